//! Unit tests of `grid`.

use std::sync::Arc;

use geo::{Geometry, LineString, Polygon, Rect, coord};

use super::*;
use crate::entry::WHOLE;
use crate::predicate::Shape;

fn entry(id: u32, b: BBox) -> PartEntry {
    let rect = Rect::new(coord! {x: b[0], y: b[1]}, coord! {x: b[2], y: b[3]});
    PartEntry {
        bbox: b,
        shape: Arc::new(Shape::new(Geometry::Polygon(rect.to_polygon())).unwrap()),
        part: WHOLE,
        id,
    }
}

/// splitmix64: deterministic boxes and points.
fn rng(state: &mut u64) -> f64 {
    *state = state.wrapping_add(0x9e3779b97f4a7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
    ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
}

/// Probes agree with a scan of the live boxes, for small, wide and late parts (inside
/// the extent and beyond it), after removals, at box corners and edges and at random
/// points.
#[test]
fn probes_match_a_scan() {
    let mut s = 7u64;
    let mut boxes: Vec<(u32, BBox)> = Vec::new();
    for id in 0..400u32 {
        let (x, y) = (rng(&mut s) * 100.0, rng(&mut s) * 50.0);
        let (w, h) = if id % 50 == 0 {
            (90.0, 45.0) // spans hundreds of cells
        } else {
            (rng(&mut s) * 3.0, rng(&mut s) * 3.0)
        };
        boxes.push((id, [x, y, x + w, y + h]));
    }
    let mut entries: Vec<PartEntry> = boxes.iter().map(|(id, b)| entry(*id, *b)).collect();
    let mut grid = PartGrid::build(&entries).unwrap();
    assert!(grid.extra.is_empty());
    let wide_at_build = grid.wide.len();
    // Later: parts within the extent, one spanning more than WIDE_CELLS cells, parts
    // beyond the extent; then removals of old and new parts.
    for id in 400..430u32 {
        let b = match id {
            400..410 => [150.0 + id as f64, -20.0, 152.0 + id as f64, -18.0],
            410 => [-1000.0, -1000.0, 1000.0, 1000.0],
            _ => {
                let (x, y) = (rng(&mut s) * 100.0, rng(&mut s) * 50.0);
                [x, y, x + 2.0, y + 1.0]
            }
        };
        entries.push(entry(id, b));
        grid.insert(entries[id as usize].clone());
        boxes.push((id, b));
    }
    assert_eq!(grid.wide.len(), wide_at_build + 1);
    // The ten far away and the twenty within, in their cells.
    assert!(grid.extra.len() >= 30, "{}", grid.extra.len());
    for id in (0..430u32).step_by(7) {
        let i = boxes.iter().position(|(b, _)| *b == id).unwrap();
        boxes.swap_remove(i);
        // The same entry (its shape is compared by pointer), as the engine passes it.
        grid.remove(&entries[id as usize]);
    }
    assert!(grid.dead > 0);
    assert!(grid.usable());
    let mut probes: Vec<(f64, f64)> = (0..3000)
        .map(|_| (rng(&mut s) * 180.0 - 10.0, rng(&mut s) * 90.0 - 25.0))
        .collect();
    for (_, b) in &boxes {
        probes.extend([(b[0], b[1]), (b[2], b[3]), (b[0], (b[1] + b[3]) / 2.0)]);
    }
    let mut hits = 0;
    for (x, y) in probes {
        let mut got = Vec::new();
        grid.probe(x, y, |id, _, _| got.push(id));
        got.sort_unstable();
        let mut want: Vec<u32> = boxes
            .iter()
            .filter(|(_, b)| bbox_contains(b, x, y))
            .map(|(id, _)| *id)
            .collect();
        want.sort_unstable();
        assert_eq!(got, want, "at ({x}, {y})");
        hits += got.len();
    }
    assert!(hits > 3000, "too few hits to mean much: {hits}");
}

/// An entry for each band of a polygonal geometry, as the engine makes them.
fn band_entries(id: u32, geometry: Geometry<f64>) -> Vec<PartEntry> {
    let shape = Arc::new(Shape::new(geometry).unwrap());
    (0..shape.parts.len())
        .map(|i| PartEntry {
            bbox: shape.parts[i].bbox,
            shape: shape.clone(),
            part: i as u32,
            id,
        })
        .collect()
}

/// A star-shaped polygon with `n` spikes around `(cx, cy)`, with a star-shaped hole.
fn star(s: &mut u64, cx: f64, cy: f64, r: f64, n: usize) -> Polygon<f64> {
    let ring = |s: &mut u64, r: f64| {
        let pts: Vec<(f64, f64)> = (0..n)
            .map(|i| {
                let a = i as f64 / n as f64 * std::f64::consts::TAU;
                let d = r * (0.9 + 0.1 * rng(s));
                (cx + d * a.cos(), cy + d * a.sin())
            })
            .collect();
        LineString::from(pts)
    };
    let shell = ring(s, r);
    let hole = ring(s, r * 0.3);
    Polygon::new(shell, vec![hole])
}

/// With real parts (bands of polygons with holes), the grid's known locations and the
/// parts it leaves out agree with locating the point in every part whose box holds it.
#[test]
fn known_locations_match_locate() {
    let mut s = 11u64;
    let mut entries = Vec::new();
    for id in 0..150u32 {
        let (cx, cy) = (rng(&mut s) * 100.0, rng(&mut s) * 60.0);
        let r = 2.0 + rng(&mut s) * 6.0;
        let poly = star(&mut s, cx, cy, r, 600);
        entries.extend(band_entries(id, Geometry::Polygon(poly)));
    }
    assert!(entries.len() > 400, "{} parts", entries.len());
    // Later inserts classify too; removals take their cell entries away.
    let late = entries.split_off(entries.len() - 100);
    let mut grid = PartGrid::build(&entries).unwrap();
    for e in &late {
        grid.insert(e.clone());
    }
    for e in late.iter().step_by(3) {
        grid.remove(e);
    }
    entries.extend(
        late.iter()
            .enumerate()
            .filter(|(i, _)| i % 3 != 0)
            .map(|(_, e)| e.clone()),
    );
    let (mut known, mut left_out, mut inside) = (0, 0, 0);
    for _ in 0..20_000 {
        let (x, y) = (rng(&mut s) * 110.0 - 5.0, rng(&mut s) * 70.0 - 5.0);
        let mut got: Vec<(u32, u32, Option<Location>)> = Vec::new();
        grid.probe(x, y, |id, e, k| got.push((id, e.part, k)));
        for e in entries.iter().filter(|e| bbox_contains(&e.bbox, x, y)) {
            let want = e.shape.parts[e.part as usize].locate(x, y);
            inside += usize::from(want == Location::Interior);
            match got.iter().find(|g| (g.0, g.1) == (e.id, e.part)) {
                Some((_, _, Some(k))) => {
                    assert_eq!(*k, want, "part {}/{} at ({x}, {y})", e.id, e.part);
                    known += 1;
                }
                Some((_, _, None)) => {}
                None => {
                    assert_eq!(
                        want,
                        Location::Exterior,
                        "part {}/{} at ({x}, {y})",
                        e.id,
                        e.part
                    );
                    left_out += 1;
                }
            }
        }
        let listed = entries
            .iter()
            .filter(|e| bbox_contains(&e.bbox, x, y))
            .count();
        assert!(
            got.len() <= listed,
            "a part listed twice or outside its box"
        );
    }
    // The classification must do something on these shapes to mean much.
    assert!(known > inside / 4, "known {known} of {inside} interior");
    assert!(left_out > 100, "left out {left_out}");
}

/// A simple polygon without holes: a ring star-shaped around `(cx, cy)`, its vertices
/// on a grid of 1/1024 (so that edge midpoints and the points beside a vertex are exact),
/// with some edges horizontal or vertical (a vertex on its angle's ray at the last one's
/// `y` or `x`).
fn jagged(s: &mut u64, cx: f64, cy: f64, r: f64, n: usize) -> Polygon<f64> {
    let snap = |v: f64| (v * 1024.0).round() / 1024.0;
    let mut pts: Vec<(f64, f64)> = Vec::new();
    for i in 0..n {
        let a = i as f64 / n as f64 * std::f64::consts::TAU;
        let (cos, sin) = (a.cos(), a.sin());
        let mut d = r * (0.6 + 0.4 * rng(s));
        if let Some(&(lx, ly)) = pts.last() {
            // Along the ray, the distance that meets the last vertex's row or column.
            let level = match i % 6 {
                0 if sin.abs() > 0.2 => (ly - cy) / sin,
                3 if cos.abs() > 0.2 => (lx - cx) / cos,
                _ => f64::NAN,
            };
            if (0.6 * r..=r).contains(&level) {
                d = level;
            }
        }
        let p = (snap(cx + d * cos), snap(cy + d * sin));
        if let Some(&(_, ly)) = pts.last()
            && i % 6 == 0
            && (p.1 - ly).abs() < 2.0 / 1024.0
        {
            pts.push((p.0, ly));
        } else if let Some(&(lx, _)) = pts.last()
            && i % 6 == 3
            && (p.0 - lx).abs() < 2.0 / 1024.0
        {
            pts.push((lx, p.1));
        } else {
            pts.push(p);
        }
    }
    Polygon::new(LineString::from(pts), vec![])
}

/// With chains (hole-free polygons and multipolygons, cut into bands), every known
/// location is the point's in the part's polygon, as geo's `coordinate_position` finds it
/// by scanning all its edges; and combining what a probe reports as the engine does gives
/// each feature's location, at random points, at vertices and on edges.
#[test]
fn chains_locate_as_a_scan_does() {
    use geo::coordinate_position::{CoordPos, CoordinatePosition};
    use geo::{Coord, MultiPolygon};
    let mut s = 5u64;
    let mut entries = Vec::new();
    let mut features: Vec<Vec<Polygon<f64>>> = Vec::new();
    for id in 0..120u32 {
        let (cx, cy) = (rng(&mut s) * 100.0, rng(&mut s) * 60.0);
        let r = 1.0 + rng(&mut s) * 5.0;
        let n = [12, 80, 700][id as usize % 3];
        let polys = if id % 4 == 0 {
            vec![
                jagged(&mut s, cx, cy, r, n),
                jagged(&mut s, cx + 2.5 * r, cy, r, n),
            ]
        } else {
            vec![jagged(&mut s, cx, cy, r, n)]
        };
        let geometry = match polys.as_slice() {
            [one] => Geometry::Polygon(one.clone()),
            _ => Geometry::MultiPolygon(MultiPolygon(polys.clone())),
        };
        entries.extend(band_entries(id, geometry));
        features.push(polys);
    }
    let grid = PartGrid::build(&entries).unwrap();
    let chained = |e: &&CellEntry| e.chain.len != NO_CHAIN;
    let with_chain = grid.entries.iter().filter(chained).count();
    assert!(
        with_chain > grid.entries.len() / 3,
        "{with_chain} of {}",
        grid.entries.len()
    );
    assert!(
        grid.entries
            .iter()
            .filter(chained)
            .any(|e| e.chain.len & MIRRORED != 0)
    );
    let oracle =
        |poly: &Polygon<f64>, x: f64, y: f64| match poly.coordinate_position(&Coord { x, y }) {
            CoordPos::Inside => Location::Interior,
            CoordPos::OnBoundary => Location::Boundary,
            CoordPos::Outside => Location::Exterior,
        };
    let mut probes: Vec<(f64, f64)> = (0..20_000)
        .map(|_| (rng(&mut s) * 110.0 - 5.0, rng(&mut s) * 70.0 - 5.0))
        .collect();
    for polys in features.iter().step_by(3) {
        for w in polys[0].exterior().0.windows(2) {
            let (a, b) = (w[0], w[1]);
            // The vertex, the edge's middle, and beside the vertex on its row.
            probes.extend([(a.x, a.y), ((a.x + b.x) / 2.0, (a.y + b.y) / 2.0)]);
            probes.extend([(a.x - 1.0 / 128.0, a.y), (a.x + 1.0 / 128.0, a.y)]);
        }
    }
    let (mut known, mut inside, mut boundary) = (0, 0, 0);
    for (x, y) in probes {
        let mut got: Vec<(u32, u32, Option<Location>)> = Vec::new();
        grid.probe(x, y, |id, e, k| got.push((id, e.part, k)));
        let mut seen: Vec<(u32, u32)> = got.iter().map(|g| (g.0, g.1)).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), got.len(), "a part reported twice at ({x}, {y})");
        let mut combined: Vec<(u32, Location)> = Vec::new();
        for &(id, part, k) in &got {
            let e = entries
                .iter()
                .find(|e| e.id == id && e.part == part)
                .unwrap();
            let element = e.shape.parts[part as usize].element as usize;
            let want = oracle(&features[id as usize][element], x, y);
            let loc = match k {
                Some(k) => {
                    assert_eq!(k, want, "part {id}/{part} at ({x}, {y})");
                    known += 1;
                    k
                }
                None => {
                    assert!(
                        bbox_contains(&e.bbox, x, y),
                        "part {id}/{part} at ({x}, {y})"
                    );
                    e.shape.parts[part as usize].locate(x, y)
                }
            };
            combined.push((id, loc));
        }
        for (id, polys) in features.iter().enumerate() {
            let shape = &entries.iter().find(|e| e.id == id as u32).unwrap().shape;
            if !bbox_contains(&shape.bbox, x, y) {
                assert!(
                    combined.iter().all(|c| c.0 != id as u32),
                    "{id} at ({x}, {y})"
                );
                continue;
            }
            let want = polys.iter().map(|p| oracle(p, x, y)).max().unwrap();
            let got = combined
                .iter()
                .filter(|c| c.0 == id as u32)
                .map(|c| c.1)
                .max()
                .unwrap_or(Location::Exterior);
            assert_eq!(got, want, "feature {id} at ({x}, {y})");
            inside += usize::from(want == Location::Interior);
            boundary += usize::from(want == Location::Boundary);
        }
    }
    assert!(known > 5000, "known {known}");
    assert!(
        inside > 5000 && boundary > 500,
        "inside {inside}, boundary {boundary}"
    );
}

