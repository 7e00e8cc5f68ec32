//! GeoJSON geometries to `geo` types and back, with validation that says where it failed.
//!
//! Accepted: Point, MultiPoint, LineString, MultiLineString, Polygon, MultiPolygon. Positions
//! may carry a third ordinate (elevation); the engine is 2-D and ignores it. Structurally
//! broken input is refused: non-finite numbers, coordinates out of range, unclosed or short
//! rings, empty coordinates, wrong nesting. OGC-invalid but well-formed shapes (self-
//! intersecting rings, collapsed rings) are accepted, as GEOS and PostGIS accept them.

use std::fmt;

use geo::{Coord, Geometry, LineString, MultiLineString, MultiPoint, MultiPolygon, Point, Polygon};
use serde_json::{Value, json};

/// A geometry that cannot be used, and where in it the fault is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeometryError {
    /// A JSON-pointer-like path: `coordinates[1][0]`.
    pub path: String,
    pub message: String,
}

impl fmt::Display for GeometryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl std::error::Error for GeometryError {}

fn fail<T>(path: &str, message: impl Into<String>) -> Result<T, GeometryError> {
    Err(GeometryError {
        path: path.to_string(),
        message: message.into(),
    })
}

/// How forgiving the parser is.
#[derive(Debug, Clone, Copy, Default)]
pub struct ParseOptions {
    /// Close a ring whose last position differs from its first, instead of refusing it.
    /// For loaders of real-world data with known small gaps; off by default.
    pub close_rings: bool,
}

/// Parse a GeoJSON geometry object.
pub fn parse_geojson(v: &Value) -> Result<Geometry<f64>, GeometryError> {
    parse_geojson_with(v, ParseOptions::default())
}

pub fn parse_geojson_with(v: &Value, opts: ParseOptions) -> Result<Geometry<f64>, GeometryError> {
    let Some(obj) = v.as_object() else {
        return fail("", "geometry is not a JSON object");
    };
    let Some(kind) = obj.get("type").and_then(Value::as_str) else {
        return fail("type", "geometry has no string member \"type\"");
    };
    let Some(coords) = obj.get("coordinates") else {
        return fail(
            "coordinates",
            format!("{kind} has no member \"coordinates\""),
        );
    };
    parse_parts(kind, coords, opts)
}

/// Parse a geometry given as its `type` and its `coordinates` (for callers that deserialize
/// the object themselves).
pub fn parse_parts(
    kind: &str,
    coords: &Value,
    opts: ParseOptions,
) -> Result<Geometry<f64>, GeometryError> {
    let p = "coordinates";
    match kind {
        "Point" => Ok(Geometry::Point(Point(position(coords, &|| p.to_string())?))),
        "MultiPoint" => {
            let list = non_empty_array(coords, p)?;
            let pts = list
                .iter()
                .enumerate()
                .map(|(i, c)| position(c, &|| format!("{p}[{i}]")).map(Point))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Geometry::MultiPoint(MultiPoint(pts)))
        }
        "LineString" => Ok(Geometry::LineString(line(coords, p)?)),
        "MultiLineString" => {
            let list = non_empty_array(coords, p)?;
            let lines = list
                .iter()
                .enumerate()
                .map(|(i, c)| line(c, &format!("{p}[{i}]")))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Geometry::MultiLineString(MultiLineString(lines)))
        }
        "Polygon" => Ok(Geometry::Polygon(polygon(coords, p, opts)?)),
        "MultiPolygon" => {
            let list = non_empty_array(coords, p)?;
            let polys = list
                .iter()
                .enumerate()
                .map(|(i, c)| polygon(c, &format!("{p}[{i}]"), opts))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Geometry::MultiPolygon(MultiPolygon(polys)))
        }
        "GeometryCollection" => fail("type", "GeometryCollection is not supported"),
        other => fail("type", format!("unknown geometry type {other:?}")),
    }
}

fn non_empty_array<'a>(v: &'a Value, path: &str) -> Result<&'a Vec<Value>, GeometryError> {
    match v {
        Value::Array(a) if a.is_empty() => fail(path, "coordinates are empty"),
        Value::Array(a) => Ok(a),
        Value::Number(_) => fail(
            path,
            "nesting is too shallow: expected an array, found a number",
        ),
        _ => fail(path, "expected an array"),
    }
}

