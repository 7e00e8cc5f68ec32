//! Geofences: definitions, every transition against a brute-force oracle (geo's predicates and
//! exact box tests, not the server's prepared polygons), server-sent events resumed after a
//! disconnect, a restart and a SIGKILL, signed webhooks retried, permissions, roaming.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use geo::{Distance, Geodesic, Intersects, Line, Point, Polygon, coord, polygon};
use serde_json::{Value, json};

use crate::common::layers::{bulk, put};
use crate::common::*;

/// A point layer `service`/0 over `collection`: `id` as OBJECTID, `kind`, and `//geometry`.
fn point_layer(c: &mut Client, service: &str, collection: &str) {
    let columns = json!([
        {"name": "OBJECTID", "scalarType": "int", "val": "id"},
        {"name": "kind", "scalarType": "string", "val": "kind", "nullable": true}]);
    crate::common::layers::layer(c, service, collection, ("fleet", columns), "Point");
}

fn mover(id: i64, kind: &str, p: (f64, f64)) -> Value {
    json!({"id": id, "kind": kind, "geometry": {"type": "Point", "coordinates": [p.0, p.1]}})
}

/// Write mover 1 of `kind` at `at` (created or replaced).
fn move_to(c: &mut Client, kind: &str, at: (f64, f64)) {
    let r = put(
        c,
        "/movers/1.json",
        "&collection=movers",
        &mover(1, kind, at),
    );
    assert!(r.status == 201 || r.status == 204, "{}", r.text());
}

/// The URIs of events, in order.
fn uris_of(events: &[(u64, Value)]) -> Vec<&str> {
    events
        .iter()
        .map(|(_, e)| e["uri"].as_str().unwrap())
        .collect()
}

fn put_fence(c: &mut Client, name: &str, body: &Value) -> Response {
    c.put_json(&format!("/v1/fences/{name}"), &body.to_string())
}

/// Read a fence's server-sent events until `want` have come and then `quiet` passes with no
/// more (or `limit` passes): `(id, event)` in the order sent.
fn read_events(
    addr: SocketAddr,
    user: (&str, &str),
    path: &str,
    last_id: Option<u64>,
    want: usize,
    quiet: Duration,
) -> Vec<(u64, Value)> {
    let mut s = TcpStream::connect(addr).unwrap();
    let resume = last_id.map_or(String::new(), |n| format!("Last-Event-ID: {n}\r\n"));
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: t\r\nAuthorization: Basic {}\r\n{resume}\r\n",
        base64(&format!("{}:{}", user.0, user.1))
    )
    .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut status = String::new();
    r.read_line(&mut status).unwrap();
    assert!(status.contains(" 200 "), "{path}: {status}");
    let mut chunked = false;
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        if line
            .to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
        {
            chunked = true;
        }
        if line == "\r\n" {
            break;
        }
    }
    assert!(chunked, "an event stream is chunked");
    let limit = Instant::now() + Duration::from_secs(60);
    let mut text = String::new();
    let mut events = Vec::new();
    let mut deadline = limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        s.set_read_timeout(Some(left)).unwrap();
        let mut size = String::new();
        match r.read_line(&mut size) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let n = usize::from_str_radix(size.trim(), 16).unwrap();
        if n == 0 {
            break;
        }
        let mut chunk = vec![0; n + 2];
        r.read_exact(&mut chunk).unwrap();
        text.push_str(std::str::from_utf8(&chunk[..n]).unwrap());
        while let Some(end) = text.find("\n\n") {
            let block: String = text.drain(..end + 2).collect();
            let mut id = None;
            let mut data = None;
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = Some(v.parse::<u64>().unwrap());
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data = Some(serde_json::from_str::<Value>(v).unwrap());
                }
            }
            if let (Some(id), Some(data)) = (id, data) {
                events.push((id, data));
                if events.len() >= want {
                    deadline = (Instant::now() + quiet).min(limit);
                }
            }
        }
    }
    events
}

// ---------------------------------------------------------------------------------------
// The oracle.

#[derive(Clone)]
enum Area {
    Box([f64; 4]),
    Polygon(geo::MultiPolygon<f64>),
    Circle((f64, f64), f64),
}

struct OFence {
    name: String,
    area: Area,
    trucks_only: bool,
    detect: Vec<&'static str>,
}

impl OFence {
    fn inside(&self, p: (f64, f64)) -> bool {
        match &self.area {
            Area::Box(b) => b[0] <= p.0 && p.0 <= b[2] && b[1] <= p.1 && p.1 <= b[3],
            Area::Polygon(mp) => mp.intersects(&Point::new(p.0, p.1)),
            Area::Circle(c, r) => {
                Geodesic.distance(Point::new(c.0, c.1), Point::new(p.0, p.1)) <= *r
            }
        }
    }

    fn crossed(&self, a: (f64, f64), b: (f64, f64)) -> bool {
        let line = Line::new(coord! {x: a.0, y: a.1}, coord! {x: b.0, y: b.1});
        match &self.area {
            Area::Box(bx) => {
                let r = geo::Rect::new(coord! {x: bx[0], y: bx[1]}, coord! {x: bx[2], y: bx[3]});
                line.intersects(&r)
            }
            Area::Polygon(mp) => line.intersects(mp),
            Area::Circle(..) => unreachable!("no cross on circles in this test"),
        }
    }

