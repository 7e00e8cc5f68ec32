//! geoshard-loadtest: drives a running geoshard over real HTTP with Digest auth, beside the
//! HTTP ceiling of the machine and a PostGIS peer, checks answers, and writes the report.
//!
//! - `prepare`: load a named dataset (counties, countries, places-1m, places-10m).
//! - `run`: a workload against geoshard, the baseline or PostGIS; closed or open loop.
//! - `baseline`: the minimal hyper server that measures the HTTP ceiling.
//! - `peer-load`: load a dataset into PostGIS (see `peers/postgis.sh`).
//! - `report`: results to `reports/<name>.md` with charts.
//! - `put`: sustained durable PUTs (optionally through an input flow).

use geoshard_loadtest::{baseline, client, data, drive, load, postgis, report, sched, workload};

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Parser, Subcommand};
use hdrhistogram::Histogram;

use client::{BoxError, Conn};

#[derive(Parser)]
#[command(
    name = "geoshard-loadtest",
    about = "HTTP load generator and report for geoshard"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Load a dataset into a running server (bulk documents, then template and descriptor).
    Prepare {
        #[arg(long, default_value = "127.0.0.1:8011")]
        addr: SocketAddr,
        #[arg(long)]
        user: String,
        #[arg(long)]
        password: String,
        /// counties, countries, places-1m, places-10m, places-<n>
        #[arg(long)]
        dataset: String,
        #[arg(long, default_value_t = 4)]
        parallel: usize,
        #[arg(long, default_value_t = 5000)]
        batch: usize,
        /// The server's pid, to report its resident memory after loading.
        #[arg(long)]
        server_pid: Option<u32>,
    },
    /// Write `places-<n>` as NDJSON GeoJSON features (name, cc), for `geoshard load`.
    Ndjson {
        /// places-1m, places-10m, places-<n>
        #[arg(long)]
        dataset: String,
        #[arg(long)]
        out: PathBuf,
    },
    /// Drive a target with a workload and append the result to --out.
    Run(RunArgs),
    /// Serve the HTTP ceiling: a fixed small JSON body for every request.
    Baseline {
        #[arg(long, default_value = "127.0.0.1:8090")]
        listen: SocketAddr,
        /// io threads, placed as geoshard's (`io_threads`): 1 serves on the accept loop's.
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Bind each io thread to a CPU of its own, as geoshard does by default
        /// (`pin_io_threads`).
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        pin: bool,
        /// Microseconds an io thread polls after a request before it sleeps, as geoshard's
        /// do (`io_poll_us`, the same default); 0 = none.
        #[arg(long, default_value_t = geoshard::config::Config::default().io_poll_us)]
        poll_us: u64,
    },
    /// Load a dataset into PostGIS (the cluster is started by peers/postgis.sh).
    PeerLoad {
        #[arg(
            long,
            default_value = "host=/tmp/geoshard-pg dbname=postgres user=postgres"
        )]
        pg: String,
        #[arg(long)]
        dataset: String,
    },
    /// Write the report from result files.
    Report {
        /// JSON-lines result files.
        #[arg(long, required = true)]
        results: Vec<PathBuf>,
        #[arg(long)]
        name: String,
        #[arg(long, default_value = "loadtest/reports")]
        dir: PathBuf,
        /// A file of the commands that made the results (one per line).
        #[arg(long)]
        commands: Option<PathBuf>,
        /// Extra figures, `label=value`, repeatable.
        #[arg(long = "figure")]
        figures: Vec<String>,
    },
    /// A target's best closed-loop figure in result files, as the report takes it: its
    /// fastest setup and concurrency by median. Prints JSON.
    Peak {
        /// JSON-lines result files.
        #[arg(long, required = true)]
        results: Vec<PathBuf>,
        #[arg(long, default_value = "geoshard")]
        target: String,
        #[arg(long, default_value = "pip-counties")]
        workload: String,
        /// Only the setups whose server ran on this many io threads.
        #[arg(long)]
        server_threads: Option<usize>,
    },
    /// Sustained durable PUTs of small JSON documents (closed loop).
    Put {
        #[arg(long, default_value = "127.0.0.1:8011")]
        addr: SocketAddr,
        #[arg(long)]
        user: String,
        #[arg(long)]
        password: String,
        /// Concurrent keep-alive connections.
        #[arg(long, default_value_t = 64)]
        connections: usize,
        /// Measured seconds (after the warm-up).
        #[arg(long, default_value_t = 10.0)]
        duration: f64,
        #[arg(long, default_value_t = 2.0)]
        warmup: f64,
        /// Load-generator threads.
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Run every PUT through this input flow (`Entity:Flow`), with mollusk-like rows
        /// (`id`, `X`, `Y` as strings) for the flow to turn into feature documents.
        #[arg(long)]
        flow: Option<String>,
        /// Replace places of a `geoshard load`ed places-N layer instead (`/places/0/<id>.json`
        /// in collection `places`, ids spread over 1..=N), so every write changes its view.
        #[arg(long)]
        places: Option<u64>,
        /// Write each measured PUT to this file: its start (Unix ms) and latency (µs).
        #[arg(long)]
        latencies: Option<PathBuf>,
        /// Move the written points at random within this box (`xmin,ymin,xmax,ymax`).
        #[arg(long, value_parser = parse_bbox)]
        bbox: Option<[f64; 4]>,
        /// PUTs a second over all connections, evenly paced (default: as fast as answered).
        #[arg(long)]
        rate: Option<f64>,
        /// With `--bbox` and `--places`: each place stays within this many degrees of a home
        /// drawn from its id (a random walk around it), instead of jumping over the whole box.
        #[arg(long)]
        jitter: Option<f64>,
    },
}

