//! The durable document store: documents (content, format, collections, permissions) and
//! the service's own records (users, deployed flows, traces) in one redb file.
//!
//! Writes go through one writer thread that commits in groups: it takes every request that
//! is waiting, applies them in one transaction, fsyncs once, runs the commit hook (derived
//! indexes), and only then answers each request. An answer therefore means the write is on
//! disk and visible to queries. Permission checks happen here, inside the transaction that
//! writes, so no caller can get around them. This module knows nothing of views or HTTP.

// Sibling crates under the module names the code uses.
use geoshard_core::{FastMap, acl, cpu, error, metrics};

mod bulk;
mod changes;
mod codec;
mod compress;
pub mod content;
mod events;
pub mod logged;
mod repack;
pub mod snapshot;
mod types;
mod writer;

pub use bulk::{Bulk, BulkWritten};
pub use events::{Kept, Record, Retention};
pub use repack::{
    Dictionary, Repacked, SAMPLES as DICTIONARY_SAMPLES, compact, repack, repack_with,
};
pub use types::*;
use writer::*;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use bytes::Bytes;
use geoshard_core::oneshot;
use parking_lot::{Mutex, RwLock};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use thiserror::Error;

use crate::acl::{Caller, Capability, Permissions, Role};
use crate::error::{ApiError, ErrorCode};

const DOCUMENTS: TableDefinition<&str, &[u8]> = TableDefinition::new("documents");
/// The `Meta` key of the last log entry applied (cluster mode), a decimal number.
const APPLIED_KEY: &str = "cluster.applied";

/// A check made before a write reached the writer thread, for the document as the write
/// creates it (the collections and permissions it names, or their defaults), against the
/// hook's state `generation`. The writer takes it when it lands that same document at that
/// same generation; else it checks again.
struct Prechecked {
    generation: u64,
    collections: Vec<String>,
    permissions: Permissions,
    result: Result<Checked, Rejection>,
}

/// Writes of more documents than this have their early checks spread over the rayon pool;
/// fewer are checked on the request's thread.
const PARALLEL_PRECHECK: usize = 8;
/// Writes of more bytes than this are checked on rayon however few their documents, so a
/// large geometry is not extracted on a thread that serves connections.
const INLINE_PRECHECK_BYTES: usize = 64 * 1024;

/// Counters for the operator and the throughput report.
#[derive(Debug, Default)]
pub struct StoreStats {
    /// Durable commits (fsyncs) so far.
    pub commits: AtomicU64,
    /// Write requests answered by those commits.
    pub writes: AtomicU64,
    /// The number of the last commit that changed documents, as stored (it survives
    /// restarts, unlike the counters above).
    pub last_commit: AtomicU64,
}

struct WriteRequest {
    /// Whose rights the checks use.
    caller: Caller,
    /// The request's place in the replicated log, when it comes from one: it lands only as
    /// the next entry after the last applied.
    seq: Option<u64>,
    ops: Vec<Op>,
    /// The early checks of `ops`, by index (empty when none were made).
    prechecked: Vec<Option<Prechecked>>,
    /// A copy of documents kept as stubs (`Store::fill`), not a write of the log's.
    fill: bool,
    reply: oneshot::Sender<Result<Written, StoreError>>,
}

enum Message {
    Write(WriteRequest),
    Shutdown(oneshot::Sender<()>),
}

type HookSlot = Arc<RwLock<Option<Arc<dyn CommitHook>>>>;

/// The store. Cheap to share behind an `Arc`.
pub struct Store {
    /// Readers open their own transactions on it; only the writer thread writes.
    db: Arc<Database>,
    /// The group-commit queue; bounded, so writers wait when the disk cannot keep up.
    queue: async_channel::Sender<Message>,
    writer: Mutex<Option<JoinHandle<()>>>,
    hook: HookSlot,
    stats: Arc<StoreStats>,
    path: PathBuf,
    /// The last log entry applied (cluster mode; 0 before any), as committed.
    applied: Arc<AtomicU64>,
    log: RwLock<Option<Arc<dyn WriteLog>>>,
    quick_repair: bool,
    min_free_bytes: u64,
    /// The compression dictionary writes use (0: none), shared with the writer thread.
    dictionary: Arc<std::sync::atomic::AtomicU32>,
}

