//! The OpenAPI 3 document of the API, served at `GET /openapi.json`.

use axum::http::header;
use axum::response::IntoResponse;

/// The OpenAPI document (JSON text).
pub const OPENAPI_JSON: &str = include_str!("openapi.json");

/// `GET /openapi.json`.
pub(super) async fn document() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON)
}
