//! Property tests: the engine (cells, shards, R-trees, striped point location) against a
//! brute-force scan with no index, for every relation, shard count and resolution.
//!
//! The oracle uses only geo's DE-9IM `relate` (and plain box tests for the envelope
//! relation): it shares no code with the engine's point location, partitioning or indexes.
//! Coordinates sit on a half-unit grid, so query points fall exactly on feature edges and
//! vertices and polygons share edges, near the antimeridian and the pole too.

use geo::{
    BoundingRect, Coord, Geometry, LineString, MultiPoint, MultiPolygon, Point, Polygon, Relate,
};
use proptest::prelude::*;

use geoshard::spatial::{Engine, EngineConfig, Query, Relation};

/// Where a case is placed on the globe; all of its coordinates are within 10 units of it.
const ANCHORS: [(f64, f64); 5] = [
    (0.0, 0.0),
    (170.0, -30.0),
    (-170.0, 10.0),
    (20.0, 80.0),
    (-100.0, 40.0),
];

fn grid() -> impl Strategy<Value = f64> {
    (-16i32..=16).prop_map(|v| v as f64 * 0.5)
}

fn pt() -> impl Strategy<Value = (f64, f64)> {
    (grid(), grid())
}

fn rect_ring(x0: f64, y0: f64, x1: f64, y1: f64) -> LineString<f64> {
    LineString(vec![
        Coord { x: x0, y: y0 },
        Coord { x: x1, y: y0 },
        Coord { x: x1, y: y1 },
        Coord { x: x0, y: y1 },
        Coord { x: x0, y: y0 },
    ])
}

fn rect() -> impl Strategy<Value = (f64, f64, f64, f64)> {
    (pt(), 1i32..=8, 1i32..=8)
        .prop_map(|((x, y), w, h)| (x, y, x + w as f64 * 0.5, y + h as f64 * 0.5))
}

/// Features in local coordinates (moved to the anchor later).
fn feature() -> impl Strategy<Value = Geometry<f64>> {
    prop_oneof![
        3 => pt().prop_map(|(x, y)| Geometry::Point(Point::new(x, y))),
        1 => prop::collection::vec(pt(), 1..4)
            .prop_map(|v| Geometry::MultiPoint(MultiPoint(v.into_iter().map(|(x, y)| Point::new(x, y)).collect()))),
        2 => rect().prop_map(|(x0, y0, x1, y1)| Geometry::Polygon(Polygon::new(rect_ring(x0, y0, x1, y1), vec![]))),
        // A rectangle with a hole strictly inside it.
        2 => (pt(), 4i32..=10, 4i32..=10).prop_map(|((x, y), w, h)| {
            let (x1, y1) = (x + w as f64 * 0.5, y + h as f64 * 0.5);
            Geometry::Polygon(Polygon::new(
                rect_ring(x, y, x1, y1),
                vec![rect_ring(x + 0.5, y + 0.5, x1 - 0.5, y1 - 0.5)],
            ))
        }),
        // A triangle (non-degenerate).
        2 => (pt(), pt(), pt())
            .prop_filter("non-collinear", |(a, b, c)| ((b.0 - a.0) * (c.1 - a.1) - (b.1 - a.1) * (c.0 - a.0)) != 0.0)
            .prop_map(|(a, b, c)| Geometry::Polygon(Polygon::new(
                LineString(vec![a.into(), b.into(), c.into(), a.into()]), vec![]))),
        // Two separate elements, the first with a hole.
        2 => (pt(), 4i32..=6, 4i32..=6, 1i32..=4).prop_map(|((x, y), w, h, gap)| {
            let (x1, y1) = (x + w as f64 * 0.5, y + h as f64 * 0.5);
            let x2 = x1 + gap as f64 * 0.5;
            Geometry::MultiPolygon(MultiPolygon(vec![
                Polygon::new(rect_ring(x, y, x1, y1), vec![rect_ring(x + 0.5, y + 0.5, x1 - 0.5, y1 - 0.5)]),
                Polygon::new(rect_ring(x2, y, x2 + 1.0, y + 1.5), vec![]),
            ]))
        }),
        2 => prop::collection::vec(pt(), 2..5)
            .prop_filter("distinct ends", |v| v.windows(2).all(|w| w[0] != w[1]))
            .prop_map(|v| Geometry::LineString(LineString(v.into_iter().map(Coord::from).collect()))),
    ]
}