    fn geometry(&self) -> Value {
        match &self.area {
            Area::Box(b) => json!({"type": "Polygon", "coordinates": [[[b[0], b[1]], [b[2], b[1]],
                [b[2], b[3]], [b[0], b[3]], [b[0], b[1]]]]}),
            Area::Polygon(mp) => {
                let polys: Vec<Value> =
                    mp.0.iter()
                        .map(|p| {
                            let ring: Vec<[f64; 2]> =
                                p.exterior().0.iter().map(|c| [c.x, c.y]).collect();
                            json!([ring])
                        })
                        .collect();
                json!({"type": "MultiPolygon", "coordinates": polys})
            }
            Area::Circle(..) => Value::Null,
        }
    }

    fn definition(&self) -> Value {
        let mut d = json!({"service": "Fleet", "layer": 0, "detect": self.detect});
        match &self.area {
            Area::Circle(c, r) => {
                d["point"] = json!([c.0, c.1]);
                d["radius"] = json!(r);
            }
            _ => d["geometry"] = self.geometry(),
        }
        if self.trucks_only {
            d["where"] = json!("kind = 'truck'");
        }
        d
    }

    /// The events one write makes, as the specification orders them.
    fn events(&self, was: Option<&Mover>, is: Option<&Mover>) -> Vec<&'static str> {
        let pop = |m: Option<&Mover>| {
            m.filter(|m| !self.trucks_only || m.kind == "truck")
                .copied()
        };
        let (was, is) = (pop(was), pop(is));
        let was_in = was.is_some_and(|m| self.inside(m.at));
        let is_in = is.is_some_and(|m| self.inside(m.at));
        let mut out = Vec::new();
        let wants = |d: &str| self.detect.contains(&d);
        if !was_in && is_in && wants("enter") {
            out.push("enter");
        }
        if was_in && !is_in && wants("exit") {
            out.push("exit");
        }
        if let Some(m) = is {
            if is_in && wants("inside") {
                out.push("inside");
            }
            if !is_in && wants("outside") {
                out.push("outside");
            }
            if !is_in
                && !was_in
                && wants("cross")
                && let Some(w) = was
                && w.at != m.at
                && self.crossed(w.at, m.at)
            {
                out.push("cross");
            }
        }
        out
    }
}

#[derive(Clone, Copy, Debug)]
struct Mover {
    at: (f64, f64),
    kind: &'static str,
}

/// A small deterministic generator (xorshift), so a failure replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A multiple of 1/8 in [0, 4]: on many fences' edges and vertices.
    fn grid(&mut self) -> f64 {
        self.below(33) as f64 / 8.0
    }
}

fn fences(rng: &mut Rng) -> Vec<OFence> {
    let all = vec!["enter", "exit", "inside", "outside", "cross"];
    let mut out = Vec::new();
    for i in 0..8 {
        let (x0, x1) = {
            let (a, b) = (rng.below(16) as f64 / 4.0, rng.below(16) as f64 / 4.0);
            (a.min(b), a.max(b) + 0.25)
        };
        let (y0, y1) = {
            let (a, b) = (rng.below(16) as f64 / 4.0, rng.below(16) as f64 / 4.0);
            (a.min(b), a.max(b) + 0.25)
        };
        out.push(OFence {
            name: format!("box-{i}"),
            area: Area::Box([x0, y0, x1, y1]),
            trucks_only: i == 7,
            detect: if i == 6 {
                vec!["enter", "exit"]
            } else {
                all.clone()
            },
        });
    }
    let triangle: Polygon<f64> =
        polygon![(x: 0.5, y: 0.5), (x: 3.5, y: 0.5), (x: 2.0, y: 3.5), (x: 0.5, y: 0.5)];
    out.push(OFence {
        name: "triangle".into(),
        area: Area::Polygon(geo::MultiPolygon(vec![triangle])),
        trucks_only: false,
        detect: all.clone(),
    });
    let a: Polygon<f64> = polygon![(x: 0.0, y: 0.0), (x: 1.0, y: 0.0), (x: 1.0, y: 1.0), (x: 0.0, y: 1.0), (x: 0.0, y: 0.0)];
    let b: Polygon<f64> = polygon![(x: 3.0, y: 3.0), (x: 4.0, y: 3.0), (x: 4.0, y: 4.0), (x: 3.0, y: 4.0), (x: 3.0, y: 3.0)];
    out.push(OFence {
        name: "corners".into(),
        area: Area::Polygon(geo::MultiPolygon(vec![a, b])),
        trucks_only: false,
        detect: all.clone(),
    });
    out.push(OFence {
        name: "circle".into(),
        area: Area::Circle((2.0, 2.0), 90_000.0),
        trucks_only: false,
        detect: vec!["enter", "exit", "inside", "outside"],
    });
    out
}

/// The walk's writes, in order per mover: `Some` a position and kind, `None` a delete.
fn walk(rng: &mut Rng, movers: i64, steps: usize) -> Vec<Vec<Option<Mover>>> {
    (0..movers)
        .map(|_| {
            (0..steps)
                .map(|_| {
                    if rng.below(20) == 0 {
                        return None;
                    }
                    Some(Mover {
                        at: (rng.grid(), rng.grid()),
                        kind: if rng.below(3) == 0 { "car" } else { "truck" },
                    })
                })
                .collect()
        })
        .collect()
}

/// Per (fence, uri), the transitions in order.
type ByMover = BTreeMap<(String, String), Vec<String>>;

fn expected(fences: &[OFence], walks: &[Vec<Option<Mover>>]) -> ByMover {
    let mut out = ByMover::new();
    for (m, steps) in walks.iter().enumerate() {
        let uri = format!("/movers/{m}.json");
        let mut was: Option<Mover> = None;
        for is in steps {
            // Deleting what does not exist changes nothing.
            if was.is_none() && is.is_none() {
                continue;
            }
            for f in fences {
                let list = out.entry((f.name.clone(), uri.clone())).or_default();
                list.extend(
                    f.events(was.as_ref(), is.as_ref())
                        .into_iter()
                        .map(String::from),
                );
            }
            was = *is;
        }
    }
    out.retain(|_, v| !v.is_empty());
    out
}

