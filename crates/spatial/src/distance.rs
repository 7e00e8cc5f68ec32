//! Distance queries: whether a feature lies within a given number of metres of the query
//! geometry, measured on the WGS84 ellipsoid.
//!
//! Geometries that intersect (in the engine's plane of longitude and latitude, as every other
//! relation) are at distance 0. Otherwise the closest pair of points, one on each geometry, is
//! found on the sphere (each vertex of one against each edge of the other, edges as great-circle
//! arcs); a distance clearly inside or outside the bound is decided there, and one near it is
//! measured again between that pair on the ellipsoid (Karney's geodesic, from `geo`).

use std::time::Instant;

use geo::{Coord, Distance, Geodesic, Geometry, Intersects, Point};

use super::pip::BBox;

/// The mean radius of the WGS84 ellipsoid, in metres.
const MEAN_RADIUS: f64 = 6_371_008.8;

/// How far, relatively, a distance on the sphere of mean radius may be from the ellipsoid's
/// (at most about 0.56 %).
const SPHERE_SLACK: f64 = 0.0075;

/// Pairs of vertex and edge between looks at the clock.
const PAIRS_PER_CLOCK: usize = 1 << 16;

/// A box holding every point within `meters` of `bbox` (longitude, latitude in degrees). Near
/// a pole or across the antimeridian it spans every longitude.
pub fn around(bbox: &BBox, meters: f64) -> BBox {
    // 110,574 m is the shortest degree of latitude (at the equator); 111,320 m × cos φ
    // bounds a degree of longitude from above. The margins cover rounding.
    let dlat = meters / 110_574.0 * 1.01 + 1e-9;
    let ymin = (bbox[1] - dlat).max(-90.0);
    let ymax = (bbox[3] + dlat).min(90.0);
    let phi = ymin.abs().max(ymax.abs());
    let full = [-180.0, ymin, 180.0, ymax];
    if phi >= 89.99 {
        return full;
    }
    let dlon = meters / (111_320.0 * phi.to_radians().cos()) * 1.01 + 1e-9;
    let (xmin, xmax) = (bbox[0] - dlon, bbox[2] + dlon);
    if dlon >= 180.0 || xmin < -180.0 || xmax > 180.0 {
        return full;
    }
    [xmin, ymin, xmax, ymax]
}

/// Whether `a` and `b` are at most `meters` apart; `None` once `deadline` has passed.
pub fn within(
    a: &Geometry<f64>,
    b: &Geometry<f64>,
    meters: f64,
    deadline: Option<Instant>,
) -> Option<bool> {
    if a.intersects(b) {
        return Some(true);
    }
    Near::new(b).apart_within(a, meters, deadline)
}

/// A query geometry on the sphere, made once for all the features it is measured against.
pub struct Near {
    vertices: Vec<V3>,
    edges: Vec<[V3; 2]>,
}

impl Near {
    pub fn new(query: &Geometry<f64>) -> Near {
        Near {
            vertices: vertices(query),
            edges: edges(query),
        }
    }

    /// Whether `g`, known not to intersect the query geometry, is at most `meters` from it:
    /// the closest pair is a vertex of one against an edge of the other, or two points when
    /// neither has edges. `None` once `deadline` has passed.
    pub fn apart_within(
        &self,
        g: &Geometry<f64>,
        meters: f64,
        deadline: Option<Instant>,
    ) -> Option<bool> {
        let (vg, eg) = (vertices(g), edges(g));
        let mut best = Closest {
            angle: f64::INFINITY,
            from: [0.0; 3],
            to: [0.0; 3],
        };
        let mut pairs = 0usize;
        let mut consider = |p: &V3, angle: f64, to: V3| -> bool {
            pairs += 1;
            if angle < best.angle {
                best = Closest {
                    angle,
                    from: *p,
                    to,
                };
            }
            !(pairs.is_multiple_of(PAIRS_PER_CLOCK)
                && deadline.is_some_and(|d| Instant::now() >= d))
        };
        for (points, segments) in [(&vg, &self.edges), (&self.vertices, &eg)] {
            for p in points {
                for s in segments {
                    let (angle, c) = to_arc(p, &s[0], &s[1]);
                    if !consider(p, angle, c) {
                        return None;
                    }
                }
            }
        }
        if eg.is_empty() && self.edges.is_empty() {
            for p in &vg {
                for q in &self.vertices {
                    if !consider(p, between(p, q), *q) {
                        return None;
                    }
                }
            }
        }
        if !best.angle.is_finite() {
            return Some(false);
        }
        let on_sphere = best.angle * MEAN_RADIUS;
        if on_sphere <= meters * (1.0 - SPHERE_SLACK) {
            return Some(true);
        }
        if on_sphere > meters * (1.0 + SPHERE_SLACK) {
            return Some(false);
        }
        Some(Geodesic.distance(lon_lat(&best.from), lon_lat(&best.to)) <= meters)
    }
}

