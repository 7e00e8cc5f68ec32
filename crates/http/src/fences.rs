//! `/v1/fences`: geofences defined, listed and removed, and their events delivered as
//! server-sent events (resumable by `Last-Event-ID`) and to webhooks (signed, retried).
//!
//! Events are decided and kept by the store's writer (`features::fence`); this module reads
//! them back from the store and hears each commit's new ones through [`Hub`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, watch};

use super::response::{self, Resp};
use super::{App, BoxError, Ctx, read_body, require_any};
use crate::acl::{Caller, Capability, FENCE_COLLECTION, Permissions, Role, RoleSet};
use crate::error::{ApiError, ErrorCode};
use crate::features::fence::{self, FenceSpec, event_json, fence_uri};
use crate::store::{Format, Op, PutDocument, Record, Store};

/// Events read from the store at a time when a reader catches up.
const PAGE: usize = 512;
/// A comment sent on a quiet event stream this often, so proxies keep it open.
const KEEPALIVE: Duration = Duration::from_secs(15);

/// A commit's events: the first one's number and the records.
pub type Batch = Arc<(u64, Vec<Record>)>;

/// Where each commit's events go once durable: the event streams and the webhooks.
pub struct Hub {
    tx: broadcast::Sender<Batch>,
    /// Set once the server shuts down: event streams end.
    closing: watch::Sender<bool>,
}

impl Default for Hub {
    fn default() -> Self {
        Hub {
            tx: broadcast::channel(4096).0,
            closing: watch::channel(false).0,
        }
    }
}

impl Hub {
    /// Hear a commit's events (on the writer thread: it never blocks).
    pub fn publish(&self, first: u64, records: Vec<Record>) {
        crate::metrics::record(|m| m.fence_events.inc_by(records.len() as u64));
        let _ = self.tx.send(Arc::new((first, records)));
    }

    /// End every event stream (the server is shutting down).
    pub fn close(&self) {
        let _ = self.closing.send(true);
    }
}

/// Whether a caller with `roles` may read an event's row.
fn may_read(roles: RoleSet, readers: RoleSet) -> bool {
    roles.contains(Role::Admin) || roles.bits() & readers.bits() != 0
}

fn not_found(name: &str) -> ApiError {
    ApiError::new(ErrorCode::NoDocument, format!("no fence {name}"))
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidRequest, message.into())
}

fn fence_json(fences: &fence::FenceSet, spec: &FenceSpec) -> Value {
    let mut v = spec.public_json();
    if let Some(why) = fences.inactive(&spec.name) {
        v["inactive"] = json!(why);
    }
    v
}

/// `/v1/fences[/{name}[/events|/failed]]`: `rest` is the path after `/v1/fences`.
pub(super) async fn serve<B>(
    app: &Arc<App>,
    ctx: &Ctx,
    method: &hyper::Method,
    rest: &str,
    body: B,
) -> Result<Resp, ApiError>
where
    B: hyper::body::Body<Data = Bytes> + Send + Unpin,
    B::Error: Into<BoxError>,
{
    let rest = rest.trim_start_matches('/');
    let (name, tail) = match rest.split_once('/') {
        Some((n, t)) => (n, t),
        None => (rest, ""),
    };
    use hyper::Method;
    match (name, tail, method) {
        ("", "", &Method::GET) => list(app, ctx),
        ("", "", &Method::POST) => post_many(app, ctx, body).await,
        (n, "", &Method::GET) => get(app, ctx, n),
        (n, "", &Method::PUT) if !n.is_empty() => put(app, ctx, n, body).await,
        (n, "", &Method::DELETE) if !n.is_empty() => delete(app, ctx, n).await,
        (n, "events", &Method::GET) => events(app, ctx, n),
        (n, "failed", &Method::GET) => failed(app, ctx, n),
        (_, "" | "events" | "failed", m) => Err(ApiError::new(
            ErrorCode::MethodNotAllowed,
            format!("{m} is not allowed on {}", ctx.path),
        )),
        _ => Err(ApiError::new(
            ErrorCode::UnknownEndpoint,
            format!("no endpoint at {}", ctx.path),
        )),
    }
}

fn readers(ctx: &Ctx) -> Result<(), ApiError> {
    require_any(&ctx.caller, &[Role::GeoReader, Role::Admin])
}

