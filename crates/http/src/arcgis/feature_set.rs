//! geoQueryService's answer written again as an Esri feature set (`f=json`) or as plain
//! GeoJSON (`f=geojson`): attributes copied as they were written, dates as milliseconds,
//! geometries as Esri's points, paths and rings (outer rings clockwise, holes
//! counterclockwise), in WGS84 or Web Mercator, rounded and generalized as asked.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use super::{EsriError, last};
use crate::features::{EsriShape, Quantization};
use crate::params::Params;

/// A layer's geometry type as Esri names it.
pub(super) fn esri_geometry_type(t: Option<&str>) -> &'static str {
    crate::features::esri_geometry_type(t.unwrap_or_default())
}

/// geoQueryService's fields (`name`, `type`, `alias`, `length`) as Esri fields.
pub(super) fn esri_fields(fields: Option<&[Value]>, id_field: &str) -> Vec<Value> {
    fields
        .unwrap_or_default()
        .iter()
        .map(|f| {
            let name = f["name"].as_str().unwrap_or_default();
            let kind = crate::features::esri_field_type(
                f["type"].as_str().unwrap_or_default(),
                name == id_field,
            );
            let mut out = json!({"name": name, "type": kind,
                                 "alias": f["alias"].as_str().unwrap_or(name),
                                 "sqlType": "sqlTypeOther", "domain": null, "defaultValue": null});
            if kind == "esriFieldTypeString" {
                out["length"] = f["length"].as_u64().unwrap_or(1024).into();
            }
            out
        })
        .collect()
}

/// A boolean parameter as ArcGIS reads one: `name`'s value, false when absent.
pub(super) fn yes(p: &Params, name: &str) -> Result<bool, EsriError> {
    match last(p, name)
        .map(|s| s.trim().to_ascii_lowercase())
        .as_deref()
    {
        None | Some("false") | Some("0") | Some("") => Ok(false),
        Some("true") | Some("1") => Ok(true),
        Some(other) => Err(EsriError::invalid(format!(
            "{name}: {other:?} is not true or false"
        ))),
    }
}

/// How geometries are written, from `outSR`, `geometryPrecision` and `maxAllowableOffset`.
pub(super) fn shape_of(p: &Params) -> Result<EsriShape, EsriError> {
    let web_mercator = match last(p, "outSR") {
        None => false,
        Some(sr) => {
            let wkid = match serde_json::from_str::<Value>(sr) {
                Ok(Value::Object(o)) => o
                    .get("latestWkid")
                    .or_else(|| o.get("wkid"))
                    .and_then(Value::as_i64),
                _ => sr.trim().parse::<i64>().ok(),
            };
            match wkid {
                Some(4326) => false,
                Some(3857 | 102100 | 102113 | 900913) => true,
                _ => {
                    return Err(EsriError::invalid(format!(
                        "outSR {sr} is not served: use 4326, or 3857 (102100)"
                    )));
                }
            }
        }
    };
    let precision = match last(p, "geometryPrecision") {
        None => None,
        Some(n) => Some(
            n.trim()
                .parse::<i32>()
                .ok()
                .filter(|n| (0..=17).contains(n))
                .ok_or_else(|| {
                    EsriError::invalid(format!("geometryPrecision {n:?} is not 0 to 17"))
                })?,
        ),
    };
    let max_offset = match last(p, "maxAllowableOffset") {
        None => None,
        Some(n) => {
            let v = n
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0);
            Some(v.ok_or_else(|| {
                EsriError::invalid(format!("maxAllowableOffset {n:?} is not a distance"))
            })?)
            .filter(|v| *v > 0.0)
        }
    };
    Ok(EsriShape {
        web_mercator,
        max_offset,
        precision,
        pbf: None,
    })
}

