//! Driving a target with a workload.
//!
//! - Closed loop: `connections` clients, each sending its next request when the last one is
//!   answered: peak throughput at that concurrency.
//! - Open loop: requests are due at a fixed rate; each one's latency is measured from the
//!   moment it was due, not from when a client got to send it, so a slow server cannot hide
//!   its queueing (no coordinated omission). Enough connections are kept to carry the rate.
//!
//! Latencies go into HDR histograms (µs). A sample of responses is compared with the expected
//! answers; any mismatch fails the run.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::client::{BoxError, Conn};
use crate::pace::Pacer;
use crate::workload::{PgArgs, Query, QuerySet};

/// One measured run, as the report reads it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunRecord {
    /// `geoshard`, `baseline` or `postgis`.
    pub target: String,
    pub workload: String,
    pub dataset: String,
    /// `closed` or `open`.
    pub mode: String,
    pub connections: usize,
    /// Requests per second offered (open loop).
    pub offered: Option<f64>,
    pub seconds: f64,
    pub requests: u64,
    pub errors: u64,
    pub throughput: f64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    pub checked: u64,
    pub mismatched: u64,
    /// Resident memory of the server process, when its pid was given.
    pub server_rss_bytes: Option<u64>,
    /// CPU time (user and system, all threads) the server process used in the measured
    /// window, divided by the requests measured; when its pid was given. On a shared machine
    /// this tells a slow minute (every request costs more) from a server that got slower.
    #[serde(default)]
    pub server_cpu_us_per_request: Option<f64>,
    /// The same for this load generator, which shares the machine with the server.
    #[serde(default)]
    pub client_cpu_us_per_request: Option<f64>,
    /// The server's io threads, as the run was told (`--server-threads`).
    #[serde(default)]
    pub server_threads: Option<usize>,
    /// This load generator's threads (`--threads`); `None` in records from before it was kept.
    #[serde(default)]
    pub client_threads: Option<usize>,
    /// Whether this load generator ran under SCHED_BATCH (`sched`); `None` in records from
    /// before it was kept.
    #[serde(default)]
    pub client_sched_batch: Option<bool>,
    pub note: Option<String>,
    /// The first failed request's error, when any failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

#[derive(Debug, Clone, Copy)]
pub struct Spec {
    pub connections: usize,
    pub warmup: Duration,
    pub duration: Duration,
    /// Open loop at this many requests per second.
    pub rate: Option<f64>,
    /// The server's process, for its CPU time in the measured window.
    pub server_pid: Option<u32>,
    /// Open loop: the pacer's shortest wait between two releases.
    pub step: Duration,
}

/// The HTTP API a query is asked through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/resources/geoQueryService`.
    GeoQuery,
    /// `GET /arcgis/rest/services/…/query`: geoshard's own FeatureServer.
    ArcGis,
    /// The same GET of Koop's FeatureServer (`/marklogic/rest/services/…`), in front of
    /// geoshard.
    Koop,
}

/// What answers a query: an HTTP connection or a PostgreSQL connection.
pub enum Sender {
    Http {
        conn: Conn,
        /// Check `features[].id` in responses (not for the baseline).
        check: bool,
        /// Which API is asked.
        api: Api,
    },
    Postgres {
        client: tokio_postgres::Client,
        statement: tokio_postgres::Statement,
    },
}

/// Ids of the features of a geoQueryService response, ascending; features without an
/// integer id are left out.
///
/// Parsed into a struct that keeps only the ids: every other member (the geometries, most of
/// the bytes) is skipped without being built: building a `serde_json::Value` of every answer
/// took CPU from the server the load generator shares the machine with.
pub fn response_ids(body: &[u8]) -> Option<Vec<i64>> {
    #[derive(Deserialize)]
    struct Answer {
        features: Vec<Feature>,
    }
    #[derive(Deserialize)]
    struct Feature {
        #[serde(default)]
        id: Option<IntOrOther>,
    }
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum IntOrOther {
        Int(i64),
        Other(serde::de::IgnoredAny),
    }
    let answer: Answer = serde_json::from_slice(body).ok()?;
    let mut ids: Vec<i64> = answer
        .features
        .into_iter()
        .filter_map(|f| match f.id {
            Some(IntOrOther::Int(id)) => Some(id),
            _ => None,
        })
        .collect();
    ids.sort_unstable();
    Some(ids)
}

