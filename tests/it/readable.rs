//! What a caller may read and what a read costs: extents over the caller's readable rows only, in every place
//! one is given (both descriptors, the OGC collections, TileJSON); unreadable rows that cost a
//! query no exact geometry test; OGC items and tiles over huge polygons within a memory bound
//! read from the server's `/proc`, a time limit, and `max_answer_bytes`. The expected extents
//! are the readable documents' own coordinates, written here.

use crate::common;

use std::time::{Duration, Instant};

use geozero::mvt::Message;

use common::*;
use serde_json::{Value, json};

const TDE: &str = "http://marklogic.com/xdmp/tde";
const SERVICES: &str = "http://marklogic.com/feature-services";
const GEO_READ: &str = "&perm:geo-data-services-reader=read&perm:geo-data-services-writer=update";
const ADMIN_ONLY: &str = "&perm:admin=read";

fn define(admin: &mut Client, service: &str, collection: &str, kind: &str) {
    let template = json!({"template": {"context": "/", "collections": [collection], "rows": [{
        "schemaName": service, "viewName": "v", "columns": [
            {"name": "OBJECTID", "scalarType": "int", "val": "id"}]}]}});
    let r = admin.put_json(
        &format!(
            "/v1/documents?uri=/tde/{service}.json&collection={}",
            enc(TDE)
        ),
        &template.to_string(),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let descriptor = json!({"info": {"name": service, "description": "d"}, "layers": [{
        "id": 0, "name": "v", "description": "d", "geometryType": kind,
        "schema": service, "view": "v",
        "geometry": {"format": "geojson", "coordinateSystem": "wgs84", "xpath": "//geometry"}}]});
    let r = admin.put_json(
        &format!(
            "/v1/documents?uri=/sd/{service}.json&collection={}",
            enc(SERVICES)
        ),
        &descriptor.to_string(),
    );
    assert_eq!(r.status, 201, "{}", r.text());
}

fn put(admin: &mut Client, collection: &str, id: i64, geometry: &Value, perms: &str) {
    let doc = json!({"id": id, "geometry": geometry});
    let r = admin.put_json(
        &format!("/v1/documents?uri=/{collection}/{id}.json&collection={collection}{perms}"),
        &doc.to_string(),
    );
    assert!(r.status == 201 || r.status == 204, "{}", r.text());
}

fn point(x: f64, y: f64) -> Value {
    json!({"type": "Point", "coordinates": [x, y]})
}

fn geo_query(c: &mut Client, body: Value) -> Value {
    let r = c.post_json("/v1/resources/geoQueryService", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// `[xmin, ymin, xmax, ymax]` of an `extent` member, or `None` without one.
fn esri_extent(e: &Value) -> Option<[f64; 4]> {
    Some([
        e.get("xmin")?.as_f64()?,
        e["ymin"].as_f64()?,
        e["xmax"].as_f64()?,
        e["ymax"].as_f64()?,
    ])
}

fn box_of(v: &Value) -> Option<[f64; 4]> {
    let a = v.as_array()?;
    Some([
        a[0].as_f64()?,
        a[1].as_f64()?,
        a[2].as_f64()?,
        a[3].as_f64()?,
    ])
}

/// Every extent the server gives for layer 0 of `service`, as `who` sees it.
fn extents(srv: &TestServer, who: (&str, &str), service: &str) -> Vec<(String, Option<[f64; 4]>)> {
    let mut c = srv.client(who);
    let svc = geo_query(&mut c, json!({"params": {"id": service}}));
    let layer = geo_query(&mut c, json!({"params": {"id": service, "layer": 0}}));
    let collection = srv.client(who).get(&format!(
        "/ogc/collections/{}",
        enc(&format!("{service}.0"))
    ));
    assert_eq!(collection.status, 200, "{}", collection.text());
    let collections = srv.client(who).get("/ogc/collections").json();
    let listed = collections["collections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == format!("{service}.0"))
        .cloned()
        .unwrap_or_else(|| panic!("{service}.0 not listed: {collections}"));
    let tilejson = srv
        .client(who)
        .get(&format!("/tiles/{}.json", enc(&format!("{service}.0"))));
    assert_eq!(tilejson.status, 200, "{}", tilejson.text());
    vec![
        ("service extent".into(), esri_extent(&svc["extent"])),
        (
            "service layer extent".into(),
            esri_extent(&svc["layers"][0]["metadata"]["extent"]),
        ),
        (
            "layer extent".into(),
            esri_extent(&layer["metadata"]["extent"]),
        ),
        (
            "OGC collection".into(),
            box_of(&collection.json()["extent"]["spatial"]["bbox"][0]),
        ),
        (
            "OGC collections".into(),
            box_of(&listed["extent"]["spatial"]["bbox"][0]),
        ),
        ("TileJSON bounds".into(), box_of(&tilejson.json()["bounds"])),
    ]
}

/// Each extent is `want` (to a micrometre: an index's own box may be padded by 1e-9).
fn assert_all(got: &[(String, Option<[f64; 4]>)], want: Option<[f64; 4]>, who: &str) {
    for (place, e) in got {
        let close = match (e, want) {
            (Some(a), Some(b)) => a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6),
            (a, b) => a.is_none() && b.is_none(),
        };
        assert!(close, "{place} as {who}: {e:?}, want {want:?}");
    }
}

/// Every extent a caller is given covers only what it may read: an admin-only document far
/// away widens the admin's extents, not a geo user's; a write or a delete changes them at once.
#[test]
fn extents_cover_only_what_the_caller_may_read() {
    let srv = TestServer::start();
    let mut admin = srv.client(ADMIN);
    define(&mut admin, "Spots", "spots", "Point");
    put(&mut admin, "spots", 1, &point(10.0, 10.0), GEO_READ);
    put(&mut admin, "spots", 2, &point(11.0, 12.0), GEO_READ);
    put(&mut admin, "spots", 3, &point(12.0, 11.0), GEO_READ);
    put(&mut admin, "spots", 4, &point(-120.0, -40.0), ADMIN_ONLY);
    // A polygon layer of one admin-only feature: nothing for the geo user, so no extent.
    define(&mut admin, "Hidden", "hidden", "Polygon");
    let square = json!({"type": "Polygon", "coordinates": [[[50, 50], [51, 50], [51, 51], [50, 51], [50, 50]]]});
    put(&mut admin, "hidden", 1, &square, ADMIN_ONLY);

    assert_all(
        &extents(&srv, GEO, "Spots"),
        Some([10.0, 10.0, 12.0, 12.0]),
        "geo",
    );
    assert_all(
        &extents(&srv, ADMIN, "Spots"),
        Some([-120.0, -40.0, 12.0, 12.0]),
        "admin",
    );
    assert_all(&extents(&srv, GEO, "Hidden"), None, "geo");
    assert_all(
        &extents(&srv, ADMIN, "Hidden"),
        Some([50.0, 50.0, 51.0, 51.0]),
        "admin",
    );

    // A readable write widens the geo user's extent at once, and its delete narrows it back.
    put(&mut admin, "spots", 5, &point(20.0, 5.0), GEO_READ);
    assert_all(
        &extents(&srv, GEO, "Spots"),
        Some([10.0, 5.0, 20.0, 12.0]),
        "geo after a write",
    );
    let r = admin.delete("/v1/documents?uri=/spots/5.json");
    assert_eq!(r.status, 204);
    assert_all(
        &extents(&srv, GEO, "Spots"),
        Some([10.0, 10.0, 12.0, 12.0]),
        "geo after a delete",
    );
    // The admin-only document made readable: now it counts.
    put(&mut admin, "hidden", 1, &square, GEO_READ);
    assert_all(
        &extents(&srv, GEO, "Hidden"),
        Some([50.0, 50.0, 51.0, 51.0]),
        "geo, readable",
    );
}

/// A polygon of `n` vertices on a circle of radius `r` around `(cx, cy)`.
fn ring(cx: f64, cy: f64, r: f64, n: usize) -> Value {
    let mut pts: Vec<[f64; 2]> = (0..n)
        .map(|i| {
            let a = i as f64 / n as f64 * std::f64::consts::TAU;
            [cx + r * a.cos(), cy + r * a.sin()]
        })
        .collect();
    pts.push(pts[0]);
    json!({"type": "Polygon", "coordinates": [pts]})
}

/// The least time of `n` runs of `f`.
fn least(n: usize, mut f: impl FnMut()) -> Duration {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap()
}

/// A count over a box of admin-only polygons of 200k vertices costs a geo user, who may read
/// none of them, what a count over an empty box does; the admin's count tests them.
#[test]
fn unreadable_rows_cost_no_exact_test() {
    let srv = TestServer::start();
    let mut admin = srv.client(ADMIN);
    define(&mut admin, "Big", "big", "Polygon");
    for (i, cx) in [0.0, 3.0, 6.0].into_iter().enumerate() {
        put(
            &mut admin,
            "big",
            i as i64 + 1,
            &ring(cx, 0.0, 1.0, 200_000),
            ADMIN_ONLY,
        );
    }
    // The query: a thin diagonal polygon crossing every disc's box, so that the exact test
    // cannot be answered from the boxes alone.
    let over = json!({"type": "Polygon", "coordinates": [[[-1.2, -1.2], [7.2, 1.1], [7.2, 1.2], [-1.2, -1.1], [-1.2, -1.2]]]});
    let empty = json!({"type": "Polygon", "coordinates": [[[100, 60], [101, 60], [101, 61], [100, 61], [100, 60]]]});
    let count = |who: (&str, &str), g: &Value| -> i64 {
        let body = json!({"params": {"id": "Big", "layer": 0, "method": "query"},
            "query": {"returnCountOnly": true,
                      "extension": {"geometry": g, "spatialRel": "esriSpatialRelIntersects"}}});
        let mut c = srv.client(who);
        geo_query(&mut c, body)["count"].as_i64().unwrap()
    };
    assert_eq!(count(ADMIN, &over), 3);
    assert_eq!(count(GEO, &over), 0);
    assert_eq!(count(GEO, &empty), 0);
    // One client each, so the least of several runs measures the query, not the handshake.
    let mut geo = srv.client(GEO);
    let mut admin = srv.client(ADMIN);
    let body = |g: &Value| {
        json!({"params": {"id": "Big", "layer": 0, "method": "query"},
            "query": {"returnCountOnly": true,
                      "extension": {"geometry": g, "spatialRel": "esriSpatialRelIntersects"}}})
        .to_string()
    };
    let (over_body, empty_body) = (body(&over), body(&empty));
    let time = |c: &mut Client, b: &str, runs: usize| {
        least(runs, || {
            let r = c.post_json("/v1/resources/geoQueryService", b);
            assert_eq!(r.status, 200);
        })
    };
    let geo_over = time(&mut geo, &over_body, 7);
    let geo_empty = time(&mut geo, &empty_body, 7);
    let admin_over = time(&mut admin, &over_body, 1);
    eprintln!(
        "least of 7: geo over {geo_over:?}, geo empty {geo_empty:?}; admin over {admin_over:?}"
    );
    // The unreadable polygons cost the geo user no more than an empty box, give or take
    // the machine's noise; the admin's count, which tests them, shows what that would be.
    assert!(
        geo_over <= geo_empty * 3 + Duration::from_millis(5),
        "geo over {geo_over:?}, empty {geo_empty:?}"
    );
    assert!(
        admin_over > geo_over,
        "the admin's exact tests ({admin_over:?}) should cost more than none ({geo_over:?})"
    );
}

/// A server process with the geo layer `Big` of six polygons of 200k vertices each.
fn big_polygons(env: &[(&str, &str)]) -> (TestDir, ChildServer) {
    let dir = temp_dir("big-polygons");
    seed_users(dir.path());
    let srv = ChildServer::start(dir.path(), env);
    let mut admin = srv.client(ADMIN);
    define(&mut admin, "Big", "big", "Polygon");
    for i in 0..6 {
        let cx = -150.0 + 60.0 * i as f64;
        put(
            &mut admin,
            "big",
            i + 1,
            &ring(cx, 10.0, 20.0, 200_000),
            GEO_READ,
        );
    }
    (dir, srv)
}

/// OGC items over six polygons of 200k vertices: a page grows the server by at most eight
/// times its size (at least 256 MiB of room), and that memory is given back; a zoom-0 tile
/// over them is drawn from simplified geometries kept after its first drawing.
#[test]
fn items_and_tiles_over_huge_polygons_stay_within_memory() {
    let (_dir, srv) = big_polygons(&[]);
    let mut geo = srv.client(GEO);
    // Settle: the loading's own transient memory.
    assert_eq!(geo.get("/ogc/collections/Big.0/items?limit=1").status, 200);
    let before = srv.rss_mib();
    let r = geo.get("/ogc/collections/Big.0/items?limit=100");
    assert_eq!(r.status, 200, "{}", r.text());
    let answer_mib = (r.body.len() >> 20) as u64;
    let fc = r.json();
    assert_eq!(fc["numberMatched"], 6);
    assert_eq!(fc["numberReturned"], 6);
    let first = &fc["features"][0];
    assert_eq!(first["id"], 1);
    assert_eq!(
        first["geometry"]["coordinates"][0]
            .as_array()
            .unwrap()
            .len(),
        200_001
    );
    drop(fc);
    let after = srv.rss_mib();
    let room = (8 * answer_mib).max(256);
    eprintln!("items: answer {answer_mib} MiB, server {before} -> {after} MiB");
    assert!(answer_mib >= 20, "{answer_mib} MiB");
    assert!(
        after <= before + room,
        "items took the server from {before} to {after} MiB for a {answer_mib} MiB answer"
    );
    // The same page again, and a moment after: the memory of the answers is given back.
    assert_eq!(
        geo.get("/ogc/collections/Big.0/items?limit=100").status,
        200
    );
    let again = srv.rss_mib();
    std::thread::sleep(Duration::from_secs(2));
    let settled = srv.rss_mib();
    eprintln!("items again: {again} MiB, {settled} MiB 2 s later");
    assert!(again <= before + room, "{before} -> {again} MiB");
    assert!(settled <= before + answer_mib, "{before} -> {settled} MiB");
    // One feature.
    let one = geo.get("/ogc/collections/Big.0/items/4").json();
    assert_eq!(one["id"], 4);
    assert_eq!(one["type"], "Feature");
    assert!(
        one["links"].as_array().unwrap().len() == 2,
        "{}",
        one["links"]
    );
    assert_eq!(geo.get("/ogc/collections/Big.0/items/7").status, 404);

    // A zoom-0 tile: its first drawing simplifies each polygon once; later ones reuse that.
    let t = Instant::now();
    let first = geo.get("/tiles/Big.0/0/0/0.mvt");
    let first_time = t.elapsed();
    assert_eq!(first.status, 200, "{}", first.text());
    let times: Vec<Duration> = (0..5)
        .map(|_| {
            let t = Instant::now();
            let r = geo.get("/tiles/Big.0/0/0/0.mvt");
            assert_eq!(r.status, 200);
            assert_eq!(r.body, first.body, "the same tile twice");
            t.elapsed()
        })
        .collect();
    let later = times.iter().min().unwrap();
    eprintln!("zoom-0 tile: first {first_time:?}, then at least {later:?}");
    assert!(
        *later * 4 <= first_time,
        "a cached tile ({later:?}) should cost far less than the first ({first_time:?})"
    );
    let tiled = srv.rss_mib();
    assert!(
        tiled <= again + 256,
        "{again} -> {tiled} MiB after the tiles"
    );
    // The tile holds all six polygons, drawn with few vertices.
    let tile = geozero::mvt::Tile::decode(first.body.as_slice()).unwrap();
    assert_eq!(tile.layers[0].features.len(), 6);
    let commands: usize = tile.layers[0]
        .features
        .iter()
        .map(|f| f.geometry.len())
        .sum();
    assert!(commands < 6 * 2_000, "{commands} geometry commands");
}

/// A page over max_answer_bytes is a 413 naming its setting, and a tile bounded by
/// query_time_limit_ms a 503 naming its own. The time limit is set only for the tile, on a
/// restart over the same data, so that the small pages are never timed out on a slow machine.
#[test]
fn tiles_have_a_time_limit_and_answers_a_size_limit() {
    let (dir, srv) = big_polygons(&[
        ("GEOSHARD_TILE_CACHE_BYTES", "0"),
        ("GEOSHARD_MAX_ANSWER_BYTES", "4000000"),
    ]);
    let mut geo = srv.client(GEO);
    // Each polygon is about 7 MB of JSON: one is over the limit, through either reader.
    let r = geo.get("/ogc/collections/Big.0/items?limit=2");
    assert_eq!(r.status, 413, "{}", r.text());
    let message = r.error().2;
    assert!(message.contains("max_answer_bytes"), "{message}");
    assert!(message.contains("limit"), "{message}");
    let r = geo.post_json(
        "/v1/resources/geoQueryService",
        &json!({"params": {"id": "Big", "layer": 0, "method": "query"},
                "query": {"where": "1=1", "resultRecordCount": 2, "returnGeometry": true}})
        .to_string(),
    );
    assert_eq!(r.status, 413, "{}", r.text());
    // Without geometries the page is small.
    let r = geo.post_json(
        "/v1/resources/geoQueryService",
        &json!({"params": {"id": "Big", "layer": 0, "method": "query"},
                "query": {"where": "1=1", "returnGeometry": false}})
        .to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["features"].as_array().unwrap().len(), 6);
    assert!(srv.stop().success());

    let srv = ChildServer::start(
        dir.path(),
        &[
            ("GEOSHARD_QUERY_TIME_LIMIT_MS", "1"),
            ("GEOSHARD_TILE_CACHE_BYTES", "0"),
        ],
    );
    let mut geo = srv.client(GEO);
    let r = geo.get("/tiles/Big.0/0/0/0.mvt");
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.error().2.contains("query_time_limit_ms"), "{}", r.text());
}

/// The tile at zoom `z` holding a longitude and latitude, by the slippy-map formula.
fn tile_of(z: u32, lon: f64, lat: f64) -> (u32, u32) {
    let n = f64::from(1u32 << z);
    let r = lat.to_radians();
    let x = ((lon + 180.0) / 360.0 * n).floor() as u32;
    let y =
        ((1.0 - (r.tan() + 1.0 / r.cos()).ln() / std::f64::consts::PI) / 2.0 * n).floor() as u32;
    (x, y)
}

/// The features of a vector tile, decoded by geozero's protobuf types.
fn tile_features(body: &[u8]) -> usize {
    let tile = geozero::mvt::Tile::decode(body).unwrap();
    tile.layers.iter().map(|l| l.features.len()).sum()
}

/// `geoshard_tiles_served_total` by source, from the server's own `/metrics`.
fn tiles_served(srv: &ChildServer) -> (u64, u64) {
    let text = srv.client(ADMIN).get("/metrics").text();
    let count = |source: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(&format!(
                    "geoshard_tiles_served_total{{source=\"{source}\"}} "
                ))
            })
            .map_or(0, |v| v.trim().parse().unwrap())
    };
    (count("cache"), count("made"))
}

