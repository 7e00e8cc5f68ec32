//! The store's unit tests.

use super::*;
use crate::acl::RoleSet;
pub(crate) use geoshard_core::testing::tempdir;

pub(crate) fn put(uri: &str, body: &str) -> Op {
    Op::PutDocument(PutDocument {
        uri: uri.into(),
        content: Bytes::copy_from_slice(body.as_bytes()),
        format: Format::Json,
        collections: None,
        permissions: None,
        default_permissions: Permissions::document_default(),
    })
}

pub(crate) fn writer() -> Caller {
    Caller::new("w", RoleSet::from_roles([Role::RestWriter]))
}

/// Log entry `seq` applied through the writer, waited for outside the runtime.
pub(crate) fn apply(
    store: &Store,
    seq: u64,
    caller: Caller,
    ops: Vec<Op>,
) -> Result<Written, StoreError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let answer = rt.block_on(store.apply_logged(seq, caller, ops)).unwrap();
    answer.blocking_recv().unwrap()
}

#[test]
fn commits_are_numbered_and_their_changes_recorded_after_a_save_point() {
    let dir = tempdir();
    let set = |v: &[&str]| -> Option<std::collections::BTreeSet<String>> {
        Some(v.iter().map(|s| s.to_string()).collect())
    };
    {
        let store = Store::open(&dir, StoreOptions::default()).unwrap();
        assert_eq!(store.last_commit(), 0);
        store
            .write_blocking(&writer(), vec![put("/a", "1"), put("/b", "2")])
            .unwrap();
        assert_eq!(store.last_commit(), 1);
        // Nothing is recorded before a save point.
        assert_eq!(store.changed_since(0).unwrap(), None);
        store.saved_at(1).unwrap();
        assert_eq!(store.changed_since(1).unwrap(), set(&[]));
        store
            .write_blocking(&writer(), vec![put("/c", "3")])
            .unwrap();
        store
            .write_blocking(&writer(), vec![put("/a", "4"), put("/c", "5")])
            .unwrap();
        // A refused write is no commit.
        let reader = Caller::new("r", RoleSet::from_roles([Role::RestReader]));
        assert!(store.write_blocking(&reader, vec![put("/d", "6")]).is_err());
        assert_eq!(store.last_commit(), 3);
        assert_eq!(store.changed_since(1).unwrap(), set(&["/a", "/c"]));
        assert_eq!(store.changed_since(2).unwrap(), set(&["/a", "/c"]));
        assert_eq!(store.changed_since(3).unwrap(), set(&[]));
        // Before the save point, the changes are not known.
        assert_eq!(store.changed_since(0).unwrap(), None);
        store.shutdown_blocking();
    }
    {
        // The number and the record survive a reopen; a new save point forgets the past.
        let store = Store::open(&dir, StoreOptions::default()).unwrap();
        assert_eq!(store.last_commit(), 3);
        assert_eq!(store.changed_since(1).unwrap(), set(&["/a", "/c"]));
        store.saved_at(2).unwrap();
        assert_eq!(store.changed_since(1).unwrap(), None);
        assert_eq!(store.changed_since(2).unwrap(), set(&["/a", "/c"]));
        // Past MAX_RECORDED (6 in tests) URIs since the save point, the record is dropped.
        store
            .write_blocking(&writer(), vec![put("/e", "1"), put("/f", "1")])
            .unwrap();
        assert_eq!(
            store.changed_since(2).unwrap(),
            set(&["/a", "/c", "/e", "/f"])
        );
        store
            .write_blocking(
                &writer(),
                vec![put("/g", "1"), put("/h", "1"), put("/i", "1")],
            )
            .unwrap();
        assert_eq!(store.last_commit(), 5);
        assert_eq!(store.changed_since(2).unwrap(), None);
        assert_eq!(store.changed_since(5).unwrap(), None);
        store.saved_at(5).unwrap();
        store
            .write_blocking(&writer(), vec![put("/j", "1")])
            .unwrap();
        assert_eq!(store.changed_since(5).unwrap(), set(&["/j"]));
        store.shutdown_blocking();
    }
}

