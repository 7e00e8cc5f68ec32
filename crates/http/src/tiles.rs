//! Mapbox vector tiles of a collection (an OGC collection id, `<service>.<layer id>`):
//! `GET /tiles/{collection}/{z}/{x}/{y}.mvt` in Web Mercator, and its TileJSON at
//! `GET /tiles/{collection}.json`.
//!
//! A tile is a box query of its buffered bounds through the same engine and permissions as
//! geoQueryService, with at most `max_record_count` features, spread evenly over the matches
//! when there are more (a sample of the whole layer, not its first ids). Each geometry is
//! projected, simplified for the zoom (Douglas-Peucker, half a tile unit), clipped to the
//! buffer and encoded with geozero's MVT writer.

use std::sync::Arc;

use bytes::Bytes;
use geo::orient::{Direction, Orient};
use geo::{
    Coord, Geometry, LineString, MapCoords, MultiLineString, MultiPolygon, Polygon, Simplify,
};
use geozero::ToMvt;
use geozero::mvt::tile::{self, Layer};
use geozero::mvt::{Message, TagsBuilder, Tile, TileValue};
use serde_json::{Value, json};

use super::ogc;
use super::response::{self, Resp};
use super::{App, Ctx, require_any};
use crate::acl::Role;
use crate::error::{ApiError, ErrorCode};
use crate::features::FeatureRequest;
use crate::features::query::{Attr, QuerySpec, TileGeometry, TilePage};
use crate::spatial::engine::Indexed;
use crate::spatial::{Query, Relation, Shape};

/// Tile units across a tile, and the buffer around it in those units.
const EXTENT: u32 = 4096;
const BUFFER: f64 = 64.0;
/// Half the Web Mercator world's width, in metres.
const HALF: f64 = 20_037_508.342_789_244;
const MAX_ZOOM: u32 = 24;

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidParam, message)
}

/// `GET /tiles…`: `rest` is the path after `/tiles/`.
pub(super) async fn get(app: &Arc<App>, ctx: &Ctx, rest: &str) -> Result<Resp, ApiError> {
    require_any(&ctx.caller, &[Role::GeoWriter, Role::Admin])?;
    let parts: Vec<&str> = rest.trim_matches('/').split('/').collect();
    match parts.as_slice() {
        [name] if name.ends_with(".json") => tilejson(app, ctx, &name[..name.len() - 5]).await,
        [id, z, x, y] if y.ends_with(".mvt") => {
            let n = |s: &str| {
                super::params::digits(s)
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| bad(format!("{s:?} is not a tile number")))
            };
            let (z, x, y) = (n(z)?, n(x)?, n(&y[..y.len() - 4])?);
            if z > MAX_ZOOM || u64::from(x) >= 1u64 << z || u64::from(y) >= 1u64 << z {
                return Err(bad(format!("tile {z}/{x}/{y} does not exist")));
            }
            let bytes = tile(app, ctx, id, z, x, y).await?;
            let mut r = response::json_bytes(200, bytes);
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("application/vnd.mapbox-vector-tile"),
            );
            Ok(r)
        }
        _ => Err(ApiError::new(
            ErrorCode::UnknownEndpoint,
            format!("no endpoint at {}", ctx.path),
        )),
    }
}

