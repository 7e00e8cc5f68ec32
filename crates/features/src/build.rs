//! Building views from every stored document: extraction in parallel, then the spatial
//! indexes.

use super::*;

/// Each view's rows of one document, by index into the build's targets.
type DocRows = Vec<(usize, Result<Extracted, Refusal>)>;
/// The rows of a batch of documents, with each document's URI and readers.
type Batch = Vec<(Arc<str>, RoleSet, DocRows)>;

/// The rows of a batch of stored documents for the views being built, extracted on rayon.
fn extract_batch(
    batch: &[Document],
    targets: &[BuildTarget],
    max_vertices: usize,
    placement: Option<&placement::Placement>,
) -> Batch {
    batch
        .par_iter()
        .filter(|d| {
            !d.in_collection(TEMPLATE_COLLECTION) && !d.in_collection(DESCRIPTOR_COLLECTION)
        })
        .filter(|d| targets.iter().any(|t| t.0.applies_to(&d.collections)))
        .filter_map(|d| {
            let json = parse_json(d)?;
            let per_view = targets
                .iter()
                .enumerate()
                .filter(|(_, t)| t.0.applies_to(&d.collections))
                .map(|(i, t)| {
                    let e = unless_panics(t.1.key(), || {
                        extract(&json, &t.0, &t.1, &t.2, max_vertices, placement)
                    });
                    (i, e)
                })
                .filter(|(_, e)| e.as_ref().map_or(true, |e| !e.rows.is_empty()))
                .collect::<Vec<_>>();
            Some((Arc::from(d.uri.as_str()), readers_of(d), per_view))
        })
        .collect()
}

/// The rows of views being built, added a batch at a time.
struct Rows {
    data: Vec<ViewData>,
    items: Vec<IndexItems>,
    skipped: usize,
    without_geometry: usize,
    /// A document may come twice (a bulk load's records): its earlier rows are then dropped,
    /// their slots left dead.
    repeats: bool,
    /// Whether the geometries are kept for the spatial indexes (not for views built only to
    /// be saved).
    index: bool,
}

impl Rows {
    fn new(targets: &[BuildTarget], repeats: bool, index: bool) -> Rows {
        Rows {
            data: targets.iter().map(|t| ViewData::new(t.1.clone())).collect(),
            items: vec![BTreeMap::new(); targets.len()],
            skipped: 0,
            without_geometry: 0,
            repeats,
            index,
        }
    }

    /// Add a batch's rows, in its order, to the views of `targets`.
    fn add(&mut self, targets: &[BuildTarget], batch: Batch, diagnostics: &mut Diagnostics) {
        for (uri, readers, per_view) in batch {
            if self.repeats {
                for data in &mut self.data {
                    if !data.slots_of(&uri).is_empty() {
                        data.kill_rows(&uri);
                    }
                }
            }
            for (i, e) in per_view {
                // A stored document that a write would now refuse (the bounds or the
                // template changed since) is skipped, and said so.
                let e = match e {
                    Ok(e) => e,
                    Err(refusal) => {
                        self.skipped += 1;
                        let key = targets[i].1.key();
                        diagnostics.add(&uri, key, refusal.to_string(), true);
                        continue;
                    }
                };
                self.without_geometry += usize::from(!e.warnings.is_empty());
                for w in e.warnings {
                    diagnostics.add(&uri, targets[i].1.key(), w, false);
                }
                let slots = self.data[i].add_rows(&uri, readers, e.rows);
                if !self.index {
                    continue;
                }
                for (path, g) in e.index {
                    let v = self.items[i].entry(path).or_default();
                    for s in &slots {
                        v.push((*s, g.clone()));
                    }
                }
            }
        }
    }

    /// Each view with its spatial indexes bulk-loaded.
    /// `placement`: the signature of the placement the rows were extracted under.
    fn finish(
        self,
        features: &Features,
        targets: Vec<BuildTarget>,
        placement: &str,
    ) -> Result<Vec<(ViewKey, Arc<ViewState>)>, StoreError> {
        if self.skipped + self.without_geometry > 0 {
            tracing::warn!(
                skipped = self.skipped,
                without_geometry = self.without_geometry,
                "views built without some documents' rows or geometries: GET /v1/diagnostics lists them"
            );
        }
        let mut out = Vec::new();
        for ((template, def, paths), (data, mut items)) in targets
            .into_iter()
            .zip(self.data.into_iter().zip(self.items))
        {
            if self.repeats {
                // Rows of a document given again are dead: their geometries stay out.
                for v in items.values_mut() {
                    v.retain(|(slot, _)| data.is_live(*slot));
                }
            }
            out.push((
                def.key().clone(),
                features.view_state(template, data, paths, items, placement.to_string())?,
            ));
        }
        Ok(out)
    }
}

/// Every view of `catalog` named in `keys`, with the paths its descriptors need.
fn targets_of(catalog: &Catalog, keys: &[ViewKey]) -> Vec<BuildTarget> {
    let needed = catalog.needed_paths();
    keys.iter()
        .filter_map(|k| catalog.template_of(k))
        .map(|(t, v)| {
            let paths = needed.get(v.key()).cloned().unwrap_or_default();
            (t, v, paths)
        })
        .collect()
}

/// Views built from documents handed in rather than read from the store: an offline bulk
/// load's, fed as it reads its files, to be saved. Every view of the catalog starts empty,
/// and takes the place of the one the catalog holds at [`BulkViews::finish_for_saving`].
/// Their spatial indexes stay empty: a save computes a point path's index from its points,
/// and a start bulk-loads any other path's from its geometries, so the load keeps no
/// geometry twice (at 100M points, 6 GB of index items and 3 GB of index).
pub struct BulkViews {
    features: Arc<Features>,
    targets: Vec<BuildTarget>,
    rows: Rows,
}

