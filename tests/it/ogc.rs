//! OGC API – Features under `/ogc`: a conformance test of our own for the Core requirements
//! (links, `numberMatched`/`numberReturned`, `limit` bounds, paging through `next`, `bbox`
//! errors, unknown collections), answers compared with geoQueryService's and with the source
//! file, and GDAL's OAPIF driver (Debian's `gdal-bin`) reading it unchanged.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use common::layers::query;
use common::*;
use serde_json::{Value, json};

const COLLECTION: &str = "US%20Counties.0";

fn fixture() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/load/counties-tx-co.geojson")
}

/// A stopped server's directory with the 318 Texas and Colorado counties as `US Counties`.
fn loaded_dir() -> TestDir {
    let dir = temp_dir("ogc");
    seed_users(&dir);
    let out = Command::new(env!("CARGO_BIN_EXE_geoshard"))
        .args(["load", "--quiet", "--service", "US Counties", "--data-dir"])
        .arg(dir.path())
        .arg(fixture())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    dir
}

fn source() -> Vec<Value> {
    let fc: Value = serde_json::from_str(&std::fs::read_to_string(fixture()).unwrap()).unwrap();
    fc["features"].as_array().unwrap().clone()
}

fn rel<'a>(doc: &'a Value, rel: &str) -> Option<&'a str> {
    doc["links"]
        .as_array()?
        .iter()
        .find(|l| l["rel"] == rel)
        .and_then(|l| l["href"].as_str())
}

/// The path and query of an absolute link of this server.
fn local(href: &str) -> String {
    let rest = href.strip_prefix("http://").unwrap();
    rest[rest.find('/').unwrap()..].to_string()
}

