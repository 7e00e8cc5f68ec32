//! geoshard-loadtest: drives a running geoshard over real HTTP with Digest auth and reports
//! throughput and latency from HDR histograms.

mod client;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Parser, Subcommand};
use hdrhistogram::Histogram;

use client::{BoxError, Conn};

#[derive(Parser)]
#[command(name = "geoshard-loadtest", about = "HTTP load generator for geoshard")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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
    },
}

fn main() -> Result<(), BoxError> {
    let cli = Cli::parse();
    match cli.command {
        Command::Put {
            addr,
            user,
            password,
            connections,
            duration,
            warmup,
            threads,
            flow,
        } => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads.max(1))
                .enable_all()
                .build()?;
            rt.block_on(put(
                addr,
                &user,
                &password,
                connections,
                warmup,
                duration,
                flow,
            ))
        }
    }
}

fn health_counter(v: &serde_json::Value, name: &str) -> u64 {
    v[name].as_u64().unwrap_or(0)
}

async fn put(
    addr: SocketAddr,
    user: &str,
    password: &str,
    connections: usize,
    warmup: f64,
    duration: f64,
    flow: Option<String>,
) -> Result<(), BoxError> {
    let flow = match flow.as_deref().map(|f| f.split_once(':')) {
        None => None,
        Some(Some((e, f))) => Some((e.to_string(), f.to_string())),
        Some(None) => return Err("--flow takes Entity:Flow".into()),
    };
    let label = if flow.is_some() { "put-flow" } else { "put" };
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..connections {
        let mut conn = Conn::connect(addr, user, password).await?;
        let (measuring, stop, errors) = (measuring.clone(), stop.clone(), errors.clone());
        let flow = flow.clone();
        tasks.push(tokio::spawn(async move {
            let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let (x, y) = ((i % 360) as f64 - 180.0, (c % 180) as f64 - 90.0);
                let (target, body) = match &flow {
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
                match conn.request("PUT", &target, Some("application/json"), body).await {
                    Ok(r) if r.status == 201 || r.status == 204 => {
                        if measuring.load(Ordering::Relaxed) {
                            let _ = hist.record(t0.elapsed().as_micros() as u64);
                        }
                    }
                    _ => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                i += 1;
            }
            hist
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
    for t in tasks {
        total.add(t.await?)?;
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
