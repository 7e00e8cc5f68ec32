//! Routing: a plain match on path, then on method. Authentication comes first for every path
//! but `/health`, so an anonymous client learns nothing about what exists.

use std::sync::Arc;

use hyper::header::{ALLOW, AUTHORIZATION, HeaderValue, RETRY_AFTER};
use hyper::{Method, Request};

use super::names::{AFTER, OPENAPI};
use super::params::Params;
use super::response::{self, Resp};
use super::{App, BoxError, Ctx, documents, feature_service, flows, manage};
use crate::error::{ApiError, ErrorCode};
use crate::security::AuthOutcome;
use bytes::Bytes;

/// The endpoint families, by path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    Health,
    Ready,
    Metrics,
    OpenApi,
    Ping,
    Documents,
    Users,
    User(String),
    UserProperties(String),
    ModelService,
    GeoQueryService,
    Deploy,
    Traces,
    Diagnostics,
    Cluster,
    /// OGC API – Features: the path after `/ogc`.
    Ogc(String),
    /// Vector tiles and TileJSON: the path after `/tiles/`.
    Tiles(String),
    /// The map page (`/`, an empty path) and its files: the path after `/map/`.
    Map(String),
    /// The GeoServices REST API: the path after `/arcgis`.
    ArcGis(String),
    /// Geofences: the path after `/v1/fences`.
    Fences(String),
    NotFound,
}

impl Route {
    fn of(path: &str) -> Route {
        match path {
            "/health" => Route::Health,
            "/ready" => Route::Ready,
            "/metrics" => Route::Metrics,
            "/v1/openapi.json" => Route::OpenApi,
            "/v1/ping" => Route::Ping,
            "/v1/documents" => Route::Documents,
            "/manage/v2/users" => Route::Users,
            "/v1/resources/modelService" => Route::ModelService,
            "/v1/resources/geoQueryService" => Route::GeoQueryService,
            "/v1/deploy" => Route::Deploy,
            "/v1/traces" => Route::Traces,
            "/v1/diagnostics" => Route::Diagnostics,
            "/v1/cluster" => Route::Cluster,
            "/" => Route::Map(String::new()),
            _ => {
                if let Some(rest) = path.strip_prefix("/map/") {
                    return Route::Map(rest.to_string());
                }
                if let Some(rest) = path.strip_prefix("/tiles/") {
                    return Route::Tiles(rest.to_string());
                }
                if let Some(rest) = path.strip_prefix("/arcgis/") {
                    return Route::ArcGis(rest.to_string());
                }
                if path == "/v1/fences" || path.starts_with("/v1/fences/") {
                    return Route::Fences(path["/v1/fences".len()..].to_string());
                }
                if path == "/ogc" || path.starts_with("/ogc/") {
                    return Route::Ogc(path["/ogc".len()..].to_string());
                }
                if let Some(rest) = path.strip_prefix("/manage/v2/users/") {
                    let decode = |s: &str| {
                        form_urlencoded::parse(format!("n={s}").as_bytes())
                            .next()
                            .map(|(_, v)| v.into_owned())
                            .unwrap_or_default()
                    };
                    if let Some(name) = rest.strip_suffix("/properties") {
                        if !name.is_empty() && !name.contains('/') {
                            return Route::UserProperties(decode(name));
                        }
                    } else if !rest.is_empty() && !rest.contains('/') {
                        return Route::User(decode(rest));
                    }
                }
                Route::NotFound
            }
        }
    }

