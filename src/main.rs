//! The `geoshard` command: serve, demo, load, user administration.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use geoshard::config::ConfigError;
use geoshard::service;
use geoshard::store::{Store, StoreOptions};

#[derive(Parser)]
#[command(
    name = "geoshard",
    version,
    about = "A sharded spatial engine with a feature-service REST API"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server.
    Serve(ServeArgs),
    /// Run the server on a fresh temporary data directory with a demo user.
    Demo {
        /// Address to listen on (default 127.0.0.1:8011, or the settings' `listen`).
        #[arg(long)]
        listen: Option<String>,
        /// A TOML file of settings, read as `serve` reads it (its data_dir is not used: the
        /// demo's is a fresh temporary directory, removed on exit).
        #[arg(long, env = "GEOSHARD_CONFIG")]
        config: Option<PathBuf>,
        /// The examples folder with the sample layers (default: the source tree's).
        #[arg(long)]
        examples: Option<PathBuf>,
    },
    /// Offline user administration on a stopped server's data directory.
    User {
        #[command(subcommand)]
        command: UserCommand,
    },
    /// Load files (GeoJSON, NDJSON, CSV, Shapefile, FlatGeobuf, GeoPackage, GeoParquet) into a layer: a running server's (`--url`) or a
    /// stopped server's data directory (`--data-dir`).
    Load(Box<geoshard::load::LoadArgs>),
    /// Write a layer's features, or a query's, to a file (GeoJSON text sequences, CSV with
    /// WKT, FlatGeobuf, GeoParquet): from a running server (`--url`) or a stopped server's data directory
    /// (`--data-dir`).
    Export(Box<geoshard::load::export::ExportArgs>),
    /// A cluster's state as NATS holds it: the log, the live nodes and their lag.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// Rewrite a stopped server's store: documents in key order and compressed with a
    /// dictionary trained on them (as `load --data-dir` does at its end).
    Compact {
        #[arg(long, default_value = "./geoshard-data")]
        data_dir: PathBuf,
    },
    /// Deploy a project's input flows into a stopped server's data directory.
    Deploy {
        #[arg(long, default_value = "./geoshard-data")]
        data_dir: PathBuf,
        /// The project directory (with plugins/entities/...).
        #[arg(long)]
        project: PathBuf,
    },
}

#[derive(Args)]
struct ServeArgs {
    /// Data directory (default ./geoshard-data).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Address to listen on (default 127.0.0.1:8011).
    #[arg(long)]
    listen: Option<String>,
    /// A TOML file of settings (see README).
    #[arg(long, env = "GEOSHARD_CONFIG")]
    config: Option<PathBuf>,
    /// A project directory to deploy at start.
    #[arg(long)]
    project: Option<PathBuf>,
    /// Cluster mode: the NATS server(s) of the cluster's log, comma-separated URLs.
    #[arg(long)]
    cluster: Option<String>,
    /// This node's name in the cluster (default: the host name).
    #[arg(long)]
    node: Option<String>,
    /// The cluster's shards (setting `cluster_shards`; 0: every node holds every row).
    #[arg(long)]
    cluster_shards: Option<String>,
    /// The shards this node holds, comma-separated (setting `hold`).
    #[arg(long)]
    hold: Option<String>,
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Nodes, what each has applied of the log, and the log's replicas. NATS credentials
    /// and the cluster secret come from `GEOSHARD_CLUSTER_*` as a node takes them.
    Status {
        /// The NATS server(s), comma-separated URLs.
        #[arg(long, default_value = "nats://127.0.0.1:4222")]
        cluster: String,
        /// The cluster's name (the servers' `cluster_name`).
        #[arg(long, default_value = "geoshard")]
        name: String,
    },
}

