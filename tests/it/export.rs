//! `geoshard export` end to end: the US counties loaded offline, then exported to each format,
//! offline and over HTTP, whole and by a query. Each file is read back by a reader that is not
//! ours where there is one (the csv and wkt crates, GDAL for FlatGeobuf), and compared with
//! the source file: attributes exact, coordinates within 1e-9°. Query exports are compared
//! with brute-force scans of the source.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use geo::Intersects;
use serde_json::Value;

/// The source: each county's name and its geometry, in file order (a load's OBJECTIDs).
pub(crate) fn counties() -> Vec<(String, Value)> {
    let text = std::fs::read_to_string(data_dir().join("real/us-counties.geojson")).unwrap();
    let fc: Value = serde_json::from_str(&text).unwrap();
    fc["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["properties"]["name"].as_str().unwrap().to_string(),
                f["geometry"].clone(),
            )
        })
        .collect()
}

/// Every coordinate of a GeoJSON geometry, in order.
fn coordinates(v: &Value, out: &mut Vec<f64>) {
    match v {
        Value::Array(a) => a.iter().for_each(|x| coordinates(x, out)),
        Value::Number(n) => out.push(n.as_f64().unwrap()),
        _ => {}
    }
}

pub(crate) fn same_geometry(got: &Value, want: &Value, what: &str) {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    coordinates(&got["coordinates"], &mut a);
    coordinates(&want["coordinates"], &mut b);
    assert_eq!(got["type"], want["type"], "{what}");
    assert_eq!(a.len(), b.len(), "{what}: coordinates");
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-9, "{what}: {x} against {y}");
    }
}

