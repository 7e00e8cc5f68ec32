//! What the store takes and answers: tables, documents, operations, outcomes and errors,
//! and the hooks a commit runs through.

use super::*;

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
    pub(crate) fn definition(self) -> TableDefinition<'static, &'static str, &'static [u8]> {
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
    /// The document's content is kept by the holders of these shards, not by this node.
    #[error("the document is kept by the holders of shards {0:?}")]
    Elsewhere(Vec<u16>),
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
            StoreError::Elsewhere(_) => ErrorCode::Unavailable,
            StoreError::Log(_) => ErrorCode::Unavailable,
            StoreError::TooLarge { .. } => ErrorCode::PayloadTooLarge,
        };
        ApiError::new(code, e.to_string())
    }
}

/// A storage error as the store reports it. redb stops at its first I/O error, every later
/// operation answering `PreviousIo` until the database is opened again: that says so.
pub(crate) fn storage<E: Into<redb::Error>>(e: E) -> StoreError {
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
pub(crate) fn free_bytes(dir: &Path) -> Option<u64> {
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
    pub fn from_u8(b: u8) -> Option<Format> {
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
    /// A copy of a document this node kept a stub of ([`crate::Store::fill`]), not a write:
    /// it decides no records (no geofence events).
    pub quiet: bool,
}

/// A document as [`crate::Store::lookup`] finds it for a caller.
#[derive(Debug)]
pub enum Lookup {
    /// Absent, or not readable by the caller.
    Absent,
    Here(Document),
    /// Its content is kept by the holders of these shards (a cluster node holding some).
    Elsewhere {
        shards: Vec<u16>,
    },
}

/// The hook's verdict on a document about to land.
#[derive(Debug, Default)]
pub struct Checked {
    /// Problems that do not stop the write (a geometry that cannot be indexed): the write's
    /// answer lists them.
    pub warnings: Vec<String>,
    /// Work done in the check that `committed` can use instead of doing it again.
    pub prepared: Option<Prepared>,
    /// `Some`: this node does not keep the content (a cluster node holding some shards),
    /// only the document's header and the shards whose holders keep it.
    pub elsewhere: Option<Vec<u16>>,
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
    /// Records decided from a batch's changes, in order, before it commits, on the writer
    /// thread: they are kept in the same transaction (geofence events), so they are durable
    /// exactly when the changes are.
    fn decide(&self, _changes: &[Change]) -> Vec<crate::Record> {
        Vec::new()
    }
    /// The records [`CommitHook::decide`] made, numbered from `first`, once their commit is
    /// durable and `committed` has run, before any writer is answered.
    fn recorded(&self, _first: u64, _records: Vec<crate::Record>) {}
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
