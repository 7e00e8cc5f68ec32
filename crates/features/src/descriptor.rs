//! Service descriptors ("models", INTERFACE §2.4, docs/contract.md §5): parsing, validation, the
//! listing entry, and layer lookup.

use serde_json::{Map, Value, json};

use super::path::Path;
use super::template::ViewKey;
use crate::acl::Permissions;

/// The collection that marks a document as a service descriptor.
pub use crate::acl::DESCRIPTOR_COLLECTION;

#[derive(Debug, Clone)]
pub struct Layer {
    pub id: i64,
    pub name: String,
    pub description: String,
    pub geometry_type: String,
    pub view: ViewKey,
    pub schema_name: String,
    pub view_name: String,
    /// Where the geometry is in each document.
    pub geometry_path: Path,
    pub id_field: String,
    pub display_field: Option<String>,
    /// `timeInfo.startTimeField` / `endTimeField`.
    pub time_fields: Option<(String, Option<String>)>,
    /// The layer object as written, for the layer descriptor response.
    pub raw: Map<String, Value>,
}

#[derive(Debug, Clone)]
pub struct Descriptor {
    pub uri: String,
    pub name: String,
    pub description: String,
    pub layers: Vec<Layer>,
    /// The document's permissions: only readers see the descriptor.
    pub permissions: Permissions,
    /// The document as written (`rs:id` returns it whole).
    pub raw: Value,
}

fn text<'a>(v: &'a Value, key: &str, at: &str) -> Result<&'a str, String> {
    match v.get(key) {
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(format!("descriptor: {at}.{key} must be a string")),
        None => Err(format!("descriptor: {at}.{key} is required")),
    }
}