pub(crate) fn export(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_geoshard"))
        .arg("export")
        .args(args)
        .arg("--quiet")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

pub(crate) fn load_counties(dir: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_geoshard"))
        .args(["load", "--quiet", "--service", "Counties", "--data-dir"])
        .arg(dir)
        .arg(data_dir().join("real/us-counties.geojson"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The features of a GeoJSON lines or text-sequence file: (OBJECTID, name, geometry).
pub(crate) fn read_lines(path: &Path) -> Vec<(i64, String, Value)> {
    let text = std::fs::read_to_string(path).unwrap();
    text.split(['\n', '\x1e'])
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Value = serde_json::from_str(l).unwrap();
            (
                f["properties"]["OBJECTID"].as_i64().unwrap(),
                f["properties"]["name"].as_str().unwrap().to_string(),
                f["geometry"].clone(),
            )
        })
        .collect()
}

/// A CSV's rows as features, its WKT read by the wkt crate.
fn read_csv(path: &Path) -> Vec<(i64, String, Value)> {
    use wkt::TryFromWkt;
    let mut r = csv::Reader::from_path(path).unwrap();
    let h = r.headers().unwrap().clone();
    assert_eq!(&h[0], "WKT", "GDAL's name comes first");
    let col = |n: &str| h.iter().position(|x| x == n).unwrap();
    let (id, name) = (col("OBJECTID"), col("name"));
    r.records()
        .map(|row| {
            let row = row.unwrap();
            let g: geo::Geometry<f64> = geo::Geometry::try_from_wkt_str(&row[0]).unwrap();
            let gj = geozero::ToJson::to_json(&g).unwrap();
            (
                row[id].parse().unwrap(),
                row[name].to_string(),
                serde_json::from_str(&gj).unwrap(),
            )
        })
        .collect()
}

/// A FlatGeobuf file as GDAL reads it, written by GDAL as CSV with WKT (which keeps rings as
/// they are: GeoJSON would reorient them).
fn read_fgb_with_gdal(path: &Path, dir: &Path) -> Vec<(i64, String, Value)> {
    crate::ogc::need_gdal();
    let out = dir.join("from-fgb.csv");
    let done = Command::new("ogr2ogr")
        .args(["-f", "CSV", "-lco", "GEOMETRY=AS_WKT"])
        .arg(&out)
        .arg(path)
        .output()
        .unwrap();
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    // The file's spatial index orders its features along a Hilbert curve.
    let mut features = read_csv(&out);
    features.sort_by_key(|f| f.0);
    features
}

/// A GeoParquet file as GeoPandas reads it, after checking its `geo` metadata: version 1.1,
/// WKB with a bbox covering and the extent of the counties.
fn read_parquet_with_geopandas(path: &Path, dir: &Path) -> Vec<(i64, String, Value)> {
    let lines = dir.join("from-parquet.geojsonl");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/python/gis.py");
    let summary = crate::clients::run(
        &crate::clients::python(),
        &[
            script.display().to_string(),
            "read".into(),
            path.display().to_string(),
            lines.display().to_string(),
        ],
    );
    let geo = &summary["geo"];
    assert_eq!(geo["version"], "1.1.0", "{summary}");
    let column = &geo["columns"][geo["primary_column"].as_str().unwrap()];
    assert_eq!(column["encoding"], "WKB", "{summary}");
    assert_eq!(column["covering"]["bbox"]["xmin"][1], "xmin", "{summary}");
    let types: Vec<&str> = column["geometry_types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(types, ["MultiPolygon", "Polygon"], "{summary}");
    // The whole of the US: the Aleutians on both sides of the antimeridian, American Samoa.
    let bbox: Vec<f64> = column["bbox"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert!(
        bbox[0] < -179.0 && bbox[2] > 179.0 && bbox[1] < -14.0 && bbox[3] > 71.0,
        "{bbox:?}"
    );
    read_lines(&lines)
}

pub(crate) fn check_whole(got: &[(i64, String, Value)], want: &[(String, Value)], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: features");
    for (i, (id, name, g)) in got.iter().enumerate() {
        assert_eq!(*id, i as i64 + 1, "{what}: in OBJECTID order");
        let (wname, wg) = &want[i];
        assert_eq!(name, wname, "{what}: OBJECTID {id}");
        same_geometry(g, wg, &format!("{what}: {name}"));
    }
}

/// A load then an export to each format gives back the source's features, and the CSV loads
/// again (its WKT column found by name) into the same features.
#[test]
fn every_format_gives_back_the_loaded_features() {
    let dir = temp_dir("export-whole");
    load_counties(dir.path());
    let files = temp_dir("export-files");
    let want = counties();
    let data = dir.path().to_str().unwrap().to_string();
    let out = |name: &str| -> PathBuf { files.path().join(name) };
    for name in ["c.geojsonl", "c.geojsons", "c.csv", "c.fgb", "c.parquet"] {
        let path = out(name);
        let (code, text) = export(&[
            path.to_str().unwrap(),
            "--service",
            "Counties",
            "--data-dir",
            &data,
        ]);
        assert_eq!(code, 0, "{name}: {text}");
        assert!(
            text.contains(&format!("exported {} features", want.len())),
            "{text}"
        );
        let got = match name {
            "c.csv" => read_csv(&path),
            "c.fgb" => read_fgb_with_gdal(&path, files.path()),
            "c.parquet" => read_parquet_with_geopandas(&path, files.path()),
            _ => read_lines(&path),
        };
        check_whole(&got, &want, name);
    }
    let seq = std::fs::read(out("c.geojsons")).unwrap();
    assert_eq!(seq[0], 0x1e, "RFC 8142: each text after a record separator");

    // The CSV back in, its geometry column found by its name, then out again.
    let again = temp_dir("export-again");
    let loaded = Command::new(env!("CARGO_BIN_EXE_geoshard"))
        .args(["load", "--quiet", "--service", "Counties", "--data-dir"])
        .arg(again.path())
        .arg(out("c.csv"))
        .output()
        .unwrap();
    assert!(
        loaded.status.success(),
        "{}",
        String::from_utf8_lossy(&loaded.stdout)
    );
    let back = out("back.geojsonl");
    let (code, text) = export(&[
        back.to_str().unwrap(),
        "--service",
        "Counties",
        "--data-dir",
        again.path().to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}");
    check_whole(&read_lines(&back), &want, "CSV loaded again");
}

/// A query's export (a where clause, a box) over HTTP, paged small, holds what a scan of the
/// source selects; a caller who may not query the layer gets a refusal and no file.
#[test]
fn a_query_exports_what_a_scan_selects_with_the_callers_permissions() {
    let dir = temp_dir("export-query");
    load_counties(dir.path());
    seed_users(dir.path());
    let want = counties();
    let srv = ChildServer::start(dir.path(), &[]);
    let url = format!("http://{}", srv.addr);
    let files = temp_dir("export-query-files");
    let http = |path: &Path, user: (&str, &str), extra: &[&str]| {
        let mut args = vec![
            path.to_str().unwrap().to_string(),
            "--service".into(),
            "Counties".into(),
            "--url".into(),
            url.clone(),
            "--user".into(),
            user.0.into(),
            "--password".into(),
            user.1.into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        export(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };

    // Names starting with "San", 7 a page: several pages, each after the last id.
    let path = files.path().join("san.geojsonl");
    let (code, text) = http(&path, GEO, &["--where", "name LIKE 'San%'", "--page", "7"]);
    assert_eq!(code, 0, "{text}");
    let got: Vec<String> = read_lines(&path).into_iter().map(|f| f.1).collect();
    let scan: Vec<String> = want
        .iter()
        .filter(|(n, _)| n.starts_with("San"))
        .map(|(n, _)| n.clone())
        .collect();
    assert!(scan.len() > 14, "{scan:?}");
    assert_eq!(got, scan);

    // A box over Colorado: the counties whose geometry meets it.
    let bbox = (-105.5, 38.5, -104.5, 39.5);
    let path = files.path().join("box.csv");
    let b = format!("{},{},{},{}", bbox.0, bbox.1, bbox.2, bbox.3);
    let (code, text) = http(&path, GEO, &["--bbox", &b]);
    assert_eq!(code, 0, "{text}");
    let rect = geo::Rect::new(
        geo::coord! {x: bbox.0, y: bbox.1},
        geo::coord! {x: bbox.2, y: bbox.3},
    );
    let mut scan: Vec<i64> = want
        .iter()
        .enumerate()
        .filter(|(_, (_, g))| {
            let g: geo::Geometry<f64> = geoshard::spatial::parse_geojson(g).unwrap();
            g.intersects(&rect)
        })
        .map(|(i, _)| i as i64 + 1)
        .collect();
    scan.sort();
    let got: Vec<i64> = read_csv(&path).into_iter().map(|f| f.0).collect();
    assert!(!scan.is_empty());
    assert_eq!(got, scan);

    // A REST writer may not query the feature service: refused, and no file left.
    let path = files.path().join("refused.geojsonl");
    let (code, text) = http(&path, WRITER, &[]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("refused"), "{text}");
    assert!(!path.exists());
    assert!(!files.path().join("refused.geojsonl.part").exists());

    // Bad arguments are named.
    let (code, text) = http(&path, GEO, &["--bbox", "1,2,3"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("--bbox"), "{text}");
    let (code, text) = http(&files.path().join("x.shp"), GEO, &[]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("--format"), "{text}");
    srv.kill();
}
