//! Query geometries as ArcGIS clients send them in `query.geometry`: Esri JSON (a point,
//! multipoint, polyline, polygon or envelope) or its short text forms (`"x,y"`,
//! `"xmin,ymin,xmax,ymax"`), in WGS84 or Web Mercator, turned into the GeoJSON type and
//! coordinates the engine reads. Also the `distance` units.

use serde_json::{Value, json};
use thiserror::Error;

/// Why a query geometry or `units` member was refused; `at` names the member.
#[derive(Debug, Error)]
pub enum EsriError {
    #[error("geometry is not valid JSON: {0}")]
    NotJson(serde_json::Error),
    #[error("inSR {0} is not a spatial reference")]
    InSr(Value),
    #[error("geometry.spatialReference {0} has no wkid")]
    NoWkid(Value),
    #[error(
        "spatial reference {0} is not supported for query geometries: use 4326, 3857 or 102100"
    )]
    Unsupported(i64),
    #[error("geometry.{0} must be a number")]
    NotNumber(&'static str),
    #[error(
        "geometry is not an Esri point (x, y), multipoint (points), polyline (paths), polygon \
         (rings) or envelope (xmin, ymin, xmax, ymax)"
    )]
    UnknownShape,
    #[error("geometry must be an Esri JSON object or \"x,y\" text")]
    NotObject,
    #[error("{0}: x and y must be numbers (an empty point selects nothing)")]
    NotPoint(&'static str),
    #[error("{0} must be an array")]
    NotArray(&'static str),
    #[error("{0}: each position must be [x, y]")]
    NotPosition(&'static str),
    #[error("{0} is empty")]
    Empty(&'static str),
    #[error("geometry {0:?} is not \"x,y\" or \"xmin,ymin,xmax,ymax\"")]
    Text(String),
    #[error(
        "units {0:?} is not supported: use esriSRUnit_Meter, esriSRUnit_Kilometer, \
         esriSRUnit_Foot, esriSRUnit_StatuteMile or esriSRUnit_NauticalMile"
    )]
    Units(String),
}

/// Spatial references a query geometry may be in: WGS84, and Web Mercator under its names.
const WEB_MERCATOR: [i64; 4] = [102100, 3857, 102113, 900913];

/// The GeoJSON `(type, coordinates)` of an Esri `geometry` member, in WGS84 longitude and
/// latitude. `in_sr` (the request's `inSR`) wins over the geometry's own
/// `spatialReference`; with neither it is WGS84.
pub(super) fn to_geojson(
    geometry: &Value,
    in_sr: Option<&Value>,
) -> Result<(String, Value), EsriError> {
    let parsed;
    let g = match geometry {
        Value::String(s) if s.trim_start().starts_with('{') => {
            parsed = serde_json::from_str::<Value>(s).map_err(EsriError::NotJson)?;
            &parsed
        }
        other => other,
    };
    let sr = match in_sr.filter(|v| !v.is_null() && v.as_str() != Some("")) {
        Some(v) => wkid(v).ok_or_else(|| EsriError::InSr(v.clone()))?,
        None => match g.get("spatialReference") {
            Some(v) if !v.is_null() => wkid(v).ok_or_else(|| EsriError::NoWkid(v.clone()))?,
            _ => 4326,
        },
    };
    let project: fn([f64; 2]) -> [f64; 2] = if sr == 4326 {
        |p| p
    } else if WEB_MERCATOR.contains(&sr) {
        from_web_mercator
    } else {
        return Err(EsriError::Unsupported(sr));
    };
    let (kind, coords) = match g {
        Value::String(s) => text_form(s)?,
        Value::Object(o) => {
            if o.contains_key("x") || o.contains_key("y") {
                ("Point", json!(point(o.get("x"), o.get("y"), "geometry")?))
            } else if let Some(ps) = o.get("points") {
                ("MultiPoint", Value::from(positions(ps, "geometry.points")?))
            } else if let Some(paths) = o.get("paths") {
                let paths = lists(paths, "geometry.paths")?;
                match paths.len() {
                    1 => ("LineString", json!(paths[0])),
                    _ => ("MultiLineString", json!(paths)),
                }
            } else if let Some(rings) = o.get("rings") {
                crate::spatial::geometry::rings_to_polygon(lists(rings, "geometry.rings")?)
            } else if o.contains_key("xmin") {
                let n = |k: &'static str| {
                    o.get(k)
                        .and_then(Value::as_f64)
                        .ok_or(EsriError::NotNumber(k))
                };
                envelope([n("xmin")?, n("ymin")?, n("xmax")?, n("ymax")?])
            } else {
                return Err(EsriError::UnknownShape);
            }
        }
        _ => return Err(EsriError::NotObject),
    };
    Ok((kind.to_string(), reproject(coords, project)))
}

