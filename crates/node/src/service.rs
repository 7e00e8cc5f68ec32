//! Starting and stopping the whole service: configuration, logging, the signal that stops
//! it, and the demo. The CLI in `main.rs` is a thin layer over these functions.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use crate::config::{Config, ConfigError};
use crate::http::{App, Server};
use crate::open::{Savers, StartError};

/// Build the configuration: defaults < file < `GEOSHARD_*` environment < `flags`.
pub fn load_config(
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
    flags: impl FnOnce(&mut Config) -> Result<(), ConfigError>,
) -> Result<Config, ConfigError> {
    let mut config = Config::default();
    if let Some(path) = file {
        config.apply_file(path)?;
    }
    config.apply_env(env)?;
    flags(&mut config)?;
    Ok(config)
}

/// Log through `tracing` with the configured filter (`RUST_LOG` wins when set).
pub fn init_logging(filter: &str, format: crate::config::LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter));
    // geo's relate warns once per candidate feature about a query polygon of no area ("no
    // winding order"): dozens of lines a query. Its warnings are kept out unless asked for
    // (a filter naming `geo::`).
    let filter = if filter.to_string().contains("geo::") {
        filter
    } else {
        filter.add_directive(quiet_geo())
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_writer(std::io::stderr);
    let _ = match format {
        // One object a line, a request's span fields (its request id) in `span`/`spans`.
        crate::config::LogFormat::Json => builder.json().with_current_span(true).try_init(),
        crate::config::LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
    };
}

/// geo's algorithms at `error` only. A target directive matches by prefix, so plain `geo`
/// would silence `geoshard` too.
fn quiet_geo() -> tracing_subscriber::filter::Directive {
    "geo::algorithm=error".parse().expect("a valid directive")
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => tracing::info!("SIGINT received"),
        _ = term => tracing::info!("SIGTERM received"),
    }
}

/// Bind, open everything, and serve until `shutdown`. Calls `ready` with the bound address
/// once the service is ready; until then every request gets a 503 (`/health` a 200 saying it
/// is starting).
pub async fn serve(
    config: Config,
    shutdown: impl Future<Output = ()>,
    ready: impl FnOnce(&App, std::net::SocketAddr),
) -> Result<(), StartError> {
    // Bound first, so that clients and probes get answers while the service starts: `/health`
    // says it is alive and starting, every other route 503 until it is ready.
    let listener = Server::listen(&config).map_err(|source| StartError::Listen {
        addr: config.listen,
        source,
    })?;
    let addr = listener.local_addr().unwrap_or(config.listen);
    tracing::info!(%addr, "accepting connections: answering 503 until started");
    let answering = crate::http::answer_while_starting(
        &listener,
        std::time::Instant::now(),
        crate::http::pace(&config),
    );
    let starting = open_app(config);
    let app = tokio::select! {
        app = starting => app?,
        never = answering => match never {},
    };
    let server = Server::new(listener, app.clone());
    if let Some(cluster) = app.cluster.get() {
        cluster.set_http_address(addr.to_string());
    }
    tracing::info!(%addr, data_dir = %app.config.data_dir.display(), "listening");
    if app
        .security
        .list_users(&app.store)
        .is_ok_and(|users| users.is_empty())
    {
        tracing::warn!(
            data_dir = %app.config.data_dir.display(),
            "the store has no users, so every request will be refused: add one with \
             `geoshard user add --data-dir DIR --name NAME --password PW --role admin` on the \
             stopped server"
        );
    }
    let savers = Savers::start(&app);
    ready(&app, addr);
    server.run(shutdown).await;
    savers.finish(&app).await;
    Ok(())
}

/// The service opened on `config`: in a cluster, prepared from a snapshot when its log
/// needs it, then joined.
async fn open_app(config: Config) -> Result<Arc<App>, StartError> {
    // A node whose log no longer holds what its store needs starts from the latest snapshot
    // (its bytes counted in the metrics).
    geoshard_core::metrics::set_enabled(config.metrics);
    if config.cluster.is_some() {
        let settings = cluster_settings(&config);
        let dir = config.data_dir.clone();
        tokio::task::spawn_blocking(move || crate::cluster::prepare(&settings, &dir))
            .await
            .map_err(|e| StartError::Cluster(e.to_string()))?
            .map_err(|e| StartError::Cluster(e.to_string()))?;
    }
    // Opening reads the store and rebuilds the indexes: off the runtime's threads, which
    // may be a single one.
    let app = match tokio::task::spawn_blocking(move || crate::open::open(config)).await {
        Ok(opened) => opened?,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    };
    if app.config.cluster.is_some() {
        join_cluster(&app).await?;
    }
    Ok(app)
}

