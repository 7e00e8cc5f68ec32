//! The feature-service resource extensions: `GET /v1/resources/modelService` and
//! `POST /v1/resources/geoQueryService` (INTERFACE §4.2-4.3, docs/contract.md §5).
//!
//! Both need `geo-data-services-writer` (or `admin`), as the peer extension does; a user with
//! only `geo-data-services-reader` gets 403 here (it may still read descriptor documents
//! through `/v1/documents` when it also holds `rest-reader`).

use std::sync::Arc;

use bytes::Bytes;
use hyper::header::CONTENT_TYPE;
use serde_json::Value;

use super::Ctx;
use super::response::{self, Resp};
use super::{App, BoxError, read_body, require_any};
use crate::acl::Role;
use crate::error::{ApiError, ErrorCode};
use crate::features::{FeatureError, FeatureRequest};

/// Bodies above this are parsed on rayon with their query, not on the io thread: a query
/// geometry of thousands of positions takes milliseconds to parse and prepare.
const INLINE_PARSE_BYTES: usize = 64 * 1024;

fn require_writer(ctx: &Ctx) -> Result<(), ApiError> {
    require_any(&ctx.caller, &[Role::GeoWriter, Role::Admin])
}

pub(super) fn model_service(app: &App, ctx: &Ctx) -> Result<Resp, ApiError> {
    require_writer(ctx)?;
    ctx.params
        .only(&ctx.path, |k| k.starts_with("rs:") || k == "format")?;
    let roles = ctx.caller.roles();
    let mut body = serde_json::Map::new();
    body.insert("$version".into(), env!("CARGO_PKG_VERSION").into());
    match ctx.params.get("rs:id") {
        Some(name) => {
            let d = app.features.descriptor(name, roles).ok_or_else(|| {
                ApiError::new(
                    ErrorCode::ExtensionNotFound,
                    format!("Service {name} not found"),
                )
            })?;
            if let Value::Object(map) = &d.raw {
                for (k, v) in map {
                    body.insert(k.clone(), v.clone());
                }
            }
        }
        None => {
            let models: serde_json::Map<String, Value> = app
                .features
                .descriptors(roles)
                .iter()
                .map(|d| (d.name.clone(), d.listing()))
                .collect();
            body.insert("models".into(), Value::Object(models));
        }
    }
    Ok(response::json_value(200, &Value::Object(body)))
}

/// `GET /v1/diagnostics` (admin): the stored documents the views cannot use in full, as
/// the last build or write of each found them (rows skipped, or a geometry left out).
pub(super) fn diagnostics(app: &App, ctx: &Ctx) -> Result<Resp, ApiError> {
    require_any(&ctx.caller, &[Role::Admin])?;
    ctx.params.only(&ctx.path, |_| false)?;
    let (problems, omitted) = app.features.diagnostics();
    Ok(response::json_value(
        200,
        &serde_json::json!({"count": problems.len(), "omitted": omitted, "problems": problems}),
    ))
}

/// The JSON part of a `multipart/mixed` body (one official client sends the query so).
fn multipart_json(content_type: &str, body: &Bytes) -> Option<Bytes> {
    let boundary = super::multipart::boundary(content_type)?;
    let parts = super::multipart::parse(body, &boundary).ok()?;
    let part = parts.iter().find(|p| {
        p.header("content-type").is_none_or(|t| t.contains("json"))
            && p.body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
    })?;
    let start = part.body.as_ptr() as usize - body.as_ptr() as usize;
    Some(body.slice(start..start + part.body.len()))
}

