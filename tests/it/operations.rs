//! Operating the service: Prometheus metrics that move by what was done, request ids carried
//! from the request to its answer and its log lines, JSON logs, liveness and readiness.
//! One server process a test, since the metrics are the process's.

use crate::common;

use std::collections::HashMap;

use common::layers::{load_counties, query};
use common::*;
use serde_json::{Value, json};

/// The samples of a scrape, by name and labels (sorted `k=v` pairs), parsed with
/// `prometheus-parse`, an implementation of the text format independent of the encoder.
fn scrape(c: &mut Client) -> HashMap<String, f64> {
    let r = c.get("/metrics");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.header("content-type")
            .is_some_and(|t| t.starts_with("text/plain; version=0.0.4")),
        "{:?}",
        r.header("content-type")
    );
    let text = r.text();
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let parsed = prometheus_parse::Scrape::parse(lines).expect("a valid Prometheus text page");
    let mut out = HashMap::new();
    for s in parsed.samples {
        let mut labels: Vec<String> = s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        labels.sort();
        let value = match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            prometheus_parse::Value::Histogram(h) => h.iter().map(|b| b.count).fold(0.0, f64::max),
            prometheus_parse::Value::Summary(_) => continue,
        };
        out.insert(format!("{}{{{}}}", s.metric, labels.join(",")), value);
    }
    out
}

fn get(m: &HashMap<String, f64>, key: &str) -> f64 {
    m.get(key).copied().unwrap_or(0.0)
}

fn delta(before: &HashMap<String, f64>, after: &HashMap<String, f64>, key: &str) -> f64 {
    get(after, key) - get(before, key)
}

