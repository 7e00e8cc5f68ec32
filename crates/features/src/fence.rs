//! Geofences: areas over a layer whose rows' moves make events.
//!
//! A fence is a document of [`FENCE_COLLECTION`] (written through `/v1/fences`). It names a
//! layer, an optional `where` over its columns, an area (a polygon or multipolygon, or a
//! point and a radius in metres) and the transitions it reports. A roaming fence names a
//! second layer and a distance instead of an area: its events say when a row comes within
//! that distance of the other layer's rows, and when it parts from them.
//!
//! Events are decided on the writer thread from each commit's changes, before it commits
//! ([`crate::store::CommitHook::decide`]): the row as it was (the view, or an earlier change
//! of the same batch) against the row as the change leaves it. So their order is the commit
//! order, and they are kept in the commit's transaction.
//!
//! A row is in a fence's population when it exists and passes the fence's `where`. It is
//! inside when it is in the population and its geometry meets the area (a point on an edge
//! or a vertex is inside). `enter`: not inside before, inside after; `exit`: the reverse
//! (a row deleted, or no longer passing the `where`, exits); `inside`/`outside`: every change
//! that leaves a row of the population inside/outside; `cross`: a point that was and stays
//! outside while the segment between its two positions meets the area.

use std::borrow::Cow;
use std::collections::BTreeMap;

use geo::{Geometry, Intersects, Line, Point};
use rstar::{AABB, RTree, primitives::GeomWithData, primitives::Rectangle};
use serde_json::{Value, json};

use super::*;
use crate::acl::FENCE_COLLECTION;
use crate::spatial::{Location, Shape};
use crate::store::Record;
use crate::where_clause::{Datum, Row, Where};

/// Where fence documents live: `/geoshard/fences/{name}.json`.
pub const FENCE_PREFIX: &str = "/geoshard/fences/";

/// The document URI of fence `name`.
pub fn fence_uri(name: &str) -> String {
    format!("{FENCE_PREFIX}{name}.json")
}

/// A transition a fence reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detect {
    Enter,
    Exit,
    Inside,
    Outside,
    Cross,
    /// Roaming: the row came within the distance of another.
    Near,
    /// Roaming: the row parted from another.
    Far,
}

impl Detect {
    pub const ALL: [Detect; 7] = [
        Detect::Enter,
        Detect::Exit,
        Detect::Inside,
        Detect::Outside,
        Detect::Cross,
        Detect::Near,
        Detect::Far,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Detect::Enter => "enter",
            Detect::Exit => "exit",
            Detect::Inside => "inside",
            Detect::Outside => "outside",
            Detect::Cross => "cross",
            Detect::Near => "near",
            Detect::Far => "far",
        }
    }

    pub fn parse(s: &str) -> Option<Detect> {
        Detect::ALL.into_iter().find(|d| d.name() == s)
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// Bounds of fences, from `Config`.
#[derive(Debug, Clone, Copy)]
pub struct FenceLimits {
    /// Most fences defined at once.
    pub max_fences: usize,
    /// Most positions in a fence's area.
    pub max_vertices: usize,
}

impl Default for FenceLimits {
    fn default() -> Self {
        FenceLimits {
            max_fences: 100_000,
            max_vertices: 100_000,
        }
    }
}

/// The area of a fence.
#[derive(Debug, Clone)]
pub enum Area {
    /// A polygon or multipolygon.
    Polygon(Geometry<f64>),
    /// Within `meters` of a point (on the WGS84 ellipsoid).
    Circle { center: [f64; 2], meters: f64 },
    /// Roaming: within `meters` of a row of another layer.
    Roam {
        service: String,
        layer: i64,
        meters: f64,
    },
}

/// A webhook: where a fence's events are posted, and the key their signature uses.
#[derive(Debug, Clone)]
pub struct Webhook {
    pub url: String,
    pub secret: String,
}

/// A fence as its document states it, checked.
#[derive(Debug, Clone)]
pub struct FenceSpec {
    pub name: String,
    pub service: String,
    pub layer: i64,
    pub where_text: Option<String>,
    pub area: Area,
    detect: u8,
    pub webhook: Option<Webhook>,
    /// Who defined it, and the roles whose reads its webhook carries.
    pub owner: String,
    pub owner_roles: RoleSet,
    /// The store's last event when it was defined: its webhook starts after it.
    pub since: u64,
    /// The document as written.
    pub raw: Value,
}

impl FenceSpec {
    pub fn detects(&self, d: Detect) -> bool {
        self.detect & d.bit() != 0
    }

    pub fn detect_list(&self) -> Vec<&'static str> {
        Detect::ALL
            .into_iter()
            .filter(|d| self.detects(*d))
            .map(Detect::name)
            .collect()
    }

    /// The definition as `GET /v1/fences/{name}` gives it: the document without the
    /// webhook's secret.
    pub fn public_json(&self) -> Value {
        let mut v = self.raw.clone();
        if let Some(hook) = v.get_mut("webhook").and_then(Value::as_object_mut) {
            hook.remove("secret");
        }
        v
    }
}

fn count_positions(g: &Geometry<f64>) -> usize {
    use geo::CoordsIter;
    g.coords_count()
}