/// A zig-zag star beside small polygons: its long edges put its parts past the chain
/// and classification budgets, so they are left to locate in their stripes; probes still
/// agree with locating in every part whose box holds the point.
#[test]
fn parts_past_their_budgets_still_locate() {
    let mut s = 17u64;
    let n = 6000;
    let zigzag: Vec<(f64, f64)> = (0..n)
        .map(|i| {
            let a = i as f64 / n as f64 * std::f64::consts::TAU;
            let r = if i % 2 == 0 { 5.0 } else { 7.0 };
            (50.0 + r * a.cos(), 30.0 + r * a.sin())
        })
        .collect();
    let mut entries = band_entries(
        0,
        Geometry::Polygon(Polygon::new(LineString::from(zigzag), vec![])),
    );
    let zig_parts = entries.len();
    for id in 1..200u32 {
        let (cx, cy) = (rng(&mut s) * 100.0, rng(&mut s) * 60.0);
        let r = 0.5 + rng(&mut s);
        let poly = jagged(&mut s, cx, cy, r, 40);
        entries.extend(band_entries(id, Geometry::Polygon(poly)));
    }
    let grid = PartGrid::build(&entries).unwrap();
    let is_zig =
        |e: &CellEntry| e.slot != DEAD && grid.parts[(e.slot & !INTERIOR) as usize].id == 0;
    let zig: Vec<&CellEntry> = grid.entries.iter().filter(|e| is_zig(e)).collect();
    assert!(!zig.is_empty(), "the star is listed ({zig_parts} parts)");
    assert!(
        zig.iter().all(|e| e.chain.len == NO_CHAIN),
        "no chains past the budget"
    );
    assert!(
        grid.entries
            .iter()
            .any(|e| !is_zig(e) && e.chain.len != NO_CHAIN),
        "the small polygons keep theirs"
    );
    let mut located = 0;
    for _ in 0..20_000 {
        let (x, y) = (rng(&mut s) * 110.0 - 5.0, rng(&mut s) * 70.0 - 5.0);
        let mut got: Vec<(u32, u32, Option<Location>)> = Vec::new();
        grid.probe(x, y, |id, e, k| got.push((id, e.part, k)));
        for e in entries.iter().filter(|e| bbox_contains(&e.bbox, x, y)) {
            let want = e.shape.parts[e.part as usize].locate(x, y);
            match got.iter().find(|g| (g.0, g.1) == (e.id, e.part)) {
                Some((_, _, Some(k))) => {
                    assert_eq!(*k, want, "{}/{} at ({x}, {y})", e.id, e.part)
                }
                Some((_, _, None)) => located += usize::from(e.id == 0),
                None => assert_eq!(
                    want,
                    Location::Exterior,
                    "{}/{} at ({x}, {y})",
                    e.id,
                    e.part
                ),
            }
        }
    }
    assert!(located > 200, "the star's parts located {located} times");
}