/// How `f=pbf` quantizes, from `quantizationParameters` (`tolerance`, the `extent`'s corner
/// at `originPosition`, `mode`), else the default for the output's reference.
pub(super) fn quantization_of(p: &Params, web_mercator: bool) -> Result<Quantization, EsriError> {
    let mut q = Quantization::default_for(web_mercator);
    let Some(text) = last(p, "quantizationParameters") else {
        return Ok(q);
    };
    let bad = |why: &str| EsriError::invalid(format!("quantizationParameters: {why}"));
    let v: Value = serde_json::from_str(text).map_err(|e| bad(&e.to_string()))?;
    if !v.is_object() {
        return Err(bad("not a JSON object"));
    }
    q.lower_left = match v["originPosition"].as_str() {
        None | Some("upperLeft") => false,
        Some("lowerLeft") => true,
        Some(other) => return Err(bad(&format!("originPosition {other:?}"))),
    };
    q.view = match v["mode"].as_str() {
        None | Some("view") => true,
        Some("edit") => false,
        Some(other) => return Err(bad(&format!("mode {other:?}"))),
    };
    if let Some(t) = v.get("tolerance").filter(|t| !t.is_null()) {
        q.scale = t
            .as_f64()
            .filter(|t| t.is_finite() && *t > 0.0)
            .ok_or_else(|| bad("tolerance must be a positive number"))?;
    }
    if let Some(e) = v.get("extent").filter(|e| !e.is_null()) {
        let n = |k: &str| e[k].as_f64().filter(|x| x.is_finite());
        let (Some(xmin), Some(ymin), Some(ymax)) = (n("xmin"), n("ymin"), n("ymax")) else {
            return Err(bad("extent needs xmin, ymin and ymax"));
        };
        q.origin = [xmin, if q.lower_left { ymin } else { ymax }];
    }
    Ok(q)
}

/// A box `[xmin, ymin, xmax, ymax]` in WGS84 as an Esri extent in the output's reference;
/// none is Esri's empty extent.
pub(super) fn extent(shape: &EsriShape, b: Option<[f64; 4]>) -> Value {
    match b {
        None => json!({"xmin": "NaN", "ymin": "NaN", "xmax": "NaN", "ymax": "NaN",
                       "spatialReference": shape.spatial_reference()}),
        Some([x0, y0, x1, y1]) => {
            let [a, b] = shape.project([x0, y0]);
            let [c, d] = shape.project([x1, y1]);
            json!({"xmin": a, "ymin": b, "xmax": c, "ymax": d,
                   "spatialReference": shape.spatial_reference()})
        }
    }
}

/// The members of geoQueryService's answer that a feature set is made from.
#[derive(Deserialize)]
struct Answer<'a> {
    #[serde(default)]
    metadata: Option<Meta>,
    count: Option<u64>,
    #[serde(rename = "objectIdFieldName")]
    id_name: Option<String>,
    #[serde(rename = "objectIds")]
    object_ids: Option<Vec<i64>>,
    statistics: Option<Vec<Map<String, Value>>>,
    #[serde(borrow, default)]
    features: Vec<Feature<'a>>,
}

#[derive(Deserialize, Default)]
struct Meta {
    #[serde(default)]
    fields: Vec<Value>,
    #[serde(rename = "limitExceeded", default)]
    limit_exceeded: bool,
    #[serde(rename = "idField")]
    id_field: Option<String>,
}

#[derive(Deserialize)]
struct Feature<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    properties: Option<&'a RawValue>,
    #[serde(borrow)]
    geometry: Option<&'a RawValue>,
}

fn read(answer: &[u8]) -> Result<Answer<'_>, EsriError> {
    serde_json::from_slice(answer)
        .map_err(|e| EsriError::new(500, "Error performing query operation.").detail(e.to_string()))
}

/// A feature's attributes: its properties as written, date fields as milliseconds.
fn attributes(out: &mut Vec<u8>, properties: Option<&RawValue>, dates: &[&str]) {
    let Some(raw) = properties else {
        out.extend_from_slice(b"{}");
        return;
    };
    if dates.is_empty() {
        out.extend_from_slice(raw.get().as_bytes());
        return;
    }
    let mut map: Map<String, Value> = serde_json::from_str(raw.get()).unwrap_or_default();
    for d in dates {
        if let Some(v) = map.get_mut(*d)
            && let Some(ms) = v.as_str().and_then(crate::time::parse_datetime)
        {
            *v = ms.into();
        }
    }
    let _ = serde_json::to_writer(&mut *out, &map);
}