const LONGITUDE: std::ops::RangeInclusive<f64> = -180.0..=180.0;
const LATITUDE: std::ops::RangeInclusive<f64> = -90.0..=90.0;

/// A position `[x, y]` or `[x, y, z]`. `path` names it in an error, made only then (a
/// geometry has as many positions as it has vertices).
fn position(v: &Value, path: &dyn Fn() -> String) -> Result<Coord<f64>, GeometryError> {
    let Value::Array(a) = v else {
        return fail(&path(), "a position must be an array of numbers");
    };
    if a.iter().any(Value::is_array) {
        return fail(
            &path(),
            "nesting is too deep: expected a number, found an array",
        );
    }
    if a.len() < 2 {
        return fail(
            &path(),
            format!("a position needs 2 numbers, found {}", a.len()),
        );
    }
    if a.len() > 3 {
        return fail(
            &path(),
            format!("a position has at most 3 numbers, found {}", a.len()),
        );
    }
    let mut xy = [0.0f64; 2];
    for (i, n) in a.iter().enumerate() {
        let f = match n {
            Value::Number(num) => num.as_f64(),
            _ => None,
        };
        let Some(f) = f else {
            return fail(&format!("{}[{i}]", path()), "not a number");
        };
        if !f.is_finite() {
            return fail(&format!("{}[{i}]", path()), "not a finite number");
        }
        if i < 2 {
            xy[i] = f;
        }
    }
    if !LONGITUDE.contains(&xy[0]) {
        return fail(
            &path(),
            format!("longitude {} is outside [-180, 180]", xy[0]),
        );
    }
    if !LATITUDE.contains(&xy[1]) {
        return fail(&path(), format!("latitude {} is outside [-90, 90]", xy[1]));
    }
    Ok(Coord { x: xy[0], y: xy[1] })
}

/// The point `[x, y]` when [`parse_parts`] accepts it as a `Point`'s coordinates (finite, and
/// within longitude and latitude range, as `position` checks); `None` where it gives an
/// error.
pub fn point(x: f64, y: f64) -> Option<Geometry<f64>> {
    (LONGITUDE.contains(&x) && LATITUDE.contains(&y))
        .then_some(Geometry::Point(Point(Coord { x, y })))
}

fn positions(v: &Value, path: &str) -> Result<Vec<Coord<f64>>, GeometryError> {
    non_empty_array(v, path)?
        .iter()
        .enumerate()
        .map(|(i, c)| position(c, &|| format!("{path}[{i}]")))
        .collect()
}

fn line(v: &Value, path: &str) -> Result<LineString<f64>, GeometryError> {
    let pts = positions(v, path)?;
    if pts.len() < 2 {
        return fail(
            path,
            format!("a line needs at least 2 positions, found {}", pts.len()),
        );
    }
    Ok(LineString(pts))
}

fn ring(v: &Value, path: &str, opts: ParseOptions) -> Result<LineString<f64>, GeometryError> {
    let mut pts = positions(v, path)?;
    if pts.first() != pts.last() {
        if !opts.close_rings {
            let (a, b) = (pts[0], pts[pts.len() - 1]);
            return fail(
                path,
                format!(
                    "ring is not closed: first [{}, {}] differs from last [{}, {}]",
                    a.x, a.y, b.x, b.y
                ),
            );
        }
        pts.push(pts[0]);
    }
    if pts.len() < 4 {
        return fail(
            path,
            format!("a ring needs at least 4 positions, found {}", pts.len()),
        );
    }
    Ok(LineString(pts))
}

fn polygon(v: &Value, path: &str, opts: ParseOptions) -> Result<Polygon<f64>, GeometryError> {
    let rings = non_empty_array(v, path)?;
    let mut out = Vec::with_capacity(rings.len());
    for (i, r) in rings.iter().enumerate() {
        out.push(ring(r, &format!("{path}[{i}]"), opts)?);
    }
    let exterior = out.remove(0);
    Ok(Polygon::new(exterior, out))
}

/// Twice the signed area of a ring (positive when counter-clockwise).
pub fn signed_area(r: &[[f64; 2]]) -> f64 {
    r.windows(2)
        .map(|w| w[0][0] * w[1][1] - w[1][0] * w[0][1])
        .sum()
}

