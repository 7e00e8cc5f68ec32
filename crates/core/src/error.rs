//! The error codes of the contract (docs/contract.md §1) and their HTTP statuses, in one table.
//!
//! Every module keeps its own `thiserror` enum; each converts into an [`ApiError`], which is
//! what the HTTP layer renders as an `errorResponse` body. The status of a code is chosen in
//! exactly one function, [`ErrorCode::status`], which matches every variant with no wildcard
//! arm, so a new code forces a decision. This module knows nothing of hyper.

use std::fmt;

/// The status a plugin chose by throwing an error with a `status`: only 400 to 599 are kept
/// (a plugin cannot answer a success or a redirect by failing); anything else is a 500.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PluginStatus(u16);

impl PluginStatus {
    /// A flow's output that makes no envelope: the request's fault, as a plugin's 400 says.
    pub const BAD_OUTPUT: PluginStatus = PluginStatus(400);
    /// The flow runtime is stopping or stopped: a client may try again, as a 503 says.
    pub const UNAVAILABLE: PluginStatus = PluginStatus(503);

    /// The status as a number, as a flow's trace records it.
    pub fn get(self) -> u16 {
        self.0
    }

    pub fn new(thrown: Option<u64>) -> PluginStatus {
        PluginStatus(
            thrown
                .filter(|s| (400..=599).contains(s))
                .and_then(|s| u16::try_from(s).ok())
                .unwrap_or(500),
        )
    }
}

/// A contract error code. The variant decides the HTTP status and the `messageCode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// A required parameter is missing (`REST-REQUIREDPARAM`).
    RequiredParam,
    /// A parameter the endpoint does not know (`REST-UNSUPPORTEDPARAM`).
    UnsupportedParam,
    /// A parameter with a bad value (`REST-INVALIDPARAM`).
    InvalidParam,
    /// A parameter whose value has the wrong type, such as options that are not an object.
    InvalidType,
    /// A body declared JSON that does not parse (`XDMP-JSONDOC`).
    JsonDoc,
    /// A body declared XML that is not well-formed (`XDMP-DOCROOTTEXT`).
    XmlDoc,
    /// A request body that is malformed for the endpoint (`RESTAPI-INVALIDREQ`).
    InvalidRequest,
    /// A media type the endpoint does not accept (`RESTAPI-INVALIDMIMETYPE`).
    InvalidMimeType,
    /// No or bad credentials.
    Unauthorized,
    /// Authenticated, but lacking a role for the endpoint (`SEC-PRIV`).
    SecPriv,
    /// Authenticated, but lacking a permission on the document (`SEC-PERMDENIED`).
    SecPermDenied,
    /// A document that does not exist or that the caller may not read (`RESTAPI-NODOCUMENT`).
    NoDocument,
    /// A path no endpoint serves.
    UnknownEndpoint,
    /// A method the endpoint does not support (`REST-UNSUPPORTEDMETHOD`).
    MethodNotAllowed,
    /// A body above the configured limit.
    PayloadTooLarge,
    /// A request URI longer than the server reads.
    UriTooLong,
    /// Request header fields larger than the server reads.
    HeadersTooLarge,
    /// An extension (feature service, flow) found no service, layer or flow of that name.
    ExtensionNotFound,
    /// An extension refused the request as malformed (a bad where clause, an unusable
    /// geometry, a flow's output that cannot be enveloped).
    ExtensionInvalid,
    /// A flow's plugin failed: with the status it threw (400 to 599), else 500.
    PluginFailed(PluginStatus),
    /// A resource of the management API that already exists.
    Conflict,
    /// The service is shutting down, a bounded queue is full, or its connections are all in
    /// use.
    Unavailable,
    /// A request head or body arrived slower than the configured minimum.
    RequestTimeout,
    /// Too many failed authentications from this client or for this user, for now.
    TooManyRequests,
    /// A query ran past `query_time_limit_ms`.
    TimeLimit,
    /// The store's disk is full (or its quota reached): writes wait for space.
    InsufficientStorage,
    /// Anything unexpected: a bug or an I/O failure.
    Internal,
}

impl ErrorCode {
    /// The HTTP status for this code. Every variant is matched: no wildcard.
    pub fn status(self) -> u16 {
        match self {
            ErrorCode::RequiredParam => 400,
            ErrorCode::UnsupportedParam => 400,
            ErrorCode::InvalidParam => 400,
            ErrorCode::InvalidType => 400,
            ErrorCode::JsonDoc => 400,
            ErrorCode::XmlDoc => 400,
            ErrorCode::InvalidRequest => 400,
            ErrorCode::InvalidMimeType => 415,
            ErrorCode::Unauthorized => 401,
            ErrorCode::SecPriv => 403,
            ErrorCode::SecPermDenied => 403,
            ErrorCode::NoDocument => 404,
            ErrorCode::UnknownEndpoint => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::UriTooLong => 414,
            ErrorCode::HeadersTooLarge => 431,
            ErrorCode::ExtensionNotFound => 404,
            ErrorCode::ExtensionInvalid => 400,
            ErrorCode::PluginFailed(status) => status.0,
            ErrorCode::Conflict => 409,
            ErrorCode::Unavailable => 503,
            ErrorCode::RequestTimeout => 408,
            ErrorCode::TooManyRequests => 429,
            ErrorCode::TimeLimit => 503,
            ErrorCode::InsufficientStorage => 507,
            ErrorCode::Internal => 500,
        }
    }

