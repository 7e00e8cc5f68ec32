//! Web Mercator tile geometry: a tile's bounds, projection to Web Mercator and back,
//! simplification for a zoom, clipping to a box, and the rings and lines that collapse in
//! whole tile units.

use geo::{Coord, Geometry, LineString, MultiLineString, MultiPolygon, Polygon, Simplify};

/// Tile units across a tile, and the buffer around it in those units.
pub const EXTENT: u32 = 4096;

pub const BUFFER: f64 = 64.0;

/// Half the Web Mercator world's width, in metres.
pub const HALF: f64 = 20_037_508.342_789_244;

pub const MAX_ZOOM: u32 = 24;

/// The tile's bounds in Web Mercator metres: (left, bottom, right, top).
pub fn mercator_bounds(z: u32, x: u32, y: u32) -> (f64, f64, f64, f64) {
    let size = 2.0 * HALF / f64::from(1u32 << z.min(31));
    let left = -HALF + f64::from(x) * size;
    let top = HALF - f64::from(y) * size;
    (left, top - size, left + size, top)
}

/// Web Mercator metres to degrees; the world's edge rounds to just past 180°, so longitude is
/// clamped to the range a query geometry may have.
pub fn to_lon_lat(x: f64, y: f64) -> (f64, f64) {
    const R: f64 = 6_378_137.0;
    let lon = (x / R).to_degrees().clamp(-180.0, 180.0);
    let lat = (2.0 * (y / R).exp().atan() - std::f64::consts::FRAC_PI_2).to_degrees();
    (lon, lat)
}

pub fn to_mercator(c: Coord<f64>) -> Coord<f64> {
    const R: f64 = 6_378_137.0;
    let lat = c.y.clamp(-85.051_128_78, 85.051_128_78).to_radians();
    Coord {
        x: c.x.to_radians() * R,
        y: (std::f64::consts::FRAC_PI_4 + lat / 2.0).tan().ln() * R,
    }
}

/// Zoom bands of four zooms each (0-3, 4-7, 8-11); past them, a tile draws each geometry as
/// it is (clipped to the tile, it is small).
pub const BANDS: u32 = 3;

pub fn band_of(z: u32) -> Option<u8> {
    (z < 4 * BANDS).then_some((z / 4) as u8)
}

/// The simplification of a band: half a tile unit of its finest zoom, so that every zoom of
/// the band draws at least the detail it would have drawn from the full geometry.
pub fn band_epsilon(band: u8) -> f64 {
    let z = 4 * u32::from(band) + 3;
    2.0 * HALF / f64::from(1u32 << z) / f64::from(EXTENT) / 2.0
}

/// The geometry without the rings and lines that collapse in whole tile units (fewer than
/// three distinct positions, or no area, for a ring; fewer than two for a line), which
/// decoders refuse; `None` when nothing is left.
pub fn without_collapsed(
    g: Geometry<f64>,
    left: f64,
    top: f64,
    unit: f64,
) -> Option<Geometry<f64>> {
    let cells = |l: &LineString<f64>| -> Vec<(i64, i64)> {
        let mut v: Vec<(i64, i64)> =
            l.0.iter()
                .map(|c| {
                    (
                        ((c.x - left) / unit).round() as i64,
                        ((top - c.y) / unit).round() as i64,
                    )
                })
                .collect();
        v.dedup();
        v
    };
    let ring_ok = |r: &LineString<f64>| {
        let v = cells(r);
        let area: i64 = v
            .windows(2)
            .map(|w| w[0].0 * w[1].1 - w[1].0 * w[0].1)
            .sum();
        v.len() >= 4 && area != 0
    };
    let polygon = |p: Polygon<f64>| -> Option<Polygon<f64>> {
        if !ring_ok(p.exterior()) {
            return None;
        }
        let (shell, holes) = p.into_inner();
        Some(Polygon::new(
            shell,
            holes.into_iter().filter(|h| ring_ok(h)).collect(),
        ))
    };
    match g {
        Geometry::Polygon(p) => polygon(p).map(Geometry::Polygon),
        Geometry::MultiPolygon(m) => {
            let kept: Vec<_> = m.0.into_iter().filter_map(polygon).collect();
            (!kept.is_empty()).then_some(Geometry::MultiPolygon(MultiPolygon(kept)))
        }
        Geometry::LineString(l) => (cells(&l).len() >= 2).then_some(Geometry::LineString(l)),
        Geometry::MultiLineString(m) => {
            let kept: Vec<_> = m.0.into_iter().filter(|l| cells(l).len() >= 2).collect();
            (!kept.is_empty()).then_some(Geometry::MultiLineString(MultiLineString(kept)))
        }
        other => Some(other),
    }
}

