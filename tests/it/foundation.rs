//! The foundation over real HTTP: authentication, the documents API, permissions, user
//! management, limits, and a restart that keeps every document.

use crate::common;

use common::*;

#[test]
fn health_needs_no_auth_and_everything_else_does() {
    let srv = TestServer::start();
    let mut anon = srv.anonymous();
    let r = anon.get("/health");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["status"], "ok");

    let r = anon.get("/v1/documents?uri=/x.json");
    assert_eq!(r.status, 401);
    let challenges = r.headers_named("www-authenticate");
    assert_eq!(challenges.len(), 2, "{challenges:?}");
    assert!(challenges[0].starts_with("Digest realm=\"public\", qop=\"auth\", nonce=\""));
    assert!(challenges[0].contains("opaque=\""));
    assert_eq!(challenges[1], "Basic realm=\"public\"");
    assert_eq!(
        r.json(),
        serde_json::json!({"errorResponse":{"statusCode":401,"status":"Unauthorized","message":"401 Unauthorized"}})
    );
    // Unknown paths are not revealed before authentication either.
    assert_eq!(anon.get("/nope").status, 401);
    // HEAD /v1/ping: the negotiation request of one official client.
    let r = anon.request("HEAD", "/v1/ping", &[], b"");
    assert_eq!(r.status, 401);
    let mut c = srv.client(READER);
    assert_eq!(c.request("HEAD", "/v1/ping", &[], b"").status, 204);
    assert_eq!(c.get("/v1/ping").status, 204);
}

#[test]
fn digest_and_basic() {
    let srv = TestServer::start();
    let mut c = srv.client(WRITER);
    for i in 0..20 {
        let r = c.put_json(&format!("/v1/documents?uri=/d/{i}.json"), "{\"i\":1}");
        assert_eq!(r.status, 201, "{}", r.text());
    }
    assert_eq!(c.connects, 1, "keep-alive: one connection for all requests");

    let mut basic = Client::new(srv.addr, Auth::Basic(WRITER.0.into(), WRITER.1.into()));
    assert_eq!(basic.get("/v1/documents?uri=/d/1.json").status, 200);
    let mut wrong = Client::new(srv.addr, Auth::Basic(WRITER.0.into(), "nope".into()));
    assert_eq!(wrong.get("/v1/documents?uri=/d/1.json").status, 401);
    let mut wrong = Client::new(srv.addr, Auth::Digest(WRITER.0.into(), "nope".into()));
    assert_eq!(wrong.get("/v1/documents?uri=/d/1.json").status, 401);
    let mut nobody = Client::new(srv.addr, Auth::Digest("nobody".into(), "x".into()));
    assert_eq!(nobody.get("/v1/ping").status, 401);
}

#[test]
fn digest_replay_and_stale_nonce() {
    let srv = TestServer::start_with(|c| {
        c.nonce_ttl_secs = 1;
        c.nonce_idle_secs = 1;
        c.nonce_lifetime_secs = 4;
    });
    let issued = std::time::Instant::now();
    let mut anon = srv.anonymous();
    let r = anon.get("/v1/ping");
    let digest = r.headers_named("www-authenticate")[0].to_string();
    let mut challenge = digest_auth::parse(&digest).unwrap();
    let ctx = digest_auth::AuthContext::new(READER.0, READER.1, "/v1/ping");
    let header = challenge.respond(&ctx).unwrap().to_header_string();
    let h = vec![("Authorization".to_string(), header)];
    assert_eq!(anon.send("GET", "/v1/ping", &h, b"").status, 204);
    // The same nc again is a replay.
    let again = anon.send("GET", "/v1/ping", &h, b"");
    assert_eq!(again.status, 401);
    assert!(!again.headers_named("www-authenticate")[0].contains("stale=true"));
    // Unused past its idle limit, the nonce is still good with its next nc.
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let header = challenge.respond(&ctx).unwrap().to_header_string();
    let r = anon.send("GET", "/v1/ping", &[("Authorization".into(), header)], b"");
    assert_eq!(r.status, 204, "{:?}", r.headers);
    // Past its lifetime, a correct response gets stale=true.
    while issued.elapsed() < std::time::Duration::from_millis(5100) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let header = challenge.respond(&ctx).unwrap().to_header_string();
    let r = anon.send("GET", "/v1/ping", &[("Authorization".into(), header)], b"");
    assert_eq!(r.status, 401);
    assert!(
        r.headers_named("www-authenticate")[0].contains("stale=true"),
        "{:?}",
        r.headers
    );
    // A client that follows stale=true carries on without asking for the password again.
    let mut c = srv.client(READER);
    assert_eq!(c.get("/v1/ping").status, 204);
    std::thread::sleep(std::time::Duration::from_millis(5100));
    assert_eq!(c.get("/v1/ping").status, 204);
}

