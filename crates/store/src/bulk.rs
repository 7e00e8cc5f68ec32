//! A bulk load into a store that holds no documents but definitions: each document encoded
//! (compressed) once as it comes, kept in sorted runs in `bulk/` beside the store file, then
//! merged in key order into a table of its own, so that its B-tree is built from its first
//! page to its last, each page full (redb starts a new leaf for a key past every other), with
//! no insert out of order and no document written twice. The store's documents (the
//! definitions) then join it, and it takes the documents table's place, in one transaction.
//!
//! Until that transaction, the store is as it was: a crash leaves the run files and the side
//! table, which the next open deletes.

use std::collections::BinaryHeap;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rayon::prelude::*;

use redb::{ReadableTable, TableDefinition};

use super::{DOCUMENTS, Document, Store, StoreError, changes, codec, storage};

/// Where the merge writes, before the table takes the documents' place.
pub(crate) const MERGED: TableDefinition<&str, &[u8]> = TableDefinition::new("documents.bulk");

/// Encoded documents kept in memory before they are sorted and written as a run.
const RUN_BYTES: usize = 256 << 20;
/// Documents inserted in one transaction of the merge.
const ROWS_A_COMMIT: usize = 50_000;
/// What an entry costs in memory beyond its bytes: the key's and value's vectors.
const ENTRY_OVERHEAD: usize = 64;

/// The directory of a bulk load's runs in a data directory.
pub(crate) fn runs_dir(dir: &Path) -> PathBuf {
    dir.join("bulk")
}

/// A bulk load under way; see the module's documentation.
pub struct Bulk {
    store: Arc<Store>,
    dir: PathBuf,
    runs: Vec<PathBuf>,
    /// Encoded documents not yet in a run: URI, stored bytes.
    buffer: Vec<(String, Vec<u8>)>,
    buffered: usize,
    added: u64,
}

/// What a bulk load's merge wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BulkWritten {
    /// Documents written (a URI given twice counts once: the later one).
    pub documents: u64,
    /// Sorted runs written to disk before the merge.
    pub runs: usize,
    /// The store file's size after.
    pub bytes: u64,
    pub took: Duration,
}

impl Store {
    /// Whether the store holds documents of `collections` only (templates and descriptors,
    /// for a load): a bulk load may then go into it.
    pub fn holds_only(&self, collections: &[&str]) -> Result<bool, StoreError> {
        const FEW: u64 = 10_000;
        if self.document_count()? > FEW {
            return Ok(false);
        }
        // Any other document is passed over on its header alone, and not counted.
        let mut held = 0;
        self.scan_documents_in(collections, |_| {
            held += 1;
            Ok(())
        })?;
        Ok(held == self.document_count()?)
    }

    /// Start a bulk load: documents given to [`Bulk::add`] reach the store at
    /// [`Bulk::finish`], through no writer and no commit hook. For a store that holds no
    /// document a load may give again (see [`Store::holds_only`]), with no other writer.
    pub fn bulk(self: &Arc<Self>) -> Result<Bulk, StoreError> {
        let dir = runs_dir(self.path.parent().unwrap_or(Path::new(".")));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(storage)?;
        Ok(Bulk {
            store: self.clone(),
            dir,
            runs: Vec::new(),
            buffer: Vec::new(),
            buffered: 0,
            added: 0,
        })
    }
}

impl Bulk {
    /// Encode `docs` (on rayon) with the store's dictionary, and keep them for the merge.
    pub fn add(&mut self, docs: &[Document]) -> Result<(), StoreError> {
        let dictionary = self.store.dictionary.load(Ordering::Acquire);
        let encoded: Vec<(String, Vec<u8>)> = docs
            .par_iter()
            .with_min_len(16)
            .map(|d| (d.uri.clone(), codec::encode(d, dictionary)))
            .collect();
        self.added += encoded.len() as u64;
        for e in encoded {
            self.buffered += e.0.len() + e.1.len() + ENTRY_OVERHEAD;
            self.buffer.push(e);
        }
        if self.buffered >= RUN_BYTES {
            self.spill()?;
        }
        Ok(())
    }