fn writers(ctx: &Ctx) -> Result<(), ApiError> {
    require_any(&ctx.caller, &[Role::GeoWriter, Role::Admin])
}

/// A fence the caller may see: one on a service it may read.
fn visible(app: &App, ctx: &Ctx, name: &str) -> Result<Arc<FenceSpec>, ApiError> {
    let spec = app
        .features
        .fences()
        .get(name)
        .ok_or_else(|| not_found(name))?;
    if app
        .features
        .descriptor(&spec.service, ctx.caller.roles())
        .is_none()
    {
        return Err(not_found(name));
    }
    Ok(spec)
}

fn list(app: &App, ctx: &Ctx) -> Result<Resp, ApiError> {
    readers(ctx)?;
    let roles = ctx.caller.roles();
    let set = app.features.fences();
    let fences: Vec<Value> = set
        .all()
        .filter(|s| app.features.descriptor(&s.service, roles).is_some())
        .map(|s| fence_json(&set, s))
        .collect();
    Ok(response::json_value(200, &json!({ "fences": fences })))
}

fn get(app: &App, ctx: &Ctx, name: &str) -> Result<Resp, ApiError> {
    readers(ctx)?;
    let spec = visible(app, ctx, name)?;
    Ok(response::json_value(
        200,
        &fence_json(&app.features.fences(), &spec),
    ))
}

async fn put<B>(app: &App, ctx: &Ctx, name: &str, body: B) -> Result<Resp, ApiError>
where
    B: hyper::body::Body<Data = Bytes> + Send + Unpin,
    B::Error: Into<BoxError>,
{
    writers(ctx)?;
    fence::check_name(name).map_err(invalid)?;
    let body = read_body(app, &ctx.headers, body).await?;
    let mut doc: Value = serde_json::from_slice(&body)
        .map_err(|e| invalid(format!("a fence is a JSON object: {e}")))?;
    let Some(obj) = doc.as_object_mut() else {
        return Err(invalid("a fence is a JSON object"));
    };
    if obj.get("name").is_some_and(|n| n.as_str() != Some(name)) {
        return Err(invalid(format!("name: the URL names the fence {name}")));
    }
    obj.insert("name".into(), json!(name));
    let existed = app.features.fences().get(name).is_some();
    let since = app.store.last_event()?;
    let op = define(app, ctx, doc, since)?;
    write_fences(app, vec![op]).await?;
    tracing::info!(fence = name, by = ctx.caller.name(), "fence defined");
    let status = if existed { 200 } else { 201 };
    let spec = app
        .features
        .fences()
        .get(name)
        .ok_or_else(|| not_found(name))?;
    Ok(response::json_value(
        status,
        &fence_json(&app.features.fences(), &spec),
    ))
}

/// `POST /v1/fences` with `{"fences": [fence, …]}`, each naming itself: all defined in one
/// write, or none (a 400 naming the first that is wrong).
async fn post_many<B>(app: &App, ctx: &Ctx, body: B) -> Result<Resp, ApiError>
where
    B: hyper::body::Body<Data = Bytes> + Send + Unpin,
    B::Error: Into<BoxError>,
{
    writers(ctx)?;
    let body = read_body(app, &ctx.headers, body).await?;
    let doc: Value = serde_json::from_slice(&body)
        .map_err(|e| invalid(format!("a JSON object {{\"fences\": [...]}}: {e}")))?;
    let Some(list) = doc.get("fences").and_then(Value::as_array) else {
        return Err(invalid("fences: missing, or not an array of fences"));
    };
    let set = app.features.fences();
    let mut names = std::collections::HashSet::new();
    let mut created = 0;
    for (i, f) in list.iter().enumerate() {
        let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
        fence::check_name(name).map_err(|e| invalid(format!("fences[{i}]: {e}")))?;
        if !names.insert(name) {
            return Err(invalid(format!("fences[{i}]: {name} is named twice")));
        }
        if set.get(name).is_none() {
            created += 1;
        }
    }
    let max = app.features.settings().fences.max_fences;
    if set.len() + created > max {
        return Err(invalid(format!(
            "{} fences are defined and {created} more are new: max_fences is {max}",
            set.len()
        )));
    }
    let since = app.store.last_event()?;
    let ops = list
        .iter()
        .enumerate()
        .map(|(i, f)| {
            define(app, ctx, f.clone(), since).map_err(|e| {
                let name = f["name"].as_str().unwrap_or_default();
                invalid(format!("fences[{i}] ({name}): {}", e.message))
            })
        })
        .collect::<Result<Vec<Op>, ApiError>>()?;
    write_fences(app, ops).await?;
    tracing::info!(
        fences = list.len(),
        created,
        by = ctx.caller.name(),
        "fences defined"
    );
    Ok(response::json_value(
        200,
        &json!({"defined": list.len(), "created": created, "replaced": list.len() - created}),
    ))
}

