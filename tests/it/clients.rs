//! Real clients of the contract against a real server: Python `requests` and the official
//! Node.js client (`marklogic`). They come from the registries through
//! `scripts/setup-clients.sh`, which these tests run themselves when the clients are not
//! installed yet; without npm, Python or the registries they fail, saying so.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Once;

use common::layers::*;
use common::*;
use serde_json::Value;

pub(crate) fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Install the clients once per test binary (the script is idempotent and quick when they
/// are there already).
pub(crate) fn setup() {
    static SETUP: Once = Once::new();
    SETUP.call_once(|| {
        let out = Command::new(root().join("scripts/setup-clients.sh"))
            .output()
            .unwrap_or_else(|e| panic!("cannot run scripts/setup-clients.sh: {e}"));
        assert!(
            out.status.success(),
            "scripts/setup-clients.sh failed (it needs npm, python3 and the registries):\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    });
}

pub(crate) fn python() -> PathBuf {
    root().join("target/clients-venv/bin/python")
}

/// Run a client script; its last line of output is a JSON summary.
pub(crate) fn run(program: &Path, args: &[String]) -> Value {
    setup();
    let out = Command::new(program)
        .args(args)
        .current_dir(root().join("tests/clients"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{} {args:?} failed:\n{stdout}\n{}",
        program.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// As Python `requests` met it: about one first PUT in five of 30-100 KB
/// failed with "connection closed without response" after the Digest challenge. 500 PUTs of
/// 100 KB, each on a fresh session, with no error.
#[test]
fn python_requests_digest_puts_of_100_kb() {
    let srv = TestServer::start();
    let summary = run(
        &python(),
        &[
            root()
                .join("tests/clients/python/digest_puts.py")
                .display()
                .to_string(),
            format!("http://{}", srv.addr),
            WRITER.0.into(),
            WRITER.1.into(),
            "500".into(),
        ],
    );
    assert_eq!(summary["errors"], serde_json::json!([]), "{summary}");
    assert_eq!(summary["statuses"]["201"], 500, "{summary}");
    // They are all there, whole.
    let mut reader = srv.client(READER);
    for i in [0, 250, 499] {
        let doc = reader
            .get(&format!("/v1/documents?uri=/py/{i}.json"))
            .json();
        assert_eq!(doc["pad"].as_str().map(str::len), Some(100 * 1024));
    }
}

/// As the Node.js client met it: the call after a 400 failed with
/// "socket hang up". Fifty 400s, each followed at once by a read that must succeed.
#[test]
fn node_client_calls_after_a_400() {
    let srv = TestServer::start();
    let node = PathBuf::from("node");
    let summary = run(
        &node,
        &[
            root()
                .join("tests/clients/node/after_400.js")
                .display()
                .to_string(),
            srv.addr.ip().to_string(),
            srv.addr.port().to_string(),
            WRITER.0.into(),
            WRITER.1.into(),
            "50".into(),
        ],
    );
    assert!(summary.get("fatal").is_none(), "{summary}");
    assert_eq!(summary["errors"], serde_json::json!([]), "{summary}");
    let refused = summary["refused"].as_array().unwrap();
    assert_eq!(refused.len(), 50, "{summary}");
    assert!(refused.iter().all(|s| s == 400), "{summary}");
}

fn project_dir() -> PathBuf {
    root().join("tests/fixtures/project")
}

/// The counties containing a point, by a scan with geo: the answer a query must give.
fn counties_containing(all: &[(i64, geo::Geometry<f64>, Value)], lon: f64, lat: f64) -> Value {
    use geo::Contains;
    let mut ids: Vec<i64> = all
        .iter()
        .filter(|(_, g, _)| g.contains(&geo::Point::new(lon, lat)))
        .map(|(id, _, _)| *id)
        .collect();
    ids.sort_unstable();
    serde_json::json!(ids)
}

fn sorted_ids(v: &Value) -> Value {
    let mut ids: Vec<i64> = v
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|i| i.as_i64().unwrap())
        .collect();
    ids.sort_unstable();
    serde_json::json!(ids)
}

/// A stored mollusk envelope's point, as the flow made it from X and Y.
fn envelope_point(doc: &Value) -> (f64, f64) {
    let c = &doc["envelope"]["instance"]["geometry"]["coordinates"];
    (c[0].as_f64().unwrap(), c[1].as_f64().unwrap())
}

/// A role's capabilities among permissions as either client reports them.
fn capabilities(perms: &Value, role: &str) -> Vec<String> {
    let mut caps: Vec<String> = match perms {
        Value::Array(a) => a
            .iter()
            .filter(|p| p["role-name"] == role)
            .flat_map(|p| p["capabilities"].as_array().cloned().unwrap_or_default())
            .filter_map(|c| c.as_str().map(str::to_string))
            .collect(),
        Value::Object(o) => match o.get(role) {
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(|c| c.as_str().map(str::to_string))
                .collect(),
            _ => Vec::new(),
        },
        _ => Vec::new(),
    };
    caps.sort();
    caps
}

/// The official Node.js client's calls, each checked against what was written or a
/// scan of the counties.
#[test]
fn node_client_through_the_contract() {
    let srv = TestServer::start_with(|c| c.project = Some(project_dir()));
    let all = load_counties(&mut srv.client(GEO));
    let (lon, lat) = (-97.33, 37.69);
    let out = run(
        Path::new("node"),
        &[
            root()
                .join("tests/clients/node/contract.js")
                .display()
                .to_string(),
            srv.addr.ip().to_string(),
            srv.addr.port().to_string(),
            ADMIN.0.into(),
            ADMIN.1.into(),
            lon.to_string(),
            lat.to_string(),
        ],
    );
    assert!(out.get("fatal").is_none(), "{out}");
    use serde_json::json;
    assert_eq!(out["single"], json!(["/node/single.json"]), "{out}");
    assert_eq!(
        out["bulk"],
        json!(["/node/b1.json", "/node/b2.json"]),
        "{out}"
    );
    assert_eq!(out["single_flow"], json!(["/node/m1.json"]), "{out}");
    assert_eq!(
        out["bulk_flow"],
        json!(["/node/m2.json", "/node/m3.json"]),
        "{out}"
    );
    // The flow ran on each: envelopes with the point of their X and Y.
    let mut r = srv.client(READER);
    for (uri, x, y) in [
        ("/node/m1.json", -70.5, 41.25),
        ("/node/m2.json", -71.0, 42.0),
        ("/node/m3.json", -72.5, 43.0),
    ] {
        assert_eq!(
            envelope_point(&r.get(&format!("/v1/documents?uri={uri}")).json()),
            (x, y),
            "{uri}"
        );
    }
    let many = out["read_many"]
        .as_array()
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(many.len(), 2, "the absent one is left out: {out}");
    assert_eq!(
        many[0],
        json!({"uri": "/node/b1.json", "content": {"n": 2}})
    );
    assert_eq!(many[1]["uri"], "/node/m2.json");
    assert_eq!(envelope_point(&many[1]["content"]), (-71.0, 42.0));
    let cats = out["read_categories"]
        .as_array()
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(cats.len(), 2, "{out}");
    assert_eq!(cats[0]["uri"], "/node/single.json");
    assert_eq!(cats[0]["content"], json!({"n": 1}));
    assert_eq!(cats[0]["collections"], json!(["node"]));
    assert_eq!(
        capabilities(&cats[0]["permissions"], "rest-reader"),
        ["read"]
    );
    assert_eq!(
        capabilities(&cats[0]["permissions"], "rest-writer"),
        ["update"]
    );
    assert_eq!(envelope_point(&cats[1]["content"]), (-72.5, 43.0));
    assert_eq!(out["probe"], json!([true, false]), "{out}");
    assert_eq!(out["models"], json!(["Counties"]), "{out}");
    let want = counties_containing(&all, lon, lat);
    assert_eq!(want.as_array().unwrap().len(), 1);
    assert_eq!(sorted_ids(&out["pip"]), want, "{out}");
}

/// The official Python client's calls, permissions in its documented form
/// (`{"rest-reader": "read"}`) included.
#[test]
fn python_client_through_the_contract() {
    let srv = TestServer::start_with(|c| c.project = Some(project_dir()));
    let all = load_counties(&mut srv.client(GEO));
    let (lon, lat) = (-104.99, 39.74);
    let out = run(
        &python(),
        &[
            root()
                .join("tests/clients/python/contract.py")
                .display()
                .to_string(),
            format!("http://{}", srv.addr),
            ADMIN.0.into(),
            ADMIN.1.into(),
            lon.to_string(),
            lat.to_string(),
        ],
    );
    use serde_json::json;
    assert_eq!(out["single"], json!(["/py/single.json"]), "{out}");
    assert_eq!(out["bulk"], json!(["/py/b1.json", "/py/b2.json"]), "{out}");
    assert_eq!(
        out["bulk_flow"],
        json!(["/py/m1.json", "/py/m2.json"]),
        "{out}"
    );
    let mut admin = srv.client(ADMIN);
    for (uri, x, y) in [("/py/m1.json", -70.5, 41.25), ("/py/m2.json", -71.0, 42.0)] {
        assert_eq!(
            envelope_point(&admin.get(&format!("/v1/documents?uri={uri}")).json()),
            (x, y),
            "{uri}"
        );
    }
    // The permissions were stored as given, on every document of the bulk writes too.
    for uri in ["/py/single.json", "/py/b2.json", "/py/m1.json"] {
        let p = admin
            .get(&format!("/v1/documents?uri={uri}&category=permissions"))
            .json();
        assert_eq!(
            capabilities(&p["permissions"], "rest-reader"),
            ["read"],
            "{uri}: {p}"
        );
        assert_eq!(
            capabilities(&p["permissions"], "rest-writer"),
            ["read", "update"],
            "{uri}: {p}"
        );
        // A reader can read it: the permissions are not empty.
        assert_eq!(
            srv.client(READER)
                .get(&format!("/v1/documents?uri={uri}"))
                .status,
            200
        );
    }
    let many = out["read_many"]
        .as_array()
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(many.len(), 2, "{out}");
    assert_eq!(many[0], json!({"uri": "/py/b1.json", "content": {"n": 2}}));
    assert_eq!(envelope_point(&many[1]["content"]), (-71.0, 42.0));
    let cats = out["read_categories"]
        .as_array()
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(cats.len(), 2, "{out}");
    assert_eq!(cats[0]["content"], json!({"n": 1}));
    assert_eq!(cats[0]["collections"], json!(["py"]));
    assert_eq!(
        capabilities(&cats[0]["permissions"], "rest-writer"),
        ["read", "update"],
        "{out}"
    );
    assert_eq!(envelope_point(&cats[1]["content"]), (-70.5, 41.25));
    assert_eq!(out["models"], json!(["Counties"]), "{out}");
    assert_eq!(
        sorted_ids(&out["pip"]),
        counties_containing(&all, lon, lat),
        "{out}"
    );
}

/// Koop 8 with the vendored MarkLogic provider, in front of a server, unauthenticated to its
/// own clients and Digest to the server; stopped when dropped.
pub(crate) struct Koop {
    child: std::process::Child,
    client: Client,
    addr: std::net::SocketAddr,
    /// Koop's standard error, shown when it stops early.
    log: TestDir,
}

impl Koop {
    pub(crate) fn start(server: std::net::SocketAddr, user: (&str, &str)) -> Koop {
        setup();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = serde_json::json!({
            "logLevel": "warn", "port": port, "ssl": {"enabled": false},
            "marklogic": {"connection": {"host": server.ip().to_string(), "port": server.port(),
                "user": user.0, "password": user.1, "authType": "DIGEST"}}
        });
        let log = temp_dir("koop-log");
        let stderr = std::fs::File::create(log.join("stderr")).unwrap();
        let mut child = Command::new("node")
            .arg("server.js")
            .current_dir(root().join("tests/clients/koop-provider-marklogic"))
            .env("NODE_CONFIG", config.to_string())
            .env("SUPPRESS_NO_CONFIG_WARNING", "1")
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("node runs Koop");
        // Ready once it accepts connections. A connection from the port to itself (the kernel
        // can pick the listening port, free until Koop binds it, as the source) does not count.
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            if let Ok(s) = std::net::TcpStream::connect(addr)
                && s.local_addr().ok() != s.peer_addr().ok()
            {
                return Koop {
                    child,
                    client: Client::new(addr, Auth::None),
                    addr,
                    log,
                };
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("Koop exited: {status}\n{}", Koop::stderr(&log));
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("Koop did not start\n{}", Koop::stderr(&log));
    }

    fn stderr(log: &TestDir) -> String {
        std::fs::read_to_string(log.join("stderr")).unwrap_or_default()
    }
}

/// A FeatureServer of the counties that a test asks: Koop's in front of geoshard, or
/// geoshard's own (`crate::arcgis`).
pub(crate) trait FeatureServer {
    /// An answer as JSON, with `f=json`: `path` is what follows `…/FeatureServer`.
    fn get(&mut self, path: &str, query: &[(&str, String)]) -> Value;

    /// The OBJECTIDs of a query's features, sorted.
    fn ids(&mut self, query: &[(&str, String)]) -> Vec<i64> {
        let mut q = query.to_vec();
        q.push(("returnIdsOnly", "true".into()));
        let v = self.get("/0/query", &q);
        let mut ids: Vec<i64> = v["objectIds"]
            .as_array()
            .unwrap_or_else(|| panic!("{v}"))
            .iter()
            .map(|i| i.as_i64().unwrap())
            .collect();
        ids.sort_unstable();
        ids
    }
}

impl FeatureServer for Koop {
    fn get(&mut self, path: &str, query: &[(&str, String)]) -> Value {
        let mut target = format!("/marklogic/rest/services/Counties/FeatureServer{path}?f=json");
        for (k, v) in query {
            target.push_str(&format!("&{k}={}", enc(v)));
        }
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("Koop exited: {status}\n{}", Koop::stderr(&self.log));
        }
        let r = self.client.get(&target);
        assert_eq!(r.status, 200, "{target}: {}", r.text());
        r.json()
    }
}

impl Drop for Koop {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The sorted ids of the counties `hit` selects: the oracle of the FeatureServer tests.
pub(crate) fn scan(
    all: &[(i64, geo::Geometry<f64>, Value)],
    hit: &dyn Fn(&geo::Geometry<f64>, &Value) -> bool,
) -> Vec<i64> {
    let mut v: Vec<i64> = all
        .iter()
        .filter(|(_, g, d)| hit(g, d))
        .map(|(id, _, _)| *id)
        .collect();
    v.sort_unstable();
    v
}

/// Koop's FeatureServer in front of the counties, each answer against a scan of the
/// counties with geo.
#[test]
fn koop_feature_server_over_the_counties() {
    let srv = TestServer::start();
    let all = load_counties(&mut srv.client(GEO));
    let mut koop = Koop::start(srv.addr, GEO);
    feature_server_over_the_counties(&mut koop, &srv, &all);
}

/// The queries the FeatureServer tests make of `fs`, over the counties `all` that `srv`
/// holds, each answer against a scan of the counties with geo: infos, where, a point with
/// intersects and contains, an envelope with each relation a box has, a polygon in WGS84
/// and Web Mercator, a distance, counts, object ids, order and paging, statistics.
pub(crate) fn feature_server_over_the_counties(
    koop: &mut dyn FeatureServer,
    srv: &TestServer,
    all: &[(i64, geo::Geometry<f64>, Value)],
) {
    use geo::{BoundingRect, Contains, Intersects, Relate};
    let scan = |hit: &dyn Fn(&geo::Geometry<f64>, &Value) -> bool| scan(all, hit);
    let s = |x: &str| x.to_string();

    // Service and layer info: names, fields, maxRecordCount, the data's extent.
    let (mut x0, mut y0, mut x1, mut y1) = (f64::MAX, f64::MAX, f64::MIN, f64::MIN);
    for (_, g, _) in all {
        let r = g.bounding_rect().unwrap();
        (x0, y0, x1, y1) = (
            x0.min(r.min().x),
            y0.min(r.min().y),
            x1.max(r.max().x),
            y1.max(r.max().y),
        );
    }
    let near = |e: &Value| {
        [("xmin", x0), ("ymin", y0), ("xmax", x1), ("ymax", y1)]
            .iter()
            .all(|(k, v)| (e[*k].as_f64().unwrap_or(f64::NAN) - v).abs() < 1e-6)
    };
    let svc = koop.get("", &[]);
    assert_eq!(svc["layers"][0]["name"], "shapes", "{svc}");
    assert_eq!(svc["layers"][0]["geometryType"], "esriGeometryPolygon");
    assert_eq!(svc["maxRecordCount"], 5000);
    assert!(near(&svc["fullExtent"]), "{}", svc["fullExtent"]);
    let layer = koop.get("/0", &[]);
    assert_eq!(layer["name"], "shapes");
    assert_eq!(layer["maxRecordCount"], 5000);
    assert!(near(&layer["extent"]), "{}", layer["extent"]);
    assert_eq!(field_names(&layer), ["OBJECTID", "name", "pop"]);
    let layers = koop.get("/layers", &[]);
    assert_eq!(layers["layers"][0]["name"], "shapes", "{layers}");

    // where.
    assert_eq!(
        koop.ids(&[("where", s("name = 'Washington'"))]),
        scan(&|_, d| d["name"] == "Washington")
    );
    // A point, with intersects and contains.
    let (lon, lat) = (-89.4, 43.07);
    let want = scan(&|g, _| g.contains(&geo::Point::new(lon, lat)));
    assert_eq!(want.len(), 1);
    for rel in ["esriSpatialRelIntersects", "esriSpatialRelContains"] {
        let q = [
            ("geometry", format!("{lon},{lat}")),
            ("geometryType", s("esriGeometryPoint")),
            ("spatialRel", s(rel)),
        ];
        assert_eq!(koop.ids(&q), want, "{rel}");
    }
    // An envelope, with each relation a box has.
    let (a, b, c, d) = (-90.3, 38.1, -88.9, 39.4);
    let rect = geo::Rect::new(geo::coord! {x: a, y: b}, geo::coord! {x: c, y: d});
    let rect_g = geo::Geometry::Rect(rect);
    for (rel, hit) in [
        (
            "esriSpatialRelIntersects",
            &(|g: &geo::Geometry<f64>| g.intersects(&rect)) as &dyn Fn(&geo::Geometry<f64>) -> bool,
        ),
        ("esriSpatialRelWithin", &|g| rect.contains(g)),
        ("esriSpatialRelContains", &|g| g.contains(&rect)),
        ("esriSpatialRelTouches", &|g| g.relate(&rect_g).is_touches()),
        ("esriSpatialRelOverlaps", &|g| {
            g.relate(&rect_g).is_overlaps()
        }),
        ("esriSpatialRelEnvelopeIntersects", &|g| {
            g.bounding_rect().unwrap().intersects(&rect)
        }),
    ] {
        let q = [
            ("geometry", format!("{a},{b},{c},{d}")),
            ("geometryType", s("esriGeometryEnvelope")),
            ("spatialRel", s(rel)),
        ];
        assert_eq!(koop.ids(&q), scan(&|g, _| hit(g)), "{rel}");
    }
    // A polygon in Esri JSON, in WGS84 and in Web Mercator (inSR 102100).
    let ring = [(-100.0, 35.0), (-97.0, 40.0), (-94.0, 35.0), (-100.0, 35.0)];
    let triangle = geo::Polygon::new(ring.to_vec().into(), vec![]);
    let want = scan(&|g, _| g.intersects(&triangle));
    let merc = |(x, y): (f64, f64)| {
        const R: f64 = 6_378_137.0;
        (
            R * f64::to_radians(x),
            R * (std::f64::consts::FRAC_PI_4 + f64::to_radians(y) / 2.0)
                .tan()
                .ln(),
        )
    };
    let wgs: Vec<[f64; 2]> = ring.iter().map(|&(x, y)| [x, y]).collect();
    let web: Vec<[f64; 2]> = ring.iter().map(|&p| merc(p)).map(|(x, y)| [x, y]).collect();
    for (coords, sr) in [(wgs, 4326), (web, 102100)] {
        let q = [
            (
                "geometry",
                serde_json::json!({"rings": [coords], "spatialReference": {"wkid": sr}})
                    .to_string(),
            ),
            ("geometryType", s("esriGeometryPolygon")),
            ("inSR", sr.to_string()),
            ("spatialRel", s("esriSpatialRelIntersects")),
        ];
        assert_eq!(koop.ids(&q), want, "inSR {sr}");
    }
    // A distance from a point: at least the county holding it, and exactly what the
    // server's own distance query gives (itself checked against a geodesic scan).
    let q = [
        ("geometry", format!("{lon},{lat}")),
        ("geometryType", s("esriGeometryPoint")),
        ("distance", s("30")),
        ("units", s("esriSRUnit_Kilometer")),
    ];
    let got = koop.ids(&q);
    let direct = srv
        .client(GEO)
        .post_json(
            "/v1/resources/geoQueryService",
            &serde_json::json!({"params": {"id": "Counties", "layer": 0, "method": "query"},
                "query": {"geometry": {"x": lon, "y": lat}, "distance": 30, "units": "esriSRUnit_Kilometer", "returnIdsOnly": true}})
            .to_string(),
        )
        .json();
    assert_eq!(serde_json::json!(got), sorted_ids(&direct["objectIds"]));
    assert!(
        got.len() > 1 && got.contains(&scan(&|g, _| g.contains(&geo::Point::new(lon, lat)))[0])
    );
    // Counts, object ids, order and paging.
    let count = koop.get(
        "/0/query",
        &[
            ("where", s("name LIKE 'W%'")),
            ("returnCountOnly", s("true")),
        ],
    );
    let w = scan(&|_, d| d["name"].as_str().unwrap().starts_with('W'));
    assert_eq!(count["count"], w.len());
    let v = koop.get(
        "/0/query",
        &[
            ("objectIds", s("1001,6037,48201")),
            ("outFields", s("name")),
        ],
    );
    let mut names: Vec<&str> = v["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["attributes"]["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["Autauga", "Harris", "Los Angeles"]);
    let mut by_name: Vec<(String, i64)> = all
        .iter()
        .filter(|(_, _, d)| d["name"].as_str().unwrap().starts_with('W'))
        .map(|(id, _, d)| (d["name"].as_str().unwrap().to_string(), *id))
        .collect();
    by_name.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for (offset, page) in [(0, 0), (7, 1)] {
        let v = koop.get(
            "/0/query",
            &[
                ("where", s("name LIKE 'W%'")),
                ("orderByFields", s("name DESC, OBJECTID")),
                ("outFields", s("name,OBJECTID")),
                ("resultOffset", offset.to_string()),
                ("resultRecordCount", s("7")),
                ("returnGeometry", s("false")),
            ],
        );
        let got: Vec<(String, i64)> = v["features"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["attributes"]["name"].as_str().unwrap().to_string(),
                    f["attributes"]["OBJECTID"].as_i64().unwrap(),
                )
            })
            .collect();
        assert_eq!(got, by_name[offset..offset + 7], "page {page}");
        assert_eq!(v["exceededTransferLimit"], true, "page {page}");
    }
    // Statistics grouped by a field.
    let stats = koop.get(
        "/0/query",
        &[
            ("where", s("name IN ('Washington', 'Jefferson', 'Franklin')")),
            ("outStatistics", s(r#"[{"statisticType":"count","onStatisticField":"OBJECTID","outStatisticFieldName":"n"}]"#)),
            ("groupByFieldsForStatistics", s("name")),
        ],
    );
    let mut got: Vec<(String, i64)> = stats["features"]
        .as_array()
        .unwrap_or_else(|| panic!("{stats}"))
        .iter()
        .map(|f| {
            (
                f["attributes"]["name"].as_str().unwrap().to_string(),
                f["attributes"]["n"].as_f64().unwrap() as i64,
            )
        })
        .collect();
    got.sort();
    let want: Vec<(String, i64)> = ["Franklin", "Jefferson", "Washington"]
        .iter()
        .map(|n| (n.to_string(), scan(&|_, d| d["name"] == *n).len() as i64))
        .collect();
    assert_eq!(got, want);
}

/// The Node.js client keeps its first nonce and ignores `stale=true`, so
/// every call failed once the nonce's time ran out. Calls keep it in use: a client calling
/// for three times the idle limit gets no 401.
#[test]
fn a_node_client_keeps_calling_past_the_nonce_limits() {
    let srv = TestServer::start_with(|c| {
        // Two seconds, not one: a loaded CI machine can be a second late with the first call.
        c.nonce_idle_secs = 2;
        c.nonce_ttl_secs = 2;
    });
    let out = run(
        Path::new("node"),
        &[
            root()
                .join("tests/clients/node/long_lived.js")
                .display()
                .to_string(),
            srv.addr.ip().to_string(),
            srv.addr.port().to_string(),
            READER.0.into(),
            READER.1.into(),
            "7000".into(),
        ],
    );
    assert!(out.get("fatal").is_none(), "{out}");
    assert_eq!(out["errors"], serde_json::json!([]), "{out}");
    assert!(out["calls"].as_u64().unwrap() >= 20, "{out}");
}

/// The official Node.js client (and Koop, which holds one for its life) never asks for a new
/// nonce and takes a 401 as an error: one client, kept across a clean restart, a crash and a
/// quiet spell past the idle limit, gets an answer every time.
#[test]
fn a_node_client_keeps_its_nonce_across_restarts_and_quiet_spells() {
    use std::io::{BufRead, BufReader, Write};
    setup();
    let dir = temp_dir("node-restarts");
    seed_users(dir.path());
    let env = [
        ("GEOSHARD_NONCE_IDLE_SECS", "2"),
        ("GEOSHARD_NONCE_TTL_SECS", "2"),
    ];
    let srv = ChildServer::start(dir.path(), &env);
    let listen = srv.addr.to_string();
    let mut node = Command::new("node")
        .arg(root().join("tests/clients/node/across_restarts.js"))
        .args([
            srv.addr.ip().to_string(),
            srv.addr.port().to_string(),
            READER.0.into(),
            READER.1.into(),
        ])
        .current_dir(root().join("tests/clients"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("node");
    let mut input = node.stdin.take().unwrap();
    let mut output = BufReader::new(node.stdout.take().unwrap()).lines();
    let mut call = |when: &str| {
        writeln!(input, "call").unwrap();
        let line = output.next().expect("an answer line").unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["ok"], true, "{when}: {v}");
    };
    call("first");
    call("second");
    // A clean restart on the same address.
    assert!(srv.stop().success());
    let srv = ChildServer::start_at(dir.path(), &listen, &env);
    call("after a clean restart");
    // A crash and a restart.
    srv.kill();
    let srv = ChildServer::start_at(dir.path(), &listen, &env);
    call("after a crash");
    call("after a crash, again");
    // A quiet spell past the idle limit (and the first-use limit).
    std::thread::sleep(std::time::Duration::from_millis(3500));
    call("after a quiet spell");
    drop(input);
    let _ = node.wait();
    srv.kill();
}

/// One Koop, kept across a clean restart and a crash of the geoshard behind it, answers every
/// query: its client keeps its first nonce, and that nonce stays good.
#[test]
fn koop_keeps_answering_across_geoshard_restarts() {
    let dir = temp_dir("koop-restarts");
    seed_users(dir.path());
    let srv = ChildServer::start(dir.path(), &[]);
    let listen = srv.addr.to_string();
    let all = load_counties(&mut srv.client(GEO));
    let mut want: Vec<i64> = all
        .iter()
        .filter(|(_, _, d)| d["name"] == "Washington")
        .map(|(id, _, _)| *id)
        .collect();
    want.sort_unstable();
    assert!(want.len() > 10);
    let mut koop = Koop::start(srv.addr, GEO);
    let washington = [("where", "name = 'Washington'".to_string())];
    assert_eq!(koop.ids(&washington), want, "before");
    assert!(srv.stop().success());
    let srv = ChildServer::start_at(dir.path(), &listen, &[]);
    assert_eq!(koop.ids(&washington), want, "after a clean restart");
    srv.kill();
    let srv = ChildServer::start_at(dir.path(), &listen, &[]);
    assert_eq!(koop.ids(&washington), want, "after a crash");
    assert_eq!(koop.ids(&washington), want, "after a crash, again");
    drop(srv);
}

/// The ArcGIS API for Python (`arcgis` from PyPI, in target/arcgis-venv) through Koop: a
/// `FeatureLayer`'s query with a where clause, `return_count_only`, an envelope filter and
/// pages of 500, each against a scan of the counties.
#[test]
fn arcgis_api_for_python_through_koop() {
    use geo::Intersects;
    let srv = TestServer::start();
    let all = load_counties(&mut srv.client(GEO));
    let koop = Koop::start(srv.addr, GEO);
    let url = format!(
        "http://{}/marklogic/rest/services/Counties/FeatureServer/0",
        koop.addr
    );
    let summary = run(
        &root().join("target/arcgis-venv/bin/python"),
        &[
            root()
                .join("tests/clients/python/arcgis_check.py")
                .display()
                .to_string(),
            url,
        ],
    );
    let scan = |hit: &dyn Fn(&geo::Geometry<f64>, &Value) -> bool| scan(&all, hit);
    let ids = |k: &str| -> Vec<i64> {
        summary[k]
            .as_array()
            .unwrap_or_else(|| panic!("{k}: {summary}"))
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect()
    };
    let washington = scan(&|_, d| d["name"] == "Washington");
    assert!(washington.len() > 25, "{washington:?}");
    assert_eq!(ids("washington"), washington);
    assert_eq!(summary["count"], all.len(), "{summary}");
    let rect = geo::Rect::new(
        geo::coord! {x: -105.1, y: 39.6},
        geo::coord! {x: -104.8, y: 39.9},
    );
    let in_box = scan(&|g, _| g.intersects(&rect));
    assert!(in_box.len() >= 4, "{in_box:?}");
    assert_eq!(ids("box"), in_box);
    // Every county once, in OBJECTID order.
    assert_eq!(ids("paged"), scan(&|_, _| true));
}