async fn tilejson(app: &Arc<App>, ctx: &Ctx, id: &str) -> Result<Resp, ApiError> {
    let (d, layer_id) = ogc::find(app, ctx, id)?;
    let layer = d.layers.iter().find(|l| l.id == layer_id).ok_or_else(|| {
        ApiError::new(
            ErrorCode::ExtensionNotFound,
            format!("Collection {id} not found"),
        )
    })?;
    let collection = ogc::collection_id(&d, layer);
    let fields: serde_json::Map<String, Value> = app
        .features
        .view(&layer.view)
        .map(|v| {
            v.def
                .columns
                .iter()
                .map(|c| (c.name.clone(), json!(c.scalar.name())))
                .collect()
        })
        .unwrap_or_default();
    let mut doc = json!({
        "tilejson": "3.0.0",
        "name": layer.name,
        "description": layer.description,
        "scheme": "xyz",
        "tiles": [format!("{}/tiles/{}/{{z}}/{{x}}/{{y}}.mvt", ogc::origin(app, ctx), ogc::enc(&collection))],
        "minzoom": 0,
        "maxzoom": MAX_ZOOM,
        "vector_layers": [{"id": collection, "fields": fields}],
    });
    let bounds = match super::spread::layer_extents(app, ctx, &d.name).await? {
        Some(extents) => extents.get(&layer.id).copied(),
        None => app.features.layer_extent(layer, &ctx.caller),
    };
    if let Some(b) = bounds {
        doc["bounds"] = json!(b);
    }
    Ok(response::json_value(200, &doc))
}

/// The tile's bounds in Web Mercator metres: (left, bottom, right, top).
pub fn mercator_bounds(z: u32, x: u32, y: u32) -> (f64, f64, f64, f64) {
    let size = 2.0 * HALF / f64::from(1u32 << z.min(31));
    let left = -HALF + f64::from(x) * size;
    let top = HALF - f64::from(y) * size;
    (left, top - size, left + size, top)
}

/// Web Mercator metres to degrees; the world's edge rounds to just past 180°, so longitude is
/// clamped to the range a query geometry may have.
fn to_lon_lat(x: f64, y: f64) -> (f64, f64) {
    const R: f64 = 6_378_137.0;
    let lon = (x / R).to_degrees().clamp(-180.0, 180.0);
    let lat = (2.0 * (y / R).exp().atan() - std::f64::consts::FRAC_PI_2).to_degrees();
    (lon, lat)
}

fn to_mercator(c: Coord<f64>) -> Coord<f64> {
    const R: f64 = 6_378_137.0;
    let lat = c.y.clamp(-85.051_128_78, 85.051_128_78).to_radians();
    Coord {
        x: c.x.to_radians() * R,
        y: (std::f64::consts::FRAC_PI_4 + lat / 2.0).tan().ln() * R,
    }
}

async fn tile(
    app: &Arc<App>,
    ctx: &Ctx,
    id: &str,
    z: u32,
    x: u32,
    y: u32,
) -> Result<Bytes, ApiError> {
    let (d, layer_id) = ogc::find(app, ctx, id)?;
    let (left, bottom, right, top) = mercator_bounds(z, x, y);
    let unit = (right - left) / f64::from(EXTENT);
    let pad = BUFFER * unit;
    let clip = (left - pad, bottom - pad, right + pad, top + pad);
    let (west, south) = to_lon_lat(clip.0.max(-HALF), clip.1.max(-HALF));
    let (east, north) = to_lon_lat(clip.2.min(HALF), clip.3.min(HALF));
    let limit = app.features.settings().max_record_count.max(1);
    let name = ogc::collection_id(
        &d,
        d.layers.iter().find(|l| l.id == layer_id).ok_or_else(|| {
            ApiError::new(
                ErrorCode::ExtensionNotFound,
                format!("Collection {id} not found"),
            )
        })?,
    );
    let time_limit = app.query_limit();
    let area = [
        [west, south],
        [east, south],
        [east, north],
        [west, north],
        [west, south],
    ];
    let tile = Frame {
        bounds: (left, bottom, right, top),
        clip,
        unit,
        band: band_of(z),
        deadline: time_limit,
    };
    if super::spread::cluster_of(app).is_some() {
        // A node with some shards only: the query is routed, its answer read back.
        let body = json!({
            "params": {"id": d.name, "layer": layer_id, "method": "query"},
            "query": {
                "outFields": "*",
                "returnGeometry": true,
                "resultRecordCount": limit,
                "extension": {"geometry": {"type": "Polygon", "coordinates": [area]}},
            },
        });
        let answer = ogc::run_bytes(app, ctx, body, true).await?;
        let encoded = crate::cpu::run_cpu_intensive(move || {
            let features = match serde_json::from_slice::<Answer<'_>>(&answer) {
                Ok(a) => a.features,
                Err(_) => Vec::new(),
            };
            encode(&name, &features, tile.bounds, tile.clip, tile.unit)
        })
        .await
        .ok_or_else(|| ApiError::new(ErrorCode::Internal, "the tile failed"))?;
        return Ok(Bytes::from(encoded));
    }
    let request = FeatureRequest {
        service: d.name.clone(),
        layer: Some(layer_id),
        layer_text: Some(layer_id.to_string()),
        method: Some("query".into()),
        query: QuerySpec {
            return_geometry: true,
            limit: Some(limit),
            spread: true,
            geometry: Some((
                Arc::new(Query::new(Geometry::Polygon(Polygon::new(
                    LineString::from(area.iter().map(|p| (p[0], p[1])).collect::<Vec<_>>()),
                    vec![],
                )))),
                Relation::Intersects,
            )),
            ..QuerySpec::default()
        },
    };
    let (features, caller, app2) = (app.features.clone(), ctx.caller.clone(), app.clone());
    let encoded = crate::cpu::run_cpu_intensive(move || {
        let page = features.tile_page(&caller, &request, time_limit)?;
        encode_page(&name, &page, &tile, &app2.simplified)
    })
    .await
    .ok_or_else(|| ApiError::new(ErrorCode::Internal, "the tile failed"))??;
    Ok(Bytes::from(encoded))
}

