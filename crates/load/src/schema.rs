//! A layer's schema from its first records: typed columns named for the properties, the
//! template and descriptor that publish them, and each record as the document they read.

use serde_json::{Map, Value, json};

use super::record::{Feature, Problem};
use crate::time::parse_datetime;

/// A column's type, as a template names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Int,
    Double,
    Boolean,
    DateTime,
    String,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Int => "int",
            Kind::Double => "double",
            Kind::Boolean => "boolean",
            Kind::DateTime => "dateTime",
            Kind::String => "string",
        }
    }

    /// The narrowest kind that holds `v`; `None` for null and empty text. Text is read for
    /// numbers and booleans only from a source whose values are all text (`text`).
    fn of(v: &Value, text: bool) -> Option<Kind> {
        match v {
            Value::Null => None,
            Value::Bool(_) => Some(Kind::Boolean),
            Value::Number(n) if n.is_i64() => Some(Kind::Int),
            Value::Number(_) => Some(Kind::Double),
            Value::String(s) => {
                let t = s.trim();
                if t.is_empty() {
                    None
                } else if !text {
                    Some(if t.len() >= 10 && parse_datetime(t).is_some() {
                        Kind::DateTime
                    } else {
                        Kind::String
                    })
                } else if t.parse::<i64>().is_ok() && !leading_zero(t) {
                    Some(Kind::Int)
                } else if t.parse::<f64>().is_ok_and(f64::is_finite) && !leading_zero(t) {
                    Some(Kind::Double)
                } else if t.eq_ignore_ascii_case("true") || t.eq_ignore_ascii_case("false") {
                    Some(Kind::Boolean)
                } else if t.len() >= 10 && parse_datetime(t).is_some() {
                    Some(Kind::DateTime)
                } else {
                    Some(Kind::String)
                }
            }
            Value::Array(_) | Value::Object(_) => Some(Kind::String),
        }
    }

    /// The kind that holds values of both.
    fn join(self, other: Kind) -> Kind {
        match (self, other) {
            (a, b) if a == b => a,
            (Kind::Int, Kind::Double) | (Kind::Double, Kind::Int) => Kind::Double,
            _ => Kind::String,
        }
    }
}

/// Codes such as ZIP or FIPS codes (`"01001"`) are text, not numbers that lose their zeros.
fn leading_zero(t: &str) -> bool {
    let digits = t.strip_prefix('-').unwrap_or(t);
    digits.len() > 1 && digits.starts_with('0') && !digits.starts_with("0.")
}

/// A column of the layer: its name in the view, the property it reads, its kind.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    pub name: String,
    pub property: String,
    pub kind: Kind,
}

/// The columns and geometry type of a layer, and where its OBJECTID comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct Schema {
    pub columns: Vec<Column>,
    /// The property holding integer ids, when the data has one; otherwise ids are assigned.
    pub id_property: Option<String>,
    /// `Point`, `Polyline` or `Polygon`: what most of the sample is.
    pub geometry_type: &'static str,
}

pub const OBJECTID: &str = "OBJECTID";

impl Schema {
    /// Infer the schema from sample records: each property's kind over the sample, named for
    /// the view (letters, digits and `_`, unique ignoring case).
    pub fn infer(sample: &[&Feature], text: bool) -> Schema {
        let mut kinds: Vec<(String, Option<Kind>)> = Vec::new();
        for f in sample {
            for (k, v) in &f.properties {
                let kind = Kind::of(v, text);
                match kinds.iter_mut().find(|(name, _)| name == k) {
                    Some((_, seen)) => {
                        *seen = match (*seen, kind) {
                            (Some(a), Some(b)) => Some(a.join(b)),
                            (a, b) => a.or(b),
                        }
                    }
                    None => kinds.push((k.clone(), kind)),
                }
            }
        }
        let id_property = kinds
            .iter()
            .find(|(k, kind)| k.eq_ignore_ascii_case(OBJECTID) && *kind == Some(Kind::Int))
            .map(|(k, _)| k.clone());
        let mut taken: Vec<String> = vec![OBJECTID.to_ascii_lowercase()];
        let mut columns = Vec::new();
        for (property, kind) in kinds {
            if Some(&property) == id_property.as_ref() || property.contains('\'') {
                continue;
            }
            let name = unique(column_name(&property), &mut taken);
            columns.push(Column {
                name,
                property,
                kind: kind.unwrap_or(Kind::String),
            });
        }
        let geometry_type = geometry_type(sample);
        Schema {
            columns,
            id_property,
            geometry_type,
        }
    }