    fn methods(&self) -> &'static [Method] {
        match self {
            Route::Health | Route::Ready | Route::Metrics => &[Method::GET, Method::HEAD],
            Route::Ping => &[Method::GET, Method::HEAD],
            Route::Documents => &[
                Method::GET,
                Method::HEAD,
                Method::PUT,
                Method::POST,
                Method::DELETE,
            ],
            Route::Users => &[Method::GET, Method::POST],
            Route::User(_) => &[Method::GET, Method::DELETE],
            Route::UserProperties(_) => &[Method::GET, Method::PUT],
            Route::ModelService | Route::OpenApi => &[Method::GET],
            Route::GeoQueryService => &[Method::POST],
            Route::Deploy => &[Method::POST],
            Route::Traces | Route::Cluster => &[Method::GET],
            Route::Diagnostics | Route::Ogc(_) | Route::Tiles(_) | Route::Map(_) => &[Method::GET],
            Route::ArcGis(_) => &[Method::GET, Method::POST],
            // A fence itself is defined and removed; the list is read, and many fences are
            // defined by posting to it; a fence's events and failures are read.
            Route::Fences(rest) if rest.len() > 1 && !rest[1..].contains('/') => {
                &[Method::GET, Method::PUT, Method::DELETE]
            }
            Route::Fences(rest) if rest.trim_matches('/').is_empty() => {
                &[Method::GET, Method::POST]
            }
            Route::Fences(_) => &[Method::GET],
            Route::NotFound => &[],
        }
    }
}

/// `conn`: the state of the connection the request came over, when it did.
pub(super) async fn dispatch<B>(
    app: &Arc<App>,
    conn: Option<&super::conn::Activity>,
    req: Request<B>,
) -> Resp
where
    B: hyper::body::Body<Data = Bytes> + Send + Unpin,
    B::Error: Into<BoxError>,
{
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let route = Route::of(&path);
    let open = match route {
        Route::Health | Route::Ready => true,
        Route::Metrics => !app.config.metrics_auth,
        _ => false,
    };
    if open {
        return match parts.method {
            Method::GET | Method::HEAD => unauthenticated(app, &route),
            _ => method_not_allowed(&route, &parts.method, &path),
        };
    }

    // Before authentication: the entry waited for may be the one that made the caller's user.
    if let Some(refused) = wait_for_entry(app, &parts.headers).await {
        return refused;
    }
    if let Route::ArcGis(rest) = &route {
        // Tokens, Esri's errors: authenticated and answered in its own module.
        let req = Request::from_parts(parts, body);
        return super::arcgis::serve(app, conn, req, rest).await;
    }
    let target = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or(&path);
    let header = parts
        .headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let caller = match app.security.authenticate_on(
        parts.method.as_str(),
        target,
        header,
        conn.map(|c| &c.digest),
        conn.and_then(|c| c.peer),
    ) {
        AuthOutcome::Authenticated(c) => c,
        AuthOutcome::Challenge { stale } => {
            crate::metrics::record(|m| m.challenges.inc());
            return response::unauthorized(&app.security.challenges(stale));
        }
        AuthOutcome::Throttled { retry_after_secs } => {
            crate::metrics::record(|m| m.shed.with_label_values(&["auth_throttled"]).inc());
            let mut r = response::error(&ApiError::new(
                ErrorCode::TooManyRequests,
                "too many failed authentications from this client or for this user; \
                 retry after the time Retry-After gives",
            ));
            r.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(retry_after_secs));
            return r;
        }
    };
    let user = app
        .config
        .access_log
        .then(|| super::User(caller.name().to_string()));
    let mut resp = authenticated(app, conn, caller, route, parts, body, path).await;
    if let Some(user) = user {
        resp.extensions_mut().insert(user);
    }
    resp
}

/// Cluster mode: wait until this node has applied the entry `X-Geoshard-After` names, within
/// `query_time_limit_ms` (10 s when that is 0); the refusal when it has not or the header is
/// not a number. Outside a cluster the header is ignored.
async fn wait_for_entry(app: &App, headers: &hyper::HeaderMap) -> Option<Resp> {
    let cluster = app.cluster.get()?;
    let value = headers.get(AFTER)?;
    let Some(seq) = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
    else {
        return Some(response::error(&ApiError::new(
            ErrorCode::InvalidRequest,
            "X-Geoshard-After must be a log sequence number (the X-Geoshard-Sequence of an \
             earlier answer)",
        )));
    };
    let limit = match app.config.query_time_limit_ms {
        0 => std::time::Duration::from_secs(10),
        ms => std::time::Duration::from_millis(ms),
    };
    if cluster.wait_visible(seq, limit).await {
        return None;
    }
    let visible = cluster.visible();
    let message = if visible >= seq {
        format!(
            "this node has applied the cluster's log entry {seq}, but a view it changes is \
             still being built; retry shortly or ask another node"
        )
    } else {
        format!(
            "this node has applied the cluster's log up to entry {visible}, not yet {seq}; \
             retry shortly or ask another node"
        )
    };
    let mut r = response::error(&ApiError::new(ErrorCode::Unavailable, message));
    r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(1));
    Some(r)
}