    /// Documents added so far.
    pub fn added(&self) -> u64 {
        self.added
    }

    /// The buffer sorted by URI (stably, so of one URI the later stays later) and written
    /// as a run: a `u32` key length, a `u32` value length, the key, the value, each entry.
    fn spill(&mut self) -> Result<(), StoreError> {
        self.buffer.sort_by(|a, b| a.0.cmp(&b.0));
        let path = self.dir.join(format!("run-{:05}", self.runs.len()));
        let file = std::fs::File::create(&path).map_err(storage)?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        for (k, v) in self.buffer.drain(..) {
            out.write_all(&(k.len() as u32).to_le_bytes())
                .and_then(|_| out.write_all(&(v.len() as u32).to_le_bytes()))
                .and_then(|_| out.write_all(k.as_bytes()))
                .and_then(|_| out.write_all(&v))
                .map_err(storage)?;
        }
        out.flush().map_err(storage)?;
        self.buffered = 0;
        self.runs.push(path);
        Ok(())
    }

    /// Merge the runs and the documents still in memory into the documents table, in key
    /// order, `ROWS_A_COMMIT` to a transaction, each a commit of the store; the last of one
    /// URI wins. `progress` is told the documents merged so far and added in all. The runs
    /// are deleted after.
    pub fn finish(mut self, mut progress: impl FnMut(u64, u64)) -> Result<BulkWritten, StoreError> {
        let started = Instant::now();
        self.buffer.sort_by(|a, b| a.0.cmp(&b.0));
        let memory = std::mem::take(&mut self.buffer);
        let mut sources: Vec<Source> = Vec::with_capacity(self.runs.len() + 1);
        for path in &self.runs {
            let file = std::fs::File::open(path).map_err(storage)?;
            sources.push(Source::Run(BufReader::with_capacity(1 << 20, file)));
        }
        sources.push(Source::Memory(memory.into_iter()));
        let runs = self.runs.len();
        let mut merge = Merge::new(sources)?;
        let (mut written, total) = (0u64, self.added);
        loop {
            let mut chunk: Vec<(String, Vec<u8>)> = Vec::with_capacity(ROWS_A_COMMIT);
            while chunk.len() < ROWS_A_COMMIT {
                match merge.next()? {
                    Some(e) => chunk.push(e),
                    None => break,
                }
            }
            if chunk.is_empty() {
                break;
            }
            let mut txn = self.store.db.begin_write().map_err(storage)?;
            txn.set_quick_repair(self.store.quick_repair);
            {
                let mut merged = txn.open_table(MERGED).map_err(storage)?;
                for (uri, stored) in &chunk {
                    merged
                        .insert(uri.as_str(), stored.as_slice())
                        .map_err(storage)?;
                }
            }
            txn.commit().map_err(storage)?;
            written += chunk.len() as u64;
            progress(written.min(total), total);
        }
        // The store's own documents (definitions, a few) join the merged ones, unless a load
        // gave their URI; the merged table takes the documents' place; one commit.
        let mut txn = self.store.db.begin_write().map_err(storage)?;
        txn.set_quick_repair(self.store.quick_repair);
        {
            let docs = txn.open_table(DOCUMENTS).map_err(storage)?;
            let mut merged = txn.open_table(MERGED).map_err(storage)?;
            for row in docs.iter().map_err(storage)? {
                let (k, v) = row.map_err(storage)?;
                if merged.get(k.value()).map_err(storage)?.is_none() {
                    merged.insert(k.value(), v.value()).map_err(storage)?;
                }
            }
        }
        txn.delete_table(DOCUMENTS).map_err(storage)?;
        txn.rename_table(MERGED, DOCUMENTS).map_err(storage)?;
        let commit = changes::record_wholesale(&txn)?;
        txn.commit().map_err(storage)?;
        self.store
            .stats
            .last_commit
            .store(commit, Ordering::Release);
        drop(merge);
        let _ = std::fs::remove_dir_all(&self.dir);
        tracing::info!(
            documents = written,
            runs,
            secs = started.elapsed().as_secs_f64(),
            "bulk load merged into the store"
        );
        Ok(BulkWritten {
            documents: written,
            runs,
            bytes: std::fs::metadata(&self.store.path).map_err(storage)?.len(),
            took: started.elapsed(),
        })
    }
}

