//! Cluster mode: several nodes serve one dataset, with NATS JetStream as the write log.
//!
//! Every write a node takes is published to one JetStream stream (replicated on the NATS
//! servers) and answered only after JetStream acknowledges it and this node has applied it.
//! Every node follows the stream from the entry after the last it applied and applies each
//! entry through its own store, views and indexes, in stream order: a state machine
//! replicated by the log, so nodes hold the same documents and answer queries alike. An
//! entry's outcome (created, refused by a permission or a template) is decided where it is
//! applied, and alike everywhere, since each node applies the same entries to the same state.
//!
//! Nodes register in a JetStream key-value bucket with a lease (`geoshard cluster status`),
//! with the shards they hold when `cluster_shards` is set (their views hold those rows only),
//! and answer other nodes' questions (`ask`: a query's part) over core NATS. The log's
//! subjects separate feature documents (`geoshard.<cluster>.data`) from the rest
//! (`geoshard.<cluster>.meta`).

// Sibling crates under the module names the code uses.
use geoshard_core::{FastMap, acl};
use geoshard_store as store;

mod ask;
mod direct;
pub mod place;
mod snapshot;
pub mod spread;
mod status;
mod trust;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::consumer::DeliverPolicy;
use futures_util::StreamExt;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot, watch};

use crate::acl::Caller;
use crate::store::{Op, Store, StoreError, Table, WriteLog, Written, logged};

pub use ask::{Answerer, AskError};
pub use snapshot::prepare;
pub use status::{NodeRecord, NodeState, Overview, ShardHolders, Shards, status_report};
pub use trust::NatsAccess;
/// For the signing benchmark.
#[doc(hidden)]
pub use trust::Signer;

/// How long a write waits for JetStream to acknowledge it, publishing again after failures
/// (a stream electing a new leader takes seconds).
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(15);
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// How long a write, once in the log, waits for this node to apply it.
const APPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a node renews its registry entry, and how long the entry outlives the last.
const HEARTBEAT: Duration = Duration::from_secs(2);
const LEASE: Duration = Duration::from_secs(10);
/// How long the follower may receive nothing while the log holds entries it has not applied.
const STALL: Duration = Duration::from_secs(5);
/// Log entries handed to the store and not yet finished, in KiB: bounds the follower's memory
/// however large the entries.
const IN_FLIGHT_KIB: usize = 64 * 1024;
/// Room kept in a NATS message for its headers and subject.
const ENVELOPE_BYTES: usize = 1024;

/// How far a log entry's signing time may be from the time JetStream stored it. A copy of an
/// entry published again later is refused for it, and one published again sooner is dropped
/// by JetStream as a duplicate (its message id is signed too, and the stream's duplicate
/// window, `DUPLICATE_WINDOW`, is longer).
const FRESH: Duration = Duration::from_secs(60);
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

const ORIGIN: &str = "Geoshard-Origin";
const REQUEST: &str = "Geoshard-Request";

/// What a node needs to join a cluster.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    /// NATS server URLs, comma-separated.
    pub url: String,
    pub node: String,
    pub name: String,
    pub replicas: usize,
    /// The cluster's shards as this node cuts them (empty: this node holds every row).
    pub partition: String,
    /// The shards this node holds.
    pub shards: Vec<usize>,
    /// Whether its store keeps every document's content (else stubs of other shards'):
    /// only such a node's snapshot serves any node.
    pub keeps_all: bool,
    /// Log bytes a second applied while catching up, and document bytes a second copied in
    /// when taking shards (0: no limit).
    pub catch_up_bytes: u64,
    /// Log entries between snapshots (0: none taken, the log keeps every entry).
    pub snapshot_entries: u64,
    /// Credentials and TLS for NATS.
    pub access: NatsAccess,
    /// The secret every node shares, which signs what nodes tell each other; `None`: nothing
    /// is signed and anyone who can reach NATS is believed.
    pub secret: Option<geoshard_core::secret::Secret>,
    /// Where the node listens for other nodes' questions over direct connections; `None`:
    /// they ask over NATS.
    pub listen: Option<std::net::SocketAddr>,
    /// Whether the shards are placed automatically over the live nodes (`shards` are then
    /// only where this node starts: what its store keeps whole).
    pub auto: bool,
}

impl ClusterSettings {
    pub fn stream(&self) -> String {
        format!(
            "GEOSHARD_{}",
            self.name.to_ascii_uppercase().replace('-', "_")
        )
    }

    pub fn bucket(&self) -> String {
        format!("geoshard_{}_nodes", self.name)
    }