/// Read and check a fence document's JSON.
pub fn parse_fence(json: &Value, limits: FenceLimits) -> Result<FenceSpec, String> {
    let obj = json.as_object().ok_or("a fence is a JSON object")?;
    let text = |k: &str| -> Result<Option<String>, String> {
        match obj.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("{k}: not a string")),
        }
    };
    let name = text("name")?.ok_or("name: missing")?;
    check_name(&name)?;
    let service = text("service")?.ok_or("service: missing")?;
    let layer = obj
        .get("layer")
        .and_then(Value::as_i64)
        .ok_or("layer: missing, or not an integer")?;
    let where_text = text("where")?.filter(|w| !w.trim().is_empty());
    let meters = |k: &str| -> Result<f64, String> {
        let m = obj
            .get(k)
            .and_then(Value::as_f64)
            .ok_or_else(|| format!("{k}: missing, or not a number"))?;
        if !(m.is_finite() && m > 0.0 && m <= 20_000_000.0) {
            return Err(format!("{k}: {m} is not a distance in metres above 0"));
        }
        Ok(m)
    };
    let area = match (obj.get("geometry"), obj.get("point"), obj.get("roam")) {
        (Some(g), None, None) => {
            let geometry =
                crate::spatial::parse_geojson(g).map_err(|e| format!("geometry: {e}"))?;
            if !matches!(geometry, Geometry::Polygon(_) | Geometry::MultiPolygon(_)) {
                return Err("geometry: a fence's area is a Polygon or a MultiPolygon".into());
            }
            let n = count_positions(&geometry);
            if n > limits.max_vertices {
                return Err(format!(
                    "geometry: {n} positions, above max_fence_vertices ({})",
                    limits.max_vertices
                ));
            }
            Area::Polygon(geometry)
        }
        (None, Some(p), None) => {
            let pair = p
                .as_array()
                .filter(|a| a.len() == 2)
                .and_then(|a| Some([a[0].as_f64()?, a[1].as_f64()?]))
                .ok_or("point: not [longitude, latitude]")?;
            if !(-180.0..=180.0).contains(&pair[0]) || !(-90.0..=90.0).contains(&pair[1]) {
                return Err("point: outside [-180, 180] x [-90, 90]".into());
            }
            Area::Circle {
                center: pair,
                meters: meters("radius")?,
            }
        }
        (None, None, Some(r)) => {
            let r = r.as_object().ok_or("roam: not an object")?;
            Area::Roam {
                service: r
                    .get("service")
                    .and_then(Value::as_str)
                    .ok_or("roam.service: missing")?
                    .to_string(),
                layer: r
                    .get("layer")
                    .and_then(Value::as_i64)
                    .ok_or("roam.layer: missing, or not an integer")?,
                meters: {
                    let m = r
                        .get("distance")
                        .and_then(Value::as_f64)
                        .ok_or("roam.distance: missing, or not a number")?;
                    if !(m.is_finite() && m > 0.0 && m <= 1_000_000.0) {
                        return Err(format!("roam.distance: {m} is not in (0, 1000000] metres"));
                    }
                    m
                },
            }
        }
        (None, None, None) => {
            return Err("a fence needs an area: geometry, point and radius, or roam".into());
        }
        _ => return Err("a fence has one area: geometry, point and radius, or roam".into()),
    };
    let roaming = matches!(area, Area::Roam { .. });
    let mut detect = 0u8;
    match obj.get("detect") {
        None | Some(Value::Null) => {
            detect = if roaming {
                Detect::Near.bit() | Detect::Far.bit()
            } else {
                Detect::Enter.bit() | Detect::Exit.bit()
            }
        }
        Some(Value::Array(list)) if !list.is_empty() => {
            for d in list {
                let d = d.as_str().and_then(Detect::parse).ok_or_else(|| {
                    format!(
                        "detect: {d} is not one of enter, exit, inside, outside, cross, near, far"
                    )
                })?;
                if roaming != matches!(d, Detect::Near | Detect::Far) {
                    return Err(format!(
                        "detect: {} is for {} fences",
                        d.name(),
                        if roaming { "area" } else { "roaming" }
                    ));
                }
                detect |= d.bit();
            }
        }
        Some(_) => return Err("detect: a non-empty array of transitions".into()),
    }
    let webhook = match obj.get("webhook") {
        None | Some(Value::Null) => None,
        Some(Value::Object(h)) => {
            let url = h
                .get("url")
                .and_then(Value::as_str)
                .ok_or("webhook.url: missing")?;
            if !url.starts_with("http://") {
                return Err(
                    "webhook.url: an http:// URL (https:// webhooks are not posted to yet)".into(),
                );
            }
            let secret = h
                .get("secret")
                .and_then(Value::as_str)
                .ok_or("webhook.secret: missing (it keys the signature)")?;
            if secret.len() < 16 {
                return Err("webhook.secret: at least 16 bytes".into());
            }
            Some(Webhook {
                url: url.to_string(),
                secret: secret.to_string(),
            })
        }
        Some(_) => return Err("webhook: an object with url and secret".into()),
    };
    let owner = text("owner")?.unwrap_or_default();
    let owner_roles = RoleSet::from_bits(
        obj.get("ownerRoles")
            .and_then(Value::as_u64)
            .and_then(|b| u8::try_from(b).ok())
            .unwrap_or(0),
    );
    Ok(FenceSpec {
        since: obj.get("since").and_then(Value::as_u64).unwrap_or(0),
        name,
        service,
        layer,
        where_text,
        area,
        detect,
        webhook,
        owner,
        owner_roles,
        raw: json.clone(),
    })
}

/// A fence's name: what its URLs and its document's URI hold.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !name.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "name: {name:?} is not 1 to 128 letters, digits, '-', '_' or '.'"
        ))
    }
}

/// A fence made ready against the catalog: its view, geometry path and prepared area.
struct Active {
    spec: Arc<FenceSpec>,
    /// The area's box (`None`: roaming).
    bbox: Option<crate::spatial::pip::BBox>,
    /// The geometry path of the layer, as the view's indexes name it.
    path: String,
    filter: Option<Where>,
    test: Test,
}

enum Test {
    Polygon {
        shape: Shape,
        geometry: Geometry<f64>,
    },
    Circle {
        center: Geometry<f64>,
        meters: f64,
    },
    Roam {
        view: ViewKey,
        path: String,
        meters: f64,
    },
}

impl Test {
    /// Whether a geometry meets the area.
    fn meets(&self, g: &Seen) -> bool {
        match self {
            Test::Polygon { shape, geometry } => match g.point {
                Some((x, y)) => shape.locate(x, y) != Location::Exterior,
                None => g.geometry.as_ref().is_some_and(|p| p.intersects(geometry)),
            },
            Test::Circle { center, meters } => g
                .geometry
                .as_ref()
                .and_then(|p| crate::spatial::distance::within(p, center, *meters, None))
                .unwrap_or(false),
            Test::Roam { .. } => false,
        }
    }