/// Write fence documents; a fence the store's check refuses is a 400 that names it.
async fn write_fences(app: &App, ops: Vec<Op>) -> Result<(), ApiError> {
    app.store
        .write(&Caller::system(), ops)
        .await
        .map(|_| ())
        .map_err(|e| match ApiError::from(e) {
            // "fence /geoshard/fences/{name}.json: why": the name said once, as `{name}: why`.
            e if e.status() == 400 => invalid(
                e.message
                    .replacen(&format!("fence {}", fence::FENCE_PREFIX), "", 1)
                    .replacen(".json: ", ": ", 1),
            ),
            e => e,
        })
}

/// Check fence document `doc` (which names its fence) for the caller, and make the write that
/// defines it, with its owner, the owner's roles and `since` (the event id its webhook starts
/// after).
fn define(app: &App, ctx: &Ctx, mut doc: Value, since: u64) -> Result<Op, ApiError> {
    let Some(obj) = doc.as_object_mut() else {
        return Err(invalid("a fence is a JSON object"));
    };
    let name = obj
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let roles = ctx.caller.roles();
    // "This county": the area is a copy of the feature's geometry as it is now.
    if let Some(f) = obj.get("feature").cloned() {
        if obj.contains_key("geometry") || obj.contains_key("point") {
            return Err(invalid(
                "a fence has one area: geometry, point and radius, feature, or roam",
            ));
        }
        let service = f["service"]
            .as_str()
            .or(obj.get("service").and_then(Value::as_str));
        let layer = f["layer"]
            .as_i64()
            .or(obj.get("layer").and_then(Value::as_i64));
        let (Some(service), Some(layer), Some(id)) = (service, layer, f["OBJECTID"].as_i64())
        else {
            return Err(invalid("feature: {\"service\", \"layer\", \"OBJECTID\"}"));
        };
        let g = app
            .features
            .feature_geometry(service, layer, id, roles)
            .map_err(|e| invalid(format!("feature: {e}")))?;
        obj.insert("geometry".into(), g);
    }
    obj.insert("owner".into(), json!(ctx.caller.name()));
    obj.insert("since".into(), json!(since));
    obj.insert("ownerRoles".into(), json!(roles.bits()));
    let spec = fence::parse_fence(&doc, app.features.settings().fences).map_err(invalid)?;
    if app.features.descriptor(&spec.service, roles).is_none() {
        return Err(invalid(format!(
            "service: no service {} this user may read",
            spec.service
        )));
    }
    if let fence::Area::Roam { service, .. } = &spec.area
        && app.features.descriptor(service, roles).is_none()
    {
        return Err(invalid(format!(
            "roam.service: no service {service} this user may read"
        )));
    }
    if let Some(problem) = app.features.fence_problem(&spec) {
        return Err(invalid(problem));
    }
    // Readable by the services' readers, changed by their writers.
    let mut permissions = Permissions::new();
    permissions.grant(Role::GeoReader, Capability::Read);
    permissions.grant(Role::GeoWriter, Capability::Read);
    permissions.grant(Role::GeoWriter, Capability::Update);
    Ok(Op::PutDocument(PutDocument {
        uri: fence_uri(&name),
        content: Bytes::from(serde_json::to_vec(&doc).unwrap_or_default()),
        format: Format::Json,
        collections: Some(vec![FENCE_COLLECTION.to_string()]),
        permissions: Some(permissions),
        default_permissions: permissions,
    }))
}

async fn delete(app: &App, ctx: &Ctx, name: &str) -> Result<Resp, ApiError> {
    writers(ctx)?;
    visible(app, ctx, name)?;
    app.store
        .write(
            &Caller::system(),
            vec![Op::DeleteDocument {
                uri: fence_uri(name),
            }],
        )
        .await?;
    tracing::info!(fence = name, by = ctx.caller.name(), "fence removed");
    Ok(response::empty(204))
}