    fn subject(&self, what: &str) -> String {
        format!("geoshard.{}.{what}", self.name)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cannot reach NATS at {url}: {message}")]
    Connect { url: String, message: String },
    #[error("JetStream: {0}")]
    JetStream(String),
    #[error("cannot start the cluster's threads: {0}")]
    Runtime(String),
    #[error("{0}")]
    Trust(String),
}

fn js_error(e: impl std::fmt::Display) -> ClusterError {
    ClusterError::JetStream(e.to_string())
}

/// Record tables whose change the node must take into memory when another node makes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reload {
    pub users: bool,
    pub flows: bool,
}

impl Reload {
    fn of(ops: &[Op]) -> Reload {
        let mut r = Reload::default();
        for op in ops {
            let table = match op {
                Op::PutRecord { table, .. }
                | Op::DeleteRecord { table, .. }
                | Op::ReplaceTable { table, .. } => *table,
                _ => continue,
            };
            r.users |= table == Table::Users;
            r.flows |= table == Table::Flows;
        }
        r
    }

    fn any(self) -> bool {
        self.users || self.flows
    }
}

type Reloader = Box<dyn Fn(Reload) + Send + Sync>;
type Waiter = oneshot::Sender<Result<Written, StoreError>>;

struct Inner {
    settings: ClusterSettings,
    client: async_nats::Client,
    js: jetstream::Context,
    /// The live nodes' registry entries (this node's too), as of the last heartbeat.
    peers: Mutex<Arc<Vec<NodeRecord>>>,
    store: Arc<Store>,
    /// This node's writes in the log, by request id, waiting for their outcome here.
    waiters: Mutex<crate::FastMap<u64, Waiter>>,
    next_request: AtomicU64,
    /// The last entry applied and answered here: queries waiting for an entry watch it.
    visible: watch::Sender<u64>,
    /// Entries applied whose change has not taken effect yet (a view built in the
    /// background): a query waiting for one of them, or a later entry, waits for it too.
    unsettled: watch::Sender<std::collections::BTreeSet<u64>>,
    /// Set once the node has applied what the log held when it started following.
    caught_up: AtomicBool,
    /// Copying in the documents of shards taken: not caught up yet.
    filling: AtomicBool,
    /// The shards this node answers for, as its registry record says; and those it is
    /// taking (placed automatically, they move while it runs).
    serving: Mutex<Vec<usize>>,
    taking: Mutex<Vec<usize>>,
    letting_go: Mutex<Vec<usize>>,
    /// Whether its store keeps every document whole (then its snapshots serve any node).
    keeps_all: AtomicBool,
    max_payload: usize,
    reload: Reloader,
    /// The node's HTTP address, for the registry (known once it listens).
    http: Mutex<String>,
    /// The log's last entry, as of the last heartbeat.
    log_last: AtomicU64,
    /// Unique to this run of the node: with the request id, a message id JetStream
    /// deduplicates by.
    boot: String,
    signer: trust::Signer,
    /// The last entries refused for their signature, recorded before they are applied (as
    /// nothing): a writer whose entry it was learns so instead of waiting for an outcome.
    refused: Mutex<std::collections::VecDeque<u64>>,
    /// Questions to other nodes over direct connections, and this node's address for them.
    direct: direct::Direct,
}

/// A node's membership of the cluster: its log, its follower and its registry entry.
pub struct Cluster {
    inner: Arc<Inner>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    handle: tokio::runtime::Handle,
    /// Geofence events to publish, in commit order (see [`Cluster::publish_events`]).
    events: std::sync::OnceLock<mpsc::Sender<Vec<FenceEvent>>>,
}

/// A geofence event to publish: its number, its fence, and its JSON.
pub type FenceEvent = (u64, String, bytes::Bytes);

