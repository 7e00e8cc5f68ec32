//! SIGKILLs in the storage's long operations: an offline `geoshard load` at moments spread
//! over all its phases (the documents, the views' build and save, the documents' repack),
//! and a server killed while it saves its views and writes go on. (A killed `geoshard
//! compact`, the store's merge, is `crash::a_killed_compaction_leaves_a_whole_store`.) After
//! every kill the data directory opens, holds what was written as it was written (every
//! acknowledged write, for the server), and answers as a start that builds its views from
//! its documents does.

use crate::common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::layers::queries;
use common::*;
use serde_json::{Value, json};

/// The first `rows` GeoNames places as a CSV file in `dir`.
fn places_csv(dir: &Path, rows: usize) -> PathBuf {
    let all =
        std::fs::read_to_string(data_dir().join("real").join("geonames-cities1000.csv")).unwrap();
    let file = dir.join("places.csv");
    let head: Vec<&str> = all.lines().take(rows + 1).collect();
    std::fs::write(&file, head.join("\n") + "\n").unwrap();
    file
}

fn load(dir: &Path, file: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_geoshard"));
    c.args(["load", "--quiet", "--service", "Places", "--data-dir"])
        .arg(dir)
        .arg(file)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

/// Each query of the places layer as answered (status and body), and the diagnostics.
fn answers(c: &mut Client) -> Vec<Value> {
    let mut out = Vec::new();
    for (what, body) in queries() {
        if body["params"]["id"] != "Places" {
            continue;
        }
        let r = c.post_json("/v1/resources/geoQueryService", &body.to_string());
        let mut v = r.json();
        if let Some(o) = v.as_object_mut() {
            o.remove("$timestamp");
        }
        out.push(json!({"query": what, "status": r.status, "body": v}));
    }
    out.push(c.get("/v1/diagnostics").json());
    out
}

/// The answers of a start on a copy of `dir` without its saved views: built from the
/// documents.
fn rebuilt_answers(dir: &Path) -> Vec<Value> {
    let copy = temp_dir("kills-rebuilt");
    copy_dir(dir, copy.path());
    let _ = std::fs::remove_dir_all(copy.path().join("views"));
    let s = ChildServer::start(copy.path(), &[]);
    let got = answers(&mut s.client(ADMIN));
    s.kill();
    got
}

fn same(got: &[Value], want: &[Value], when: &str) {
    assert_eq!(got.len(), want.len(), "{when}");
    for (g, w) in got.iter().zip(want) {
        if let Err(e) = same_json(g, w, "") {
            panic!("{when}: {}: {e}", w["query"]);
        }
    }
}

/// Places' documents, by number, as a whole load stores them.
fn documents(c: &mut Client, ids: impl Iterator<Item = usize>) -> HashMap<usize, Option<Value>> {
    ids.map(|id| {
        let r = c.get(&format!("/v1/documents?uri=/Places/0/{id}.json"));
        let doc = match r.status {
            200 => Some(r.json()),
            404 => None,
            s => panic!("document {id}: {s} {}", r.text()),
        };
        (id, doc)
    })
    .collect()
}

/// `geoshard load --data-dir` killed at eight moments over a whole load's time (more of them
/// early, where the documents are written, whose phase is the shortest): each
/// directory it leaves opens, every document in it is as the whole load stores it, its
/// answers equal those of a start that builds the views from its documents, and the same
/// load run again completes it.
#[test]
fn a_killed_offline_load_leaves_a_directory_that_opens_and_answers_as_a_rebuild() {
    const ROWS: usize = 30_000;
    const KILLS: u32 = 8;
    let files = temp_dir("kills-load-files");
    let csv = places_csv(files.path(), ROWS);

    // A whole load, timed: the moments of the kills, the documents and the answers.
    let whole = temp_dir("kills-load-whole");
    seed_users(whole.path());
    let started = Instant::now();
    assert!(load(whole.path(), &csv).status().unwrap().success());
    let took = started.elapsed();
    let s = ChildServer::start(whole.path(), &[]);
    let mut c = s.client(ADMIN);
    let want = answers(&mut c);
    assert_eq!(want[0]["status"], 200, "{}", want[0]);
    let sample = || (1..=ROWS).step_by(311).chain([ROWS]);
    let docs = documents(&mut c, sample());
    assert!(docs.values().all(Option::is_some));
    s.kill();

    let mut partial = 0;
    for k in 0..KILLS {
        let dir = temp_dir(&format!("kills-load-{k}"));
        seed_users(dir.path());
        let mut child = load(dir.path(), &csv).spawn().unwrap();
        let at = took.mul_f64(((k + 1) as f64 / (KILLS + 1) as f64).powi(2));
        std::thread::sleep(at);
        let finished = child.try_wait().unwrap().is_some();
        let _ = child.kill();
        let _ = child.wait();
        let when = format!(
            "kill {k} at {:?} of {took:?}",
            took * (2 * k + 1) / (2 * KILLS)
        );

        let s = ChildServer::start(dir.path(), &[]);
        let mut c = s.client(ADMIN);
        let got = answers(&mut c);
        let held = documents(&mut c, sample());
        s.kill();
        for (id, doc) in &held {
            assert!(
                doc.is_none() || doc == &docs[id],
                "{when}: document {id} is not as written: {doc:?}"
            );
        }
        partial += usize::from(held.values().any(Option::is_none) && !finished);
        same(&got, &rebuilt_answers(dir.path()), &when);

        // The load run again completes the directory.
        assert!(load(dir.path(), &csv).status().unwrap().success(), "{when}");
        let s = ChildServer::start(dir.path(), &[]);
        same(
            &answers(&mut s.client(ADMIN)),
            &want,
            &format!("{when}, loaded again"),
        );
        s.kill();
    }
    // Some kills came before every document was in.
    eprintln!("{KILLS} kills of a load of {took:?}: {partial} left documents out");
    assert!(partial >= 2, "{partial} kills left documents out");
}

/// A server saving its views every second while bulk writes go on, killed six times, each
/// time after a save has begun and before it can end: the start after each kill finds
/// every acknowledged write (or the write in flight at the kill, whole) and answers as a
/// start that builds its views from the documents.
#[test]
fn kills_during_view_saves_lose_no_acknowledged_write_and_views_equal_a_rebuild() {
    const ROWS: usize = 30_000;
    const KILLS: usize = 6;
    let files = temp_dir("kills-save-files");
    let csv = places_csv(files.path(), ROWS);
    let dir = temp_dir("kills-save");
    seed_users(dir.path());
    assert!(load(dir.path(), &csv).status().unwrap().success());
    let env = [
        ("GEOSHARD_VIEW_SAVE_SECS", "1"),
        ("GEOSHARD_ACCESS_LOG", "off"),
        ("RUST_LOG", "info,geoshard_features::persist=debug"),
    ];
    // URI -> the last acknowledged content, and the one in flight at the kill.
    type Written = Arc<Mutex<HashMap<String, (Option<Value>, Option<Value>)>>>;
    let written: Written = Arc::default();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut saves_cut = 0;
    for round in 0..=KILLS {
        let s = ChildServer::start(dir.path(), &env);
        let mut c = s.client(ADMIN);
        for (uri, (acked, in_flight)) in written.lock().unwrap().iter_mut() {
            let r = c.get(&format!("/v1/documents?uri={uri}"));
            assert_eq!(r.status, 200, "round {round}: {uri}");
            let got = Some(r.json());
            // Never acknowledged: the load's place, or the write in flight.
            let loaded = acked.is_none()
                && !got.as_ref().unwrap()["properties"]["name"]
                    .as_str()
                    .unwrap()
                    .starts_with("Saved ");
            assert!(
                got == *acked || got == *in_flight || loaded,
                "round {round}: {uri} holds {got:?}, not {acked:?} (or {in_flight:?})"
            );
            // What a start finds is what later rounds must keep: a write in flight at a
            // kill that was found whole counts from now on as acknowledged.
            if got == *in_flight {
                *acked = got;
            }
            *in_flight = None;
        }
        if round == KILLS {
            s.kill();
            break;
        }
        let killed = Arc::new(AtomicBool::new(false));
        let writer = {
            let (mut c, killed, written) = (s.client(ADMIN), killed.clone(), written.clone());
            let first = next();
            std::thread::spawn(move || {
                for batch in 0u64.. {
                    // Coordinates of few digits, which read back as the same floats.
                    let docs: Vec<(String, Value)> = (0..200u64)
                        .map(|i| {
                            let id = 1 + (first + batch * 7_919 + i * 131) % ROWS as u64;
                            let doc = json!({"type": "Feature",
                                "properties": {"name": format!("Saved {round} {batch} {i}"), "cc": "FR"},
                                "geometry": {"type": "Point",
                                             "coordinates": [(2000 + i) as f64 / 1e3, (4800 + batch % 50) as f64 / 1e2]}});
                            (format!("/Places/0/{id}.json"), doc)
                        })
                        .collect();
                    {
                        let mut w = written.lock().unwrap();
                        for (uri, doc) in &docs {
                            w.entry(uri.clone()).or_default().1 = Some(doc.clone());
                        }
                    }
                    let answered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        common::layers::bulk(&mut c, "Places", &docs).status
                    }));
                    if killed.load(Ordering::SeqCst) {
                        return;
                    }
                    assert!(
                        matches!(answered, Ok(s) if s < 300),
                        "a write failed: {answered:?}"
                    );
                    let mut w = written.lock().unwrap();
                    for (uri, doc) in docs {
                        let e = w.get_mut(&uri).unwrap();
                        *e = (Some(doc), None);
                    }
                }
            })
        };
        // The first save's length, then a kill at a random moment of a later save.
        let deadline = Instant::now() + Duration::from_secs(120);
        let lines = |needle: &str| -> Vec<String> {
            s.log
                .lock()
                .unwrap()
                .iter()
                .filter(|l| l.contains(needle))
                .cloned()
                .collect()
        };
        while lines("views saved").is_empty() {
            assert!(
                Instant::now() < deadline,
                "no save: {:?}",
                lines("saving views")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let secs: f64 = lines("views saved")[0]
            .split("secs=")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .unwrap();
        let begun = lines("saving views").len();
        while lines("saving views").len() == begun {
            assert!(Instant::now() < deadline, "no second save");
            std::thread::sleep(Duration::from_millis(5));
        }
        let into = Duration::from_secs_f64(secs * (next() % 80) as f64 / 100.0);
        std::thread::sleep(into);
        let (begun, ended) = (lines("saving views").len(), lines("views saved").len());
        killed.store(true, Ordering::SeqCst);
        s.kill();
        writer.join().unwrap();
        let unfinished = std::fs::read_dir(dir.path().join("views"))
            .unwrap()
            .any(|e| e.unwrap().file_name().to_string_lossy().ends_with(".tmp"));
        saves_cut += usize::from(unfinished || ended < begun);

        // The start reads what the saves left and answers as a rebuild.
        let want = rebuilt_answers(dir.path());
        let s = ChildServer::start(dir.path(), &env);
        same(
            &answers(&mut s.client(ADMIN)),
            &want,
            &format!("kill {round}, {into:?} into a save of about {secs} s"),
        );
        s.kill();
    }
    assert!(
        saves_cut >= KILLS / 2,
        "{saves_cut} of {KILLS} kills cut a save short"
    );
}
