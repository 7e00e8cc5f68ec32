//! The GeoServices REST API's feature-service subset under `/arcgis/`, so ArcGIS clients
//! (ArcGIS Pro and Online, the JS and Python APIs, GDAL's ESRIJSON driver) reach the engine
//! with no Koop in between.
//!
//! - `GET /arcgis/rest/info`: the version and where tokens come from;
//! - `POST /arcgis/tokens/generateToken`: a signed token for a user (`auth::token`);
//! - `/arcgis/rest/services`: the catalog of the services the caller may read;
//! - `/arcgis/rest/services/{service}/FeatureServer`, `…/layers`, `…/{layer}`: the service
//!   and layer infos, from the service descriptors;
//! - `…/{layer}/query`, by GET or by POST (form-encoded).
//!
//! A query's parameters become a geoQueryService request, run by the same code, with the
//! same permissions, limits and cluster routing ([`feature_service::answer`]); its answer is
//! written as Esri JSON or Esri's protobuf format (`features::query::esri_out`,
//! `esri_pbf`), or written again from geoQueryService's answer (`feature_set`). Every route takes a token
//! (`token=`, `Authorization: Bearer` or `X-Esri-Authorization: Bearer`), Digest or Basic,
//! and needs the roles geoQueryService needs. Errors are Esri's
//! `{"error": {"code", "message", "details"}}` with the code also as the HTTP status.

mod feature_set;

use std::sync::Arc;

use bytes::Bytes;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue, RETRY_AFTER, WWW_AUTHENTICATE};
use hyper::{Method, Request};
use serde_json::{Map, Value, json};

use super::feature_service;
use super::params::Params;
use super::response::{self, Resp};
use super::{App, BoxError, Ctx, read_body};
use crate::acl::{Caller, Role, RoleSet};
use crate::error::ApiError;
use crate::features::FeatureRequest;
use crate::security::{AuthOutcome, DEFAULT_TOKEN_MINUTES, TokenRefusal};

/// The ArcGIS Server version whose REST API this answers as.
const CURRENT_VERSION: f64 = 11.3;
const FULL_VERSION: &str = "11.3.0";

/// What a path under `/arcgis` names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Page {
    Info,
    GenerateToken,
    Services,
    Service(String),
    Layers(String),
    Layer(String, i64),
    Query(String, i64),
    NotFound,
}

impl Page {
    /// `rest`: the path after `/arcgis`, as sent (segments percent-decoded here).
    fn of(rest: &str) -> Page {
        let parts: Vec<String> = rest
            .trim_matches('/')
            .split('/')
            .map(|p| {
                form_urlencoded::parse(format!("s={}", p.replace('+', "%2B")).as_bytes())
                    .next()
                    .map(|(_, v)| v.into_owned())
                    .unwrap_or_default()
            })
            .collect();
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        let layer = |s: &str| s.parse::<i64>().ok();
        match parts.as_slice() {
            ["rest", "info"] => Page::Info,
            ["tokens", "generateToken"] | ["tokens"] => Page::GenerateToken,
            ["rest", "services"] => Page::Services,
            ["rest", "services", s, "FeatureServer"] => Page::Service(s.to_string()),
            ["rest", "services", s, "FeatureServer", "layers"] => Page::Layers(s.to_string()),
            ["rest", "services", s, "FeatureServer", l] => match layer(l) {
                Some(l) => Page::Layer(s.to_string(), l),
                None => Page::NotFound,
            },
            ["rest", "services", s, "FeatureServer", l, "query"] => match layer(l) {
                Some(l) => Page::Query(s.to_string(), l),
                None => Page::NotFound,
            },
            _ => Page::NotFound,
        }
    }

    /// Pages answered with no credentials: where tokens come from, and the call that makes one.
    fn open(&self) -> bool {
        matches!(self, Page::Info | Page::GenerateToken)
    }
}

/// A request's page as a metrics label (from the path's shape alone: this runs on every
/// request).
pub(super) fn label(rest: &str) -> &'static str {
    let rest = rest.trim_end_matches('/');
    if rest.ends_with("/query") {
        "arcgisQuery"
    } else if rest.starts_with("tokens") {
        "arcgisToken"
    } else {
        "arcgisInfo"
    }
}

/// An Esri error: `code` is also the HTTP status.
#[derive(Debug)]
pub(super) struct EsriError {
    code: u16,
    message: String,
    details: Vec<String>,
}

