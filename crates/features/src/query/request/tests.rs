//! Unit tests of `request`.

use super::*;
use serde_json::json;

#[test]
fn coerces_what_koop_sends() {
    let body = json!({
        "params": {"id": "GDeltGKG", "layer": "3", "method": "query"},
        "query": {
            "f": "json", "inSR": 4326, "outSR": {"wkid": 4326},
            "geometry": "{\"x\":1,\"y\":2}",
            "returnGeometry": "true", "returnCountOnly": false,
            "resultRecordCount": "10", "resultOffset": 5,
            "outStatistics": "[{\"statisticType\":\"count\",\"onStatisticField\":\"OBJECTID\"}]",
            "geometryType": "esriGeometryEnvelope",
            "spatialRel": "esrispatialrelcontains",
            "time": "1495605600000,null",
            "objectIds": "1, 2,3",
            "extension": {"geometry": {"type": "Polygon", "coordinates": [[[0,0],[1,0],[1,1],[0,1],[0,0]]], "spatialReference": {"wkid": 4326}}}
        }
    });
    let r = FeatureRequest::from_json(&body).unwrap();
    assert_eq!(r.layer, Some(3));
    assert!(r.query.return_geometry);
    assert_eq!(r.query.limit, Some(10));
    assert_eq!(r.query.offset, 5);
    assert_eq!(r.query.object_ids, Some(vec![1, 2, 3]));
    assert_eq!(r.query.time, Some((Some(1_495_605_600_000), None)));
    let stats = r.query.statistics.unwrap();
    assert_eq!(stats[0].out_name, "OBJECTID_count");
    assert_eq!(r.query.geometry.unwrap().1, Relation::Contains);
}

#[test]
fn refuses_bad_members() {
    let base = |q: Value| json!({"params": {"id": "s", "layer": 0, "method": "query"}, "query": q});
    let cases = [
        (
            json!({"geometryType": "gisGeometryCircle"}),
            "unsupported geometryType",
        ),
        (
            json!({"spatialRel": "gisSpatialRelNear"}),
            "unsupported spatialRel",
        ),
        (json!({"returnGeometry": "maybe"}), "returnGeometry"),
        (json!({"resultRecordCount": -1}), "resultRecordCount"),
        (json!({"objectIds": "1,x"}), "objectIds"),
        (json!({"outStatistics": "[{"}), "outStatistics"),
        (
            json!({"outStatistics": [{"statisticType": "median", "onStatisticField": "a"}]}),
            "median",
        ),
        (
            json!({"extension": {"geometry": {"type": "Point", "coordinates": [500, 0]}}}),
            "longitude 500",
        ),
    ];
    for (q, needle) in cases {
        let e = FeatureRequest::from_json(&base(q.clone()))
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle), "{q}: {e}");
    }
    assert!(
        FeatureRequest::from_json(&json!({"query": {}}))
            .unwrap_err()
            .to_string()
            .contains("params")
    );
    assert!(matches!(
        FeatureRequest::from_json(&json!({"params": {"id": "s", "layer": "abc"}})),
        Err(FeatureError::LayerNotFound(_))
    ));
}

