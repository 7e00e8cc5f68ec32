//! A vector tile of about 5,000 features through the whole request path, in process: the box
//! query, the GeoJSON of the answer, projection, simplification, clipping and MVT encoding.
//! The tile is the zoom-5 tile over the GeoNames places (the demo's sample layer) whose count
//! is nearest 5,000, capped at `max_record_count` (5,000).
//!
//!     cargo bench --bench tiles

use std::sync::Arc;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http_body_util::Full;
use hyper::Request;

use geoshard::config::Config;
use geoshard::http::App;
use geoshard::store::{Store, StoreOptions};

fn app() -> Arc<App> {
    let dir = std::env::temp_dir().join(format!("geoshard-bench-tiles-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = Store::open(&dir, StoreOptions::default()).unwrap();
    geoshard::security::put_user_offline(
        &store,
        "bench",
        "pw",
        &["geo-data-services-writer".into()],
        "public",
    )
    .unwrap();
    geoshard::demo::load_examples(&store, &geoshard::demo::default_examples_dir()).unwrap();
    store.shutdown_blocking();
    drop(store);
    geoshard::node::open(Config {
        data_dir: dir,
        ..Config::default()
    })
    .unwrap()
}

/// The zoom-5 tile holding the number of places nearest 5,000.
fn busiest_tile() -> (u32, u32, u32, usize) {
    let csv = geoshard::demo::default_examples_dir().join("data/real/geonames-cities1000.csv");
    let text = std::fs::read_to_string(csv).unwrap();
    let z = 5u32;
    let n = f64::from(1u32 << z);
    let mut counts = std::collections::HashMap::new();
    for l in text.lines().skip(1) {
        let mut it = l.split(',');
        let lat: f64 = it.next().unwrap().parse().unwrap();
        let lon: f64 = it.next().unwrap().parse().unwrap();
        let x = ((lon + 180.0) / 360.0 * n).floor().clamp(0.0, n - 1.0) as u32;
        let r = lat.to_radians();
        let y = ((1.0 - (r.tan() + 1.0 / r.cos()).ln() / std::f64::consts::PI) / 2.0 * n)
            .floor()
            .clamp(0.0, n - 1.0) as u32;
        *counts.entry((x, y)).or_insert(0usize) += 1;
    }
    let ((x, y), c) = counts
        .into_iter()
        .min_by_key(|(_, c)| c.abs_diff(5000))
        .unwrap();
    (z, x, y, c)
}

fn tiles(c: &mut Criterion) {
    let app = app();
    let (z, x, y, count) = busiest_tile();
    eprintln!("tile {z}/{x}/{y}: {count} places");
    let basic = format!(
        "Basic {}",
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, "bench:pw")
    );
    let target = format!("/tiles/World%20Places.0/{z}/{x}/{y}.mvt");
    let run = || {
        let req = Request::builder()
            .method("GET")
            .uri(&target)
            .header("authorization", &basic)
            .header("host", "bench")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = futures_executor(geoshard::http::handle(app.clone(), req));
        assert_eq!(resp.status(), 200);
        resp
    };
    let bytes = hyper::body::Body::size_hint(run().body())
        .exact()
        .unwrap_or(0);
    eprintln!("tile size {bytes} bytes");
    let mut group = c.benchmark_group("tiles");
    group.sample_size(30);
    group.bench_function("places_5000", |b| b.iter(run));
    group.finish();
}

/// Drive a future on this thread with a current-thread runtime (the handler awaits the rayon
/// pool through a channel).
fn futures_executor<F: std::future::Future>(f: F) -> F::Output {
    thread_local! {
        static RT: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
    }
    RT.with(|rt| rt.block_on(f))
}

criterion_group!(benches, tiles);
criterion_main!(benches);