/// Where a tile is and what bounds its work.
#[derive(Clone, Copy)]
struct Frame {
    /// (left, bottom, right, top) in Web Mercator metres.
    bounds: (f64, f64, f64, f64),
    /// The bounds with the buffer.
    clip: (f64, f64, f64, f64),
    /// A tile unit, in metres.
    unit: f64,
    /// The zoom band whose simplified geometries the tile may draw from.
    band: Option<u8>,
    deadline: Option<(std::time::Instant, u64)>,
}

/// Zoom bands of four zooms each (0-3, 4-7, 8-11); past them, a tile draws each geometry as
/// it is (clipped to the tile, it is small).
const BANDS: u32 = 3;

fn band_of(z: u32) -> Option<u8> {
    (z < 4 * BANDS).then_some((z / 4) as u8)
}

/// The simplification of a band: half a tile unit of its finest zoom, so that every zoom of
/// the band draws at least the detail it would have drawn from the full geometry.
fn band_epsilon(band: u8) -> f64 {
    let z = 4 * u32::from(band) + 3;
    2.0 * HALF / f64::from(1u32 << z) / f64::from(EXTENT) / 2.0
}

/// Simplified geometries for the low zooms, in Web Mercator: made once per shape and zoom
/// band on first use, kept within a budget of bytes (past it, all are dropped and made
/// again as tiles ask). A shape is known by its address and a weak reference, so a shape
/// that was replaced or deleted is never served, and is not kept alive by the cache.
pub struct Simplified {
    budget: usize,
    inner: parking_lot::Mutex<SimplifiedInner>,
}

/// A shape, weakly, and its simplified copy.
type Kept = (std::sync::Weak<Shape>, Arc<Geometry<f64>>);

#[derive(Default)]
struct SimplifiedInner {
    by_shape: crate::FastMap<(usize, u8), Kept>,
    bytes: usize,
}

impl Simplified {
    pub fn new(budget: usize) -> Simplified {
        Simplified {
            budget,
            inner: Default::default(),
        }
    }