/// The rest of [`dispatch`], for an authenticated caller.
async fn authenticated<B>(
    app: &Arc<App>,
    conn: Option<&super::conn::Activity>,
    caller: crate::acl::Caller,
    route: Route,
    parts: hyper::http::request::Parts,
    body: B,
    path: String,
) -> Resp
where
    B: hyper::body::Body<Data = Bytes> + Send + Unpin,
    B::Error: Into<BoxError>,
{
    if let Some(refused) = super::reserve_refusal(conn, &caller) {
        return refused;
    }

    if route == Route::NotFound {
        return response::error(&ApiError::new(
            ErrorCode::UnknownEndpoint,
            format!("no endpoint at {path}"),
        ));
    }
    if !route.methods().contains(&parts.method) {
        return method_not_allowed(&route, &parts.method, &path);
    }

    let ctx = Ctx {
        caller,
        params: Params::parse(parts.uri.query()),
        headers: parts.headers,
        path,
    };
    let method = parts.method;
    let result = match route {
        Route::Health | Route::Ready | Route::ArcGis(_) | Route::NotFound => unreachable_route(),
        Route::Metrics => Ok(metrics(app, ctx.caller.has(crate::acl::Role::Admin))),
        Route::OpenApi => Ok(response::json_bytes(
            200,
            Bytes::from_static(OPENAPI.as_bytes()),
        )),
        Route::Ping => Ok(response::empty(204)),
        Route::Documents => match method {
            Method::PUT => documents::put(app, &ctx, body).await,
            Method::POST => documents::post_bulk(app, &ctx, body).await,
            Method::DELETE => documents::delete(app, &ctx).await,
            _ => documents::get(app, &ctx).await,
        },
        Route::Users => match method {
            Method::POST => manage::create_user(app, &ctx, body).await,
            _ => manage::list_users(app, &ctx),
        },
        Route::User(name) => match method {
            Method::DELETE => manage::delete_user(app, &ctx, &name).await,
            _ => manage::get_user(app, &ctx, &name),
        },
        Route::UserProperties(name) => match method {
            Method::PUT => manage::update_user(app, &ctx, &name, body).await,
            _ => manage::get_user(app, &ctx, &name),
        },
        Route::ModelService => feature_service::model_service(app, &ctx),
        Route::GeoQueryService => feature_service::geo_query(app, &ctx, body).await,
        Route::Deploy => flows::deploy(app, &ctx, body).await,
        Route::Traces => flows::traces(app, &ctx),
        Route::Diagnostics => feature_service::diagnostics(app, &ctx),
        Route::Cluster => manage::cluster(app, &ctx),
        Route::Fences(rest) => super::fences::serve(app, &ctx, &method, &rest, body).await,
        Route::Ogc(rest) => super::ogc::get(app, &ctx, &rest).await,
        Route::Tiles(rest) => super::tiles::get(app, &ctx, &rest).await,
        Route::Map(rest) => match rest.strip_prefix("base/") {
            Some(tile) => super::basemap::get(&ctx, tile).await,
            None => super::map::get(&ctx, &rest),
        },
    };
    result.unwrap_or_else(|e| {
        if e.status() >= 500 {
            tracing::error!(code = e.code.message_code(), message = %e.message, "request failed");
        }
        response::error(&e)
    })
}

