//! One `Config` for the whole service: defaults < `geoshard.toml` < `GEOSHARD_*` environment
//! < command-line flags.
//!
//! Every bound the service enforces (body size, queues, caches, connections) is a setting
//! here, with its default and its reason. The file and the environment go through the same
//! `set(key, text)` function, so a setting has one spelling and one parser: `data_dir` in the
//! file is `GEOSHARD_DATA_DIR` in the environment.

// Sibling crates under the module names the code uses.
use geoshard_features as features;
use geoshard_spatial as spatial;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use geoshard_core::secret::Secret;
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("unknown setting {0:?}")]
    UnknownKey(String),
    #[error("setting {key}: {message}")]
    BadValue { key: String, message: String },
    #[error("cannot read config file {path}: {message}")]
    File { path: String, message: String },
}

/// The settings of a running service.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Where the redb store lives; created if missing.
    pub data_dir: PathBuf,
    /// The address the HTTP server binds; port 0 picks a free port.
    pub listen: SocketAddr,
    /// Largest request body accepted; larger is a 413. Bounds memory per request.
    pub max_body_bytes: u64,
    /// Open connections served at once. Past it a connection is answered 503 (with
    /// `Retry-After`) and closed at once, unless the reserve takes it. Bounds memory and tasks.
    pub max_connections: usize,
    /// Connections the kernel queues for the accept loop; a burst larger than this has
    /// connections refused for a second (their SYNs dropped). The kernel caps it at
    /// `net.core.somaxconn`.
    pub listen_backlog: u32,
    /// Connections past `max_connections` kept for `/health` and admins, so that an operator
    /// can still look in while ordinary clients are turned away; other requests on them get
    /// a 503.
    pub reserve_connections: usize,
    /// Longest time a request head may take to arrive, from the connection's opening or the
    /// first byte after the last request; past it the client gets a 408 and the connection is
    /// closed. Also the grace before `body_min_bytes_per_sec` applies.
    pub header_timeout_secs: u64,
    /// Slowest a request body may arrive, on average, after the first `header_timeout_secs`;
    /// slower is a 408 and the connection is closed. 0 = no minimum.
    pub body_min_bytes_per_sec: u64,
    /// Longest a geoQueryService request may run; past it the answer is a 503 naming the limit
    /// and the work stops at its next check. 0 = no limit.
    pub query_time_limit_ms: u64,
    /// Failed authentications one client address (an IPv6 /64) may make in a minute; past it
    /// its requests get a 429 with `Retry-After` until the minute is over. 0 = no limit.
    pub auth_failures_per_address: u32,
    /// Failed authentications naming one user in a minute, from anywhere; past it requests
    /// naming that user get a 429 until the minute is over. Above the address limit, so that
    /// one address cannot lock a user out. 0 = no limit.
    pub auth_failures_per_user: u32,
    /// The authentication realm of the Digest and Basic challenges.
    pub realm: String,
    /// How long an issued Digest nonce may wait for its first use; after it, the client gets
    /// `stale=true` and a new one.
    pub nonce_ttl_secs: u64,
    /// How long a Digest nonce in use stays in memory without being used; then its highest
    /// `nc` goes to the store, and it stays valid; at least `nonce_ttl_secs`.
    pub nonce_idle_secs: u64,
    /// How long a Digest nonce is valid from its issue, however it is used, across restarts
    /// and nodes; then `stale=true`. At least `nonce_idle_secs`.
    pub nonce_lifetime_secs: u64,
    /// Most Digest nonces tracked in memory for replay checks, over all users. A nonce pushed
    /// out keeps its highest `nc` in the store (ten times this many are kept there).
    pub nonce_capacity: usize,
    /// Most Digest nonces tracked for one user, so that one user's clients cannot push
    /// another's nonces out; past it the user's least recently used goes.
    pub nonce_per_user: usize,
    /// Most writes one group commit takes; bounds the writer's batch memory.
    pub commit_batch_max: usize,
    /// Writes waiting for the writer; a full queue makes writers wait (back-pressure).
    pub write_queue: usize,
    /// The store's page cache, in bytes.
    pub store_cache_bytes: usize,
    /// Each commit also records the store's allocator state (two-phase), so that opening it
    /// after a crash takes milliseconds instead of a walk of the whole file.
    pub store_quick_repair: bool,
    /// Below this much free space on the data directory's disk, writes are refused with a
    /// 507 before they start (reads go on); they resume once space is freed. The store stops
    /// at its first failed write, so it must never meet a full disk. 0 = no check.
    pub min_free_disk_bytes: u64,
    /// Spatial shards per index; defaults to the core count.
    pub shards: usize,
    /// H3 resolution of the cells that map features to shards.
    pub h3_resolution: u8,
    /// Largest page of features a query returns (`maxRecordCount`).
    pub max_record_count: usize,
    /// Largest answer of features a query may make (geoQueryService, OGC API items), in
    /// bytes: a larger one is a 413 asking for a smaller page.
    pub max_answer_bytes: usize,
    /// Memory for the simplified geometries tiles draw at low zooms, made once per feature
    /// and zoom band.
    pub tile_cache_bytes: usize,
    /// Longest `where` clause, in bytes; longer is a 400. Parsing and evaluating a clause
    /// cost time linear in its length for every row.
    pub max_where_bytes: usize,
    /// Deepest nesting of parentheses, `NOT`, `-` and functions in a `where` clause; deeper
    /// is a 400. Parsing and evaluating recurse once a level, on a thread's stack.
    pub max_where_depth: usize,
    /// Most positions in a query geometry; more is a 400. Preparing the geometry costs
    /// memory linear in them, and exact relations time growing faster than that.
    pub max_query_vertices: usize,
    /// Most positions in a feature document's geometry; a write with more is a 400, and a
    /// stored one with more (after the setting was lowered) is skipped and reported.
    pub max_document_vertices: usize,
    /// Views holding at least this many rows in all are rebuilt after a template or
    /// descriptor change in the background while writes go on (queries see the old views
    /// until the new ones are complete); fewer, at once, holding writes back. 0: always in
    /// the background.
    pub background_build_rows: usize,
    /// A saved view's sections of at most this many bytes have their checksums checked
    /// before the view serves; larger ones right after, in the background, and a view found
    /// damaged then is rebuilt from the documents.
    pub view_check_at_open_bytes: usize,
    /// Memory for map tiles kept once made, answered again until a write meets them; 0: none
    /// kept.
    pub encoded_tile_cache_bytes: usize,
    /// Most geofences defined at once.
    pub max_fences: usize,
    /// Most positions in a geofence's area.
    pub max_fence_vertices: usize,
    /// Geofence events are kept this long for readers that resume (`Last-Event-ID`)...
    pub event_retention_secs: u64,
    /// ...and while they take at most this many bytes; the oldest go first.
    pub event_retention_bytes: u64,
    /// A webhook post that fails is tried again this many times, waiting twice as long each
    /// time (from 200 ms, at most 30 s), before the event is listed as failed.
    pub webhook_retries: u32,
    /// Events kept per fence at `/v1/fences/{name}/failed`.
    pub webhook_failed_keep: usize,
    /// While writes go on, the views are saved to the data directory this often (sooner
    /// when many documents changed), so that a start after a crash reads them back and only
    /// the documents changed since; 0: only at a clean stop.
    pub view_save_secs: u64,
    /// Keep a trace record of every flow run, not only of failed ones.
    pub flow_tracing: bool,
    /// A project directory deployed when the server starts.
    pub project: Option<PathBuf>,
    /// The URL clients reach this server at (`https://maps.example.org`), for the absolute
    /// links of OGC API and TileJSON; `None`: `http://` and the request's `Host`, when it is
    /// a plain host and port.
    pub public_url: Option<String>,
    /// Cluster mode: the NATS server(s) holding the write log, comma-separated URLs. `None`:
    /// a single node on its embedded store.
    pub cluster: Option<String>,
    /// This node's name in the cluster (its registry key, and the origin of its writes).
    pub node: String,
    /// The cluster's name: its stream (`GEOSHARD_<NAME>`), subjects and registry bucket.
    pub cluster_name: String,
    /// Copies JetStream keeps of the log and the registry (1, 3 or 5 NATS servers' worth).
    pub cluster_replicas: usize,
    /// Log entries after which the cluster's store is copied into a snapshot again, and the
    /// entries the snapshots before it cover dropped from the log; 0: never.
    pub cluster_snapshot_entries: u64,
    /// Log bytes a second a node applies while it catches up (it joined, or returned), and
    /// document bytes a second it copies in from holders when it takes shards, so that the
    /// other work of its machine keeps its latency; 0: as fast as it can.
    pub cluster_catch_up_bytes: u64,
    /// The cluster's shards, H3 cells at `cluster_resolution` mapped to numbers; 0: every
    /// node holds every row (and answers every query alone).
    pub cluster_shards: usize,
    /// The H3 resolution of the cluster's shards.
    pub cluster_resolution: u8,
    /// The cluster shards this node holds (their rows only are in its views); empty: all.
    pub hold: Vec<usize>,
    /// `cluster_placement = "auto"`: the shards are spread over the live nodes placed so,
    /// `cluster_shard_replicas` holders each, and move when nodes join or are gone past
    /// their lease (`hold` must then be empty). `"hold"` (the default): each node's `hold`.
    pub cluster_auto_placement: bool,
    /// Live, caught-up holders each cluster shard should have (R); a shard with fewer is
    /// reported under-replicated (`GET /v1/cluster`, `/metrics`).
    pub cluster_shard_replicas: usize,
    /// How the node reaches NATS and proves itself to the other nodes.
    pub cluster_access: ClusterAccess,
    /// Questions between nodes over direct HTTP/2 connections (`false`: over NATS).
    pub cluster_direct: bool,
    /// Where the node listens for other nodes' questions; `None`: the HTTP address's IP, a
    /// free port.
    pub cluster_listen: Option<SocketAddr>,
    /// JavaScript contexts kept warm for flow plugins.
    pub js_pool_size: usize,
    /// CPU time one flow run may take in its plugins.
    pub js_time_limit_ms: u64,
    /// Heap one JavaScript context may use.
    pub js_memory_limit_bytes: usize,
    /// Seconds in-flight requests get to finish at shutdown.
    pub shutdown_grace_secs: u64,
    /// A connection that starts no request for this long, with none in flight, is closed:
    /// idle keep-alives and clients that never finish a request head free their slot.
    pub idle_timeout_secs: u64,
    /// Threads serving HTTP, each with its own current-thread runtime and its own
    /// connections; 0 = the core count.
    pub io_threads: usize,
    /// Bind each io thread to a CPU of its own (when there are at least as many CPUs as io
    /// threads). Off for a machine where other busy processes should be free to move them.
    pub pin_io_threads: bool,
    /// After a request, an io thread keeps polling for events (yielding its CPU to anything
    /// else runnable) for this many microseconds before it sleeps; 0 = it sleeps at once.
    /// See `http::poll`.
    pub io_poll_us: u64,
    /// The `tracing` filter, e.g. `info` or `geoshard=debug`.
    pub log: String,
    /// `text` (human-readable lines) or `json` (one JSON object a line).
    pub log_format: LogFormat,
    /// One `info` line a request: method, route, status, bytes, duration, user, request id.
    pub access_log: bool,
    /// Record the Prometheus metrics served at `/metrics`.
    pub metrics: bool,
    /// `/metrics` asks for credentials (any user; only an admin sees the per-layer gauges);
    /// `false` answers anyone, without them.
    pub metrics_auth: bool,
}

