//! The map page's base layer: the world's countries (Natural Earth 1:50m, public domain,
//! bundled in `examples/data` and embedded in the binary) as vector tiles at
//! `GET /map/base/{z}/{x}/{y}.mvt`, so the map has land under its layers with no network.
//! The countries are read and projected once; each tile is drawn as a layer's are
//! (simplified for the zoom, clipped to its buffer) and kept, since the countries never change.

use std::sync::{Arc, OnceLock};

use geo::{BoundingRect, Geometry, MapCoords};
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, ETAG, HeaderValue, IF_NONE_MATCH};
use serde_json::Value;

use super::Ctx;
use super::response::{self, Resp};
use crate::error::{ApiError, ErrorCode};
use crate::features::mvt::encode_items;
use crate::features::tile_cache::{BBox, Tile, TileCache, TileKey, tile_box};
use crate::spatial::tile::{BUFFER, EXTENT, MAX_ZOOM, mercator_bounds, to_mercator};

static COUNTRIES: &str = include_str!("../../../examples/data/real/world-countries-50m.geojson");

/// The MVT layer's name.
pub const LAYER: &str = "countries";

/// A country: its name, its geometry in Web Mercator and its box in degrees.
struct Country {
    name: String,
    mercator: Geometry<f64>,
    bbox: BBox,
}

fn countries() -> &'static [Country] {
    static ALL: OnceLock<Vec<Country>> = OnceLock::new();
    ALL.get_or_init(|| {
        let fc: Value = serde_json::from_str(COUNTRIES).unwrap_or(Value::Null);
        let options = crate::spatial::geometry::ParseOptions { close_rings: true };
        fc["features"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(|f| {
                let g =
                    crate::spatial::geometry::parse_geojson_with(&f["geometry"], options).ok()?;
                let g = unwrapped(g);
                let r = g.bounding_rect()?;
                Some(Country {
                    name: f["properties"]["name"].as_str().unwrap_or("").to_string(),
                    mercator: g.map_coords(to_mercator),
                    bbox: [r.min().x, r.min().y, r.max().x, r.max().y],
                })
            })
            .collect()
    })
}

/// A country whose rings cross the antimeridian (Russia, Fiji) as polygons drawn twice: east
/// of it (western longitudes + 360°) and west of it (eastern ones − 360°), each clipped by the
/// tiles, so no edge spans the world.
fn unwrapped(g: Geometry<f64>) -> Geometry<f64> {
    use geo::{Coord, MultiPolygon, Polygon};
    let polygons = match g {
        Geometry::Polygon(p) => vec![p],
        Geometry::MultiPolygon(m) => m.0,
        other => return other,
    };
    let crosses = |p: &Polygon<f64>| {
        std::iter::once(p.exterior())
            .chain(p.interiors())
            .any(|r| r.lines().any(|l| (l.end.x - l.start.x).abs() > 180.0))
    };
    let shifted =
        |p: &Polygon<f64>, f: fn(f64) -> f64| p.map_coords(|c| Coord { x: f(c.x), y: c.y });
    let mut out = Vec::with_capacity(polygons.len());
    for p in polygons {
        if crosses(&p) {
            out.push(shifted(&p, |x| if x < 0.0 { x + 360.0 } else { x }));
            out.push(shifted(&p, |x| if x > 0.0 { x - 360.0 } else { x }));
        } else {
            out.push(p);
        }
    }
    Geometry::MultiPolygon(MultiPolygon(out))
}

/// Base tiles drawn so far (at most 16 MiB; nothing ever invalidates them).
fn kept() -> &'static TileCache {
    static KEPT: OnceLock<TileCache> = OnceLock::new();
    KEPT.get_or_init(|| TileCache::new(16 << 20))
}

