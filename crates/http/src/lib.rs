//! The only module that knows hyper: the accept loop, connection limits, graceful shutdown,
//! authentication at the edge, routing by method and path, and one file per endpoint family.
//!
//! Handlers turn requests into calls on the domain layers (`store`, `security`, `features`,
//! `flow`) and their results into responses. Every error leaves as an `errorResponse` body;
//! a panic in a handler becomes a 500, never a dropped connection.

// Sibling crates under the module names the code uses.
use geoshard_auth as security;
use geoshard_cluster as cluster;
use geoshard_config as config;
use geoshard_core::{acl, cpu, error, metrics, time};
use geoshard_features as features;
use geoshard_flow as flow;
use geoshard_spatial as spatial;
use geoshard_store as store;

mod arcgis;
mod basemap;
pub mod conn;
mod documents;
mod feature_service;
pub mod fences;
mod flows;
pub mod io_threads;
mod manage;
mod map;
pub mod multipart;
mod names;
mod ogc;
pub mod params;
pub mod poll;
pub mod response;
mod router;
mod tiles;
mod wire;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::FutureExt;
use hyper::header::CONTENT_LENGTH;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use self::io_threads::IoThreads;
use crate::acl::{Caller, Role};
use crate::config::Config;
use crate::error::{ApiError, ErrorCode};
use crate::features::Features;
use crate::flow::Flows;
use crate::security::Security;
use crate::store::Store;

/// Everything a request handler can reach. One per running service.
pub struct App {
    pub config: Config,
    pub store: Arc<Store>,
    pub security: Security,
    pub features: Arc<Features>,
    pub flows: Arc<Flows>,
    /// For `/health`.
    pub started: Instant,
    /// Cluster mode: this node's membership (set once, after the views are built).
    pub cluster: std::sync::OnceLock<Arc<crate::cluster::Cluster>>,
    /// Cluster mode with placed shards: queries are routed over the nodes (set with `cluster`).
    pub spread: std::sync::OnceLock<Arc<crate::cluster::spread::Spread>>,
    /// The low zooms' simplified geometries, for tiles (`tile_cache_bytes`).
    pub(crate) simplified: crate::features::mvt::Simplified,
    /// Each commit's geofence events, for the event streams and webhooks.
    pub events: Arc<fences::Hub>,
    /// Webhook delivery of geofence events.
    pub webhooks: Arc<fences::Webhooks>,
}

/// What every handler gets besides the body (made by the router, read by the handlers).
pub(crate) struct Ctx {
    pub caller: crate::acl::Caller,
    pub params: params::Params,
    pub headers: hyper::HeaderMap,
    pub path: String,
}

/// Each layer's data extent over every node, by layer id, for service `service` (the OGC
/// collections' and TileJSON's bounds); `None` when this node answers alone.
pub(crate) async fn spread_extents(
    app: &App,
    ctx: &Ctx,
    service: &str,
) -> Result<Option<std::collections::HashMap<i64, crate::spatial::pip::BBox>>, ApiError> {
    match app.spread() {
        None => Ok(None),
        Some(spread) => {
            crate::cluster::spread::layer_extents(spread, &ctx.caller, ctx.after(), service).await
        }
    }
}

impl Ctx {
    /// The log entry the request's `X-Geoshard-After` names (0 for none; the router has
    /// checked it).
    pub(crate) fn after(&self) -> u64 {
        self.headers
            .get(names::AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    }
}

impl App {
    /// The routing of queries when this node's views hold some shards only, else `None`.
    pub(crate) fn spread(&self) -> Option<&Arc<crate::cluster::spread::Spread>> {
        self.spread.get()
    }

    /// The deadline of a query starting now and the limit it comes from
    /// (`query_time_limit_ms`); `None` without a limit.
    pub(crate) fn query_limit(&self) -> Option<(Instant, u64)> {
        let ms = self.config.query_time_limit_ms;
        (ms > 0).then(|| (Instant::now() + Duration::from_millis(ms), ms))
    }

