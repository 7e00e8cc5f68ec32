//! Opening the engine: the store, security, placement, features and their commit hook, the
//! project and the flows, from one `Config`. The one place that assembles them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::features::{FeatureHook, Features};
use crate::flow::js::JsSettings;
use crate::flow::{FlowSettings, Flows};
use crate::http::App;
use crate::security::Security;
use crate::store::{Store, StoreOptions};

/// Why the service did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Security(#[from] crate::security::SecurityError),
    #[error("the project cannot be deployed:\n  {}", .0.join("\n  "))]
    Deploy(Vec<String>),
    #[error("cannot join the cluster: {0}")]
    Cluster(String),
    #[error("hold: {0}")]
    Placement(String),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// The file in the data directory naming the shards whose documents the store keeps whole
/// (a node holding some shards keeps only stubs of the others').
const KEPT_SHARDS: &str = "kept-shards";

/// The shards of `placement` whose documents the store in `dir` keeps only stubs of: those
/// its `hold` took since the store last kept them whole (`kept-shards`). A node that took
/// shards copies their documents in from their holders (`Spread::fill`) before it answers
/// for them. A placement of another partition (shard count or resolution) is refused.
pub(crate) fn taken_shards(
    dir: &std::path::Path,
    placement: &crate::features::placement::Placement,
) -> Result<Vec<usize>, String> {
    let Ok(kept) = std::fs::read_to_string(dir.join(KEPT_SHARDS)) else {
        return Ok(Vec::new());
    };
    let kept = kept.trim();
    let list = kept
        .strip_prefix(placement.partition())
        .and_then(|rest| rest.strip_prefix(": "))
        .and_then(|list| serde_json::from_str::<Vec<usize>>(list).ok())
        .ok_or_else(|| {
            format!(
                "this data directory keeps the documents of {kept}, not of {}: start the node \
                 from an empty data directory",
                placement.partition()
            )
        })?;
    Ok(placement
        .held()
        .into_iter()
        .filter(|s| !list.contains(s))
        .collect())
}

/// The shards the store in `dir` keeps whole, as last recorded; `None` when nothing is.
pub(crate) fn recorded_kept(dir: &std::path::Path) -> Option<Vec<usize>> {
    let kept = std::fs::read_to_string(dir.join(KEPT_SHARDS)).ok()?;
    let (_, list) = kept.trim().rsplit_once(": ")?;
    serde_json::from_str(list).ok()
}

/// Record that the store in `dir` keeps the documents of `placement`'s shards whole (and what
/// later writes keep).
pub(crate) fn record_kept(
    dir: &std::path::Path,
    placement: &crate::features::placement::Placement,
) -> Result<(), String> {
    let file = dir.join(KEPT_SHARDS);
    let line = format!("{}: {:?}\n", placement.partition(), placement.held());
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    std::fs::write(&file, line).map_err(|e| format!("{}: {e}", file.display()))
}

