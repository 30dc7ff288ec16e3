//! [`ApiError`]: every way a request fails, and its HTTP response `{"error": "…"}`.

use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::store::StoreError;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// Bad input (400); the message names the field.
    #[error("{0}")]
    BadRequest(String),
    /// A write without the right bearer token (401).
    #[error("missing or invalid bearer token")]
    Unauthorized,
    /// No such thing (404).
    #[error("{0}")]
    NotFound(String),
    /// The route exists but not with this method (405).
    #[error("method not allowed")]
    MethodNotAllowed,
    /// The request body is larger than the limit (413).
    #[error("the request body is larger than the limit")]
    TooLarge,
    /// A request body not declared as JSON (415); the message names the Content-Type given.
    #[error("{0}")]
    NotJson(String),
    /// The store failed (503 when the database is unreachable, 500 for bad stored data).
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ApiError {
    /// A 400 with this message.
    pub fn bad(message: impl Into<String>) -> ApiError {
        ApiError::BadRequest(message.into())
    }

    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::NotJson(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Store(StoreError::Invalid(_) | StoreError::Duplicate { .. }) => StatusCode::BAD_REQUEST,
            ApiError::Store(StoreError::Database(_)) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(error = %self, "API request failed");
        }
        let mut response = (status, Json(json!({ "error": self.to_string() }))).into_response();
        if matches!(self, ApiError::Unauthorized) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// The fallback for unknown paths.
pub(super) async fn not_found(uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no route {}", uri.path()))
}

/// The fallback for a known path with another method.
pub(super) async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
