//! OGC API – Features, Part 1 (Core, GeoJSON) under `/ogc`: the landing page, conformance,
//! collections (one a layer, `<service>.<layer id>`), a collection's items with `bbox`,
//! `limit`, `offset` (the `next` link), `datetime` on layers with a time field and property
//! filters `name=value`, and one item by its id.
//!
//! Items are geoQueryService queries run for the caller (same roles, same document
//! permissions, same engine); their answers are reshaped into the standard's documents.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::response::{self, Resp};
use super::{App, Ctx, require_any};
use crate::acl::Role;
use crate::error::{ApiError, ErrorCode};
use crate::features::descriptor::{Descriptor, Layer};
use crate::features::query::ItemsPage;
use crate::features::template::Kind;
use crate::features::{FeatureRequest, ViewState};
use crate::spatial::pip::BBox;

const CORE: &str = "http://www.opengis.net/spec/ogcapi-features-1/1.0/conf/core";
const GEOJSON: &str = "http://www.opengis.net/spec/ogcapi-features-1/1.0/conf/geojson";
const OAS30: &str = "http://www.opengis.net/spec/ogcapi-features-1/1.0/conf/oas30";
/// Part 3 (filtering) and the CQL2 classes its `filter` takes.
const FILTERING: [&str; 7] = [
    "http://www.opengis.net/spec/ogcapi-features-3/1.0/conf/queryables",
    "http://www.opengis.net/spec/ogcapi-features-3/1.0/conf/filter",
    "http://www.opengis.net/spec/ogcapi-features-3/1.0/conf/features-filter",
    "http://www.opengis.net/spec/cql2/1.0/conf/cql2-text",
    "http://www.opengis.net/spec/cql2/1.0/conf/cql2-json",
    "http://www.opengis.net/spec/cql2/1.0/conf/basic-cql2",
    "http://www.opengis.net/spec/cql2/1.0/conf/advanced-comparison-operators",
];
const QUERYABLES_REL: &str = "http://www.opengis.net/def/rel/ogc/1.0/queryables";
const CRS84: &str = "http://www.opengis.net/def/crs/OGC/1.3/CRS84";
/// Items a page when `limit` is not given, and the most a page may ask for.
const DEFAULT_LIMIT: usize = 10;
const MAX_LIMIT: usize = 10_000;

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidParam, message)
}

fn not_found(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::ExtensionNotFound, message)
}

/// A link object.
fn link(href: String, rel: &str, kind: &str, title: &str) -> Value {
    json!({"href": href, "rel": rel, "type": kind, "title": title})
}

/// The OGC API's root URL, for absolute links.
fn base(app: &App, ctx: &Ctx) -> String {
    format!("{}/ogc", origin(app, ctx))
}

/// Where clients reach this server, for absolute links: `public_url` when set, else
/// `http://` and the request's `Host` when it is a plain host and port (never anything else
/// a client put there), else `http://localhost`.
pub(super) fn origin(app: &App, ctx: &Ctx) -> String {
    if let Some(url) = &app.config.public_url {
        return url.clone();
    }
    let host = ctx
        .headers
        .get(hyper::header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| crate::config::authority_ok(h))
        .unwrap_or("localhost");
    format!("http://{host}")
}

pub(super) fn enc(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

/// `GET /ogc…`: `rest` is the path after `/ogc`.
pub(super) async fn get(app: &Arc<App>, ctx: &Ctx, rest: &str) -> Result<Resp, ApiError> {
    require_any(&ctx.caller, &[Role::GeoWriter, Role::Admin])?;
    let parts: Vec<&str> = rest
        .trim_matches('/')
        .split('/')
        .filter(|p| !p.is_empty())
        .collect();
    match parts.as_slice() {
        [] => landing(app, ctx),
        ["conformance"] => {
            let mut classes = vec![CORE, OAS30, GEOJSON];
            classes.extend(FILTERING);
            Ok(response::json_value(200, &json!({"conformsTo": classes})))
        }
        ["api"] => {
            let mut r = response::json_bytes(200, openapi_30().clone());
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(OAS30_TYPE),
            );
            Ok(r)
        }
        ["collections"] => collections(app, ctx).await,
        ["collections", id] => {
            let (d, layer) = find(app, ctx, id)?;
            let extents = super::spread_extents(app, ctx, &d.name).await?;
            Ok(response::json_value(
                200,
                &collection(app, ctx, &d, layer, extents.as_ref()),
            ))
        }
        ["collections", id, "items"] => items(app, ctx, id).await,
        ["collections", id, "queryables"] => queryables(app, ctx, id),
        ["collections", id, "items", fid] => item(app, ctx, id, fid).await,
        _ => Err(ApiError::new(
            ErrorCode::UnknownEndpoint,
            format!("no endpoint at {}", ctx.path),
        )),
    }
}