    /// `shape` in Web Mercator, simplified for `band`.
    fn get(&self, shape: &Arc<Shape>, band: u8) -> Arc<Geometry<f64>> {
        let key = (Arc::as_ptr(shape) as usize, band);
        if let Some((weak, g)) = self.inner.lock().by_shape.get(&key)
            && weak.upgrade().is_some_and(|s| Arc::ptr_eq(&s, shape))
        {
            return g.clone();
        }
        let g = Arc::new(simplify(
            shape.geometry.map_coords(to_mercator),
            band_epsilon(band),
        ));
        let bytes = 64 + 16 * geo::CoordsIter::coords_count(g.as_ref());
        if bytes <= self.budget {
            let mut inner = self.inner.lock();
            if inner.bytes + bytes > self.budget {
                inner.by_shape.clear();
                inner.bytes = 0;
            }
            inner.bytes += bytes;
            if let Some((_, old)) = inner
                .by_shape
                .insert(key, (Arc::downgrade(shape), g.clone()))
            {
                inner.bytes -= 64 + 16 * geo::CoordsIter::coords_count(old.as_ref());
            }
        }
        g
    }
}

/// Encode a typed page as one MVT layer named `name`; its geometries come from the zoom
/// band's simplified ones where the tile has a band. Stops at the deadline.
fn encode_page(
    name: &str,
    page: &TilePage,
    tile: &Frame,
    simplified: &Simplified,
) -> Result<Vec<u8>, ApiError> {
    let mut items = Vec::with_capacity(page.features.len());
    for (i, f) in page.features.iter().enumerate() {
        // The clock is read before each shape (one may take long to simplify) and every 64
        // points.
        let costly = matches!(f.geometry, TileGeometry::Indexed(Indexed::Shape(_)));
        if (costly || i % 64 == 0)
            && let Some((deadline, ms)) = tile.deadline
            && std::time::Instant::now() >= deadline
        {
            return Err(crate::features::FeatureError::TimeLimit(ms).into());
        }
        let mercator = match &f.geometry {
            TileGeometry::Point(x, y) => {
                Geometry::Point(to_mercator(Coord { x: *x, y: *y }).into())
            }
            TileGeometry::Indexed(Indexed::Points(points)) => Geometry::MultiPoint(
                points
                    .iter()
                    .map(|[x, y]| geo::Point::from(to_mercator(Coord { x: *x, y: *y })))
                    .collect(),
            ),
            TileGeometry::Indexed(Indexed::Shape(shape)) => match tile.band {
                Some(band) => simplified.get(shape, band).as_ref().clone(),
                None => shape.geometry.map_coords(to_mercator),
            },
        };
        let props: Vec<(&str, TileValue)> = page
            .columns
            .iter()
            .zip(&f.attrs)
            .filter_map(|(k, v)| {
                let value = match v.as_ref()? {
                    Attr::Text(s) => TileValue::Str(s.clone()),
                    Attr::Bool(b) => TileValue::Bool(*b),
                    Attr::Int(i) => TileValue::Sint(*i),
                    Attr::Float(x) => TileValue::Double(*x),
                };
                Some((k.as_str(), value))
            })
            .collect();
        items.push((u64::try_from(f.id).ok(), props, mercator));
    }
    Ok(encode_items(name, items, tile.bounds, tile.clip, tile.unit))
}

/// The features of a geoQueryService answer, read without building a tree of the whole:
/// property names and strings borrowed, the geometry left as its JSON text.
#[derive(serde::Deserialize)]
pub struct Answer<'a> {
    #[serde(borrow, default)]
    pub features: Vec<AnswerFeature<'a>>,
}

#[derive(serde::Deserialize)]
pub struct AnswerFeature<'a> {
    #[serde(default)]
    pub id: Option<u64>,
    #[serde(borrow, default, deserialize_with = "entries")]
    pub properties: Vec<(std::borrow::Cow<'a, str>, Property<'a>)>,
    #[serde(borrow)]
    pub geometry: Option<&'a serde_json::value::RawValue>,
}

/// A geometry's JSON: a point read straight into its two numbers (most tiles are points),
/// anything else through the service's GeoJSON reader.
fn read_geometry(text: &str) -> Option<Geometry<f64>> {
    #[derive(serde::Deserialize)]
    struct Point<'a> {
        #[serde(rename = "type", borrow)]
        kind: &'a str,
        coordinates: (f64, f64),
    }
    if let Ok(p) = serde_json::from_str::<Point<'_>>(text)
        && p.kind == "Point"
    {
        return crate::spatial::geometry::point(p.coordinates.0, p.coordinates.1);
    }
    let v: Value = serde_json::from_str(text).ok()?;
    crate::spatial::parse_geojson(&v).ok()
}

