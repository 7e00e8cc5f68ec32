//! The writer thread: group commit, the plan of each request with its permission checks,
//! and applying the plan inside the transaction that writes.

use super::*;

/// Where the store lives and how much room its writes need there.
pub(crate) struct SpaceCheck {
    pub(crate) dir: std::path::PathBuf,
    pub(crate) min: u64,
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
pub(crate) struct WriterSettings {
    pub(crate) batch_max: usize,
    pub(crate) space: SpaceCheck,
    pub(crate) quick_repair: bool,
    /// The compression dictionary documents are written with (0: none); a store without one
    /// may be given one while it runs ([`crate::Store::train_dictionary`]).
    pub(crate) dictionary: Arc<std::sync::atomic::AtomicU32>,
    /// How long the hook's records are kept.
    pub(crate) retention: crate::Retention,
}

pub(crate) fn writer_loop(
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
pub(crate) enum Planned {
    Document {
        uri: String,
        doc: Option<Arc<Document>>,
        prepared: Option<Prepared>,
        /// The shards whose holders keep the content, when this node keeps a stub.
        elsewhere: Option<Vec<u16>>,
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

pub(crate) fn commit_batch(
    db: &Database,
    batch: &mut Vec<WriteRequest>,
    hook: Option<&dyn CommitHook>,
    stats: &StoreStats,
    applied: &AtomicU64,
    writer: &WriterSettings,
) {
    let before = applied.load(Ordering::Acquire);
    match write_batch(db, batch, hook, before, writer) {
        Ok(mut done) => {
            applied.store(done.last, Ordering::Release);
            crate::metrics::record(|m| {
                m.commits.inc();
                m.commit_batch.observe(batch.len() as f64);
                m.documents_written.inc_by(done.changes.len() as u64);
            });
            stats.commits.fetch_add(1, Ordering::Relaxed);
            stats
                .writes
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
            let mut settling = None;
            if let Some(hook) = hook
                && !done.changes.is_empty()
            {
                let hooked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    hook.committed(&done.changes)
                }));
                match hooked {
                    Ok(s) => settling = s,
                    Err(_) => {
                        tracing::error!(changes = done.changes.len(), "commit hook panicked")
                    }
                }
                if let Some((first, records)) = done.records.take() {
                    let recorded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        hook.recorded(first, records)
                    }));
                    if recorded.is_err() {
                        tracing::error!(first, "commit hook panicked on its records");
                    }
                }
            }
            if let Some(c) = done.commit {
                stats.last_commit.store(c, Ordering::Release);
            }
            answer_batch(batch, done, settling);
        }
        Err(e) => {
            tracing::error!(error = %e, requests = batch.len(), "group commit failed");
            for req in batch.drain(..) {
                let _ = req.reply.send(Err(e.clone()));
            }
        }
    }
}

/// A batch written and committed, not yet answered.
struct CommittedBatch {
    /// The last log entry applied (`before` outside a cluster).
    last: u64,
    answers: Vec<Result<Written, StoreError>>,
    changes: Vec<Change>,
    /// Each request's changes, by index into `changes`.
    spans: Vec<std::ops::Range<usize>>,
    /// The commit's number in the change record, if it changed anything.
    commit: Option<u64>,
    /// The hook's records kept with the commit, numbered from the first.
    records: Option<(u64, Vec<crate::Record>)>,
}

