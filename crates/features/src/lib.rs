//! The feature service's data: templates and the views they define, service descriptors and
//! their layers, and a spatial index per view and geometry path that some layer uses.
//!
//! Everything here is derived from the store and rebuilt from it at start-up. After that it
//! follows the store through its commit hook, on the writer thread, in commit order:
//!
//! - a document in a template's collections gets its rows (re)extracted and its geometry
//!   (re)indexed; a deleted one loses them;
//! - a template write rebuilds its views from every stored document (so documents stored
//!   before the template count); a descriptor write rebuilds the indexes its layers need.
//!
//! Templates and descriptors are validated before they land (a 400 naming the fault). This
//! module knows nothing of HTTP; [`query`] runs the geoQueryService queries.

// Sibling crates under the module names the code uses.
use geoshard_core::{FastMap, acl, error, time};
use geoshard_spatial as spatial;
use geoshard_store as store;

pub mod descriptor;
pub mod path;
pub mod placement;
pub mod query;
mod segment;
pub mod strings;
pub mod template;
pub mod view;
pub mod where_clause;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::RwLock;
use rayon::prelude::*;
use serde_json::Value;

use crate::acl::{Capability, RoleSet};
use crate::spatial::{Engine, EngineConfig, parse_geojson};
use crate::store::{Change, Checked, CommitHook, Document, Format, Rejection, Store, StoreError};
use descriptor::{DESCRIPTOR_COLLECTION, Descriptor, parse_descriptor};
use path::Path;
use template::{
    RowError, TEMPLATE_COLLECTION, Template, ViewDef, ViewKey, extract_rows, parse_template,
};
use view::{GeometryOut, NewRow, ViewData};
use where_clause::WhereLimits;

pub use query::{FeatureError, FeatureRequest};

/// Settings of the feature service, from `Config`.
#[derive(Debug, Clone, Copy)]
pub struct FeatureSettings {
    pub engine: EngineConfig,
    pub max_record_count: usize,
    /// Largest answer of features, in bytes (`max_answer_bytes`).
    pub max_answer_bytes: usize,
    /// Bounds of a `where` clause.
    pub where_limits: WhereLimits,
    /// Most positions in a query geometry.
    pub max_query_vertices: usize,
    /// Most positions in a document's geometry at a layer's path.
    pub max_document_vertices: usize,
    /// Views holding at least this many rows in all are rebuilt after a definition change on
    /// a thread of their own while writes go on; fewer, at once on the writer thread.
    pub background_build_rows: usize,
}

/// The service's default settings, as `Config::default()` gives them.
impl Default for FeatureSettings {
    fn default() -> Self {
        FeatureSettings {
            engine: EngineConfig::default(),
            max_record_count: 5000,
            max_answer_bytes: 256 * 1024 * 1024,
            where_limits: WhereLimits {
                max_bytes: 128 * 1024,
                max_depth: 64,
            },
            max_query_vertices: 100_000,
            max_document_vertices: 1_000_000,
            background_build_rows: 100_000,
        }
    }
}

/// One view: its rows and its spatial indexes.
pub struct ViewState {
    pub def: Arc<ViewDef>,
    pub template: Arc<Template>,
    pub data: RwLock<ViewData>,
    /// The geometry paths some layer reads from this view's documents (fixed per build).
    pub paths: BTreeMap<String, Path>,
    /// Geometry path -> index over the rows' geometries at that path.
    pub indexes: RwLock<BTreeMap<String, Arc<Engine>>>,
}

#[derive(Default)]
pub struct Catalog {
    /// Changes when the catalog is replaced, so that rows prepared against an older one are
    /// made again.
    generation: u64,
    /// By document URI.
    templates: BTreeMap<String, Arc<Template>>,
    /// By document URI.
    descriptors: BTreeMap<String, Arc<Descriptor>>,
    views: crate::FastMap<ViewKey, Arc<ViewState>>,
}

impl Catalog {
    /// Geometry paths each view needs, from the layers of every descriptor.
    fn needed_paths(&self) -> HashMap<ViewKey, BTreeMap<String, Path>> {
        let mut out: HashMap<ViewKey, BTreeMap<String, Path>> = HashMap::new();
        for d in self.descriptors.values() {
            for l in &d.layers {
                out.entry(l.view.clone())
                    .or_default()
                    .insert(l.geometry_path.text().to_string(), l.geometry_path.clone());
            }
        }
        out
    }