impl EsriError {
    fn new(code: u16, message: impl Into<String>) -> EsriError {
        EsriError {
            code,
            message: message.into(),
            details: Vec::new(),
        }
    }

    fn detail(mut self, d: impl Into<String>) -> EsriError {
        self.details.push(d.into());
        self
    }

    fn invalid(detail: impl Into<String>) -> EsriError {
        EsriError::new(400, "Unable to complete operation.").detail(detail)
    }

    fn response(&self) -> Resp {
        let body = json!({"error": {"code": self.code, "message": self.message,
                                    "details": self.details}});
        response::json_value(self.code, &body)
    }
}

impl From<ApiError> for EsriError {
    fn from(e: ApiError) -> EsriError {
        let code = e.status();
        let message = match code {
            400 => "Unable to complete operation.",
            403 => "You do not have permissions to access this resource or perform this operation.",
            404 => "Service or layer not found.",
            413 => "The answer is too large.",
            503 => "Service unavailable.",
            _ => "Error performing query operation.",
        };
        EsriError::new(code, message).detail(e.message)
    }
}

/// The request's parameters: the query string's, then a form body's (which win, as ArcGIS
/// Server reads a POST).
fn parameters(query: Option<&str>, headers: &hyper::HeaderMap, body: &[u8]) -> Params {
    let form = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_none_or(|t| {
            t.trim_start()
                .to_ascii_lowercase()
                .starts_with("application/x-www-form-urlencoded")
        });
    let mut text = query.unwrap_or_default().to_string();
    if form && !body.is_empty() {
        if !text.is_empty() {
            text.push('&');
        }
        text.push_str(&String::from_utf8_lossy(body));
    }
    Params::parse(Some(&text))
}

/// The last value of `name` (a form value after the query string's).
fn last<'a>(params: &'a Params, name: &str) -> Option<&'a str> {
    params
        .pairs()
        .filter(|(k, _)| *k == name)
        .map(|(_, v)| v)
        .last()
        .filter(|v| !v.is_empty())
}

/// A bearer token from `token=`, `Authorization` or `X-Esri-Authorization`.
fn token<'a>(params: &'a Params, headers: &'a hyper::HeaderMap) -> Option<&'a str> {
    if let Some(t) = last(params, "token") {
        return Some(t);
    }
    for name in [AUTHORIZATION.as_str(), "x-esri-authorization"] {
        if let Some(v) = headers.get(name).and_then(|v| v.to_str().ok()) {
            let v = v.trim_start();
            if let Some((scheme, rest)) = v.split_once(' ')
                && scheme.eq_ignore_ascii_case("bearer")
            {
                return Some(rest.trim());
            }
        }
    }
    None
}

/// Serve a request under `/arcgis`: `rest` is the path after it. The body is read first,
/// since a POST's form may carry the token.
pub(super) async fn serve<B>(
    app: &Arc<App>,
    conn: Option<&super::conn::Activity>,
    req: Request<B>,
    rest: &str,
) -> Resp
where
    B: hyper::body::Body<Data = Bytes> + Send + Unpin,
    B::Error: Into<BoxError>,
{
    let (parts, body) = req.into_parts();
    let page = Page::of(rest);
    if parts.method != Method::GET && parts.method != Method::POST {
        let mut r = EsriError::new(405, "Method not allowed.")
            .detail(format!(
                "{} is not served here; use GET or POST",
                parts.method
            ))
            .response();
        r.headers_mut()
            .insert(hyper::header::ALLOW, HeaderValue::from_static("GET, POST"));
        return r;
    }
    let body = match read_body(app, &parts.headers, body).await {
        Ok(b) => b,
        Err(e) => return EsriError::from(e).response(),
    };
    let params = parameters(parts.uri.query(), &parts.headers, &body);
    let caller = match authenticate(app, conn, &parts, &params, &page) {
        Ok(c) => c,
        Err(r) => return *r,
    };
    if let Some(refused) = super::reserve_refusal(conn, &caller) {
        return refused;
    }
    let user = (app.config.access_log && caller.name() != ANONYMOUS)
        .then(|| super::User(caller.name().to_string()));
    let ctx = Ctx {
        caller,
        params,
        headers: parts.headers,
        path: parts.uri.path().to_string(),
    };
    let mut resp = match handle(app, &ctx, &parts.method, page, conn).await {
        Ok(r) => r,
        Err(e) => {
            if e.code >= 500 {
                tracing::error!(code = e.code, message = %e.message, details = ?e.details,
                    "arcgis request failed");
            }
            e.response()
        }
    };
    if let Some(user) = user {
        resp.extensions_mut().insert(user);
    }
    resp
}

