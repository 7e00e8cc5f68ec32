//! Input flows over real HTTP: the transforms, exact envelopes, JavaScript plugins with
//! options and job ids, traces, failures, deploys, and the mollusks ingested through a JS
//! flow and queried with geoQueryService.

use crate::common;

use common::*;
use serde_json::{Value, json};

fn project_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/project")
}

fn flow_server(tracing: bool) -> TestServer {
    TestServer::start_with(|c| {
        c.project = Some(project_dir());
        c.flow_tracing = tracing;
        c.js_time_limit_ms = 300;
        c.js_memory_limit_bytes = 32 * 1024 * 1024;
        c.js_pool_size = 2;
    })
}

#[allow(clippy::too_many_arguments)]
fn flow_put(
    c: &mut Client,
    uri: &str,
    transform: &str,
    entity: &str,
    flow: &str,
    extra: &str,
    ctype: &str,
    body: &str,
) -> Response {
    let target = format!(
        "/v1/documents?uri={}&transform={}&trans:entity-name={}&trans:flow-name={}{extra}",
        enc(uri),
        enc(transform),
        enc(entity),
        enc(flow)
    );
    c.request("PUT", &target, &[("Content-Type", ctype)], body.as_bytes())
}

#[test]
fn default_flows_make_exact_envelopes() {
    let srv = flow_server(false);
    let mut w = srv.client(WRITER);
    // JSON, through a scaffolded JavaScript flow and through an XQuery flow (default plugins).
    for (transform, flow) in [
        ("svc:sjsInputFlow", "Json"),
        ("svc:inputFlow", "XqyJson"),
        ("ml:sjsInputFlow", "Json"),
        ("run-sjs-flow", "Json"),
    ] {
        let uri = format!("/env/{flow}-{}.json", transform.replace(':', "_"));
        let r = flow_put(
            &mut w,
            &uri,
            transform,
            "Default",
            flow,
            "",
            "application/json",
            r#"{"testing":123}"#,
        );
        assert_eq!(r.status, 201, "{transform} {flow}: {}", r.text());
        let got = w.get(&format!("/v1/documents?uri={}", enc(&uri)));
        assert_eq!(got.header("content-type"), Some("application/json"));
        assert_eq!(
            got.text(),
            r#"{"envelope":{"headers":{},"triples":[],"instance":{"testing":123},"attachments":null}}"#,
            "{transform} {flow}"
        );
    }
    // XML, through an XQuery flow; also the real-world spelling of the transform.
    for transform in ["svc:inputFlow", "ml:inputFlow", "run-flow"] {
        let uri = format!("/env/xml-{}.xml", transform.replace(':', "_"));
        let r = flow_put(
            &mut w,
            &uri,
            transform,
            "default",
            "XqyXml",
            "",
            "application/xml",
            "<testing>123</testing>",
        );
        assert_eq!(r.status, 201, "{}", r.text());
        let got = w.get(&format!("/v1/documents?uri={}", enc(&uri)));
        assert_eq!(got.header("content-type"), Some("application/xml"));
        assert_eq!(
            got.text(),
            r#"<envelope xmlns="http://marklogic.com/entity-services"><headers/><triples/><instance><testing xmlns="">123</testing></instance><attachments/></envelope>"#
        );
    }
    // Replacing through a flow is a 204; collections and permissions come from the request.
    let r = flow_put(
        &mut w,
        "/env/c.json",
        "svc:sjsInputFlow",
        "Default",
        "Json",
        "&collection=a&collection=b&perm:rest-reader=read&perm:rest-writer=update",
        "application/json",
        "{}",
    );
    assert_eq!(r.status, 201);
    let r = flow_put(
        &mut w,
        "/env/c.json",
        "svc:sjsInputFlow",
        "Default",
        "Json",
        "",
        "application/json",
        r#"{"v":2}"#,
    );
    assert_eq!(r.status, 204);
    let meta = w
        .get("/v1/documents?uri=/env/c.json&category=collections")
        .json();
    assert_eq!(meta["collections"], json!(["a", "b"]));
    // The $type entity form.
    let r = flow_put(
        &mut w,
        "/env/typed.json",
        "svc:sjsInputFlow",
        "Mollusk",
        "Typed",
        "",
        "application/json",
        r#"{"id":"7","scientificName":"Aspella media"}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(
        w.get("/v1/documents?uri=/env/typed.json").json(),
        json!({"envelope": {"headers": {}, "triples": [],
            "instance": {"Mollusk": {"name": "Aspella media", "id": 7}, "info": {"title": "Mollusk", "version": "0.0.1"}},
            "attachments": {"id": "7", "scientificName": "Aspella media"}}})
    );
}