#[derive(clap::Args, Clone)]
struct RunArgs {
    /// geoshard (geoQueryService), arcgis (the same point queries as GETs of the native
    /// FeatureServer; pip workloads), koop (those GETs of Koop's FeatureServer at `--addr`),
    /// baseline or postgis.
    #[arg(long, default_value = "geoshard")]
    target: String,
    #[arg(long, default_value = "127.0.0.1:8011")]
    addr: SocketAddr,
    /// More servers answering the same data (the nodes of a cluster): the connections are
    /// spread over `--addr` and these, in turn.
    #[arg(long = "also")]
    also: Vec<SocketAddr>,
    #[arg(long, default_value = "")]
    user: String,
    #[arg(long, default_value = "")]
    password: String,
    #[arg(
        long,
        default_value = "host=/tmp/geoshard-pg dbname=postgres user=postgres"
    )]
    pg: String,
    /// pip-counties, pip-countries, point-eq, envelope, mixed
    #[arg(long)]
    workload: String,
    /// The dataset the workload runs on (default: counties, countries or places-1m).
    #[arg(long)]
    dataset: Option<String>,
    #[arg(long, default_value_t = 64)]
    connections: usize,
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Open loop at this many requests per second (default: closed loop).
    #[arg(long)]
    rate: Option<f64>,
    /// Open loop: the pacer's shortest wait between two releases, in microseconds (at least 1:
    /// at 0 the pacer thread would spin).
    #[arg(long, default_value_t = geoshard_loadtest::pace::STEP.as_micros() as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    release_step_us: u64,
    /// Distinct queries, cycled.
    #[arg(long, default_value_t = 20_000)]
    queries: usize,
    /// Queries whose answers are checked.
    #[arg(long, default_value_t = 400)]
    checked: usize,
    /// Ask for geometries (the interface's request has returnGeometry 1).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    geometry: bool,
    /// Load-generator threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Run the load generator under SCHED_BATCH, so that it never preempts the server it
    /// shares the machine with (see `sched`).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    sched_batch: bool,
    /// Append the result here (JSON lines).
    #[arg(long)]
    out: Option<PathBuf>,
    /// The server's pid, to record its resident memory and its CPU time a request.
    #[arg(long)]
    server_pid: Option<u32>,
    /// The server's io threads, recorded with the run (the report keeps the ceiling's
    /// thread counts apart).
    #[arg(long)]
    server_threads: Option<usize>,
}