/// Side entries and dead marks make the grid stale past half its entries (plus a floor),
/// and so do too many wide parts.
#[test]
fn churn_makes_the_grid_stale() {
    let parts: Vec<PartEntry> = (0..6000u32)
        .map(|i| {
            let (x, y) = ((i % 50) as f64, (i / 50) as f64);
            entry(i, [x, y, x + 0.5, y + 0.5])
        })
        .collect();
    let mut grid = PartGrid::build(&parts).unwrap();
    let limit = grid.entries.len() / 2 + 4096;
    // Each round removes a built part (dead marks) and adds a new one (side entries).
    for (i, p) in parts.iter().enumerate() {
        let before = grid.extra_entries + grid.dead;
        assert_eq!(grid.stale(), before > limit, "after {i} rounds");
        if before > limit {
            assert!(i > 500, "stale after {i} rounds");
            break;
        }
        grid.remove(p);
        grid.insert(entry(10_000 + i as u32, p.bbox));
        assert!(grid.extra_entries + grid.dead > before);
    }
    assert!(grid.stale());
    let mut wide = PartGrid::build(&parts).unwrap();
    for i in 0..=MAX_SCANNED as u32 {
        assert!(!wide.stale());
        wide.insert(entry(5000 + i, [-500.0, -500.0, 501.0, 501.0]));
    }
    assert!(wide.stale());
}

/// Too many parts to scan beside the cells: no grid, so probes use the R-tree.
#[test]
fn no_grid_when_side_lists_would_be_long() {
    let mut parts: Vec<PartEntry> = (0..200u32)
        .map(|i| entry(i, [i as f64, 0.0, i as f64 + 0.5, 0.5]))
        .collect();
    assert!(PartGrid::build(&parts).is_some());
    // Each of these spans thousands of cells at every side tried: wide.
    parts.extend((200..200 + MAX_SCANNED as u32 + 1).map(|i| entry(i, [0.0, 0.0, 10_000.0, 0.5])));
    assert!(PartGrid::build(&parts).is_none());
}