impl Cluster {
    /// Connect, make sure the stream and the registry exist, put the log in front of
    /// `store` and start following the stream from the entry after the last applied.
    /// `reload` takes record changes other nodes make into memory.
    pub fn start(
        settings: ClusterSettings,
        store: Arc<Store>,
        reload: Reloader,
    ) -> Result<Arc<Cluster>, ClusterError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("cluster")
            .enable_all()
            .build()
            .map_err(|e| ClusterError::Runtime(e.to_string()))?;
        let handle = runtime.handle().clone();
        let inner = runtime.block_on(connect(settings, store, reload))?;
        let cluster = Arc::new(Cluster {
            inner: inner.clone(),
            runtime: Mutex::new(Some(runtime)),
            handle: handle.clone(),
            events: std::sync::OnceLock::new(),
        });
        inner.store.set_log(cluster.clone());
        handle.spawn(follow(inner.clone()));
        handle.spawn(snapshot::snapshots(inner.clone()));
        handle.spawn(heartbeat(inner));
        Ok(cluster)
    }

    pub fn node(&self) -> &str {
        &self.inner.settings.node
    }

    /// The last log entry this node applied and answered.
    pub fn visible(&self) -> u64 {
        *self.inner.visible.borrow()
    }

    /// The log's last entry when the node last asked (every heartbeat).
    pub fn log_last(&self) -> u64 {
        self.inner.log_last.load(Ordering::Relaxed)
    }

    /// Whether the node has applied what the log held when it started, and copied in the
    /// documents of the shards it took (see [`Cluster::set_filling`]).
    pub fn caught_up(&self) -> bool {
        self.log_caught_up() && !self.inner.filling.load(Ordering::Acquire)
    }

    /// Whether the node has applied what the log held when it started.
    pub fn log_caught_up(&self) -> bool {
        self.inner.caught_up.load(Ordering::Acquire)
    }

    /// `cluster_catch_up_bytes`: bytes a second a node copies in while it catches up or
    /// takes shards (0: no limit).
    pub(crate) fn catch_up_bytes(&self) -> u64 {
        self.inner.settings.catch_up_bytes
    }

    /// The shards this node answers for.
    pub fn serving(&self) -> Vec<usize> {
        self.inner.serving.lock().clone()
    }

    /// Shards placed automatically: the ones this node answers for, and those it is taking.
    /// `keeps_all`: whether its store now keeps every document whole.
    pub fn set_shards(&self, serving: Vec<usize>, taking: Vec<usize>, keeps_all: bool) {
        *self.inner.serving.lock() = serving;
        *self.inner.taking.lock() = taking;
        self.inner.keeps_all.store(keeps_all, Ordering::Release);
    }

    /// The shards this node no longer answers for and still holds a moment.
    pub fn set_letting_go(&self, shards: Vec<usize>) {
        *self.inner.letting_go.lock() = shards;
    }

    /// While a node copies in the documents of shards it took (it kept only stubs of them),
    /// it is not caught up: the others do not ask it for those shards.
    pub fn set_filling(&self, on: bool) {
        self.inner.filling.store(on, Ordering::Release);
    }

    /// The cluster as this node sees it: the live nodes, and each shard's holders measured
    /// against `replicas`.
    pub fn overview(&self, replicas: usize) -> Overview {
        let peers = self.inner.peers.lock().clone();
        status::overview(
            &self.inner.settings.name,
            &self.inner.settings.node,
            self.log_last(),
            self.inner.signer.on(),
            &peers,
            replicas,
        )
    }

    pub fn set_http_address(&self, addr: String) {
        *self.inner.http.lock() = addr;
    }

    /// Wait until this node has applied log entry `seq` and every entry up to it has taken
    /// effect; false if not within `limit`.
    pub async fn wait_visible(&self, seq: u64, limit: Duration) -> bool {
        let mut applied = self.inner.visible.subscribe();
        let mut unsettled = self.inner.unsettled.subscribe();
        let both = async {
            applied.wait_for(|v| *v >= seq).await.is_ok()
                && unsettled
                    .wait_for(|u| u.first().is_none_or(|first| *first > seq))
                    .await
                    .is_ok()
        };
        tokio::time::timeout(limit, both).await.unwrap_or(false)
    }

    /// The JetStream stream geofence events are published to, and its subjects'
    /// prefix: `geoshard-events.<cluster>.<fence>` (outside the log's subjects).
    pub fn events_stream(&self) -> (String, String) {
        let s = &self.inner.settings;
        (
            format!("{}_EVENTS", s.stream()),
            format!("geoshard-events.{}", s.name),
        )
    }

    /// Publish geofence events, in order, on their fence's subject. Every node decides the
    /// same events under the same numbers and publishes them; the message id (fence and
    /// number) has JetStream keep one copy of each, so a subscriber gets each once while any
    /// node is up.
    pub fn publish_events(&self, events: Vec<FenceEvent>) {
        let tx = self.events.get_or_init(|| {
            let (tx, rx) = mpsc::channel(EVENTS_QUEUE);
            self.handle
                .spawn(publish_events(self.inner.clone(), self.events_stream(), rx));
            tx
        });
        if let Err(mpsc::error::TrySendError::Full(events)) = tx.try_send(events) {
            tracing::warn!(
                events = events.len(),
                "NATS is behind: geofence events not published there (the store keeps them)"
            );
        }
    }

    /// Stop following and close the connection.
    pub fn shutdown(&self) {
        if let Some(rt) = self.runtime.lock().take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

impl WriteLog for Cluster {
    fn append(
        &self,
        caller: Caller,
        ops: Vec<Op>,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Written, StoreError>> + Send + 'static>> {
        let inner = self.inner.clone();
        let task = self.handle.spawn(append(inner, caller, ops));
        Box::pin(async move {
            task.await
                .unwrap_or_else(|_| Err(StoreError::Internal("the log append failed".into())))
        })
    }
}

/// A connection to NATS (waited for, within a bound), its JetStream context and the largest
/// message it takes.
async fn nats(
    settings: &ClusterSettings,
) -> Result<(async_nats::Client, jetstream::Context, usize), ClusterError> {
    let urls: Vec<&str> = settings.url.split(',').map(str::trim).collect();
    let refused = |message: String| ClusterError::Connect {
        url: settings.url.clone(),
        message,
    };
    let (options, last) = settings
        .access
        .options(&format!("geoshard {}", settings.node))
        .await
        .map_err(refused)?;
    let client = options
        .retry_on_initial_connect()
        .connect(urls.as_slice())
        .await
        .map_err(|e| refused(e.to_string()))?;
    // The first connection is made in the background: wait for it, within a bound. The
    // client can say it is connected before it has stored the server's INFO, whose
    // placeholder has a max_payload of 0 (nats.rs PR 1567): wait for the INFO too.
    let mut waited = Duration::ZERO;
    while client.connection_state() != async_nats::connection::State::Connected
        || client.server_info().max_payload == 0
    {
        // Credentials the server refuses do not get better by trying again.
        let last = last.get();
        if let Some((event, true)) = &last
            && waited > Duration::from_secs(2)
        {
            return Err(refused(format!(
                "the NATS server refused this node's credentials or certificate ({event}); see \
                 the cluster_user, cluster_password, cluster_token, cluster_creds, cluster_ca, \
                 cluster_cert and cluster_key settings"
            )));
        }
        if waited > Duration::from_secs(30) {
            let why = last.map_or(String::new(), |(event, _)| format!(" (last: {event})"));
            return Err(refused(format!("no NATS server answered within 30 s{why}")));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += Duration::from_millis(50);
    }
    let max_payload = client.server_info().max_payload;
    let js = jetstream::new(client.clone());
    Ok((client, js, max_payload))
}

/// Make sure the log's stream exists. A NATS cluster that is itself starting has no
/// JetStream leader for a few seconds.
async fn log_stream(
    js: &jetstream::Context,
    settings: &ClusterSettings,
) -> Result<(), ClusterError> {
    let mut tries = 0;
    loop {
        let made = js
            .get_or_create_stream(jetstream::stream::Config {
                name: settings.stream(),
                subjects: vec![settings.subject(">")],
                num_replicas: settings.replicas,
                duplicate_window: DUPLICATE_WINDOW,
                storage: jetstream::stream::StorageType::File,
                ..Default::default()
            })
            .await;
        match made {
            Ok(_) => return Ok(()),
            Err(e) if tries < 60 => {
                tracing::info!(error = %e, "waiting for JetStream");
                tries += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(js_error(e)),
        }
    }
}

/// Commits' events waiting to be published on NATS; past them, a commit's are not.
const EVENTS_QUEUE: usize = 4096;

/// The events stream's retention: as long as a week of events, or 1 GiB.
const EVENTS_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
const EVENTS_MAX_BYTES: i64 = 1 << 30;

async fn publish_events(
    inner: Arc<Inner>,
    (stream, prefix): (String, String),
    mut rx: mpsc::Receiver<Vec<FenceEvent>>,
) {
    let made = inner
        .js
        .get_or_create_stream(jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{prefix}.>")],
            num_replicas: inner.settings.replicas,
            duplicate_window: DUPLICATE_WINDOW,
            max_age: EVENTS_MAX_AGE,
            max_bytes: EVENTS_MAX_BYTES,
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        })
        .await;
    if let Err(e) = made {
        tracing::error!(error = %e, stream, "cannot make the geofence events' stream; events are not published on NATS");
        return;
    }
    while let Some(batch) = rx.recv().await {
        for (n, fence, body) in batch {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Nats-Msg-Id", format!("{fence}:{n}").as_str());
            headers.insert("Geoshard-Event-Id", n.to_string().as_str());
            let subject = format!("{prefix}.{fence}");
            let acked = match inner.js.publish_with_headers(subject, headers, body).await {
                Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if let Err(e) = acked {
                tracing::warn!(error = %e, fence, event = n, "a geofence event was not published on NATS");
            }
        }
    }
}

async fn connect(
    settings: ClusterSettings,
    store: Arc<Store>,
    reload: Reloader,
) -> Result<Arc<Inner>, ClusterError> {
    let (client, js, max_payload) = nats(&settings).await?;
    log_stream(&js, &settings).await?;
    let (visible, _) = watch::channel(store.applied());
    if settings.secret.is_none() {
        tracing::warn!(
            "cluster_secret is not set: log entries and questions are not signed, and anyone \
             who can publish to the NATS servers can write and read as any user"
        );
    }
    let signer = trust::Signer::new(settings.secret.as_ref());
    status::check_secret(&js, &settings, &signer).await?;
    let (serving, keeps_all) = (settings.shards.clone(), settings.keeps_all);
    Ok(Arc::new(Inner {
        signer,
        refused: Mutex::new(Default::default()),
        direct: Default::default(),
        settings,
        client,
        js,
        peers: Mutex::new(Arc::new(Vec::new())),
        store,
        waiters: Mutex::new(crate::FastMap::default()),
        next_request: AtomicU64::new(1),
        visible,
        unsettled: watch::channel(Default::default()).0,
        caught_up: AtomicBool::new(false),
        filling: AtomicBool::new(false),
        serving: Mutex::new(serving),
        taking: Mutex::new(Vec::new()),
        letting_go: Mutex::new(Vec::new()),
        keeps_all: AtomicBool::new(keeps_all),
        max_payload,
        reload,
        http: Mutex::new(String::new()),
        boot: uuid::Uuid::new_v4().simple().to_string(),
        log_last: AtomicU64::new(0),
    }))
}

/// Removes a waiter that will not be answered (the publish failed or the write gave up).
struct Forget<'a>(&'a Inner, u64);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.0.waiters.lock().remove(&self.1);
    }
}

