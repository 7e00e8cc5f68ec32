//! The cost of indexing one polygon, by shape and size: convex rings, zig-zag stars, combs
//! and spirals (`shapes.rs`) of 1k, 10k, 100k and 1M positions. Long edges used to make the
//! index quadratic; its build time and its bytes a vertex should now differ between shapes
//! of one size by a small factor.
//!
//!     cargo bench --bench polygon_index
//!
//! - `polygon_index/parts/<shape>/<n>`: the polygon's banded, striped parts (`Shape::new`).
//! - `polygon_index/engine/<shape>/<n>`: a whole engine build with that one polygon (parts,
//!   shards, R-trees and the point-probe grid with its chains).
//!
//! Before the runs, the index's heap bytes a vertex (the geometry's 16 included) are
//! printed for each shape and size.

#[path = "shapes.rs"]
mod shapes;

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use geo::Geometry;
use geoshard::spatial::predicate::Shape;
use geoshard::spatial::{Engine, EngineConfig};

const SIZES: [usize; 4] = [1_000, 10_000, 100_000, 1_000_000];

fn bytes_a_vertex() {
    println!("heap bytes a vertex of the polygon index:");
    for n in SIZES {
        let row: Vec<String> = shapes::KINDS
            .iter()
            .map(|kind| {
                let s = Shape::new(Geometry::Polygon(shapes::shape(kind, n)))
                    .unwrap_or_else(|| unreachable!("a polygon is a shape"));
                format!("{kind} {:.1}", s.heap_bytes() as f64 / n as f64)
            })
            .collect();
        println!("  {n:>9}: {}", row.join(", "));
    }
}

fn polygon_index(c: &mut Criterion) {
    bytes_a_vertex();
    let mut g = c.benchmark_group("polygon_index");
    g.sample_size(10);
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(3));
    for n in SIZES {
        g.throughput(Throughput::Elements(n as u64));
        for kind in shapes::KINDS {
            let polygon = Geometry::Polygon(shapes::shape(kind, n));
            g.bench_with_input(
                BenchmarkId::new(format!("parts/{kind}"), n),
                &polygon,
                |b, p| b.iter(|| black_box(Shape::new(p.clone()))),
            );
            g.bench_with_input(
                BenchmarkId::new(format!("engine/{kind}"), n),
                &polygon,
                |b, p| {
                    b.iter(|| {
                        let e = Engine::new(EngineConfig {
                            shards: 2,
                            resolution: 3,
                        })
                        .unwrap_or_else(|e| panic!("{e}"));
                        e.bulk_load(vec![(1, p.clone())]);
                        black_box(e)
                    })
                },
            );
        }
    }
    g.finish();
}

criterion_group!(benches, polygon_index);
criterion_main!(benches);
