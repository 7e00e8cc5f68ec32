//! Real clients of the contract against a real server: Python `requests` and the official
//! Node.js client (`marklogic`). They come from the registries through
//! `scripts/setup-clients.sh`, which these tests run themselves when the clients are not
//! installed yet; without npm, Python or the registries they fail, saying so.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Once;

use common::*;
use serde_json::Value;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Install the clients once per test binary (the script is idempotent and quick when they
/// are there already).
fn setup() {
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

fn python() -> PathBuf {
    root().join("target/clients-venv/bin/python")
}

/// Run a client script; its last line of output is a JSON summary.
fn run(program: &Path, args: &[String]) -> Value {
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

/// Issue 33 finding 5, as Python `requests` met it: about one first PUT in five of 30-100 KB
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

/// Issue 33 finding 5, as the Node.js client met it: the call after a 400 failed with
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
