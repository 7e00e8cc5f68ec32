//! The full request path of a point-in-polygon query on the US counties layer, in process:
//! request parsing, Digest verification, the engine, and GeoJSON serialization, with no
//! socket. Beside it, in the same run, the engine alone on the same points, so the HTTP
//! layer's share is visible.
//!
//!     cargo bench --bench http_path
//!
//! Each request carries a fresh Digest `nc`, computed before the timed loop (clients pay for
//! that, not the server). The request is the one of INTERFACE §4.3 (`returnGeometry: 1`).

#[path = "fixture.rs"]
mod fixture;

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use futures_util::FutureExt;
use http_body_util::Full;
use hyper::Request;

use geoshard::acl::{Caller, Capability, Permissions, Role};
use geoshard::config::Config;
use geoshard::http::App;
use geoshard::spatial::{Query, Relation};
use geoshard::store::{Format, Op, PutDocument, Store, StoreOptions};

const TDE: &str = "http://marklogic.com/xdmp/tde";
const SERVICES: &str = "http://marklogic.com/feature-services";

fn put(uri: String, body: &serde_json::Value, collection: &str) -> Op {
    let mut p = Permissions::new();
    p.grant(Role::GeoReader, Capability::Read);
    p.grant(Role::GeoWriter, Capability::Update);
    Op::PutDocument(PutDocument {
        uri,
        content: Bytes::from(body.to_string()),
        format: Format::Json,
        collections: Some(vec![collection.to_string()]),
        permissions: Some(p),
        default_permissions: p,
    })
}

fn bench_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("geoshard-bench-http-{}", std::process::id()))
}

fn app() -> Arc<App> {
    let dir = bench_dir();
    let _ = std::fs::remove_dir_all(&dir);
    let store = Store::open(&dir, StoreOptions::default()).unwrap();
    geoshard::security::put_user_offline(
        &store,
        "bench",
        "pw",
        &[
            "geo-data-services-writer".into(),
            "rest-extension-user".into(),
        ],
        "public",
    )
    .unwrap();
    let examples = geoshard::demo::default_examples_dir();
    let read = |p: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(examples.join(p)).unwrap()).unwrap()
    };
    let mut ops = vec![
        put(
            "/t.json".into(),
            &read("layers/us-counties/template.json"),
            TDE,
        ),
        put(
            "/d.json".into(),
            &read("layers/us-counties/descriptor.json"),
            SERVICES,
        ),
    ];
    let counties = read("data/real/us-counties.geojson");
    for f in counties["features"].as_array().unwrap() {
        ops.push(put(
            format!("/c/{}.json", f["id"].as_str().unwrap()),
            f,
            "demo-counties",
        ));
    }
    store.write_blocking(&Caller::system(), ops).unwrap();
    store.shutdown_blocking();
    drop(store);
    let config = Config {
        data_dir: dir,
        ..Config::default()
    };
    geoshard::node::open(config).unwrap()
}

/// `n` query bodies with geometry, at the next US points from `k` on.
fn next_bodies(us: &[(f64, f64)], k: &mut usize, n: u64) -> Vec<String> {
    (0..n)
        .map(|_| {
            let (x, y) = us[*k % us.len()];
            *k += 1;
            body(x, y, true)
        })
        .collect()
}

fn body(x: f64, y: f64, geometry: bool) -> String {
    serde_json::json!({
        "params": {"id": "US Counties", "layer": 0, "method": "query"},
        "query": {
            "returnGeometry": if geometry { 1 } else { 0 },
            "geometryType": "gisGeometryPoint",
            "spatialRel": "gisSpatialRelContains",
            "extension": {"geometry": {"type": "Point", "coordinates": [x, y]}}
        }
    })
    .to_string()
}

const TARGET: &str = "/v1/resources/geoQueryService";