/// Where a reader of a fence's events starts: after `Last-Event-ID`, or `after`, or now.
fn start_after(app: &App, ctx: &Ctx) -> Result<u64, ApiError> {
    let header = ctx
        .headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    match header.or_else(|| ctx.params.get("after").map(str::to_string)) {
        Some(v) => v.trim().parse().map_err(|_| {
            ApiError::new(
                ErrorCode::InvalidParam,
                format!("Last-Event-ID or after: {v:?} is not an event id"),
            )
        }),
        None => Ok(app.store.last_event()?),
    }
}

/// A topic's events after `after`, read on a blocking thread; none (logged) if the store
/// cannot be read.
async fn kept_after(store: &Arc<Store>, topic: &str, after: u64) -> crate::store::Kept {
    let (store, topic) = (store.clone(), topic.to_string());
    let read = tokio::task::spawn_blocking(move || store.events_after(&topic, after, PAGE)).await;
    match read {
        Ok(Ok(kept)) => kept,
        Ok(Err(e)) => {
            tracing::error!(error = %e, "cannot read geofence events");
            Default::default()
        }
        Err(e) => {
            tracing::error!(error = %e, "reading geofence events failed");
            Default::default()
        }
    }
}

/// A reader resuming after `after` when retention has trimmed events it has not had: an
/// `event: trimmed` naming the ids that are gone (some may have been other fences'). It has no
/// `id`, so a reader's `Last-Event-ID` stays where it was.
fn trimmed(after: u64, kept: &crate::store::Kept) -> Option<Bytes> {
    let next = kept.oldest.unwrap_or(kept.last + 1);
    (after < kept.last && after + 1 < next).then(|| {
        Bytes::from(format!(
            "event: trimmed\ndata: {{\"from\":{},\"through\":{}}}\n\n",
            after + 1,
            next - 1
        ))
    })
}

