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

mod changes;
mod codec;
pub mod content;
pub mod logged;
pub mod snapshot;

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

/// The service's own record tables, apart from documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// User name -> user record (roles, Digest HA1).
    Users,
    /// Small settings the service keeps for itself.
    Meta,
    /// Deployed flow key -> flow definition and modules.
    Flows,
    /// `job-id/trace-id` -> trace record.
    Traces,
    /// Digest nonce state that outlives a process: the keys nonces are signed with
    /// (`key/…`) and the highest `nc` of nonces no longer held in memory (`nc/…`).
    Nonces,
}

impl Table {
    /// Every table, for those that walk them all.
    pub const ALL: [Table; 5] = [
        Table::Users,
        Table::Meta,
        Table::Flows,
        Table::Traces,
        Table::Nonces,
    ];
}

impl Table {
    fn definition(self) -> TableDefinition<'static, &'static str, &'static [u8]> {
        match self {
            Table::Users => TableDefinition::new("users"),
            Table::Meta => TableDefinition::new("meta"),
            Table::Flows => TableDefinition::new("flows"),
            Table::Traces => TableDefinition::new("traces"),
            Table::Nonces => TableDefinition::new("nonces"),
        }
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum StoreError {
    #[error("storage failure: {0}")]
    Storage(String),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    #[error("{user} has no {capability} permission on {uri}")]
    Forbidden {
        user: String,
        capability: &'static str,
        uri: String,
    },
    /// A write of schema (a template, a service descriptor) by a caller without its role.
    #[error("user {user} needs the role {role} (or admin) to write or delete {uri}")]
    SchemaPrivilege {
        user: String,
        role: &'static str,
        uri: String,
    },
    #[error("{0}")]
    Rejected(Rejection),
    #[error("the store is shutting down")]
    ShuttingDown,
    /// A fault of ours, not of the request or the disk (a check that panicked).
    #[error("internal error: {0}")]
    Internal(String),
    /// The disk holding the store is (nearly) full: the write is refused before it starts.
    #[error(
        "the disk holding the data directory has {free} bytes free, below \
         min_free_disk_bytes ({min}); writes resume once space is freed"
    )]
    Full { free: u64, min: u64 },
    /// The disk filled up under a write (past the check), or an earlier write failed so: redb
    /// stops at its first I/O error, and only a restart opens it again.
    #[error("{0}; free space on the data directory's disk and restart the server")]
    Stopped(String),
    #[error("cannot open the store at {path}: {message}")]
    Open { path: String, message: String },
    /// A log entry that is not the next one this store applies (cluster mode): already
    /// applied, or past a gap. Nothing was written.
    #[error("log entry {got} is not the next to apply ({expected})")]
    Sequence { expected: u64, got: u64 },
    /// The replicated log could not take the write (cluster mode); it may or may not land.
    #[error("the cluster's log is unavailable: {0}")]
    Log(String),
    /// A write too large for one log entry (cluster mode).
    #[error(
        "the write is {size} bytes, more than one entry of the cluster's log holds ({max}); \
         send it in smaller requests"
    )]
    TooLarge { size: usize, max: usize },
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        let code = match &e {
            StoreError::Storage(_) => ErrorCode::Internal,
            StoreError::Corrupt(_) => ErrorCode::Internal,
            StoreError::Forbidden { .. } => ErrorCode::SecPermDenied,
            StoreError::SchemaPrivilege { .. } => ErrorCode::SecPriv,
            StoreError::Rejected(_) => ErrorCode::InvalidRequest,
            StoreError::ShuttingDown => ErrorCode::Unavailable,
            StoreError::Internal(_) => ErrorCode::Internal,
            StoreError::Full { .. } => ErrorCode::InsufficientStorage,
            StoreError::Stopped(_) => ErrorCode::Unavailable,
            StoreError::Open { .. } => ErrorCode::Internal,
            StoreError::Sequence { .. } => ErrorCode::Internal,
            StoreError::Log(_) => ErrorCode::Unavailable,
            StoreError::TooLarge { .. } => ErrorCode::PayloadTooLarge,
        };
        ApiError::new(code, e.to_string())
    }
}