fn query() -> impl Strategy<Value = Geometry<f64>> {
    prop_oneof![
        4 => pt().prop_map(|(x, y)| Geometry::Point(Point::new(x, y))),
        3 => rect().prop_map(|(x0, y0, x1, y1)| Geometry::Polygon(Polygon::new(rect_ring(x0, y0, x1, y1), vec![]))),
        1 => (pt(), pt(), pt())
            .prop_filter("non-collinear", |(a, b, c)| ((b.0 - a.0) * (c.1 - a.1) - (b.1 - a.1) * (c.0 - a.0)) != 0.0)
            .prop_map(|(a, b, c)| Geometry::Polygon(Polygon::new(
                LineString(vec![a.into(), b.into(), c.into(), a.into()]), vec![]))),
        1 => (pt(), pt()).prop_filter("distinct", |(a, b)| a != b)
            .prop_map(|(a, b)| Geometry::LineString(LineString(vec![a.into(), b.into()]))),
        1 => prop::collection::vec(pt(), 1..3)
            .prop_map(|v| Geometry::MultiPoint(MultiPoint(v.into_iter().map(|(x, y)| Point::new(x, y)).collect()))),
    ]
}

fn moved(g: &Geometry<f64>, (ax, ay): (f64, f64)) -> Geometry<f64> {
    use geo::MapCoords;
    g.map_coords(|c| Coord {
        x: (c.x + ax).clamp(-180.0, 180.0),
        y: (c.y + ay).clamp(-90.0, 90.0),
    })
}

fn bbox(g: &Geometry<f64>) -> [f64; 4] {
    let r = g.bounding_rect().unwrap();
    [r.min().x, r.min().y, r.max().x, r.max().y]
}

/// The independent oracle.
fn oracle(feature: &Geometry<f64>, q: &Geometry<f64>, rel: Relation) -> bool {
    let (fb, qb) = (bbox(feature), bbox(q));
    let boxes_meet = fb[0] <= qb[2] && qb[0] <= fb[2] && fb[1] <= qb[3] && qb[1] <= fb[3];
    let points: Vec<Point<f64>> = match feature {
        Geometry::Point(p) => vec![*p],
        Geometry::MultiPoint(mp) => mp.0.clone(),
        _ => {
            if rel == Relation::EnvelopeIntersects {
                return boxes_meet;
            }
            let m = feature.relate(q);
            return match rel {
                Relation::Intersects => m.is_intersects(),
                Relation::Contains => m.is_contains(),
                Relation::Within => m.is_within(),
                Relation::Crosses => m.is_crosses(),
                Relation::Overlaps => m.is_overlaps(),
                Relation::Touches => m.is_touches(),
                Relation::EnvelopeIntersects => unreachable!(),
            };
        }
    };
    points.iter().any(|p| {
        if rel == Relation::EnvelopeIntersects {
            qb[0] <= p.x() && p.x() <= qb[2] && qb[1] <= p.y() && p.y() <= qb[3]
        } else {
            Geometry::Point(*p).relate(q).is_intersects()
        }
    })
}