    /// The state served for an opened engine: `node` opens the store, security, features and
    /// flows, and hands them here.
    pub fn new(
        config: Config,
        store: Arc<Store>,
        security: Security,
        features: Arc<Features>,
        flows: Arc<Flows>,
    ) -> App {
        let events = Arc::new(fences::Hub::default());
        let hub = events.clone();
        features.on_events(Arc::new(move |first, records| hub.publish(first, records)));
        let dir = store.path().parent().unwrap_or(std::path::Path::new("."));
        let webhooks = Arc::new(fences::Webhooks::open(
            dir,
            config.webhook_retries,
            config.webhook_failed_keep,
        ));
        App {
            events,
            webhooks,
            simplified: crate::features::mvt::Simplified::new(config.tile_cache_bytes),
            config,
            store,
            security,
            features,
            flows,
            started: Instant::now(),
            cluster: std::sync::OnceLock::new(),
            spread: std::sync::OnceLock::new(),
        }
    }
}

/// A bound, not yet serving, HTTP server.
pub struct Server {
    listener: TcpListener,
    app: Arc<App>,
}

impl Server {
    /// Bind the listening socket with a queue of `listen_backlog` connections: a burst of
    /// new connections waits there for the accept loop (which answers each, a 503 past the
    /// limits) instead of having its SYNs dropped, which costs a client a second.
    pub fn listen(config: &Config) -> std::io::Result<TcpListener> {
        let addr = config.listen;
        let listen = || -> std::io::Result<TcpListener> {
            let socket = if addr.is_ipv4() {
                tokio::net::TcpSocket::new_v4()?
            } else {
                tokio::net::TcpSocket::new_v6()?
            };
            socket.set_reuseaddr(true)?;
            socket.bind(addr)?;
            socket.listen(config.listen_backlog)
        };
        listen()
    }

    /// The server of `app` on a socket from [`Server::listen`].
    pub fn new(listener: TcpListener, app: Arc<App>) -> Server {
        Server { listener, app }
    }

    /// Serve until `shutdown` resolves; then stop accepting and let in-flight requests finish
    /// (up to the grace period). What is saved at the end is the caller's (`node`).
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let Server { listener, app } = self;
        let graceful = GracefulShutdown::new();
        let permits = Arc::new(Semaphore::new(app.config.max_connections));
        let mut reserve = conn::Reserve::new(app.config.reserve_connections);
        let shedding = Arc::new(Semaphore::new(MAX_SHEDDING));
        // One io thread: connections are served right here, on the accept loop's runtime.
        // More: each goes to its own thread (see `io_threads`).
        let io = IoThreads::start(
            app.config.io_thread_count(),
            "geoshard-io",
            app.config.pin_io_threads,
            Duration::from_micros(app.config.io_poll_us),
        )
        .unwrap_or_else(|e| {
            tracing::error!(error = %e, "cannot start the io threads; serving on this one");
            IoThreads::none()
        });
        let pinned = io.pinned_cpus();
        if !pinned.is_empty() {
            tracing::info!(cpus = ?pinned, "io threads bound to CPUs");
        }
        let webhooks = tokio::spawn(fences::follow_webhooks(app.clone()));
        let published = tokio::spawn(fences::follow_cluster(app.clone()));
        tokio::pin!(shutdown);
        loop {
            let (stream, peer) = tokio::select! {
                _ = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Usually EMFILE: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            // Past the limit, the reserve; past that, a 503 at once instead of a wait.
            let (permit, in_reserve) = match permits.clone().try_acquire_owned() {
                Ok(p) => (Some(p), false),
                Err(_) if reserve.admit() => (None, true),
                Err(_) => {
                    crate::metrics::record(|m| m.shed.with_label_values(&["connections"]).inc());
                    if let Ok(slot) = shedding.clone().try_acquire_owned() {
                        tokio::spawn(async move {
                            shed(stream).await;
                            drop(slot);
                        });
                    }
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let (stream, placement) = match io.place(stream) {
                Ok(placed) => placed,
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "cannot hand a connection to an io thread");
                    continue;
                }
            };
            let idle = Duration::from_secs(app.config.idle_timeout_secs);
            let head = Duration::from_secs(app.config.header_timeout_secs);
            let app = app.clone();
            let activity = Arc::new(conn::Activity::new(Some(peer.ip()), in_reserve));
            let seen = activity.clone();
            let service = service_fn(move |req| {
                poll::note_request();
                let app = app.clone();
                let busy = seen.begin();
                async move {
                    let resp = handle_on(app, Some(busy.activity()), req).await;
                    // A streamed answer (a fence's events) keeps the connection busy while
                    // it lasts.
                    Ok::<_, Infallible>(response::with_stream(resp, busy))
                }
            });
            // Half-closed: a client may shut down its side once its request is sent and
            // still get the answer (by default hyper drops the request on that EOF).
            let conn = http1::Builder::new()
                .keep_alive(true)
                .half_close(true)
                .serve_connection(
                    TokioIo::new(wire::Wire::watched(stream, activity.clone())),
                    service,
                );
            let conn = graceful.watch(conn);
            let runtime = placement.runtime().clone();
            crate::metrics::record(|m| m.connections_open.inc());
            let task = runtime.spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                crate::metrics::record(|m| m.connections_open.dec());
                drop(permit);
                drop(placement);
            });
            if in_reserve {
                reserve.hold(activity.clone(), task.abort_handle());
            }
            runtime.spawn(conn::watch(activity, task, idle, head));
        }
        drop(listener);
        tracing::info!("shutting down: finishing in-flight requests");
        // Event streams end; webhooks stop where their cursors say, to resume at the next start.
        app.events.close();
        webhooks.abort();
        published.abort();
        app.webhooks.stop();
        let grace = Duration::from_secs(app.config.shutdown_grace_secs);
        if tokio::time::timeout(grace, graceful.shutdown())
            .await
            .is_err()
        {
            tracing::warn!("grace period over; closing remaining connections");
        }
        if !io.is_empty() {
            // Whatever is left on them past the grace period is dropped with them.
            let _ = tokio::task::spawn_blocking(move || io.stop()).await;
        }
        tracing::info!("no longer serving");
    }
}

