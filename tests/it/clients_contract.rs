//! What ArcGIS clients, Koop and the official database clients send, over real HTTP (issue
//! 34): Esri JSON query geometries in WGS84 and Web Mercator, `distance` queries against a
//! geodesic scan, the descriptor shapes Koop reads, multi-document and multi-category reads,
//! `HEAD`, and permissions in the Python client's form.

use crate::common;

use common::layers::*;
use common::*;
use geo::{BoundingRect, Contains, Distance, Geodesic, Geometry, Intersects, Point, Rect, coord};
use serde_json::{Value, json};

/// Web Mercator from longitude and latitude, computed here independently of the server.
fn mercator(lon: f64, lat: f64) -> (f64, f64) {
    const R: f64 = 6_378_137.0;
    let x = R * lon.to_radians();
    let y = R
        * (std::f64::consts::FRAC_PI_4 + lat.to_radians() / 2.0)
            .tan()
            .ln();
    (x, y)
}

fn count_ids(c: &mut Client, q: Value) -> Vec<i64> {
    let mut q = q;
    q["returnIdsOnly"] = json!(true);
    let r = query(c, "Counties", q);
    assert_eq!(r.status, 200, "{}", r.text());
    ids(&r.json())
}

/// Points, envelopes and rings in Esri JSON, in WGS84 and Web Mercator, select the counties a
/// scan with geo selects; an Esri geometry is never dropped.
#[test]
fn esri_geometries_select_what_a_scan_selects() {
    let srv = TestServer::start();
    let mut c = srv.client(GEO);
    let all = load_counties(&mut c);
    let scan = |hit: &dyn Fn(&Geometry<f64>) -> bool| -> Vec<i64> {
        let mut v: Vec<i64> = all
            .iter()
            .filter(|(_, g, _)| hit(g))
            .map(|(id, _, _)| *id)
            .collect();
        v.sort_unstable();
        v
    };
    // Points on a lattice over the lower 48 (some outside every county).
    let mut points = 0;
    for i in 0..6 {
        for j in 0..4 {
            let (lon, lat) = (-122.3 + 9.7 * f64::from(i), 27.9 + 5.3 * f64::from(j));
            let want = scan(&|g| g.contains(&Point::new(lon, lat)));
            let (x, y) = mercator(lon, lat);
            for q in [
                json!({"geometry": {"x": lon, "y": lat}, "inSR": 4326}),
                json!({"geometry": format!("{lon},{lat}")}),
                json!({"geometry": {"x": x, "y": y, "spatialReference": {"wkid": 102100}}}),
                json!({"geometry": {"x": x, "y": y}, "inSR": "3857"}),
                json!({"geometry": json!({"x": x, "y": y}).to_string(), "inSR": {"wkid": 102100, "latestWkid": 3857}}),
            ] {
                let mut q = q;
                q["geometryType"] = json!("esriGeometryPoint");
                q["spatialRel"] = json!("esriSpatialRelIntersects");
                assert_eq!(count_ids(&mut c, q.clone()), want, "{q}");
            }
            points += usize::from(!want.is_empty());
        }
    }
    assert!(
        points >= 12,
        "most lattice points fall in a county ({points})"
    );
    // Envelopes: an Esri envelope, its text form and its Web Mercator form.
    let (xmin, ymin, xmax, ymax) = (-90.3, 38.1, -88.9, 39.4);
    let rect = Rect::new(coord! {x: xmin, y: ymin}, coord! {x: xmax, y: ymax});
    let want = scan(&|g| g.intersects(&rect));
    assert!(want.len() > 10);
    let (mx0, my0) = mercator(xmin, ymin);
    let (mx1, my1) = mercator(xmax, ymax);
    for q in [
        json!({"geometry": {"xmin": xmin, "ymin": ymin, "xmax": xmax, "ymax": ymax}}),
        json!({"geometry": format!("{xmin},{ymin},{xmax},{ymax}"), "geometryType": "esriGeometryEnvelope"}),
        json!({"geometry": {"xmin": mx0, "ymin": my0, "xmax": mx1, "ymax": my1}, "inSR": 102100}),
    ] {
        let got = count_ids(&mut c, q.clone());
        // The Web Mercator round trip moves the edges by nanometres; no county edge is there.
        assert_eq!(got, want, "{q}");
    }
    // A clockwise Esri ring (a triangle) selects what the same GeoJSON polygon selects.
    let ring = json!([[-100.0, 35.0], [-97.0, 40.0], [-94.0, 35.0], [-100.0, 35.0]]);
    let triangle: Geometry<f64> = geo::Polygon::new(
        vec![(-100.0, 35.0), (-97.0, 40.0), (-94.0, 35.0), (-100.0, 35.0)].into(),
        vec![],
    )
    .into();
    let want = scan(&|g| g.intersects(&triangle));
    assert!(want.len() > 20);
    assert_eq!(
        count_ids(
            &mut c,
            json!({"geometry": {"rings": [ring]}, "geometryType": "esriGeometryPolygon"})
        ),
        want
    );
    // extension.geometry wins over an Esri geometry (Koop sends both, the Esri one in inSR).
    let q = json!({
        "geometry": {"x": 0, "y": 0}, "inSR": 102100,
        "extension": {"geometry": {"type": "Point", "coordinates": [-97.0, 38.0]}}
    });
    assert_eq!(
        count_ids(&mut c, q),
        scan(&|g| g.contains(&Point::new(-97.0, 38.0)))
    );
    // What cannot be used is refused, naming the problem; never the whole layer.
    for (q, says) in [
        (
            json!({"geometry": {"x": -97, "y": 38}, "inSR": 2263}),
            "2263",
        ),
        (json!({"geometry": {"curveRings": []}}), "not an Esri"),
        (json!({"geometry": "1,2,3"}), "xmin,ymin"),
        (
            json!({"geometry": {"x": -97, "y": 38}, "distance": 5, "units": "parsecs"}),
            "parsecs",
        ),
        (json!({"distance": 5}), "needs a query geometry"),
        (
            json!({"geometry": {"x": -97, "y": 38}, "distance": 5, "spatialRel": "esriSpatialRelContains"}),
            "intersects only",
        ),
    ] {
        let r = query(&mut c, "Counties", q.clone());
        assert_eq!(r.status, 400, "{q}: {}", r.text());
        assert!(r.text().contains(says), "{q}: {}", r.text());
    }
}

