//! `geoshard load` end to end: real files loaded offline into a stopped server's directory
//! and over HTTP into a running server, then queried through geoQueryService. Answers are
//! checked against GEOS (the shapely oracle in `tests/fixtures/pip_oracle.csv`), brute-force
//! scans of the source files, and counts taken from the files themselves.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::layers::{ids, query};
use common::*;
use geo::Contains;
use serde_json::{Value, json};

/// The loader's exit code and printed report.
struct Loaded {
    code: i32,
    report: String,
}

fn load(args: &[&str]) -> Loaded {
    let out = Command::new(env!("CARGO_BIN_EXE_geoshard"))
        .arg("load")
        .args(args)
        .arg("--quiet")
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    Loaded {
        code: out.status.code().unwrap_or(-1),
        report: format!("{report}{stderr}"),
    }
}

fn real(name: &str) -> PathBuf {
    data_dir().join("real").join(name)
}

fn mollusks_csv() -> PathBuf {
    data_dir().join("gds/mollusks/mollusks.csv")
}

/// Where the loads go: `--data-dir DIR` or `--url … --user … --password …`.
fn target_args(target: &Target) -> Vec<String> {
    match target {
        Target::Offline(dir) => vec!["--data-dir".into(), dir.display().to_string()],
        Target::Http(addr) => vec![
            "--url".into(),
            format!("http://{addr}"),
            "--user".into(),
            GEO.0.into(),
            "--password".into(),
            GEO.1.into(),
        ],
    }
}

enum Target {
    Offline(PathBuf),
    Http(std::net::SocketAddr),
}

fn load_into(target: &Target, file: &Path, service: &str, extra: &[&str]) -> Loaded {
    let t = target_args(target);
    let mut args: Vec<&str> = vec![file.to_str().unwrap(), "--service", service];
    args.extend(t.iter().map(String::as_str));
    args.extend(extra);
    load(&args)
}

/// Load the five real files into `target`, checking each report.
fn load_all(target: &Target) {
    let rows = csv::Reader::from_path(mollusks_csv())
        .unwrap()
        .records()
        .count();
    // (file, service, exit code, records loaded of read)
    let loads = [
        (real("us-counties.geojson"), "counties", 0, (3231, 3231)),
        // Illinois's outer ring is not closed: skipped, reported by name, and the exit says so.
        (real("us-states.geojson"), "states", 1, (55, 56)),
        (
            real("world-countries-50m.geojson"),
            "countries",
            0,
            (241, 241),
        ),
        (
            real("geonames-cities1000.csv"),
            "places",
            0,
            (144563, 144563),
        ),
        (mollusks_csv(), "mollusks", 0, (rows, rows)),
    ];
    for (file, service, code, (loaded, read)) in loads {
        let r = load_into(target, &file, service, &[]);
        assert_eq!(r.code, code, "{}", r.report);
        if let Target::Offline(_) = target {
            // The first load (the counties), into a store of no documents, is a bulk load;
            // a later one that writes a quarter of the store's documents or more (the
            // places) rewrites the store; the others are small beside it.
            let said = match service {
                "counties" => "documents compressed as read and written once, in key order",
                "places" => "documents compressed and packed in",
                _ => "the store was not rewritten: the load wrote less than 1/4 of its documents",
            };
            assert!(r.report.contains(said), "{service}: {}", r.report);
        }
        assert!(
            r.report
                .contains(&format!("loaded {loaded} of {read} records")),
            "{}",
            r.report
        );
        if service == "states" {
            assert!(
                r.report.contains(
                    "us-states.geojson feature 20 (Illinois): the geometry is not usable: \
                     coordinates[0][0]: ring is not closed"
                ),
                "{}",
                r.report
            );
        }
    }
}