/// A request's route as a metrics label: one of a few fixed names.
pub(super) fn label(path: &str) -> &'static str {
    match Route::of(path) {
        Route::Health => "health",
        Route::Ready => "ready",
        Route::Metrics => "metrics",
        Route::OpenApi => "openapi",
        Route::Ping => "ping",
        Route::Documents => "documents",
        Route::Users | Route::User(_) | Route::UserProperties(_) => "users",
        Route::ModelService => "modelService",
        Route::GeoQueryService => "geoQueryService",
        Route::Deploy => "deploy",
        Route::Traces => "traces",
        Route::Diagnostics => "diagnostics",
        Route::Cluster => "cluster",
        Route::Ogc(_) => "ogc",
        Route::Tiles(_) => "tiles",
        Route::Map(_) => "map",
        Route::ArcGis(rest) => super::arcgis::label(&rest),
        Route::Fences(rest) if rest.ends_with("/events") => "fenceEvents",
        Route::Fences(_) => "fences",
        Route::NotFound => "unknown",
    }
}

/// The routes served before authentication: liveness, readiness, and the metrics unless
/// `metrics_auth`.
fn unauthenticated(app: &App, route: &Route) -> Resp {
    match route {
        Route::Ready => ready(app),
        Route::Metrics => metrics(app, false),
        _ => health(app),
    }
}

/// Readiness: this answers only once the store is open, every view and index built and the
/// project (if any) deployed, since the server listens after all of that.
/// In a cluster, only once the node has applied what the log held when it started.
fn ready(app: &App) -> Resp {
    let (layers, _) = app.features.sizes();
    let mut body = serde_json::json!({
        "status": "ready",
        "store": "open",
        "layers": layers.len(),
    });
    let mut status = 200;
    if let Some(c) = app.cluster.get() {
        if !c.caught_up() {
            status = 503;
            body["status"] = "catching up".into();
        }
        body["cluster"] = serde_json::json!({
            "node": c.node(),
            "applied": c.visible(),
            "log_last": c.log_last(),
        });
    }
    response::json_value(status, &body)
}