#[derive(Debug, Clone)]
struct Case {
    anchor: usize,
    shards: usize,
    resolution: u8,
    features: Vec<Geometry<f64>>,
    /// Bulk-load the first `bulk` features; insert the rest one by one.
    bulk: usize,
    /// Features removed after loading (indexes into `features`).
    removed: Vec<usize>,
    /// Features replaced by another geometry after loading.
    replaced: Vec<(usize, Geometry<f64>)>,
    /// Features bulk-loaded after the single inserts (which moves every point of a rebuilt
    /// shard), before the replacements and removals.
    later: Vec<Geometry<f64>>,
    queries: Vec<Geometry<f64>>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        0..ANCHORS.len(),
        prop::sample::select(vec![1usize, 2, 3, 7]),
        prop::sample::select(vec![0u8, 2, 3, 5]),
        prop::collection::vec(feature(), 1..14),
        prop::collection::vec(query(), 1..5),
        prop::collection::vec(any::<prop::sample::Index>(), 0..3),
        prop::collection::vec((any::<prop::sample::Index>(), feature()), 0..3),
        any::<prop::sample::Index>(),
        prop::collection::vec(feature(), 0..4),
    )
        .prop_map(
            |(anchor, shards, resolution, features, queries, removed, replaced, bulk, later)| {
                let n = features.len();
                Case {
                    anchor,
                    shards,
                    resolution,
                    bulk: bulk.index(n + 1),
                    removed: removed.into_iter().map(|i| i.index(n)).collect(),
                    replaced: replaced.into_iter().map(|(i, g)| (i.index(n), g)).collect(),
                    later,
                    features,
                    queries,
                }
            },
        )
}