/// A storage error as the store reports it. redb stops at its first I/O error, every later
/// operation answering `PreviousIo` until the database is opened again: that says so.
fn storage<E: Into<redb::Error>>(e: E) -> StoreError {
    match e.into() {
        redb::Error::Io(io) if io.kind() == std::io::ErrorKind::StorageFull => {
            StoreError::Stopped(format!("the disk is full ({io}); the store has stopped"))
        }
        redb::Error::PreviousIo => {
            StoreError::Stopped("the store stopped at an earlier I/O error".to_string())
        }
        other => StoreError::Storage(other.to_string()),
    }
}

/// Bytes free for the store's use on the disk that holds `dir`, when that can be read.
fn free_bytes(dir: &Path) -> Option<u64> {
    let s = rustix::fs::statvfs(dir).ok()?;
    Some(s.f_bavail.saturating_mul(s.f_frsize))
}

/// How a document's content is interpreted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Format {
    Json = 0,
    Xml = 1,
    Text = 2,
    Binary = 3,
}

impl Format {
    pub(crate) fn from_u8(b: u8) -> Option<Format> {
        match b {
            0 => Some(Format::Json),
            1 => Some(Format::Xml),
            2 => Some(Format::Text),
            3 => Some(Format::Binary),
            _ => None,
        }
    }

    pub fn parse(name: &str) -> Option<Format> {
        match name {
            "json" => Some(Format::Json),
            "xml" => Some(Format::Xml),
            "text" => Some(Format::Text),
            "binary" => Some(Format::Binary),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Xml => "xml",
            Format::Text => "text",
            Format::Binary => "binary",
        }
    }

    pub fn mime_type(self) -> &'static str {
        match self {
            Format::Json => "application/json",
            Format::Xml => "application/xml",
            Format::Text => "text/plain; charset=utf-8",
            Format::Binary => "application/octet-stream",
        }
    }
}

/// A stored document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    pub uri: String,
    pub format: Format,
    pub collections: Vec<String>,
    pub permissions: Permissions,
    pub content: Bytes,
}

impl Document {
    pub fn in_collection(&self, name: &str) -> bool {
        self.collections.iter().any(|c| c == name)
    }
}

/// A document write as a client asks for it.
#[derive(Debug, Clone)]
pub struct PutDocument {
    pub uri: String,
    pub content: Bytes,
    pub format: Format,
    /// `Some` replaces the collections; `None` keeps them on update (none on create).
    pub collections: Option<Vec<String>>,
    /// `Some` replaces the permissions; `None` keeps them on update.
    pub permissions: Option<Permissions>,
    /// What a new document written without explicit permissions gets.
    pub default_permissions: Permissions,
}

/// One operation of a write request. A request's operations are checked together and
/// applied together: either all of them land or none does.
#[derive(Debug, Clone)]
pub enum Op {
    PutDocument(PutDocument),
    DeleteDocument {
        uri: String,
    },
    PutRecord {
        table: Table,
        key: String,
        value: Vec<u8>,
    },
    DeleteRecord {
        table: Table,
        key: String,
    },
    /// Replace every record of a table (an atomic redeploy).
    ReplaceTable {
        table: Table,
        entries: Vec<(String, Vec<u8>)>,
    },
}

/// What happened to one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Created,
    Replaced,
    Deleted,
    /// A delete of something that was not there.
    Absent,
    Done,
}

/// What the commit hook made of a document when it checked it, handed back to it with the
/// document's [`Change`]: the store only carries it.
pub type Prepared = Arc<dyn std::any::Any + Send + Sync>;

/// A committed change to a document, handed to the commit hook. `doc` is `None` for a delete.
#[derive(Debug, Clone)]
pub struct Change {
    pub uri: String,
    pub doc: Option<Arc<Document>>,
    /// What [`CommitHook::check`] prepared for this document, if anything.
    pub prepared: Option<Prepared>,
}

/// The hook's verdict on a document about to land.
#[derive(Debug, Default)]
pub struct Checked {
    /// Problems that do not stop the write (a geometry that cannot be indexed): the write's
    /// answer lists them.
    pub warnings: Vec<String>,
    /// Work done in the check that `committed` can use instead of doing it again.
    pub prepared: Option<Prepared>,
}

/// A warning about one document of a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    pub uri: String,
    pub message: String,
}

/// The answer to a write request: what happened to each operation, and the warnings.
#[derive(Debug, Default)]
pub struct Written {
    pub outcomes: Vec<Outcome>,
    pub warnings: Vec<Warning>,
    /// For a log entry whose change takes effect later (a view built in the background):
    /// resolves when it has. The entry's own writer is answered then; the log goes on.
    pub settled: Option<oneshot::Receiver<()>>,
}