#[derive(Subcommand)]
enum UserCommand {
    /// Add a user, or replace its password and roles if it exists.
    Add {
        #[arg(long, default_value = "./geoshard-data")]
        data_dir: PathBuf,
        #[arg(long)]
        name: String,
        /// Taken as it is, even when it begins with `-`.
        #[arg(long, allow_hyphen_values = true)]
        password: String,
        /// A role; repeat for several.
        #[arg(long = "role")]
        roles: Vec<String>,
        /// The realm the server uses (its `realm` setting).
        #[arg(long, default_value = "public")]
        realm: String,
    },
    /// List users and their roles.
    List {
        #[arg(long, default_value = "./geoshard-data")]
        data_dir: PathBuf,
    },
    /// Remove a user.
    Remove {
        #[arg(long, default_value = "./geoshard-data")]
        data_dir: PathBuf,
        #[arg(long)]
        name: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve(args),
        Command::Demo {
            listen,
            config,
            examples,
        } => demo(listen, config, examples),
        Command::User { command } => user(command),
        Command::Deploy { data_dir, project } => deploy(&data_dir, &project),
        Command::Compact { data_dir } => compact(&data_dir),
        Command::Cluster { command } => cluster(command),
        Command::Load(args) => return load(&args),
        Command::Export(args) => return export(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("geoshard: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The runtime of the accept loop and of start-up and shutdown. It serves connections
/// itself only with one io thread; with more, they run on their own threads (one
/// current-thread runtime each), so this one needs no work-stealing machinery either.
fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("geoshard-io")
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))
}

fn serve(args: ServeArgs) -> Result<(), String> {
    let config = service::load_config(args.config.as_deref(), std::env::vars(), |c| {
        if let Some(d) = &args.data_dir {
            c.data_dir = d.clone();
        }
        if let Some(l) = &args.listen {
            c.set("listen", l)?;
        }
        if let Some(p) = &args.project {
            c.project = Some(p.clone());
        }
        if let Some(url) = &args.cluster {
            c.set("cluster", url)?;
        }
        if let Some(node) = &args.node {
            c.set("node", node)?;
        }
        if let Some(n) = &args.cluster_shards {
            c.set("cluster_shards", n)?;
        }
        if let Some(h) = &args.hold {
            c.set("hold", h)?;
        }
        Ok::<(), ConfigError>(())
    })
    .map_err(|e| e.to_string())?;
    service::init_logging(&config.log, config.log_format);
    runtime()?
        .block_on(service::serve(
            config,
            service::shutdown_signal(),
            // Machine-readable, for scripts that start the server on port 0.
            |_, addr| println!("geoshard listening on http://{addr}"),
        ))
        .map_err(|e| e.to_string())
}

/// Removes the demo's temporary data directory when the demo ends, however it ends.
struct TempDataDir(PathBuf);

impl Drop for TempDataDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            eprintln!("geoshard: cannot remove {}: {e}", self.0.display());
        }
    }
}