const ANONYMOUS: &str = "";

/// The caller: a token's, else Digest's or Basic's, else nobody (for the open pages). A
/// request with none of them for any other page is answered 401 with the Digest and Basic
/// challenges and Esri's "Token Required".
fn authenticate(
    app: &App,
    conn: Option<&super::conn::Activity>,
    parts: &hyper::http::request::Parts,
    params: &Params,
    page: &Page,
) -> Result<Caller, Box<Resp>> {
    if let Some(t) = token(params, &parts.headers) {
        return app.security.token_caller(t).ok_or_else(|| {
            crate::metrics::record(|m| m.auth_failures.inc());
            Box::new(
                EsriError::new(498, "Invalid Token")
                    .detail(
                        "the token is not one this server made, or it expired, or its user \
                         changed",
                    )
                    .response(),
            )
        });
    }
    let header = parts
        .headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if header.is_none() && page.open() {
        return Ok(Caller::new(ANONYMOUS, RoleSet::EMPTY));
    }
    let target = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    match app.security.authenticate_on(
        parts.method.as_str(),
        target,
        header,
        conn.map(|c| &c.digest),
        conn.and_then(|c| c.peer),
    ) {
        AuthOutcome::Authenticated(c) => Ok(c),
        AuthOutcome::Challenge { stale } => {
            crate::metrics::record(|m| m.challenges.inc());
            let mut r = EsriError::new(499, "Token Required")
                .detail("send a token from /arcgis/tokens/generateToken, or Digest or Basic")
                .response();
            *r.status_mut() = hyper::StatusCode::UNAUTHORIZED;
            for c in app.security.challenges(stale) {
                if let Ok(v) = HeaderValue::from_str(&c) {
                    r.headers_mut().append(WWW_AUTHENTICATE, v);
                }
            }
            Err(Box::new(r))
        }
        AuthOutcome::Throttled { retry_after_secs } => Err(Box::new(throttled(retry_after_secs))),
    }
}

fn throttled(retry_after_secs: u64) -> Resp {
    crate::metrics::record(|m| m.shed.with_label_values(&["auth_throttled"]).inc());
    let mut r = EsriError::new(429, "Too many failed logins.")
        .detail("retry after the time Retry-After gives")
        .response();
    r.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(retry_after_secs));
    r
}

async fn handle(
    app: &Arc<App>,
    ctx: &Ctx,
    method: &Method,
    page: Page,
    conn: Option<&super::conn::Activity>,
) -> Result<Resp, EsriError> {
    let format = Format::of(last(&ctx.params, "f"))?;
    if !page.open() && !ctx.caller.has(Role::GeoWriter) && !ctx.caller.has(Role::Admin) {
        return Err(EsriError::new(
            403,
            "You do not have permissions to access this resource or perform this operation.",
        )
        .detail("geo-data-services-writer or admin is needed"));
    }
    match page {
        Page::Info => Ok(json_answer(&info(app, ctx))),
        Page::GenerateToken => {
            if method != Method::POST {
                return Err(EsriError::new(405, "Method not allowed.")
                    .detail("generateToken takes its credentials by POST"));
            }
            generate_token(app, ctx, conn).await
        }
        Page::Services => Ok(json_answer(&services(app, ctx))),
        Page::Service(s) => Ok(json_answer(&service_info(app, ctx, &s).await?)),
        Page::Layers(s) => {
            let service = describe(app, ctx, &s, None).await?;
            let layers: Vec<Value> = layer_list(&service)
                .iter()
                .map(|m| layer_info(app, m))
                .collect();
            Ok(json_answer(&json!({"layers": layers, "tables": []})))
        }
        Page::Layer(s, l) => {
            let described = describe(app, ctx, &s, Some(l)).await?;
            Ok(json_answer(&layer_info(app, &described["metadata"])))
        }
        Page::Query(s, l) => query(app, ctx, &s, l, format).await,
        Page::NotFound => Err(EsriError::new(404, "Requested resource not found.")
            .detail(format!("no resource at {}", ctx.path))),
    }
}

/// The `f` of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Json,
    GeoJson,
    Pbf,
}