/// A JSON object's members in order, as pairs.
fn entries<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Vec<(std::borrow::Cow<'de, str>, Property<'de>)>, D::Error> {
    struct Pairs;
    impl<'de> serde::de::Visitor<'de> for Pairs {
        type Value = Vec<(std::borrow::Cow<'de, str>, Property<'de>)>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }
        fn visit_map<M: serde::de::MapAccess<'de>>(
            self,
            mut m: M,
        ) -> Result<Self::Value, M::Error> {
            let mut out = Vec::new();
            while let Some(entry) = m.next_entry()? {
                out.push(entry);
            }
            Ok(out)
        }
    }
    d.deserialize_any(Pairs)
}

/// A property value as a tile can hold it.
#[derive(serde::Deserialize)]
#[serde(untagged)]
pub enum Property<'a> {
    Int(i64),
    Float(f64),
    Bool(bool),
    #[serde(borrow)]
    Text(std::borrow::Cow<'a, str>),
    Other(serde::de::IgnoredAny),
}

/// Encode answered features as one MVT layer named `name`.
pub fn encode(
    name: &str,
    features: &[AnswerFeature<'_>],
    bounds: (f64, f64, f64, f64),
    clip: (f64, f64, f64, f64),
    unit: f64,
) -> Vec<u8> {
    let items = features
        .iter()
        .filter_map(|f| {
            let g = read_geometry(f.geometry?.get())?;
            let props: Vec<(&str, TileValue)> = f
                .properties
                .iter()
                .filter_map(|(k, v)| {
                    let value = match v {
                        Property::Text(s) => TileValue::Str(s.to_string()),
                        Property::Bool(b) => TileValue::Bool(*b),
                        Property::Int(i) => TileValue::Sint(*i),
                        Property::Float(x) => TileValue::Double(*x),
                        Property::Other(_) => return None,
                    };
                    Some((k.as_ref(), value))
                })
                .collect();
            Some((f.id, props, g.map_coords(to_mercator)))
        })
        .collect();
    encode_items(name, items, bounds, clip, unit)
}

/// A feature to encode: its id, properties, and geometry in Web Mercator.
type Item<'a> = (Option<u64>, Vec<(&'a str, TileValue)>, Geometry<f64>);

/// Encode features (id, properties, geometry in Web Mercator) as one MVT layer: each
/// geometry simplified for the zoom, clipped to the buffer, wound as MVT wants and rid of
/// what collapses in whole tile units.
fn encode_items(
    name: &str,
    items: Vec<Item<'_>>,
    (left, bottom, right, top): (f64, f64, f64, f64),
    clip: (f64, f64, f64, f64),
    unit: f64,
) -> Vec<u8> {
    let mut tags = TagsBuilder::new();
    let mut out = Vec::with_capacity(items.len());
    for (id, props, projected) in items {
        let Some(clipped) = clip_geometry(simplify(projected, unit / 2.0), clip) else {
            continue;
        };
        // MVT tells shells from holes by winding: shells counter-clockwise here (y up), which
        // is the spec's clockwise in tile coordinates (y down). Sources wind either way.
        let clipped = match clipped {
            Geometry::Polygon(p) => Geometry::Polygon(p.orient(Direction::Default)),
            Geometry::MultiPolygon(m) => Geometry::MultiPolygon(m.orient(Direction::Default)),
            other => other,
        };
        let Some(clipped) = without_collapsed(clipped, left, top, unit) else {
            continue;
        };
        let Ok(mut feature) = clipped.to_mvt(EXTENT, left, bottom, right, top) else {
            continue;
        };
        feature.id = id;
        for (k, value) in props {
            let (ki, vi) = tags.insert_ref(k, value);
            feature.tags.push(ki);
            feature.tags.push(vi);
        }
        out.push(feature);
    }
    let (keys, values) = tags.into_tags();
    let layer = Layer {
        version: 2,
        name: name.to_string(),
        features: out,
        keys,
        values: values.into_iter().map(tile::Value::from).collect(),
        extent: Some(EXTENT),
    };
    Tile {
        layers: vec![layer],
    }
    .encode_to_vec()
}

