//! Keeping the views in step with the store: the commit hook's checks, committed changes
//! applied, definition changes rebuilt at once or in the background.

use super::*;

impl Features {
    /// The rows a document gives every view it feeds, under the bounds of a write: a
    /// refusal names the view and the fault.
    pub(crate) fn rows_of(
        &self,
        catalog: &Catalog,
        doc: &Document,
    ) -> Result<PreparedRows, Refusal> {
        let mut per_view = Vec::new();
        let feeds: Vec<&Arc<ViewState>> = catalog
            .views
            .values()
            .filter(|v| v.template.applies_to(&doc.collections))
            .collect();
        let placement = self.placement();
        let placed = placement.as_deref();
        let json = match (feeds.is_empty(), placed) {
            (true, None) => None,
            _ => parse_json(doc),
        };
        let mut elsewhere = None;
        if let Some(json) = json {
            for view in feeds {
                let e = extract(
                    &json,
                    &view.template,
                    &view.def,
                    &view.paths,
                    self.settings.max_document_vertices,
                    placed,
                )?;
                per_view.push((view.def.key().clone(), e));
            }
            if let Some(p) = placed
                && per_view.iter().all(|(_, e)| e.rows.is_empty())
            {
                elsewhere = p.home(&json);
            }
        }
        Ok(PreparedRows {
            generation: catalog.generation,
            per_view,
            elsewhere,
        })
    }

    /// Re-extract one document's rows in every view it feeds or fed, from what its check
    /// prepared when that is still current.
    fn apply_document(
        &self,
        catalog: &Catalog,
        uri: &str,
        doc: Option<&Document>,
        prepared: Option<&PreparedRows>,
    ) {
        let uri: Arc<str> = Arc::from(uri);
        let made;
        let rows = match (doc, prepared) {
            (None, _) => None,
            (Some(_), Some(p)) if p.generation == catalog.generation => Some(p),
            (Some(d), _) => {
                // Checked against another catalog (or not at all): extract again; a refusal
                // now can only leave the document without rows.
                made = self.rows_of(catalog, d).unwrap_or_else(|r| {
                    tracing::warn!(uri = %uri, problem = %r, "document skipped by its views");
                    PreparedRows {
                        generation: catalog.generation,
                        per_view: Vec::new(),
                        elsewhere: None,
                    }
                });
                Some(&made)
            }
        };
        let mut diagnostics = self.diagnostics.lock();
        diagnostics.clear_document(&uri);
        for view in catalog.views.values() {
            let key = view.def.key();
            let extracted = rows.and_then(|r| r.per_view.iter().find(|(k, _)| k == key));
            let had_rows = !view.data.read().slots_of(&uri).is_empty();
            if extracted.is_none() && !had_rows {
                continue;
            }
            let (new_rows, index) = match extracted {
                Some((_, e)) => {
                    for w in &e.warnings {
                        diagnostics.add(&uri, key, w.clone(), false);
                    }
                    (e.rows.clone(), &e.index[..])
                }
                None => (Vec::new(), &[][..]),
            };
            let readers = doc.map(readers_of).unwrap_or_default();
            // The boxes of the rows' old and new geometries, for the tiles they meet.
            let touched = self.tiles.watching(key).then(|| {
                let mut boxes = self.old_boxes(view, &uri);
                boxes.extend(index.iter().filter_map(|(_, g)| {
                    geo::BoundingRect::bounding_rect(g)
                        .map(|r| [r.min().x, r.min().y, r.max().x, r.max().y])
                }));
                boxes
            });
            // Rows switch atomically for attribute queries; the spatial indexes follow. A
            // dead slot is reused only after every index has dropped it.
            let (old, new) = {
                let mut data = view.write_rows();
                let old = data.kill_rows(&uri);
                let new = data.add_rows(&uri, readers, new_rows);
                (old, new)
            };
            let indexes = view.indexes.read().clone();
            for (path, engine) in &indexes {
                for s in &old {
                    engine.remove(*s);
                }
                if let Some((_, g)) = index.iter().find(|(p, _)| p == path) {
                    for s in &new {
                        engine.insert(*s, g.clone());
                    }
                }
            }
            view.write_rows().release(&old);
            for b in touched.into_iter().flatten() {
                self.tiles.changed(key, b);
            }
        }
    }

