//! The only module that knows hyper: the accept loop, connection limits, graceful shutdown,
//! authentication at the edge, routing by method and path, and one file per endpoint family.
//!
//! Handlers turn requests into calls on the domain layers (`store`, `security`, `features`,
//! `flow`) and their results into responses. Every error leaves as an `errorResponse` body;
//! a panic in a handler becomes a 500, never a dropped connection.

mod documents;
mod features;
mod flows;
pub mod io_threads;
mod manage;
pub(crate) mod multipart;
pub mod params;
pub mod poll;
pub mod response;
mod router;
mod wire;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::FutureExt;
use http_body_util::BodyExt;
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
use crate::features::{FeatureHook, FeatureSettings, Features};
use crate::flow::js::JsSettings;
use crate::flow::{FlowSettings, Flows};
use crate::security::{HeaderCache, Security};
use crate::spatial::EngineConfig;
use crate::store::{Store, StoreOptions};

/// Everything a request handler can reach. One per running service.
pub struct App {
    pub config: Config,
    pub store: Arc<Store>,
    pub security: Security,
    pub features: Arc<Features>,
    pub flows: Arc<Flows>,
    /// For `/health`.
    pub started: Instant,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Security(#[from] crate::security::SecurityError),
    #[error("the project cannot be deployed:\n  {}", .0.join("\n  "))]
    Deploy(Vec<String>),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

impl App {
    /// Open the store in the configured data directory and load the users.
    pub fn open(config: Config) -> Result<Arc<App>, StartError> {
        let store = Arc::new(Store::open(
            &config.data_dir,
            StoreOptions {
                commit_batch_max: config.commit_batch_max,
                write_queue: config.write_queue,
                cache_bytes: config.store_cache_bytes,
            },
        )?);
        let security = Security::open(
            &store,
            &config.realm,
            crate::security::NonceLimits {
                ttl_secs: config.nonce_ttl_secs,
                idle_secs: config.nonce_idle_secs,
                capacity: config.nonce_capacity,
                per_user: config.nonce_per_user,
            },
        )?;
        let features = Features::open(
            store.clone(),
            FeatureSettings {
                engine: EngineConfig {
                    shards: config.shards,
                    resolution: config.h3_resolution,
                },
                max_record_count: config.max_record_count,
                where_limits: crate::features::sql::WhereLimits {
                    max_bytes: config.max_where_bytes,
                    max_depth: config.max_where_depth,
                },
                max_query_vertices: config.max_query_vertices,
                max_document_vertices: config.max_document_vertices,
            },
        )?;
        store.set_hook(Arc::new(FeatureHook(features.clone())));
        if let Some(dir) = &config.project {
            let files = crate::flow::project::read_dir(dir).map_err(StartError::Deploy)?;
            let project =
                crate::flow::deploy_blocking(&store, &files).map_err(StartError::Deploy)?;
            for w in &project.warnings {
                tracing::warn!("{w}");
            }
        }
        let flows = Flows::open(
            store.clone(),
            FlowSettings {
                js: JsSettings {
                    workers: config.js_pool_size,
                    time_limit: Duration::from_millis(config.js_time_limit_ms),
                    memory_limit: config.js_memory_limit_bytes,
                },
                tracing: config.flow_tracing,
            },
        )?;
        Ok(Arc::new(App {
            config,
            store,
            security,
            features,
            flows,
            started: Instant::now(),
        }))
    }
}

/// A bound, not yet serving, HTTP server.
pub struct Server {
    listener: TcpListener,
    app: Arc<App>,
}

impl Server {
    pub async fn bind(app: Arc<App>) -> Result<Server, StartError> {
        let addr = app.config.listen;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Listen { addr, source })?;
        Ok(Server { listener, app })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap_or(self.app.config.listen)
    }

    /// Serve until `shutdown` resolves; then stop accepting, let in-flight requests finish
    /// (up to the grace period), and commit and close the store.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let Server { listener, app } = self;
        let graceful = GracefulShutdown::new();
        let permits = Arc::new(Semaphore::new(app.config.max_connections));
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
        tokio::pin!(shutdown);
        loop {
            let permit = tokio::select! {
                _ = &mut shutdown => break,
                p = permits.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
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
            let _ = stream.set_nodelay(true);
            let (stream, placement) = match io.place(stream) {
                Ok(placed) => placed,
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "cannot hand a connection to an io thread");
                    continue;
                }
            };
            let idle = Duration::from_secs(app.config.idle_timeout_secs);
            let app = app.clone();
            let activity = Arc::new(Activity::default());
            let seen = activity.clone();
            let service = service_fn(move |req| {
                poll::note_request();
                let app = app.clone();
                let busy = seen.begin();
                async move {
                    let resp = handle_on(app, Some(&busy.0.digest), req).await;
                    drop(busy);
                    Ok::<_, Infallible>(resp)
                }
            });
            // Half-closed: a client may shut down its side once its request is sent and
            // still get the answer (by default hyper drops the request on that EOF).
            let conn = http1::Builder::new()
                .keep_alive(true)
                .half_close(true)
                .serve_connection(TokioIo::new(wire::Wire::new(stream)), service);
            let conn = graceful.watch(conn);
            let runtime = placement.runtime().clone();
            let task = runtime.spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                drop(permit);
                drop(placement);
            });
            runtime.spawn(close_when_idle(activity, task, idle));
        }
        drop(listener);
        tracing::info!("shutting down: finishing in-flight requests");
        let grace = Duration::from_secs(app.config.shutdown_grace_secs);
        if tokio::time::timeout(grace, graceful.shutdown())
            .await
            .is_err()
        {
            tracing::warn!("grace period over; closing remaining connections");
        }
        app.store.shutdown().await;
        if !io.is_empty() {
            // Whatever is left on them past the grace period is dropped with them.
            let _ = tokio::task::spawn_blocking(move || io.stop()).await;
        }
        tracing::info!("stopped");
    }
}