#[test]
fn metrics_move_by_what_was_done() {
    let dir = temp_dir("ops-metrics");
    seed_users(&dir);
    let srv = ChildServer::start(
        dir.path(),
        &[(
            "GEOSHARD_PROJECT",
            concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/project"),
        )],
    );
    // Scrapes need credentials by default; the per-layer gauges are an admin's.
    let mut anon = srv.client(ADMIN);
    let mut geo = srv.client(GEO);
    let mut w = srv.client(WRITER);
    load_counties(&mut geo);
    let before = scrape(&mut anon);

    // 7 queries, 3 unknown endpoints, 5 documents written one by one, 2 flow runs (one fails).
    for i in 0..7 {
        let r = query(
            &mut geo,
            "Counties",
            json!({"returnCountOnly": true, "extension": {"geometry":
                {"type": "Point", "coordinates": [-100.0 + i as f64, 40.0]}}}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    for _ in 0..3 {
        assert_eq!(geo.get("/v1/nowhere").status, 404);
    }
    for i in 0..5 {
        let r = w.put_json(&format!("/v1/documents?uri=/ops/{i}.json"), r#"{"a":1}"#);
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let ok = w.request(
        "PUT",
        "/v1/documents?uri=/ops/flow.json&transform=svc:sjsInputFlow&trans:entity-name=Default&trans:flow-name=Json",
        &[("Content-Type", "application/json")],
        br#"{"testing":1}"#,
    );
    assert_eq!(ok.status, 201, "{}", ok.text());
    let failed = w.request(
        "PUT",
        "/v1/documents?uri=/ops/fail.json&transform=svc:sjsInputFlow&trans:entity-name=Broken&trans:flow-name=Fail",
        &[("Content-Type", "application/json")],
        b"{}",
    );
    assert_eq!(failed.status, 500, "{}", failed.text());

    let after = scrape(&mut anon);
    let requests = |route: &str, method: &str, status: &str| {
        format!("geoshard_http_requests_total{{method={method},route={route},status={status}}}")
    };
    assert_eq!(
        delta(&before, &after, &requests("geoQueryService", "POST", "200")),
        7.0
    );
    assert_eq!(
        delta(&before, &after, &requests("unknown", "GET", "404")),
        3.0
    );
    assert_eq!(
        delta(&before, &after, &requests("documents", "PUT", "201")),
        6.0
    );
    assert_eq!(
        delta(&before, &after, &requests("documents", "PUT", "500")),
        1.0
    );
    assert_eq!(
        delta(&before, &after, "geoshard_documents_written_total{}"),
        6.0
    );
    assert_eq!(
        delta(&before, &after, "geoshard_flow_runs_total{outcome=ok}"),
        1.0
    );
    assert_eq!(
        delta(&before, &after, "geoshard_flow_runs_total{outcome=failed}"),
        1.0
    );
    // The first request of each client was a Digest challenge; these clients had theirs.
    assert!(get(&after, "geoshard_auth_challenges_total{}") >= 2.0);
    // The scrape itself was counted once between the two.
    assert_eq!(
        delta(&before, &after, &requests("metrics", "GET", "200")),
        1.0
    );
    assert_eq!(
        get(&after, "geoshard_layer_features{layer=0,service=Counties}"),
        3231.0
    );
    let shards: f64 = after
        .iter()
        .filter(|(k, _)| k.starts_with("geoshard_shard_features{"))
        .map(|(_, v)| v)
        .sum();
    assert!(shards >= 3231.0, "{shards}");
    assert!(get(&after, "geoshard_process_resident_memory_bytes{}") > 1e6);
    assert!(get(&after, "geoshard_store_file_bytes{}") > 1e5);
    assert!(get(&after, "geoshard_http_connections_open{}") >= 3.0);
    assert!(get(&after, "geoshard_store_commits_total{}") >= 6.0);
    srv.kill();
}

#[test]
fn request_ids_are_echoed_and_logged_as_json() {
    let dir = temp_dir("ops-logs");
    seed_users(&dir);
    let srv = ChildServer::start(
        dir.path(),
        &[("GEOSHARD_LOG_FORMAT", "json"), ("GEOSHARD_LOG", "info")],
    );
    let mut c = srv.client(ADMIN);
    let r = c.request(
        "GET",
        "/v1/nowhere",
        &[("X-Request-Id", "trace-me-42")],
        b"",
    );
    assert_eq!(r.status, 404);
    assert_eq!(r.header("x-request-id"), Some("trace-me-42"));
    // Without one, the server makes one, different each time.
    let a = c.get("/v1/ping");
    let b = c.get("/v1/ping");
    let (a, b) = (
        a.header("x-request-id").unwrap(),
        b.header("x-request-id").unwrap(),
    );
    assert_ne!(a, b);
    // The lines reach the test through a pipe and a reader thread: wait for them (5 s at most).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let (log, mine) = loop {
        let log = srv.log.lock().unwrap().clone();
        let mine: Vec<Value> = log
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["span"]["id"] == "trace-me-42")
            .collect();
        let answered = mine
            .iter()
            .any(|v| v["fields"]["message"] == "request" && v["fields"]["status"] == 404);
        if answered || std::time::Instant::now() > deadline {
            break (log, mine);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(
        !mine.is_empty(),
        "no JSON line of the request in:\n{}",
        log.join("\n")
    );
    // The Digest client's first try was challenged (a 401 line with the same id); the last
    // access line is the answered request.
    let access = mine
        .iter()
        .rev()
        .find(|v| v["fields"]["message"] == "request")
        .unwrap_or_else(|| panic!("no access line: {mine:?}"));
    assert_eq!(access["fields"]["status"], 404);
    assert_eq!(access["fields"]["route"], "unknown");
    assert_eq!(access["fields"]["method"], "GET");
    assert_eq!(access["fields"]["user"], ADMIN.0);
    assert!(access["fields"]["duration_us"].is_u64());
    // Every line of the log is JSON.
    for l in &log {
        assert!(serde_json::from_str::<Value>(l).is_ok(), "not JSON: {l}");
    }
    srv.kill();
}

#[test]
fn liveness_readiness_and_guarded_metrics() {
    let dir = temp_dir("ops-ready");
    seed_users(&dir);
    let project = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/project");
    // The default: metrics_auth.
    let srv = ChildServer::start(dir.path(), &[("GEOSHARD_PROJECT", project)]);
    let mut anon = Client::new(srv.addr, Auth::None);
    assert_eq!(anon.get("/health").status, 200);
    let ready = anon.get("/ready");
    assert_eq!(ready.status, 200, "{}", ready.text());
    assert_eq!(ready.json()["status"], "ready");
    // Readiness names no path of the machine.
    assert!(ready.json().get("project").is_none(), "{}", ready.text());
    assert!(!ready.text().contains("fixtures"), "{}", ready.text());
    load_counties(&mut srv.client(GEO));
    // Anonymous scrapes are challenged; any user may scrape, and only an admin sees the
    // services, views and their row counts.
    assert_eq!(anon.get("/metrics").status, 401);
    let reader = srv.client(READER).get("/metrics");
    assert_eq!(reader.status, 200, "{}", reader.text());
    assert!(reader.text().contains("geoshard_http_requests_total"));
    assert!(!reader.text().contains("Counties"), "{}", reader.text());
    assert!(!reader.text().contains("geoshard_layer_features{"));
    let admin = srv.client(ADMIN).get("/metrics").text();
    assert!(
        admin.contains("geoshard_layer_features{layer=\"0\",service=\"Counties\"} 3231"),
        "{admin}"
    );
    srv.kill();
    // metrics_auth = false: anyone may scrape, and the page names no service or view.
    let srv = ChildServer::start(dir.path(), &[("GEOSHARD_METRICS_AUTH", "false")]);
    let open = Client::new(srv.addr, Auth::None).get("/metrics");
    assert_eq!(open.status, 200, "{}", open.text());
    assert!(
        open.text()
            .contains("geoshard_process_resident_memory_bytes")
    );
    assert!(!open.text().contains("Counties"), "{}", open.text());
    assert!(!open.text().contains("shard_features{"), "{}", open.text());
    srv.kill();
}

/// `geoshard compact` rewrites a stopped server's store, documents compressed: every
/// document reads back as written, queries answer as before, and later writes land.
#[test]
fn compact_keeps_every_document_and_answer() {
    let srv = TestServer::start();
    let mut c = srv.client(ADMIN);
    let all = load_counties(&mut c);
    let probe = json!({"returnGeometry": true, "outFields": "*", "spatialRel": "esriSpatialRelContains",
        "extension": {"geometry": {"type": "Point", "coordinates": [-87.65, 41.85]}}});
    let before = query(&mut c, "Counties", probe.clone()).json()["features"].clone();
    assert_eq!(before[0]["properties"]["name"], "Cook", "{before}");
    let dir = srv.stop();

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_geoshard"))
        .args(["compact", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("documents compressed and packed"), "{said}");

    let srv = TestServer::start_in(dir.path(), |_| {});
    let mut c = srv.client(ADMIN);
    for (id, _, doc) in &all {
        let r = c.get(&format!("/v1/documents?uri=/counties/{id}.json"));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(&r.json(), doc, "county {id}");
    }
    let after = query(&mut c, "Counties", probe).json()["features"].clone();
    assert_eq!(after, before);
    let r = c.put_json(
        "/v1/documents?uri=/later.json",
        r#"{"a":"written after the compaction"}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(
        c.get("/v1/documents?uri=/later.json").json()["a"],
        "written after the compaction"
    );
    drop(srv);
    drop(dir);
}