/// Whether `p` is inside ring `r` (even-odd crossings).
pub fn inside(r: &[[f64; 2]], p: [f64; 2]) -> bool {
    let mut inside = false;
    for w in r.windows(2) {
        let ([x1, y1], [x2, y2]) = (w[0], w[1]);
        if (y1 > p[1]) != (y2 > p[1]) && p[0] < x1 + (p[1] - y1) / (y2 - y1) * (x2 - x1) {
            inside = !inside;
        }
    }
    inside
}

/// Rings in the Esri (and Shapefile) convention as a GeoJSON Polygon or MultiPolygon:
/// clockwise rings are shells, counter-clockwise ones holes of the shell that holds them (a
/// hole no shell holds, as from a writer that ignores orientation, becomes a shell of its
/// own). Open rings are closed.
pub fn rings_to_polygon(rings: Vec<Vec<[f64; 2]>>) -> (&'static str, Value) {
    let mut rings = rings;
    for r in &mut rings {
        if r.first() != r.last() {
            let first = r[0];
            r.push(first);
        }
    }
    type Ring = Vec<[f64; 2]>;
    let mut shells: Vec<Vec<Ring>> = Vec::new();
    let mut holes: Vec<Ring> = Vec::new();
    for r in rings {
        if signed_area(&r) <= 0.0 {
            shells.push(vec![r]);
        } else {
            holes.push(r);
        }
    }
    for h in holes {
        match shells.iter_mut().find(|s| inside(&s[0], h[0])) {
            Some(s) => s.push(h),
            None => shells.push(vec![h]),
        }
    }
    if shells.len() == 1 {
        ("Polygon", json!(shells[0]))
    } else {
        ("MultiPolygon", json!(shells))
    }
}

/// The GeoJSON object of a geometry. Coordinates are written with the shortest decimal form
/// that reads back to the same `f64`, so `parse(to_geojson(g)) == g`.
pub fn to_geojson(g: &Geometry<f64>) -> Value {
    let pos = |c: &Coord<f64>| serde_json::json!([c.x, c.y]);
    let line = |l: &LineString<f64>| Value::Array(l.0.iter().map(pos).collect());
    let poly = |p: &Polygon<f64>| {
        let mut rings = vec![line(p.exterior())];
        rings.extend(p.interiors().iter().map(line));
        Value::Array(rings)
    };
    let (kind, coords) = match g {
        Geometry::Point(p) => ("Point", pos(&p.0)),
        Geometry::MultiPoint(mp) => (
            "MultiPoint",
            Value::Array(mp.0.iter().map(|p| pos(&p.0)).collect()),
        ),
        Geometry::LineString(l) => ("LineString", line(l)),
        Geometry::MultiLineString(ml) => (
            "MultiLineString",
            Value::Array(ml.0.iter().map(line).collect()),
        ),
        Geometry::Polygon(p) => ("Polygon", poly(p)),
        Geometry::MultiPolygon(mp) => (
            "MultiPolygon",
            Value::Array(mp.0.iter().map(poly).collect()),
        ),
        // Never produced by the parser; written as an empty collection.
        _ => return serde_json::json!({"type": "GeometryCollection", "geometries": []}),
    };
    serde_json::json!({"type": kind, "coordinates": coords})
}