impl Format {
    fn of(f: Option<&str>) -> Result<Format, EsriError> {
        match f.map(str::to_ascii_lowercase).as_deref() {
            None | Some("json") | Some("pjson") => Ok(Format::Json),
            Some("geojson") => Ok(Format::GeoJson),
            Some("pbf") => Ok(Format::Pbf),
            Some(other) => Err(EsriError::invalid(format!(
                "f={other} is not served; use json, pjson, geojson or pbf"
            ))),
        }
    }
}

fn json_answer(v: &Value) -> Resp {
    response::json_value(200, v)
}

fn info(app: &App, ctx: &Ctx) -> Value {
    let origin = super::ogc::origin(app, ctx);
    json!({
        "currentVersion": CURRENT_VERSION,
        "fullVersion": FULL_VERSION,
        "authInfo": {
            "isTokenBasedSecurity": true,
            "tokenServicesUrl": format!("{origin}/arcgis/tokens/generateToken"),
            "shortLivedTokenValidity": DEFAULT_TOKEN_MINUTES,
        },
    })
}

async fn generate_token(
    app: &App,
    ctx: &Ctx,
    conn: Option<&super::conn::Activity>,
) -> Result<Resp, EsriError> {
    let refused = || EsriError::new(400, "Unable to generate token.");
    let user = last(&ctx.params, "username")
        .ok_or_else(|| refused().detail("'username' must be specified."))?;
    let password = last(&ctx.params, "password")
        .ok_or_else(|| refused().detail("'password' must be specified."))?;
    let minutes = match last(&ctx.params, "expiration") {
        None => DEFAULT_TOKEN_MINUTES,
        Some(m) => m.trim().parse::<u64>().map_err(|_| {
            refused().detail(format!("expiration {m:?} is not a number of minutes"))
        })?,
    };
    let peer = conn.and_then(|c| c.peer);
    match app
        .security
        .issue_token(&app.store, user, password, minutes, peer)
        .await
    {
        Ok((token, expires)) => Ok(json_answer(
            &json!({"token": token, "expires": expires, "ssl": false}),
        )),
        Err(TokenRefusal::Credentials) => Err(refused().detail("Invalid username or password.")),
        Err(TokenRefusal::Throttled(secs)) => Ok(throttled(secs)),
    }
}

fn services(app: &App, ctx: &Ctx) -> Value {
    let origin = super::ogc::origin(app, ctx);
    let services: Vec<Value> = app
        .features
        .descriptors(ctx.caller.roles())
        .iter()
        .map(|d| {
            json!({"name": d.name, "type": "FeatureServer",
                   "url": format!("{origin}/arcgis/rest/services/{}/FeatureServer",
                                  super::ogc::enc(&d.name))})
        })
        .collect();
    json!({"currentVersion": CURRENT_VERSION, "folders": [], "services": services})
}

/// geoQueryService's description of service `service` (`layer` none) or of one layer.
async fn describe(
    app: &Arc<App>,
    ctx: &Ctx,
    service: &str,
    layer: Option<i64>,
) -> Result<Value, EsriError> {
    let mut params = json!({"id": service});
    if let Some(l) = layer {
        params["layer"] = l.into();
    }
    let body = json!({ "params": params }).to_string();
    let out = feature_service::answer(app, ctx, Bytes::from(body)).await?;
    serde_json::from_slice(&out)
        .map_err(|e| EsriError::new(500, "Internal error").detail(e.to_string()))
}

/// The metadata of each layer of a service's description.
fn layer_list(service: &Value) -> Vec<&Value> {
    service["layers"]
        .as_array()
        .map(|a| a.iter().map(|l| &l["metadata"]).collect())
        .unwrap_or_default()
}

fn wgs84() -> Value {
    json!({"wkid": 4326, "latestWkid": 4326})
}

/// An extent with its spatial reference, or the world's.
fn extent_of(v: &Value) -> Value {
    let mut e = match v {
        Value::Object(m) if m.contains_key("xmin") => Value::Object(m.clone()),
        _ => json!({"xmin": -180.0, "ymin": -90.0, "xmax": 180.0, "ymax": 90.0}),
    };
    e["spatialReference"] = wgs84();
    e
}