impl Features {
    /// Build every view from the documents given to [`BulkViews::add`], for a store that
    /// holds none of their documents, written by nothing else meanwhile.
    pub fn bulk_views(self: &Arc<Self>) -> BulkViews {
        let targets = {
            let catalog = self.catalog.read();
            let keys: Vec<ViewKey> = catalog.views.keys().cloned().collect();
            targets_of(&catalog, &keys)
        };
        let mut diagnostics = self.diagnostics.lock();
        for t in &targets {
            diagnostics.clear_view(t.1.key());
        }
        drop(diagnostics);
        BulkViews {
            features: self.clone(),
            rows: Rows::new(&targets, true, false),
            targets,
        }
    }
}

impl BulkViews {
    /// Extract the rows of `docs` (on rayon) and add them, in their order; a document given
    /// again replaces its earlier rows.
    pub fn add(&mut self, docs: &[Document]) {
        let f = &self.features;
        let batch = extract_batch(
            docs,
            &self.targets,
            f.settings.max_document_vertices,
            f.placement().as_deref(),
        );
        self.rows
            .add(&self.targets, batch, &mut self.features.diagnostics.lock());
    }

    /// Put the views in place of the catalog's, with empty spatial indexes: they are for
    /// [`Features::save_views`], not for queries.
    pub fn finish_for_saving(self) -> Result<(), StoreError> {
        let placement = self.features.placement_signature();
        let built = self.rows.finish(&self.features, self.targets, &placement)?;
        let _applying = self.features.applying.lock();
        let mut catalog = self.features.catalog.write();
        catalog.views.extend(built);
        catalog.generation += 1;
        Ok(())
    }
}

impl Features {
    /// Build views from a full scan of the store: rows extracted in parallel, then each
    /// view's spatial indexes bulk-loaded.
    pub(crate) fn build_views(
        &self,
        catalog: &Catalog,
        keys: &[ViewKey],
    ) -> Result<Vec<(ViewKey, Arc<ViewState>)>, StoreError> {
        let targets = targets_of(catalog, keys);
        if targets.is_empty() {
            return Ok(Vec::new());
        }
        {
            let mut diagnostics = self.diagnostics.lock();
            for t in &targets {
                diagnostics.clear_view(t.1.key());
            }
        }
        let max_vertices = self.settings.max_document_vertices;
        let placed = self.placement();
        let placement = placed.as_deref();
        // Three stages overlap: one thread reads the store, this one extracts each batch's rows
        // (on rayon: the pool of the caller, which a background build keeps to itself), and
        // one adds them to the views in the store's order (so slots are as a sequential build
        // gives them).
        let rows = std::thread::scope(|scope| {
            let targets = &targets;
            let (docs, scanned) = crossbeam_channel::bounded::<Vec<Document>>(2);
            let (rows, extracted) = crossbeam_channel::bounded::<Batch>(2);
            let scan = scope.spawn(move || {
                let mut batch = Vec::with_capacity(BUILD_BATCH);
                self.store.scan_documents(|doc| {
                    batch.push(doc);
                    if batch.len() == BUILD_BATCH {
                        let full = std::mem::replace(&mut batch, Vec::with_capacity(BUILD_BATCH));
                        docs.send(full).map_err(|_| StoreError::ShuttingDown)?;
                    }
                    Ok(())
                })?;
                docs.send(batch).map_err(|_| StoreError::ShuttingDown)
            });
            let apply = scope.spawn(move || {
                let mut built = Rows::new(targets, false, true);
                for batch in extracted {
                    built.add(targets, batch, &mut self.diagnostics.lock());
                }
                built
            });
            for batch in scanned {
                let out = extract_batch(&batch, targets, max_vertices, placement);
                if rows.send(out).is_err() {
                    break;
                }
            }
            // The adding thread ends when it has taken the last batch.
            drop(rows);
            let scanned = scan.join();
            let applied = apply.join();
            match (scanned, applied) {
                (Ok(Ok(())), Ok(built)) => Ok(built),
                (Ok(Err(e)), Ok(_)) => Err(e),
                (Err(panic), _) | (_, Err(panic)) => std::panic::resume_unwind(panic),
            }
        })?;
        rows.finish(self, targets, placement.map_or("", |p| p.signature()))
    }

    /// A view from its rows: each geometry path's index bulk-loaded from `items`.
    fn view_state(
        &self,
        template: Arc<Template>,
        data: ViewData,
        paths: BTreeMap<String, Path>,
        mut items: IndexItems,
        placement: String,
    ) -> Result<Arc<ViewState>, StoreError> {
        let mut indexes = BTreeMap::new();
        for path in paths.keys() {
            let engine = self.index(items.remove(path).unwrap_or_default())?;
            indexes.insert(path.clone(), engine);
        }
        Ok(Self::state_of(template, data, paths, indexes, placement))
    }

    /// An index bulk-loaded with `items`.
    pub(crate) fn index(
        &self,
        items: Vec<(u32, geo::Geometry<f64>)>,
    ) -> Result<Arc<Engine>, StoreError> {
        let engine = Engine::new(self.settings.engine)
            .map_err(|e| StoreError::Corrupt(format!("spatial settings: {e}")))?;
        engine.bulk_load(items);
        Ok(Arc::new(engine))
    }

    pub(crate) fn state_of(
        template: Arc<Template>,
        data: ViewData,
        paths: BTreeMap<String, Path>,
        indexes: BTreeMap<String, Arc<Engine>>,
        placement: String,
    ) -> Arc<ViewState> {
        Arc::new(ViewState {
            placement,
            def: data.def.clone(),
            template,
            data: RwLock::new(data),
            paths,
            indexes: RwLock::new(indexes),
        })
    }
}