/// Why a commit hook refused a document. The store carries the hook's own error without
/// knowing its type (the views' errors belong to the layers above).
#[derive(Debug, Clone, Error)]
pub enum Rejection {
    /// A document the hook cannot take, named by its URI.
    #[error("{uri}: {reason}")]
    Document {
        uri: String,
        reason: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// A template or descriptor that does not validate (its message names the document).
    #[error("{0}")]
    Definition(String),
}

/// Two refusals are the same when they say the same (the hook's error types are not known
/// here).
impl PartialEq for Rejection {
    fn eq(&self, other: &Rejection) -> bool {
        self.to_string() == other.to_string()
    }
}

impl Eq for Rejection {}

/// What the layers above the store attach to the write path.
pub trait CommitHook: Send + Sync {
    /// Runs in the write transaction before a document lands, on the writer thread; an `Err`
    /// rejects that request with a 400 and the message.
    fn check(&self, doc: &Document) -> Result<Checked, Rejection>;
    /// Runs after a commit is durable and before any writer is answered, in commit order, on
    /// the writer thread (so nothing the hook reads changes between a check and this).
    /// `Some`: some changes take effect later (views built in the background); their writers
    /// are answered when they do, while the writer thread goes on.
    fn committed(&self, changes: &[Change]) -> Option<Settling>;
    /// The check of a document made early, on the writing request's own thread, so the
    /// writer thread does not have to: `None` where only the writer may check (definitions).
    /// Used only while [`CommitHook::generation`] has not moved.
    fn precheck(&self, _doc: &Document) -> Option<Result<Checked, Rejection>> {
        None
    }
    /// An id of the state checks depend on: an early check made at the generation the writer
    /// sees is still the check. `None`: no early checks.
    fn generation(&self) -> Option<u64> {
        None
    }
}

/// A replicated log in front of the store (cluster mode): [`Store::write`] appends the write
/// to it, and the answer is this node's outcome of applying it once the log has it.
pub trait WriteLog: Send + Sync {
    fn append(
        &self,
        caller: Caller,
        ops: Vec<Op>,
    ) -> Pin<Box<dyn Future<Output = Result<Written, StoreError>> + Send + 'static>>;
}

/// Changes of a commit that take effect later (see [`CommitHook::committed`]): the writers of
/// these documents are answered when `done` resolves; the others at once.
pub struct Settling {
    pub uris: Vec<String>,
    pub done: oneshot::Receiver<()>,
}

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
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            commit_batch_max: 2048,
            write_queue: 16_384,
            cache_bytes: 128 * 1024 * 1024,
            min_free_bytes: 0,
            quick_repair: true,
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
        }
        txn.commit().map_err(storage)?;
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
        })
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
            reply,
        };
        self.queue
            .send_blocking(Message::Write(req))
            .map_err(|_| StoreError::ShuttingDown)?;
        answer
            .blocking_recv()
            .map_err(|_| StoreError::ShuttingDown)?
    }

    /// A document, if it exists and `caller` may read it. Unreadable is the same as absent.
    pub fn get(&self, caller: &Caller, uri: &str) -> Result<Option<Document>, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let table = txn.open_table(DOCUMENTS).map_err(storage)?;
        let Some(value) = table.get(uri).map_err(storage)? else {
            return Ok(None);
        };
        let doc = codec::decode(uri, value.value())?;
        if !caller.may(&doc.permissions, Capability::Read) {
            return Ok(None);
        }
        Ok(Some(doc))
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

    /// The documents whose stored bytes `keep` takes, decoded, in URI order.
    pub fn scan_where(
        &self,
        keep: impl Fn(&[u8]) -> bool,
        mut f: impl FnMut(Document) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let table = txn.open_table(DOCUMENTS).map_err(storage)?;
        for entry in table.iter().map_err(storage)? {
            let (k, v) = entry.map_err(storage)?;
            if keep(v.value()) {
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

/// Where the store lives and how much room its writes need there.
struct SpaceCheck {
    dir: std::path::PathBuf,
    min: u64,
}

impl SpaceCheck {
    /// The refusal for a batch, when the disk is short of space.
    fn short(&self) -> Option<StoreError> {
        if self.min == 0 {
            return None;
        }
        let free = free_bytes(&self.dir)?;
        (free < self.min).then_some(StoreError::Full {
            free,
            min: self.min,
        })
    }
}

/// What the writer thread is set to.
struct WriterSettings {
    batch_max: usize,
    space: SpaceCheck,
    quick_repair: bool,
}

fn writer_loop(
    db: Arc<Database>,
    rx: async_channel::Receiver<Message>,
    hook: HookSlot,
    stats: Arc<StoreStats>,
    applied: Arc<AtomicU64>,
    writer: WriterSettings,
) {
    let WriterSettings {
        batch_max,
        ref space,
        ..
    } = writer;
    let mut batch: Vec<WriteRequest> = Vec::with_capacity(batch_max);
    loop {
        let mut shutdown = None;
        match rx.recv_blocking() {
            Err(_) => break,
            Ok(Message::Shutdown(done)) => shutdown = Some(done),
            Ok(Message::Write(req)) => batch.push(req),
        }
        while shutdown.is_none() && batch.len() < batch_max {
            match rx.try_recv() {
                Ok(Message::Write(req)) => batch.push(req),
                Ok(Message::Shutdown(done)) => shutdown = Some(done),
                Err(_) => break,
            }
        }
        if !batch.is_empty() {
            if let Some(full) = space.short() {
                tracing::warn!(error = %full, requests = batch.len(), "writes refused");
                for req in batch.drain(..) {
                    let _ = req.reply.send(Err(full.clone()));
                }
            } else {
                let hook = hook.read().clone();
                commit_batch(&db, &mut batch, hook.as_deref(), &stats, &applied, &writer);
            }
        }
        if let Some(done) = shutdown {
            rx.close();
            // Anything that raced in after the shutdown request is refused, not dropped.
            while let Ok(msg) = rx.try_recv() {
                match msg {
                    Message::Write(req) => {
                        let _ = req.reply.send(Err(StoreError::ShuttingDown));
                    }
                    Message::Shutdown(other) => {
                        let _ = other.send(());
                    }
                }
            }
            let _ = done.send(());
            break;
        }
    }
}

/// What pass one decided for one operation, applied in pass two.
enum Planned {
    Document {
        uri: String,
        doc: Option<Arc<Document>>,
        prepared: Option<Prepared>,
    },
    Record {
        table: Table,
        key: String,
        value: Option<Vec<u8>>,
    },
    Replace {
        table: Table,
        entries: Vec<(String, Vec<u8>)>,
    },
}

fn commit_batch(
    db: &Database,
    batch: &mut Vec<WriteRequest>,
    hook: Option<&dyn CommitHook>,
    stats: &StoreStats,
    applied: &AtomicU64,
    writer: &WriterSettings,
) {
    let before = applied.load(Ordering::Acquire);
    let mut last = before;
    let mut answers: Vec<Result<Written, StoreError>> = Vec::with_capacity(batch.len());
    let mut changes: Vec<Change> = Vec::new();
    // Each request's changes, by index into `changes`.
    let mut spans: Vec<std::ops::Range<usize>> = Vec::with_capacity(batch.len());
    let mut commit = None;
    let result = (|| -> Result<(), StoreError> {
        let mut txn = db.begin_write().map_err(storage)?;
        txn.set_quick_repair(writer.quick_repair);
        {
            let mut docs = txn.open_table(DOCUMENTS).map_err(storage)?;
            // The hook's state moves only in `committed`, after this transaction.
            let generation = hook.and_then(|h| h.generation());
            for req in batch.iter_mut() {
                let ops = std::mem::take(&mut req.ops);
                let pre = std::mem::take(&mut req.prechecked);
                let checks = Checks {
                    hook,
                    generation,
                    pre,
                };
                let first = changes.len();
                if let Some(seq) = req.seq {
                    if seq != last + 1 {
                        answers.push(Err(StoreError::Sequence {
                            expected: last + 1,
                            got: seq,
                        }));
                        spans.push(first..first);
                        continue;
                    }
                    // A refused entry is applied too: every node refuses it alike.
                    last = seq;
                }
                let answer = match plan_request(&docs, &req.caller, ops, checks) {
                    Err(e) => Err(e),
                    Ok((planned, written)) => {
                        apply_plan(&txn, &mut docs, planned, &mut changes)?;
                        Ok(written)
                    }
                };
                answers.push(answer);
                spans.push(first..changes.len());
            }
        }
        if last != before {
            let mut meta = txn.open_table(Table::Meta.definition()).map_err(storage)?;
            meta.insert(APPLIED_KEY, last.to_string().as_bytes())
                .map_err(storage)?;
        }
        if !changes.is_empty() {
            commit = Some(changes::record(
                &txn,
                changes.iter().map(|c| c.uri.as_str()),
                changes.len(),
            )?);
        }
        let committing = std::time::Instant::now();
        txn.commit().map_err(storage)?;
        crate::metrics::record(|m| m.commit_seconds.observe(committing.elapsed().as_secs_f64()));
        Ok(())
    })();
    match result {
        Ok(()) => {
            applied.store(last, Ordering::Release);
            crate::metrics::record(|m| {
                m.commits.inc();
                m.commit_batch.observe(batch.len() as f64);
                m.documents_written.inc_by(changes.len() as u64);
            });
            stats.commits.fetch_add(1, Ordering::Relaxed);
            stats
                .writes
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
            let mut settling = None;
            if let Some(hook) = hook
                && !changes.is_empty()
            {
                let hooked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    hook.committed(&changes)
                }));
                match hooked {
                    Ok(s) => settling = s,
                    Err(_) => tracing::error!(changes = changes.len(), "commit hook panicked"),
                }
            }
            if let Some(c) = commit {
                stats.last_commit.store(c, Ordering::Release);
            }
            let mut later = Vec::new();
            let mut logged_later = Vec::new();
            for ((req, answer), span) in batch.drain(..).zip(answers).zip(spans) {
                let waits = settling
                    .as_ref()
                    .is_some_and(|s| changes[span].iter().any(|c| s.uris.contains(&c.uri)));
                match answer {
                    // A log entry is answered now, so that the entries after it are not held
                    // behind the build; its `settled` says when it has taken effect.
                    Ok(mut written) if waits && req.seq.is_some() => {
                        let (tx, rx) = oneshot::channel();
                        written.settled = Some(rx);
                        logged_later.push(tx);
                        let _ = req.reply.send(Ok(written));
                    }
                    answer if waits => later.push((req.reply, answer)),
                    answer => {
                        let _ = req.reply.send(answer);
                    }
                }
            }
            // The writers of changes that take effect later are answered then, without
            // holding the writer thread.
            if let Some(settled) =
                settling.filter(|_| !later.is_empty() || !logged_later.is_empty())
            {
                let spawned = std::thread::Builder::new()
                    .name("store-settle".into())
                    .spawn(move || {
                        let _ = settled.done.blocking_recv();
                        for (reply, answer) in later {
                            let _ = reply.send(answer);
                        }
                        for tx in logged_later {
                            let _ = tx.send(());
                        }
                    });
                if let Err(e) = spawned {
                    tracing::error!(error = %e, "cannot wait for the changes to settle");
                }
            }
        }
        Err(e) => {
            tracing::error!(error = %e, requests = batch.len(), "group commit failed");
            for req in batch.drain(..) {
                let _ = req.reply.send(Err(e.clone()));
            }
        }
    }
}

