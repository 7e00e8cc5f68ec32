//! The feature service over real HTTP: templates, descriptors, modelService and
//! geoQueryService on the interface's sample (mollusks) and on the gkg points, lines and
//! polygons. Expected answers are computed independently: from the CSV rows in this file,
//! and from shapely/GEOS for the spatial relations (`tests/fixtures/gkg_relations.json`).

use crate::common;

use std::collections::BTreeMap;

use common::*;
use serde_json::{Value, json};

const TDE: &str = "http://marklogic.com/xdmp/tde";
const SERVICES: &str = "http://marklogic.com/feature-services";

/// A mollusk CSV row as the test sees it.
#[derive(Debug, Clone)]
struct Mollusk {
    id: i64,
    kind: String,
    citation: String,
    x: f64,
    y: f64,
    doc: Value,
}

fn mollusks() -> Vec<Mollusk> {
    let mut r = csv::Reader::from_path(data_dir().join("gds/mollusks/mollusks.csv")).unwrap();
    let headers = r.headers().unwrap().clone();
    r.records()
        .map(|rec| {
            let rec = rec.unwrap();
            let mut doc = serde_json::Map::new();
            for (h, v) in headers.iter().zip(rec.iter()) {
                doc.insert(h.to_string(), Value::String(v.to_string()));
            }
            let x: f64 = doc["X"].as_str().unwrap().parse().unwrap();
            let y: f64 = doc["Y"].as_str().unwrap().parse().unwrap();
            let id: i64 = doc["id"].as_str().unwrap().parse().unwrap();
            doc.insert("X".into(), json!(x));
            doc.insert("Y".into(), json!(y));
            doc.insert("id".into(), json!(id));
            doc.insert(
                "geometry".into(),
                json!({"type": "Point", "coordinates": [x, y]}),
            );
            Mollusk {
                id,
                kind: doc["type"].as_str().unwrap().to_string(),
                citation: doc["bibliographicCitation"].as_str().unwrap().to_string(),
                x,
                y,
                doc: Value::Object(doc),
            }
        })
        .collect()
}

fn put(c: &mut Client, uri: &str, params: &str, body: &Value) -> Response {
    c.put_json(
        &format!("/v1/documents?uri={}{params}", enc(uri)),
        &body.to_string(),
    )
}

fn read_json(rel: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(data_dir().join(rel)).unwrap()).unwrap()
}

fn load_mollusks(c: &mut Client, rows: &[Mollusk]) {
    for m in rows {
        let r = put(
            c,
            &format!("/data/{}.json", m.id),
            "&collection=mollusks",
            &m.doc,
        );
        assert!(r.status == 201 || r.status == 204, "{}", r.text());
    }
}