fn ids(fc: &Value) -> Vec<i64> {
    fc["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_i64().unwrap())
        .collect()
}

/// GDAL's tools, installed by `scripts/setup-system.sh` (as .ci/run does; root or sudo) when
/// missing.
pub(crate) fn need_gdal() {
    let have = || Command::new("ogr2ogr").arg("--version").output().is_ok();
    if !have() {
        let setup = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/setup-system.sh");
        let _ = Command::new(setup).status();
    }
    assert!(
        have(),
        "ogr2ogr is missing and scripts/setup-system.sh could not install Debian's gdal-bin"
    );
}

/// The ids a geoQueryService envelope query of the box returns, sorted.
fn envelope_ids(c: &mut Client, (xmin, ymin, xmax, ymax): (f64, f64, f64, f64)) -> Vec<i64> {
    let env = json!({"type": "Polygon", "coordinates": [[[xmin, ymin], [xmax, ymin], [xmax, ymax], [xmin, ymax], [xmin, ymin]]]});
    let mut ids = common::layers::ids(
        &query(
            c,
            "US Counties",
            json!({"returnIdsOnly": true, "extension": {"geometry": env}}),
        )
        .json(),
    );
    ids.sort_unstable();
    ids
}

#[test]
fn core_requirements() {
    let dir = loaded_dir();
    let srv = ChildServer::start(dir.path(), &[]);
    let mut c = srv.client(GEO);

    // Landing page and conformance.
    let landing = c.get("/ogc").json();
    for r in ["self", "conformance", "data", "service-desc"] {
        assert!(
            rel(&landing, r).is_some(),
            "landing has no {r} link: {landing}"
        );
    }
    let conf = c.get(&local(rel(&landing, "conformance").unwrap())).json();
    let classes: Vec<&str> = conf["conformsTo"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(classes.contains(&"http://www.opengis.net/spec/ogcapi-features-1/1.0/conf/core"));
    assert!(classes.contains(&"http://www.opengis.net/spec/ogcapi-features-1/1.0/conf/geojson"));

    // Collections: one a layer, with its extent holding every source feature.
    let cols = c.get(&local(rel(&landing, "data").unwrap())).json();
    let list = cols["collections"].as_array().unwrap();
    assert_eq!(list.len(), 1);
    let col = &list[0];
    assert_eq!(col["id"], "US Counties.0");
    let bbox = col["extent"]["spatial"]["bbox"][0]
        .as_array()
        .unwrap()
        .clone();
    let b: Vec<f64> = bbox.iter().map(|v| v.as_f64().unwrap()).collect();
    for f in source() {
        let g = geoshard::spatial::parse_geojson(&f["geometry"]).unwrap();
        let r = geo::BoundingRect::bounding_rect(&g).unwrap();
        assert!(r.min().x >= b[0] && r.min().y >= b[1] && r.max().x <= b[2] && r.max().y <= b[3]);
    }
    let items_href = local(rel(col, "items").unwrap());
    assert_eq!(
        c.get(&format!("/ogc/collections/{COLLECTION}")).json()["id"],
        "US Counties.0"
    );

    // Paging: limit bounds numberReturned, next walks every feature exactly once.
    let mut seen = Vec::new();
    let mut next = Some(format!("{items_href}?limit=50"));
    let mut pages = 0;
    while let Some(href) = next {
        let r = c.get(&href);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("content-type"), Some("application/geo+json"));
        let page = r.json();
        assert_eq!(page["type"], "FeatureCollection");
        assert_eq!(page["numberMatched"], 318);
        let n = page["features"].as_array().unwrap().len();
        assert_eq!(page["numberReturned"].as_u64().unwrap() as usize, n);
        assert!(n <= 50);
        assert!(rel(&page, "self").is_some());
        seen.extend(ids(&page));
        next = rel(&page, "next").map(local);
        pages += 1;
    }
    assert_eq!(pages, 7);
    let unique: BTreeSet<i64> = seen.iter().copied().collect();
    assert_eq!(seen.len(), 318);
    assert_eq!(unique, (1..=318).collect());

    // bbox: the same features as a geoQueryService envelope query.
    let (xmin, ymin, xmax, ymax) = (-105.1, 39.6, -104.8, 39.9);
    let page = c
        .get(&format!(
            "{items_href}?bbox={xmin},{ymin},{xmax},{ymax}&limit=1000"
        ))
        .json();
    let mut got = ids(&page);
    got.sort_unstable();
    let want = envelope_ids(&mut c, (xmin, ymin, xmax, ymax));
    assert_eq!(got, want);
    assert!(got.len() >= 3, "{got:?}");
    assert_eq!(page["numberMatched"].as_u64().unwrap() as usize, got.len());

    // A property filter, and one item by id with the source's attributes.
    let denver = c.get(&format!("{items_href}?name=Denver")).json();
    assert_eq!(denver["numberMatched"], 1);
    let id = ids(&denver)[0];
    let item = c.get(&format!("{items_href}/{id}"));
    assert_eq!(item.status, 200);
    let item = item.json();
    assert_eq!(item["properties"]["name"], "Denver");
    assert_eq!(item["properties"]["fips"], "08031");
    assert!(rel(&item, "collection").is_some());

    // The same bbox page as CSV, from the page's alternate link: a WKT column (read by the
    // wkt crate) then the columns, row for row the GeoJSON page.
    let json_page = c
        .get(&format!(
            "{items_href}?bbox={xmin},{ymin},{xmax},{ymax}&limit=2"
        ))
        .json();
    let csv_href = json_page["links"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["rel"] == "alternate" && l["type"] == "text/csv")
        .and_then(|l| l["href"].as_str())
        .map(local)
        .unwrap();
    let r = c.get(&csv_href);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("text/csv; charset=utf-8"));
    let text = r.text();
    let mut rows = csv::Reader::from_reader(text.as_bytes());
    let header = rows.headers().unwrap().clone();
    assert_eq!(&header[0], "WKT");
    let rows: Vec<csv::StringRecord> = rows.records().map(Result::unwrap).collect();
    let features = json_page["features"].as_array().unwrap();
    assert_eq!(rows.len(), features.len());
    assert_eq!(rows.len(), 2);
    for (row, f) in rows.iter().zip(features) {
        use wkt::TryFromWkt;
        let name_at = header.iter().position(|h| h == "name").unwrap();
        assert_eq!(&row[name_at], f["properties"]["name"].as_str().unwrap());
        let from_wkt: geo::Geometry<f64> = geo::Geometry::try_from_wkt_str(&row[0]).unwrap();
        let from_json = geoshard::spatial::parse_geojson(&f["geometry"]).unwrap();
        assert_eq!(from_wkt, from_json, "{}", &row[0]);
    }

    // Errors: limit bounds, bbox, unknown collection and feature, unknown parameter.
    for bad in [
        "limit=0",
        "limit=10001",
        "limit=ten",
        "bbox=1,2,3",
        "bbox=a,b,c,d",
        "bbox=0,50,1,40",
        "offset=-1",
        "nosuchfield=1",
        "datetime=2020-01-01T00:00:00Z",
        "f=xml",
    ] {
        let r = c.get(&format!("{items_href}?{bad}"));
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert!(r.json()["errorResponse"]["message"].is_string());
    }
    assert_eq!(c.get("/ogc/collections/nope.0").status, 404);
    assert_eq!(c.get("/ogc/collections/nope.0/items").status, 404);
    assert_eq!(c.get(&format!("{items_href}/99999")).status, 404);
    assert_eq!(c.get("/ogc/nothing").status, 404);
    // As geoQueryService: credentials and the feature-service role.
    assert_eq!(Client::new(srv.addr, Auth::None).get("/ogc").status, 401);
    assert_eq!(srv.client(READER).get("/ogc/collections").status, 403);
    srv.kill();
}