fn landing(app: &App, ctx: &Ctx) -> Result<Resp, ApiError> {
    let b = base(app, ctx);
    Ok(response::json_value(
        200,
        &json!({
            "title": "geoshard",
            "description": "The layers of this geoshard server as OGC API – Features collections",
            "links": [
                link(b.clone(), "self", "application/json", "this document"),
                link(format!("{b}/api"), "service-desc", OAS30_TYPE, "the API definition (OpenAPI 3.0)"),
                link(
                    b.replace("/ogc", "/v1/openapi.json"),
                    "service-desc",
                    "application/vnd.oai.openapi+json;version=3.1",
                    "the API definition (OpenAPI 3.1)"
                ),
                link(format!("{b}/conformance"), "conformance", "application/json", "conformance classes"),
                link(format!("{b}/collections"), "data", "application/json", "the collections"),
            ]
        }),
    ))
}

/// A CQL2 filter, text or JSON, parsed by the `cql2` crate and written back as CQL2-text,
/// then as the where language.
fn cql2_filter(filter: &str, json: bool) -> Result<String, ApiError> {
    let expr = if json {
        cql2::parse_json(filter).map_err(|e| bad(format!("filter: not CQL2-JSON: {e}")))?
    } else {
        cql2::parse_text(filter).map_err(|e| bad(format!("filter: not CQL2-text: {e}")))?
    };
    let text = expr.to_text().map_err(|e| bad(format!("filter: {e}")))?;
    Ok(cql2_to_where(&text))
}

/// CQL2-text (the Basic CQL2 and advanced comparison classes) as the where language, which
/// has the same grammar but for temporal literals: CQL2's `TIMESTAMP('…')` and `DATE('…')`
/// become `TIMESTAMP '…'` and `DATE '…'`. The where parser then checks the whole, so anything
/// else CQL2 has and it lacks is refused with its position.
fn cql2_to_where(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    // The end of the string literal starting at `i` (a quote), `''` being a quote inside.
    let literal_end = |mut j: usize| -> Option<usize> {
        j += 1;
        while j < chars.len() {
            if chars[j] == '\'' {
                if chars.get(j + 1) == Some(&'\'') {
                    j += 2;
                    continue;
                }
                return Some(j + 1);
            }
            j += 1;
        }
        None
    };
    let skip_space = |mut j: usize| {
        while chars.get(j).is_some_and(|c| c.is_whitespace()) {
            j += 1;
        }
        j
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '\'' {
            let end = literal_end(i).unwrap_or(chars.len());
            out.extend(&chars[i..end]);
            i = end;
        } else if c == '"' {
            let end = chars[i + 1..]
                .iter()
                .position(|&q| q == '"')
                .map_or(chars.len(), |p| i + p + 2);
            out.extend(&chars[i..end]);
            i = end;
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let upper = word.to_ascii_uppercase();
            if upper == "TIMESTAMP" || upper == "DATE" {
                let open = skip_space(i);
                if chars.get(open) == Some(&'(') {
                    let lit = skip_space(open + 1);
                    if chars.get(lit) == Some(&'\'')
                        && let Some(end) = literal_end(lit)
                    {
                        let close = skip_space(end);
                        if chars.get(close) == Some(&')') {
                            out.push_str(&upper);
                            out.push(' ');
                            out.extend(&chars[lit..end]);
                            i = close + 1;
                            continue;
                        }
                    }
                }
            }
            out.push_str(&word);
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// `collections/{id}/queryables`: the columns a filter may name, as a JSON Schema.
fn queryables(app: &App, ctx: &Ctx, id: &str) -> Result<Resp, ApiError> {
    let (d, at, view) = find_view(app, ctx, id)?;
    let layer = &d.layers[at];
    let properties: Map<String, Value> = view
        .def
        .columns
        .iter()
        .map(|c| {
            let schema = match c.scalar.kind() {
                Kind::Int => json!({"type": "integer"}),
                Kind::Float => json!({"type": "number"}),
                Kind::Bool => json!({"type": "boolean"}),
                Kind::Str => json!({"type": "string"}),
                Kind::Date => json!({"type": "string", "format": "date-time"}),
            };
            (c.name.clone(), schema)
        })
        .collect();
    let href = format!(
        "{}/collections/{}/queryables",
        base(app, ctx),
        enc(&collection_id(&d, layer))
    );
    let mut r = response::json_value(
        200,
        &json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": href,
            "type": "object",
            "title": layer.name,
            "properties": properties,
            "additionalProperties": false,
        }),
    );
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/schema+json"),
    );
    Ok(r)
}

