//! What signing costs a cluster's log entry: the HMAC-SHA256 a node puts on every entry it
//! publishes (`cluster_secret`), and the check every node makes before applying one, against
//! encoding the entry, which every write through the log already pays. Entries of one
//! document and of 10,000 (a bulk write), GeoNames places as the loader writes them.
//!
//!     cargo bench --bench cluster_sign

#[path = "fixture.rs"]
mod fixture;

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use geoshard::acl::{Caller, Permissions};
use geoshard::cluster::Signer;
use geoshard::secret::Secret;
use geoshard::store::{Format, Op, PutDocument, logged};

fn ops(n: usize) -> Vec<Op> {
    let places = fixture::places();
    let points = fixture::jittered(&places, n, 7);
    points
        .iter()
        .enumerate()
        .map(|(i, (x, y))| {
            let p = &places[i % places.len()];
            let doc = format!(
                r#"{{"type":"Feature","properties":{{"name":"place {i}","cc":"{}","OBJECTID":{}}},"geometry":{{"type":"Point","coordinates":[{x},{y}]}}}}"#,
                p.2,
                i + 1
            );
            Op::PutDocument(PutDocument {
                uri: format!("/places/{}.json", i + 1),
                content: Bytes::from(doc),
                format: Format::Json,
                collections: Some(vec!["places".into()]),
                permissions: Some(Permissions::new()),
                default_permissions: Permissions::new(),
            })
        })
        .collect()
}

fn entry_parts(payload: &[u8]) -> [&[u8]; 6] {
    [
        b"geoshard.bench.data",
        b"node-a",
        b"12345",
        b"node-a-0123456789abcdef-12345",
        payload,
        b"1764633600000",
    ]
}

fn signing(c: &mut Criterion) {
    let signer = Signer::new(Some(&Secret::new("a cluster secret for the benchmark")));
    let caller = Caller::system();
    let mut g = c.benchmark_group("cluster_entry");
    for n in [1usize, 10_000] {
        let ops = ops(n);
        let payload = logged::encode(&caller, &ops);
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::new("encode", n), &ops, |b, ops| {
            b.iter(|| logged::encode(&caller, ops))
        });
        g.bench_with_input(BenchmarkId::new("sign", n), &payload, |b, p| {
            b.iter(|| signer.sign(&entry_parts(p)))
        });
        let mac = signer.sign(&entry_parts(&payload));
        g.bench_with_input(BenchmarkId::new("verify", n), &payload, |b, p| {
            b.iter(|| assert!(signer.verify(&entry_parts(p), mac.as_deref())))
        });
    }
    g.finish();
}

criterion_group!(benches, signing);
criterion_main!(benches);
