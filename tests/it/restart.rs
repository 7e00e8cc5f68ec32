//! Restarts on the views saved in the data directory: a clean stop saves them, a start reads
//! them back (and the documents changed since, after a SIGKILL too) instead of extracting
//! every stored document, and answers every query kind exactly as a server that built its
//! views from the documents; a damaged or truncated saved view is detected and rebuilt.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::layers::{put, queries};
use common::*;
use serde_json::{Value, json};

fn load_offline(dir: &Path, service: &str, file: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_geoshard"))
        .args(["load", "--quiet", "--service", service, "--data-dir"])
        .arg(dir)
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A data directory with the users, US counties and GeoNames places loaded offline, and
/// without the views the loads saved, so that the first start builds them.
fn counties_and_places_unbuilt(tag: &str) -> TestDir {
    let dir = temp_dir(tag);
    seed_users(&dir);
    let real = data_dir().join("real");
    load_offline(&dir, "Counties", &real.join("us-counties.geojson"));
    load_offline(&dir, "Places", &real.join("geonames-cities1000.csv"));
    std::fs::remove_dir_all(dir.join("views")).unwrap();
    dir
}

/// Every query kind's answer (without its clock), then the diagnostics.
fn answers(c: &mut Client) -> Vec<Value> {
    let mut out = Vec::new();
    for (what, body) in queries() {
        let r = c.post_json("/v1/resources/geoQueryService", &body.to_string());
        assert_eq!(r.status, 200, "{what}: {}", r.text());
        let mut v = r.json();
        v.as_object_mut().unwrap().remove("$timestamp");
        out.push(v);
    }
    let r = c.get("/v1/diagnostics");
    assert_eq!(r.status, 200, "{}", r.text());
    out.push(r.json());
    out
}

/// The server's log lines holding `needle`, waiting a moment for its log reader.
fn log_lines(s: &ChildServer, needle: &str, at_least: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let lines: Vec<String> = s
            .log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .cloned()
            .collect();
        if lines.len() >= at_least || Instant::now() > deadline {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

const INFO: [(&str, &str); 1] = [("GEOSHARD_LOG", "info")];

fn assert_same(got: &[Value], want: &[Value], when: &str) {
    let names: Vec<&str> = queries().iter().map(|(n, _)| *n).collect();
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g, w, "{when}: {}", names.get(i).unwrap_or(&"diagnostics"));
    }
    assert_eq!(got.len(), want.len());
}

#[test]
fn restarts_read_the_saved_views_and_answer_as_a_rebuild_does() {
    let dir = counties_and_places_unbuilt("restart");

    // The first start builds the views from the documents; its clean stop saves them.
    let s = ChildServer::start(&dir, &INFO);
    let built = answers(&mut s.client(ADMIN));
    assert_eq!(built[7]["count"], json!(144_563), "{}", built[7]);
    assert!(log_lines(&s, "view read from its saved file", 0).is_empty());
    assert!(s.stop().success());
    let mut saved: Vec<String> = std::fs::read_dir(dir.join("views"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".seg"))
        .collect();
    saved.sort();
    assert_eq!(saved.len(), 2, "{saved:?}");
    assert!(
        saved[0].starts_with("counties.") && saved[1].starts_with("places."),
        "{saved:?}"
    );

    // A restart reads them, and answers alike.
    let s = ChildServer::start(&dir, &INFO);
    let read = log_lines(&s, "view read from its saved file", 2);
    assert_eq!(read.len(), 2, "{read:?}");
    assert!(
        read.iter().all(|l| l.contains("changed_since=0")),
        "{read:?}"
    );
    assert!(log_lines(&s, "saved view not used", 0).is_empty());
    assert_same(&answers(&mut s.client(ADMIN)), &built, "after a clean stop");

    // Writes, then SIGKILL: the next start reads the saved views and the documents changed
    // since. Replaced, deleted and new places; a county whose geometry cannot be used.
    let mut c = s.client(ADMIN);
    let mut changed = 0;
    for id in [1, 2, 3, 50_000, 144_563] {
        let uri = format!("/Places/0/{id}.json");
        let r = c.get(&format!("/v1/documents?uri={uri}"));
        assert_eq!(r.status, 200, "{}", r.text());
        let mut doc = r.json();
        doc["properties"]["name"] = json!(format!("Renamed {id}"));
        doc["properties"]["cc"] = json!("FR");
        doc["geometry"]["coordinates"] = json!([2.35 + id as f64 * 1e-7, 48.85]);
        assert!(put(&mut c, &uri, "&collection=Places", &doc).status < 300);
        changed += 1;
    }
    for id in [4, 5, 60_000] {
        let r = c.delete(&format!("/v1/documents?uri=/Places/0/{id}.json"));
        assert_eq!(r.status, 204, "{}", r.text());
        changed += 1;
    }
    for id in 200_001..200_011 {
        let doc = json!({"type": "Feature",
            "properties": {"OBJECTID": id, "name": format!("Saint New {id}"), "cc": "FR"},
            "geometry": {"type": "Point", "coordinates": [2.0 + (id - 200_000) as f64 * 0.05, 48.9]}});
        let r = put(
            &mut c,
            &format!("/Places/0/{id}.json"),
            "&collection=Places",
            &doc,
        );
        assert!(r.status < 300, "{}", r.text());
        changed += 1;
    }
    let r = c.get("/v1/documents?uri=/Counties/0/7.json");
    let mut county = r.json();
    county["geometry"] = json!({"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1]]]});
    let r = put(
        &mut c,
        "/Counties/0/7.json",
        "&collection=Counties",
        &county,
    );
    assert!(r.status < 300, "{}", r.text());
    changed += 1;
    let after_writes = answers(&mut c);
    assert_ne!(after_writes, built);
    assert!(
        after_writes
            .last()
            .unwrap()
            .to_string()
            .contains("/Counties/0/7.json"),
        "{}",
        after_writes.last().unwrap()
    );
    s.kill();

    let s = ChildServer::start(&dir, &INFO);
    let read = log_lines(&s, "view read from its saved file", 2);
    assert_eq!(read.len(), 2, "{read:?}");
    let since: usize = read
        .iter()
        .map(|l| {
            l.split("changed_since=")
                .nth(1)
                .unwrap()
                .split(' ')
                .next()
                .unwrap()
                .parse::<usize>()
                .unwrap()
        })
        .sum();
    // Each view reads again every document changed since (the other view's too).
    assert_eq!(since, 2 * changed, "{read:?}");
    assert_same(
        &answers(&mut s.client(ADMIN)),
        &after_writes,
        "after a SIGKILL",
    );
    assert!(s.stop().success());

    // Without the saved views, a start builds them from the documents: the same answers.
    std::fs::rename(dir.join("views"), dir.join("views-kept")).unwrap();
    let s = ChildServer::start(&dir, &INFO);
    assert!(log_lines(&s, "view read from its saved file", 0).is_empty());
    let rebuilt = answers(&mut s.client(ADMIN));
    assert_same(&rebuilt, &after_writes, "rebuilt from the documents");
    assert!(s.stop().success());

    // A damaged file (one byte changed) and a truncated one are found out and rebuilt.
    let places = dir.join("views").join(&saved[1]);
    let mut bytes = std::fs::read(&places).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x20;
    std::fs::write(&places, &bytes).unwrap();
    let counties = dir.join("views").join(&saved[0]);
    let len = std::fs::metadata(&counties).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&counties)
        .unwrap()
        .set_len(len - 1000)
        .unwrap();
    let s = ChildServer::start(&dir, &INFO);
    let refused = log_lines(&s, "saved view not used", 2);
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(log_lines(&s, "view read from its saved file", 0).is_empty());
    assert_same(&answers(&mut s.client(ADMIN)), &rebuilt, "after damage");
    s.kill();

    // Sums checked after the start, not before it (every section larger than the setting):
    // a point of the places view changed on disk passes the open, so the view serves from
    // its file; the check that follows finds it, and the view is rebuilt from the documents
    // while the server serves.
    std::fs::copy(dir.join("views-kept").join(&saved[1]), &places).unwrap();
    let mut bytes = std::fs::read(&places).unwrap();
    let (rows, sections) = saved_sections(&bytes);
    // The places view's one geometry path is the section before the diagnostics: a tag,
    // then two floats a row. The middle row's longitude is multiplied or divided by four.
    let (geometry, _) = sections[sections.len() - 2];
    let row = geometry + 8 + 16 * (rows / 2);
    let float = |b: &[u8], at: usize| f64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let (x, y) = (float(&bytes, row), float(&bytes, row + 8));
    bytes[row + 6] ^= 0x20;
    assert_ne!(float(&bytes, row), x);
    std::fs::write(&places, &bytes).unwrap();
    // The place at that row, found by the index (whose copy of the point is whole), and
    // answered with the view's point.
    let at_the_place = |c: &mut Client| -> Vec<Value> {
        let body = common::layers::q(
            "Places",
            json!({"returnGeometry": true, "outFields": "*", "spatialRel": "esriSpatialRelIntersects",
                   "extension": {"geometry": {"type": "Point", "coordinates": [x, y]}}}),
        );
        let r = c.post_json("/v1/resources/geoQueryService", &body.to_string());
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["features"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["geometry"]["coordinates"].clone())
            .collect()
    };
    let s = ChildServer::start(
        &dir,
        &[
            ("GEOSHARD_LOG", "info"),
            ("GEOSHARD_VIEW_CHECK_AT_OPEN_BYTES", "0"),
        ],
    );
    let read = log_lines(&s, "view read from its saved file", 1);
    assert!(read.len() == 1 && read[0].contains("places"), "{read:?}");
    let damaged = wait_for_lines(&s, "saved view damaged", 1, 60);
    assert!(
        damaged.len() == 1 && damaged[0].contains("places"),
        "{damaged:?}"
    );
    let rebuilt_now = wait_for_lines(&s, "views rebuilt in the background", 1, 120);
    assert_eq!(rebuilt_now.len(), 1, "{rebuilt_now:?}");
    assert_same(
        &answers(&mut s.client(ADMIN)),
        &rebuilt,
        "after damage found by the check after the start",
    );
    let found = at_the_place(&mut s.client(ADMIN));
    assert!(
        !found.is_empty() && found.iter().all(|p| *p == json!([x, y])),
        "{found:?} at {x} {y}"
    );
    s.kill();
}

/// A saved view's rows and its sections' `(offset, length)`, from the head of its file:
/// magic, format, fingerprint, commit point, rows, then the section table.
fn saved_sections(b: &[u8]) -> (usize, Vec<(usize, usize)>) {
    let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap()) as usize;
    let print = u32::from_le_bytes(b[12..16].try_into().unwrap()) as usize;
    let mut at = 16 + print + 8;
    let rows = u64_at(at);
    at += 8;
    let n = u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
    at += 4;
    let sections = (0..n)
        .map(|i| (u64_at(at + i * 20), u64_at(at + i * 20 + 8)))
        .collect();
    (rows, sections)
}

/// `n` log lines holding `needle`, waiting up to `secs` for them.
fn wait_for_lines(s: &ChildServer, needle: &str, n: usize, secs: u64) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let lines = log_lines(s, needle, n);
        if lines.len() >= n || Instant::now() > deadline {
            return lines;
        }
    }
}

