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

/// Run a browser script of `tests/clients/node` with `args`: the JSON summary it prints last,
/// which must not be a fatal error.
pub(crate) fn page_script(script: &str, args: &[String]) -> Value {
    let out = Command::new("node")
        .arg(root().join("tests/clients/node").join(script))
        .args(args)
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
    summary
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

    let summary = page_script(
        "map_page.js",
        &[
            // The credentials in the page's URL too, as a user may type them (the
            // page's requests failed, since fetch refuses URLs that carry credentials).
            format!("http://{}:{}@{}", GEO.0, GEO.1, srv.addr),
            GEO.0.to_string(),
            GEO.1.to_string(),
            format!("8/{}/{}", DENVER.1, DENVER.0),
            DENVER.0.to_string(),
            DENVER.1.to_string(),
            shot.display().to_string(),
            chromium.display().to_string(),
        ],
    );
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

/// The page draws the fences the caller may see and lists their events live: a place that
/// drives into Denver County and a circle downtown, then out of both, makes the events a
/// brute-force oracle (the source file's county, Karney's distance) says, in order.
#[test]
fn the_map_shows_fences_and_their_live_events() {
    use crate::common::layers;
    use geo::{Contains, Distance, Geodesic, Point};

    let chromium = need_chromium();
    setup_clients();
    let srv = TestServer::start();
    let mut c = srv.client(GEO);
    let counties = layers::load_counties(&mut c);
    let columns = serde_json::json!([
        {"name": "OBJECTID", "scalarType": "int", "val": "id"},
        {"name": "name", "scalarType": "string", "val": "name", "nullable": true}]);
    layers::layer(&mut c, "Fleet", "fleet", ("fleet", columns), "Point");
    let denver: Vec<i64> = counties
        .iter()
        .filter(|(_, g, _)| g.contains(&Point::new(DENVER.0, DENVER.1)))
        .map(|(id, _, _)| *id)
        .collect();
    assert_eq!(denver.len(), 1);
    let center = Point::new(-104.9903, 39.7392);
    let radius = 2000.0;
    for (name, fence) in [
        (
            "denver",
            serde_json::json!({"service": "Fleet", "layer": 0, "detect": ["enter", "exit"],
                "feature": {"service": "Counties", "layer": 0, "OBJECTID": denver[0]}}),
        ),
        (
            "downtown",
            serde_json::json!({"service": "Fleet", "layer": 0, "detect": ["enter", "exit"],
                "point": [center.x(), center.y()], "radius": radius}),
        ),
    ] {
        let r = c.put_json(&format!("/v1/fences/{name}"), &fence.to_string());
        assert_eq!(r.status, 201, "{}", r.text());
    }

    // A rover's path: into both, out of the circle only, out of both.
    let path = [(-104.99, 39.74), (-104.90, 39.70), (-105.30, 39.74)];
    let writes: Vec<Value> = path
        .iter()
        .map(|&(x, y)| {
            serde_json::json!({"uri": "/fleet/rover.json", "collection": "fleet",
                "body": {"id": 1, "name": "rover",
                    "geometry": {"type": "Point", "coordinates": [x, y]}}})
        })
        .collect();
    // The oracle: each fence's transitions along the path.
    let inside = |fence: &str, (x, y): (f64, f64)| match fence {
        "denver" => counties_at(x, y) == ["Denver"],
        _ => Geodesic.distance(center, Point::new(x, y)) <= radius,
    };
    let mut expected: Vec<(String, String)> = Vec::new();
    let mut was = [false, false];
    for &p in &path {
        for (i, fence) in ["denver", "downtown"].into_iter().enumerate() {
            let now = inside(fence, p);
            if now != was[i] {
                expected.push((fence.into(), if now { "enter" } else { "exit" }.into()));
            }
            was[i] = now;
        }
    }
    assert_eq!(expected.len(), 4, "{expected:?}");

    let artifacts = root().join("target/test-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let shot = artifacts.join("map-fences.png");
    let summary = page_script(
        "map_fences.js",
        &[
            format!("http://{}", srv.addr),
            GEO.0.to_string(),
            GEO.1.to_string(),
            format!("9/{}/{}", DENVER.1, -105.1),
            serde_json::to_string(&writes).unwrap(),
            expected.len().to_string(),
            shot.display().to_string(),
            chromium.display().to_string(),
        ],
    );
    assert_eq!(summary["consoleErrors"], serde_json::json!([]), "{summary}");
    assert_eq!(summary["failed"], serde_json::json!([]), "{summary}");
    assert_eq!(
        summary["answers"],
        serde_json::json!([201, 204, 204]),
        "{summary}"
    );

    // Both fences listed and followed.
    let listed: Vec<(&str, &str)> = summary["fences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["name"].as_str().unwrap(),
                f["following"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [("denver", "yes"), ("downtown", "yes")],
        "{summary}"
    );

    // The events the page listed (newest first), as the oracle has them, in commit order.
    let mut events: Vec<&Value> = summary["events"].as_array().unwrap().iter().collect();
    events.reverse();
    let ids: Vec<u64> = events.iter().map(|e| e["id"].as_u64().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{summary}");
    let listed: Vec<(String, String)> = events
        .iter()
        .map(|e| {
            assert_eq!(e["OBJECTID"], "1", "{summary}");
            (
                e["fence"].as_str().unwrap().to_string(),
                e["detect"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(listed, expected, "{summary}");

    // Both areas drawn at this view; the events' positions marked, the last exit in red.
    let drawn = &summary["drawn"];
    assert_eq!(
        drawn["fences"],
        serde_json::json!(["denver", "downtown"]),
        "{drawn}"
    );
    assert_eq!(
        drawn["outlines"],
        serde_json::json!(["denver", "downtown"]),
        "{drawn}"
    );
    let marks = drawn["marks"].as_array().unwrap();
    assert!(
        marks.iter().any(|m| m["color"] == "#c62828"
            && (m["coordinates"][0].as_f64().unwrap() + 105.30).abs() < 1e-3),
        "{drawn}"
    );
    assert!(drawn["tracks"].as_u64().unwrap() > 0, "{drawn}");
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000);
}