fn request(body: String, auth: &str) -> Request<Full<Bytes>> {
    Request::builder()
        .method("POST")
        .uri(TARGET)
        .header("content-type", "application/json")
        .header("authorization", auth)
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

fn http_path(c: &mut Criterion) {
    let app = app();
    let places = fixture::places();
    let us: Vec<(f64, f64)> = places
        .iter()
        .filter(|p| p.2 == "US")
        .map(|p| (p.0, p.1))
        .collect();
    // One Digest challenge; every request then uses the next nc.
    let challenge = {
        let req = Request::builder()
            .uri("/v1/ping")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = geoshard::http::handle(app.clone(), req)
            .now_or_never()
            .unwrap();
        assert_eq!(resp.status(), 401);
        resp.headers()
            .get_all("www-authenticate")
            .iter()
            .find_map(|v| {
                v.to_str()
                    .ok()
                    .filter(|v| v.starts_with("Digest"))
                    .map(str::to_string)
            })
            .unwrap()
    };
    let mut challenge = digest_auth::parse(&challenge).unwrap();
    let mut next_auth = move || {
        let ctx = digest_auth::AuthContext::new_with_method(
            "bench",
            "pw",
            TARGET,
            Option::<&[u8]>::None,
            digest_auth::HttpMethod::POST,
        );
        challenge.respond(&ctx).unwrap().to_header_string()
    };
    let basic = format!("Basic {}", {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode("bench:pw")
    });

    let mut g = c.benchmark_group("http_path");
    g.measurement_time(Duration::from_secs(4));
    let mut k = 0usize;
    for (name, geometry, digest) in [
        ("pip_counties_digest_geometry", true, true),
        ("pip_counties_digest_no_geometry", false, true),
        ("pip_counties_basic_geometry", true, false),
    ] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let reqs: Vec<Request<Full<Bytes>>> = (0..iters)
                    .map(|_| {
                        let (x, y) = us[k % us.len()];
                        k += 1;
                        let auth = if digest { next_auth() } else { basic.clone() };
                        request(body(x, y, geometry), &auth)
                    })
                    .collect();
                let start = Instant::now();
                for req in reqs {
                    let resp = geoshard::http::handle(app.clone(), req)
                        .now_or_never()
                        .unwrap();
                    debug_assert_eq!(resp.status(), 200);
                    black_box(resp);
                }
                start.elapsed()
            })
        });
    }
    // The stages of the path, each alone on the same requests.
    let mut next_digest = next_auth;
    g.bench_function("stage_digest_authenticate", |b| {
        b.iter_custom(|iters| {
            let headers: Vec<String> = (0..iters).map(|_| next_digest()).collect();
            let start = Instant::now();
            for h in &headers {
                black_box(app.security.authenticate("POST", TARGET, Some(h)));
            }
            start.elapsed()
        })
    });
    let caller = Caller::new(
        "bench",
        geoshard::acl::RoleSet::from_roles([Role::GeoWriter]),
    );
    g.bench_function("stage_parse_and_coerce", |b| {
        b.iter_custom(|iters| {
            let bodies = next_bodies(&us, &mut k, iters);
            let start = Instant::now();
            for text in &bodies {
                black_box(geoshard::features::FeatureRequest::parse(text.as_bytes()).unwrap());
            }
            start.elapsed()
        })
    });
    // The same bodies for one user: after the first, each is bound to the kept one (the
    // server's path for a client repeating one request shape).
    g.bench_function("stage_parse_bound", |b| {
        b.iter_custom(|iters| {
            let bodies = next_bodies(&us, &mut k, iters);
            let start = Instant::now();
            for text in &bodies {
                black_box(
                    geoshard::features::FeatureRequest::parse_for(
                        "bench",
                        text.as_bytes(),
                        100_000,
                    )
                    .unwrap(),
                );
            }
            start.elapsed()
        })
    });
    // Two users alternating on one thread: no body binds, and each is kept after parsing
    // (the worst case of parse_for against plain parsing).
    g.bench_function("stage_parse_two_users", |b| {
        b.iter_custom(|iters| {
            let bodies = next_bodies(&us, &mut k, iters);
            let start = Instant::now();
            for (i, text) in bodies.iter().enumerate() {
                let user = if i % 2 == 0 { "bench-a" } else { "bench-b" };
                black_box(
                    geoshard::features::FeatureRequest::parse_for(user, text.as_bytes(), 100_000)
                        .unwrap(),
                );
            }
            start.elapsed()
        })
    });
    g.bench_function("stage_execute_and_serialize", |b| {
        b.iter_custom(|iters| {
            let reqs: Vec<_> = (0..iters)
                .map(|_| {
                    let (x, y) = us[k % us.len()];
                    k += 1;
                    geoshard::features::FeatureRequest::parse(body(x, y, true).as_bytes()).unwrap()
                })
                .collect();
            let start = Instant::now();
            for r in &reqs {
                black_box(app.features.queries().execute(&caller, r).unwrap());
            }
            start.elapsed()
        })
    });
    // The same points through the engine alone (what the HTTP path adds to).
    let view = app
        .features
        .view(&geoshard::features::template::ViewKey::new(
            "demo", "counties",
        ))
        .unwrap();
    let engine = view.indexes.read().get("//geometry").cloned().unwrap();
    g.bench_function("engine_only_same_points", |b| {
        b.iter(|| {
            let (x, y) = us[k % us.len()];
            k += 1;
            black_box(engine.query(&Query::point(x, y), Relation::Contains))
        })
    });
    g.finish();
    // The store's files stay open in `app` until the process ends; their names go now.
    let _ = std::fs::remove_dir_all(bench_dir());
}

criterion_group!(benches, http_path);
criterion_main!(benches);