/// Publish a write, wait for JetStream's acknowledgement (the write is durable on a quorum
/// of NATS servers), then for this node's outcome of applying it.
async fn append(inner: Arc<Inner>, caller: Caller, ops: Vec<Op>) -> Result<Written, StoreError> {
    let payload = logged::encode(&caller, &ops);
    if payload.len() + ENVELOPE_BYTES > inner.max_payload {
        return Err(StoreError::TooLarge {
            size: payload.len(),
            max: inner.max_payload.saturating_sub(ENVELOPE_BYTES),
        });
    }
    let documents_only = ops
        .iter()
        .all(|op| matches!(op, Op::PutDocument(_) | Op::DeleteDocument { .. }));
    let subject = inner
        .settings
        .subject(if documents_only { "data" } else { "meta" });
    let id = inner.next_request.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = oneshot::channel();
    inner.waiters.lock().insert(id, tx);
    let _forget = Forget(&inner, id);
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(ORIGIN, inner.settings.node.as_str());
    headers.insert(REQUEST, id.to_string().as_str());
    // JetStream drops a second message with the same id, so a publish that failed without
    // an answer (a NATS server gone, the stream electing a leader) is sent again safely.
    let msg_id = format!("{}-{}-{id}", inner.settings.node, inner.boot);
    headers.insert("Nats-Msg-Id", msg_id.as_str());
    let request = id.to_string();
    inner.signer.sign_headers(
        &mut headers,
        &entry_parts(&subject, &inner.settings.node, &request, &msg_id, &payload),
    );
    let payload = bytes::Bytes::from(payload);
    let deadline = tokio::time::Instant::now() + PUBLISH_TIMEOUT;
    let seq = loop {
        let attempt = tokio::time::timeout_at(deadline, async {
            inner
                .js
                .publish_with_headers(subject.clone(), headers.clone(), payload.clone())
                .await?
                .await
        })
        .await;
        match attempt {
            Ok(Ok(ack)) => break ack.sequence,
            Ok(Err(e)) if tokio::time::Instant::now() + RETRY_PAUSE < deadline => {
                tracing::debug!(error = %e, "publishing again");
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            Ok(Err(e)) => return Err(StoreError::Log(e.to_string())),
            Err(_) => {
                return Err(StoreError::Log(format!(
                    "JetStream did not acknowledge the write within {} s; it may or may not land",
                    PUBLISH_TIMEOUT.as_secs()
                )));
            }
        }
    };
    // The limit is on applying the entry; once applied, an entry whose change takes effect
    // later (a view built in the background) is answered when it has, as on a single node.
    let mut applied = inner.visible.subscribe();
    tokio::pin!(rx);
    let first = tokio::time::timeout(APPLY_TIMEOUT, async {
        tokio::select! {
            outcome = &mut rx => Some(outcome),
            _ = applied.wait_for(|v| *v >= seq) => None,
        }
    })
    .await;
    let outcome = match first {
        Ok(Some(outcome)) => outcome,
        // Applied: its outcome follows (once a view it changes is built), unless the entry
        // was refused here for its signature and so answers nobody.
        Ok(None) => {
            if inner.refused.lock().contains(&seq) {
                return Err(StoreError::Log(format!(
                    "log entry {seq}, this write, was refused here for its signature (the \
                     node's log says why)"
                )));
            }
            rx.await
        }
        Err(_) => {
            return Err(StoreError::Log(format!(
                "the write is log entry {seq}, which this node has not applied within {} s",
                APPLY_TIMEOUT.as_secs()
            )));
        }
    };
    outcome.unwrap_or(Err(StoreError::ShuttingDown))
}

/// What a log entry's signature covers: the subject, who wrote it, its message id (which
/// JetStream deduplicates by) and the encoded entry.
fn entry_parts<'a>(
    subject: &'a str,
    origin: &'a str,
    request: &'a str,
    msg_id: &'a str,
    payload: &'a [u8],
) -> [&'a [u8]; 5] {
    [
        subject.as_bytes(),
        origin.as_bytes(),
        request.as_bytes(),
        msg_id.as_bytes(),
        payload,
    ]
}

