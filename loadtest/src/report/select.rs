//! Selecting the figures: setups, series, medians, the best closed-loop figure of a target,
//! and the open-loop points.

use super::*;

/// How a target ran: its server's io threads and the load generator's threads (`None` where
/// a run did not record them). A target's figures are never mixed across setups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Setup {
    pub server: Option<usize>,
    pub client: Option<usize>,
}

pub(super) fn setup_of(r: &RunRecord) -> Setup {
    Setup {
        server: r.server_threads,
        client: r.client_threads,
    }
}

/// Whether `r` is a closed-loop run of one line of figures: a target, a workload (the
/// ceiling's runs count for every workload) and a setup.
pub(super) fn in_series(r: &RunRecord, target: &str, workload: &str, setup: Setup) -> bool {
    r.target == target
        && r.mode == "closed"
        && (r.workload == workload || target == "baseline")
        && setup_of(r) == setup
}

/// Throughputs of the closed-loop runs of one (target, workload, connections, setup).
pub(super) fn samples(
    runs: &[RunRecord],
    target: &str,
    workload: &str,
    connections: usize,
    setup: Setup,
) -> Vec<f64> {
    let mut v: Vec<f64> = runs
        .iter()
        .filter(|r| r.connections == connections && in_series(r, target, workload, setup))
        .map(|r| r.throughput)
        .collect();
    v.sort_by(f64::total_cmp);
    v
}

pub(super) fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// A target's best closed-loop figure for a workload.
#[derive(Debug, Clone, Copy)]
pub struct Best {
    pub connections: usize,
    pub median: f64,
    pub min: f64,
    pub runs: usize,
    pub setup: Setup,
}

/// The setups a target's closed-loop runs were measured in.
pub(super) fn setups(runs: &[RunRecord], target: &str) -> Vec<Setup> {
    let mut t: Vec<Setup> = runs
        .iter()
        .filter(|r| r.target == target && r.mode == "closed")
        .map(setup_of)
        .collect();
    t.sort_unstable();
    t.dedup();
    t
}

/// The setup and concurrency with the highest median throughput: each target at its
/// fastest, the ceiling as much as geoshard and PostGIS.
pub fn best(runs: &[RunRecord], target: &str, workload: &str) -> Option<Best> {
    best_where(runs, target, workload, None, |_| true)
}

/// [`best`] among the setups `keep` takes (those on a given number of io threads, say), at
/// `connections` when given.
pub fn best_where(
    runs: &[RunRecord],
    target: &str,
    workload: &str,
    connections: Option<usize>,
    keep: impl Fn(&Setup) -> bool,
) -> Option<Best> {
    setups(runs, target)
        .into_iter()
        .filter(keep)
        .filter_map(|s| best_with(runs, target, workload, s, connections))
        .max_by(|a, b| a.median.total_cmp(&b.median))
}

/// The best concurrency of one setup, or its figure at `connections` when given.
pub(super) fn best_with(
    runs: &[RunRecord],
    target: &str,
    workload: &str,
    setup: Setup,
    connections: Option<usize>,
) -> Option<Best> {
    let mut conns: Vec<usize> = runs
        .iter()
        .filter(|r| in_series(r, target, workload, setup))
        .map(|r| r.connections)
        .filter(|c| connections.is_none_or(|want| *c == want))
        .collect();
    conns.sort_unstable();
    conns.dedup();
    conns
        .into_iter()
        .filter_map(|c| {
            let s = samples(runs, target, workload, c, setup);
            (!s.is_empty()).then(|| Best {
                connections: c,
                median: median(&s),
                min: s[0],
                runs: s.len(),
                setup,
            })
        })
        .max_by(|a, b| a.median.total_cmp(&b.median))
}

/// A target's best setup at given connections and client threads (PostGIS's best, say).
pub(super) fn best_at(
    runs: &[RunRecord],
    target: &str,
    workload: &str,
    connections: usize,
    client: Option<usize>,
) -> Option<Best> {
    best_where(runs, target, workload, Some(connections), |s| {
        s.client == client
    })
}

/// One offered load of the open-loop runs of a target and workload: the median of each
/// percentile over the repetitions (ms), with the range of p99.
pub(super) struct OpenPoint {
    pub(super) offered: f64,
    /// The setup of the runs, when they all had one.
    pub(super) setup: Option<Setup>,
    /// The connections of the runs, when they all had the same.
    pub(super) connections: Option<usize>,
    pub(super) runs: usize,
    pub(super) p50: f64,
    pub(super) p90: f64,
    pub(super) p99: f64,
    pub(super) p999: f64,
    pub(super) max: f64,
    pub(super) p99_min: f64,
    pub(super) p99_max: f64,
    /// Cores the server and the load generator kept busy together (their CPU time a request
    /// times the requests a second), median over the runs; `None` without CPU figures.
    pub(super) busy: Option<f64>,
}

