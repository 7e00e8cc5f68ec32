//! Feature layers for tests over HTTP: a polygon layer's template and descriptor, bulk
//! writes, queries, and the US counties as documents.

use geo::{Geometry, Polygon};
use serde_json::{Value, json};

use super::{Client, Response, data_dir, enc};

pub const TDE: &str = "http://marklogic.com/xdmp/tde";
pub const SERVICES: &str = "http://marklogic.com/feature-services";

pub fn put(c: &mut Client, uri: &str, params: &str, body: &Value) -> Response {
    c.put_json(
        &format!("/v1/documents?uri={}{params}", enc(uri)),
        &body.to_string(),
    )
}

/// A polygon layer `service`/0 over the documents of `collection`: `id` as OBJECTID, `name`,
/// `pop` (long, ignored when invalid) and the geometry at `//geometry`.
pub fn polygon_layer(c: &mut Client, service: &str, collection: &str) {
    let columns = json!([
        {"name": "OBJECTID", "scalarType": "int", "val": "id"},
        {"name": "name", "scalarType": "string", "val": "name"},
        {"name": "pop", "scalarType": "long", "val": "pop", "nullable": true,
         "invalidValues": "ignore"}]);
    layer(c, service, collection, ("hostile", columns), "Polygon");
}

/// A layer `service`/0 over the documents of `collection`: a template of view
/// `schema.collection` with `columns`, and a descriptor whose geometry is at `//geometry`.
pub fn layer(
    c: &mut Client,
    service: &str,
    collection: &str,
    (schema, columns): (&str, Value),
    geometry_type: &str,
) {
    let template = json!({"template": {"context": "/", "collections": [collection], "rows": [{
        "schemaName": schema, "viewName": collection, "columns": columns}]}});
    let r = put(
        c,
        &format!("/t/{collection}.json"),
        &format!("&collection={}", enc(TDE)),
        &template,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let descriptor = json!({"info": {"name": service, "description": "d"}, "layers": [{
        "id": 0, "name": "shapes", "description": "d", "geometryType": geometry_type,
        "schema": schema, "view": collection,
        "geometry": {"format": "geojson", "coordinateSystem": "wgs84", "xpath": "//geometry"}}]});
    let r = put(
        c,
        &format!("/s/{collection}.json"),
        &format!("&collection={}", enc(SERVICES)),
        &descriptor,
    );
    assert_eq!(r.status, 201, "{}", r.text());
}

pub fn geojson(p: &Polygon<f64>) -> Value {
    let ring: Vec<[f64; 2]> = p.exterior().0.iter().map(|c| [c.x, c.y]).collect();
    json!({"type": "Polygon", "coordinates": [ring]})
}

pub fn query(c: &mut Client, service: &str, q: Value) -> Response {
    c.post_json(
        "/v1/resources/geoQueryService",
        &json!({"params": {"id": service, "layer": 0, "method": "query"}, "query": q}).to_string(),
    )
}

pub fn ids(v: &Value) -> Vec<i64> {
    let mut ids: Vec<i64> = v["objectIds"]
        .as_array()
        .unwrap_or_else(|| panic!("no objectIds: {v}"))
        .iter()
        .map(|i| i.as_i64().unwrap())
        .collect();
    ids.sort_unstable();
    ids
}

/// One multipart/mixed bulk write of `docs` into `collection`.
pub fn bulk(c: &mut Client, collection: &str, docs: &[(String, Value)]) -> Response {
    let boundary = "hostile-boundary";
    let mut body = Vec::new();
    for (uri, doc) in docs {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Type: application/json\r\n\
                 Content-Disposition: attachment; filename=\"{uri}\"\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(doc.to_string().as_bytes());
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    let ct = format!("multipart/mixed; boundary={boundary}");
    c.request(
        "POST",
        &format!("/v1/documents?collection={}", enc(collection)),
        &[("Content-Type", ct.as_str())],
        &body,
    )
}

/// The US counties as (id, geometry, document).
pub fn counties() -> Vec<(i64, Geometry<f64>, Value)> {
    let text = std::fs::read_to_string(data_dir().join("real/us-counties.geojson")).unwrap();
    let fc: Value = serde_json::from_str(&text).unwrap();
    fc["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let id: i64 = f["id"].as_str().unwrap().parse().unwrap();
            let g = geoshard::spatial::parse_geojson(&f["geometry"]).unwrap();
            let doc = json!({"id": id, "name": f["properties"]["name"], "geometry": f["geometry"]});
            (id, g, doc)
        })
        .collect()
}

pub fn load_counties(c: &mut Client) -> Vec<(i64, Geometry<f64>, Value)> {
    polygon_layer(c, "Counties", "counties");
    let all = counties();
    let docs: Vec<(String, Value)> = all
        .iter()
        .map(|(id, _, doc)| (format!("/counties/{id}.json"), doc.clone()))
        .collect();
    let r = bulk(c, "counties", &docs);
    assert_eq!(r.status, 200, "{}", r.text());
    all
}

/// The names of a layer's `fields`, in order.
pub fn field_names(layer: &Value) -> Vec<&str> {
    layer["fields"]
        .as_array()
        .unwrap_or_else(|| panic!("no fields: {layer}"))
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect()
}

/// A geoQueryService body for layer 0 of `service`.
pub fn q(service: &str, query: Value) -> Value {
    json!({"params": {"id": service, "layer": 0, "method": "query"}, "query": query})
}

/// Every query kind the contract has, over the counties and the GeoNames places loaded as
/// services `counties` and `places`.
pub fn queries() -> Vec<(&'static str, Value)> {
    let paris = json!({"type": "Polygon", "coordinates": [[[2.0, 48.5], [2.8, 48.5], [2.8, 49.1], [2.0, 49.1], [2.0, 48.5]]]});
    let colorado = json!({"type": "Polygon", "coordinates": [[[-106.0, 38.5], [-103.5, 39.0], [-105.0, 40.5], [-106.0, 38.5]]]});
    vec![
        (
            "point in polygon",
            q(
                "Counties",
                json!({"returnGeometry": true, "outFields": "*", "spatialRel": "esriSpatialRelContains",
                       "extension": {"geometry": {"type": "Point", "coordinates": [-104.9903, 39.7392]}}}),
            ),
        ),
        (
            "polygon intersects",
            q(
                "Counties",
                json!({"returnGeometry": false, "outFields": "name", "orderByFields": "name",
                       "spatialRel": "esriSpatialRelIntersects", "extension": {"geometry": colorado}}),
            ),
        ),
        (
            "envelope",
            q(
                "Places",
                json!({"outFields": "*", "returnGeometry": true,
                       "geometry": {"xmin": 2.0, "ymin": 48.5, "xmax": 2.8, "ymax": 49.1},
                       "geometryType": "esriGeometryEnvelope", "spatialRel": "esriSpatialRelIntersects"}),
            ),
        ),
        (
            "where, order and paging",
            q(
                "Places",
                json!({"where": "cc = 'FR' AND name LIKE 'Saint%'", "outFields": "name,admin1",
                       "orderByFields": "name DESC", "resultOffset": 20, "resultRecordCount": 15}),
            ),
        ),
        (
            "box, where and paging",
            q(
                "Places",
                json!({"where": "cc = 'FR'", "outFields": "name", "orderByFields": "name",
                       "resultRecordCount": 7, "extension": {"geometry": paris},
                       "spatialRel": "esriSpatialRelIntersects"}),
            ),
        ),
        (
            "statistics by group",
            q(
                "Places",
                json!({"where": "cc IN ('US','CA','MX','FR')", "groupByFieldsForStatistics": "cc",
                       "outStatistics": [
                           {"statisticType": "count", "onStatisticField": "OBJECTID", "outStatisticFieldName": "n"},
                           {"statisticType": "sum", "onStatisticField": "OBJECTID", "outStatisticFieldName": "s"},
                           {"statisticType": "min", "onStatisticField": "OBJECTID", "outStatisticFieldName": "lo"},
                           {"statisticType": "max", "onStatisticField": "OBJECTID", "outStatisticFieldName": "hi"},
                           {"statisticType": "avg", "onStatisticField": "OBJECTID", "outStatisticFieldName": "mean"},
                           {"statisticType": "stddev", "onStatisticField": "OBJECTID", "outStatisticFieldName": "sd"},
                           {"statisticType": "var", "onStatisticField": "OBJECTID", "outStatisticFieldName": "v"}]}),
            ),
        ),
        (
            "ids",
            q(
                "Places",
                json!({"returnIdsOnly": true, "extension": {"geometry": paris},
                       "spatialRel": "esriSpatialRelIntersects"}),
            ),
        ),
        ("count", q("Places", json!({"returnCountOnly": true}))),
        (
            "count with where",
            q(
                "Counties",
                json!({"returnCountOnly": true, "where": "name LIKE 'S%'"}),
            ),
        ),
    ]
}

/// More query kinds over the same services, for answers merged from several nodes: pages deep
/// in an order, statistics over floats, ids in an order, a distance, the descriptors.
pub fn more_queries() -> Vec<(&'static str, Value)> {
    vec![
        ("service", json!({"params": {"id": "Places"}})),
        ("layer", json!({"params": {"id": "Counties", "layer": 0}})),
        (
            "counties over the whole country, ordered by name, a middle page",
            q(
                "Counties",
                json!({"outFields": "name,OBJECTID", "orderByFields": "name", "returnGeometry": true,
                       "resultOffset": 700, "resultRecordCount": 50,
                       "geometry": {"xmin": -125.0, "ymin": 24.0, "xmax": -66.0, "ymax": 50.0},
                       "geometryType": "esriGeometryEnvelope", "spatialRel": "esriSpatialRelIntersects"}),
            ),
        ),
        (
            "every place by OBJECTID, the last page",
            q(
                "Places",
                json!({"outFields": "*", "resultOffset": 144500, "resultRecordCount": 100}),
            ),
        ),
        (
            "float statistics over the world, no groups",
            q(
                "Places",
                json!({"outStatistics": [
                    {"statisticType": "avg", "onStatisticField": "lat", "outStatisticFieldName": "a"},
                    {"statisticType": "stddev", "onStatisticField": "lon", "outStatisticFieldName": "s"},
                    {"statisticType": "sum", "onStatisticField": "lat", "outStatisticFieldName": "p"},
                    {"statisticType": "min", "onStatisticField": "name", "outStatisticFieldName": "first"},
                    {"statisticType": "max", "onStatisticField": "lat", "outStatisticFieldName": "north"},
                    {"statisticType": "count", "onStatisticField": "*", "outStatisticFieldName": "n"}]}),
            ),
        ),
        (
            "statistics of nothing",
            q(
                "Places",
                json!({"where": "cc = 'XX'", "outStatistics": [
                    {"statisticType": "avg", "onStatisticField": "lat", "outStatisticFieldName": "a"},
                    {"statisticType": "count", "onStatisticField": "*", "outStatisticFieldName": "n"}]}),
            ),
        ),
        (
            "ids across Europe ordered by name descending",
            q(
                "Places",
                json!({"returnIdsOnly": true, "orderByFields": "name DESC",
                       "geometry": {"xmin": -10.0, "ymin": 35.0, "xmax": 30.0, "ymax": 60.0},
                       "geometryType": "esriGeometryEnvelope", "spatialRel": "esriSpatialRelIntersects"}),
            ),
        ),
        (
            "a distance around Denver",
            q(
                "Places",
                json!({"outFields": "name", "orderByFields": "name", "distance": 300000, "units": "esriSRUnit_Meter",
                       "geometry": {"x": -104.99, "y": 39.74}, "geometryType": "esriGeometryPoint",
                       "spatialRel": "esriSpatialRelIntersects"}),
            ),
        ),
    ]
}