/// Why a log entry is refused, if it is: its signature fails, or it was signed more than
/// [`FRESH`] from when JetStream stored it (a copy of an old entry published again). Every
/// node decides alike: the storing time is the stream's.
fn check_entry(inner: &Inner, message: &async_nats::Message, stored_ms: u64) -> Option<String> {
    let header = |name: &str| {
        message
            .headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map_or("", |v| v.as_str())
    };
    let parts = entry_parts(
        message.subject.as_str(),
        header(ORIGIN),
        header(REQUEST),
        header("Nats-Msg-Id"),
        &message.payload,
    );
    let signed = match inner.signer.check_headers(message.headers.as_ref(), &parts) {
        Ok(0) => return None,
        Ok(ms) => ms,
        Err(why) => return Some(why.to_string()),
    };
    (signed.abs_diff(stored_ms) > FRESH.as_millis() as u64).then(|| {
        format!(
            "signed {} s from when the log stored it (a copy of an older entry, or clocks \
             more than {} s apart)",
            signed.abs_diff(stored_ms) / 1000,
            FRESH.as_secs()
        )
    })
}

/// An entry handed to the store, waiting for its outcome.
struct Pending {
    seq: u64,
    /// The request id when this node wrote the entry.
    mine: Option<u64>,
    reload: Reload,
    /// Why the entry could not be decoded (it was applied as nothing).
    unreadable: Option<StoreError>,
    outcome: geoshard_core::oneshot::Receiver<Result<Written, StoreError>>,
    /// Its share of [`IN_FLIGHT_KIB`], given back when it is finished.
    _room: tokio::sync::OwnedSemaphorePermit,
}

