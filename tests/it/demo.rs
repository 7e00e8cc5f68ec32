//! `geoshard demo` as a newcomer runs it: it reads the same settings as `serve`
//! (a `--config` file and `GEOSHARD_*`), refuses a port in use before loading anything, and
//! removes its temporary data directory when it stops.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

/// The `geoshard-demo-*` directories under `tmp`.
fn demo_dirs(tmp: &Path) -> Vec<String> {
    std::fs::read_dir(tmp)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("geoshard-demo-"))
        .collect()
}

fn demo(tmp: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_geoshard"));
    cmd.arg("demo")
        .args(args)
        .env("TMPDIR", tmp)
        .env("GEOSHARD_LOG", "warn")
        .env_remove("GEOSHARD_CONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

#[test]
fn demo_reads_settings_checks_its_port_and_cleans_up() {
    let tmp = temp_dir("demo");
    // A port in use: a clear error at once, and nothing left behind.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().to_string();
    let t0 = Instant::now();
    let out = demo(tmp.path(), &["--listen", &port], &[])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("cannot listen on {port}")), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(demo_dirs(tmp.path()), Vec::<String>::new());
    drop(taken);

    // Settings from a file and from the environment, as `serve` takes them.
    let file = tmp.path().join("demo.toml");
    std::fs::write(&file, "max_record_count = 7\nlisten = \"localhost:0\"\n").unwrap();
    let mut child = demo(
        tmp.path(),
        &["--config", file.to_str().unwrap()],
        &[("GEOSHARD_NONCE_IDLE_SECS", "5")],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut addr = None;
    while Instant::now() < deadline {
        let Some(Ok(line)) = lines.next() else { break };
        if let Some(rest) = line.strip_prefix("geoshard demo is running on http://") {
            addr = Some(rest.trim().parse::<std::net::SocketAddr>().unwrap());
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    let addr = addr.expect("the demo announces its address");
    assert!(addr.ip().is_loopback());
    assert_eq!(demo_dirs(tmp.path()).len(), 1);
    let mut c = Client::new(addr, Auth::Digest("demo".into(), "demo-password".into()));
    let svc = c
        .post_json(
            "/v1/resources/geoQueryService",
            &json!({"params": {"id": "US Counties"}}).to_string(),
        )
        .json();
    assert_eq!(svc["maxRecordCount"], 7, "{svc}");
    // The demo's input flow, as its banner shows it: a sighting becomes a point of the
    // Sightings layer; one without a position is the plugin's 400.
    let r = c.request(
        "PUT",
        "/v1/documents?uri=/sightings/1.json&collection=sightings&transform=svc:sjsInputFlow&trans:entity-name=Sighting&trans:flow-name=Load",
        &[("Content-Type", "application/json")],
        br#"{"id": 1, "species": "heron", "lon": 2.35, "lat": 48.85}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let r = c.request(
        "PUT",
        "/v1/documents?uri=/sightings/2.json&collection=sightings&transform=svc:sjsInputFlow&trans:entity-name=Sighting&trans:flow-name=Load",
        &[("Content-Type", "application/json")],
        br#"{"species": "heron"}"#,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let found = c
        .post_json(
            "/v1/resources/geoQueryService",
            &json!({"params": {"id": "Sightings", "layer": 0, "method": "query"},
                    "query": {"outFields": "*", "distance": 5, "units": "esriSRUnit_Kilometer",
                              "extension": {"geometry": {"type": "Point", "coordinates": [2.3, 48.86]}}}})
            .to_string(),
        )
        .json();
    assert_eq!(
        found["features"][0]["properties"]["species"], "heron",
        "{found}"
    );
    assert_eq!(
        found["features"].as_array().map(Vec::len),
        Some(1),
        "{found}"
    );
    // A file through the same flow with `geoshard load --transform`: each CSV row reaches
    // the flow as an object of its columns (numbers as text, which the flow reads), the row
    // without a latitude is the loader's skip, and the layer stays the project's (no template
    // of the loader's).
    let csv_file = tmp.path().join("sightings.csv");
    let mut text = String::from("id,species,lon,lat\n");
    let mut rows = Vec::new();
    for i in 0..200i64 {
        let (lon, lat) = (-10.0 + i as f64 * 0.1, 40.0 + (i % 17) as f64 * 0.25);
        let species = ["heron", "egret", "ibis"][(i % 3) as usize];
        text.push_str(&format!("{},{species},{lon},{lat}\n", 1000 + i));
        rows.push((1000 + i, species, lon, lat));
    }
    text.push_str("9999,stork,3.5,\n");
    std::fs::write(&csv_file, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_geoshard"))
        .arg("load")
        .arg(&csv_file)
        .args(["--service", "Sightings", "--collection", "sightings"])
        .args([
            "--uri",
            "/sightings/load-{id}.json",
            "--quiet",
            "--allow-skips",
        ])
        .args(["--url", &format!("http://{addr}")])
        .args(["--user", "demo", "--password", "demo-password"])
        .args([
            "--transform",
            "svc:sjsInputFlow",
            "--entity",
            "Sighting",
            "--flow",
            "Load",
        ])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        report
            .starts_with("loaded 200 of 201 records into Sightings layer 0 (1 skipped, 0 failed)"),
        "{report}"
    );
    let q = |query: serde_json::Value, c: &mut Client| {
        c.post_json(
            "/v1/resources/geoQueryService",
            &json!({"params": {"id": "Sightings", "layer": 0, "method": "query"}, "query": query})
                .to_string(),
        )
        .json()
    };
    assert_eq!(q(json!({"returnCountOnly": true}), &mut c)["count"], 201);
    // A box, against a scan of the rows: the flow's ids, and the species by count (this
    // demo pages by 7, so ids and statistics rather than features).
    let (w, s, e, n) = (-5.05, 41.0, 4.05, 43.0);
    let inside: Vec<&(i64, &str, f64, f64)> = rows
        .iter()
        .filter(|(_, _, lon, lat)| (w..=e).contains(lon) && (s..=n).contains(lat))
        .collect();
    assert!(inside.len() > 10, "{inside:?}");
    let geometry = json!({"type": "Polygon",
        "coordinates": [[[w, s], [e, s], [e, n], [w, n], [w, s]]]});
    let found = q(
        json!({"returnIdsOnly": true, "extension": {"geometry": geometry}}),
        &mut c,
    );
    let mut got = common::layers::ids(&found);
    got.sort_unstable();
    let want: Vec<i64> = inside.iter().map(|r| r.0).collect();
    assert_eq!(got, want);
    let stats = q(
        json!({"outStatistics": [{"statisticType": "count", "onStatisticField": "OBJECTID",
                                  "outStatisticFieldName": "n"}],
               "groupByFieldsForStatistics": "species",
               "extension": {"geometry": geometry}}),
        &mut c,
    );
    let mut by_species: Vec<(String, i64)> = stats["statistics"]
        .as_array()
        .unwrap_or_else(|| panic!("{stats}"))
        .iter()
        .map(|g| {
            (
                g["species"].as_str().unwrap().to_string(),
                g["n"].as_i64().unwrap(),
            )
        })
        .collect();
    by_species.sort();
    let mut want_species: Vec<(String, i64)> = ["egret", "heron", "ibis"]
        .iter()
        .map(|sp| {
            (
                sp.to_string(),
                inside.iter().filter(|r| r.1 == *sp).count() as i64,
            )
        })
        .collect();
    want_species.retain(|(_, n)| *n > 0);
    assert_eq!(by_species, want_species, "{stats}");
    assert_eq!(
        c.get("/v1/documents?uri=/geoshard-load/Sightings/template-0.json")
            .status,
        404
    );
    // SIGTERM: it stops and its data directory is gone.
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert_eq!(demo_dirs(tmp.path()), Vec::<String>::new());
}