fn mollusk_definitions(c: &mut Client) {
    let r = put(
        c,
        "/tde/mollusks.json",
        &format!("&collection={}", enc(TDE)),
        &read_json("gds/mollusks/template.json"),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let r = put(
        c,
        "/services/mollusks.json",
        &format!("&collection={}", enc(SERVICES)),
        &read_json("gds/mollusks/descriptor.json"),
    );
    assert_eq!(r.status, 201, "{}", r.text());
}

fn query(c: &mut Client, body: Value) -> Response {
    c.post_json("/v1/resources/geoQueryService", &body.to_string())
}

/// The request of INTERFACE §4.3.
fn point_query(service: &str, layer: Value, x: f64, y: f64) -> Value {
    json!({
        "params": {"id": service, "layer": layer, "method": "query"},
        "query": {
            "returnGeometry": 1,
            "geometryType": "gisGeometryPoint",
            "spatialRel": "gisSpatialRelContains",
            "extension": {"geometry": {"type": "Point", "coordinates": [x, y]}}
        }
    })
}

fn ids(v: &Value) -> Vec<i64> {
    let mut out: Vec<i64> = v["features"]
        .as_array()
        .unwrap_or_else(|| panic!("no features: {v}"))
        .iter()
        .map(|f| f["id"].as_i64().unwrap())
        .collect();
    out.sort();
    out
}

/// A server with the mollusks layer defined and the first `n` of its 277 rows loaded, with
/// clients of the admin and of the geo reader.
struct Mollusks {
    srv: TestServer,
    admin: Client,
    geo: Client,
    rows: Vec<Mollusk>,
}

impl Mollusks {
    fn loaded(n: usize) -> Mollusks {
        let srv = TestServer::start();
        let mut admin = srv.client(ADMIN);
        let geo = srv.client(GEO);
        let rows = mollusks();
        mollusk_definitions(&mut admin);
        load_mollusks(&mut admin, &rows[..n.min(rows.len())]);
        Mollusks {
            srv,
            admin,
            geo,
            rows,
        }
    }
}

#[test]
fn mollusks_end_to_end() {
    let srv = TestServer::start();
    let mut admin = srv.client(ADMIN);
    let mut geo = srv.client(GEO);
    let rows = mollusks();
    assert_eq!(rows.len(), 277);
    // Documents first, then the template: rows of documents stored before it count.
    load_mollusks(&mut admin, &rows);
    mollusk_definitions(&mut admin);

    // 1. The model listing.
    let r = geo.get("/v1/resources/modelService");
    assert_eq!(r.status, 200, "{}", r.text());
    let listing = r.json();
    assert_eq!(listing["$version"], env!("CARGO_PKG_VERSION"));
    let descriptor = read_json("gds/mollusks/descriptor.json");
    assert_eq!(
        listing["models"],
        json!({"ArcGIS Hub Data": {
            "id": "ArcGIS Hub Data",
            "name": "ArcGIS Hub Data",
            "description": descriptor["info"]["description"],
            "layers": [{
                "id": 0,
                "name": descriptor["layers"][0]["name"],
                "description": descriptor["layers"][0]["description"],
                "geometryType": "Point"
            }]
        }})
    );
    let one = geo
        .get(&format!(
            "/v1/resources/modelService?rs:id={}",
            enc("ArcGIS Hub Data")
        ))
        .json();
    assert_eq!(one["layers"][0]["view"], "mollusks");
    assert_eq!(one["info"], descriptor["info"]);

    // 2. The point query of INTERFACE §4.3, at the README's point and at every distinct
    // location: exactly the records at that point.
    let mut by_point: BTreeMap<(u64, u64), Vec<i64>> = BTreeMap::new();
    for m in &rows {
        by_point
            .entry((m.x.to_bits(), m.y.to_bits()))
            .or_default()
            .push(m.id);
    }
    let fiji = rows
        .iter()
        .filter(|m| m.x == 178.03333 && m.y == -18.36667)
        .count();
    assert!(fiji > 1, "the README's point has several records");
    for ((xb, yb), want) in &by_point {
        let (x, y) = (f64::from_bits(*xb), f64::from_bits(*yb));
        let r = query(&mut geo, point_query("ArcGIS Hub Data", json!(0), x, y));
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        let mut want = want.clone();
        want.sort();
        assert_eq!(ids(&v), want, "at ({x}, {y})");
        let f = &v["features"][0];
        assert_eq!(f["type"], "Feature");
        assert_eq!(
            f["geometry"],
            json!({"type": "Point", "coordinates": [x, y]})
        );
        let m = rows
            .iter()
            .find(|m| m.id == f["id"].as_i64().unwrap())
            .unwrap();
        assert_eq!(f["properties"]["citation"], m.citation.as_str());
        assert_eq!(f["properties"]["featureType"], m.kind.as_str());
        assert_eq!(f["properties"]["latitude"], json!(y));
    }
    // The response's envelope.
    let v = query(
        &mut geo,
        point_query("ArcGIS Hub Data", json!("0"), 178.03333, -18.36667),
    )
    .json();
    assert_eq!(v["type"], "FeatureCollection");
    assert!(v["$timestamp"].as_str().unwrap().ends_with('Z'));
    assert_eq!(v["metadata"]["idField"], "OBJECTID");
    assert_eq!(v["metadata"]["limitExceeded"], false);
    assert_eq!(
        v["metadata"]["fields"][0],
        json!({"name": "OBJECTID", "type": "Integer", "alias": "OBJECTID"})
    );
    assert_eq!(
        v["metadata"]["fields"][2],
        json!({"name": "citation", "type": "String", "alias": "citation", "length": 1024})
    );
    // No point there: no features.
    let v = query(&mut geo, point_query("ArcGIS Hub Data", json!(0), 0.0, 0.0)).json();
    assert_eq!(ids(&v), Vec::<i64>::new());
}

fn base(q: Value) -> Value {
    json!({"params": {"id": "ArcGIS Hub Data", "layer": 0, "method": "query"}, "query": q})
}

#[test]
fn where_order_paging_and_statistics() {
    let Mollusks {
        srv: _srv,
        admin: _,
        mut geo,
        rows,
    } = Mollusks::loaded(usize::MAX);

    // where: computed by filtering the CSV rows here.
    type Case<'a> = (&'a str, Box<dyn Fn(&Mollusk) -> bool>);
    let cases: Vec<Case> = vec![
        ("1=1", Box::new(|_| true)),
        (
            "latitude < -18.3 AND longitude > 178.0",
            Box::new(|m| m.y < -18.3 && m.x > 178.0),
        ),
        (
            "citation LIKE '%Chicoreus%' OR OBJECTID IN (1, 2, 3)",
            Box::new(|m| m.citation.contains("Chicoreus") || [1, 2, 3].contains(&m.id)),
        ),
        (
            "NOT (OBJECTID BETWEEN 10 AND 200)",
            Box::new(|m| !(10..=200).contains(&m.id)),
        ),
        (
            "UPPER(citation) LIKE 'ASPELLA%' AND latitude IS NOT NULL",
            Box::new(|m| m.citation.to_uppercase().starts_with("ASPELLA")),
        ),
        (
            "featureType <> 'PhysicalObject'",
            Box::new(|m| m.kind != "PhysicalObject"),
        ),
    ];
    for (clause, keep) in cases {
        let mut want: Vec<i64> = rows.iter().filter(|m| keep(m)).map(|m| m.id).collect();
        want.sort();
        let r = query(
            &mut geo,
            base(json!({"where": clause, "returnIdsOnly": true})),
        );
        assert_eq!(r.status, 200, "{clause}: {}", r.text());
        let v = r.json();
        let got: Vec<i64> = v["objectIds"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_i64().unwrap())
            .collect();
        assert_eq!(got, want, "{clause}");
        let count = query(
            &mut geo,
            base(json!({"where": clause, "returnCountOnly": "true"})),
        )
        .json();
        assert_eq!(
            count["count"].as_u64().unwrap() as usize,
            want.len(),
            "{clause}"
        );
        assert_eq!(count["features"], json!([]));
    }

    // orderByFields and paging, against a sort done here.
    let mut sorted = rows.clone();
    sorted.sort_by(|a, b| b.y.total_cmp(&a.y).then(a.id.cmp(&b.id)));
    let want: Vec<i64> = sorted.iter().skip(20).take(15).map(|m| m.id).collect();
    let v = query(
        &mut geo,
        base(json!({"orderByFields": "latitude DESC", "resultOffset": "20", "resultRecordCount": 15, "outFields": "OBJECTID,latitude"})),
    )
    .json();
    let got: Vec<i64> = v["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_i64().unwrap())
        .collect();
    assert_eq!(got, want);
    assert_eq!(v["metadata"]["limitExceeded"], true);
    assert_eq!(
        v["features"][0]["properties"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        vec!["OBJECTID", "latitude"]
    );
    assert_eq!(
        v["features"][0]["geometry"],
        Value::Null,
        "returnGeometry defaults to false"
    );
    // The last page is not exceeded; default order is ascending id.
    let v = query(
        &mut geo,
        base(json!({"resultOffset": 270, "resultRecordCount": 15})),
    )
    .json();
    let mut all: Vec<i64> = rows.iter().map(|m| m.id).collect();
    all.sort();
    assert_eq!(ids(&v), all[270..].to_vec());
    assert_eq!(v["metadata"]["limitExceeded"], false);

    // Statistics, grouped, as a JSON string the way Koop sends them.
    let stats = r#"[{"statisticType":"count","onStatisticField":"OBJECTID","outStatisticFieldName":"n"},
                    {"statisticType":"avg","onStatisticField":"latitude"},
                    {"statisticType":"min","onStatisticField":"longitude","outStatisticFieldName":"west"},
                    {"statisticType":"max","onStatisticField":"citation","outStatisticFieldName":"last"},
                    {"statisticType":"stddev","onStatisticField":"latitude","outStatisticFieldName":"sd"}]"#;
    let v = query(
        &mut geo,
        base(json!({"where": "latitude < -18", "outStatistics": stats, "groupByFieldsForStatistics": "featureType"})),
    )
    .json();
    let mut groups: BTreeMap<String, Vec<&Mollusk>> = BTreeMap::new();
    for m in rows.iter().filter(|m| m.y < -18.0) {
        groups.entry(m.kind.clone()).or_default().push(m);
    }
    let got = v["statistics"].as_array().unwrap();
    assert_eq!(got.len(), groups.len());
    for (g, (kind, ms)) in got.iter().zip(&groups) {
        assert_eq!(g["featureType"], kind.as_str());
        assert_eq!(g["n"].as_u64().unwrap() as usize, ms.len());
        let mean = ms.iter().map(|m| m.y).sum::<f64>() / ms.len() as f64;
        assert!((g["latitude_avg"].as_f64().unwrap() - mean).abs() < 1e-9);
        let west = ms.iter().map(|m| m.x).fold(f64::INFINITY, f64::min);
        assert_eq!(g["west"].as_f64().unwrap(), west);
        let last = ms.iter().map(|m| m.citation.as_str()).max().unwrap();
        assert_eq!(g["last"], last);
        let var = ms.iter().map(|m| (m.y - mean).powi(2)).sum::<f64>() / (ms.len() - 1) as f64;
        assert!((g["sd"].as_f64().unwrap() - var.sqrt()).abs() < 1e-9);
    }
    assert_eq!(v["features"], json!([]));

    // objectIds, as a string and as a number.
    let v = query(&mut geo, base(json!({"objectIds": "5, 7,9"}))).json();
    assert_eq!(ids(&v), vec![5, 7, 9]);
    let v = query(&mut geo, base(json!({"objectIds": 5}))).json();
    assert_eq!(ids(&v), vec![5]);
}

#[test]
fn gkg_every_relation_agrees_with_geos() {
    let srv = TestServer::start();
    let mut admin = srv.client(ADMIN);
    let mut geo = srv.client(GEO);
    let r = put(
        &mut admin,
        "/tde/gkg.json",
        &format!("&collection={}", enc(TDE)),
        &read_json("gds/gkg/template.json"),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let r = put(
        &mut admin,
        "/services/gkg.json",
        &format!("&collection={}", enc(SERVICES)),
        &read_json("gds/gkg/descriptor.json"),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    for entry in std::fs::read_dir(data_dir().join("gds/gkg")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if !name.chars().next().unwrap().is_ascii_digit() {
            continue;
        }
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let r = put(
            &mut admin,
            &format!("/gkg/{name}"),
            "&collection=example-gkg",
            &doc,
        );
        assert_eq!(r.status, 201);
    }
    let fixture: Value =
        serde_json::from_str(include_str!("../fixtures/gkg_relations.json")).unwrap();
    let rels = [
        ("intersects", "gisSpatialRelIntersects"),
        ("contains", "esriSpatialRelContains"),
        ("within", "GISSPATIALRELWITHIN"),
        ("crosses", "esrispatialrelcrosses"),
        ("overlaps", "gisSpatialRelOverlaps"),
        ("touches", "esriSpatialRelTouches"),
        ("envelopeIntersects", "gisSpatialRelEnvelopeIntersects"),
    ];
    let mut checked = 0;
    for q in fixture["queries"].as_array().unwrap() {
        for (rel, spelling) in rels {
            let body = json!({
                "params": {"id": "GDeltGKG", "layer": "3", "method": "query"},
                "query": {"spatialRel": spelling, "returnGeometry": true, "extension": {"geometry": q["geometry"]}}
            });
            let r = query(&mut geo, body);
            assert_eq!(r.status, 200, "{}", r.text());
            let v = r.json();
            let want: Vec<i64> = q["expected"][rel]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i.as_i64().unwrap())
                .collect();
            assert_eq!(ids(&v), want, "{} / {rel}", q["name"]);
            checked += 1;
        }
    }
    assert_eq!(checked, 12 * 7);
    // Lines and polygons come back with their geometry, dates as ISO-8601.
    let v = query(
        &mut geo,
        json!({
            "params": {"id": "GDeltGKG", "layer": 3, "method": "query"},
            "query": {"returnGeometry": "true", "objectIds": "3237,3985", "outFields": "*"}
        }),
    )
    .json();
    let line: Value = read_json("gds/gkg/3237.json");
    assert_eq!(
        v["features"][0]["geometry"],
        line["envelope"]["feature"]["geometry"]
    );
    assert_eq!(
        v["features"][0]["properties"]["urlpubtimedate"],
        "2017-05-24T06:00:00.000Z"
    );
    assert_eq!(v["features"][1]["geometry"]["type"], "Polygon");
    assert_eq!(v["metadata"]["displayField"], "name");
    // The layer descriptor (no method) and the service descriptor (no layer).
    let layer = query(&mut geo, json!({"params": {"id": "GDeltGKG", "layer": 3}})).json();
    assert_eq!(layer["metadata"]["maxRecordCount"], 5000);
    assert_eq!(layer["metadata"]["name"], "GKG level 4");
    assert!(
        layer["metadata"]["fields"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["name"] == "urltone" && f["type"] == "Double")
    );
    // The service descriptor in the shape Koop reads (docs/contract.md §5): layers' metadata.
    let service = query(&mut geo, json!({"params": {"id": "GDeltGKG"}})).json();
    assert_eq!(service["maxRecordCount"], 5000);
    assert_eq!(service["name"], "GDeltGKG");
    let three = &service["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["metadata"]["id"] == 3)
        .unwrap()["metadata"];
    assert_eq!(three["name"], "GKG level 4");
    assert_eq!(three["maxRecordCount"], 5000);
    assert_eq!(three["fields"], layer["metadata"]["fields"]);
    let ids: Vec<i64> = service["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["metadata"]["id"].as_i64().unwrap())
        .collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "ascending ids: {ids:?}"
    );
    // A time window on a layer without timeInfo filters nothing; where on dates works.
    let v = query(&mut geo, json!({
        "params": {"id": "GDeltGKG", "layer": 3, "method": "query"},
        "query": {"where": "urlpubtimedate >= TIMESTAMP '2017-05-24 06:00:00' AND urltone < 0", "returnCountOnly": true}
    })).json();
    assert!(v["count"].as_u64().unwrap() >= 1);
}

#[test]
fn definitions_follow_documents_both_ways() {
    let srv = TestServer::start();
    let mut admin = srv.client(ADMIN);
    let mut geo = srv.client(GEO);
    let rows = mollusks();
    // Descriptor first, before its view exists: allowed, and the layer is empty.
    let r = put(
        &mut admin,
        "/services/mollusks.json",
        &format!("&collection={}", enc(SERVICES)),
        &read_json("gds/mollusks/descriptor.json"),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    load_mollusks(&mut admin, &rows[..50]);
    let m = &rows[3];
    assert_eq!(
        ids(&query(&mut geo, point_query("ArcGIS Hub Data", json!(0), m.x, m.y)).json()),
        Vec::<i64>::new()
    );
    // The template arrives after the documents: they become rows.
    let r = put(
        &mut admin,
        "/tde/mollusks.json",
        &format!("&collection={}", enc(TDE)),
        &read_json("gds/mollusks/template.json"),
    );
    assert_eq!(r.status, 201);
    let at = |c: &mut Client, x: f64, y: f64| {
        ids(&query(c, point_query("ArcGIS Hub Data", json!(0), x, y)).json())
    };
    assert!(at(&mut geo, m.x, m.y).contains(&m.id));
    // A document replaced after the template: its feature moves.
    let mut moved = m.doc.clone();
    moved["geometry"] = json!({"type": "Point", "coordinates": [10.5, 20.25]});
    let r = put(&mut admin, &format!("/data/{}.json", m.id), "", &moved);
    assert_eq!(r.status, 204);
    assert!(!at(&mut geo, m.x, m.y).contains(&m.id));
    assert_eq!(at(&mut geo, 10.5, 20.25), vec![m.id]);
    // Deleted: gone from the view.
    assert_eq!(
        admin
            .delete(&format!("/v1/documents?uri=/data/{}.json", m.id))
            .status,
        204
    );
    assert!(at(&mut geo, 10.5, 20.25).is_empty());
    let count = query(&mut geo, base(json!({"returnCountOnly": true}))).json();
    assert_eq!(count["count"], 49);
    // A template change applies to stored documents: drop the citation column.
    let mut t = read_json("gds/mollusks/template.json");
    t["template"]["rows"][0]["columns"]
        .as_array_mut()
        .unwrap()
        .remove(2);
    assert_eq!(put(&mut admin, "/tde/mollusks.json", "", &t).status, 204);
    let v = query(&mut geo, base(json!({"objectIds": "1"}))).json();
    assert!(v["features"][0]["properties"].get("citation").is_none());
    let r = query(&mut geo, base(json!({"where": "citation = 'x'"})));
    assert_eq!(r.status, 400);
    // Everything survives a restart: views are rebuilt from the store.
    let dir = srv.stop();
    let srv = TestServer::start_in(&dir, |_| {});
    let mut geo = srv.client(GEO);
    assert!(at(&mut geo, rows[5].x, rows[5].y).contains(&rows[5].id));
    let count = query(&mut geo, base(json!({"returnCountOnly": true}))).json();
    assert_eq!(count["count"], 49);
}

#[test]
fn permissions_and_roles() {
    let Mollusks {
        srv,
        mut admin,
        mut geo,
        rows,
    } = Mollusks::loaded(20);
    // One document only admin may read: the geo user never sees its feature.
    let secret = &rows[7];
    let r = put(
        &mut admin,
        &format!("/data/{}.json", secret.id),
        "&perm:admin=read&perm:admin=update",
        &secret.doc,
    );
    assert_eq!(r.status, 204);
    assert!(
        !ids(&query(
            &mut geo,
            point_query("ArcGIS Hub Data", json!(0), secret.x, secret.y)
        )
        .json())
        .contains(&secret.id)
    );
    assert!(
        ids(&query(
            &mut admin,
            point_query("ArcGIS Hub Data", json!(0), secret.x, secret.y)
        )
        .json())
        .contains(&secret.id)
    );
    let count = query(&mut geo, base(json!({"returnCountOnly": true}))).json();
    assert_eq!(count["count"], 19);
    let stats = query(
        &mut geo,
        base(
            json!({"outStatistics": [{"statisticType": "count", "onStatisticField": "OBJECTID"}]}),
        ),
    )
    .json();
    assert_eq!(stats["statistics"][0]["OBJECTID_count"], 19);

    // No writer role: 403 on both endpoints. A reader-only user does not get the listing
    // (the extension needs the writer role); it reads descriptor documents directly.
    let mut reader = srv.client(GEO_READER);
    let r = reader.get("/v1/resources/modelService");
    assert_eq!(r.status, 403);
    assert_eq!(r.error().1, "SEC-PRIV");
    assert_eq!(
        query(
            &mut reader,
            point_query("ArcGIS Hub Data", json!(0), 0.0, 0.0)
        )
        .status,
        403
    );
    let r = reader.get(&format!(
        "/v1/documents?uri={}",
        enc("/services/mollusks.json")
    ));
    assert_eq!(
        r.status, 200,
        "descriptors default to geo-data-services-reader: read"
    );
    let mut plain = srv.client(WRITER);
    assert_eq!(plain.get("/v1/resources/modelService").status, 403);

    // A descriptor only admin may read is not listed for others.
    let mut hidden = read_json("gds/gkg/descriptor.json");
    hidden["info"]["name"] = json!("Hidden");
    let r = put(
        &mut admin,
        "/services/hidden.json",
        &format!("&collection={}&perm:admin=read", enc(SERVICES)),
        &hidden,
    );
    assert_eq!(r.status, 201);
    let listing = geo.get("/v1/resources/modelService").json();
    assert!(listing["models"].get("Hidden").is_none());
    assert!(listing["models"].get("ArcGIS Hub Data").is_some());
    assert!(
        admin.get("/v1/resources/modelService").json()["models"]
            .get("Hidden")
            .is_some()
    );
    let r = query(
        &mut geo,
        json!({"params": {"id": "Hidden", "layer": 3, "method": "query"}}),
    );
    assert_eq!(r.status, 404);
}

#[test]
fn errors() {
    let srv = TestServer::start();
    let mut admin = srv.client(ADMIN);
    let mut geo = srv.client(GEO);
    mollusk_definitions(&mut admin);
    load_mollusks(&mut admin, &mollusks()[..5]);

    let r = query(
        &mut geo,
        json!({"params": {"id": "Nope", "layer": 0, "method": "query"}}),
    );
    assert_eq!(r.status, 404);
    let (_, code, message) = r.error();
    assert_eq!(
        (code.as_str(), message.as_str()),
        ("RESTAPI-SRVEXERR", "Service Nope not found")
    );
    let r = query(
        &mut geo,
        json!({"params": {"id": "ArcGIS Hub Data", "layer": "9", "method": "query"}}),
    );
    assert_eq!(r.status, 404);
    assert_eq!(r.error().2, "Layer 9 not found");
    let r = admin.get("/v1/resources/modelService?rs:id=Nope");
    assert_eq!(r.status, 404);
    assert_eq!(r.error().2, "Service Nope not found");

    let cases = [
        (
            base(json!({"where": "OBJECTID = 1 AND bogus > 2"})),
            "position 18",
        ),
        (base(json!({"where": "OBJECTID ="})), "position"),
        (
            base(json!({"outFields": "OBJECTID,nope"})),
            "unknown field nope",
        ),
        (
            base(json!({"orderByFields": "nope DESC"})),
            "unknown field nope",
        ),
        (
            base(json!({"geometryType": "gisGeometryCircle"})),
            "unsupported geometryType",
        ),
        (
            base(json!({"spatialRel": "esriSpatialRelNear"})),
            "unsupported spatialRel",
        ),
        (
            base(json!({"outStatistics": [{"statisticType": "sum", "onStatisticField": "nope"}]})),
            "unknown field nope",
        ),
        (json!({"query": {}}), "params"),
    ];
    for (body, needle) in cases {
        let r = query(&mut geo, body.clone());
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        let (_, code, message) = r.error();
        assert_eq!(code, "RESTAPI-SRVEXERR");
        assert!(message.contains(needle), "{body}: {message}");
    }
    let r = geo.post_json("/v1/resources/geoQueryService", "{not json");
    assert_eq!(r.status, 400);
    assert!(r.error().2.contains("not JSON"));
    assert_eq!(geo.get("/v1/resources/geoQueryService").status, 405);

    // Template and descriptor validation at write time.
    let mut t = read_json("gds/mollusks/template.json");
    t["template"]["rows"][0]["columns"][0]["name"] = json!("ID");
    let r = put(
        &mut admin,
        "/tde/bad.json",
        &format!("&collection={}", enc(TDE)),
        &t,
    );
    assert_eq!(r.status, 400);
    assert!(r.error().2.contains("no OBJECTID column"), "{}", r.text());
    let mut t = read_json("gds/mollusks/template.json");
    t["template"]["rows"][0]["columns"][1]["scalarType"] = json!("varchar");
    let r = put(
        &mut admin,
        "/tde/bad.json",
        &format!("&collection={}", enc(TDE)),
        &t,
    );
    assert!(
        r.error().2.contains("unknown scalarType \"varchar\""),
        "{}",
        r.text()
    );
    let mut t = read_json("gds/mollusks/template.json");
    t["template"]["rows"][0]["columns"][1]["val"] = json!("a[0]");
    let r = put(
        &mut admin,
        "/tde/bad.json",
        &format!("&collection={}", enc(TDE)),
        &t,
    );
    assert!(r.error().2.contains("malformed path"), "{}", r.text());
    let r = put(
        &mut admin,
        "/tde/dup.json",
        &format!("&collection={}", enc(TDE)),
        &read_json("gds/mollusks/template.json"),
    );
    assert!(r.error().2.contains("already defined"), "{}", r.text());
    let mut d = read_json("gds/gkg/descriptor.json");
    d["layers"][0]
        .as_object_mut()
        .unwrap()
        .remove("geometryType");
    let r = put(
        &mut admin,
        "/services/bad.json",
        &format!("&collection={}", enc(SERVICES)),
        &d,
    );
    assert_eq!(r.status, 400);
    assert!(
        r.error().2.contains("layers[0].geometryType is required"),
        "{}",
        r.text()
    );
    assert_eq!(
        admin.get("/v1/documents?uri=/services/bad.json").status,
        404,
        "nothing stored"
    );
    // A second document for a service name already taken is refused, so a name always
    // answers with one descriptor; the first one still does.
    let mut twin = read_json("gds/mollusks/descriptor.json");
    twin["info"]["description"] = json!("a twin");
    let r = put(
        &mut admin,
        "/services/twin.json",
        &format!("&collection={}", enc(SERVICES)),
        &twin,
    );
    assert_eq!(r.status, 400);
    assert!(r.error().2.contains("already exists"), "{}", r.text());
    let listing = admin.get("/v1/resources/modelService").json();
    assert_eq!(
        listing["models"]["ArcGIS Hub Data"]["description"],
        read_json("gds/mollusks/descriptor.json")["info"]["description"]
    );
    assert_eq!(
        admin.get("/v1/documents?uri=/services/twin.json").status,
        404
    );
}

#[test]
fn koop_shapes_and_multipart() {
    let Mollusks {
        srv: _srv,
        admin: _,
        mut geo,
        rows,
    } = Mollusks::loaded(30);
    let m = &rows[0];
    // Everything as strings, extra members, a spatialReference inside the GeoJSON.
    let body = json!({
        "params": {"id": "ArcGIS Hub Data", "layer": "0", "method": "query"},
        "query": {
            "f": "geojson", "inSR": "4326", "outSR": 4326, "returnGeometry": "false",
            "geometry": format!("{},{}", m.x, m.y), "geometryType": "esriGeometryPoint",
            "spatialRel": "esrispatialrelcontains", "resultRecordCount": "10",
            "extension": {"geometry": {"type": "Point", "coordinates": [m.x, m.y], "spatialReference": {"wkid": 4326}}},
            "somethingElse": {"a": 1}
        }
    });
    let v = query(&mut geo, body.clone()).json();
    assert!(ids(&v).contains(&m.id));
    assert_eq!(v["features"][0]["geometry"], Value::Null);
    // The same body as multipart/mixed with one JSON part.
    let wire = format!("--XyZ\r\nContent-Type: application/json\r\n\r\n{body}\r\n--XyZ--\r\n");
    let r = geo.request(
        "POST",
        "/v1/resources/geoQueryService",
        // Media types are case-insensitive (RFC 9110 §8.3.1).
        &[("Content-Type", "Multipart/Mixed; boundary=XyZ")],
        wire.as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(ids(&r.json()).contains(&m.id));
    // An envelope arrives as a closed 5-point polygon.
    let envelope = json!({
        "params": {"id": "ArcGIS Hub Data", "layer": 0, "method": "query"},
        "query": {"geometryType": "gisGeometryEnvelope", "spatialRel": "gisSpatialRelIntersects", "returnIdsOnly": true,
                  "extension": {"geometry": {"type": "Polygon", "coordinates": [[[178.0, -19.0], [179.0, -19.0], [179.0, -18.0], [178.0, -18.0], [178.0, -19.0]]]}}}
    });
    let v = query(&mut geo, envelope).json();
    let mut want: Vec<i64> = rows[..30]
        .iter()
        .filter(|m| (178.0..=179.0).contains(&m.x) && (-19.0..=-18.0).contains(&m.y))
        .map(|m| m.id)
        .collect();
    want.sort();
    let got: Vec<i64> = v["objectIds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_i64().unwrap())
        .collect();
    assert_eq!(got, want);
    assert!(!want.is_empty());
}

/// The answers a few queries give on the Places layer, to compare two servers' views.
fn places_answers(c: &mut Client) -> Vec<Value> {
    let q = |c: &mut Client, query: Value| {
        let r = query_places(c, query);
        let mut v = r;
        // Answers carry the time they were made.
        v.as_object_mut().map(|o| o.remove("$timestamp"));
        v
    };
    let boxed = |w: f64, s: f64, e: f64, n: f64| json!({"type": "Polygon", "coordinates": [[[w, s], [e, s], [e, n], [w, n], [w, s]]]});
    vec![
        q(c, json!({"returnCountOnly": true})),
        q(
            c,
            json!({"where": "country IS NOT NULL", "returnCountOnly": true}),
        ),
        q(c, json!({"where": "cc LIKE 'W-%'", "returnIdsOnly": true})),
        q(
            c,
            json!({"where": "cc LIKE 'W-%'", "outFields": "OBJECTID,name,country",
                     "orderByFields": "OBJECTID", "returnGeometry": false}),
        ),
        q(
            c,
            json!({"returnIdsOnly": true, "extension": {"geometry": boxed(-10.0, 35.0, 30.0, 60.0)}}),
        ),
        q(
            c,
            json!({"outStatistics": [{"statisticType": "count", "onStatisticField": "OBJECTID",
                                      "outStatisticFieldName": "n"}],
                     "groupByFieldsForStatistics": "country",
                     "extension": {"geometry": boxed(-130.0, 20.0, -60.0, 55.0)}}),
        ),
    ]
}

fn query_places(c: &mut Client, query: Value) -> Value {
    let r = c.post_json(
        "/v1/resources/geoQueryService",
        &json!({"params": {"id": "Places", "layer": 0, "method": "query"}, "query": query})
            .to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// A template changed while 16 writers write: the new view is built in the background from
/// a snapshot while the writes go on, the documents written meanwhile are applied to it, and
/// then it takes the old one's place. No write waits for the build, and the view equals a
/// recomputation (the same answers after a restart, which builds every view afresh).
#[test]
fn a_template_change_is_built_in_the_background_while_writes_go_on() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    let dir = temp_dir("rebuild");
    seed_users(&dir);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_geoshard"))
        .args(["load", "--quiet", "--service", "Places", "--data-dir"])
        .arg(dir.path())
        .arg(data_dir().join("real/geonames-cities1000.csv"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let env = [
        ("GEOSHARD_BACKGROUND_BUILD_ROWS", "0"),
        ("GEOSHARD_LOG", "warn,geoshard_features=info"),
    ];
    let srv = ChildServer::start(dir.path(), &env);
    let addr = srv.addr;
    let mut admin = srv.client(ADMIN);
    let t_uri = "/geoshard-load/Places/template-0.json";
    let mut template = admin
        .get(&format!("/v1/documents?uri={}", enc(t_uri)))
        .json();
    template["template"]["rows"][0]["columns"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "country", "scalarType": "string", "val": "properties/cc", "nullable": true}));

    // Each writer creates, replaces and deletes its own 40 documents until told to stop,
    // timing every write and keeping the last state of each.
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..16i64)
        .map(|w| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut c = Client::new(addr, Auth::Digest(WRITER.0.into(), WRITER.1.into()));
                let mut times = Vec::new();
                let mut last: BTreeMap<i64, Option<String>> = BTreeMap::new();
                let mut i = 0i64;
                while !stop.load(Ordering::Relaxed) {
                    let id = 1_000_000 + w * 100 + i % 40;
                    let uri = format!("/Places/0/{id}.json");
                    let t0 = Instant::now();
                    let name = format!("w{w} write {i}");
                    let status = if i % 7 == 6 {
                        last.insert(id, None);
                        c.delete(&format!("/v1/documents?uri={}", enc(&uri))).status
                    } else {
                        last.insert(id, Some(name.clone()));
                        let doc = json!({"type": "Feature",
                            "properties": {"OBJECTID": id, "name": name, "cc": format!("W-{w}")},
                            "geometry": {"type": "Point", "coordinates": [w as f64, (i % 40) as f64]}});
                        c.put_json(
                            &format!("/v1/documents?uri={}&collection=Places", enc(&uri)),
                            &doc.to_string(),
                        )
                        .status
                    };
                    assert!(status < 300, "{uri}: {status}");
                    times.push((t0, t0.elapsed()));
                    i += 1;
                }
                (times, last)
            })
        })
        .collect();

    std::thread::sleep(Duration::from_millis(500));
    let changed = Instant::now();
    // The template's writer, on a thread of its own: its answer comes once the new view is in
    // place, so it reads its own change; nobody else waits.
    let template_writer = {
        let body = template.to_string();
        std::thread::spawn(move || {
            let mut c = Client::new(addr, Auth::Digest(ADMIN.0.into(), ADMIN.1.into()));
            let r = c.put_json(
                &format!("/v1/documents?uri={}&collection={}", enc(t_uri), enc(TDE)),
                &body,
            );
            assert!(r.status < 300, "{}", r.text());
            let answered = changed.elapsed();
            // Its own change, at once.
            let r = query_places(
                &mut c,
                json!({"where": "country = 'US'", "returnCountOnly": true}),
            );
            assert!(r["count"].as_i64().unwrap() > 1000, "{r}");
            answered
        })
    };
    let building = |c: &mut Client| {
        c.get("/metrics")
            .text()
            .lines()
            .find_map(|l| l.strip_prefix("geoshard_view_builds_running "))
            .map(str::to_string)
    };
    let seen_building = loop {
        match building(&mut admin).as_deref() {
            Some("1") => break true,
            _ if changed.elapsed() > Duration::from_secs(2) => break false,
            _ => std::thread::sleep(Duration::from_millis(5)),
        }
    };
    assert!(seen_building, "no background build was seen");
    // The build's log line says when it is done and how long it took.
    let deadline = Instant::now() + Duration::from_secs(120);
    let build_secs = loop {
        let line = srv
            .log
            .lock()
            .unwrap()
            .iter()
            .find(|l| l.contains("views rebuilt in the background"))
            .cloned();
        if let Some(l) = line {
            let secs: f64 = l
                .split("secs=")
                .nth(1)
                .and_then(|s| s.split_whitespace().next())
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("{l}"));
            break secs;
        }
        assert!(Instant::now() < deadline, "no background build");
        std::thread::sleep(Duration::from_millis(20));
    };
    let answered = template_writer.join().unwrap();
    let built = changed.elapsed();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(building(&mut admin).as_deref(), Some("0"));
    stop.store(true, Ordering::Relaxed);
    let mut during = Vec::new();
    let mut idle = Vec::new();
    let mut last_state: BTreeMap<i64, Option<String>> = BTreeMap::new();
    for w in writers {
        let (times, last) = w.join().unwrap();
        for (at, took) in times {
            if at >= changed && at < changed + built {
                during.push(took);
            } else if at < changed {
                idle.push(took);
            }
        }
        last_state.extend(last);
    }
    during.sort();
    idle.sort();
    let p99 = |v: &[Duration]| v[(v.len() * 99 / 100).min(v.len() - 1)];
    eprintln!(
        "template answered in {answered:?}; build {build_secs:.3} s; writes idle {} (p99 {:?}), \
         during the build {} (p99 {:?}, slowest {:?})",
        idle.len(),
        p99(&idle),
        during.len(),
        p99(&during),
        during.last()
    );
    // Writes went on: many during the build, none held for most of it, and the template's own
    // write did not wait for the build either.
    assert!(
        during.len() >= 16,
        "{} writes during the build",
        during.len()
    );
    let slowest = *during.last().unwrap();
    assert!(
        slowest.as_secs_f64() < build_secs / 2.0,
        "a write took {slowest:?} during a build of {build_secs} s"
    );
    // The template's own answer waited for the build (and only it did).
    assert!(
        answered.as_secs_f64() >= build_secs * 0.9,
        "{answered:?} / {build_secs}"
    );

    // The new column is there for every row, the writers' final states included.
    let before = places_answers(&mut admin);
    assert_eq!(before[0]["count"], before[1]["count"], "{}", before[1]);
    let mut live: Vec<i64> = last_state
        .iter()
        .filter(|(_, s)| s.is_some())
        .map(|(id, _)| *id)
        .collect();
    live.sort_unstable();
    let mut ids: Vec<i64> = before[2]["objectIds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, live);
    for f in before[3]["features"].as_array().unwrap() {
        let id = f["properties"]["OBJECTID"].as_i64().unwrap();
        assert_eq!(
            f["properties"]["name"].as_str(),
            last_state[&id].as_deref(),
            "{id}"
        );
        assert_eq!(
            f["properties"]["country"].as_str().unwrap(),
            format!("W-{}", (id - 1_000_000) / 100)
        );
    }

    // A restart builds every view from the stored documents: the same answers.
    let dir_path = dir.path().to_path_buf();
    srv.kill();
    let again = ChildServer::start(&dir_path, &[]);
    let after = places_answers(&mut again.client(ADMIN));
    assert_eq!(after, before);
    again.kill();
}
