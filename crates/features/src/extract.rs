//! From a stored document to its rows: the JSON parsed once, each view's columns and
//! geometries extracted, and why a document is refused.

use super::*;

/// A document's JSON, parsed once for all the views it feeds.
pub(crate) fn parse_json(doc: &Document) -> Option<Value> {
    if doc.format != Format::Json {
        return None;
    }
    serde_json::from_slice(&doc.content).ok()
}

/// Why a document cannot join a view: what makes its write a 400, and its rows skipped
/// when a view is built from stored documents.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Refusal {
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
pub(crate) fn geometry_at(
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
pub(crate) type Located = (geo::Geometry<f64>, GeometryOut);

/// Per geometry path, the (slot, geometry) pairs to bulk-load into that path's index.
pub(crate) type IndexItems = BTreeMap<String, Vec<(u32, geo::Geometry<f64>)>>;

/// Documents a view build reads from the store at a time.
pub(crate) const BUILD_BATCH: usize = 4096;

/// Views read back from their saved files, each with the documents changed since.
pub(crate) type SavedViews = Vec<(ViewKey, Arc<ViewState>, Arc<Vec<String>>)>;

/// A view to build: its template, its definition, and the geometry paths it needs.
pub(crate) type BuildTarget = (Arc<Template>, Arc<ViewDef>, BTreeMap<String, Path>);

/// What one document contributes to one view.
#[derive(Default)]
pub(crate) struct Extracted {
    pub(crate) rows: Vec<NewRow>,
    /// Per geometry path, the geometry to index for each of the rows.
    pub(crate) index: Vec<(String, geo::Geometry<f64>)>,
    /// What could not be used without refusing the document.
    pub(crate) warnings: Vec<String>,
}

/// A document's rows and geometries for one view, under the bounds of a write.
pub(crate) fn extract(
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
pub(crate) fn unless_panics<T>(
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
pub(crate) struct PreparedRows {
    pub(crate) generation: u64,
    pub(crate) per_view: Vec<(ViewKey, Extracted)>,
    /// On a node holding some shards: the shards whose holders keep the document, when this
    /// node neither holds a row of it nor is its home (`Placement::home`).
    pub(crate) elsewhere: Option<Vec<u16>>,
}

pub(crate) fn readers_of(doc: &Document) -> RoleSet {
    doc.permissions.holders(Capability::Read)
}