/// Plan and apply every request of `batch` in one transaction, and commit it.
fn write_batch(
    db: &Database,
    batch: &mut [WriteRequest],
    hook: Option<&dyn CommitHook>,
    before: u64,
    writer: &WriterSettings,
) -> Result<CommittedBatch, StoreError> {
    let mut last = before;
    let mut answers = Vec::with_capacity(batch.len());
    let mut changes: Vec<Change> = Vec::new();
    let mut spans = Vec::with_capacity(batch.len());
    let mut commit = None;
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
            // A fill copies only the documents still kept as a stub: one written or deleted
            // since it was asked for is as the log left it.
            let ops = if req.fill {
                let mut kept = Vec::with_capacity(ops.len());
                for op in ops {
                    if let Op::PutDocument(p) = &op
                        && let Some(v) = docs.get(p.uri.as_str()).map_err(storage)?
                        && codec::is_elsewhere(v.value())
                    {
                        kept.push(op);
                    }
                }
                kept
            } else {
                ops
            };
            let answer = match plan_request(&docs, &req.caller, ops, checks) {
                Err(e) => Err(e),
                Ok((planned, written)) => {
                    let dictionary = writer.dictionary.load(Ordering::Acquire);
                    apply_plan(&txn, &mut docs, planned, dictionary, &mut changes)?;
                    for c in &mut changes[first..] {
                        c.quiet = req.fill;
                    }
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
    let mut records = None;
    if let Some(hook) = hook
        && !changes.is_empty()
    {
        // A panic here decides nothing: the write goes on without its records.
        let decided =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook.decide(&changes)))
                .unwrap_or_else(|_| {
                    tracing::error!(
                        changes = changes.len(),
                        "commit hook panicked deciding records"
                    );
                    Vec::new()
                });
        if !decided.is_empty() {
            let now = geoshard_core::time::now_ms();
            let first = crate::events::append(&txn, &decided, writer.retention, now)?;
            records = Some((first, decided));
        }
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
    Ok(CommittedBatch {
        last,
        answers,
        changes,
        spans,
        commit,
        records,
    })
}

/// Answer each request of a committed batch: at once, or, for changes that take effect
/// later (`settling`), once they have, on a thread of their own so that the writer goes on.
fn answer_batch(batch: &mut Vec<WriteRequest>, done: CommittedBatch, settling: Option<Settling>) {
    let CommittedBatch {
        answers,
        changes,
        spans,
        ..
    } = done;
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
    let Some(settled) = settling.filter(|_| !later.is_empty() || !logged_later.is_empty()) else {
        return;
    };
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

/// The early check of one operation, when it puts a document the hook checks early and its
/// state did not move meanwhile. A panic leaves the check to the writer.
pub(crate) fn precheck_one(hook: &dyn CommitHook, op: &Op) -> Option<Prechecked> {
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
pub(crate) fn check_guarded(hook: &dyn CommitHook, doc: &Document) -> Result<Checked, StoreError> {
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

pub(crate) type DocTable<'t> = redb::Table<'t, &'static str, &'static [u8]>;

/// The hook, its state's generation and a request's early checks, by operation.
pub(crate) struct Checks<'h> {
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
pub(crate) fn plan_request(
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
    let mut plan = Plan {
        docs,
        caller,
        repeats,
        overlay: crate::FastMap::default(),
        planned: Vec::with_capacity(ops.len()),
        outcomes: Vec::with_capacity(ops.len()),
        warnings: Vec::new(),
    };
    for (i, op) in ops.into_iter().enumerate() {
        match op {
            Op::PutDocument(put) => plan.put(i, put, &mut checks)?,
            Op::DeleteDocument { uri } => plan.delete(uri)?,
            Op::PutRecord { table, key, value } => plan.record(
                table,
                Planned::Record {
                    table,
                    key,
                    value: Some(value),
                },
            )?,
            Op::DeleteRecord { table, key } => plan.record(
                table,
                Planned::Record {
                    table,
                    key,
                    value: None,
                },
            )?,
            Op::ReplaceTable { table, entries } => {
                plan.record(table, Planned::Replace { table, entries })?
            }
        }
    }
    Ok((
        plan.planned,
        Written {
            outcomes: plan.outcomes,
            warnings: plan.warnings,
            settled: None,
        },
    ))
}

/// One request's plan as it is made, operation by operation.
struct Plan<'a, 't> {
    docs: &'a DocTable<'t>,
    caller: &'a Caller,
    /// Whether the request names a URI twice, so that `overlay` is kept.
    repeats: bool,
    /// What earlier operations of the request made of a URI (`None`: deleted).
    overlay: crate::FastMap<String, Option<(Permissions, Vec<String>)>>,
    planned: Vec<Planned>,
    outcomes: Vec<Outcome>,
    warnings: Vec<Warning>,
}

impl Plan<'_, '_> {
    /// A document's permissions and collections as the request sees it so far.
    fn existing(&self, uri: &str) -> Result<Option<(Permissions, Vec<String>)>, StoreError> {
        match self.overlay.get(uri) {
            Some(state) => Ok(state.clone()),
            None => read_meta(self.docs, uri),
        }
    }

    fn forbidden(&self, capability: &'static str, uri: String) -> StoreError {
        StoreError::Forbidden {
            user: self.caller.name().to_string(),
            capability,
            uri,
        }
    }

    fn put(
        &mut self,
        i: usize,
        put: PutDocument,
        checks: &mut Checks<'_>,
    ) -> Result<(), StoreError> {
        let caller = self.caller;
        let (permissions, collections, outcome) = match self.existing(&put.uri)? {
            Some((perms, colls)) => {
                if !caller.may(&perms, Capability::Update) {
                    return Err(self.forbidden("update", put.uri));
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
                    return Err(self.forbidden("insert", put.uri));
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
        self.warnings
            .extend(checked.warnings.into_iter().map(|message| Warning {
                uri: doc.uri.clone(),
                message,
            }));
        if self.repeats {
            self.overlay.insert(
                doc.uri.clone(),
                Some((doc.permissions, doc.collections.clone())),
            );
        }
        self.outcomes.push(outcome);
        self.planned.push(Planned::Document {
            uri: doc.uri.clone(),
            doc: Some(Arc::new(doc)),
            prepared: checked.prepared,
            elsewhere: checked.elsewhere,
        });
        Ok(())
    }

    fn delete(&mut self, uri: String) -> Result<(), StoreError> {
        let caller = self.caller;
        match self.existing(&uri)? {
            None => self.outcomes.push(Outcome::Absent),
            // A document the caller can neither read nor update is, to them, not there: the
            // same answer as an absent one, so a delete is no oracle.
            Some((perms, _))
                if !caller.may(&perms, Capability::Read)
                    && !caller.may(&perms, Capability::Update) =>
            {
                self.outcomes.push(Outcome::Absent)
            }
            Some((perms, colls)) => {
                if !caller.may(&perms, Capability::Update) {
                    return Err(self.forbidden("update", uri));
                }
                may_write_schema(caller, &uri, &colls)?;
                if self.repeats {
                    self.overlay.insert(uri.clone(), None);
                }
                self.outcomes.push(Outcome::Deleted);
                self.planned.push(Planned::Document {
                    uri,
                    doc: None,
                    prepared: None,
                    elsewhere: None,
                });
            }
        }
        Ok(())
    }

    /// A write of the service's own records: the admin's only.
    fn record(&mut self, table: Table, planned: Planned) -> Result<(), StoreError> {
        require_admin(self.caller, table)?;
        self.outcomes.push(Outcome::Done);
        self.planned.push(planned);
        Ok(())
    }
}

/// Creating a document needs `rest-writer`; replacing or deleting one needs `update` on it.
pub(crate) fn may_create(caller: &Caller) -> bool {
    caller.has(Role::RestWriter) || caller.has(Role::Admin)
}

/// A document in a schema collection (templates, descriptors) is written or deleted only by a
/// caller with that collection's role, or an admin (`acl::schema_role`).
pub(crate) fn may_write_schema(
    caller: &Caller,
    uri: &str,
    collections: &[String],
) -> Result<(), StoreError> {
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
pub(crate) fn require_admin(caller: &Caller, table: Table) -> Result<(), StoreError> {
    if table == Table::Traces || caller.has(Role::Admin) {
        return Ok(());
    }
    Err(StoreError::Forbidden {
        user: caller.name().to_string(),
        capability: "admin",
        uri: format!("{table:?}"),
    })
}

pub(crate) fn read_meta(
    docs: &DocTable<'_>,
    uri: &str,
) -> Result<Option<(Permissions, Vec<String>)>, StoreError> {
    let Some(value) = docs.get(uri).map_err(storage)? else {
        return Ok(None);
    };
    let (_, perms, colls, _) = codec::decode_meta(uri, value.value())?;
    Ok(Some((perms, colls)))
}

/// Documents in a batch from which they are encoded in parallel.
const PARALLEL_ENCODE: usize = 64;

/// Pass two: write what pass one decided.
pub(crate) fn apply_plan(
    txn: &redb::WriteTransaction,
    docs: &mut DocTable<'_>,
    planned: Vec<Planned>,
    dictionary: u32,
    changes: &mut Vec<Change>,
) -> Result<(), StoreError> {
    // Compressing is the costly part of encoding: a batch's documents are encoded in
    // parallel, then inserted in order.
    let encode = |p: &Planned| match p {
        Planned::Document {
            doc: Some(d),
            elsewhere: Some(home),
            ..
        } => Some(codec::encode_elsewhere(d, home)),
        Planned::Document { doc: Some(d), .. } => Some(codec::encode(d, dictionary)),
        _ => None,
    };
    let encoded: Vec<Option<Vec<u8>>> = if dictionary != 0 && planned.len() >= PARALLEL_ENCODE {
        use rayon::prelude::*;
        planned.par_iter().with_min_len(16).map(encode).collect()
    } else {
        planned.iter().map(encode).collect()
    };
    for (p, bytes) in planned.into_iter().zip(encoded) {
        match p {
            Planned::Document {
                uri, doc, prepared, ..
            } => {
                match bytes {
                    Some(bytes) => {
                        docs.insert(uri.as_str(), bytes.as_slice())
                            .map_err(storage)?;
                    }
                    None => {
                        docs.remove(uri.as_str()).map_err(storage)?;
                    }
                }
                changes.push(Change {
                    uri,
                    doc,
                    prepared,
                    quiet: false,
                });
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