const OAS30_TYPE: &str = "application/vnd.oai.openapi+json;version=3.0";

/// The API definition as OpenAPI 3.0 (the OAS30 conformance class), made once from the 3.1
/// document kept in `docs/openapi.json`.
fn openapi_30() -> &'static Bytes {
    static DOC: std::sync::OnceLock<Bytes> = std::sync::OnceLock::new();
    DOC.get_or_init(|| {
        let mut doc: Value = serde_json::from_str(super::names::OPENAPI).unwrap_or_default();
        downgrade(&mut doc, false);
        doc["openapi"] = json!("3.0.3");
        Bytes::from(serde_json::to_vec(&doc).unwrap_or_default())
    })
}

/// Rewrites what OpenAPI 3.1 (JSON Schema 2020-12) allows and 3.0 does not: `type` lists
/// (`null` among them becomes `nullable`) and `const`. `names`: `v` maps names to schemas
/// (`properties`), whose keys are not keywords.
fn downgrade(v: &mut Value, names: bool) {
    match v {
        Value::Object(m) if names => m.values_mut().for_each(|x| downgrade(x, false)),
        Value::Object(m) => {
            if let Some(Value::Array(types)) = m.get("type").cloned() {
                let kinds: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
                if kinds.len() < types.len() {
                    m.insert("nullable".into(), json!(true));
                }
                match kinds.as_slice() {
                    [one] => {
                        m.insert("type".into(), one.clone());
                    }
                    _ => {
                        m.remove("type");
                        let any: Vec<Value> = kinds.iter().map(|t| json!({"type": t})).collect();
                        m.insert("anyOf".into(), Value::Array(any));
                    }
                }
            }
            if let Some(c) = m.remove("const") {
                m.insert("enum".into(), json!([c]));
            }
            for (k, x) in m.iter_mut() {
                downgrade(x, k == "properties" || k == "patternProperties");
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| downgrade(x, false)),
        _ => {}
    }
}

/// A collection id: `<service>.<layer id>`, percent-decoded by the router.
pub(super) fn find(app: &App, ctx: &Ctx, id: &str) -> Result<(Arc<Descriptor>, i64), ApiError> {
    let id = percent_decode(id);
    let missing = || not_found(format!("Collection {id} not found"));
    let (service, layer) = id.rsplit_once('.').ok_or_else(missing)?;
    let layer = super::params::digits(layer)
        .and_then(|n| i64::try_from(n).ok())
        .ok_or_else(missing)?;
    let d = app
        .features
        .descriptor(service, ctx.caller.roles())
        .ok_or_else(missing)?;
    if !d.layers.iter().any(|l| l.id == layer) {
        return Err(missing());
    }
    Ok((d, layer))
}

/// A collection's descriptor, its layer's position there, and the layer's view.
fn find_view(
    app: &App,
    ctx: &Ctx,
    id: &str,
) -> Result<(Arc<Descriptor>, usize, Arc<ViewState>), ApiError> {
    let (d, layer_id) = find(app, ctx, id)?;
    let at = d
        .layers
        .iter()
        .position(|l| l.id == layer_id)
        .ok_or_else(|| not_found(format!("Collection {id} not found")))?;
    let view = app
        .features
        .view(&d.layers[at].view)
        .ok_or_else(|| not_found(format!("Collection {id} has no view")))?;
    Ok((d, at, view))
}

fn percent_decode(s: &str) -> String {
    form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

pub(super) fn collection_id(d: &Descriptor, layer: &Layer) -> String {
    format!("{}.{}", d.name, layer.id)
}

/// A collection's description; its extent from `extents` (a cluster's, by layer id) when
/// given, else from this node's views.
fn collection(
    app: &App,
    ctx: &Ctx,
    d: &Descriptor,
    layer_id: i64,
    extents: Option<&HashMap<i64, BBox>>,
) -> Value {
    let Some(layer) = d.layers.iter().find(|l| l.id == layer_id) else {
        return Value::Null;
    };
    let id = collection_id(d, layer);
    let href = format!("{}/collections/{}", base(app, ctx), enc(&id));
    let mut c = json!({
        "id": id,
        "title": layer.name,
        "description": layer.description,
        "itemType": "feature",
        "crs": [CRS84],
        "links": [
            link(href.clone(), "self", "application/json", "this collection"),
            link(format!("{href}/items"), "items", "application/geo+json", "its features"),
            link(format!("{href}/queryables"), QUERYABLES_REL, "application/schema+json", "what a filter may name"),
        ],
    });
    let extent = match extents {
        Some(e) => e.get(&layer.id).copied(),
        None => app.features.queries().layer_extent(layer, &ctx.caller),
    };
    if let Some([xmin, ymin, xmax, ymax]) = extent {
        c["extent"] = json!({"spatial": {"bbox": [[xmin, ymin, xmax, ymax]], "crs": CRS84}});
    }
    c
}

async fn collections(app: &Arc<App>, ctx: &Ctx) -> Result<Resp, ApiError> {
    let b = base(app, ctx);
    let mut list = Vec::new();
    for d in app.features.descriptors(ctx.caller.roles()) {
        let extents = super::spread_extents(app, ctx, &d.name).await?;
        let mut layers: Vec<i64> = d.layers.iter().map(|l| l.id).collect();
        layers.sort_unstable();
        for l in layers {
            list.push(collection(app, ctx, &d, l, extents.as_ref()));
        }
    }
    Ok(response::json_value(
        200,
        &json!({
            "links": [link(format!("{b}/collections"), "self", "application/json", "the collections")],
            "collections": list,
        }),
    ))
}

/// The parameters of an items request, checked.
struct ItemsQuery {
    bbox: Option<[f64; 4]>,
    limit: usize,
    offset: usize,
    /// `datetime`, in milliseconds.
    time: Option<crate::features::query::TimeWindow>,
    filters: Vec<(String, String)>,
    /// `filter` (CQL2-text), as a where clause.
    filter: Option<String>,
    /// `f=csv`: the page as CSV with a WKT column rather than GeoJSON.
    csv: bool,
}

fn items_query(ctx: &Ctx, layer: &Layer, view: &ViewState) -> Result<ItemsQuery, ApiError> {
    let mut q = ItemsQuery {
        bbox: None,
        limit: DEFAULT_LIMIT,
        offset: 0,
        time: None,
        filters: Vec::new(),
        filter: None,
        csv: false,
    };
    let (mut filter, mut json) = (None, false);
    for (k, v) in ctx.params.pairs() {
        match k {
            "bbox" => {
                let n: Vec<f64> = v
                    .split(',')
                    .map(|p| p.trim().parse::<f64>())
                    .collect::<Result<_, _>>()
                    .map_err(|_| bad(format!("bbox {v:?} is not four (or six) numbers")))?;
                let b = match n[..] {
                    [a, b, c, d] => [a, b, c, d],
                    [a, b, _, c, d, _] => [a, b, c, d],
                    _ => return Err(bad(format!("bbox {v:?} is not four (or six) numbers"))),
                };
                if b.iter().any(|x| !x.is_finite()) || b[1] > b[3] || b[1] < -90.0 || b[3] > 90.0 {
                    return Err(bad(format!(
                        "bbox {v:?}: latitudes must be within -90..90, the lower first"
                    )));
                }
                if [b[0], b[2]].iter().any(|x| !(-180.0..=180.0).contains(x)) {
                    return Err(bad(format!(
                        "bbox {v:?}: longitudes must be within -180..180"
                    )));
                }
                q.bbox = Some(b);
            }
            "limit" => {
                let n: usize = v
                    .parse()
                    .map_err(|_| bad(format!("limit {v:?} is not a positive integer")))?;
                if n == 0 || n > MAX_LIMIT {
                    return Err(bad(format!("limit {n} is outside 1..{MAX_LIMIT}")));
                }
                q.limit = n;
            }
            "offset" => {
                q.offset = v
                    .parse()
                    .map_err(|_| bad(format!("offset {v:?} is not a non-negative integer")))?;
            }
            "datetime" => {
                if layer.time_fields.is_none() {
                    return Err(bad("datetime: this collection has no time field"));
                }
                q.time = Some(interval(v)?);
            }
            "f" => match v {
                "json" | "geojson" => q.csv = false,
                "csv" => q.csv = true,
                _ => return Err(bad(format!("f={v}: json (GeoJSON) and csv are served"))),
            },
            "filter" => filter = Some(v),
            "filter-lang" => {
                json = match v {
                    "cql2-text" => false,
                    "cql2-json" => true,
                    _ => {
                        return Err(bad(format!(
                            "filter-lang={v}: cql2-text and cql2-json are taken"
                        )));
                    }
                }
            }
            "filter-crs" => {
                if v != CRS84 {
                    return Err(bad(format!("filter-crs={v}: only {CRS84} is taken")));
                }
            }
            name => {
                let column = view
                    .def
                    .columns
                    .iter()
                    .find(|c| c.name == name)
                    .ok_or_else(|| bad(format!("unknown parameter {name}")))?;
                q.filters
                    .push((column.name.clone(), where_value(column.scalar.kind(), v)?));
            }
        }
    }
    if let Some(f) = filter {
        q.filter = Some(cql2_filter(f, json)?);
    }
    Ok(q)
}

/// A value as a where-clause literal for a column of `kind`.
fn where_value(kind: Kind, v: &str) -> Result<String, ApiError> {
    match kind {
        Kind::Int | Kind::Float => v
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite())
            .map(|_| v.to_string())
            .ok_or_else(|| bad(format!("{v:?} is not a number"))),
        Kind::Bool => match v {
            "true" | "false" => Ok(v.to_string()),
            _ => Err(bad(format!("{v:?} is not true or false"))),
        },
        Kind::Str | Kind::Date => Ok(format!("'{}'", v.replace('\'', "''"))),
    }
}

/// An RFC 3339 instant or interval (`a/b`, `../b`, `a/..`), in milliseconds (`None` for an
/// open end).
fn interval(v: &str) -> Result<crate::features::query::TimeWindow, ApiError> {
    let one = |s: &str| -> Result<Option<i64>, ApiError> {
        if s.is_empty() || s == ".." {
            return Ok(None);
        }
        crate::time::parse_datetime(s)
            .map(Some)
            .ok_or_else(|| bad(format!("datetime {s:?} is not an RFC 3339 instant")))
    };
    Ok(match v.split_once('/') {
        Some((a, b)) => (one(a)?, one(b)?),
        None => {
            let t = one(v)?;
            (t, t)
        }
    })
}

/// Run a geoQueryService body for the caller on the query threads.
pub(super) async fn run(app: &Arc<App>, ctx: &Ctx, body: Value) -> Result<Value, ApiError> {
    let out = run_bytes(app, ctx, body, false).await?;
    serde_json::from_slice(&out)
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("the query's answer: {e}")))
}