#[test]
fn options_job_ids_and_traces() {
    let srv = flow_server(true);
    let mut w = srv.client(WRITER);
    let mut admin = srv.client(ADMIN);
    let options = enc(r#"{"source":"unit-test"}"#);
    let r = flow_put(
        &mut w,
        "/m/1.json",
        "svc:sjsInputFlow",
        "MOLLUSK",
        "LoadJson",
        &format!("&trans:options={options}&trans:job-id=job-42"),
        "application/json",
        r#"{"id":"1","X":"178.5","Y":"-18.25"}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let env = w.get("/v1/documents?uri=/m/1.json").json();
    let h = &env["envelope"]["headers"];
    assert_eq!(h["source"], "unit-test");
    assert_eq!(h["entity"], "Mollusk", "the entity as deployed");
    assert_eq!(h["flow"], "LoadJson");
    assert_eq!(h["flowType"], "input");
    assert_eq!(h["dataFormat"], "json");
    assert_eq!(h["jobId"], "job-42");
    assert_eq!(h["uri"], "/m/1.json");
    assert_eq!(
        env["envelope"]["instance"]["geometry"],
        json!({"type": "Point", "coordinates": [178.5, -18.25]})
    );

    let t = admin.get("/v1/traces?job-id=job-42").json();
    let traces = t["traces"].as_array().unwrap();
    assert_eq!(traces.len(), 1);
    let tr = &traces[0]["trace"];
    assert_eq!(tr["jobId"], "job-42");
    assert_eq!(tr["identifier"], "/m/1.json");
    assert_eq!(tr["flowName"], "LoadJson");
    assert_eq!(tr["flowType"], "input");
    assert_eq!(tr["format"], "json");
    assert_eq!(tr["hasError"], false);
    let labels: Vec<&str> = tr["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels, vec!["content", "headers", "triples"]);
    assert_eq!(tr["steps"][0]["options"]["source"], "unit-test");
    assert!(
        tr["steps"][0]["duration"]
            .as_str()
            .unwrap()
            .starts_with("PT")
    );

    // Without a job id, a UUID is made up and the plugins see it.
    let r = flow_put(
        &mut w,
        "/m/2.json",
        "svc:sjsInputFlow",
        "Mollusk",
        "LoadJson",
        "",
        "application/json",
        r#"{"id":"2","X":1,"Y":2}"#,
    );
    assert_eq!(r.status, 201);
    let job = w.get("/v1/documents?uri=/m/2.json").json()["envelope"]["headers"]["jobId"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(job.len(), 36, "a UUID: {job}");
    assert_eq!(
        admin.get(&format!("/v1/traces?job-id={job}")).json()["traces"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    // Traces are for admins.
    assert_eq!(w.get("/v1/traces?job-id=job-42").status, 403);
    assert_eq!(admin.get("/v1/traces").status, 400);
}

#[test]
fn failures_store_nothing_and_leave_a_trace() {
    let srv = flow_server(false);
    let mut w = srv.client(WRITER);
    let mut admin = srv.client(ADMIN);
    // The plugin chose 400.
    let r = flow_put(
        &mut w,
        "/f/1.json",
        "svc:sjsInputFlow",
        "Broken",
        "Fail",
        &format!(
            "&trans:options={}&trans:job-id=fail-1",
            enc(r#"{"mode":"client"}"#)
        ),
        "application/json",
        "{}",
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let (_, code, message) = r.error();
    assert_eq!(code, "RESTAPI-SRVEXERR");
    assert_eq!(message, "the record is not a mollusk");
    assert_eq!(
        w.get("/v1/documents?uri=/f/1.json").status,
        404,
        "nothing stored"
    );
    // A plain throw is a 500 with the plugin's message.
    let r = flow_put(
        &mut w,
        "/f/2.json",
        "svc:sjsInputFlow",
        "Broken",
        "Fail",
        "&trans:job-id=fail-2",
        "application/json",
        "{}",
    );
    assert_eq!(r.status, 500);
    assert_eq!(r.error().2, "plugin exploded on /f/2.json");
    // Even with tracing off, failures are traced, with the plugin's error.
    let t = admin.get("/v1/traces?job-id=fail-2").json();
    let tr = &t["traces"][0]["trace"];
    assert_eq!(tr["hasError"], true);
    assert_eq!(tr["steps"][0]["label"], "content");
    assert_eq!(
        tr["steps"][0]["error"]["message"],
        "plugin exploded on /f/2.json"
    );
    // A plugin that never ends hits the time limit; one that eats memory, the heap limit;
    // the pool recovers either way.
    let t0 = std::time::Instant::now();
    let r = flow_put(
        &mut w,
        "/f/3.json",
        "svc:sjsInputFlow",
        "Broken",
        "Spin",
        "&trans:job-id=spin",
        "application/json",
        "{}",
    );
    assert_eq!(r.status, 500);
    assert!(
        r.error().2.contains("longer than its limit of 300 ms"),
        "{}",
        r.text()
    );
    assert!(t0.elapsed() < std::time::Duration::from_secs(5));
    let r = flow_put(
        &mut w,
        "/f/4.json",
        "svc:sjsInputFlow",
        "Broken",
        "Spin",
        &format!("&trans:options={}", enc(r#"{"grow":true}"#)),
        "application/json",
        "{}",
    );
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(
        r.error()
            .2
            .contains("ran out of memory (limit 33554432 bytes)"),
        "{}",
        r.text()
    );
    assert_eq!(
        admin.get("/v1/traces?job-id=spin").json()["traces"][0]["trace"]["hasError"],
        true
    );
    for i in 0..4 {
        let r = flow_put(
            &mut w,
            &format!("/f/ok{i}.json"),
            "svc:sjsInputFlow",
            "Default",
            "Json",
            "",
            "application/json",
            "{}",
        );
        assert_eq!(r.status, 201, "the pool works after limits were hit");
    }
    // A plugin's JSON content with malformed request JSON never reaches the plugin.
    let r = flow_put(
        &mut w,
        "/f/5.json",
        "svc:sjsInputFlow",
        "Default",
        "Json",
        "",
        "application/json",
        "{nope",
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.error().1, "XDMP-JSONDOC");
}

#[test]
fn parameter_errors() {
    let srv = flow_server(false);
    let mut w = srv.client(WRITER);
    let r = w.request(
        "PUT",
        "/v1/documents?uri=/p.json&transform=svc:sjsInputFlow&trans:flow-name=Json",
        &[("Content-Type", "application/json")],
        b"{}",
    );
    assert_eq!(r.status, 400);
    let (_, code, message) = r.error();
    assert_eq!(
        (code.as_str(), message.contains("trans:entity-name")),
        ("REST-REQUIREDPARAM", true)
    );
    let r = w.request(
        "PUT",
        "/v1/documents?uri=/p.json&transform=svc:sjsInputFlow&trans:entity-name=Default",
        &[("Content-Type", "application/json")],
        b"{}",
    );
    assert_eq!(r.status, 400);
    assert!(r.error().2.contains("trans:flow-name"));
    for bad in ["[1,2]", "\"text\"", "{nope"] {
        let r = flow_put(
            &mut w,
            "/p.json",
            "svc:sjsInputFlow",
            "Default",
            "Json",
            &format!("&trans:options={}", enc(bad)),
            "application/json",
            "{}",
        );
        assert_eq!(r.status, 400, "{bad}");
        assert!(r.error().2.contains("trans:options"), "{bad}");
    }
    // The flow name matches exactly; the message names what was asked for.
    let r = flow_put(
        &mut w,
        "/p.json",
        "svc:sjsInputFlow",
        "MOLLUSK",
        "loadjson",
        "",
        "application/json",
        "{}",
    );
    assert_eq!(r.status, 404);
    assert_eq!(
        r.json(),
        json!({"errorResponse": {"statusCode": 404, "status": "Not Found", "messageCode": "RESTAPI-SRVEXERR", "message": "The specified flow MOLLUSK:loadjson is missing."}})
    );
    assert_eq!(w.get("/v1/documents?uri=/p.json").status, 404);
}

#[test]
fn missing_flow_before_any_deploy() {
    let srv = TestServer::start();
    let mut w = srv.client(WRITER);
    let r = flow_put(
        &mut w,
        "/x.json",
        "svc:sjsInputFlow",
        "Order",
        "Load",
        "",
        "application/json",
        "{}",
    );
    assert_eq!(r.status, 404);
    assert_eq!(r.error().2, "The specified flow Order:Load is missing.");
}

fn tar_of(files: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut b = tar::Builder::new(&mut out);
        for (path, text) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(text.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, path, text.as_bytes()).unwrap();
        }
        b.finish().unwrap();
    }
    out
}

#[test]
fn deploy_over_http() {
    let srv = flow_server(false);
    let mut admin = srv.client(ADMIN);
    let mut w = srv.client(WRITER);
    // Broken projects fail whole, naming each file; the deployed flows keep working.
    let broken = tar_of(&[
        (
            "plugins/entities/New/input/A/A.properties",
            "codeFormat=java\ndataFormat=json\n",
        ),
        (
            "plugins/entities/New/input/B/B.properties",
            "codeFormat=sjs\ndataFormat=json\n",
        ),
        (
            "plugins/entities/New/input/C/C.properties",
            "codeFormat=sjs\ndataFormat=json\nthis is not a property\n",
        ),
        (
            "plugins/entities/New/input/C/main.sjs",
            "module.exports = {",
        ),
    ]);
    let r = admin.request(
        "POST",
        "/v1/deploy",
        &[("Content-Type", "application/x-tar")],
        &broken,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let message = r.error().2;
    for needle in [
        "plugins/entities/New/input/A/A.properties: unknown codeFormat \"java\"",
        "plugins/entities/New/input/B/main.sjs: the main module is missing",
        "plugins/entities/New/input/C/C.properties:3: not a key=value line",
    ] {
        assert!(message.contains(needle), "{needle} in {message}");
    }
    let r = flow_put(
        &mut w,
        "/d/1.json",
        "svc:sjsInputFlow",
        "Default",
        "Json",
        "",
        "application/json",
        "{}",
    );
    assert_eq!(r.status, 201, "old flows still deployed");
    // A syntax error in a JavaScript module is a deploy error too.
    let bad_js = tar_of(&[
        (
            "plugins/entities/New/input/A/A.properties",
            "codeFormat=sjs\ndataFormat=json\n",
        ),
        (
            "plugins/entities/New/input/A/main.sjs",
            "module.exports = { main: function( };",
        ),
    ]);
    let r = admin.request("POST", "/v1/deploy", &[], &bad_js);
    assert_eq!(r.status, 400);
    assert!(
        r.error()
            .2
            .contains("plugins/entities/New/input/A/main.sjs: SyntaxError"),
        "{}",
        r.text()
    );
    assert_eq!(w.request("POST", "/v1/deploy", &[], &bad_js).status, 403);

    // A good project replaces the old one without a restart, and warns about XQuery.
    let good = tar_of(&[
        (
            "myproj/plugins/entities/Order/input/Load/Load.properties",
            "codeFormat=sjs\ndataFormat=json\n",
        ),
        (
            "myproj/plugins/entities/Order/input/Load/main.sjs",
            "module.exports = { main: function (id, raw, o) { return { order: raw.n * 2 }; } };",
        ),
        (
            "myproj/plugins/entities/Order/input/Xq/Xq.properties",
            "codeFormat=xqy\ndataFormat=json\n",
        ),
        (
            "myproj/plugins/entities/Order/input/Xq/main.xqy",
            "xquery version '1.0-ml';",
        ),
    ]);
    let r = admin.request(
        "POST",
        "/v1/deploy",
        &[("Content-Type", "application/x-tar")],
        &good,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["deployed"], json!(["Order:Load", "Order:Xq"]));
    assert!(
        v["warnings"][0]
            .as_str()
            .unwrap()
            .contains("plugins/entities/Order/input/Xq/main.xqy")
    );
    let r = flow_put(
        &mut w,
        "/d/2.json",
        "svc:sjsInputFlow",
        "order",
        "Load",
        "",
        "application/json",
        r#"{"n":21}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(
        w.get("/v1/documents?uri=/d/2.json").json()["envelope"]["instance"]["order"],
        42
    );
    let r = flow_put(
        &mut w,
        "/d/3.json",
        "svc:sjsInputFlow",
        "Default",
        "Json",
        "",
        "application/json",
        "{}",
    );
    assert_eq!(r.status, 404, "the old project is gone");
    // And it survives a restart (the flows are in the store).
    let dir = srv.stop();
    let srv = TestServer::start_in(&dir, |_| {});
    let mut w = srv.client(WRITER);
    let r = flow_put(
        &mut w,
        "/d/4.json",
        "svc:sjsInputFlow",
        "Order",
        "Load",
        "",
        "application/json",
        r#"{"n":1}"#,
    );
    assert_eq!(r.status, 201);
}

#[test]
fn offline_deploy() {
    let dir = temp_dir("deploy");
    seed_users(&dir);
    let store = geoshard::store::Store::open(&dir, Default::default()).unwrap();
    let files = geoshard::flow::project::read_dir(&project_dir()).unwrap();
    let project = geoshard::flow::deploy_blocking(&store, &files).unwrap();
    assert_eq!(project.flows.len(), 9);
    assert_eq!(project.warnings.len(), 2, "{:?}", project.warnings);
    store.shutdown_blocking();
    drop(store);
    let srv = TestServer::start_in(&dir, |_| {});
    let mut w = srv.client(WRITER);
    let r = flow_put(
        &mut w,
        "/o.json",
        "svc:sjsInputFlow",
        "Default",
        "Json",
        "",
        "application/json",
        "{}",
    );
    assert_eq!(r.status, 201);
}

#[test]
fn mollusks_through_a_js_flow_then_a_point_query() {
    let srv = flow_server(false);
    let mut admin = srv.client(ADMIN);
    let mut geo = srv.client(GEO);
    // A template whose context points into the envelope.
    let mut template: Value = serde_json::from_str(
        &std::fs::read_to_string(data_dir().join("gds/mollusks/template.json")).unwrap(),
    )
    .unwrap();
    template["template"]["context"] = json!("/envelope/instance");
    let tde = enc("http://marklogic.com/xdmp/tde");
    let r = admin.put_json(
        &format!("/v1/documents?uri=/tde/m.json&collection={tde}"),
        &template.to_string(),
    );
    assert_eq!(r.status, 201);
    let descriptor =
        std::fs::read_to_string(data_dir().join("gds/mollusks/descriptor.json")).unwrap();
    let r = admin.put_json(
        &format!(
            "/v1/documents?uri=/svc/m.json&collection={}",
            enc("http://marklogic.com/feature-services")
        ),
        &descriptor,
    );
    assert_eq!(r.status, 201);

    // Every CSV row, as strings, through the JS flow: the plugin makes the geometry.
    let mut reader = csv::Reader::from_path(data_dir().join("gds/mollusks/mollusks.csv")).unwrap();
    let headers = reader.headers().unwrap().clone();
    let mut at_point: Vec<i64> = Vec::new();
    let mut rows = 0;
    for rec in reader.records() {
        let rec = rec.unwrap();
        let row: serde_json::Map<String, Value> = headers
            .iter()
            .zip(rec.iter())
            .map(|(h, v)| (h.to_string(), json!(v)))
            .collect();
        let id = row["id"].as_str().unwrap().to_string();
        if row["X"] == "178.03333" && row["Y"] == "-18.36667" {
            at_point.push(id.parse().unwrap());
        }
        let r = flow_put(
            &mut admin,
            &format!("/data/{id}.json"),
            "svc:sjsInputFlow",
            "Mollusk",
            "LoadJson",
            "&collection=mollusks&perm:rest-reader=read&perm:geo-data-services-reader=read&perm:rest-writer=update",
            "application/json",
            &Value::Object(row).to_string(),
        );
        assert_eq!(r.status, 201, "{}", r.text());
        rows += 1;
    }
    assert_eq!(rows, 277);
    at_point.sort();
    assert!(at_point.len() > 1);
    let r = geo.post_json("/v1/resources/geoQueryService", &json!({
        "params": {"id": "ArcGIS Hub Data", "layer": 0, "method": "query"},
        "query": {"returnGeometry": 1, "geometryType": "gisGeometryPoint", "spatialRel": "gisSpatialRelContains",
                  "extension": {"geometry": {"type": "Point", "coordinates": [178.03333, -18.36667]}}}
    }).to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let mut ids: Vec<i64> = v["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_i64().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, at_point);
    assert_eq!(
        v["features"][0]["geometry"],
        json!({"type": "Point", "coordinates": [178.03333, -18.36667]})
    );
}

/// What a flow returns is bounded like a stored document: content nested past the limit is a
/// failed run (the server and the pool go on), and content within it makes exact envelopes in
/// both data formats.
#[test]
fn deep_flow_output_is_refused_or_enveloped_whole() {
    // Room to reach QuickJS's stack limit before the time limit on a loaded machine.
    let srv = TestServer::start_with(|c| {
        c.project = Some(project_dir());
        c.js_time_limit_ms = 5_000;
        c.js_memory_limit_bytes = 32 * 1024 * 1024;
        c.js_pool_size = 2;
    });
    let mut w = srv.client(WRITER);
    let deep = |w: &mut Client, uri: &str, depth: usize| {
        flow_put(
            w,
            uri,
            "svc:sjsInputFlow",
            "Broken",
            "Fail",
            &format!("&trans:options={}", enc(&format!(r#"{{"depth":{depth}}}"#))),
            "application/json",
            "{}",
        )
    };
    // Past QuickJS's stack, and past serde_json's 128 levels.
    for (depth, says) in [
        (100_000, "Maximum call stack size exceeded"),
        (1_000, "recursion limit exceeded"),
    ] {
        let r = deep(&mut w, "/deep/too.json", depth);
        assert_eq!(r.status, 500, "{}", r.text());
        assert!(r.error().2.contains(says), "{depth}: {}", r.text());
        assert_eq!(w.get("/v1/documents?uri=/deep/too.json").status, 404);
    }
    let r = deep(&mut w, "/deep/ok.json", 100);
    assert_eq!(r.status, 201, "{}", r.text());
    let mut v = w.get("/v1/documents?uri=/deep/ok.json").json();
    v = v["envelope"]["instance"].take();
    for _ in 0..100 {
        v = v["a"].take();
    }
    assert_eq!(v, "leaf");
    // JSON content as XML elements, through the default plugins of an XML flow.
    let depth = 120;
    let body = format!("{}1{}", r#"{"a":"#.repeat(depth), "}".repeat(depth));
    let r = flow_put(
        &mut w,
        "/deep/x.xml",
        "svc:inputFlow",
        "Default",
        "XqyXml",
        "",
        "application/json",
        &body,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let xml = w.get("/v1/documents?uri=/deep/x.xml").text();
    let inner = format!("{}1{}", "<a>".repeat(depth), "</a>".repeat(depth));
    assert!(xml.contains(&inner), "{xml}");
}

/// Flow isolation: a spy flow wrapped the host's hooks and read other
/// flows' input, and a polluter that replaced `JSON.stringify` made every other flow fail
/// until a restart. With one JavaScript worker, so every flow shares its runtime.
#[test]
fn a_spy_and_a_polluter_cannot_reach_other_flows() {
    let srv = TestServer::start_with(|c| {
        c.project = Some(project_dir());
        c.js_pool_size = 1;
        c.js_time_limit_ms = 1000;
    });
    let mut w = srv.client(WRITER);
    let run = |w: &mut Client, uri: &str, entity: &str, flow: &str, body: &str| {
        let r = flow_put(
            w,
            uri,
            "svc:sjsInputFlow",
            entity,
            flow,
            "",
            "application/json",
            body,
        );
        assert_eq!(r.status, 201, "{entity}/{flow}: {}", r.text());
        w.get(&format!("/v1/documents?uri={}", enc(uri))).text()
    };
    let envelope = |instance: &str| {
        format!(
            r#"{{"envelope":{{"headers":{{}},"triples":[],"instance":{instance},"attachments":null}}}}"#
        )
    };
    // The polluter's own run still makes its envelope (the host kept its own JSON).
    assert_eq!(
        run(&mut w, "/iso/p.json", "Hostile", "Polluter", r#"{"p":1}"#),
        envelope(r#"{"polluter":{"p":1}}"#)
    );
    // The spy installs its wrappers, if it finds anything to wrap.
    let spy = run(&mut w, "/iso/s1.json", "Hostile", "Spy", "{}");
    assert_eq!(
        spy,
        envelope(r#"{"hooks":[],"seen":[],"shared":"undefined"}"#)
    );
    // A victim flow with a secret, after both: exact.
    for i in 0..3 {
        let uri = format!("/iso/v{i}.json");
        assert_eq!(
            run(&mut w, &uri, "Default", "Json", r#"{"secret":"s3cr3t"}"#),
            envelope(r#"{"secret":"s3cr3t"}"#)
        );
    }
    // The spy saw nothing of it.
    let spy = run(&mut w, "/iso/s2.json", "Hostile", "Spy", "{}");
    assert!(!spy.contains("s3cr3t"), "{spy}");
    assert_eq!(
        spy,
        envelope(r#"{"hooks":[],"seen":[],"shared":"undefined"}"#)
    );
}

/// A plugin's thrown status is used only when it is an HTTP error status; anything else (the
/// −1, which once leaked "expected u16") is a 500 with the plugin's message.
#[test]
fn a_thrown_status_outside_the_error_range_is_a_500() {
    let srv = flow_server(false);
    let mut w = srv.client(WRITER);
    for (status, want) in [
        ("-1", 500),
        ("0", 500),
        ("200", 500),
        ("302", 500),
        ("1e9", 500),
        ("70000", 500),
        ("404.5", 500),
        ("\"418\"", 418),
        ("null", 500),
        ("418", 418),
        ("503", 503),
    ] {
        let r = flow_put(
            &mut w,
            "/st/1.json",
            "svc:sjsInputFlow",
            "Broken",
            "Fail",
            &format!(
                "&trans:options={}",
                enc(&format!(r#"{{"status":{status}}}"#))
            ),
            "application/json",
            "{}",
        );
        assert_eq!(r.status, want, "{status}: {}", r.text());
        let message = r.error().2;
        assert!(
            message.starts_with("thrown with status"),
            "{status}: {message}"
        );
    }
}

/// `POST /v1/documents` multipart with `transform` (both official clients' bulk writes): the
/// flow runs on every document and their envelopes are written together; if one run fails,
/// none is written and the batch's traces are kept under one job.
#[test]
fn bulk_writes_run_the_flow_on_every_document() {
    let srv = flow_server(false);
    let mut w = srv.client(WRITER);
    let mut admin = srv.client(ADMIN);
    let batch = |rows: &[(&str, Value)]| -> (String, Vec<u8>) {
        let boundary = "flow-batch";
        let mut body = String::new();
        for (uri, row) in rows {
            body.push_str(&format!(
                "--{boundary}\r\nContent-Type: application/json\r\nContent-Disposition: attachment; filename=\"{uri}\"\r\n\r\n{row}\r\n"
            ));
        }
        body.push_str(&format!("--{boundary}--\r\n"));
        (
            format!("multipart/mixed; boundary={boundary}"),
            body.into_bytes(),
        )
    };
    let target = |job: &str| {
        format!(
            "/v1/documents?transform=svc:sjsInputFlow&trans:entity-name=Mollusk&trans:flow-name=LoadJson&trans:job-id={job}&collection=m"
        )
    };
    let rows = [
        (
            "/bulk/1.json",
            json!({"id": "1", "X": "-70.5", "Y": "41.25"}),
        ),
        ("/bulk/2.json", json!({"id": "2", "X": "-71", "Y": "42"})),
        (
            "/bulk/3.json",
            json!({"id": "3", "X": "-72.125", "Y": "43"}),
        ),
    ];
    let (ct, body) = batch(&rows);
    let r = w.request(
        "POST",
        &target("bulk-ok"),
        &[("Content-Type", ct.as_str())],
        &body,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let uris: Vec<Value> = r.json()["documents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["uri"].clone())
        .collect();
    assert_eq!(
        uris,
        [
            json!("/bulk/1.json"),
            json!("/bulk/2.json"),
            json!("/bulk/3.json")
        ]
    );
    for (uri, row) in &rows {
        let doc = w.get(&format!("/v1/documents?uri={uri}")).json();
        let instance = &doc["envelope"]["instance"];
        let x: f64 = row["X"].as_str().unwrap().parse().unwrap();
        let y: f64 = row["Y"].as_str().unwrap().parse().unwrap();
        assert_eq!(instance["geometry"]["type"], "Point", "{uri}");
        let c = &instance["geometry"]["coordinates"];
        assert_eq!((c[0].as_f64(), c[1].as_f64()), (Some(x), Some(y)), "{uri}");
        let cols = w
            .get(&format!("/v1/documents?uri={uri}&category=collections"))
            .json();
        assert_eq!(cols["collections"], json!(["m"]));
    }
    // The third row has no usable X: the plugin's 400, and none of the batch is written.
    let rows = [
        ("/bulk/4.json", json!({"id": "4", "X": "-70", "Y": "41"})),
        ("/bulk/5.json", json!({"id": "5", "X": "-71", "Y": "42"})),
        ("/bulk/6.json", json!({"id": "6", "X": "none", "Y": "43"})),
    ];
    let (ct, body) = batch(&rows);
    let r = w.request(
        "POST",
        &target("bulk-bad"),
        &[("Content-Type", ct.as_str())],
        &body,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.error().2, "row /bulk/6.json has no usable X/Y");
    for (uri, _) in &rows {
        assert_eq!(
            w.get(&format!("/v1/documents?uri={uri}")).status,
            404,
            "{uri}"
        );
    }
    let t = admin.get("/v1/traces?job-id=bulk-bad").json();
    assert!(
        t["traces"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["trace"]["hasError"] == true),
        "{t}"
    );
    // A transform that is not a flow, or a flow without its entity, is refused up front.
    let r = w.request(
        "POST",
        "/v1/documents?transform=nope",
        &[("Content-Type", ct.as_str())],
        &body,
    );
    assert_eq!(r.status, 400);
    let r = w.request(
        "POST",
        "/v1/documents?transform=svc:sjsInputFlow&trans:flow-name=LoadJson",
        &[("Content-Type", ct.as_str())],
        &body,
    );
    assert_eq!(r.status, 400);
    assert!(r.text().contains("trans:entity-name"), "{}", r.text());
}
