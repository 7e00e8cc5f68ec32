//! `report`: results (JSON lines of [`RunRecord`]) to `loadtest/reports/<name>.md`, the same
//! as JSON, and SVG charts: throughput against concurrency, latency against offered load,
//! and geoshard beside PostGIS and the HTTP ceiling per workload.

use std::collections::BTreeMap;
use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;

use crate::drive::RunRecord;

#[derive(Debug, Clone, Serialize)]
pub struct Context {
    pub name: String,
    pub date: String,
    pub commit: String,
    pub cores: usize,
    pub cpu_model: String,
    pub memory: String,
    pub kernel: String,
    /// The commands and settings that produced the results.
    pub commands: Vec<String>,
    /// Other figures (load times, memory) as label -> value.
    pub extra: BTreeMap<String, String>,
}

fn read_file(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

impl Context {
    pub fn gather(name: &str, commands: Vec<String>, extra: BTreeMap<String, String>) -> Context {
        let cpuinfo = read_file("/proc/cpuinfo");
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let mem_kb: u64 = read_file("/proc/meminfo")
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let commit = std::process::Command::new("git")
            .args(["rev-parse", "--short", "HEAD"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let date = std::process::Command::new("date")
            .args(["-u", "+%Y-%m-%d %H:%M UTC"])
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        Context {
            name: name.to_string(),
            date,
            commit,
            cores: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(0),
            cpu_model,
            memory: format!("{:.1} GiB", mem_kb as f64 / 1024.0 / 1024.0),
            kernel: read_file("/proc/sys/kernel/osrelease").trim().to_string(),
            commands,
            extra,
        }
    }
}

/// How a target ran: its server's io threads and the load generator's threads (`None` where
/// a run did not record them). A target's figures are never mixed across setups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Setup {
    pub server: Option<usize>,
    pub client: Option<usize>,
}

fn setup_of(r: &RunRecord) -> Setup {
    Setup {
        server: r.server_threads,
        client: r.client_threads,
    }
}

/// Whether `r` is a closed-loop run of one line of figures: a target, a workload (the
/// ceiling's runs count for every workload) and a setup.
fn in_series(r: &RunRecord, target: &str, workload: &str, setup: Setup) -> bool {
    r.target == target
        && r.mode == "closed"
        && (r.workload == workload || target == "baseline")
        && setup_of(r) == setup
}

/// Throughputs of the closed-loop runs of one (target, workload, connections, setup).
fn samples(
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

fn median(v: &[f64]) -> f64 {
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
fn setups(runs: &[RunRecord], target: &str) -> Vec<Setup> {
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
fn best_with(
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
fn best_at(
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

/// geoshard, PostGIS and the ceiling at each concurrency PostGIS ran, each in its best setup
/// at that many connections: the comparison at the same concurrency, with the ceiling's lead
/// over PostGIS as the most any HTTP server could show there.
fn by_concurrency(runs: &[RunRecord], workload: &str) -> String {
    let mut conns: Vec<usize> = runs
        .iter()
        .filter(|r| r.target == "postgis" && r.mode == "closed" && r.workload == workload)
        .map(|r| r.connections)
        .collect();
    conns.sort_unstable();
    conns.dedup();
    if conns.is_empty() {
        return String::new();
    }
    let cell = |b: Option<Best>| {
        b.map(|b| {
            let setup = setup_text(b.setup);
            format!(
                "{} [{}]{}",
                fmt_k(b.median),
                fmt_k(b.min),
                setup
                    .get(2..)
                    .filter(|t| !t.is_empty())
                    .map(|t| format!(" ({t})"))
                    .unwrap_or_default()
            )
        })
        .unwrap_or("-".into())
    };
    let ratio = |a: Option<Best>, b: Option<Best>| match (a, b) {
        (Some(a), Some(b)) if b.median > 0.0 => format!("{:.2}x", a.median / b.median),
        _ => "-".into(),
    };
    let mut md = format!(
        "\n{workload} at the same concurrency: each target in its fastest setup at that many connections, medians (minimum in brackets). The ceiling's lead over PostGIS is the most any HTTP server could show at that concurrency here.\n\n| conns | geoshard | PostGIS | geoshard / PostGIS | HTTP ceiling | ceiling / PostGIS |\n|---|---|---|---|---|---|\n"
    );
    for c in conns {
        let g = best_where(runs, "geoshard", workload, Some(c), |_| true);
        let p = best_where(runs, "postgis", workload, Some(c), |_| true);
        let h = best_where(runs, "baseline", workload, Some(c), |_| true);
        md.push_str(&format!(
            "| {c} | {} | {} | {} | {} | {} |\n",
            cell(g),
            cell(p),
            ratio(g, p),
            cell(h),
            ratio(h, p)
        ));
    }
    md
}

/// `, 1 io thread, 2 client threads`; the parts not recorded are left out.
fn setup_text(setup: Setup) -> String {
    let count =
        |n: usize, what: &str| format!(", {n} {what} thread{}", if n == 1 { "" } else { "s" });
    let mut t = String::new();
    if let Some(n) = setup.server {
        t.push_str(&count(n, "io"));
    }
    if let Some(n) = setup.client {
        t.push_str(&count(n, "client"));
    }
    t
}

/// How a run's target reads in the report, with its setup.
fn label(target: &str, setup: Setup) -> String {
    let name = match target {
        "baseline" => "HTTP ceiling",
        t => t,
    };
    format!("{name}{}", setup_text(setup))
}

fn chart_err<E: std::fmt::Display>(e: E) -> String {
    format!("chart: {e}")
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(127, 127, 127),
    RGBColor(140, 86, 75),
    RGBColor(23, 190, 207),
];

/// Each series as a line with dots, in its own colour, and the legend.
fn draw_lines<'a, X, Y, S: AsRef<str>>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    series: &[(S, Vec<(f64, f64)>)],
) -> Result<(), String>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(chart_err)?
            .label(name.as_ref())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart
            .draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(chart_err)?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(chart_err)
}

fn throughput_chart(runs: &[RunRecord], workload: &str, path: &Path) -> Result<(), String> {
    // A line for each target and setup.
    let lines: Vec<(&str, Setup)> = ["geoshard", "baseline", "postgis"]
        .into_iter()
        .flat_map(|t| setups(runs, t).into_iter().map(move |s| (t, s)))
        .collect();
    let series: Vec<(String, Vec<(f64, f64)>)> = lines
        .into_iter()
        .map(|(t, setup)| {
            let mut pts: BTreeMap<usize, f64> = BTreeMap::new();
            for r in runs.iter().filter(|r| in_series(r, t, workload, setup)) {
                let e = pts.entry(r.connections).or_insert(0.0);
                *e = e.max(r.throughput);
            }
            (
                label(t, setup),
                pts.into_iter()
                    .map(|(c, v)| ((c as f64).log2(), v / 1000.0))
                    .collect::<Vec<(f64, f64)>>(),
            )
        })
        .filter(|(_, p)| !p.is_empty())
        .collect();
    let max_y = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.1))
        .fold(1.0, f64::max)
        * 1.15;
    let max_x = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.0))
        .fold(1.0, f64::max);
    let root = SVGBackend::new(path, (760, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(chart_err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Throughput against concurrency ({workload}, closed loop)"),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..max_x + 0.5, 0.0..max_y)
        .map_err(chart_err)?;
    chart
        .configure_mesh()
        .x_desc("connections")
        .y_desc("thousand requests / s")
        .x_label_formatter(&|x| format!("{}", 2f64.powf(x.round()) as u64))
        .draw()
        .map_err(chart_err)?;
    draw_lines(&mut chart, &series)?;
    root.present().map_err(chart_err)
}

/// One offered load of the open-loop runs of a target and workload: the median of each
/// percentile over the repetitions (ms), with the range of p99.
struct OpenPoint {
    offered: f64,
    /// The setup of the runs, when they all had one.
    setup: Option<Setup>,
    /// The connections of the runs, when they all had the same.
    connections: Option<usize>,
    runs: usize,
    p50: f64,
    p90: f64,
    p99: f64,
    p999: f64,
    max: f64,
    p99_min: f64,
    p99_max: f64,
    /// Cores the server and the load generator kept busy together (their CPU time a request
    /// times the requests a second), median over the runs; `None` without CPU figures.
    busy: Option<f64>,
}

impl OpenPoint {
    /// ", N connections" when the runs all had the same, else nothing.
    fn connections_text(&self) -> String {
        self.connections
            .map(|c| format!(", {c} connections"))
            .unwrap_or_default()
    }

    /// "medians of N runs: p50 …, p99 … (range …), p99.9 …, max …"; "one run: p50 …, p99 …,
    /// p99.9 …, max …" for one.
    fn percentiles(&self) -> String {
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
fn busy_cores(r: &RunRecord) -> Option<f64> {
    let us = r.server_cpu_us_per_request? + r.client_cpu_us_per_request?;
    Some(us * r.throughput / 1e6)
}

/// The setup of a target's open-loop sweep: the one with the most open-loop runs (the first
/// of those, on a tie). Other setups may have been run at a single load beside it.
fn sweep_setup(runs: &[RunRecord], target: &str, workload: &str) -> Option<Setup> {
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
fn sweep_points(runs: &[RunRecord], workload: &str) -> Vec<OpenPoint> {
    match sweep_setup(runs, "geoshard", workload) {
        Some(s) => open_points(runs, "geoshard", workload, Some(s)),
        None => Vec::new(),
    }
}

/// geoshard in its other setups at the sweep's `offered` load: one sentence each.
fn other_setups_at(runs: &[RunRecord], workload: &str, offered: f64) -> String {
    let sweep = sweep_setup(runs, "geoshard", workload);
    let mut others: Vec<Setup> = runs
        .iter()
        .filter(|r| r.target == "geoshard" && r.mode == "open" && r.workload == workload)
        .map(setup_of)
        .filter(|s| Some(*s) != sweep)
        .collect();
    others.sort_unstable();
    others.dedup();
    let mut text = String::new();
    for s in others {
        let at = open_points(runs, "geoshard", workload, Some(s))
            .into_iter()
            .find(|p| (p.offered - offered).abs() <= 0.01 * offered);
        if let Some(p) = at {
            text.push_str(&format!(
                " geoshard on{}{} at the same offered load, {}{}.",
                setup_text(s).get(1..).unwrap_or(" another setup"),
                p.connections_text(),
                p.percentiles(),
                p.busy
                    .map(|b| format!(", {b:.2} busy cores"))
                    .unwrap_or_default()
            ));
        }
    }
    text
}

/// A target's open-loop medians by offered load, of the runs in one setup when given.
fn open_points(
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

/// The ceiling at 70% of its own closed-loop peak, open loop, in the setup of that peak (the
/// same bar geoshard is held to), when the run measured it: empty otherwise.
fn ceiling_at_own_peak(runs: &[RunRecord], workload: &str) -> String {
    let Some(peak) = best(runs, "baseline", workload) else {
        return String::new();
    };
    let due = 0.7 * peak.median;
    let near = open_points(runs, "baseline", workload, Some(peak.setup))
        .into_iter()
        .filter(|p| (p.offered - due).abs() <= 0.01 * due)
        .min_by(|a, b| (a.offered - due).abs().total_cmp(&(b.offered - due).abs()));
    let Some(p) = near else {
        return String::new();
    };
    format!(
        " The HTTP ceiling at {:.0} requests/s offered, {:.0}% of its own closed-loop median peak {} (these runs on{}{}), {}{}.",
        p.offered,
        100.0 * p.offered / peak.median,
        fmt_k(peak.median),
        setup_text(peak.setup).get(1..).unwrap_or(" its best setup"),
        p.connections_text(),
        p.percentiles(),
        p.busy
            .map(|b| format!(", {b:.2} busy cores"))
            .unwrap_or_default()
    )
}

/// How the load generator was scheduled, as its runs recorded it: a sentence, or nothing when
/// no run recorded it.
fn client_policy(runs: &[RunRecord]) -> String {
    let count = |want: Option<bool>| runs.iter().filter(|r| r.client_sched_batch == want).count();
    let (batch, plain, unknown) = (count(Some(true)), count(Some(false)), count(None));
    let what = "under SCHED_BATCH, so that it never preempts the server it shares the cores with when it wakes (a real client takes nothing from the server's cores)";
    if unknown == runs.len() {
        String::new()
    } else if batch == runs.len() {
        format!(" The load generator ran {what}, in every run and for every target alike.")
    } else if plain == runs.len() {
        " The load generator ran under the default scheduling policy.".into()
    } else {
        format!(
            " The load generator ran {what} in {batch} of the {} runs (the default policy in {plain}, not recorded in {unknown}).",
            runs.len()
        )
    }
}

/// The ceiling's open-loop points to set beside geoshard's: those in the setup all of
/// geoshard's open-loop runs had (the ceiling's runs at its own peak may be in another).
fn ceiling_beside(runs: &[RunRecord], geoshard: &[OpenPoint], workload: &str) -> Vec<OpenPoint> {
    let first = geoshard.first().and_then(|p| p.setup);
    let same = first.filter(|s| geoshard.iter().all(|p| p.setup == Some(*s)));
    open_points(runs, "baseline", workload, same)
}

/// The open-loop medians of geoshard and the ceiling by offered load, with the cores both
/// processes kept busy: on a machine the server shares with its load generator, the tail
/// follows how busy the whole machine is, and rows where the two keep it equally busy compare
/// the servers at the same machine load.
fn open_table(geoshard: &[OpenPoint], ceiling: &[OpenPoint], cores: usize) -> String {
    let cell = |p: Option<&OpenPoint>| match p {
        Some(p) => format!(
            "{:.2} | {:.2} ({:.2}–{:.2}; {} run{}) | {}",
            p.p50,
            p.p99,
            p.p99_min,
            p.p99_max,
            p.runs,
            if p.runs == 1 { "" } else { "s" },
            p.busy.map(|b| format!("{b:.2}")).unwrap_or("-".into())
        ),
        None => "- | - | -".into(),
    };
    let mut offered: Vec<f64> = geoshard.iter().chain(ceiling).map(|p| p.offered).collect();
    offered.sort_by(f64::total_cmp);
    offered.dedup();
    let mut md = format!(
        "\nOpen loop, pip-counties, medians by offered load. Busy cores: the server's and the load generator's CPU time a request, times the requests a second, out of the machine's {cores}; the server and its load generator share them.\n\n| offered/s | geoshard p50 ms | geoshard p99 ms (range; runs) | geoshard busy cores | ceiling p50 ms | ceiling p99 ms (range; runs) | ceiling busy cores |\n|---|---|---|---|---|---|---|\n"
    );
    for o in offered {
        let g = geoshard.iter().find(|p| p.offered == o);
        let c = ceiling.iter().find(|p| p.offered == o);
        md.push_str(&format!("| {o:.0} | {} | {} |\n", cell(g), cell(c)));
    }
    md
}

/// Ok(false) when there were no open-loop runs to draw.
fn latency_chart(runs: &[RunRecord], workload: &str, path: &Path) -> Result<bool, String> {
    // geoshard's percentiles (medians over the repetitions), and the ceiling server's at the
    // same offered loads: the floor this machine and client put under any server's latency.
    let open = sweep_points(runs, workload);
    let ceiling = ceiling_beside(runs, &open, workload);
    if open.is_empty() {
        return Ok(false);
    }
    let curve = |ps: &[OpenPoint], f: fn(&OpenPoint) -> f64| -> Vec<(f64, f64)> {
        ps.iter().map(|p| (p.offered / 1000.0, f(p))).collect()
    };
    let mut series: Vec<(&str, Vec<(f64, f64)>)> = vec![
        ("geoshard p50", curve(&open, |p| p.p50)),
        ("geoshard p90", curve(&open, |p| p.p90)),
        ("geoshard p99", curve(&open, |p| p.p99)),
        ("geoshard p99.9", curve(&open, |p| p.p999)),
    ];
    if !ceiling.is_empty() {
        series.push(("HTTP ceiling p50", curve(&ceiling, |p| p.p50)));
        series.push(("HTTP ceiling p99", curve(&ceiling, |p| p.p99)));
    }
    // Over every series: the ceiling's points may reach past geoshard's (its run at 70% of its
    // own peak, when that peak is in geoshard's open-loop setup).
    let max_x = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.0))
        .fold(1.0, f64::max)
        * 1.05;
    let max_y = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.1))
        .fold(0.1, f64::max)
        * 1.3;
    let root = SVGBackend::new(path, (760, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(chart_err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Latency against offered load ({workload}, open loop, medians)"),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..max_x, (0.01..max_y).log_scale())
        .map_err(chart_err)?;
    chart
        .configure_mesh()
        .x_desc("offered load, thousand requests / s")
        .y_desc("latency, ms (log)")
        .draw()
        .map_err(chart_err)?;
    draw_lines(&mut chart, &series)?;
    root.present().map_err(chart_err)?;
    Ok(true)
}

fn comparison_chart(runs: &[RunRecord], workloads: &[&str], path: &Path) -> Result<(), String> {
    let targets = ["geoshard", "postgis", "baseline"];
    let max_y = runs
        .iter()
        .map(|r| r.throughput / 1000.0)
        .fold(1.0, f64::max)
        * 1.15;
    let root = SVGBackend::new(path, (760, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(chart_err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Best closed-loop throughput per workload",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(-0.5..(workloads.len() as f64 - 0.5), 0.0..max_y)
        .map_err(chart_err)?;
    let names: Vec<String> = workloads.iter().map(|w| w.to_string()).collect();
    chart
        .configure_mesh()
        .x_labels(workloads.len())
        .x_label_formatter(&|x| names.get(x.round() as usize).cloned().unwrap_or_default())
        .y_desc("thousand requests / s")
        .draw()
        .map_err(chart_err)?;
    for (ti, target) in targets.iter().enumerate() {
        let color = COLORS[ti % COLORS.len()];
        let width = 0.25;
        let offset = (ti as f64 - 1.0) * width;
        let bars: Vec<Rectangle<(f64, f64)>> = workloads
            .iter()
            .enumerate()
            .filter_map(|(i, w)| {
                // The ceiling is one figure for every workload.
                let m = best(runs, target, w)?.median;
                let x = i as f64 + offset;
                Some(Rectangle::new(
                    [(x - width / 2.0, 0.0), (x + width / 2.0, m / 1000.0)],
                    color.filled(),
                ))
            })
            .collect();
        chart
            .draw_series(bars)
            .map_err(chart_err)?
            .label(*target)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(chart_err)?;
    root.present().map_err(chart_err)
}

fn fmt_k(v: f64) -> String {
    format!("{:.1}k", v / 1000.0)
}

/// Write the report; returns the Markdown path.
pub fn write(dir: &Path, ctx: &Context, runs: &[RunRecord]) -> Result<std::path::PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let name = &ctx.name;
    let workloads: Vec<&str> = [
        "pip-counties",
        "pip-countries",
        "point-eq",
        "envelope",
        "mixed",
    ]
    .into_iter()
    .filter(|w| {
        runs.iter()
            .any(|r| r.workload == *w && r.target != "baseline")
    })
    .collect();
    throughput_chart(
        runs,
        "pip-counties",
        &dir.join(format!("{name}-throughput.svg")),
    )?;
    let latency = latency_chart(
        runs,
        "pip-counties",
        &dir.join(format!("{name}-latency.svg")),
    )?;
    comparison_chart(runs, &workloads, &dir.join(format!("{name}-compare.svg")))?;

    let mut md = String::new();
    md.push_str(&format!("# geoshard load test: {name}\n\n"));
    md.push_str(&format!(
        "- date: {}\n- commit: `{}`\n- machine: {} cores, {}, {} memory, Linux {}\n- server and load generator share the machine; PostGIS runs on the same machine over a local socket and pays no HTTP cost.\n\n",
        ctx.date, ctx.commit, ctx.cores, ctx.cpu_model, ctx.memory, ctx.kernel
    ));
    md.push_str("## Summary\n\n");
    md.push_str("Throughput is the median of repeated closed-loop runs (minimum in brackets) at the setup (the server's io threads, the load generator's threads) and concurrency where that median is highest: every target, the ceiling included, at its fastest. A median never mixes setups. Ratios compare medians.\n\n");
    md.push_str("| workload | geoshard (conns) | HTTP ceiling (conns) | geoshard / ceiling | PostGIS (conns) | geoshard / PostGIS, best vs best | geoshard / PostGIS at PostGIS's best conns and client threads | answers checked (wrong) |\n|---|---|---|---|---|---|---|---|\n");
    let ceiling = best(runs, "baseline", "");
    let cell = |b: Option<Best>| {
        b.map(|b| {
            format!(
                "{} [{}] ({}{}, {} runs)",
                fmt_k(b.median),
                fmt_k(b.min),
                b.connections,
                setup_text(b.setup),
                b.runs
            )
        })
        .unwrap_or("-".into())
    };
    for w in &workloads {
        let g = best(runs, "geoshard", w);
        let p = best(runs, "postgis", w);
        // geoshard at PostGIS's best connections and client threads, in its best setup there.
        let at_pg = p.and_then(|p| {
            best_at(runs, "geoshard", w, p.connections, p.setup.client).map(|g| g.median / p.median)
        });
        let checks: (u64, u64) = runs
            .iter()
            .filter(|r| r.workload == *w && r.target != "baseline")
            .fold((0, 0), |a, r| (a.0 + r.checked, a.1 + r.mismatched));
        md.push_str(&format!(
            "| {w} | {} | {} | {} | {} | {} | {} | {} ({}) |\n",
            cell(g),
            cell(ceiling),
            match (g, ceiling) {
                // One decimal: the target is a fraction of the ceiling, and 69.7% is not 70%.
                (Some(g), Some(c)) => format!("{:.1}%", 100.0 * g.median / c.median),
                _ => "-".into(),
            },
            cell(p),
            match (g, p) {
                (Some(g), Some(p)) => format!("{:.2}x", g.median / p.median),
                _ => "-".into(),
            },
            at_pg.map(|x| format!("{x:.2}x")).unwrap_or("-".into()),
            checks.0,
            checks.1
        ));
    }
    md.push_str(&by_concurrency(runs, "pip-counties"));
    // Open loop: the latency at about 70% of the closed-loop peak.
    if let Some(Best { median: peak, .. }) = best(runs, "geoshard", "pip-counties") {
        let open = sweep_points(runs, "pip-counties");
        let near = open.iter().min_by(|a, b| {
            (a.offered - 0.7 * peak)
                .abs()
                .total_cmp(&(b.offered - 0.7 * peak).abs())
        });
        if let Some(p) = near {
            md.push_str(&format!(
                "\nOpen loop, pip-counties at {:.0} requests/s offered ({:.0}% of the closed-loop median peak {}{}{}), {} (latency from each request's due time).",
                p.offered,
                100.0 * p.offered / peak,
                fmt_k(peak),
                p.setup
                    .map(setup_text)
                    .filter(|t| !t.is_empty())
                    .map(|t| format!("; these runs on {}", &t[2..]))
                    .unwrap_or_default(),
                p.connections_text(),
                p.percentiles()
            ));
            // The same offered load on the ceiling server: what the client and machine add.
            let ceiling = ceiling_beside(runs, &open, "pip-counties");
            if let Some(b) = ceiling.iter().find(|b| b.offered == p.offered) {
                md.push_str(&format!(
                    " The HTTP ceiling server at the same offered load, {}.",
                    b.percentiles()
                ));
            }
            md.push_str(&other_setups_at(runs, "pip-counties", p.offered));
            md.push_str(&ceiling_at_own_peak(runs, "pip-counties"));
            md.push('\n');
            md.push_str(&open_table(&open, &ceiling, ctx.cores));
        }
    }
    md.push_str("\nThe ceiling is the harness's own minimal hyper server answering a fixed small JSON body, measured in the same run by the same client code. It serves its connections on geoshard's own io threads (`geoshard::http::io_threads`), which poll for events for geoshard's default `io_poll_us` after a request before they sleep (`geoshard::http::poll`); PostgreSQL's backends sleep at once.");
    md.push_str(&client_policy(runs));
    md.push_str("\n\n");
    if !ctx.extra.is_empty() {
        md.push_str("## Other figures\n\n");
        for (k, v) in &ctx.extra {
            md.push_str(&format!("- {k}: {v}\n"));
        }
        md.push('\n');
    }
    md.push_str("## Charts\n\n");
    for chart in ["throughput", "latency", "compare"] {
        // The latency chart exists only when there were open-loop runs.
        if chart != "latency" || latency {
            md.push_str(&format!("![{chart}]({name}-{chart}.svg)\n\n"));
        }
    }
    md.push_str("## Every run\n\nServer and client CPU are the CPU time (user and system) each process used in the measured window, divided by the requests measured: on a shared machine, a minute in which every request costs more shows there. Blank where the process is not one (PostGIS runs a backend a connection).\n\n| target | workload | dataset | mode | conns | offered/s | achieved/s | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | server CPU µs/req | client CPU µs/req | errors | checked | mismatched |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    let ms = |us: u64| format!("{:.2}", us as f64 / 1000.0);
    let cpu = |us: Option<f64>| us.map_or(String::new(), |us| format!("{us:.1}"));
    for r in runs {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            label(&r.target, setup_of(r)),
            r.workload,
            r.dataset,
            r.mode,
            r.connections,
            r.offered.map(|o| format!("{o:.0}")).unwrap_or("-".into()),
            r.throughput,
            ms(r.p50_us),
            ms(r.p90_us),
            ms(r.p99_us),
            ms(r.p999_us),
            ms(r.max_us),
            cpu(r.server_cpu_us_per_request),
            cpu(r.client_cpu_us_per_request),
            r.errors,
            r.checked,
            r.mismatched
        ));
    }
    md.push_str("\n## How these figures were made\n\n```sh\n");
    for c in &ctx.commands {
        md.push_str(c);
        md.push('\n');
    }
    md.push_str("```\n");
    let md_path = dir.join(format!("{name}.md"));
    std::fs::write(&md_path, md).map_err(|e| e.to_string())?;
    let json = serde_json::json!({"context": ctx, "runs": runs});
    std::fs::write(
        dir.join(format!("{name}.json")),
        serde_json::to_vec_pretty(&json).unwrap_or_default(),
    )
    .map_err(|e| e.to_string())?;
    Ok(md_path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn closed(target: &str, conns: usize, setup: (usize, usize), throughput: f64) -> RunRecord {
        RunRecord {
            target: target.into(),
            workload: "pip-counties".into(),
            dataset: "counties".into(),
            mode: "closed".into(),
            connections: conns,
            throughput,
            server_threads: Some(setup.0),
            client_threads: Some(setup.1),
            ..Default::default()
        }
    }

    fn setup(server: usize, client: usize) -> Setup {
        Setup {
            server: Some(server),
            client: Some(client),
        }
    }

    /// Every target is taken at its fastest setup (server io threads, client threads) and
    /// concurrency, and a median never mixes setups.
    #[test]
    fn each_target_is_its_fastest_setup() {
        let mut runs = Vec::new();
        // The ceiling at 64 connections: one io thread and one client thread is the best
        // median (110k); two io threads have the single best run (200k) but a median of 95k.
        for (s, rate) in [
            ((1, 1), 100.0),
            ((1, 1), 110.0),
            ((1, 1), 120.0),
            ((2, 1), 90.0),
            ((2, 1), 95.0),
            ((2, 1), 200.0),
            ((1, 2), 105.0),
            ((1, 2), 106.0),
            ((1, 2), 107.0),
        ] {
            runs.push(closed("baseline", 64, s, rate * 1000.0));
        }
        // At 4 connections two io threads win, with a median of 104k.
        for (s, rate) in [
            ((1, 1), 80.0),
            ((1, 1), 85.0),
            ((2, 1), 101.0),
            ((2, 1), 104.0),
            ((2, 1), 130.0),
        ] {
            runs.push(closed("baseline", 4, s, rate * 1000.0));
        }
        // geoshard: with one client thread 64k at 64 connections; with two, 70k at 256
        // (mixed, the 256-connection median would be 66k).
        for (s, c, rate) in [
            ((2, 1), 64, 63.0),
            ((2, 1), 64, 64.0),
            ((2, 1), 64, 65.0),
            ((2, 1), 256, 60.0),
            ((2, 1), 256, 62.0),
            ((2, 2), 64, 66.0),
            ((2, 2), 256, 69.0),
            ((2, 2), 256, 71.0),
        ] {
            runs.push(closed("geoshard", c, s, rate * 1000.0));
        }
        // PostGIS is best at 64 connections with one client thread.
        for (c, rate) in [(64, 40.0), (64, 42.0), (256, 35.0)] {
            let mut r = closed("postgis", c, (0, 1), rate * 1000.0);
            r.server_threads = None;
            runs.push(r);
        }

        let b = best(&runs, "baseline", "").unwrap();
        assert_eq!(
            (b.connections, b.setup, b.median, b.min, b.runs),
            (64, setup(1, 1), 110_000.0, 100_000.0, 3)
        );
        assert_eq!(
            samples(&runs, "baseline", "", 64, setup(2, 1)),
            [90e3, 95e3, 200e3]
        );
        let with_two = best_with(&runs, "baseline", "", setup(2, 1), None).unwrap();
        assert_eq!((with_two.connections, with_two.median), (4, 104_000.0));
        // The best on two io threads, whatever the client threads (`peak --server-threads 2`).
        let on_two = best_where(&runs, "baseline", "", None, |s| s.server == Some(2)).unwrap();
        assert_eq!((on_two.connections, on_two.median), (4, 104_000.0));
        let g = best(&runs, "geoshard", "pip-counties").unwrap();
        assert_eq!(
            (g.connections, g.setup, g.median, g.min, g.runs),
            (256, setup(2, 2), 70_000.0, 69_000.0, 2)
        );
        // At PostGIS's best (64 connections, one client thread), geoshard's figure is 64k.
        let at = best_at(&runs, "geoshard", "pip-counties", 64, Some(1)).unwrap();
        assert_eq!((at.setup, at.median), (setup(2, 1), 64_000.0));

        let dir = std::env::temp_dir().join(format!("geoshard-report-test-{}", std::process::id()));
        let ctx = Context::gather("t", vec![], Default::default());
        let text = std::fs::read_to_string(write(&dir, &ctx, &runs).unwrap()).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            text.contains("| pip-counties | 70.0k [69.0k] (256, 2 io threads, 2 client threads, 2 runs) | 110.0k [100.0k] (64, 1 io thread, 1 client thread, 3 runs) | 63.6% | 41.0k [40.0k] (64, 1 client thread, 2 runs) | 1.71x | 1.56x |"),
            "{text}"
        );
        assert!(
            text.contains("| HTTP ceiling, 2 io threads, 1 client thread | pip-counties |"),
            "{text}"
        );
    }

    /// Busy cores are both processes' CPU time a request times the rate, the median over a
    /// load's runs; the open-loop table has a row for every offered load of either target.
    #[test]
    fn open_loop_rows_carry_the_busy_cores() {
        let open = |target: &str, offered: f64, p99_ms: u64, cpu: Option<(f64, f64)>| RunRecord {
            target: target.into(),
            workload: "pip-counties".into(),
            mode: "open".into(),
            offered: Some(offered),
            throughput: offered,
            p50_us: 300,
            p99_us: p99_ms * 1000,
            server_cpu_us_per_request: cpu.map(|c| c.0),
            client_cpu_us_per_request: cpu.map(|c| c.1),
            ..Default::default()
        };
        // 40k/s at 20 + 10 µs a request is 1.2 cores; at 25 + 15, 1.6; the median of three
        // runs is the middle one.
        let runs = vec![
            open("geoshard", 40_000.0, 3, Some((20.0, 10.0))),
            open("geoshard", 40_000.0, 9, Some((25.0, 15.0))),
            open("geoshard", 40_000.0, 5, Some((22.0, 13.0))),
            open("baseline", 40_000.0, 2, Some((12.0, 13.0))),
            open("baseline", 20_000.0, 1, None),
        ];
        assert_eq!(busy_cores(&runs[0]), Some(1.2));
        assert_eq!(busy_cores(&runs[4]), None);
        let g = open_points(&runs, "geoshard", "pip-counties", None);
        let c = open_points(&runs, "baseline", "pip-counties", None);
        assert_eq!(g.len(), 1);
        assert!((g[0].busy.unwrap() - 1.4).abs() < 1e-9);
        let table = open_table(&g, &c, 2);
        assert!(table.contains("out of the machine's 2"), "{table}");
        assert!(
            table.contains("| 20000 | - | - | - | 0.30 | 1.00 (1.00–1.00; 1 run) | - |"),
            "{table}"
        );
        assert!(
            table.contains(
                "| 40000 | 0.30 | 5.00 (3.00–9.00; 3 runs) | 1.40 | 0.30 | 2.00 (2.00–2.00; 1 run) | 1.00 |"
            ),
            "{table}"
        );
    }

    /// The ceiling at 70% of its own peak is reported in the setup of that peak, and only
    /// runs in geoshard's open-loop setup stand beside geoshard's in the table.
    #[test]
    fn the_ceiling_is_held_to_its_own_peak_too() {
        let rec = |target: &str,
                   mode: &str,
                   io: usize,
                   ct: usize,
                   offered: Option<f64>,
                   thr: f64,
                   p99_ms: u64| RunRecord {
            target: target.into(),
            workload: "pip-counties".into(),
            mode: mode.into(),
            connections: if mode == "open" { 256 } else { 64 },
            offered,
            throughput: thr,
            p50_us: 400,
            p99_us: p99_ms * 1000,
            server_cpu_us_per_request: Some(10.0),
            client_cpu_us_per_request: Some(10.0),
            server_threads: Some(io),
            client_threads: Some(ct),
            ..Default::default()
        };
        let mut runs = vec![
            rec("baseline", "closed", 1, 1, None, 100_000.0, 1),
            rec("baseline", "closed", 2, 2, None, 90_000.0, 1),
            rec("geoshard", "closed", 2, 2, None, 60_000.0, 1),
            rec("geoshard", "open", 2, 2, Some(42_000.0), 42_000.0, 4),
            rec("baseline", "open", 2, 2, Some(42_000.0), 42_000.0, 2),
        ];
        assert_eq!(ceiling_at_own_peak(&runs, "pip-counties"), "");
        for p99 in [9, 7, 20] {
            runs.push(rec("baseline", "open", 1, 1, Some(70_000.0), 70_000.0, p99));
        }
        assert_eq!(
            ceiling_at_own_peak(&runs, "pip-counties"),
            " The HTTP ceiling at 70000 requests/s offered, 70% of its own closed-loop median peak 100.0k (these runs on 1 io thread, 1 client thread, 256 connections), medians of 3 runs: p50 0.40 ms, p99 9.00 ms (range 7.00–20.00), p99.9 0.00 ms, max 0.00 ms, 1.40 busy cores."
        );
        let open = sweep_points(&runs, "pip-counties");
        let beside = ceiling_beside(&runs, &open, "pip-counties");
        assert_eq!(beside.len(), 1);
        assert_eq!(beside[0].offered, 42_000.0);
        let table = open_table(&open, &beside, 2);
        assert!(!table.contains("| 70000 |"), "{table}");
        // Runs at another rate than 70% of the peak are not taken for it.
        runs.retain(|r| r.offered != Some(70_000.0));
        runs.push(rec("baseline", "open", 1, 1, Some(60_000.0), 60_000.0, 3));
        assert_eq!(ceiling_at_own_peak(&runs, "pip-counties"), "");
    }

    /// At each concurrency PostGIS ran, every target is taken in its fastest setup there, and
    /// the ceiling's lead over PostGIS is set beside geoshard's.
    #[test]
    fn by_concurrency_takes_each_target_at_its_fastest_setup_there() {
        let mut runs = Vec::new();
        for (target, conns, s, thr) in [
            ("postgis", 1, (0, 1), 7.0),
            ("postgis", 1, (0, 1), 8.0),
            ("postgis", 4, (0, 1), 27.0),
            ("postgis", 4, (0, 1), 29.0),
            ("geoshard", 1, (2, 1), 6.0),
            ("geoshard", 1, (1, 1), 9.0),
            ("geoshard", 1, (1, 1), 9.4),
            ("geoshard", 4, (2, 1), 37.0),
            ("geoshard", 4, (1, 1), 63.0),
            ("geoshard", 4, (1, 1), 65.0),
            // Not a concurrency PostGIS ran: no row.
            ("geoshard", 16, (1, 1), 70.0),
            ("baseline", 1, (2, 1), 10.0),
            ("baseline", 1, (1, 1), 9.0),
            ("baseline", 4, (1, 1), 83.0),
        ] {
            let mut r = closed(target, conns, s, thr * 1000.0);
            if target == "postgis" {
                r.server_threads = None;
            }
            runs.push(r);
        }
        let table = by_concurrency(&runs, "pip-counties");
        assert!(
            table.contains("| 1 | 9.2k [9.0k] (1 io thread, 1 client thread) | 7.5k [7.0k] (1 client thread) | 1.23x | 10.0k [10.0k] (2 io threads, 1 client thread) | 1.33x |\n"),
            "{table}"
        );
        assert!(
            table.contains("| 4 | 64.0k [63.0k] (1 io thread, 1 client thread) | 28.0k [27.0k] (1 client thread) | 2.29x | 83.0k [83.0k] (1 io thread, 1 client thread) | 2.96x |\n"),
            "{table}"
        );
        assert!(!table.contains("| 16 |"), "{table}");
        assert_eq!(by_concurrency(&runs, "pip-countries"), "");
    }

    /// geoshard's open-loop table and chart are its sweep's setup (the most runs); a setup run
    /// at one load beside it gets a sentence, not a place among the sweep's medians.
    #[test]
    fn open_loop_setups_are_kept_apart() {
        let open = |io: usize, ct: usize, offered: f64, p99_ms: u64| RunRecord {
            target: "geoshard".into(),
            workload: "pip-counties".into(),
            mode: "open".into(),
            connections: 64,
            offered: Some(offered),
            throughput: offered,
            p50_us: 500,
            p99_us: p99_ms * 1000,
            server_threads: Some(io),
            client_threads: Some(ct),
            ..Default::default()
        };
        let runs = vec![
            open(2, 2, 35_000.0, 3),
            open(2, 2, 35_000.0, 4),
            open(2, 2, 50_000.0, 8),
            open(2, 2, 50_000.0, 10),
            open(1, 1, 50_000.0, 30),
        ];
        assert_eq!(
            sweep_setup(&runs, "geoshard", "pip-counties"),
            Some(setup(2, 2))
        );
        let sweep = sweep_points(&runs, "pip-counties");
        assert_eq!(sweep.len(), 2);
        assert_eq!((sweep[1].runs, sweep[1].p99), (2, 9.0));
        assert_eq!(
            other_setups_at(&runs, "pip-counties", 50_000.0),
            " geoshard on 1 io thread, 1 client thread, 64 connections at the same offered load, one run: p50 0.50 ms, p99 30.00 ms, p99.9 0.00 ms, max 0.00 ms."
        );
        assert_eq!(other_setups_at(&runs, "pip-counties", 35_000.0), "");
    }

    /// Records from before the client threads were kept read as they did: one setup.
    #[test]
    fn older_records_without_client_threads_are_one_setup() {
        let line = r#"{"target":"geoshard","workload":"pip-counties","dataset":"counties","mode":"closed","connections":64,"offered":null,"seconds":8.0,"requests":1,"errors":0,"throughput":5000.0,"p50_us":1,"p90_us":1,"p99_us":1,"p999_us":1,"max_us":1,"checked":0,"mismatched":0,"server_rss_bytes":null,"server_threads":2,"note":null}"#;
        let r: RunRecord = serde_json::from_str(line).unwrap();
        assert_eq!(r.client_threads, None);
        let b = best(std::slice::from_ref(&r), "geoshard", "pip-counties").unwrap();
        assert_eq!(
            (b.median, setup_text(b.setup)),
            (5000.0, ", 2 io threads".to_string())
        );
    }

    /// The policy sentence says what the runs recorded: all, some, none, or nothing recorded.
    #[test]
    fn client_policy_follows_the_records() {
        let run = |batch: Option<bool>| RunRecord {
            client_sched_batch: batch,
            ..Default::default()
        };
        assert_eq!(client_policy(&[run(None), run(None)]), "");
        let all = client_policy(&[run(Some(true)), run(Some(true))]);
        assert!(all.contains("under SCHED_BATCH"), "{all}");
        assert!(
            all.ends_with("in every run and for every target alike."),
            "{all}"
        );
        let some = client_policy(&[run(Some(true)), run(Some(false)), run(None)]);
        assert!(some.contains("in 1 of the 3 runs"), "{some}");
        assert!(
            some.ends_with("(the default policy in 1, not recorded in 1)."),
            "{some}"
        );
        // Unrecorded runs are not taken for the default policy.
        let partly = client_policy(&[run(Some(false)), run(None)]);
        assert!(partly.contains("in 0 of the 2 runs"), "{partly}");
        assert_eq!(
            client_policy(&[run(Some(false))]),
            " The load generator ran under the default scheduling policy."
        );
    }

    /// The latency chart's x axis reaches the ceiling's furthest point, not only geoshard's
    /// (it stopped at geoshard's 64k and cut off the ceiling's 78k in report 2026-11-23c).
    #[test]
    fn latency_chart_spans_the_ceilings_points() {
        let rec = |target: &str, offered: f64| RunRecord {
            target: target.into(),
            workload: "pip-counties".into(),
            mode: "open".into(),
            connections: 64,
            offered: Some(offered),
            throughput: offered,
            p50_us: 400,
            p99_us: 2000,
            server_threads: Some(2),
            client_threads: Some(2),
            ..Default::default()
        };
        let runs = vec![
            rec("geoshard", 21_000.0),
            rec("geoshard", 64_000.0),
            rec("baseline", 21_000.0),
            rec("baseline", 64_000.0),
            rec("baseline", 78_000.0),
        ];
        let dir = std::env::temp_dir().join(format!("lt-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("latency.svg");
        assert!(latency_chart(&runs, "pip-counties", &path).unwrap());
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        // Tick labels stand on lines of their own; 80 (thousand requests/s) is past 78.
        let labels: Vec<f64> = svg.lines().filter_map(|l| l.trim().parse().ok()).collect();
        let furthest = labels.iter().copied().fold(0.0, f64::max);
        assert!(furthest >= 70.0, "x tick labels {labels:?}");
    }
}
