//! Overload and slow clients: past `max_connections` a 503 at once while `/health`
//! and admins still get in; request heads and bodies slower than their minimum get a 408 and
//! a closed connection; an answer given before the body was read keeps the connection (or
//! says it closes); failed authentications are throttled with a 429; and queries stop at
//! `query_time_limit_ms`.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

/// Everything the server sends on `s` until it closes (or `limit` passes).
fn read_until_closed(s: &mut TcpStream, limit: Duration) -> (String, bool) {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break false;
            }
            Err(_) => break true,
        }
    };
    (String::from_utf8_lossy(&out).into_owned(), closed)
}

fn body_of(answer: &str) -> serde_json::Value {
    let (_, body) = answer.split_once("\r\n\r\n").expect("a complete answer");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer:?}"))
}

/// Past `max_connections` new clients hung until their own timeout, and
/// 5,000 idle connections kept `/health` unreachable. Now the reserve serves `/health` and
/// admins, idle connections in it give way to new ones, and past it a 503 comes at once.
#[test]
fn connection_exhaustion_answers_503_and_keeps_health() {
    let srv = TestServer::start_with(|c| {
        c.max_connections = 20;
        c.reserve_connections = 2;
        c.io_threads = 1;
    });
    // Twenty clients hold every ordinary connection, and two more the reserve, all idle.
    let mut held: Vec<TcpStream> = (0..22)
        .map(|_| TcpStream::connect(srv.addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // /health and an admin still get in, each in place of an idle reserve connection.
    let mut health = srv.anonymous();
    let r = health.get("/health");
    assert_eq!(r.status, 200, "{}", r.text());
    let mut admin = srv.client(ADMIN);
    assert_eq!(admin.get("/manage/v2/users").status, 200);
    let mut closed = 0;
    for s in held[20..].iter_mut() {
        closed += usize::from(read_until_closed(s, Duration::from_millis(500)).1);
    }
    assert_eq!(
        closed, 2,
        "the idle reserve connections were closed for them"
    );
    // Anyone else on the reserve is turned away with a 503.
    let mut writer = srv.client(WRITER);
    let r = writer.get("/v1/ping");
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.header("connection"), Some("close"));
    assert_eq!(r.error().1, "RESTAPI-UNAVAILABLE");
    drop(writer);
    // Two admin requests in flight on the reserve (bodies still arriving): no place can be
    // taken, so the next client gets a 503 at once, and a closed socket.
    let busy: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = TcpStream::connect(srv.addr).unwrap();
            let head = format!(
                "PUT /v1/documents?uri=/slow.json HTTP/1.1\r\nHost: x\r\nAuthorization: \
                 Basic {}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{",
                base64("admin:admin-pw")
            );
            s.write_all(head.as_bytes()).unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let mut s = TcpStream::connect(srv.addr).unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let (answer, closed) = read_until_closed(&mut s, Duration::from_secs(5));
    let took = started.elapsed();
    assert!(answer.starts_with("HTTP/1.1 503 "), "{answer:?}");
    assert!(answer.contains("retry-after: 1\r\n"), "{answer:?}");
    assert!(closed, "the turned-away connection is closed");
    assert!(took < Duration::from_millis(1000), "answered in {took:?}");
    assert_eq!(body_of(&answer)["errorResponse"]["statusCode"], 503);
    // Freed places serve ordinary clients again.
    drop(busy);
    drop(health);
    drop(admin);
    held.truncate(10);
    std::thread::sleep(Duration::from_millis(300));
    let mut writer = srv.client(WRITER);
    assert_eq!(writer.get("/v1/ping").status, 204);
    drop(held);
}

/// A request head that arrives too slowly, or not at all, gets a 408 and a closed connection
/// within the head timeout (plus the watchdog's tick).
#[test]
fn a_slow_head_is_answered_408_and_closed() {
    let srv = TestServer::start_with(|c| {
        c.header_timeout_secs = 1;
        c.idle_timeout_secs = 30;
    });
    // Trickled, a byte every 300 ms.
    let started = Instant::now();
    let mut s = TcpStream::connect(srv.addr).unwrap();
    let head = b"GET /health HTTP/1.1\r\nHost: slow\r\nX-Slow: yes\r\n\r\n";
    s.set_nonblocking(false).unwrap();
    let mut sent = 0;
    let mut answer = String::new();
    while sent < head.len() && started.elapsed() < Duration::from_secs(10) {
        if s.write_all(&head[sent..sent + 1]).is_err() {
            break;
        }
        sent += 1;
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut buf = [0u8; 2048];
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                answer.push_str(&String::from_utf8_lossy(&buf[..n]));
                break;
            }
            Err(_) => {}
        }
    }
    let (rest, closed) = read_until_closed(&mut s, Duration::from_secs(3));
    answer.push_str(&rest);
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer:?}");
    assert!(closed);
    assert!(sent < head.len(), "the whole head got through");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(body_of(&answer)["errorResponse"]["statusCode"], 408);
    // A connection that sends nothing at all.
    let started = Instant::now();
    let mut silent = TcpStream::connect(srv.addr).unwrap();
    let (answer, closed) = read_until_closed(&mut silent, Duration::from_secs(5));
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer:?}");
    assert!(closed && started.elapsed() < Duration::from_secs(3));
    // A keep-alive connection between requests is idle, not slow: it is not cut at 1 s.
    let mut c = srv.anonymous();
    assert_eq!(c.get("/health").status, 200);
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(c.get("/health").status, 200);
    assert_eq!(c.connects, 1);
}