/// Layer ids compare loosely: `"3"` is layer 3.
pub(crate) fn layer_id(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n
            .as_i64()
            .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

pub(crate) fn parse_descriptor(
    uri: &str,
    doc: &Value,
    permissions: Permissions,
) -> Result<Descriptor, String> {
    if !doc.is_object() {
        return Err("descriptor: the document must be a JSON object".into());
    }
    let info = doc
        .get("info")
        .filter(|i| i.is_object())
        .ok_or("descriptor: info is required (an object with name and description)")?;
    let name = text(info, "name", "info")?;
    if name.trim().is_empty() {
        return Err("descriptor: info.name must not be empty".into());
    }
    let description = text(info, "description", "info")?;
    let layers_json = match doc.get("layers") {
        Some(Value::Array(a)) => a,
        Some(_) => return Err("descriptor: layers must be an array".into()),
        None => return Err("descriptor: layers is required".into()),
    };
    let mut layers: Vec<Layer> = Vec::new();
    for (i, l) in layers_json.iter().enumerate() {
        let at = format!("layers[{i}]");
        let Some(obj) = l.as_object() else {
            return Err(format!("descriptor: {at} must be an object"));
        };
        let id = match l.get("id") {
            None => return Err(format!("descriptor: {at}.id is required")),
            Some(v) => layer_id(v)
                .filter(|_| v.is_number())
                .ok_or_else(|| format!("descriptor: {at}.id must be an integer"))?,
        };
        if layers.iter().any(|x| x.id == id) {
            return Err(format!("descriptor: layer id {id} appears twice"));
        }
        let geometry = l.get("geometry").filter(|g| g.is_object()).ok_or_else(|| {
            format!("descriptor: {at}.geometry is required (format, coordinateSystem, xpath)")
        })?;
        let gat = format!("{at}.geometry");
        let format = text(geometry, "format", &gat)?;
        if !format.eq_ignore_ascii_case("geojson") {
            return Err(format!(
                "descriptor: {gat}.format {format:?} is not supported (geojson)"
            ));
        }
        let crs = text(geometry, "coordinateSystem", &gat)?;
        if !crs.eq_ignore_ascii_case("wgs84") {
            return Err(format!(
                "descriptor: {gat}.coordinateSystem {crs:?} is not supported (wgs84)"
            ));
        }
        let xpath = text(geometry, "xpath", &gat)?;
        let geometry_path =
            Path::parse(xpath).map_err(|e| format!("descriptor: {gat}.xpath: {e}"))?;
        let schema = text(l, "schema", &at)?;
        let view = text(l, "view", &at)?;
        let time_fields = l.get("timeInfo").and_then(|t| {
            let start = t.get("startTimeField")?.as_str()?.to_string();
            let end = t
                .get("endTimeField")
                .and_then(Value::as_str)
                .map(str::to_string);
            Some((start, end))
        });
        layers.push(Layer {
            id,
            name: text(l, "name", &at)?.to_string(),
            description: text(l, "description", &at)?.to_string(),
            geometry_type: text(l, "geometryType", &at)?.to_string(),
            view: ViewKey::new(schema, view),
            schema_name: schema.to_string(),
            view_name: view.to_string(),
            geometry_path,
            id_field: l
                .get("idField")
                .and_then(Value::as_str)
                .unwrap_or("OBJECTID")
                .to_string(),
            display_field: l
                .get("displayField")
                .and_then(Value::as_str)
                .map(str::to_string),
            time_fields,
            raw: obj.clone(),
        });
    }
    Ok(Descriptor {
        uri: uri.to_string(),
        name: name.to_string(),
        description: description.to_string(),
        layers,
        permissions,
        raw: doc.clone(),
    })
}

impl Descriptor {
    /// The model listing entry (INTERFACE §2.5): no schema, view or geometry.
    pub fn listing(&self) -> Value {
        json!({
            "id": self.name,
            "name": self.name,
            "description": self.description,
            "layers": self.layers.iter().map(|l| json!({
                "id": l.id,
                "name": l.name,
                "description": l.description,
                "geometryType": l.geometry_type,
            })).collect::<Vec<_>>(),
        })
    }

    pub fn layer(&self, id: i64) -> Option<&Layer> {
        self.layers.iter().find(|l| l.id == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Value {
        serde_json::from_str(include_str!(
            "../../../examples/data/gds/mollusks/descriptor.json"
        ))
        .unwrap()
    }

    #[test]
    fn parses_the_samples() {
        let d = parse_descriptor("/d.json", &sample(), Permissions::new()).unwrap();
        assert_eq!(d.name, "ArcGIS Hub Data");
        assert_eq!(d.layers[0].id, 0);
        assert_eq!(d.layers[0].view, ViewKey::new("arcgis_hub", "mollusks"));
        assert_eq!(d.layers[0].geometry_path.text(), "//geometry");
        let listing = d.listing();
        assert_eq!(listing["layers"][0]["geometryType"], "Point");
        assert!(listing["layers"][0].get("schema").is_none());
        let gkg: Value = serde_json::from_str(include_str!(
            "../../../examples/data/gds/gkg/descriptor.json"
        ))
        .unwrap();
        let d = parse_descriptor("/g.json", &gkg, Permissions::new()).unwrap();
        assert_eq!(d.layers[0].id, 3);
        assert_eq!(d.layers[0].display_field.as_deref(), Some("name"));
    }

    #[test]
    fn names_missing_fields() {
        type Mutation<'a> = (&'a str, &'a dyn Fn(&mut Value));
        let cases: [Mutation; 6] = [
            ("info.name is required", &|v| {
                v["info"].as_object_mut().unwrap().remove("name");
            }),
            ("layers is required", &|v| {
                v.as_object_mut().unwrap().remove("layers");
            }),
            ("layers[0].id must be an integer", &|v| {
                v["layers"][0]["id"] = json!("zero")
            }),
            ("layers[0].view is required", &|v| {
                v["layers"][0].as_object_mut().unwrap().remove("view");
            }),
            ("layers[0].geometry.xpath is required", &|v| {
                v["layers"][0]["geometry"]
                    .as_object_mut()
                    .unwrap()
                    .remove("xpath");
            }),
            ("layers[0].geometry is required", &|v| {
                v["layers"][0].as_object_mut().unwrap().remove("geometry");
            }),
        ];
        for (want, mutate) in cases {
            let mut v = sample();
            mutate(&mut v);
            let e = parse_descriptor("/d", &v, Permissions::new()).unwrap_err();
            assert!(e.contains(want), "{e} (wanted {want})");
        }
    }

    #[test]
    fn loose_layer_ids() {
        assert_eq!(layer_id(&json!("3")), Some(3));
        assert_eq!(layer_id(&json!(3)), Some(3));
        assert_eq!(layer_id(&json!(3.0)), Some(3));
        assert_eq!(layer_id(&json!("x")), None);
    }
}