/// One thread: the current-thread scheduler, as geoshard uses for each io thread, so the
/// client pays for no work-stealing machinery either.
fn runtime(threads: usize) -> Result<tokio::runtime::Runtime, BoxError> {
    let mut builder = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    Ok(builder.enable_all().build()?)
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = dispatch(cli.command) {
        eprintln!("geoshard-loadtest: {e}");
        std::process::exit(1);
    }
}

fn dispatch(command: Command) -> Result<(), BoxError> {
    match command {
        Command::Prepare {
            addr,
            user,
            password,
            dataset,
            parallel,
            batch,
            server_pid,
        } => {
            let ds = data::Dataset::parse(&dataset)?;
            let p =
                runtime(2)?.block_on(load::prepare(addr, &user, &password, ds, parallel, batch))?;
            let rss = server_pid.and_then(drive::rss_of);
            println!(
                "{}",
                serde_json::json!({
                    "dataset": dataset,
                    "documents": p.documents,
                    "load_seconds": p.seconds,
                    "docs_per_sec": p.documents as f64 / p.seconds,
                    "index_seconds": p.index_seconds,
                    "server_rss_bytes": rss,
                    "server_rss_bytes_per_document": rss.map(|r| r as f64 / p.documents as f64),
                })
            );
            Ok(())
        }
        Command::Ndjson { dataset, out } => Ok(ndjson(&dataset, &out)?),
        Command::Run(args) => run(args),
        Command::Baseline {
            listen,
            threads,
            pin,
            poll_us,
        } => runtime(1)?
            .block_on(async {
                let poll = std::time::Duration::from_micros(poll_us);
                baseline::serve(listen, threads, pin, poll, |a| {
                    println!("baseline listening on http://{a}")
                })
                .await
            })
            .map_err(Into::into),
        Command::PeerLoad { pg, dataset } => {
            let ds = data::Dataset::parse(&dataset)?;
            let t = Instant::now();
            let n = runtime(1)?.block_on(postgis::load(&pg, ds))?;
            println!(
                "{}",
                serde_json::json!({"dataset": dataset, "rows": n, "seconds": t.elapsed().as_secs_f64()})
            );
            Ok(())
        }
        Command::Report {
            results,
            name,
            dir,
            commands,
            figures,
        } => {
            let runs = read_results(&results)?;
            let commands = match commands {
                Some(p) => std::fs::read_to_string(p)?
                    .lines()
                    .map(str::to_string)
                    .collect(),
                None => Vec::new(),
            };
            let extra: BTreeMap<String, String> = figures
                .iter()
                .filter_map(|f| {
                    f.split_once('=')
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                })
                .collect();
            let ctx = report::Context::gather(&name, commands, extra);
            let path = report::write(&dir, &ctx, &runs)?;
            println!("wrote {}", path.display());
            Ok(())
        }
        Command::Peak {
            results,
            target,
            workload,
            server_threads,
        } => {
            let runs = read_results(&results)?;
            let b = report::best_where(&runs, &target, &workload, None, |s| {
                server_threads.is_none_or(|n| s.server == Some(n))
            })
            .ok_or_else(|| format!("no closed-loop {workload} runs of {target}"))?;
            println!(
                "{}",
                serde_json::json!({
                    "throughput": b.median,
                    "connections": b.connections,
                    "server_threads": b.setup.server,
                    "client_threads": b.setup.client,
                })
            );
            Ok(())
        }
        Command::Put {
            addr,
            user,
            password,
            connections,
            duration,
            warmup,
            threads,
            flow,
            places,
            latencies,
            bbox,
            rate,
            jitter,
        } => runtime(threads)?.block_on(put(
            addr,
            &user,
            &password,
            connections,
            (warmup, duration),
            flow,
            places,
            latencies,
            Moves { bbox, rate, jitter },
        )),
    }
}