pub(super) async fn geo_query<B>(app: &Arc<App>, ctx: &Ctx, body: B) -> Result<Resp, ApiError>
where
    B: hyper::body::Body<Data = Bytes> + Send + Unpin,
    B::Error: Into<BoxError>,
{
    require_writer(ctx)?;
    ctx.params
        .only(&ctx.path, |k| k.starts_with("rs:") || k == "format")?;
    let body = read_body(app, &ctx.headers, body).await?;
    let content_type = ctx
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    const MULTIPART: &str = "multipart/";
    let multipart = content_type
        .get(..MULTIPART.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(MULTIPART));
    let body = if multipart {
        multipart_json(content_type, &body).ok_or_else(|| {
            ApiError::new(
                ErrorCode::ExtensionInvalid,
                "the multipart body has no JSON part",
            )
        })?
    } else {
        body
    };
    Ok(response::json_bytes(200, answer(app, ctx, body).await?))
}

/// The geoQueryService answer to a request `body` (its JSON), for the caller of `ctx`: routed
/// over the cluster's nodes when they hold some shards each, parsed and run on rayon when
/// large or heavy, within `query_time_limit_ms`. The FeatureServer's queries come here too.
pub(super) async fn answer(app: &Arc<App>, ctx: &Ctx, body: Bytes) -> Result<Vec<u8>, ApiError> {
    let max_vertices = app.features.settings().max_query_vertices;
    let features = app.features.clone();
    let caller = ctx.caller.clone();
    let failed = || ApiError::new(ErrorCode::Internal, "the query failed");
    let limit = app.query_limit();
    if let Some(cluster) = app.spread() {
        // Nodes hold some shards each: the query is routed and its parts merged.
        let after = ctx.after();
        let out = within(
            limit,
            crate::cluster::spread::geo_query(cluster, &caller, after, body, limit, false),
        )
        .await??;
        return Ok(out);
    }
    if body.len() > INLINE_PARSE_BYTES {
        // A large body (a big query geometry) is parsed and prepared with the query, off the
        // io thread; what it freed goes back to the OS.
        let out = within(
            limit,
            crate::cpu::run_cpu_intensive(move || {
                let out = FeatureRequest::parse_for(caller.name(), &body, max_vertices).and_then(
                    |request| features.queries().execute_within(&caller, &request, limit),
                );
                drop(body);
                crate::features::release_freed_memory();
                out
            }),
        )
        .await?
        .ok_or_else(failed)??;
        return Ok(out);
    }
    let request = FeatureRequest::parse_for(ctx.caller.name(), &body, max_vertices)?;
    run(app, &caller, request).await
}

/// Run a parsed request on this node for `caller`: a light one (a point query) on the
/// calling task, any other on rayon, within `query_time_limit_ms`.
pub(super) async fn run(
    app: &Arc<App>,
    caller: &crate::acl::Caller,
    request: FeatureRequest,
) -> Result<Vec<u8>, ApiError> {
    let features = app.features.clone();
    let limit = app.query_limit();
    if request.is_light() {
        return Ok(features.queries().execute_within(caller, &request, limit)?);
    }
    let caller = caller.clone();
    let failed = || ApiError::new(ErrorCode::Internal, "the query failed");
    within(
        limit,
        crate::cpu::run_cpu_intensive(move || {
            features.queries().execute_within(&caller, &request, limit)
        }),
    )
    .await?
    .ok_or_else(failed)?
    .map_err(ApiError::from)
}

/// `work`, or a 503 naming `query_time_limit_ms` at the deadline. The work itself stops at
/// its next look at the clock; the answer does not wait for that.
async fn within<T>(
    limit: Option<(std::time::Instant, u64)>,
    work: impl std::future::Future<Output = T>,
) -> Result<T, ApiError> {
    match limit {
        None => Ok(work.await),
        Some((deadline, ms)) => tokio::time::timeout_at(deadline.into(), work)
            .await
            .map_err(|_| ApiError::from(FeatureError::TimeLimit(ms))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_json_part() {
        let body = b"--b1\r\nContent-Type: application/json\r\n\r\n{\"params\":{}}\r\n--b1--\r\n";
        let body = Bytes::from_static(body);
        let got = multipart_json("multipart/mixed; boundary=b1", &body).unwrap();
        assert_eq!(&got[..], b"{\"params\":{}}");
        assert!(multipart_json("multipart/mixed", &body).is_none());
    }
}
