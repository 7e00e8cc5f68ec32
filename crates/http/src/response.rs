//! Building responses: JSON, empty, errors in the contract's format, and the 401 challenge.

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{CONTENT_TYPE, HeaderValue, LOCATION, WWW_AUTHENTICATE};
use hyper::{Response, StatusCode};

use crate::error::ApiError;
use crate::store::{Outcome, Warning, Written};

pub(crate) type Resp = Response<Full<Bytes>>;

/// Frames of a streamed answer.
type FrameStream = std::pin::Pin<
    Box<
        dyn futures_util::Stream<Item = Result<hyper::body::Frame<Bytes>, std::convert::Infallible>>
            + Send,
    >,
>;

/// What a connection sends: a whole body, or a stream (a fence's events).
pub type Body = http_body_util::Either<Full<Bytes>, http_body_util::StreamBody<FrameStream>>;

/// The answer as a connection sends it: with the stream its handler marked
/// ([`crate::fences::Streamed`]) as the body, holding `busy` until the stream ends.
pub fn with_stream<T: Send + 'static>(resp: Resp, busy: T) -> Response<Body> {
    let (mut parts, full) = resp.into_parts();
    let streamed = parts
        .extensions
        .remove::<crate::fences::Streamed>()
        .and_then(|s| s.0.lock().take());
    match streamed {
        None => {
            drop(busy);
            Response::from_parts(parts, http_body_util::Either::Left(full))
        }
        Some(rx) => {
            parts.headers.remove(hyper::header::CONTENT_LENGTH);
            let frames = futures_util::stream::unfold((rx, busy), |(mut rx, busy)| async move {
                let bytes = rx.recv().await?;
                Some((Ok(hyper::body::Frame::data(bytes)), (rx, busy)))
            });
            let body = http_body_util::StreamBody::new(Box::pin(frames) as FrameStream);
            Response::from_parts(parts, http_body_util::Either::Right(body))
        }
    }
}

const JSON: HeaderValue = HeaderValue::from_static("application/json");

fn status(code: u16) -> StatusCode {
    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

pub(crate) fn json_bytes(code: u16, body: impl Into<Bytes>) -> Resp {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status(code);
    r.headers_mut().insert(CONTENT_TYPE, JSON);
    r
}

pub(crate) fn json_value(code: u16, value: &serde_json::Value) -> Resp {
    json_bytes(code, serde_json::to_vec(value).unwrap_or_default())
}

pub fn empty(code: u16) -> Resp {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = status(code);
    r
}

pub(crate) fn with_body(code: u16, content_type: &str, body: impl Into<Bytes>) -> Resp {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status(code);
    if let Ok(v) = HeaderValue::from_str(content_type) {
        r.headers_mut().insert(CONTENT_TYPE, v);
    }
    r
}

pub fn error(e: &ApiError) -> Resp {
    json_bytes(e.status(), e.to_body())
}

/// 401 with both challenges (Digest first) and the body docs/contract.md §6 shows.
pub(crate) fn unauthorized(challenges: &[String; 2]) -> Resp {
    let mut r = json_bytes(
        crate::error::ErrorCode::Unauthorized.status(),
        crate::error::ApiError::challenge_body(),
    );
    for c in challenges {
        if let Ok(v) = HeaderValue::from_str(c) {
            r.headers_mut().append(WWW_AUTHENTICATE, v);
        }
    }
    r
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
                Some(b) => json_value(201, b),
                None => empty(201),
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
            Some(b) => json_value(200, b),
            None => empty(204),
        },
    }
}
