//! What the fuzz targets check, one function a target: each takes arbitrary bytes and panics
//! when a property fails. `fuzz/` runs them under libFuzzer (cargo-fuzz, nightly);
//! `tests/fuzz_corpora.rs` replays the committed corpora through them on stable, so every
//! input that once found something stays a test.
//!
//! Beyond "no panic, no overflow, no runaway": the where language keeps `NOT` a complement
//! and parentheses neutral; GeoJSON round-trips; the fast request reader agrees with serde;
//! a connection's Digest header cache parses as a fresh parse does; multipart parts come
//! back as they were written; and the point-location index (bands, stripes, the grid and its
//! chains) locates every probe as a plain scan of every edge does.

use std::borrow::Cow;

use geo::{Coord, Geometry, LineString, MultiPolygon, Polygon};

use crate::features::path::{ContextNode, Path};
use crate::features::where_clause::{Datum, Row, Where, WhereLimits};
use crate::spatial::predicate::Shape;
use crate::spatial::{Engine, EngineConfig, Location, Query, Relation};

/// Rows the where target evaluates against: each type, and NULLs.
struct FuzzRow(usize);

const COLUMNS: [&str; 5] = ["OBJECTID", "name", "score", "born", "flag"];

impl Row for FuzzRow {
    fn get(&self, column: usize) -> Datum<'_> {
        match (column, self.0) {
            (_, 2) => Datum::Null,
            (0, k) => Datum::Int(k as i64 - 1),
            (1, k) => Datum::Str(Cow::Borrowed(["", "O'Hara", "é"][k % 3])),
            (2, k) => Datum::Float([2.5, -0.0, f64::MAX][k % 3]),
            (3, k) => Datum::Date([0, i64::MIN, 1_495_605_600_000][k % 3]),
            (_, k) => Datum::Bool(k == 0),
        }
    }
}

/// The where language: parsing any text within small bounds terminates without a panic,
/// `NOT (w)` never holds where `w` does, and `(w)` holds exactly where `w` does.
pub fn where_clause(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let limits = WhereLimits {
        max_bytes: 4096,
        max_depth: 32,
    };
    let resolve = |n: &str| COLUMNS.iter().position(|c| c.eq_ignore_ascii_case(n));
    let Ok(w) = Where::parse(&text, &resolve, limits) else {
        return;
    };
    let negated = Where::parse(&format!("NOT ({text})"), &resolve, limits);
    let wrapped = Where::parse(&format!("({text})"), &resolve, limits);
    for k in 0..4 {
        let row = FuzzRow(k);
        let m = w.matches(&row);
        if let Ok(n) = &negated {
            assert!(
                !(m && n.matches(&row)),
                "{text:?} and its negation on row {k}"
            );
        }
        if let Ok(p) = &wrapped {
            assert_eq!(p.matches(&row), m, "({text:?}) on row {k}");
        }
    }
}

/// GeoJSON geometries: whatever parses round-trips through the writer exactly, and a
/// polygonal one can be prepared and located in.
pub fn geojson(data: &[u8]) {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let Ok(g) = crate::spatial::parse_geojson(&v) else {
        return;
    };
    let back = crate::spatial::to_geojson(&g);
    let again = crate::spatial::parse_geojson(&back).unwrap_or_else(|e| panic!("{back}: {e}"));
    assert_eq!(g, again);
    if let Some(s) = Shape::new(g) {
        let b = s.bbox;
        for (x, y) in [(b[0], b[1]), ((b[0] + b[2]) / 2.0, (b[1] + b[3]) / 2.0)] {
            let _ = s.locate(x, y);
        }
    }
}

/// The geoQueryService body: the fast reader agrees with serde wherever it answers, and
/// parsing (twice, the second time through the per-thread prepared body) never panics.
pub fn query_request(data: &[u8]) {
    assert!(
        crate::features::query::readers_agree(data),
        "reader and serde disagree on {:?}",
        String::from_utf8_lossy(data)
    );
    let max = 1000;
    let first = crate::features::FeatureRequest::parse_for("fuzz", data, max).is_ok();
    let second = crate::features::FeatureRequest::parse_for("fuzz", data, max).is_ok();
    assert_eq!(first, second, "a body parses as it did the first time");
}

/// Template paths: the first line is a path, the rest a JSON document. Selection stays
/// within its budget and `first` is the first node selected.
pub fn template_path(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (path, doc) = text.split_once('\n').unwrap_or((&text, "{}"));
    let Ok(path) = Path::parse(path) else {
        return;
    };
    let Ok(doc) = serde_json::from_str::<serde_json::Value>(doc) else {
        return;
    };
    let Ok(selected) = path.select(&doc, ContextNode::root(&doc)) else {
        return;
    };
    let first = path.first(&doc).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(first, selected.first().map(|n| n.value()));
}