/// A cluster node's credentials: for NATS (`cluster_user` and `cluster_password`,
/// `cluster_token`, a `.creds` file, TLS with `cluster_ca`, `cluster_cert` and `cluster_key`),
/// and the secret every node of the cluster shares (`cluster_secret`, or the first line of
/// `cluster_secret_file`), from which the key signing log entries and questions is derived.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClusterAccess {
    pub user: Option<String>,
    pub password: Option<Secret>,
    pub token: Option<Secret>,
    pub creds: Option<PathBuf>,
    /// Refuse a NATS server that does not speak TLS.
    pub tls: bool,
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub secret: Option<Secret>,
}

/// The shortest cluster secret taken, in bytes.
pub const MIN_CLUSTER_SECRET: usize = 16;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: PathBuf::from("./geoshard-data"),
            listen: SocketAddr::from(([127, 0, 0, 1], 8011)),
            max_body_bytes: 64 * 1024 * 1024,
            max_connections: 4096,
            reserve_connections: 16,
            listen_backlog: 4096,
            header_timeout_secs: 10,
            body_min_bytes_per_sec: 1024,
            query_time_limit_ms: 60_000,
            auth_failures_per_address: 60,
            auth_failures_per_user: 600,
            realm: "public".to_string(),
            nonce_ttl_secs: 300,
            nonce_idle_secs: 3600,
            nonce_lifetime_secs: 365 * 86_400,
            nonce_capacity: 100_000,
            nonce_per_user: 1024,
            commit_batch_max: 2048,
            write_queue: 16_384,
            store_cache_bytes: 128 * 1024 * 1024,
            store_quick_repair: true,
            min_free_disk_bytes: 64 * 1024 * 1024,
            shards: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2),
            h3_resolution: 3,
            max_record_count: 5000,
            max_answer_bytes: 256 * 1024 * 1024,
            tile_cache_bytes: 64 * 1024 * 1024,
            max_where_bytes: 128 * 1024,
            max_where_depth: 64,
            max_query_vertices: 100_000,
            max_document_vertices: 1_000_000,
            background_build_rows: 100_000,
            view_check_at_open_bytes: 64 * 1024 * 1024,
            encoded_tile_cache_bytes: 64 * 1024 * 1024,
            max_fences: 100_000,
            max_fence_vertices: 100_000,
            event_retention_secs: 7 * 24 * 3600,
            event_retention_bytes: 256 * 1024 * 1024,
            webhook_retries: 8,
            webhook_failed_keep: 1000,
            view_save_secs: 60,
            flow_tracing: false,
            project: None,
            public_url: None,
            cluster: None,
            node: default_node_name(),
            cluster_name: "geoshard".to_string(),
            cluster_replicas: 3,
            cluster_snapshot_entries: 100_000,
            cluster_catch_up_bytes: 0,
            cluster_shards: 0,
            cluster_resolution: 3,
            hold: Vec::new(),
            cluster_auto_placement: false,
            cluster_shard_replicas: 2,
            cluster_access: ClusterAccess::default(),
            cluster_direct: true,
            cluster_listen: None,
            js_pool_size: std::thread::available_parallelism()
                .map(|n| n.get() * 2)
                .unwrap_or(4),
            js_time_limit_ms: 1000,
            js_memory_limit_bytes: 64 * 1024 * 1024,
            shutdown_grace_secs: 30,
            idle_timeout_secs: 60,
            io_threads: 0,
            pin_io_threads: true,
            io_poll_us: 100,
            log: "info".to_string(),
            log_format: LogFormat::Text,
            access_log: true,
            metrics: true,
            metrics_auth: true,
        }
    }
}

