//! The web UI: one HTML page with plain JavaScript files and CSS, embedded in the binary
//! (no build step). `charts.js` draws the charts as SVG; `overview.js` is the landing
//! page; `queues.js`, `tasks.js`, `schedules.js` and `admin.js` the other pages; `app.js` the shell.

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::Shared;

const INDEX_HTML: &str = include_str!("ui/index.html");

/// The files under `/ui/`: name, content type, text.
const ASSETS: &[(&str, &str, &str)] = &[
    ("app.js", JS, include_str!("ui/app.js")),
    ("charts.js", JS, include_str!("ui/charts.js")),
    ("overview.js", JS, include_str!("ui/overview.js")),
    ("queues.js", JS, include_str!("ui/queues.js")),
    ("tasks.js", JS, include_str!("ui/tasks.js")),
    ("admin.js", JS, include_str!("ui/admin.js")),
    ("schedules.js", JS, include_str!("ui/schedules.js")),
    ("app.css", "text/css; charset=utf-8", include_str!("ui/app.css")),
];
const JS: &str = "text/javascript; charset=utf-8";

/// `GET /` and `GET /ui/{file}`.
pub(super) fn routes() -> Router<Shared> {
    Router::new()
        .route("/", get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }))
        .route("/ui/{file}", get(file))
}

async fn file(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, body)) => asset(content_type, body).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(serde_json::json!({ "error": format!("no UI file {name:?}") })),
        )
            .into_response(),
    }
}

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
}