#[test]
fn a_save_while_writes_go_on_starts_the_record_first_and_counts_only_if_it_held() {
    let dir = tempdir();
    let set = |v: &[&str]| -> Option<std::collections::BTreeSet<String>> {
        Some(v.iter().map(|s| s.to_string()).collect())
    };
    let store = Store::open(&dir, StoreOptions::default()).unwrap();
    store
        .write_blocking(&writer(), vec![put("/a", "1")])
        .unwrap();
    assert_eq!(store.recorded_changes().unwrap(), None);
    // Recording starts at the last commit; a second call keeps that point.
    assert_eq!(store.record_changes().unwrap(), 1);
    assert_eq!(store.recorded_changes().unwrap(), Some(0));
    store
        .write_blocking(&writer(), vec![put("/b", "1"), put("/a", "2")])
        .unwrap();
    assert_eq!(store.record_changes().unwrap(), 1);
    store
        .write_blocking(&writer(), vec![put("/b", "2")])
        .unwrap();
    assert_eq!(store.recorded_changes().unwrap(), Some(3));
    assert_eq!(store.changed_since(1).unwrap(), set(&["/a", "/b"]));
    // Saved as of commit 2 while commit 3 went on: commit 3 stays recorded.
    assert!(store.saved_live(2).unwrap());
    assert_eq!(store.changed_since(2).unwrap(), set(&["/b"]));
    assert_eq!(store.changed_since(1).unwrap(), None);
    assert_eq!(store.recorded_changes().unwrap(), Some(1));
    // The record dropped during a save (past MAX_RECORDED, 6 in tests): the save is
    // of no use, and says so without setting a save point.
    store
        .write_blocking(
            &writer(),
            (0..7).map(|i| put(&format!("/x{i}"), "1")).collect(),
        )
        .unwrap();
    assert_eq!(store.recorded_changes().unwrap(), None);
    assert!(!store.saved_live(4).unwrap());
    assert_eq!(store.changed_since(4).unwrap(), None);
    assert_eq!(store.recorded_changes().unwrap(), None);
    store.shutdown_blocking();
}

#[test]
fn log_entries_land_once_in_order_and_the_place_survives_a_reopen() {
    let dir = tempdir();
    let reader = Caller::new("r", RoleSet::from_roles([Role::RestReader]));
    {
        let store = Store::open(&dir, StoreOptions::default()).unwrap();
        assert_eq!(store.applied(), 0);
        let w = apply(&store, 1, writer(), vec![put("/a", "1")]).unwrap();
        assert_eq!(w.outcomes, vec![Outcome::Created]);
        // A refused entry is applied too (every node refuses it alike).
        let refused = apply(&store, 2, reader.clone(), vec![put("/b", "2")]);
        assert!(
            matches!(refused, Err(StoreError::Forbidden { .. })),
            "{refused:?}"
        );
        assert_eq!(store.applied(), 2);
        // A repeat and a gap write nothing and move nothing.
        let again = apply(&store, 1, writer(), vec![put("/a", "again")]);
        assert_eq!(
            again.unwrap_err(),
            StoreError::Sequence {
                expected: 3,
                got: 1
            }
        );
        let gap = apply(&store, 5, writer(), vec![put("/c", "5")]);
        assert_eq!(
            gap.unwrap_err(),
            StoreError::Sequence {
                expected: 3,
                got: 5
            }
        );
        assert_eq!(store.applied(), 2);
        assert!(store.get(&reader, "/c").unwrap().is_none());
        assert_eq!(
            store.get(&reader, "/a").unwrap().unwrap().content,
            Bytes::from_static(b"1")
        );
        store.shutdown_blocking();
    }
    let store = Store::open(&dir, StoreOptions::default()).unwrap();
    assert_eq!(store.applied(), 2);
    assert!(apply(&store, 3, writer(), vec![put("/c", "3")]).is_ok());
    assert_eq!(store.applied(), 3);
    store.shutdown_blocking();
}

