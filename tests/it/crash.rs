//! Durability under SIGKILL, again and again, under mixed load: a child server takes plain
//! PUTs of point features, ingests through a JavaScript flow, multipart batches, template and
//! descriptor changes and queries, and is killed without warning at a random moment,
//! `CRASH_KILLS` times (5 by default; the issue asks for 20 in a long run). After
//! every restart:
//!
//! - every write that was acknowledged is there byte for byte (or the write after it that
//!   was in flight when the server died, whole);
//! - a write never acknowledged is absent or whole, and a multipart batch is all there or
//!   not at all;
//! - the layer's query answers equal a recomputation from the stored documents: the ids,
//!   the coordinates and the columns of the template in effect.
//!
//! The state seen after a restart is the expectation carried into the next round.

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

const TDE: &str = "http://marklogic.com/xdmp/tde";
const SERVICES: &str = "http://marklogic.com/feature-services";
const TEMPLATE_URI: &str = "/crash/tde.json";
const DESCRIPTOR_URI: &str = "/crash/sd.json";

/// What a URI should hold: the content of its last acknowledged write, and a write sent after
/// it whose answer never came (it may or may not have landed).
#[derive(Default, Clone, Debug)]
struct Expect {
    acked: Option<Vec<u8>>,
    in_flight: Option<Vec<u8>>,
}

/// A batch's documents and their contents.
type Batch = Vec<(String, Vec<u8>)>;

#[derive(Default)]
struct Model {
    docs: HashMap<String, Expect>,
    /// Batch number -> (its documents and contents, acknowledged).
    batches: BTreeMap<u64, (Batch, bool)>,
}

type Shared = Arc<Mutex<Model>>;

fn template(extra: bool) -> Value {
    let mut columns = vec![
        json!({"name": "OBJECTID", "scalarType": "int", "val": "id"}),
        json!({"name": "name", "scalarType": "string", "val": "name"}),
    ];
    if extra {
        columns.push(json!({"name": "extra", "scalarType": "int", "val": "k"}));
    }
    json!({"template": {"context": "/", "collections": ["pts"], "rows": [{
        "schemaName": "crash", "viewName": "pts", "columns": columns}]}})
}

fn descriptor(round: u64) -> Value {
    json!({"info": {"name": "Crash", "description": format!("round {round}")}, "layers": [{
        "id": 0, "name": "pts", "description": "d", "geometryType": "Point",
        "schema": "crash", "view": "pts",
        "geometry": {"format": "geojson", "coordinateSystem": "wgs84", "xpath": "//geometry"}}]})
}

/// A point feature document; keys in the order serde_json writes them back.
fn feature(id: u64, k: u64) -> String {
    let (x, y) = ((id * 37 + k * 11) % 360, (id * 13 + k * 7) % 170);
    format!(
        r#"{{"geometry":{{"coordinates":[{},{}],"type":"Point"}},"id":{id},"k":{k},"name":"f{id}-{k}"}}"#,
        x as f64 - 180.0,
        y as f64 - 85.0
    )
}

/// The envelope the Default/Json flow makes of `content`.
fn envelope(content: &str) -> String {
    format!(
        r#"{{"envelope":{{"headers":{{}},"triples":[],"instance":{content},"attachments":null}}}}"#
    )
}

fn put_raw(c: &mut Client, target: &str, body: &[u8]) -> Option<u16> {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        c.request("PUT", target, &[("Content-Type", "application/json")], body)
    }));
    r.ok().map(|r| r.status)
}

/// Record `body` as in flight for `uri`, send it, and record the answer.
fn tracked_put(
    model: &Shared,
    c: &mut Client,
    uri: &str,
    target: &str,
    stored: Vec<u8>,
    body: &[u8],
) -> bool {
    model
        .lock()
        .unwrap()
        .docs
        .entry(uri.to_string())
        .or_default()
        .in_flight = Some(stored);
    match put_raw(c, target, body) {
        Some(201 | 204) => {
            let mut m = model.lock().unwrap();
            let e = m.docs.get_mut(uri).unwrap();
            e.acked = e.in_flight.take();
            true
        }
        Some(status) => panic!("{uri}: {status}"),
        None => false,
    }
}