/// The Prometheus text format, with the gauges read now. The gauges labelled with service and
/// view names, and their row counts over every row, are on the page only for an admin
/// (`data`): anyone else, anonymous scrapes included, learns nothing of what is stored.
fn metrics(app: &App, data: bool) -> Resp {
    // One page at a time: the labelled gauges are filled for an admin's page and emptied for
    // another's, in one registry.
    static PAGE: parking_lot::Mutex<()> = parking_lot::Mutex::new(());
    let _page = PAGE.lock();
    let m = &crate::metrics::METRICS;
    m.features.reset();
    m.shard_features.reset();
    if data {
        let (layers, shards) = app.features.sizes();
        for (service, layer, rows) in layers {
            m.features
                .with_label_values(&[service.as_str(), layer.to_string().as_str()])
                .set(rows as i64);
        }
        for (view, shard, n) in shards {
            m.shard_features
                .with_label_values(&[view.as_str(), shard.to_string().as_str()])
                .set(n as i64);
        }
    }
    if let Some(rss) = crate::metrics::resident_bytes() {
        m.resident_bytes.set(rss);
    }
    if let Ok(meta) = std::fs::metadata(app.store.path()) {
        m.store_bytes.set(meta.len() as i64);
    }
    m.view_builds.set(i64::from(app.features.rebuilding()));
    m.tile_cache_bytes
        .set(app.features.tiles().usage().1 as i64);
    if let Some(c) = app.cluster.get() {
        m.cluster_applied.set(c.visible() as i64);
        m.cluster_log_last.set(c.log_last() as i64);
        let overview = c.overview(app.config.cluster_shard_replicas);
        m.cluster_nodes.set(overview.nodes.len() as i64);
        if let Some(shards) = &overview.shards {
            let held = app.features.placement().map_or(0, |p| p.held().len());
            m.cluster_shards_held.set(held as i64);
            m.cluster_shards_under_replicated
                .set(shards.under_replicated.len() as i64);
        }
    }
    let mut r = hyper::Response::new(http_body_util::Full::new(Bytes::from(
        crate::metrics::encode(),
    )));
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

fn unreachable_route() -> Result<Resp, ApiError> {
    Err(ApiError::new(ErrorCode::Internal, "routing error"))
}

fn method_not_allowed(route: &Route, method: &Method, path: &str) -> Resp {
    let allowed: Vec<&str> = route.methods().iter().map(|m| m.as_str()).collect();
    let mut r = response::error(&ApiError::new(
        ErrorCode::MethodNotAllowed,
        format!("endpoint {path} does not support method {method}"),
    ));
    if let Ok(v) = HeaderValue::from_str(&allowed.join(", ")) {
        r.headers_mut().insert(ALLOW, v);
    }
    r
}

fn health(app: &App) -> Resp {
    use std::sync::atomic::Ordering::Relaxed;
    let stats = app.store.stats();
    response::json_value(
        200,
        &serde_json::json!({
            "status": "ok",
            "version": env!("CARGO_PKG_VERSION"),
            "uptimeSecs": app.started.elapsed().as_secs(),
            "commits": stats.commits.load(Relaxed),
            "writes": stats.writes.load(Relaxed),
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every route the router knows is in the OpenAPI document with exactly its methods, and
    /// the document has nothing else.
    #[test]
    fn the_openapi_document_is_the_router() {
        let doc: serde_json::Value = serde_json::from_str(OPENAPI).unwrap();
        let mut seen = Vec::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            let route = Route::of(
                &path
                    .replace("{name}", "ann")
                    .replace("{collectionId}", "c.0")
                    .replace("{featureId}", "1")
                    .replace("{z}", "0")
                    .replace("{x}", "0")
                    .replace("{y}", "0")
                    .replace("{asset}", "map.js")
                    .replace("{arcgisPath}", "rest/info"),
            );
            assert_ne!(route, Route::NotFound, "{path} is no route");
            let mut documented: Vec<String> = item
                .as_object()
                .unwrap()
                .keys()
                .filter(|k| *k != "parameters")
                .map(|k| k.to_ascii_uppercase())
                .collect();
            documented.sort();
            let mut served: Vec<String> = route.methods().iter().map(|m| m.to_string()).collect();
            served.sort();
            assert_eq!(documented, served, "{path}");
            seen.push(std::mem::discriminant(&route));
        }
        let all = [
            Route::Health,
            Route::Ready,
            Route::Metrics,
            Route::OpenApi,
            Route::Ping,
            Route::Documents,
            Route::Users,
            Route::User("a".into()),
            Route::UserProperties("a".into()),
            Route::ModelService,
            Route::GeoQueryService,
            Route::Deploy,
            Route::Traces,
            Route::Diagnostics,
            Route::Cluster,
            Route::Ogc(String::new()),
            Route::Tiles(String::new()),
            Route::Map(String::new()),
            Route::ArcGis(String::new()),
            Route::Fences(String::new()),
        ];
        for r in all {
            // A new route must be added here, and to the document.
            match r {
                Route::Health
                | Route::Ready
                | Route::Metrics
                | Route::OpenApi
                | Route::Ping
                | Route::Documents
                | Route::Users
                | Route::User(_)
                | Route::UserProperties(_)
                | Route::ModelService
                | Route::GeoQueryService
                | Route::Deploy
                | Route::Traces
                | Route::Diagnostics
                | Route::Cluster
                | Route::Ogc(_)
                | Route::Tiles(_)
                | Route::Map(_)
                | Route::ArcGis(_)
                | Route::Fences(_)
                | Route::NotFound => {}
            }
            assert!(
                seen.contains(&std::mem::discriminant(&r)),
                "{r:?} is not in docs/openapi.json"
            );
        }
    }

    #[test]
    fn routes() {
        assert_eq!(Route::of("/v1/documents"), Route::Documents);
        assert_eq!(Route::of("/manage/v2/users/ann"), Route::User("ann".into()));
        assert_eq!(
            Route::of("/manage/v2/users/a%20b/properties"),
            Route::UserProperties("a b".into())
        );
        assert_eq!(Route::of("/manage/v2/users/a/b"), Route::NotFound);
        assert_eq!(Route::of("/v1/documentsx"), Route::NotFound);
        assert_eq!(Route::of("/"), Route::Map(String::new()));
        assert_eq!(Route::of("/map/map.js"), Route::Map("map.js".into()));
        assert_eq!(Route::of("/mapx"), Route::NotFound);
        assert_eq!(
            Route::of("/arcgis/rest/services"),
            Route::ArcGis("rest/services".into())
        );
    }
}