#[test]
fn create_replace_delete_and_reopen() {
    let dir = tempdir();
    {
        let store = Store::open(&dir, StoreOptions::default()).unwrap();
        let w = writer();
        assert_eq!(
            store
                .write_blocking(&w, vec![put("/a", "1")])
                .unwrap()
                .outcomes,
            vec![Outcome::Created]
        );
        assert_eq!(
            store
                .write_blocking(&w, vec![put("/a", "2")])
                .unwrap()
                .outcomes,
            vec![Outcome::Replaced]
        );
        assert_eq!(
            store
                .write_blocking(&w, vec![put("/b", "3")])
                .unwrap()
                .outcomes,
            vec![Outcome::Created]
        );
        assert_eq!(
            store
                .write_blocking(&w, vec![Op::DeleteDocument { uri: "/b".into() }])
                .unwrap()
                .outcomes,
            vec![Outcome::Deleted]
        );
        assert_eq!(
            store
                .write_blocking(&w, vec![Op::DeleteDocument { uri: "/b".into() }])
                .unwrap()
                .outcomes,
            vec![Outcome::Absent]
        );
        store.shutdown_blocking();
    }
    let store = Store::open(&dir, StoreOptions::default()).unwrap();
    let doc = store.get(&writer(), "/a").unwrap().unwrap();
    assert_eq!(&doc.content[..], b"2");
    assert!(store.get(&writer(), "/b").unwrap().is_none());
    store.shutdown_blocking();
}

/// A hook whose rule changes with its generation: from generation 2 on, a document "bad"
/// is refused. It counts the checks made on the writer thread and the early ones.
#[derive(Default)]
struct RuleHook {
    generation: AtomicU64,
    early: AtomicU64,
    on_writer: AtomicU64,
}

impl CommitHook for RuleHook {
    fn check(&self, doc: &Document) -> Result<Checked, Rejection> {
        if std::thread::current().name() == Some("store-writer") {
            self.on_writer.fetch_add(1, Ordering::Relaxed);
        }
        let g = self.generation.load(Ordering::Relaxed);
        if g >= 2 && &doc.content[..] == b"\"bad\"" {
            return Err(Rejection::Definition(format!("{} is bad", doc.uri)));
        }
        Ok(Checked {
            warnings: vec![format!("checked at {g}")],
            prepared: None,
            elsewhere: None,
        })
    }
    fn committed(&self, _: &[Change]) -> Option<Settling> {
        None
    }
    fn precheck(&self, doc: &Document) -> Option<Result<Checked, Rejection>> {
        self.early.fetch_add(1, Ordering::Relaxed);
        Some(self.check(doc))
    }
    fn generation(&self) -> Option<u64> {
        Some(self.generation.load(Ordering::Relaxed))
    }
}

/// Early checks are taken while they still hold: same generation, same document. A write
/// checked early whose hook state then moved, or that lands another document than the
/// one checked (an update keeping other collections), is checked again by the writer.
#[test]
fn early_checks_are_taken_only_while_they_hold() {
    let dir = tempdir();
    let store = Arc::new(Store::open(&dir, StoreOptions::default()).unwrap());
    let hook = Arc::new(RuleHook::default());
    hook.generation.store(1, Ordering::Relaxed);
    store.set_hook(hook.clone());
    let w = writer();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        // A large write (checked in parallel) and a small one: no check on the writer.
        let many: Vec<Op> = (0..40).map(|i| put(&format!("/m{i}"), "1")).collect();
        let written = store.write(&w, many).await.unwrap();
        assert_eq!(written.warnings.len(), 40);
        assert!(written.warnings.iter().all(|x| x.message == "checked at 1"));
        store.write(&w, vec![put("/one", "1")]).await.unwrap();
        assert_eq!(hook.early.load(Ordering::Relaxed), 41);
        assert_eq!(hook.on_writer.load(Ordering::Relaxed), 0);

        // Checked early at generation 1, landing at 2: the writer's check refuses it.
        let (ops, pre) = store.precheck(vec![put("/bad", "\"bad\"")]).await.unwrap();
        assert!(matches!(&pre[0], Some(p) if p.result.is_ok()));
        hook.generation.store(2, Ordering::Relaxed);
        let refused = store.submit(&w, ops, pre).await;
        assert!(
            matches!(&refused, Err(StoreError::Rejected(r)) if r.to_string() == "/bad is bad"),
            "{refused:?}"
        );
        assert_eq!(hook.on_writer.load(Ordering::Relaxed), 1);
        assert!(store.get(&w, "/bad").unwrap().is_none());

        // An update that keeps the stored collections lands another document than the
        // one checked early (which had none): checked again.
        let mut tagged = put("/c", "1");
        if let Op::PutDocument(p) = &mut tagged {
            p.collections = Some(vec!["c".into()]);
        }
        store.write(&w, vec![tagged]).await.unwrap();
        assert_eq!(hook.on_writer.load(Ordering::Relaxed), 1);
        let kept = store.write(&w, vec![put("/c", "2")]).await.unwrap();
        assert_eq!(kept.warnings[0].message, "checked at 2");
        assert_eq!(hook.on_writer.load(Ordering::Relaxed), 2);
        assert_eq!(store.get(&w, "/c").unwrap().unwrap().collections, ["c"]);
    });
    store.shutdown_blocking();
}

