//! `/v1/documents`: write, read and delete one document (docs/contract.md §2).

use bytes::Bytes;
use hyper::header::{ACCEPT, CONTENT_TYPE, HeaderValue};

use super::Ctx;
use super::response::{self, Resp};
use super::{App, BoxError, read_body, require_any};
use crate::acl::{Capability, Permissions, Role};
use crate::error::{ApiError, ErrorCode};
use crate::store::{Document, Format, Lookup, Op, PutDocument, content};

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
    let flow = super::flows::FlowParams::requested(ctx)?;
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
    if let Some(params) = &flow {
        return super::flows::put_through_flow(app, ctx, params, put).await;
    }
    let op = Op::PutDocument(put);
    let answer = app.store.write(&ctx.caller, vec![op]).await?;
    Ok(response::written(&uri, &answer))
}

/// What a new document written without `perm:` gets: descriptors are readable by the
/// feature-service roles (INTERFACE §2.4), everything else by the REST roles.
pub fn default_permissions(collections: Option<&[String]>) -> Permissions {
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

pub(super) fn document_uri(ctx: &Ctx) -> Result<String, ApiError> {
    let uri = ctx.params.required("uri")?;
    check_uri(uri)?;
    Ok(uri.to_string())
}

fn check_uri(uri: &str) -> Result<(), ApiError> {
    if uri.len() > MAX_URI_BYTES {
        return Err(ApiError::new(
            ErrorCode::InvalidParam,
            format!("uri is longer than {MAX_URI_BYTES} bytes"),
        ));
    }
    Ok(())
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

/// The categories a read may ask for: `content` and the metadata ones.
const CATEGORIES: [&str; 7] = [
    "content",
    "metadata",
    "collections",
    "permissions",
    "properties",
    "quality",
    "metadata-values",
];

/// `GET` (and `HEAD`) `/v1/documents`: one document's content or metadata as itself, or, for
/// several `uri`s, several `category`s or `Accept: multipart/mixed`, a `multipart/mixed` body
/// with a metadata part and a content part a document, as asked. Of several documents, those
/// that are absent or unreadable are left out; a single one is a 404.
pub(super) async fn get(app: &App, ctx: &Ctx) -> Result<Resp, ApiError> {
    require_any(&ctx.caller, &[Role::RestReader, Role::Admin])?;
    ctx.params
        .only(&ctx.path, |k| matches!(k, "uri" | "category" | "format"))?;
    document_uri(ctx)?;
    let uris: Vec<String> = ctx.params.all("uri").map(str::to_string).collect();
    for uri in &uris {
        check_uri(uri)?;
    }
    let mut categories: Vec<&str> = Vec::new();
    for c in ctx.params.all("category").flat_map(|c| c.split(',')) {
        let c = c.trim();
        if !CATEGORIES.contains(&c) {
            return Err(ApiError::new(
                ErrorCode::InvalidParam,
                format!("category {c:?} is not one of {}", CATEGORIES.join(", ")),
            ));
        }
        if !categories.contains(&c) {
            categories.push(c);
        }
    }
    if categories.is_empty() {
        categories.push("content");
    }
    let wants_multipart = ctx
        .headers
        .get(ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("multipart/mixed"));
    let store = app.store.clone();
    let caller = ctx.caller.clone();
    let lookup = uris.clone();
    // The documents of one answer hold at most max_body_bytes between them.
    let max_bytes = app.config.max_body_bytes;
    let too_large = move || {
        ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "the documents asked for hold more than max_body_bytes ({max_bytes}) \
                 between them: ask for fewer at a time"
            ),
        )
    };
    let several = uris.len() > 1;
    let (found, mut total) = tokio::task::spawn_blocking(move || -> Result<_, ApiError> {
        let mut total = 0u64;
        let mut found = Vec::with_capacity(lookup.len());
        for uri in &lookup {
            let doc = store.lookup(&caller, uri)?;
            if let Lookup::Here(d) = &doc {
                total += d.content.len() as u64;
            }
            if total > max_bytes && several {
                return Err(too_large());
            }
            found.push(doc);
        }
        Ok((found, total))
    })
    .await
    .map_err(|_| ApiError::new(ErrorCode::Internal, "document read failed"))??;
    // A cluster node holding some shards keeps only a stub of the others' documents: their
    // content comes from a node that keeps it.
    let mut docs = Vec::with_capacity(found.len());
    let mut kept_by = app.cluster.get().map(|c| c.node().to_string());
    for (uri, doc) in uris.iter().zip(found) {
        docs.push(match doc {
            Lookup::Here(d) => Some(d),
            Lookup::Absent => None,
            Lookup::Elsewhere { shards } => {
                let Some(spread) = app.spread() else {
                    return Err(ApiError::new(
                        ErrorCode::Unavailable,
                        format!("{uri} is kept by the holders of shards {shards:?}, not here"),
                    ));
                };
                let doc = crate::cluster::spread::document(
                    spread,
                    &ctx.caller,
                    ctx.after(),
                    uri,
                    &shards,
                )
                .await?;
                total += doc.as_ref().map_or(0, |d| d.0.content.len() as u64);
                if total > max_bytes && several {
                    return Err(too_large());
                }
                doc.map(|(d, node)| {
                    kept_by = Some(node);
                    d
                })
            }
        });
    }
    let with_content = categories.contains(&"content");
    let metadata: Vec<&str> = categories
        .iter()
        .copied()
        .filter(|c| *c != "content")
        .collect();
    if uris.len() == 1 {
        let Some(doc) = &docs[0] else {
            return Err(ApiError::new(
                ErrorCode::NoDocument,
                format!(
                    "Resource or document does not exist: category: {} message: {}",
                    categories.join(","),
                    uris[0]
                ),
            ));
        };
        if !with_content && !wants_multipart {
            return Ok(response::json_value(200, &metadata_json(doc, &metadata)));
        }
        if categories == ["content"] && !wants_multipart {
            let mut r = response::with_body(200, doc.format.mime_type(), doc.content.clone());
            r.headers_mut().insert(
                "vnd.marklogic.document-format",
                HeaderValue::from_static(doc.format.name()),
            );
            // In a cluster: the node whose store gave the content.
            if let Some(v) = kept_by.and_then(|n| HeaderValue::from_str(&n).ok()) {
                r.headers_mut().insert(super::names::KEPT_BY, v);
            }
            return Ok(r);
        }
    }
    let docs: Vec<&Document> = docs.iter().flatten().collect();
    Ok(multipart(&docs, &metadata, with_content))
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

/// The metadata JSON of `categories` (`metadata` is all of them).
fn metadata_json(doc: &Document, categories: &[&str]) -> serde_json::Value {
    let all = categories.contains(&"metadata");
    let wants = |c: &str| all || categories.contains(&c);
    let mut m = serde_json::Map::new();
    if wants("collections") {
        m.insert("collections".into(), serde_json::json!(doc.collections));
    }
    if wants("permissions") {
        m.insert("permissions".into(), permissions_json(&doc.permissions));
    }
    if wants("properties") {
        m.insert("properties".into(), serde_json::json!({}));
    }
    if wants("quality") {
        m.insert("quality".into(), 0.into());
    }
    if wants("metadata-values") {
        m.insert("metadataValues".into(), serde_json::json!({}));
    }
    serde_json::Value::Object(m)
}

/// The `multipart/mixed` form: per document, a metadata part (when `metadata` asks for any)
/// then a content part (when `content`), each naming its document and category.
fn multipart(docs: &[&Document], metadata: &[&str], content: bool) -> Resp {
    let boundary = format!("geoshard-{}", uuid::Uuid::new_v4().simple());
    let mut body = Vec::new();
    let mut part = |uri: &str, mime: &str, category: &str, format: &str, bytes: &[u8]| {
        body.extend_from_slice(format!("--{boundary}\r\nContent-Type: {mime}\r\n").as_bytes());
        body.extend_from_slice(
            format!(
                "Content-Disposition: attachment; filename=\"{}\"; category={category}; \
                 format={format}\r\nContent-Length: {}\r\n\r\n",
                uri.replace('"', "%22"),
                bytes.len()
            )
            .as_bytes(),
        );
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    };
    for doc in docs {
        if !metadata.is_empty() {
            let json = serde_json::to_vec(&metadata_json(doc, metadata)).unwrap_or_default();
            part(&doc.uri, "application/json", "metadata", "json", &json);
        }
        if content {
            part(
                &doc.uri,
                doc.format.mime_type(),
                "content",
                doc.format.name(),
                &doc.content,
            );
        }
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
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
        None | Some(serde_json::Value::Null) => None,
        Some(p) => Some(metadata_permissions(p)?),
    };
    Ok(BulkMeta {
        collections,
        permissions,
    })
}

/// The `permissions` of a metadata part: `[{"role-name", "capabilities"}]` with the
/// capabilities a list or one string, or an object from role to capability (a string or a
/// list), as the Python client writes it. Anything else is refused, never stored as none.
fn metadata_permissions(v: &serde_json::Value) -> Result<Permissions, ApiError> {
    use serde_json::Value;
    let bad = |m: String| ApiError::new(ErrorCode::InvalidRequest, m);
    let mut p = Permissions::new();
    let mut grant = |role: &str, caps: &Value| -> Result<(), ApiError> {
        let r = Role::parse(role).ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidParam,
                format!("Role {role} does not exist"),
            )
        })?;
        let names: Vec<&Value> = match caps {
            Value::String(_) => vec![caps],
            Value::Array(a) => a.iter().collect(),
            _ => {
                return Err(bad(format!(
                    "the capabilities of role {role} must be a string or a list of strings"
                )));
            }
        };
        for cap in names {
            let name = cap.as_str().unwrap_or_default();
            let c = Capability::parse(name).ok_or_else(|| {
                bad(format!(
                    "capability {cap} of role {role} is not one of read, update, insert, execute"
                ))
            })?;
            p.grant(r, c);
        }
        Ok(())
    };
    match v {
        Value::Array(a) => {
            for entry in a {
                let role = entry
                    .get("role-name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("a permission {entry} has no \"role-name\"")))?;
                grant(role, entry.get("capabilities").unwrap_or(&Value::Null))?;
            }
        }
        Value::Object(o) => {
            for (role, caps) in o {
                grant(role, caps)?;
            }
        }
        _ => {
            return Err(bad(
                "metadata permissions must be an array or an object".into()
            ));
        }
    }
    Ok(p)
}