/// The setting names, as written in the file (`GEOSHARD_` + uppercase in the environment).
pub const KEYS: &[&str] = &[
    "data_dir",
    "listen",
    "max_body_bytes",
    "max_connections",
    "reserve_connections",
    "listen_backlog",
    "header_timeout_secs",
    "body_min_bytes_per_sec",
    "query_time_limit_ms",
    "auth_failures_per_address",
    "auth_failures_per_user",
    "realm",
    "nonce_ttl_secs",
    "nonce_idle_secs",
    "nonce_lifetime_secs",
    "nonce_capacity",
    "nonce_per_user",
    "commit_batch_max",
    "write_queue",
    "store_cache_bytes",
    "store_quick_repair",
    "min_free_disk_bytes",
    "shards",
    "h3_resolution",
    "max_record_count",
    "max_answer_bytes",
    "tile_cache_bytes",
    "max_where_bytes",
    "max_where_depth",
    "max_query_vertices",
    "max_document_vertices",
    "background_build_rows",
    "view_check_at_open_bytes",
    "encoded_tile_cache_bytes",
    "max_fences",
    "max_fence_vertices",
    "event_retention_secs",
    "event_retention_bytes",
    "webhook_retries",
    "webhook_failed_keep",
    "view_save_secs",
    "flow_tracing",
    "project",
    "public_url",
    "cluster",
    "node",
    "cluster_name",
    "cluster_replicas",
    "cluster_snapshot_entries",
    "cluster_catch_up_bytes",
    "cluster_shards",
    "cluster_resolution",
    "hold",
    "cluster_placement",
    "cluster_shard_replicas",
    "cluster_direct",
    "cluster_listen",
    "cluster_user",
    "cluster_password",
    "cluster_token",
    "cluster_creds",
    "cluster_tls",
    "cluster_ca",
    "cluster_cert",
    "cluster_key",
    "cluster_secret",
    "cluster_secret_file",
    "js_pool_size",
    "js_time_limit_ms",
    "js_memory_limit_bytes",
    "shutdown_grace_secs",
    "idle_timeout_secs",
    "io_threads",
    "pin_io_threads",
    "io_poll_us",
    "log",
    "log_format",
    "access_log",
    "metrics",
    "metrics_auth",
];