pub fn simplify(g: Geometry<f64>, epsilon: f64) -> Geometry<f64> {
    match g {
        Geometry::LineString(l) => Geometry::LineString(l.simplify(epsilon)),
        Geometry::MultiLineString(m) => Geometry::MultiLineString(m.simplify(epsilon)),
        Geometry::Polygon(p) => Geometry::Polygon(p.simplify(epsilon)),
        Geometry::MultiPolygon(m) => Geometry::MultiPolygon(m.simplify(epsilon)),
        other => other,
    }
}

/// The part of a geometry inside `(xmin, ymin, xmax, ymax)`: points kept when inside, lines
/// cut at the box, rings clipped to it (Sutherland-Hodgman); `None` when nothing is left.
pub fn clip_geometry(g: Geometry<f64>, b: (f64, f64, f64, f64)) -> Option<Geometry<f64>> {
    let inside = |c: &Coord<f64>| c.x >= b.0 && c.x <= b.2 && c.y >= b.1 && c.y <= b.3;
    match g {
        Geometry::Point(p) => inside(&p.0).then_some(Geometry::Point(p)),
        Geometry::MultiPoint(m) => {
            let kept: Vec<_> = m.0.into_iter().filter(|p| inside(&p.0)).collect();
            (!kept.is_empty()).then(|| Geometry::MultiPoint(kept.into()))
        }
        Geometry::LineString(l) => lines(vec![l], b),
        Geometry::MultiLineString(m) => lines(m.0, b),
        Geometry::Polygon(p) => polygons(vec![p], b),
        Geometry::MultiPolygon(m) => polygons(m.0, b),
        _ => None,
    }
}

fn lines(ls: Vec<LineString<f64>>, b: (f64, f64, f64, f64)) -> Option<Geometry<f64>> {
    let mut out: Vec<LineString<f64>> = Vec::new();
    for l in ls {
        let mut current: Vec<Coord<f64>> = Vec::new();
        for w in l.0.windows(2) {
            match crate::predicate::clip_segment(w[0], w[1], &[b.0, b.1, b.2, b.3]) {
                Some((a, c)) => {
                    if current.last() != Some(&a) {
                        if current.len() >= 2 {
                            out.push(LineString::new(std::mem::take(&mut current)));
                        }
                        current.clear();
                        current.push(a);
                    }
                    current.push(c);
                }
                None => {
                    if current.len() >= 2 {
                        out.push(LineString::new(std::mem::take(&mut current)));
                    }
                    current.clear();
                }
            }
        }
        if current.len() >= 2 {
            out.push(LineString::new(current));
        }
    }
    match out.len() {
        0 => None,
        1 => out.pop().map(Geometry::LineString),
        _ => Some(Geometry::MultiLineString(MultiLineString(out))),
    }
}

fn polygons(ps: Vec<Polygon<f64>>, b: (f64, f64, f64, f64)) -> Option<Geometry<f64>> {
    let mut out = Vec::new();
    for p in ps {
        let (exterior, interiors) = p.into_inner();
        let Some(shell) = clip_ring(exterior, b) else {
            continue;
        };
        let holes: Vec<_> = interiors
            .into_iter()
            .filter_map(|r| clip_ring(r, b))
            .collect();
        out.push(Polygon::new(shell, holes));
    }
    match out.len() {
        0 => None,
        1 => out.pop().map(Geometry::Polygon),
        _ => Some(Geometry::MultiPolygon(MultiPolygon(out))),
    }
}

