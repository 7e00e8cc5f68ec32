//! The SVG charts: throughput against concurrency, latency against offered load, and
//! geoshard beside PostGIS and the ceiling.

use super::*;

pub(super) fn chart_err<E: std::fmt::Display>(e: E) -> String {
    format!("chart: {e}")
}

pub(super) const COLORS: [RGBColor; 8] = [
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
pub(super) fn draw_lines<'a, X, Y, S: AsRef<str>>(
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

pub(super) fn throughput_chart(
    runs: &[RunRecord],
    workload: &str,
    path: &Path,
) -> Result<(), String> {
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

/// Ok(false) when there were no open-loop runs to draw.
pub(super) fn latency_chart(
    runs: &[RunRecord],
    workload: &str,
    path: &Path,
) -> Result<bool, String> {
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

pub(super) fn comparison_chart(
    runs: &[RunRecord],
    workloads: &[&str],
    path: &Path,
) -> Result<(), String> {
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