/// The geometry without the rings and lines that collapse in whole tile units (fewer than
/// three distinct positions, or no area, for a ring; fewer than two for a line), which
/// decoders refuse; `None` when nothing is left.
fn without_collapsed(g: Geometry<f64>, left: f64, top: f64, unit: f64) -> Option<Geometry<f64>> {
    let cells = |l: &LineString<f64>| -> Vec<(i64, i64)> {
        let mut v: Vec<(i64, i64)> =
            l.0.iter()
                .map(|c| {
                    (
                        ((c.x - left) / unit).round() as i64,
                        ((top - c.y) / unit).round() as i64,
                    )
                })
                .collect();
        v.dedup();
        v
    };
    let ring_ok = |r: &LineString<f64>| {
        let v = cells(r);
        let area: i64 = v
            .windows(2)
            .map(|w| w[0].0 * w[1].1 - w[1].0 * w[0].1)
            .sum();
        v.len() >= 4 && area != 0
    };
    let polygon = |p: Polygon<f64>| -> Option<Polygon<f64>> {
        if !ring_ok(p.exterior()) {
            return None;
        }
        let (shell, holes) = p.into_inner();
        Some(Polygon::new(
            shell,
            holes.into_iter().filter(|h| ring_ok(h)).collect(),
        ))
    };
    match g {
        Geometry::Polygon(p) => polygon(p).map(Geometry::Polygon),
        Geometry::MultiPolygon(m) => {
            let kept: Vec<_> = m.0.into_iter().filter_map(polygon).collect();
            (!kept.is_empty()).then_some(Geometry::MultiPolygon(MultiPolygon(kept)))
        }
        Geometry::LineString(l) => (cells(&l).len() >= 2).then_some(Geometry::LineString(l)),
        Geometry::MultiLineString(m) => {
            let kept: Vec<_> = m.0.into_iter().filter(|l| cells(l).len() >= 2).collect();
            (!kept.is_empty()).then_some(Geometry::MultiLineString(MultiLineString(kept)))
        }
        other => Some(other),
    }
}

fn simplify(g: Geometry<f64>, epsilon: f64) -> Geometry<f64> {
    match g {
        Geometry::LineString(l) => Geometry::LineString(l.simplify(epsilon)),
        Geometry::MultiLineString(m) => Geometry::MultiLineString(m.simplify(epsilon)),
        Geometry::Polygon(p) => Geometry::Polygon(p.simplify(epsilon)),
        Geometry::MultiPolygon(m) => Geometry::MultiPolygon(m.simplify(epsilon)),
        other => other,
    }
}

/// The part of a geometry inside `(xmin, ymin, xmax, ymax)`: points kept when inside, lines
/// cut at the box, rings clipped to it (Sutherland-Hodgman); `None` when nothing is left.
pub fn clip_geometry(g: Geometry<f64>, b: (f64, f64, f64, f64)) -> Option<Geometry<f64>> {
    let inside = |c: &Coord<f64>| c.x >= b.0 && c.x <= b.2 && c.y >= b.1 && c.y <= b.3;
    match g {
        Geometry::Point(p) => inside(&p.0).then_some(Geometry::Point(p)),
        Geometry::MultiPoint(m) => {
            let kept: Vec<_> = m.0.into_iter().filter(|p| inside(&p.0)).collect();
            (!kept.is_empty()).then(|| Geometry::MultiPoint(kept.into()))
        }
        Geometry::LineString(l) => lines(vec![l], b),
        Geometry::MultiLineString(m) => lines(m.0, b),
        Geometry::Polygon(p) => polygons(vec![p], b),
        Geometry::MultiPolygon(m) => polygons(m.0, b),
        _ => None,
    }
}