/// [`run`], the answer's JSON as written; `spread`: a page over the limit is an even sample of
/// the matches (a tile's), not the first ones.
pub(super) async fn run_bytes(
    app: &Arc<App>,
    ctx: &Ctx,
    body: Value,
    spread: bool,
) -> Result<Bytes, ApiError> {
    let bytes = Bytes::from(body.to_string());
    if let Some(cluster) = app.spread() {
        let after = ctx.after();
        let out =
            crate::cluster::spread::geo_query(cluster, &ctx.caller, after, bytes, None, spread)
                .await?;
        return Ok(Bytes::from(out));
    }
    let max_vertices = app.features.settings().max_query_vertices;
    let mut request = FeatureRequest::parse_for(ctx.caller.name(), &bytes, max_vertices)?;
    request.query.spread = spread;
    let features = app.features.clone();
    let caller = ctx.caller.clone();
    let out = crate::cpu::run_cpu_intensive(move || {
        features.queries().execute_within(&caller, &request, None)
    })
    .await
    .ok_or_else(|| ApiError::new(ErrorCode::Internal, "the query failed"))??;
    Ok(Bytes::from(out))
}

impl ItemsQuery {
    /// `filter` and the property filters as one where clause; `None` without either.
    fn where_text(&self) -> Option<String> {
        let clause: Vec<String> = self
            .filter
            .iter()
            .map(|f| format!("({f})"))
            .chain(self.filters.iter().map(|(c, v)| format!("{c} = {v}")))
            .collect();
        (!clause.is_empty()).then(|| clause.join(" AND "))
    }
}