/// Follow the log for as long as the node runs, starting again after a failure from the
/// entry after the last applied.
async fn follow(inner: Arc<Inner>) {
    loop {
        if let Err(e) = follow_once(&inner).await {
            tracing::warn!(error = %e, applied = inner.store.applied(), "following the log");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Bytes at most `rate` a second, on average since the first: `take` waits until that holds.
pub(crate) struct Pace {
    rate: u64,
    since: Option<tokio::time::Instant>,
    taken: u64,
}

impl Pace {
    pub(crate) fn new(rate: u64) -> Pace {
        Pace {
            rate,
            since: None,
            taken: 0,
        }
    }

    pub(crate) async fn take(&mut self, bytes: u64) {
        if self.rate == 0 {
            return;
        }
        let since = *self.since.get_or_insert_with(tokio::time::Instant::now);
        self.taken += bytes;
        let due = since + Duration::from_secs_f64(self.taken as f64 / self.rate as f64);
        tokio::time::sleep_until(due).await;
    }
}

async fn follow_once(inner: &Arc<Inner>) -> Result<(), ClusterError> {
    let start = inner.store.applied() + 1;
    // Entries the store applied after the last follower stopped taking outcomes are applied
    // and in the views: visible, with whatever users or flows they changed.
    if *inner.visible.borrow() < start - 1 {
        (inner.reload)(Reload {
            users: true,
            flows: true,
        });
        inner.visible.send_replace(start - 1);
    }
    let mut stream = inner
        .js
        .get_stream(inner.settings.stream())
        .await
        .map_err(js_error)?;
    let state = stream.info().await.map_err(js_error)?.state.clone();
    let last = state.last_sequence;
    if start < state.first_sequence {
        // Dropped after a snapshot while this node was away from the registry: only the
        // snapshot has them, and it is installed before the store opens.
        tracing::error!(
            applied = start - 1,
            log_first = state.first_sequence,
            "the log no longer holds the entries after the last this node applied; stopping \
             so that a restart installs the latest snapshot"
        );
        std::process::exit(3);
    }
    if last < start {
        inner.caught_up.store(true, Ordering::Release);
    }
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::OrderedConfig {
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: start,
            },
            ..Default::default()
        })
        .await
        .map_err(js_error)?;
    let mut messages = consumer.messages().await.map_err(js_error)?;
    tracing::info!(from = start, last, "following the log");
    let (tx, rx) = mpsc::channel::<Pending>(4096);
    let room = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT_KIB));
    let mut catching_up = Pace::new(inner.settings.catch_up_bytes);
    let (stop, mut stopped) = watch::channel(false);
    let finisher = tokio::spawn(finish(inner.clone(), rx, stop, last));
    // A consumer whose server went away can go quiet instead of failing: when the log holds
    // entries this node has not applied and none has come for STALL, it is made again.
    let mut watch = tokio::time::interval(Duration::from_secs(1));
    let mut quiet_since = tokio::time::Instant::now();
    // The last entry handed to the store.
    let mut handed = start - 1;
    let result = loop {
        let next = tokio::select! {
            _ = stopped.changed() => break Ok(()),
            _ = watch.tick() => {
                let behind = inner.log_last.load(Ordering::Relaxed) > handed;
                if behind && quiet_since.elapsed() > STALL {
                    break Err(ClusterError::JetStream(format!(
                        "no log entry for {} s while the log holds more; following again",
                        STALL.as_secs()
                    )));
                }
                continue;
            }
            next = messages.next() => next,
        };
        quiet_since = tokio::time::Instant::now();
        let Some(message) = next else {
            break Ok(());
        };
        let message = message.map_err(js_error)?;
        let seq = message.info().map_err(js_error)?.stream_sequence;
        let kib = (message.message.payload.len() / 1024 + 1).min(IN_FLIGHT_KIB) as u32;
        if !inner.caught_up.load(Ordering::Acquire) {
            let n = message.message.payload.len() as u64;
            geoshard_core::metrics::record(|m| {
                m.cluster_copied.with_label_values(&["log"]).inc_by(n)
            });
            catching_up.take(n).await;
        }
        let Ok(permit) = room.clone().acquire_many_owned(kib).await else {
            break Ok(());
        };
        let headers = message.message.headers.as_ref();
        let header = |name: &str| headers.and_then(|h| h.get(name)).map(|v| v.as_str());
        let stored = message.info().map_err(js_error)?.published;
        let stored_ms = (stored.unix_timestamp_nanos() / 1_000_000).max(0) as u64;
        let refused = check_entry(inner, &message.message, stored_ms);
        let mine = header(ORIGIN)
            .filter(|o| *o == inner.settings.node && refused.is_none())
            .and(header(REQUEST))
            .and_then(|r| r.parse::<u64>().ok());
        let (caller, ops, unreadable) = match refused {
            Some(why) => {
                trust::Refused::Entry.record(&format!("log entry {seq}: {why}"));
                let mut refused = inner.refused.lock();
                if refused.len() == 1024 {
                    refused.pop_front();
                }
                refused.push_back(seq);
                drop(refused);
                (
                    Caller::system(),
                    Vec::new(),
                    Some(StoreError::Log(format!(
                        "log entry {seq} was refused: {why}"
                    ))),
                )
            }
            None => match logged::decode(&message.message.payload) {
                Ok((caller, ops)) => (caller, ops, None),
                Err(e) => {
                    tracing::error!(seq, error = %e, "a log entry cannot be read; applied as nothing");
                    (Caller::system(), Vec::new(), Some(e))
                }
            },
        };
        let reload = Reload::of(&ops);
        let outcome = match inner.store.apply_logged(seq, caller, ops).await {
            Ok(o) => o,
            Err(e) => break Err(ClusterError::JetStream(e.to_string())),
        };
        handed = seq;
        let pending = Pending {
            seq,
            mine,
            reload,
            unreadable,
            outcome,
            _room: permit,
        };
        if tx.send(pending).await.is_err() {
            break Ok(());
        }
    };
    drop(tx);
    let _ = finisher.await;
    result
}