/// `f=json`: a feature set, an id list, a count or statistics, as ArcGIS Server writes them.
/// `geometry_type` is the layer's, none when geometries are not returned.
pub(super) fn esri_json(
    answer: &[u8],
    geometry_type: Option<&str>,
    shape: &EsriShape,
) -> Result<Vec<u8>, EsriError> {
    let a = read(answer)?;
    let meta = a.metadata.unwrap_or_default();
    let id_field = meta.id_field.as_deref().unwrap_or("OBJECTID");
    if let Some(n) = a.count {
        return Ok(json!({ "count": n }).to_string().into_bytes());
    }
    if let Some(ids) = a.object_ids {
        let name = a.id_name.as_deref().unwrap_or(id_field);
        return Ok(json!({"objectIdFieldName": name, "objectIds": ids})
            .to_string()
            .into_bytes());
    }
    let fields = esri_fields(Some(&meta.fields), id_field);
    if let Some(stats) = a.statistics {
        let type_of = |name: &str| {
            fields
                .iter()
                .find(|f| f["name"] == name)
                .map(|f| f["type"].clone())
                .unwrap_or_else(|| "esriFieldTypeDouble".into())
        };
        let out_fields: Vec<Value> = stats
            .first()
            .map(|s| {
                s.keys()
                    .map(|k| json!({"name": k, "type": type_of(k), "alias": k}))
                    .collect()
            })
            .unwrap_or_default();
        let features: Vec<Value> = stats
            .into_iter()
            .map(|s| json!({ "attributes": s }))
            .collect();
        return Ok(
            json!({"displayFieldName": "", "fields": out_fields, "features": features})
                .to_string()
                .into_bytes(),
        );
    }
    let dates: Vec<&str> = meta
        .fields
        .iter()
        .filter(|f| f["type"] == "Date")
        .filter_map(|f| f["name"].as_str())
        .collect();
    // Only the fields the features carry (outFields).
    let carried: Option<Map<String, Value>> = a
        .features
        .first()
        .and_then(|f| f.properties)
        .and_then(|p| serde_json::from_str(p.get()).ok());
    let fields: Vec<Value> = match &carried {
        Some(c) => fields
            .into_iter()
            .filter(|f| f["name"].as_str().is_some_and(|n| c.contains_key(n)))
            .collect(),
        None => fields,
    };
    let mut out = Vec::with_capacity(answer.len() + 512);
    out.extend_from_slice(b"{\"objectIdFieldName\":");
    let _ = serde_json::to_writer(&mut out, id_field);
    out.extend_from_slice(b",\"uniqueIdField\":");
    let _ = serde_json::to_writer(
        &mut out,
        &json!({"name": id_field, "isSystemMaintained": true}),
    );
    out.extend_from_slice(b",\"globalIdFieldName\":\"\"");
    // With no geometries, no geometry type or reference (as ArcGIS Server and Koop answer).
    if let Some(kind) = geometry_type {
        out.extend_from_slice(b",\"geometryType\":");
        let _ = serde_json::to_writer(&mut out, esri_geometry_type(Some(kind)));
        out.extend_from_slice(b",\"spatialReference\":");
        let _ = serde_json::to_writer(&mut out, &shape.spatial_reference());
    }
    out.extend_from_slice(b",\"fields\":");
    let _ = serde_json::to_writer(&mut out, &fields);
    if meta.limit_exceeded {
        out.extend_from_slice(b",\"exceededTransferLimit\":true");
    }
    out.extend_from_slice(b",\"features\":[");
    for (i, f) in a.features.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"attributes\":");
        attributes(&mut out, f.properties, &dates);
        if let Some(g) = f.geometry.filter(|g| g.get() != "null") {
            let g: Value = serde_json::from_str(g.get()).unwrap_or(Value::Null);
            out.extend_from_slice(b",\"geometry\":");
            let _ = serde_json::to_writer(&mut out, &shape.geometry(&g));
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
    Ok(out)
}