/// The load of one round, until `stop` or the server dies. Returns acknowledged writes.
fn load(addr: std::net::SocketAddr, model: Shared, stop: Arc<AtomicBool>, round: u64) -> usize {
    let acked = Arc::new(AtomicUsize::new(0));
    let mut threads = Vec::new();
    // Plain PUTs: four writers, 20 features each, replaced over and over.
    for t in 0..4u64 {
        let (model, stop, acked) = (model.clone(), stop.clone(), acked.clone());
        threads.push(std::thread::spawn(move || {
            let mut c = Client::new(addr, Auth::Digest(GEO.0.into(), GEO.1.into()));
            let mut k = round * 1_000_000;
            while !stop.load(Ordering::Relaxed) {
                let id = t * 100 + k % 20;
                let uri = format!("/crash/p/{id}.json");
                let body = feature(id, k);
                let target = format!("/v1/documents?uri={}&collection=pts", enc(&uri));
                if !tracked_put(
                    &model,
                    &mut c,
                    &uri,
                    &target,
                    body.clone().into_bytes(),
                    body.as_bytes(),
                ) {
                    return;
                }
                acked.fetch_add(1, Ordering::Relaxed);
                k += 1;
            }
        }));
    }
    // Flow ingests: the stored document is the flow's envelope of the content.
    {
        let (model, stop, acked) = (model.clone(), stop.clone(), acked.clone());
        threads.push(std::thread::spawn(move || {
            let mut c = Client::new(addr, Auth::Digest(GEO.0.into(), GEO.1.into()));
            let mut k = round * 1_000_000;
            while !stop.load(Ordering::Relaxed) {
                let uri = format!("/crash/flow/{}.json", k % 10);
                let content = format!(r#"{{"a":"ingest","k":{k}}}"#);
                let target = format!(
                    "/v1/documents?uri={}&transform=svc:sjsInputFlow&trans:entity-name=Default&trans:flow-name=Json",
                    enc(&uri)
                );
                if !tracked_put(&model, &mut c, &uri, &target, envelope(&content).into_bytes(), content.as_bytes()) {
                    return;
                }
                acked.fetch_add(1, Ordering::Relaxed);
                k += 1;
            }
        }));
    }
    // Multipart batches of five new documents.
    {
        let (model, stop, acked) = (model.clone(), stop.clone(), acked.clone());
        threads.push(std::thread::spawn(move || {
            let mut c = Client::new(addr, Auth::Digest(GEO.0.into(), GEO.1.into()));
            let mut b = round * 1_000_000;
            while !stop.load(Ordering::Relaxed) {
                let docs: Vec<(String, Vec<u8>)> = (0..5)
                    .map(|i| {
                        (
                            format!("/crash/batch/{b}/{i}.json"),
                            format!(r#"{{"b":{b},"i":{i}}}"#).into_bytes(),
                        )
                    })
                    .collect();
                let mut body = Vec::new();
                for (uri, content) in &docs {
                    body.extend_from_slice(
                        format!(
                            "--cb\r\nContent-Type: application/json\r\nContent-Disposition: \
                             attachment; filename=\"{uri}\"\r\n\r\n"
                        )
                        .as_bytes(),
                    );
                    body.extend_from_slice(content);
                    body.extend_from_slice(b"\r\n");
                }
                body.extend_from_slice(b"--cb--\r\n");
                model.lock().unwrap().batches.insert(b, (docs, false));
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    c.request(
                        "POST",
                        "/v1/documents",
                        &[("Content-Type", "multipart/mixed; boundary=cb")],
                        &body,
                    )
                }));
                match r {
                    Ok(r) if r.status == 200 => {
                        model.lock().unwrap().batches.get_mut(&b).unwrap().1 = true;
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(r) => panic!("batch {b}: {} {}", r.status, r.text()),
                    Err(_) => return,
                }
                b += 1;
            }
        }));
    }
    // Template and descriptor changes, now and then.
    {
        let (model, stop, acked) = (model.clone(), stop.clone(), acked.clone());
        threads.push(std::thread::spawn(move || {
            let mut c = Client::new(addr, Auth::Digest(GEO.0.into(), GEO.1.into()));
            let mut n = round * 1000;
            while !stop.load(Ordering::Relaxed) {
                let t = template(n.is_multiple_of(2)).to_string();
                let target = format!("/v1/documents?uri={TEMPLATE_URI}&collection={}", enc(TDE));
                if !tracked_put(
                    &model,
                    &mut c,
                    TEMPLATE_URI,
                    &target,
                    t.clone().into_bytes(),
                    t.as_bytes(),
                ) {
                    return;
                }
                let d = descriptor(n).to_string();
                let target = format!(
                    "/v1/documents?uri={DESCRIPTOR_URI}&collection={}",
                    enc(SERVICES)
                );
                if !tracked_put(
                    &model,
                    &mut c,
                    DESCRIPTOR_URI,
                    &target,
                    d.clone().into_bytes(),
                    d.as_bytes(),
                ) {
                    return;
                }
                acked.fetch_add(2, Ordering::Relaxed);
                n += 1;
                std::thread::sleep(Duration::from_millis(150));
            }
        }));
    }
    // Queries, answered or cut off by the kill; checked after the restart, not here.
    {
        let stop = stop.clone();
        threads.push(std::thread::spawn(move || {
            let mut c = Client::new(addr, Auth::Digest(GEO.0.into(), GEO.1.into()));
            while !stop.load(Ordering::Relaxed) {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    c.post_json(
                        "/v1/resources/geoQueryService",
                        &json!({"params": {"id": "Crash", "layer": 0, "method": "query"},
                                "query": {"where": "1=1", "outFields": "*",
                                          "extension": {"geometry": {"type": "Polygon",
                                            "coordinates": [[[-90,-45],[90,-45],[90,45],[-90,45],[-90,-45]]]}}}})
                        .to_string(),
                    )
                }));
                match r {
                    Ok(r) => assert!(r.status == 200 || r.status == 404, "{} {}", r.status, r.text()),
                    Err(_) => return,
                }
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    acked.load(Ordering::Relaxed)
}

/// Check the store against the model after a restart, then make what was seen the model.
fn verify(srv: &ChildServer, model: &Shared) -> (usize, usize) {
    let mut c = srv.client(GEO);
    let mut m = model.lock().unwrap();
    let mut seen: HashMap<String, Option<Vec<u8>>> = HashMap::new();
    let mut checked = 0;
    for (uri, e) in m.docs.iter() {
        let r = c.get(&format!("/v1/documents?uri={}", enc(uri)));
        let stored = match r.status {
            200 => Some(r.body.clone()),
            404 => None,
            other => panic!("{uri}: {other} {}", r.text()),
        };
        let ok = match (&e.acked, &e.in_flight) {
            (Some(acked), in_flight) => {
                stored.as_ref() == Some(acked)
                    || (in_flight.is_some() && stored.as_ref() == in_flight.as_ref())
            }
            (None, Some(in_flight)) => stored.is_none() || stored.as_ref() == Some(in_flight),
            (None, None) => stored.is_none(),
        };
        assert!(
            ok,
            "{uri}: stored {:?}, expected {:?}",
            stored
                .as_ref()
                .map(|s| String::from_utf8_lossy(s).into_owned()),
            e
        );
        checked += 1;
        seen.insert(uri.clone(), stored);
    }
    for (uri, stored) in seen {
        let e = m.docs.get_mut(&uri).unwrap();
        e.acked = stored;
        e.in_flight = None;
    }
    let mut batches = 0;
    let mut gone = Vec::new();
    for (b, (docs, acked)) in m.batches.iter() {
        let present: Vec<bool> = docs
            .iter()
            .map(|(uri, content)| {
                let r = c.get(&format!("/v1/documents?uri={}", enc(uri)));
                assert!(r.status == 200 || r.status == 404, "{uri}: {}", r.status);
                if r.status == 200 {
                    assert_eq!(&r.body, content, "{uri}");
                }
                r.status == 200
            })
            .collect();
        if *acked {
            assert!(
                present.iter().all(|p| *p),
                "acknowledged batch {b}: {present:?}"
            );
        } else {
            assert!(
                present.iter().all(|p| *p) || present.iter().all(|p| !*p),
                "batch {b} half applied: {present:?}"
            );
            if !present[0] {
                gone.push(*b);
            }
        }
        batches += 1;
    }
    for b in gone {
        m.batches.remove(&b);
    }
    for (_, acked) in m.batches.values_mut() {
        *acked = true;
    }
    // The layer against a recomputation from the stored documents.
    let template_doc = m.docs.get(TEMPLATE_URI).and_then(|e| e.acked.clone());
    let descriptor_doc = m.docs.get(DESCRIPTOR_URI).and_then(|e| e.acked.clone());
    if let (Some(t), Some(_)) = (template_doc, descriptor_doc) {
        let t: Value = serde_json::from_slice(&t).unwrap();
        let extra = t["template"]["rows"][0]["columns"]
            .as_array()
            .unwrap()
            .len()
            == 3;
        let mut want: BTreeMap<i64, Value> = BTreeMap::new();
        for (uri, e) in m.docs.iter() {
            if let (true, Some(body)) = (uri.starts_with("/crash/p/"), &e.acked) {
                let doc: Value = serde_json::from_slice(body).unwrap();
                want.insert(doc["id"].as_i64().unwrap(), doc);
            }
        }
        let r = c.post_json(
            "/v1/resources/geoQueryService",
            &json!({"params": {"id": "Crash", "layer": 0, "method": "query"},
                    "query": {"where": "1=1", "outFields": "*", "returnGeometry": true,
                              "resultRecordCount": 5000}})
            .to_string(),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let answer = r.json();
        let features = answer["features"].as_array().unwrap();
        let got: BTreeMap<i64, &Value> = features
            .iter()
            .map(|f| (f["properties"]["OBJECTID"].as_i64().unwrap(), f))
            .collect();
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            "the layer's ids"
        );
        for (id, doc) in &want {
            let f = got[id];
            let xy = |v: &Value| -> Vec<f64> {
                v.as_array()
                    .unwrap()
                    .iter()
                    .map(|c| c.as_f64().unwrap())
                    .collect()
            };
            assert_eq!(
                xy(&f["geometry"]["coordinates"]),
                xy(&doc["geometry"]["coordinates"]),
                "{id}"
            );
            assert_eq!(f["properties"]["name"], doc["name"], "{id}");
            match extra {
                true => assert_eq!(f["properties"]["extra"], doc["k"], "{id}"),
                false => assert!(f["properties"].get("extra").is_none(), "{id}: {f}"),
            }
        }
        // A box, against a scan of the stored points.
        let inside: Vec<i64> = want
            .iter()
            .filter(|(_, d)| {
                let c = &d["geometry"]["coordinates"];
                let (x, y) = (c[0].as_f64().unwrap(), c[1].as_f64().unwrap());
                (-90.0..=90.0).contains(&x) && (-45.0..=45.0).contains(&y)
            })
            .map(|(id, _)| *id)
            .collect();
        let r = c.post_json(
            "/v1/resources/geoQueryService",
            &json!({"params": {"id": "Crash", "layer": 0, "method": "query"},
                    "query": {"returnIdsOnly": true, "extension": {"geometry": {"type": "Polygon",
                        "coordinates": [[[-90,-45],[90,-45],[90,45],[-90,45],[-90,-45]]]}}}})
            .to_string(),
        );
        let mut ids: Vec<i64> = r.json()["objectIds"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_i64().unwrap())
            .collect();
        ids.sort_unstable();
        assert_eq!(ids, inside, "the box query");
    }
    (checked, batches)
}

#[test]
fn acknowledged_writes_survive_repeated_sigkills_under_mixed_load() {
    let kills: u64 = std::env::var("CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let dir = temp_dir("crash");
    seed_users(&dir);
    let project = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/project");
    let project = project.to_str().unwrap();
    let env = [
        ("GEOSHARD_PROJECT", project),
        ("GEOSHARD_JS_POOL_SIZE", "2"),
    ];
    // Workers see the server die under them; keep their expected panics out of the log, and
    // the test's own in it.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current()
            .name()
            .is_some_and(|n| n.contains("sigkill"))
        {
            default_hook(info);
        }
    }));
    let model: Shared = Arc::default();
    let mut rng_state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        rng_state
    };
    let (mut total_acked, mut total_checked) = (0usize, 0usize);
    let started = Instant::now();
    for round in 0..kills {
        let srv = ChildServer::start(&dir, &env);
        if round > 0 {
            let (checked, batches) = verify(&srv, &model);
            total_checked += checked + batches;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let worker = {
            let (model, stop) = (model.clone(), stop.clone());
            let addr = srv.addr;
            std::thread::spawn(move || load(addr, model, stop, round))
        };
        // A random moment: 0.3 to 2.3 s into the round's load.
        std::thread::sleep(Duration::from_millis(300 + next() % 2000));
        srv.kill();
        stop.store(true, Ordering::Relaxed);
        total_acked += worker.join().unwrap();
    }
    let srv = ChildServer::start(&dir, &env);
    let (checked, batches) = verify(&srv, &model);
    total_checked += checked + batches;
    drop(srv);
    let _ = std::panic::take_hook();
    eprintln!(
        "{kills} SIGKILLs in {:?}: {total_acked} acknowledged writes; {total_checked} \
         documents and batches verified after the restarts, and the layer's answers each time",
        started.elapsed()
    );
    assert!(
        total_acked >= 50 * kills as usize,
        "{total_acked} acknowledged"
    );
}

