//! The extractors, with errors as [`ApiError`]s: [`JsonBody`], a request body parsed as a
//! JSON object (415 when not declared JSON, 400 for bad JSON or a body that is not an
//! object, 413 over the limit), [`OptionalFields`], the same where every field is optional
//! so that an empty body is `{}` (the actions on tasks), [`Params`], a JSON object or a
//! form (the routes where Disbatch 4 read forms; 403 for a form from another site), and
//! [`PathKey`], the one parameter of a path (400 when it is not UTF-8).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use bson::oid::ObjectId;
use serde_json::{Map, Value};

use super::ApiError;

/// The value of query parameter `name`, `None` when it is absent or given empty (`since=`):
/// an empty value is no value. (A flag such as `epoch` is read by `truthy` instead, for
/// which a bare `epoch` means on.)
pub(super) fn query_value<'a>(q: &'a std::collections::HashMap<String, String>, name: &str) -> Option<&'a str> {
    q.get(name).map(|v| v.trim()).filter(|v| !v.is_empty())
}

/// A JSON object request body.
pub(super) struct JsonBody(pub Map<String, Value>);

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        check_json_type(req.headers())?;
        let bytes = read(req, state).await?;
        json_object(&bytes).map(JsonBody)
    }
}

/// The JSON object body of a request whose fields are all optional: an empty body (still
/// declared `Content-Type: application/json`, so that browsers cannot send it cross-site)
/// is `{}`. Otherwise as [`JsonBody`].
pub(super) struct OptionalFields(pub Map<String, Value>);

impl<S: Send + Sync> FromRequest<S> for OptionalFields {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        check_json_type(req.headers())?;
        let bytes = read(req, state).await?;
        optional_object(&bytes).map(OptionalFields)
    }
}

/// A body that is a JSON object or empty (only whitespace), which is `{}`.
pub(super) fn optional_object(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    json_object(bytes)
}

/// The request body, within the limit.
pub(super) async fn read<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, state).await.map_err(|e: BytesRejection| {
        if let Some(t) = super::timed_body::timed_out(&e) {
            ApiError::Timeout(t.to_string())
        } else if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::TooLarge("the request body is larger than the limit".into())
        } else {
            ApiError::bad(format!("cannot read the request body: {e}"))
        }
    })
}

/// The body, at most `limit` bytes: 408 when it stalls or trickles (see `timed_body`),
/// `too_large` past the limit, 400 when it cannot be read otherwise.
pub(super) async fn read_limited(
    body: axum::body::Body,
    limit: usize,
    too_large: impl FnOnce() -> ApiError,
) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(cause) = next {
            if cause.is::<http_body_util::LengthLimitError>() {
                return too_large();
            }
            next = cause.source();
        }
        match super::timed_body::timed_out(&e) {
            Some(t) => ApiError::Timeout(t.to_string()),
            None => ApiError::bad(format!("cannot read the request body: {e}")),
        }
    })
}

/// A body that must be a JSON object.
pub(super) fn json_object(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad("the request body is empty: expected a JSON object"));
    }
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(ApiError::bad(format!(
            "the request body must be a JSON object, got {}",
            kind(&other)
        ))),
        Err(e) => Err(ApiError::bad(format!("the request body is not valid JSON: {e}"))),
    }
}

/// The fields of a request body sent as a JSON object or, as Disbatch 4's tools send them,
/// as a form (`application/x-www-form-urlencoded`: every value a string, a repeated key
/// the array of its values). A form that a browser posts from another site is refused
/// with 403 (see [`super::form::check_same_site`]); any other type with 415.
pub(super) struct Params {
    /// The fields.
    pub fields: Map<String, Value>,
    /// Whether they came from a form.
    pub form: bool,
}

impl<S: Send + Sync> FromRequest<S> for Params {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !is_form(req.headers()) {
            return JsonBody::from_request(req, state)
                .await
                .map(|JsonBody(fields)| Params { fields, form: false });
        }
        super::form::check_same_site(req.headers(), req.uri())?;
        let bytes = read(req, state).await?;
        Ok(Params {
            fields: super::form::to_fields(super::form::decode(&bytes)),
            form: true,
        })
    }
}

/// Whether the body is declared as a form.
pub(super) fn is_form(headers: &HeaderMap) -> bool {
    content_type(headers).0.as_deref() == Some("application/x-www-form-urlencoded")
}

/// Refuses a body whose `Content-Type` is not JSON (`application/json` or `…+json`):
/// browsers send other types cross-site without asking, so accepting them would let any
/// web page write to a DCI without a token.
pub(super) fn check_json_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let (essence, given) = content_type(headers);
    match essence.as_deref() {
        Some("application/json") => Ok(()),
        Some(t) if t.starts_with("application/") && t.ends_with("+json") => Ok(()),
        _ => Err(ApiError::NotJson(format!(
            "the request body must be JSON: send header Content-Type: application/json (got {given}; \
             forms, application/x-www-form-urlencoded, are taken where Disbatch 4 took them)"
        ))),
    }
}

/// The request's media type (lowercase, parameters dropped), and the header as given for
/// messages (`no Content-Type` when there is none).
pub(super) fn content_type(headers: &HeaderMap) -> (Option<String>, String) {
    let given = headers.get(header::CONTENT_TYPE);
    let essence = given
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or("").trim().to_ascii_lowercase());
    let shown = match given {
        Some(v) => format!("{:?}", String::from_utf8_lossy(v.as_bytes())),
        None => "no Content-Type".into(),
    };
    (essence, shown)
}

/// The single parameter of a route's path (a queue, node or task key).
pub(super) struct PathKey(pub String);

impl<S: Send + Sync> FromRequestParts<S> for PathKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Path::<String>::from_request_parts(parts, state)
            .await
            .map(|Path(key)| PathKey(key))
            .map_err(|e| ApiError::bad(e.body_text()))
    }
}

/// The JSON type of a value, for messages.
pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// An ObjectId given as hex or `{"$oid": hex}`.
pub(super) fn object_id(v: &Value) -> Option<ObjectId> {
    match v {
        Value::String(s) => ObjectId::parse_str(s).ok(),
        Value::Object(o) => o
            .get("$oid")
            .and_then(Value::as_str)
            .and_then(|s| ObjectId::parse_str(s).ok()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt as _;
    use http_body::Frame;
    use http_body_util::StreamBody;

    use super::*;
    use crate::api::TimedBody;

    /// A body of `len` bytes, then nothing more ever when `stall`, cut by a short timeout.
    fn body(len: usize, stall: bool) -> axum::body::Body {
        let chunk = futures::stream::iter([Ok::<_, std::io::Error>(Frame::data(Bytes::from(vec![b'x'; len])))]);
        let s = if stall {
            chunk.chain(futures::stream::pending()).boxed()
        } else {
            chunk.boxed()
        };
        axum::body::Body::new(TimedBody::new(StreamBody::new(s), Duration::from_millis(100)))
    }

    #[tokio::test]
    async fn a_stalled_body_is_a_timeout_not_too_large() {
        let big = || ApiError::TooLarge("big".into());
        let stalled = read_limited(body(10, true), 1000, big).await.unwrap_err();
        assert!(
            matches!(stalled, ApiError::Timeout(ref t) if t.contains("stalled")),
            "{stalled:?}"
        );
        let over = read_limited(body(2000, false), 1000, big).await.unwrap_err();
        assert!(matches!(over, ApiError::TooLarge(_)), "{over:?}");
        assert_eq!(read_limited(body(10, false), 1000, big).await.unwrap().len(), 10);
    }
}