/// Take the outcomes of the entries handed to the store, in log order: make them visible,
/// reload what they changed, and answer this node's writers. A failure of this node's own
/// (its disk) stops the follower, which starts again from the last entry applied.
async fn finish(
    inner: Arc<Inner>,
    mut rx: mpsc::Receiver<Pending>,
    stop: watch::Sender<bool>,
    caught_up_at: u64,
) {
    let mut stopping = false;
    while let Some(p) = rx.recv().await {
        let mut outcome = p.outcome.await.unwrap_or(Err(StoreError::ShuttingDown));
        if stopping {
            continue;
        }
        match &outcome {
            // Applied before: a repeat delivery.
            Err(StoreError::Sequence { expected, got }) if got < expected => continue,
            Err(
                e @ (StoreError::Storage(_)
                | StoreError::Stopped(_)
                | StoreError::Full { .. }
                | StoreError::ShuttingDown
                | StoreError::Sequence { .. }
                | StoreError::Corrupt(_)),
            ) => {
                tracing::error!(seq = p.seq, error = %e, "a log entry could not be applied here");
                stopping = true;
                let _ = stop.send(true);
                continue;
            }
            _ => {}
        }
        if p.reload.any() {
            (inner.reload)(p.reload);
        }
        // An entry that takes effect later is unsettled until then; the entries after it go on.
        let settled = outcome.as_mut().ok().and_then(|w| w.settled.take());
        if settled.is_some() {
            inner.unsettled.send_modify(|u| {
                u.insert(p.seq);
            });
        }
        inner.visible.send_replace(p.seq);
        if p.seq >= caught_up_at {
            inner.caught_up.store(true, Ordering::Release);
        }
        let waiter = p.mine.and_then(|id| inner.waiters.lock().remove(&id));
        let answer = match p.unreadable {
            Some(e) => Err(e),
            None => outcome,
        };
        match settled {
            None => {
                if let Some(waiter) = waiter {
                    let _ = waiter.send(answer);
                }
            }
            // Its writer is answered once it has taken effect, so it reads its change.
            Some(settled) => {
                let (inner, seq) = (inner.clone(), p.seq);
                tokio::spawn(async move {
                    let _ = settled.await;
                    inner.unsettled.send_modify(|u| {
                        u.remove(&seq);
                    });
                    if let Some(waiter) = waiter {
                        let _ = waiter.send(answer);
                    }
                });
            }
        }
    }
}