/// The GEOS oracle's GeoNames rows: (lon, lat, counties, countries) by feature index.
fn oracle() -> Vec<(f64, f64, Vec<i64>, Vec<i64>)> {
    let places = geonames_points();
    let ids = |s: &str| -> Vec<i64> {
        s.split('|')
            .filter(|v| !v.is_empty())
            .map(|v| v.parse().unwrap())
            .collect()
    };
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pip_oracle.csv"),
    )
    .unwrap()
    .lines()
    .filter(|l| !l.starts_with('#'))
    .skip(1)
    .filter(|l| l.starts_with("g,"))
    .map(|l| {
        let f: Vec<&str> = l.split(',').collect();
        let (x, y) = places[f[1].parse::<usize>().unwrap()];
        (x, y, ids(f[4]), ids(f[5]))
    })
    .collect()
}

fn point(x: f64, y: f64) -> Value {
    json!({"type": "Point", "coordinates": [x, y]})
}

fn contains_ids(c: &mut Client, service: &str, x: f64, y: f64) -> Vec<i64> {
    let r = query(
        c,
        service,
        json!({"returnIdsOnly": true, "extension": {"geometry": point(x, y)}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    ids(&r.json())
}

fn count(c: &mut Client, service: &str, q: Value) -> i64 {
    let mut q = q;
    q["returnCountOnly"] = json!(true);
    let r = query(c, service, q);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["count"].as_i64().unwrap()
}

/// Query what was loaded; every answer computed independently of the engine.
fn check_layers(c: &mut Client) {
    // Counties and countries: OBJECTID is the feature's position in its file, so GEOS's
    // feature index + 1. Every 400th GeoNames place.
    let oracle = oracle();
    let mut checked = (0, 0);
    for (x, y, counties, countries) in oracle.iter().step_by(400) {
        let want: Vec<i64> = counties.iter().map(|i| i + 1).collect();
        assert_eq!(
            contains_ids(c, "counties", *x, *y),
            want,
            "counties at {x},{y}"
        );
        let want: Vec<i64> = countries.iter().map(|i| i + 1).collect();
        assert_eq!(
            contains_ids(c, "countries", *x, *y),
            want,
            "countries at {x},{y}"
        );
        checked.0 += usize::from(!counties.is_empty());
        checked.1 += usize::from(!countries.is_empty());
    }
    assert!(checked.0 > 20 && checked.1 > 300, "{checked:?}");

    // States: a brute-force scan of the file (Illinois left out, as it was not loaded).
    let text = std::fs::read_to_string(real("us-states.geojson")).unwrap();
    let fc: Value = serde_json::from_str(&text).unwrap();
    for (x, y) in [
        (-97.7, 30.3),
        (-89.65, 39.78),
        (-74.0, 40.7),
        (-120.5, 47.4),
    ] {
        let want: Vec<String> = fc["features"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["properties"]["name"] != "Illinois")
            .filter(|f| {
                geoshard::spatial::parse_geojson(&f["geometry"])
                    .is_ok_and(|g| g.contains(&geo::Point::new(x, y)))
            })
            .map(|f| f["properties"]["name"].as_str().unwrap().to_string())
            .collect();
        let r = query(
            c,
            "states",
            json!({"outFields": "name", "returnGeometry": false,
                   "extension": {"geometry": point(x, y)}}),
        );
        let got: Vec<String> = r.json()["features"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["properties"]["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(got, want, "states at {x},{y}");
    }

    // Places: counts by name and by country from the CSV itself; a point query at a place's
    // coordinates finds every row at exactly those coordinates (OBJECTID = row number).
    let mut rows = csv::Reader::from_path(real("geonames-cities1000.csv")).unwrap();
    let rows: Vec<csv::StringRecord> = rows.records().map(Result::unwrap).collect();
    let named = rows.iter().filter(|r| &r[2] == "Springfield").count() as i64;
    assert_eq!(
        count(c, "places", json!({"where": "name = 'Springfield'"})),
        named
    );
    let in_ad = rows.iter().filter(|r| &r[5] == "AD").count() as i64;
    assert_eq!(count(c, "places", json!({"where": "cc = 'AD'"})), in_ad);
    for i in [0usize, 777, 144_562] {
        let (lat, lon) = (&rows[i][0], &rows[i][1]);
        let want: Vec<i64> = rows
            .iter()
            .enumerate()
            .filter(|(_, r)| &r[0] == lat && &r[1] == lon)
            .map(|(j, _)| j as i64 + 1)
            .collect();
        let got = contains_ids(c, "places", lon.parse().unwrap(), lat.parse().unwrap());
        assert_eq!(got, want, "places at row {i}");
    }

    // Mollusks: every row, and a count by species and by a numeric column from the CSV.
    let mut reader = csv::Reader::from_path(mollusks_csv()).unwrap();
    let headers = reader.headers().unwrap().clone();
    let col = |n: &str| headers.iter().position(|h| h == n).unwrap();
    let (species, year) = (col("scientificName"), col("year"));
    let rows: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    assert_eq!(count(c, "mollusks", json!({})), rows.len() as i64);
    let name = rows[0][species].to_string();
    let want = rows.iter().filter(|r| r[species] == *name).count() as i64;
    assert_eq!(
        count(
            c,
            "mollusks",
            json!({"where": format!("scientificName = '{name}'")})
        ),
        want
    );
    let want = rows
        .iter()
        .filter(|r| r[year].parse::<i64>().is_ok_and(|y| y >= 2000))
        .count() as i64;
    assert_eq!(count(c, "mollusks", json!({"where": "year >= 2000"})), want);
}

#[test]
fn offline_into_a_stopped_server_then_served() {
    let dir = temp_dir("load-offline");
    seed_users(&dir);
    load_all(&Target::Offline(dir.path().to_path_buf()));
    let srv = ChildServer::start(dir.path(), &[("GEOSHARD_LOG", "info")]);
    let mut c = srv.client(GEO);
    check_layers(&mut c);
    // The load built and saved every view: the server read each from its file.
    let log = srv.log.lock().unwrap().clone();
    let read = log
        .iter()
        .filter(|l| l.contains("view read from its saved file"));
    assert_eq!(read.count(), 5, "{}", log.join("\n"));
    assert!(
        !log.iter().any(|l| l.contains("saved view not used")),
        "{}",
        log.join("\n")
    );
    // The load's end compressed the documents: each reads back with its feature's geometry
    // and properties.
    let text = std::fs::read_to_string(real("world-countries-50m.geojson")).unwrap();
    let source: Value = serde_json::from_str(&text).unwrap();
    for (i, f) in source["features"].as_array().unwrap().iter().enumerate() {
        let r = c.get(&format!("/v1/documents?uri=/countries/0/{}.json", i + 1));
        assert_eq!(r.status, 200, "{}", r.text());
        let doc = r.json();
        assert_eq!(doc["geometry"], f["geometry"], "feature {i}");
        for (k, v) in f["properties"].as_object().unwrap() {
            assert_eq!(&doc["properties"][k], v, "feature {i}: {k}");
        }
    }
    srv.kill();
}

#[test]
fn over_http_into_a_running_server() {
    let srv = TestServer::start();
    load_all(&Target::Http(srv.addr));
    let mut c = srv.client(GEO);
    check_layers(&mut c);
    // A second load of the same file replaces (stable OBJECTIDs): the count stays.
    let r = load_into(
        &Target::Http(srv.addr),
        &real("us-counties.geojson"),
        "counties",
        &[],
    );
    assert_eq!(r.code, 0, "{}", r.report);
    assert_eq!(count(&mut c, "counties", json!({})), 3231);
    // A plain rest-writer may not define the layer (templates need tde-admin,
    // descriptors geo-data-services-writer): the load stops before any record, naming the
    // role, and nothing is stored. With the schema roles it loads. Bad credentials stop the
    // load before anything is read, with exit 2.
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/load/counties-tx-co.geojson");
    let url = format!("http://{}", srv.addr);
    let as_writer = [
        fixture.to_str().unwrap(),
        "--service",
        "by-writer",
        "--url",
        url.as_str(),
        "--user",
        WRITER.0,
        "--password",
        WRITER.1,
    ];
    let r = load(&as_writer);
    assert_ne!(r.code, 0, "{}", r.report);
    assert!(r.report.contains("tde-admin"), "{}", r.report);
    assert!(r.report.contains("403"), "{}", r.report);
    let models = c.get("/v1/resources/modelService").json();
    assert!(!models.to_string().contains("by-writer"), "{models}");
    let r = srv.client(ADMIN).post_json(
        "/manage/v2/users",
        &json!({"user-name": "loader", "password": "loader-pw",
                "role": ["rest-writer", "tde-admin", "geo-data-services-writer"]})
        .to_string(),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let mut as_loader = as_writer;
    as_loader[6] = "loader";
    as_loader[8] = "loader-pw";
    let r = load(&as_loader);
    assert_eq!(r.code, 0, "{}", r.report);
    assert_eq!(count(&mut c, "by-writer", json!({})), 318);
    let mut wrong = as_writer;
    wrong[8] = "not-the-password";
    let r = load(&wrong);
    assert_eq!(r.code, 2, "{}", r.report);
    assert!(r.report.contains("HTTP 401"), "{}", r.report);
}

/// Every kind of broken record, skipped with its place and reason; the good ones loaded.
#[test]
fn broken_records_are_reported_exactly() {
    let dir = temp_dir("load-broken");
    seed_users(&dir);
    let file = dir.path().join("broken.ndjson");
    let good = |n: i64, x: f64, y: f64| {
        json!({"type": "Feature", "properties": {"name": format!("p{n}"), "n": n},
               "geometry": {"type": "Point", "coordinates": [x, y]}})
        .to_string()
    };
    let lines = [
        good(1, 1.0, 1.0),
        "{\"type\": \"Feature\", \"geometry\": ".to_string(),
        json!({"type": "Feature", "properties": {"name": "nowhere"}}).to_string(),
        json!({"type": "Feature", "properties": {"name": "text"},
               "geometry": {"type": "Point", "coordinates": ["east", 1]}})
        .to_string(),
        json!({"type": "Feature", "properties": {"name": "open"},
               "geometry": {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 1]]]}})
        .to_string(),
        json!({"type": "Feature", "properties": {"name": "high"},
               "geometry": {"type": "Point", "coordinates": [10, 200]}})
        .to_string(),
        json!({"type": "Feature", "properties": {"name": "misfit", "n": "many"},
               "geometry": {"type": "Point", "coordinates": [2, 2]}})
        .to_string(),
        good(2, 3.0, 3.0),
    ];
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    // The schema from the first record: "n" is an int column, and "many" does not fit it.
    let r = load(&[
        file.to_str().unwrap(),
        "--service",
        "broken",
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--sample",
        "1",
    ]);
    assert_eq!(r.code, 1, "{}", r.report);
    let skipped: Vec<&str> = r
        .report
        .lines()
        .filter(|l| l.starts_with("  "))
        .map(str::trim)
        .collect();
    assert_eq!(
        skipped,
        [
            "broken.ndjson line 2: bad JSON: EOF while parsing a value at line 1 column 32",
            "broken.ndjson line 3: no geometry",
            "broken.ndjson line 4 (text): the geometry is not usable: coordinates[0]: not a number",
            "broken.ndjson line 5 (open): the geometry is not usable: coordinates[0]: ring is not closed: first [0, 0] differs from last [0, 1]",
            "broken.ndjson line 6 (high): the geometry is not usable: coordinates: latitude 200 is outside [-90, 90]",
            "broken.ndjson line 7 (misfit): property \"n\" value \"many\" does not fit its column n (int)",
        ],
        "{}",
        r.report
    );
    assert!(
        r.report
            .starts_with("loaded 2 of 8 records into broken layer 0 (6 skipped, 0 failed)"),
        "{}",
        r.report
    );
    // --allow-skips: the same load succeeds; --strict stops at the first bad record.
    let args = |extra: &str| {
        vec![
            file.to_str().unwrap().to_string(),
            "--service".into(),
            "broken".into(),
            "--data-dir".into(),
            dir.path().to_str().unwrap().to_string(),
            extra.to_string(),
        ]
    };
    let allowed = args("--allow-skips");
    let r = load(&allowed.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(r.code, 0, "{}", r.report);
    let strict = args("--strict");
    let r = load(&strict.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(r.code, 1, "{}", r.report);
    assert!(
        r.report
            .contains("stopped at broken.ndjson line 2: bad JSON"),
        "{}",
        r.report
    );

    // CSV: empty and non-numeric coordinates, a short row.
    let csv = dir.path().join("broken.csv");
    std::fs::write(&csv, "name,lon,lat\na,1,2\nb,,2\nc,east,2\nd,1\ne,3,4\n").unwrap();
    let r = load(&[
        csv.to_str().unwrap(),
        "--service",
        "broken-csv",
        "--data-dir",
        dir.path().to_str().unwrap(),
    ]);
    let skipped: Vec<&str> = r
        .report
        .lines()
        .filter(|l| l.starts_with("  "))
        .map(str::trim)
        .collect();
    assert_eq!(
        skipped,
        [
            "broken.csv row 2: missing coordinates: lon or lat is empty",
            "broken.csv row 3: lon is not a number: \"east\"",
            "broken.csv row 4: a row of 2 fields where the header has 3",
        ],
        "{}",
        r.report
    );

    // What was loaded is served, and nothing else.
    let srv = ChildServer::start(dir.path(), &[]);
    let mut c = srv.client(GEO);
    assert_eq!(count(&mut c, "broken", json!({})), 2);
    assert_eq!(count(&mut c, "broken-csv", json!({})), 2);
    let r = query(
        &mut c,
        "broken",
        json!({"outFields": "name,n", "returnGeometry": false, "orderByFields": "n"}),
    );
    let got: Vec<Value> = r.json()["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["properties"].clone())
        .collect();
    assert_eq!(
        got,
        [json!({"name": "p1", "n": 1}), json!({"name": "p2", "n": 2})]
    );
    srv.kill();
}

/// The Shapefile (UTM 14N, reprojected through its .prj), GeoPackage (Web Mercator) and
/// FlatGeobuf fixtures GDAL made from one GeoJSON (`scripts/make-load-fixtures.sh`) load as
/// that GeoJSON does: the same features, attributes and coordinates within 1e-7 degrees.
#[test]
fn gis_files_load_as_their_geojson() {
    use geo::HausdorffDistance;
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/load");
    let source: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures.join("counties-tx-co.geojson")).unwrap(),
    )
    .unwrap();
    let want: std::collections::BTreeMap<String, (Value, geo::Geometry<f64>)> = source["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let g = geoshard::spatial::parse_geojson(&f["geometry"]).unwrap();
            (
                f["properties"]["fips"].as_str().unwrap().to_string(),
                (f["properties"].clone(), g),
            )
        })
        .collect();
    assert_eq!(want.len(), 318);

    let dir = temp_dir("load-gis");
    seed_users(&dir);
    let files = [
        ("c-geojson", "counties-tx-co.geojson"),
        ("c-shp", "counties-tx-co-utm14.shp"),
        ("c-gpkg", "counties-tx-co-3857.gpkg"),
        ("c-fgb", "counties-tx-co.fgb"),
    ];
    for (service, file) in files {
        let r = load_into(
            &Target::Offline(dir.path().to_path_buf()),
            &fixtures.join(file),
            service,
            &[],
        );
        assert_eq!(r.code, 0, "{file}: {}", r.report);
        assert!(
            r.report.contains("loaded 318 of 318"),
            "{file}: {}",
            r.report
        );
    }
    let srv = ChildServer::start(dir.path(), &[]);
    let mut c = srv.client(GEO);
    for (service, file) in files {
        let r = query(
            &mut c,
            service,
            json!({"outFields": "name,fips,state,vertices,west", "returnGeometry": true}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let features = r.json()["features"].as_array().unwrap().clone();
        assert_eq!(features.len(), 318, "{file}");
        let mut worst: f64 = 0.0;
        for f in &features {
            let p = &f["properties"];
            let fips = p["fips"].as_str().unwrap_or_else(|| panic!("{file}: {p}"));
            let (props, geometry) = &want[fips];
            assert_eq!(p["name"], props["name"], "{file} {fips}");
            assert_eq!(
                p["state"].as_i64(),
                props["state"].as_i64(),
                "{file} {fips}"
            );
            assert_eq!(
                p["vertices"].as_i64(),
                props["vertices"].as_i64(),
                "{file} {fips}"
            );
            let west = (p["west"].as_f64().unwrap() - props["west"].as_f64().unwrap()).abs();
            assert!(west < 1e-9, "{file} {fips}: west off by {west}");
            let got = geoshard::spatial::parse_geojson(&f["geometry"]).unwrap();
            worst = worst.max(got.hausdorff_distance(geometry));
        }
        eprintln!("{file}: largest Hausdorff distance from the GeoJSON {worst:e} degrees");
        assert!(
            worst < 1e-7,
            "{file}: coordinates {worst} degrees from the GeoJSON"
        );
    }
    srv.kill();

    // A CRS that cannot be reprojected stops the load, naming it; nothing is written.
    let odd = temp_dir("load-crs");
    for ext in ["shp", "shx", "dbf"] {
        std::fs::copy(
            fixtures.join(format!("counties-tx-co-utm14.{ext}")),
            odd.path().join(format!("odd.{ext}")),
        )
        .unwrap();
    }
    std::fs::write(
        odd.path().join("odd.prj"),
        r#"PROJCS["Mystery Grid",GEOGCS["GCS_WGS_1984",DATUM["D_WGS_1984",SPHEROID["WGS_1984",6378137.0,298.257223563]],PRIMEM["Greenwich",0.0],UNIT["Degree",0.0174532925199433]],PROJECTION["Nowhere_Conic"],UNIT["Meter",1.0]]"#,
    )
    .unwrap();
    let r = load_into(
        &Target::Offline(dir.path().to_path_buf()),
        &odd.path().join("odd.shp"),
        "c-odd",
        &[],
    );
    assert_eq!(r.code, 2, "{}", r.report);
    assert!(
        r.report
            .contains("odd.shp: cannot reproject from Mystery Grid"),
        "{}",
        r.report
    );
}

/// A CSV whose geometry is a WKT column.
#[test]
fn csv_with_a_wkt_column() {
    let dir = temp_dir("load-wkt");
    seed_users(&dir);
    let r = load_into(
        &Target::Offline(dir.path().to_path_buf()),
        &mollusks_csv(),
        "m-wkt",
        &["--wkt-field", "footprintWKT"],
    );
    assert_eq!(r.code, 0, "{}", r.report);
    let mut reader = csv::Reader::from_path(mollusks_csv()).unwrap();
    let headers = reader.headers().unwrap().clone();
    let (x, y, wkt) = (
        headers.iter().position(|h| h == "X").unwrap(),
        headers.iter().position(|h| h == "Y").unwrap(),
        headers.iter().position(|h| h == "footprintWKT").unwrap(),
    );
    let rows: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    let srv = ChildServer::start(dir.path(), &[]);
    let mut c = srv.client(GEO);
    assert_eq!(count(&mut c, "m-wkt", json!({})), rows.len() as i64);
    // The first row's point, from its WKT, is where its X and Y say.
    assert!(rows[0][wkt].starts_with("POINT"), "{}", &rows[0][wkt]);
    let got = contains_ids(
        &mut c,
        "m-wkt",
        rows[0][x].parse().unwrap(),
        rows[0][y].parse().unwrap(),
    );
    assert!(got.contains(&1), "{got:?}");
    srv.kill();
}

/// An offline load logs to standard error as the server does: warnings by default (none for
/// a clean load), more with `GEOSHARD_LOG`. Its report's "see the log" points there.
#[test]
fn an_offline_load_logs_to_standard_error() {
    let dir = temp_dir("load-log");
    let run = |level: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_geoshard"));
        cmd.args(["load", "--quiet", "--service", "Mollusks", "--data-dir"])
            .arg(dir.join("d"))
            .arg(mollusks_csv())
            .env_remove("GEOSHARD_LOG")
            .env_remove("RUST_LOG");
        if let Some(level) = level {
            cmd.env("GEOSHARD_LOG", level);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let quiet = run(None);
    assert_eq!(quiet, "", "a clean load at the default level");
    let info = run(Some("info"));
    let saved: Vec<&str> = info.lines().filter(|l| l.contains("views saved")).collect();
    assert_eq!(saved.len(), 1, "{info}");
    assert!(
        saved[0].contains("INFO") && saved[0].contains("views=1"),
        "{info}"
    );
}

/// What the server found wrong in loaded documents reaches the loader's report, by URI; and
/// a load whose standard error is a log (not a terminal) prints progress lines there.
#[test]
fn server_warnings_and_progress_lines_reach_the_user() {
    let srv = TestServer::start();
    let dir = temp_dir("load-warnings");
    let file = dir.path().join("sites.ndjson");
    let site = |n: i64, shape: Option<&str>| {
        let mut p = json!({"name": format!("s{n}"), "OBJECTID": n});
        if let Some(shape) = shape {
            p["shape"] = json!(shape);
        }
        json!({"type": "Feature", "properties": p,
               "geometry": {"type": "Point", "coordinates": [(n % 100) as f64, 1.0]}})
        .to_string()
    };
    let write = |lines: &[String]| std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    write(&[site(1, None)]);
    let t = target_args(&Target::Http(srv.addr));
    let base: Vec<&str> = [file.to_str().unwrap(), "--service", "sites"]
        .into_iter()
        .chain(t.iter().map(String::as_str))
        .collect();
    let r = load(&base);
    assert_eq!(r.code, 0, "{}", r.report);
    assert!(!r.report.contains("server warnings"), "{}", r.report);
    assert_eq!(contains_ids(&mut srv.client(GEO), "sites", 1.0, 1.0), [1]);
    // The layer's geometry is moved to a `shape` property: a text the loader stores as it
    // is, and the server cannot use as a geometry.
    let mut admin = srv.client(ADMIN);
    let d_uri = "/geoshard-load/sites/service.json";
    let mut descriptor = admin
        .get(&format!("/v1/documents?uri={}", enc(d_uri)))
        .json();
    descriptor["layers"][0]["geometry"]["xpath"] = json!("/properties/shape");
    let put = admin.put_json(
        &format!(
            "/v1/documents?uri={}&collection={}",
            enc(d_uri),
            enc("http://marklogic.com/feature-services")
        ),
        &descriptor.to_string(),
    );
    assert!(put.status < 300, "{}", put.text());
    write(&[
        site(2, Some("POINT (2 1)")),
        site(3, None),
        site(4, Some("{\"type\": \"Point\", \"coordinates\": [4, 1]}")),
    ]);
    let r = load(&base);
    assert_eq!(r.code, 0, "{}", r.report);
    assert!(r.report.contains("loaded 3 of 3 records"), "{}", r.report);
    assert!(
        r.report.contains("server warnings (the first 2 of 2):"),
        "{}",
        r.report
    );
    for uri in ["/sites/0/2.json", "/sites/0/4.json"] {
        let line = r
            .report
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{uri}: ")))
            .unwrap_or_else(|| panic!("no warning for {uri}: {}", r.report));
        assert!(
            line.contains("the geometry at /properties/shape is not usable"),
            "{line}"
        );
    }
    // The documents were stored all the same, without a geometry in the layer.
    let mut c = srv.client(GEO);
    assert_eq!(count(&mut c, "sites", json!({})), 4);
    assert_eq!(contains_ids(&mut c, "sites", 2.0, 1.0), [] as [i64; 0]);

    // Progress: a line at each step when asked for every 0 s, on standard error.
    let lines: Vec<String> = (10..2010).map(|n| site(n, None)).collect();
    write(&lines);
    let out = Command::new(env!("CARGO_BIN_EXE_geoshard"))
        .arg("load")
        .args(&base)
        .args(["--progress-every", "0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let progress: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("read ") && l.contains(" records ("))
        .collect();
    assert!(!progress.is_empty(), "no progress lines: {stderr}");
    let last = progress.last().unwrap();
    assert!(last.contains(" loaded, 0 skipped"), "{last}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("loaded 2000 of 2000 records"), "{stdout}");
}

/// A bulk load (into a directory of no documents) whose records give one OBJECTID twice:
/// the later record is the document and the row, as the writer's path keeps it; the
/// earlier one's point answers nothing.
#[test]
fn a_bulk_load_keeps_the_later_of_two_records_of_one_id() {
    let dir = temp_dir("load-bulk-repeats");
    seed_users(&dir);
    let files = temp_dir("load-bulk-repeats-files");
    let file = files.path().join("repeats.geojson");
    let feature = |id: i64, name: &str, x: f64, y: f64| {
        json!({"type": "Feature", "properties": {"OBJECTID": id, "name": name},
               "geometry": point(x, y)})
    };
    let features = json!({"type": "FeatureCollection", "features": [
        feature(1, "first", 10.0, 10.0),
        feature(2, "other", 20.0, 20.0),
        feature(1, "again", 30.0, 30.0),
    ]});
    std::fs::write(&file, features.to_string()).unwrap();
    let r = load_into(
        &Target::Offline(dir.path().to_path_buf()),
        &file,
        "repeats",
        &[],
    );
    assert_eq!(r.code, 0, "{}", r.report);
    assert!(
        r.report
            .contains("documents compressed as read and written once, in key order"),
        "{}",
        r.report
    );

    let srv = ChildServer::start(dir.path(), &[]);
    let mut c = srv.client(GEO);
    let doc = c.get("/v1/documents?uri=/repeats/0/1.json");
    assert_eq!(doc.status, 200, "{}", doc.text());
    assert_eq!(doc.json()["properties"]["name"], "again");
    assert_eq!(count(&mut c, "repeats", json!({})), 2);
    let near = |x: f64, y: f64| {
        json!({"extension": {"geometry": {"type": "Polygon", "coordinates": [[
            [x - 1.0, y - 1.0], [x + 1.0, y - 1.0], [x + 1.0, y + 1.0],
            [x - 1.0, y + 1.0], [x - 1.0, y - 1.0]]]}}})
    };
    assert_eq!(count(&mut c, "repeats", near(10.0, 10.0)), 0);
    assert_eq!(count(&mut c, "repeats", near(30.0, 30.0)), 1);
    assert_eq!(count(&mut c, "repeats", near(20.0, 20.0)), 1);
    let r = query(
        &mut c,
        "repeats",
        json!({"outFields": "*", "extension": {"geometry": near(30.0, 30.0)["extension"]["geometry"]}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let features = r.json()["features"].clone();
    assert_eq!(features[0]["properties"]["name"], "again", "{features}");
    assert_eq!(features[0]["properties"]["OBJECTID"], 1, "{features}");
    srv.kill();
}