    fn template_of(&self, key: &ViewKey) -> Option<(Arc<Template>, Arc<ViewDef>)> {
        self.templates.values().find_map(|t| {
            t.views
                .iter()
                .find(|v| v.key() == key)
                .map(|v| (t.clone(), v.clone()))
        })
    }
}

pub struct Features {
    store: Arc<Store>,
    settings: FeatureSettings,
    catalog: RwLock<Catalog>,
    diagnostics: parking_lot::Mutex<Diagnostics>,
    /// The views being built in the background after a definition change, if any.
    rebuild: parking_lot::Mutex<Option<Rebuild>>,
    /// Held while committed changes are applied to the views, and while views built in the
    /// background take their place, so no change falls between the two.
    applying: parking_lot::Mutex<()>,
    /// Views whose saved file holds them as they are: the commit it was saved at, and the
    /// view then (a new one after a definition change).
    on_disk: parking_lot::Mutex<HashMap<ViewKey, (u64, std::sync::Weak<ViewState>)>>,
    /// Held while the views are saved: when they last were, and as of which commit.
    saves: parking_lot::Mutex<LastSave>,
    /// In a cluster whose nodes hold some shards each: this node's (rows of other shards are
    /// left out of its views).
    placement: Option<Arc<placement::Placement>>,
}

struct LastSave {
    at: std::time::Instant,
    /// 0 when some view was never saved.
    point: u64,
}

/// Most documents changed since views of `rows` rows in all were saved that a start reads
/// again; past them, it builds the views from every document instead.
fn most_changes(rows: usize) -> usize {
    (rows / 10).max(10_000)
}

/// For work in the background (this thread included): half the cores at most, at a lower
/// priority (nice 10, per thread on Linux), so that writes and queries keep the others and
/// come first on these. `None` when no pool can be made: the global one serves.
fn background_pool(name: &'static str) -> Option<rayon::ThreadPool> {
    let _ = rustix::process::setpriority_process(Some(rustix::thread::gettid()), 10);
    let threads = std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1));
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("{name}-{i}"))
        .start_handler(|_| {
            let me = rustix::thread::gettid();
            let _ = rustix::process::setpriority_process(Some(me), 10);
        })
        .build()
        .ok()
}

/// How a save of the views went.
struct Saved {
    /// The store recorded the save's point: a start reads the files and what changed since.
    recorded: bool,
    /// Views not written (too little free disk, or a write failed).
    unsaved: usize,
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

/// A background build of views: the documents changed since it began, to apply to the new
/// views before they replace the old ones.
struct Rebuild {
    /// URIs chosen by clients: the standard hasher keeps them from colliding on purpose.
    changed: std::collections::HashSet<String>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Changes a background build applies with writes held back; more are applied first while
/// writes go on.
pub const REPLAY_HELD: usize = 1024;

/// A document's JSON, parsed once for all the views it feeds.
fn parse_json(doc: &Document) -> Option<Value> {
    if doc.format != Format::Json {
        return None;
    }
    serde_json::from_slice(&doc.content).ok()
}

/// Why a document cannot join a view: what makes its write a 400, and its rows skipped
/// when a view is built from stored documents.
#[derive(Debug, Clone, PartialEq)]
enum Refusal {
    Rows(RowError),
    Vertices {
        view: ViewKey,
        path: String,
        count: usize,
        max: usize,
    },
    /// Reading the document panicked: a fault of ours, logged where it happened.
    Internal {
        view: ViewKey,
    },
}

impl std::error::Error for Refusal {}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Rows(e) => write!(f, "{e}"),
            Refusal::Vertices {
                view,
                path,
                count,
                max,
            } => write!(
                f,
                "view {view}: the geometry at {path} has {count} positions, above \
                 max_document_vertices ({max})"
            ),
            Refusal::Internal { view } => {
                write!(
                    f,
                    "view {view}: the document could not be read (an internal error)"
                )
            }
        }
    }
}

