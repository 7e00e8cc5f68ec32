//! geoshard's own FeatureServer under `/arcgis/`: the queries the Koop tests make, answered
//! against the same scans, and answered as Koop answers them; tokens and Esri's errors; a
//! harvester paging by POST; GDAL's ESRIJSON driver paging a layer; and the ArcGIS API for
//! Python with a token over the GeoNames places.

use crate::clients::{self, FeatureServer, feature_server_over_the_counties, scan};
use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use common::layers::*;
use common::*;
use serde_json::Value;

/// geoshard's FeatureServer of the service `Counties`, asked by a client with Digest or, when
/// `token` is set, with no credentials but the token.
struct Native {
    client: Client,
    token: Option<String>,
}

impl FeatureServer for Native {
    fn get(&mut self, path: &str, query: &[(&str, String)]) -> Value {
        let mut target = format!("/arcgis/rest/services/Counties/FeatureServer{path}?f=json");
        for (k, v) in query {
            target.push_str(&format!("&{k}={}", enc(v)));
        }
        if let Some(t) = &self.token {
            target.push_str(&format!("&token={}", enc(t)));
        }
        let r = self.client.get(&target);
        assert_eq!(r.status, 200, "{target}: {}", r.text());
        r.json()
    }
}

/// A token for `user` from generateToken.
fn token(c: &mut Client, user: (&str, &str), minutes: u32) -> String {
    let form = format!(
        "username={}&password={}&expiration={minutes}&f=json",
        enc(user.0),
        enc(user.1)
    );
    let r = c.request(
        "POST",
        "/arcgis/tokens/generateToken",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        form.as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["token"].as_str().unwrap().to_string()
}

/// Every query the Koop tests make, through geoshard's own FeatureServer, with Digest and
/// with a token: each answer as the scans of the counties give it.
#[test]
fn the_koop_tests_queries_answer_alike_natively() {
    let srv = TestServer::start();
    let all = load_counties(&mut srv.client(GEO));
    let mut digest = Native {
        client: srv.client(GEO),
        token: None,
    };
    feature_server_over_the_counties(&mut digest, &srv, &all);
    let t = token(&mut srv.anonymous(), GEO, 10);
    let mut tokened = Native {
        client: srv.anonymous(),
        token: Some(t),
    };
    feature_server_over_the_counties(&mut tokened, &srv, &all);
}

/// A ring as compared: its closing position dropped, counterclockwise, from its least
/// position.
fn ring_key(ring: &[[f64; 2]]) -> Vec<[f64; 2]> {
    let mut r: Vec<[f64; 2]> = ring.to_vec();
    if r.len() > 1 && r.first() == r.last() {
        r.pop();
    }
    let area: f64 = (0..r.len())
        .map(|i| {
            let (a, b) = (r[i], r[(i + 1) % r.len()]);
            a[0] * b[1] - b[0] * a[1]
        })
        .sum();
    if area < 0.0 {
        r.reverse();
    }
    let least = (0..r.len())
        .min_by(|&i, &j| r[i].partial_cmp(&r[j]).unwrap())
        .unwrap_or(0);
    r.rotate_left(least);
    r
}

/// Every ring of a geometry, as compared, in order.
fn rings_of(v: &Value) -> Vec<Vec<[f64; 2]>> {
    let ring = |r: &Value| -> Vec<[f64; 2]> {
        r.as_array()
            .unwrap()
            .iter()
            .map(|p| [p[0].as_f64().unwrap(), p[1].as_f64().unwrap()])
            .collect()
    };
    let mut out: Vec<Vec<[f64; 2]>> = if let Some(rings) = v["rings"].as_array() {
        rings.iter().map(ring).collect()
    } else {
        match v["type"].as_str() {
            Some("Polygon") => v["coordinates"]
                .as_array()
                .unwrap()
                .iter()
                .map(ring)
                .collect(),
            Some("MultiPolygon") => v["coordinates"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|p| p.as_array().unwrap().iter().map(ring))
                .collect(),
            other => panic!("not a polygon: {other:?}"),
        }
    };
    out = out.iter().map(|r| ring_key(r)).collect();
    out.sort_by(|a, b| a[0].partial_cmp(&b[0]).unwrap());
    out
}

/// Whether two geometries have the same rings, position by position within 1e-9°.
fn same_rings(a: &Value, b: &Value) -> Result<(), String> {
    let (x, y) = (rings_of(a), rings_of(b));
    if x.len() != y.len() {
        return Err(format!("{} rings against {}", x.len(), y.len()));
    }
    for (r, s) in x.iter().zip(&y) {
        if r.len() != s.len() {
            return Err(format!(
                "a ring of {} positions against {}",
                r.len(),
                s.len()
            ));
        }
        for (p, q) in r.iter().zip(s) {
            if (p[0] - q[0]).abs() > 1e-9 || (p[1] - q[1]).abs() > 1e-9 {
                return Err(format!("{p:?} against {q:?}"));
            }
        }
    }
    Ok(())
}

/// Features by OBJECTID: attributes, and geometry when there is one.
fn by_id(v: &Value) -> BTreeMap<i64, (Value, Value)> {
    v["features"]
        .as_array()
        .unwrap_or_else(|| panic!("no features: {v}"))
        .iter()
        .map(|f| {
            let a = f["attributes"].clone();
            (a["OBJECTID"].as_i64().unwrap(), (a, f["geometry"].clone()))
        })
        .collect()
}

/// The same queries through Koop and natively give the same features (attributes exact,
/// rings within 1e-9°), counts, ids, statistics and transfer limits.
#[test]
fn answers_equal_koops() {
    let srv = TestServer::start();
    let _all = load_counties(&mut srv.client(GEO));
    let mut koop = clients::Koop::start(srv.addr, GEO);
    let mut native = Native {
        client: srv.client(GEO),
        token: None,
    };
    let s = |x: &str| x.to_string();
    let queries: Vec<Vec<(&str, String)>> = vec![
        vec![("where", s("name LIKE 'W%'")), ("outFields", s("*"))],
        vec![
            ("geometry", s("-89.4,43.07")),
            ("geometryType", s("esriGeometryPoint")),
            ("spatialRel", s("esriSpatialRelIntersects")),
            ("outFields", s("*")),
        ],
        vec![
            ("geometry", s("-90.3,38.1,-88.9,39.4")),
            ("geometryType", s("esriGeometryEnvelope")),
            ("outFields", s("OBJECTID,name")),
        ],
        vec![
            ("where", s("1=1")),
            ("orderByFields", s("name DESC, OBJECTID")),
            ("resultOffset", s("100")),
            ("resultRecordCount", s("40")),
            ("outFields", s("OBJECTID,name,pop")),
        ],
        vec![
            ("where", s("name = 'Adams'")),
            ("returnGeometry", s("false")),
        ],
    ];
    for q in &queries {
        let (k, n) = (koop.get("/0/query", q), native.get("/0/query", q));
        assert_eq!(
            k["exceededTransferLimit"].as_bool().unwrap_or(false),
            n["exceededTransferLimit"].as_bool().unwrap_or(false),
            "{q:?}"
        );
        assert_eq!(k["geometryType"], n["geometryType"], "{q:?}");
        let (k, n) = (by_id(&k), by_id(&n));
        assert!(!n.is_empty(), "{q:?}");
        assert_eq!(
            k.keys().collect::<Vec<_>>(),
            n.keys().collect::<Vec<_>>(),
            "{q:?}"
        );
        for (id, (ka, kg)) in &k {
            let (na, ng) = &n[id];
            assert_eq!(ka, na, "{q:?}: {id}");
            if kg.is_null() {
                assert!(ng.is_null(), "{q:?}: {id}");
            } else if let Err(e) = same_rings(kg, ng) {
                panic!("{q:?}: {id}: {e}");
            }
        }
    }
    for extra in [
        vec![
            ("where", s("name LIKE 'W%'")),
            ("returnCountOnly", s("true")),
        ],
        vec![("where", s("name LIKE 'W%'")), ("returnIdsOnly", s("true"))],
    ] {
        let (k, mut n) = (koop.get("/0/query", &extra), native.get("/0/query", &extra));
        if let (Some(a), Some(b)) = (k["objectIds"].as_array(), n["objectIds"].as_array_mut()) {
            let mut a = a.clone();
            a.sort_by_key(|v| v.as_i64());
            b.sort_by_key(|v| v.as_i64());
            assert_eq!(&a, b);
        } else {
            assert_eq!(k["count"], n["count"], "{extra:?}");
        }
    }
    let stats = vec![
        (
            "where",
            s("name IN ('Washington', 'Jefferson', 'Franklin')"),
        ),
        (
            "outStatistics",
            s(
                r#"[{"statisticType":"count","onStatisticField":"OBJECTID","outStatisticFieldName":"n"},{"statisticType":"max","onStatisticField":"pop","outStatisticFieldName":"most"}]"#,
            ),
        ),
        ("groupByFieldsForStatistics", s("name")),
    ];
    let rows = |v: &Value| -> Vec<(String, f64, Value)> {
        let mut r: Vec<(String, f64, Value)> = v["features"]
            .as_array()
            .unwrap_or_else(|| panic!("{v}"))
            .iter()
            .map(|f| {
                let a = &f["attributes"];
                (
                    a["name"].as_str().unwrap().to_string(),
                    a["n"].as_f64().unwrap(),
                    a["most"].clone(),
                )
            })
            .collect();
        r.sort_by(|a, b| a.0.cmp(&b.0));
        r
    };
    let (k, n) = (koop.get("/0/query", &stats), native.get("/0/query", &stats));
    assert_eq!(rows(&k), rows(&n));
    assert_eq!(rows(&n).len(), 3);
}

/// The counties as their source file has them: OBJECTID (the FIPS code) to the geometry.
fn source_counties() -> BTreeMap<i64, Value> {
    counties()
        .into_iter()
        .map(|(id, _, doc)| (id, doc["geometry"].clone()))
        .collect()
}

/// A harvester pages the counties by POST (form-encoded) with `resultOffset`, as ArcGIS
/// clients and harvesters do: every county comes back exactly once, with the geometry its
/// source file has.
#[test]
fn a_post_harvester_gets_every_county_once() {
    let srv = TestServer::start();
    let all = load_counties(&mut srv.client(GEO));
    let source = source_counties();
    assert_eq!(source.len(), all.len());
    let mut c = srv.client(GEO);
    let mut seen: BTreeMap<i64, usize> = BTreeMap::new();
    let mut offset = 0;
    loop {
        let form = format!(
            "where={}&outFields=OBJECTID,name&returnGeometry=true&resultOffset={offset}\
             &resultRecordCount=700&f=json",
            enc("1=1")
        );
        let r = c.request(
            "POST",
            "/arcgis/rest/services/Counties/FeatureServer/0/query",
            &[("Content-Type", "application/x-www-form-urlencoded")],
            form.as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        let page = v["features"].as_array().unwrap();
        for f in page {
            let id = f["attributes"]["OBJECTID"].as_i64().unwrap();
            *seen.entry(id).or_default() += 1;
            if let Err(e) = same_rings(&f["geometry"], &source[&id]) {
                panic!("county {id}: {e}");
            }
        }
        offset += page.len();
        if v["exceededTransferLimit"] != true {
            break;
        }
        assert_eq!(page.len(), 700);
    }
    assert!(seen.values().all(|&n| n == 1), "some counties came twice");
    assert_eq!(
        seen.keys().collect::<Vec<_>>(),
        source.keys().collect::<Vec<_>>()
    );
}

/// Tokens: made by generateToken for the right password only, taken as `token=`, `Bearer`
/// and `X-Esri-Authorization`, refused when altered; no credentials is 401 with challenges
/// and Esri's 499; a caller without the geo role gets 403; errors are Esri's.
#[test]
fn tokens_roles_and_esri_errors() {
    let srv = TestServer::start();
    load_counties(&mut srv.client(GEO));
    let mut anon = srv.anonymous();
    let info = anon.get("/arcgis/rest/info?f=json");
    assert_eq!(info.status, 200, "{}", info.text());
    assert!(
        info.json()["authInfo"]["tokenServicesUrl"]
            .as_str()
            .unwrap()
            .ends_with("/arcgis/tokens/generateToken")
    );
    let esri = |r: &Response| -> (i64, String) {
        let v = r.json();
        (
            v["error"]["code"].as_i64().unwrap_or(-1),
            v["error"]["details"].to_string(),
        )
    };
    let r = anon.get("/arcgis/rest/services?f=json");
    assert_eq!(r.status, 401);
    assert_eq!(esri(&r).0, 499);
    assert!(r.headers_named("www-authenticate").len() == 2);
    // generateToken: POST only, the right password only.
    let r = anon.get("/arcgis/tokens/generateToken?username=geo&password=geo-pw");
    assert_eq!((r.status, esri(&r).0), (405, 405));
    let r = anon.request(
        "POST",
        "/arcgis/tokens/generateToken",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        b"username=geo&password=nope&f=json",
    );
    assert_eq!(r.status, 400);
    assert!(
        esri(&r).1.contains("Invalid username or password"),
        "{}",
        r.text()
    );
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let r = anon.request(
        "POST",
        "/arcgis/tokens/generateToken",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        b"username=geo&password=geo-pw&expiration=30&f=json",
    );
    let expires = r.json()["expires"].as_i64().unwrap();
    assert!((expires - before - 30 * 60_000).abs() < 60_000, "{expires}");
    let t = r.json()["token"].as_str().unwrap().to_string();
    let services = |r: Response| -> Vec<String> {
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["services"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        services(anon.get(&format!("/arcgis/rest/services?token={}", enc(&t)))),
        ["Counties"]
    );
    for header in ["Authorization", "X-Esri-Authorization"] {
        let bearer = format!("Bearer {t}");
        let r = anon.request("GET", "/arcgis/rest/services", &[(header, &bearer)], b"");
        assert_eq!(services(r), ["Counties"], "{header}");
    }
    // A token in a POST's form.
    let r = anon.request(
        "POST",
        "/arcgis/rest/services/Counties/FeatureServer/0/query",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        format!("where=1%3D1&returnCountOnly=true&token={}", enc(&t)).as_bytes(),
    );
    assert_eq!(r.json()["count"], 3231, "{}", r.text());
    let altered = format!("{}x", &t[..t.len() - 1]);
    let r = anon.get(&format!("/arcgis/rest/services?token={}", enc(&altered)));
    assert_eq!((r.status, esri(&r).0), (498, 498));
    // A reader of documents only: no geo role, no services.
    let reader = token(&mut anon, READER, 5);
    let r = anon.get(&format!(
        "/arcgis/rest/services/Counties/FeatureServer/0/query?where=1%3D1&token={reader}"
    ));
    assert_eq!((r.status, esri(&r).0), (403, 403));
    // Esri's errors, naming what is wrong.
    let mut c = srv.client(GEO);
    let base = "/arcgis/rest/services/Counties/FeatureServer";
    for (target, status, says) in [
        (format!("{base}/0/query?where=nme%3D1"), 400, "nme"),
        (
            format!("{base}/0/query?where=1%3D1&outSR=2154"),
            400,
            "outSR",
        ),
        (format!("{base}/0/query?f=html"), 400, "f=html"),
        (
            format!("{base}/0/query?geometryPrecision=40"),
            400,
            "geometryPrecision",
        ),
        (
            format!("{base}/0/query?returnCountOnly=maybe"),
            400,
            "maybe",
        ),
        (format!("{base}/9"), 404, "9"),
        (
            "/arcgis/rest/services/Nothing/FeatureServer".into(),
            404,
            "Nothing",
        ),
        (
            "/arcgis/rest/services/Counties/MapServer".into(),
            404,
            "MapServer",
        ),
    ] {
        let r = c.get(&target);
        assert_eq!(r.status, status, "{target}: {}", r.text());
        let (code, details) = esri(&r);
        assert_eq!(code, i64::from(status), "{target}");
        assert!(details.contains(says), "{target}: {details}");
    }
    let r = c.request("PUT", &format!("{base}/0/query"), &[], b"");
    assert_eq!((r.status, esri(&r).0), (405, 405));
    // Counted by route.
    let metrics = srv.client(ADMIN).get("/metrics").text();
    for route in ["arcgisQuery", "arcgisToken", "arcgisInfo"] {
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("geoshard_http_requests_total")
                    && l.contains(&format!("route=\"{route}\""))),
            "{route}"
        );
    }
}

/// Extents and counts: `returnExtentOnly` with and without a count, in WGS84 and Web
/// Mercator, against the box of the scanned counties.
#[test]
fn extents_and_web_mercator() {
    use geo::BoundingRect;
    let srv = TestServer::start();
    let all = load_counties(&mut srv.client(GEO));
    let mut fs = Native {
        client: srv.client(GEO),
        token: None,
    };
    let w: Vec<&(i64, geo::Geometry<f64>, Value)> = all
        .iter()
        .filter(|(_, _, d)| d["name"].as_str().unwrap().starts_with('W'))
        .collect();
    let mut b = [f64::MAX, f64::MAX, f64::MIN, f64::MIN];
    for (_, g, _) in &w {
        let r = g.bounding_rect().unwrap();
        b = [
            b[0].min(r.min().x),
            b[1].min(r.min().y),
            b[2].max(r.max().x),
            b[3].max(r.max().y),
        ];
    }
    let s = |x: &str| x.to_string();
    let v = fs.get(
        "/0/query",
        &[
            ("where", s("name LIKE 'W%'")),
            ("returnExtentOnly", s("true")),
            ("returnCountOnly", s("true")),
        ],
    );
    assert_eq!(v["count"], w.len());
    for (k, want) in ["xmin", "ymin", "xmax", "ymax"].iter().zip(b) {
        assert!(
            (v["extent"][k].as_f64().unwrap() - want).abs() < 1e-9,
            "{k}: {v}"
        );
    }
    let v = fs.get(
        "/0/query",
        &[
            ("where", s("name LIKE 'W%'")),
            ("returnExtentOnly", s("true")),
            ("outSR", s("102100")),
        ],
    );
    assert_eq!(v["extent"]["spatialReference"]["latestWkid"], 3857);
    let x = 6_378_137.0 * b[0].to_radians();
    assert!(
        (v["extent"]["xmin"].as_f64().unwrap() - x).abs() < 1e-6,
        "{v}"
    );
    // A point in Web Mercator, read back to degrees.
    let v = fs.get(
        "/0/query",
        &[
            ("objectIds", s("8031")),
            ("outSR", s("3857")),
            ("geometryPrecision", s("2")),
        ],
    );
    let ring = &v["features"][0]["geometry"]["rings"][0];
    let x = ring[0][0].as_f64().unwrap();
    assert!((-11_800_000.0..-11_500_000.0).contains(&x), "{ring}");
    assert_eq!((x * 100.0).round() / 100.0, x);
    assert_eq!(v["spatialReference"]["wkid"], 102100);
}

/// GDAL's ESRIJSON driver pages the counties from a `/query` URL with a token
/// (`FEATURE_SERVER_PAGING`): every county once, its geometry as the source file has it.
#[test]
fn gdal_pages_a_layer_through_esrijson() {
    let srv = TestServer::start();
    load_counties(&mut srv.client(GEO));
    let t = token(&mut srv.anonymous(), GEO, 10);
    let out = temp_dir("arcgis-gdal");
    let file = out.path().join("counties.geojson");
    let url = format!(
        "http://{}/arcgis/rest/services/Counties/FeatureServer/0/query?where=1%3D1&outFields=*\
         &resultRecordCount=600&f=json&token={}",
        srv.addr,
        enc(&t)
    );
    let run = Command::new("ogr2ogr")
        .args(["-f", "GeoJSON", "-oo", "FEATURE_SERVER_PAGING=YES"])
        .arg(&file)
        .arg(&url)
        .output()
        .expect("ogr2ogr runs (gdal-bin)");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let got: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let source = source_counties();
    let mut seen: BTreeMap<i64, usize> = BTreeMap::new();
    for f in got["features"].as_array().unwrap() {
        let id = f["properties"]["OBJECTID"].as_i64().unwrap();
        *seen.entry(id).or_default() += 1;
        if let Err(e) = same_rings(&f["geometry"], &source[&id]) {
            panic!("county {id}: {e}");
        }
    }
    assert!(seen.values().all(|&n| n == 1), "some counties came twice");
    assert_eq!(seen.len(), source.len());
}

/// The GeoNames places the test loads: OBJECTID (the row) to country and position.
fn places(rows: usize) -> Vec<(i64, String, f64, f64)> {
    let text = std::fs::read_to_string(shared_data().join("real").join("geonames-cities1000.csv"))
        .unwrap();
    let mut r = csv::Reader::from_reader(text.as_bytes());
    r.records()
        .take(rows)
        .enumerate()
        .map(|(i, rec)| {
            let rec = rec.unwrap();
            let lat: f64 = rec[0].parse().unwrap();
            let lon: f64 = rec[1].parse().unwrap();
            (i as i64 + 1, rec[5].to_string(), lon, lat)
        })
        .collect()
}

/// The ArcGIS API for Python (`arcgis`), with a token it is given, over all 144,563
/// GeoNames places: a where, a count, an envelope filter, statistics and every id page by
/// page, each against a scan of the source file; then each relation of boxes with the
/// places, against the scan.
#[test]
fn arcgis_api_for_python_with_a_token_over_the_places() {
    clients::setup();
    let dir = temp_dir("arcgis-places");
    seed_users(dir.path());
    let csv = shared_data().join("real").join("geonames-cities1000.csv");
    let loaded = Command::new(env!("CARGO_BIN_EXE_geoshard"))
        .args(["load", "--quiet", "--service", "Places", "--data-dir"])
        .arg(dir.path())
        .arg(&csv)
        .status()
        .unwrap();
    assert!(loaded.success());
    let all = places(usize::MAX);
    assert_eq!(all.len(), 144_563);
    let srv = ChildServer::start(dir.path(), &[]);
    let layer = format!(
        "http://{}/arcgis/rest/services/Places/FeatureServer/0",
        srv.addr
    );
    let summary = clients::run(
        &clients::root().join("target/arcgis-venv/bin/python"),
        &[
            clients::root()
                .join("tests/clients/python/arcgis_token_check.py")
                .display()
                .to_string(),
            format!("http://{}/arcgis", srv.addr),
            layer,
            GEO.0.into(),
            GEO.1.into(),
        ],
    );
    let ids = |k: &str| -> Vec<i64> {
        let mut v: Vec<i64> = summary[k]
            .as_array()
            .unwrap_or_else(|| panic!("{k}: {summary}"))
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect();
        v.sort_unstable();
        v
    };
    let fr = all.iter().filter(|p| p.1 == "FR").count();
    assert_eq!(summary["count_fr"], fr, "{summary}");
    assert_eq!(summary["count"], all.len(), "{summary}");
    let in_box: Vec<i64> = all
        .iter()
        .filter(|p| (2.2..=2.5).contains(&p.2) && (48.7..=49.0).contains(&p.3))
        .map(|p| p.0)
        .collect();
    assert!(in_box.len() > 20, "{}", in_box.len());
    assert_eq!(ids("box"), in_box);
    let mut per_cc: BTreeMap<&str, i64> = BTreeMap::new();
    for p in all
        .iter()
        .filter(|p| ["FR", "DE", "IT"].contains(&p.1.as_str()))
    {
        *per_cc.entry(p.1.as_str()).or_default() += 1;
    }
    let stats: BTreeMap<String, i64> = summary["stats"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_f64().unwrap() as i64))
        .collect();
    let want: BTreeMap<String, i64> = per_cc.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    assert_eq!(stats, want);
    // Every place once, in OBJECTID order.
    let paged: Vec<i64> = summary["paged"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(paged, (1..=all.len() as i64).collect::<Vec<_>>());

    // Each relation of a box with the places, against a scan of the file. A point feature
    // matches every relation when it lies inside or on the query geometry (docs/contract.md
    // §5, as the contract's system answers; ArcGIS Server's `contains` would give none).
    let mut c = srv.client(GEO);
    for (x0, y0, x1, y1) in [
        (2.2137, 48.7071, 2.4913, 48.9377),
        (-74.1203, 40.5791, -73.7019, 40.9137),
        (139.5117, 35.5213, 139.9071, 35.8191),
    ] {
        let want: Vec<i64> = all
            .iter()
            .filter(|p| (x0..=x1).contains(&p.2) && (y0..=y1).contains(&p.3))
            .map(|p| p.0)
            .collect();
        assert!(want.len() > 10, "{}", want.len());
        for rel in [
            "esriSpatialRelIntersects",
            "esriSpatialRelEnvelopeIntersects",
            "esriSpatialRelWithin",
            "esriSpatialRelContains",
        ] {
            let target = format!(
                "/arcgis/rest/services/Places/FeatureServer/0/query?geometry={x0},{y0},{x1},{y1}\
                 &geometryType=esriGeometryEnvelope&spatialRel={rel}&returnIdsOnly=true&f=json"
            );
            let r = c.get(&target);
            assert_eq!(r.status, 200, "{target}: {}", r.text());
            let mut got: Vec<i64> = r.json()["objectIds"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_i64().unwrap())
                .collect();
            got.sort_unstable();
            assert_eq!(got, want, "{rel} {x0},{y0},{x1},{y1}");
        }
    }
    srv.kill();
}

/// `f=geojson`: the features a scan selects, each with its source file's geometry.
#[test]
fn geojson_answers_hold_the_same_features() {
    let srv = TestServer::start();
    let all = load_counties(&mut srv.client(GEO));
    let mut c = srv.client(GEO);
    let r = c.get(
        "/arcgis/rest/services/Counties/FeatureServer/0/query?where=name%20LIKE%20%27W%25%27\
         &outFields=OBJECTID,name&f=geojson",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/geo+json"));
    let v = r.json();
    let mut ids: Vec<i64> = v["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["properties"]["OBJECTID"].as_i64().unwrap())
        .collect();
    ids.sort_unstable();
    let want = scan(&all, &|_, d| d["name"].as_str().unwrap().starts_with('W'));
    assert_eq!(ids, want);
    let source = source_counties();
    for f in v["features"].as_array().unwrap() {
        let id = f["properties"]["OBJECTID"].as_i64().unwrap();
        assert_eq!(f["id"], id);
        if let Err(e) = same_rings(&f["geometry"], &source[&id]) {
            panic!("county {id}: {e}");
        }
    }
}

/// `f=pbf`, read by arcgis-pbf-parser (npm) and the `pbf` package, not by geoshard: the
/// features a scan selects with their source geometry (quantized to a nanodegree), a page's
/// transfer limit, counts and ids; and in Web Mercator with the JS API's
/// `quantizationParameters`, each ring within the tolerance of its source's box.
#[test]
fn pbf_answers_read_by_an_independent_decoder() {
    clients::setup();
    let srv = TestServer::start();
    let all = load_counties(&mut srv.client(GEO));
    let source = source_counties();
    let t = token(&mut srv.anonymous(), GEO, 10);
    let base = format!(
        "http://{}/arcgis/rest/services/Counties/FeatureServer/0/query?token={}&f=pbf",
        srv.addr,
        enc(&t)
    );
    let w = enc("name LIKE 'W%'");
    let quantization = enc(
        r#"{"mode":"view","originPosition":"upperLeft","tolerance":20,"extent":{"xmin":-20037508.342789244,"ymin":-20037508.342789244,"xmax":20037508.342789244,"ymax":20037508.342789244,"spatialReference":{"wkid":102100}}}"#,
    );
    let urls = [
        format!("{base}&where={w}&outFields=OBJECTID,name"),
        format!("{base}&where={w}&outFields=OBJECTID&resultRecordCount=5"),
        format!("{base}&where={w}&returnCountOnly=true"),
        format!("{base}&where={w}&returnIdsOnly=true"),
        format!(
            "{base}&where={w}&outFields=OBJECTID&outSR=102100&quantizationParameters={quantization}"
        ),
    ];
    let got = clients::run(
        Path::new("node"),
        &std::iter::once(
            clients::root()
                .join("tests/clients/node/pbf_decode.js")
                .display()
                .to_string(),
        )
        .chain(urls.iter().cloned())
        .collect::<Vec<_>>(),
    );
    let want = scan(&all, &|_, d| d["name"].as_str().unwrap().starts_with('W'));
    let names: BTreeMap<i64, &str> = all
        .iter()
        .map(|(id, _, d)| (*id, d["name"].as_str().unwrap()))
        .collect();
    // Features, with names and geometry.
    let fc = &got[0]["featureCollection"];
    let mut ids = Vec::new();
    for f in fc["features"].as_array().unwrap() {
        let id = f["properties"]["OBJECTID"].as_i64().unwrap();
        assert_eq!(f["id"], id);
        assert_eq!(f["properties"]["name"], names[&id], "{id}");
        if let Err(e) = same_rings(&f["geometry"], &source[&id]) {
            panic!("county {id}: {e}");
        }
        ids.push(id);
    }
    ids.sort_unstable();
    assert_eq!(ids, want);
    assert_eq!(got[0]["exceededTransferLimit"], false);
    assert_eq!(
        got[1]["featureCollection"]["features"]
            .as_array()
            .unwrap()
            .len(),
        5
    );
    assert_eq!(got[1]["exceededTransferLimit"], true);
    assert_eq!(
        got[2],
        serde_json::json!({"kind": "count", "count": want.len()})
    );
    let mut id_list: Vec<i64> = got[3]["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    id_list.sort_unstable();
    assert_eq!(
        (got[3]["name"].as_str(), id_list),
        (Some("OBJECTID"), want.clone())
    );
    // Web Mercator, quantized to 20 m: each county's box within 40 m of its source's rings'.
    let merc = |x: f64, y: f64| {
        const R: f64 = 6_378_137.0;
        (
            R * x.to_radians(),
            R * (std::f64::consts::FRAC_PI_4 + y.to_radians() / 2.0)
                .tan()
                .ln(),
        )
    };
    let bounds = |rings: &[Vec<[f64; 2]>]| {
        let mut b = [f64::MAX, f64::MAX, f64::MIN, f64::MIN];
        for p in rings.iter().flatten() {
            b = [
                b[0].min(p[0]),
                b[1].min(p[1]),
                b[2].max(p[0]),
                b[3].max(p[1]),
            ];
        }
        b
    };
    let mut seen = 0;
    for f in got[4]["featureCollection"]["features"].as_array().unwrap() {
        let id = f["properties"]["OBJECTID"].as_i64().unwrap();
        let got_box = bounds(&rings_of(&f["geometry"]));
        // A ring of no area (the source has one, out and back) is dropped in view mode.
        let src: Vec<Vec<[f64; 2]>> = rings_of(&source[&id])
            .into_iter()
            .filter(|r| {
                let area: f64 = (0..r.len())
                    .map(|i| {
                        let (a, b) = (r[i], r[(i + 1) % r.len()]);
                        a[0] * b[1] - b[0] * a[1]
                    })
                    .sum();
                area != 0.0
            })
            .map(|r| {
                r.into_iter()
                    .map(|[x, y]| {
                        let (a, b) = merc(x, y);
                        [a, b]
                    })
                    .collect()
            })
            .collect();
        let want_box = bounds(&src);
        for k in 0..4 {
            assert!(
                (got_box[k] - want_box[k]).abs() <= 40.0,
                "county {id}: {got_box:?} against {want_box:?}"
            );
        }
        seen += 1;
    }
    assert_eq!(seen, want.len());
}