/// A sorted run: on disk, or the last, still in memory.
enum Source {
    Run(BufReader<std::fs::File>),
    Memory(std::vec::IntoIter<(String, Vec<u8>)>),
}

impl Source {
    fn next(&mut self) -> Result<Option<(String, Vec<u8>)>, StoreError> {
        let reader = match self {
            Source::Memory(it) => return Ok(it.next()),
            Source::Run(r) => r,
        };
        let mut lengths = [0u8; 8];
        match reader.read_exact(&mut lengths) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(storage(e)),
        }
        let klen = u32::from_le_bytes(lengths[..4].try_into().unwrap_or_default()) as usize;
        let vlen = u32::from_le_bytes(lengths[4..].try_into().unwrap_or_default()) as usize;
        let mut key = vec![0u8; klen];
        let mut value = vec![0u8; vlen];
        reader
            .read_exact(&mut key)
            .and_then(|_| reader.read_exact(&mut value))
            .map_err(storage)?;
        let key = String::from_utf8(key)
            .map_err(|_| StoreError::Corrupt("a bulk load's run: a key is not UTF-8".into()))?;
        Ok(Some((key, value)))
    }
}

/// A head of one source in the merge's heap: the smallest key first, and of equal keys the
/// earlier source first (so that the later one, popped after, wins).
struct Head {
    key: String,
    value: Vec<u8>,
    source: usize,
}

impl PartialEq for Head {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key && self.source == other.source
    }
}
impl Eq for Head {}
impl PartialOrd for Head {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Head {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // Reversed: `BinaryHeap` is a max-heap.
        (other.key.as_str(), other.source).cmp(&(self.key.as_str(), self.source))
    }
}

/// The k-way merge of sorted sources, each URI once: the last given of it.
struct Merge {
    sources: Vec<Source>,
    heap: BinaryHeap<Head>,
}

impl Merge {
    fn new(mut sources: Vec<Source>) -> Result<Merge, StoreError> {
        let mut heap = BinaryHeap::with_capacity(sources.len());
        for (i, s) in sources.iter_mut().enumerate() {
            if let Some((key, value)) = s.next()? {
                heap.push(Head {
                    key,
                    value,
                    source: i,
                });
            }
        }
        Ok(Merge { sources, heap })
    }

    fn pop(&mut self) -> Result<Option<Head>, StoreError> {
        let Some(head) = self.heap.pop() else {
            return Ok(None);
        };
        if let Some((key, value)) = self.sources[head.source].next()? {
            self.heap.push(Head {
                key,
                value,
                source: head.source,
            });
        }
        Ok(Some(head))
    }

