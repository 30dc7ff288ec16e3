//! The REST API under test: a router on a fresh test database ([`setup`]), requests sent
//! in-process with `oneshot` ([`send`], [`get`], [`post`], [`send_request`]) or over a real
//! TCP connection to an `axum::serve` of the same router ([`serve`], [`raw_http`]).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, HeaderMap, Method, Request, StatusCode};
use axum::Router;
use disbatch::api::{router, ApiState};
use http_body_util::BodyExt;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::ServiceExt;

use super::db::{test_db, TestDb};

/// The plugins the test routers allow.
pub const PLUGINS: [&str; 2] = ["demo", "fail"];

/// A router on a fresh database, with the collection form of `POST /tasks` enabled;
/// `tweak` adjusts the state (token, body limit, …) before the router is built.
pub async fn setup(hint: &str, tweak: impl FnOnce(&mut ApiState)) -> (TestDb, Router) {
    let db = test_db(hint).await;
    let mut state = ApiState::new(
        Arc::new(db.store.clone()),
        PLUGINS.iter().map(|s| s.to_string()).collect(),
    );
    state.documents = Some(Arc::new(db.db.clone()));
    state.database = Some(db.name.clone());
    tweak(&mut state);
    let app = router(state);
    (db, app)
}

/// An answer of the API.
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub text: String,
}

impl Reply {
    /// The body as JSON; panics with the text when it is not.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }

    /// The `error` string of the body; panics when there is none.
    pub fn error(&self) -> String {
        self.json()["error"]
            .as_str()
            .unwrap_or_else(|| panic!("no error field: {}", self.text))
            .to_owned()
    }
}

/// Sends `request` through the router in-process.
pub async fn send_request(app: &Router, request: Request<Body>) -> Reply {
    let resp = app.clone().oneshot(request).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        text: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

/// Sends a request with an optional JSON body (as `application/json`) and bearer token,
/// asking for the native answer shapes as our own clients do (`Disbatch-Shape: native`).
pub async fn send(app: &Router, method: Method, uri: &str, body: Option<&str>, token: Option<&str>) -> Reply {
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .header(disbatch::api::SHAPE_HEADER, "native");
    if body.is_some() {
        req = req.header(header::CONTENT_TYPE, "application/json");
    }
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let req = req.body(Body::from(body.unwrap_or_default().to_owned())).unwrap();
    send_request(app, req).await
}

/// `GET uri`.
pub async fn get(app: &Router, uri: &str) -> Reply {
    send(app, Method::GET, uri, None, None).await
}

/// `POST uri` with `body`.
pub async fn post(app: &Router, uri: &str, body: Value) -> Reply {
    send(app, Method::POST, uri, Some(&body.to_string()), None).await
}

/// Asserts a 400 whose error mentions `mentions`.
pub fn assert_bad(r: &Reply, mentions: &str) {
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(
        r.error().contains(mentions),
        "error {:?} should mention {mentions:?}",
        r.error()
    );
}

/// Percent-encodes everything but unreserved characters.
pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Serves `app` on a free port of 127.0.0.1 until the test's runtime ends.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// Writes `request` (raw HTTP/1.1 bytes, which should say `Connection: close`) on a new
/// connection, closes the writing side when `close_write`, and reads the answer until the
/// server closes. The status is `None` when the server closed without answering.
pub async fn raw_http(addr: SocketAddr, request: &[u8], close_write: bool) -> (Option<u16>, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The server may answer and close before reading everything (e.g. a 413).
    let _ = stream.write_all(request).await;
    if close_write {
        let _ = stream.shutdown().await;
    }
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok());
    (status, text)
}

/// The body of a raw HTTP answer (after the blank line).
pub fn raw_body(answer: &str) -> &str {
    answer.split_once("\r\n\r\n").map_or("", |(_, body)| body)
}