    /// Whether the segment between two points meets the area.
    fn crossed(&self, a: (f64, f64), b: (f64, f64)) -> bool {
        let line = Line::new(geo::coord! {x: a.0, y: a.1}, geo::coord! {x: b.0, y: b.1});
        match self {
            Test::Polygon { geometry, .. } => line.intersects(geometry),
            Test::Circle { center, meters } => {
                crate::spatial::distance::within(&Geometry::Line(line), center, *meters, None)
                    .unwrap_or(false)
            }
            Test::Roam { .. } => false,
        }
    }

    fn bbox(&self) -> Option<crate::spatial::pip::BBox> {
        match self {
            Test::Polygon { geometry, .. } => crate::spatial::predicate::bbox_of(geometry),
            Test::Circle { center, meters } => crate::spatial::predicate::bbox_of(center)
                .map(|b| crate::spatial::distance::around(&b, *meters)),
            Test::Roam { .. } => None,
        }
    }
}

type FenceBox = GeomWithData<Rectangle<[f64; 2]>, usize>;

/// The fences of one view and geometry path.
#[derive(Default)]
struct ViewFences {
    fences: Vec<Arc<Active>>,
    /// Boxes of the area fences, by index into `fences`.
    tree: RTree<FenceBox>,
    /// Boxes of the area fences that report `cross`: the segment between two positions is
    /// looked up here alone, since a long one meets many boxes.
    crossing: RTree<FenceBox>,
    /// Area fences that report `outside`: wherever a row is, they are candidates.
    outside: Vec<usize>,
    /// Roaming fences, by index into `fences`.
    roaming: Vec<usize>,
}

/// Every fence: as defined, and made ready against a catalog generation.
#[derive(Default, Clone)]
pub struct FenceSet {
    /// By name.
    specs: BTreeMap<String, Arc<FenceSpec>>,
    /// By document URI, the name (a document may be deleted by URI).
    by_uri: BTreeMap<String, String>,
    /// By name, each fence made ready against catalog generation `compiled_at` (or why it
    /// cannot be): kept across fence changes, so a change prepares only its own fence.
    compiled: FastMap<String, Compiled>,
    compiled_at: u64,
    ready: Option<Arc<Ready>>,
}

type Compiled = Result<(ViewKey, Arc<Active>), String>;

struct Ready {
    generation: u64,
    views: FastMap<ViewKey, ViewFences>,
    /// Fences whose layer or `where` does not resolve, and why.
    inactive: BTreeMap<String, String>,
}

impl FenceSet {
    pub fn len(&self) -> usize {
        self.specs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    pub fn get(&self, name: &str) -> Option<Arc<FenceSpec>> {
        self.specs.get(name).cloned()
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<FenceSpec>> {
        self.specs.values()
    }

    /// Why a fence makes no events, when it makes none (its layer or `where` does not
    /// resolve against the catalog).
    pub fn inactive(&self, name: &str) -> Option<String> {
        self.ready.as_ref()?.inactive.get(name).cloned()
    }

    fn put(&mut self, uri: &str, spec: Option<FenceSpec>) {
        if let Some(old) = self.by_uri.remove(uri) {
            self.specs.remove(&old);
            self.compiled.remove(&old);
        }
        if let Some(spec) = spec {
            self.compiled.remove(&spec.name);
            self.by_uri.insert(uri.to_string(), spec.name.clone());
            self.specs.insert(spec.name.clone(), Arc::new(spec));
        }
        self.ready = None;
    }

    /// The fences made ready against `catalog`, if they are.
    fn fresh(&self, catalog: &Catalog) -> Option<Arc<Ready>> {
        self.ready
            .as_ref()
            .filter(|r| r.generation == catalog.generation)
            .cloned()
    }

    /// Made ready against `catalog`, once per generation and fence change.
    fn ready(&mut self, catalog: &Catalog, limits: WhereLimits) -> Arc<Ready> {
        if let Some(r) = self.fresh(catalog) {
            return r;
        }
        if self.compiled_at != catalog.generation {
            self.compiled.clear();
            self.compiled_at = catalog.generation;
        }
        let mut ready = Ready {
            generation: catalog.generation,
            views: FastMap::default(),
            inactive: BTreeMap::new(),
        };
        for spec in self.specs.values() {
            let compiled = self
                .compiled
                .entry(spec.name.clone())
                .or_insert_with(|| activate(catalog, spec, limits).map(|(k, a)| (k, Arc::new(a))));
            match compiled {
                Ok((key, active)) => {
                    let vf = ready.views.entry(key.clone()).or_default();
                    vf.fences.push(active.clone());
                }
                Err(why) => {
                    ready.inactive.insert(spec.name.clone(), why.clone());
                }
            }
        }
        for vf in ready.views.values_mut() {
            let boxes: Vec<FenceBox> = vf
                .fences
                .iter()
                .enumerate()
                .filter_map(|(i, f)| {
                    let b = f.bbox?;
                    Some(GeomWithData::new(
                        Rectangle::from_corners([b[0], b[1]], [b[2], b[3]]),
                        i,
                    ))
                })
                .collect();
            let detects = |i: usize, d: Detect| vf.fences[i].spec.detects(d);
            vf.crossing = RTree::bulk_load(
                boxes
                    .iter()
                    .filter(|b| detects(b.data, Detect::Cross))
                    .cloned()
                    .collect(),
            );
            vf.outside = boxes
                .iter()
                .map(|b| b.data)
                .filter(|&i| detects(i, Detect::Outside))
                .collect();
            vf.tree = RTree::bulk_load(boxes);
            vf.roaming = (0..vf.fences.len())
                .filter(|&i| matches!(vf.fences[i].test, Test::Roam { .. }))
                .collect();
        }
        let ready = Arc::new(ready);
        self.ready = Some(ready.clone());
        ready
    }
}

/// The view, geometry path and catalog layer of a service's layer.
fn layer_of(catalog: &Catalog, service: &str, layer: i64) -> Result<(ViewKey, String), String> {
    let descriptor = catalog
        .descriptors
        .values()
        .find(|d| d.name == service)
        .ok_or_else(|| format!("no service {service}"))?;
    let layer = descriptor
        .layers
        .iter()
        .find(|l| l.id == layer)
        .ok_or_else(|| format!("service {service} has no layer {layer}"))?;
    let view = catalog
        .views
        .get(&layer.view)
        .ok_or_else(|| format!("no view {}", layer.view))?;
    let path = view
        .paths
        .iter()
        .find(|(_, p)| **p == layer.geometry_path)
        .map(|(k, _)| k.clone())
        .ok_or_else(|| format!("the layer's geometry path is not indexed in {}", layer.view))?;
    Ok((layer.view.clone(), path))
}

fn activate(
    catalog: &Catalog,
    spec: &Arc<FenceSpec>,
    limits: WhereLimits,
) -> Result<(ViewKey, Active), String> {
    let (key, path) = layer_of(catalog, &spec.service, spec.layer)?;
    let def = &catalog.views[&key].def;
    let filter = match &spec.where_text {
        None => None,
        Some(w) => Some(
            Where::parse(w, &|name| def.column(name), limits).map_err(|e| format!("where: {e}"))?,
        ),
    };
    let test = match &spec.area {
        Area::Polygon(g) => Test::Polygon {
            shape: Shape::new(g.clone()).ok_or("the area is not a polygon")?,
            geometry: g.clone(),
        },
        Area::Circle { center, meters } => Test::Circle {
            center: Geometry::Point(Point::new(center[0], center[1])),
            meters: *meters,
        },
        Area::Roam {
            service,
            layer,
            meters,
        } => {
            let (view, path) = layer_of(catalog, service, *layer)?;
            Test::Roam {
                view,
                path,
                meters: *meters,
            }
        }
    };
    Ok((
        key,
        Active {
            bbox: test.bbox(),
            spec: spec.clone(),
            path,
            filter,
            test,
        },
    ))
}

/// A row as one side of a change sees it.
#[derive(Clone, Default)]
struct Seen {
    id: Option<i64>,
    readers: RoleSet,
    cells: Vec<Datum<'static>>,
    /// The geometry at the fence's path as GeoJSON text, when it is not a point.
    json: Option<Box<[u8]>>,
    point: Option<(f64, f64)>,
    geometry: Option<Geometry<f64>>,
}

impl Row for Seen {
    fn get(&self, column: usize) -> Datum<'_> {
        self.cells.get(column).cloned().unwrap_or(Datum::Null)
    }
}

fn owned(d: Datum<'_>) -> Datum<'static> {
    match d {
        Datum::Null => Datum::Null,
        Datum::Int(i) => Datum::Int(i),
        Datum::Float(f) => Datum::Float(f),
        Datum::Str(s) => Datum::Str(std::borrow::Cow::Owned(s.into_owned())),
        Datum::Bool(b) => Datum::Bool(b),
        Datum::Date(ms) => Datum::Date(ms),
    }
}

fn cell_datum(c: &Option<template::Cell>) -> Datum<'static> {
    use template::Cell;
    match c {
        None => Datum::Null,
        Some(Cell::Int(i)) => Datum::Int(*i),
        Some(Cell::Float(f)) => Datum::Float(*f),
        Some(Cell::Str(s)) => Datum::Str(std::borrow::Cow::Owned(s.to_string())),
        Some(Cell::Bool(b)) => Datum::Bool(*b),
        Some(Cell::Date(ms)) => Datum::Date(*ms),
    }
}

/// Write a value as JSON (writing to a vector cannot fail).
fn write_json<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, v: &T) {
    let _ = serde_json::to_writer(&mut *out, v);
}