    /// The template of the view `schema.view` over documents in `collection`.
    pub fn template(&self, schema: &str, view: &str, collection: &str) -> Value {
        let mut columns = vec![json!({
            "name": OBJECTID, "scalarType": "int", "val": format!("properties/{OBJECTID}")
        })];
        for c in &self.columns {
            columns.push(json!({
                "name": c.name,
                "scalarType": c.kind.name(),
                "val": format!("properties/{}", step(&c.property)),
                "nullable": true,
            }));
        }
        json!({"template": {
            "context": "/",
            "collections": [collection],
            "rows": [{"schemaName": schema, "viewName": view, "columns": columns}],
        }})
    }

    /// The layer entry of a service descriptor for the view.
    pub fn layer(&self, id: i64, name: &str, description: &str, schema: &str, view: &str) -> Value {
        let mut layer = json!({
            "id": id,
            "name": name,
            "description": description,
            "geometryType": self.geometry_type,
            "idField": OBJECTID,
            "schema": schema,
            "view": view,
            "geometry": {"format": "geojson", "coordinateSystem": "wgs84", "xpath": "/geometry"},
        });
        if let Some(c) = self.columns.iter().find(|c| c.kind == Kind::String) {
            layer["displayField"] = json!(c.name);
        }
        layer
    }

    /// The document of a record: a GeoJSON Feature whose properties are typed for their
    /// columns, with its `OBJECTID` (the record's own, or `ordinal`), as JSON bytes.
    /// Properties outside the schema are kept as they came. On a refusal the record keeps its
    /// properties (for its name in the report).
    pub fn document(&self, f: &mut Feature, ordinal: i64) -> Result<(i64, Vec<u8>), Problem> {
        let properties = &mut f.properties;
        let id = match &self.id_property {
            Some(p) => match properties.get(p) {
                None => ordinal,
                Some(v) => match fit(v, Kind::Int) {
                    Ok(Some(Value::Number(n))) => n.as_i64().unwrap_or(ordinal),
                    Ok(None) => v.as_i64().unwrap_or(ordinal),
                    _ if v.is_null() || v.as_str() == Some("") => ordinal,
                    _ => return Err(does_not_fit(p, OBJECTID, v, Kind::Int)),
                },
            },
            None => ordinal,
        };
        for c in &self.columns {
            if let Some(v) = properties.get_mut(&c.property) {
                match fit(v, c.kind) {
                    Ok(Some(typed)) => *v = typed,
                    Ok(None) => {}
                    Err(()) => return Err(does_not_fit(&c.property, &c.name, v, c.kind)),
                }
            }
        }
        if let Some(p) = &self.id_property {
            properties.shift_remove(p);
        }
        properties.insert(OBJECTID.into(), json!(id));
        #[derive(serde::Serialize)]
        struct Document<'a> {
            #[serde(rename = "type")]
            kind: &'static str,
            properties: &'a Map<String, Value>,
            geometry: &'a Value,
        }
        let bytes = serde_json::to_vec(&Document {
            kind: "Feature",
            properties: &f.properties,
            geometry: &f.geometry,
        })
        .map_err(|e| Problem::BadJson(e.to_string()))?;
        Ok((id, bytes))
    }
}

