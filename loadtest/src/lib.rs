//! geoshard-loadtest as a library: the binary's subcommands, and the CI smoke test, use it.
//!
//! - [`data`]: datasets and the answer oracle.
//! - [`workload`]: queries and expected answers.
//! - [`drive`]: closed- and open-loop drivers, histograms, checks.
//! - [`pace`]: when open-loop requests are due, released from a thread of its own.
//! - [`load`]: `prepare` over the bulk documents API.
//! - [`baseline`]: the HTTP ceiling server.
//! - [`postgis`]: the PostGIS peer.
//! - [`report`]: Markdown, JSON and SVG.
//! - [`client`]: one keep-alive connection with Digest.
//! - [`sched`]: the load generator's scheduling policy (`SCHED_BATCH`).

pub mod baseline;
pub mod client;
pub mod data;
pub mod drive;
pub mod load;
pub mod pace;
pub mod postgis;
pub mod report;
pub mod sched;
pub mod workload;

/// Run one workload against an HTTP target and return its record (the `run` subcommand's
/// core, for the smoke test).
pub async fn run_http(
    addr: std::net::SocketAddr,
    user: &str,
    password: &str,
    target: &str,
    set: std::sync::Arc<workload::QuerySet>,
    spec: drive::Spec,
) -> Result<(drive::RunRecord, Option<String>), client::BoxError> {
    let check = target != "baseline";
    let senders = drive::http_senders(&[addr], user, password, spec.connections, check).await?;
    let (mut record, mismatch) = drive::drive(set, senders, spec).await?;
    record.target = target.to_string();
    Ok((record, mismatch))
}