struct Closest {
    angle: f64,
    from: [f64; 3],
    to: [f64; 3],
}

type V3 = [f64; 3];

fn unit(c: Coord<f64>) -> V3 {
    let (lon, lat) = (c.x.to_radians(), c.y.to_radians());
    [lat.cos() * lon.cos(), lat.cos() * lon.sin(), lat.sin()]
}

fn lon_lat(v: &V3) -> Point<f64> {
    Point::new(
        v[1].atan2(v[0]).to_degrees(),
        v[2].atan2(v[0].hypot(v[1])).to_degrees(),
    )
}

fn dot(a: &V3, b: &V3) -> f64 {
    a[0] * b[0] + a[1] * b[1] + a[2] * b[2]
}

fn cross(a: &V3, b: &V3) -> V3 {
    [
        a[1] * b[2] - a[2] * b[1],
        a[2] * b[0] - a[0] * b[2],
        a[0] * b[1] - a[1] * b[0],
    ]
}

fn norm(a: &V3) -> f64 {
    dot(a, a).sqrt()
}

/// The angle between two unit vectors, in radians (stable for small and large angles).
fn between(a: &V3, b: &V3) -> f64 {
    norm(&cross(a, b)).atan2(dot(a, b))
}

/// The angle from `p` to the minor great-circle arc from `a` to `b`, and its closest point.
fn to_arc(p: &V3, a: &V3, b: &V3) -> (f64, V3) {
    let n = cross(a, b);
    let len = norm(&n);
    if len > 1e-15 {
        let n = [n[0] / len, n[1] / len, n[2] / len];
        let pn = dot(p, &n);
        let c = [p[0] - n[0] * pn, p[1] - n[1] * pn, p[2] - n[2] * pn];
        let cl = norm(&c);
        if cl > 1e-15 {
            let c = [c[0] / cl, c[1] / cl, c[2] / cl];
            if dot(&cross(a, &c), &n) >= 0.0 && dot(&cross(&c, b), &n) >= 0.0 {
                return (between(p, &c), c);
            }
        }
    }
    let (da, db) = (between(p, a), between(p, b));
    if da <= db { (da, *a) } else { (db, *b) }
}

fn vertices(g: &Geometry<f64>) -> Vec<V3> {
    use geo::CoordsIter;
    g.coords_iter().map(unit).collect()
}

fn edges(g: &Geometry<f64>) -> Vec<[V3; 2]> {
    let mut out = Vec::new();
    let mut line = |l: &geo::LineString<f64>| {
        out.extend(l.0.windows(2).map(|w| [unit(w[0]), unit(w[1])]));
    };
    each_line(g, &mut line);
    out
}