/// `f=geojson`: a FeatureCollection, with `exceededTransferLimit` in its `properties` as
/// ArcGIS Server writes it. GeoJSON is WGS84: `outSR` and generalization do not apply.
pub(super) fn geojson(answer: &[u8], _shape: &EsriShape) -> Result<Vec<u8>, EsriError> {
    let a = read(answer)?;
    let meta = a.metadata.unwrap_or_default();
    if let Some(n) = a.count {
        return Ok(json!({"type": "FeatureCollection", "features": [],
                         "properties": {"count": n}})
        .to_string()
        .into_bytes());
    }
    if let Some(ids) = a.object_ids {
        return Ok(json!({"type": "FeatureCollection", "features": [],
                         "properties": {"objectIds": ids}})
        .to_string()
        .into_bytes());
    }
    if let Some(stats) = a.statistics {
        let features: Vec<Value> = stats
            .into_iter()
            .map(|s| json!({"type": "Feature", "properties": s, "geometry": null}))
            .collect();
        return Ok(json!({"type": "FeatureCollection", "features": features})
            .to_string()
            .into_bytes());
    }
    let mut out = Vec::with_capacity(answer.len());
    out.extend_from_slice(b"{\"type\":\"FeatureCollection\"");
    if meta.limit_exceeded {
        out.extend_from_slice(b",\"properties\":{\"exceededTransferLimit\":true}");
    }
    out.extend_from_slice(b",\"features\":[");
    for (i, f) in a.features.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"type\":\"Feature\"");
        if let Some(id) = f.id {
            out.extend_from_slice(b",\"id\":");
            out.extend_from_slice(id.get().as_bytes());
        }
        out.extend_from_slice(b",\"geometry\":");
        out.extend_from_slice(f.geometry.map_or("null", |g| g.get()).as_bytes());
        out.extend_from_slice(b",\"properties\":");
        out.extend_from_slice(f.properties.map_or("null", |p| p.get()).as_bytes());
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
    Ok(out)
}

/// Widen `bbox` by the geometries of an answer's features: how many features it had, and
/// whether more match past them.
pub(super) fn extend_box(
    answer: &[u8],
    bbox: &mut Option<[f64; 4]>,
) -> Result<(usize, bool), EsriError> {
    let a = read(answer)?;
    let more = a.metadata.as_ref().is_some_and(|m| m.limit_exceeded);
    for f in &a.features {
        let Some(g) = f.geometry else { continue };
        let g: Value = serde_json::from_str(g.get()).unwrap_or(Value::Null);
        visit(&g["coordinates"], &mut |[x, y]| {
            let b = bbox.get_or_insert([x, y, x, y]);
            *b = [b[0].min(x), b[1].min(y), b[2].max(x), b[3].max(y)];
        });
    }
    Ok((a.features.len(), more))
}

fn position(v: &Value) -> Option<[f64; 2]> {
    let a = v.as_array()?;
    Some([a.first()?.as_f64()?, a.get(1)?.as_f64()?])
}

/// Every position of a GeoJSON coordinate tree.
fn visit(v: &Value, f: &mut dyn FnMut([f64; 2])) {
    if let Some(p) = position(v) {
        f(p);
    } else if let Some(a) = v.as_array() {
        for x in a {
            visit(x, f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain() -> EsriShape {
        EsriShape::default()
    }

    #[test]
    fn a_feature_set_from_an_answer() {
        let answer = json!({"$version": "x", "type": "FeatureCollection",
            "metadata": {"fields": [{"name": "OBJECTID", "type": "Integer"},
                                    {"name": "name", "type": "String", "length": 20},
                                    {"name": "seen", "type": "Date"}],
                         "limitExceeded": true, "idField": "OBJECTID"},
            "features": [{"type": "Feature", "id": 7,
                          "properties": {"OBJECTID": 7, "name": "a", "seen": "1970-01-01T00:00:01.000Z"},
                          "geometry": {"type": "Point", "coordinates": [1.5, 2.5]}}]})
        .to_string();
        let out: Value =
            serde_json::from_slice(&esri_json(answer.as_bytes(), Some("Point"), &plain()).unwrap())
                .unwrap();
        assert_eq!(out["geometryType"], "esriGeometryPoint");
        assert_eq!(out["exceededTransferLimit"], true);
        assert_eq!(out["fields"][0]["type"], "esriFieldTypeOID");
        assert_eq!(out["fields"][1]["length"], 20);
        assert_eq!(out["fields"][2]["type"], "esriFieldTypeDate");
        assert_eq!(
            out["features"][0],
            json!({"attributes": {"OBJECTID": 7, "name": "a", "seen": 1000},
                   "geometry": {"x": 1.5, "y": 2.5}})
        );
        let gj: Value =
            serde_json::from_slice(&geojson(answer.as_bytes(), &plain()).unwrap()).unwrap();
        assert_eq!(gj["properties"]["exceededTransferLimit"], true);
        assert_eq!(gj["features"][0]["id"], 7);
        assert_eq!(
            gj["features"][0]["geometry"]["coordinates"],
            json!([1.5, 2.5])
        );
        let mut b = None;
        assert_eq!(extend_box(answer.as_bytes(), &mut b).unwrap(), (1, true));
        assert_eq!(b, Some([1.5, 2.5, 1.5, 2.5]));
    }
}
