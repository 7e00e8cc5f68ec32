//! One input-flow run on a pooled QuickJS context (the mollusk flow of the test project:
//! scaffolded main, CommonJS requires, a content plugin that builds a GeoJSON point), and
//! the envelope after it. No HTTP, no store.
//!
//!     cargo bench --bench flow

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use geoshard::flow::js::{JsPool, JsSettings, Raw, RunResult};

fn flow_run(c: &mut Criterion) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/project");
    let files = geoshard::flow::project::read_dir(&root).unwrap();
    let project = geoshard::flow::prepare(&files).unwrap();
    let flow = Arc::new(
        project
            .flows
            .iter()
            .find(|f| f.flow == "LoadJson")
            .unwrap()
            .clone(),
    );
    let pool = JsPool::new(JsSettings {
        workers: 1,
        time_limit: Duration::from_secs(1),
        memory_limit: 64 * 1024 * 1024,
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let options = serde_json::json!({"entity": "Mollusk", "flow": "LoadJson", "flowType": "input", "dataFormat": "json", "jobId": "bench"});
    let body = r#"{"id":"17","X":"178.551","Y":"-18.206","type":"PhysicalObject","bibliographicCitation":"Aspella media (Muricidae from Fiji and Tonga 1)"}"#;
    let mut g = c.benchmark_group("flow");
    g.measurement_time(Duration::from_secs(4));
    g.bench_function("js_flow_run_mollusk", |b| {
        b.iter(|| {
            let r = rt.block_on(pool.run(
                flow.clone(),
                1,
                "/data/17.json".into(),
                Raw::Json(body.into()),
                &options,
                false,
            ));
            assert!(matches!(r, RunResult::Done { .. }));
            black_box(r)
        })
    });
    g.finish();
}

criterion_group!(benches, flow_run);
criterion_main!(benches);
