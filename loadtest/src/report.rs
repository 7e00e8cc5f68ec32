//! `report`: results (JSON lines of [`RunRecord`]) to `loadtest/reports/<name>.md`, the same
//! as JSON, and SVG charts: throughput against concurrency, latency against offered load,
//! and geoshard beside PostGIS and the HTTP ceiling per workload.

use std::collections::BTreeMap;
use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;

use crate::drive::RunRecord;

mod charts;
mod markdown;
mod select;

use charts::*;
use markdown::*;
use select::*;

pub use markdown::write;
pub use select::{Best, Setup, best, best_where};

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