/// The geometry of a document at a layer's path: for the index, and as the response writes
/// it. `Ok(None)` when there is nothing at the path; `Err` with a warning when what is there
/// cannot be used (the rows keep no geometry); a refusal past `max_vertices`.
fn geometry_at(
    doc: &Value,
    view: &ViewKey,
    path: &Path,
    max_vertices: usize,
) -> Result<Result<Option<Located>, String>, Refusal> {
    let found = path.first(doc).map_err(|error| {
        Refusal::Rows(RowError::Path {
            view: view.to_string(),
            error,
        })
    })?;
    let Some(v) = found else {
        return Ok(Ok(None));
    };
    let g = match parse_geojson(v) {
        Ok(g) => g,
        Err(e) => {
            return Ok(Err(format!(
                "view {view}: the geometry at {} is not usable ({e}); its rows have no geometry",
                path.text()
            )));
        }
    };
    let count = crate::spatial::geometry::coord_count(&g);
    if count > max_vertices {
        return Err(Refusal::Vertices {
            view: view.clone(),
            path: path.text().to_string(),
            count,
            max: max_vertices,
        });
    }
    let out = match &g {
        geo::Geometry::Point(p) => GeometryOut::Point(p.x(), p.y()),
        _ => GeometryOut::Json(Arc::from(serde_json::to_vec(v).unwrap_or_default())),
    };
    Ok(Ok(Some((g, out))))
}

/// A geometry to index, and the same geometry as responses write it.
type Located = (geo::Geometry<f64>, GeometryOut);

/// Per geometry path, the (slot, geometry) pairs to bulk-load into that path's index.
type IndexItems = BTreeMap<String, Vec<(u32, geo::Geometry<f64>)>>;

/// Documents a view build reads from the store at a time.
const BUILD_BATCH: usize = 4096;

/// Views read back from their saved files, each with the documents changed since.
type SavedViews = Vec<(ViewKey, Arc<ViewState>, Arc<Vec<String>>)>;

/// A view to build: its template, its definition, and the geometry paths it needs.
type BuildTarget = (Arc<Template>, Arc<ViewDef>, BTreeMap<String, Path>);

/// What one document contributes to one view.
#[derive(Default)]
struct Extracted {
    rows: Vec<NewRow>,
    /// Per geometry path, the geometry to index for each of the rows.
    index: Vec<(String, geo::Geometry<f64>)>,
    /// What could not be used without refusing the document.
    warnings: Vec<String>,
}

/// A document's rows and geometries for one view, under the bounds of a write.
fn extract(
    doc: &Value,
    template: &Template,
    def: &ViewDef,
    paths: &BTreeMap<String, Path>,
    max_vertices: usize,
    placement: Option<&placement::Placement>,
) -> Result<Extracted, Refusal> {
    let cells = extract_rows(template, def, doc).map_err(Refusal::Rows)?;
    if cells.is_empty() {
        return Ok(Extracted::default());
    }
    let key = def.key();
    let mut warnings = Vec::new();
    let mut geoms: Vec<(String, Option<Located>)> = Vec::with_capacity(paths.len());
    for (text, p) in paths {
        let g = match geometry_at(doc, key, p, max_vertices)? {
            Ok(g) => g,
            Err(w) => {
                warnings.push(w);
                None
            }
        };
        geoms.push((text.clone(), g));
    }
    if let Some(p) = placement {
        let held = p.holds(geoms.iter().map(|(_, g)| {
            let (g, out) = g.as_ref()?;
            Some((out.as_ref(), crate::spatial::predicate::bbox_of(g)?))
        }));
        if !held {
            // Another node's row: the write is checked and warned about as on every node.
            return Ok(Extracted {
                warnings,
                ..Extracted::default()
            });
        }
    }
    let rows = cells
        .into_iter()
        .map(|cells| NewRow {
            cells,
            geometries: geoms
                .iter()
                .map(|(t, g)| (t.clone(), g.as_ref().map(|g| g.1.clone())))
                .collect(),
        })
        .collect();
    let index = geoms
        .into_iter()
        .filter_map(|(t, g)| g.map(|g| (t, g.0)))
        .collect();
    Ok(Extracted {
        rows,
        index,
        warnings,
    })
}