fn query_body(service: &str, layer: i64, q: &ItemsQuery) -> Value {
    let mut query = Map::new();
    if let Some(w) = q.where_text() {
        query.insert("where".into(), json!(w));
    }
    if let Some((from, to)) = q.time {
        // geoQueryService's `time`: `start,end` in milliseconds, `null` for an open end.
        let ms = |t: Option<i64>| t.map_or("null".to_string(), |t| t.to_string());
        query.insert("time".into(), json!(format!("{},{}", ms(from), ms(to))));
    }
    if let Some([xmin, ymin, xmax, ymax]) = q.bbox {
        // A box across the antimeridian (xmin > xmax) is its two halves.
        let rect =
            |a: f64, b: f64| json!([[[a, ymin], [b, ymin], [b, ymax], [a, ymax], [a, ymin]]]);
        let geometry = if xmin <= xmax {
            json!({"type": "Polygon", "coordinates": rect(xmin, xmax)})
        } else {
            json!({"type": "MultiPolygon", "coordinates": [rect(xmin, 180.0), rect(-180.0, xmax)]})
        };
        query.insert("extension".into(), json!({"geometry": geometry}));
    }
    json!({"params": {"id": service, "layer": layer, "method": "query"}, "query": query})
}

/// The query of an items request, built directly: its where clause, time, box and page, in
/// OBJECTID order, every column and the geometry.
fn items_request(service: &str, layer: i64, q: &ItemsQuery, id_column: &str) -> FeatureRequest {
    let geometry = q.bbox.map(|[xmin, ymin, xmax, ymax]| {
        let rect = |a: f64, b: f64| {
            geo::Polygon::new(
                geo::LineString::from(vec![(a, ymin), (b, ymin), (b, ymax), (a, ymax), (a, ymin)]),
                vec![],
            )
        };
        // A box across the antimeridian (xmin > xmax) is its two halves.
        let g = if xmin <= xmax {
            geo::Geometry::Polygon(rect(xmin, xmax))
        } else {
            geo::Geometry::MultiPolygon(geo::MultiPolygon(vec![
                rect(xmin, 180.0),
                rect(-180.0, xmax),
            ]))
        };
        (
            Arc::new(crate::spatial::Query::new(g)),
            crate::spatial::Relation::Intersects,
        )
    });
    FeatureRequest {
        service: service.to_string(),
        layer: Some(layer),
        layer_text: Some(layer.to_string()),
        method: Some("query".into()),
        query: crate::features::query::QuerySpec {
            where_text: q.where_text(),
            time: q.time,
            geometry,
            return_geometry: true,
            order_by: Some(id_column.to_string()),
            offset: q.offset,
            limit: Some(q.limit),
            ..Default::default()
        },
    }
}

