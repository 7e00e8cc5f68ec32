//! The service's Prometheus metrics: one registry for the process, counters and histograms
//! recorded where things happen (requests in `http`, commits in `store`, flow runs in `flow`,
//! authentication in `security`), and gauges read when `/metrics` is scraped (features per
//! layer and shard, resident memory, the store's size, open connections).
//!
//! Recording is a few atomic operations; `metrics = false` turns it off for benchmarks.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Whether metrics are recorded (the `metrics` setting).
static ON: AtomicBool = AtomicBool::new(true);

pub fn set_enabled(on: bool) {
    ON.store(on, Ordering::Relaxed);
}

#[inline]
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Every metric of the process.
pub struct Metrics {
    pub registry: Registry,
    pub requests: IntCounterVec,
    pub duration: HistogramVec,
    pub in_flight: IntGauge,
    pub connections_open: IntGauge,
    pub bytes_in: IntCounter,
    pub bytes_out: IntCounter,
    pub documents_written: IntCounter,
    pub commits: IntCounter,
    pub commit_batch: Histogram,
    pub commit_seconds: Histogram,
    pub flow_runs: IntCounterVec,
    pub flow_seconds: Histogram,
    pub challenges: IntCounter,
    pub auth_failures: IntCounter,
    pub shed: IntCounterVec,
    pub features: IntGaugeVec,
    pub shard_features: IntGaugeVec,
    pub resident_bytes: IntGauge,
    pub store_bytes: IntGauge,
    pub view_builds: IntGauge,
    pub tiles: IntCounterVec,
    pub tile_cache_bytes: IntGauge,
    pub cluster_applied: IntGauge,
    pub cluster_log_last: IntGauge,
    pub cluster_refused: IntCounterVec,
    pub cluster_nodes: IntGauge,
    pub cluster_shards_held: IntGauge,
    pub cluster_shards_under_replicated: IntGauge,
    pub cluster_copied: IntCounterVec,
    pub fence_events: IntCounter,
    pub fence_delivered: IntCounterVec,
    pub fence_retried: IntCounter,
    pub fence_dropped: IntCounter,
    pub fence_lag: Histogram,
}

fn counter_vec(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("a valid metric")
}

fn counter(name: &str, help: &str) -> IntCounter {
    IntCounter::new(name, help).expect("a valid metric")
}

fn gauge(name: &str, help: &str) -> IntGauge {
    IntGauge::new(name, help).expect("a valid metric")
}

fn histogram(name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)).expect("a valid metric")
}

/// Latency buckets from 50 µs to 10 s.
fn latency_buckets() -> Vec<f64> {
    vec![
        0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
        1.0, 2.5, 5.0, 10.0,
    ]
}