/// A spatial reference's well-known id: a number, numeric text, or `{wkid}` /
/// `{latestWkid}`.
fn wkid(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        Value::Object(o) => o
            .get("latestWkid")
            .and_then(wkid)
            .filter(|w| *w == 4326 || WEB_MERCATOR.contains(w))
            .or_else(|| o.get("wkid").and_then(wkid)),
        _ => None,
    }
}

fn from_web_mercator([x, y]: [f64; 2]) -> [f64; 2] {
    const R: f64 = 6_378_137.0;
    let lon = (x / R).to_degrees();
    let lat = (2.0 * (y / R).exp().atan() - std::f64::consts::FRAC_PI_2).to_degrees();
    [lon, lat]
}

/// Apply `f` to every position of nested coordinate arrays.
fn reproject(v: Value, f: fn([f64; 2]) -> [f64; 2]) -> Value {
    match v {
        Value::Array(a) if a.len() >= 2 && a.iter().all(Value::is_number) => {
            let [x, y] = f([
                a[0].as_f64().unwrap_or(f64::NAN),
                a[1].as_f64().unwrap_or(f64::NAN),
            ]);
            json!([x, y])
        }
        Value::Array(a) => Value::Array(a.into_iter().map(|x| reproject(x, f)).collect()),
        other => other,
    }
}

fn point(x: Option<&Value>, y: Option<&Value>, at: &'static str) -> Result<[f64; 2], EsriError> {
    match (x.and_then(Value::as_f64), y.and_then(Value::as_f64)) {
        (Some(x), Some(y)) => Ok([x, y]),
        _ => Err(EsriError::NotPoint(at)),
    }
}

fn positions(v: &Value, at: &'static str) -> Result<Vec<[f64; 2]>, EsriError> {
    let a = v.as_array().ok_or(EsriError::NotArray(at))?;
    a.iter()
        .map(|p| match p.as_array() {
            Some(c) if c.len() >= 2 => point(c.first(), c.get(1), at),
            _ => Err(EsriError::NotPosition(at)),
        })
        .collect()
}

fn lists(v: &Value, at: &'static str) -> Result<Vec<Vec<[f64; 2]>>, EsriError> {
    let a = v.as_array().ok_or(EsriError::NotArray(at))?;
    if a.is_empty() {
        return Err(EsriError::Empty(at));
    }
    a.iter().map(|l| positions(l, at)).collect()
}

fn envelope([xmin, ymin, xmax, ymax]: [f64; 4]) -> (&'static str, Value) {
    (
        "Polygon",
        json!([[
            [xmin, ymin],
            [xmax, ymin],
            [xmax, ymax],
            [xmin, ymax],
            [xmin, ymin]
        ]]),
    )
}

/// `"x,y"` (a point) or `"xmin,ymin,xmax,ymax"` (an envelope).
fn text_form(s: &str) -> Result<(&'static str, Value), EsriError> {
    let n: Vec<f64> = s
        .split(',')
        .map(|p| p.trim().parse::<f64>())
        .collect::<Result<_, _>>()
        .map_err(|_| EsriError::Text(s.to_string()))?;
    match n[..] {
        [x, y] => Ok(("Point", json!([x, y]))),
        [a, b, c, d] => Ok(envelope([a, b, c, d])),
        _ => Err(EsriError::Text(s.to_string())),
    }
}