/// `read`, with a panic in it a refusal: a view build skips the one stored document (and
/// lists it) instead of failing, and with it the start. A write has the store's own guard.
fn unless_panics<T>(
    view: &ViewKey,
    read: impl FnOnce() -> Result<T, Refusal>,
) -> Result<T, Refusal> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(read)).unwrap_or_else(|_| {
        tracing::error!(view = %view, "reading a stored document into a view panicked");
        Err(Refusal::Internal { view: view.clone() })
    })
}

/// What a checked document gives the views it feeds, made in the store's check and applied
/// after its commit (on the same thread, so against the same catalog: `generation` says so).
struct PreparedRows {
    generation: u64,
    per_view: Vec<(ViewKey, Extracted)>,
}

/// A problem a view has with a stored document: rows skipped, or a geometry left out.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Diagnostic {
    pub uri: String,
    pub view: String,
    pub problem: String,
    /// Whether the document has no rows in the view (else only its geometry is missing).
    #[serde(rename = "rowsSkipped")]
    pub rows_skipped: bool,
}

/// Most problems kept; past it they are counted only.
const MAX_DIAGNOSTICS: usize = 10_000;

/// The views' current problems with stored documents, by document and view: what a build
/// skipped or a write was warned of, until the document is written again or its view rebuilt.
#[derive(Default)]
struct Diagnostics {
    by_doc: BTreeMap<(String, String), (String, bool)>,
    /// Problems not kept, past [`MAX_DIAGNOSTICS`].
    omitted: u64,
}

impl Diagnostics {
    /// Record a problem; logged at `debug` only (a build logs one summary, a write answers
    /// its warnings), so that many bad documents do not flood the log.
    fn add(&mut self, uri: &str, view: &ViewKey, problem: String, rows_skipped: bool) {
        tracing::debug!(uri, view = %view, problem, rows_skipped, "a view cannot use a document in full");
        if self.by_doc.len() >= MAX_DIAGNOSTICS {
            self.omitted += 1;
            return;
        }
        self.by_doc
            .insert((uri.to_string(), view.to_string()), (problem, rows_skipped));
    }

    fn clear_document(&mut self, uri: &str) {
        if self.by_doc.is_empty() {
            return;
        }
        let keys: Vec<(String, String)> = self
            .by_doc
            .range((uri.to_string(), String::new())..)
            .take_while(|((u, _), _)| u == uri)
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            self.by_doc.remove(&k);
        }
    }

    fn clear_view(&mut self, view: &ViewKey) {
        let name = view.to_string();
        self.by_doc.retain(|(_, v), _| *v != name);
    }
}

fn readers_of(doc: &Document) -> RoleSet {
    doc.permissions.holders(Capability::Read)
}

impl Features {
    /// Load templates and descriptors from the store and build every view and index.
    pub fn open(store: Arc<Store>, settings: FeatureSettings) -> Result<Arc<Features>, StoreError> {
        Self::open_placed(store, settings, None)
    }