fn got(events: &[(String, Vec<(u64, Value)>)]) -> ByMover {
    let mut out = ByMover::new();
    for (fence, list) in events {
        for (_, e) in list {
            assert_eq!(e["fence"], json!(fence));
            out.entry((fence.clone(), e["uri"].as_str().unwrap().to_string()))
                .or_default()
                .push(e["detect"].as_str().unwrap().to_string());
        }
    }
    out
}

/// Write each mover's steps: three writers at once, each its own movers in order, some
/// steps as a bulk of several movers.
fn run_walk(srv_addr: SocketAddr, walks: &[Vec<Option<Mover>>], base: i64) {
    let walks = Arc::new(walks.to_vec());
    let writers: Vec<_> = (0..3)
        .map(|w| {
            let walks = walks.clone();
            std::thread::spawn(move || {
                let mut c = Client::new(srv_addr, Auth::Digest(GEO.0.into(), GEO.1.into()));
                let mine: Vec<usize> = (0..walks.len()).filter(|m| m % 3 == w).collect();
                let steps = walks[0].len();
                for s in 0..steps {
                    if s % 5 == 4 {
                        // A bulk of this writer's movers that move (deletes go one by one).
                        let docs: Vec<(String, Value)> = mine
                            .iter()
                            .filter_map(|&m| {
                                let mv = walks[m][s]?;
                                Some((
                                    format!("/movers/{m}.json"),
                                    mover(base + m as i64, mv.kind, mv.at),
                                ))
                            })
                            .collect();
                        let r = bulk(&mut c, "movers", &docs);
                        assert_eq!(r.status, 200, "{}", r.text());
                        for &m in &mine {
                            if walks[m][s].is_none() {
                                let r = c.delete(&format!("/v1/documents?uri=/movers/{m}.json"));
                                assert!(r.status == 204 || r.status == 404, "{}", r.text());
                            }
                        }
                        continue;
                    }
                    for &m in &mine {
                        let uri = format!("/movers/{m}.json");
                        match walks[m][s] {
                            Some(mv) => {
                                let r = put(
                                    &mut c,
                                    &uri,
                                    "&collection=movers",
                                    &mover(base + m as i64, mv.kind, mv.at),
                                );
                                assert!(r.status == 201 || r.status == 204, "{}", r.text());
                            }
                            None => {
                                let r = c.delete(&format!("/v1/documents?uri={}", enc(&uri)));
                                assert!(r.status == 204 || r.status == 404, "{}", r.text());
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
}

/// Define the fences: the first half one `PUT` each, the rest in one `POST`.
fn define(c: &mut Client, fences: &[OFence]) {
    let (one_by_one, bulk) = fences.split_at(fences.len() / 2);
    for f in one_by_one {
        let r = put_fence(c, &f.name, &f.definition());
        assert_eq!(r.status, 201, "{}: {}", f.name, r.text());
    }
    let list: Vec<Value> = bulk
        .iter()
        .map(|f| {
            let mut d = f.definition();
            d["name"] = json!(f.name);
            d
        })
        .collect();
    let r = c.post_json("/v1/fences", &json!({ "fences": list }).to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["created"], json!(bulk.len()));
}

fn read_all(
    addr: SocketAddr,
    fences: &[OFence],
    want: &ByMover,
) -> Vec<(String, Vec<(u64, Value)>)> {
    fences
        .iter()
        .map(|f| {
            let n: usize = want
                .iter()
                .filter(|((name, _), _)| name == &f.name)
                .map(|(_, v)| v.len())
                .sum();
            let path = format!("/v1/fences/{}/events", f.name);
            let list = read_events(addr, GEO, &path, Some(0), n, Duration::from_millis(400));
            (f.name.clone(), list)
        })
        .collect()
}

fn assert_same(want: &ByMover, got: &ByMover) {
    let mut wrong = Vec::new();
    for (k, v) in want {
        if got.get(k) != Some(v) {
            wrong.push(format!("{k:?}: want {v:?}, got {:?}", got.get(k)));
        }
    }
    for (k, v) in got {
        if !want.contains_key(k) {
            wrong.push(format!("{k:?}: want nothing, got {v:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} (fence, mover) sequences differ:\n{}",
        wrong.len(),
        want.len(),
        wrong[..wrong.len().min(10)].join("\n")
    );
}

fn assert_ids_increase(events: &[(String, Vec<(u64, Value)>)]) {
    for (fence, list) in events {
        for w in list.windows(2) {
            assert!(w[0].0 < w[1].0, "{fence}: ids {} then {}", w[0].0, w[1].0);
        }
    }
}

#[test]
fn a_random_walk_makes_exactly_the_oracles_events() {
    let srv = TestServer::start();
    let mut c = srv.client(GEO);
    point_layer(&mut c, "Fleet", "movers");
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let fences = fences(&mut rng);
    define(&mut c, &fences);
    let walks = walk(&mut rng, 30, 40);
    run_walk(srv.addr, &walks, 1);
    let want = expected(&fences, &walks);
    let total: usize = want.values().map(Vec::len).sum();
    assert!(
        total > 2000,
        "the walk makes too few events to test much: {total}"
    );
    for kind in ["enter", "exit", "inside", "outside", "cross"] {
        let n = want.values().flatten().filter(|d| *d == kind).count();
        assert!(n >= 20, "the walk makes {n} {kind} events");
    }
    // Positions exactly on edges and vertices: the walk puts some there.
    let on_edge = walks
        .iter()
        .flatten()
        .flatten()
        .filter(|m| {
            fences.iter().any(|f| match f.area {
                Area::Box(b) => {
                    f.inside(m.at)
                        && (m.at.0 == b[0] || m.at.0 == b[2] || m.at.1 == b[1] || m.at.1 == b[3])
                }
                _ => false,
            })
        })
        .count();
    assert!(on_edge > 100, "{on_edge} positions on box edges");
    let events = read_all(srv.addr, &fences, &want);
    assert_ids_increase(&events);
    assert_same(&want, &got(&events));
    // Each event carries the row and where it was.
    let (_, list) = &events[0];
    let e = &list[0].1;
    assert!(
        e["OBJECTID"].is_i64() && e["properties"]["kind"].is_string(),
        "{e}"
    );
    assert_eq!(e["geometry"]["type"], "Point", "{e}");
    assert!(e["time"].is_string(), "{e}");

    // The metrics count them.
    let metrics = c.get("/metrics").text();
    let made = metrics
        .lines()
        .find_map(|l| l.strip_prefix("geoshard_fence_events_total "))
        .unwrap()
        .parse::<u64>()
        .unwrap();
    // At least these (the metrics are the process's, and other tests run beside this one).
    assert!(made as usize >= total, "events made: {made} of {total}");
    assert!(metrics.contains("geoshard_fence_events_delivered_total{via=\"sse\"}"));
}

#[test]
fn fences_are_defined_listed_and_removed() {
    let srv = TestServer::start();
    let mut c = srv.client(GEO);
    point_layer(&mut c, "Fleet", "movers");
    let def = json!({"service": "Fleet", "layer": 0, "point": [1, 2], "radius": 500,
        "webhook": {"url": "http://127.0.0.1:9/hook", "secret": "0123456789abcdef"}});
    let r = put_fence(&mut c, "depot", &def);
    assert_eq!(r.status, 201, "{}", r.text());
    let got = r.json();
    assert_eq!(got["name"], "depot");
    assert_eq!(got["owner"], "geo");
    assert!(got["webhook"].get("secret").is_none(), "{got}");
    assert_eq!(put_fence(&mut c, "depot", &def).status, 200);
    let list = c.get("/v1/fences").json();
    assert_eq!(list["fences"].as_array().unwrap().len(), 1, "{list}");
    let mut reader = srv.client(GEO_READER);
    assert_eq!(reader.get("/v1/fences/depot").json()["radius"], 500);

    // Refusals name the problem.
    for (name, body, says) in [
        (
            "a b",
            json!({"service": "Fleet", "layer": 0, "point": [0, 0], "radius": 1}),
            "name",
        ),
        (
            "x",
            json!({"service": "Nope", "layer": 0, "point": [0, 0], "radius": 1}),
            "service",
        ),
        (
            "x",
            json!({"service": "Fleet", "layer": 0, "point": [0, 0]}),
            "radius",
        ),
        (
            "x",
            json!({"service": "Fleet", "layer": 0, "point": [0, 0], "radius": 1, "detect": ["arrive"]}),
            "detect",
        ),
        (
            "x",
            json!({"service": "Fleet", "layer": 0, "point": [0, 0], "radius": 1, "where": "nope = 1"}),
            "where",
        ),
        (
            "x",
            json!({"service": "Fleet", "layer": 0, "geometry": {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [0, 0]]]}}),
            "geometry",
        ),
    ] {
        let r = put_fence(&mut c, &enc(name), &body);
        let (status, _, message) = r.error();
        assert_eq!(status, 400, "{name}: {}", r.text());
        assert!(message.contains(says), "{name}: {message}");
    }

    // Who may do what.
    let (status, code, _) = reader.put_json("/v1/fences/mine", &def.to_string()).error();
    assert_eq!((status, code.as_str()), (403, "SEC-PRIV"));
    let mut writer = srv.client(WRITER);
    assert_eq!(writer.get("/v1/fences").error().0, 403);
    // Through the documents API, only an admin writes the fences' collection.
    let r = put(
        &mut c,
        "/geoshard/fences/forged.json",
        "&collection=http%3A%2F%2Fgeoshard.dev%2Ffences",
        &json!({"name": "forged", "service": "Fleet", "layer": 0, "point": [0, 0], "radius": 1, "ownerRoles": 255}),
    );
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(c.get("/v1/fences/forged").status == 404);

    assert_eq!(c.delete("/v1/fences/depot").status, 204);
    assert_eq!(c.get("/v1/fences/depot").error().0, 404);
    assert_eq!(c.delete("/v1/fences/depot").error().0, 404);
}

#[test]
fn an_area_can_be_another_layers_feature_and_a_where_filters() {
    let srv = TestServer::start();
    let mut c = srv.client(GEO);
    point_layer(&mut c, "Fleet", "movers");
    crate::common::layers::polygon_layer(&mut c, "Zones", "zones");
    let zone = json!({"id": 7, "name": "seven", "geometry": {"type": "Polygon",
        "coordinates": [[[10, 10], [11, 10], [11, 11], [10, 11], [10, 10]]]}});
    assert_eq!(
        put(&mut c, "/zones/7.json", "&collection=zones", &zone).status,
        201
    );
    let def = json!({"service": "Fleet", "layer": 0, "where": "kind = 'truck'",
        "feature": {"service": "Zones", "layer": 0, "OBJECTID": 7}, "detect": ["enter", "exit"]});
    let r = put_fence(&mut c, "zone-7", &def);
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["geometry"]["type"], "Polygon");
    let r = put_fence(
        &mut c,
        "zone-8",
        &json!({"service": "Fleet", "layer": 0,
        "feature": {"service": "Zones", "layer": 0, "OBJECTID": 8}}),
    );
    assert!(r.error().2.contains("no feature 8"), "{}", r.text());

    let moves = [
        ("car", (10.5, 10.5)),   // not a truck: nothing
        ("truck", (10.5, 10.5)), // becomes a truck inside: enter
        ("truck", (11.0, 10.2)), // on the edge: still inside
        ("truck", (12.0, 10.0)), // out: exit
    ];
    for (kind, at) in moves {
        move_to(&mut c, kind, at);
    }
    let events = read_events(
        srv.addr,
        GEO,
        "/v1/fences/zone-7/events?after=0",
        None,
        2,
        Duration::from_millis(300),
    );
    let kinds: Vec<&str> = events
        .iter()
        .map(|(_, e)| e["detect"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["enter", "exit"]);
    assert_eq!(events[1].1["previous"]["coordinates"], json!([11.0, 10.2]));
    assert_eq!(events[1].1["geometry"]["coordinates"], json!([12.0, 10.0]));
}

#[test]
fn roaming_fences_say_when_rows_meet_and_part() {
    let srv = TestServer::start();
    let mut c = srv.client(GEO);
    point_layer(&mut c, "Fleet", "movers");
    point_layer(&mut c, "Depots", "depots");
    let depot = json!({"id": 50, "kind": "depot", "geometry": {"type": "Point", "coordinates": [5.0, 5.0]}});
    assert_eq!(
        put(&mut c, "/depots/50.json", "&collection=depots", &depot).status,
        201
    );
    let def = json!({"service": "Fleet", "layer": 0, "roam": {"service": "Depots", "layer": 0, "distance": 1000}});
    let r = put_fence(&mut c, "near-depot", &def);
    assert_eq!(r.status, 201, "{}", r.text());
    // 0.005 degrees of latitude is about 553 m; 0.02 about 2.2 km.
    for at in [(5.0, 5.02), (5.0, 5.005), (5.0, 5.004), (5.0, 4.98)] {
        move_to(&mut c, "truck", at);
    }
    let events = read_events(
        srv.addr,
        GEO,
        "/v1/fences/near-depot/events?after=0",
        None,
        2,
        Duration::from_millis(300),
    );
    let got: Vec<(&str, i64)> = events
        .iter()
        .map(|(_, e)| {
            (
                e["detect"].as_str().unwrap(),
                e["nearby"]["OBJECTID"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(got, [("near", 50), ("far", 50)]);
}

#[test]
fn events_resume_after_a_disconnect_and_a_restart() {
    let dir = temp_dir("fences-resume");
    seed_users(&dir);
    let srv = TestServer::start_in(&dir, |_| {});
    let mut c = srv.client(GEO);
    point_layer(&mut c, "Fleet", "movers");
    let box_ = json!({"service": "Fleet", "layer": 0, "detect": ["inside"],
        "geometry": {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 1], [0, 0]]]}});
    assert_eq!(put_fence(&mut c, "unit", &box_).status, 201);
    let write = |c: &mut Client, n: i64| {
        let r = put(
            c,
            &format!("/movers/{n}.json"),
            "&collection=movers",
            &mover(n, "truck", (0.5, 0.5)),
        );
        assert_eq!(r.status, 201, "{}", r.text());
    };
    // A reader that follows from now gets what comes next.
    let addr = srv.addr;
    let live = std::thread::spawn(move || {
        read_events(
            addr,
            GEO,
            "/v1/fences/unit/events",
            None,
            3,
            Duration::from_millis(300),
        )
    });
    std::thread::sleep(Duration::from_millis(300));
    for n in 1..=3 {
        write(&mut c, n);
    }
    let first = live.join().unwrap();
    assert_eq!(first.len(), 3, "{first:?}");
    let last = first[2].0;
    for n in 4..=5 {
        write(&mut c, n);
    }
    // After a disconnect: from the last id seen, the two missed, nothing twice.
    let resumed = read_events(
        srv.addr,
        GEO,
        "/v1/fences/unit/events",
        Some(last),
        2,
        Duration::from_millis(300),
    );
    let uris = uris_of(&resumed);
    assert_eq!(uris, ["/movers/4.json", "/movers/5.json"]);
    let last = resumed[1].0;
    write(&mut c, 6);
    drop(c);
    srv.stop();

    // After a restart: the events are kept, and so are the fences.
    let srv = TestServer::start_in(&dir, |_| {});
    let mut c = srv.client(GEO);
    write(&mut c, 7);
    let after = read_events(
        srv.addr,
        GEO,
        "/v1/fences/unit/events",
        Some(last),
        2,
        Duration::from_millis(300),
    );
    let uris = uris_of(&after);
    assert_eq!(uris, ["/movers/6.json", "/movers/7.json"]);
    let all = read_events(
        srv.addr,
        GEO,
        "/v1/fences/unit/events",
        Some(0),
        7,
        Duration::from_millis(300),
    );
    assert_eq!(all.len(), 7);
    srv.stop();
}

#[test]
fn subscribers_get_only_what_they_may_read() {
    let srv = TestServer::start();
    let mut c = srv.client(GEO);
    point_layer(&mut c, "Fleet", "movers");
    let unit = json!({"service": "Fleet", "layer": 0, "detect": ["inside"],
        "geometry": {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 1], [0, 0]]]}});
    assert_eq!(put_fence(&mut c, "unit", &unit).status, 201);
    // One open to the geo readers, one to rest-writers only.
    let open = "&perm:geo-data-services-reader=read&perm:rest-writer=update";
    let closed = "&perm:rest-writer=read&perm:rest-writer=update";
    assert_eq!(
        put(
            &mut c,
            "/movers/1.json",
            &format!("&collection=movers{open}"),
            &mover(1, "truck", (0.5, 0.5))
        )
        .status,
        201
    );
    assert_eq!(
        put(
            &mut c,
            "/movers/2.json",
            &format!("&collection=movers{closed}"),
            &mover(2, "truck", (0.5, 0.5))
        )
        .status,
        201
    );
    let reader = read_events(
        srv.addr,
        GEO_READER,
        "/v1/fences/unit/events?after=0",
        None,
        1,
        Duration::from_millis(500),
    );
    let uris = uris_of(&reader);
    assert_eq!(uris, ["/movers/1.json"]);
    let admin = read_events(
        srv.addr,
        ADMIN,
        "/v1/fences/unit/events?after=0",
        None,
        2,
        Duration::from_millis(300),
    );
    assert_eq!(admin.len(), 2);
}

/// A webhook receiver: answers 500 to the first `fail` posts, then 200; keeps each post's
/// headers and body.
struct Receiver {
    addr: SocketAddr,
    posts: Arc<Mutex<Vec<Post>>>,
}

/// A post's headers (lower-cased names), body, and the status it was answered.
type Post = (HashMap<String, String>, Vec<u8>, u16);

fn receiver(fail: usize) -> Receiver {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let posts = Arc::new(Mutex::new(Vec::new()));
    let kept = posts.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let mut r = BufReader::new(stream.try_clone().unwrap());
            let mut headers = HashMap::new();
            let mut line = String::new();
            if r.read_line(&mut line).is_err() {
                continue;
            }
            loop {
                let mut h = String::new();
                r.read_line(&mut h).unwrap();
                if h == "\r\n" || h.is_empty() {
                    break;
                }
                if let Some((k, v)) = h.trim_end().split_once(": ") {
                    headers.insert(k.to_ascii_lowercase(), v.to_string());
                }
            }
            let len: usize = headers
                .get("content-length")
                .map_or(0, |v| v.parse().unwrap());
            let mut body = vec![0; len];
            r.read_exact(&mut body).unwrap();
            let mut posts = kept.lock().unwrap();
            let status = if posts.len() < fail { 500 } else { 200 };
            posts.push((headers, body, status));
            drop(posts);
            let mut s = stream;
            let _ = write!(
                s,
                "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            );
        }
    });
    Receiver { addr, posts }
}

fn hmac_hex(secret: &str, body: &[u8]) -> String {
    use hmac::{KeyInit, Mac};
    let mut mac = <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body);
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn webhooks_are_signed_retried_and_failures_listed() {
    let srv = TestServer::start_with(|c| c.webhook_retries = 2);
    let mut c = srv.client(GEO);
    point_layer(&mut c, "Fleet", "movers");
    let hook = receiver(2);
    let secret = "a-webhook-secret-0123";
    let unit = |url: String| {
        json!({"service": "Fleet", "layer": 0, "detect": ["enter", "exit"],
        "geometry": {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 1], [0, 0]]]},
        "webhook": {"url": url, "secret": secret}})
    };
    assert_eq!(
        put_fence(
            &mut c,
            "hooked",
            &unit(format!("http://{}/events", hook.addr))
        )
        .status,
        201
    );
    // The delivery task starts within a second of the fence.
    std::thread::sleep(Duration::from_millis(1500));
    for at in [(0.5, 0.5), (2.0, 2.0)] {
        move_to(&mut c, "truck", at);
    }
    wait_for("two delivered events", || {
        hook.posts
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.2 == 200)
            .count()
            >= 2
    });
    let posts = hook.posts.lock().unwrap().clone();
    // The first event failed twice, then went; then the second.
    assert_eq!(
        posts.iter().map(|p| p.2).collect::<Vec<_>>(),
        [500, 500, 200, 200]
    );
    let detects: Vec<String> = posts[2..]
        .iter()
        .map(|(_, b, _)| {
            serde_json::from_slice::<Value>(b).unwrap()["detect"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(detects, ["enter", "exit"]);
    for (headers, body, _) in &posts {
        assert_eq!(
            headers["x-geoshard-signature"],
            format!("sha256={}", hmac_hex(secret, body))
        );
        assert!(headers.contains_key("x-geoshard-event-id"));
    }
    assert_eq!(
        posts[0].0["x-geoshard-event-id"],
        posts[2].0["x-geoshard-event-id"]
    );

    // A webhook nobody answers: each event is tried 1 + 2 times, then listed as failed.
    let dead = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    assert_eq!(
        put_fence(&mut c, "dead", &unit(format!("http://{dead}/x"))).status,
        201
    );
    std::thread::sleep(Duration::from_millis(1500));
    let r = put(
        &mut c,
        "/movers/2.json",
        "&collection=movers",
        &mover(2, "truck", (0.5, 0.5)),
    );
    assert_eq!(r.status, 201);
    wait_for("a failed event", || {
        c.get("/v1/fences/dead/failed").json()["failed"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
    });
    let failed = c.get("/v1/fences/dead/failed").json();
    assert_eq!(failed["failed"][0]["uri"], "/movers/2.json", "{failed}");
    assert_eq!(failed["failed"][0]["detect"], "enter", "{failed}");
    let metrics = c.get("/metrics").text();
    let count = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0)
    };
    // At least these (the metrics are the process's, and other tests run beside this one).
    assert!(
        count("geoshard_fence_webhook_failed_total") >= 1,
        "{metrics}"
    );
    assert!(
        count("geoshard_fence_webhook_retries_total") >= 4,
        "retries: 2 + 2"
    );
}

#[test]
fn no_event_lost_or_repeated_across_kills() {
    let dir = temp_dir("fences-kill");
    seed_users(&dir);
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let fences = fences(&mut rng);
    let walks = walk(&mut rng, 12, 30);
    let mut srv = ChildServer::start(dir.path(), &[]);
    let mut c = srv.client(GEO);
    point_layer(&mut c, "Fleet", "movers");
    define(&mut c, &fences);
    drop(c);
    // Each round writes ten steps of the walk, then the server is killed with SIGKILL.
    let mut seen: Vec<(String, Vec<(u64, Value)>)> = fences
        .iter()
        .map(|f| (f.name.clone(), Vec::new()))
        .collect();
    for round in 0..3 {
        let part: Vec<Vec<Option<Mover>>> = walks
            .iter()
            .map(|w| w[round * 10..round * 10 + 10].to_vec())
            .collect();
        run_walk(srv.addr, &part, 1);
        // Read what is new since the last id each fence's reader saw, as a client resumes.
        let so_far: Vec<Vec<Option<Mover>>> = walks
            .iter()
            .map(|w| w[..round * 10 + 10].to_vec())
            .collect();
        let want = expected(&fences, &so_far);
        for (i, f) in fences.iter().enumerate() {
            let total: usize = want
                .iter()
                .filter(|((n, _), _)| n == &f.name)
                .map(|(_, v)| v.len())
                .sum();
            let last = seen[i].1.last().map_or(0, |(n, _)| *n);
            let missing = total.saturating_sub(seen[i].1.len());
            let more = read_events(
                srv.addr,
                GEO,
                &format!("/v1/fences/{}/events", f.name),
                Some(last),
                missing,
                Duration::from_millis(200),
            );
            seen[i].1.extend(more);
        }
        assert_ids_increase(&seen);
        assert_same(&want, &got(&seen));
        srv.kill();
        srv = ChildServer::start(dir.path(), &[]);
    }
    srv.stop();
}

#[test]
fn in_a_cluster_events_are_published_on_nats_once_each() {
    use crate::cluster::{Nats, SECRET, wait_ready};
    let nats = Nats::start("fences-nats");
    let name = "fenced";
    let dirs = [temp_dir("fences-node-a"), temp_dir("fences-node-b")];
    let nodes: Vec<ChildServer> = dirs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            seed_users(d.path());
            let urls = nats.urls(i);
            let node = format!("n{i}");
            let s = ChildServer::start(
                d.path(),
                &[
                    ("GEOSHARD_CLUSTER", urls.as_str()),
                    ("GEOSHARD_CLUSTER_SECRET", SECRET),
                    ("GEOSHARD_NODE", node.as_str()),
                    ("GEOSHARD_CLUSTER_NAME", name),
                ],
            );
            wait_ready(&s);
            s
        })
        .collect();
    let mut a = nodes[0].client(GEO);
    point_layer(&mut a, "Fleet", "movers");
    let unit = json!({"service": "Fleet", "layer": 0, "detect": ["enter", "exit"],
        "geometry": {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 1], [0, 0]]]}});
    let r = put_fence(&mut a, "unit", &unit);
    assert_eq!(r.status, 201, "{}", r.text());
    // Written through the other node: each node decides the same events.
    let mut b = nodes[1].client(GEO);
    let after = crate::cluster::sequence(&r);
    let mut last = after;
    for at in [(0.5, 0.5), (2.0, 2.0), (0.25, 0.75)] {
        let r = b.request(
            "PUT",
            &format!(
                "/v1/documents?uri={}&collection=movers",
                enc("/movers/1.json")
            ),
            &[
                ("X-Geoshard-After", last.to_string().as_str()),
                ("Content-Type", "application/json"),
            ],
            mover(1, "truck", at).to_string().as_bytes(),
        );
        assert!(r.status == 201 || r.status == 204, "{}", r.text());
        last = crate::cluster::sequence(&r);
    }
    let want = ["enter", "exit", "enter"];
    for node in &nodes {
        let got = read_events(
            node.addr,
            GEO,
            "/v1/fences/unit/events",
            Some(0),
            3,
            Duration::from_millis(300),
        );
        let kinds: Vec<&str> = got
            .iter()
            .map(|(_, e)| e["detect"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, want, "node {}", node.addr);
    }
    // On NATS: each event once, in order, though both nodes published it.
    let stream = format!("GEOSHARD_{}_EVENTS", name.to_uppercase());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let published: Vec<(String, Value)> = rt.block_on(async {
        let client = async_nats::connect(nats.urls(0).split(',').collect::<Vec<_>>().as_slice())
            .await
            .unwrap();
        let js = async_nats::jetstream::new(client);
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let mut s = js.get_stream(&stream).await.unwrap();
            let n = s.info().await.unwrap().state.messages;
            if n >= 3 || Instant::now() > until {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Both nodes have published by now; let a late duplicate arrive if one would.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let s = js.get_stream(&stream).await.unwrap();
        let mut out = Vec::new();
        let mut seq = 1;
        while let Ok(m) = s.get_raw_message(seq).await {
            out.push((
                m.subject.to_string(),
                serde_json::from_slice(&m.payload).unwrap(),
            ));
            seq += 1;
        }
        out
    });
    let kinds: Vec<&str> = published
        .iter()
        .map(|(_, e)| e["detect"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, want, "{published:?}");
    assert!(
        published
            .iter()
            .all(|(s, _)| s == &format!("geoshard-events.{name}.unit"))
    );
    for n in nodes {
        n.stop();
    }
}

/// Many fences in one `POST`: all or none, bounded by `max_fences`, and they make events.
#[test]
fn fences_are_defined_in_bulk() {
    let srv = TestServer::start_with(|c| c.max_fences = 5);
    let mut c = srv.client(GEO);
    point_layer(&mut c, "Fleet", "movers");
    let boxed = |name: &str, x: f64| {
        json!({"name": name, "service": "Fleet", "layer": 0, "geometry": {"type": "Polygon",
            "coordinates": [[[x, 0.0], [x + 1.0, 0.0], [x + 1.0, 1.0], [x, 1.0], [x, 0.0]]]}})
    };
    let post = |c: &mut Client, list: Vec<Value>| {
        c.post_json("/v1/fences", &json!({ "fences": list }).to_string())
    };
    let r = post(
        &mut c,
        vec![boxed("a", 0.0), boxed("b", 2.0), boxed("c", 4.0)],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"defined": 3, "created": 3, "replaced": 0}));
    let listed = c.get("/v1/fences").json();
    let names: Vec<&str> = listed["fences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert_eq!(c.get("/v1/fences/b").json()["owner"], "geo");

    // One wrong fence: a 400 that names it, and none of the list is defined.
    let mut wrong = boxed("e", 6.0);
    wrong["detect"] = json!(["arrive"]);
    let r = post(&mut c, vec![boxed("d", 8.0), wrong]);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.error().2.contains("fences[1] (e)"), "{}", r.text());
    assert_eq!(c.get("/v1/fences/d").status, 404);
    let r = post(&mut c, vec![boxed("d", 8.0), boxed("d", 9.0)]);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.error().2.contains("named twice"), "{}", r.text());
    let r = post(&mut c, vec![json!({"service": "Fleet"})]);
    assert_eq!(r.status, 400, "{}", r.text());
    let r = c.post_json("/v1/fences", "[]");
    assert_eq!(r.status, 400, "{}", r.text());

    // max_fences counts the new ones; a replaced fence is not new.
    let r = post(
        &mut c,
        vec![boxed("d", 8.0), boxed("e", 10.0), boxed("f", 12.0)],
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.error().2.contains("max_fences is 5"), "{}", r.text());
    assert_eq!(c.get("/v1/fences/d").status, 404);
    let r = post(&mut c, vec![boxed("a", 20.0), boxed("d", 8.0)]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"defined": 2, "created": 1, "replaced": 1}));

    // Only the services' writers define fences.
    let mut reader = srv.client(GEO_READER);
    assert_eq!(post(&mut reader, vec![boxed("f", 12.0)]).status, 403);

    // The fences defined in bulk make events: "a" now lies at x 20..21.
    for at in [(20.5, 0.5), (2.5, 0.5)] {
        move_to(&mut c, "truck", at);
    }
    for (fence, want) in [("a", ["enter", "exit"]), ("b", ["enter", "exit"])] {
        let path = format!("/v1/fences/{fence}/events?after=0");
        let n = if fence == "a" { 2 } else { 1 };
        let events = read_events(srv.addr, GEO, &path, None, n, Duration::from_millis(300));
        let kinds: Vec<&str> = events
            .iter()
            .map(|(_, e)| e["detect"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, want[..n], "{fence}");
    }
}