/// `geoshard compact` killed at moments spread over its run: every kill leaves a store that
/// opens whole, old or new, with every document as written and the layer's answers unchanged.
#[test]
fn a_killed_compaction_leaves_a_whole_store() {
    let srv = TestServer::start();
    let mut c = srv.client(ADMIN);
    let all = common::layers::load_counties(&mut c);
    let probe = json!({"returnGeometry": false, "outFields": "name", "orderByFields": "name",
        "spatialRel": "esriSpatialRelIntersects",
        "extension": {"geometry": {"type": "Polygon", "coordinates": [[[-106.0, 38.5], [-103.5, 39.0], [-105.0, 40.5], [-106.0, 38.5]]]}}});
    let before =
        common::layers::query(&mut c, "Counties", probe.clone()).json()["features"].clone();
    assert!(before.as_array().unwrap().len() > 5, "{before}");
    let dir = srv.stop();

    let compact = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_geoshard"))
            .args(["compact", "--data-dir"])
            .arg(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    // How long a whole compaction takes here, to spread the kills over it.
    let started = Instant::now();
    assert!(compact().wait().unwrap().success());
    let whole = started.elapsed();
    let kills = 6;
    for k in 0..kills {
        let mut child = compact();
        std::thread::sleep(whole * k / kills);
        let _ = child.kill();
        let _ = child.wait();
        let srv = TestServer::start_in(dir.path(), |_| {});
        let mut c = srv.client(ADMIN);
        for (id, _, doc) in all.iter().step_by(7) {
            let r = c.get(&format!("/v1/documents?uri=/counties/{id}.json"));
            assert_eq!(r.status, 200, "kill {k}: {}", r.text());
            assert_eq!(&r.json(), doc, "kill {k}: county {id}");
        }
        let after =
            common::layers::query(&mut c, "Counties", probe.clone()).json()["features"].clone();
        assert_eq!(after, before, "kill {k}");
        srv.stop();
    }
}
