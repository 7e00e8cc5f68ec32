//! Mapbox vector tiles: a page of features, or the features of an answer's JSON, as one MVT
//! layer, with the low zooms drawn from simplified geometries kept within a budget.

use std::sync::Arc;

use geo::orient::{Direction, Orient};
use geo::{Coord, Geometry, MapCoords};
use geozero::ToMvt;
use geozero::mvt::tile::{self, Layer};
use geozero::mvt::{Message, TagsBuilder, Tile, TileValue};
use serde_json::Value;

use crate::FeatureError;
use crate::query::{Attr, TileGeometry, TilePage};
use crate::spatial::Shape;
use crate::spatial::engine::Indexed;
use crate::spatial::tile::{
    EXTENT, band_epsilon, clip_geometry, simplify, to_mercator, without_collapsed,
};

/// Where a tile is and what bounds its work.
#[derive(Clone, Copy)]
pub struct Frame {
    /// (left, bottom, right, top) in Web Mercator metres.
    pub bounds: (f64, f64, f64, f64),
    /// The bounds with the buffer.
    pub clip: (f64, f64, f64, f64),
    /// A tile unit, in metres.
    pub unit: f64,
    /// The zoom band whose simplified geometries the tile may draw from.
    pub band: Option<u8>,
    pub deadline: Option<(std::time::Instant, u64)>,
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
    pub fn get(&self, shape: &Arc<Shape>, band: u8) -> Arc<Geometry<f64>> {
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
pub fn encode_page(
    name: &str,
    page: &TilePage,
    tile: &Frame,
    simplified: &Simplified,
) -> Result<Vec<u8>, FeatureError> {
    let mut items = Vec::with_capacity(page.features.len());
    for (i, f) in page.features.iter().enumerate() {
        // The clock is read before each shape (one may take long to simplify) and every 64
        // points.
        let costly = matches!(f.geometry, TileGeometry::Indexed(Indexed::Shape(_)));
        if (costly || i % 64 == 0)
            && let Some((deadline, ms)) = tile.deadline
            && std::time::Instant::now() >= deadline
        {
            return Err(FeatureError::TimeLimit(ms));
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
pub type Item<'a> = (Option<u64>, Vec<(&'a str, TileValue)>, Geometry<f64>);

/// Encode features (id, properties, geometry in Web Mercator) as one MVT layer: each
/// geometry simplified for the zoom, clipped to the buffer, wound as MVT wants and rid of
/// what collapses in whole tile units.
pub fn encode_items(
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
        // MVT tells shells from holes by winding: a shell has a positive area in tile
        // coordinates (y down), so it is clockwise here (y up), and a hole the other way.
        // Sources wind either way; strict readers (QGIS) drop a shell wound as a hole.
        let clipped = match clipped {
            Geometry::Polygon(p) => Geometry::Polygon(p.orient(Direction::Reversed)),
            Geometry::MultiPolygon(m) => Geometry::MultiPolygon(m.orient(Direction::Reversed)),
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

#[cfg(test)]
mod tests {
    use super::*;
    use geo::{LineString, Polygon};

    /// The rings of an MVT polygon's commands, in tile coordinates.
    fn rings(commands: &[u32]) -> Vec<Vec<(i64, i64)>> {
        let zigzag = |n: u32| i64::from((n >> 1) as i32 ^ -((n & 1) as i32));
        let (mut x, mut y, mut i) = (0i64, 0i64, 0usize);
        let (mut out, mut ring) = (Vec::new(), Vec::new());
        while i < commands.len() {
            let (id, count) = (commands[i] & 7, commands[i] >> 3);
            i += 1;
            if id == 7 {
                out.push(std::mem::take(&mut ring));
                continue;
            }
            for _ in 0..count {
                x += zigzag(commands[i]);
                y += zigzag(commands[i + 1]);
                i += 2;
                ring.push((x, y));
            }
        }
        out
    }

    /// The surveyor's formula, as the MVT specification applies it.
    fn area(ring: &[(i64, i64)]) -> i64 {
        let n = ring.len();
        (0..n)
            .map(|k| {
                let (a, b) = (ring[k], ring[(k + 1) % n]);
                a.0 * b.1 - b.0 * a.1
            })
            .sum()
    }

    #[test]
    fn shells_have_a_positive_area_in_tile_coordinates_and_holes_a_negative_one() {
        // A square with a square hole, both wound the wrong way round for MVT, in the middle of
        // the zoom-0 tile.
        let square = |h: f64| LineString::from(vec![(-h, -h), (-h, h), (h, h), (h, -h), (-h, -h)]);
        let polygon = Polygon::new(square(5.0e6), vec![square(1.0e6)]);
        let half = crate::spatial::tile::HALF;
        let unit = 2.0 * half / f64::from(EXTENT);
        let bytes = encode_items(
            "t",
            vec![(Some(1), Vec::new(), Geometry::Polygon(polygon))],
            (-half, -half, half, half),
            (-half, -half, half, half),
            unit,
        );
        let tile = Tile::decode(&bytes[..]).unwrap();
        let feature = &tile.layers[0].features[0];
        let got = rings(&feature.geometry);
        assert_eq!(got.len(), 2);
        assert!(area(&got[0]) > 0, "the shell: {:?}", got[0]);
        assert!(area(&got[1]) < 0, "the hole: {:?}", got[1]);
    }
}