/// The host name, else a name from the process id: a node's default name.
fn default_node_name() -> String {
    let host = rustix::system::uname();
    let host = host.nodename().to_string_lossy();
    let name: String = host
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect();
    if name.is_empty() {
        format!("node-{}", std::process::id())
    } else {
        name
    }
}

/// A name that goes into NATS subjects, stream and bucket names: letters, digits, `-`, `_`.
/// An `http://` or `https://` URL without a path, query or fragment (a trailing `/` is
/// dropped); empty for none.
fn public_url(key: &str, text: &str) -> Result<Option<String>, ConfigError> {
    let t = text.trim().trim_end_matches('/');
    if t.is_empty() {
        return Ok(None);
    }
    let rest = t
        .strip_prefix("http://")
        .or_else(|| t.strip_prefix("https://"));
    match rest {
        Some(authority) if authority_ok(authority) => Ok(Some(t.to_string())),
        _ => Err(ConfigError::BadValue {
            key: key.to_string(),
            message: format!("{text:?}: an http:// or https:// URL of a host (and port), no path"),
        }),
    }
}

/// Whether `s` is a plain URL authority: a host name or IPv4 address of letters, digits, `.`
/// and `-`, or a bracketed IPv6 address, then at most a `:port`. Nothing else goes into a
/// link made from a request's `Host`.
pub fn authority_ok(s: &str) -> bool {
    let (host, port) = match s.rsplit_once(':') {
        Some((h, _)) if !h.ends_with(']') && h.contains(':') => (s, None),
        Some((h, p)) => (h, Some(p)),
        None => (s, None),
    };
    let port_ok =
        port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => {
            !v6.is_empty()
                && v6
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        }
        None => {
            !host.is_empty()
                && host.len() <= 253
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        }
    };
    port_ok && host_ok
}

/// A cluster secret: at least [`MIN_CLUSTER_SECRET`] bytes, or none when empty.
fn cluster_secret(key: &str, text: &str) -> Result<Option<Secret>, ConfigError> {
    if text.is_empty() {
        return Ok(None);
    }
    if text.len() < MIN_CLUSTER_SECRET {
        return Err(ConfigError::BadValue {
            key: key.to_string(),
            message: format!(
                "a cluster secret of {} bytes; at least {MIN_CLUSTER_SECRET} (for instance \
                 `openssl rand -hex 32`)",
                text.len()
            ),
        });
    }
    Ok(Some(Secret::new(text)))
}

fn cluster_token(key: &str, text: &str) -> Result<String, ConfigError> {
    let t = text.trim();
    if t.is_empty()
        || t.len() > 64
        || !t
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(ConfigError::BadValue {
            key: key.to_string(),
            message: format!("{text:?}: 1 to 64 letters, digits, '-' or '_'"),
        });
    }
    Ok(t.to_string())
}

fn parse<T: std::str::FromStr>(key: &str, text: &str) -> Result<T, ConfigError>
where
    T::Err: std::fmt::Display,
{
    text.trim().parse::<T>().map_err(|e| ConfigError::BadValue {
        key: key.to_string(),
        message: format!("{text:?}: {e}"),
    })
}

/// An address to listen on: `IP:PORT`, or `HOST:PORT` resolved now (its first address).
fn socket_addr(key: &str, text: &str) -> Result<SocketAddr, ConfigError> {
    use std::net::ToSocketAddrs;
    if let Ok(addr) = text.trim().parse() {
        return Ok(addr);
    }
    let bad = |message: String| ConfigError::BadValue {
        key: key.to_string(),
        message,
    };
    text.trim()
        .to_socket_addrs()
        .map_err(|e| bad(format!("{text:?}: {e} (expected HOST:PORT)")))?
        .next()
        .ok_or_else(|| bad(format!("{text:?} resolves to no address")))
}

/// The longest an io thread may poll after a request: 10 ms, far past any gain.
pub(crate) const MAX_IO_POLL_US: u64 = 10_000;

fn positive(key: &str, n: usize) -> Result<usize, ConfigError> {
    if n == 0 {
        return Err(ConfigError::BadValue {
            key: key.to_string(),
            message: "must be at least 1".to_string(),
        });
    }
    Ok(n)
}

impl Config {
    /// The feature service's settings.
    pub fn feature_settings(&self) -> crate::features::FeatureSettings {
        crate::features::FeatureSettings {
            engine: crate::spatial::EngineConfig {
                shards: self.shards,
                resolution: self.h3_resolution,
            },
            max_record_count: self.max_record_count,
            max_answer_bytes: self.max_answer_bytes,
            where_limits: crate::features::where_clause::WhereLimits {
                max_bytes: self.max_where_bytes,
                max_depth: self.max_where_depth,
            },
            max_query_vertices: self.max_query_vertices,
            max_document_vertices: self.max_document_vertices,
            background_build_rows: self.background_build_rows,
            view_check_at_open_bytes: self.view_check_at_open_bytes,
            encoded_tile_cache_bytes: self.encoded_tile_cache_bytes,
            fences: crate::features::fence::FenceLimits {
                max_fences: self.max_fences,
                max_vertices: self.max_fence_vertices,
            },
        }
    }