fn demo(
    listen: Option<String>,
    config_file: Option<PathBuf>,
    examples: Option<PathBuf>,
) -> Result<(), String> {
    let data_dir = std::env::temp_dir().join(format!(
        "geoshard-demo-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    ));
    let config = service::load_config(config_file.as_deref(), std::env::vars(), |c| {
        if let Some(l) = &listen {
            c.set("listen", l)?;
        }
        c.data_dir = data_dir.clone();
        Ok::<(), ConfigError>(())
    })
    .map_err(|e| e.to_string())?;
    service::init_logging(&config.log, config.log_format);
    // Before any loading: a port in use fails at once, and nothing is left behind.
    std::net::TcpListener::bind(config.listen)
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    let _cleanup = TempDataDir(data_dir);
    {
        let store =
            Store::open(&config.data_dir, StoreOptions::default()).map_err(|e| e.to_string())?;
        let roles: Vec<String> = geoshard::acl::Role::ALL
            .iter()
            .map(|r| r.name().to_string())
            .collect();
        geoshard::security::put_user_offline(
            &store,
            service::DEMO_USER,
            service::DEMO_PASSWORD,
            &roles,
            &config.realm,
        )
        .map_err(|e| e.to_string())?;
        let examples = examples.unwrap_or_else(geoshard::demo::default_examples_dir);
        eprintln!("loading the sample layers from {} ...", examples.display());
        let loaded = geoshard::demo::load_examples(&store, &examples);
        store.shutdown_blocking();
        for (service, docs) in loaded? {
            eprintln!("  {service}: {docs} documents");
        }
    }
    let data_dir = config.data_dir.clone();
    runtime()?
        .block_on(service::serve(
            config,
            service::shutdown_signal(),
            |_, addr| println!("{}", service::demo_banner(addr, &data_dir)),
        ))
        .map_err(|e| e.to_string())
}

/// Exit 0 only when every record was loaded (or skips were allowed).
fn load(args: &geoshard::load::LoadArgs) -> ExitCode {
    // The store's and the views' warnings (a view not saved, and why) go to standard error,
    // as the server's do; `GEOSHARD_LOG` sets the level.
    let level = std::env::var("GEOSHARD_LOG").unwrap_or_else(|_| "warn".to_string());
    service::init_logging(&level, geoshard::config::LogFormat::Text);
    match geoshard::load::run(args) {
        Ok(summary) => {
            print!("{}", summary.report(&args.service, args.layer));
            if summary.success(args.allow_skips) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("geoshard load: {e}");
            ExitCode::from(2)
        }
    }
}

fn export(args: &geoshard::load::export::ExportArgs) -> ExitCode {
    let level = std::env::var("GEOSHARD_LOG").unwrap_or_else(|_| "warn".to_string());
    service::init_logging(&level, geoshard::config::LogFormat::Text);
    let mut shown = std::time::Instant::now();
    let mut progress = |done: u64, all: u64| {
        if !args.quiet && (shown.elapsed().as_secs() >= 1 || (done == all && done > 0)) {
            shown = std::time::Instant::now();
            eprintln!("exported {done} of {all} features");
        }
    };
    match geoshard::load::export::run(args, &mut progress) {
        Ok(done) => {
            println!(
                "exported {} features of {} layer {} to {} in {:.1} s",
                done.features,
                args.service,
                args.layer,
                args.out.display(),
                done.took.as_secs_f64()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("geoshard export: {e}");
            ExitCode::from(2)
        }
    }
}

fn cluster(command: ClusterCommand) -> Result<(), String> {
    let ClusterCommand::Status { cluster, name } = command;
    // Credentials and the cluster secret as a node takes them from its environment.
    let config =
        service::load_config(None, std::env::vars(), |_| Ok(())).map_err(|e| e.to_string())?;
    let settings = geoshard::cluster::ClusterSettings {
        url: cluster,
        name,
        ..service::cluster_settings(&config)
    };
    let report = runtime()?
        .block_on(geoshard::cluster::status_report(&settings))
        .map_err(|e| e.to_string())?;
    print!("{report}");
    Ok(())
}

fn deploy(data_dir: &std::path::Path, project: &std::path::Path) -> Result<(), String> {
    let files = geoshard::flow::project::read_dir(project).map_err(|e| e.join("\n"))?;
    let store = open_offline(data_dir)?;
    let result = geoshard::flow::deploy_blocking(&store, &files);
    store.shutdown_blocking();
    match result {
        Ok(p) => {
            for f in &p.flows {
                println!(
                    "deployed {}:{} ({:?}, {:?})",
                    f.entity, f.flow, f.code_format, f.data_format
                );
            }
            for w in &p.warnings {
                println!("warning: {w}");
            }
            Ok(())
        }
        Err(errors) => Err(format!("deploy failed:\n  {}", errors.join("\n  "))),
    }
}

fn open_offline(dir: &std::path::Path) -> Result<Store, String> {
    Store::open(dir, StoreOptions::default())
        .map_err(|e| format!("{e} (is a server running on this data directory?)"))
}

fn user(command: UserCommand) -> Result<(), String> {
    match command {
        UserCommand::Add {
            data_dir,
            name,
            password,
            roles,
            realm,
        } => {
            let store = open_offline(&data_dir)?;
            let created =
                geoshard::security::put_user_offline(&store, &name, &password, &roles, &realm)
                    .map_err(|e| e.to_string());
            store.shutdown_blocking();
            println!(
                "{} user {name} with roles [{}]",
                if created? { "added" } else { "updated" },
                roles.join(", ")
            );
            Ok(())
        }
        UserCommand::List { data_dir } => {
            let store = open_offline(&data_dir)?;
            let users = geoshard::security::load_users(&store).map_err(|e| e.to_string());
            store.shutdown_blocking();
            for u in users? {
                println!("{}\t{}", u.name, u.roles.join(","));
            }
            Ok(())
        }
        UserCommand::Remove { data_dir, name } => {
            let store = open_offline(&data_dir)?;
            let removed =
                geoshard::security::remove_user_offline(&store, &name).map_err(|e| e.to_string());
            store.shutdown_blocking();
            removed?;
            println!("removed user {name}");
            Ok(())
        }
    }
}

fn compact(dir: &Path) -> Result<(), String> {
    if !geoshard::store::snapshot::store_file(dir).exists() {
        return Err(format!("{}: no store here", dir.display()));
    }
    let r = geoshard::store::repack(dir, |_, _| {}).map_err(|e| match e {
        geoshard::store::StoreError::Open { .. } => {
            format!("{e} (is a server running on this data directory? stop it first)")
        }
        e => e.to_string(),
    })?;
    println!(
        "{} documents {} in {:.1} s: the store is {} MB, was {} MB",
        r.documents,
        if r.trained {
            "compressed and packed"
        } else {
            "packed (too few to train a dictionary)"
        },
        r.took.as_secs_f64(),
        r.bytes_after / 1_000_000,
        r.bytes_before / 1_000_000
    );
    Ok(())
}