/// Number of coordinates, for thresholds and reports.
pub fn coord_count(g: &Geometry<f64>) -> usize {
    use geo::CoordsIter;
    g.coords_count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(v: Value) -> String {
        parse_geojson(&v).unwrap_err().to_string()
    }

    /// Coordinates read from JSON text are the nearest doubles, as the standard library's
    /// parser reads them: a position written is the position stored, to the last bit.
    #[test]
    fn coordinates_are_read_to_the_last_bit() {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let x = (state >> 11) as f64 / (1u64 << 53) as f64 * 360.0 - 180.0;
            let y = x / 2.0;
            let text = format!(r#"{{"type": "Point", "coordinates": [{x}, {y}]}}"#);
            let v: Value = serde_json::from_str(&text).unwrap();
            let Geometry::Point(p) = parse_geojson(&v).unwrap() else {
                panic!("{text}");
            };
            assert_eq!(p.x().to_bits(), x.to_bits(), "{text}");
            assert_eq!(p.y().to_bits(), y.to_bits(), "{text}");
        }
    }

    #[test]
    fn round_trips_every_type() {
        let samples = [
            json!({"type":"Point","coordinates":[178.03333,-18.36667]}),
            json!({"type":"MultiPoint","coordinates":[[1.5,2.25],[-3.0,4.125]]}),
            json!({"type":"LineString","coordinates":[[0.1,0.2],[0.30000000000000004,0.4]]}),
            json!({"type":"MultiLineString","coordinates":[[[0,0],[1,1]],[[2,2],[3,3],[4,5]]]}),
            json!({"type":"Polygon","coordinates":[[[0,0],[10,0],[10,10],[0,10],[0,0]],[[2,2],[3,2],[3,3],[2,2]]]}),
            json!({"type":"MultiPolygon","coordinates":[[[[0,0],[1,0],[1,1],[0,0]]],[[[5,5],[6,5],[6,6],[5,5]]]]}),
        ];
        for s in samples {
            let g = parse_geojson(&s).unwrap();
            let back = to_geojson(&g);
            let g2 = parse_geojson(&back).unwrap();
            assert_eq!(g, g2, "{s}");
            // Numbers survive exactly.
            let a: Vec<f64> = flatten(&s["coordinates"]);
            let b: Vec<f64> = flatten(&back["coordinates"]);
            assert_eq!(a, b);
        }
    }

    fn flatten(v: &Value) -> Vec<f64> {
        match v {
            Value::Array(a) => a.iter().flat_map(flatten).collect(),
            Value::Number(n) => vec![n.as_f64().unwrap()],
            _ => vec![],
        }
    }

    #[test]
    fn errors_say_where() {
        assert_eq!(
            err(json!({"type":"Point","coordinates":[200,0]})),
            "coordinates: longitude 200 is outside [-180, 180]"
        );
        assert_eq!(
            err(json!({"type":"Point","coordinates":[0,-91]})),
            "coordinates: latitude -91 is outside [-90, 90]"
        );
        assert_eq!(
            err(
                json!({"type":"Polygon","coordinates":[[[0,0],[1,0],[1,1],[0,0]],[[0,0],[1,0],[1,1],[0,1]]]})
            ),
            "coordinates[1]: ring is not closed: first [0, 0] differs from last [0, 1]"
        );
        assert_eq!(
            err(json!({"type":"Polygon","coordinates":[[[0,0],[1,0],[0,0]]]})),
            "coordinates[0]: a ring needs at least 4 positions, found 3"
        );
        assert_eq!(
            err(json!({"type":"MultiPolygon","coordinates":[]})),
            "coordinates: coordinates are empty"
        );
        assert_eq!(
            err(json!({"type":"LineString","coordinates":[[[0,0]],[1,1]]})),
            "coordinates[0]: nesting is too deep: expected a number, found an array"
        );
        assert_eq!(
            err(json!({"type":"Polygon","coordinates":[[0,0],[1,1]]})),
            "coordinates[0][0]: a position must be an array of numbers"
        );
        assert_eq!(
            err(json!({"type":"LineString","coordinates":[[0,"a"],[1,1]]})),
            "coordinates[0][1]: not a number"
        );
        assert_eq!(
            err(json!({"type":"LineString","coordinates":[[0,0]]})),
            "coordinates: a line needs at least 2 positions, found 1"
        );
        assert_eq!(
            err(json!({"type":"Circle","coordinates":[0,0]})),
            "type: unknown geometry type \"Circle\""
        );
        assert_eq!(
            err(json!({"coordinates":[0,0]})),
            "type: geometry has no string member \"type\""
        );
        assert_eq!(err(json!([1, 2])), "geometry is not a JSON object");
    }

    #[test]
    fn elevation_is_accepted_and_dropped() {
        let g = parse_geojson(&json!({"type":"Point","coordinates":[1,2,300]})).unwrap();
        assert_eq!(g, Geometry::Point(Point::new(1.0, 2.0)));
    }

    #[test]
    fn close_rings_repairs_gaps_when_asked() {
        let v = json!({"type":"Polygon","coordinates":[[[0,0],[1,0],[1,1],[0,1]]]});
        assert!(parse_geojson(&v).is_err());
        let g = parse_geojson_with(&v, ParseOptions { close_rings: true }).unwrap();
        let Geometry::Polygon(p) = g else { panic!() };
        assert_eq!(p.exterior().0.len(), 5);
    }
}