    /// Most nonce states kept in the store: ten times those held in memory.
    pub fn nonce_records(&self) -> usize {
        self.nonce_capacity.saturating_mul(10)
    }

    /// `io_threads`, with 0 resolved to the core count.
    pub fn io_thread_count(&self) -> usize {
        match self.io_threads {
            0 => std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            n => n,
        }
    }

    /// Set one setting from its text form. The file and the environment both land here.
    pub fn set(&mut self, key: &str, text: &str) -> Result<(), ConfigError> {
        match key {
            "data_dir" => self.data_dir = PathBuf::from(text),
            "listen" => self.listen = socket_addr(key, text)?,
            "max_body_bytes" => self.max_body_bytes = parse(key, text)?,
            "max_connections" => self.max_connections = positive(key, parse(key, text)?)?,
            "reserve_connections" => self.reserve_connections = parse(key, text)?,
            "listen_backlog" => self.listen_backlog = positive(key, parse(key, text)?)? as u32,
            "header_timeout_secs" => {
                self.header_timeout_secs = positive(key, parse(key, text)?)? as u64
            }
            "body_min_bytes_per_sec" => self.body_min_bytes_per_sec = parse(key, text)?,
            "query_time_limit_ms" => self.query_time_limit_ms = parse(key, text)?,
            "auth_failures_per_address" => self.auth_failures_per_address = parse(key, text)?,
            "auth_failures_per_user" => self.auth_failures_per_user = parse(key, text)?,
            "realm" => self.realm = text.to_string(),
            "nonce_ttl_secs" => self.nonce_ttl_secs = parse(key, text)?,
            "nonce_idle_secs" => self.nonce_idle_secs = parse(key, text)?,
            "nonce_lifetime_secs" => self.nonce_lifetime_secs = parse(key, text)?,
            "nonce_capacity" => self.nonce_capacity = positive(key, parse(key, text)?)?,
            "nonce_per_user" => self.nonce_per_user = positive(key, parse(key, text)?)?,
            "commit_batch_max" => self.commit_batch_max = positive(key, parse(key, text)?)?,
            "write_queue" => self.write_queue = positive(key, parse(key, text)?)?,
            "store_cache_bytes" => self.store_cache_bytes = positive(key, parse(key, text)?)?,
            "store_quick_repair" => self.store_quick_repair = parse_bool(key, text)?,
            "min_free_disk_bytes" => self.min_free_disk_bytes = parse(key, text)?,
            "shards" => self.shards = positive(key, parse(key, text)?)?,
            "h3_resolution" => self.h3_resolution = h3_resolution(key, text)?,
            "max_record_count" => self.max_record_count = positive(key, parse(key, text)?)?,
            "max_answer_bytes" => self.max_answer_bytes = positive(key, parse(key, text)?)?,
            "tile_cache_bytes" => self.tile_cache_bytes = parse(key, text)?,
            "max_where_bytes" => self.max_where_bytes = positive(key, parse(key, text)?)?,
            "max_where_depth" => self.max_where_depth = positive(key, parse(key, text)?)?,
            "max_query_vertices" => self.max_query_vertices = positive(key, parse(key, text)?)?,
            "max_document_vertices" => {
                self.max_document_vertices = positive(key, parse(key, text)?)?
            }
            "background_build_rows" => self.background_build_rows = parse(key, text)?,
            "view_check_at_open_bytes" => self.view_check_at_open_bytes = parse(key, text)?,
            "encoded_tile_cache_bytes" => self.encoded_tile_cache_bytes = parse(key, text)?,
            "max_fences" => self.max_fences = parse(key, text)?,
            "max_fence_vertices" => self.max_fence_vertices = positive(key, parse(key, text)?)?,
            "event_retention_secs" => {
                self.event_retention_secs = positive(key, parse(key, text)?)? as u64
            }
            "event_retention_bytes" => {
                self.event_retention_bytes = positive(key, parse(key, text)?)? as u64
            }
            "webhook_retries" => self.webhook_retries = parse(key, text)?,
            "webhook_failed_keep" => self.webhook_failed_keep = parse(key, text)?,
            "view_save_secs" => self.view_save_secs = parse(key, text)?,
            "flow_tracing" => self.flow_tracing = parse_bool(key, text)?,
            "project" => {
                self.project = if text.is_empty() {
                    None
                } else {
                    Some(PathBuf::from(text))
                }
            }
            "public_url" => self.public_url = public_url(key, text)?,
            _ if key.starts_with("cluster") || matches!(key, "node" | "hold") => {
                return self.set_cluster(key, text);
            }
            _ => return self.set_runtime(key, text),
        }
        Ok(())
    }