/// The cluster settings of `config`, before its placement is checked (`open`).
pub fn cluster_settings(config: &Config) -> crate::cluster::ClusterSettings {
    let a = &config.cluster_access;
    let n = config.cluster_shards;
    let mut shards: Vec<usize> = if config.cluster_auto_placement {
        crate::open::recorded_kept(&config.data_dir).unwrap_or_default()
    } else if config.hold.is_empty() {
        (0..n).collect()
    } else {
        config.hold.clone()
    };
    shards.sort_unstable();
    shards.dedup();
    crate::cluster::ClusterSettings {
        url: config.cluster.clone().unwrap_or_default(),
        node: config.node.clone(),
        name: config.cluster_name.clone(),
        replicas: config.cluster_replicas,
        partition: String::new(),
        keeps_all: n == 0 || shards.len() == n,
        shards: if n == 0 { Vec::new() } else { shards },
        snapshot_entries: config.cluster_snapshot_entries,
        catch_up_bytes: config.cluster_catch_up_bytes,
        access: crate::cluster::NatsAccess {
            user: a.user.clone(),
            password: a.password.clone(),
            token: a.token.clone(),
            creds: a.creds.clone(),
            tls: a.tls,
            ca: a.ca.clone(),
            cert: a.cert.clone(),
            key: a.key.clone(),
        },
        secret: a.secret.clone(),
        auto: config.cluster_auto_placement,
        listen: config.cluster_direct.then(|| {
            config
                .cluster_listen
                .unwrap_or(std::net::SocketAddr::new(config.listen.ip(), 0))
        }),
    }
}

/// Cluster mode: put the log in front of the store and follow it; then deploy the project,
/// if any, through the log, so every node has it.
async fn join_cluster(app: &Arc<App>) -> Result<(), StartError> {
    let settings = crate::cluster::ClusterSettings {
        partition: app
            .features
            .placement()
            .map_or(String::new(), |p| p.partition().to_string()),
        shards: app.features.placement().map_or(Vec::new(), |p| p.held()),
        keeps_all: app
            .features
            .placement()
            .is_none_or(|p| p.held().len() == p.shards()),
        ..cluster_settings(&app.config)
    };
    let weak = Arc::downgrade(app);
    let reload = Box::new(move |changed: crate::cluster::Reload| {
        let Some(app) = weak.upgrade() else {
            return;
        };
        if changed.users
            && let Err(e) = app.security.reload_users(&app.store)
        {
            tracing::error!(error = %e, "reloading the users another node changed");
        }
        if changed.flows
            && let Err(e) = app.flows.reload()
        {
            tracing::error!(error = %e, "reloading the flows another node deployed");
        }
    });
    let store = app.store.clone();
    let cluster = tokio::task::spawn_blocking(move || {
        crate::cluster::Cluster::start(settings, store, reload)
    })
    .await
    .map_err(|e| StartError::Cluster(e.to_string()))?
    .map_err(|e| StartError::Cluster(e.to_string()))?;
    tracing::info!(
        node = cluster.node(),
        applied = cluster.visible(),
        "joined the cluster"
    );
    // With placed shards, queries are routed over the nodes, and this node answers theirs
    // until the app is dropped.
    let spread = crate::cluster::spread::Spread::new(
        app.features.clone(),
        cluster.clone(),
        app.config.query_time_limit_ms,
    );
    if let Some(spread) = spread.map(Arc::new) {
        cluster.answer_asks(crate::cluster::spread::answerer(Arc::downgrade(&spread)));
        // Shards this node took since its store last kept them whole: their documents are
        // copied in from their holders before it answers for them.
        if let Some(placement) = app.features.placement() {
            let dir = app.config.data_dir.clone();
            let taken =
                crate::open::taken_shards(&dir, &placement).map_err(StartError::Placement)?;
            if !taken.is_empty() {
                let features = app.features.clone();
                tokio::spawn(spread.clone().fill(taken, move || {
                    if let Some(p) = features.placement()
                        && let Err(e) = crate::open::record_kept(&dir, &p)
                    {
                        tracing::error!(error = %e, "recording the shards kept");
                    }
                }));
            }
        }
        // Placed automatically: the node moves toward its share of the shards.
        if app.config.cluster_auto_placement {
            let dir = app.config.data_dir.clone();
            tokio::spawn(crate::cluster::place::place(
                spread.clone(),
                app.config.cluster_shard_replicas,
                move |p| {
                    if let Err(e) = crate::open::record_kept(&dir, p) {
                        tracing::error!(error = %e, "recording the shards kept");
                    }
                },
            ));
        }
        let _ = app.spread.set(spread);
    }
    let _ = app.cluster.set(cluster);
    if let Some(dir) = &app.config.project {
        let files = crate::flow::project::read_dir(dir).map_err(StartError::Deploy)?;
        let project = app
            .flows
            .deploy(&crate::acl::Caller::system(), files)
            .await
            .map_err(|e| StartError::Deploy(vec![e.to_string()]))?;
        for w in &project.warnings {
            tracing::warn!("{w}");
        }
    }
    Ok(())
}