/// Tiles are kept once made and revalidated with their entity tag (304), per set of readable
/// rows: the geo user's tile and the admin's differ. A write drops the tiles it meets, so the
/// next answer holds it, and leaves a tile elsewhere kept.
#[test]
fn tiles_are_kept_until_a_write_meets_them_and_per_readable_rows() {
    let dir = temp_dir("tile-cache");
    seed_users(dir.path());
    let srv = ChildServer::start(dir.path(), &[]);
    let mut admin = srv.client(ADMIN);
    define(&mut admin, "Spots", "spots", "Point");
    put(&mut admin, "spots", 1, &point(10.0, 10.0), GEO_READ);
    put(&mut admin, "spots", 2, &point(10.001, 10.001), ADMIN_ONLY);
    put(&mut admin, "spots", 3, &point(-120.0, -40.0), GEO_READ);
    // Enough points beside the first for a tile worth gzipping.
    for i in 0..200 {
        let at = point(
            10.1 + f64::from(i % 20) * 0.01,
            10.1 + f64::from(i / 20) * 0.01,
        );
        put(&mut admin, "spots", 100 + i64::from(i), &at, GEO_READ);
    }
    let (x, y) = tile_of(8, 10.0, 10.0);
    let near = format!("/tiles/Spots.0/8/{x}/{y}.mvt");
    let (fx, fy) = tile_of(8, -120.0, -40.0);
    let far = format!("/tiles/Spots.0/8/{fx}/{fy}.mvt");
    let mut geo = srv.client(GEO);

    let first = geo.get(&near);
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(tile_features(&first.body), 201);
    assert!(first.body.len() > 1024, "{}", first.body.len());
    let tag = first.header("etag").unwrap().to_string();
    assert_eq!(first.header("cache-control"), Some("private, no-cache"));
    assert_eq!(tiles_served(&srv), (0, 1));
    // Again: the same bytes, kept.
    let again = geo.get(&near);
    assert_eq!(again.body, first.body);
    assert_eq!(again.header("etag"), Some(tag.as_str()));
    assert_eq!(tiles_served(&srv), (1, 1));
    // Revalidated: 304 with no body.
    let r = geo.request("GET", &near, &[("If-None-Match", tag.as_str())], b"");
    assert_eq!(r.status, 304, "{}", r.text());
    assert!(r.body.is_empty());
    // Gzipped when asked for, under a tag of its own; the same tile once unzipped.
    let gz = geo.request("GET", &near, &[("Accept-Encoding", "gzip")], b"");
    assert_eq!(gz.header("content-encoding"), Some("gzip"));
    let gz_tag = gz.header("etag").unwrap().to_string();
    assert_ne!(gz_tag, tag);
    let mut unzipped = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::GzDecoder::new(&gz.body[..]),
        &mut unzipped,
    )
    .unwrap();
    assert_eq!(unzipped, first.body);
    let r = geo.request(
        "GET",
        &near,
        &[
            ("Accept-Encoding", "gzip"),
            ("If-None-Match", gz_tag.as_str()),
        ],
        b"",
    );
    assert_eq!(r.status, 304);
    // The admin reads the admin-only point too: another tile, never the geo user's.
    let a = admin.get(&near);
    assert_eq!(tile_features(&a.body), 202);
    assert_ne!(a.header("etag"), Some(tag.as_str()));
    let r = geo.get(&far);
    assert_eq!(tile_features(&r.body), 1);
    let far_tag = r.header("etag").unwrap().to_string();
    let served = tiles_served(&srv);
    // Both answers in gzip above came from the cache.
    assert_eq!(served, (4, 3), "{served:?}");

    // A readable point lands in the near tile: the tag no longer matches, the tile has it.
    put(&mut admin, "spots", 4, &point(10.002, 10.002), GEO_READ);
    let r = geo.request("GET", &near, &[("If-None-Match", tag.as_str())], b"");
    assert_eq!(r.status, 200);
    assert_eq!(tile_features(&r.body), 202);
    assert_ne!(r.header("etag"), Some(tag.as_str()));
    // The far tile was not met: still kept, still 304.
    let r = geo.request("GET", &far, &[("If-None-Match", far_tag.as_str())], b"");
    assert_eq!(r.status, 304);
    let now = tiles_served(&srv);
    assert_eq!(
        (now.0 - served.0, now.1 - served.1),
        (1, 1),
        "{served:?} -> {now:?}"
    );
    // A point moved out of the far tile drops it too.
    put(&mut admin, "spots", 3, &point(100.0, 40.0), GEO_READ);
    let r = geo.get(&far);
    assert_eq!(tile_features(&r.body), 0);
    srv.kill();
}