async fn service_info(app: &Arc<App>, ctx: &Ctx, service: &str) -> Result<Value, EsriError> {
    let d = describe(app, ctx, service, None).await?;
    let description = d["description"].as_str().unwrap_or_default();
    let extent = extent_of(&d["extent"]);
    let layers: Vec<Value> = layer_list(&d)
        .iter()
        .map(|m| {
            json!({"id": m["id"], "name": m["name"], "parentLayerId": -1,
                   "defaultVisibility": true, "subLayerIds": null, "minScale": 0, "maxScale": 0,
                   "type": "Feature Layer",
                   "geometryType": feature_set::esri_geometry_type(m["geometryType"].as_str())})
        })
        .collect();
    Ok(json!({
        "currentVersion": CURRENT_VERSION,
        "serviceDescription": description,
        "hasVersionedData": false,
        "supportsDisconnectedEditing": false,
        "hasStaticData": false,
        "maxRecordCount": d["maxRecordCount"],
        "supportedQueryFormats": "JSON, geoJSON, PBF",
        "capabilities": "Query",
        "description": description,
        "copyrightText": d["copyrightText"].as_str().unwrap_or_default(),
        "spatialReference": wgs84(),
        "initialExtent": extent,
        "fullExtent": extent,
        "allowGeometryUpdates": false,
        "units": "esriDecimalDegrees",
        "syncEnabled": false,
        "supportsQueryDataElements": false,
        "layers": layers,
        "tables": [],
    }))
}

/// A layer's info, from its metadata in geoQueryService's description.
fn layer_info(app: &App, m: &Value) -> Value {
    let id_field = m["idField"].as_str().unwrap_or("OBJECTID");
    let fields = feature_set::esri_fields(m["fields"].as_array().map(Vec::as_slice), id_field);
    let geometry_type = feature_set::esri_geometry_type(m["geometryType"].as_str());
    let renderer = match geometry_type {
        "esriGeometryPolygon" => json!({"type": "simple", "symbol": {
            "type": "esriSFS", "style": "esriSFSSolid", "color": [75, 172, 198, 161],
            "outline": {"type": "esriSLS", "style": "esriSLSSolid",
                        "color": [150, 150, 150, 155], "width": 0.5}}}),
        "esriGeometryPolyline" => json!({"type": "simple", "symbol": {
            "type": "esriSLS", "style": "esriSLSSolid", "color": [247, 150, 70, 204],
            "width": 2}}),
        _ => json!({"type": "simple", "symbol": {
            "type": "esriSMS", "style": "esriSMSCircle", "color": [45, 172, 128, 161],
            "size": 7.5, "outline": {"type": "esriSLS", "style": "esriSLSSolid",
                                     "color": [190, 190, 190, 105], "width": 0.5}}}),
    };
    let mut info = Map::new();
    let mut put = |k: &str, v: Value| {
        info.insert(k.to_string(), v);
    };
    put("currentVersion", CURRENT_VERSION.into());
    put("id", m["id"].clone());
    put("name", m["name"].clone());
    put("type", "Feature Layer".into());
    put(
        "description",
        m["description"].as_str().unwrap_or_default().into(),
    );
    put("geometryType", geometry_type.into());
    put("sourceSpatialReference", wgs84());
    put("copyrightText", "".into());
    put("parentLayer", Value::Null);
    put("subLayers", json!([]));
    put("minScale", 0.into());
    put("maxScale", 0.into());
    put("defaultVisibility", true.into());
    put("extent", extent_of(&m["extent"]));
    put("hasAttachments", false.into());
    put("htmlPopupType", "esriServerHTMLPopupTypeNone".into());
    put(
        "displayField",
        m["displayField"].as_str().unwrap_or(id_field).into(),
    );
    put("typeIdField", Value::Null);
    put("fields", Value::Array(fields));
    put("relationships", json!([]));
    put("canModifyLayer", false.into());
    put("canScaleSymbols", false.into());
    put("hasLabels", false.into());
    put("capabilities", "Query".into());
    put(
        "maxRecordCount",
        app.features.settings().max_record_count.into(),
    );
    put("supportsStatistics", true.into());
    put("supportsAdvancedQueries", true.into());
    put("supportedQueryFormats", "JSON, geoJSON, PBF".into());
    put("isDataVersioned", false.into());
    put(
        "ownershipBasedAccessControlForFeatures",
        json!({"allowOthersToQuery": true}),
    );
    put("useStandardizedQueries", true.into());
    put(
        "advancedQueryCapabilities",
        json!({
            "useStandardizedQueries": true, "supportsStatistics": true,
            "supportsHavingClause": false, "supportsCountDistinct": false,
            "supportsOrderBy": true, "supportsDistinct": false, "supportsPagination": true,
            "supportsTrueCurve": false, "supportsReturningQueryExtent": true,
            "supportsQueryWithDistance": true, "supportsSqlExpression": false,
            "supportsPaginationOnAggregatedQueries": false,
        }),
    );
    put("supportsCoordinatesQuantization", true.into());
    put(
        "drawingInfo",
        json!({"renderer": renderer, "labelingInfo": null}),
    );
    put("hasM", false.into());
    put("hasZ", false.into());
    put("allowGeometryUpdates", false.into());
    put("objectIdField", id_field.into());
    put(
        "uniqueIdField",
        json!({"name": id_field, "isSystemMaintained": true}),
    );
    put("globalIdField", "".into());
    put("types", json!([]));
    put("templates", json!([]));
    put("spatialReference", wgs84());
    if let Some(t) = m.get("timeInfo").filter(|t| t.is_object()) {
        put("timeInfo", t.clone());
    }
    Value::Object(info)
}

