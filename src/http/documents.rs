//! `/v1/documents`: write, read and delete one document (REFERENCE §2).

use bytes::Bytes;
use hyper::header::{ACCEPT, CONTENT_TYPE, HeaderValue, LOCATION};

use super::response::{self, Resp};
use super::router::Ctx;
use super::{App, BoxError, read_body, require_any};
use crate::acl::{Capability, Permissions, Role};
use crate::error::{ApiError, ErrorCode};
use crate::store::{Document, Format, Op, Outcome, PutDocument, Warning, Written, content};

/// Bodies above this are checked off the async threads.
const INLINE_CHECK_BYTES: usize = 256 * 1024;
/// Longest document URI accepted.
const MAX_URI_BYTES: usize = 4096;

pub(super) async fn put<B>(app: &App, ctx: &Ctx, body: B) -> Result<Resp, ApiError>
where
    B: hyper::body::Body<Data = Bytes> + Send + Unpin,
    B::Error: Into<BoxError>,
{
    require_any(&ctx.caller, &[Role::RestWriter, Role::Admin])?;
    ctx.params.only(&ctx.path, |k| {
        matches!(k, "uri" | "collection" | "format" | "transform")
            || k.starts_with("perm:")
            || k.starts_with("trans:")
    })?;
    let uri = document_uri(ctx)?;
    let format = decide_format(ctx, &uri)?;
    let collections = ctx
        .params
        .has("collection")
        .then(|| ctx.params.all("collection").map(str::to_string).collect());
    let permissions = parse_permissions(ctx)?;
    let transform = ctx.params.get("transform").map(str::to_string);
    if let Some(t) = &transform
        && !crate::flow::is_flow_transform(t)
    {
        return Err(ApiError::new(
            ErrorCode::InvalidParam,
            format!("unknown transform: {t}"),
        ));
    }
    let body = read_body(app, &ctx.headers, body).await?;
    check_content(format, body.clone()).await?;
    let put = PutDocument {
        uri: uri.clone(),
        content: body,
        format,
        default_permissions: default_permissions(collections.as_deref()),
        collections,
        permissions,
    };
    if transform.is_some() {
        return super::flows::put_through_flow(app, ctx, put).await;
    }
    let op = Op::PutDocument(put);
    let answer = app.store.write(&ctx.caller, vec![op]).await?;
    Ok(written(&uri, &answer))
}

/// What a new document written without `perm:` gets: descriptors are readable by the
/// feature-service roles (INTERFACE §2.4), everything else by the REST roles.
pub(super) fn default_permissions(collections: Option<&[String]>) -> Permissions {
    let is_descriptor = collections.is_some_and(|c| {
        c.iter()
            .any(|c| c == crate::features::descriptor::DESCRIPTOR_COLLECTION)
    });
    if is_descriptor {
        Permissions::descriptor_default()
    } else {
        Permissions::document_default()
    }
}

/// The `warnings` of a write's answer: the URI and the reason for each.
pub(super) fn warnings_json(warnings: &[Warning]) -> serde_json::Value {
    serde_json::Value::Array(
        warnings
            .iter()
            .map(|w| serde_json::json!({"uri": w.uri, "message": w.message}))
            .collect(),
    )
}

/// 201 with `Location` for a new document, 204 for a replaced one. A write with warnings
/// (a geometry its views cannot use) says so in a JSON body: 201 with it, or 200 in place of
/// the 204 that can have none.
pub(super) fn written(uri: &str, answer: &Written) -> Resp {
    let body = (!answer.warnings.is_empty())
        .then(|| serde_json::json!({"warnings": warnings_json(&answer.warnings)}));
    match answer.outcomes.first() {
        Some(Outcome::Created) => {
            let mut r = match &body {
                Some(b) => response::json_value(201, b),
                None => response::empty(201),
            };
            let location = format!(
                "/v1/documents?uri={}",
                form_urlencoded::byte_serialize(uri.as_bytes()).collect::<String>()
            );
            if let Ok(v) = HeaderValue::from_str(&location) {
                r.headers_mut().insert(LOCATION, v);
            }
            r
        }
        _ => match &body {
            Some(b) => response::json_value(200, b),
            None => response::empty(204),
        },
    }
}

pub(super) fn document_uri(ctx: &Ctx) -> Result<String, ApiError> {
    let uri = ctx.params.required("uri")?;
    if uri.len() > MAX_URI_BYTES {
        return Err(ApiError::new(
            ErrorCode::InvalidParam,
            format!("uri is longer than {MAX_URI_BYTES} bytes"),
        ));
    }
    Ok(uri.to_string())
}

