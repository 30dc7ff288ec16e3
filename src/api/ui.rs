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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::ASSETS;

    /// The scripts share the page's global scope: a name declared at the top level of two
    /// of them is one name, and the later script's declaration replaces the earlier one's
    /// for every page (or, for `const` and `let`, stops the later script).
    #[test]
    fn no_top_level_name_is_declared_by_two_scripts() {
        let mut seen: HashMap<String, &str> = HashMap::new();
        for (file, _, text) in ASSETS.iter().filter(|(f, _, _)| f.ends_with(".js")) {
            for line in text.lines().filter(|l| !l.starts_with(char::is_whitespace)) {
                let words: Vec<&str> = line.split_whitespace().collect();
                let name = match words.as_slice() {
                    ["async", "function", name, ..] | ["function", name, ..] => name,
                    ["const" | "let" | "class", name, ..] => name,
                    _ => continue,
                };
                let name: String = name
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$')
                    .collect();
                if name.is_empty() {
                    continue;
                }
                if let Some(first) = seen.insert(name.clone(), file) {
                    assert_eq!(
                        first, *file,
                        "{name} is declared at the top level of both {first} and {file}"
                    );
                }
            }
        }
        assert!(
            seen.contains_key("showSchedules") && seen.contains_key("when"),
            "{seen:?}"
        );
    }
}