pub static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let m = Metrics {
        registry: Registry::new_custom(Some("geoshard".into()), None).expect("a registry"),
        requests: counter_vec(
            "http_requests_total",
            "HTTP requests answered, by route, method and status",
            &["route", "method", "status"],
        ),
        duration: HistogramVec::new(
            HistogramOpts::new(
                "http_request_duration_seconds",
                "Time from a request's head to its answer, by route",
            )
            .buckets(latency_buckets()),
            &["route"],
        )
        .expect("a valid metric"),
        in_flight: gauge("http_requests_in_flight", "Requests being handled"),
        connections_open: gauge("http_connections_open", "Open client connections"),
        bytes_in: counter("http_request_bytes_total", "Request body bytes read"),
        bytes_out: counter("http_response_bytes_total", "Response body bytes written"),
        documents_written: counter(
            "documents_written_total",
            "Documents created, replaced or deleted by committed writes",
        ),
        commits: counter("store_commits_total", "Store transactions committed"),
        commit_batch: histogram(
            "store_commit_batch_requests",
            "Write requests committed together in one transaction",
            vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0],
        ),
        commit_seconds: histogram(
            "store_commit_seconds",
            "Time of a transaction's commit, its fsync included",
            latency_buckets(),
        ),
        flow_runs: counter_vec(
            "flow_runs_total",
            "Input flow runs, by outcome (ok or failed)",
            &["outcome"],
        ),
        flow_seconds: histogram(
            "flow_run_seconds",
            "Time of an input flow run, its plugins' time",
            latency_buckets(),
        ),
        challenges: counter(
            "auth_challenges_total",
            "Digest challenges sent (401 answers asking for credentials)",
        ),
        auth_failures: counter(
            "auth_failures_total",
            "Requests whose credentials were wrong or throttled",
        ),
        shed: counter_vec(
            "load_shed_total",
            "Requests or connections turned away to protect the service, by reason",
            &["reason"],
        ),
        features: IntGaugeVec::new(
            Opts::new("layer_features", "Features (view rows) of a layer"),
            &["service", "layer"],
        )
        .expect("a valid metric"),
        shard_features: IntGaugeVec::new(
            Opts::new("shard_features", "Indexed geometries of a view's shard"),
            &["view", "shard"],
        )
        .expect("a valid metric"),
        resident_bytes: gauge("process_resident_memory_bytes", "Resident memory"),
        store_bytes: gauge("store_file_bytes", "Size of the store's file"),
        view_builds: gauge(
            "view_builds_running",
            "Views being rebuilt in the background after a definition change (0 or 1)",
        ),
        tiles: counter_vec(
            "tiles_served_total",
            "Map tiles answered, kept from before (cache) or made",
            &["source"],
        ),
        tile_cache_bytes: gauge(
            "tile_cache_bytes",
            "Bytes of map tiles kept (encoded_tile_cache_bytes)",
        ),
        cluster_applied: gauge(
            "cluster_applied_entry",
            "Cluster mode: the last entry of the cluster's log this node applied",
        ),
        cluster_log_last: gauge(
            "cluster_log_last_entry",
            "Cluster mode: the log's last entry when this node last asked (every 2 s)",
        ),
        cluster_refused: counter_vec(
            "cluster_refused_total",
            "Cluster mode: log entries, questions, answers, registry records and snapshots refused \
             for a missing or wrong signature, by kind",
            &["kind"],
        ),
        cluster_nodes: gauge(
            "cluster_nodes",
            "Cluster mode: live nodes in the registry, this one included",
        ),
        cluster_shards_held: gauge(
            "cluster_shards_held",
            "Cluster mode with shards: the cluster shards this node holds",
        ),
        cluster_shards_under_replicated: gauge(
            "cluster_shards_under_replicated",
            "Cluster mode with shards: shards with fewer live, caught-up holders than \
             cluster_shard_replicas",
        ),
        cluster_copied: counter_vec(
            "cluster_copied_bytes_total",
            "Cluster mode: bytes this node copied to catch up (a node that joins, returns or \
             takes shards): from a snapshot, log entries applied before it was caught up, or \
             documents copied in from the holders of shards it took",
            &["from"],
        ),
        fence_events: counter(
            "fence_events_total",
            "Geofence events made by committed writes",
        ),
        fence_delivered: counter_vec(
            "fence_events_delivered_total",
            "Geofence events delivered, by way (sse or webhook)",
            &["via"],
        ),
        fence_retried: counter(
            "fence_webhook_retries_total",
            "Webhook posts of geofence events tried again after a failure",
        ),
        fence_dropped: counter(
            "fence_webhook_failed_total",
            "Geofence events a webhook refused every try of (listed at /v1/fences/{name}/failed)",
        ),
        fence_lag: histogram(
            "fence_delivery_lag_seconds",
            "Time from a geofence event's commit to its delivery",
            latency_buckets(),
        ),
    };
    let r = &m.registry;
    let registered = [
        r.register(Box::new(m.requests.clone())),
        r.register(Box::new(m.duration.clone())),
        r.register(Box::new(m.in_flight.clone())),
        r.register(Box::new(m.connections_open.clone())),
        r.register(Box::new(m.bytes_in.clone())),
        r.register(Box::new(m.bytes_out.clone())),
        r.register(Box::new(m.documents_written.clone())),
        r.register(Box::new(m.commits.clone())),
        r.register(Box::new(m.commit_batch.clone())),
        r.register(Box::new(m.commit_seconds.clone())),
        r.register(Box::new(m.flow_runs.clone())),
        r.register(Box::new(m.flow_seconds.clone())),
        r.register(Box::new(m.challenges.clone())),
        r.register(Box::new(m.auth_failures.clone())),
        r.register(Box::new(m.shed.clone())),
        r.register(Box::new(m.features.clone())),
        r.register(Box::new(m.shard_features.clone())),
        r.register(Box::new(m.resident_bytes.clone())),
        r.register(Box::new(m.store_bytes.clone())),
        r.register(Box::new(m.view_builds.clone())),
        r.register(Box::new(m.tiles.clone())),
        r.register(Box::new(m.tile_cache_bytes.clone())),
        r.register(Box::new(m.cluster_applied.clone())),
        r.register(Box::new(m.cluster_log_last.clone())),
        r.register(Box::new(m.cluster_refused.clone())),
        r.register(Box::new(m.cluster_nodes.clone())),
        r.register(Box::new(m.cluster_shards_held.clone())),
        r.register(Box::new(m.cluster_shards_under_replicated.clone())),
        r.register(Box::new(m.cluster_copied.clone())),
        r.register(Box::new(m.fence_events.clone())),
        r.register(Box::new(m.fence_delivered.clone())),
        r.register(Box::new(m.fence_retried.clone())),
        r.register(Box::new(m.fence_dropped.clone())),
        r.register(Box::new(m.fence_lag.clone())),
    ];
    for result in registered {
        if let Err(e) = result {
            tracing::error!(error = %e, "a metric could not be registered");
        }
    }
    m
});

/// Record `f` when metrics are on.
#[inline]
pub fn record(f: impl FnOnce(&Metrics)) {
    if enabled() {
        f(&METRICS);
    }
}

/// The process's resident memory, from `/proc/self/statm`.
pub fn resident_bytes() -> Option<i64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: i64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// The registry in the Prometheus text format.
pub fn encode() -> Vec<u8> {
    let mut out = Vec::new();
    let families = METRICS.registry.gather();
    if let Err(e) = TextEncoder::new().encode(&families, &mut out) {
        tracing::error!(error = %e, "the metrics could not be encoded");
    }
    out
}