/// The early check of one operation, when it puts a document the hook checks early and its
/// state did not move meanwhile. A panic leaves the check to the writer.
fn precheck_one(hook: &dyn CommitHook, op: &Op) -> Option<Prechecked> {
    let Op::PutDocument(put) = op else {
        return None;
    };
    let generation = hook.generation()?;
    let doc = Document {
        uri: put.uri.clone(),
        format: put.format,
        collections: put.collections.clone().unwrap_or_default(),
        permissions: put.permissions.unwrap_or(put.default_permissions),
        content: put.content.clone(),
    };
    let result =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook.precheck(&doc))).ok()??;
    (hook.generation() == Some(generation)).then(|| Prechecked {
        generation,
        collections: doc.collections,
        permissions: doc.permissions,
        result,
    })
}

/// A hook's check of one document. A panic in it refuses that request alone: unguarded, it
/// would end the writer thread and with it every later write.
fn check_guarded(hook: &dyn CommitHook, doc: &Document) -> Result<Checked, StoreError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook.check(doc))) {
        Ok(checked) => checked.map_err(StoreError::Rejected),
        Err(_) => {
            tracing::error!(uri = %doc.uri, "the commit hook's check panicked");
            Err(StoreError::Internal(format!(
                "{}: the document could not be checked",
                doc.uri
            )))
        }
    }
}