    fn next(&mut self) -> Result<Option<(String, Vec<u8>)>, StoreError> {
        let Some(mut head) = self.pop()? else {
            return Ok(None);
        };
        // Equal keys come out in the order given: keep the last.
        while self.heap.peek().is_some_and(|h| h.key == head.key) {
            if let Some(h) = self.pop()? {
                head = h;
            }
        }
        Ok(Some((head.key, head.value)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::{Caller, Permissions};
    use crate::{Format, Op, PutDocument, StoreOptions};
    use bytes::Bytes;
    use redb::ReadableDatabase;

    fn doc(uri: &str, content: &str) -> Document {
        Document {
            uri: uri.into(),
            format: Format::Json,
            collections: vec!["c".into()],
            permissions: Permissions::document_default(),
            content: Bytes::from(content.to_string()),
        }
    }

    /// Runs on disk and in memory merge into key order; of a URI given twice the later
    /// wins, across runs and within one; the runs are gone after; the commit moved.
    #[test]
    fn runs_merge_in_key_order_and_the_last_of_a_uri_wins() {
        let dir = crate::tests::tempdir();
        let store = Arc::new(Store::open(&dir, StoreOptions::default()).unwrap());
        store
            .write_blocking(
                &Caller::system(),
                vec![Op::PutDocument(PutDocument {
                    uri: "/def.json".into(),
                    content: Bytes::from_static(b"{}"),
                    format: Format::Json,
                    collections: Some(vec!["defs".into()]),
                    permissions: None,
                    default_permissions: Permissions::document_default(),
                })],
            )
            .unwrap();
        assert!(store.holds_only(&["defs"]).unwrap());
        assert!(!store.holds_only(&["other"]).unwrap());
        let before = store.last_commit();
        let mut bulk = store.bulk().unwrap();
        // Three runs on disk, then one in memory, every one out of order; the oracle is a
        // map written in the same order.
        let mut want = std::collections::BTreeMap::new();
        for run in 0..4 {
            let docs: Vec<Document> = (0..500)
                .map(|i| (i * 7919 + run * 13) % 1000)
                .map(|i| {
                    doc(
                        &format!("/d/{i}.json"),
                        &format!("{{\"run\":{run},\"i\":{i}}}"),
                    )
                })
                .collect();
            for d in &docs {
                want.insert(d.uri.clone(), d.content.clone());
            }
            bulk.add(&docs).unwrap();
            if run < 3 {
                bulk.spill().unwrap();
            }
        }
        assert_eq!(bulk.runs.len(), 3);
        let mut seen = Vec::new();
        let written = bulk.finish(|done, all| seen.push((done, all))).unwrap();
        assert_eq!(written.documents, want.len() as u64);
        assert_eq!(written.runs, 3);
        assert_eq!(seen.last(), Some(&(want.len() as u64, 2000)));
        assert!(!runs_dir(&dir).exists());
        assert!(store.last_commit() > before);
        let mut got = std::collections::BTreeMap::new();
        store
            .scan_documents(|d| {
                got.insert(d.uri.clone(), d.content.clone());
                Ok(())
            })
            .unwrap();
        assert_eq!(got.remove("/def.json").unwrap().as_ref(), b"{}");
        assert_eq!(got, want);
        assert!(!store.holds_only(&["defs"]).unwrap());
    }

    /// The runs and the side table left by a load that did not finish are deleted by the
    /// next open, and the documents are as before it.
    #[test]
    fn what_a_crash_leaves_goes_at_the_next_open() {
        let dir = crate::tests::tempdir();
        {
            let store = Arc::new(Store::open(&dir, StoreOptions::default()).unwrap());
            let mut bulk = store.bulk().unwrap();
            bulk.add(&[doc("/a.json", "{}")]).unwrap();
            bulk.spill().unwrap();
            drop(bulk);
            // A merge cut short: a chunk committed to the side table.
            let txn = store.db.begin_write().unwrap();
            txn.open_table(MERGED)
                .unwrap()
                .insert("/b.json", &b"x"[..])
                .unwrap();
            txn.commit().unwrap();
            store.shutdown_blocking();
        }
        assert!(runs_dir(&dir).join("run-00000").exists());
        let store = Store::open(&dir, StoreOptions::default()).unwrap();
        assert!(!runs_dir(&dir).exists());
        assert_eq!(store.document_count().unwrap(), 0);
        let read = store.db.begin_read().unwrap();
        assert!(matches!(
            read.open_table(MERGED),
            Err(redb::TableError::TableDoesNotExist(_))
        ));
    }
}