    /// [`Features::open`] for a cluster node holding the shards of `placement` only.
    pub fn open_placed(
        store: Arc<Store>,
        settings: FeatureSettings,
        placement: Option<placement::Placement>,
    ) -> Result<Arc<Features>, StoreError> {
        let features = Arc::new(Features {
            placement: placement.map(Arc::new),
            store,
            settings,
            catalog: RwLock::new(Catalog::default()),
            diagnostics: parking_lot::Mutex::new(Diagnostics::default()),
            rebuild: parking_lot::Mutex::new(None),
            applying: parking_lot::Mutex::new(()),
            on_disk: parking_lot::Mutex::new(HashMap::new()),
            saves: parking_lot::Mutex::new(LastSave {
                at: std::time::Instant::now(),
                point: 0,
            }),
        });
        let mut catalog = Catalog::default();
        if !features.load_saved_definitions(&mut catalog)? {
            let definitions = [TEMPLATE_COLLECTION, DESCRIPTOR_COLLECTION];
            features.store.scan_documents_in(&definitions, |doc| {
                features.load_definition(&mut catalog, &doc);
                Ok(())
            })?;
        }
        let keys: Vec<ViewKey> = catalog
            .templates
            .values()
            .flat_map(|t| t.views.iter().map(|v| v.key().clone()))
            .collect();
        let started = std::time::Instant::now();
        let (saved, keys) = features.load_saved_views(&catalog, keys)?;
        let built = features.build_views(&catalog, &keys)?;
        catalog.views.extend(built);
        // Saved as of the oldest file read, or never when a view was built.
        features.saves.lock().point = if keys.is_empty() {
            let on_disk = features.on_disk.lock();
            on_disk
                .values()
                .map(|(at, _)| *at)
                .min()
                .unwrap_or_else(|| features.store.last_commit())
        } else {
            0
        };
        // Past the empty catalog's, so no early check made against that one is taken.
        catalog.generation = 1;
        features.catch_up(&mut catalog, saved);
        if !catalog.views.is_empty() {
            tracing::info!(
                secs = started.elapsed().as_secs_f64(),
                rebuilt = keys.len(),
                "views ready"
            );
        }
        tracing::info!(
            templates = catalog.templates.len(),
            descriptors = catalog.descriptors.len(),
            views = catalog.views.len(),
            rows = catalog
                .views
                .values()
                .map(|v| v.data.read().len())
                .sum::<usize>(),
            "feature service loaded"
        );
        *features.catalog.write() = catalog;
        release_freed_memory();
        Ok(features)
    }

    pub fn settings(&self) -> &FeatureSettings {
        &self.settings
    }

    pub fn placement(&self) -> Option<&placement::Placement> {
        self.placement.as_deref()
    }

    fn placement_signature(&self) -> &str {
        self.placement.as_deref().map_or("", |p| p.signature())
    }

    /// Record a template or descriptor found in the store (already validated when written).
    fn load_definition(&self, catalog: &mut Catalog, doc: &Document) {
        let is_template = doc.in_collection(TEMPLATE_COLLECTION);
        let is_descriptor = doc.in_collection(DESCRIPTOR_COLLECTION);
        if !is_template && !is_descriptor {
            return;
        }
        let Some(json) = parse_json(doc) else {
            tracing::warn!(uri = %doc.uri, "template or descriptor is not JSON; ignored");
            return;
        };
        if is_template {
            match parse_template(&doc.uri, &json) {
                Ok(t) => {
                    catalog.templates.insert(doc.uri.clone(), Arc::new(t));
                }
                Err(e) => tracing::warn!(uri = %doc.uri, error = %e, "stored template ignored"),
            }
        }
        if is_descriptor {
            match parse_descriptor(&doc.uri, &json, doc.permissions) {
                Ok(d) => {
                    catalog.descriptors.insert(doc.uri.clone(), Arc::new(d));
                }
                Err(e) => tracing::warn!(uri = %doc.uri, error = %e, "stored descriptor ignored"),
            }
        }
    }