/// The tile z/x/y of the countries, drawn on first use.
pub fn tile(z: u32, x: u32, y: u32) -> Tile {
    let key = TileKey {
        collection: Arc::from(LAYER),
        generation: 0,
        readers: 0,
        z,
        x,
        y,
    };
    if let Some(t) = kept().get(&key) {
        return t;
    }
    let making = kept().making();
    let (left, bottom, right, top) = mercator_bounds(z, x, y);
    let unit = (right - left) / f64::from(EXTENT);
    let pad = BUFFER * unit;
    let clip = (left - pad, bottom - pad, right + pad, top + pad);
    let area = tile_box(z, x, y);
    let items = countries()
        .iter()
        .filter(|c| {
            c.bbox[0] <= area[2]
                && area[0] <= c.bbox[2]
                && c.bbox[1] <= area[3]
                && area[1] <= c.bbox[3]
        })
        .map(|c| {
            (
                None,
                vec![("name", geozero::mvt::TileValue::Str(c.name.clone()))],
                c.mercator.clone(),
            )
        })
        .collect();
    let bytes = encode_items(LAYER, items, (left, bottom, right, top), clip, unit);
    let t = Tile::new(bytes::Bytes::from(bytes));
    kept().put(
        key,
        crate::features::template::ViewKey::new("", LAYER),
        making,
        t.clone(),
    );
    t
}

/// `GET /map/base/{z}/{x}/{y}.mvt`: `rest` is what follows `base/`.
pub(super) async fn get(ctx: &Ctx, rest: &str) -> Result<Resp, ApiError> {
    let bad = |m: String| ApiError::new(ErrorCode::InvalidParam, m);
    let parts: Vec<&str> = rest.split('/').collect();
    let [z, x, y] = parts.as_slice() else {
        return Err(ApiError::new(
            ErrorCode::UnknownEndpoint,
            format!("no endpoint at {}", ctx.path),
        ));
    };
    let y = y
        .strip_suffix(".mvt")
        .ok_or_else(|| bad(format!("{y}: a base tile ends in .mvt")))?;
    let n = |s: &str| {
        super::params::digits(s)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| bad(format!("{s:?} is not a tile number")))
    };
    let (z, x, y) = (n(z)?, n(x)?, n(y)?);
    if z > MAX_ZOOM || u64::from(x) >= 1u64 << z || u64::from(y) >= 1u64 << z {
        return Err(bad(format!("tile {z}/{x}/{y} does not exist")));
    }
    let t = crate::cpu::run_cpu_intensive(move || tile(z, x, y))
        .await
        .ok_or_else(|| ApiError::new(ErrorCode::Internal, "the base tile failed"))?;
    let fresh = ctx
        .headers
        .get(IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|m| m.split(',').any(|e| e.trim() == &*t.etag));
    let mut r = if fresh {
        response::empty(304)
    } else {
        response::with_body(200, "application/vnd.mapbox-vector-tile", t.bytes)
    };
    let h = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&t.etag) {
        h.insert(ETAG, v);
    }
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/vnd.mapbox-vector-tile"),
    );
    // Public data, the same for everyone, but behind the page's authentication: kept a day.
    h.insert(
        CACHE_CONTROL,
        HeaderValue::from_static("private, max-age=86400"),
    );
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use geozero::mvt::Message;

    fn names(t: &Tile) -> Vec<String> {
        let tile = geozero::mvt::Tile::decode(&t.bytes[..]).unwrap();
        let layer = &tile.layers[0];
        assert_eq!(layer.name, LAYER);
        let mut out: Vec<String> = layer
            .features
            .iter()
            .map(|f| {
                layer.values[f.tags[1] as usize]
                    .string_value
                    .clone()
                    .unwrap()
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn the_world_tile_holds_the_countries_and_a_close_tile_its_own() {
        let world = names(&tile(0, 0, 0));
        // Every country of the file with a box of some size: Natural Earth's 241 less the
        // specks that collapse at zoom 0.
        assert!(world.len() > 150, "{}", world.len());
        assert!(world.iter().any(|n| n == "United States of America"));
        // Zoom 8 over Denver: the United States alone.
        let (x, y) = (53, 97);
        assert_eq!(names(&tile(8, x, y)), ["United States of America"]);
        // The Strait of Gibraltar at zoom 7: Spain and Morocco (and Gibraltar).
        let got = names(&tile(7, 62, 50));
        assert!(
            got.contains(&"Spain".to_string()) && got.contains(&"Morocco".to_string()),
            "{got:?}"
        );
        // Kept: the same bytes again.
        assert_eq!(tile(8, x, y).etag, tile(8, x, y).etag);
    }
}