#[test]
fn documents_create_replace_read_delete() {
    let srv = TestServer::start();
    let mut w = srv.client(WRITER);
    let r = w.put_json("/v1/documents?uri=/a%20b.json&collection=c1", "{\"x\":1}");
    assert_eq!(r.status, 201);
    assert_eq!(r.header("location"), Some("/v1/documents?uri=%2Fa+b.json"));
    assert!(r.body.is_empty());
    let r = w.put_json("/v1/documents?uri=/a%20b.json", "{\"x\":2}");
    assert_eq!(r.status, 204);

    let r = w.get("/v1/documents?uri=/a%20b.json");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.body, b"{\"x\":2}");
    // The update named no collection: the old ones stay.
    let meta = w
        .get("/v1/documents?uri=/a%20b.json&category=metadata")
        .json();
    assert_eq!(meta["collections"], serde_json::json!(["c1"]));
    assert_eq!(
        meta["permissions"],
        serde_json::json!([
            {"role-name": "rest-reader", "capabilities": ["read"]},
            {"role-name": "rest-writer", "capabilities": ["update"]}
        ])
    );
    // Naming collections replaces them.
    w.put_json(
        "/v1/documents?uri=/a%20b.json&collection=c2&collection=c3",
        "{}",
    );
    let colls = w
        .get("/v1/documents?uri=/a%20b.json&category=collections")
        .json();
    assert_eq!(colls, serde_json::json!({"collections": ["c2", "c3"]}));

    // XML and text, by Content-Type, format= and extension.
    let r = w.request(
        "PUT",
        "/v1/documents?uri=/doc.xml",
        &[("Content-Type", "application/xml")],
        b"<a><b>1</b></a>",
    );
    assert_eq!(r.status, 201);
    let r = w.get("/v1/documents?uri=/doc.xml");
    assert_eq!(r.header("content-type"), Some("application/xml"));
    let r = w.request("PUT", "/v1/documents?uri=/t&format=text", &[], b"plain");
    assert_eq!(r.status, 201);
    assert!(
        w.get("/v1/documents?uri=/t")
            .header("content-type")
            .unwrap()
            .starts_with("text/plain")
    );
    let r = w.request("PUT", "/v1/documents?uri=/bin", &[], &[0, 159, 146, 150]);
    assert_eq!(r.status, 201);
    assert_eq!(w.get("/v1/documents?uri=/bin").body, vec![0, 159, 146, 150]);

    // multipart/mixed reply.
    let r = w.request(
        "GET",
        "/v1/documents?uri=/doc.xml",
        &[("Accept", "multipart/mixed")],
        b"",
    );
    assert!(
        r.header("content-type")
            .unwrap()
            .starts_with("multipart/mixed; boundary=")
    );
    assert!(r.text().contains(
        "Content-Disposition: attachment; filename=\"/doc.xml\"; category=content; format=xml"
    ));

    let r = w.delete("/v1/documents?uri=/a%20b.json");
    assert_eq!(r.status, 204);
    let r = w.get("/v1/documents?uri=/a%20b.json");
    assert_eq!(r.status, 404);
    let (_, code, message) = r.error();
    assert_eq!(code, "RESTAPI-NODOCUMENT");
    assert!(message.contains("/a b.json"), "{message}");
}

