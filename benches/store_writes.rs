//! The store's document writes against redb alone, the floor under every load: the same
//! documents (places-1m's shape: GeoNames places jittered, as an offline `geoshard load` writes
//! them) and the same commits (10,000 documents, durable), written
//!
//! - by `Store::write_blocking`, as the offline loader does, and
//! - by `Store::write_blocking` into a store with a compression dictionary (trained by a
//!   repack of 20,000 other documents of the same shape first), so each document is
//!   compressed on the writer thread, and
//! - straight into a redb table of the same shape (`&str` URI to bytes), one `get` and one
//!   `insert` a document, as the store's writer does.
//!
//! Each side runs `REPEAT` times (default 3), alternated, into a fresh directory; prints
//! documents/s per run, then the minimum and median.
//!
//!     cargo bench --bench store_writes            # 1,000,000 documents
//!     DOCS=200000 REPEAT=5 cargo bench --bench store_writes

#[path = "fixture.rs"]
mod fixture;

use std::time::Instant;

use bytes::Bytes;
use geoshard::acl::{Caller, Permissions};
use geoshard::store::{Format, Op, PutDocument, Store, StoreOptions};
use redb::{Database, ReadableTable, TableDefinition};

const DOCUMENTS: TableDefinition<&str, &[u8]> = TableDefinition::new("documents");
const BATCH: usize = 10_000;
const CACHE: usize = 1 << 30;

fn documents(n: usize) -> Vec<(String, Bytes)> {
    let places = fixture::places();
    let points = fixture::jittered(&places, n, 7);
    let mut docs: Vec<(String, Bytes)> = points
        .iter()
        .enumerate()
        .map(|(i, (x, y))| {
            let p = &places[i % places.len()];
            let doc = format!(
                r#"{{"type":"Feature","properties":{{"name":"place {i}","cc":"{}","OBJECTID":{}}},"geometry":{{"type":"Point","coordinates":[{x},{y}]}}}}"#,
                p.2,
                i + 1
            );
            (format!("/places/{}.json", i + 1), Bytes::from(doc))
        })
        .collect();
    // As the loader sends them: each batch in URI order.
    for chunk in docs.chunks_mut(BATCH) {
        chunk.sort_by(|a, b| a.0.cmp(&b.0));
    }
    docs
}

/// A store whose writes are compressed: seeded with `seed` and repacked, which trains its
/// dictionary.
fn with_dictionary(dir: &std::path::Path, seed: &[(String, Bytes)]) {
    let renamed: Vec<(String, Bytes)> = seed
        .iter()
        .map(|(uri, d)| (format!("/seed{uri}"), d.clone()))
        .collect();
    through_store(dir, &renamed);
    let r = geoshard::store::repack(dir, |_, _| {}).unwrap();
    assert!(r.trained);
}

fn through_store(dir: &std::path::Path, docs: &[(String, Bytes)]) -> f64 {
    let options = StoreOptions {
        cache_bytes: CACHE,
        ..StoreOptions::default()
    };
    let store = Store::open(dir, options).unwrap();
    let perms = Permissions::new();
    let t = Instant::now();
    for chunk in docs.chunks(BATCH) {
        let ops = chunk
            .iter()
            .map(|(uri, content)| {
                Op::PutDocument(PutDocument {
                    uri: uri.clone(),
                    content: content.clone(),
                    format: Format::Json,
                    collections: Some(vec!["places".into()]),
                    permissions: Some(perms),
                    default_permissions: perms,
                })
            })
            .collect();
        store.write_blocking(&Caller::system(), ops).unwrap();
    }
    let secs = t.elapsed().as_secs_f64();
    store.shutdown_blocking();
    secs
}

fn redb_alone(dir: &std::path::Path, docs: &[(String, Bytes)]) -> f64 {
    std::fs::create_dir_all(dir).unwrap();
    let db = Database::builder()
        .set_cache_size(CACHE)
        .create(dir.join("alone.redb"))
        .unwrap();
    let t = Instant::now();
    for chunk in docs.chunks(BATCH) {
        let mut txn = db.begin_write().unwrap();
        txn.set_quick_repair(true);
        {
            let mut table = txn.open_table(DOCUMENTS).unwrap();
            for (uri, content) in chunk {
                let _ = table.get(uri.as_str()).unwrap();
                table.insert(uri.as_str(), &content[..]).unwrap();
            }
        }
        txn.commit().unwrap();
    }
    t.elapsed().as_secs_f64()
}

fn summary(name: &str, mut rates: Vec<f64>) {
    rates.sort_by(f64::total_cmp);
    println!(
        "{name}: min {:.0}/s, median {:.0}/s",
        rates[0],
        rates[rates.len() / 2]
    );
}

fn main() {
    let n: usize = std::env::var("DOCS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let repeat: usize = std::env::var("REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let docs = documents(n);
    let bytes: usize = docs.iter().map(|(u, d)| u.len() + d.len()).sum();
    println!(
        "{n} documents, {} MB of URIs and content",
        bytes / 1_000_000
    );
    let work = std::env::temp_dir().join(format!("geoshard-store-writes-{}", std::process::id()));
    let seed = documents(20_000);
    let (mut store, mut compressed, mut alone) = (Vec::new(), Vec::new(), Vec::new());
    for run in 1..=repeat {
        let _ = std::fs::remove_dir_all(&work);
        let s = n as f64 / through_store(&work.join("store"), &docs);
        with_dictionary(&work.join("compressed"), &seed);
        let c = n as f64 / through_store(&work.join("compressed"), &docs);
        let a = n as f64 / redb_alone(&work.join("alone"), &docs);
        println!("run {run}: store {s:.0}/s, compressed {c:.0}/s, redb alone {a:.0}/s");
        store.push(s);
        compressed.push(c);
        alone.push(a);
    }
    let _ = std::fs::remove_dir_all(&work);
    summary("store (Store::write_blocking)", store);
    summary("store with a dictionary", compressed);
    summary("redb alone (get + insert)", alone);
}