/// The OBJECTIDs of an Esri feature set (`features[].attributes.OBJECTID`), ascending.
pub fn esri_ids(body: &[u8]) -> Option<Vec<i64>> {
    #[derive(Deserialize)]
    struct Answer {
        features: Vec<Feature>,
    }
    #[derive(Deserialize)]
    struct Feature {
        attributes: Attributes,
    }
    #[derive(Deserialize)]
    struct Attributes {
        #[serde(rename = "OBJECTID")]
        id: i64,
    }
    let answer: Answer = serde_json::from_slice(body).ok()?;
    let mut ids: Vec<i64> = answer.features.iter().map(|f| f.attributes.id).collect();
    ids.sort_unstable();
    Some(ids)
}

impl Sender {
    /// Send one query; the ids it answered (when asked and available).
    async fn query(&mut self, q: &Query, want_ids: bool) -> Result<Option<Vec<i64>>, BoxError> {
        match self {
            Sender::Http { conn, check, api } => {
                let r = match (&q.get, *api) {
                    (Some(target), Api::ArcGis) => {
                        conn.request("GET", target, None, Bytes::new()).await?
                    }
                    (Some(target), Api::Koop) => {
                        let target = target.replacen("/arcgis/rest/", "/marklogic/rest/", 1);
                        conn.request("GET", &target, None, Bytes::new()).await?
                    }
                    (None, Api::ArcGis | Api::Koop) => {
                        return Err("this workload has no FeatureServer query".into());
                    }
                    _ => {
                        conn.request(
                            "POST",
                            "/v1/resources/geoQueryService",
                            Some("application/json"),
                            q.body.clone(),
                        )
                        .await?
                    }
                };
                if r.status != 200 {
                    return Err(format!("status {}", r.status).into());
                }
                Ok(if want_ids && *check {
                    let ids = match api {
                        Api::GeoQuery => response_ids(&r.body),
                        Api::ArcGis | Api::Koop => esri_ids(&r.body),
                    };
                    Some(ids.ok_or("response without features")?)
                } else {
                    None
                })
            }
            Sender::Postgres { client, statement } => {
                let rows = match q.pg {
                    PgArgs::Point(x, y) => client.query(&*statement, &[&x, &y]).await?,
                    PgArgs::Box(a, b, c, d) => client.query(&*statement, &[&a, &b, &c, &d]).await?,
                };
                Ok(if want_ids {
                    let mut ids: Vec<i64> = rows.iter().map(|r| r.get::<_, i64>(0)).collect();
                    ids.sort_unstable();
                    Some(ids)
                } else {
                    None
                })
            }
        }
    }

    async fn write(&mut self, n: u64) -> Result<(), BoxError> {
        let Sender::Http { conn, .. } = self else {
            return Ok(());
        };
        let r = conn
            .request(
                "PUT",
                &format!("/v1/documents?uri=/lt/mixed/{n}.json&collection=lt-mixed"),
                Some("application/json"),
                Bytes::from(format!(
                    "{{\"n\":{n},\"geometry\":{{\"type\":\"Point\",\"coordinates\":[0,0]}}}}"
                )),
            )
            .await?;
        if r.status != 201 && r.status != 204 {
            return Err(format!("PUT status {}", r.status).into());
        }
        Ok(())
    }
}

/// Latencies held back before they go into a task's histogram in one pass.
const PENDING: usize = 1024;

struct Tally {
    hist: Histogram<u64>,
    /// Latencies (µs) not yet in `hist`. A histogram is 150 KB of counts, one per connection
    /// task: recorded one at a time, each latency was a cache miss into a different one. In a
    /// batch, the few lines a run's latencies land on stay in cache.
    pending: Vec<u64>,
    errors: u64,
    checked: u64,
    mismatched: u64,
    first_mismatch: Option<String>,
    first_error: Option<String>,
}

impl Tally {
    fn record(&mut self, us: u64) {
        self.pending.push(us);
        if self.pending.len() == PENDING {
            self.flush();
        }
    }

    fn flush(&mut self) {
        for us in self.pending.drain(..) {
            // Past the histogram's bound (120 s) the value is dropped, as before.
            let _ = self.hist.record(us);
        }
    }
}

