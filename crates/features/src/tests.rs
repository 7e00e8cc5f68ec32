//! The features crate's unit tests.

use super::*;

/// A background build (a template change over many rows) runs in its own pool, at a
/// lower priority, so that queries keep the other cores: with every thread of the global
/// rayon pool held, it must still finish.
#[test]
fn a_background_build_needs_no_thread_of_the_global_pool() {
    use crate::store::{Format, Op, PutDocument, StoreOptions};
    let dir = geoshard_core::testing::tempdir();
    let store = Arc::new(Store::open(&dir, StoreOptions::default()).unwrap());
    let layer =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/layers/places");
    let read = |name: &str| std::fs::read(layer.join(name)).unwrap();
    let put = |uri: String, content: Vec<u8>, collection: &str| {
        Op::PutDocument(PutDocument {
            uri,
            content: content.into(),
            format: Format::Json,
            collections: Some(vec![collection.to_string()]),
            permissions: None,
            default_permissions: crate::acl::Permissions::document_default(),
        })
    };
    let mut ops = vec![
        put("/t.json".into(), read("template.json"), TEMPLATE_COLLECTION),
        put(
            "/d.json".into(),
            read("descriptor.json"),
            DESCRIPTOR_COLLECTION,
        ),
    ];
    const PLACES: usize = 5_000;
    for i in 0..PLACES {
        let doc = serde_json::json!({"OBJECTID": i, "name": format!("p{i}"), "cc": "FR",
            "geometry": {"type": "Point", "coordinates": [2.0 + i as f64 * 1e-4, 48.0]}});
        ops.push(put(
            format!("/p/{i}.json"),
            doc.to_string().into_bytes(),
            "demo-places",
        ));
    }
    store
        .write_blocking(&crate::acl::Caller::system(), ops)
        .unwrap();
    let settings = FeatureSettings::default();
    let features = Features::open(store.clone(), settings).unwrap();
    let (next, keys) = {
        let c = features.catalog.read();
        let next = Catalog {
            generation: c.generation + 1,
            templates: c.templates.clone(),
            descriptors: c.descriptors.clone(),
            views: Default::default(),
        };
        (next, c.views.keys().cloned().collect::<Vec<_>>())
    };
    assert_eq!(keys.len(), 1);

    // Every thread of the global pool waits until the build is over (or has failed).
    let threads = rayon::current_num_threads();
    let (held, holding) = crossbeam_channel::unbounded::<()>();
    let (release, released) = crossbeam_channel::unbounded::<()>();
    for _ in 0..threads {
        let (held, released) = (held.clone(), released.clone());
        rayon::spawn(move || {
            held.send(()).unwrap();
            let _ = released.recv();
        });
    }
    for _ in 0..threads {
        holding.recv().unwrap();
    }
    // Built and in place (its last step, giving memory back, visits every thread of the
    // global pool: it waits for them, as it should).
    let generation = next.generation;
    let building = features.clone();
    let build = std::thread::spawn(move || building.build_in_background(next, keys));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while features.catalog.read().generation != generation && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let built = features.catalog.read().generation == generation;
    drop(release);
    build.join().unwrap();
    assert!(
        built,
        "the background build waited for the global rayon pool"
    );
    let catalog = features.catalog.read();
    let (_, view) = catalog.views.iter().next().unwrap();
    assert_eq!(view.data.read().len(), PLACES);
    drop(catalog);
    store.shutdown_blocking();
}

#[test]
fn a_panic_reading_a_document_is_a_refusal() {
    let view = ViewKey::new("S", "V");
    let r: Result<(), Refusal> = unless_panics(&view, || panic!("a reader bug"));
    let refusal = r.unwrap_err();
    assert_eq!(refusal, Refusal::Internal { view: view.clone() });
    assert_eq!(
        refusal.to_string(),
        "view s.v: the document could not be read (an internal error)"
    );
    // Answers and refusals pass through as they are.
    assert_eq!(unless_panics(&view, || Ok(7)), Ok(7));
    let vertices = Refusal::Vertices {
        view: view.clone(),
        path: "geometry".into(),
        count: 2,
        max: 1,
    };
    assert_eq!(
        unless_panics::<()>(&view, || Err(vertices.clone())),
        Err(vertices)
    );
}

/// A reader that reads again while a writer waits (a query whose rayon thread takes up
/// another query of the same view) is not stopped by the writer: the writer steps aside,
/// the second read goes through, and the writer has the lock once both readers are done.
#[test]
fn a_waiting_writer_lets_a_reader_read_again() {
    use std::sync::mpsc;
    use std::time::Duration;
    let lock = Arc::new(RwLock::new(0u32));
    let outer = lock.read();
    let writer = {
        let lock = lock.clone();
        std::thread::spawn(move || *write_between_readers(&lock) += 1)
    };
    // The writer is waiting now, or soon.
    std::thread::sleep(Duration::from_millis(50));
    let (done, read_again) = mpsc::channel();
    let reader = {
        let lock = lock.clone();
        std::thread::spawn(move || {
            let inner = lock.read();
            let _ = done.send(*inner);
        })
    };
    let seen = read_again.recv_timeout(Duration::from_secs(5));
    assert_eq!(seen, Ok(0), "the second read waited for the writer");
    reader.join().unwrap();
    drop(outer);
    writer.join().unwrap();
    assert_eq!(*lock.read(), 1);
}