/// A body trickled at a byte every few seconds kept its connection for
/// as long as the client liked. Now it is a 408 within the grace plus what its bytes earned,
/// and nothing is stored.
#[test]
fn a_slow_body_is_answered_408_and_closed() {
    let srv = TestServer::start_with(|c| {
        c.header_timeout_secs = 1;
        c.body_min_bytes_per_sec = 100;
    });
    let body = vec![b' '; 1000];
    let head = format!(
        "PUT /v1/documents?uri=/slow.json HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{{",
        base64(&format!("{}:{}", WRITER.0, WRITER.1)),
        body.len() + 2
    );
    let started = Instant::now();
    let mut s = TcpStream::connect(srv.addr).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    let mut answer = String::new();
    for _ in 0..40 {
        if s.write_all(b" ").is_err() {
            break;
        }
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut buf = [0u8; 2048];
        if let Ok(n) = s.read(&mut buf)
            && n > 0
        {
            answer.push_str(&String::from_utf8_lossy(&buf[..n]));
            break;
        }
    }
    let (rest, closed) = read_until_closed(&mut s, Duration::from_secs(3));
    answer.push_str(&rest);
    let took = started.elapsed();
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer:?}");
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer:?}"
    );
    assert!(closed);
    assert!(took < Duration::from_secs(5), "{took:?}");
    let message = body_of(&answer)["errorResponse"]["message"].clone();
    assert!(
        message
            .as_str()
            .unwrap()
            .contains("body_min_bytes_per_sec (100"),
        "{message}"
    );
    assert_eq!(
        srv.client(READER)
            .get("/v1/documents?uri=/slow.json")
            .status,
        404
    );
}

/// An answer given before the body was read (a 401 challenge, a 400 on
/// a parameter) closed the connection without saying so, and a client reusing it failed.
/// Now bodies up to 1 MiB are drained and the connection is kept; past that, or behind an
/// unanswered `Expect: 100-continue`, the answer says `Connection: close`.
#[test]
fn early_answers_keep_or_close_the_connection_explicitly() {
    let srv = TestServer::start();
    let body = vec![b'x'; 100 * 1024];
    let mut c = srv.anonymous();
    for round in 0..20 {
        // No credentials: a 401 before the body is read. Then a bad parameter: a 400.
        let r = c.send("PUT", "/v1/documents?uri=/a.json", &[], &body);
        assert_eq!(r.status, 401, "round {round}");
        assert_eq!(r.header("connection"), None);
        let r = c.send(
            "PUT",
            "/v1/documents?uri=/a.json&nonsense=1",
            &[(
                "Authorization".into(),
                format!("Basic {}", base64("writer:writer-pw")),
            )],
            &body,
        );
        assert_eq!(r.status, 400, "round {round}: {}", r.text());
        assert_eq!(r.header("connection"), None);
    }
    assert_eq!(c.connects, 1, "every answer kept the connection");
    // Past the drain bound: the answer says the connection closes.
    let big = vec![b'x'; 3 * 1024 * 1024];
    let r = c.send("PUT", "/v1/documents?uri=/a.json", &[], &big);
    assert_eq!(r.status, 401);
    assert_eq!(r.header("connection"), Some("close"));
    // Expect: 100-continue, refused before the body was asked for: not sent, not waited for.
    let mut s = TcpStream::connect(srv.addr).unwrap();
    s.write_all(
        b"PUT /v1/documents?uri=/b.json HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\
          Content-Length: 500000\r\n\r\n",
    )
    .unwrap();
    let (answer, closed) = read_until_closed(&mut s, Duration::from_secs(5));
    assert!(answer.starts_with("HTTP/1.1 401 "), "{answer:?}");
    assert!(answer.contains("connection: close\r\n"), "{answer:?}");
    assert!(closed);
}