impl Schema {
    /// The schema of a template a user wrote (`--schema`): its columns that read
    /// `properties/<name>`, typed by their `scalarType`; the geometry type is `geometry_type`.
    pub fn from_template(t: &Value, geometry_type: &'static str) -> Result<Schema, String> {
        let columns = t
            .pointer("/template/rows/0/columns")
            .and_then(Value::as_array)
            .ok_or("the schema file is not a template with template.rows[0].columns")?;
        let mut schema = Schema {
            columns: Vec::new(),
            id_property: None,
            geometry_type,
        };
        for (i, c) in columns.iter().enumerate() {
            let name = c["name"]
                .as_str()
                .ok_or_else(|| format!("columns[{i}] has no name"))?;
            let val = c["val"]
                .as_str()
                .ok_or_else(|| format!("columns[{i}] has no val"))?;
            let property = val.strip_prefix("properties/").ok_or_else(|| {
                format!("columns[{i}].val {val:?} does not read properties/<name>")
            })?;
            let property = property
                .strip_prefix("node('")
                .and_then(|p| p.strip_suffix("')"))
                .unwrap_or(property)
                .to_string();
            if name == OBJECTID {
                schema.id_property = Some(property);
                continue;
            }
            let kind = match c["scalarType"].as_str().unwrap_or("string") {
                "int" | "integer" | "long" | "short" | "unsignedInt" | "unsignedLong" => Kind::Int,
                "double" | "float" | "decimal" => Kind::Double,
                "boolean" => Kind::Boolean,
                "dateTime" | "date" => Kind::DateTime,
                _ => Kind::String,
            };
            schema.columns.push(Column {
                name: name.to_string(),
                property,
                kind,
            });
        }
        Ok(schema)
    }
}

fn does_not_fit(property: &str, column: &str, v: &Value, kind: Kind) -> Problem {
    Problem::DoesNotFit {
        property: property.to_string(),
        column: column.to_string(),
        value: v.to_string(),
        kind: kind.name(),
    }
}

/// The geometry type most of `sample` has, as a descriptor names it.
pub fn geometry_type(sample: &[&Feature]) -> &'static str {
    let mut counts = [0usize; 3];
    for f in sample {
        match f.geometry.get("type").and_then(Value::as_str) {
            Some("Point" | "MultiPoint") => counts[0] += 1,
            Some("LineString" | "MultiLineString") => counts[1] += 1,
            _ => counts[2] += 1,
        }
    }
    let most = (0..3).max_by_key(|i| (counts[*i], 3 - i)).unwrap_or(0);
    ["Point", "Polyline", "Polygon"][most]
}

/// `v` as a value of a `kind` column: numbers from text, text from anything; null for
/// empty text. `None` when `v` is that already.
fn fit(v: &Value, kind: Kind) -> Result<Option<Value>, ()> {
    let typed = match (kind, v) {
        (_, Value::Null) => return Ok(None),
        (_, Value::String(s)) if s.trim().is_empty() => Value::Null,
        (Kind::Int, Value::Number(n)) if n.is_i64() => return Ok(None),
        (Kind::Int, Value::Number(n)) => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => json!(f as i64),
            _ => return Err(()),
        },
        (Kind::Int, Value::String(s)) => json!(s.trim().parse::<i64>().map_err(|_| ())?),
        (Kind::Double, Value::Number(_)) => return Ok(None),
        (Kind::Double, Value::String(s)) => json!(
            s.trim()
                .parse::<f64>()
                .ok()
                .filter(|f| f.is_finite())
                .ok_or(())?
        ),
        (Kind::Boolean, Value::Bool(_)) => return Ok(None),
        (Kind::Boolean, Value::String(s)) => match s.trim().to_ascii_lowercase().as_str() {
            "true" => json!(true),
            "false" => json!(false),
            _ => return Err(()),
        },
        (Kind::DateTime, Value::String(s)) if parse_datetime(s.trim()).is_some() => {
            if s.trim().len() == s.len() {
                return Ok(None);
            }
            json!(s.trim())
        }
        (Kind::String, Value::String(_)) => return Ok(None),
        (Kind::String, _) => json!(v.to_string()),
        _ => return Err(()),
    };
    Ok(Some(typed))
}

/// A property name as a column name: letters, digits and `_`, not starting with a digit.
pub(super) fn column_name(property: &str) -> String {
    let mut name: String = property
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert(0, '_');
    }
    name
}