#[test]
fn views_saved_while_writes_go_on_serve_the_start_after_a_sigkill() {
    let dir = counties_and_places_unbuilt("restart-live");
    let env = [
        ("GEOSHARD_LOG", "info"),
        ("GEOSHARD_ACCESS_LOG", "off"),
        ("GEOSHARD_VIEW_SAVE_SECS", "1"),
    ];

    // The start builds the views from the documents and saves them within a second or two,
    // without a stop.
    let s = ChildServer::start(&dir, &env);
    let saved = wait_for_lines(&s, "views saved", 1, 60);
    assert!(
        saved.len() == 1 && saved[0].contains("live=true") && saved[0].contains("views=2"),
        "{saved:?}"
    );

    // Four writers replace, add and delete places while saves go on, and are still writing
    // at the SIGKILL: more changes than a start reads again after one save (14,456 for the
    // 147,789 rows), so without the saves made meanwhile it would build the views. Past
    // 20,000 changes they slow to a trickle, so that fewer documents change after the last
    // save than a start reads again, however long a save takes on a busy machine.
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let killed = Arc::new(AtomicBool::new(false));
    let trickle = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicUsize::new(0));
    let writers: Vec<_> = (0..4i64)
        .map(|w| {
            let mut c = s.client(ADMIN);
            let (killed, trickle, written) = (killed.clone(), trickle.clone(), written.clone());
            std::thread::spawn(move || {
                for round in 0i64.. {
                    let slow = trickle.load(Ordering::SeqCst);
                    let docs: Vec<(String, Value)> = (0..if slow { 5 } else { 250 })
                        .map(|i| {
                            // Existing places, and new ones past the last every third round.
                            let id = 1 + (w * 36_000 + round * 1_750 + i * 7) % 144_000
                                + if round % 3 == 2 { 200_000 } else { 0 };
                            let cc = ["FR", "US", "MX"][(i % 3) as usize];
                            let doc = json!({"type": "Feature",
                                "properties": {"OBJECTID": id, "name": format!("Live {w} {round} {i}"), "cc": cc},
                                "geometry": {"type": "Point",
                                             "coordinates": [2.0 + i as f64 * 3e-3, 48.5 + (round % 10) as f64 * 0.06]}});
                            (format!("/Places/0/{id}.json"), doc)
                        })
                        .collect();
                    let deleted = 3 + (w * 36_000 + round * 1_750) % 144_000;
                    let wrote = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        let r = common::layers::bulk(&mut c, "Places", &docs);
                        assert!(r.status < 300, "{}", r.text());
                        let r = c.delete(&format!("/v1/documents?uri=/Places/0/{deleted}.json"));
                        assert_eq!(r.status, 204, "{}", r.text());
                    }));
                    if killed.load(Ordering::SeqCst) {
                        return;
                    }
                    assert!(wrote.is_ok(), "a write failed before the SIGKILL");
                    written.fetch_add(docs.len() + 1, Ordering::SeqCst);
                    if slow {
                        std::thread::sleep(Duration::from_millis(200));
                    }
                }
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(300);
    let wait = |done: &dyn Fn() -> bool| {
        while !done() {
            assert!(Instant::now() < deadline, "writes or saves too slow");
            assert!(writers.iter().all(|w| !w.is_finished()), "a writer stopped");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait(&|| {
        written.load(Ordering::SeqCst) >= 20_000 && log_lines(&s, "views saved", 3).len() >= 3
    });
    // The save under way may have begun before the trickle: the one after it began after.
    trickle.store(true, Ordering::SeqCst);
    let before = log_lines(&s, "views saved", 0).len();
    wait(&|| log_lines(&s, "views saved", before + 2).len() >= before + 2);
    killed.store(true, Ordering::SeqCst);
    let saves = log_lines(&s, "views saved", 0);
    s.kill();
    for w in writers {
        w.join().unwrap();
    }

    // The start reads the views saved last (while writing) and the documents changed since,
    // and answers as the views built from the documents do.
    let s = ChildServer::start(&dir, &INFO);
    let read = log_lines(&s, "view read from its saved file", 2);
    assert_eq!(
        read.len(),
        2,
        "{read:?}\nsaves before the SIGKILL: {saves:?}\nthe start: {:?}",
        log_lines(&s, "saved view", 0)
    );
    assert!(
        read.iter().all(|l| !l.contains("changed_since=0 ")),
        "{read:?}"
    );
    assert!(log_lines(&s, "saved view not used", 0).is_empty());
    let from_saved = answers(&mut s.client(ADMIN));
    assert!(s.stop().success());
    std::fs::remove_dir_all(dir.join("views")).unwrap();
    let s = ChildServer::start(&dir, &INFO);
    assert!(log_lines(&s, "view read from its saved file", 0).is_empty());
    assert_same(
        &from_saved,
        &answers(&mut s.client(ADMIN)),
        "from the views saved while writing, against a build",
    );
    s.kill();
}

/// While a start builds its views, the server answers already: `/health` 200 (alive,
/// starting), `/ready` and the contract's routes 503 in its error format with `Retry-After`,
/// so that probes and clients meet answers instead of refused connections. Once started, it
/// serves.
#[test]
fn a_start_answers_503_until_it_is_ready() {
    let dir = counties_and_places_unbuilt("restart-starting");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_geoshard"))
        .args(["serve", "--listen", &addr.to_string(), "--data-dir"])
        .arg(&*dir)
        .env("GEOSHARD_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(
            Instant::now() < deadline,
            "the server never accepted a connection"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut anon = Client::new(addr, Auth::None);
    let health = anon.get("/health");
    assert_eq!(health.status, 200, "{}", health.text());
    assert_eq!(health.json()["status"], "starting", "{}", health.text());
    let ready = anon.get("/ready");
    assert_eq!(ready.status, 503, "{}", ready.text());
    assert_eq!(ready.json()["status"], "starting");
    assert_eq!(ready.header("retry-after"), Some("1"));
    let mut admin = Client::new(addr, Auth::Digest(ADMIN.0.into(), ADMIN.1.into()));
    let (_, body) = &queries()[0];
    let r = admin.post_json("/v1/resources/geoQueryService", &body.to_string());
    assert_eq!(r.status, 503, "{}", r.text());
    let (_, code, message) = r.error();
    assert_eq!(code, "RESTAPI-UNAVAILABLE");
    assert!(message.contains("starting"), "{message}");
    assert_eq!(r.header("retry-after"), Some("1"));
    // The address is announced once the server is ready; then it serves.
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert!(line.starts_with("geoshard listening on"), "{line}");
    let ready = anon.get("/ready");
    assert_eq!(ready.status, 200, "{}", ready.text());
    assert_eq!(anon.get("/health").json()["status"], "ok");
    let r = admin.post_json("/v1/resources/geoQueryService", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    let _ = child.kill();
    let _ = child.wait();
}