#[test]
fn chunked_request_body() {
    let srv = TestServer::start();
    let mut w = srv.client(WRITER);
    assert_eq!(w.get("/v1/ping").status, 204); // settle the Digest challenge
    let auth = {
        // A second client shares nothing; compute a fresh Authorization by doing one request.
        let mut probe = srv.anonymous();
        let r = probe.get("/v1/documents");
        let mut ch = digest_auth::parse(r.headers_named("www-authenticate")[0]).unwrap();
        let ctx = digest_auth::AuthContext::new_with_method(
            WRITER.0,
            WRITER.1,
            "/v1/documents?uri=/chunked.json",
            Option::<&[u8]>::None,
            digest_auth::HttpMethod::PUT,
        );
        ch.respond(&ctx).unwrap().to_header_string()
    };
    let wire = format!(
        "PUT /v1/documents?uri=/chunked.json HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{{\"a\"\r\n3\r\n:1}}\r\n0\r\n\r\n"
    );
    let r = srv.anonymous().send_raw(wire.as_bytes(), false);
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(w.get("/v1/documents?uri=/chunked.json").body, b"{\"a\":1}");
}

#[test]
fn bad_requests_have_contract_errors() {
    let srv = TestServer::start();
    let mut w = srv.client(WRITER);
    // (method, target, content type, body, status, messageCode, a word of the message)
    type Case<'a> = (&'a str, &'a str, &'a str, &'a [u8], u16, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (
            "PUT",
            "/v1/documents",
            "application/json",
            b"{}",
            400,
            "REST-REQUIREDPARAM",
            "uri",
        ),
        (
            "PUT",
            "/v1/documents?uri=/a.json&bogus=1",
            "application/json",
            b"{}",
            400,
            "REST-UNSUPPORTEDPARAM",
            "bogus",
        ),
        (
            "PUT",
            "/v1/documents?uri=/a.json&perm:superuser=read",
            "application/json",
            b"{}",
            400,
            "REST-INVALIDPARAM",
            "Role superuser does not exist",
        ),
        (
            "PUT",
            "/v1/documents?uri=/a.json&perm:rest-reader=fly",
            "application/json",
            b"{}",
            400,
            "REST-INVALIDPARAM",
            "fly",
        ),
        (
            "PUT",
            "/v1/documents?uri=/a.json&format=pdf",
            "application/json",
            b"{}",
            400,
            "REST-INVALIDPARAM",
            "pdf",
        ),
        (
            "PUT",
            "/v1/documents?uri=/a.json",
            "application/json",
            b"{\"a\":",
            400,
            "XDMP-JSONDOC",
            "JSON",
        ),
        (
            "PUT",
            "/v1/documents?uri=/a.xml",
            "application/xml",
            b"<a><b></a>",
            400,
            "XDMP-DOCROOTTEXT",
            "XML",
        ),
        (
            "PUT",
            "/v1/documents?uri=/a.json&transform=no-such",
            "application/json",
            b"{}",
            400,
            "REST-INVALIDPARAM",
            "no-such",
        ),
        (
            "PUT",
            "/v1/documents?uri=/a.json",
            "multipart/mixed; boundary=x",
            b"{}",
            415,
            "RESTAPI-INVALIDMIMETYPE",
            "multipart",
        ),
        (
            "GET",
            "/v1/documents",
            "",
            b"",
            400,
            "REST-REQUIREDPARAM",
            "uri",
        ),
        (
            "GET",
            "/v1/documents?uri=/a.json&category=nope",
            "",
            b"",
            400,
            "REST-INVALIDPARAM",
            "nope",
        ),
        (
            "GET",
            "/nowhere",
            "",
            b"",
            404,
            "RESTAPI-INVALIDREQ",
            "/nowhere",
        ),
        (
            "PATCH",
            "/v1/documents?uri=/a.json",
            "application/json",
            b"{}",
            405,
            "REST-UNSUPPORTEDMETHOD",
            "PATCH",
        ),
        (
            "DELETE",
            "/v1/ping",
            "",
            b"",
            405,
            "REST-UNSUPPORTEDMETHOD",
            "DELETE",
        ),
    ];
    for (method, target, ctype, body, status, code, needle) in cases {
        let headers: Vec<(&str, &str)> = if ctype.is_empty() {
            vec![]
        } else {
            vec![("Content-Type", ctype)]
        };
        let r = w.request(method, target, &headers, body);
        assert_eq!(r.status, status, "{method} {target}: {}", r.text());
        let (_, got_code, message) = r.error();
        assert_eq!(got_code, code, "{method} {target}");
        assert!(message.contains(needle), "{method} {target}: {message}");
    }
    let r = w.request("DELETE", "/v1/ping", &[], b"");
    assert_eq!(r.header("allow"), Some("GET, HEAD"));
    // Nothing of the failed writes landed.
    assert_eq!(w.get("/v1/documents?uri=/a.json").status, 404);
    assert_eq!(w.get("/v1/documents?uri=/a.xml").status, 404);
}