/// Open the store in the configured data directory, the users, the views and the flows; a
/// project named by `config` is deployed (outside a cluster, which deploys through its log).
pub fn open(config: Config) -> Result<Arc<App>, StartError> {
    geoshard_core::metrics::set_enabled(config.metrics);
    let store = Arc::new(Store::open(
        &config.data_dir,
        StoreOptions {
            commit_batch_max: config.commit_batch_max,
            write_queue: config.write_queue,
            cache_bytes: config.store_cache_bytes,
            min_free_bytes: config.min_free_disk_bytes,
            quick_repair: config.store_quick_repair,
            event_retention: crate::store::Retention {
                max_age_ms: config.event_retention_secs.saturating_mul(1000),
                max_bytes: config.event_retention_bytes,
            },
        },
    )?);
    let security = Security::open(
        &store,
        &config.realm,
        crate::security::NonceLimits {
            ttl_secs: config.nonce_ttl_secs,
            idle_secs: config.nonce_idle_secs,
            lifetime_secs: config.nonce_lifetime_secs,
            capacity: config.nonce_capacity,
            per_user: config.nonce_per_user,
        },
        crate::security::ThrottleLimits {
            per_address: config.auth_failures_per_address,
            per_user: config.auth_failures_per_user,
        },
    )?;
    let placement = match config.cluster_shards {
        0 if config.cluster_auto_placement => {
            return Err(StartError::Placement(
                "cluster_placement = \"auto\" needs cluster_shards".into(),
            ));
        }
        0 => None,
        _ if config.cluster_auto_placement && !config.hold.is_empty() => {
            return Err(StartError::Placement(
                "with cluster_placement = \"auto\" the shards are placed for the node: leave \
                 hold empty"
                    .into(),
            ));
        }
        // Placed automatically: the node starts with what its store keeps whole (nothing
        // when new), and moves toward its share once it has joined (`cluster::place`).
        n if config.cluster_auto_placement => {
            let none = crate::features::placement::Placement::none(config.cluster_resolution, n)
                .map_err(StartError::Placement)?;
            let kept = recorded_kept(&config.data_dir).unwrap_or_default();
            // The same check as a `hold`'s: a store of another partition is refused.
            taken_shards(
                &config.data_dir,
                &none.new_held(&kept).map_err(StartError::Placement)?,
            )
            .map_err(StartError::Placement)?;
            let placement = none.new_held(&kept).map_err(StartError::Placement)?;
            record_kept(&config.data_dir, &placement).map_err(StartError::Placement)?;
            Some(placement)
        }
        n => {
            let hold: Vec<usize> = if config.hold.is_empty() {
                (0..n).collect()
            } else {
                config.hold.clone()
            };
            let placement =
                crate::features::placement::Placement::new(config.cluster_resolution, n, &hold)
                    .map_err(StartError::Placement)?;
            // Shards taken are recorded once their documents are copied in from their holders
            // (`service::join_cluster`), which only a cluster has.
            let taken =
                taken_shards(&config.data_dir, &placement).map_err(StartError::Placement)?;
            if taken.is_empty() {
                record_kept(&config.data_dir, &placement).map_err(StartError::Placement)?;
            } else if config.cluster.is_none() {
                return Err(StartError::Placement(format!(
                    "this data directory keeps only stubs of the documents of shards {taken:?}, \
                     and outside a cluster no node can copy them in"
                )));
            }
            Some(placement)
        }
    };
    let features = Features::open_placed(store.clone(), config.feature_settings(), placement)?;
    store.set_hook(Arc::new(FeatureHook(features.clone())));
    if let Some(dir) = config.project.as_ref().filter(|_| config.cluster.is_none()) {
        let files = crate::flow::project::read_dir(dir).map_err(StartError::Deploy)?;
        let project = crate::flow::deploy_blocking(&store, &files).map_err(StartError::Deploy)?;
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
    Ok(Arc::new(App::new(config, store, security, features, flows)))
}

/// What runs beside the server for as long as it serves: the views' saver, and the nonce
/// saver that puts nonce states that left memory in the store every second and those in use
/// every minute (what a crash can lose).
pub struct Savers {
    views: crate::features::ViewSaver,
    nonces: tokio::task::JoinHandle<()>,
}

impl Savers {
    /// Start both on the current runtime.
    pub fn start(app: &Arc<App>) -> Savers {
        let views = crate::features::ViewSaver::start(
            app.features.clone(),
            Duration::from_secs(app.config.view_save_secs),
        );
        let nonces = {
            let app = app.clone();
            tokio::spawn(async move {
                let mut tick = 0u64;
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    tick += 1;
                    app.security
                        .save_nonces(
                            &app.store,
                            tick.is_multiple_of(60),
                            app.config.nonce_records(),
                        )
                        .await;
                }
            })
        };
        Savers { views, nonces }
    }

    /// Once the server has stopped: stop both, save every nonce state, commit and close the
    /// store, and save the views as its last commit left them.
    pub async fn finish(self, app: &Arc<App>) {
        let Savers { views, nonces } = self;
        let _ = tokio::task::spawn_blocking(move || views.stop()).await;
        nonces.abort();
        let saving = app
            .security
            .save_all_nonces(&app.store, app.config.nonce_records());
        if tokio::time::timeout(Duration::from_secs(10), saving)
            .await
            .is_err()
        {
            tracing::warn!("nonce states not saved in 10 s; clients may retry their nonces");
        }
        app.store.shutdown().await;
        let features = app.features.clone();
        let _ = tokio::task::spawn_blocking(move || features.save_views()).await;
        tracing::info!("stopped");
    }
}