fn run(case: &Case) -> Result<(), TestCaseError> {
    let anchor = ANCHORS[case.anchor];
    let engine = Engine::new(EngineConfig {
        shards: case.shards,
        resolution: case.resolution,
    })
    .unwrap();
    let mut live: Vec<Option<Geometry<f64>>> = case
        .features
        .iter()
        .map(|g| Some(moved(g, anchor)))
        .collect();
    let items: Vec<(u32, Geometry<f64>)> = live
        .iter()
        .enumerate()
        .take(case.bulk)
        .map(|(i, g)| (i as u32, g.clone().unwrap()))
        .collect();
    engine.bulk_load(items);
    for (i, g) in live.iter().enumerate().skip(case.bulk) {
        engine.insert(i as u32, g.clone().unwrap());
    }
    let later: Vec<(u32, Geometry<f64>)> = case
        .later
        .iter()
        .enumerate()
        .map(|(j, g)| ((live.len() + j) as u32, moved(g, anchor)))
        .collect();
    live.extend(later.iter().map(|(_, g)| Some(g.clone())));
    engine.bulk_load(later);
    for &(i, ref g) in &case.replaced {
        let g = moved(g, anchor);
        engine.insert(i as u32, g.clone());
        live[i] = Some(g);
    }
    for &i in &case.removed {
        engine.remove(i as u32);
        live[i] = None;
    }
    for q in &case.queries {
        let q = moved(q, anchor);
        let prepared = Query::new(q.clone());
        for rel in Relation::ALL {
            let got = engine.query(&prepared, rel);
            let want: Vec<u32> = live
                .iter()
                .enumerate()
                .filter_map(|(i, f)| f.as_ref().map(|f| (i, f)))
                .filter(|(_, f)| oracle(f, &q, rel))
                .map(|(i, _)| i as u32)
                .collect();
            prop_assert_eq!(&got, &want, "{:?} query {:?}", rel, q);
        }
    }
    // Removing every feature leaves no entry behind in any shard.
    for (i, f) in live.iter().enumerate() {
        prop_assert_eq!(engine.remove(i as u32), f.is_some(), "feature {}", i);
    }
    prop_assert_eq!(engine.len(), 0);
    for (s, sizes) in engine.shard_sizes().into_iter().enumerate() {
        prop_assert_eq!(sizes, (0, 0, 0), "shard {}", s);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn engine_matches_brute_force(c in case()) {
        run(&c)?;
    }
}

/// Points exactly on every edge midpoint and vertex of a polygon with a hole, through the
/// whole engine, for every shard count.
#[test]
fn boundary_points_through_the_engine() {
    let shell = rect_ring(0.0, 0.0, 4.0, 4.0);
    let hole = rect_ring(1.0, 1.0, 3.0, 3.0);
    let poly = Geometry::Polygon(Polygon::new(shell.clone(), vec![hole.clone()]));
    for shards in [1, 2, 5] {
        let e = Engine::new(EngineConfig {
            shards,
            resolution: 4,
        })
        .unwrap();
        e.insert(7, poly.clone());
        e.insert(8, Geometry::Point(Point::new(2.0, 0.0)));
        for ring in [&shell, &hole] {
            for w in ring.0.windows(2) {
                let mid = ((w[0].x + w[1].x) / 2.0, (w[0].y + w[1].y) / 2.0);
                for (x, y) in [(w[0].x, w[0].y), mid] {
                    let q = Query::point(x, y);
                    let on_point = (x, y) == (2.0, 0.0);
                    let contains = e.query(&q, Relation::Contains);
                    assert_eq!(
                        contains,
                        if on_point { vec![8] } else { vec![] },
                        "({x}, {y})"
                    );
                    let touches = e.query(&q, Relation::Touches);
                    assert_eq!(
                        touches,
                        if on_point { vec![7, 8] } else { vec![7] },
                        "({x}, {y})"
                    );
                }
            }
        }
        // In the hole: nothing; in the ring: the polygon.
        assert!(
            e.query(&Query::point(2.0, 2.0), Relation::Intersects)
                .is_empty()
        );
        assert_eq!(
            e.query(&Query::point(0.5, 2.0), Relation::Contains),
            vec![7]
        );
    }
}

#[derive(Debug, Clone)]
enum PointOp {
    /// Put feature `id` at a grid point (insert or move).
    Put(u32, (f64, f64)),
    Remove(u32),
    /// Bulk-load a batch of features at once.
    Bulk(Vec<(u32, (f64, f64))>),
}

fn point_op() -> impl Strategy<Value = PointOp> {
    let id = 0u32..200;
    let at = ((-8i32..8), (-8i32..8)).prop_map(|(x, y)| (x as f64 * 0.25, y as f64 * 0.25));
    prop_oneof![
        6 => (id.clone(), at.clone()).prop_map(|(i, p)| PointOp::Put(i, p)),
        2 => id.clone().prop_map(PointOp::Remove),
        1 => prop::collection::vec((id, at), 1..60).prop_map(PointOp::Bulk),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Many points in a small area, so buckets fill, split and empty: the engine stays in
    /// step with a plain map of id -> position (the model), as redb's fuzzer does with a
    /// BTreeMap.
    #[test]
    fn point_buckets_follow_a_model(
        ops in prop::collection::vec(point_op(), 1..400),
        shards in prop::sample::select(vec![1usize, 2, 5]),
    ) {
        let engine = Engine::new(EngineConfig { shards, resolution: 6 }).unwrap();
        let mut model: std::collections::BTreeMap<u32, (f64, f64)> = Default::default();
        for op in &ops {
            match op {
                PointOp::Put(id, p) => {
                    engine.insert(*id, Geometry::Point(Point::new(p.0, p.1)));
                    model.insert(*id, *p);
                }
                PointOp::Remove(id) => {
                    prop_assert_eq!(engine.remove(*id), model.remove(id).is_some());
                }
                PointOp::Bulk(items) => {
                    let mut last: std::collections::BTreeMap<u32, (f64, f64)> = Default::default();
                    for (id, p) in items {
                        last.insert(*id, *p);
                    }
                    engine.bulk_load(last.iter().map(|(id, p)| (*id, Geometry::Point(Point::new(p.0, p.1)))).collect());
                    model.extend(last);
                }
            }
        }
        prop_assert_eq!(engine.len(), model.len());
        for x in -8..8 {
            for y in -8..8 {
                let p = (x as f64 * 0.25, y as f64 * 0.25);
                let got = engine.query(&Query::point(p.0, p.1), Relation::Contains);
                let want: Vec<u32> = model.iter().filter(|(_, q)| **q == p).map(|(id, _)| *id).collect();
                prop_assert_eq!(got, want, "at {:?}", p);
            }
        }
        let all = Query::new(Geometry::Polygon(Polygon::new(rect_ring(-2.0, -2.0, 2.0, 2.0), vec![])));
        let got = engine.query(&all, Relation::Intersects);
        let want: Vec<u32> = model.keys().copied().collect();
        prop_assert_eq!(got, want);
    }
}
