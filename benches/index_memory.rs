//! Memory and build figures of the engine that criterion does not give: resident bytes per
//! indexed feature (measured from /proc, not estimated) and one-shot build times.
//!
//!     cargo bench --bench index_memory

#[path = "fixture.rs"]
mod fixture;

use std::time::Instant;

use geo::{Geometry, Point};
use geoshard::spatial::{Engine, EngineConfig};

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Give freed memory back to the OS, so resident size reflects live data only.
fn collect() {
    // SAFETY: `mi_collect` only walks mimalloc's own heaps; it has no preconditions.
    unsafe { libmimalloc_sys::mi_collect(true) };
}

/// Resident bytes of the index of `items`, and the build time. Runs in a fresh state: the
/// input is counted before and subtracted, since bulk loading consumes (frees) it.
fn measure(items: Vec<(u32, Geometry<f64>)>) -> (Engine, f64, f64) {
    let n = items.len();
    let input_bytes = (items.capacity() * std::mem::size_of::<(u32, Geometry<f64>)>()) as f64;
    collect();
    let before = rss_bytes() as f64;
    let t = Instant::now();
    let e = Engine::new(EngineConfig::default()).unwrap();
    e.bulk_load(items);
    let secs = t.elapsed().as_secs_f64();
    collect();
    let after = rss_bytes() as f64;
    (e, secs, (after - (before - input_bytes)) / n as f64)
}

fn main() {
    for name in ["us-counties.geojson", "world-countries-50m.geojson"] {
        let layer = fixture::layer(name);
        let items: Vec<(u32, Geometry<f64>)> = layer
            .iter()
            .enumerate()
            .map(|(i, g)| (i as u32, g.clone()))
            .collect();
        let count = items.len();
        let (e, secs, per) = measure(items);
        println!(
            "{name}: {count} features, build {secs:.3}s, resident {:.0} bytes/feature \
             (geometry included), shard entries (points, parts, envelopes) {:?}",
            per,
            e.shard_sizes()
        );
    }
    let places = fixture::places();
    let n = 1_000_000usize;
    let pts = fixture::jittered(&places, n, 42);
    let make = || -> Vec<(u32, Geometry<f64>)> {
        pts.iter()
            .enumerate()
            .map(|(i, &(x, y))| (i as u32, Geometry::Point(Point::new(x, y))))
            .collect()
    };
    let mut times = Vec::new();
    let mut bytes = Vec::new();
    for _ in 0..3 {
        let (e, secs, per) = measure(make());
        times.push(secs);
        bytes.push(per);
        drop(e);
        collect();
    }
    times.sort_by(f64::total_cmp);
    bytes.sort_by(f64::total_cmp);
    println!(
        "points {n}: bulk build min {:.3}s median {:.3}s = {:.2}M features/s (median); \
         resident index bytes/feature min {:.1} median {:.1}",
        times[0],
        times[1],
        n as f64 / times[1] / 1e6,
        bytes[0],
        bytes[1]
    );
}