/// The query parameters passed on to geoQueryService as they are (it reads Esri's names,
/// forms and prefixes).
const PASSED: [&str; 17] = [
    "where",
    "objectIds",
    "outFields",
    "returnCountOnly",
    "returnIdsOnly",
    "orderByFields",
    "resultOffset",
    "resultRecordCount",
    "outStatistics",
    "groupByFieldsForStatistics",
    "time",
    "geometry",
    "geometryType",
    "spatialRel",
    "inSR",
    "distance",
    "units",
];

async fn query(
    app: &Arc<App>,
    ctx: &Ctx,
    service: &str,
    layer: i64,
    format: Format,
) -> Result<Resp, EsriError> {
    let p = &ctx.params;
    let mut shape = feature_set::shape_of(p)?;
    // ArcGIS returns geometries unless told not to; geoQueryService, only when asked.
    let geometry = last(p, "returnGeometry").is_none() || feature_set::yes(p, "returnGeometry")?;
    let extent_only = feature_set::yes(p, "returnExtentOnly")?;
    let count_only = feature_set::yes(p, "returnCountOnly")?;
    let statistics = last(p, "outStatistics").is_some();
    if format == Format::Pbf {
        if extent_only || statistics {
            return Err(EsriError::invalid(
                "f=pbf answers features, ids and counts; ask for extents and statistics \
                 with f=json",
            ));
        }
        if app.spread().is_some() {
            return Err(EsriError::invalid(
                "f=pbf is not served yet by a cluster whose nodes hold some shards each; use \
                 f=json",
            ));
        }
        shape.pbf = Some(feature_set::quantization_of(p, shape.web_mercator)?);
    }
    if format != Format::GeoJson && !extent_only && !statistics && app.spread().is_none() {
        // Written as Esri JSON by the query itself, from the parameters as sent.
        let max_vertices = app.features.settings().max_query_vertices;
        let pairs = std::iter::once(("returnGeometry", if geometry { "true" } else { "false" }))
            .chain(p.pairs().filter(|(k, _)| *k != "returnGeometry"));
        let mut request = FeatureRequest::from_params(service, layer, pairs, max_vertices)
            .map_err(ApiError::from)?;
        request.query.esri = Some(shape);
        let out = feature_service::run(app, &ctx.caller, request).await?;
        let kind = match format {
            Format::Pbf => "application/x-protobuf",
            _ => "application/json; charset=utf-8",
        };
        return Ok(response::with_body(200, kind, out));
    }
    let mut q = Map::new();
    for name in PASSED {
        if let Some(v) = last(p, name) {
            q.insert(name.to_string(), v.into());
        }
    }
    q.insert("returnGeometry".into(), geometry.into());
    if extent_only {
        let (extent, count) = extent(app, ctx, service, layer, q.clone()).await?;
        let mut out = json!({ "extent": feature_set::extent(&shape, extent) });
        if count_only {
            out["count"] = count.into();
        }
        return Ok(json_answer(&out));
    }
    // geoQueryService's answer, written again: statistics, GeoJSON, and every answer of a
    // cluster whose nodes hold some shards each.
    let answer =
        feature_service::answer(app, ctx, Bytes::from(query_body(service, layer, &q))).await?;
    let geometry_type = app
        .features
        .descriptor(service, ctx.caller.roles())
        .and_then(|d| {
            d.layers
                .iter()
                .find(|l| l.id == layer)
                .map(|l| l.geometry_type.clone())
        })
        .filter(|_| geometry);
    let (out, kind) = match format {
        Format::GeoJson => (
            feature_set::geojson(&answer, &shape)?,
            "application/geo+json",
        ),
        _ => (
            feature_set::esri_json(&answer, geometry_type.as_deref(), &shape)?,
            "application/json; charset=utf-8",
        ),
    };
    Ok(response::with_body(200, kind, out))
}