/// Failed authentications are throttled per client address and per user: past the limit,
/// a 429 with Retry-After, even with the right password, until the minute is over.
#[test]
fn failed_authentications_are_throttled() {
    let srv = TestServer::start_with(|c| {
        c.auth_failures_per_address = 5;
        c.auth_failures_per_user = 0;
    });
    let mut wrong = Client::new(srv.addr, Auth::Digest(READER.0.into(), "wrong".into()));
    for _ in 0..5 {
        assert_eq!(wrong.get("/v1/ping").status, 401);
    }
    let r = wrong.get("/v1/ping");
    assert_eq!(r.status, 429, "{}", r.text());
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    assert_eq!(r.error().1, "SEC-TOOMANYFAILURES");
    // Every user from this address, right password or not.
    let r = srv.client(ADMIN).get("/v1/ping");
    assert_eq!(r.status, 429);
    // Health needs no credentials and is not throttled.
    assert_eq!(srv.anonymous().get("/health").status, 200);

    // By user, from anywhere: the user is refused, other users are not.
    let srv = TestServer::start_with(|c| {
        c.auth_failures_per_address = 0;
        c.auth_failures_per_user = 3;
    });
    let mut wrong = Client::new(srv.addr, Auth::Basic(READER.0.into(), "wrong".into()));
    for _ in 0..3 {
        assert_eq!(wrong.get("/v1/ping").status, 401);
    }
    assert_eq!(srv.client(READER).get("/v1/ping").status, 429);
    assert_eq!(srv.client(WRITER).get("/v1/ping").status, 204);
    // Made-up names are not counted by name (the address limit is what stops them).
    let mut nobody = Client::new(srv.addr, Auth::Basic("nobody".into(), "x".into()));
    for _ in 0..10 {
        assert_eq!(nobody.get("/v1/ping").status, 401);
    }
}