/// GDAL's OAPIF driver: `ogrinfo` lists the collection, `ogr2ogr` copies every feature (paged)
/// equal to the source, and `ogrinfo -spat` returns the features of an envelope query.
#[test]
fn gdal_reads_it() {
    need_gdal();
    let dir = loaded_dir();
    let srv = ChildServer::start(dir.path(), &[]);
    let url = format!("OAPIF:http://{}/ogc", srv.addr);
    let auth = [
        "--config",
        "GDAL_HTTP_AUTH",
        "ANY",
        "--config",
        "GDAL_HTTP_USERPWD",
        "geo:geo-pw",
    ];
    let info = Command::new("ogrinfo")
        .args(["-ro"])
        .args(auth)
        .arg(&url)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(info.status.success(), "{info:?}");
    assert!(text.contains("1: US Counties.0"), "{text}");

    let out = dir.path().join("copy.geojson");
    let copy = Command::new("ogr2ogr")
        .args(auth)
        .args(["-f", "GeoJSON"])
        .arg(&out)
        .arg(&url)
        .arg("US Counties.0")
        .args(["-oo", "PAGE_SIZE=40"])
        .output()
        .unwrap();
    assert!(copy.status.success(), "{copy:?}");
    let copied: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let copied = copied["features"].as_array().unwrap();
    assert_eq!(copied.len(), 318);
    let by_fips: std::collections::HashMap<String, &Value> = copied
        .iter()
        .map(|f| (f["properties"]["fips"].as_str().unwrap().to_string(), f))
        .collect();
    for f in source() {
        let fips = f["properties"]["fips"].as_str().unwrap();
        let got = by_fips[fips];
        for k in ["name", "state", "vertices"] {
            assert_eq!(got["properties"][k], f["properties"][k], "{fips} {k}");
        }
        let a = geoshard::spatial::parse_geojson(&f["geometry"]).unwrap();
        let b = geoshard::spatial::parse_geojson(&got["geometry"]).unwrap();
        let d = geo::HausdorffDistance::hausdorff_distance(&a, &b);
        assert!(d < 1e-7, "{fips}: {d}");
    }

    // -spat: GDAL sends bbox; the answer is an envelope query's.
    let spat = Command::new("ogrinfo")
        .args(["-ro", "-q"])
        .args(auth)
        .args(["-spat", "-105.1", "39.6", "-104.8", "39.9"])
        .arg(&url)
        .arg("US Counties.0")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&spat.stdout);
    let mut got: Vec<i64> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("OBJECTID (Integer) = "))
        .map(|v| v.trim().parse().unwrap())
        .collect();
    got.sort_unstable();
    let mut c = srv.client(GEO);
    let want = envelope_ids(&mut c, (-105.1, 39.6, -104.8, 39.9));
    assert_eq!(got, want, "{text}");
    srv.kill();
}

