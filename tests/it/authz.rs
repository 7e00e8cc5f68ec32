//! The authorization matrix, from one table: every endpoint, as each of the six built-in
//! roles, a user with no roles, a wrong password and no credentials, over documents with
//! four kinds of permission. Expected statuses are the contract's rules written out
//! (docs/contract.md §5 and §6, the README's Security section), not the server's own answers.
//!
//! Each principal works on its own copies of the documents, so the cells of one principal
//! never see another's writes; within a principal, the rows run in order (reads, then
//! replacements, then deletes).

use crate::common;

use common::*;
use serde_json::{Value, json};

const TDE: &str = "http://marklogic.com/xdmp/tde";
const SERVICES: &str = "http://marklogic.com/feature-services";

/// The principals, in the order of the table's columns: (name, password, roles). The last
/// two are a wrong password and no credentials at all.
const PRINCIPALS: [(&str, &str, &[&str]); 9] = [
    ("admin", "admin-pw", &["admin"]),
    ("m-rr", "pw", &["rest-reader"]),
    ("m-rw", "pw", &["rest-writer"]),
    ("m-ext", "pw", &["rest-extension-user"]),
    ("m-gr", "pw", &["geo-data-services-reader"]),
    ("m-gw", "pw", &["geo-data-services-writer"]),
    ("m-none", "pw", &[]),
    ("m-rw", "wrong", &[]),
    ("", "", &[]),
];

/// The documents each principal has copies of: (name, `perm:` parameters).
/// - `default`: no `perm:`, so `rest-reader: read`, `rest-writer: update`;
/// - `geo`: the feature-service roles', as a descriptor's;
/// - `ro`: readable by `rest-reader` (so by `rest-writer`), updatable by no role;
/// - `sealed`: no role may read or update it (only `execute`): an admin's alone.
const DOCS: [(&str, &str); 4] = [
    ("default", ""),
    (
        "geo",
        "&perm:geo-data-services-reader=read&perm:geo-data-services-writer=update",
    ),
    ("ro", "&perm:rest-reader=read"),
    ("sealed", "&perm:rest-extension-user=execute"),
];

/// One row: a request, and the status each principal gets (columns as in [`PRINCIPALS`]).
/// `{p}` in the target is the principal's own prefix.
struct Row {
    method: &'static str,
    target: &'static str,
    body: Body,
    want: [u16; 9],
}