    /// The boxes of a document's rows' geometries in `view`, at every indexed path.
    fn old_boxes(&self, view: &ViewState, uri: &str) -> Vec<tile_cache::BBox> {
        let data = view.data.read();
        let indexes = view.indexes.read();
        let mut out = Vec::new();
        for &slot in data.slots_of(uri).iter() {
            for (path, engine) in indexes.iter() {
                match data.geometry_column(path).get(slot) {
                    Some(view::GeometryRef::Point(x, y)) => out.push([x, y, x, y]),
                    Some(view::GeometryRef::Json(_)) => match engine.indexed(slot) {
                        Some(crate::spatial::engine::Indexed::Shape(s)) => out.push(s.bbox),
                        Some(crate::spatial::engine::Indexed::Points(p)) => {
                            out.extend(p.iter().map(|&[x, y]| [x, y, x, y]))
                        }
                        None => {}
                    },
                    None => {}
                }
            }
        }
        out
    }

    /// `Some` when a definition change is being built in the background: it resolves once
    /// the new views are in place.
    pub fn apply_changes(self: &Arc<Self>, changes: &[Change]) -> Option<crate::store::Settling> {
        let touches_definitions = |d: &Document| {
            d.in_collection(TEMPLATE_COLLECTION) || d.in_collection(DESCRIPTOR_COLLECTION)
        };
        let mut definitions: Vec<String> = Vec::new();
        {
            let _applying = self.applying.lock();
            let catalog = self.catalog.read();
            let mut rebuild = self.rebuild.lock();
            for c in changes {
                let was_definition = catalog.templates.contains_key(&c.uri)
                    || catalog.descriptors.contains_key(&c.uri);
                let is_definition = c.doc.as_deref().is_some_and(touches_definitions);
                if was_definition || is_definition {
                    definitions.push(c.uri.clone());
                    continue;
                }
                let prepared = c
                    .prepared
                    .as_ref()
                    .and_then(|p| p.downcast_ref::<PreparedRows>());
                self.apply_document(&catalog, &c.uri, c.doc.as_deref(), prepared);
                if let Some(r) = rebuild.as_mut() {
                    r.changed.insert(c.uri.clone());
                }
            }
        }
        if definitions.is_empty() {
            return None;
        }
        // One build at a time: the next starts from the catalog the last one made.
        let _starting = self.starting_rebuild.lock();
        self.finish_rebuild();
        self.apply_definitions(changes, definitions)
    }

    /// Wait for a background build of views, if one is running, to take its place.
    pub(crate) fn finish_rebuild(&self) {
        let thread = self.rebuild.lock().as_mut().and_then(|r| r.thread.take());
        if let Some(t) = thread
            && t.join().is_err()
        {
            tracing::error!("the background view build panicked");
            *self.rebuild.lock() = None;
        }
    }

    /// Whether views are being built in the background.
    pub fn rebuilding(&self) -> bool {
        self.rebuild.lock().is_some()
    }

    /// Templates or descriptors changed: update them and rebuild the views whose
    /// definition or needed geometry paths changed; large views on a thread of their own.
    /// `definitions`: the URIs of the changed templates and descriptors, whose writers are
    /// answered when a background build is done.
    pub fn apply_definitions(
        self: &Arc<Self>,
        changes: &[Change],
        definitions: Vec<String>,
    ) -> Option<crate::store::Settling> {
        let (next, rebuild, rows) = {
            let current = self.catalog.read();
            let rows: usize = current.views.values().map(|v| v.data.read().len()).sum();
            let mut next = Catalog {
                generation: current.generation + 1,
                templates: current.templates.clone(),
                descriptors: current.descriptors.clone(),
                views: crate::FastMap::default(),
            };
            for c in changes {
                next.templates.remove(&c.uri);
                next.descriptors.remove(&c.uri);
                if let Some(doc) = &c.doc {
                    self.load_definition(&mut next, doc);
                }
            }
            let old_paths = current.needed_paths();
            let new_paths = next.needed_paths();
            let mut rebuild = Vec::new();
            for t in next.templates.values() {
                for v in &t.views {
                    let key = v.key().clone();
                    let same_template = current
                        .views
                        .get(&key)
                        .is_some_and(|s| Arc::ptr_eq(&s.template, t));
                    let same_paths = old_paths.get(&key).map(|p| p.keys().collect::<Vec<_>>())
                        == new_paths.get(&key).map(|p| p.keys().collect::<Vec<_>>());
                    match current.views.get(&key) {
                        Some(state) if same_template && same_paths => {
                            next.views.insert(key, state.clone());
                        }
                        _ => rebuild.push(key),
                    }
                }
            }
            (next, rebuild, rows)
        };
        if !rebuild.is_empty() && rows >= self.settings.background_build_rows {
            return self
                .start_background_build(next, rebuild)
                .map(|done| crate::store::Settling {
                    uris: definitions,
                    done,
                });
        }
        let mut next = next;
        match self.build_views(&next, &rebuild) {
            Ok(built) => next.views.extend(built),
            Err(e) => tracing::error!(error = %e, "rebuilding views failed"),
        }
        if !rebuild.is_empty() {
            tracing::info!(views = ?rebuild.iter().map(|k| k.to_string()).collect::<Vec<_>>(), "views rebuilt");
        }
        *write_between_readers(&self.catalog) = next;
        if !rebuild.is_empty() {
            release_freed_memory();
        }
        None
    }

