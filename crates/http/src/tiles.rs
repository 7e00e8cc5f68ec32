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
use geo::{Geometry, LineString, Polygon};
use hyper::header::{
    ACCEPT_ENCODING, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_TYPE, ETAG, HeaderValue,
    IF_NONE_MATCH, VARY,
};
use serde_json::{Value, json};

use super::ogc;
use super::response::{self, Resp};
use super::{App, Ctx, require_any};
use crate::acl::Role;
use crate::error::{ApiError, ErrorCode};
use crate::features::FeatureRequest;
use crate::features::mvt::{Answer, Frame, encode, encode_page};
use crate::features::query::QuerySpec;
use crate::features::tile_cache::{Tile, TileKey, tile_box};
use crate::spatial::tile::{BUFFER, EXTENT, MAX_ZOOM, band_of, mercator_bounds};
use crate::spatial::{Query, Relation};

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
            let made = tile(app, ctx, id, z, x, y).await?;
            let h = |name| ctx.headers.get(name).and_then(|v| v.to_str().ok());
            // Gzipped when the client takes it and the tile is worth it; the tag then names
            // that representation.
            let gzip = made.bytes.len() >= GZIP_FROM
                && h(ACCEPT_ENCODING).is_some_and(super::map::accepts_gzip);
            let tag = if gzip {
                format!("{}-gz\"", made.etag.trim_end_matches('"'))
            } else {
                made.etag.to_string()
            };
            let fresh = h(IF_NONE_MATCH)
                .is_some_and(|m| m.split(',').any(|t| t.trim() == tag || t.trim() == "*"));
            let mut r = if fresh {
                response::empty(304)
            } else {
                let body = if gzip {
                    gzipped(&made).await
                } else {
                    made.bytes.clone()
                };
                let mut r = response::json_bytes(200, body);
                r.headers_mut().insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static("application/vnd.mapbox-vector-tile"),
                );
                if gzip {
                    r.headers_mut()
                        .insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
                }
                r
            };
            let headers = r.headers_mut();
            if let Ok(v) = HeaderValue::from_str(&tag) {
                headers.insert(ETAG, v);
            }
            // Private: a tile holds what its caller may read, so no shared cache may keep it
            // for another. Revalidated each time, which the tag makes a 304 until a write
            // changes the tile.
            headers.insert(CACHE_CONTROL, HeaderValue::from_static("private, no-cache"));
            headers.insert(
                VARY,
                HeaderValue::from_static("Authorization, Accept-Encoding"),
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
    let bounds = match super::spread_extents(app, ctx, &d.name).await? {
        Some(extents) => extents.get(&layer.id).copied(),
        None => app.features.queries().layer_extent(layer, &ctx.caller),
    };
    if let Some(b) = bounds {
        doc["bounds"] = json!(b);
    }
    Ok(response::json_value(200, &doc))
}

/// Tiles smaller than this go as they are: gzip would save little.
const GZIP_FROM: usize = 1024;

/// A tile's bytes gzipped (fast, level 1), made once per tile and kept with it.
async fn gzipped(t: &Tile) -> Bytes {
    if let Some(gz) = t.gzip.get() {
        return gz.clone();
    }
    let (raw, slot) = (t.bytes.clone(), t.gzip.clone());
    crate::cpu::run_cpu_intensive(move || {
        use std::io::Write;
        let mut z = flate2::write::GzEncoder::new(
            Vec::with_capacity(raw.len() / 3),
            flate2::Compression::fast(),
        );
        let gz = z.write_all(&raw).and_then(|()| z.finish());
        match gz {
            Ok(gz) => slot.get_or_init(|| Bytes::from(gz)).clone(),
            Err(_) => raw,
        }
    })
    .await
    .unwrap_or_else(|| t.bytes.clone())
}

/// A tile: kept from before when no write has met it since, else made (and kept).
async fn tile(
    app: &Arc<App>,
    ctx: &Ctx,
    id: &str,
    z: u32,
    x: u32,
    y: u32,
) -> Result<Tile, ApiError> {
    let (d, layer_id) = ogc::find(app, ctx, id)?;
    let cache = app.features.tiles();
    // A node holding some shards only asks others, whose writes it does not see.
    let view = app
        .features
        .view_of(&d.name, layer_id)
        .filter(|_| cache.enabled() && app.spread().is_none());
    let Some(view) = view else {
        return make(app, ctx, &d, layer_id, id, z, x, y)
            .await
            .map(Tile::new);
    };
    let key = TileKey {
        collection: Arc::from(id),
        generation: app.features.generation(),
        readers: TileKey::readers_of(ctx.caller.roles()),
        z,
        x,
        y,
    };
    if let Some(t) = cache.get(&key) {
        crate::metrics::record(|m| m.tiles.with_label_values(&["cache"]).inc());
        return Ok(t);
    }
    crate::metrics::record(|m| m.tiles.with_label_values(&["made"]).inc());
    let making = cache.making();
    let t = Tile::new(make(app, ctx, &d, layer_id, id, z, x, y).await?);
    cache.put(key, view, making, t.clone());
    Ok(t)
}

#[allow(clippy::too_many_arguments)]
async fn make(
    app: &Arc<App>,
    ctx: &Ctx,
    d: &crate::features::descriptor::Descriptor,
    layer_id: i64,
    id: &str,
    z: u32,
    x: u32,
    y: u32,
) -> Result<Bytes, ApiError> {
    let (left, bottom, right, top) = mercator_bounds(z, x, y);
    let unit = (right - left) / f64::from(EXTENT);
    let pad = BUFFER * unit;
    let clip = (left - pad, bottom - pad, right + pad, top + pad);
    // The box the query covers is the one a write is checked against to drop kept tiles.
    let [west, south, east, north] = tile_box(z, x, y);
    let limit = app.features.settings().max_record_count.max(1);
    let name = ogc::collection_id(
        d,
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
    if app.spread().is_some() {
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
        let page = features
            .queries()
            .tile_page(&caller, &request, time_limit)?;
        Ok::<_, ApiError>(encode_page(&name, &page, &tile, &app2.simplified)?)
    })
    .await
    .ok_or_else(|| ApiError::new(ErrorCode::Internal, "the tile failed"))??;
    Ok(Bytes::from(encoded))
}