    /// [`Config::set`] for the cluster's settings.
    fn set_cluster(&mut self, key: &str, text: &str) -> Result<(), ConfigError> {
        match key {
            "cluster" => self.cluster = (!text.trim().is_empty()).then(|| text.trim().to_string()),
            "node" => self.node = cluster_token(key, text)?,
            "cluster_name" => self.cluster_name = cluster_token(key, text)?,
            "cluster_replicas" => {
                let n: usize = parse(key, text)?;
                if !matches!(n, 1 | 3 | 5) {
                    return Err(ConfigError::BadValue {
                        key: key.to_string(),
                        message: format!("{n}: JetStream keeps 1, 3 or 5 replicas"),
                    });
                }
                self.cluster_replicas = n
            }
            "cluster_snapshot_entries" => self.cluster_snapshot_entries = parse(key, text)?,
            "cluster_catch_up_bytes" => self.cluster_catch_up_bytes = parse(key, text)?,
            "cluster_shards" => {
                let n: usize = parse(key, text)?;
                if n > crate::spatial::partition::MAX_SHARDS {
                    return Err(ConfigError::BadValue {
                        key: key.to_string(),
                        message: format!(
                            "{n}: at most {} shards",
                            crate::spatial::partition::MAX_SHARDS
                        ),
                    });
                }
                self.cluster_shards = n
            }
            "cluster_resolution" => self.cluster_resolution = h3_resolution(key, text)?,
            "cluster_direct" => self.cluster_direct = parse_bool(key, text)?,
            "cluster_listen" => {
                self.cluster_listen = match text.trim() {
                    "" => None,
                    t => Some(socket_addr(key, t)?),
                }
            }
            "cluster_placement" => {
                self.cluster_auto_placement = match text.trim() {
                    "auto" => true,
                    "hold" => false,
                    _ => {
                        return Err(ConfigError::BadValue {
                            key: key.to_string(),
                            message: "must be \"hold\" or \"auto\"".to_string(),
                        });
                    }
                }
            }
            "cluster_shard_replicas" => {
                self.cluster_shard_replicas = positive(key, parse(key, text)?)?
            }
            "hold" => {
                self.hold = text
                    .split(',')
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .map(|t| parse(key, t))
                    .collect::<Result<_, _>>()?
            }
            _ => return self.set_cluster_access(key, text),
        }
        Ok(())
    }

    /// [`Config::set`] for the cluster's credentials.
    fn set_cluster_access(&mut self, key: &str, text: &str) -> Result<(), ConfigError> {
        let a = &mut self.cluster_access;
        let t = text.trim();
        let some = |t: &str| (!t.is_empty()).then(|| t.to_string());
        let path = |t: &str| (!t.is_empty()).then(|| PathBuf::from(t));
        match key {
            "cluster_user" => a.user = some(t),
            "cluster_password" => a.password = some(t).map(Secret::new),
            "cluster_token" => a.token = some(t).map(Secret::new),
            "cluster_creds" => a.creds = path(t),
            "cluster_tls" => a.tls = parse_bool(key, text)?,
            "cluster_ca" => a.ca = path(t),
            "cluster_cert" => a.cert = path(t),
            "cluster_key" => a.key = path(t),
            "cluster_secret" => a.secret = cluster_secret(key, t)?,
            "cluster_secret_file" => {
                a.secret = match path(t) {
                    None => None,
                    Some(p) => {
                        let read =
                            std::fs::read_to_string(&p).map_err(|e| ConfigError::BadValue {
                                key: key.to_string(),
                                message: format!("{}: {e}", p.display()),
                            })?;
                        cluster_secret(key, read.lines().next().unwrap_or("").trim())?
                    }
                }
            }
            _ => return Err(ConfigError::UnknownKey(key.to_string())),
        }
        Ok(())
    }

    /// [`Config::set`] for the settings of flows, threads, shutdown, logs and metrics.
    fn set_runtime(&mut self, key: &str, text: &str) -> Result<(), ConfigError> {
        match key {
            "js_pool_size" => self.js_pool_size = positive(key, parse(key, text)?)?,
            "js_time_limit_ms" => self.js_time_limit_ms = parse(key, text)?,
            "js_memory_limit_bytes" => self.js_memory_limit_bytes = parse(key, text)?,
            "shutdown_grace_secs" => self.shutdown_grace_secs = parse(key, text)?,
            "idle_timeout_secs" => {
                self.idle_timeout_secs = positive(key, parse(key, text)?)? as u64
            }
            "io_threads" => self.io_threads = parse(key, text)?,
            "pin_io_threads" => self.pin_io_threads = parse_bool(key, text)?,
            "io_poll_us" => {
                let us: u64 = parse(key, text)?;
                if us > MAX_IO_POLL_US {
                    return Err(ConfigError::BadValue {
                        key: key.to_string(),
                        message: format!("{us} is more than {MAX_IO_POLL_US}"),
                    });
                }
                self.io_poll_us = us
            }
            "log" => self.log = text.to_string(),
            "log_format" => {
                self.log_format = match text.trim().to_ascii_lowercase().as_str() {
                    "text" => LogFormat::Text,
                    "json" => LogFormat::Json,
                    other => {
                        return Err(ConfigError::BadValue {
                            key: key.to_string(),
                            message: format!("{other:?} is not text or json"),
                        });
                    }
                }
            }
            "access_log" => self.access_log = parse_bool(key, text)?,
            "metrics" => self.metrics = parse_bool(key, text)?,
            "metrics_auth" => self.metrics_auth = parse_bool(key, text)?,
            _ => return Err(ConfigError::UnknownKey(key.to_string())),
        }
        Ok(())
    }