/// What a connection keeps between its requests. Its idle watchdog reads requests started
/// and requests in flight, counted on the request path instead of a per-request timer
/// (hyper's header-read timeout arms and cancels a timer-wheel entry for every request).
#[derive(Default)]
struct Activity {
    started: AtomicU64,
    in_flight: AtomicU32,
    /// The connection's last Digest header, so that the next one, which differs only in
    /// `nc` and `response`, is bound instead of parsed.
    digest: HeaderCache,
}

/// Marks a request in flight until dropped (also when the handler future is dropped).
struct Busy(Arc<Activity>);

impl Activity {
    fn begin(self: &Arc<Self>) -> Busy {
        self.started.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Busy(self.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Close a connection that starts no request for a whole `idle` period with none in flight
/// (so after between one and two periods of silence): an idle keep-alive, or a client that
/// never completes a request head (slowloris). Ends with the connection's task.
async fn close_when_idle(
    activity: Arc<Activity>,
    mut task: tokio::task::JoinHandle<()>,
    idle: Duration,
) {
    let mut last = activity.started.load(Ordering::Relaxed);
    loop {
        tokio::select! {
            _ = &mut task => return,
            _ = tokio::time::sleep(idle) => {}
        }
        let now = activity.started.load(Ordering::Relaxed);
        if now == last && activity.in_flight.load(Ordering::Relaxed) == 0 {
            tracing::debug!("closing an idle connection");
            task.abort();
            return;
        }
        last = now;
    }
}

/// A request body error, whatever the body type.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Handle one request: authenticate, route, answer. Public so that benchmarks can drive
/// the whole request path in process with any body type.
pub async fn handle<B>(app: Arc<App>, req: hyper::Request<B>) -> response::Resp
where
    B: hyper::body::Body<Data = Bytes> + Send,
    B::Error: Into<BoxError>,
{
    handle_on(app, None, req).await
}

/// [`handle`], for a request of a connection that keeps its last Digest header in `kept`.
pub async fn handle_on<B>(
    app: Arc<App>,
    kept: Option<&HeaderCache>,
    req: hyper::Request<B>,
) -> response::Resp
where
    B: hyper::body::Body<Data = Bytes> + Send,
    B::Error: Into<BoxError>,
{
    match std::panic::AssertUnwindSafe(router::dispatch(&app, kept, req))
        .catch_unwind()
        .await
    {
        Ok(resp) => resp,
        Err(_) => {
            tracing::error!("request handler panicked");
            response::error(&ApiError::new(
                ErrorCode::Internal,
                "internal error while handling the request",
            ))
        }
    }
}

/// Read a request body, refusing anything above the configured limit with a 413.
pub(crate) async fn read_body<B>(
    app: &App,
    headers: &hyper::HeaderMap,
    body: B,
) -> Result<Bytes, ApiError>
where
    B: hyper::body::Body<Data = Bytes> + Send,
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
    // returned as it is, with no copy.
    let mut body = std::pin::pin!(body);
    let mut whole: Option<Bytes> = None;
    let mut joined: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
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
    Ok(whole.unwrap_or_else(|| Bytes::from(joined)))
}

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