impl OpenPoint {
    /// ", N connections" when the runs all had the same, else nothing.
    pub(super) fn connections_text(&self) -> String {
        self.connections
            .map(|c| format!(", {c} connections"))
            .unwrap_or_default()
    }

    /// "medians of N runs: p50 …, p99 … (range …), p99.9 …, max …"; "one run: p50 …, p99 …,
    /// p99.9 …, max …" for one.
    pub(super) fn percentiles(&self) -> String {
        if self.runs == 1 {
            return format!(
                "one run: p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms",
                self.p50, self.p99, self.p999, self.max
            );
        }
        format!(
            "medians of {} runs: p50 {:.2} ms, p99 {:.2} ms (range {:.2}–{:.2}), p99.9 {:.2} ms, max {:.2} ms",
            self.runs, self.p50, self.p99, self.p99_min, self.p99_max, self.p999, self.max
        )
    }
}

/// Cores a run kept busy: the server's and the load generator's CPU time a request, times
/// the requests a second. `None` when either CPU figure is missing.
pub(super) fn busy_cores(r: &RunRecord) -> Option<f64> {
    let us = r.server_cpu_us_per_request? + r.client_cpu_us_per_request?;
    Some(us * r.throughput / 1e6)
}

/// The setup of a target's open-loop sweep: the one with the most open-loop runs (the first
/// of those, on a tie). Other setups may have been run at a single load beside it.
pub(super) fn sweep_setup(runs: &[RunRecord], target: &str, workload: &str) -> Option<Setup> {
    let mut count: BTreeMap<Setup, usize> = BTreeMap::new();
    for r in runs
        .iter()
        .filter(|r| r.target == target && r.mode == "open" && r.workload == workload)
    {
        *count.entry(setup_of(r)).or_default() += 1;
    }
    let most = count.values().copied().max()?;
    count.into_iter().find(|(_, n)| *n == most).map(|(s, _)| s)
}

/// geoshard's open-loop points: those of its sweep setup.
pub(super) fn sweep_points(runs: &[RunRecord], workload: &str) -> Vec<OpenPoint> {
    match sweep_setup(runs, "geoshard", workload) {
        Some(s) => open_points(runs, "geoshard", workload, Some(s)),
        None => Vec::new(),
    }
}

/// A target's open-loop medians by offered load, of the runs in one setup when given.
pub(super) fn open_points(
    runs: &[RunRecord],
    target: &str,
    workload: &str,
    setup: Option<Setup>,
) -> Vec<OpenPoint> {
    let mut groups: BTreeMap<u64, Vec<&RunRecord>> = BTreeMap::new();
    for r in runs.iter().filter(|r| {
        r.target == target
            && r.mode == "open"
            && r.workload == workload
            && setup.is_none_or(|s| setup_of(r) == s)
    }) {
        let offered = r.offered.unwrap_or(0.0).round() as u64;
        groups.entry(offered).or_default().push(r);
    }
    groups
        .into_iter()
        .map(|(offered, rs)| {
            let ms = |f: fn(&RunRecord) -> u64| {
                let mut v: Vec<f64> = rs.iter().map(|r| f(r) as f64 / 1000.0).collect();
                v.sort_by(f64::total_cmp);
                v
            };
            let p99 = ms(|r| r.p99_us);
            let setup = setup_of(rs[0]);
            let conns = rs[0].connections;
            OpenPoint {
                offered: offered as f64,
                setup: rs.iter().all(|r| setup_of(r) == setup).then_some(setup),
                connections: rs.iter().all(|r| r.connections == conns).then_some(conns),
                runs: rs.len(),
                p50: median(&ms(|r| r.p50_us)),
                p90: median(&ms(|r| r.p90_us)),
                p99: median(&p99),
                p999: median(&ms(|r| r.p999_us)),
                max: median(&ms(|r| r.max_us)),
                p99_min: p99.first().copied().unwrap_or(0.0),
                p99_max: p99.last().copied().unwrap_or(0.0),
                busy: rs
                    .iter()
                    .map(|r| busy_cores(r))
                    .collect::<Option<Vec<f64>>>()
                    .map(|mut v| {
                        v.sort_by(f64::total_cmp);
                        median(&v)
                    }),
            }
        })
        .collect()
}

/// The ceiling's open-loop points to set beside geoshard's: those in the setup all of
/// geoshard's open-loop runs had (the ceiling's runs at its own peak may be in another).
pub(super) fn ceiling_beside(
    runs: &[RunRecord],
    geoshard: &[OpenPoint],
    workload: &str,
) -> Vec<OpenPoint> {
    let first = geoshard.first().and_then(|p| p.setup);
    let same = first.filter(|s| geoshard.iter().all(|p| p.setup == Some(*s)));
    open_points(runs, "baseline", workload, same)
}
