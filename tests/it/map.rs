//! The map page at `GET /`: served from the binary's embedded files behind authentication,
//! and used in a real browser: Debian's Chromium (installed by `scripts/setup-system.sh`, as
//! `.ci/run` does) driven by playwright-core (npm, `scripts/setup-clients.sh`) against a server
//! with the US counties and the GeoNames places. The browser's answers are checked against
//! scans of the source files.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

const DENVER: (f64, f64) = (-104.9903, 39.7392);

/// A stopped server's directory with `US Counties` and `Places` loaded from the shared data.
fn loaded_dir() -> TestDir {
    let dir = temp_dir("map");
    seed_users(&dir);
    let real = data_dir().join("real");
    for (service, file) in [
        ("US Counties", "us-counties.geojson"),
        ("Places", "geonames-cities1000.csv"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_geoshard"))
            .args(["load", "--quiet", "--service", service, "--data-dir"])
            .arg(dir.path())
            .arg(real.join(file))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    dir
}

#[test]
fn the_page_and_its_files_are_served_behind_authentication() {
    let dir = temp_dir("map-files");
    seed_users(&dir);
    let srv = ChildServer::start(dir.path(), &[]);
    let mut anon = Client::new(srv.addr, Auth::None);
    assert_eq!(anon.get("/").status, 401);
    assert_eq!(anon.get("/map/map.js").status, 401);

    let mut c = srv.client(READER);
    let page = c.get("/");
    assert_eq!(page.status, 200);
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    let html = page.text();
    assert!(html.contains(r#"<script type="module" src="/map/map.js">"#));
    for (path, kind) in [
        ("/map/map.js", "text/javascript; charset=utf-8"),
        ("/map/map.css", "text/css; charset=utf-8"),
        (
            "/map/vendor/maplibre-gl.mjs",
            "text/javascript; charset=utf-8",
        ),
        (
            "/map/vendor/maplibre-gl-worker.mjs",
            "text/javascript; charset=utf-8",
        ),
        ("/map/vendor/maplibre-gl.css", "text/css; charset=utf-8"),
    ] {
        let r = c.get(path);
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.header("content-type"), Some(kind), "{path}");
        let file = root().join("assets").join(path.trim_start_matches('/'));
        assert_eq!(r.body, std::fs::read(&file).unwrap(), "{path}");
        // Revalidation by the entity tag.
        let tag = r.header("etag").unwrap().to_string();
        let again = c.request("GET", path, &[("If-None-Match", &tag)], b"");
        assert_eq!(again.status, 304, "{path}");
        assert!(again.body.is_empty());
    }
    // gzip when asked for, and it is the same file.
    let gz = c.request(
        "GET",
        "/map/vendor/maplibre-gl.mjs",
        &[("Accept-Encoding", "gzip, br")],
        b"",
    );
    assert_eq!(gz.status, 200);
    assert_eq!(gz.header("content-encoding"), Some("gzip"));
    let mut plain = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz.body[..]), &mut plain)
        .unwrap();
    assert_eq!(
        plain,
        std::fs::read(root().join("assets/map/vendor/maplibre-gl.mjs")).unwrap()
    );

    // An unknown file is a 404 in the contract's format, and only GET is served.
    let missing = c.get("/map/nothing.js");
    assert_eq!(missing.status, 404);
    assert_eq!(missing.error().0, 404);
    assert_eq!(c.delete("/").status, 405);
}

/// Debian's Chromium, installed by `scripts/setup-system.sh` when missing.
pub(crate) fn need_chromium() -> PathBuf {
    let chromium = PathBuf::from("/usr/bin/chromium");
    if !chromium.exists() {
        let _ = Command::new(root().join("scripts/setup-system.sh")).status();
    }
    assert!(
        chromium.exists(),
        "/usr/bin/chromium is missing and scripts/setup-system.sh could not install Debian's chromium"
    );
    chromium
}

pub(crate) fn setup_clients() {
    let out = Command::new(root().join("scripts/setup-clients.sh"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/setup-clients.sh failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The counties of the source file containing a point, by name.
fn counties_at(lon: f64, lat: f64) -> Vec<String> {
    use geo::Contains;
    let text = std::fs::read_to_string(data_dir().join("real/us-counties.geojson")).unwrap();
    let fc: Value = serde_json::from_str(&text).unwrap();
    let p = geo::Point::new(lon, lat);
    let mut names: Vec<String> = fc["features"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| {
            geoshard::spatial::parse_geojson(&f["geometry"])
                .unwrap()
                .contains(&p)
        })
        .map(|f| f["properties"]["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

/// The places of the source file in a box (edges included), by name.
fn places_in(w: f64, s: f64, e: f64, n: f64) -> Vec<String> {
    let mut r = csv::Reader::from_path(data_dir().join("real/geonames-cities1000.csv")).unwrap();
    let mut names: Vec<String> = r
        .records()
        .map(Result::unwrap)
        .filter(|rec| {
            let lat: f64 = rec[0].parse().unwrap();
            let lon: f64 = rec[1].parse().unwrap();
            (w..=e).contains(&lon) && (s..=n).contains(&lat)
        })
        .map(|rec| rec[2].to_string())
        .collect();
    names.sort();
    names
}

fn source_counts() -> (u64, u64) {
    let text = std::fs::read_to_string(data_dir().join("real/us-counties.geojson")).unwrap();
    let fc: Value = serde_json::from_str(&text).unwrap();
    let counties = fc["features"].as_array().unwrap().len() as u64;
    let places = csv::Reader::from_path(data_dir().join("real/geonames-cities1000.csv"))
        .unwrap()
        .records()
        .count() as u64;
    (counties, places)
}

/// The names on the cards of one layer, sorted.
fn card_names(summary: &Value, layer: &str) -> Vec<String> {
    let mut names: Vec<String> = summary["cards"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["layer"] == layer)
        .map(|c| c["properties"]["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

#[test]
fn a_real_browser_draws_the_layers_and_finds_denver() {
    let chromium = need_chromium();
    setup_clients();
    let dir = loaded_dir();
    let srv = ChildServer::start(dir.path(), &[]);
    let artifacts = root().join("target/test-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let shot = artifacts.join("map-page.png");
    let _ = std::fs::remove_file(&shot);

    let out = Command::new("node")
        .arg(root().join("tests/clients/node/map_page.js"))
        .args([
            // The credentials in the page's URL too, as a user may type them (the
            // page's requests failed, since fetch refuses URLs that carry credentials).
            format!("http://{}:{}@{}", GEO.0, GEO.1, srv.addr),
            GEO.0.to_string(),
            GEO.1.to_string(),
            format!("8/{}/{}", DENVER.1, DENVER.0),
            DENVER.0.to_string(),
            DENVER.1.to_string(),
        ])
        .arg(&shot)
        .arg(&chromium)
        .current_dir(root().join("tests/clients"))
        .output()
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert!(summary.get("fatal").is_none(), "{summary}");
    assert_eq!(summary["state"], "ready", "{summary}");
    assert_eq!(summary["consoleErrors"], serde_json::json!([]), "{summary}");
    assert_eq!(summary["failed"], serde_json::json!([]), "{summary}");

    // The layer list: both layers, with the source files' feature counts.
    let (counties, places) = source_counts();
    let layers = summary["layers"].as_array().unwrap();
    // The list is the legend: each layer's symbol says its kind of geometry; the base last.
    let kinds: Vec<(&str, &str)> = layers
        .iter()
        .map(|l| (l["id"].as_str().unwrap(), l["swatch"].as_str().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("Places.0", "swatch point"),
            ("US Counties.0", "swatch polygon"),
            ("base", "swatch base")
        ],
        "{summary}"
    );
    let listed: Vec<(String, u64)> = layers
        .iter()
        .filter(|l| l["id"] != "base")
        .map(|l| {
            (
                l["id"].as_str().unwrap().to_string(),
                l["count"]
                    .as_str()
                    .unwrap()
                    .replace(',', "")
                    .parse()
                    .unwrap(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        vec![
            ("Places.0".to_string(), places),
            ("US Counties.0".to_string(), counties)
        ],
        "{summary}"
    );

    // Tiles were fetched and drawn: features of both layers rendered, and a canvas that is
    // painted (not the bare background) in more than a few colours.
    let drawn = &summary["drawn"];
    assert!(summary["tiles"].as_u64().unwrap() > 0, "{summary}");
    for layer in ["Places.0", "US Counties.0"] {
        assert!(
            drawn["rendered"][layer].as_u64().unwrap_or(0) > 0,
            "{layer}: {drawn}"
        );
    }
    let pixels = drawn["pixels"].as_u64().unwrap();
    assert!(drawn["painted"].as_u64().unwrap() * 10 > pixels, "{drawn}");
    // The base layer: its tiles came from this server, and countries were drawn under the
    // layers.
    assert!(summary["baseTiles"].as_u64().unwrap() > 0, "{summary}");
    assert!(
        drawn["rendered"]["countries"].as_u64().unwrap_or(0) > 0,
        "{drawn}"
    );
    assert!(drawn["colors"].as_u64().unwrap() >= 3, "{drawn}");

    // The click: the county containing the point the page queried, and the places in the box
    // it queried, as the source files have them.
    let at = &summary["clicked"]["US Counties.0"];
    assert_eq!(at["type"], "Point", "{summary}");
    let (lon, lat) = (
        at["coordinates"][0].as_f64().unwrap(),
        at["coordinates"][1].as_f64().unwrap(),
    );
    assert!((lon - DENVER.0).abs() < 0.01 && (lat - DENVER.1).abs() < 0.01);
    let expected = counties_at(lon, lat);
    assert_eq!(expected, vec!["Denver".to_string()]);
    assert_eq!(card_names(&summary, "US Counties.0"), expected, "{summary}");
    let ring = &summary["clicked"]["Places.0"]["coordinates"][0];
    let xs: Vec<f64> = (0..5).map(|i| ring[i][0].as_f64().unwrap()).collect();
    let ys: Vec<f64> = (0..5).map(|i| ring[i][1].as_f64().unwrap()).collect();
    let fold = |v: &[f64], f: fn(f64, f64) -> f64| v.iter().copied().reduce(f).unwrap();
    let expected = places_in(
        fold(&xs, f64::min),
        fold(&ys, f64::min),
        fold(&xs, f64::max),
        fold(&ys, f64::max),
    );
    assert!(expected.contains(&"Denver".to_string()), "{expected:?}");
    assert_eq!(card_names(&summary, "Places.0"), expected, "{summary}");
    assert!(summary["panel"].as_str().unwrap().contains("Denver"));

    // The screenshot, kept as the test's artifact.
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000);
}
