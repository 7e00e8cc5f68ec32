//! Durability under SIGKILL: a child server takes concurrent PUTs and is killed mid-stream.
//! After a restart, every write that got 201/204 is there byte for byte.

mod common;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_geoshard");

/// Per URI: the content of the last acknowledged PUT, and any PUT sent after it whose answer
/// never came (it may or may not have landed when the server died).
#[derive(Default, Clone)]
struct Expect {
    acked: Option<Vec<u8>>,
    in_flight: Option<Vec<u8>>,
}

#[test]
fn acknowledged_writes_survive_sigkill() {
    let dir = temp_dir("crash");
    let status = Command::new(BIN)
        .args([
            "user",
            "add",
            "--name",
            "w",
            "--password",
            "pw",
            "--role",
            "rest-writer",
            "--data-dir",
        ])
        .arg(&dir)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());

    let server = ChildServer::start(&dir, &[]);
    let addr = server.addr;
    // Workers see the server die under them; keep their expected panics out of the log.
    std::panic::set_hook(Box::new(|_| {}));
    let expect: Arc<Mutex<HashMap<String, Expect>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let expect = expect.clone();
            let stop = stop.clone();
            let acked = acked.clone();
            std::thread::spawn(move || {
                let mut c = Client::new(addr, Auth::Digest("w".into(), "pw".into()));
                let mut k = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // 40 URIs per thread, so most later writes replace earlier ones.
                    let uri = format!("/crash/{t}/{}.json", k % 40);
                    let body = format!(
                        "{{\"t\":{t},\"k\":{k},\"pad\":\"{}\"}}",
                        "x".repeat((k % 97) as usize)
                    );
                    expect
                        .lock()
                        .unwrap()
                        .entry(uri.clone())
                        .or_default()
                        .in_flight = Some(body.clone().into_bytes());
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        c.put_json(&format!("/v1/documents?uri={}", enc(&uri)), &body)
                    }));
                    match result {
                        Ok(r) if r.status == 201 || r.status == 204 => {
                            let mut e = expect.lock().unwrap();
                            let slot = e.get_mut(&uri).unwrap();
                            slot.acked = slot.in_flight.take();
                            acked.fetch_add(1, Ordering::Relaxed);
                        }
                        // The server died under us: this write's fate is unknown.
                        _ => break,
                    }
                    k += 1;
                }
            })
        })
        .collect();

    // Let writes flow, then kill without warning once plenty are acknowledged.
    let deadline = Instant::now() + Duration::from_secs(60);
    while acked.load(Ordering::Relaxed) < 3000 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    server.kill(); // SIGKILL
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let _ = std::panic::take_hook(); // back to the default hook
    let total = acked.load(Ordering::Relaxed);
    assert!(
        total >= 1000,
        "only {total} writes were acknowledged before the kill"
    );

    let server = ChildServer::start(&dir, &[]);
    let mut c = server.client(("w", "pw"));
    let expect = expect.lock().unwrap().clone();
    let mut checked = 0;
    for (uri, e) in &expect {
        let r = c.get(&format!("/v1/documents?uri={}", enc(uri)));
        match (&e.acked, &e.in_flight) {
            (Some(acked), in_flight) => {
                assert_eq!(r.status, 200, "{uri} was acknowledged but is gone");
                let ok = r.body == *acked || in_flight.as_ref() == Some(&r.body);
                assert!(
                    ok,
                    "{uri}: stored {:?} is neither the acknowledged content nor the one in flight",
                    r.text()
                );
                checked += 1;
            }
            (None, Some(in_flight)) => {
                // Never acknowledged: absent, or exactly what was sent.
                assert!(
                    r.status == 404 || r.body == *in_flight,
                    "{uri}: {}",
                    r.status
                );
            }
            (None, None) => {}
        }
    }
    assert!(checked > 100, "checked {checked}");
    server.kill();
    eprintln!("{total} acknowledged writes before SIGKILL; {checked} URIs verified after restart");
}
