//! [`JsonBody`]: a request body parsed as a JSON object, with errors as [`ApiError`]s
//! (400 for bad JSON or a body that is not an object, 413 over the limit).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde_json::{Map, Value};

use super::ApiError;

/// A JSON object request body.
pub(super) struct JsonBody(pub Map<String, Value>);

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e: BytesRejection| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::TooLarge
            } else {
                ApiError::bad(format!("cannot read the request body: {e}"))
            }
        })?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(ApiError::bad("the request body is empty: expected a JSON object"));
        }
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(Value::Object(map)) => Ok(JsonBody(map)),
            Ok(other) => Err(ApiError::bad(format!(
                "the request body must be a JSON object, got {}",
                kind(&other)
            ))),
            Err(e) => Err(ApiError::bad(format!("the request body is not valid JSON: {e}"))),
        }
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