/// The run records of JSON-lines result files.
fn read_results(paths: &[PathBuf]) -> Result<Vec<drive::RunRecord>, BoxError> {
    let mut runs = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            runs.push(serde_json::from_str::<drive::RunRecord>(line)?);
        }
    }
    Ok(runs)
}

fn run(args: RunArgs) -> Result<(), BoxError> {
    let wl = workload::Workload::parse(&args.workload)?;
    let dataset = match &args.dataset {
        Some(d) => data::Dataset::parse(d)?,
        None => match wl {
            workload::Workload::PipCountries => data::Dataset::Countries,
            workload::Workload::PointEq | workload::Workload::Envelope => {
                data::Dataset::Places(1_000_000)
            }
            workload::Workload::PipCounties | workload::Workload::Mixed => data::Dataset::Counties,
        },
    };
    let places = data::places()?;
    let checked = if args.target == "baseline" {
        0
    } else {
        args.checked
    };
    let set = Arc::new(workload::build(
        wl,
        dataset,
        &places,
        args.queries,
        checked,
        args.geometry,
    )?);
    drop(places);
    let spec = drive::Spec {
        connections: args.connections,
        warmup: Duration::from_secs_f64(args.warmup),
        duration: Duration::from_secs_f64(args.duration),
        rate: args.rate,
        server_pid: args.server_pid,
        step: Duration::from_micros(args.release_step_us),
    };
    if args.sched_batch {
        // Before the runtime and the pacer start: their threads inherit it.
        sched::batch_this_thread().map_err(|e| format!("SCHED_BATCH: {e}"))?;
    }
    let rt = runtime(args.threads)?;
    let addrs: Vec<SocketAddr> = std::iter::once(args.addr)
        .chain(args.also.iter().copied())
        .collect();
    let (mut record, mismatch) = rt.block_on(async {
        let senders = match args.target.as_str() {
            "geoshard" => {
                drive::http_senders(&addrs, &args.user, &args.password, args.connections, true)
                    .await?
            }
            "baseline" => {
                drive::http_senders(&addrs, &args.user, &args.password, args.connections, false)
                    .await?
            }
            "arcgis" | "koop" => {
                let mut senders =
                    drive::http_senders(&addrs, &args.user, &args.password, args.connections, true)
                        .await?;
                let which = if args.target == "koop" {
                    drive::Api::Koop
                } else {
                    drive::Api::ArcGis
                };
                for s in &mut senders {
                    if let drive::Sender::Http { api, .. } = s {
                        *api = which;
                    }
                }
                senders
            }
            "postgis" => postgis::senders(&args.pg, &set, args.connections, args.geometry).await?,
            other => {
                return Err::<_, BoxError>(
                    format!("unknown target {other} (geoshard, arcgis, koop, baseline, postgis)")
                        .into(),
                );
            }
        };
        drive::drive(set.clone(), senders, spec).await
    })?;
    record.target = args.target.clone();
    record.dataset = match dataset {
        data::Dataset::Counties => "counties".into(),
        data::Dataset::Countries => "countries".into(),
        data::Dataset::Places(n) => format!("places-{n}"),
    };
    record.server_rss_bytes = args.server_pid.and_then(drive::rss_of);
    record.server_threads = args.server_threads;
    record.client_threads = Some(args.threads);
    record.client_sched_batch = Some(args.sched_batch);
    record.note = (!args.geometry).then(|| "returnGeometry 0".to_string());
    let line = serde_json::to_string(&record)?;
    println!("{line}");
    if let Some(out) = &args.out {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(out)?;
        writeln!(f, "{line}")?;
    }
    if let Some(m) = mismatch {
        return Err(format!(
            "{} of {} checked answers were wrong; first: {m}",
            record.mismatched, record.checked
        )
        .into());
    }
    if record.errors > 0 && record.errors * 100 > record.requests {
        return Err(format!("{} errors in {} requests", record.errors, record.requests).into());
    }
    Ok(())
}

fn health_counter(v: &serde_json::Value, name: &str) -> u64 {
    v[name].as_u64().unwrap_or(0)
}