/// Multipart bodies: any bytes under any boundary parse or fail without a panic; parts
/// written with a boundary they do not contain come back as written.
pub fn multipart(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (boundary, rest) = text.split_once('\n').unwrap_or(("b", &text));
    let _ = crate::http::multipart::parse(rest.as_bytes(), boundary);
    let boundary: String = boundary
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(40)
        .collect();
    if boundary.is_empty() {
        return;
    }
    let delimiter = format!("--{boundary}");
    let parts: Vec<&str> = rest
        .split('\u{1}')
        .filter(|p| !p.contains(&delimiter) && !p.contains('\r') && !p.contains('\n'))
        .collect();
    let mut body = String::new();
    for p in &parts {
        body.push_str(&format!("{delimiter}\r\nX-Part: yes\r\n\r\n{p}\r\n"));
    }
    body.push_str(&format!("{delimiter}--\r\n"));
    match crate::http::multipart::parse(body.as_bytes(), &boundary) {
        Ok(got) => {
            let bodies: Vec<&[u8]> = got.iter().map(|p| p.body).collect();
            let want: Vec<&[u8]> = parts.iter().map(|p| p.as_bytes()).collect();
            assert_eq!(bodies, want, "{body:?}");
        }
        Err(e) => assert!(parts.is_empty(), "{e}: {body:?}"),
    }
}

/// Digest headers: the lines are a connection's successive `Authorization` values; the
/// connection's cache parses each as a fresh parse does.
pub fn digest_header(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let cache = crate::security::HeaderCache::default();
    for line in text.split('\n') {
        assert_eq!(
            cache.parse(line),
            crate::security::parse_digest(line),
            "{line:?}"
        );
    }
}

/// The location of `p` relative to a closed ring, by GEOS's `RayCrossingCounter` over every
/// edge: on an edge or vertex is the boundary; otherwise the parity of the crossings of a
/// rightward ray (half-open in y, exact orientation).
fn ring_location(ring: &[Coord<f64>], p: Coord<f64>) -> Location {
    let mut crossings = 0usize;
    for w in ring.windows(2) {
        let (p1, p2) = (w[0], w[1]);
        if p1.x < p.x && p2.x < p.x {
            continue;
        }
        if p == p2 || p == p1 {
            return Location::Boundary;
        }
        if p1.y == p.y && p2.y == p.y {
            if p1.x.min(p2.x) <= p.x && p.x <= p1.x.max(p2.x) {
                return Location::Boundary;
            }
            continue;
        }
        if (p1.y > p.y) != (p2.y > p.y) {
            let o = robust::orient2d(
                robust::Coord { x: p1.x, y: p1.y },
                robust::Coord { x: p2.x, y: p2.y },
                robust::Coord { x: p.x, y: p.y },
            );
            if o == 0.0 {
                return Location::Boundary;
            }
            if (o > 0.0) == (p2.y > p1.y) {
                crossings += 1;
            }
        }
    }
    if crossings % 2 == 1 {
        Location::Interior
    } else {
        Location::Exterior
    }
}

/// A polygon's location of `p` as GEOS's `SimplePointInAreaLocator` has it: the shell, then
/// each hole in order.
fn polygon_location(poly: &Polygon<f64>, p: Coord<f64>) -> Location {
    let shell = ring_location(&poly.exterior().0, p);
    if shell != Location::Interior {
        return shell;
    }
    for hole in poly.interiors() {
        match ring_location(&hole.0, p) {
            Location::Boundary => return Location::Boundary,
            Location::Interior => return Location::Exterior,
            Location::Exterior => {}
        }
    }
    Location::Interior
}

/// Rings from bytes: pairs of signed bytes on a grid of a quarter degree (so vertices repeat
/// and edges line up, as real boundaries do), a `0x80` byte between rings.
fn rings(data: &[u8]) -> Vec<Vec<Coord<f64>>> {
    data.split(|b| *b == 0x80)
        .map(|chunk| {
            let mut ring: Vec<Coord<f64>> = chunk
                .chunks_exact(2)
                .map(|xy| Coord {
                    x: f64::from(xy[0] as i8) / 4.0,
                    y: f64::from(xy[1] as i8) / 4.0,
                })
                .collect();
            if let (Some(first), Some(last)) = (ring.first().copied(), ring.last())
                && first != *last
            {
                ring.push(first);
            }
            ring
        })
        .filter(|r| r.len() >= 4)
        .take(8)
        .collect()
}