/// Every line string of `g`: lines, and polygon rings.
fn each_line(g: &Geometry<f64>, f: &mut impl FnMut(&geo::LineString<f64>)) {
    match g {
        Geometry::LineString(l) => f(l),
        Geometry::MultiLineString(m) => m.0.iter().for_each(f),
        Geometry::Line(l) => f(&geo::LineString::from(vec![l.start, l.end])),
        Geometry::Polygon(p) => {
            f(p.exterior());
            p.interiors().iter().for_each(f);
        }
        Geometry::MultiPolygon(m) => m.0.iter().for_each(|p| {
            f(p.exterior());
            p.interiors().iter().for_each(&mut *f);
        }),
        Geometry::Rect(r) => f(r.to_polygon().exterior()),
        Geometry::Triangle(t) => f(t.to_polygon().exterior()),
        Geometry::GeometryCollection(c) => c.0.iter().for_each(|g| each_line(g, f)),
        Geometry::Point(_) | Geometry::MultiPoint(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use geo::{line_string, point, polygon};

    fn far(a: Point<f64>, b: Point<f64>) -> f64 {
        Geodesic.distance(a, b)
    }

    /// Point to point: decided against the ellipsoid's distance on both sides of the bound,
    /// including bounds within the sphere's slack.
    #[test]
    fn points_against_the_geodesic() {
        let pairs = [
            (point!(x: 0.0, y: 0.0), point!(x: 0.01, y: 0.0)),
            (point!(x: -73.98, y: 40.75), point!(x: -0.12, y: 51.5)),
            (point!(x: 10.0, y: 80.0), point!(x: 10.0, y: 80.02)),
            (point!(x: 179.99, y: -10.0), point!(x: -179.99, y: -10.0)),
        ];
        for (a, b) in pairs {
            let d = far(a, b);
            let (ga, gb) = (Geometry::Point(a), Geometry::Point(b));
            for k in [0.5, 0.99, 0.999, 0.9999] {
                assert_eq!(
                    within(&ga, &gb, d * k, None),
                    Some(false),
                    "{a:?} {b:?} {k}"
                );
            }
            for k in [1.0001, 1.001, 1.01, 2.0] {
                assert_eq!(within(&ga, &gb, d * k, None), Some(true), "{a:?} {b:?} {k}");
            }
        }
    }

    /// A point beside a long edge is measured to the edge, not its ends; inside a polygon it
    /// is at distance 0.
    #[test]
    fn points_to_edges_and_into_polygons() {
        let line = Geometry::LineString(line_string![(x: -1.0, y: 0.0), (x: 1.0, y: 0.0)]);
        let p = Geometry::Point(point!(x: 0.0, y: 0.01));
        // 0.01° of latitude at the equator is 1,105.7 m; the line's ends are 111 km away.
        assert_eq!(within(&p, &line, 1_110.0, None), Some(true));
        assert_eq!(within(&p, &line, 1_100.0, None), Some(false));
        let square = Geometry::Polygon(polygon![
            (x: 0.0, y: 0.0), (x: 1.0, y: 0.0), (x: 1.0, y: 1.0), (x: 0.0, y: 1.0), (x: 0.0, y: 0.0)
        ]);
        assert_eq!(
            within(&Geometry::Point(point!(x: 0.5, y: 0.5)), &square, 0.0, None),
            Some(true)
        );
        let east = Geometry::Point(point!(x: 1.02, y: 0.5));
        let d = far(point!(x: 1.0, y: 0.5), point!(x: 1.02, y: 0.5));
        assert_eq!(within(&east, &square, d * 1.001, None), Some(true));
        assert_eq!(within(&east, &square, d * 0.999, None), Some(false));
        // Two polygons: the closest pair is a vertex of one against an edge of the other.
        let other = Geometry::Polygon(polygon![
            (x: 1.5, y: 0.4), (x: 2.0, y: 0.4), (x: 2.0, y: 0.6), (x: 1.5, y: 0.6), (x: 1.5, y: 0.4)
        ]);
        let d = far(point!(x: 1.0, y: 0.4), point!(x: 1.5, y: 0.4));
        assert_eq!(within(&square, &other, d * 1.001, None), Some(true));
        assert_eq!(within(&square, &other, d * 0.99, None), Some(false));
    }

    #[test]
    fn boxes_around_hold_the_distance() {
        let b = around(&[10.0, 50.0, 10.0, 50.0], 10_000.0);
        let east = point!(x: b[2], y: 50.0);
        let north = point!(x: 10.0, y: b[3]);
        assert!(far(point!(x: 10.0, y: 50.0), east) >= 10_000.0);
        assert!(far(point!(x: 10.0, y: 50.0), north) >= 10_000.0);
        assert_eq!(around(&[179.99, 0.0, 179.99, 0.0], 5_000.0)[0], -180.0);
        assert_eq!(around(&[0.0, 89.99, 0.0, 89.99], 5_000.0)[2], 180.0);
    }
}
