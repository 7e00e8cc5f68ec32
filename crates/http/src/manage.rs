//! `/manage/v2/users`: user administration over REST, and `/v1/cluster`, the cluster's
//! nodes and shards; for `admin` only.

use bytes::Bytes;
use hyper::header::{HeaderValue, LOCATION};
use serde::Deserialize;

use super::Ctx;
use super::response::{self, Resp};
use super::{App, BoxError, read_body, require_any};
use crate::acl::Role;
use crate::error::{ApiError, ErrorCode};
use crate::security::UserRecord;

#[derive(Deserialize)]
struct NewUser {
    #[serde(rename = "user-name")]
    name: String,
    password: String,
    #[serde(rename = "role", default)]
    roles: Vec<String>,
}

#[derive(Deserialize)]
struct UserProperties {
    password: Option<String>,
    #[serde(rename = "role")]
    roles: Option<Vec<String>>,
}

fn admin_only(ctx: &Ctx) -> Result<(), ApiError> {
    require_any(&ctx.caller, &[Role::Admin])?;
    ctx.params.only(&ctx.path, |k| k == "format")
}

fn parse_json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            ErrorCode::InvalidRequest,
            format!("invalid user record: {e}"),
        )
    })
}

pub(super) async fn create_user<B>(app: &App, ctx: &Ctx, body: B) -> Result<Resp, ApiError>
where
    B: hyper::body::Body<Data = Bytes> + Send + Unpin,
    B::Error: Into<BoxError>,
{
    admin_only(ctx)?;
    let body = read_body(app, &ctx.headers, body).await?;
    let user: NewUser = parse_json(&body)?;
    app.security
        .create_user(
            &app.store,
            &ctx.caller,
            &user.name,
            &user.password,
            &user.roles,
        )
        .await?;
    tracing::info!(user = %user.name, by = ctx.caller.name(), "user created");
    let mut r = response::empty(201);
    let location = format!(
        "/manage/v2/users/{}",
        form_urlencoded::byte_serialize(user.name.as_bytes()).collect::<String>()
    );
    if let Ok(v) = HeaderValue::from_str(&location) {
        r.headers_mut().insert(LOCATION, v);
    }
    Ok(r)
}

fn user_json(u: &UserRecord) -> serde_json::Value {
    serde_json::json!({ "user-name": u.name, "role": u.roles })
}

pub(super) fn list_users(app: &App, ctx: &Ctx) -> Result<Resp, ApiError> {
    admin_only(ctx)?;
    let users = app.security.list_users(&app.store)?;
    let items: Vec<serde_json::Value> = users
        .iter()
        .map(|u| {
            serde_json::json!({
                "nameref": u.name,
                "uriref": format!("/manage/v2/users/{}", u.name),
                "role": u.roles,
            })
        })
        .collect();
    Ok(response::json_value(
        200,
        &serde_json::json!({
            "user-default-list": {
                "list-items": {
                    "list-count": { "value": items.len(), "units": "quantity" },
                    "list-item": items,
                }
            }
        }),
    ))
}

pub(super) fn get_user(app: &App, ctx: &Ctx, name: &str) -> Result<Resp, ApiError> {
    admin_only(ctx)?;
    let users = app.security.list_users(&app.store)?;
    let user = users.iter().find(|u| u.name == name).ok_or_else(|| {
        ApiError::new(ErrorCode::NoDocument, format!("user {name} does not exist"))
    })?;
    Ok(response::json_value(200, &user_json(user)))
}

pub(super) async fn update_user<B>(
    app: &App,
    ctx: &Ctx,
    name: &str,
    body: B,
) -> Result<Resp, ApiError>
where
    B: hyper::body::Body<Data = Bytes> + Send + Unpin,
    B::Error: Into<BoxError>,
{
    admin_only(ctx)?;
    let body = read_body(app, &ctx.headers, body).await?;
    let props: UserProperties = parse_json(&body)?;
    app.security
        .update_user(
            &app.store,
            &ctx.caller,
            name,
            props.password.as_deref(),
            props.roles.as_deref(),
        )
        .await?;
    tracing::info!(user = %name, by = ctx.caller.name(), "user updated");
    Ok(response::empty(204))
}

pub(super) async fn delete_user(app: &App, ctx: &Ctx, name: &str) -> Result<Resp, ApiError> {
    admin_only(ctx)?;
    app.security
        .remove_user(&app.store, &ctx.caller, name)
        .await?;
    tracing::info!(user = %name, by = ctx.caller.name(), "user removed");
    Ok(response::empty(204))
}

/// `GET /v1/cluster`: the live nodes, what each has applied and holds, and each shard's
/// holders against `cluster_shard_replicas`, as this node's registry view has them.
pub(super) fn cluster(app: &App, ctx: &Ctx) -> Result<Resp, ApiError> {
    admin_only(ctx)?;
    let Some(cluster) = app.cluster.get() else {
        return Err(ApiError::new(
            ErrorCode::UnknownEndpoint,
            "this server is a single node: cluster mode is off (the `cluster` setting)",
        ));
    };
    let overview = cluster.overview(app.config.cluster_shard_replicas);
    let body = serde_json::to_value(&overview)
        .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?;
    Ok(response::json_value(200, &body))
}
