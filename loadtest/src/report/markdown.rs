//! Writing the report: the Markdown text and its tables, and the JSON beside it.

use minijinja::value::Kwargs;
use minijinja::{Environment, context};

use super::*;

/// geoshard, PostGIS and the ceiling at each concurrency PostGIS ran, each in its best setup
/// at that many connections: the comparison at the same concurrency, with the ceiling's lead
/// over PostGIS as the most any HTTP server could show there.
pub(super) fn by_concurrency(runs: &[RunRecord], workload: &str) -> String {
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
    let rows: Vec<[String; 6]> = conns
        .into_iter()
        .map(|c| {
            let g = best_where(runs, "geoshard", workload, Some(c), |_| true);
            let p = best_where(runs, "postgis", workload, Some(c), |_| true);
            let h = best_where(runs, "baseline", workload, Some(c), |_| true);
            [
                c.to_string(),
                cell(g),
                cell(p),
                ratio(g, p),
                cell(h),
                ratio(h, p),
            ]
        })
        .collect();
    say("by_concurrency", context! { workload, rows })
}

/// `, 1 io thread, 2 client threads`; the parts not recorded are left out.
pub(super) fn setup_text(setup: Setup) -> String {
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
pub(super) fn label(target: &str, setup: Setup) -> String {
    let name = match target {
        "baseline" => "HTTP ceiling",
        t => t,
    };
    format!("{name}{}", setup_text(setup))
}

/// geoshard in its other setups at the sweep's `offered` load: one sentence each.
pub(super) fn other_setups_at(runs: &[RunRecord], workload: &str, offered: f64) -> String {
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
            text.push_str(&say(
                "other_setup",
                context! {
                    setup => setup_text(s).get(1..).unwrap_or(" another setup"),
                    connections => p.connections_text(),
                    percentiles => p.percentiles(),
                    busy => p.busy.map(|b| format!("{b:.2}")),
                },
            ));
        }
    }
    text
}

/// The ceiling at 70% of its own closed-loop peak, open loop, in the setup of that peak (the
/// same bar geoshard is held to), when the run measured it: empty otherwise.
pub(super) fn ceiling_at_own_peak(runs: &[RunRecord], workload: &str) -> String {
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
    say(
        "ceiling_at_own_peak",
        context! {
            offered => format!("{:.0}", p.offered),
            share => format!("{:.0}", 100.0 * p.offered / peak.median),
            peak => fmt_k(peak.median),
            setup => setup_text(peak.setup).get(1..).unwrap_or(" its best setup"),
            connections => p.connections_text(),
            percentiles => p.percentiles(),
            busy => p.busy.map(|b| format!("{b:.2}")),
        },
    )
}

/// How the load generator was scheduled, as its runs recorded it: a sentence, or nothing when
/// no run recorded it.
pub(super) fn client_policy(runs: &[RunRecord]) -> String {
    let count = |want: Option<bool>| runs.iter().filter(|r| r.client_sched_batch == want).count();
    say(
        "client_policy",
        context! {
            batch => count(Some(true)),
            plain => count(Some(false)),
            unknown => count(None),
            total => runs.len(),
        },
    )
}

/// The open-loop medians of geoshard and the ceiling by offered load, with the cores both
/// processes kept busy: on a machine the server shares with its load generator, the tail
/// follows how busy the whole machine is, and rows where the two keep it equally busy compare
/// the servers at the same machine load.
pub(super) fn open_table(geoshard: &[OpenPoint], ceiling: &[OpenPoint], cores: usize) -> String {
    let cells = |p: Option<&OpenPoint>| match p {
        Some(p) => [
            format!("{:.2}", p.p50),
            format!(
                "{:.2} ({:.2}–{:.2}; {} run{})",
                p.p99,
                p.p99_min,
                p.p99_max,
                p.runs,
                if p.runs == 1 { "" } else { "s" }
            ),
            p.busy.map(|b| format!("{b:.2}")).unwrap_or("-".into()),
        ],
        None => ["-".into(), "-".into(), "-".into()],
    };
    let mut offered: Vec<f64> = geoshard.iter().chain(ceiling).map(|p| p.offered).collect();
    offered.sort_by(f64::total_cmp);
    offered.dedup();
    let rows: Vec<Vec<String>> = offered
        .into_iter()
        .map(|o| {
            let mut row = vec![format!("{o:.0}")];
            row.extend(cells(geoshard.iter().find(|p| p.offered == o)));
            row.extend(cells(ceiling.iter().find(|p| p.offered == o)));
            row
        })
        .collect();
    say("open_table", context! { cores, rows })
}