/// The demo user's credentials.
pub const DEMO_USER: &str = "demo";
pub const DEMO_PASSWORD: &str = "demo-password";

/// What the demo prints once it listens.
pub fn demo_banner(addr: std::net::SocketAddr, data_dir: &Path) -> String {
    let base = format!("http://{addr}");
    let auth = format!("--digest -u {DEMO_USER}:{DEMO_PASSWORD}");
    let pip = r#"{"params":{"id":"US Counties","layer":0,"method":"query"},"query":{"returnGeometry":0,"geometryType":"gisGeometryPoint","spatialRel":"gisSpatialRelContains","extension":{"geometry":{"type":"Point","coordinates":[-104.9903,39.7392]}}}}"#;
    let box_query = r#"{"params":{"id":"World Places","layer":"0","method":"query"},"query":{"where":"cc = 'FR'","orderByFields":"name","resultRecordCount":5,"outFields":"name,admin1","spatialRel":"esriSpatialRelIntersects","extension":{"geometry":{"type":"Polygon","coordinates":[[[2.0,48.5],[2.8,48.5],[2.8,49.1],[2.0,49.1],[2.0,48.5]]]}}}}"#;
    let stats = r#"{"params":{"id":"World Places","layer":0,"method":"query"},"query":{"outStatistics":[{"statisticType":"count","onStatisticField":"OBJECTID","outStatisticFieldName":"places"}],"groupByFieldsForStatistics":"cc","where":"cc IN ('US','CA','MX')"}}"#;
    format!(
        "geoshard demo is running on {base}\n\
         data directory: {dir}\n\
         user: {DEMO_USER}   password: {DEMO_PASSWORD}   (roles: admin and every built-in role)\n\
         \n\
         Try:\n\
         \x20 curl -s {base}/health\n\
         \x20 # the services and their layers\n\
         \x20 curl -s {auth} {base}/v1/resources/modelService\n\
         \x20 # point-in-polygon: which county is Denver in?\n\
         \x20 curl -s {auth} -H 'Content-Type: application/json' -d '{pip}' {base}/v1/resources/geoQueryService\n\
         \x20 # places in a box around Paris, filtered, ordered, paged\n\
         \x20 curl -s {auth} -H 'Content-Type: application/json' -d \"{box_esc}\" {base}/v1/resources/geoQueryService\n\
         \x20 # statistics grouped by country\n\
         \x20 curl -s {auth} -H 'Content-Type: application/json' -d \"{stats_esc}\" {base}/v1/resources/geoQueryService\n\
         \x20 # documents\n\
         \x20 curl -s {auth} -X PUT -H 'Content-Type: application/json' \\\n\
         \x20      -d '{{\"hello\":\"world\"}}' '{base}/v1/documents?uri=/hello.json&collection=demo'\n\
         \x20 curl -s {auth} '{base}/v1/documents?uri=/demo/counties/08031.json&category=metadata'\n\
         \x20 # an input flow: a sighting becomes a feature document, then a point of the Sightings layer\n\
         \x20 curl -s {auth} -X PUT -H 'Content-Type: application/json' -d '{{\"species\":\"heron\",\"lon\":2.35,\"lat\":48.85}}' \\\n\
         \x20      '{base}/v1/documents?uri=/sightings/1.json&collection=sightings&transform=svc:sjsInputFlow&trans:entity-name=Sighting&trans:flow-name=Load'\n\
         \x20 curl -s {auth} -H 'Content-Type: application/json' -d '{sight}' {base}/v1/resources/geoQueryService\n\
         \n\
         Press Ctrl-C to stop.\n",
        dir = data_dir.display(),
        sight = r#"{"params":{"id":"Sightings","layer":0,"method":"query"},"query":{"outFields":"*","returnGeometry":true,"distance":5,"units":"esriSRUnit_Kilometer","extension":{"geometry":{"type":"Point","coordinates":[2.3,48.86]}}}}"#,
        box_esc = box_query.replace('"', "\\\""),
        stats_esc = stats.replace('"', "\\\""),
    )
}