/// Run `set` through `senders` (one per connection). Fails only if the open-loop pacer's
/// thread cannot start.
pub async fn drive(
    set: Arc<QuerySet>,
    senders: Vec<Sender>,
    spec: Spec,
) -> Result<(RunRecord, Option<String>), BoxError> {
    let start = Instant::now() + Duration::from_millis(20);
    let measure_from = start + spec.warmup;
    let measure_to = measure_from + spec.duration;
    let next = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // Open loop: requests 0..total are due by measure_to.
    let pacer = match spec.rate {
        Some(rate) => {
            let total = ((measure_to - start).as_secs_f64() * rate) as u64 + 1;
            Some(Arc::new(Pacer::start(start, rate, total, spec.step)?))
        }
        None => None,
    };
    // CPU time of both processes over the measured window, sampled at its two ends.
    let cpu = tokio::spawn(async move {
        tokio::time::sleep_until(measure_from.into()).await;
        let at_start = (
            spec.server_pid.and_then(cpu_us_of),
            cpu_us_of(std::process::id()),
        );
        tokio::time::sleep_until(measure_to.into()).await;
        let at_end = (
            spec.server_pid.and_then(cpu_us_of),
            cpu_us_of(std::process::id()),
        );
        let used = |a: Option<u64>, b: Option<u64>| Some(b?.saturating_sub(a?));
        (used(at_start.0, at_end.0), used(at_start.1, at_end.1))
    });
    let mut tasks = Vec::new();
    for mut sender in senders {
        let (set, next, stop, pacer) = (set.clone(), next.clone(), stop.clone(), pacer.clone());
        tasks.push(tokio::spawn(async move {
            let mut t = Tally {
                hist: Histogram::new_with_bounds(1, 120_000_000, 3).expect("histogram bounds"),
                pending: Vec::with_capacity(PENDING),
                errors: 0,
                checked: 0,
                mismatched: 0,
                first_mismatch: None,
                first_error: None,
            };
            tokio::time::sleep_until(start.into()).await;
            while !stop.load(Ordering::Relaxed) {
                if let Some(pacer) = &pacer
                    && !pacer.ready().await
                {
                    break;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                let due = match &pacer {
                    Some(pacer) => pacer.due(i),
                    None => Instant::now(),
                };
                let q = &set.queries[(i as usize) % set.queries.len()];
                let measuring = due >= measure_from && due < measure_to;
                let result = if set.write_every > 0 && i % set.write_every == set.write_every - 1 {
                    sender.write(i).await.map(|_| None)
                } else {
                    sender.query(q, measuring && q.expected.is_some()).await
                };
                let done = Instant::now();
                if !measuring {
                    if done > measure_to && spec.rate.is_none() {
                        break;
                    }
                    continue;
                }
                match result {
                    Ok(ids) => {
                        t.record((done - due).as_micros().max(1) as u64);
                        if let (Some(got), Some(want)) = (ids, &q.expected) {
                            t.checked += 1;
                            if &got != want {
                                t.mismatched += 1;
                                if t.first_mismatch.is_none() {
                                    t.first_mismatch = Some(format!(
                                        "query {} of {}: got {:?}, expected {:?}",
                                        i as usize % set.queries.len(),
                                        set.workload.name(),
                                        got,
                                        want
                                    ));
                                }
                            }
                        }
                    }
                    Err(e) => {
                        t.errors += 1;
                        if t.first_error.is_none() {
                            t.first_error = Some(e.to_string());
                        }
                    }
                }
            }
            t.flush();
            t
        }));
    }
    tokio::time::sleep_until(measure_to.into()).await;
    // Open loop: let the last due requests finish (they count from when they were due).
    let grace = if spec.rate.is_some() {
        Duration::from_secs(5)
    } else {
        Duration::from_millis(0)
    };
    tokio::time::sleep(grace).await;
    stop.store(true, Ordering::Relaxed);
    if let Some(pacer) = &pacer {
        pacer.close();
    }
    let mut hist = Histogram::<u64>::new_with_bounds(1, 120_000_000, 3).expect("histogram bounds");
    let (mut errors, mut checked, mut mismatched, mut first) = (0, 0, 0, None);
    let mut first_error = None;
    for task in tasks {
        if let Ok(t) = task.await {
            let _ = hist.add(&t.hist);
            errors += t.errors;
            checked += t.checked;
            mismatched += t.mismatched;
            first = first.or(t.first_mismatch);
            first_error = first_error.or(t.first_error);
        }
    }
    let seconds = spec.duration.as_secs_f64();
    let (server_cpu, client_cpu) = cpu.await.unwrap_or((None, None));
    let per_request = |us: Option<u64>| {
        us.filter(|_| !hist.is_empty())
            .map(|us| us as f64 / hist.len() as f64)
    };
    let record = RunRecord {
        target: String::new(),
        workload: set.workload.name().to_string(),
        dataset: String::new(),
        mode: if spec.rate.is_some() {
            "open"
        } else {
            "closed"
        }
        .to_string(),
        connections: spec.connections,
        offered: spec.rate,
        seconds,
        requests: hist.len(),
        errors,
        throughput: hist.len() as f64 / seconds,
        p50_us: hist.value_at_quantile(0.5),
        p90_us: hist.value_at_quantile(0.9),
        p99_us: hist.value_at_quantile(0.99),
        p999_us: hist.value_at_quantile(0.999),
        max_us: hist.max(),
        checked,
        mismatched,
        server_rss_bytes: None,
        server_cpu_us_per_request: per_request(server_cpu),
        client_cpu_us_per_request: per_request(client_cpu),
        server_threads: None,
        client_threads: None,
        client_sched_batch: None,
        note: None,
        first_error,
    };
    Ok((record, first))
}

/// Open `n` HTTP connections (Digest negotiated on first use), to `addrs` in turn.
pub async fn http_senders(
    addrs: &[std::net::SocketAddr],
    user: &str,
    password: &str,
    n: usize,
    check: bool,
) -> Result<Vec<Sender>, BoxError> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let mut conn = Conn::connect(addrs[i % addrs.len()], user, password).await?;
        // Negotiate Digest before the clock starts.
        let _ = conn.request("GET", "/v1/ping", None, Bytes::new()).await?;
        out.push(Sender::Http {
            conn,
            check,
            api: Api::GeoQuery,
        });
    }
    Ok(out)
}

