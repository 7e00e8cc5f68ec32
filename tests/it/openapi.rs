//! The OpenAPI document (`docs/openapi.json`) against a live server: served as it is kept, and
//! checked by schemathesis (PyPI, installed by `scripts/setup-clients.sh`), which generates
//! requests for every operation from the document and checks every answer: no server error,
//! a documented status, a documented content type, a body that fits its schema.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::*;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn schemathesis_finds_no_failure() {
    let st = root().join("target/clients-venv/bin/schemathesis");
    assert!(
        st.exists(),
        "{} is missing: run scripts/setup-clients.sh (as .ci/run does)",
        st.display()
    );
    let dir = temp_dir("openapi");
    seed_users(&dir);
    // The document's geoQueryService example names this service: its requests reach real data.
    let loaded = Command::new(env!("CARGO_BIN_EXE_geoshard"))
        .args(["load", "--quiet", "--service", "US Counties", "--data-dir"])
        .arg(dir.path())
        .arg(root().join("tests/fixtures/load/counties-tx-co.geojson"))
        .output()
        .unwrap();
    assert!(loaded.status.success(), "{loaded:?}");
    let srv = ChildServer::start(dir.path(), &[]);

    let mut c = srv.client(ADMIN);
    let served = c.get("/v1/openapi.json");
    assert_eq!(served.status, 200);
    let kept: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("docs/openapi.json")).unwrap())
            .unwrap();
    assert_eq!(served.json(), kept);

    let out = Command::new(&st)
        .current_dir(dir.path())
        .args(["run"])
        .arg(root().join("docs/openapi.json"))
        .args(["--url", &format!("http://{}", srv.addr)])
        .args(["--auth", &format!("{}:{}", ADMIN.0, ADMIN.1)])
        .args([
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
            "--max-examples",
            "25",
            // The stateful phase chains calls through the user endpoints, and changing the
            // password of the user it runs as ends its own run; the others cover every
            // operation.
            "--phases",
            "examples,coverage,fuzzing",
            "--generation-deterministic",
            "--max-response-time",
            "10",
            // A fence's event stream does not end: its own tests read it.
            "--exclude-path-regex",
            "/events$",
        ])
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    eprintln!("{report}");
    assert!(
        out.status.success(),
        "schemathesis found failures:\n{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        report.contains("25 passed") || report.contains("passed"),
        "{report}"
    );
    srv.kill();
}
