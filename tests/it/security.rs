//! Security properties, each over real HTTP: Digest replay after nonce eviction,
//! nonces that live while in use, exact Digest URIs, the last admin, user names, and DELETE
//! as an existence oracle. Digest responses come from the independent `digest_auth` crate.

use crate::common;

use common::*;
use serde_json::json;

fn put_with(c: &mut Client, uri: &str, auth: &str, body: &str) -> Response {
    c.send(
        "PUT",
        uri,
        &[
            ("Content-Type".into(), "application/json".into()),
            ("Authorization".into(), auth.into()),
        ],
        body.as_bytes(),
    )
}

/// With a small nonce table, a captured admin PUT was replayed after
/// other requests pushed its nonce out. Now neither the admin's own later nonces nor another
/// user's flood make it pass again.
#[test]
fn nonce_eviction_replay() {
    let srv = TestServer::start_with(|c| {
        c.nonce_capacity = 32;
        c.nonce_per_user = 4;
    });
    let mut admin = srv.client(ADMIN);
    let r = admin.post_json(
        "/manage/v2/users",
        &json!({"user-name": "plain", "password": "plain-pw", "role": []}).to_string(),
    );
    assert!(r.status == 201 || r.status == 204, "{}", r.text());
    let mut raw = srv.anonymous();
    let target = "/v1/documents?uri=/replay.json";
    let mut ch = challenge(&mut raw);
    let captured = authorization(&mut ch, ADMIN, "PUT", target);
    let r = put_with(&mut raw, target, &captured, r#"{"v":"original"}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    let replay = |raw: &mut Client| {
        let r = put_with(raw, target, &captured, r#"{"v":"replayed"}"#);
        assert_eq!(r.status, 401, "a replay was accepted: {}", r.text());
        r
    };
    // Straight away: a replayed nc.
    replay(&mut raw);
    // Another user's flood of fresh nonces.
    for _ in 0..400 {
        let mut ch = challenge(&mut raw);
        let a = authorization(&mut ch, ("plain", "plain-pw"), "GET", "/v1/ping");
        let r = raw.send("GET", "/v1/ping", &[("Authorization".into(), a)], b"");
        assert_eq!(r.status, 204);
    }
    replay(&mut raw);
    // The admin's own other clients push the nonce out of the admin's places: its highest
    // nc goes with it, so the replay is still refused, and not as stale (a client
    // would only retry it).
    for _ in 0..10 {
        let mut ch = challenge(&mut raw);
        let a = authorization(&mut ch, ADMIN, "GET", "/v1/ping");
        let r = raw.send("GET", "/v1/ping", &[("Authorization".into(), a)], b"");
        assert_eq!(r.status, 204);
    }
    let r = replay(&mut raw);
    let digest = r.headers_named("www-authenticate")[0];
    assert!(!digest.contains("stale=true"), "{digest}");
    let doc = admin.get("/v1/documents?uri=/replay.json").json();
    assert_eq!(doc, json!({"v": "original"}));
    // The client that owns the nonce goes on with its next nc, as a client that never asks
    // for a new nonce does.
    let next = authorization(&mut ch, ADMIN, "PUT", target);
    let r = put_with(&mut raw, target, &next, r#"{"v":"next"}"#);
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(
        admin.get("/v1/documents?uri=/replay.json").json(),
        json!({"v": "next"})
    );
}

/// A client that keeps using its first nonce (the Node client does) is not cut off when the
/// nonce's first-use limit passes, nor after a quiet spell past the idle limit; only the
/// nonce's lifetime ends it.
#[test]
fn a_nonce_in_use_outlives_its_first_use_limit() {
    let srv = TestServer::start_with(|c| {
        c.nonce_ttl_secs = 1;
        c.nonce_idle_secs = 2;
        c.nonce_lifetime_secs = 9;
    });
    let mut raw = srv.anonymous();
    let mut ch = challenge(&mut raw);
    let ping = |raw: &mut Client, ch: &mut digest_auth::WwwAuthenticateHeader| {
        let a = authorization(ch, READER, "GET", "/v1/ping");
        raw.send("GET", "/v1/ping", &[("Authorization".into(), a)], b"")
    };
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_millis(3500) {
        assert_eq!(ping(&mut raw, &mut ch).status, 204);
        std::thread::sleep(std::time::Duration::from_millis(400));
    }
    // Idle past the idle limit: out of memory, into the store, and still good.
    std::thread::sleep(std::time::Duration::from_millis(3100));
    assert_eq!(ping(&mut raw, &mut ch).status, 204);
    // Past its lifetime: stale, so the client asks for a new one.
    while started.elapsed() < std::time::Duration::from_millis(10_500) {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let r = ping(&mut raw, &mut ch);
    assert_eq!(r.status, 401);
    assert!(r.headers_named("www-authenticate")[0].contains("stale=true"));
}

/// The digest covers the whole request target: one computed for the path alone does not
/// authenticate a request with a query.
#[test]
fn a_digest_of_the_path_alone_is_refused() {
    let srv = TestServer::start();
    let mut admin = srv.client(ADMIN);
    assert_eq!(
        admin.put_json("/v1/documents?uri=/a.json", "{}").status,
        201
    );
    let mut raw = srv.anonymous();
    let mut ch = challenge(&mut raw);
    let a = authorization(&mut ch, ADMIN, "DELETE", "/v1/documents");
    let r = raw.send(
        "DELETE",
        "/v1/documents?uri=/a.json",
        &[("Authorization".into(), a)],
        b"",
    );
    assert_eq!(r.status, 401);
    assert_eq!(admin.get("/v1/documents?uri=/a.json").status, 200);
    let a = authorization(&mut ch, ADMIN, "DELETE", "/v1/documents?uri=/a.json");
    let r = raw.send(
        "DELETE",
        "/v1/documents?uri=/a.json",
        &[("Authorization".into(), a)],
        b"",
    );
    assert_eq!(r.status, 204);
    assert_eq!(admin.get("/v1/documents?uri=/a.json").status, 404);
}

/// The last admin cannot demote or remove itself; with a second admin it can. User names
/// with `/` (a path separator of the management API) or control characters are refused.
#[test]
fn the_last_admin_stays_and_names_are_checked() {
    let srv = TestServer::start();
    let mut admin = srv.client(ADMIN);
    let demote = json!({"role": ["rest-reader"]}).to_string();
    let r = admin.request(
        "PUT",
        "/manage/v2/users/admin/properties",
        &[("Content-Type", "application/json")],
        demote.as_bytes(),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.error().2.contains("last admin"), "{}", r.text());
    let r = admin.delete("/manage/v2/users/admin");
    assert_eq!(r.status, 400, "{}", r.text());
    // Still an admin.
    assert_eq!(admin.get("/manage/v2/users").status, 200);
    for bad in ["a/b", "/", "tab\there", "new\nline"] {
        let r = admin.post_json(
            "/manage/v2/users",
            &json!({"user-name": bad, "password": "p", "role": []}).to_string(),
        );
        assert_eq!(r.status, 400, "{bad:?}: {}", r.text());
    }
    // With a second admin, the first may step down, and then the second is the last.
    let r = admin.post_json(
        "/manage/v2/users",
        &json!({"user-name": "admin2", "password": "pw2", "role": ["admin"]}).to_string(),
    );
    assert!(r.status == 201 || r.status == 204, "{}", r.text());
    let r = admin.request(
        "PUT",
        "/manage/v2/users/admin/properties",
        &[("Content-Type", "application/json")],
        demote.as_bytes(),
    );
    assert_eq!(r.status, 204, "{}", r.text());
    let mut admin2 = srv.client(("admin2", "pw2"));
    assert_eq!(admin2.delete("/manage/v2/users/admin2").status, 400);
    assert_eq!(admin2.delete("/manage/v2/users/admin").status, 204);
}

/// DELETE of a document the caller cannot read answers as for an absent one, so it tells
/// nothing of what exists; a caller who can read but not update gets a 403.
#[test]
fn delete_is_no_existence_oracle() {
    let srv = TestServer::start();
    let mut admin = srv.client(ADMIN);
    let perms = |p: &str| format!("&perm:{p}");
    // Readable by geo readers only, updatable by admins only.
    let r = admin.put_json(
        &format!(
            "/v1/documents?uri=/secret.json{}",
            perms("geo-data-services-reader=read")
        ),
        r#"{"s":1}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let mut writer = srv.client(WRITER);
    let hidden = writer.delete("/v1/documents?uri=/secret.json");
    let absent = writer.delete("/v1/documents?uri=/never-was.json");
    assert_eq!(hidden.status, absent.status);
    assert_eq!(hidden.status, 204);
    assert_eq!(hidden.body, absent.body);
    assert_eq!(admin.get("/v1/documents?uri=/secret.json").status, 200);
    // A caller who can read it learns nothing new from a 403.
    let r = admin.post_json(
        "/manage/v2/users",
        &json!({"user-name": "gr", "password": "gr-pw",
                "role": ["geo-data-services-reader", "rest-writer"]})
        .to_string(),
    );
    assert!(r.status == 201 || r.status == 204, "{}", r.text());
    let mut reader = srv.client(("gr", "gr-pw"));
    assert_eq!(reader.delete("/v1/documents?uri=/secret.json").status, 403);
    assert_eq!(admin.get("/v1/documents?uri=/secret.json").status, 200);
}
