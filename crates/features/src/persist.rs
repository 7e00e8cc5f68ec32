//! Saving the views beside the store and opening them again: the saver thread, the save,
//! and a start that reads the saved views and replays what changed since.

use super::*;

/// How a save of the views went.
pub(crate) struct Saved {
    /// The store recorded the save's point: a start reads the files and what changed since.
    pub(crate) recorded: bool,
    /// Views not written (too little free disk, or a write failed).
    pub(crate) unsaved: usize,
}

/// A thread saving the views while the server runs (see [`Features::save_views_if_due`]).
pub struct ViewSaver {
    stop: Arc<std::sync::atomic::AtomicBool>,
    wake: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ViewSaver {
    /// Look every second (or `every`, if shorter) whether a save is due; none when `every`
    /// is zero.
    pub fn start(features: Arc<Features>, every: std::time::Duration) -> ViewSaver {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (wake, sleep) = std::sync::mpsc::channel::<()>();
        let thread = (!every.is_zero()).then(|| {
            let stop = stop.clone();
            let check = every.min(std::time::Duration::from_secs(1));
            std::thread::Builder::new()
                .name("view-saver".into())
                .spawn(move || {
                    let pool = background_pool("view-save");
                    while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                        sleep.recv_timeout(check)
                    {
                        let cancelled = || stop.load(std::sync::atomic::Ordering::Relaxed);
                        let save = || features.save_views_if_due(every, &cancelled);
                        match &pool {
                            Some(pool) => pool.install(save),
                            None => save(),
                        };
                    }
                })
                .ok()
        });
        ViewSaver {
            stop,
            wake: Some(wake),
            thread: thread.flatten(),
        }
    }

    /// Stop it, cancelling a save under way (the file it would replace stays whole).
    pub fn stop(mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        drop(self.wake.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Features {
    /// Check the sums the start left for later ([`segment::load`]) on a thread of its own;
    /// a view found damaged is rebuilt from the documents in the background, as after a
    /// definition change, while it and the others serve.
    pub(crate) fn verify_in_background(self: &Arc<Self>) {
        let pending = std::mem::take(&mut *self.unverified.lock());
        if pending.is_empty() {
            return;
        }
        let me = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("view-verify".into())
            .spawn(move || {
                let started = std::time::Instant::now();
                let bytes: usize = pending.iter().map(|(_, u)| u.bytes()).sum();
                let mut damaged = Vec::new();
                for (key, unchecked) in pending {
                    match unchecked.verify() {
                        Ok(()) => {
                            if let Some(features) = me.upgrade() {
                                features.untrusted.lock().remove(&key);
                            }
                        }
                        Err(why) => {
                            tracing::error!(view = %key, why = %why, "saved view damaged; rebuilding it from the documents");
                            damaged.push(key);
                        }
                    }
                }
                tracing::info!(
                    bytes,
                    damaged = damaged.len(),
                    secs = started.elapsed().as_secs_f64(),
                    "saved views verified"
                );
                if let Some(features) = me.upgrade()
                    && !damaged.is_empty()
                {
                    features.rebuild_in_background(damaged);
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start checking the saved views");
        }
    }

    /// Build `keys` again from the documents, in the background, then put them in place.
    fn rebuild_in_background(self: Arc<Self>, keys: Vec<ViewKey>) {
        let _starting = self.starting_rebuild.lock();
        self.finish_rebuild();
        let next = {
            let current = self.catalog.read();
            Catalog {
                generation: current.generation + 1,
                templates: current.templates.clone(),
                descriptors: current.descriptors.clone(),
                views: current
                    .views
                    .iter()
                    .filter(|(k, _)| !keys.contains(k))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            }
        };
        // Its end is waited for by whoever starts the next build, or by the save at a stop.
        let _ = self.start_background_build(next, keys);
    }

    /// Read back the saved views that can be used (see [`segment`]):
    /// those views with the documents changed since each one's commit point, and the keys of
    /// the views still to build.
    pub(crate) fn load_saved_views(
        &self,
        catalog: &Catalog,
        keys: Vec<ViewKey>,
    ) -> Result<(SavedViews, Vec<ViewKey>), StoreError> {
        let dir = segment::dir(self.store.path());
        if !dir.exists() {
            return Ok((Vec::new(), keys));
        }
        let needed = catalog.needed_paths();
        let last = self.store.last_commit();
        let mut changes: HashMap<u64, Option<Arc<Vec<String>>>> = HashMap::new();
        let mut saved = Vec::new();
        let mut read = Vec::new();
        let mut rest = Vec::new();
        for key in keys {
            let Some((template, def)) = catalog.template_of(&key) else {
                continue;
            };
            let paths = needed.get(&key).cloned().unwrap_or_default();
            let file = dir.join(segment::file_name(&key));
            if !file.exists() {
                rest.push(key);
                continue;
            }
            let print = segment::fingerprint(
                &template,
                &def,
                &paths,
                self.settings.max_document_vertices,
                &self.placement_signature(),
            );
            let reading = std::time::Instant::now();
            let index = |items| self.index(items).map_err(|e| e.to_string());
            let settings = (self.settings.engine, self.settings.view_check_at_open_bytes);
            let loaded =
                segment::load(&file, def, &paths, &print, &index, settings).and_then(|l| {
                    if l.point > last {
                        return Err(format!(
                            "saved at commit {}, past the store's last ({last})",
                            l.point
                        ));
                    }
                    let changed = match changes.get(&l.point) {
                        Some(c) => c.clone(),
                        None => {
                            let c = self
                                .store
                                .changed_since(l.point)
                                .map_err(|e| e.to_string())?
                                .map(|c| Arc::new(c.into_iter().collect::<Vec<_>>()));
                            changes.insert(l.point, c.clone());
                            c
                        }
                    };
                    let changed = changed.ok_or_else(|| {
                        "the documents changed since it was saved were not all recorded".to_string()
                    })?;
                    Ok((l, changed))
                });
            match loaded {
                Ok((l, changed)) => {
                    tracing::debug!(view = %key, secs = reading.elapsed().as_secs_f64(), "saved view read");
                    read.push((key, template, paths, l, changed, file));
                }
                Err(why) => {
                    tracing::info!(view = %key, file = %file.display(), why = %why, "saved view not used; building it");
                    rest.push(key);
                }
            }
        }
        // The documents changed since a point are read again once for all the views saved
        // at it: past what that costs against building those views, they are built.
        let mut rows_at: HashMap<u64, usize> = HashMap::new();
        for (_, _, _, l, _, _) in &read {
            *rows_at.entry(l.point).or_default() += l.data.len();
        }
        for (key, template, paths, l, changed, file) in read {
            let most = most_changes(rows_at[&l.point]);
            if changed.len() > most {
                tracing::info!(view = %key, file = %file.display(),
                    why = %format!("{} documents changed since it was saved, more than {most}", changed.len()),
                    "saved view not used; building it");
                rest.push(key);
                continue;
            }
            let mut diagnostics = self.diagnostics.lock();
            diagnostics.clear_view(&key);
            for (uri, problem, skipped) in l.diagnostics {
                diagnostics.add(&uri, &key, problem, skipped);
            }
            drop(diagnostics);
            let unchecked = l.unchecked;
            let state = Self::state_of(
                template,
                l.data,
                paths,
                l.indexes,
                self.placement_signature(),
            );
            if !unchecked.is_empty() {
                self.unverified.lock().push((key.clone(), unchecked));
                self.untrusted
                    .lock()
                    .insert(key.clone(), Arc::downgrade(&state));
            }
            self.on_disk
                .lock()
                .insert(key.clone(), (l.point, Arc::downgrade(&state)));
            saved.push((key, state, changed));
        }
        Ok((saved, rest))
    }

    /// The templates and descriptors, without reading every document: those listed when the
    /// views were last saved and those written since. `false` when that cannot be known.
    pub(crate) fn load_saved_definitions(&self, catalog: &mut Catalog) -> Result<bool, StoreError> {
        let file = segment::dir(self.store.path()).join(segment::DEFINITIONS);
        let Some((point, uris)) = segment::read_definitions(&file) else {
            return Ok(false);
        };
        if point > self.store.last_commit() {
            return Ok(false);
        }
        let Some(changed) = self.store.changed_since(point)? else {
            return Ok(false);
        };
        let system = crate::acl::Caller::system();
        for uri in uris.iter().chain(&changed) {
            if let Some(doc) = self.store.get(&system, uri)? {
                self.load_definition(catalog, &doc);
            }
        }
        Ok(true)
    }

    /// Put the views read back into `catalog` and apply to them the documents changed since
    /// they were saved.
    pub(crate) fn catch_up(&self, catalog: &mut Catalog, saved: SavedViews) {
        // Views saved at the same point catch up together: a document's diagnostics are
        // cleared and made again for every view it feeds at once.
        type Group = (Arc<Vec<String>>, Vec<(ViewKey, Arc<ViewState>)>);
        let mut groups: Vec<Group> = Vec::new();
        for (key, state, changed) in saved {
            match groups.iter_mut().find(|(c, _)| Arc::ptr_eq(c, &changed)) {
                Some((_, views)) => views.push((key, state)),
                None => groups.push((changed, vec![(key, state)])),
            }
        }
        for (changed, views) in groups {
            let together = Catalog {
                generation: catalog.generation,
                templates: catalog.templates.clone(),
                descriptors: catalog.descriptors.clone(),
                views: views.iter().cloned().collect(),
            };
            let documents: Vec<String> = changed
                .iter()
                .filter(|u| {
                    !catalog.templates.contains_key(*u) && !catalog.descriptors.contains_key(*u)
                })
                .cloned()
                .collect();
            self.replay(&together, &documents);
            for (key, state) in views {
                tracing::info!(
                    view = %key,
                    rows = state.data.read().len(),
                    changed_since = documents.len(),
                    "view read from its saved file"
                );
                catalog.views.insert(key, state);
            }
        }
    }

    /// Save every view to the data directory as of the store's last commit, for the next
    /// start (see [`segment`]). Call once no write can come: the store's writer has stopped.
    /// Returns the number of views not saved (their next start builds them).
    pub fn save_views(&self) -> usize {
        self.finish_rebuild();
        let mut last = self.saves.lock();
        self.save(&mut last, self.store.last_commit(), false, &|| false)
            .unsaved
    }

    /// Save the views while writes go on, when `every` has passed since they last were and
    /// documents changed since, or sooner when the documents changed near the most a start
    /// reads again (see [`most_changes`]). Not while views are built in the background.
    /// Returns whether a save was made; `cancelled` stops one midway.
    pub fn save_views_if_due(
        &self,
        every: std::time::Duration,
        cancelled: &(dyn Fn() -> bool + Sync),
    ) -> bool {
        if self.rebuilding() {
            return false;
        }
        let Some(mut last) = self.saves.try_lock() else {
            return false;
        };
        if self.store.last_commit() == last.point {
            return false;
        }
        let elapsed = last.at.elapsed();
        let due = elapsed >= every
            || (elapsed >= every / 4 && {
                let rows: usize = {
                    let catalog = self.catalog.read();
                    catalog.views.values().map(|v| v.data.read().len()).sum()
                };
                let bound = most_changes(rows);
                matches!(self.store.recorded_changes(), Ok(Some(n)) if n as usize >= bound / 2)
            });
        if !due {
            return false;
        }
        // Every change from `from` on is recorded; the views hold every commit up to
        // `last_commit` once its hook ran, which the point waits for.
        let from = match self.store.record_changes() {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, "views not saved: the store cannot record changes");
                return false;
            }
        };
        let waiting = std::time::Instant::now();
        while self.store.last_commit() < from {
            if waiting.elapsed() > std::time::Duration::from_secs(10) || cancelled() {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let point = self.store.last_commit();
        self.save(&mut last, point, true, cancelled).recorded
    }

    /// Write every view whose file does not hold it as of `point`, then tell the store.
    /// `live`: writes go on meanwhile (see [`segment::save`]).
    fn save(
        &self,
        last: &mut LastSave,
        point: u64,
        live: bool,
        cancelled: &(dyn Fn() -> bool + Sync),
    ) -> Saved {
        tracing::debug!(commit = point, live, "saving views");
        let started = std::time::Instant::now();
        let dir = segment::dir(self.store.path());
        if let Err(e) = std::fs::create_dir_all(&dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "views not saved");
            return Saved {
                recorded: false,
                unsaved: self.catalog.read().views.len(),
            };
        }
        // The views and definitions as they are now; the catalog is not held while saving.
        let (views, definitions) = {
            let catalog = self.catalog.read();
            let views: Vec<(ViewKey, Arc<ViewState>)> = catalog
                .views
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let definitions: Vec<String> = catalog
                .templates
                .keys()
                .chain(catalog.descriptors.keys())
                .cloned()
                .collect();
            (views, definitions)
        };
        let mut by_view: HashMap<String, Vec<segment::SavedDiagnostic>> = HashMap::new();
        for ((uri, view), (problem, skipped)) in &self.diagnostics.lock().by_doc {
            by_view
                .entry(view.clone())
                .or_default()
                .push((uri.clone(), problem.clone(), *skipped));
        }
        let mut kept = std::collections::HashSet::new();
        let definitions: Vec<&String> = definitions.iter().collect();
        match segment::write_definitions(&dir.join(segment::DEFINITIONS), point, &definitions) {
            Ok(()) => {
                kept.insert(segment::DEFINITIONS.to_string());
            }
            Err(e) => tracing::warn!(error = %e, "the list of definitions was not saved"),
        }
        let mut rows = 0;
        let mut unsaved = 0;
        for (key, view) in &views {
            let name = segment::file_name(key);
            let diagnostics = by_view.remove(&key.to_string()).unwrap_or_default();
            match self.save_view(&dir.join(&name), key, view, point, &diagnostics, cancelled) {
                ViewSave::Kept(n) => {
                    rows += n;
                    kept.insert(name);
                }
                ViewSave::Failed => unsaved += 1,
                ViewSave::Cancelled => {
                    return Saved {
                        recorded: false,
                        unsaved: views.len(),
                    };
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if !kept.contains(&name) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        self.record_save(
            last,
            point,
            live,
            started,
            SaveTally {
                kept,
                rows,
                unsaved,
                views: views.len(),
            },
        )
    }

    /// Record a save of the views at commit `point` in the store, and say how it went.
    fn record_save(
        &self,
        last: &mut LastSave,
        point: u64,
        live: bool,
        started: std::time::Instant,
        tally: SaveTally,
    ) -> Saved {
        let SaveTally {
            kept,
            rows,
            unsaved,
            views: all,
        } = tally;
        let recorded = if live {
            self.store.saved_live(point)
        } else {
            self.store.saved_at(point).map(|()| true)
        };
        match recorded {
            Ok(true) => {
                tracing::info!(
                    views = kept.iter().filter(|n| n.ends_with(".seg")).count(),
                    rows,
                    commit = point,
                    live,
                    secs = started.elapsed().as_secs_f64(),
                    "views saved"
                );
                *last = LastSave {
                    at: std::time::Instant::now(),
                    point,
                };
                Saved {
                    recorded: true,
                    unsaved,
                }
            }
            Ok(false) => {
                tracing::info!(
                    commit = point,
                    "views saved, but more documents changed meanwhile than the store records; the next save replaces them"
                );
                *last = LastSave {
                    at: std::time::Instant::now(),
                    point: 0,
                };
                Saved {
                    recorded: false,
                    unsaved,
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "views saved, but the store could not record it; the next start builds them");
                Saved {
                    recorded: false,
                    unsaved: all,
                }
            }
        }
    }

    /// Save one view to `file`, unless the file read at start (or saved since) is of this
    /// very commit and view.
    fn save_view(
        &self,
        file: &std::path::Path,
        key: &ViewKey,
        view: &Arc<ViewState>,
        point: u64,
        diagnostics: &[segment::SavedDiagnostic],
        cancelled: &(dyn Fn() -> bool + Sync),
    ) -> ViewSave {
        // A view read from a file whose sums are not all checked yet (or failed) is never
        // saved from: its file stays as it is, and the next start reads it and the documents
        // changed since again.
        let untrusted = self
            .untrusted
            .lock()
            .get(key)
            .is_some_and(|was| was.upgrade().is_some_and(|w| Arc::ptr_eq(&w, view)));
        if untrusted && file.exists() {
            return ViewSave::Kept(view.data.read().len());
        }
        let unchanged = self.on_disk.lock().get(key).is_some_and(|(at, was)| {
            *at == point && was.upgrade().is_some_and(|w| Arc::ptr_eq(&w, view))
        });
        if unchanged && file.exists() {
            return ViewSave::Kept(view.data.read().len());
        }
        let print = segment::fingerprint(
            &view.template,
            &view.def,
            &view.paths,
            self.settings.max_document_vertices,
            &view.placement,
        );
        // The store must never meet a full disk: every piece of the file must leave it the
        // space it keeps.
        let room = |bytes: u64| self.store.has_room_for(bytes);
        match segment::save(
            file,
            &view.data,
            &view.paths,
            &segment::Saving {
                fingerprint: &print,
                point,
                engine: self.settings.engine,
            },
            diagnostics,
            &segment::SaveLimits {
                cancelled,
                room: &room,
            },
        ) {
            Ok(n) => {
                self.on_disk
                    .lock()
                    .insert(key.clone(), (point, Arc::downgrade(view)));
                ViewSave::Kept(n)
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {
                // Its old file, if any, is whole and still of use.
                tracing::info!(view = %key, "saving the views cancelled");
                ViewSave::Cancelled
            }
            Err(e) => {
                tracing::warn!(view = %key, error = %e, "view not saved; the next start builds it");
                let _ = std::fs::remove_file(file);
                ViewSave::Failed
            }
        }
    }
}

/// What a save of the views wrote.
pub(crate) struct SaveTally {
    /// The files of the directory to keep.
    kept: std::collections::HashSet<String>,
    /// Rows in the views saved.
    rows: usize,
    /// Views not saved.
    unsaved: usize,
    /// Views in all.
    views: usize,
}

/// How the save of one view went.
pub(crate) enum ViewSave {
    /// Its file is of this commit: the rows it holds.
    Kept(usize),
    /// Not saved; the next start builds it.
    Failed,
    /// The save was cancelled.
    Cancelled,
}