/// `name`, or `name_2`, `name_3`… when a column of that name (ignoring case) exists.
fn unique(name: String, taken: &mut Vec<String>) -> String {
    let mut candidate = name.clone();
    let mut n = 1;
    while taken.contains(&candidate.to_ascii_lowercase()) {
        n += 1;
        candidate = format!("{name}_{n}");
    }
    taken.push(candidate.to_ascii_lowercase());
    candidate
}

/// A template path step for a property: the plain name when a step can hold it.
fn step(property: &str) -> String {
    let plain = property
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && property
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if plain {
        property.to_string()
    } else {
        format!("node('{property}')")
    }
}

/// The GeoJSON geometry of WKT text.
pub fn from_wkt(text: &str) -> Result<Value, String> {
    use wkt::TryFromWkt;
    let g: geo::Geometry<f64> = geo::Geometry::try_from_wkt_str(text).map_err(|e| e.to_string())?;
    Ok(crate::spatial::to_geojson(&g))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feature(props: Value) -> Feature {
        Feature {
            properties: props.as_object().unwrap().clone(),
            geometry: json!({"type": "Point", "coordinates": [1, 2]}),
            row: false,
        }
    }

    #[test]
    fn kinds_from_json_and_text() {
        let a = feature(json!({"n": 1, "x": 1, "s": "a", "b": true, "code": "01001",
            "t": "2020-01-02T03:04:05Z", "ct": "7", "cf": "2.5", "e": ""}));
        let b = feature(
            json!({"n": 2, "x": 2.5, "s": "b", "b": false, "code": "01003",
            "t": "2021-01-02T03:04:05Z", "ct": "8", "cf": "3", "e": null}),
        );
        let s = Schema::infer(&[&a, &b], true);
        let kinds: Vec<(&str, &str)> = s
            .columns
            .iter()
            .map(|c| (c.name.as_str(), c.kind.name()))
            .collect();
        assert_eq!(
            kinds,
            [
                ("n", "int"),
                ("x", "double"),
                ("s", "string"),
                ("b", "boolean"),
                ("code", "string"),
                ("t", "dateTime"),
                ("ct", "int"),
                ("cf", "double"),
                ("e", "string"),
            ]
        );
        assert_eq!(s.geometry_type, "Point");
        assert_eq!(s.id_property, None);
    }

    #[test]
    fn names_are_columns_and_unique() {
        let f = feature(json!({"Pop 2020": 1, "pop_2020": 2, "1st": 3, "objectid": 9}));
        let s = Schema::infer(&[&f], true);
        let names: Vec<&str> = s.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["Pop_2020", "pop_2020_2", "_1st"]);
        assert_eq!(s.id_property.as_deref(), Some("objectid"));
        let t = s.template("svc", "v", "c");
        assert_eq!(
            t["template"]["rows"][0]["columns"][1]["val"],
            "properties/node('Pop 2020')"
        );
    }

    #[test]
    fn documents_are_typed_and_misfits_refused() {
        let s = Schema::infer(&[&feature(json!({"ct": "7", "name": "a"}))], true);
        let (id, doc) = s
            .document(&mut feature(json!({"ct": "8", "name": "b"})), 5)
            .unwrap();
        assert_eq!(id, 5);
        let doc: Value = serde_json::from_slice(&doc).unwrap();
        assert_eq!(
            doc["properties"],
            json!({"ct": 8, "name": "b", "OBJECTID": 5})
        );
        assert_eq!(doc["type"], "Feature");
        let err = s
            .document(&mut feature(json!({"ct": "many", "name": "c"})), 6)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "property \"ct\" value \"many\" does not fit its column ct (int)"
        );
    }

    #[test]
    fn wkt_becomes_geojson() {
        assert_eq!(
            from_wkt("POINT (178.551 -18.206)").unwrap(),
            json!({"type": "Point", "coordinates": [178.551, -18.206]})
        );
        assert!(from_wkt("POINT (1").is_err());
    }
}