    /// Build views from a full scan of the store: rows extracted in parallel, then each
    /// view's spatial indexes bulk-loaded.
    fn build_views(
        &self,
        catalog: &Catalog,
        keys: &[ViewKey],
    ) -> Result<Vec<(ViewKey, Arc<ViewState>)>, StoreError> {
        let needed = catalog.needed_paths();
        let targets: Vec<BuildTarget> = keys
            .iter()
            .filter_map(|k| catalog.template_of(k))
            .map(|(t, v)| {
                let paths = needed.get(v.key()).cloned().unwrap_or_default();
                (t, v, paths)
            })
            .collect();
        if targets.is_empty() {
            return Ok(Vec::new());
        }
        let mut data: Vec<ViewData> = targets.iter().map(|t| ViewData::new(t.1.clone())).collect();
        let mut items: Vec<IndexItems> = vec![BTreeMap::new(); targets.len()];
        {
            let mut diagnostics = self.diagnostics.lock();
            for t in &targets {
                diagnostics.clear_view(t.1.key());
            }
        }
        type DocRows = Vec<(usize, Result<Extracted, Refusal>)>;
        type Batch = Vec<(Arc<str>, RoleSet, DocRows)>;
        let max_vertices = self.settings.max_document_vertices;
        let placement = self.placement.as_deref();
        // Three stages overlap: one thread reads the store, this one extracts each batch's rows
        // (on rayon: the pool of the caller, which a background build keeps to itself), and
        // one adds them to the views in the store's order (so slots are as a sequential build
        // gives them).
        let (data, items, skipped, without_geometry) = std::thread::scope(|scope| {
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
                let (mut skipped, mut without_geometry) = (0usize, 0usize);
                for batch in extracted {
                    let mut diagnostics = self.diagnostics.lock();
                    for (uri, readers, per_view) in batch {
                        for (i, e) in per_view {
                            // A stored document that a write would now refuse (the bounds or
                            // the template changed since) is skipped, and said so.
                            let e = match e {
                                Ok(e) => e,
                                Err(refusal) => {
                                    skipped += 1;
                                    let key = targets[i].1.key();
                                    diagnostics.add(&uri, key, refusal.to_string(), true);
                                    continue;
                                }
                            };
                            without_geometry += usize::from(!e.warnings.is_empty());
                            for w in e.warnings {
                                diagnostics.add(&uri, targets[i].1.key(), w, false);
                            }
                            let slots = data[i].add_rows(&uri, readers, e.rows);
                            for (path, g) in e.index {
                                let v = items[i].entry(path).or_default();
                                for s in &slots {
                                    v.push((*s, g.clone()));
                                }
                            }
                        }
                    }
                }
                (data, items, skipped, without_geometry)
            });
            for batch in scanned {
                let out: Batch = batch
                    .par_iter()
                    .filter(|d| {
                        !d.in_collection(TEMPLATE_COLLECTION)
                            && !d.in_collection(DESCRIPTOR_COLLECTION)
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
                    .collect();
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
        if skipped + without_geometry > 0 {
            tracing::warn!(
                skipped,
                without_geometry,
                "views built without some documents' rows or geometries: GET /v1/diagnostics lists them"
            );
        }
        let mut out = Vec::new();
        for ((template, def, paths), (data, items)) in
            targets.into_iter().zip(data.into_iter().zip(items))
        {
            out.push((
                def.key().clone(),
                self.view_state(template, data, paths, items)?,
            ));
        }
        Ok(out)
    }

    /// A view from its rows: each geometry path's index bulk-loaded from `items`.
    fn view_state(
        &self,
        template: Arc<Template>,
        data: ViewData,
        paths: BTreeMap<String, Path>,
        mut items: IndexItems,
    ) -> Result<Arc<ViewState>, StoreError> {
        let mut indexes = BTreeMap::new();
        for path in paths.keys() {
            let engine = self.index(items.remove(path).unwrap_or_default())?;
            indexes.insert(path.clone(), engine);
        }
        Ok(Self::state_of(template, data, paths, indexes))
    }

    /// An index bulk-loaded with `items`.
    fn index(&self, items: Vec<(u32, geo::Geometry<f64>)>) -> Result<Arc<Engine>, StoreError> {
        let engine = Engine::new(self.settings.engine)
            .map_err(|e| StoreError::Corrupt(format!("spatial settings: {e}")))?;
        engine.bulk_load(items);
        Ok(Arc::new(engine))
    }

    fn state_of(
        template: Arc<Template>,
        data: ViewData,
        paths: BTreeMap<String, Path>,
        indexes: BTreeMap<String, Arc<Engine>>,
    ) -> Arc<ViewState> {
        Arc::new(ViewState {
            def: data.def.clone(),
            template,
            data: RwLock::new(data),
            paths,
            indexes: RwLock::new(indexes),
        })
    }

    /// Read back the saved views that can be used (see [`segment`]):
    /// those views with the documents changed since each one's commit point, and the keys of
    /// the views still to build.
    fn load_saved_views(
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
                self.placement_signature(),
            );
            let reading = std::time::Instant::now();
            let index = |items| self.index(items).map_err(|e| e.to_string());
            let loaded = segment::load(&file, def, &paths, &print, &index).and_then(|l| {
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
            let state = Self::state_of(template, l.data, paths, l.indexes);
            self.on_disk
                .lock()
                .insert(key.clone(), (l.point, Arc::downgrade(&state)));
            saved.push((key, state, changed));
        }
        Ok((saved, rest))
    }

    /// The templates and descriptors, without reading every document: those listed when the
    /// views were last saved and those written since. `false` when that cannot be known.
    fn load_saved_definitions(&self, catalog: &mut Catalog) -> Result<bool, StoreError> {
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
    fn catch_up(&self, catalog: &mut Catalog, saved: SavedViews) {
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
            let file = dir.join(&name);
            // Read at start from a file of this very commit, and the same view since.
            let unchanged = self.on_disk.lock().get(key).is_some_and(|(at, was)| {
                *at == point && was.upgrade().is_some_and(|w| Arc::ptr_eq(&w, view))
            });
            if unchanged && file.exists() {
                rows += view.data.read().len();
                kept.insert(name);
                continue;
            }
            let print = segment::fingerprint(
                &view.template,
                &view.def,
                &view.paths,
                self.settings.max_document_vertices,
                self.placement_signature(),
            );
            let diagnostics = by_view.remove(&key.to_string()).unwrap_or_default();
            // The store must never meet a full disk: every piece of the file must leave it the
            // space it keeps.
            let room = |bytes: u64| self.store.has_room_for(bytes);
            match segment::save(
                &file,
                &view.data,
                &view.paths,
                &print,
                point,
                &diagnostics,
                &segment::SaveLimits {
                    cancelled,
                    room: &room,
                },
            ) {
                Ok(n) => {
                    rows += n;
                    kept.insert(name);
                    self.on_disk
                        .lock()
                        .insert(key.clone(), (point, Arc::downgrade(view)));
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {
                    // Its old file, if any, is whole and still of use.
                    tracing::info!(view = %key, "saving the views cancelled");
                    return Saved {
                        recorded: false,
                        unsaved: views.len(),
                    };
                }
                Err(e) => {
                    tracing::warn!(view = %key, error = %e, "view not saved; the next start builds it");
                    let _ = std::fs::remove_file(&file);
                    unsaved += 1;
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
                    unsaved: views.len(),
                }
            }
        }
    }

    /// The rows a document gives every view it feeds, under the bounds of a write: a
    /// refusal names the view and the fault.
    fn rows_of(&self, catalog: &Catalog, doc: &Document) -> Result<PreparedRows, Refusal> {
        let mut per_view = Vec::new();
        let feeds: Vec<&Arc<ViewState>> = catalog
            .views
            .values()
            .filter(|v| v.template.applies_to(&doc.collections))
            .collect();
        if let (false, Some(json)) = (feeds.is_empty(), parse_json(doc)) {
            for view in feeds {
                let e = extract(
                    &json,
                    &view.template,
                    &view.def,
                    &view.paths,
                    self.settings.max_document_vertices,
                    self.placement.as_deref(),
                )?;
                per_view.push((view.def.key().clone(), e));
            }
        }
        Ok(PreparedRows {
            generation: catalog.generation,
            per_view,
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
            // Rows switch atomically for attribute queries; the spatial indexes follow. A
            // dead slot is reused only after every index has dropped it.
            let (old, new) = {
                let mut data = view.data.write();
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
            view.data.write().release(&old);
        }
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
            *self.rebuild.lock() = Some(Rebuild {
                changed: Default::default(),
                thread: None,
            });
            let me = self.clone();
            let keys = rebuild.clone();
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
                    return Some(crate::store::Settling {
                        uris: definitions,
                        done: settling,
                    });
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot start a background view build");
                    *self.rebuild.lock() = None;
                    return None;
                }
            }
        }
        let mut next = next;
        match self.build_views(&next, &rebuild) {
            Ok(built) => next.views.extend(built),
            Err(e) => tracing::error!(error = %e, "rebuilding views failed"),
        }
        if !rebuild.is_empty() {
            tracing::info!(views = ?rebuild.iter().map(|k| k.to_string()).collect::<Vec<_>>(), "views rebuilt");
        }
        *self.catalog.write() = next;
        if !rebuild.is_empty() {
            release_freed_memory();
        }
        None
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
                *self.catalog.write() = next;
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
    fn replay(&self, catalog: &Catalog, uris: &[String]) {
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

    /// The descriptor named `name`, if `roles` may read it.
    pub fn descriptor(&self, name: &str, roles: RoleSet) -> Option<Arc<Descriptor>> {
        self.catalog
            .read()
            .descriptors
            .values()
            .find(|d| d.name == name && d.permissions.allows(roles, Capability::Read))
            .cloned()
    }

    /// Every descriptor `roles` may read, by name.
    pub fn descriptors(&self, roles: RoleSet) -> Vec<Arc<Descriptor>> {
        let mut out: Vec<Arc<Descriptor>> = self
            .catalog
            .read()
            .descriptors
            .values()
            .filter(|d| d.permissions.allows(roles, Capability::Read))
            .cloned()
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The views' current problems with stored documents, by URI, and how many more there
    /// were than are kept.
    pub fn diagnostics(&self) -> (Vec<Diagnostic>, u64) {
        let d = self.diagnostics.lock();
        let list = d
            .by_doc
            .iter()
            .map(|((uri, view), (problem, rows_skipped))| Diagnostic {
                uri: uri.clone(),
                view: view.clone(),
                problem: problem.clone(),
                rows_skipped: *rows_skipped,
            })
            .collect();
        (list, d.omitted)
    }

    /// For `/metrics`: the rows of each layer as `(service, layer, rows)`, and the entries
    /// (points and polygon parts) of each view's shard indexes as `(view, shard, entries)`.
    pub fn sizes(&self) -> (Vec<LayerRows>, Vec<ShardEntries>) {
        let c = self.catalog.read();
        let layers = c
            .descriptors
            .values()
            .flat_map(|d| {
                d.layers.iter().map(|l| {
                    let rows = c.views.get(&l.view).map_or(0, |v| v.data.read().len());
                    (d.name.clone(), l.id, rows)
                })
            })
            .collect();
        let mut shards = Vec::new();
        for (key, v) in &c.views {
            let mut per_shard: Vec<usize> = Vec::new();
            for engine in v.indexes.read().values() {
                for (i, (points, parts, _)) in engine.shard_sizes().into_iter().enumerate() {
                    if per_shard.len() <= i {
                        per_shard.resize(i + 1, 0);
                    }
                    per_shard[i] += points + parts;
                }
            }
            shards.extend(
                per_shard
                    .into_iter()
                    .enumerate()
                    .map(|(i, n)| (key.to_string(), i, n)),
            );
        }
        (layers, shards)
    }

    pub fn view(&self, key: &ViewKey) -> Option<Arc<ViewState>> {
        self.catalog.read().views.get(key).cloned()
    }
}

/// `(service, layer id, rows)`.
pub type LayerRows = (String, i64, usize);
/// `(view, shard, index entries)`.
pub type ShardEntries = (String, usize, usize);

/// The store's commit hook: validation before a write, derived data after it.
pub struct FeatureHook(pub Arc<Features>);

impl CommitHook for FeatureHook {
    fn check(&self, doc: &Document) -> Result<Checked, Rejection> {
        let f = &self.0;
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
            prepared: Some(Arc::new(rows)),
        })
    }

    fn committed(&self, changes: &[Change]) -> Option<crate::store::Settling> {
        self.0.apply_changes(changes)
    }

    /// A document's rows depend only on it and the catalog: they can be made before the
    /// write reaches the writer. Definitions are checked there, against what is stored.
    fn precheck(&self, doc: &Document) -> Option<Result<Checked, Rejection>> {
        if doc.in_collection(TEMPLATE_COLLECTION) || doc.in_collection(DESCRIPTOR_COLLECTION) {
            return None;
        }
        Some(self.check(doc))
    }

    fn generation(&self) -> Option<u64> {
        Some(self.0.catalog.read().generation)
    }
}

/// Return freed memory to the OS, after a view build or a large query. The work's transient
/// vectors are freed on the rayon threads that made them, which then fall idle; mimalloc
/// keeps a thread's free pages until that thread allocates again, so without this they stay
/// resident.
pub fn release_freed_memory() {
    rayon::broadcast(|_| geoshard_alloc::collect());
    geoshard_alloc::collect();
}

#[cfg(test)]
mod tests {
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
        while features.catalog.read().generation != generation
            && std::time::Instant::now() < deadline
        {
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
}