/// Sutherland-Hodgman clipping of a ring against the box, edge by edge.
fn clip_ring(ring: LineString<f64>, b: (f64, f64, f64, f64)) -> Option<LineString<f64>> {
    let mut pts: Vec<Coord<f64>> = ring.0;
    if pts.first() == pts.last() {
        pts.pop();
    }
    type Edge = (
        fn(&Coord<f64>, f64) -> bool,
        fn(Coord<f64>, Coord<f64>, f64) -> Coord<f64>,
        f64,
    );
    let at_x = |p: Coord<f64>, q: Coord<f64>, x: f64| Coord {
        x,
        y: p.y + (q.y - p.y) * (x - p.x) / (q.x - p.x),
    };
    let at_y = |p: Coord<f64>, q: Coord<f64>, y: f64| Coord {
        x: p.x + (q.x - p.x) * (y - p.y) / (q.y - p.y),
        y,
    };
    let edges: [Edge; 4] = [
        (|c, v| c.x >= v, at_x, b.0),
        (|c, v| c.x <= v, at_x, b.2),
        (|c, v| c.y >= v, at_y, b.1),
        (|c, v| c.y <= v, at_y, b.3),
    ];
    for (keep, cross, v) in edges {
        if pts.is_empty() {
            return None;
        }
        let mut next = Vec::with_capacity(pts.len() + 4);
        for i in 0..pts.len() {
            let cur = pts[i];
            let prev = pts[(i + pts.len() - 1) % pts.len()];
            match (keep(&cur, v), keep(&prev, v)) {
                (true, true) => next.push(cur),
                (true, false) => {
                    next.push(cross(prev, cur, v));
                    next.push(cur);
                }
                (false, true) => next.push(cross(prev, cur, v)),
                (false, false) => {}
            }
        }
        pts = next;
    }
    if pts.len() < 3 {
        return None;
    }
    pts.push(pts[0]);
    Some(LineString::new(pts))
}

#[cfg(test)]
mod tests {
    use super::*;
    use geo::{Area, BooleanOps, Rect};

    #[test]
    fn the_world_tile_and_its_quarters() {
        assert_eq!(mercator_bounds(0, 0, 0), (-HALF, -HALF, HALF, HALF));
        assert_eq!(mercator_bounds(1, 1, 0), (0.0, 0.0, HALF, HALF));
        assert_eq!(mercator_bounds(1, 0, 1), (-HALF, -HALF, 0.0, 0.0));
    }

    #[test]
    fn projection_round_trips() {
        for (lon, lat) in [(0.0, 0.0), (-104.99, 39.74), (151.2, -33.87), (179.9, 85.0)] {
            let m = to_mercator(Coord { x: lon, y: lat });
            let (x, y) = to_lon_lat(m.x, m.y);
            assert!(
                (x - lon).abs() < 1e-9 && (y - lat).abs() < 1e-9,
                "{lon},{lat}"
            );
        }
    }

    /// A clipped polygon has the area of its intersection with the box, as geo's boolean
    /// operations compute it.
    #[test]
    fn clipping_a_polygon_keeps_its_intersection_with_the_box() {
        let shapes = [
            Polygon::new(
                LineString::from(vec![(0.0, 0.0), (10.0, 0.0), (10.0, 10.0), (0.0, 10.0)]),
                vec![],
            ),
            Polygon::new(
                LineString::from(vec![(-5.0, -5.0), (15.0, 2.0), (3.0, 20.0)]),
                vec![LineString::from(vec![(2.0, 2.0), (4.0, 2.0), (3.0, 4.0)])],
            ),
        ];
        let b = (2.5, -1.0, 7.5, 6.0);
        let rect = Rect::new((b.0, b.1), (b.2, b.3)).to_polygon();
        for p in shapes {
            let want = p.intersection(&rect).unsigned_area();
            let got = clip_geometry(Geometry::Polygon(p), b).map_or(0.0, |g| g.unsigned_area());
            // geo's boolean operations snap to a fixed grid: equal to a millionth.
            assert!(
                (got - want).abs() < 1e-6 * want.max(1.0),
                "{got} against {want}"
            );
        }
        let outside = Polygon::new(
            LineString::from(vec![(20.0, 20.0), (30.0, 20.0), (30.0, 30.0)]),
            vec![],
        );
        assert!(clip_geometry(Geometry::Polygon(outside), b).is_none());
    }
}