/// The point-location index against a scan of every edge: polygons (shells with holes, and
/// a multipolygon of all of them) built from the bytes, located at every vertex, every edge's
/// middle and a lattice over their box, both by the prepared shape and through the engine
/// (shards, R-trees and the point-probe grid), for `intersects`, `contains` and `touches`.
pub fn point_location(data: &[u8]) {
    let rings = rings(data);
    let Some((shell, holes)) = rings.split_first() else {
        return;
    };
    let mut polys = vec![Polygon::new(
        LineString(shell.clone()),
        holes.iter().map(|h| LineString(h.clone())).collect(),
    )];
    polys.extend(
        rings
            .iter()
            .skip(1)
            .map(|r| Polygon::new(LineString(r.clone()), vec![])),
    );
    let multi = MultiPolygon(polys.clone());
    let features: Vec<(u32, Geometry<f64>)> = polys
        .iter()
        .cloned()
        .map(Geometry::Polygon)
        .chain(std::iter::once(Geometry::MultiPolygon(multi.clone())))
        .enumerate()
        .map(|(i, g)| (i as u32, g))
        .collect();
    let locate = |i: usize, p: Coord<f64>| match &features[i].1 {
        Geometry::Polygon(poly) => polygon_location(poly, p),
        _ => polys
            .iter()
            .map(|poly| polygon_location(poly, p))
            .max()
            .unwrap_or(Location::Exterior),
    };
    let shapes: Vec<Shape> = features
        .iter()
        .filter_map(|(_, g)| Shape::new(g.clone()))
        .collect();
    let engine = match Engine::new(EngineConfig {
        shards: 2,
        resolution: 2,
    }) {
        Ok(e) => e,
        Err(e) => panic!("{e}"),
    };
    engine.bulk_load(features.clone());
    let mut probes: Vec<Coord<f64>> = Vec::new();
    for r in &rings {
        for w in r.windows(2) {
            probes.push(w[0]);
            probes.push(Coord {
                x: (w[0].x + w[1].x) / 2.0,
                y: (w[0].y + w[1].y) / 2.0,
            });
        }
    }
    for gx in -8..=8 {
        for gy in -8..=8 {
            probes.push(Coord {
                x: f64::from(gx) * 3.75,
                y: f64::from(gy) * 3.75,
            });
        }
    }
    for p in probes {
        let want: Vec<Location> = (0..features.len()).map(|i| locate(i, p)).collect();
        for (i, s) in shapes.iter().enumerate() {
            assert_eq!(s.locate(p.x, p.y), want[i], "feature {i} at {p:?}");
        }
        for rel in [Relation::Intersects, Relation::Contains, Relation::Touches] {
            let got = engine.query(&Query::point(p.x, p.y), rel);
            let expected: Vec<u32> = want
                .iter()
                .enumerate()
                .filter(|(_, l)| match rel {
                    Relation::Contains => **l == Location::Interior,
                    Relation::Touches => **l == Location::Boundary,
                    _ => **l != Location::Exterior,
                })
                .map(|(i, _)| i as u32)
                .collect();
            assert_eq!(got, expected, "{rel:?} at {p:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scan the point-location target trusts agrees with geo on valid polygons.
    #[test]
    fn the_scan_agrees_with_geo() {
        use geo::coordinate_position::{CoordPos, CoordinatePosition};
        let poly = Polygon::new(
            LineString::from(vec![(0., 0.), (4., 0.), (4., 4.), (0., 4.), (0., 0.)]),
            vec![LineString::from(vec![
                (1., 1.),
                (2., 1.),
                (2., 2.),
                (1., 2.),
                (1., 1.),
            ])],
        );
        for gx in -2..=18 {
            for gy in -2..=18 {
                let p = Coord {
                    x: f64::from(gx) / 4.0,
                    y: f64::from(gy) / 4.0,
                };
                let want = match poly.coordinate_position(&p) {
                    CoordPos::Inside => Location::Interior,
                    CoordPos::OnBoundary => Location::Boundary,
                    CoordPos::Outside => Location::Exterior,
                };
                assert_eq!(polygon_location(&poly, p), want, "{p:?}");
            }
        }
    }

    #[test]
    fn targets_take_any_bytes() {
        let samples: [&[u8]; 6] = [
            b"",
            b"\xff\xfe",
            b"name = 'x' AND (score > 1 OR NOT flag IS NULL)",
            b"{\"type\":\"Polygon\",\"coordinates\":[[[0,0],[1,0],[1,1],[0,0]]]}",
            b"//a\n{\"a\":[{\"a\":1}]}",
            b"\x00\x00\x10\x00\x10\x10\x00\x10\x80\x04\x04\x08\x04\x08\x08",
        ];
        for s in samples {
            where_clause(s);
            geojson(s);
            query_request(s);
            template_path(s);
            multipart(s);
            digest_header(s);
            point_location(s);
        }
    }
}