/// Settings of the store, from `Config`.
#[derive(Debug, Clone, Copy)]
pub struct StoreOptions {
    pub commit_batch_max: usize,
    pub write_queue: usize,
    /// redb's page cache. Queries read the in-memory views, not the store, so this mostly
    /// serves document reads and start-up scans.
    pub cache_bytes: usize,
    /// Below this much free space on the store's disk, writes are refused (507) before they
    /// start: redb stops at its first I/O error, reads included, so it must never meet a full
    /// disk. 0 = no check.
    pub min_free_bytes: u64,
    /// Commits record the allocator state, so that an open after a crash needs no repair
    /// walk of the whole file (redb's quick repair; each commit writes twice).
    pub quick_repair: bool,
    /// How long the commit hook's records (geofence events) are kept.
    pub event_retention: Retention,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            commit_batch_max: 2048,
            write_queue: 16_384,
            cache_bytes: 128 * 1024 * 1024,
            min_free_bytes: 0,
            quick_repair: true,
            event_retention: Retention::default(),
        }
    }
}

impl Store {
    /// Open (or create) the store in `dir`, recovering whatever the last run committed.
    pub fn open(dir: &Path, options: StoreOptions) -> Result<Store, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::Open {
            path: dir.display().to_string(),
            message: e.to_string(),
        })?;
        let path = dir.join("geoshard.redb");
        // What a repack that did not finish left: the store it would have replaced is whole.
        let _ = std::fs::remove_file(repack::repack_file(dir));
        // What a bulk load that did not finish left: its runs; the store is as before it.
        let _ = std::fs::remove_dir_all(bulk::runs_dir(dir));
        let db = Database::builder()
            .set_cache_size(options.cache_bytes)
            .create(&path)
            .map_err(|e| StoreError::Open {
                path: path.display().to_string(),
                message: e.to_string(),
            })?;
        // Create every table once, so readers never meet a missing one.
        let mut txn = db.begin_write().map_err(storage)?;
        txn.set_quick_repair(options.quick_repair);
        {
            txn.open_table(DOCUMENTS).map_err(storage)?;
            for t in Table::ALL {
                txn.open_table(t.definition()).map_err(storage)?;
            }
            txn.open_table(changes::CHANGES).map_err(storage)?;
            txn.open_table(compress::DICTIONARIES).map_err(storage)?;
            txn.open_table(events::EVENTS).map_err(storage)?;
            txn.open_table(events::TOPICS).map_err(storage)?;
            // What a bulk load that did not finish left.
            txn.delete_table(bulk::MERGED).map_err(storage)?;
        }
        txn.commit().map_err(storage)?;
        let dictionary = Arc::new(std::sync::atomic::AtomicU32::new(compress::load(&db)?));
        let (applied, last_commit) = {
            let txn = db.begin_read().map_err(storage)?;
            let meta = txn.open_table(Table::Meta.definition()).map_err(storage)?;
            (
                changes::read_number(&meta, APPLIED_KEY)?.unwrap_or(0),
                changes::read_number(&meta, changes::COMMITS_KEY)?.unwrap_or(0),
            )
        };
        let applied = Arc::new(AtomicU64::new(applied));

        let db = Arc::new(db);
        let (queue, rx) = async_channel::bounded(options.write_queue.max(1));
        let hook: HookSlot = Arc::new(RwLock::new(None));
        let stats = Arc::new(StoreStats {
            last_commit: AtomicU64::new(last_commit),
            ..StoreStats::default()
        });
        let writer = {
            let db = db.clone();
            let hook = hook.clone();
            let stats = stats.clone();
            let applied = applied.clone();
            let settings = WriterSettings {
                batch_max: options.commit_batch_max.max(1),
                space: SpaceCheck {
                    dir: dir.to_path_buf(),
                    min: options.min_free_bytes,
                },
                quick_repair: options.quick_repair,
                dictionary: dictionary.clone(),
                retention: options.event_retention,
            };
            std::thread::Builder::new()
                .name("store-writer".into())
                .spawn(move || writer_loop(db, rx, hook, stats, applied, settings))
                .map_err(storage)?
        };
        Ok(Store {
            db,
            queue,
            writer: Mutex::new(Some(writer)),
            hook,
            stats,
            path,
            applied,
            log: RwLock::new(None),
            quick_repair: options.quick_repair,
            min_free_bytes: options.min_free_bytes,
            dictionary,
        })
    }

    /// Compress the documents written from now on with a dictionary trained on `samples`
    /// (documents' contents), when the store has none yet: an offline load trains one on its
    /// first documents, so that it writes none plain. `false`: the store has one already, or
    /// the samples are too few or too alike to train one.
    pub fn train_dictionary(&self, samples: &[Vec<u8>]) -> Result<bool, StoreError> {
        if self.dictionary.load(Ordering::Acquire) != 0 {
            return Ok(false);
        }
        let Some(bytes) = compress::train(samples) else {
            return Ok(false);
        };
        let id = compress::register(&bytes)?;
        // Beside the writer's transactions (redb takes one at a time): this one writes the
        // dictionaries table alone.
        let mut txn = self.db.begin_write().map_err(storage)?;
        txn.set_quick_repair(self.quick_repair);
        compress::store_current(&txn, id, &bytes)?;
        txn.commit().map_err(storage)?;
        self.dictionary.store(id, Ordering::Release);
        Ok(true)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn stats(&self) -> &StoreStats {
        &self.stats
    }

    /// Attach the commit hook (views and spatial indexes). One hook; a second replaces it.
    pub fn set_hook(&self, hook: Arc<dyn CommitHook>) {
        *self.hook.write() = Some(hook);
    }

    /// Put a replicated log in front of the store: every later [`Store::write`] goes through
    /// it (cluster mode).
    pub fn set_log(&self, log: Arc<dyn WriteLog>) {
        *self.log.write() = Some(log);
    }

    /// Whether `bytes` more can be written beside the store and still leave it the free
    /// space it keeps (`min_free_bytes`); true when the free space cannot be read.
    pub fn has_room_for(&self, bytes: u64) -> bool {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        free_bytes(dir).is_none_or(|free| free >= self.min_free_bytes.saturating_add(bytes))
    }

    /// The number of the last commit that changed documents (0 before any), once the commit
    /// hook has seen it: the views hold every commit up to it.
    pub fn last_commit(&self) -> u64 {
        self.stats.last_commit.load(Ordering::Acquire)
    }

    /// The URIs of the documents changed after commit `point`, when every change since was
    /// recorded (see [`Store::saved_at`]); `None` otherwise.
    pub fn changed_since(
        &self,
        point: u64,
    ) -> Result<Option<std::collections::BTreeSet<String>>, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        changes::since(&txn, point)
    }

    /// Data derived from the documents was saved as of commit `point`, no write going on:
    /// from now on, record which documents each commit changes, so that it can be brought up
    /// to date.
    pub fn saved_at(&self, point: u64) -> Result<(), StoreError> {
        self.record_saved(point, false).map(|_| ())
    }

    /// Data derived from the documents was saved while writes went on, holding at least
    /// every commit up to `point`: keep recording from `point`. `false` when the changes
    /// since `point` were not all recorded (see [`Store::record_changes`]): the saved data
    /// is then of no use.
    pub fn saved_live(&self, point: u64) -> Result<bool, StoreError> {
        self.record_saved(point, true)
    }

    fn record_saved(&self, point: u64, writes_went_on: bool) -> Result<bool, StoreError> {
        let mut txn = self.db.begin_write().map_err(storage)?;
        txn.set_quick_repair(self.quick_repair);
        let kept = changes::saved_at(&txn, point, writes_went_on)?;
        txn.commit().map_err(storage)?;
        Ok(kept)
    }

    /// Record the documents each commit changes from now on, if not already: for a save
    /// while writes go on. Returns the commit from which every change is recorded.
    pub fn record_changes(&self) -> Result<u64, StoreError> {
        let mut txn = self.db.begin_write().map_err(storage)?;
        txn.set_quick_repair(self.quick_repair);
        let from = changes::start(&txn)?;
        txn.commit().map_err(storage)?;
        Ok(from)
    }

    /// How many document changes were recorded since the last save point (a document
    /// changed twice counts twice); `None` when none is set.
    pub fn recorded_changes(&self) -> Result<Option<u64>, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        changes::recorded(&txn)
    }

    /// How many documents the store holds.
    pub fn document_count(&self) -> Result<u64, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let table = txn.open_table(DOCUMENTS).map_err(storage)?;
        redb::ReadableTableMetadata::len(&table).map_err(storage)
    }

    /// The last log entry this store applied (0 before any).
    pub fn applied(&self) -> u64 {
        self.applied.load(Ordering::Acquire)
    }

    /// Queue log entry `seq` for the writer, which lands it only as the entry after the last
    /// applied. Entries queued in log order land in log order; the receiver has the outcome.
    pub async fn apply_logged(
        &self,
        seq: u64,
        caller: Caller,
        ops: Vec<Op>,
    ) -> Result<oneshot::Receiver<Result<Written, StoreError>>, StoreError> {
        let (reply, answer) = oneshot::channel();
        let req = WriteRequest {
            caller,
            seq: Some(seq),
            ops,
            prechecked: Vec::new(),
            fill: false,
            reply,
        };
        self.queue
            .send(Message::Write(req))
            .await
            .map_err(|_| StoreError::ShuttingDown)?;
        Ok(answer)
    }

    /// Submit a write request and wait until it is durable.
    pub async fn write(&self, caller: &Caller, ops: Vec<Op>) -> Result<Written, StoreError> {
        let log = self.log.read().clone();
        if let Some(log) = log {
            return log.append(caller.clone(), ops).await;
        }
        let (ops, prechecked) = self
            .precheck(ops)
            .await
            .ok_or_else(|| StoreError::Internal("the write could not be checked".into()))?;
        self.submit(caller, ops, prechecked).await
    }

    /// Queue a checked-early write for the writer thread and wait for its answer.
    async fn submit(
        &self,
        caller: &Caller,
        ops: Vec<Op>,
        prechecked: Vec<Option<Prechecked>>,
    ) -> Result<Written, StoreError> {
        let (reply, answer) = oneshot::channel();
        let req = WriteRequest {
            caller: caller.clone(),
            seq: None,
            ops,
            prechecked,
            fill: false,
            reply,
        };
        self.queue
            .send(Message::Write(req))
            .await
            .map_err(|_| StoreError::ShuttingDown)?;
        answer.await.map_err(|_| StoreError::ShuttingDown)?
    }

    /// The hook's early checks of the documents `ops` puts, made here rather than on the
    /// writer thread (on rayon for a large write), so that thread only stores and applies.
    /// `None` if the checking failed: the write is then refused, never applied without its ops.
    async fn precheck(&self, ops: Vec<Op>) -> Option<(Vec<Op>, Vec<Option<Prechecked>>)> {
        let hook = self.hook.read().clone();
        let Some(hook) = hook.filter(|h| h.generation().is_some()) else {
            return Some((ops, Vec::new()));
        };
        let bytes: usize = ops
            .iter()
            .map(|op| match op {
                Op::PutDocument(p) => p.content.len(),
                _ => 0,
            })
            .sum();
        if ops.len() <= PARALLEL_PRECHECK && bytes <= INLINE_PRECHECK_BYTES {
            let pre = ops
                .iter()
                .map(|op| precheck_one(hook.as_ref(), op))
                .collect();
            return Some((ops, pre));
        }
        crate::cpu::run_cpu_intensive(move || {
            use rayon::prelude::*;
            let pre = ops
                .par_iter()
                .map(|op| precheck_one(hook.as_ref(), op))
                .collect();
            (ops, pre)
        })
        .await
    }

    /// [`Store::write`] for threads outside the async runtime (offline tools, tests).
    pub fn write_blocking(&self, caller: &Caller, ops: Vec<Op>) -> Result<Written, StoreError> {
        if self.log.read().is_some() {
            return Err(StoreError::Log(
                "a node of a cluster writes through its log only".into(),
            ));
        }
        let (reply, answer) = oneshot::channel();
        let req = WriteRequest {
            caller: caller.clone(),
            seq: None,
            ops,
            prechecked: Vec::new(),
            fill: false,
            reply,
        };
        self.queue
            .send_blocking(Message::Write(req))
            .map_err(|_| StoreError::ShuttingDown)?;
        answer
            .blocking_recv()
            .map_err(|_| StoreError::ShuttingDown)?
    }

    /// A document, if it exists here and `caller` may read it. Unreadable is the same as
    /// absent, and so is a document whose content other nodes keep (see [`Store::lookup`]).
    pub fn get(&self, caller: &Caller, uri: &str) -> Result<Option<Document>, StoreError> {
        match self.lookup(caller, uri)? {
            Lookup::Here(doc) => Ok(Some(doc)),
            Lookup::Absent | Lookup::Elsewhere { .. } => Ok(None),
        }
    }

    /// A document, if it exists and `caller` may read it: here, or kept by other nodes.
    pub fn lookup(&self, caller: &Caller, uri: &str) -> Result<Lookup, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let table = txn.open_table(DOCUMENTS).map_err(storage)?;
        let Some(value) = table.get(uri).map_err(storage)? else {
            return Ok(Lookup::Absent);
        };
        let bytes = value.value();
        if codec::is_elsewhere(bytes) {
            let (_, permissions, _, _) = codec::decode_meta(uri, bytes)?;
            if !caller.may(&permissions, Capability::Read) {
                return Ok(Lookup::Absent);
            }
            return Ok(Lookup::Elsewhere {
                shards: codec::home_of(uri, bytes)?,
            });
        }
        let doc = codec::decode(uri, bytes)?;
        if !caller.may(&doc.permissions, Capability::Read) {
            return Ok(Lookup::Absent);
        }
        Ok(Lookup::Here(doc))
    }

    /// Copy in the content of documents this store keeps a stub of (a node that takes new
    /// shards, from their holders): each lands only if it is still a stub, with the stub's
    /// permissions and collections, and decides no geofence events. Not a write of the log's.
    pub async fn fill(&self, docs: Vec<(String, Format, Bytes)>) -> Result<Written, StoreError> {
        let ops = docs
            .into_iter()
            .map(|(uri, format, content)| {
                Op::PutDocument(PutDocument {
                    uri,
                    content,
                    format,
                    collections: None,
                    permissions: None,
                    default_permissions: crate::acl::Permissions::new(),
                })
            })
            .collect();
        let (reply, answer) = oneshot::channel();
        let req = WriteRequest {
            caller: Caller::system(),
            seq: None,
            ops,
            prechecked: Vec::new(),
            fill: true,
            reply,
        };
        self.queue
            .send(Message::Write(req))
            .await
            .map_err(|_| StoreError::ShuttingDown)?;
        answer.await.map_err(|_| StoreError::ShuttingDown)?
    }

    /// The documents this store keeps a stub of whose content the holders of any of `shards`
    /// keep: (URI, those shards).
    pub fn stubs_in(&self, shards: &[u16]) -> Result<Vec<(String, Vec<u16>)>, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let table = txn.open_table(DOCUMENTS).map_err(storage)?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(storage)? {
            let (k, v) = entry.map_err(storage)?;
            if codec::is_elsewhere(v.value()) {
                let home = codec::home_of(k.value(), v.value())?;
                let wanted: Vec<u16> = home.into_iter().filter(|s| shards.contains(s)).collect();
                if !wanted.is_empty() {
                    out.push((k.value().to_string(), wanted));
                }
            }
        }
        Ok(out)
    }

    /// Every document, in URI order, for the service's own rebuilds (no permission filter:
    /// derived indexes keep each document's permissions and check them at query time).
    pub fn scan_documents(
        &self,
        f: impl FnMut(Document) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        self.scan_where(|_| true, f)
    }

    /// The documents in any of `collections`, in URI order; the others are passed over on
    /// their header alone.
    pub fn scan_documents_in(
        &self,
        collections: &[&str],
        f: impl FnMut(Document) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        self.scan_where(|stored| codec::in_any_collection(stored, collections), f)
    }

    /// The documents whose stored bytes `keep` takes, decoded, in URI order; stubs (content
    /// kept by other nodes) are passed over.
    pub fn scan_where(
        &self,
        keep: impl Fn(&[u8]) -> bool,
        mut f: impl FnMut(Document) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let table = txn.open_table(DOCUMENTS).map_err(storage)?;
        for entry in table.iter().map_err(storage)? {
            let (k, v) = entry.map_err(storage)?;
            if !codec::is_elsewhere(v.value()) && keep(v.value()) {
                f(codec::decode(k.value(), v.value())?)?;
            }
        }
        Ok(())
    }

    pub fn get_record(&self, table: Table, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let t = txn.open_table(table.definition()).map_err(storage)?;
        Ok(t.get(key).map_err(storage)?.map(|v| v.value().to_vec()))
    }

    /// Records of a table whose keys start with `prefix`, in key order.
    pub fn records(
        &self,
        table: Table,
        prefix: &str,
    ) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let t = txn.open_table(table.definition()).map_err(storage)?;
        let mut out = Vec::new();
        for entry in t.range(prefix..).map_err(storage)? {
            let (k, v) = entry.map_err(storage)?;
            if !k.value().starts_with(prefix) {
                break;
            }
            out.push((k.value().to_string(), v.value().to_vec()));
        }
        Ok(out)
    }

    /// Stop the writer after everything queued before this call is committed.
    pub async fn shutdown(&self) {
        let (tx, rx) = oneshot::channel();
        if self.queue.send(Message::Shutdown(tx)).await.is_ok() {
            let _ = rx.await;
        }
        self.join_writer();
    }

    /// [`Store::shutdown`] outside the async runtime.
    pub fn shutdown_blocking(&self) {
        let (tx, rx) = oneshot::channel();
        if self.queue.send_blocking(Message::Shutdown(tx)).is_ok() {
            let _ = rx.blocking_recv();
        }
        self.join_writer();
    }

    fn join_writer(&self) {
        if let Some(handle) = self.writer.lock().take() {
            let _ = handle.join();
        }
        // The hook holds what holds the store: drop it so the store (and its file lock)
        // can go.
        *self.hook.write() = None;
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // The writer ends when its queue closes; the queue closes when `self.queue` drops.
        // Joining here would deadlock if the last `Store` dropped inside the runtime while
        // the writer waits on it, so the writer is left to finish on its own.
    }
}

#[cfg(test)]
pub(crate) mod tests;