/// A reader resuming from before what retention keeps is told which ids are gone, then gets
/// the kept ones.
#[test]
fn a_reader_past_retention_is_told_what_was_trimmed() {
    let srv = TestServer::start_with(|c| c.event_retention_bytes = 300);
    let mut c = srv.client(GEO);
    point_layer(&mut c, "Fleet", "movers");
    let area = json!({"service": "Fleet", "layer": 0, "geometry": {"type": "Polygon",
        "coordinates": [[[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0], [0.0, 0.0]]]}});
    assert_eq!(put_fence(&mut c, "yard", &area).status, 201);
    for i in 0..6 {
        let at = if i % 2 == 0 { (0.5, 0.5) } else { (2.0, 0.5) };
        move_to(&mut c, "truck", at);
    }
    let mut s = TcpStream::connect(srv.addr).unwrap();
    write!(
        s,
        "GET /v1/fences/yard/events?after=0 HTTP/1.1\r\nHost: t\r\nAuthorization: Basic {}\r\n\r\n",
        base64(&format!("{}:{}", GEO.0, GEO.1))
    )
    .unwrap();
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut text = Vec::new();
    let end = Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 8192];
    while Instant::now() < end && !String::from_utf8_lossy(&text).contains("id: 6\n") {
        if let Ok(n) = std::io::Read::read(&mut s, &mut buf) {
            text.extend_from_slice(&buf[..n]);
        }
    }
    let text = String::from_utf8_lossy(&text).to_string();
    let notice = text
        .split("event: trimmed\ndata: ")
        .nth(1)
        .and_then(|t| t.split('\n').next())
        .unwrap_or_else(|| panic!("no trimmed notice: {text}"));
    let notice: Value = serde_json::from_str(notice).unwrap();
    assert_eq!(notice["from"], 1, "{text}");
    let through = notice["through"].as_u64().unwrap();
    assert!((1..6).contains(&through), "{text}");
    // The kept events follow, from the one after the trimmed ones to the last.
    let ids: Vec<u64> = text
        .lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .map(|v| v.parse().unwrap())
        .collect();
    assert_eq!(ids, ((through + 1)..=6).collect::<Vec<_>>(), "{text}");
    assert!(text.find("event: trimmed") < text.find("\nid: "), "{text}");
}