#[test]
fn body_limit_is_a_413() {
    let srv = TestServer::start_with(|c| c.max_body_bytes = 1000);
    let mut w = srv.client(WRITER);
    let big = format!("{{\"x\":\"{}\"}}", "a".repeat(2000));
    let r = w.put_json("/v1/documents?uri=/big.json", &big);
    assert_eq!(r.status, 413);
    let (_, code, message) = r.error();
    assert_eq!(code, "RESTAPI-REQUESTTOOLARGE");
    assert!(message.contains("1000"), "{message}");
    // A chunked body that grows past the limit is refused too.
    let mut probe = srv.anonymous();
    let ch = probe.get("/v1/documents");
    let mut ch = digest_auth::parse(ch.headers_named("www-authenticate")[0]).unwrap();
    let ctx = digest_auth::AuthContext::new_with_method(
        WRITER.0,
        WRITER.1,
        "/v1/documents?uri=/big2.json",
        Option::<&[u8]>::None,
        digest_auth::HttpMethod::PUT,
    );
    let auth = ch.respond(&ctx).unwrap().to_header_string();
    let mut wire = format!(
        "PUT /v1/documents?uri=/big2.json HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    for _ in 0..3 {
        wire.push_str(&format!("200\r\n{}\r\n", "a".repeat(512)));
    }
    wire.push_str("0\r\n\r\n");
    let r = srv.anonymous().send_raw(wire.as_bytes(), false);
    assert_eq!(r.status, 413);
    assert_eq!(w.get("/v1/documents?uri=/big.json").status, 404);
    // The server still serves normally afterwards.
    assert_eq!(
        w.put_json("/v1/documents?uri=/small.json", "{}").status,
        201
    );
}

#[test]
fn roles_and_document_permissions() {
    let srv = TestServer::start();
    let mut admin = srv.client(ADMIN);
    let mut w = srv.client(WRITER);
    let mut r = srv.client(READER);
    let mut geo = srv.client(GEO_READER);

    // A reader may not write; a writer may.
    let resp = r.put_json("/v1/documents?uri=/p.json", "{}");
    assert_eq!(resp.status, 403);
    assert_eq!(resp.error().1, "SEC-PRIV");
    assert_eq!(w.put_json("/v1/documents?uri=/p.json", "{}").status, 201);
    assert_eq!(r.get("/v1/documents?uri=/p.json").status, 200);

    // A document readable only by the geo reader: invisible (404) to the plain reader; the
    // writer may not replace it (403), and its delete answers as for an absent document
    // (204) without deleting it.
    let resp = admin.put_json(
        "/v1/documents?uri=/geo.json&perm:geo-data-services-reader=read&perm:geo-data-services-writer=update",
        "{\"g\":1}",
    );
    assert_eq!(resp.status, 201);
    assert_eq!(r.get("/v1/documents?uri=/geo.json").status, 404);
    assert_eq!(geo.get("/v1/documents?uri=/geo.json").status, 200);
    let resp = w.put_json("/v1/documents?uri=/geo.json", "{\"g\":2}");
    assert_eq!(resp.status, 403);
    let (_, code, message) = resp.error();
    assert_eq!(code, "SEC-PERMDENIED");
    assert!(message.contains("/geo.json"), "{message}");
    assert_eq!(w.delete("/v1/documents?uri=/geo.json").status, 204);
    assert_eq!(geo.get("/v1/documents?uri=/geo.json").body, b"{\"g\":1}");
    // admin may do everything.
    assert_eq!(admin.delete("/v1/documents?uri=/geo.json").status, 204);
}

