//! The polygon index stays linear in the vertices whatever the ring's shape (convex, zig-zag,
//! comb, spiral), and locates exactly where its budgets make it fall back to longer scans:
//! every answer is compared with geo's `coordinate_position`, which scans all edges.

use crate::shapes;

use geo::coordinate_position::{CoordPos, CoordinatePosition};
use geo::{Coord, Geometry, Polygon};
use geoshard::spatial::predicate::Shape;
use geoshard::spatial::{Engine, EngineConfig, Location, Query, Relation};

/// The index's bytes a vertex can never exceed: at most 2 band copies of an edge times 4
/// stripe copies, 32 bytes each, plus the geometry's 16 bytes, stripe offsets and part
/// headers.
const MAX_BYTES_PER_VERTEX: f64 = 320.0;

fn oracle(p: &Polygon<f64>, x: f64, y: f64) -> Location {
    match p.coordinate_position(&Coord { x, y }) {
        CoordPos::Inside => Location::Interior,
        CoordPos::OnBoundary => Location::Boundary,
        CoordPos::Outside => Location::Exterior,
    }
}

/// splitmix64 in [0, 1).
fn rng(state: &mut u64) -> f64 {
    *state = state.wrapping_add(0x9e3779b97f4a7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
    ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
}

/// Random points over the polygon's box, some of its vertices and edge midpoints.
fn probes(p: &Polygon<f64>, s: &mut u64, random: usize) -> Vec<(f64, f64)> {
    use geo::BoundingRect;
    let b = p.bounding_rect().unwrap();
    let mut out: Vec<(f64, f64)> = (0..random)
        .map(|_| {
            (
                b.min().x - 0.5 + rng(s) * (b.width() + 1.0),
                b.min().y - 0.5 + rng(s) * (b.height() + 1.0),
            )
        })
        .collect();
    let ring = &p.exterior().0;
    let step = (ring.len() / 300).max(1);
    for w in ring.windows(2).step_by(step) {
        out.push((w[0].x, w[0].y));
        out.push(((w[0].x + w[1].x) / 2.0, (w[0].y + w[1].y) / 2.0));
    }
    out
}

#[test]
fn bytes_a_vertex_are_bounded_for_every_shape() {
    for n in [1_000, 10_000, 100_000] {
        let mut per_vertex = Vec::new();
        for kind in shapes::KINDS {
            let shape = Shape::new(Geometry::Polygon(shapes::shape(kind, n))).unwrap();
            let bytes = shape.heap_bytes() as f64 / n as f64;
            assert!(
                bytes <= MAX_BYTES_PER_VERTEX,
                "{kind} {n}: {bytes:.0} bytes a vertex"
            );
            per_vertex.push(bytes);
        }
        let (lo, hi) = per_vertex
            .iter()
            .fold((f64::MAX, 0.0f64), |(lo, hi), b| (lo.min(*b), hi.max(*b)));
        assert!(hi / lo < 4.0, "{n}: {per_vertex:?}");
    }
}

#[test]
fn every_shape_locates_as_geo_does() {
    let mut s = 3u64;
    for n in [2_000, 20_000] {
        for kind in shapes::KINDS {
            let p = shapes::shape(kind, n);
            let shape = Shape::new(Geometry::Polygon(p.clone())).unwrap();
            let (mut inside, mut boundary) = (0, 0);
            for (x, y) in probes(&p, &mut s, 3000) {
                let want = oracle(&p, x, y);
                assert_eq!(shape.locate(x, y), want, "{kind} {n} at ({x}, {y})");
                inside += usize::from(want == Location::Interior);
                boundary += usize::from(want == Location::Boundary);
            }
            assert!(
                inside > 100 && boundary > 100,
                "{kind} {n}: {inside} {boundary}"
            );
        }
    }
}

/// Through the engine (shards, R-trees and the point-probe grid with its chains and
/// budgets): many such polygons side by side, point queries against a scan of all of them.
#[test]
fn engine_point_queries_on_hostile_shapes_match_a_scan() {
    let mut s = 9u64;
    let mut polys: Vec<Polygon<f64>> = Vec::new();
    for i in 0..24 {
        let kind = shapes::KINDS[i % 4];
        let n = [500, 3_000, 12_000][i % 3];
        let (dx, dy) = ((i % 6) as f64 * 9.0, (i / 6) as f64 * 9.0);
        let mut p = shapes::shape(kind, n);
        use geo::MapCoordsInPlace;
        p.map_coords_in_place(|c| Coord {
            x: c.x + dx,
            y: c.y + dy,
        });
        polys.push(p);
    }
    let engine = Engine::new(EngineConfig {
        shards: 3,
        resolution: 3,
    })
    .unwrap();
    engine.bulk_load(
        polys
            .iter()
            .enumerate()
            .map(|(i, p)| (i as u32, Geometry::Polygon(p.clone())))
            .collect(),
    );
    use geo::BoundingRect;
    let boxes: Vec<geo::Rect<f64>> = polys.iter().map(|p| p.bounding_rect().unwrap()).collect();
    let mut checked = 0;
    for (i, p) in polys.iter().enumerate() {
        for (x, y) in probes(p, &mut s, 300) {
            // The oracle scans every polygon whose box holds the point (outside it, none can).
            let locs: Vec<(u32, Location)> = polys
                .iter()
                .zip(&boxes)
                .enumerate()
                .filter(|(_, (_, b))| {
                    b.min().x <= x && x <= b.max().x && b.min().y <= y && y <= b.max().y
                })
                .map(|(j, (q, _))| (j as u32, oracle(q, x, y)))
                .collect();
            for rel in [Relation::Intersects, Relation::Contains, Relation::Touches] {
                let got = engine.query(&Query::point(x, y), rel);
                let want: Vec<u32> = locs
                    .iter()
                    .filter(|(_, loc)| match rel {
                        Relation::Contains => *loc == Location::Interior,
                        Relation::Touches => *loc == Location::Boundary,
                        _ => *loc != Location::Exterior,
                    })
                    .map(|(j, _)| *j)
                    .collect();
                assert_eq!(got, want, "polygon {i}, {rel:?} at ({x}, {y})");
                checked += 1;
            }
        }
    }
    assert!(checked > 30_000, "{checked}");
}