fn lines(ls: Vec<LineString<f64>>, b: (f64, f64, f64, f64)) -> Option<Geometry<f64>> {
    let mut out: Vec<LineString<f64>> = Vec::new();
    for l in ls {
        let mut current: Vec<Coord<f64>> = Vec::new();
        for w in l.0.windows(2) {
            match crate::spatial::predicate::clip_segment(w[0], w[1], &[b.0, b.1, b.2, b.3]) {
                Some((a, c)) => {
                    if current.last() != Some(&a) {
                        if current.len() >= 2 {
                            out.push(LineString::new(std::mem::take(&mut current)));
                        }
                        current.clear();
                        current.push(a);
                    }
                    current.push(c);
                }
                None => {
                    if current.len() >= 2 {
                        out.push(LineString::new(std::mem::take(&mut current)));
                    }
                    current.clear();
                }
            }
        }
        if current.len() >= 2 {
            out.push(LineString::new(current));
        }
    }
    match out.len() {
        0 => None,
        1 => out.pop().map(Geometry::LineString),
        _ => Some(Geometry::MultiLineString(MultiLineString(out))),
    }
}

fn polygons(ps: Vec<Polygon<f64>>, b: (f64, f64, f64, f64)) -> Option<Geometry<f64>> {
    let mut out = Vec::new();
    for p in ps {
        let (exterior, interiors) = p.into_inner();
        let Some(shell) = clip_ring(exterior, b) else {
            continue;
        };
        let holes: Vec<_> = interiors
            .into_iter()
            .filter_map(|r| clip_ring(r, b))
            .collect();
        out.push(Polygon::new(shell, holes));
    }
    match out.len() {
        0 => None,
        1 => out.pop().map(Geometry::Polygon),
        _ => Some(Geometry::MultiPolygon(MultiPolygon(out))),
    }
}

/// Sutherland-Hodgman clipping of a ring against the box, edge by edge.
fn clip_ring(ring: LineString<f64>, b: (f64, f64, f64, f64)) -> Option<LineString<f64>> {
    let mut pts: Vec<Coord<f64>> = ring.0;
    if pts.first() == pts.last() {
        pts.pop();
    }
    type Edge = (
        fn(&Coord<f64>, f64) -> bool,
        fn(Coord<f64>, Coord<f64>, f64) -> Coord<f64>,
        f64,
    );
    let at_x = |p: Coord<f64>, q: Coord<f64>, x: f64| Coord {
        x,
        y: p.y + (q.y - p.y) * (x - p.x) / (q.x - p.x),
    };
    let at_y = |p: Coord<f64>, q: Coord<f64>, y: f64| Coord {
        x: p.x + (q.x - p.x) * (y - p.y) / (q.y - p.y),
        y,
    };
    let edges: [Edge; 4] = [
        (|c, v| c.x >= v, at_x, b.0),
        (|c, v| c.x <= v, at_x, b.2),
        (|c, v| c.y >= v, at_y, b.1),
        (|c, v| c.y <= v, at_y, b.3),
    ];
    for (keep, cross, v) in edges {
        if pts.is_empty() {
            return None;
        }
        let mut next = Vec::with_capacity(pts.len() + 4);
        for i in 0..pts.len() {
            let cur = pts[i];
            let prev = pts[(i + pts.len() - 1) % pts.len()];
            match (keep(&cur, v), keep(&prev, v)) {
                (true, true) => next.push(cur),
                (true, false) => {
                    next.push(cross(prev, cur, v));
                    next.push(cur);
                }
                (false, true) => next.push(cross(prev, cur, v)),
                (false, false) => {}
            }
        }
        pts = next;
    }
    if pts.len() < 3 {
        return None;
    }
    pts.push(pts[0]);
    Some(LineString::new(pts))
}