/// A query past `query_time_limit_ms` is a 503 naming the limit; quick ones still answer.
#[test]
fn queries_stop_at_their_time_limit() {
    let srv = TestServer::start_with(|c| c.query_time_limit_ms = 1);
    let mut c = srv.client(GEO);
    // The counties, as polygons.
    let template = json!({"template": {"context": "/", "collections": ["c"], "rows": [{
        "schemaName": "t", "viewName": "c", "columns": [
            {"name": "OBJECTID", "scalarType": "int", "val": "id"},
            {"name": "name", "scalarType": "string", "val": "name"}]}]}});
    let tde = enc("http://marklogic.com/xdmp/tde");
    let r = c.put_json(
        &format!("/v1/documents?uri=/t.json&collection={tde}"),
        &template.to_string(),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let descriptor = json!({"info": {"name": "C", "description": "d"}, "layers": [{
        "id": 0, "name": "c", "description": "d", "geometryType": "Polygon",
        "schema": "t", "view": "c",
        "geometry": {"format": "geojson", "coordinateSystem": "wgs84", "xpath": "//geometry"}}]});
    let services = enc("http://marklogic.com/feature-services");
    let r = c.put_json(
        &format!("/v1/documents?uri=/s.json&collection={services}"),
        &descriptor.to_string(),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let text = std::fs::read_to_string(data_dir().join("real/us-counties.geojson")).unwrap();
    let fc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let boundary = "b";
    let mut body = Vec::new();
    for f in fc["features"].as_array().unwrap() {
        let id: i64 = f["id"].as_str().unwrap().parse().unwrap();
        let doc = json!({"id": id, "name": f["properties"]["name"], "geometry": f["geometry"]});
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Type: application/json\r\nContent-Disposition: \
                 attachment; filename=\"/c/{id}.json\"\r\n\r\n{doc}\r\n"
            )
            .as_bytes(),
        );
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    let ct = format!("multipart/mixed; boundary={boundary}");
    let r = c.request(
        "POST",
        "/v1/documents?collection=c",
        &[("Content-Type", ct.as_str())],
        &body,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let query = |c: &mut Client, q: serde_json::Value| {
        c.post_json(
            "/v1/resources/geoQueryService",
            &json!({"params": {"id": "C", "layer": 0, "method": "query"}, "query": q}).to_string(),
        )
    };
    // A polygon over the whole country, intersected exactly with every county.
    let r = query(
        &mut c,
        json!({"returnIdsOnly": true, "spatialRel": "esriSpatialRelIntersects",
               "extension": {"geometry": {"type": "Polygon", "coordinates":
                   [[[-125, 24], [-66, 24], [-66, 50], [-125, 50], [-125, 24.5], [-125, 24]]]}}}),
    );
    assert_eq!(r.status, 503, "{}", r.text());
    let (_, code, message) = r.error();
    assert_eq!(code, "XDMP-EXTIME");
    assert!(message.contains("query_time_limit_ms (1 ms)"), "{message}");
    // A point in one county is quick enough: on a loaded machine a descheduled thread can
    // still pass 1 ms, so one answer in five tries suffices.
    let r = (0..5)
        .map(|_| {
            query(
                &mut c,
                json!({"returnIdsOnly": true,
                       "extension": {"geometry": {"type": "Point", "coordinates": [-104.99, 39.74]}}}),
            )
        })
        .find(|r| r.status != 503)
        .expect("a point query answered within 1 ms in one of five tries");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["objectIds"].as_array().unwrap().len(), 1);
}

/// A burst of new connections waits in the listen queue for the accept loop: with tokio's
/// default queue of 128, one connect in about 150 had its SYN dropped and took a second.
#[test]
fn a_burst_of_connections_is_queued_not_dropped() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    // Client and server share this process: two descriptors a connection.
    let mut limit = getrlimit(Resource::Nofile);
    let room = limit.maximum.unwrap_or(u64::MAX).min(8192);
    if limit.current.is_some_and(|c| c < room) {
        limit.current = Some(room);
        setrlimit(Resource::Nofile, limit).unwrap();
    }
    let burst = ((room as usize).saturating_sub(300) / 2).min(2000);
    assert!(burst >= 500, "only {room} descriptors");
    let srv = TestServer::start();
    let started = Instant::now();
    let mut slow = 0;
    let held: Vec<TcpStream> = (0..burst)
        .map(|_| {
            let t = Instant::now();
            let s = TcpStream::connect(srv.addr).unwrap();
            slow += usize::from(t.elapsed() > Duration::from_millis(500));
            s
        })
        .collect();
    let took = started.elapsed();
    assert_eq!(slow, 0, "{slow} connects waited for a SYN retransmission");
    assert!(took < Duration::from_secs(3), "{took:?}");
    drop(held);
    assert_eq!(srv.anonymous().get("/health").status, 200);
}

/// An answer that closes the connection before the body was read (past the drain bound) still
/// reaches a client that goes on sending: the server shuts its side and reads and drops the
/// rest for a moment (a lingering close) instead of resetting the connection under it. Before,
/// a client sending 8 MB unauthenticated got a broken pipe and never saw the 401.
#[test]
fn a_client_still_sending_gets_the_answer_that_closes() {
    let srv = TestServer::start();
    let body = vec![b'x'; 8 * 1024 * 1024];
    for round in 0..3 {
        let mut s = TcpStream::connect(srv.addr).unwrap();
        s.write_all(
            format!(
                "PUT /v1/documents?uri=/a.json HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .as_bytes(),
        )
        .unwrap();
        s.write_all(&body)
            .unwrap_or_else(|e| panic!("round {round}: the server reset the connection: {e}"));
        let (answer, closed) = read_until_closed(&mut s, Duration::from_secs(5));
        assert!(
            answer.starts_with("HTTP/1.1 401 "),
            "round {round}: {answer:?}"
        );
        assert!(answer.contains("connection: close\r\n"), "{answer:?}");
        assert!(closed);
    }
}