/// JSON and XML bodies must parse; big ones are checked on the blocking pool.
pub(super) async fn check_content(format: Format, body: Bytes) -> Result<(), ApiError> {
    let result = if body.len() > INLINE_CHECK_BYTES {
        tokio::task::spawn_blocking(move || content::check(format, &body))
            .await
            .map_err(|_| ApiError::new(ErrorCode::Internal, "content check failed"))?
    } else {
        content::check(format, &body)
    };
    result.map_err(|e| {
        let code = match e.format {
            Format::Xml => ErrorCode::XmlDoc,
            Format::Json | Format::Text | Format::Binary => ErrorCode::JsonDoc,
        };
        ApiError::new(code, e.message)
    })
}

/// `format=` wins; then the Content-Type; then the URI's extension; else binary.
pub(super) fn decide_format(ctx: &Ctx, uri: &str) -> Result<Format, ApiError> {
    if let Some(f) = ctx.params.get("format") {
        return Format::parse(f).ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidParam,
                format!("format {f:?} is not one of json, xml, text, binary"),
            )
        });
    }
    let mime = ctx
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(media_type)
        .unwrap_or_default();
    if let Some(f) = format_of_mime(&mime)? {
        return Ok(f);
    }
    Ok(format_of_extension(uri))
}

/// The media type of a Content-Type value, lowercased, without its parameters.
fn media_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

fn format_of_mime(mime: &str) -> Result<Option<Format>, ApiError> {
    Ok(match mime {
        "" => None,
        "application/json" | "text/json" => Some(Format::Json),
        "application/xml" | "text/xml" => Some(Format::Xml),
        m if m.ends_with("+json") => Some(Format::Json),
        m if m.ends_with("+xml") => Some(Format::Xml),
        m if m.starts_with("text/") => Some(Format::Text),
        m if m.starts_with("multipart/") => {
            return Err(ApiError::new(
                ErrorCode::InvalidMimeType,
                format!("a single document cannot be {m}"),
            ));
        }
        "application/octet-stream" => Some(Format::Binary),
        _ => None,
    })
}

fn format_of_extension(uri: &str) -> Format {
    let ext = uri
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "json" => Format::Json,
        "xml" | "xsd" | "xsl" | "xslt" => Format::Xml,
        "txt" | "csv" | "text" | "sjs" | "js" | "xqy" | "md" => Format::Text,
        _ => Format::Binary,
    }
}

/// `perm:ROLE=CAP`, repeatable. `None` when none given.
pub(super) fn parse_permissions(ctx: &Ctx) -> Result<Option<Permissions>, ApiError> {
    let mut perms = Permissions::new();
    let mut any = false;
    for (role, cap) in ctx.params.prefixed("perm:") {
        let r = Role::parse(role).ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidParam,
                format!("Role {role} does not exist"),
            )
        })?;
        let c = Capability::parse(cap).ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidParam,
                format!("capability {cap:?} is not one of read, update, insert, execute"),
            )
        })?;
        perms.grant(r, c);
        any = true;
    }
    Ok(any.then_some(perms))
}

pub(super) async fn get(app: &App, ctx: &Ctx) -> Result<Resp, ApiError> {
    require_any(&ctx.caller, &[Role::RestReader, Role::Admin])?;
    ctx.params
        .only(&ctx.path, |k| matches!(k, "uri" | "category" | "format"))?;
    let uri = document_uri(ctx)?;
    let category = ctx.params.get("category").unwrap_or("content");
    if !matches!(
        category,
        "content" | "metadata" | "collections" | "permissions"
    ) {
        return Err(ApiError::new(
            ErrorCode::InvalidParam,
            format!(
                "category {category:?} is not one of content, metadata, collections, permissions"
            ),
        ));
    }
    let store = app.store.clone();
    let caller = ctx.caller.clone();
    let lookup = uri.clone();
    let doc = tokio::task::spawn_blocking(move || store.get(&caller, &lookup))
        .await
        .map_err(|_| ApiError::new(ErrorCode::Internal, "document read failed"))??;
    let Some(doc) = doc else {
        return Err(ApiError::new(
            ErrorCode::NoDocument,
            format!("Resource or document does not exist: category: {category} message: {uri}"),
        ));
    };
    if category != "content" {
        return Ok(response::json_value(200, &metadata_json(&doc, category)));
    }
    let wants_multipart = ctx
        .headers
        .get(ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("multipart/mixed"));
    if wants_multipart {
        return Ok(multipart(&doc));
    }
    let mut r = response::with_body(200, doc.format.mime_type(), doc.content.clone());
    r.headers_mut().insert(
        "vnd.marklogic.document-format",
        HeaderValue::from_static(doc.format.name()),
    );
    Ok(r)
}

fn permissions_json(perms: &Permissions) -> serde_json::Value {
    let mut by_role: Vec<(Role, Vec<&str>)> = Vec::new();
    for (role, cap) in perms.pairs() {
        match by_role.last_mut() {
            Some((r, caps)) if *r == role => caps.push(cap.name()),
            _ => by_role.push((role, vec![cap.name()])),
        }
    }
    serde_json::Value::Array(
        by_role
            .into_iter()
            .map(|(r, caps)| serde_json::json!({"role-name": r.name(), "capabilities": caps}))
            .collect(),
    )
}