    /// Apply a TOML file: a flat table of the keys in [`KEYS`].
    pub fn apply_file(&mut self, path: &Path) -> Result<(), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        self.apply_toml(&text).map_err(|e| match e {
            ConfigError::File { message, .. } => ConfigError::File {
                path: path.display().to_string(),
                message,
            },
            other => other,
        })
    }

    pub fn apply_toml(&mut self, text: &str) -> Result<(), ConfigError> {
        let table: toml::Table = toml::from_str(text).map_err(|e| ConfigError::File {
            path: String::new(),
            message: e.to_string(),
        })?;
        for (key, value) in table {
            let text = match value {
                toml::Value::String(s) => s,
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                toml::Value::Float(f) => f.to_string(),
                other => {
                    return Err(ConfigError::BadValue {
                        key,
                        message: format!("unsupported value {other}"),
                    });
                }
            };
            self.set(&key, &text)?;
        }
        Ok(())
    }

    /// Apply `GEOSHARD_<KEY>` variables from an environment (an iterator so tests need not
    /// touch the process environment). Unknown `GEOSHARD_` names are errors, so a typo is
    /// not silently ignored.
    pub fn apply_env(
        &mut self,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(), ConfigError> {
        for (name, value) in vars {
            let Some(key) = name.strip_prefix("GEOSHARD_") else {
                continue;
            };
            let key = key.to_ascii_lowercase();
            if key == "config" {
                continue; // names the file itself; read before everything else
            }
            self.set(&key, &value)?;
        }
        Ok(())
    }
}

fn parse_bool(key: &str, text: &str) -> Result<bool, ConfigError> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        other => Err(ConfigError::BadValue {
            key: key.to_string(),
            message: format!("{other:?} is not a boolean"),
        }),
    }
}