type DocTable<'t> = redb::Table<'t, &'static str, &'static [u8]>;

/// The hook, its state's generation and a request's early checks, by operation.
struct Checks<'h> {
    hook: Option<&'h dyn CommitHook>,
    generation: Option<u64>,
    pre: Vec<Option<Prechecked>>,
}

impl Checks<'_> {
    /// The hook's verdict on the document operation `i` lands: its early check when that was
    /// of this document at this generation, else a check now.
    fn check(&mut self, i: usize, doc: &Document) -> Result<Checked, StoreError> {
        let Some(hook) = self.hook else {
            return Ok(Checked::default());
        };
        let early = self.pre.get_mut(i).and_then(Option::take).filter(|p| {
            Some(p.generation) == self.generation
                && p.permissions == doc.permissions
                && p.collections == doc.collections
        });
        match early {
            Some(p) => p.result.map_err(StoreError::Rejected),
            None => check_guarded(hook, doc),
        }
    }
}

/// Pass one: check every operation of a request against the state it will apply to.
fn plan_request(
    docs: &DocTable<'_>,
    caller: &Caller,
    ops: Vec<Op>,
    mut checks: Checks<'_>,
) -> Result<(Vec<Planned>, Written), StoreError> {
    // Earlier operations of the same request are visible to later ones, through the overlay.
    // Only a request that names a URI twice needs it, and most never do: they skip its copies.
    let repeats = ops.len() > 1 && {
        let mut seen: crate::FastMap<&str, ()> = crate::FastMap::default();
        seen.reserve(ops.len());
        ops.iter().any(|op| match op {
            Op::PutDocument(p) => seen.insert(&p.uri, ()).is_some(),
            Op::DeleteDocument { uri } => seen.insert(uri, ()).is_some(),
            _ => false,
        })
    };
    let mut overlay: crate::FastMap<String, Option<(Permissions, Vec<String>)>> =
        crate::FastMap::default();
    let mut planned = Vec::with_capacity(ops.len());
    let mut outcomes = Vec::with_capacity(ops.len());
    let mut warnings = Vec::new();
    for (i, op) in ops.into_iter().enumerate() {
        match op {
            Op::PutDocument(put) => {
                let existing = match overlay.get(&put.uri) {
                    Some(state) => state.clone(),
                    None => read_meta(docs, &put.uri)?,
                };
                let (permissions, collections, outcome) = match existing {
                    Some((perms, colls)) => {
                        if !caller.may(&perms, Capability::Update) {
                            return Err(StoreError::Forbidden {
                                user: caller.name().to_string(),
                                capability: "update",
                                uri: put.uri,
                            });
                        }
                        may_write_schema(caller, &put.uri, &colls)?;
                        (
                            put.permissions.unwrap_or(perms),
                            put.collections.unwrap_or(colls),
                            Outcome::Replaced,
                        )
                    }
                    None => {
                        if !may_create(caller) {
                            return Err(StoreError::Forbidden {
                                user: caller.name().to_string(),
                                capability: "insert",
                                uri: put.uri,
                            });
                        }
                        (
                            put.permissions.unwrap_or(put.default_permissions),
                            put.collections.unwrap_or_default(),
                            Outcome::Created,
                        )
                    }
                };
                // Schema is checked on both sides: what the document was (above), and what it
                // becomes.
                may_write_schema(caller, &put.uri, &collections)?;
                let doc = Document {
                    uri: put.uri,
                    format: put.format,
                    collections,
                    permissions,
                    content: put.content,
                };
                let checked = checks.check(i, &doc)?;
                warnings.extend(checked.warnings.into_iter().map(|message| Warning {
                    uri: doc.uri.clone(),
                    message,
                }));
                if repeats {
                    overlay.insert(
                        doc.uri.clone(),
                        Some((doc.permissions, doc.collections.clone())),
                    );
                }
                outcomes.push(outcome);
                planned.push(Planned::Document {
                    uri: doc.uri.clone(),
                    doc: Some(Arc::new(doc)),
                    prepared: checked.prepared,
                });
            }
            Op::DeleteDocument { uri } => {
                let existing = match overlay.get(&uri) {
                    Some(state) => state.clone(),
                    None => read_meta(docs, &uri)?,
                };
                match existing {
                    None => outcomes.push(Outcome::Absent),
                    // A document the caller can neither read nor update is, to them, not
                    // there: the same answer as an absent one, so a delete is no oracle.
                    Some((perms, _))
                        if !caller.may(&perms, Capability::Read)
                            && !caller.may(&perms, Capability::Update) =>
                    {
                        outcomes.push(Outcome::Absent)
                    }
                    Some((perms, colls)) => {
                        if !caller.may(&perms, Capability::Update) {
                            return Err(StoreError::Forbidden {
                                user: caller.name().to_string(),
                                capability: "update",
                                uri,
                            });
                        }
                        may_write_schema(caller, &uri, &colls)?;
                        if repeats {
                            overlay.insert(uri.clone(), None);
                        }
                        outcomes.push(Outcome::Deleted);
                        planned.push(Planned::Document {
                            uri,
                            doc: None,
                            prepared: None,
                        });
                    }
                }
            }
            Op::PutRecord { table, key, value } => {
                require_admin(caller, table)?;
                outcomes.push(Outcome::Done);
                planned.push(Planned::Record {
                    table,
                    key,
                    value: Some(value),
                });
            }
            Op::DeleteRecord { table, key } => {
                require_admin(caller, table)?;
                outcomes.push(Outcome::Done);
                planned.push(Planned::Record {
                    table,
                    key,
                    value: None,
                });
            }
            Op::ReplaceTable { table, entries } => {
                require_admin(caller, table)?;
                outcomes.push(Outcome::Done);
                planned.push(Planned::Replace { table, entries });
            }
        }
    }
    Ok((
        planned,
        Written {
            outcomes,
            warnings,
            settled: None,
        },
    ))
}