fn write_datum(out: &mut Vec<u8>, d: &Datum<'_>) {
    match d {
        Datum::Null => out.extend_from_slice(b"null"),
        Datum::Int(i) => write_json(out, i),
        Datum::Float(f) => write_json(out, f),
        Datum::Str(s) => write_json(out, s.as_ref()),
        Datum::Bool(b) => write_json(out, b),
        Datum::Date(ms) => write_json(out, &crate::time::format_datetime(*ms)),
    }
}

impl Seen {
    /// The geometry as the view keeps it: a point as it is, anything else parsed.
    fn fill_geometry(&mut self, g: Option<view::GeometryRef<'_>>) {
        match g {
            Some(view::GeometryRef::Point(x, y)) => {
                self.point = Some((x, y));
                self.geometry = Some(Geometry::Point(Point::new(x, y)));
            }
            Some(view::GeometryRef::Json(bytes)) => {
                let Ok(json) = serde_json::from_slice::<Value>(bytes) else {
                    return;
                };
                self.geometry = crate::spatial::parse_geojson(&json).ok();
                if let Some(Geometry::Point(p)) = &self.geometry {
                    self.point = Some((p.x(), p.y()));
                }
                self.json = Some(bytes.into());
            }
            None => {}
        }
    }

    /// The row as the view holds it (its first row, for a document of several).
    fn from_view(view: &ViewState, uri: &str, path: &str) -> Option<Seen> {
        let data = view.data.read();
        let slot = *data.slots_of(uri).first()?;
        let row = data.row(slot);
        let mut seen = Seen {
            id: data.id_of(slot),
            readers: RoleSet::from_bits(data.reader_bits(slot)),
            cells: (0..view.def.columns.len())
                .map(|c| owned(row.get(c)))
                .collect(),
            ..Seen::default()
        };
        seen.fill_geometry(data.geometry_column(path).get(slot));
        Some(seen)
    }

    /// The row as a change leaves it.
    fn from_rows(
        def: &ViewDef,
        rows: &[view::NewRow],
        readers: RoleSet,
        path: &str,
    ) -> Option<Seen> {
        let row = rows.first()?;
        let mut seen = Seen {
            id: row.cells.get(def.id_column).and_then(|c| match c {
                Some(template::Cell::Int(i)) => Some(*i),
                _ => None,
            }),
            readers,
            cells: row.cells.iter().map(cell_datum).collect(),
            ..Seen::default()
        };
        let g = row
            .geometries
            .iter()
            .find(|(p, _)| p == path)
            .and_then(|(_, g)| g.as_ref());
        seen.fill_geometry(g.map(view::GeometryOut::as_ref));
        Some(seen)
    }