#[derive(Clone, Copy)]
enum Body {
    None,
    Json(&'static str),
    /// A one-document multipart bulk write into `{p}`.
    Bulk,
    /// geoQueryService on the matrix layer, every row, ids only.
    Query,
    /// Not a project archive.
    Junk,
}

use Body::*;

#[rustfmt::skip]
const TABLE: &[Row] = &[
    //                                                   admin  rr   rw  ext   gr   gw none wrong anon
    Row { method: "GET", target: "/health", body: None, want: [200, 200, 200, 200, 200, 200, 200, 200, 200] },
    Row { method: "GET", target: "/v1/ping", body: None, want: [204, 204, 204, 204, 204, 204, 204, 401, 401] },
    Row { method: "HEAD", target: "/v1/ping", body: None, want: [204, 204, 204, 204, 204, 204, 204, 401, 401] },
    // Reads need rest-reader (rest-writer includes it), then read permission; an unreadable
    // document is a 404.
    Row { method: "GET", target: "/v1/documents?uri=/{p}/default.json", body: None, want: [200, 200, 200, 403, 403, 403, 403, 401, 401] },
    Row { method: "GET", target: "/v1/documents?uri=/{p}/geo.json", body: None, want: [200, 404, 404, 403, 403, 403, 403, 401, 401] },
    Row { method: "GET", target: "/v1/documents?uri=/{p}/ro.json", body: None, want: [200, 200, 200, 403, 403, 403, 403, 401, 401] },
    Row { method: "GET", target: "/v1/documents?uri=/{p}/sealed.json", body: None, want: [200, 404, 404, 403, 403, 403, 403, 401, 401] },
    Row { method: "GET", target: "/v1/documents?uri=/{p}/never.json", body: None, want: [404, 404, 404, 403, 403, 403, 403, 401, 401] },
    // Writes need rest-writer, then update permission on an existing document.
    Row { method: "PUT", target: "/v1/documents?uri=/{p}/new.json", body: Json("{\"n\":1}"), want: [201, 403, 201, 403, 403, 403, 403, 401, 401] },
    Row { method: "PUT", target: "/v1/documents?uri=/{p}/default.json", body: Json("{\"v\":2}"), want: [204, 403, 204, 403, 403, 403, 403, 401, 401] },
    Row { method: "PUT", target: "/v1/documents?uri=/{p}/geo.json", body: Json("{\"v\":2}"), want: [204, 403, 403, 403, 403, 403, 403, 401, 401] },
    Row { method: "PUT", target: "/v1/documents?uri=/{p}/ro.json", body: Json("{\"v\":2}"), want: [204, 403, 403, 403, 403, 403, 403, 401, 401] },
    Row { method: "PUT", target: "/v1/documents?uri=/{p}/sealed.json", body: Json("{\"v\":2}"), want: [204, 403, 403, 403, 403, 403, 403, 401, 401] },
    Row { method: "POST", target: "/v1/documents?collection={p}", body: Bulk, want: [200, 403, 200, 403, 403, 403, 403, 401, 401] },
    // Deletes: update permission; a document the caller can neither read nor update answers
    // as an absent one (204, nothing deleted); one it can read but not update is a 403.
    Row { method: "DELETE", target: "/v1/documents?uri=/{p}/geo.json", body: None, want: [204, 403, 204, 403, 403, 403, 403, 401, 401] },
    Row { method: "DELETE", target: "/v1/documents?uri=/{p}/ro.json", body: None, want: [204, 403, 403, 403, 403, 403, 403, 401, 401] },
    Row { method: "DELETE", target: "/v1/documents?uri=/{p}/sealed.json", body: None, want: [204, 403, 204, 403, 403, 403, 403, 401, 401] },
    Row { method: "DELETE", target: "/v1/documents?uri=/{p}/default.json", body: None, want: [204, 403, 204, 403, 403, 403, 403, 401, 401] },
    Row { method: "DELETE", target: "/v1/documents?uri=/{p}/never.json", body: None, want: [204, 403, 204, 403, 403, 403, 403, 401, 401] },
    // The feature services: the geo writer's (and admin's).
    Row { method: "GET", target: "/v1/resources/modelService", body: None, want: [200, 403, 403, 403, 403, 200, 403, 401, 401] },
    Row { method: "POST", target: "/v1/resources/geoQueryService", body: Query, want: [200, 403, 403, 403, 403, 200, 403, 401, 401] },
    // Administration: admins only.
    Row { method: "GET", target: "/manage/v2/users", body: None, want: [200, 403, 403, 403, 403, 403, 403, 401, 401] },
    Row { method: "POST", target: "/manage/v2/users", body: Json("{\"user-name\":\"made-by-{p}\",\"password\":\"x\",\"role\":[]}"), want: [201, 403, 403, 403, 403, 403, 403, 401, 401] },
    Row { method: "GET", target: "/manage/v2/users/m-none", body: None, want: [200, 403, 403, 403, 403, 403, 403, 401, 401] },
    Row { method: "GET", target: "/manage/v2/users/m-none/properties", body: None, want: [200, 403, 403, 403, 403, 403, 403, 401, 401] },
    Row { method: "PUT", target: "/manage/v2/users/victim/properties", body: Json("{\"role\":[\"rest-reader\"]}"), want: [204, 403, 403, 403, 403, 403, 403, 401, 401] },
    Row { method: "DELETE", target: "/manage/v2/users/made-by-{p}", body: None, want: [204, 403, 403, 403, 403, 403, 403, 401, 401] },
    Row { method: "GET", target: "/v1/traces?job-id=none", body: None, want: [200, 403, 403, 403, 403, 403, 403, 401, 401] },
    Row { method: "GET", target: "/v1/diagnostics", body: None, want: [200, 403, 403, 403, 403, 403, 403, 401, 401] },
    // An admin gets past authorization to the archive check (400); no one else does.
    Row { method: "POST", target: "/v1/deploy", body: Junk, want: [400, 403, 403, 403, 403, 403, 403, 401, 401] },
    Row { method: "GET", target: "/nowhere", body: None, want: [404, 404, 404, 404, 404, 404, 404, 401, 401] },
];

fn client(srv: &TestServer, i: usize) -> Client {
    let (name, pass, _) = PRINCIPALS[i];
    if name.is_empty() {
        srv.anonymous()
    } else {
        srv.client((name, pass))
    }
}

fn prefix(i: usize) -> String {
    format!("m{i}")
}

fn send(c: &mut Client, row: &Row, p: &str) -> Response {
    let target = row.target.replace("{p}", p);
    match row.body {
        None => c.request(row.method, &target, &[], b""),
        Json(text) => c.request(
            row.method,
            &target,
            &[("Content-Type", "application/json")],
            text.replace("{p}", p).as_bytes(),
        ),
        Bulk => {
            let body = format!(
                "--b\r\nContent-Type: application/json\r\nContent-Disposition: attachment; \
                 filename=\"/{p}/bulk.json\"\r\n\r\n{{\"bulk\":1}}\r\n--b--\r\n"
            );
            c.request(
                row.method,
                &target,
                &[("Content-Type", "multipart/mixed; boundary=b")],
                body.as_bytes(),
            )
        }
        Query => c.request(
            row.method,
            &target,
            &[("Content-Type", "application/json")],
            json!({"params": {"id": "Matrix", "layer": 0, "method": "query"},
                   "query": {"where": "1=1", "returnIdsOnly": true}})
            .to_string()
            .as_bytes(),
        ),
        Junk => c.request(
            row.method,
            &target,
            &[("Content-Type", "application/zip")],
            b"not an archive",
        ),
    }
}

fn ids(v: &Value) -> Vec<i64> {
    let mut out: Vec<i64> = v["objectIds"]
        .as_array()
        .unwrap_or_else(|| panic!("no objectIds: {v}"))
        .iter()
        .map(|i| i.as_i64().unwrap())
        .collect();
    out.sort_unstable();
    out
}

#[test]
fn every_endpoint_for_every_role() {
    let srv = TestServer::start_with(|c| {
        // The wrong-password column fails once a row; this test is not about the throttle.
        c.auth_failures_per_address = 0;
        c.auth_failures_per_user = 0;
    });
    let mut admin = srv.client(ADMIN);
    for (name, pass, roles) in &PRINCIPALS[1..7] {
        let r = admin.post_json(
            "/manage/v2/users",
            &json!({"user-name": name, "password": pass, "role": roles}).to_string(),
        );
        assert_eq!(r.status, 201, "{name}: {}", r.text());
    }
    let r = admin.post_json(
        "/manage/v2/users",
        &json!({"user-name": "victim", "password": "v", "role": []}).to_string(),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    // Each principal's documents.
    for i in 0..PRINCIPALS.len() {
        for (doc, perms) in DOCS {
            let r = admin.put_json(
                &format!("/v1/documents?uri=/{}/{doc}.json{perms}", prefix(i)),
                r#"{"v":1}"#,
            );
            assert_eq!(r.status, 201, "{}", r.text());
        }
    }
    // A layer whose three features have three kinds of permission, and a second service
    // that only rest-reader may see.
    let template = json!({"template": {"context": "/", "collections": ["matrix"], "rows": [{
        "schemaName": "m", "viewName": "x", "columns": [
            {"name": "OBJECTID", "scalarType": "int", "val": "id"}]}]}});
    let r = admin.put_json(
        &format!("/v1/documents?uri=/tde/m.json&collection={}", enc(TDE)),
        &template.to_string(),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let descriptor = |name: &str| {
        json!({"info": {"name": name, "description": "d"}, "layers": [{
            "id": 0, "name": "x", "description": "d", "geometryType": "Point",
            "schema": "m", "view": "x",
            "geometry": {"format": "geojson", "coordinateSystem": "wgs84", "xpath": "//geometry"}}]})
        .to_string()
    };
    let r = admin.put_json(
        &format!(
            "/v1/documents?uri=/sd/matrix.json&collection={}",
            enc(SERVICES)
        ),
        &descriptor("Matrix"),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let r = admin.put_json(
        &format!(
            "/v1/documents?uri=/sd/hidden.json&collection={}&perm:rest-reader=read",
            enc(SERVICES)
        ),
        &descriptor("Hidden"),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    for (id, (_, perms)) in [(1, DOCS[1]), (2, DOCS[2]), (3, DOCS[3])] {
        let doc = json!({"id": id, "geometry": {"type": "Point", "coordinates": [id, id]}});
        let r = admin.put_json(
            &format!("/v1/documents?uri=/f/{id}.json&collection=matrix{perms}"),
            &doc.to_string(),
        );
        assert_eq!(r.status, 201, "{}", r.text());
    }

    let mut wrong = Vec::new();
    for (i, principal) in PRINCIPALS.iter().enumerate() {
        let mut c = client(&srv, i);
        let p = prefix(i);
        for row in TABLE {
            let r = send(&mut c, row, &p);
            if r.status != row.want[i] {
                wrong.push(format!(
                    "{} {} as {:?}: {} (want {}) {}",
                    row.method,
                    row.target.replace("{p}", &p),
                    principal,
                    r.status,
                    row.want[i],
                    r.text()
                ));
                continue;
            }
            // The answers that let something through say what they let through.
            match (row.body, r.status) {
                (Query, 200) => {
                    // Rows as their documents allow: admin all three, the geo writer the
                    // geo one.
                    let want = if i == 0 { vec![1, 2, 3] } else { vec![1] };
                    if ids(&r.json()) != want {
                        wrong.push(format!("query as {principal:?}: {}", r.text()));
                    }
                }
                (None, 200) if row.target == "/v1/resources/modelService" => {
                    let models = r.json()["models"].clone();
                    let mut names: Vec<String> =
                        models.as_object().unwrap().keys().cloned().collect();
                    names.sort();
                    let want: Vec<&str> = if i == 0 {
                        vec!["Hidden", "Matrix"]
                    } else {
                        vec!["Matrix"]
                    };
                    if names != want {
                        wrong.push(format!("models as {principal:?}: {names:?}"));
                    }
                }
                (None, 401) => {
                    let challenges = r.headers_named("www-authenticate");
                    if challenges.len() != 2 || !challenges[0].starts_with("Digest ") {
                        wrong.push(format!("401 without both challenges: {challenges:?}"));
                    }
                }
                _ => {}
            }
        }
    }
    // What the deletes did: only the documents a delete was allowed on are gone.
    for i in 0..PRINCIPALS.len() {
        let p = prefix(i);
        for (doc, _) in DOCS {
            let status = admin
                .get(&format!("/v1/documents?uri=/{p}/{doc}.json"))
                .status;
            let deleted = match i {
                0 => true,
                2 => doc == "default",
                _ => false,
            };
            let want = if deleted { 404 } else { 200 };
            if status != want {
                wrong.push(format!(
                    "/{p}/{doc}.json after the deletes: {status} (want {want})"
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} cells wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// Templates and descriptors are schema (docs/contract.md §5, Roles): writing or deleting one needs
/// `tde-admin` or `geo-data-services-writer` (or `admin`), by any route; `rest-writer` alone
/// writes plain documents only. A refused write is a 403 `SEC-PRIV` and changes nothing.
#[test]
fn schema_needs_its_role_by_every_write_route() {
    let srv = TestServer::start();
    let mut admin = srv.client(ADMIN);
    let users: [(&str, &[&str]); 4] = [
        ("s-rw", &["rest-writer"]),
        ("s-tde", &["rest-writer", "tde-admin"]),
        ("s-gw", &["rest-writer", "geo-data-services-writer"]),
        (
            "s-both",
            &["rest-writer", "tde-admin", "geo-data-services-writer"],
        ),
    ];
    for (name, roles) in users {
        let r = admin.post_json(
            "/manage/v2/users",
            &json!({"user-name": name, "password": "pw", "role": roles}).to_string(),
        );
        assert_eq!(r.status, 201, "{name}: {}", r.text());
    }
    // Each template its own view: two templates may not define one.
    let view = |schema: &str| {
        json!({"template": {"context": "/", "collections": ["s"], "rows": [{
            "schemaName": schema, "viewName": "v", "columns": [
                {"name": "OBJECTID", "scalarType": "int", "val": "id"}]}]}})
        .to_string()
    };
    let service = |name: &str| {
        json!({"info": {"name": name, "description": "d"}, "layers": [{
            "id": 0, "name": "v", "description": "d", "geometryType": "Point",
            "schema": name, "view": "v",
            "geometry": {"format": "geojson", "coordinateSystem": "wgs84", "xpath": "//geometry"}}]})
        .to_string()
    };
    let exists = |admin: &mut Client, uri: &str| {
        admin.get(&format!("/v1/documents?uri={uri}")).status == 200
    };
    // (user, may write templates, may write descriptors)
    for (name, tde, gw) in [
        ("s-rw", false, false),
        ("s-tde", true, false),
        ("s-gw", false, true),
        ("s-both", true, true),
    ] {
        let mut c = srv.client((name, "pw"));
        let t_uri = format!("/tde/{name}.json");
        let template = view(name);
        let r = c.put_json(
            &format!("/v1/documents?uri={t_uri}&collection={}", enc(TDE)),
            &template,
        );
        if tde {
            assert_eq!(r.status, 201, "{name} template: {}", r.text());
        } else {
            assert_eq!(r.status, 403, "{name} template: {}", r.text());
            let (_, code, message) = r.error();
            assert_eq!(code, "SEC-PRIV", "{message}");
            assert!(message.contains("tde-admin"), "{message}");
            assert!(
                !exists(&mut admin, &t_uri),
                "{name}: a refused template was stored"
            );
        }
        let d_uri = format!("/sd/{name}.json");
        let r = c.put_json(
            &format!("/v1/documents?uri={d_uri}&collection={}", enc(SERVICES)),
            &service(name),
        );
        if gw {
            assert_eq!(r.status, 201, "{name} descriptor: {}", r.text());
        } else {
            assert_eq!(r.status, 403, "{name} descriptor: {}", r.text());
            assert!(
                r.error().2.contains("geo-data-services-writer"),
                "{}",
                r.text()
            );
            assert!(!exists(&mut admin, &d_uri));
        }
        // A bulk write with a plain document and a template: all or nothing.
        let bulk = format!(
            "--b\r\nContent-Type: application/json\r\nContent-Disposition: inline; category=metadata\r\n\r\n\
             {{\"collections\":[\"plain\"]}}\r\n\
             --b\r\nContent-Type: application/json\r\nContent-Disposition: attachment; filename=\"/plain/{name}.json\"\r\n\r\n{{\"v\":1}}\r\n\
             --b\r\nContent-Type: application/json\r\nContent-Disposition: inline; category=metadata\r\n\r\n\
             {{\"collections\":[\"{TDE}\"]}}\r\n\
             --b\r\nContent-Type: application/json\r\nContent-Disposition: attachment; filename=\"/tde/bulk-{name}.json\"\r\n\r\n{}\r\n--b--\r\n",
            view(&format!("bulk-{name}"))
        );
        let r = c.request(
            "POST",
            "/v1/documents",
            &[("Content-Type", "multipart/mixed; boundary=b")],
            bulk.as_bytes(),
        );
        if tde {
            assert_eq!(r.status, 200, "{name} bulk: {}", r.text());
        } else {
            assert_eq!(r.status, 403, "{name} bulk: {}", r.text());
            assert!(
                !exists(&mut admin, &format!("/plain/{name}.json")),
                "{name}: half a refused bulk"
            );
            assert!(!exists(&mut admin, &format!("/tde/bulk-{name}.json")));
        }
    }
    // The admin's template: a rest-writer can neither delete it, nor move it out of the TDE
    // collection by replacing it, even though its permissions give rest-writer update.
    let r = admin.put_json(
        &format!("/v1/documents?uri=/tde/a.json&collection={}", enc(TDE)),
        &view("a"),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let mut rw = srv.client(("s-rw", "pw"));
    let r = rw.delete("/v1/documents?uri=/tde/a.json");
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.error().1, "SEC-PRIV");
    let r = rw.put_json(
        "/v1/documents?uri=/tde/a.json&collection=plain",
        r#"{"v":1}"#,
    );
    assert_eq!(r.status, 403, "{}", r.text());
    let r = admin.get("/v1/documents?uri=/tde/a.json&category=collections");
    assert!(r.text().contains(TDE), "{}", r.text());
    // The tde-admin may delete it.
    let r = srv
        .client(("s-tde", "pw"))
        .delete("/v1/documents?uri=/tde/a.json");
    assert_eq!(r.status, 204, "{}", r.text());
    // A plain document is still the rest-writer's to write.
    let r = rw.put_json("/v1/documents?uri=/plain/ok.json", r#"{"v":1}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    // The role is listed and granted like any other.
    let r = admin.get("/manage/v2/users/s-tde");
    assert!(r.text().contains("tde-admin"), "{}", r.text());
}

/// A flow's output lands where the request says: into the TDE collection it is a template
/// write like any other, and needs tde-admin.
#[test]
fn a_flows_output_into_the_schema_needs_its_role() {
    let project = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/project");
    let srv = TestServer::start_with(|c| c.project = Some(project));
    let flow = |c: &mut Client, uri: &str, collection: &str| {
        c.request(
            "PUT",
            &format!(
                "/v1/documents?uri={uri}&collection={}&transform=svc:sjsInputFlow\
                 &trans:entity-name=Default&trans:flow-name=Json",
                enc(collection)
            ),
            &[("Content-Type", "application/json")],
            br#"{"testing": 1}"#,
        )
    };
    let mut writer = srv.client(WRITER);
    let r = flow(&mut writer, "/flowed/plain.json", "plain");
    assert_eq!(r.status, 201, "{}", r.text());
    let r = flow(&mut writer, "/flowed/tde.json", TDE);
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.error().1, "SEC-PRIV");
    let r = flow(&mut writer, "/flowed/sd.json", SERVICES);
    assert_eq!(r.status, 403, "{}", r.text());
    let mut admin = srv.client(ADMIN);
    for uri in ["/flowed/tde.json", "/flowed/sd.json"] {
        assert_eq!(
            admin.get(&format!("/v1/documents?uri={uri}")).status,
            404,
            "{uri}"
        );
    }
    assert_eq!(
        admin.get("/v1/documents?uri=/flowed/plain.json").status,
        200
    );
}
