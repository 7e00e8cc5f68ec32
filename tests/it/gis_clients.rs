//! GIS tools that are not ours, at both ends of geoshard: GeoParquet files made by GeoPandas
//! (WKB, GeoArrow's native encoding, and a projected CRS) load with every county in place;
//! GeoPandas' `read_file` (pyogrio, GDAL's OAPIF driver) reads the OGC API collection equal
//! to the source; QGIS, headless, reads it as an OGC API layer and draws it from the vector
//! tiles. GeoPandas comes from PyPI through `scripts/setup-clients.sh`, QGIS from Debian
//! through `scripts/setup-system.sh`.

use crate::clients::{python, run};
use crate::common;
use crate::export::{counties, export, load_counties, read_lines};

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/python/gis.py")
}

fn geopandas(args: &[&str]) -> Value {
    let mut all = vec![script().display().to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    run(&python(), &all)
}

/// Each feature read matches the source county of its position: names exact, geometry within
/// `tolerance` degrees (Hausdorff distance, so a polygon written as a one-part multipolygon
/// still matches).
fn check(got: &[(i64, String, Value)], tolerance: f64, what: &str) {
    let want = counties();
    assert_eq!(got.len(), want.len(), "{what}: features");
    for (i, (_, name, g)) in got.iter().enumerate() {
        let (wname, wg) = &want[i];
        assert_eq!(name, wname, "{what}: feature {i}");
        let a = geoshard::spatial::parse_geojson(g).unwrap();
        let b = geoshard::spatial::parse_geojson(wg).unwrap();
        let d = geo::HausdorffDistance::hausdorff_distance(&a, &b);
        assert!(d <= tolerance, "{what}: {name} is {d}° away");
    }
}

/// GeoPandas `to_parquet` of the counties, in three forms, each loaded then exported.
#[test]
fn geoparquet_made_by_geopandas_loads() {
    let files = temp_dir("geopandas-parquet");
    let source = data_dir().join("real/us-counties.geojson");
    for (encoding, epsg, tolerance) in [
        ("WKB", None, 1e-9),
        ("geoarrow", None, 1e-9),
        // Web Mercator and back through two projection libraries (PROJ, proj4rs).
        ("WKB", Some("3857"), 1e-7),
    ] {
        let what = format!("{encoding} {epsg:?}");
        let parquet = files
            .path()
            .join(format!("{encoding}-{}.parquet", epsg.unwrap_or("4326")));
        let mut args = vec![
            "write",
            source.to_str().unwrap(),
            parquet.to_str().unwrap(),
            encoding,
        ];
        args.extend(epsg);
        let made = geopandas(&args);
        assert_eq!(made["rows"], 3231, "{made}");

        let dir = temp_dir("geopandas-parquet-load");
        let out = Command::new(env!("CARGO_BIN_EXE_geoshard"))
            .args(["load", "--quiet", "--service", "Counties", "--data-dir"])
            .arg(dir.path())
            .arg(&parquet)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{what}: {text}");
        assert!(text.contains("loaded 3231 of 3231"), "{what}: {text}");
        let lines = files.path().join("back.geojsonl");
        let (code, text) = export(&[
            lines.to_str().unwrap(),
            "--service",
            "Counties",
            "--data-dir",
            dir.path().to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{what}: {text}");
        check(&read_lines(&lines), tolerance, &what);
    }
}

/// `geopandas.read_file("OAPIF:…")` of the counties' collection, paged by GDAL.
#[test]
fn geopandas_reads_the_ogc_collection() {
    let dir = temp_dir("geopandas-ogc");
    load_counties(dir.path());
    seed_users(dir.path());
    let srv = ChildServer::start(dir.path(), &[]);
    let lines = dir.path().join("ogc.geojsonl");
    let read = geopandas(&[
        "ogc",
        &format!("http://{}/ogc", srv.addr),
        "Counties.0",
        &format!("{}:{}", GEO.0, GEO.1),
        lines.to_str().unwrap(),
    ]);
    assert_eq!(read["rows"], 3231, "{read}");
    let mut got = read_lines(&lines);
    got.sort_by_key(|f| f.0);
    // OGC API answers with coordinates rounded as GeoJSON text carries them.
    check(&got, 1e-9, "OGC API read by GeoPandas");
    srv.kill();
}

/// Debian's PyQGIS, installed by `scripts/setup-system.sh` (as .ci/run does) when missing.
fn need_qgis() {
    let have = || {
        Command::new("/usr/bin/python3")
            .args(["-c", "import qgis.core"])
            .env("QT_QPA_PLATFORM", "offscreen")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !have() {
        let setup = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/setup-system.sh");
        let _ = Command::new(setup).status();
    }
    assert!(
        have(),
        "PyQGIS is missing and scripts/setup-system.sh could not install Debian's python3-qgis"
    );
}

/// QGIS adds the counties as an OGC API - Features layer and as a vector tile layer: every
/// county comes, those meeting a box over Colorado are the source's, and both layers draw
/// Colorado (the tiles only since their polygons are wound as the MVT specification says).
#[test]
fn qgis_reads_the_collection_and_draws_its_tiles() {
    need_qgis();
    let dir = temp_dir("qgis");
    load_counties(dir.path());
    seed_users(dir.path());
    let srv = ChildServer::start(dir.path(), &[]);
    let png = dir.path().join("colorado.png");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/python/qgis_check.py");
    let out = Command::new("/usr/bin/python3")
        .arg(&script)
        .arg(format!("http://{}", srv.addr))
        .args([GEO.0, GEO.1, "Counties.0"])
        .arg(&png)
        .env("QT_QPA_PLATFORM", "offscreen")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {stdout}"));

    let want = counties();
    assert_eq!(summary["features"], want.len(), "{}", summary["qgis"]);
    let mut names: Vec<&str> = summary["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    let mut source: Vec<&str> = want.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    source.sort_unstable();
    assert_eq!(names, source);

    // The box query: OBJECTIDs are positions in the file; a scan with geo is the oracle.
    let (x0, y0, x1, y1) = (-109.06, 36.99, -102.04, 41.0);
    let rect = geo::Rect::new(geo::coord! {x: x0, y: y0}, geo::coord! {x: x1, y: y1});
    let scan: Vec<i64> = want
        .iter()
        .enumerate()
        .filter(|(_, (_, g))| {
            let g = geoshard::spatial::parse_geojson(g).unwrap();
            geo::Intersects::intersects(&g, &rect)
        })
        .map(|(i, _)| i as i64 + 1)
        .collect();
    let got: Vec<i64> = summary["colorado"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert!(
        scan.len() > 64,
        "Colorado's 64 counties and their neighbours: {scan:?}"
    );
    assert_eq!(got, scan);

    // Drawn: most of the image painted, in fills and outlines, with no rendering error.
    for layer in ["tiles", "features"] {
        let d = &summary["drawn"][layer];
        assert_eq!(d["errors"], serde_json::json!([]), "{layer}: {d}");
        let (painted, samples) = (
            d["painted"].as_u64().unwrap(),
            d["samples"].as_u64().unwrap(),
        );
        assert!(painted * 2 > samples, "{layer}: {d}");
        assert!(d["colors"].as_u64().unwrap() >= 3, "{layer}: {d}");
        assert!(dir.path().join(format!("colorado-{layer}.png")).exists());
    }
    srv.kill();
}