    /// The row's columns as a JSON object, by the columns' `names`.
    fn write_properties<'n>(&self, names: impl Iterator<Item = &'n str>, out: &mut Vec<u8>) {
        out.push(b'{');
        for (i, (name, d)) in names.zip(&self.cells).enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_json(out, name);
            out.push(b':');
            write_datum(out, d);
        }
        out.push(b'}');
    }

    /// The geometry as an event body keeps it: none (0), a point (1, x and y), or GeoJSON
    /// text (2, its length and bytes).
    fn put_geometry(seen: Option<&Seen>, out: &mut Vec<u8>) {
        match seen {
            Some(Seen {
                point: Some((x, y)),
                ..
            }) => {
                out.push(1);
                out.extend_from_slice(&x.to_le_bytes());
                out.extend_from_slice(&y.to_le_bytes());
            }
            Some(Seen {
                json: Some(json), ..
            }) => {
                out.push(2);
                out.extend_from_slice(&(json.len() as u32).to_le_bytes());
                out.extend_from_slice(json);
            }
            _ => out.push(0),
        }
    }
}

/// The format byte of an event body kept in the compact form; a body kept as JSON (by an
/// older version) has `{` there.
const COMPACT: u8 = 1;

/// An event as it is kept: the roles that may read the row (one byte), [`COMPACT`], the
/// transition, `OBJECTID`, URI, geometry, previous geometry, properties (JSON text) and the
/// roaming fence's other row. The fence is the record's topic and the time its time, so
/// neither is kept twice; the JSON is made when the event is read ([`event_json`]).
fn compact_event<'n>(
    detect: Detect,
    uri: &str,
    (row, previous): (&Seen, Option<&Seen>),
    names: impl Iterator<Item = &'n str>,
    nearby: Option<i64>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(&[row.readers.bits(), COMPACT, detect as u8]);
    put_id(&mut out, row.id);
    out.extend_from_slice(&(uri.len() as u32).to_le_bytes());
    out.extend_from_slice(uri.as_bytes());
    Seen::put_geometry(Some(row), &mut out);
    Seen::put_geometry(previous, &mut out);
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    row.write_properties(names, &mut out);
    let len = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
    put_id(&mut out, nearby);
    out
}

fn put_id(out: &mut Vec<u8>, id: Option<i64>) {
    match id {
        Some(i) => {
            out.push(1);
            out.extend_from_slice(&i.to_le_bytes());
        }
        None => out.push(0),
    }
}