    /// Hold the shards of `placement` from now on (a cluster node whose shards moved): writes
    /// are checked under it at once, and rows checked under the old one are made again. With
    /// `rebuild`, every view is built again from the store in the background, and the
    /// receiver resolves once the new views are in place (at once when there are none). A
    /// placement that only narrows needs no build: the rows of the shards let go stay, current,
    /// until their documents are written again.
    pub fn set_placement(
        self: &Arc<Self>,
        placement: placement::Placement,
        rebuild: bool,
    ) -> Option<geoshard_core::oneshot::Receiver<()>> {
        let _starting = self.starting_rebuild.lock();
        self.finish_rebuild();
        let next = {
            let _applying = self.applying.lock();
            *self.placement.write() = Some(Arc::new(placement));
            let mut catalog = write_between_readers(&self.catalog);
            catalog.generation += 1;
            Catalog {
                generation: catalog.generation + 1,
                templates: catalog.templates.clone(),
                descriptors: catalog.descriptors.clone(),
                views: crate::FastMap::default(),
            }
        };
        if !rebuild {
            return None;
        }
        let keys: Vec<ViewKey> = next
            .templates
            .values()
            .flat_map(|t| t.views.iter().map(|v| v.key().clone()))
            .collect();
        if keys.is_empty() {
            let (done, settled) = geoshard_core::oneshot::channel();
            let _ = done.send(());
            return Some(settled);
        }
        self.start_background_build(next, keys)
    }

    /// Run [`Features::build_in_background`] on a thread of its own, recorded as the running
    /// build (so that [`Features::finish_rebuild`] waits for it); the receiver resolves once
    /// `next` is in place. `None` when the thread cannot start.
    pub(crate) fn start_background_build(
        self: &Arc<Self>,
        next: Catalog,
        keys: Vec<ViewKey>,
    ) -> Option<geoshard_core::oneshot::Receiver<()>> {
        *self.rebuild.lock() = Some(Rebuild {
            changed: Default::default(),
            thread: None,
        });
        let me = self.clone();
        let (settled, settling) = geoshard_core::oneshot::channel();
        match std::thread::Builder::new()
            .name("view-build".into())
            .spawn(move || {
                me.build_in_background(next, keys);
                let _ = settled.send(());
            }) {
            Ok(t) => {
                if let Some(r) = self.rebuild.lock().as_mut() {
                    r.thread = Some(t);
                }
                Some(settling)
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot start a background view build");
                *self.rebuild.lock() = None;
                None
            }
        }
    }

    /// Build `keys` of `next` from a snapshot of the store while writes go on, apply the
    /// documents changed meanwhile (in rounds, the last with writes held back), then put
    /// `next` in place of the catalog.
    pub fn build_in_background(self: Arc<Self>, mut next: Catalog, keys: Vec<ViewKey>) {
        let started = std::time::Instant::now();
        let pool = background_pool("view-build");
        let built = match &pool {
            Some(pool) => pool.install(|| self.build_views(&next, &keys)),
            None => self.build_views(&next, &keys),
        };
        match built {
            Ok(built) => next.views.extend(built),
            Err(e) => tracing::error!(error = %e, "rebuilding views failed"),
        }
        // The new views alone, for applying what changed: the others are the live ones.
        let fresh = Catalog {
            generation: next.generation,
            templates: next.templates.clone(),
            descriptors: next.descriptors.clone(),
            views: keys
                .iter()
                .filter_map(|k| next.views.get(k).map(|v| (k.clone(), v.clone())))
                .collect(),
        };
        let take = || -> Vec<String> {
            self.rebuild
                .lock()
                .as_mut()
                .map(|r| r.changed.drain().collect())
                .unwrap_or_default()
        };
        let mut replayed = 0usize;
        loop {
            let batch = take();
            if batch.len() <= REPLAY_HELD {
                let _applying = self.applying.lock();
                let mut rest = batch;
                rest.extend(take());
                replayed += rest.len();
                self.replay(&fresh, &rest);
                *write_between_readers(&self.catalog) = next;
                if let Some(r) = self.rebuild.lock().take() {
                    // Joined by nobody: this thread is ending.
                    drop(r.thread);
                }
                break;
            }
            replayed += batch.len();
            self.replay(&fresh, &batch);
        }
        tracing::info!(
            views = ?keys.iter().map(|k| k.to_string()).collect::<Vec<_>>(),
            changed_meanwhile = replayed,
            secs = started.elapsed().as_secs_f64(),
            "views rebuilt in the background"
        );
        release_freed_memory();
    }