#[test]
fn user_management() {
    let srv = TestServer::start();
    let mut admin = srv.client(ADMIN);
    let mut w = srv.client(WRITER);

    let rec = r#"{"user-name":"carol","password":"c-pw","role":["geo-data-services-writer","rest-extension-user"]}"#;
    let resp = w.post_json("/manage/v2/users", rec);
    assert_eq!(resp.status, 403);
    assert_eq!(resp.error().1, "SEC-PRIV");
    let resp = admin.post_json("/manage/v2/users", rec);
    assert_eq!(resp.status, 201, "{}", resp.text());
    assert_eq!(resp.header("location"), Some("/manage/v2/users/carol"));
    assert_eq!(admin.post_json("/manage/v2/users", rec).status, 409);
    let resp = admin.post_json(
        "/manage/v2/users",
        r#"{"user-name":"dave","password":"x","role":["wizard"]}"#,
    );
    assert_eq!(resp.status, 400);
    assert!(resp.error().2.contains("Role wizard does not exist"));
    assert_eq!(admin.post_json("/manage/v2/users", "{not json").status, 400);

    let list = admin.get("/manage/v2/users").json();
    let names: Vec<&str> = list["user-default-list"]["list-items"]["list-item"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["nameref"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"carol") && names.contains(&"admin"),
        "{names:?}"
    );
    assert!(!admin.get("/manage/v2/users").text().contains("c-pw"));

    let mut carol = srv.client(("carol", "c-pw"));
    assert_eq!(carol.get("/v1/ping").status, 204);
    // Password change is effective on the next request, on an open connection too.
    let resp = admin.request(
        "PUT",
        "/manage/v2/users/carol/properties",
        &[("Content-Type", "application/json")],
        br#"{"password":"c-pw-2"}"#,
    );
    assert_eq!(resp.status, 204);
    assert_eq!(carol.get("/v1/ping").status, 401);
    let mut carol2 = srv.client(("carol", "c-pw-2"));
    assert_eq!(carol2.get("/v1/ping").status, 204);
    assert_eq!(
        admin.get("/manage/v2/users/carol").json(),
        serde_json::json!({"user-name":"carol","role":["geo-data-services-writer","rest-extension-user"]})
    );

    assert_eq!(admin.delete("/manage/v2/users/carol").status, 204);
    assert_eq!(carol2.get("/v1/ping").status, 401);
    assert_eq!(admin.delete("/manage/v2/users/carol").status, 404);
}

#[test]
fn restart_keeps_every_document() {
    let srv = TestServer::start();
    let mut w = srv.client(WRITER);
    let mut expected = Vec::new();
    for i in 0..300 {
        let uri = format!("/keep/{i}.json");
        let body = format!("{{\"i\":{i},\"pad\":\"{}\"}}", "z".repeat(i % 50));
        let coll = format!("c{}", i % 3);
        let resp = w.put_json(
            &format!("/v1/documents?uri={}&collection={coll}", enc(&uri)),
            &body,
        );
        assert_eq!(resp.status, 201);
        expected.push((uri, body, coll));
    }
    for (uri, _, _) in expected.iter().step_by(7) {
        assert_eq!(
            w.delete(&format!("/v1/documents?uri={}", enc(uri))).status,
            204
        );
    }
    let dir = srv.stop();

    let srv = TestServer::start_in(&dir, |_| {});
    let mut w = srv.client(WRITER);
    for (i, (uri, body, coll)) in expected.iter().enumerate() {
        let r = w.get(&format!("/v1/documents?uri={}", enc(uri)));
        if i % 7 == 0 {
            assert_eq!(r.status, 404, "{uri} was deleted");
            continue;
        }
        assert_eq!(r.status, 200, "{uri}");
        assert_eq!(r.text(), *body);
        let c = w.get(&format!(
            "/v1/documents?uri={}&category=collections",
            enc(uri)
        ));
        assert_eq!(c.json()["collections"], serde_json::json!([coll]));
    }
}

fn bulk_body(parts: &[(&str, &str, &str)]) -> Vec<u8> {
    // (content-disposition, content-type, body)
    let mut out = String::new();
    for (disp, ctype, body) in parts {
        out.push_str(&format!(
            "--BOUNDARY\r\nContent-Type: {ctype}\r\nContent-Disposition: {disp}\r\n\r\n{body}\r\n"
        ));
    }
    out.push_str("--BOUNDARY--\r\n");
    out.into_bytes()
}