/// Metres in one of `units` (Esri's `esriSRUnit_*` names, or plain English ones); meters
/// when absent.
pub(super) fn meters_per(units: Option<&str>) -> Result<f64, EsriError> {
    let Some(u) = units.map(str::trim).filter(|u| !u.is_empty()) else {
        return Ok(1.0);
    };
    let lower = u.to_ascii_lowercase();
    let name = lower.strip_prefix("esrisrunit_").unwrap_or(&lower);
    Ok(match name {
        "meter" | "meters" | "metre" | "metres" | "m" | "9001" => 1.0,
        "kilometer" | "kilometers" | "kilometre" | "kilometres" | "km" | "9036" => 1000.0,
        "foot" | "feet" | "ft" | "9002" => 0.3048,
        "surveyfoot" | "9003" => 1200.0 / 3937.0,
        "statutemile" | "mile" | "miles" | "mi" => 1609.344,
        "nauticalmile" | "nauticalmiles" | "9030" => 1852.0,
        _ => {
            return Err(EsriError::Units(u.to_string()));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo(v: Value) -> (String, Value) {
        to_geojson(&v, None).unwrap()
    }

    #[test]
    fn every_esri_kind() {
        assert_eq!(
            geo(json!({"x": 1.5, "y": 2})),
            ("Point".into(), json!([1.5, 2.0]))
        );
        assert_eq!(geo(json!("1.5, 2")), ("Point".into(), json!([1.5, 2.0])));
        assert_eq!(
            geo(json!({"points": [[1, 2], [3, 4]]})),
            ("MultiPoint".into(), json!([[1.0, 2.0], [3.0, 4.0]]))
        );
        assert_eq!(
            geo(json!({"paths": [[[0, 0], [1, 1]]]})),
            ("LineString".into(), json!([[0.0, 0.0], [1.0, 1.0]]))
        );
        assert_eq!(
            geo(json!({"paths": [[[0, 0], [1, 1]], [[2, 2], [3, 3]]]})).0,
            "MultiLineString"
        );
        let square = json!([[[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0], [0.0, 0.0]]]);
        assert_eq!(
            geo(json!({"xmin": 0, "ymin": 0, "xmax": 1, "ymax": 1})),
            ("Polygon".into(), square.clone())
        );
        assert_eq!(geo(json!("0,0,1,1")), ("Polygon".into(), square));
        // A JSON string, as some clients send it.
        assert_eq!(geo(json!("{\"x\": 3, \"y\": 4}")).1, json!([3.0, 4.0]));
    }

    /// Clockwise shells hold the counter-clockwise holes inside them; two shells make a
    /// MultiPolygon.
    #[test]
    fn rings_by_orientation() {
        let shell = json!([[0, 0], [0, 10], [10, 10], [10, 0], [0, 0]]);
        let hole = json!([[2, 2], [4, 2], [4, 4], [2, 4], [2, 2]]);
        let far_shell = json!([[20, 0], [20, 5], [25, 5], [25, 0], [20, 0]]);
        let (kind, c) = geo(json!({"rings": [shell, hole]}));
        assert_eq!(kind, "Polygon");
        assert_eq!(c.as_array().unwrap().len(), 2);
        let (kind, c) = geo(json!({"rings": [shell, far_shell, hole]}));
        assert_eq!(kind, "MultiPolygon");
        assert_eq!(
            c[0].as_array().unwrap().len(),
            2,
            "the hole is in the first shell"
        );
        assert_eq!(c[1].as_array().unwrap().len(), 1);
        // An unclosed ring is closed.
        let (_, c) = geo(json!({"rings": [[[0, 0], [0, 1], [1, 1]]]}));
        assert_eq!(c[0].as_array().unwrap().len(), 4);
    }

    /// Web Mercator under each of its names, from inSR or the geometry's own reference.
    #[test]
    fn web_mercator_to_wgs84() {
        // (-8237642.32, 4970241.33) is (-74.0, 40.713956) to six places.
        for sr in [
            json!(102100),
            json!("3857"),
            json!({"wkid": 102100, "latestWkid": 3857}),
        ] {
            let (_, c) =
                to_geojson(&json!({"x": -8237642.32, "y": 4970241.33}), Some(&sr)).unwrap();
            assert!((c[0].as_f64().unwrap() + 74.0).abs() < 1e-6, "{c}");
            assert!((c[1].as_f64().unwrap() - 40.713956).abs() < 1e-6, "{c}");
        }
        let (_, c) = geo(json!({"x": 0, "y": 0, "spatialReference": {"wkid": 3857}}));
        assert_eq!(c, json!([0.0, 0.0]));
        let err = to_geojson(&json!({"x": 0, "y": 0}), Some(&json!(2263)))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("2263") && err.contains("not supported"),
            "{err}"
        );
    }

    #[test]
    fn refusals_say_why() {
        for (g, says) in [
            (json!({"foo": 1}), "not an Esri"),
            (json!({"x": "NaN", "y": 1}), "x and y"),
            (json!("1,2,3"), "xmin,ymin"),
            (json!({"rings": []}), "empty"),
            (json!(7), "Esri JSON"),
        ] {
            let e = to_geojson(&g, None).unwrap_err().to_string();
            assert!(e.contains(says), "{g}: {e}");
        }
    }

    #[test]
    fn units() {
        assert_eq!(meters_per(None).ok(), Some(1.0));
        assert_eq!(meters_per(Some("esriSRUnit_Kilometer")).ok(), Some(1000.0));
        assert_eq!(
            meters_per(Some("esriSRUnit_StatuteMile")).ok(),
            Some(1609.344)
        );
        assert_eq!(meters_per(Some("feet")).ok(), Some(0.3048));
        assert!(
            meters_per(Some("parsecs"))
                .unwrap_err()
                .to_string()
                .contains("parsecs")
        );
    }
}