fn metadata_json(doc: &Document, category: &str) -> serde_json::Value {
    match category {
        "collections" => serde_json::json!({ "collections": doc.collections }),
        "permissions" => serde_json::json!({ "permissions": permissions_json(&doc.permissions) }),
        _ => serde_json::json!({
            "collections": doc.collections,
            "permissions": permissions_json(&doc.permissions),
            "properties": {},
            "quality": 0,
            "metadataValues": {},
        }),
    }
}

/// The `Accept: multipart/mixed` form: one content part.
fn multipart(doc: &Document) -> Resp {
    let boundary = format!("geoshard-{}", uuid::Uuid::new_v4().simple());
    let mut body = Vec::with_capacity(doc.content.len() + 256);
    body.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
    body.extend_from_slice(format!("Content-Type: {}\r\n", doc.format.mime_type()).as_bytes());
    body.extend_from_slice(
        format!(
            "Content-Disposition: attachment; filename=\"{}\"; category=content; format={}\r\n",
            doc.uri.replace('"', "%22"),
            doc.format.name()
        )
        .as_bytes(),
    );
    body.extend_from_slice(format!("Content-Length: {}\r\n\r\n", doc.content.len()).as_bytes());
    body.extend_from_slice(&doc.content);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    response::with_body(200, &format!("multipart/mixed; boundary={boundary}"), body)
}

pub(super) async fn delete(app: &App, ctx: &Ctx) -> Result<Resp, ApiError> {
    require_any(&ctx.caller, &[Role::RestWriter, Role::Admin])?;
    ctx.params.only(&ctx.path, |k| k == "uri")?;
    let uri = document_uri(ctx)?;
    app.store
        .write(&ctx.caller, vec![Op::DeleteDocument { uri }])
        .await?;
    Ok(response::empty(204))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mime_and_extension_guesses() {
        assert_eq!(
            format_of_mime("application/json").unwrap(),
            Some(Format::Json)
        );
        assert_eq!(
            format_of_mime("application/geo+json").unwrap(),
            Some(Format::Json)
        );
        assert_eq!(format_of_mime("text/xml").unwrap(), Some(Format::Xml));
        assert_eq!(format_of_mime("text/csv").unwrap(), Some(Format::Text));
        assert_eq!(format_of_mime("image/png").unwrap(), None);
        assert!(format_of_mime("multipart/mixed").is_err());
        assert_eq!(format_of_extension("/a/b.JSON"), Format::Json);
        assert_eq!(format_of_extension("/a/b.xml"), Format::Xml);
        assert_eq!(format_of_extension("/a/b"), Format::Binary);
    }

    #[test]
    fn permissions_group_by_role() {
        let mut p = Permissions::new();
        p.grant(Role::GeoReader, Capability::Read);
        p.grant(Role::GeoWriter, Capability::Update);
        p.grant(Role::GeoWriter, Capability::Read);
        assert_eq!(
            permissions_json(&p),
            serde_json::json!([
                {"role-name": "geo-data-services-reader", "capabilities": ["read"]},
                {"role-name": "geo-data-services-writer", "capabilities": ["read", "update"]},
            ])
        );
    }
}

/// Metadata of the bulk form: `{"collections": [...], "permissions": [{"role-name", "capabilities"}]}`.
#[derive(Debug, Clone, Default)]
struct BulkMeta {
    collections: Option<Vec<String>>,
    permissions: Option<Permissions>,
}

fn parse_bulk_meta(bytes: &[u8]) -> Result<BulkMeta, ApiError> {
    let bad = |m: String| ApiError::new(ErrorCode::InvalidRequest, m);
    let v: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| bad(format!("a metadata part is not JSON: {e}")))?;
    let collections = match v.get("collections") {
        None => None,
        Some(serde_json::Value::Array(a)) => Some(
            a.iter()
                .map(|c| c.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad("metadata collections must be strings".into()))?,
        ),
        Some(_) => return Err(bad("metadata collections must be an array".into())),
    };
    let permissions = match v.get("permissions") {
        None => None,
        Some(serde_json::Value::Array(a)) => {
            let mut p = Permissions::new();
            for entry in a {
                let role = entry["role-name"].as_str().unwrap_or_default();
                let r = Role::parse(role).ok_or_else(|| {
                    ApiError::new(
                        ErrorCode::InvalidParam,
                        format!("Role {role} does not exist"),
                    )
                })?;
                for cap in entry["capabilities"].as_array().into_iter().flatten() {
                    let name = cap.as_str().unwrap_or_default();
                    let c = Capability::parse(name).ok_or_else(|| {
                        bad(format!(
                            "capability {name:?} is not one of read, update, insert, execute"
                        ))
                    })?;
                    p.grant(r, c);
                }
            }
            Some(p)
        }
        Some(_) => return Err(bad("metadata permissions must be an array".into())),
    };
    Ok(BulkMeta {
        collections,
        permissions,
    })
}