/// A page of items: typed and in-process on a node that holds every shard, else routed over
/// the cluster as geoQueryService queries (a count and a page) and written as items.
async fn items_page(
    app: &Arc<App>,
    ctx: &Ctx,
    d: &Descriptor,
    layer_id: i64,
    q: &ItemsQuery,
    id_column: &str,
    head: Arc<dyn Fn(usize, usize) -> Vec<u8> + Send + Sync>,
) -> Result<ItemsPage, ApiError> {
    let filter_error = |e: ApiError| match (&q.filter, e.status()) {
        // The where parser's refusal of a filter: say which parameter it was.
        (Some(_), 400) => bad(format!("filter: {}", e.message)),
        _ => e,
    };
    if app.spread().is_none() {
        let request = items_request(&d.name, layer_id, q, id_column);
        let (features, caller, limit) =
            (app.features.clone(), ctx.caller.clone(), app.query_limit());
        let page = crate::cpu::run_cpu_intensive(move || {
            features
                .queries()
                .items_page(&caller, &request, limit, &*head)
        })
        .await
        .ok_or_else(|| ApiError::new(ErrorCode::Internal, "the query failed"))?;
        return page.map_err(|e| filter_error(ApiError::from(e)));
    }
    let mut count = query_body(&d.name, layer_id, q);
    count["query"]["returnCountOnly"] = json!(true);
    let matched = run(app, ctx, count).await.map_err(filter_error)?["count"]
        .as_u64()
        .unwrap_or(0) as usize;
    let mut page = query_body(&d.name, layer_id, q);
    page["query"]["outFields"] = json!("*");
    page["query"]["returnGeometry"] = json!(true);
    page["query"]["orderByFields"] = json!(id_column);
    page["query"]["resultOffset"] = json!(q.offset);
    page["query"]["resultRecordCount"] = json!(q.limit);
    let answer = run(app, ctx, page).await?;
    let features = answer["features"]
        .as_array()
        .map_or(&[][..], |a| a.as_slice());
    let mut out = ItemsPage {
        matched,
        returned: features.len(),
        features: head(matched, features.len()),
    };
    for (i, f) in features.iter().enumerate() {
        if i > 0 {
            out.features.push(b',');
        }
        let _ = serde_json::to_writer(&mut out.features, &item_of(f));
    }
    Ok(out)
}