#[test]
fn bulk_writes_are_one_transaction() {
    let srv = TestServer::start();
    let mut w = srv.client(WRITER);
    let ctype = [("Content-Type", "multipart/mixed; boundary=BOUNDARY")];
    let meta_default = r#"{"collections":["bulk"],"permissions":[{"role-name":"rest-reader","capabilities":["read"]},{"role-name":"rest-writer","capabilities":["update"]}]}"#;
    let meta_one = r#"{"collections":["special"]}"#;
    // One malformed document fails the whole request: nothing lands.
    let body = bulk_body(&[
        (
            "inline; category=metadata",
            "application/json",
            meta_default,
        ),
        (
            "attachment; filename=\"/b/1.json\"; category=content",
            "application/json",
            r#"{"n":1}"#,
        ),
        (
            "attachment; filename=\"/b/2.json\"; category=content",
            "application/json",
            r#"{"n":"#,
        ),
    ]);
    let r = w.request("POST", "/v1/documents", &ctype, &body);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.error().2.contains("/b/2.json"));
    assert_eq!(w.get("/v1/documents?uri=/b/1.json").status, 404);

    let body = bulk_body(&[
        (
            "inline; category=metadata",
            "application/json",
            meta_default,
        ),
        (
            "attachment; filename=\"/b/1.json\"; category=content",
            "application/json",
            r#"{"n":1}"#,
        ),
        (
            "attachment; filename=\"/b/2.json\"; category=metadata",
            "application/json",
            meta_one,
        ),
        (
            "attachment; filename=\"/b/2.json\"; category=content",
            "application/json",
            r#"{"n":2}"#,
        ),
        (
            "attachment; filename=\"/b/3.xml\"",
            "application/xml",
            "<n>3</n>",
        ),
    ]);
    let r = w.request("POST", "/v1/documents", &ctype, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["documents"].as_array().unwrap().len(), 3);
    assert_eq!(w.get("/v1/documents?uri=/b/1.json").body, br#"{"n":1}"#);
    assert_eq!(w.get("/v1/documents?uri=/b/3.xml").body, b"<n>3</n>");
    let c = |w: &mut Client, u: &str| {
        w.get(&format!("/v1/documents?uri={u}&category=collections"))
            .json()["collections"]
            .clone()
    };
    assert_eq!(c(&mut w, "/b/1.json"), serde_json::json!(["bulk"]));
    assert_eq!(c(&mut w, "/b/2.json"), serde_json::json!(["special"]));
    assert_eq!(c(&mut w, "/b/3.xml"), serde_json::json!(["bulk"]));

    let r = w.request(
        "POST",
        "/v1/documents",
        &[("Content-Type", "application/json")],
        b"{}",
    );
    assert_eq!(r.status, 415);
    let r = srv
        .client(READER)
        .request("POST", "/v1/documents", &ctype, &body);
    assert_eq!(r.status, 403);
    let bad_role = bulk_body(&[
        (
            "inline; category=metadata",
            "application/json",
            r#"{"permissions":[{"role-name":"boss","capabilities":["read"]}]}"#,
        ),
        (
            "attachment; filename=\"/b/9.json\"",
            "application/json",
            "{}",
        ),
    ]);
    let r = w.request("POST", "/v1/documents", &ctype, &bad_role);
    assert_eq!(r.status, 400);
    assert!(r.error().2.contains("Role boss does not exist"));
}

/// A connection that sends nothing, or never finishes its request head, is closed after the
/// idle timeout; a connection in use keeps working past it.
#[test]
fn idle_and_stalled_connections_are_closed() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Duration;
    let server = TestServer::start_with(|c| c.idle_timeout_secs = 1);
    let closed_within = |mut s: TcpStream, limit: Duration| -> bool {
        s.set_read_timeout(Some(limit)).unwrap();
        let mut buf = [0u8; 64];
        // EOF (0) or a reset means the server closed it; a timeout means it is still open.
        match s.read(&mut buf) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        }
    };
    let silent = TcpStream::connect(server.addr).unwrap();
    let mut stalled = TcpStream::connect(server.addr).unwrap();
    stalled
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let started = std::time::Instant::now();
    // Busy: a request every 300 ms for 3 s, all on one keep-alive connection.
    let mut busy = server.anonymous();
    for _ in 0..10 {
        assert_eq!(busy.get("/health").status, 200);
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(closed_within(silent, Duration::from_secs(3)));
    assert!(closed_within(stalled, Duration::from_secs(3)));
    assert!(started.elapsed() < Duration::from_secs(9));
    // The busy connection survived three idle periods and still answers.
    assert_eq!(busy.get("/health").status, 200);
    assert_eq!(busy.connects, 1);
}
