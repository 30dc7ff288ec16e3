//! `web_root`: a directory of web documents served at their paths, as Disbatch 4 served
//! its `htdocs`. The API's routes and the built-in UI come first; a GET or HEAD of any
//! other path is answered from the directory when it holds that file, else 404. Hidden
//! files and directories (a path part starting with `.`) are not served.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use tower::ServiceExt as _;
use tower_http::services::ServeDir;

use super::error::ApiError;
use super::Shared;

/// The router's fallback: a file of `web_root`, or 404 naming the path.
pub(super) async fn fallback(State(state): State<Shared>, request: Request) -> Response {
    let path = request.uri().path().to_owned();
    if let Some(root) = state.web_root.as_ref() {
        // Hidden files (`.htpasswd`, `.git/…`) are never served.
        let hidden = path
            .split('/')
            .any(|part| part.starts_with('.') || part.starts_with("%2e") || part.starts_with("%2E"));
        if matches!(*request.method(), Method::GET | Method::HEAD) && !hidden {
            // Requests for directories are not redirected or listed.
            let serve = ServeDir::new(root).append_index_html_on_directories(false);
            let (parts, _) = request.into_parts();
            let Ok(found) = serve.oneshot(Request::from_parts(parts, Body::empty())).await;
            if found.status() != StatusCode::NOT_FOUND {
                return found.map(Body::new).into_response();
            }
        }
    }
    ApiError::NotFound(format!("no route {path}")).into_response()
}
