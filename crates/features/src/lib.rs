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

#![forbid(unsafe_code)]

// Sibling crates under the module names the code uses.
use geoshard_core::{FastMap, acl, error, time};
use geoshard_paged as paged;
use geoshard_spatial as spatial;
use geoshard_store as store;

mod apply;
mod build;
pub mod csv_wkt;
pub mod descriptor;
mod diagnostics;
mod extract;
pub mod fence;
pub mod mvt;
pub mod path;
mod persist;
pub mod placement;
pub mod query;
mod segment;
mod sorted;
pub mod strings;
pub mod template;
pub mod tile_cache;
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

pub use apply::FeatureHook;
pub use build::BulkViews;
pub use diagnostics::Diagnostic;
use diagnostics::*;
use extract::*;
pub use persist::ViewSaver;
pub use query::{
    EsriShape, FeatureCollectionPBuffer, FeatureError, FeatureRequest, Quantization,
    esri_field_type, esri_geometry_type,
};

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
    /// A saved view's sections up to this size are checked before it serves, larger ones
    /// after, in the background.
    pub view_check_at_open_bytes: usize,
    /// Memory for map tiles kept once made (`encoded_tile_cache_bytes`); 0: none kept.
    pub encoded_tile_cache_bytes: usize,
    /// Bounds of geofences.
    pub fences: fence::FenceLimits,
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
            view_check_at_open_bytes: 64 * 1024 * 1024,
            encoded_tile_cache_bytes: 64 * 1024 * 1024,
            fences: fence::FenceLimits::default(),
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
    /// The signature of the placement its rows were built under, which a save records: a
    /// view built before the node took shards lacks their rows.
    pub placement: String,
}

impl ViewState {
    /// The rows, for writing.
    fn write_rows(&self) -> parking_lot::RwLockWriteGuard<'_, ViewData> {
        write_between_readers(&self.data)
    }
}

/// `lock` for writing, waiting a moment at a time. A query holds its view's rows for reading
/// while its spatial search runs on rayon, and a rayon thread waiting there may take up
/// another query of the same view, which reads them again. A writer waiting as parking_lot's
/// do (blocking new readers) would then wait for that query's outer one, and the inner one
/// for it, forever; this writer steps aside every 2 ms and lets the readers through.
pub(crate) fn write_between_readers<T>(lock: &RwLock<T>) -> parking_lot::RwLockWriteGuard<'_, T> {
    loop {
        if let Some(guard) = lock.try_write_for(std::time::Duration::from_millis(2)) {
            return guard;
        }
    }
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
    /// Views read back whose large sections' sums are still to be checked.
    unverified: parking_lot::Mutex<Vec<(ViewKey, segment::Unchecked)>>,
    /// Views read back and not verified yet, or found damaged: never saved from.
    untrusted: parking_lot::Mutex<HashMap<ViewKey, std::sync::Weak<ViewState>>>,
    /// Held by whoever starts a build of views in the background, so that one waits for the
    /// other's.
    starting_rebuild: parking_lot::Mutex<()>,
    /// In a cluster whose nodes hold some shards each: this node's (rows of other shards are
    /// left out of its views).
    placement: RwLock<Option<Arc<placement::Placement>>>,
    /// Map tiles kept once made; writes drop those they meet.
    tiles: tile_cache::TileCache,
    /// The geofences as committed.
    fences: RwLock<Arc<fence::FenceSet>>,
    /// The fences as the batch being committed leaves them, set by `decide_events`, in place
    /// once it has committed.
    pending_fences: parking_lot::Mutex<Option<Arc<fence::FenceSet>>>,
    /// Told each commit's events, once durable (the server's delivery).
    on_events: RwLock<Option<EventSink>>,
}

/// What hears a commit's fence events: their first number and the records.
pub type EventSink = Arc<dyn Fn(u64, Vec<crate::store::Record>) + Send + Sync>;

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
            tiles: tile_cache::TileCache::new(settings.encoded_tile_cache_bytes),
            placement: RwLock::new(placement.map(Arc::new)),
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
            unverified: parking_lot::Mutex::new(Vec::new()),
            untrusted: parking_lot::Mutex::new(HashMap::new()),
            starting_rebuild: parking_lot::Mutex::new(()),
            fences: RwLock::new(Arc::new(fence::FenceSet::default())),
            pending_fences: parking_lot::Mutex::new(None),
            on_events: RwLock::new(None),
        });
        features.load_fences()?;
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
        features.verify_in_background();
        Ok(features)
    }

    /// Send each commit's fence events to `sink`, once durable.
    pub fn on_events(&self, sink: EventSink) {
        *self.on_events.write() = Some(sink);
    }

    /// The map tiles kept once made.
    pub fn tiles(&self) -> &tile_cache::TileCache {
        &self.tiles
    }

    /// The catalog's generation: it changes when a definition does.
    pub fn generation(&self) -> u64 {
        self.catalog.read().generation
    }

    /// The view a layer of a service reads, when both exist.
    pub fn view_of(&self, service: &str, layer: i64) -> Option<ViewKey> {
        let catalog = self.catalog.read();
        catalog
            .descriptors
            .values()
            .find(|d| d.name == service)?
            .layers
            .iter()
            .find(|l| l.id == layer)
            .map(|l| l.view.clone())
    }

    pub fn settings(&self) -> &FeatureSettings {
        &self.settings
    }

    pub fn placement(&self) -> Option<Arc<placement::Placement>> {
        self.placement.read().clone()
    }

    /// The store the views are made from.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    fn placement_signature(&self) -> String {
        self.placement
            .read()
            .as_deref()
            .map_or(String::new(), |p| p.signature().to_string())
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

/// Return freed memory to the OS, after a view build or a large query. The work's transient
/// vectors are freed on the rayon threads that made them, which then fall idle; mimalloc
/// keeps a thread's free pages until that thread allocates again, so without this they stay
/// resident.
pub fn release_freed_memory() {
    rayon::broadcast(|_| geoshard_alloc::collect());
    geoshard_alloc::collect();
}

#[cfg(test)]
mod tests;