/// A vector tile decoded by GDAL's MVT driver (not the encoder's crate) holds the features a
/// box query of the tile's buffered bounds returns, clipped to that buffer.
#[test]
fn tiles_hold_the_box_query_clipped() {
    need_gdal();
    let dir = loaded_dir();
    let srv = ChildServer::start(dir.path(), &[]);
    let mut c = srv.client(GEO);
    let tj = c.get(&format!("/tiles/{COLLECTION}.json"));
    assert_eq!(tj.status, 200, "{}", tj.text());
    let tj = tj.json();
    assert_eq!(tj["tilejson"], "3.0.0");
    assert!(
        tj["tiles"][0]
            .as_str()
            .unwrap()
            .ends_with("/{z}/{x}/{y}.mvt")
    );
    assert_eq!(tj["vector_layers"][0]["id"], "US Counties.0");

    const HALF: f64 = 20_037_508.342_789_244;
    const R: f64 = 6_378_137.0;
    for (z, x, y) in [(6u32, 13u32, 24u32), (8, 53, 97), (4, 3, 6)] {
        let r = c.get(&format!("/tiles/{COLLECTION}/{z}/{x}/{y}.mvt"));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(
            r.header("content-type"),
            Some("application/vnd.mapbox-vector-tile")
        );
        let tile = dir.path().join(format!("{z}-{x}-{y}.mvt"));
        std::fs::write(&tile, &r.body).unwrap();
        let out = dir.path().join(format!("{z}-{x}-{y}.geojson"));
        let decoded = Command::new("ogr2ogr")
            .args(["-f", "GeoJSON"])
            .arg(&out)
            .arg(&tile)
            .args([
                "-oo",
                &format!("X={x}"),
                "-oo",
                &format!("Y={y}"),
                "-oo",
                &format!("Z={z}"),
            ])
            // GDAL clips to the tile itself unless told not to; the buffer is part of the test.
            .args(["-oo", "CLIP=NO"])
            .output()
            .unwrap();
        assert!(decoded.status.success(), "{decoded:?}");
        let fc: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        let features = fc["features"].as_array().unwrap();
        let mut got: Vec<i64> = features
            .iter()
            .map(|f| f["properties"]["OBJECTID"].as_i64().unwrap())
            .collect();
        got.sort_unstable();

        // The buffered bounds (64 of 4096 units each side), in metres and in degrees.
        let size = 2.0 * HALF / f64::from(1u32 << z);
        let pad = size * 64.0 / 4096.0;
        let (l, t) = (
            -HALF + f64::from(x) * size - pad,
            HALF - f64::from(y) * size + pad,
        );
        let (r_, b) = (l + size + 2.0 * pad, t - size - 2.0 * pad);
        let lon = |m: f64| (m / R).to_degrees();
        let lat = |m: f64| (2.0 * (m / R).exp().atan() - std::f64::consts::FRAC_PI_2).to_degrees();
        let want = envelope_ids(&mut c, (lon(l), lat(b), lon(r_), lat(t)));
        // A polygon of the query that only touches the buffer's edge has nothing left inside
        // it: every feature the tile leaves out must be one (geo's boolean intersection, in
        // degrees, as the oracle), and the tile holds nothing the query does not.
        let src = source();
        let boxed = geo::Rect::new(
            geo::coord! {x: lon(l), y: lat(b)},
            geo::coord! {x: lon(r_), y: lat(t)},
        )
        .to_polygon();
        for id in &want {
            if got.contains(id) {
                continue;
            }
            let g = geoshard::spatial::parse_geojson(&src[(*id - 1) as usize]["geometry"]).unwrap();
            let mp: geo::MultiPolygon<f64> = match g {
                geo::Geometry::Polygon(p) => p.into(),
                geo::Geometry::MultiPolygon(m) => m,
                other => panic!("{other:?}"),
            };
            let inside = geo::Area::unsigned_area(&geo::BooleanOps::intersection(
                &mp,
                &geo::MultiPolygon::from(boxed.clone()),
            ));
            let tile_area = geo::Area::unsigned_area(&boxed);
            assert!(
                inside < tile_area * 1e-7,
                "tile {z}/{x}/{y} leaves out {id}, which has {inside} square degrees inside"
            );
        }
        assert!(
            got.iter().all(|id| want.contains(id)),
            "tile {z}/{x}/{y}: {got:?} / {want:?}"
        );
        assert!(
            got.len() * 10 >= want.len() * 7,
            "tile {z}/{x}/{y}: {got:?} / {want:?}"
        );

        // Clipped: every position within the buffer (GDAL writes EPSG:3857 metres here), to a
        // tile unit's rounding.
        let unit = size / 4096.0;
        let mut positions = Vec::new();
        fn walk(v: &Value, out: &mut Vec<(f64, f64)>) {
            match v.as_array() {
                Some(a) if a.first().is_some_and(Value::is_number) => {
                    out.push((a[0].as_f64().unwrap(), a[1].as_f64().unwrap()))
                }
                Some(a) => a.iter().for_each(|x| walk(x, out)),
                None => {}
            }
        }
        for f in features {
            walk(&f["geometry"]["coordinates"], &mut positions);
        }
        for (px, py) in positions {
            assert!(
                px >= l - unit && px <= r_ + unit && py >= b - unit && py <= t + unit,
                "tile {z}/{x}/{y}: ({px}, {py}) outside the buffer"
            );
        }
    }
    // The tiles at the world's edges, whose buffer reaches past ±180°: the one tile of zoom 0
    // holds every county, and the corner tiles of zoom 1 answer.
    let world = c.get(&format!("/tiles/{COLLECTION}/0/0/0.mvt"));
    assert_eq!(world.status, 200, "{}", world.text());
    let tile = dir.path().join("world.mvt");
    std::fs::write(&tile, &world.body).unwrap();
    let out = dir.path().join("world.geojson");
    let decoded = Command::new("ogr2ogr")
        .args(["-f", "GeoJSON"])
        .arg(&out)
        .arg(&tile)
        .args(["-oo", "X=0", "-oo", "Y=0", "-oo", "Z=0", "-oo", "CLIP=NO"])
        .output()
        .unwrap();
    assert!(decoded.status.success(), "{decoded:?}");
    let fc: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(fc["features"].as_array().unwrap().len(), source().len());
    for (x, y) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
        let r = c.get(&format!("/tiles/{COLLECTION}/1/{x}/{y}.mvt"));
        assert_eq!(r.status, 200, "1/{x}/{y}: {}", r.text());
    }
    assert_eq!(c.get(&format!("/tiles/{COLLECTION}/2/9/0.mvt")).status, 400);
    assert_eq!(c.get("/tiles/nope.0/0/0/0.mvt").status, 404);
    srv.kill();
}