/// The documents of a multipart/mixed body, each with its MIME type: metadata parts set the
/// defaults (no filename) or one document's metadata, content parts are checked against
/// their format.
fn plan_bulk(
    work: Bytes,
    boundary: &str,
    mut defaults: BulkMeta,
) -> Result<Vec<(PutDocument, &'static str)>, ApiError> {
    let parts = super::multipart::parse(&work, boundary)
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
    ctx.params.only(&ctx.path, |k| {
        matches!(k, "collection" | "transform") || k.starts_with("perm:") || k.starts_with("trans:")
    })?;
    let flow = super::flows::FlowParams::requested(ctx)?.map(super::flows::FlowParams::one_job);
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
    let defaults = BulkMeta {
        collections: ctx
            .params
            .has("collection")
            .then(|| ctx.params.all("collection").map(str::to_string).collect()),
        permissions: parse_permissions(ctx)?,
    };
    let body = read_body(app, &ctx.headers, body).await?;
    let work = body.clone();
    // Splitting and checking a large body is CPU work: off the async threads.
    let planned = tokio::task::spawn_blocking(move || plan_bulk(work, &boundary, defaults))
        .await
        .map_err(|_| ApiError::new(ErrorCode::Internal, "bulk parsing failed"))??;
    let (documents, ops) = match flow {
        None => {
            let documents: Vec<serde_json::Value> = planned
                .iter()
                .map(|(p, mime)| serde_json::json!({"uri": p.uri, "mime-type": mime, "category": ["metadata", "content"]}))
                .collect();
            let ops = planned
                .into_iter()
                .map(|(p, _)| Op::PutDocument(p))
                .collect::<Vec<_>>();
            (documents, ops)
        }
        // The flow runs on every document; their envelopes are written in one transaction,
        // or, if one run fails, nothing but the runs' traces.
        Some(params) => {
            let mut documents = Vec::with_capacity(planned.len());
            let mut ops = Vec::with_capacity(planned.len() * 2);
            for (put, _) in planned {
                match super::flows::through_flow(app, &params, put).await {
                    Ok(run) => {
                        for op in &run {
                            if let Op::PutDocument(p) = op {
                                documents.push(serde_json::json!({"uri": p.uri, "mime-type": p.format.mime_type(), "category": ["metadata", "content"]}));
                            }
                        }
                        ops.extend(run);
                    }
                    Err((error, trace)) => {
                        let traces = ops
                            .into_iter()
                            .filter(|op| matches!(op, Op::PutRecord { .. }))
                            .chain(trace)
                            .collect();
                        super::flows::keep_traces(app, ctx, traces).await;
                        return Err(error);
                    }
                }
            }
            (documents, ops)
        }
    };
    let answer = app.store.write(&ctx.caller, ops).await?;
    Ok(response::json_value(
        200,
        &serde_json::json!({"documents": documents, "warnings": response::warnings_json(&answer.warnings)}),
    ))
}