/// Answer every connection on `listener` while the service starts (its store opening, its
/// views building, its cluster joining): `/health` says it is alive and starting, `/ready`
/// and every other route answer 503 with `Retry-After`, each on a connection of its own.
/// Never ends: it stops when dropped, and the connections it has taken end by themselves.
pub async fn answer_while_starting(
    listener: &TcpListener,
    since: Instant,
    pace: conn::Pace,
) -> Infallible {
    let answering = Arc::new(Semaphore::new(MAX_SHEDDING));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        // Past the limit, closed without an answer, as past every limit later.
        let Ok(slot) = answering.clone().try_acquire_owned() else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let service = service_fn(
                move |req: hyper::Request<hyper::body::Incoming>| async move {
                    let path = req.uri().path().to_string();
                    // Some of the body read and dropped, so that the client's system does not
                    // reset the connection before it reads the answer.
                    conn::drain(req.into_body(), STARTING_DRAIN_BYTES, pace).await;
                    Ok::<_, Infallible>(while_starting(&path, since))
                },
            );
            let conn = http1::Builder::new()
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(Duration::from_secs(10), conn).await;
            drop(slot);
        });
    }
}

/// The most of a body read (and dropped) before a starting answer.
pub const STARTING_DRAIN_BYTES: u64 = 64 * 1024;

/// The answer to a request for `path` while the service starts.
pub fn while_starting(path: &str, since: Instant) -> response::Resp {
    let uptime = since.elapsed().as_secs();
    let mut resp = match path {
        "/health" => response::json_value(
            200,
            &serde_json::json!({
                "status": "starting",
                "version": env!("CARGO_PKG_VERSION"),
                "uptimeSecs": uptime,
            }),
        ),
        "/ready" => response::json_value(503, &serde_json::json!({"status": "starting"})),
        _ => response::error(&ApiError::new(
            ErrorCode::Unavailable,
            "the server is starting (opening its store, building its views); retry shortly",
        )),
    };
    let headers = resp.headers_mut();
    if path != "/health" {
        headers.insert(
            hyper::header::RETRY_AFTER,
            hyper::header::HeaderValue::from_static("1"),
        );
    }
    headers.insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("close"),
    );
    resp
}

/// Connections being turned away at once; past it, one is closed without an answer.
pub const MAX_SHEDDING: usize = 256;

/// Answer a connection past every limit: a 503 with `Retry-After`, then close. What the
/// client sends meanwhile is read and dropped for a moment (a lingering close), so that its
/// system does not reset the connection before it reads the answer.
pub async fn shed(mut stream: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let error = ApiError::new(
        ErrorCode::Unavailable,
        "the server is at its connection limit (max_connections); retry shortly",
    );
    let body = error.to_body();
    let status = error.status();
    let mut answer = format!(
        "HTTP/1.1 {status} {}\r\nretry-after: 1\r\nconnection: close\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        crate::error::reason_phrase(status),
        body.len()
    )
    .into_bytes();
    answer.extend_from_slice(&body);
    let linger = async {
        stream.write_all(&answer).await?;
        stream.shutdown().await?;
        let mut scratch = [0u8; 4096];
        let mut left: usize = 64 * 1024;
        while left > 0 {
            let n = stream.read(&mut scratch).await?;
            if n == 0 {
                break;
            }
            left = left.saturating_sub(n);
        }
        Ok::<_, std::io::Error>(())
    };
    let _ = tokio::time::timeout(Duration::from_millis(500), linger).await;
}