/// One server-sent event.
fn frame(n: u64, json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(json.len() + 24);
    out.extend_from_slice(format!("id: {n}\ndata: ").as_bytes());
    out.extend_from_slice(json);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// The stream of an event body: frames as the task that reads them sends them.
pub type Frames = mpsc::Receiver<Bytes>;

/// Marks an answer whose body is a stream: the connection takes it out and sends its frames.
#[derive(Clone)]
pub struct Streamed(pub Arc<parking_lot::Mutex<Option<Frames>>>);

fn events(app: &Arc<App>, ctx: &Ctx, name: &str) -> Result<Resp, ApiError> {
    readers(ctx)?;
    visible(app, ctx, name)?;
    let after = start_after(app, ctx)?;
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let follow = Follow {
        store: app.store.clone(),
        topic: name.to_string(),
        roles: ctx.caller.roles(),
        after,
        hub: app.events.tx.subscribe(),
        closing: app.events.closing.subscribe(),
        tx,
    };
    tokio::spawn(follow.run());
    let mut r = response::with_body(200, "text/event-stream", Bytes::new());
    r.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r.extensions_mut()
        .insert(Streamed(Arc::new(parking_lot::Mutex::new(Some(rx)))));
    Ok(r)
}

/// A reader of one fence's events: what the store keeps after `after`, then each commit's.
struct Follow {
    store: Arc<Store>,
    topic: String,
    roles: RoleSet,
    after: u64,
    hub: broadcast::Receiver<Batch>,
    closing: watch::Receiver<bool>,
    tx: mpsc::Sender<Bytes>,
}

impl Follow {
    /// Send a record if the reader may read it; `false` once the reader is gone.
    async fn send(&mut self, n: u64, r: &Record) -> bool {
        if n <= self.after || r.topic != self.topic {
            return true;
        }
        self.after = n;
        let (readers, json) = event_json(&r.topic, r.time_ms, &r.body);
        if !may_read(self.roles, readers) {
            return true;
        }
        let sent = self.tx.send(frame(n, &json)).await.is_ok();
        if sent {
            crate::metrics::record(|m| {
                m.fence_delivered.with_label_values(&["sse"]).inc();
                m.fence_lag
                    .observe(crate::time::now_ms().saturating_sub(r.time_ms) as f64 / 1000.0)
            });
        }
        sent
    }

    /// Send what the store keeps after `after`; `false` once the reader is gone.
    async fn catch_up(&mut self) -> bool {
        let mut first = true;
        loop {
            let kept = kept_after(&self.store, &self.topic, self.after).await;
            if std::mem::take(&mut first)
                && let Some(notice) = trimmed(self.after, &kept)
                && self.tx.send(notice).await.is_err()
            {
                return false;
            }
            let full = kept.records.len() >= PAGE;
            for (n, r) in &kept.records {
                if !self.send(*n, r).await {
                    return false;
                }
            }
            if !full {
                return true;
            }
        }
    }

    async fn run(mut self) {
        if self
            .tx
            .send(Bytes::from_static(b": geoshard fence events\n\n"))
            .await
            .is_err()
        {
            return;
        }
        if !self.catch_up().await {
            return;
        }
        loop {
            tokio::select! {
                batch = self.hub.recv() => match batch {
                    Ok(batch) => {
                        let (first, records) = &*batch;
                        for (i, r) in records.iter().enumerate() {
                            if !self.send(first + i as u64, r).await {
                                return;
                            }
                        }
                    }
                    // Fell behind the hub: read what was missed from the store.
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        if !self.catch_up().await {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = tokio::time::sleep(KEEPALIVE) => {
                    if self.tx.send(Bytes::from_static(b": keepalive\n\n")).await.is_err() {
                        return;
                    }
                }
                _ = self.closing.changed() => return,
                _ = self.tx.closed() => return,
            }
        }
    }
}

fn failed(app: &App, ctx: &Ctx, name: &str) -> Result<Resp, ApiError> {
    writers(ctx)?;
    visible(app, ctx, name)?;
    let list = app.webhooks.failed(name);
    Ok(response::json_value(
        200,
        &json!({ "fence": name, "failed": list }),
    ))
}

/// Webhook delivery: one task per fence with a webhook, each following its fence's events
/// from a cursor kept in the data directory, so that a restart resumes (at least once).
pub struct Webhooks {
    state: parking_lot::Mutex<HookState>,
    path: std::path::PathBuf,
    retries: u32,
    keep_failed: usize,
}

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Saved {
    /// By fence: the last event handled.
    cursors: BTreeMap<String, u64>,
    /// By fence: events that failed every try, newest last.
    failed: BTreeMap<String, Vec<Value>>,
}

struct HookState {
    saved: Saved,
    saved_at: std::time::Instant,
    /// By fence: the task and the webhook it posts to.
    running: HashMap<String, (String, tokio::task::JoinHandle<()>)>,
}

impl Webhooks {
    pub fn open(dir: &std::path::Path, retries: u32, keep_failed: usize) -> Webhooks {
        let path = dir.join("webhooks.json");
        let saved = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        Webhooks {
            state: parking_lot::Mutex::new(HookState {
                saved,
                saved_at: std::time::Instant::now(),
                running: HashMap::new(),
            }),
            path,
            retries,
            keep_failed,
        }
    }

    fn failed(&self, name: &str) -> Vec<Value> {
        self.state
            .lock()
            .saved
            .failed
            .get(name)
            .cloned()
            .unwrap_or_default()
    }

    fn save(&self, state: &mut HookState) {
        state.saved_at = std::time::Instant::now();
        let bytes = serde_json::to_vec(&state.saved).unwrap_or_default();
        let tmp = self.path.with_extension("json.part");
        if let Err(e) = std::fs::write(&tmp, bytes).and_then(|_| std::fs::rename(&tmp, &self.path))
        {
            tracing::warn!(error = %e, "cannot save the webhooks' cursors");
        }
    }

    /// Start a task for each fence with a webhook, and stop those of fences gone or changed.
    pub fn reconcile(self: &Arc<Self>, app: &Arc<App>) {
        let fences = app.features.fences();
        let mut state = self.state.lock();
        let wanted: HashMap<String, Arc<FenceSpec>> = fences
            .all()
            .filter(|s| s.webhook.is_some())
            .map(|s| (s.name.clone(), s.clone()))
            .collect();
        state.running.retain(|name, (url, task)| {
            let keep = wanted
                .get(name)
                .and_then(|s| s.webhook.as_ref())
                .is_some_and(|h| &h.url == url);
            if !keep {
                task.abort();
            }
            keep
        });
        for (name, spec) in wanted {
            if state.running.contains_key(&name) {
                continue;
            }
            let Some(hook) = spec.webhook.clone() else {
                continue;
            };
            let cursor = *state
                .saved
                .cursors
                .entry(name.clone())
                .or_insert(spec.since);
            let task = tokio::spawn(deliver(
                self.clone(),
                app.clone(),
                spec.clone(),
                cursor,
                app.events.tx.subscribe(),
            ));
            state.running.insert(name, (hook.url, task));
        }
        state.saved.cursors.retain(|n, _| fences.get(n).is_some());
    }

    /// Stop every delivery task.
    pub fn stop(&self) {
        for (_, (_, task)) in self.state.lock().running.drain() {
            task.abort();
        }
    }

    /// Move a fence's cursor past an event (and list it, if it failed). The cursors are
    /// saved with a failure, and else at most once a second and at the end of a page: a
    /// restart may post again what went since (at least once).
    fn advance(&self, name: &str, to: u64, failed: Option<Value>) {
        let mut state = self.state.lock();
        state.saved.cursors.insert(name.to_string(), to);
        let mut now = failed.is_some();
        if let Some(f) = failed {
            let list = state.saved.failed.entry(name.to_string()).or_default();
            list.push(f);
            let over = list.len().saturating_sub(self.keep_failed);
            list.drain(..over);
        }
        now |= state.saved_at.elapsed() >= Duration::from_secs(1);
        if now {
            self.save(&mut state);
        }
    }

    /// Save the cursors now.
    fn flush(&self) {
        self.save(&mut self.state.lock());
    }
}

/// Cluster mode: publish each commit's events on NATS (`Cluster::publish_events`).
pub(crate) async fn follow_cluster(app: Arc<App>) {
    let mut hub = app.events.tx.subscribe();
    loop {
        match hub.recv().await {
            Ok(batch) => {
                let Some(cluster) = app.cluster.get() else {
                    continue;
                };
                let (first, records) = &*batch;
                let events = records
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        let (_, json) = event_json(&r.topic, r.time_ms, &r.body);
                        (
                            first + i as u64,
                            r.topic.clone(),
                            Bytes::from(json.into_owned()),
                        )
                    })
                    .collect();
                cluster.publish_events(events);
            }
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                tracing::warn!(
                    missed,
                    "geofence events fell behind; not all were published on NATS"
                );
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Keep a delivery task for each fence with a webhook while the server runs.
pub(crate) async fn follow_webhooks(app: Arc<App>) {
    let mut hub = app.events.tx.subscribe();
    let mut seen: Option<Arc<fence::FenceSet>> = None;
    let mut last: Vec<(String, String)> = Vec::new();
    loop {
        // Looked at again only when the fences were replaced (a fence or the catalog changed).
        let fences = app.features.fences();
        if !seen.as_ref().is_some_and(|s| Arc::ptr_eq(s, &fences)) {
            let now: Vec<(String, String)> = fences
                .all()
                .filter_map(|s| {
                    let hook = s.webhook.as_ref()?;
                    Some((s.name.clone(), hook.url.clone()))
                })
                .collect();
            if now != last {
                app.webhooks.reconcile(&app);
                last = now;
            }
            seen = Some(fences);
        }
        // A fence is defined by a commit, which wakes this; or a second passes.
        let _ = tokio::time::timeout(Duration::from_secs(1), hub.recv()).await;
    }
}

/// Post one fence's events to its webhook, in order, from `cursor`.
async fn deliver(
    hooks: Arc<Webhooks>,
    app: Arc<App>,
    spec: Arc<FenceSpec>,
    mut cursor: u64,
    mut hub: broadcast::Receiver<Batch>,
) {
    let Some(hook) = spec.webhook.clone() else {
        return;
    };
    loop {
        let kept = kept_after(&app.store, &spec.name, cursor).await;
        let full = kept.records.len() >= PAGE;
        let any = !kept.records.is_empty();
        for (n, r) in kept.records {
            let (readers, body) = event_json(&r.topic, r.time_ms, &r.body);
            let mut failed = None;
            if may_read(spec.owner_roles, readers) {
                let ok = post_with_retries(&hook, n, &body, hooks.retries).await;
                crate::metrics::record(|m| {
                    if ok {
                        m.fence_delivered.with_label_values(&["webhook"]).inc();
                        m.fence_lag.observe(
                            crate::time::now_ms().saturating_sub(r.time_ms) as f64 / 1000.0,
                        );
                    } else {
                        m.fence_dropped.inc();
                    }
                });
                if !ok {
                    let mut event: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    event["id"] = json!(n);
                    failed = Some(event);
                }
            }
            cursor = n;
            hooks.advance(&spec.name, n, failed);
        }
        if any {
            hooks.flush();
        }
        if full {
            continue;
        }
        // Wait for the next commit with events (any fence's: cheap to look again).
        match hub.recv().await {
            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// The signature header: `sha256=` and the hex HMAC-SHA256 of the body under the secret.
pub const SIGNATURE: &str = "x-geoshard-signature";

pub fn sign(secret: &str, body: &[u8]) -> String {
    use hmac::{KeyInit, Mac};
    let mut mac = <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(secret.as_bytes())
        .expect("HMAC takes any key");
    mac.update(body);
    let bytes = mac.finalize().into_bytes();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

async fn post_with_retries(hook: &fence::Webhook, n: u64, body: &[u8], retries: u32) -> bool {
    let mut wait = Duration::from_millis(200);
    for attempt in 0..=retries {
        if attempt > 0 {
            crate::metrics::record(|m| m.fence_retried.inc());
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(30));
        }
        match tokio::time::timeout(Duration::from_secs(10), post(hook, n, body)).await {
            Ok(Ok(status)) if (200..300).contains(&status) => return true,
            Ok(Ok(status)) => tracing::debug!(url = %hook.url, status, "webhook refused an event"),
            Ok(Err(e)) => tracing::debug!(url = %hook.url, error = %e, "webhook unreachable"),
            Err(_) => tracing::debug!(url = %hook.url, "webhook timed out"),
        }
    }
    tracing::warn!(url = %hook.url, event = n, "webhook failed every try; listed as failed");
    false
}

/// POST one event: its status code.
async fn post(hook: &fence::Webhook, n: u64, body: &[u8]) -> Result<u16, BoxError> {
    let uri: hyper::Uri = hook.url.parse()?;
    if uri.scheme_str() != Some("http") {
        return Err("only http:// webhooks are posted to".into());
    }
    let host = uri.host().ok_or("no host")?.to_string();
    let port = uri.port_u16().unwrap_or(80);
    let stream = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let req = hyper::Request::post(path)
        .header(hyper::header::HOST, format!("{host}:{port}"))
        .header(CONTENT_TYPE, "application/json")
        .header(SIGNATURE, sign(&hook.secret, body))
        .header("x-geoshard-event-id", n.to_string())
        .body(http_body_util::Full::new(Bytes::copy_from_slice(body)))?;
    let resp = send.send_request(req).await?;
    Ok(resp.status().as_u16())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_is_hmac_sha256_hex() {
        // RFC 4231 test case 2.
        assert_eq!(
            sign("Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn frames_are_server_sent_events() {
        assert_eq!(&frame(7, br#"{"a":1}"#)[..], b"id: 7\ndata: {\"a\":1}\n\n");
    }

    #[test]
    fn a_reader_is_told_of_trimmed_events() {
        let kept = |oldest: Option<u64>, last: u64| crate::store::Kept {
            records: Vec::new(),
            oldest,
            last,
        };
        let notice = |b: Option<Bytes>| b.map(|b| String::from_utf8(b.to_vec()).unwrap());
        // Events 1..=4 trimmed; 5 is the oldest kept.
        assert_eq!(
            notice(trimmed(0, &kept(Some(5), 9))).as_deref(),
            Some("event: trimmed\ndata: {\"from\":1,\"through\":4}\n\n")
        );
        assert_eq!(
            notice(trimmed(2, &kept(Some(5), 9))).as_deref(),
            Some("event: trimmed\ndata: {\"from\":3,\"through\":4}\n\n")
        );
        // All trimmed.
        assert_eq!(
            notice(trimmed(3, &kept(None, 9))).as_deref(),
            Some("event: trimmed\ndata: {\"from\":4,\"through\":9}\n\n")
        );
        // Nothing missed: resumed at the oldest, or past the last, or nothing ever kept.
        assert_eq!(trimmed(4, &kept(Some(5), 9)), None);
        assert_eq!(trimmed(0, &kept(Some(1), 9)), None);
        assert_eq!(trimmed(9, &kept(None, 9)), None);
        assert_eq!(trimmed(12, &kept(Some(5), 9)), None);
        assert_eq!(trimmed(0, &kept(None, 0)), None);
    }
}