/// CPU time (user and system, all threads) a process has used so far, in microseconds, from
/// /proc.
pub fn cpu_us_of(pid: u32) -> Option<u64> {
    cpu_us_in(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// `utime + stime` (fields 14 and 15) of a `/proc/PID/stat` line, in microseconds. Times are
/// in USER_HZ ticks, which Linux fixes at 100 a second in /proc.
fn cpu_us_in(stat: &str) -> Option<u64> {
    let utime: u64 = stat_field(stat, 14)?.parse().ok()?;
    let stime: u64 = stat_field(stat, 15)?.parse().ok()?;
    Some((utime + stime) * 10_000)
}

/// Field `n` (numbered as in proc(5), from 3, the state) of a `/proc/…/stat` line. The command
/// name in parentheses may hold spaces and parentheses itself, so fields are counted from the
/// last `)`.
pub(crate) fn stat_field(stat: &str, n: usize) -> Option<&str> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(n.checked_sub(3)?)
}

/// Resident set size of a process, from /proc.
pub fn rss_of(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ids of an answer, ascending, whatever the other members hold; ids that are not
    /// integers are left out; a body that is not an answer has none.
    #[test]
    fn response_ids_reads_only_the_ids() {
        let body = br#"{"type":"FeatureCollection","metadata":{"idField":"OBJECTID"},
            "features":[
              {"type":"Feature","id":12,"properties":{"id":99,"name":"x"},
               "geometry":{"type":"Polygon","coordinates":[[[0,0],[1,0],[1,1],[0,0]]]}},
              {"type":"Feature","id":3,"properties":{},"geometry":null},
              {"type":"Feature","id":"7","geometry":null},
              {"type":"Feature","id":1.5,"geometry":null},
              {"type":"Feature","id":null,"geometry":null},
              {"type":"Feature","geometry":null},
              {"type":"Feature","id":-4,"geometry":{"type":"Point","coordinates":[1,2]}}
            ]}"#;
        assert_eq!(response_ids(body), Some(vec![-4, 3, 12]));
        assert_eq!(response_ids(br#"{"features":[]}"#), Some(vec![]));
        assert_eq!(response_ids(br#"{"statistics":[]}"#), None);
        assert_eq!(response_ids(br#"{"features":{}}"#), None);
        assert_eq!(response_ids(b"not json"), None);
    }

    /// Fields are counted from the last `)`, whatever the command name holds.
    #[test]
    fn cpu_time_is_read_after_the_command_name() {
        let line = "4242 (a) b (c) d) S 1 4242 4242 0 -1 4194560 900 0 0 0 \
                    1234 56 0 0 20 0 3 0 777 1000000 200 18446744073709551615";
        assert_eq!(cpu_us_in(line), Some((1234 + 56) * 10_000));
        assert_eq!(cpu_us_in("4242 (x) S 1 2"), None);
        assert_eq!(cpu_us_in("no name here"), None);
        // This process: it grows with work done.
        let before = cpu_us_of(std::process::id()).unwrap();
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(60) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let after = cpu_us_of(std::process::id()).unwrap();
        assert!(after >= before + 20_000, "{before} -> {after} µs");
    }
}