/// `POST /v1/documents` with `multipart/mixed`: many documents in one transaction. A metadata
/// part without a filename sets the defaults for the content parts after it; one with a
/// filename applies to that document. Query parameters `collection=` and `perm:` are the
/// first defaults.
pub(super) async fn post_bulk<B>(app: &App, ctx: &Ctx, body: B) -> Result<Resp, ApiError>
where
    B: hyper::body::Body<Data = Bytes> + Send + Unpin,
    B::Error: Into<BoxError>,
{
    require_any(&ctx.caller, &[Role::RestWriter, Role::Admin])?;
    ctx.params
        .only(&ctx.path, |k| k == "collection" || k.starts_with("perm:"))?;
    let content_type = ctx
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    if !content_type
        .to_ascii_lowercase()
        .starts_with("multipart/mixed")
    {
        return Err(ApiError::new(
            ErrorCode::InvalidMimeType,
            "the bulk form of POST /v1/documents takes multipart/mixed",
        ));
    }
    let boundary = super::multipart::boundary(&content_type).ok_or_else(|| {
        ApiError::new(
            ErrorCode::InvalidRequest,
            "multipart/mixed without a boundary",
        )
    })?;
    let mut defaults = BulkMeta {
        collections: ctx
            .params
            .has("collection")
            .then(|| ctx.params.all("collection").map(str::to_string).collect()),
        permissions: parse_permissions(ctx)?,
    };
    let body = read_body(app, &ctx.headers, body).await?;
    let work = body.clone();
    // Splitting and checking a large body is CPU work: off the async threads.
    let planned = tokio::task::spawn_blocking(
        move || -> Result<Vec<(PutDocument, &'static str)>, ApiError> {
            let parts = super::multipart::parse(&work, &boundary)
                .map_err(|m| ApiError::new(ErrorCode::InvalidRequest, m))?;
            let mut per_uri: std::collections::HashMap<String, BulkMeta> = Default::default();
            let mut out = Vec::new();
            for (i, part) in parts.iter().enumerate() {
                let category = part
                    .disposition("category")
                    .unwrap_or_else(|| "content".into());
                let filename = part.disposition("filename");
                if category.contains("metadata") {
                    let meta = parse_bulk_meta(part.body)?;
                    match &filename {
                        None => defaults = meta,
                        Some(uri) => {
                            per_uri.insert(uri.clone(), meta);
                        }
                    }
                    if !category.contains("content") {
                        continue;
                    }
                }
                let uri = filename.ok_or_else(|| {
                    ApiError::new(
                        ErrorCode::InvalidRequest,
                        format!("content part {} has no filename", i + 1),
                    )
                })?;
                let mime = part
                    .header("content-type")
                    .map(media_type)
                    .unwrap_or_default();
                let format = match part
                    .disposition("format")
                    .as_deref()
                    .and_then(Format::parse)
                {
                    Some(f) => f,
                    None => format_of_mime(&mime)?.unwrap_or_else(|| format_of_extension(&uri)),
                };
                content::check(format, part.body).map_err(|e| {
                    let code = match e.format {
                        Format::Xml => ErrorCode::XmlDoc,
                        Format::Json | Format::Text | Format::Binary => ErrorCode::JsonDoc,
                    };
                    ApiError::new(code, format!("{uri}: {}", e.message))
                })?;
                let meta = per_uri.remove(&uri).unwrap_or_else(|| defaults.clone());
                let start = part.body.as_ptr() as usize - work.as_ptr() as usize;
                out.push((
                    PutDocument {
                        uri,
                        content: work.slice(start..start + part.body.len()),
                        format,
                        default_permissions: default_permissions(meta.collections.as_deref()),
                        collections: meta.collections,
                        permissions: meta.permissions,
                    },
                    format.mime_type(),
                ));
            }
            Ok(out)
        },
    )
    .await
    .map_err(|_| ApiError::new(ErrorCode::Internal, "bulk parsing failed"))??;
    let documents: Vec<serde_json::Value> = planned
        .iter()
        .map(|(p, mime)| serde_json::json!({"uri": p.uri, "mime-type": mime, "category": ["metadata", "content"]}))
        .collect();
    let ops = planned
        .into_iter()
        .map(|(p, _)| Op::PutDocument(p))
        .collect();
    let answer = app.store.write(&ctx.caller, ops).await?;
    Ok(response::json_value(
        200,
        &serde_json::json!({"documents": documents, "warnings": warnings_json(&answer.warnings)}),
    ))
}