async fn items(app: &Arc<App>, ctx: &Ctx, id: &str) -> Result<Resp, ApiError> {
    let (d, at, view) = find_view(app, ctx, id)?;
    let layer = &d.layers[at];
    let layer_id = layer.id;
    let mut q = items_query(ctx, layer, &view)?;
    let max = app.features.settings().max_record_count.max(1);
    let limit = q.limit.min(max);
    q.limit = limit;
    let id_column = view.def.columns[view.def.id_column].name.to_string();
    // The envelope is written first, the features after it in the same buffer.
    let head = Arc::new(|matched: usize, returned: usize| {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(b"{\"type\":\"FeatureCollection\",\"timeStamp\":");
        let _ = serde_json::to_writer(
            &mut out,
            &crate::time::format_datetime(crate::time::now_ms() as i64),
        );
        out.extend_from_slice(
            format!(",\"numberMatched\":{matched},\"numberReturned\":{returned},\"features\":[")
                .as_bytes(),
        );
        out
    });
    let page = items_page(app, ctx, &d, layer_id, &q, &id_column, head).await?;
    if q.csv {
        let columns = view
            .def
            .columns
            .iter()
            .map(|c| c.name.to_string())
            .collect();
        return csv_page(page.features, columns);
    }
    let matched = page.matched;

    let href = format!(
        "{}/collections/{}/items",
        base(app, ctx),
        enc(&collection_id(&d, layer))
    );
    let with_format = |offset: usize, format: Option<&str>| {
        let mut pairs: Vec<(String, String)> = ctx
            .params
            .pairs()
            .filter(|(k, _)| *k != "offset" && *k != "limit" && (format.is_none() || *k != "f"))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        pairs.push(("limit".into(), limit.to_string()));
        pairs.push(("offset".into(), offset.to_string()));
        if let Some(f) = format {
            pairs.push(("f".into(), f.to_string()));
        }
        let mut s = form_urlencoded::Serializer::new(String::new());
        for (k, v) in &pairs {
            s.append_pair(k, v);
        }
        format!("{href}?{}", s.finish())
    };
    let with = |offset: usize| with_format(offset, None);
    let mut links = vec![
        link(with(q.offset), "self", "application/geo+json", "this page"),
        link(
            with_format(q.offset, Some("csv")),
            "alternate",
            "text/csv",
            "this page as CSV, its geometry as WKT",
        ),
    ];
    if q.offset.saturating_add(page.returned) < matched && page.returned > 0 {
        links.push(link(
            with(q.offset.saturating_add(limit)),
            "next",
            "application/geo+json",
            "the next page",
        ));
    }
    if q.offset > 0 {
        links.push(link(
            with(q.offset.saturating_sub(limit)),
            "prev",
            "application/geo+json",
            "the previous page",
        ));
    }
    links.push(link(
        format!(
            "{}/collections/{}",
            base(app, ctx),
            enc(&collection_id(&d, layer))
        ),
        "collection",
        "application/json",
        "the collection",
    ));
    // The envelope's head and the features are written; the links close it. No tree of the
    // page is made, and the answer is not copied.
    let mut out = page.features;
    out.extend_from_slice(b"],\"links\":");
    let _ = serde_json::to_writer(&mut out, &links);
    out.push(b'}');
    Ok(geojson_bytes(out))
}

/// A page of items (the envelope's head and the features, as [`items_page`] writes them) as
/// CSV: a WKT column, then the layer's `columns`.
fn csv_page(mut features: Vec<u8>, columns: Vec<String>) -> Result<Resp, ApiError> {
    let internal = |e: String| ApiError::new(ErrorCode::Internal, format!("the CSV page: {e}"));
    features.extend_from_slice(b"]}");
    let page: Value = serde_json::from_slice(&features).map_err(|e| internal(e.to_string()))?;
    drop(features);
    let mut out = crate::features::csv_wkt::CsvWkt::new(Vec::new(), columns).map_err(internal)?;
    for f in page["features"].as_array().map_or(&[][..], Vec::as_slice) {
        out.feature(f).map_err(internal)?;
    }
    let mut r = response::json_bytes(200, out.finish().map_err(internal)?);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/csv; charset=utf-8"),
    );
    Ok(r)
}