/// A tile with more features than its limit holds an even sample of them: at zoom 0 over the
/// 144,563 GeoNames places, 5,000 (`max_record_count`) whose ids step evenly through the whole
/// file, not its first 5,000 (one end of the alphabet of countries).
#[test]
fn a_dense_tile_is_a_sample_of_the_whole_layer() {
    need_gdal();
    let dir = temp_dir("ogc-dense");
    seed_users(&dir);
    let csv = data_dir().join("real/geonames-cities1000.csv");
    let out = Command::new(env!("CARGO_BIN_EXE_geoshard"))
        .args(["load", "--quiet", "--service", "Places", "--data-dir"])
        .arg(dir.path())
        .arg(&csv)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let rows = std::fs::read_to_string(&csv).unwrap().lines().count() - 1;
    let srv = ChildServer::start(dir.path(), &[]);
    let mut c = srv.client(GEO);
    let r = c.get("/tiles/Places.0/0/0/0.mvt");
    assert_eq!(r.status, 200, "{}", r.text());
    let tile = dir.path().join("places.mvt");
    std::fs::write(&tile, &r.body).unwrap();
    let geojson = dir.path().join("places.geojson");
    let decoded = Command::new("ogr2ogr")
        .args(["-f", "GeoJSON"])
        .arg(&geojson)
        .arg(&tile)
        .args(["-oo", "X=0", "-oo", "Y=0", "-oo", "Z=0", "-oo", "CLIP=NO"])
        .output()
        .unwrap();
    assert!(decoded.status.success(), "{decoded:?}");
    let fc: Value = serde_json::from_str(&std::fs::read_to_string(&geojson).unwrap()).unwrap();
    let mut ids: Vec<i64> = fc["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["properties"]["OBJECTID"].as_i64().unwrap())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids.len(), 5000);
    let step = rows as f64 / 5000.0;
    assert!(ids[0] <= step.ceil() as i64, "{}", ids[0]);
    assert!(*ids.last().unwrap() >= rows as i64 - step.ceil() as i64);
    for w in ids.windows(2) {
        let gap = (w[1] - w[0]) as f64;
        assert!(gap >= step.floor() && gap <= step.ceil(), "{w:?}");
    }
    srv.kill();
}

/// The OAS30 conformance class: the landing page's first `service-desc` is this API as an
/// OpenAPI 3.0 document, valid by `openapi-spec-validator` (PyPI, installed by
/// `scripts/setup-clients.sh`) and describing every path the 3.1 document does.
#[test]
fn the_api_definition_is_a_valid_openapi_30_document() {
    let validator = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/clients-venv/bin/openapi-spec-validator");
    if !validator.exists() {
        let setup = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/setup-clients.sh");
        let _ = Command::new(setup).status();
    }
    assert!(validator.exists(), "{} is missing", validator.display());
    let dir = temp_dir("ogc-api");
    seed_users(&dir);
    let srv = ChildServer::start(dir.path(), &[]);
    let mut c = srv.client(GEO);
    let landing = c.get("/ogc").json();
    let desc = landing["links"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["rel"] == "service-desc")
        .unwrap();
    assert_eq!(desc["type"], "application/vnd.oai.openapi+json;version=3.0");
    let conf = c.get("/ogc/conformance").json();
    assert!(conf["conformsTo"].as_array().unwrap().contains(&json!(
        "http://www.opengis.net/spec/ogcapi-features-1/1.0/conf/oas30"
    )));
    let r = c.get(&local(desc["href"].as_str().unwrap()));
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-type"),
        Some("application/vnd.oai.openapi+json;version=3.0")
    );
    let doc = r.json();
    assert_eq!(doc["openapi"], "3.0.3");
    let kept: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.json"))
            .unwrap(),
    )
    .unwrap();
    let keys = |d: &Value| {
        d["paths"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(keys(&doc), keys(&kept));
    let file = dir.path().join("api.json");
    std::fs::write(&file, &r.body).unwrap();
    let out = Command::new(&validator)
        .args(["--schema", "3.0"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The 3.1 document only relabelled is not one: the validator does see what was rewritten.
    let mut relabelled = kept.clone();
    relabelled["openapi"] = json!("3.0.3");
    let file = dir.path().join("relabelled.json");
    std::fs::write(&file, relabelled.to_string()).unwrap();
    let out = Command::new(&validator)
        .args(["--schema", "3.0"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    srv.kill();
}

/// OGC API – Features Part 3: `filter` in CQL2-text on the queryables, answered as a scan of
/// the source file decides, alone and with `bbox`, paged through `next`; refusals name the
/// filter.
#[test]
fn filter_is_cql2_text_on_the_queryables() {
    let dir = loaded_dir();
    let srv = ChildServer::start(dir.path(), &[]);
    let mut c = srv.client(GEO);
    let conf = c.get("/ogc/conformance").json();
    for class in [
        "http://www.opengis.net/spec/ogcapi-features-3/1.0/conf/filter",
        "http://www.opengis.net/spec/ogcapi-features-3/1.0/conf/features-filter",
        "http://www.opengis.net/spec/cql2/1.0/conf/cql2-text",
        "http://www.opengis.net/spec/cql2/1.0/conf/basic-cql2",
    ] {
        assert!(
            conf["conformsTo"]
                .as_array()
                .unwrap()
                .contains(&json!(class))
        );
    }

    // Queryables: linked from the collection, one property a column, typed.
    let col = c.get(&format!("/ogc/collections/{COLLECTION}")).json();
    let href = rel(&col, "http://www.opengis.net/def/rel/ogc/1.0/queryables").unwrap();
    let r = c.get(&local(href));
    assert_eq!(r.header("content-type"), Some("application/schema+json"));
    let q = r.json();
    assert_eq!(q["properties"]["name"]["type"], "string");
    assert_eq!(q["properties"]["state"]["type"], "integer");
    assert_eq!(q["properties"]["west"]["type"], "number");

    // Every feature of the file, for the oracle.
    let src: Vec<(i64, Value)> = source()
        .into_iter()
        .enumerate()
        .map(|(i, f)| (i as i64 + 1, f))
        .collect();
    let all_pages = |c: &mut Client, query: &str| -> Vec<i64> {
        let mut got = Vec::new();
        let mut next = Some(format!(
            "/ogc/collections/{COLLECTION}/items?limit=50&{query}"
        ));
        while let Some(path) = next {
            let page = c.get(&path);
            assert_eq!(page.status, 200, "{path}: {}", page.text());
            let page = page.json();
            got.extend(ids(&page));
            next = rel(&page, "next").map(local);
        }
        got.sort_unstable();
        got
    };
    let enc = |s: &str| common::enc(s);
    type Pred = Box<dyn Fn(&Value) -> bool>;
    let cases: Vec<(&str, Pred)> = vec![
        (
            "name LIKE 'San%' AND state = 48",
            Box::new(|p| p["name"].as_str().unwrap().starts_with("San") && p["state"] == 48),
        ),
        (
            "state = 8 OR west < -106.5",
            Box::new(|p| p["state"] == 8 || p["west"].as_f64().unwrap() < -106.5),
        ),
        (
            "vertices BETWEEN 20 AND 40 AND NOT name IN ('Harris', 'Travis')",
            Box::new(|p| {
                let v = p["vertices"].as_i64().unwrap();
                (20..=40).contains(&v)
                    && !["Harris", "Travis"].contains(&p["name"].as_str().unwrap())
            }),
        ),
        ("\"name\" = 'Denver'", Box::new(|p| p["name"] == "Denver")),
    ];
    // The ids of the source's features whose properties `pred` holds, sorted.
    let selected = |pred: &Pred| -> Vec<i64> {
        let mut want: Vec<i64> = src
            .iter()
            .filter(|(_, f)| pred(&f["properties"]))
            .map(|(id, _)| *id)
            .collect();
        want.sort_unstable();
        want
    };
    for (filter, pred) in &cases {
        let want = selected(pred);
        assert!(!want.is_empty(), "{filter}");
        let got = all_pages(
            &mut c,
            &format!("filter={}&filter-lang=cql2-text", enc(filter)),
        );
        assert_eq!(got, want, "{filter}");
    }
    // With bbox: the filter's features whose geometry meets the box, as geoQueryService says.
    let boxed = (-106.0, 38.0, -103.0, 41.0);
    let in_box = envelope_ids(&mut c, boxed);
    let want: Vec<i64> = in_box
        .iter()
        .copied()
        .filter(|id| {
            let p = &src[(*id - 1) as usize].1["properties"];
            p["vertices"].as_i64().unwrap() > 30
        })
        .collect();
    let got = all_pages(
        &mut c,
        &format!("bbox=-106,38,-103,41&filter={}", enc("vertices > 30")),
    );
    assert_eq!(got, want);

    // The same filters as CQL2-JSON, the language given before or after the filter.
    let json_cases = [
        json!({"op": "and", "args": [
            {"op": "like", "args": [{"property": "name"}, "San%"]},
            {"op": "=", "args": [{"property": "state"}, 48]}]}),
        json!({"op": "or", "args": [
            {"op": "=", "args": [{"property": "state"}, 8]},
            {"op": "<", "args": [{"property": "west"}, -106.5]}]}),
        json!({"op": "and", "args": [
            {"op": "between", "args": [{"property": "vertices"}, 20, 40]},
            {"op": "not", "args": [{"op": "in", "args": [{"property": "name"}, ["Harris", "Travis"]]}]}]}),
        json!({"op": "=", "args": [{"property": "name"}, "Denver"]}),
    ];
    for (i, ((text, pred), filter)) in cases.iter().zip(&json_cases).enumerate() {
        let want = selected(pred);
        let query = if i % 2 == 0 {
            format!("filter-lang=cql2-json&filter={}", enc(&filter.to_string()))
        } else {
            format!("filter={}&filter-lang=cql2-json", enc(&filter.to_string()))
        };
        assert_eq!(all_pages(&mut c, &query), want, "{text} as CQL2-JSON");
    }

    // Refusals: an unknown property, a bad expression, CQL2-JSON that is not, another
    // language, another CRS.
    for (query, says) in [
        ("filter=nope%20%3D%201", "filter:"),
        ("filter=name%20%3D", "filter:"),
        ("filter=state%3D8&filter-lang=cql2-json", "CQL2-JSON"),
        ("filter=state%3D8&filter-lang=ecql", "cql2-text"),
        ("filter=state%3D8&filter-crs=EPSG%3A4326", "CRS84"),
    ] {
        let r = c.get(&format!("/ogc/collections/{COLLECTION}/items?{query}"));
        assert_eq!(r.status, 400, "{query}");
        assert!(r.error().2.contains(says), "{query}: {}", r.text());
    }
    srv.kill();
}
