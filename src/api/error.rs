//! [`ApiError`]: every way a request fails, and its HTTP response `{"error": "…"}`.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bson::oid::ObjectId;
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
    /// A request refused whatever its content (403): a form posted from another site; the
    /// message says why.
    #[error("{0}")]
    Forbidden(String),
    /// No such thing (404).
    #[error("{0}")]
    NotFound(String),
    /// The request does not apply to the resource's current state (409), e.g. cancelling
    /// a running task; the message says why and what applies instead.
    #[error("{0}")]
    Conflict(String),
    /// The request body stopped coming or came too slowly (408); the message says which
    /// and that sending it again can help.
    #[error("{0}")]
    Timeout(String),
    /// The route exists but not with this method (405).
    #[error("method not allowed")]
    MethodNotAllowed,
    /// The request body is larger than the limit (413); the message names the limit.
    #[error("{0}")]
    TooLarge(String),
    /// A request body not declared as the type the route takes (415: JSON, or a component
    /// for `POST /plugins`); the message names the Content-Type given.
    #[error("{0}")]
    NotJson(String),
    /// This DCI cannot do what was asked for now (503); the message says why.
    #[error("{0}")]
    Unavailable(String),
    /// A limit on what this DCI holds at once is reached (503 with `Retry-After: 1`); the
    /// message names the limit. Trying again later can succeed.
    #[error("{0}")]
    Busy(String),
    /// The store failed (503 when the database is unreachable or briefly unable, 500 when
    /// it refused the operation or for bad stored data).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Creating tasks (`POST /tasks`) failed after some may have been created: the status
    /// is the store error's, and the body carries `{queue, count, ids}` of the tasks
    /// created and `unconfirmed`, the ids of the batch that failed, which may or may not
    /// exist (look them up with `GET /tasks/{id}`).
    #[error(transparent)]
    PartlyCreated(Box<PartlyCreated>),
}

/// What [`ApiError::PartlyCreated`] carries.
#[derive(Debug, thiserror::Error)]
#[error(
    "created {} of {total} tasks, then: {error}; the ids created are in \"ids\", those that may or may not exist in \"unconfirmed\"",
    .created.len()
)]
pub struct PartlyCreated {
    /// What failed.
    pub error: StoreError,
    /// The queue.
    pub queue: ObjectId,
    /// How many tasks were to be created.
    pub total: usize,
    /// The ids created, in order.
    pub created: Vec<ObjectId>,
    /// The ids of the batch that failed.
    pub unconfirmed: Vec<ObjectId>,
}

/// The HTTP status of a store error.
fn store_status(e: &StoreError) -> StatusCode {
    match e {
        StoreError::Invalid(_) | StoreError::Duplicate { .. } => StatusCode::BAD_REQUEST,
        StoreError::Database(_) => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
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
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::NotJson(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Unavailable(_) | ApiError::Busy(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Store(e) => store_status(e),
            ApiError::PartlyCreated(p) => store_status(&p.error),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(error = %self, "API request failed");
        }
        let mut body = json!({ "error": self.to_string() });
        if let ApiError::PartlyCreated(p) = &self {
            body = super::json::created(p.queue, &p.created);
            body["error"] = json!(self.to_string());
            body["unconfirmed"] = json!(p.unconfirmed.iter().map(|id| id.to_hex()).collect::<Vec<_>>());
        }
        let mut response = (status, Json(body)).into_response();
        if matches!(self, ApiError::Busy(_)) {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        if matches!(self, ApiError::Unauthorized) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// The fallback for a known path with another method.
pub(super) async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
