//! GIS tools that are not ours, at both ends of geoshard: GeoParquet files made by GeoPandas
//! (WKB, GeoArrow's native encoding, and a projected CRS) load with every county in place,
//! and GeoPandas' `read_file` (pyogrio, GDAL's OAPIF driver) reads the OGC API collection
//! equal to the source. GeoPandas comes from PyPI through `scripts/setup-clients.sh`.

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
