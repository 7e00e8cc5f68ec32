//! The demo's sample layers, from the repository's `examples/`: US counties (polygons),
//! GeoNames places (points) and the interface's mollusks, each with its template and
//! descriptor. They are written to a stopped server's store; the server then builds its views
//! and spatial indexes from the store when it starts, as it always does.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use serde_json::{Value, json};

use crate::acl::{Caller, Capability, Permissions, Role};
use crate::features::descriptor::DESCRIPTOR_COLLECTION;
use crate::features::template::TEMPLATE_COLLECTION;
use crate::store::{Format, Op, PutDocument, Store};

/// Documents per write request (one commit each).
const BATCH: usize = 2000;

/// The `examples/` folder of the source tree this binary was built from.
pub fn default_examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// Readable and writable by both the REST roles and the feature-service roles.
fn demo_permissions() -> Permissions {
    let mut p = Permissions::new();
    p.grant(Role::RestReader, Capability::Read);
    p.grant(Role::RestWriter, Capability::Update);
    p.grant(Role::GeoReader, Capability::Read);
    p.grant(Role::GeoWriter, Capability::Update);
    p
}

fn put(uri: String, doc: &Value, collection: &str, permissions: Permissions) -> Op {
    Op::PutDocument(PutDocument {
        uri,
        content: Bytes::from(doc.to_string()),
        format: Format::Json,
        collections: Some(vec![collection.to_string()]),
        permissions: Some(permissions),
        default_permissions: permissions,
    })
}

fn read_json(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn write_all(store: &Store, ops: Vec<Op>) -> Result<(), String> {
    let caller = Caller::system();
    let mut ops = ops;
    while !ops.is_empty() {
        let rest = ops.split_off(ops.len().min(BATCH));
        store
            .write_blocking(&caller, ops)
            .map_err(|e| e.to_string())?;
        ops = rest;
    }
    Ok(())
}

/// The template and descriptor of a layer folder (or of a gds sample).
fn definitions(name: &str, dir: &Path) -> Result<Vec<Op>, String> {
    Ok(vec![
        put(
            format!("/demo/templates/{name}.json"),
            &read_json(&dir.join("template.json"))?,
            TEMPLATE_COLLECTION,
            Permissions::document_default(),
        ),
        put(
            format!("/demo/services/{name}.json"),
            &read_json(&dir.join("descriptor.json"))?,
            DESCRIPTOR_COLLECTION,
            Permissions::descriptor_default(),
        ),
    ])
}

/// Load every sample layer; returns (service, documents) per layer.
pub fn load_examples(store: &Store, examples: &Path) -> Result<Vec<(String, usize)>, String> {
    let data = examples.join("data");
    let perms = demo_permissions();
    let mut loaded = Vec::new();

    // US counties: one document per county feature.
    let counties = read_json(&data.join("real/us-counties.geojson"))?;
    let mut ops = definitions("us-counties", &examples.join("layers/us-counties"))?;
    let features = counties["features"].as_array().cloned().unwrap_or_default();
    for f in &features {
        let fips = f["id"].as_str().unwrap_or_default();
        ops.push(put(
            format!("/demo/counties/{fips}.json"),
            f,
            "demo-counties",
            perms,
        ));
    }
    write_all(store, ops)?;
    loaded.push(("US Counties".to_string(), features.len()));

    // GeoNames places: one document per CSV row.
    let mut ops = definitions("places", &examples.join("layers/places"))?;
    let mut reader = csv::Reader::from_path(data.join("real/geonames-cities1000.csv"))
        .map_err(|e| format!("geonames: {e}"))?;
    let mut places = 0;
    for (i, rec) in reader.records().enumerate() {
        let rec = rec.map_err(|e| format!("geonames row {i}: {e}"))?;
        let (Ok(lat), Ok(lon)) = (rec[0].parse::<f64>(), rec[1].parse::<f64>()) else {
            continue;
        };
        let doc = json!({
            "OBJECTID": i + 1,
            "name": &rec[2],
            "admin1": &rec[3],
            "admin2": &rec[4],
            "cc": &rec[5],
            "geometry": {"type": "Point", "coordinates": [lon, lat]},
        });
        ops.push(put(
            format!("/demo/places/{}.json", i + 1),
            &doc,
            "demo-places",
            perms,
        ));
        places += 1;
    }
    write_all(store, ops)?;
    loaded.push(("World Places".to_string(), places));

    // The interface's sample: mollusk CSV rows with a point geometry built from X, Y.
    let dir = data.join("gds/mollusks");
    let mut ops = definitions("mollusks", &dir)?;
    let mut reader =
        csv::Reader::from_path(dir.join("mollusks.csv")).map_err(|e| format!("mollusks: {e}"))?;
    let headers = reader.headers().map_err(|e| e.to_string())?.clone();
    let mut mollusks = 0;
    for rec in reader.records() {
        let rec = rec.map_err(|e| format!("mollusks: {e}"))?;
        let mut doc = serde_json::Map::new();
        for (h, v) in headers.iter().zip(rec.iter()) {
            doc.insert(h.to_string(), Value::String(v.to_string()));
        }
        let num = |k: &str| {
            doc.get(k)
                .and_then(Value::as_str)
                .and_then(|s| s.parse::<f64>().ok())
        };
        let (Some(x), Some(y)) = (num("X"), num("Y")) else {
            continue;
        };
        let id = doc
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        doc.insert("X".into(), json!(x));
        doc.insert("Y".into(), json!(y));
        doc.insert(
            "geometry".into(),
            json!({"type": "Point", "coordinates": [x, y]}),
        );
        ops.push(put(
            format!("/data/{id}.json"),
            &Value::Object(doc),
            "mollusks",
            perms,
        ));
        mollusks += 1;
    }
    write_all(store, ops)?;
    loaded.push(("ArcGIS Hub Data".to_string(), mollusks));

    // Sightings: an empty layer over the envelopes of the demo's input flow, deployed here.
    let files = crate::flow::project::read_dir(&examples.join("project"))
        .map_err(|e| format!("the demo project: {}", e.join("; ")))?;
    crate::flow::deploy_blocking(store, &files)
        .map_err(|e| format!("the demo project: {}", e.join("; ")))?;
    write_all(
        store,
        definitions("sightings", &examples.join("layers/sightings"))?,
    )?;
    loaded.push(("Sightings (through the Sighting/Load flow)".to_string(), 0));
    Ok(loaded)
}