fn parse_bbox(s: &str) -> Result<[f64; 4], String> {
    let v: Vec<f64> = s
        .split(',')
        .map(|p| p.trim().parse::<f64>().map_err(|e| format!("{p}: {e}")))
        .collect::<Result<_, _>>()?;
    <[f64; 4]>::try_from(v).map_err(|_| "xmin,ymin,xmax,ymax".to_string())
}

/// Where written points go and how fast they are written.
#[derive(Clone, Copy)]
struct Moves {
    bbox: Option<[f64; 4]>,
    rate: Option<f64>,
    jitter: Option<f64>,
}

/// A position in `b` drawn from `(c, i)` (a splitmix hash: the same run writes the same).
fn spot(b: &[f64; 4], c: usize, i: u64) -> (f64, f64) {
    let mut z =
        (c as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let (u, v) = (
        (z >> 32) as f64 / 4_294_967_296.0,
        (z & 0xffff_ffff) as f64 / 4_294_967_296.0,
    );
    (b[0] + u * (b[2] - b[0]), b[1] + v * (b[3] - b[1]))
}

#[allow(clippy::too_many_arguments)]
async fn put(
    addr: SocketAddr,
    user: &str,
    password: &str,
    connections: usize,
    (warmup, duration): (f64, f64),
    flow: Option<String>,
    places: Option<u64>,
    latencies: Option<PathBuf>,
    moves: Moves,
) -> Result<(), BoxError> {
    let flow = match flow.as_deref().map(|f| f.split_once(':')) {
        None => None,
        Some(Some((e, f))) => Some((e.to_string(), f.to_string())),
        Some(None) => return Err("--flow takes Entity:Flow".into()),
    };
    let label = match (&flow, places) {
        (Some(_), _) => "put-flow",
        (None, Some(_)) => "put-places",
        (None, None) => "put",
    };
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..connections {
        let mut conn = Conn::connect(addr, user, password).await?;
        let (measuring, stop, errors) = (measuring.clone(), stop.clone(), errors.clone());
        let flow = flow.clone();
        let keep = latencies.is_some();
        tasks.push(tokio::spawn(async move {
            let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
            let mut each: Vec<(u64, u64)> = Vec::new();
            let mut i = 0u64;
            let every = moves
                .rate
                .map(|r| Duration::from_secs_f64(connections as f64 / r.max(1e-3)));
            let begun = tokio::time::Instant::now();
            while !stop.load(Ordering::Relaxed) {
                if let Some(every) = every {
                    tokio::time::sleep_until(begun + every * i as u32).await;
                }
                let (x, y) = match (&moves.bbox, moves.jitter, places) {
                    (Some(b), Some(d), Some(n)) => {
                        let id = 1 + (c as u64 * 7_919 + i * 104_729) % n.max(1);
                        let (hx, hy) = spot(b, 0, id);
                        let (dx, dy) = spot(&[-d, -d, d, d], c, i);
                        (hx + dx, hy + dy)
                    }
                    (Some(b), _, _) => spot(b, c, i),
                    _ => ((i % 360) as f64 - 180.0, (c % 180) as f64 - 90.0),
                };
                let (target, body) = match &flow {
                    None if places.is_some() => {
                        let n = places.unwrap_or(1).max(1);
                        let id = 1 + (c as u64 * 7_919 + i * 104_729) % n;
                        (
                            format!("/v1/documents?uri=/places/0/{id}.json&collection=places"),
                            format!(
                                "{{\"type\":\"Feature\",\"properties\":{{\"name\":\"put {c} {i}\",\"cc\":\"ZZ\",\"OBJECTID\":{id}}},\"geometry\":{{\"type\":\"Point\",\"coordinates\":[{x},{y}]}}}}"
                            ),
                        )
                    }
                    None => (
                        format!("/v1/documents?uri=/loadtest/put/{c}/{i}.json&collection=loadtest"),
                        format!(
                            "{{\"conn\":{c},\"seq\":{i},\"name\":\"place {i}\",\"geometry\":{{\"type\":\"Point\",\"coordinates\":[{x},{y}]}}}}"
                        ),
                    ),
                    Some((entity, name)) => (
                        format!(
                            "/v1/documents?uri=/loadtest/flow/{c}/{i}.json&collection=loadtest&transform=svc:sjsInputFlow&trans:entity-name={entity}&trans:flow-name={name}"
                        ),
                        format!(
                            "{{\"id\":\"{}\",\"X\":\"{x}\",\"Y\":\"{y}\",\"type\":\"PhysicalObject\",\"bibliographicCitation\":\"row {i} of connection {c}\"}}",
                            c * 1_000_000 + i as usize
                        ),
                    ),
                };
                let body = Bytes::from(body);
                let t0 = Instant::now();
                let started = std::time::SystemTime::now();
                match conn.request("PUT", &target, Some("application/json"), body).await {
                    Ok(r) if r.status == 201 || r.status == 204 => {
                        if measuring.load(Ordering::Relaxed) {
                            let took = t0.elapsed().as_micros() as u64;
                            let _ = hist.record(took);
                            if keep {
                                let at = started
                                    .duration_since(std::time::UNIX_EPOCH)
                                    .map_or(0, |d| d.as_millis() as u64);
                                each.push((at, took));
                            }
                        }
                    }
                    _ => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                i += 1;
            }
            (hist, each)
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(warmup)).await;
    let before: serde_json::Value =
        serde_json::from_slice(&client::get_plain(addr, "/health").await?)?;
    measuring.store(true, Ordering::Relaxed);
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(duration)).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = t0.elapsed().as_secs_f64();
    let after: serde_json::Value =
        serde_json::from_slice(&client::get_plain(addr, "/health").await?)?;
    stop.store(true, Ordering::Relaxed);
    let mut total = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut each = Vec::new();
    for t in tasks {
        let (h, e) = t.await?;
        total.add(h)?;
        each.extend(e);
    }
    if let Some(file) = &latencies {
        each.sort_unstable();
        let mut w = std::io::BufWriter::new(std::fs::File::create(file)?);
        for (at, took) in each {
            writeln!(w, "{at} {took}")?;
        }
        w.flush()?;
    }
    let commits = health_counter(&after, "commits") - health_counter(&before, "commits");
    let writes = health_counter(&after, "writes") - health_counter(&before, "writes");
    let ok = total.len();
    println!(
        "{{\"workload\":\"{label}\",\"connections\":{connections},\"seconds\":{elapsed:.2},\"ok\":{ok},\"errors\":{},\"put_per_sec\":{:.0},\"commits_per_sec\":{:.0},\"writes_per_commit\":{:.1},\"p50_us\":{},\"p99_us\":{},\"p999_us\":{},\"max_us\":{}}}",
        errors.load(Ordering::Relaxed),
        ok as f64 / elapsed,
        commits as f64 / elapsed,
        writes as f64 / commits.max(1) as f64,
        total.value_at_quantile(0.5),
        total.value_at_quantile(0.99),
        total.value_at_quantile(0.999),
        total.max(),
    );
    Ok(())
}

/// `places-<n>` as one GeoJSON feature a line: the points the load test's places datasets
/// hold, with their place's name and country code.
fn ndjson(dataset: &str, out: &std::path::Path) -> Result<(), String> {
    let n = match data::Dataset::parse(dataset)? {
        data::Dataset::Places(n) => n,
        _ => return Err(format!("{dataset}: only places-<n> is written as NDJSON")),
    };
    let places = data::places()?;
    let file = std::fs::File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
    for (x, y, p) in data::Jitter::new(&places).take(n) {
        let line = serde_json::json!({
            "type": "Feature",
            "properties": {"name": p.name, "cc": p.cc},
            "geometry": {"type": "Point", "coordinates": [x, y]},
        });
        writeln!(w, "{line}").map_err(|e| e.to_string())?;
    }
    w.flush().map_err(|e| e.to_string())
}