/// A body bound to the kept one ([`Prepared`]) gives what parsing it gives, whatever its
/// coordinates, including ones that are not a valid geometry, not JSON, or not one array;
/// bodies of several shapes and two users are interleaved, so kept bodies are also
/// compared with ones that differ from them elsewhere.
#[test]
fn a_bound_body_is_what_parsing_gives() {
    let templates = [
        r#"{"params":{"id":"lt-counties","layer":0,"method":"query"},"query":{"returnGeometry":1,"geometryType":"gisGeometryPoint","spatialRel":"gisSpatialRelContains","extension":{"geometry":{"type":"Point","coordinates":@}}}}"#,
        r#"{"params":{"id":"lt-counties","layer":1,"method":"query"},"query":{"returnGeometry":1,"geometryType":"gisGeometryPoint","spatialRel":"gisSpatialRelContains","extension":{"geometry":{"type":"Point","coordinates":@}}}}"#,
        r#"{"params":{"id":"lt-counties","layer":0,"method":"query"},"query":{"returnGeometry":0,"geometryType":"gisGeometryPoint","spatialRel":"gisSpatialRelContains","extension":{"geometry":{"type":"Point","coordinates":@}}}}"#,
        "{ \"query\": {\"extension\": {\"geometry\": {\"coordinates\": @ , \"type\": \"Point\"}},\n \"where\": \"name = 'Potter'\", \"outFields\": \"*\", \"spatialRel\": \"esriSpatialRelIntersects\"},\n \"params\": {\"id\": \"s\", \"layer\": \"0\", \"method\": \"query\"} }\n",
        r#"{"params":{"id":"lt-places","layer":0,"method":"query"},"query":{"returnGeometry":0,"geometryType":"gisGeometryEnvelope","spatialRel":"gisSpatialRelIntersects","extension":{"geometry":{"type":"Polygon","coordinates":@}}}}"#,
        r#"{"params":{"id":"s","layer":0},"query":{"extension":{"geometry":{"type":"MultiPoint","coordinates":@}},"resultRecordCount":"5"}}"#,
    ];
    let mut coords: Vec<String> = [
        "[1.5,2.25]",
        "[-100.26183662316625,45.246596062450614]",
        "[0,0]",
        "[-0,1e2]",
        "[ 3 , 4 ]",
        "[1,2,3]",
        "[1]",
        "[]",
        "[1e400,0]",
        "[181,0]",
        "[0,-90.5]",
        "[180,90]",
        "[-180.0,-90.0]",
        "[12345678901234567890,1]",
        "[-9223372036854775809,1]",
        "[1.7976931348623157e308,0]",
        r#"["a",1]"#,
        r#"["]",1]"#,
        "[[1,2]]",
        "[[1,2],[3,4]]",
        "[null,1]",
        "[1,2] ",
        " [1,2]",
        "[1,2]]",
        "[1,2],[3,4]",
        "[1,2],\"x\":[3,4]",
        "[1,2}",
        "1",
        "null",
        "[[[0,0],[1,0],[1,1],[0,1],[0,0]]]",
        "[[[0,0],[1,0]]]",
        "[[[0,0],[1,0],[1,1],[0,1],[0,0]],[[0.2,0.2],[0.4,0.2],[0.4,0.4],[0.2,0.2]]]",
    ]
    .iter()
    .map(|c| c.to_string())
    .collect();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..200 {
        let x = (next() % 36_000_000) as f64 / 100_000.0 - 180.0;
        let y = (next() % 18_000_000) as f64 / 100_000.0 - 90.0;
        coords.push(format!("[{x},{y}]"));
        coords.push(format!(
            "[[[{x},{y}],[{},{y}],[{},{}],[{x},{}],[{x},{y}]]]",
            x + 0.5,
            x + 0.5,
            y + 0.5,
            y + 0.5
        ));
    }
    let (mut bound, mut total) = (0, 0);
    // Runs of one shape and user, as a client sends them, between changes of both.
    while total < 6_000 {
        let template = templates[(next() % templates.len() as u64) as usize];
        assert_eq!(template.matches('@').count(), 1);
        let user = ["u1", "u2"][(next() % 2) as usize];
        for _ in 0..1 + next() % 8 {
            let c = &coords[(next() % coords.len() as u64) as usize];
            let body = template.replace('@', c);
            let binds = PREPARED.with(|p| {
                let kept = p.borrow();
                kept.as_ref()
                    .and_then(|p| p.bind(user, body.as_bytes(), DEFAULT_MAX_QUERY_VERTICES))
                    .is_some()
            });
            bound += usize::from(binds);
            total += 1;
            let got = FeatureRequest::parse_for(user, body.as_bytes(), DEFAULT_MAX_QUERY_VERTICES);
            let want = FeatureRequest::parse(body.as_bytes());
            assert_eq!(format!("{got:?}"), format!("{want:?}"), "{user}: {body}");
        }
    }
    assert!(bound > total / 3, "{bound} of {total} bound");
}

/// The kept body is one user's: another's body of the same shape is parsed.
#[test]
fn a_kept_body_binds_only_for_its_user() {
    let body = |x: f64| {
        format!(
            r#"{{"params":{{"id":"s","layer":0}},"query":{{"extension":{{"geometry":{{"type":"Point","coordinates":[{x},1]}}}}}}}}"#
        )
    };
    FeatureRequest::parse_for("u1", body(1.0).as_bytes(), DEFAULT_MAX_QUERY_VERTICES).unwrap();
    let binds = |user: &str, b: &str| {
        PREPARED.with(|p| {
            p.borrow()
                .as_ref()
                .and_then(|p| p.bind(user, b.as_bytes(), DEFAULT_MAX_QUERY_VERTICES))
                .is_some()
        })
    };
    assert!(binds("u1", &body(2.5)));
    assert!(!binds("u2", &body(2.5)));
    assert!(!binds("u", &body(2.5)));
    assert!(!binds("u1", &body(2.5).replace("\"s\"", "\"t\"")));
    let r =
        FeatureRequest::parse_for("u1", body(2.5).as_bytes(), DEFAULT_MAX_QUERY_VERTICES).unwrap();
    let (q, _) = r.query.geometry.unwrap();
    assert_eq!(q.as_point(), Some((2.5, 1.0)));
}

#[test]
fn prefixes_in_any_case() {
    assert_eq!(
        enum_value("gisSpatialRelContains", "spatialrel"),
        Some("Contains")
    );
    assert_eq!(
        enum_value("ESRISPATIALRELWITHIN", "spatialrel"),
        Some("WITHIN")
    );
    assert_eq!(enum_value("esriGeometryPoint", "geometry"), Some("Point"));
    assert_eq!(enum_value("gis", "spatialrel"), None);
    assert_eq!(enum_value("SpatialRelContains", "spatialrel"), None);
}