    /// The `messageCode` member of the error body.
    pub fn message_code(self) -> &'static str {
        match self {
            ErrorCode::RequiredParam => "REST-REQUIREDPARAM",
            ErrorCode::UnsupportedParam => "REST-UNSUPPORTEDPARAM",
            ErrorCode::InvalidParam => "REST-INVALIDPARAM",
            ErrorCode::InvalidType => "REST-INVALIDTYPE",
            ErrorCode::JsonDoc => "XDMP-JSONDOC",
            ErrorCode::XmlDoc => "XDMP-DOCROOTTEXT",
            ErrorCode::InvalidRequest => "RESTAPI-INVALIDREQ",
            ErrorCode::InvalidMimeType => "RESTAPI-INVALIDMIMETYPE",
            ErrorCode::Unauthorized => "SEC-AUTHFAILED",
            ErrorCode::SecPriv => "SEC-PRIV",
            ErrorCode::SecPermDenied => "SEC-PERMDENIED",
            ErrorCode::NoDocument => "RESTAPI-NODOCUMENT",
            ErrorCode::UnknownEndpoint => "RESTAPI-INVALIDREQ",
            ErrorCode::MethodNotAllowed => "REST-UNSUPPORTEDMETHOD",
            ErrorCode::PayloadTooLarge => "RESTAPI-REQUESTTOOLARGE",
            ErrorCode::UriTooLong => "RESTAPI-REQUESTTOOLARGE",
            ErrorCode::HeadersTooLarge => "RESTAPI-REQUESTTOOLARGE",
            ErrorCode::ExtensionNotFound
            | ErrorCode::ExtensionInvalid
            | ErrorCode::PluginFailed(_) => "RESTAPI-SRVEXERR",
            ErrorCode::Conflict => "MANAGE-EXISTS",
            ErrorCode::Unavailable => "RESTAPI-UNAVAILABLE",
            ErrorCode::RequestTimeout => "RESTAPI-REQUESTTIMEOUT",
            ErrorCode::TooManyRequests => "SEC-TOOMANYFAILURES",
            ErrorCode::TimeLimit => "XDMP-EXTIME",
            ErrorCode::InsufficientStorage => "XDMP-NOSPACE",
            ErrorCode::Internal => "INTERNAL ERROR",
        }
    }
}

/// An error as a client sees it: a code and a human message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// What kind of failure, which decides the status.
    pub code: ErrorCode,
    /// Lowercase-first, names the offending thing; never a stack trace or a type name.
    pub message: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
        }
    }

    pub fn status(&self) -> u16 {
        self.code.status()
    }

    /// The `errorResponse` body of docs/contract.md §1.
    pub fn to_body(&self) -> Vec<u8> {
        let status = self.status();
        let body = serde_json::json!({
            "errorResponse": {
                "statusCode": status,
                "status": reason_phrase(status),
                "messageCode": self.code.message_code(),
                "message": self.message,
            }
        });
        serde_json::to_vec(&body).unwrap_or_else(|_| b"{}".to_vec())
    }

    /// The body of the 401 that challenges a client to authenticate: the contract's shows
    /// no `messageCode` (docs/contract.md §6), whatever the code.
    pub fn challenge_body() -> Vec<u8> {
        let status = ErrorCode::Unauthorized.status();
        let phrase = reason_phrase(status);
        let body = serde_json::json!({
            "errorResponse": {
                "statusCode": status,
                "status": phrase,
                "message": format!("{status} {phrase}"),
            }
        });
        serde_json::to_vec(&body).unwrap_or_else(|_| b"{}".to_vec())
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.code.message_code(), self.message)
    }
}

impl std::error::Error for ApiError {}

/// The reason phrase of the statuses this service uses.
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Payload Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        507 => "Insufficient Storage",
        _ => "Error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_challenge_body_is_the_contracts() {
        assert_eq!(
            String::from_utf8(ApiError::challenge_body()).unwrap(),
            r#"{"errorResponse":{"statusCode":401,"status":"Unauthorized","message":"401 Unauthorized"}}"#
        );
    }

    #[test]
    fn body_has_the_four_members() {
        let e = ApiError::new(ErrorCode::NoDocument, "no such document: /a.json");
        let v: serde_json::Value = serde_json::from_slice(&e.to_body()).unwrap();
        assert_eq!(v["errorResponse"]["statusCode"], 404);
        assert_eq!(v["errorResponse"]["status"], "Not Found");
        assert_eq!(v["errorResponse"]["messageCode"], "RESTAPI-NODOCUMENT");
        assert_eq!(v["errorResponse"]["message"], "no such document: /a.json");
    }

    #[test]
    fn extension_statuses() {
        assert_eq!(ErrorCode::ExtensionNotFound.status(), 404);
        assert_eq!(ErrorCode::ExtensionInvalid.status(), 400);
        assert_eq!(
            ErrorCode::ExtensionNotFound.message_code(),
            "RESTAPI-SRVEXERR"
        );
        let thrown = |s| ErrorCode::PluginFailed(PluginStatus::new(s)).status();
        assert_eq!(thrown(Some(418)), 418);
        assert_eq!(thrown(Some(599)), 599);
        for outside in [
            None,
            Some(0),
            Some(200),
            Some(302),
            Some(600),
            Some(u64::MAX),
        ] {
            assert_eq!(thrown(outside), 500, "{outside:?}");
        }
    }
}