/// Creating a document needs `rest-writer`; replacing or deleting one needs `update` on it.
fn may_create(caller: &Caller) -> bool {
    caller.has(Role::RestWriter) || caller.has(Role::Admin)
}

/// A document in a schema collection (templates, descriptors) is written or deleted only by a
/// caller with that collection's role, or an admin (`acl::schema_role`).
fn may_write_schema(caller: &Caller, uri: &str, collections: &[String]) -> Result<(), StoreError> {
    for role in collections
        .iter()
        .filter_map(|c| crate::acl::schema_role(c))
    {
        if !caller.has(role) && !caller.has(Role::Admin) {
            return Err(StoreError::SchemaPrivilege {
                user: caller.name().to_string(),
                role: role.name(),
                uri: uri.to_string(),
            });
        }
    }
    Ok(())
}

/// The service's own tables are written by the service (system caller) or an admin; traces
/// are written on behalf of any caller whose flow ran.
fn require_admin(caller: &Caller, table: Table) -> Result<(), StoreError> {
    if table == Table::Traces || caller.has(Role::Admin) {
        return Ok(());
    }
    Err(StoreError::Forbidden {
        user: caller.name().to_string(),
        capability: "admin",
        uri: format!("{table:?}"),
    })
}

fn read_meta(
    docs: &DocTable<'_>,
    uri: &str,
) -> Result<Option<(Permissions, Vec<String>)>, StoreError> {
    let Some(value) = docs.get(uri).map_err(storage)? else {
        return Ok(None);
    };
    let (_, perms, colls, _) = codec::decode_meta(uri, value.value())?;
    Ok(Some((perms, colls)))
}