pub(super) fn fmt_k(v: f64) -> String {
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
    // The latency chart exists only when there were open-loop runs.
    let charts: Vec<&str> = ["throughput", "latency", "compare"]
        .into_iter()
        .filter(|c| *c != "latency" || latency)
        .collect();
    let text = environment()
        .get_template("report")
        .and_then(|t| {
            t.render(context! {
                name,
                date => ctx.date,
                commit => ctx.commit,
                cores => ctx.cores,
                cpu_model => ctx.cpu_model,
                memory => ctx.memory,
                kernel => ctx.kernel,
                summary => summary_rows(runs, &workloads),
                by_concurrency => by_concurrency(runs, "pip-counties"),
                open => open_loop(runs, ctx.cores),
                client_policy => client_policy(runs),
                extra => ctx.extra,
                charts,
                runs => run_rows(runs),
                commands => ctx.commands,
            })
        })
        .map_err(|e| format!("the report template: {e:#}"))?;
    let md_path = dir.join(format!("{name}.md"));
    std::fs::write(&md_path, text).map_err(|e| e.to_string())?;
    let json = serde_json::json!({"context": ctx, "runs": runs});
    std::fs::write(
        dir.join(format!("{name}.json")),
        serde_json::to_vec_pretty(&json).unwrap_or_default(),
    )
    .map_err(|e| e.to_string())?;
    Ok(md_path)
}

/// One summary row a workload: each target at its fastest, the ratios, the answers checked.
fn summary_rows(runs: &[RunRecord], workloads: &[&str]) -> Vec<[String; 8]> {
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
    workloads
        .iter()
        .map(|w| {
            let g = best(runs, "geoshard", w);
            let p = best(runs, "postgis", w);
            // geoshard at PostGIS's best connections and client threads, in its best setup there.
            let at_pg = p.and_then(|p| {
                best_at(runs, "geoshard", w, p.connections, p.setup.client)
                    .map(|g| g.median / p.median)
            });
            let checks: (u64, u64) = runs
                .iter()
                .filter(|r| r.workload == *w && r.target != "baseline")
                .fold((0, 0), |a, r| (a.0 + r.checked, a.1 + r.mismatched));
            [
                w.to_string(),
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
                format!("{} ({})", checks.0, checks.1),
            ]
        })
        .collect()
}

/// The open-loop paragraph's figures: pip-counties at about 70% of geoshard's closed-loop
/// peak, with the ceiling and geoshard's other setups at the same offered load.
fn open_loop(runs: &[RunRecord], cores: usize) -> Option<minijinja::Value> {
    let peak = best(runs, "geoshard", "pip-counties")?.median;
    let open = sweep_points(runs, "pip-counties");
    let p = open.iter().min_by(|a, b| {
        (a.offered - 0.7 * peak)
            .abs()
            .total_cmp(&(b.offered - 0.7 * peak).abs())
    })?;
    // The same offered load on the ceiling server: what the client and machine add.
    let ceiling = ceiling_beside(runs, &open, "pip-counties");
    Some(context! {
        offered => format!("{:.0}", p.offered),
        share => format!("{:.0}", 100.0 * p.offered / peak),
        peak => fmt_k(peak),
        setup => p.setup.map(setup_text).and_then(|t| t.get(2..).map(str::to_string)),
        connections => p.connections_text(),
        percentiles => p.percentiles(),
        ceiling => ceiling.iter().find(|b| b.offered == p.offered).map(|b| b.percentiles()),
        other_setups => other_setups_at(runs, "pip-counties", p.offered),
        ceiling_own_peak => ceiling_at_own_peak(runs, "pip-counties"),
        table => open_table(&open, &ceiling, cores),
    })
}

/// One row a run for the table of every run.
fn run_rows(runs: &[RunRecord]) -> Vec<Vec<String>> {
    let ms = |us: u64| format!("{:.2}", us as f64 / 1000.0);
    let cpu = |us: Option<f64>| us.map_or(String::new(), |us| format!("{us:.1}"));
    runs.iter()
        .map(|r| {
            vec![
                label(&r.target, setup_of(r)),
                r.workload.clone(),
                r.dataset.clone(),
                r.mode.clone(),
                r.connections.to_string(),
                r.offered.map(|o| format!("{o:.0}")).unwrap_or("-".into()),
                format!("{:.0}", r.throughput),
                ms(r.p50_us),
                ms(r.p90_us),
                ms(r.p99_us),
                ms(r.p999_us),
                ms(r.max_us),
                cpu(r.server_cpu_us_per_request),
                cpu(r.client_cpu_us_per_request),
                r.errors.to_string(),
                r.checked.to_string(),
                r.mismatched.to_string(),
            ]
        })
        .collect()
}

/// The report's templates: the document and the sentences it is made of.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(true);
    for (name, source) in [
        ("prose", include_str!("templates/prose.j2")),
        ("report", include_str!("templates/report.md.j2")),
    ] {
        // Both are compiled into the binary and covered by the tests: a syntax error cannot ship.
        if let Err(e) = env.add_template(name, source) {
            panic!("report template {name}: {e}");
        }
    }
    env
}

/// One macro of the prose template, called with the members of `args` as its keyword
/// arguments.
fn say(name: &str, args: minijinja::Value) -> String {
    thread_local! {
        static ENV: Environment<'static> = environment();
    }
    ENV.with(|env| {
        let call = || -> Result<String, minijinja::Error> {
            let kwargs: Kwargs = args
                .try_iter()?
                .map(|k| Ok((k.to_string(), args.get_item(&k)?)))
                .collect::<Result<Vec<(String, _)>, minijinja::Error>>()?
                .into_iter()
                .collect();
            env.get_template("prose")?
                .render_captured(())?
                .state()
                .call_macro(name, &[kwargs.into()])
        };
        call().unwrap_or_else(|e| panic!("report template macro {name}: {e:#}"))
    })
}