    /// Apply the stored state of each of `uris` to the views of `catalog`.
    pub(crate) fn replay(&self, catalog: &Catalog, uris: &[String]) {
        for uri in uris {
            match self.store.get(&crate::acl::Caller::system(), uri) {
                Ok(doc) => self.apply_document(catalog, uri, doc.as_ref(), None),
                Err(e) => {
                    tracing::error!(uri = %uri, error = %e, "a changed document could not be read")
                }
            }
        }
    }

    /// Validate a template or descriptor against the documents it would join.
    pub fn validate_definition(&self, doc: &Document) -> Result<(), String> {
        let is_template = doc.in_collection(TEMPLATE_COLLECTION);
        let is_descriptor = doc.in_collection(DESCRIPTOR_COLLECTION);
        if !is_template && !is_descriptor {
            return Ok(());
        }
        if doc.format != Format::Json {
            return Err(format!(
                "{} must be JSON",
                if is_template {
                    "a template"
                } else {
                    "a descriptor"
                }
            ));
        }
        let json: Value =
            serde_json::from_slice(&doc.content).map_err(|e| format!("invalid JSON: {e}"))?;
        let catalog = self.catalog.read();
        if is_template {
            let t = parse_template(&doc.uri, &json)?;
            for v in &t.views {
                if let Some(other) = catalog
                    .templates
                    .values()
                    .find(|o| o.uri != doc.uri && o.views.iter().any(|w| w.key() == v.key()))
                {
                    return Err(format!(
                        "template: view {}.{} is already defined by template {}",
                        v.schema, v.view, other.uri
                    ));
                }
            }
        }
        if is_descriptor {
            let d = parse_descriptor(&doc.uri, &json, doc.permissions)?;
            if let Some(other) = catalog
                .descriptors
                .values()
                .find(|o| o.uri != doc.uri && o.name == d.name)
            {
                return Err(format!(
                    "descriptor: a service named {:?} already exists ({})",
                    d.name, other.uri
                ));
            }
        }
        Ok(())
    }
}

/// The store's commit hook: validation before a write, derived data after it.
pub struct FeatureHook(pub Arc<Features>);

impl CommitHook for FeatureHook {
    fn check(&self, doc: &Document) -> Result<Checked, Rejection> {
        let f = &self.0;
        if doc.in_collection(crate::acl::FENCE_COLLECTION) {
            f.check_fence(doc)
                .map_err(|reason| Rejection::Definition(format!("fence {}: {reason}", doc.uri)))?;
            return Ok(Checked::default());
        }
        if doc.in_collection(TEMPLATE_COLLECTION) || doc.in_collection(DESCRIPTOR_COLLECTION) {
            // Against the definitions a running background build will put in place.
            f.finish_rebuild();
            f.validate_definition(doc).map_err(Rejection::Definition)?;
            return Ok(Checked::default());
        }
        let catalog = f.catalog.read();
        let rows = f.rows_of(&catalog, doc).map_err(|r| Rejection::Document {
            uri: doc.uri.clone(),
            reason: Arc::new(r),
        })?;
        let warnings = rows
            .per_view
            .iter()
            .flat_map(|(_, e)| e.warnings.iter().cloned())
            .collect();
        Ok(Checked {
            warnings,
            elsewhere: rows.elsewhere.clone(),
            prepared: Some(Arc::new(rows)),
        })
    }

    fn committed(&self, changes: &[Change]) -> Option<crate::store::Settling> {
        self.0.fences_committed();
        self.0.apply_changes(changes)
    }

    fn decide(&self, changes: &[Change]) -> Vec<crate::store::Record> {
        self.0.decide_events(changes)
    }

    fn recorded(&self, first: u64, records: Vec<crate::store::Record>) {
        let sink = self.0.on_events.read().clone();
        if let Some(sink) = sink {
            sink(first, records);
        }
    }

    /// A document's rows depend only on it and the catalog: they can be made before the
    /// write reaches the writer. Definitions are checked there, against what is stored.
    fn precheck(&self, doc: &Document) -> Option<Result<Checked, Rejection>> {
        if doc.in_collection(TEMPLATE_COLLECTION)
            || doc.in_collection(DESCRIPTOR_COLLECTION)
            || doc.in_collection(crate::acl::FENCE_COLLECTION)
        {
            return None;
        }
        Some(self.check(doc))
    }

    fn generation(&self) -> Option<u64> {
        Some(self.0.catalog.read().generation)
    }
}