/// Pass two: write what pass one decided.
fn apply_plan(
    txn: &redb::WriteTransaction,
    docs: &mut DocTable<'_>,
    planned: Vec<Planned>,
    changes: &mut Vec<Change>,
) -> Result<(), StoreError> {
    for p in planned {
        match p {
            Planned::Document { uri, doc, prepared } => {
                match &doc {
                    Some(d) => {
                        docs.insert(uri.as_str(), codec::encode(d).as_slice())
                            .map_err(storage)?;
                    }
                    None => {
                        docs.remove(uri.as_str()).map_err(storage)?;
                    }
                }
                changes.push(Change { uri, doc, prepared });
            }
            Planned::Record { table, key, value } => {
                let mut t = txn.open_table(table.definition()).map_err(storage)?;
                match value {
                    Some(v) => {
                        t.insert(key.as_str(), v.as_slice()).map_err(storage)?;
                    }
                    None => {
                        t.remove(key.as_str()).map_err(storage)?;
                    }
                }
            }
            Planned::Replace { table, entries } => {
                let mut t = txn.open_table(table.definition()).map_err(storage)?;
                t.retain(|_, _| false).map_err(storage)?;
                for (k, v) in entries {
                    t.insert(k.as_str(), v.as_slice()).map_err(storage)?;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
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
}