/// A hook whose check panics on one URI.
struct PanickingCheck;

impl CommitHook for PanickingCheck {
    fn check(&self, doc: &Document) -> Result<Checked, Rejection> {
        assert_ne!(doc.uri, "/boom", "a check that panics");
        Ok(Checked::default())
    }
    fn committed(&self, _: &[Change]) -> Option<Settling> {
        None
    }
}

#[test]
fn a_panicking_check_refuses_its_request_and_the_writer_goes_on() {
    let dir = tempdir();
    let store = Arc::new(Store::open(&dir, StoreOptions::default()).unwrap());
    store.set_hook(Arc::new(PanickingCheck));
    let w = writer();
    // Concurrent requests share group commits with the one whose check panics.
    let answers: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = ["/a", "/boom", "/b", "/c"]
            .into_iter()
            .map(|uri| {
                let (store, w) = (&store, &w);
                s.spawn(move || (uri, store.write_blocking(w, vec![put(uri, "1")])))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (uri, answer) in answers {
        match uri {
            "/boom" => assert!(
                matches!(&answer, Err(StoreError::Internal(m)) if m.contains("/boom")),
                "{answer:?}"
            ),
            _ => assert_eq!(answer.unwrap().outcomes, vec![Outcome::Created], "{uri}"),
        }
    }
    assert!(store.get(&w, "/boom").unwrap().is_none());
    // The writer is still there.
    let later = store.write_blocking(&w, vec![put("/d", "2")]).unwrap();
    assert_eq!(later.outcomes, vec![Outcome::Created]);
    assert_eq!(&store.get(&w, "/d").unwrap().unwrap().content[..], b"2");
    store.shutdown_blocking();
}

/// Short of free space, writes are refused before redb sees them, and reads go on; with
/// space (a bound it meets), writes go on.
#[test]
fn writes_wait_for_free_space_and_reads_go_on() {
    let dir = tempdir();
    let w = writer();
    {
        let store = Store::open(&dir, StoreOptions::default()).unwrap();
        store.write_blocking(&w, vec![put("/a", "1")]).unwrap();
        store.shutdown_blocking();
    }
    let full = StoreOptions {
        min_free_bytes: u64::MAX,
        ..StoreOptions::default()
    };
    {
        let store = Store::open(&dir, full).unwrap();
        let refused = store.write_blocking(&w, vec![put("/b", "2")]);
        assert!(
            matches!(&refused, Err(StoreError::Full { min, .. }) if *min == u64::MAX),
            "{refused:?}"
        );
        assert!(
            refused
                .unwrap_err()
                .to_string()
                .contains("min_free_disk_bytes")
        );
        assert_eq!(&store.get(&w, "/a").unwrap().unwrap().content[..], b"1");
        assert!(store.get(&w, "/b").unwrap().is_none());
        store.shutdown_blocking();
    }
    let roomy = StoreOptions {
        min_free_bytes: 1,
        ..StoreOptions::default()
    };
    let store = Store::open(&dir, roomy).unwrap();
    store.write_blocking(&w, vec![put("/b", "2")]).unwrap();
    assert_eq!(&store.get(&w, "/b").unwrap().unwrap().content[..], b"2");
    assert!(free_bytes(&dir).unwrap() > 0);
    store.shutdown_blocking();
}

#[test]
fn update_needs_update_permission_and_request_is_atomic() {
    let dir = tempdir();
    let store = Store::open(&dir, StoreOptions::default()).unwrap();
    let admin = Caller::system();
    let mut only_geo = Permissions::new();
    only_geo.grant(Role::GeoReader, Capability::Read);
    let op = Op::PutDocument(PutDocument {
        uri: "/locked".into(),
        content: Bytes::from_static(b"{}"),
        format: Format::Json,
        collections: Some(vec!["c".into()]),
        permissions: Some(only_geo),
        default_permissions: Permissions::document_default(),
    });
    store.write_blocking(&admin, vec![op]).unwrap();
    let w = writer();
    // The writer can neither read nor replace it; a request mixing a good and a
    // forbidden operation lands neither.
    assert!(store.get(&w, "/locked").unwrap().is_none());
    let err = store
        .write_blocking(&w, vec![put("/fresh", "1"), put("/locked", "2")])
        .unwrap_err();
    assert!(matches!(err, StoreError::Forbidden { .. }));
    assert!(store.get(&admin, "/fresh").unwrap().is_none());
    // Collections are kept on an update that does not name them.
    store
        .write_blocking(&admin, vec![put("/locked", "3")])
        .unwrap();
    let doc = store.get(&admin, "/locked").unwrap().unwrap();
    assert_eq!(doc.collections, vec!["c".to_string()]);
    assert_eq!(doc.permissions, only_geo);
    store.shutdown_blocking();
}

#[test]
fn records_by_prefix() {
    let dir = tempdir();
    let store = Store::open(&dir, StoreOptions::default()).unwrap();
    let sys = Caller::system();
    let rec = |k: &str| Op::PutRecord {
        table: Table::Traces,
        key: k.into(),
        value: k.as_bytes().to_vec(),
    };
    store
        .write_blocking(&sys, vec![rec("j1/a"), rec("j1/b"), rec("j2/a")])
        .unwrap();
    let got: Vec<String> = store
        .records(Table::Traces, "j1/")
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(got, vec!["j1/a", "j1/b"]);
    // Non-admins may not touch the user table.
    let err = store
        .write_blocking(
            &writer(),
            vec![Op::PutRecord {
                table: Table::Users,
                key: "x".into(),
                value: vec![],
            }],
        )
        .unwrap_err();
    assert!(matches!(err, StoreError::Forbidden { .. }));
    store.shutdown_blocking();
}

fn place(i: usize) -> String {
    format!(
        r#"{{"type":"Feature","properties":{{"name":"Place {i}","n":{i}}},"geometry":{{"type":"Point","coordinates":[{}.{},{}.{}]}}}}"#,
        i % 180,
        i * 7919 % 100_000,
        i % 90,
        i * 104_729 % 100_000
    )
}

fn every_document(dir: &std::path::Path) -> Vec<Document> {
    let store = Store::open(dir, StoreOptions::default()).unwrap();
    let mut docs = Vec::new();
    store
        .scan_documents(|d| {
            docs.push(d);
            Ok(())
        })
        .unwrap();
    store.shutdown_blocking();
    docs
}

/// The first byte of each stored value: the codec's version (2: compressed).
fn stored_versions(store: &Store) -> Vec<u8> {
    let txn = store.db.begin_read().unwrap();
    let table = txn.open_table(DOCUMENTS).unwrap();
    table
        .iter()
        .unwrap()
        .map(|r| r.unwrap().1.value()[0])
        .collect()
}

#[test]
fn a_repack_keeps_every_document_and_record_and_compresses_later_writes() {
    let dir = tempdir();
    let n = 3_000;
    let (point, commits) = {
        let store = Store::open(&dir, StoreOptions::default()).unwrap();
        for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
            let ops = chunk
                .iter()
                .map(|i| put(&format!("/p/{i}.json"), &place(*i)))
                .collect();
            store.write_blocking(&writer(), ops).unwrap();
        }
        let record = Op::PutRecord {
            table: Table::Meta,
            key: "k".into(),
            value: b"v".to_vec(),
        };
        store
            .write_blocking(&Caller::system(), vec![record])
            .unwrap();
        let point = store.last_commit();
        store.saved_at(point).unwrap();
        store
            .write_blocking(&writer(), vec![put("/p/7.json", &place(70_007))])
            .unwrap();
        assert!(stored_versions(&store).iter().all(|v| *v == 1));
        let commits = store.last_commit();
        store.shutdown_blocking();
        (point, commits)
    };
    let before = every_document(&dir);
    assert_eq!(before.len(), n);
    // What a repack cut short left is no store: it is passed over.
    std::fs::write(dir.join("geoshard.redb.repack"), b"half a file").unwrap();

    let mut told = Vec::new();
    let r = repack(&dir, |done, all| told.push((done, all))).unwrap();
    assert!(r.trained);
    assert_eq!(r.documents, n as u64);
    assert_eq!(told.last(), Some(&(n as u64, n as u64)));
    assert!(
        r.bytes_after < r.bytes_before,
        "{} bytes after, {} before",
        r.bytes_after,
        r.bytes_before
    );
    assert!(!dir.join("geoshard.redb.repack").exists());

    assert_eq!(every_document(&dir), before);
    let store = Store::open(&dir, StoreOptions::default()).unwrap();
    assert!(stored_versions(&store).iter().all(|v| *v == 3));
    assert_eq!(
        store.get_record(Table::Meta, "k").unwrap(),
        Some(b"v".to_vec())
    );
    assert_eq!(store.last_commit(), commits);
    let changed = store.changed_since(point).unwrap().unwrap();
    assert_eq!(changed.into_iter().collect::<Vec<_>>(), ["/p/7.json"]);
    // Later writes are compressed with the dictionary, and read back.
    store
        .write_blocking(&writer(), vec![put("/q/1.json", &place(123_456))])
        .unwrap();
    assert_eq!(
        stored_versions(&store).iter().filter(|v| **v == 3).count(),
        n + 1
    );
    let doc = store.get(&writer(), "/q/1.json").unwrap().unwrap();
    assert_eq!(&doc.content[..], place(123_456).as_bytes());
    store.shutdown_blocking();
    drop(store);

    // A second repack reads the first's dictionary and trains its own.
    let again = repack(&dir, |_, _| {}).unwrap();
    assert_eq!(again.documents, n as u64 + 1);
    let after = every_document(&dir);
    assert_eq!(after.len(), n + 1);
    assert_eq!(
        after
            .iter()
            .filter(|d| d.uri != "/q/1.json")
            .cloned()
            .collect::<Vec<_>>(),
        before
    );
}

#[test]
fn a_repack_of_a_few_documents_keeps_them_plain() {
    let dir = tempdir();
    {
        let store = Store::open(&dir, StoreOptions::default()).unwrap();
        store
            .write_blocking(&writer(), vec![put("/a", &place(1)), put("/b", "2")])
            .unwrap();
        store.shutdown_blocking();
    }
    let before = every_document(&dir);
    let r = repack(&dir, |_, _| {}).unwrap();
    assert!(!r.trained);
    assert_eq!(every_document(&dir), before);
}

#[test]
fn a_dictionary_trained_while_open_compresses_every_later_write() {
    let dir = tempdir();
    let n = 2_000;
    {
        let store = Store::open(&dir, StoreOptions::default()).unwrap();
        store
            .write_blocking(&writer(), vec![put("/before.json", &place(1))])
            .unwrap();
        let samples: Vec<Vec<u8>> = (0..n).map(|i| place(i).into_bytes()).collect();
        // Too few samples train nothing; enough train one, once.
        assert!(!store.train_dictionary(&samples[..10]).unwrap());
        assert!(store.train_dictionary(&samples).unwrap());
        assert!(!store.train_dictionary(&samples).unwrap());
        let ops: Vec<Op> = (0..n)
            .map(|i| put(&format!("/p/{i}.json"), &place(i)))
            .collect();
        store.write_blocking(&writer(), ops).unwrap();
        // The document written before stays plain; every later one is compressed.
        let versions = stored_versions(&store);
        assert_eq!(versions.iter().filter(|v| **v == 3).count(), n);
        assert_eq!(versions.len(), n + 1);
        store.shutdown_blocking();
    }
    // Read back after a reopen, which finds the dictionary in the store.
    let store = Store::open(&dir, StoreOptions::default()).unwrap();
    for i in (0..n).step_by(37) {
        let doc = store
            .get(&writer(), &format!("/p/{i}.json"))
            .unwrap()
            .unwrap();
        assert_eq!(&doc.content[..], place(i).as_bytes());
    }
    let doc = store.get(&writer(), "/before.json").unwrap().unwrap();
    assert_eq!(&doc.content[..], place(1).as_bytes());
    store
        .write_blocking(&writer(), vec![put("/after.json", &place(7))])
        .unwrap();
    assert_eq!(
        stored_versions(&store).iter().filter(|v| **v == 3).count(),
        n + 1
    );
}

#[test]
fn a_repack_keeping_the_dictionary_copies_what_it_compressed() {
    let dir = tempdir();
    let n = 2_000;
    {
        let store = Store::open(&dir, StoreOptions::default()).unwrap();
        store
            .write_blocking(&writer(), vec![put("/plain.json", &place(5))])
            .unwrap();
        let samples: Vec<Vec<u8>> = (0..n).map(|i| place(i).into_bytes()).collect();
        assert!(store.train_dictionary(&samples).unwrap());
        // Written out of key order, as a load's batches are.
        let ops: Vec<Op> = (0..n)
            .rev()
            .map(|i| put(&format!("/p/{i}.json"), &place(i)))
            .collect();
        store.write_blocking(&writer(), ops).unwrap();
        store.shutdown_blocking();
    }
    let before = every_document(&dir);
    let r = repack_with(&dir, Dictionary::Keep, |_, _| {}).unwrap();
    assert!(!r.trained);
    assert_eq!(r.documents, n as u64 + 1);
    assert_eq!(every_document(&dir), before);
    // The plain one compressed too, with the same dictionary.
    let store = Store::open(&dir, StoreOptions::default()).unwrap();
    assert!(stored_versions(&store).iter().all(|v| *v == 3));
}

/// Decides one record per change, topic by the URI's first letter, and keeps what it hears
/// after the commit.
#[derive(Default)]
struct Recording {
    heard: parking_lot::Mutex<Vec<(u64, usize)>>,
}

impl CommitHook for Recording {
    fn check(&self, _: &Document) -> Result<Checked, Rejection> {
        Ok(Checked::default())
    }
    fn committed(&self, _: &[Change]) -> Option<Settling> {
        None
    }
    fn decide(&self, changes: &[Change]) -> Vec<Record> {
        changes
            .iter()
            .map(|c| Record {
                topic: c.uri[1..2].to_string(),
                time_ms: if c.uri.contains("old") {
                    1
                } else {
                    geoshard_core::time::now_ms()
                },
                body: c.uri.as_bytes().to_vec(),
            })
            .collect()
    }
    fn recorded(&self, first: u64, records: Vec<Record>) {
        self.heard.lock().push((first, records.len()));
    }
}

#[test]
fn records_are_kept_with_their_commit_numbered_by_topic_and_trimmed() {
    let dir = tempdir();
    let options = StoreOptions {
        event_retention: Retention {
            max_age_ms: 60_000,
            max_bytes: 10 * 30,
        },
        ..StoreOptions::default()
    };
    let store = Store::open(&dir, options).unwrap();
    let hook = Arc::new(Recording::default());
    store.set_hook(hook.clone());
    let w = writer();
    // A record past the age bound is dropped once it is the oldest: here at once.
    store.write_blocking(&w, vec![put("/cold", "1")]).unwrap();
    assert!(store.events_after("c", 0, 10).unwrap().records.is_empty());
    store
        .write_blocking(&w, vec![put("/a1", "1"), put("/b1", "1"), put("/a2", "1")])
        .unwrap();
    store.write_blocking(&w, vec![put("/a3", "1")]).unwrap();
    assert_eq!(*hook.heard.lock(), [(1, 1), (2, 3), (5, 1)]);
    let kept = store.events_after("a", 0, 10).unwrap();
    let got: Vec<(u64, &[u8])> = kept
        .records
        .iter()
        .map(|(n, r)| (*n, &r.body[..]))
        .collect();
    assert_eq!(got, [(2, &b"/a1"[..]), (4, b"/a2"), (5, b"/a3")]);
    assert_eq!(store.events_after("a", 4, 10).unwrap().records.len(), 1);
    assert_eq!(store.events_after("b", 0, 10).unwrap().records.len(), 1);
    assert_eq!(store.last_event().unwrap(), 5);
    // Past the bytes (each record is 8 + 2 + 1 + 3 bytes here), the oldest go.
    for i in 0..30 {
        store
            .write_blocking(&w, vec![put(&format!("/z{i:02}"), "1")])
            .unwrap();
    }
    let z = store.events_after("z", 0, 100).unwrap();
    assert!(
        z.records.len() < 30 && z.records.len() >= 15,
        "{}",
        z.records.len()
    );
    assert_eq!(z.records.last().unwrap().1.body, b"/z29");
    assert!(store.events_after("a", 0, 10).unwrap().records.is_empty());
    assert_eq!(z.oldest, Some(z.records[0].0));
    store.shutdown_blocking();
    drop(store);
    // And they are there after a restart.
    let store = Store::open(&dir, options).unwrap();
    assert_eq!(store.events_after("z", 0, 100).unwrap().records, z.records);
    assert_eq!(store.last_event().unwrap(), 35);
    store.shutdown_blocking();
}