/// An H3 resolution, 0 to 15.
fn h3_resolution(key: &str, text: &str) -> Result<u8, ConfigError> {
    let r: u8 = parse(key, text)?;
    if r > 15 {
        return Err(ConfigError::BadValue {
            key: key.to_string(),
            message: format!("{r} is not an H3 resolution (0..=15)"),
        });
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The features crate's own defaults are the service's.
    #[test]
    fn default_feature_settings_agree() {
        assert_eq!(
            format!("{:?}", Config::default().feature_settings()),
            format!("{:?}", crate::features::FeatureSettings::default())
        );
    }

    #[test]
    fn precedence_file_then_env() {
        let mut c = Config::default();
        c.apply_toml("listen = \"0.0.0.0:9000\"\nshards = 4\nflow_tracing = true\n")
            .unwrap();
        assert_eq!(c.listen.port(), 9000);
        assert_eq!(c.shards, 4);
        assert!(c.flow_tracing);
        c.apply_env([
            ("GEOSHARD_SHARDS".to_string(), "8".to_string()),
            ("PATH".to_string(), "/bin".to_string()),
        ])
        .unwrap();
        assert_eq!(c.shards, 8);
        assert_eq!(c.listen.port(), 9000);
    }

    /// `listen` takes a host name as well as an address; a name that does not resolve or a
    /// missing port is a bad value naming the key.
    #[test]
    fn listen_takes_host_names() {
        let mut c = Config::default();
        c.set("listen", "localhost:9123").unwrap();
        assert!(c.listen.ip().is_loopback(), "{}", c.listen);
        assert_eq!(c.listen.port(), 9123);
        c.set("listen", "[::1]:9124").unwrap();
        assert_eq!(c.listen.to_string(), "[::1]:9124");
        for bad in ["localhost", "no-such-host.invalid:80"] {
            let e = c.set("listen", bad).unwrap_err().to_string();
            assert!(e.contains("listen"), "{e}");
        }
    }

    #[test]
    fn every_key_is_settable() {
        let samples = [
            ("data_dir", "/tmp/x"),
            ("listen", "127.0.0.1:0"),
            ("max_body_bytes", "10"),
            ("max_connections", "3"),
            ("reserve_connections", "0"),
            ("listen_backlog", "64"),
            ("header_timeout_secs", "3"),
            ("body_min_bytes_per_sec", "10"),
            ("query_time_limit_ms", "100"),
            ("auth_failures_per_address", "2"),
            ("auth_failures_per_user", "4"),
            ("realm", "r"),
            ("nonce_ttl_secs", "5"),
            ("nonce_idle_secs", "50"),
            ("nonce_lifetime_secs", "500"),
            ("nonce_capacity", "5"),
            ("nonce_per_user", "2"),
            ("commit_batch_max", "5"),
            ("write_queue", "5"),
            ("store_cache_bytes", "1000000"),
            ("store_quick_repair", "off"),
            ("min_free_disk_bytes", "0"),
            ("shards", "3"),
            ("h3_resolution", "5"),
            ("max_record_count", "10"),
            ("max_answer_bytes", "1000000"),
            ("tile_cache_bytes", "0"),
            ("max_where_bytes", "100"),
            ("max_where_depth", "8"),
            ("max_query_vertices", "1000"),
            ("max_document_vertices", "2000"),
            ("background_build_rows", "0"),
            ("view_check_at_open_bytes", "0"),
            ("encoded_tile_cache_bytes", "0"),
            ("max_fences", "10"),
            ("max_fence_vertices", "100"),
            ("event_retention_secs", "60"),
            ("event_retention_bytes", "100000"),
            ("webhook_retries", "1"),
            ("webhook_failed_keep", "5"),
            ("view_save_secs", "0"),
            ("flow_tracing", "on"),
            ("project", "/p"),
            ("public_url", "https://maps.example.org/"),
            ("cluster", "nats://127.0.0.1:4222"),
            ("node", "n-1"),
            ("cluster_name", "test"),
            ("cluster_replicas", "1"),
            ("cluster_snapshot_entries", "50"),
            ("cluster_catch_up_bytes", "4000000"),
            ("cluster_shards", "8"),
            ("cluster_resolution", "2"),
            ("hold", "1, 5,7"),
            ("cluster_placement", "auto"),
            ("cluster_shard_replicas", "3"),
            ("cluster_direct", "off"),
            ("cluster_listen", "127.0.0.1:7000"),
            ("cluster_user", "node"),
            ("cluster_password", "pw"),
            ("cluster_token", "tok"),
            ("cluster_creds", "/etc/n.creds"),
            ("cluster_tls", "on"),
            ("cluster_ca", "/etc/ca.pem"),
            ("cluster_cert", "/etc/n.pem"),
            ("cluster_key", "/etc/n.key"),
            ("cluster_secret_file", ""),
            ("cluster_secret", "0123456789abcdef0123"),
            ("js_pool_size", "2"),
            ("js_time_limit_ms", "5"),
            ("js_memory_limit_bytes", "1000000"),
            ("shutdown_grace_secs", "1"),
            ("idle_timeout_secs", "7"),
            ("io_threads", "1"),
            ("pin_io_threads", "off"),
            ("io_poll_us", "0"),
            ("log", "debug"),
            ("log_format", "json"),
            ("access_log", "off"),
            ("metrics", "false"),
            ("metrics_auth", "false"),
        ];
        assert_eq!(samples.len(), KEYS.len());
        let mut c = Config::default();
        for (k, v) in samples {
            assert!(KEYS.contains(&k));
            c.set(k, v).unwrap();
        }
        assert_eq!(c.h3_resolution, 5);
        assert_eq!(
            (c.max_fences, c.event_retention_secs, c.webhook_retries),
            (10, 60, 1)
        );
        assert_eq!((c.cluster_shards, c.cluster_resolution), (8, 2));
        assert_eq!(c.cluster_snapshot_entries, 50);
        assert_eq!(c.cluster_catch_up_bytes, 4_000_000);
        assert_eq!(c.hold, [1, 5, 7]);
        assert!(c.cluster_auto_placement);
        assert!(c.set("cluster_placement", "somewhere").is_err());
        c.set("cluster_placement", "hold").unwrap();
        assert!(!c.cluster_auto_placement);
        assert_eq!(c.cluster_shard_replicas, 3);
        assert!(!c.cluster_direct);
        assert_eq!(
            c.cluster_listen,
            Some(SocketAddr::from(([127, 0, 0, 1], 7000)))
        );
        let a = &c.cluster_access;
        assert_eq!(a.user.as_deref(), Some("node"));
        assert_eq!(a.password.as_ref().map(|p| p.expose()), Some("pw"));
        assert!(a.tls);
        assert_eq!(a.key.as_deref(), Some(Path::new("/etc/n.key")));
        assert_eq!(
            a.secret.as_ref().map(|s| s.expose()),
            Some("0123456789abcdef0123")
        );
        // Secrets stay out of a printed configuration.
        let printed = format!("{c:?}");
        assert!(!printed.contains("0123456789abcdef0123") && !printed.contains("\"pw\""));
        assert_eq!(c.public_url.as_deref(), Some("https://maps.example.org"));
        assert!(c.set("public_url", "https://evil.org/path").is_err());
        assert!(c.set("public_url", "ftp://x").is_err());
        assert!(!c.pin_io_threads);
        assert_eq!(c.io_poll_us, 0);
        assert_eq!(c.log_format, LogFormat::Json);
        assert!(!c.access_log && !c.metrics && !c.metrics_auth);
        assert!(!c.store_quick_repair);
        assert!(c.set("log_format", "xml").is_err());
    }

    #[test]
    fn bad_values_are_named() {
        let mut c = Config::default();
        assert_eq!(
            c.set("nope", "1"),
            Err(ConfigError::UnknownKey("nope".into()))
        );
        assert!(matches!(
            c.set("shards", "0"),
            Err(ConfigError::BadValue { .. })
        ));
        assert!(matches!(
            c.set("h3_resolution", "16"),
            Err(ConfigError::BadValue { .. })
        ));
        assert!(matches!(
            c.set("io_poll_us", "10001"),
            Err(ConfigError::BadValue { .. })
        ));
        c.set("io_poll_us", "10000").unwrap();
        assert_eq!(c.io_poll_us, 10_000);
        assert!(matches!(
            c.apply_env([("GEOSHARD_SHARDZ".into(), "1".into())]),
            Err(ConfigError::UnknownKey(_))
        ));
    }

    #[test]
    fn authorities_are_plain_hosts_and_ports() {
        for ok in [
            "localhost",
            "127.0.0.1:8011",
            "maps.example.org",
            "[::1]:80",
            "[::1]",
            "a-b.c:1",
        ] {
            assert!(authority_ok(ok), "{ok}");
        }
        for bad in [
            "",
            "evil.org/x",
            "a b",
            "h:",
            "h:123456",
            "h:8a",
            "user@h",
            "h\"x",
            "[]:1",
            "a:b:c",
        ] {
            assert!(!authority_ok(bad), "{bad}");
        }
    }

    #[test]
    fn a_cluster_secret_is_long_enough_and_read_from_its_file() {
        let mut c = Config::default();
        let short = c.set("cluster_secret", "short");
        assert!(
            matches!(short, Err(ConfigError::BadValue { ref message, .. }) if message.contains("at least 16"))
        );
        let dir = std::env::temp_dir().join(format!("geoshard-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("secret");
        std::fs::write(&file, "from-the-file-0123456789\nsecond line\n").unwrap();
        c.set("cluster_secret_file", file.to_str().unwrap())
            .unwrap();
        assert_eq!(
            c.cluster_access.secret.as_ref().map(|s| s.expose()),
            Some("from-the-file-0123456789")
        );
        let missing = c.set("cluster_secret_file", dir.join("none").to_str().unwrap());
        assert!(matches!(missing, Err(ConfigError::BadValue { .. })));
        c.set("cluster_secret", "").unwrap();
        assert_eq!(c.cluster_access.secret, None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
