//! Engine benchmarks on real data (no HTTP): point-in-polygon on the US counties and the world
//! countries with GeoNames places as query points, exact-point lookup and envelope queries
//! on a 1M-point layer jittered around GeoNames places, and index build throughput.
//!
//!     cargo bench --bench spatial
//!
//! Each iteration is one query, end to end inside the engine: H3 cell, shard, R-tree, exact
//! test. Query points rotate through the whole set.

#[path = "fixture.rs"]
mod fixture;

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use geo::{Geometry, Point, polygon};
use geoshard::spatial::{Engine, EngineConfig, Query, Relation};

fn engine_with(layer: &[Geometry<f64>]) -> Engine {
    let e = Engine::new(EngineConfig::default()).unwrap();
    e.bulk_load(
        layer
            .iter()
            .enumerate()
            .map(|(i, g)| (i as u32, g.clone()))
            .collect(),
    );
    e
}

fn point_in_polygon(c: &mut Criterion) {
    let places = fixture::places();
    let us: Vec<(f64, f64)> = places
        .iter()
        .filter(|p| p.2 == "US")
        .map(|p| (p.0, p.1))
        .collect();
    let all: Vec<(f64, f64)> = places.iter().map(|p| (p.0, p.1)).collect();
    let mut g = c.benchmark_group("point_contains");
    g.measurement_time(Duration::from_secs(5));
    for (name, layer, points) in [
        ("counties_us_places", "us-counties.geojson", &us),
        ("countries_all_places", "world-countries-50m.geojson", &all),
    ] {
        let engine = engine_with(&fixture::layer(layer));
        let mut i = 0usize;
        g.bench_function(name, |b| {
            b.iter(|| {
                let (x, y) = points[i % points.len()];
                i += 1;
                black_box(engine.query(&Query::point(x, y), Relation::Contains))
            })
        });
    }
    g.finish();
}

fn points_1m(c: &mut Criterion) {
    let places = fixture::places();
    let pts = fixture::jittered(&places, 1_000_000, 42);
    let engine = Engine::new(EngineConfig::default()).unwrap();
    engine.bulk_load(
        pts.iter()
            .enumerate()
            .map(|(i, &(x, y))| (i as u32, Geometry::Point(Point::new(x, y))))
            .collect(),
    );
    let mut g = c.benchmark_group("points_1m");
    g.measurement_time(Duration::from_secs(5));
    let mut i = 0usize;
    g.bench_function("exact_point_lookup", |b| {
        b.iter(|| {
            // Every 7th point is stored, so lookups hit; the others probe nearby misses.
            let (x, y) = pts[(i * 7919) % pts.len()];
            i += 1;
            black_box(engine.query(&Query::point(x, y), Relation::Contains))
        })
    });
    for size in [0.1f64, 1.0] {
        let mut rng = fixture::Rng::new(7);
        let boxes: Vec<Query> = (0..1024)
            .map(|_| {
                let (x, y) = pts[(rng.next_u64() % pts.len() as u64) as usize];
                let (x0, y0) = ((x - size / 2.0).max(-180.0), (y - size / 2.0).max(-90.0));
                let (x1, y1) = ((x0 + size).min(180.0), (y0 + size).min(90.0));
                Query::new(Geometry::Polygon(polygon![
                    (x: x0, y: y0), (x: x1, y: y0), (x: x1, y: y1), (x: x0, y: y1), (x: x0, y: y0)
                ]))
            })
            .collect();
        let mut k = 0usize;
        g.bench_with_input(BenchmarkId::new("envelope", size), &size, |b, _| {
            b.iter(|| {
                let q = &boxes[k % boxes.len()];
                k += 1;
                black_box(engine.query(q, Relation::Intersects).len())
            })
        });
    }
    g.finish();
}

fn build(c: &mut Criterion) {
    let places = fixture::places();
    let pts = fixture::jittered(&places, 1_000_000, 42);
    let items: Vec<(u32, Geometry<f64>)> = pts
        .iter()
        .enumerate()
        .map(|(i, &(x, y))| (i as u32, Geometry::Point(Point::new(x, y))))
        .collect();
    let counties = fixture::layer("us-counties.geojson");
    let mut g = c.benchmark_group("build");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(15));
    g.throughput(Throughput::Elements(items.len() as u64));
    g.bench_function("bulk_load_1m_points", |b| {
        b.iter_batched(
            || items.clone(),
            |items| {
                let e = Engine::new(EngineConfig::default()).unwrap();
                e.bulk_load(items);
                e
            },
            criterion::BatchSize::LargeInput,
        )
    });
    g.throughput(Throughput::Elements(counties.len() as u64));
    g.bench_function("bulk_load_counties", |b| {
        b.iter_batched(
            || {
                counties
                    .iter()
                    .enumerate()
                    .map(|(i, g)| (i as u32, g.clone()))
                    .collect::<Vec<_>>()
            },
            |items| {
                let e = Engine::new(EngineConfig::default()).unwrap();
                e.bulk_load(items);
                e
            },
            criterion::BatchSize::LargeInput,
        )
    });
    g.finish();
}

/// The parts of the point path, to see where time goes: the H3 cell alone, and the same
/// lookups on a one-shard engine (which needs no cell).
fn components(c: &mut Criterion) {
    let places = fixture::places();
    let pts = fixture::jittered(&places, 1_000_000, 42);
    let mut g = c.benchmark_group("components");
    g.measurement_time(Duration::from_secs(4));
    let part = geoshard::spatial::partition::Partitioner::new(3, 2).unwrap();
    let mut i = 0usize;
    g.bench_function("h3_shard_of_point", |b| {
        b.iter(|| {
            let (x, y) = pts[(i * 7919) % pts.len()];
            i += 1;
            black_box(part.shard_of_point(x, y))
        })
    });
    let one = Engine::new(EngineConfig {
        shards: 1,
        resolution: 3,
    })
    .unwrap();
    one.bulk_load(
        pts.iter()
            .enumerate()
            .map(|(i, &(x, y))| (i as u32, Geometry::Point(Point::new(x, y))))
            .collect(),
    );
    let mut i = 0usize;
    g.bench_function("exact_point_lookup_one_shard", |b| {
        b.iter(|| {
            let (x, y) = pts[(i * 7919) % pts.len()];
            i += 1;
            black_box(one.query(&Query::point(x, y), Relation::Contains))
        })
    });
    g.finish();
}

criterion_group!(benches, point_in_polygon, points_1m, build, components);
criterion_main!(benches);