/// Places near a point, by `distance` in every unit, equal a geodesic scan of every place;
/// counties near a point include every county with a vertex that close and none farther than
/// a vertex plus an edge.
#[test]
fn distance_queries_match_a_geodesic_scan() {
    let srv = TestServer::start();
    let mut c = srv.client(GEO);
    // GeoNames places in and around the Alps, as a point layer.
    let text = std::fs::read_to_string(data_dir().join("real/geonames-cities1000.csv")).unwrap();
    let places: Vec<(i64, f64, f64)> = text
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut f = l.split(',');
            let lat: f64 = f.next()?.parse().ok()?;
            let lon: f64 = f.next()?.parse().ok()?;
            Some((lon, lat))
        })
        .filter(|(lon, lat)| (5.0..12.0).contains(lon) && (44.0..48.5).contains(lat))
        .enumerate()
        .map(|(i, (lon, lat))| (i as i64 + 1, lon, lat))
        .collect();
    assert!(places.len() > 3000, "{}", places.len());
    polygon_layer(&mut c, "Places", "places");
    let docs: Vec<(String, Value)> = places
        .iter()
        .map(|(id, lon, lat)| {
            (
                format!("/places/{id}.json"),
                json!({"id": id, "name": format!("p{id}"), "geometry": {"type": "Point", "coordinates": [lon, lat]}}),
            )
        })
        .collect();
    assert_eq!(bulk(&mut c, "places", &docs).status, 200);
    let centre = Point::new(7.6869, 45.0703);
    for (distance, units, metres) in [
        (25.0, "esriSRUnit_Kilometer", 25_000.0),
        (12.0, "esriSRUnit_StatuteMile", 12.0 * 1609.344),
        (40_000.0, "esriSRUnit_Foot", 40_000.0 * 0.3048),
        (60_000.0, "esriSRUnit_Meter", 60_000.0),
        (8_000.0, "", 8_000.0),
    ] {
        let mut want: Vec<i64> = places
            .iter()
            .filter(|(_, lon, lat)| Geodesic.distance(centre, Point::new(*lon, *lat)) <= metres)
            .map(|p| p.0)
            .collect();
        want.sort_unstable();
        assert!(!want.is_empty());
        for geometry in [
            json!({"extension": {"geometry": {"type": "Point", "coordinates": [centre.x(), centre.y()]}}}),
            json!({"geometry": {"x": centre.x(), "y": centre.y()}}),
        ] {
            let mut q = geometry;
            q["distance"] = json!(distance);
            q["units"] = json!(units);
            q["returnIdsOnly"] = json!(true);
            let r = query(&mut c, "Places", q.clone());
            assert_eq!(r.status, 200, "{}", r.text());
            assert_eq!(ids(&r.json()), want, "{q}");
        }
    }

    // Counties within 20 km of a point in Kansas.
    let all = load_counties(&mut c);
    let p = Point::new(-98.37, 38.61);
    let d = 20_000.0;
    let r = query(
        &mut c,
        "Counties",
        json!({"geometry": {"x": p.x(), "y": p.y()}, "distance": 20, "units": "esriSRUnit_Kilometer", "returnIdsOnly": true}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let got = ids(&r.json());
    for (id, g, _) in &all {
        use geo::CoordsIter;
        let nearest_vertex = g
            .coords_iter()
            .map(|v| Geodesic.distance(p, Point::from(v)))
            .fold(f64::INFINITY, f64::min);
        let longest_edge = match g {
            Geometry::Polygon(_) | Geometry::MultiPolygon(_) => {
                use geo::LinesIter;
                let lines: Vec<geo::Line<f64>> = match g {
                    Geometry::Polygon(p) => p.lines_iter().collect(),
                    Geometry::MultiPolygon(m) => m.lines_iter().collect(),
                    _ => unreachable!(),
                };
                lines
                    .iter()
                    .map(|l| Geodesic.distance(Point::from(l.start), Point::from(l.end)))
                    .fold(0.0, f64::max)
            }
            _ => 0.0,
        };
        let inside = g.contains(&p);
        if inside || nearest_vertex <= d {
            assert!(
                got.contains(id),
                "county {id} has a vertex {nearest_vertex} m away"
            );
        }
        if got.contains(id) && !inside {
            assert!(
                nearest_vertex <= d + longest_edge,
                "county {id} is {nearest_vertex} m away by its vertices"
            );
        }
    }
    assert!(got.len() >= 2, "{got:?}");
}

/// The service and layer descriptors as Koop reads them: layers' metadata with fields and
/// maxRecordCount, and the data's extent; the query answer says which filters it applied.
#[test]
fn descriptors_in_the_shape_koop_reads() {
    let srv = TestServer::start();
    let mut c = srv.client(GEO);
    let all = load_counties(&mut c);
    let svc = c
        .post_json(
            "/v1/resources/geoQueryService",
            &json!({"params": {"id": "Counties"}}).to_string(),
        )
        .json();
    assert_eq!(svc["maxRecordCount"], 5000);
    assert_eq!(svc["description"], "d");
    let layer = &svc["layers"][0]["metadata"];
    assert_eq!(layer["name"], "shapes");
    assert_eq!(layer["geometryType"], "Polygon");
    assert_eq!(layer["maxRecordCount"], 5000);
    assert_eq!(field_names(layer), ["OBJECTID", "name", "pop"]);
    // The extent is the data's (from a scan here), not the world.
    let mut want = all[0].1.bounding_rect().unwrap();
    for (_, g, _) in &all {
        let r = g.bounding_rect().unwrap();
        want = Rect::new(
            coord! {x: want.min().x.min(r.min().x), y: want.min().y.min(r.min().y)},
            coord! {x: want.max().x.max(r.max().x), y: want.max().y.max(r.max().y)},
        );
    }
    // The index pads boxes by a nanodegree: the extent holds the data and is that close.
    let e = &layer["extent"];
    for (k, v, outward) in [
        ("xmin", want.min().x, -1.0),
        ("ymin", want.min().y, -1.0),
        ("xmax", want.max().x, 1.0),
        ("ymax", want.max().y, 1.0),
    ] {
        let got = e[k].as_f64().unwrap_or_else(|| panic!("{k}: {e}"));
        let out = (got - v) * outward;
        assert!((0.0..1e-6).contains(&out), "{k}: {got} for {v}");
    }
    assert_eq!(e["spatialReference"]["wkid"], 4326);
    // The service's extent holds its one layer's.
    assert_eq!(&svc["extent"], e);
    // The one-layer form is the same metadata.
    let one = c
        .post_json(
            "/v1/resources/geoQueryService",
            &json!({"params": {"id": "Counties", "layer": "0"}}).to_string(),
        )
        .json();
    assert_eq!(&one["metadata"], layer);
    let q = query(
        &mut c,
        "Counties",
        json!({"objectIds": "1001", "orderByFields": "name"}),
    )
    .json();
    for k in [
        "geometry",
        "where",
        "offset",
        "limit",
        "objectIds",
        "orderByFields",
    ] {
        assert_eq!(q["filtersApplied"][k], true, "{k}");
    }
}

/// Several `uri`s and several `category`s answer multipart/mixed with a part per document and
/// category; `HEAD` probes; permissions as the Python client writes them are kept.
#[test]
fn reads_of_many_documents_and_categories() {
    let srv = TestServer::start();
    let mut w = srv.client(WRITER);
    // A bulk write whose metadata gives permissions in both of the Python client's forms.
    let boundary = "b0undary";
    let mut body = String::new();
    for (uri, perms) in [
        (
            "/r/a.json",
            json!({"rest-reader": "read", "rest-writer": ["read", "update"]}),
        ),
        (
            "/r/b.json",
            json!([{"role-name": "rest-reader", "capabilities": "read"}, {"role-name": "rest-writer", "capabilities": ["update"]}]),
        ),
    ] {
        body.push_str(&format!(
            "--{boundary}\r\nContent-Type: application/json\r\nContent-Disposition: inline; category=metadata; filename=\"{uri}\"\r\n\r\n{}\r\n",
            json!({"permissions": perms, "collections": ["r"]})
        ));
        body.push_str(&format!(
            "--{boundary}\r\nContent-Type: application/json\r\nContent-Disposition: attachment; filename=\"{uri}\"\r\n\r\n{}\r\n",
            json!({"name": uri})
        ));
    }
    body.push_str(&format!("--{boundary}--\r\n"));
    let ct = format!("multipart/mixed; boundary={boundary}");
    let r = w.request(
        "POST",
        "/v1/documents",
        &[("Content-Type", ct.as_str())],
        body.as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let perms = w
        .get("/v1/documents?uri=/r/a.json&category=permissions")
        .json();
    let mut got: Vec<(String, Vec<String>)> = perms["permissions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let mut caps: Vec<String> = p["capabilities"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_str().unwrap().to_string())
                .collect();
            caps.sort();
            (p["role-name"].as_str().unwrap().to_string(), caps)
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("rest-reader".to_string(), vec!["read".to_string()]),
            (
                "rest-writer".to_string(),
                vec!["read".to_string(), "update".to_string()]
            )
        ]
    );
    // Permissions that are neither form are refused, not stored as none.
    let bad = format!(
        "--{boundary}\r\nContent-Type: application/json\r\nContent-Disposition: inline; category=metadata; filename=\"/r/c.json\"\r\n\r\n{{\"permissions\": {{\"rest-reader\": 7}}}}\r\n--{boundary}\r\nContent-Type: application/json\r\nContent-Disposition: attachment; filename=\"/r/c.json\"\r\n\r\n{{}}\r\n--{boundary}--\r\n"
    );
    let r = w.request(
        "POST",
        "/v1/documents",
        &[("Content-Type", ct.as_str())],
        bad.as_bytes(),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("rest-reader"), "{}", r.text());

    let mut rd = srv.client(READER);
    // Two uris (one absent): a content part for each present document, in order.
    let r = rd.get("/v1/documents?uri=/r/b.json&uri=/r/none.json&uri=/r/a.json");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.header("content-type")
            .unwrap()
            .starts_with("multipart/mixed; boundary=")
    );
    let text = r.text();
    let parts: Vec<&str> = text
        .match_indices("filename=")
        .map(|(i, _)| &text[i..])
        .collect();
    assert_eq!(parts.len(), 2, "{text}");
    assert!(parts[0].starts_with("filename=\"/r/b.json\"; category=content; format=json"));
    assert!(parts[1].starts_with("filename=\"/r/a.json\"; category=content; format=json"));
    assert!(text.contains(&json!({"name": "/r/a.json"}).to_string()));
    // Content and metadata: a metadata part then a content part a document.
    let r = rd.get("/v1/documents?uri=/r/a.json&category=content&category=metadata");
    assert_eq!(r.status, 200);
    let text = r.text();
    let cats: Vec<&str> = text
        .match_indices("category=")
        .map(|(i, _)| text[i + 9..].split(';').next().unwrap())
        .collect();
    assert_eq!(cats, ["metadata", "content"], "{text}");
    assert!(text.contains("\"collections\":[\"r\"]"), "{text}");
    // One uri, content only: the document itself, as before.
    let r = rd.get("/v1/documents?uri=/r/a.json");
    assert_eq!(r.json(), json!({"name": "/r/a.json"}));
    // HEAD: 200 with no body for a document, 404 for none.
    let r = rd.request("HEAD", "/v1/documents?uri=/r/a.json", &[], b"");
    assert_eq!(r.status, 200);
    assert!(r.text().is_empty());
    let r = rd.request("HEAD", "/v1/documents?uri=/r/none.json", &[], b"");
    assert_eq!(r.status, 404);
    // A bad category is a 400 naming the valid ones.
    let r = rd.get("/v1/documents?uri=/r/a.json&category=everything");
    assert_eq!(r.status, 400);
    assert!(r.text().contains("metadata-values"), "{}", r.text());

    // One answer holds at most max_body_bytes of documents; one document alone is its own.
    let small = TestServer::start_with(|c| c.max_body_bytes = 100);
    let mut w = small.client(WRITER);
    for uri in ["/big/1.json", "/big/2.json"] {
        let doc = json!({"pad": "x".repeat(60)}).to_string();
        assert_eq!(
            w.put_json(&format!("/v1/documents?uri={uri}"), &doc).status,
            201
        );
    }
    let mut rd = small.client(READER);
    let r = rd.get("/v1/documents?uri=/big/1.json&uri=/big/2.json");
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(r.text().contains("max_body_bytes (100)"), "{}", r.text());
    assert_eq!(
        rd.get("/v1/documents?uri=/big/1.json&category=content&category=metadata")
            .status,
        200
    );
}

/// Koop's 45 ms: a client with Nagle's algorithm on that sends a request's
/// head and its body's last bytes in separate writes holds the second until the first is
/// acknowledged, and Linux delays that by 40 ms unless told to acknowledge at once. Twenty
/// requests written that way on one keep-alive connection answer well inside that.
#[test]
fn a_request_in_two_writes_is_not_held_by_delayed_acks() {
    use std::io::{BufReader, Write};
    let srv = TestServer::start();
    let mut stream = std::net::TcpStream::connect(srv.addr).unwrap();
    stream.set_nodelay(false).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let body = b"{\"params\":{\"id\":\"none\"}}";
    let mut times = Vec::new();
    for _ in 0..20 {
        let head = format!(
            "POST /v1/resources/geoQueryService HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            base64(&format!("{}:{}", GEO.0, GEO.1)),
            body.len()
        );
        let t0 = std::time::Instant::now();
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(body).unwrap();
        let r = read_response(&mut reader, false).expect("an answer");
        times.push(t0.elapsed());
        assert_eq!(r.status, 404, "{}", r.text());
    }
    times.sort();
    let median = times[times.len() / 2];
    assert!(
        median < std::time::Duration::from_millis(20),
        "median {median:?} of {times:?}"
    );
}