/// The geoQueryService request of a query of `layer` of `service`.
fn query_body(service: &str, layer: i64, q: &Map<String, Value>) -> String {
    json!({"params": {"id": service, "layer": layer, "method": "query"}, "query": q}).to_string()
}

/// `returnExtentOnly`: the box of the matching features' geometries, read a page at a time
/// (in id order, each page after the last id seen), and how many matched.
async fn extent(
    app: &Arc<App>,
    ctx: &Ctx,
    service: &str,
    layer: i64,
    mut q: Map<String, Value>,
) -> Result<(Option<[f64; 4]>, u64), EsriError> {
    let page = app.features.settings().max_record_count.max(1);
    q.remove("returnCountOnly");
    q.remove("returnIdsOnly");
    q.remove("outStatistics");
    q.insert("returnGeometry".into(), true.into());
    q.insert("outFields".into(), "".into());
    q.insert("orderByFields".into(), "".into());
    q.insert("resultRecordCount".into(), page.into());
    let mut bbox: Option<[f64; 4]> = None;
    let mut count = 0u64;
    let mut offset = 0usize;
    loop {
        q.insert("resultOffset".into(), offset.into());
        let answer =
            feature_service::answer(app, ctx, Bytes::from(query_body(service, layer, &q))).await?;
        let (got, more) = feature_set::extend_box(&answer, &mut bbox)?;
        count += got as u64;
        offset += got;
        if !more || got == 0 {
            return Ok((bbox, count));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages() {
        assert_eq!(Page::of("/rest/info"), Page::Info);
        assert_eq!(Page::of("/tokens/generateToken"), Page::GenerateToken);
        assert_eq!(Page::of("/rest/services/"), Page::Services);
        assert_eq!(
            Page::of("/rest/services/US%20Counties/FeatureServer"),
            Page::Service("US Counties".into())
        );
        assert_eq!(
            Page::of("/rest/services/A+B/FeatureServer/layers"),
            Page::Layers("A+B".into())
        );
        assert_eq!(
            Page::of("/rest/services/S/FeatureServer/2"),
            Page::Layer("S".into(), 2)
        );
        assert_eq!(
            Page::of("/rest/services/S/FeatureServer/0/query"),
            Page::Query("S".into(), 0)
        );
        assert_eq!(Page::of("/rest/services/S/FeatureServer/x"), Page::NotFound);
        assert_eq!(Page::of("/rest/services/S/MapServer"), Page::NotFound);
    }

    #[test]
    fn a_form_body_wins_over_the_query_string() {
        let mut headers = hyper::HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/x-www-form-urlencoded"),
        );
        let p = parameters(
            Some("f=json&resultOffset=0"),
            &headers,
            b"resultOffset=10&where=a%20%3D%201",
        );
        assert_eq!(last(&p, "resultOffset"), Some("10"));
        assert_eq!(last(&p, "where"), Some("a = 1"));
        assert_eq!(last(&p, "f"), Some("json"));
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let p = parameters(Some("f=json"), &headers, b"where=x");
        assert_eq!(last(&p, "where"), None);
    }

    #[test]
    fn tokens_come_from_the_parameter_or_a_bearer_header() {
        let mut headers = hyper::HeaderMap::new();
        let none = Params::parse(None);
        assert_eq!(token(&none, &headers), None);
        headers.insert(
            "x-esri-authorization",
            HeaderValue::from_static("Bearer abc"),
        );
        assert_eq!(token(&none, &headers), Some("abc"));
        headers.insert(AUTHORIZATION, HeaderValue::from_static("bearer def"));
        assert_eq!(token(&none, &headers), Some("def"));
        let p = Params::parse(Some("token=ghi"));
        assert_eq!(token(&p, &headers), Some("ghi"));
        headers.insert(AUTHORIZATION, HeaderValue::from_static("Basic xyz"));
        headers.remove("x-esri-authorization");
        assert_eq!(token(&none, &headers), None);
    }
}