/// A request body error, whatever the body type.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Handle one request: authenticate, route, answer. Public so that benchmarks can drive
/// the whole request path in process with any body type.
pub async fn handle<B>(app: Arc<App>, req: hyper::Request<B>) -> response::Resp
where
    B: hyper::body::Body<Data = Bytes> + Send + Unpin,
    B::Error: Into<BoxError>,
{
    handle_on(app, None, req).await
}

/// Most of a request body drained after an answer that did not read it, so that the
/// connection can take its next request; past it the connection is closed instead.
const DRAIN_BYTES: u64 = 1024 * 1024;

/// [`handle`], for a request of the connection whose state is `conn`.
pub async fn handle_on<B>(
    app: Arc<App>,
    conn: Option<&conn::Activity>,
    req: hyper::Request<B>,
) -> response::Resp
where
    B: hyper::body::Body<Data = Bytes> + Send + Unpin,
    B::Error: Into<BoxError>,
{
    let (parts, body) = req.into_parts();
    let expects_continue = parts
        .headers
        .get(hyper::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let started = Instant::now();
    let route = router::label(parts.uri.path());
    let method = parts.method.clone();
    let request_id = request_id(&parts.headers);
    let span = tracing::info_span!("request", id = %request_id);
    crate::metrics::record(|m| m.in_flight.inc());
    let back = conn::Back::default();
    let req = hyper::Request::from_parts(parts, conn::Tracked::new(body, &back));
    let dispatched = tracing::Instrument::instrument(
        std::panic::AssertUnwindSafe(router::dispatch(&app, conn, req)).catch_unwind(),
        span.clone(),
    )
    .await;
    let mut resp = match dispatched {
        Ok(resp) => resp,
        Err(_) => {
            span.in_scope(|| tracing::error!("request handler panicked"));
            response::error(&ApiError::new(
                ErrorCode::Internal,
                "internal error while handling the request",
            ))
        }
    };
    if let Ok(v) = hyper::header::HeaderValue::from_str(&request_id) {
        resp.headers_mut().insert(REQUEST_ID, v);
    }
    if let Some(cluster) = app.cluster.get() {
        resp.headers_mut()
            .insert(names::SEQUENCE, cluster.visible().into());
    }
    let status = resp.status();
    let bytes_out = hyper::body::Body::size_hint(resp.body())
        .exact()
        .unwrap_or(0);
    let elapsed = started.elapsed();
    crate::metrics::record(|m| {
        m.in_flight.dec();
        m.requests
            .with_label_values(&[route, method_label(&method), status.as_str()])
            .inc();
        m.duration
            .with_label_values(&[route])
            .observe(elapsed.as_secs_f64());
        m.bytes_out.inc_by(bytes_out);
    });
    if app.config.access_log {
        let user = resp
            .extensions()
            .get::<User>()
            .map_or("-", |u| u.0.as_str());
        span.in_scope(|| {
            tracing::info!(
                method = method.as_str(),
                route,
                status = status.as_u16(),
                bytes = bytes_out,
                duration_us = elapsed.as_micros() as u64,
                user,
                "request"
            )
        });
    }
    // An answer given before the body was read (a challenge, a bad parameter): read the rest
    // so the connection can go on, or say it closes. A body behind `Expect: 100-continue`
    // that nobody polled was never sent; a body too slow is not waited for again.
    let left = back.lock().take();
    if let Some(left) = left
        && !left.body.is_end_stream()
    {
        let sent = left.polled || !expects_continue;
        let keep = sent
            && resp.status() != hyper::StatusCode::REQUEST_TIMEOUT
            && conn::drain(left.body, DRAIN_BYTES, pace(&app.config)).await;
        if !keep {
            resp.headers_mut().insert(
                hyper::header::CONNECTION,
                hyper::header::HeaderValue::from_static("close"),
            );
        }
    }
    resp
}

/// The header that carries a request's id, in and out.
const REQUEST_ID: hyper::header::HeaderName =
    hyper::header::HeaderName::from_static("x-request-id");

/// The id a client sent in `X-Request-Id` (up to 128 visible ASCII characters), else a new
/// one: unique in this process, and across restarts through a random prefix.
fn request_id(headers: &hyper::HeaderMap) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static PREFIX: std::sync::LazyLock<u32> = std::sync::LazyLock::new(rand::random);
    if let Some(sent) = headers.get(REQUEST_ID).and_then(|v| v.to_str().ok())
        && !sent.is_empty()
        && sent.len() <= 128
        && sent.bytes().all(|b| b.is_ascii_graphic())
    {
        return sent.to_string();
    }
    format!(
        "{:08x}-{:012x}",
        *PREFIX,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A method as a metrics label: the ones the API knows, else `other` (labels stay few).
fn method_label(m: &hyper::Method) -> &'static str {
    match *m {
        hyper::Method::GET => "GET",
        hyper::Method::HEAD => "HEAD",
        hyper::Method::PUT => "PUT",
        hyper::Method::POST => "POST",
        hyper::Method::DELETE => "DELETE",
        hyper::Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// How fast request bodies must arrive (`body_min_bytes_per_sec` after
/// `header_timeout_secs`).
pub fn pace(config: &Config) -> conn::Pace {
    conn::Pace {
        grace: Duration::from_secs(config.header_timeout_secs),
        min_rate: config.body_min_bytes_per_sec,
    }
}

/// Read a request body, refusing anything above the configured limit with a 413.
pub(crate) async fn read_body<B>(
    app: &App,
    headers: &hyper::HeaderMap,
    body: B,
) -> Result<Bytes, ApiError>
where
    B: hyper::body::Body<Data = Bytes> + Send + Unpin,
    B::Error: Into<BoxError>,
{
    let limit = app.config.max_body_bytes;
    let too_large = || {
        ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!("request body is larger than the limit of {limit} bytes"),
        )
    };
    if let Some(len) = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        && len > limit
    {
        return Err(too_large());
    }
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    // Frame by frame, without a list of buffers: a small body comes as one frame, which is
    // returned as it is, with no copy. Each frame must come by the pace's deadline.
    let mut body = body;
    let pace = pace(&app.config);
    let start = tokio::time::Instant::now();
    let mut whole: Option<Bytes> = None;
    let mut joined: Vec<u8> = Vec::new();
    loop {
        let read = whole.as_ref().map_or(joined.len(), Bytes::len) as u64;
        let frame = match pace.frame(&mut body, start, read).await {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(()) => {
                return Err(ApiError::new(
                    ErrorCode::RequestTimeout,
                    format!(
                        "the request body arrived slower than body_min_bytes_per_sec ({} \
                         bytes a second after {} seconds)",
                        pace.min_rate,
                        pace.grace.as_secs()
                    ),
                ));
            }
        };
        let frame = frame.map_err(|e| {
            ApiError::new(
                ErrorCode::InvalidRequest,
                format!("cannot read the request body: {}", e.into()),
            )
        })?;
        // Trailers carry nothing the service reads.
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let size = whole.as_ref().map_or(joined.len(), Bytes::len) + data.len();
        if size > limit {
            return Err(too_large());
        }
        if whole.is_none() && joined.is_empty() {
            whole = Some(data);
            continue;
        }
        if let Some(first) = whole.take() {
            joined.reserve(size);
            joined.extend_from_slice(&first);
        }
        joined.extend_from_slice(&data);
    }
    let body = whole.unwrap_or_else(|| Bytes::from(joined));
    crate::metrics::record(|m| m.bytes_in.inc_by(body.len() as u64));
    Ok(body)
}

/// A connection taken from the reserve (past max_connections) serves admins only: the
/// answer to anyone else.
pub(crate) fn reserve_refusal(
    conn: Option<&conn::Activity>,
    caller: &crate::acl::Caller,
) -> Option<response::Resp> {
    if conn.is_none_or(|c| !c.reserve) || caller.has(crate::acl::Role::Admin) {
        return None;
    }
    crate::metrics::record(|m| m.shed.with_label_values(&["reserve"]).inc());
    let mut r = response::error(&ApiError::new(
        ErrorCode::Unavailable,
        "the server is at its connection limit (max_connections); retry shortly",
    ));
    r.headers_mut().insert(
        hyper::header::RETRY_AFTER,
        hyper::header::HeaderValue::from(1u32),
    );
    r.headers_mut().insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("close"),
    );
    Some(r)
}

/// The authenticated user of a request, on its answer for the access log.
#[derive(Clone)]
pub(crate) struct User(pub String);

/// A 403 unless the caller holds one of `roles`.
pub(crate) fn require_any(caller: &Caller, roles: &[Role]) -> Result<(), ApiError> {
    if roles.iter().any(|r| caller.has(*r)) {
        return Ok(());
    }
    let names: Vec<&str> = roles.iter().map(|r| r.name()).collect();
    Err(ApiError::new(
        ErrorCode::SecPriv,
        format!(
            "user {} needs one of the roles: {}",
            caller.name(),
            names.join(", ")
        ),
    ))
}
