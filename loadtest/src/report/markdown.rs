//! Writing the report: the Markdown text and its tables, and the JSON beside it.

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
pub(super) fn client_policy(runs: &[RunRecord]) -> String {
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

/// The open-loop medians of geoshard and the ceiling by offered load, with the cores both
/// processes kept busy: on a machine the server shares with its load generator, the tail
/// follows how busy the whole machine is, and rows where the two keep it equally busy compare
/// the servers at the same machine load.
pub(super) fn open_table(geoshard: &[OpenPoint], ceiling: &[OpenPoint], cores: usize) -> String {
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