/// A reader of a compact body's fields, in order; `None` once the body ends early.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn byte(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u32(&mut self) -> Option<usize> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?) as usize)
    }

    fn f64(&mut self) -> Option<f64> {
        Some(f64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn id(&mut self) -> Option<Option<i64>> {
        match self.byte()? {
            0 => Some(None),
            _ => Some(Some(i64::from_le_bytes(self.take(8)?.try_into().ok()?))),
        }
    }

    fn text(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()?;
        self.take(n)
    }

    /// A geometry written as JSON into `out`.
    fn geometry(&mut self, out: &mut Vec<u8>) -> Option<()> {
        match self.byte()? {
            0 => out.extend_from_slice(b"null"),
            1 => {
                let (x, y) = (self.f64()?, self.f64()?);
                out.extend_from_slice(br#"{"type":"Point","coordinates":["#);
                write_json(out, &x);
                out.push(b',');
                write_json(out, &y);
                out.extend_from_slice(b"]}");
            }
            _ => out.extend_from_slice(self.text()?),
        }
        Some(())
    }
}

/// An event as its readers get it: the roles that may read its row, and its JSON
/// (`{"fence", "detect", "uri", "OBJECTID", "properties", "geometry", "previous", "time"}`,
/// and `nearby` for a roaming fence), made from the kept body of fence `topic`'s event at
/// `time_ms`.
pub fn event_json<'a>(topic: &str, time_ms: u64, body: &'a [u8]) -> (RoleSet, Cow<'a, [u8]>) {
    let Some((&readers, rest)) = body.split_first() else {
        return (RoleSet::EMPTY, Cow::Borrowed(b"{}"));
    };
    let readers = RoleSet::from_bits(readers);
    match rest.first() {
        None => return (readers, Cow::Borrowed(b"{}")),
        Some(&COMPACT) => {}
        Some(_) => return (readers, Cow::Borrowed(rest)),
    }
    let mut out = Vec::with_capacity(rest.len() * 2 + 96);
    let made = (|| {
        let mut f = Fields(&rest[1..]);
        let detect = *Detect::ALL.get(f.byte()? as usize)?;
        let id = f.id()?;
        let uri = std::str::from_utf8(f.text()?).ok()?;
        out.extend_from_slice(br#"{"fence":"#);
        write_json(&mut out, topic);
        out.extend_from_slice(br#","detect":""#);
        out.extend_from_slice(detect.name().as_bytes());
        out.extend_from_slice(br#"","uri":"#);
        write_json(&mut out, uri);
        out.extend_from_slice(br#","OBJECTID":"#);
        write_json(&mut out, &id);
        let mut geometry = Vec::new();
        f.geometry(&mut geometry)?;
        let mut previous = Vec::new();
        f.geometry(&mut previous)?;
        out.extend_from_slice(br#","properties":"#);
        out.extend_from_slice(f.text()?);
        out.extend_from_slice(br#","geometry":"#);
        out.extend_from_slice(&geometry);
        out.extend_from_slice(br#","previous":"#);
        out.extend_from_slice(&previous);
        out.extend_from_slice(br#","time":"#);
        write_json(&mut out, &crate::time::format_datetime(time_ms as i64));
        if let Some(other) = f.id()? {
            out.extend_from_slice(br#","nearby":{"OBJECTID":"#);
            write_json(&mut out, &other);
            out.push(b'}');
        }
        out.push(b'}');
        Some(())
    })();
    match made {
        Some(()) => (readers, Cow::Owned(out)),
        None => (readers, Cow::Borrowed(b"{}")),
    }
}

struct Decided<'a> {
    uri: &'a str,
    def: &'a ViewDef,
    time: u64,
    out: Vec<Record>,
}

impl Decided<'_> {
    fn push(
        &mut self,
        fence: &FenceSpec,
        detect: Detect,
        row: &Seen,
        previous: Option<&Seen>,
        nearby: Option<i64>,
    ) {
        self.out.push(Record {
            topic: fence.name.clone(),
            time_ms: self.time,
            body: compact_event(
                detect,
                self.uri,
                (row, previous),
                self.def.columns.iter().map(|c| c.name.as_str()),
                nearby,
            ),
        });
    }
}

impl Features {
    /// The fences defined now.
    pub fn fences(&self) -> Arc<FenceSet> {
        self.fences.read().clone()
    }

    /// The geometry of the row of layer `layer` of `service` whose `OBJECTID` is `id`, when
    /// `roles` may read the service and the row: the area of a fence on "this county".
    pub fn feature_geometry(
        &self,
        service: &str,
        layer: i64,
        id: i64,
        roles: RoleSet,
    ) -> Result<Value, String> {
        if self.descriptor(service, roles).is_none() {
            return Err(format!("no service {service}"));
        }
        let catalog = self.catalog.read();
        let (key, path) = layer_of(&catalog, service, layer)?;
        let view = &catalog.views[&key];
        let data = view.data.read();
        let caller = crate::acl::Caller::new("", roles);
        let slot = data
            .live_slots()
            .find(|&s| data.id_of(s) == Some(id) && data.readable(&caller, s))
            .ok_or_else(|| format!("layer {layer} of {service} has no feature {id}"))?;
        data.geometry_column(&path)
            .get(slot)
            .and_then(|g| match g {
                view::GeometryRef::Point(x, y) => {
                    Some(json!({"type": "Point", "coordinates": [x, y]}))
                }
                view::GeometryRef::Json(bytes) => serde_json::from_slice(bytes).ok(),
            })
            .ok_or_else(|| format!("feature {id} has no geometry"))
    }

    /// Why `spec` would make no events against the catalog now (its layer, roaming layer or
    /// `where` does not resolve), if it would not.
    pub fn fence_problem(&self, spec: &FenceSpec) -> Option<String> {
        let catalog = self.catalog.read();
        activate(
            &catalog,
            &Arc::new(spec.clone()),
            self.settings.where_limits,
        )
        .err()
    }

    /// Load the fences the store holds (at open).
    pub(crate) fn load_fences(&self) -> Result<(), StoreError> {
        let mut set = FenceSet::default();
        let limits = self.settings.fences;
        self.store.scan_documents_in(&[FENCE_COLLECTION], |doc| {
            match parse_json(&doc).map(|j| parse_fence(&j, limits)) {
                Some(Ok(spec)) => set.put(&doc.uri, Some(spec)),
                Some(Err(e)) => tracing::warn!(uri = %doc.uri, error = %e, "stored fence ignored"),
                None => tracing::warn!(uri = %doc.uri, "stored fence is not JSON; ignored"),
            }
            Ok(())
        })?;
        *self.fences.write() = Arc::new(set);
        Ok(())
    }

    /// Check a fence document before it lands.
    pub(crate) fn check_fence(&self, doc: &Document) -> Result<(), String> {
        let json = parse_json(doc).ok_or("a fence is a JSON document")?;
        let spec = parse_fence(&json, self.settings.fences)?;
        if doc.uri != fence_uri(&spec.name) {
            return Err(format!(
                "fence {} belongs at {}",
                spec.name,
                fence_uri(&spec.name)
            ));
        }
        let set = self.fences.read();
        if set.get(&spec.name).is_none() && set.len() >= self.settings.fences.max_fences {
            return Err(format!(
                "{} fences are defined, max_fences allows no more",
                set.len()
            ));
        }
        Ok(())
    }

    /// The events of a batch's changes, in order (the store's `decide`).
    pub(crate) fn decide_events(&self, changes: &[Change]) -> Vec<Record> {
        // A fence written, or anything deleted or written at a fence's URI (a fence deleted,
        // perhaps one this batch defined).
        let current = self.fences.read().clone();
        let touches_fences = |c: &Change| {
            c.uri.starts_with(FENCE_PREFIX)
                && c.doc
                    .as_deref()
                    .is_none_or(|d| d.in_collection(FENCE_COLLECTION))
                || current.by_uri.contains_key(&c.uri)
        };
        let fence_changes = changes.iter().any(touches_fences);
        if current.is_empty() && !fence_changes {
            return Vec::new();
        }
        let catalog = self.catalog.read();
        let limits = self.settings.where_limits;
        let mut ready = match current.fresh(&catalog) {
            Some(r) => r,
            None => {
                // Made ready once for the commits to come, not once for each.
                let mut made = (*current).clone();
                let r = made.ready(&catalog, limits);
                *self.fences.write() = Arc::new(made);
                r
            }
        };
        // The fences as this batch's changes leave them, once one does; made ready again only
        // before a change that needs them, so a batch of many definitions prepares them once.
        let mut changed: Option<FenceSet> = None;
        let mut stale = false;
        let time = crate::time::now_ms();
        let mut out = Vec::new();
        // Each (document, view)'s row as the batch's earlier changes left it.
        let mut overlay: HashMap<(&str, ViewKey), Option<Seen>> = HashMap::new();
        for c in changes {
            // A copy of a document this node lacked moves nothing.
            if c.quiet {
                continue;
            }
            if touches_fences(c) {
                let spec = c
                    .doc
                    .as_deref()
                    .filter(|d| d.in_collection(FENCE_COLLECTION))
                    .and_then(parse_json)
                    .and_then(|j| parse_fence(&j, self.settings.fences).ok());
                let set = changed.get_or_insert_with(|| (*self.fences.read().clone()).clone());
                set.put(&c.uri, spec);
                stale = true;
                continue;
            }
            if let Some(set) = changed.as_mut().filter(|_| stale) {
                ready = set.ready(&catalog, limits);
                stale = false;
            }
            let doc = c.doc.as_deref();
            let prepared = c
                .prepared
                .as_ref()
                .and_then(|p| p.downcast_ref::<PreparedRows>())
                .filter(|p| p.generation == catalog.generation);
            let made;
            let rows = match (doc, prepared) {
                (None, _) => None,
                (Some(_), Some(p)) => Some(p),
                (Some(d), None) => {
                    made = self.rows_of(&catalog, d).ok();
                    made.as_ref()
                }
            };
            for (key, vf) in &ready.views {
                let Some(view) = catalog.views.get(key) else {
                    continue;
                };
                let extracted = rows.and_then(|r| r.per_view.iter().find(|(k, _)| k == key));
                let before = match overlay.get(&(c.uri.as_str(), key.clone())) {
                    Some(seen) => seen.clone(),
                    None => vf
                        .fences
                        .first()
                        .and_then(|f| Seen::from_view(view, &c.uri, &f.path)),
                };
                if before.is_none() && extracted.is_none() {
                    continue;
                }
                let readers = doc.map(readers_of).unwrap_or_default();
                let path = vf.fences.first().map_or("", |f| f.path.as_str());
                let after =
                    extracted.and_then(|(_, e)| Seen::from_rows(&view.def, &e.rows, readers, path));
                let mut decided = Decided {
                    uri: &c.uri,
                    def: &view.def,
                    time,
                    out: Vec::new(),
                };
                decide_row(
                    &catalog,
                    key,
                    vf,
                    before.as_ref(),
                    after.as_ref(),
                    &mut decided,
                );
                out.append(&mut decided.out);
                overlay.insert((c.uri.as_str(), key.clone()), after);
            }
        }
        if let Some(mut set) = changed {
            if stale {
                set.ready(&catalog, limits);
            }
            *self.pending_fences.lock() = Some(Arc::new(set));
        }
        out
    }

    /// A commit's fence changes take effect (the hook's `committed`).
    pub(crate) fn fences_committed(&self) {
        if let Some(set) = self.pending_fences.lock().take() {
            *self.fences.write() = set;
        }
    }
}

/// The row, when it is in the fence's population.
fn passes<'s>(f: &Active, s: Option<&'s Seen>) -> Option<&'s Seen> {
    s.filter(|s| f.filter.as_ref().is_none_or(|w| w.matches(*s)))
}

/// The events one row's change makes in one view's fences.
fn decide_row(
    catalog: &Catalog,
    own: &ViewKey,
    vf: &ViewFences,
    before: Option<&Seen>,
    after: Option<&Seen>,
    out: &mut Decided<'_>,
) {
    // Candidates: fences whose box holds either position; those that report `cross`, whose
    // box meets the segment between two points; those that report `outside`, all.
    let look = |tree: &RTree<FenceBox>, b: [f64; 4], into: &mut Vec<usize>| {
        let env = AABB::from_corners([b[0], b[1]], [b[2], b[3]]);
        into.extend(tree.locate_in_envelope_intersecting(env).map(|e| e.data));
    };
    let mut candidates: Vec<usize> = Vec::new();
    for s in [before, after].into_iter().flatten() {
        if let Some((x, y)) = s.point {
            look(&vf.tree, [x, y, x, y], &mut candidates);
        } else if let Some(b) = s
            .geometry
            .as_ref()
            .and_then(crate::spatial::predicate::bbox_of)
        {
            look(&vf.tree, b, &mut candidates);
        }
    }
    if let (Some(a), Some(b)) = (before.and_then(|s| s.point), after.and_then(|s| s.point))
        && vf.crossing.size() > 0
    {
        let segment = [a.0.min(b.0), a.1.min(b.1), a.0.max(b.0), a.1.max(b.1)];
        look(&vf.crossing, segment, &mut candidates);
    }
    candidates.extend_from_slice(&vf.outside);
    candidates.sort_unstable();
    candidates.dedup();
    for i in candidates {
        let f = &vf.fences[i];
        let (was, is) = (passes(f, before), passes(f, after));
        let was_in = was.is_some_and(|s| f.test.meets(s));
        let is_in = is.is_some_and(|s| f.test.meets(s));
        let spec = &f.spec;
        // Inside after means a row after; inside before, a row before (a deleted row exits
        // as it was).
        match (was_in, is_in, is.or(before)) {
            (false, true, Some(row)) if spec.detects(Detect::Enter) => {
                out.push(spec, Detect::Enter, row, before, None)
            }
            (true, false, Some(row)) if spec.detects(Detect::Exit) => {
                out.push(spec, Detect::Exit, row, before, None)
            }
            _ => {}
        }
        if let Some(row) = is {
            if is_in && spec.detects(Detect::Inside) {
                out.push(spec, Detect::Inside, row, before, None);
            }
            if !is_in && spec.detects(Detect::Outside) {
                out.push(spec, Detect::Outside, row, before, None);
            }
            if !is_in
                && !was_in
                && spec.detects(Detect::Cross)
                && let (Some(a), Some(b)) = (was.and_then(|s| s.point), row.point)
                && a != b
                && f.test.crossed(a, b)
            {
                out.push(spec, Detect::Cross, row, before, None);
            }
        }
    }
    for &i in &vf.roaming {
        let f = &vf.fences[i];
        roam(
            catalog,
            f,
            own,
            (passes(f, before), passes(f, after)),
            before,
            out,
        );
    }
}

/// The `OBJECTID`s of the roaming fence's other layer's rows within its distance of `row`,
/// leaving out the row itself.
fn near(
    catalog: &Catalog,
    f: &Active,
    row: Option<&Seen>,
    own: &ViewKey,
) -> std::collections::BTreeSet<i64> {
    let mut out = std::collections::BTreeSet::new();
    let (Test::Roam { view, path, meters }, Some(r)) = (&f.test, row) else {
        return out;
    };
    let Some(g) = r.geometry.as_ref() else {
        return out;
    };
    let Some(state) = catalog.views.get(view) else {
        return out;
    };
    let Some(engine) = state.indexes.read().get(path).cloned() else {
        return out;
    };
    let query = crate::spatial::Query::new(g.clone());
    let Ok(slots) = engine.query_distance(&query, *meters, None) else {
        return out;
    };
    let data = state.data.read();
    for s in slots {
        if let Some(id) = data.id_of(s)
            && !(view == own && Some(id) == r.id)
        {
            out.insert(id);
        }
    }
    out
}

fn roam(
    catalog: &Catalog,
    f: &Active,
    own: &ViewKey,
    (was, is): (Option<&Seen>, Option<&Seen>),
    before: Option<&Seen>,
    out: &mut Decided<'_>,
) {
    let then = near(catalog, f, was, own);
    let now = near(catalog, f, is, own);
    let spec = &f.spec;
    let nearby = |id: &i64| Some(*id);
    if spec.detects(Detect::Near)
        && let Some(row) = is
    {
        for id in now.difference(&then) {
            out.push(spec, Detect::Near, row, before, nearby(id));
        }
    }
    if spec.detects(Detect::Far)
        && let Some(row) = is.or(was)
    {
        for id in then.difference(&now) {
            out.push(spec, Detect::Far, row, before, nearby(id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> FenceLimits {
        FenceLimits::default()
    }

    #[test]
    fn fences_are_checked() {
        let ok = json!({"name": "downtown", "service": "Fleet", "layer": 0,
            "geometry": {"type": "Polygon", "coordinates": [[[0,0],[1,0],[1,1],[0,1],[0,0]]]},
            "detect": ["enter", "exit", "cross"]});
        let spec = parse_fence(&ok, limits()).unwrap();
        assert_eq!(spec.detect_list(), ["enter", "exit", "cross"]);
        let circle =
            json!({"name": "a", "service": "S", "layer": 1, "point": [10, 20], "radius": 500});
        assert!(
            matches!(parse_fence(&circle, limits()).unwrap().area, Area::Circle { meters, .. } if meters == 500.0)
        );
        let bad = [
            (
                json!({"name": "a b", "service": "S", "layer": 0, "point": [0, 0], "radius": 1}),
                "name",
            ),
            (
                json!({"name": "a", "service": "S", "layer": 0}),
                "needs an area",
            ),
            (
                json!({"name": "a", "service": "S", "layer": 0, "point": [0, 0]}),
                "radius",
            ),
            (
                json!({"name": "a", "service": "S", "layer": 0, "point": [0, 0], "radius": -1}),
                "radius",
            ),
            (
                json!({"name": "a", "service": "S", "layer": 0, "geometry": {"type": "Point", "coordinates": [0, 0]}}),
                "Polygon",
            ),
            (
                json!({"name": "a", "service": "S", "layer": 0, "point": [0, 0], "radius": 1, "detect": ["arrive"]}),
                "detect",
            ),
            (
                json!({"name": "a", "service": "S", "layer": 0, "point": [0, 0], "radius": 1, "detect": ["near"]}),
                "roaming",
            ),
            (
                json!({"name": "a", "service": "S", "layer": 0, "point": [0, 0], "radius": 1, "webhook": {"url": "ftp://x", "secret": "0123456789abcdef"}}),
                "webhook.url",
            ),
            (
                json!({"name": "a", "service": "S", "layer": 0, "point": [0, 0], "radius": 1, "webhook": {"url": "http://x"}}),
                "secret",
            ),
        ];
        for (doc, says) in bad {
            let e = parse_fence(&doc, limits()).unwrap_err();
            assert!(e.contains(says), "{doc}: {e}");
        }
        let few = FenceLimits {
            max_vertices: 4,
            ..limits()
        };
        assert!(
            parse_fence(&ok, few)
                .unwrap_err()
                .contains("max_fence_vertices")
        );
    }

    #[test]
    fn events_are_kept_compact_and_read_as_json() {
        let row = Seen {
            id: Some(42),
            readers: RoleSet::from_bits(0b101),
            cells: vec![
                Datum::Int(42),
                Datum::Str("say \"hi\"\n".into()),
                Datum::Float(0.1),
                Datum::Null,
                Datum::Bool(true),
                Datum::Date(86_400_000),
            ],
            point: Some((-104.98998641967772, 39.7)),
            ..Seen::default()
        };
        let polygon = br#"{"type":"Polygon","coordinates":[[[0,0],[1,0],[1,1],[0,0]]]}"#;
        let previous = Seen {
            json: Some(polygon.as_slice().into()),
            ..Seen::default()
        };
        let names = ["OBJECTID", "name", "f", "n", "b", "d"];
        let body = compact_event(
            Detect::Near,
            "/fleet/\"a\".json",
            (&row, Some(&previous)),
            names.into_iter(),
            Some(7),
        );
        let (readers, json) = event_json("depot", 1_000, &body);
        assert_eq!(readers.bits(), 0b101);
        let v: Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(
            v,
            json!({"fence": "depot", "detect": "near", "uri": "/fleet/\"a\".json", "OBJECTID": 42,
                "properties": {"OBJECTID": 42, "name": "say \"hi\"\n", "f": 0.1, "n": null,
                    "b": true, "d": "1970-01-02T00:00:00.000Z"},
                "geometry": {"type": "Point", "coordinates": [-104.98998641967772, 39.7]},
                "previous": {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 0]]]},
                "time": "1970-01-01T00:00:01.000Z", "nearby": {"OBJECTID": 7}})
        );
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            [
                "fence",
                "detect",
                "uri",
                "OBJECTID",
                "properties",
                "geometry",
                "previous",
                "time",
                "nearby"
            ]
        );
        // No row id, no previous position, no other row.
        let bare = Seen::default();
        let body = compact_event(Detect::Exit, "/x", (&bare, None), [].into_iter(), None);
        let v: Value = serde_json::from_slice(&event_json("f", 0, &body).1).unwrap();
        assert_eq!(v["OBJECTID"], Value::Null);
        assert_eq!(v["geometry"], Value::Null);
        assert_eq!(v["previous"], Value::Null);
        assert!(v.get("nearby").is_none());
        // A body kept as JSON is read as it is; a cut one is an empty object, not a panic.
        let old = [&[3u8][..], br#"{"fence":"f"}"#].concat();
        assert_eq!(&*event_json("f", 0, &old).1, br#"{"fence":"f"}"#);
        for cut in 0..body.len() {
            let (_, json) = event_json("f", 0, &body[..cut]);
            assert!(serde_json::from_slice::<Value>(&json).is_ok(), "{cut}");
        }
    }

    #[test]
    fn public_json_hides_the_secret() {
        let doc = json!({"name": "a", "service": "S", "layer": 0, "point": [0, 0], "radius": 1,
            "webhook": {"url": "http://x/y", "secret": "0123456789abcdef"}});
        let spec = parse_fence(&doc, limits()).unwrap();
        assert_eq!(spec.public_json()["webhook"], json!({"url": "http://x/y"}));
    }
}