/// An answer of GeoJSON bytes.
fn geojson_bytes(body: Vec<u8>) -> Resp {
    let mut r = response::json_bytes(200, body);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/geo+json"),
    );
    r
}

/// A geoQueryService feature as an OGC item: `type`, `id`, `geometry`, `properties`.
fn item_of(f: &Value) -> Value {
    json!({
        "type": "Feature",
        "id": f["id"],
        "geometry": f["geometry"],
        "properties": f["properties"],
    })
}

async fn item(app: &Arc<App>, ctx: &Ctx, id: &str, fid: &str) -> Result<Resp, ApiError> {
    let (d, at, view) = find_view(app, ctx, id)?;
    let layer = &d.layers[at];
    let missing = || not_found(format!("Feature {fid} not found in collection {id}"));
    let oid = super::params::digits(fid)
        .and_then(|n| i64::try_from(n).ok())
        .ok_or_else(missing)?;
    let q = ItemsQuery {
        bbox: None,
        limit: 1,
        offset: 0,
        time: None,
        filters: vec![(
            view.def.columns[view.def.id_column].name.to_string(),
            oid.to_string(),
        )],
        filter: None,
        csv: false,
    };
    let id_column = view.def.columns[view.def.id_column].name.to_string();
    let page = items_page(
        app,
        ctx,
        &d,
        layer.id,
        &q,
        &id_column,
        Arc::new(|_, _| Vec::new()),
    )
    .await?;
    // One feature, written: its closing brace gives way to its links.
    let Some(feature) = page.features.strip_suffix(b"}") else {
        return Err(missing());
    };
    let collection = format!(
        "{}/collections/{}",
        base(app, ctx),
        enc(&collection_id(&d, layer))
    );
    let links = json!([
        link(
            format!("{collection}/items/{oid}"),
            "self",
            "application/geo+json",
            "this feature"
        ),
        link(
            collection,
            "collection",
            "application/json",
            "the collection"
        ),
    ]);
    let mut out = Vec::with_capacity(feature.len() + 512);
    out.extend_from_slice(feature);
    out.extend_from_slice(b",\"links\":");
    let _ = serde_json::to_writer(&mut out, &links);
    out.push(b'}');
    Ok(geojson_bytes(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cql2_temporal_literals_become_the_where_forms_and_the_rest_is_kept() {
        assert_eq!(
            cql2_to_where(
                "born > TIMESTAMP('2017-05-24T06:00:00Z') AND d <= date ( '2017-05-24' )"
            ),
            "born > TIMESTAMP '2017-05-24T06:00:00Z' AND d <= DATE '2017-05-24'"
        );
        // Inside literals and quoted names nothing changes; other text is as it came.
        assert_eq!(
            cql2_to_where("name = 'DATE(''x'')' OR \"TIMESTAMP(\" IS NULL"),
            "name = 'DATE(''x'')' OR \"TIMESTAMP(\" IS NULL"
        );
        assert_eq!(
            cql2_to_where("pop BETWEEN 1 AND 5 AND cc IN ('US','CA') AND n LIKE 'Den%'"),
            "pop BETWEEN 1 AND 5 AND cc IN ('US','CA') AND n LIKE 'Den%'"
        );
        // Unfinished forms are left for the parser to refuse.
        assert_eq!(cql2_to_where("t = DATE('2017"), "t = DATE('2017");
        assert_eq!(cql2_to_where("t = DATE 'x'"), "t = DATE 'x'");
        assert_eq!(cql2_to_where("d = 'é' AND ü = 1"), "d = 'é' AND ü = 1");
    }

    #[test]
    fn downgrade_rewrites_type_lists_and_const_only_where_they_are_keywords() {
        let mut v = json!({
            "type": "object",
            "properties": {
                "type": {"type": ["string", "null"]},
                "const": {"const": 3},
                "n": {"type": ["integer", "string"]},
            },
            "items": {"type": ["number", "string", "null"]},
        });
        downgrade(&mut v, false);
        assert_eq!(
            v,
            json!({
                "type": "object",
                "properties": {
                    "type": {"type": "string", "nullable": true},
                    "const": {"enum": [3]},
                    "n": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                },
                "items": {"anyOf": [{"type": "number"}, {"type": "string"}], "nullable": true},
            })
        );
    }
}