/// Keep this node's registry entry alive while it runs.
async fn heartbeat(inner: Arc<Inner>) {
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut bucket = None;
    loop {
        if bucket.is_none() {
            match status::registry(&inner.js, &inner.settings).await {
                Ok(b) => bucket = Some(b),
                Err(e) => tracing::warn!(error = %e, "the node registry"),
            }
        }
        if let Ok(Some(info)) = tokio::time::timeout(HEARTBEAT, async {
            let mut stream = inner.js.get_stream(inner.settings.stream()).await.ok()?;
            stream.info().await.ok().cloned()
        })
        .await
        {
            let last = info.state.last_sequence;
            inner.log_last.store(last, Ordering::Relaxed);
        }
        if let Some(kv) = &bucket {
            let record = NodeRecord {
                node: inner.settings.node.clone(),
                http: inner.http.lock().clone(),
                applied: *inner.visible.borrow(),
                caught_up: inner.caught_up.load(Ordering::Acquire)
                    && !inner.filling.load(Ordering::Acquire),
                started,
                version: env!("CARGO_PKG_VERSION").to_string(),
                partition: inner.settings.partition.clone(),
                shards: inner.serving.lock().clone(),
                keeps_all: inner.keeps_all.load(Ordering::Acquire),
                snapshot_entries: inner.settings.snapshot_entries,
                ask: inner.direct.address.lock().clone(),
                auto: inner.settings.auto,
                taking: inner.taking.lock().clone(),
                letting_go: inner.letting_go.lock().clone(),
                mac: None,
            };
            let bytes = record.signed_bytes(&inner.signer);
            // Each call is bounded, so one that never answers cannot stop the renewals.
            match tokio::time::timeout(HEARTBEAT, kv.put(&inner.settings.node, bytes.into())).await
            {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "renewing the registry entry"),
                Err(_) => tracing::warn!("renewing the registry entry: no answer"),
            }
            match tokio::time::timeout(HEARTBEAT, status::live_nodes(kv, &inner.signer)).await {
                Ok(Ok(nodes)) => *inner.peers.lock() = Arc::new(nodes),
                Ok(Err(e)) => tracing::warn!(error = %e, "reading the node registry"),
                Err(_) => tracing::warn!("reading the node registry: no answer"),
            }
        }
        tokio::time::sleep(HEARTBEAT).await;
    }
}
