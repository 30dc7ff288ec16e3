//! Hostile requests to the REST API and hostile arguments to the `disbatch` CLI: each case
//! asserts the exact status (or exit code), that the error names the offending field, id,
//! header or argument, that nothing was written, and that the API still serves afterwards.
//! The API runs in-process against the real test database server; the cases about the
//! wire (body limit, truncated or garbage requests, deep nesting) go through a real TCP
//! listener, and the CLI cases run the real binaries.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use bson::{doc, Document};
use disbatch::store::{Store, TaskFilter};
use serde_json::{json, Value};

use common::http::{get, post, raw_body, raw_http, send, send_request, serve, setup, urlencode, Reply};
use common::web::{run_disbatch, stderr, Web};
use common::TestDb;

const HEX_NOT_FOUND: &str = "0123456789abcdef01234567";

/// A read after the hostile request still answers.
async fn still_serving(app: &Router) {
    let r = get(app, "/queues").await;
    assert_eq!(r.status, StatusCode::OK, "GET /queues afterwards: {}", r.text);
    assert!(r.json().is_array(), "GET /queues afterwards: {}", r.text);
}

/// Asserts the status and that the JSON `error` mentions `mentions`, for the case `case`.
fn expect(r: &Reply, status: StatusCode, mentions: &str, case: &str) {
    assert_eq!(r.status, status, "{case}: {}", r.text);
    let error = r.error();
    assert!(
        error.contains(mentions),
        "{case}: error {error:?} should mention {mentions:?}"
    );
}

/// A request with raw body bytes and an optional Content-Type and Authorization.
async fn send_bytes(
    app: &Router,
    method: Method,
    uri: &str,
    body: Vec<u8>,
    content_type: Option<&str>,
    authorization: Option<&str>,
) -> Reply {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(t) = content_type {
        req = req.header(header::CONTENT_TYPE, t);
    }
    if let Some(a) = authorization {
        req = req.header(header::AUTHORIZATION, a);
    }
    send_request(app, req.body(Body::from(body)).unwrap()).await
}

async fn post_bytes(app: &Router, uri: &str, body: Vec<u8>) -> Reply {
    send_bytes(app, Method::POST, uri, body, Some("application/json"), None).await
}

async fn task_count(db: &TestDb) -> u64 {
    db.store.count_tasks(&TaskFilter::default()).await.unwrap()
}

async fn queue_names(db: &TestDb) -> Vec<String> {
    let mut names: Vec<String> = db.store.queues().await.unwrap().into_iter().map(|q| q.name).collect();
    names.sort();
    names
}

/// A router with queue `q` (demo, threads 1) and a fresh node `n1` (maxthreads 2).
async fn with_queue_and_node(hint: &str, tweak: impl FnOnce(&mut disbatch::api::ApiState)) -> (TestDb, Router) {
    let (db, app) = setup(hint, tweak).await;
    let r = send(
        &app,
        Method::POST,
        "/queues",
        Some(r#"{"name":"q","plugin":"demo","threads":1}"#),
        None,
    )
    .await;
    if r.status == StatusCode::UNAUTHORIZED {
        db.db
            .collection::<Document>("queues")
            .insert_one(doc! {"name": "q", "plugin": "demo", "threads": 1, "sort": "default"})
            .await
            .unwrap();
    } else {
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    }
    db.store.heartbeat("n1", Duration::from_secs(30)).await.unwrap();
    assert!(disbatch::lifecycle::nodes::set_maxthreads(&db.store, "n1", Some(2))
        .await
        .unwrap());
    (db, app)
}

/// Queue `q` and node `n1` as the API shows them, without the volatile fields.
async fn snapshot(app: &Router) -> (Value, Value) {
    let q = get(app, "/queues/q").await;
    assert_eq!(q.status, StatusCode::OK, "{}", q.text);
    let n = get(app, "/nodes/n1").await.json();
    (q.json(), json!({"node": n["node"], "maxthreads": n["maxthreads"]}))
}

/// The JSON routes, with the queue and node of [`with_queue_and_node`].
const JSON_ROUTES: [&str; 4] = ["/queues", "/queues/q", "/nodes/n1", "/tasks"];

#[tokio::test]
async fn malformed_json_bodies_are_400_on_every_json_route() {
    let (db, app) = with_queue_and_node("hapi_malformed", |_| {}).await;
    let before = snapshot(&app).await;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "truncated",
            br#"{"name": "x", "plugin": "de"#.to_vec(),
            "not valid JSON",
        ),
        (
            "trailing garbage",
            br#"{"name":"x","plugin":"demo"} x"#.to_vec(),
            "not valid JSON",
        ),
        (
            "two objects",
            br#"{"name":"x","plugin":"demo"}{}"#.to_vec(),
            "not valid JSON",
        ),
        (
            "array",
            br#"[{"name":"x","plugin":"demo"}]"#.to_vec(),
            "must be a JSON object, got an array",
        ),
        ("string", br#""x""#.to_vec(), "must be a JSON object, got a string"),
        ("number", b"42".to_vec(), "must be a JSON object, got a number"),
        ("null", b"null".to_vec(), "must be a JSON object, got null"),
        ("boolean", b"true".to_vec(), "must be a JSON object, got a boolean"),
        ("empty", Vec::new(), "empty"),
        ("whitespace only", b" \r\n\t ".to_vec(), "empty"),
        (
            "invalid UTF-8",
            b"{\"name\":\"\xff\xfe\",\"plugin\":\"demo\"}".to_vec(),
            "not valid JSON",
        ),
        (
            "lone surrogate",
            br#"{"name":"\ud800","plugin":"demo"}"#.to_vec(),
            "not valid JSON",
        ),
        ("NUL byte", b"{\"name\":\"x\"\0}".to_vec(), "not valid JSON"),
        (
            "single quotes",
            b"{'name':'x','plugin':'demo'}".to_vec(),
            "not valid JSON",
        ),
        (
            "comment",
            br#"{"name":"x" /* c */,"plugin":"demo"}"#.to_vec(),
            "not valid JSON",
        ),
        (
            "NaN",
            br#"{"name":"x","plugin":"demo","threads":NaN}"#.to_vec(),
            "not valid JSON",
        ),
        (
            "byte order mark",
            b"\xef\xbb\xbf{\"name\":\"x\",\"plugin\":\"demo\"}".to_vec(),
            "not valid JSON",
        ),
    ];
    for route in JSON_ROUTES {
        for (label, body, mentions) in &cases {
            let r = post_bytes(&app, route, body.clone()).await;
            expect(
                &r,
                StatusCode::BAD_REQUEST,
                mentions,
                &format!("POST {route} with a {label} body"),
            );
        }
    }
    assert_eq!(queue_names(&db).await, ["q"]);
    assert_eq!(task_count(&db).await, 0);
    assert_eq!(snapshot(&app).await, before);
    still_serving(&app).await;
}

/// POSTs `body` over a real connection and returns the status and the JSON body.
async fn tcp_post(addr: SocketAddr, path: &str, body: &[u8]) -> (Option<u16>, String) {
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    let (status, answer) = raw_http(addr, &request, false).await;
    (status, raw_body(&answer).to_owned())
}

async fn tcp_get(addr: SocketAddr, path: &str) -> (Option<u16>, String) {
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    let (status, answer) = raw_http(addr, request.as_bytes(), false).await;
    (status, raw_body(&answer).to_owned())
}

async fn tcp_still_serving(addr: SocketAddr) {
    let (status, body) = tcp_get(addr, "/queues").await;
    assert_eq!(status, Some(200), "GET /queues afterwards: {body}");
    assert!(serde_json::from_str::<Value>(&body).unwrap().is_array(), "{body}");
}

#[tokio::test]
async fn deeply_nested_json_is_refused_without_overflowing_the_stack() {
    let (db, app) = with_queue_and_node("hapi_nested", |_| {}).await;
    let addr = serve(app).await;
    let arrays = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    let objects = |n: usize| format!("{}1{}", r#"{"a":"#.repeat(n), "}".repeat(n));
    let bodies = [
        ("10,000 nested arrays", arrays(10_000)),
        ("100,000 nested arrays", arrays(100_000)),
        ("10,000 nested objects", objects(10_000)),
        (
            "10,000 nested arrays in a field",
            format!(r#"{{"name":"x","plugin":"demo","sandbox":{}}}"#, arrays(10_000)),
        ),
        (
            "10,000 nested objects in params",
            format!(r#"{{"queue":"q","params":[{}]}}"#, objects(10_000)),
        ),
        ("unclosed nesting", "[".repeat(1_000_000)),
    ];
    for route in JSON_ROUTES {
        for (label, body) in &bodies {
            let (status, text) = tcp_post(addr, route, body.as_bytes()).await;
            let case = format!("POST {route} with {label}");
            assert_eq!(status, Some(400), "{case}: {text}");
            let error = serde_json::from_str::<Value>(&text).unwrap()["error"].clone();
            assert!(error.as_str().unwrap().contains("not valid JSON"), "{case}: {error}");
        }
    }
    let filter = urlencode(&arrays(10_000));
    let (status, text) = tcp_get(addr, &format!("/tasks?filter={filter}")).await;
    assert_eq!(status, Some(400), "a nested filter: {text}");
    assert!(text.contains("\\\"filter\\\" is not valid JSON"), "{text}");
    assert_eq!(queue_names(&db).await, ["q"]);
    assert_eq!(task_count(&db).await, 0);
    tcp_still_serving(addr).await;
}

/// `(field, value, what the error must mention)` for the fields of a queue.
fn queue_field_cases() -> Vec<(&'static str, Value, &'static str)> {
    vec![
        ("name", json!(1), "field \"name\" must be a non-empty string"),
        ("name", json!(null), "field \"name\" must be a non-empty string"),
        ("name", json!([]), "field \"name\" must be a non-empty string"),
        ("name", json!({}), "field \"name\" must be a non-empty string"),
        ("name", json!(true), "field \"name\" must be a non-empty string"),
        ("name", json!(""), "field \"name\" must be a non-empty string"),
        ("name", json!(" \t "), "field \"name\" must be a non-empty string"),
        (
            "name",
            json!(HEX_NOT_FOUND),
            "field \"name\" must not look like an ObjectId",
        ),
        ("plugin", json!(1), "field \"plugin\" must be a string"),
        ("plugin", json!(null), "field \"plugin\" must be a string"),
        ("plugin", json!(["demo"]), "field \"plugin\" must be a string"),
        ("plugin", json!({"name": "demo"}), "field \"plugin\" must be a string"),
        (
            "plugin",
            json!("nope"),
            "field \"plugin\": \"nope\" is not an allowed plugin",
        ),
        ("threads", json!("many"), "field \"threads\""),
        ("threads", json!(-1), "field \"threads\""),
        ("threads", json!("-3"), "field \"threads\""),
        ("threads", json!(1.5), "field \"threads\""),
        ("threads", json!(true), "field \"threads\""),
        ("threads", json!([1]), "field \"threads\""),
        ("threads", json!({"n": 1}), "field \"threads\""),
        ("threads", json!(1e300), "field \"threads\""),
        ("threads", json!(9_223_372_036_854_775_808u64), "field \"threads\""),
        ("sort", json!(1), "field \"sort\""),
        ("sort", json!(null), "field \"sort\""),
        ("sort", json!("random"), "field \"sort\""),
        ("sort", json!("FIFO"), "field \"sort\""),
        ("sort", json!(["fifo"]), "field \"sort\""),
        ("sandbox", json!("x"), "field \"sandbox\""),
        ("sandbox", json!(1), "field \"sandbox\""),
        ("sandbox", json!([]), "field \"sandbox\""),
        ("sandbox", json!(null), "field \"sandbox\""),
        ("sandbox", json!({"cpu": 1}), "field \"sandbox\": unknown field `cpu`"),
        ("sandbox", json!({"timeout": -1}), "field \"sandbox\""),
        ("sandbox", json!({"timeout": "soon"}), "field \"sandbox\""),
        ("sandbox", json!({"timeout": "0s"}), "field \"sandbox.timeout\""),
        ("sandbox", json!({"timeout": 31_536_001}), "field \"sandbox.timeout\""),
        (
            "sandbox",
            json!({"timeout": "100000000000years"}),
            "field \"sandbox.timeout\"",
        ),
        ("sandbox", json!({"memory_mib": "x"}), "field \"sandbox\""),
        ("sandbox", json!({"memory_mib": -1}), "field \"sandbox\""),
        ("sandbox", json!({"memory_mib": 0}), "field \"sandbox.memory_mib\""),
        ("sandbox", json!({"memory_mib": 4097}), "field \"sandbox.memory_mib\""),
        (
            "sandbox",
            json!({"memory_mib": u64::MAX}),
            "field \"sandbox.memory_mib\"",
        ),
        (
            "sandbox",
            json!({"output_cap_mib": 4097}),
            "field \"sandbox.output_cap_mib\"",
        ),
        ("sandbox", json!({"dirs": "/data"}), "field \"sandbox\""),
        ("sandbox", json!({"dirs": [1]}), "field \"sandbox\""),
        ("sandbox", json!({"dirs": [""]}), "field \"sandbox.dirs[0]\""),
        ("sandbox", json!({"dirs": ["/a:/b:/c:rw"]}), "field \"sandbox.dirs[0]\""),
        ("sandbox", json!({"env": {"K": 1}}), "field \"sandbox\""),
        ("sandbox", json!({"env": ["K=V"]}), "field \"sandbox\""),
        (
            "sandbox",
            json!({"env": {"A\u{0}B": "v"}}),
            "field \"sandbox.env\" \"A\\0B\" is not a valid",
        ),
        (
            "sandbox",
            json!({"env": {"A=B": "v"}}),
            "field \"sandbox.env\" \"A=B\" is not a valid",
        ),
        (
            "sandbox",
            json!({"env": {"": "v"}}),
            "field \"sandbox.env\" \"\" is not a valid",
        ),
        (
            "sandbox",
            json!({"env": {"K": "v\u{0}"}}),
            "field \"sandbox.env\" \"K\" must not contain a NUL",
        ),
        ("sandbox", json!({"network": "yes"}), "field \"sandbox\""),
        ("on_orphan", json!(1), "field \"on_orphan\""),
        ("on_orphan", json!(null), "field \"on_orphan\""),
        ("on_orphan", json!("delete"), "field \"on_orphan\""),
        ("on_orphan", json!(["requeue"]), "field \"on_orphan\""),
        ("bogus", json!(1), "unknown field \"bogus\""),
        ("_id", json!(HEX_NOT_FOUND), "unknown field \"_id\""),
        ("$set", json!({"plugin": "fail"}), "unknown field \"$set\""),
    ]
}

#[tokio::test]
async fn a_wrong_value_in_any_field_of_a_new_queue_is_400_naming_it() {
    let (db, app) = setup("hapi_queue_create", |_| {}).await;
    for (field, value, mentions) in queue_field_cases() {
        let mut body = json!({"name": "fresh", "plugin": "demo"});
        body[field] = value.clone();
        let r = post(&app, "/queues", body).await;
        expect(
            &r,
            StatusCode::BAD_REQUEST,
            mentions,
            &format!("POST /queues with {field}: {value}"),
        );
    }
    assert_eq!(queue_names(&db).await, Vec::<String>::new(), "no queue was created");
    still_serving(&app).await;
}

#[tokio::test]
async fn a_wrong_value_in_any_field_of_a_queue_update_is_400_and_changes_nothing() {
    let (_db, app) = with_queue_and_node("hapi_queue_update", |_| {}).await;
    let before = snapshot(&app).await;
    for (field, value, mentions) in queue_field_cases() {
        let r = post(&app, "/queues/q", json!({ field: value })).await;
        expect(
            &r,
            StatusCode::BAD_REQUEST,
            mentions,
            &format!("POST /queues/q with {field}: {value}"),
        );
        let r = post(&app, "/queues/q", json!({"threads": 7, field: value})).await;
        assert_eq!(
            r.status,
            StatusCode::BAD_REQUEST,
            "{field} beside a valid field: {}",
            r.text
        );
    }
    expect(
        &post(&app, "/queues/q", json!({})).await,
        StatusCode::BAD_REQUEST,
        "nothing to change",
        "an empty update",
    );
    assert_eq!(snapshot(&app).await, before, "the queue is unchanged");
    still_serving(&app).await;
}

#[tokio::test]
async fn a_wrong_maxthreads_is_400_and_changes_nothing() {
    let (_db, app) = with_queue_and_node("hapi_node", |_| {}).await;
    let before = snapshot(&app).await;
    let cases: Vec<(Value, &str)> = vec![
        (
            json!({"maxthreads": "x"}),
            "field \"maxthreads\" must be a non-negative integer or null",
        ),
        (json!({"maxthreads": -1}), "field \"maxthreads\""),
        (json!({"maxthreads": "-1"}), "field \"maxthreads\""),
        (json!({"maxthreads": 1.5}), "field \"maxthreads\""),
        (json!({"maxthreads": true}), "field \"maxthreads\""),
        (json!({"maxthreads": [1]}), "field \"maxthreads\""),
        (json!({"maxthreads": {"n": 1}}), "field \"maxthreads\""),
        (json!({"maxthreads": 1e300}), "field \"maxthreads\""),
        (
            json!({"maxthreads": 9_223_372_036_854_775_808u64}),
            "field \"maxthreads\"",
        ),
        (json!({"maxthreads": ""}), "field \"maxthreads\""),
        (json!({}), "field \"maxthreads\" is required"),
        (json!({"maxthreads": 1, "node": "other"}), "unknown field \"node\""),
        (json!({"maxthreads": 1, "timestamp": 0}), "unknown field \"timestamp\""),
    ];
    for (body, mentions) in cases {
        let r = post(&app, "/nodes/n1", body.clone()).await;
        expect(&r, StatusCode::BAD_REQUEST, mentions, &format!("POST /nodes/n1 {body}"));
    }
    assert_eq!(snapshot(&app).await, before, "maxthreads is unchanged");
    still_serving(&app).await;
}

#[tokio::test]
async fn a_wrong_value_in_any_field_of_post_tasks_is_400_and_creates_nothing() {
    let (db, app) = with_queue_and_node("hapi_tasks", |_| {}).await;
    let cases: Vec<(Value, &str)> = vec![
        (json!({"queue": 1, "params": [{}]}), "field \"queue\""),
        (json!({"queue": null, "params": [{}]}), "field \"queue\""),
        (json!({"queue": [], "params": [{}]}), "field \"queue\""),
        (json!({"queue": {}, "params": [{}]}), "field \"queue\""),
        (json!({"queue": "", "params": [{}]}), "field \"queue\""),
        (json!({"queue": true, "params": [{}]}), "field \"queue\""),
        (json!({"queue": {"$oid": "zz"}, "params": [{}]}), "field \"queue\""),
        (json!({"params": [{}]}), "field \"queue\" is required"),
        (json!({"queue": "q"}), "field \"params\" is required"),
        (
            json!({"queue": "q", "params": {}}),
            "field \"params\" as one object must have at least one field",
        ),
        (
            json!({"queue": "q", "params": "x"}),
            "field \"params\" must be an array of objects, got a string",
        ),
        (
            json!({"queue": "q", "params": 1}),
            "field \"params\" must be an array of objects, got a number",
        ),
        (
            json!({"queue": "q", "params": null}),
            "field \"params\" must be an array of objects, got null",
        ),
        (
            json!({"queue": "q", "params": [1]}),
            "field \"params[0]\" must be an object, got a number",
        ),
        (
            json!({"queue": "q", "params": [[]]}),
            "field \"params[0]\" must be an object, got an array",
        ),
        (
            json!({"queue": "q", "params": [null]}),
            "field \"params[0]\" must be an object, got null",
        ),
        (
            json!({"queue": "q", "params": [{}, "x"]}),
            "field \"params[1]\" must be an object, got a string",
        ),
        (
            json!({"queue": "q", "params": [{"a": {"$numberLong": "x"}}]}),
            "field \"params[0]\" is not valid Extended JSON",
        ),
        (
            json!({"queue": "q", "params": [{"a": {"$oid": "zz"}}]}),
            "field \"params[0]\" is not valid Extended JSON",
        ),
        (
            json!({"queue": "q", "params": [{}, {"a\u{0}b": 1}]}),
            "field \"params[1]\" cannot be stored",
        ),
        (
            json!({"queue": "q", "params": [{"x": {"\u{0}": 1}}]}),
            "field \"params[0]\" cannot be stored",
        ),
        (
            json!({"queue": "q", "params": [], "weight": 5}),
            "unknown field \"weight\"",
        ),
        (json!({"queue": "q", "params": [], "x": 1}), "unknown field \"x\""),
        (
            json!({"queue": "q", "filter": {}, "params": []}),
            "field \"filter\" needs field \"collection\"",
        ),
        (
            json!({"queue": "q", "collection": 1, "params": {}}),
            "field \"collection\"",
        ),
        (
            json!({"queue": "q", "collection": "", "params": {}}),
            "field \"collection\"",
        ),
        (
            json!({"queue": "q", "collection": null, "params": {}}),
            "field \"collection\"",
        ),
        (
            json!({"queue": "q", "collection": "a$b", "params": {}}),
            "field \"collection\"",
        ),
        (
            json!({"queue": "q", "collection": "system.users", "params": {}}),
            "field \"collection\"",
        ),
        (
            json!({"queue": "q", "collection": "c", "filter": "x", "params": {}}),
            "field \"filter\"",
        ),
        (
            json!({"queue": "q", "collection": "c", "filter": [], "params": {}}),
            "field \"filter\"",
        ),
        (
            json!({"queue": "q", "collection": "c", "filter": {"$bogus": 1}, "params": {}}),
            "field \"filter\"",
        ),
        (
            json!({"queue": "q", "collection": "c", "params": ["document"]}),
            "field \"params\"",
        ),
        (
            json!({"queue": "q", "collection": "c", "params": "document"}),
            "field \"params\"",
        ),
    ];
    for (body, mentions) in cases {
        let r = post(&app, "/tasks", body.clone()).await;
        expect(&r, StatusCode::BAD_REQUEST, mentions, &format!("POST /tasks {body}"));
    }
    let r = post(&app, "/tasks", json!({"queue": "nope", "params": [{}]})).await;
    expect(&r, StatusCode::NOT_FOUND, "no queue \"nope\"", "an unknown queue");
    let r = post(&app, "/tasks", json!({"queue": HEX_NOT_FOUND, "params": [{}]})).await;
    expect(&r, StatusCode::NOT_FOUND, HEX_NOT_FOUND, "an unknown queue id");
    assert_eq!(task_count(&db).await, 0, "no task was created");
    still_serving(&app).await;
}

#[tokio::test]
async fn bad_and_unknown_ids_in_every_path_that_takes_one() {
    let (db, app) = with_queue_and_node("hapi_ids", |_| {}).await;
    let threads = json!({"threads": 3}).to_string();
    let maxthreads = json!({"maxthreads": 3}).to_string();
    let cases: Vec<(Method, String, Option<&str>, StatusCode, &str)> = vec![
        // `GET /tasks/{id}` takes a task key where the text is not an id.
        (
            Method::GET,
            "/tasks/zzz".into(),
            None,
            StatusCode::NOT_FOUND,
            "no task with id or key \"zzz\"",
        ),
        (
            Method::GET,
            format!("/tasks/{}", &HEX_NOT_FOUND[..23]),
            None,
            StatusCode::NOT_FOUND,
            "no task with id or key",
        ),
        (
            Method::GET,
            format!("/tasks/{HEX_NOT_FOUND}0"),
            None,
            StatusCode::NOT_FOUND,
            "no task with id or key",
        ),
        (
            Method::GET,
            "/tasks/%00".into(),
            None,
            StatusCode::NOT_FOUND,
            "no task with id or key \"\\0\"",
        ),
        (Method::GET, "/tasks/%FF".into(), None, StatusCode::BAD_REQUEST, "`id`"),
        (
            Method::GET,
            format!("/tasks/{HEX_NOT_FOUND}"),
            None,
            StatusCode::NOT_FOUND,
            HEX_NOT_FOUND,
        ),
        (
            Method::GET,
            format!("/tasks/{HEX_NOT_FOUND}?output=1"),
            None,
            StatusCode::NOT_FOUND,
            HEX_NOT_FOUND,
        ),
        (
            Method::GET,
            "/queues/zzz".into(),
            None,
            StatusCode::NOT_FOUND,
            "no queue \"zzz\"",
        ),
        (
            Method::GET,
            format!("/queues/{HEX_NOT_FOUND}"),
            None,
            StatusCode::NOT_FOUND,
            HEX_NOT_FOUND,
        ),
        (
            Method::GET,
            "/queues/%FF".into(),
            None,
            StatusCode::BAD_REQUEST,
            "`queue`",
        ),
        (
            Method::GET,
            "/queues/..%2F..%2Fetc%2Fpasswd".into(),
            None,
            StatusCode::NOT_FOUND,
            "no queue \"../../etc/passwd\"",
        ),
        (
            Method::POST,
            format!("/queues/{HEX_NOT_FOUND}"),
            Some(&threads),
            StatusCode::NOT_FOUND,
            HEX_NOT_FOUND,
        ),
        (
            Method::POST,
            "/queues/zzz".into(),
            Some(&threads),
            StatusCode::NOT_FOUND,
            "\"zzz\"",
        ),
        (
            Method::POST,
            "/queues/%FF".into(),
            Some(&threads),
            StatusCode::BAD_REQUEST,
            "`queue`",
        ),
        (
            Method::DELETE,
            "/queues/zzz".into(),
            None,
            StatusCode::NOT_FOUND,
            "\"zzz\"",
        ),
        (
            Method::DELETE,
            format!("/queues/{HEX_NOT_FOUND}"),
            None,
            StatusCode::NOT_FOUND,
            HEX_NOT_FOUND,
        ),
        (
            Method::DELETE,
            "/queues/%FF".into(),
            None,
            StatusCode::BAD_REQUEST,
            "`queue`",
        ),
        (
            Method::GET,
            "/nodes/zzz".into(),
            None,
            StatusCode::NOT_FOUND,
            "no node \"zzz\"",
        ),
        (
            Method::GET,
            format!("/nodes/{HEX_NOT_FOUND}"),
            None,
            StatusCode::NOT_FOUND,
            HEX_NOT_FOUND,
        ),
        (
            Method::GET,
            "/nodes/%FF".into(),
            None,
            StatusCode::BAD_REQUEST,
            "`node`",
        ),
        (
            Method::POST,
            "/nodes/zzz".into(),
            Some(&maxthreads),
            StatusCode::NOT_FOUND,
            "\"zzz\"",
        ),
        (
            Method::POST,
            format!("/nodes/{HEX_NOT_FOUND}"),
            Some(&maxthreads),
            StatusCode::NOT_FOUND,
            HEX_NOT_FOUND,
        ),
        (
            Method::POST,
            "/nodes/%FF".into(),
            Some(&maxthreads),
            StatusCode::BAD_REQUEST,
            "`node`",
        ),
    ];
    let before = snapshot(&app).await;
    for (method, uri, body, status, mentions) in cases {
        let r = send(&app, method.clone(), &uri, body, None).await;
        assert_eq!(
            r.headers[header::CONTENT_TYPE],
            "application/json",
            "{method} {uri}: {}",
            r.text
        );
        expect(&r, status, mentions, &format!("{method} {uri}"));
    }
    assert_eq!(snapshot(&app).await, before, "nothing changed");
    assert_eq!(queue_names(&db).await, ["q"]);
    still_serving(&app).await;
}

#[tokio::test]
async fn plugin_names_that_are_paths_are_refused_on_create_and_update() {
    let hostile = [
        "../x",
        "/etc/passwd",
        "a/b",
        "",
        "de\0mo",
        "..",
        ".demo",
        "a\\b",
        "demo\n",
        "../demo",
    ];
    let too_long = "p".repeat(201);
    let (db, app) = with_queue_and_node("hapi_plugins", |s| {
        s.plugins.extend(hostile.iter().map(|p| p.to_string()));
        s.plugins.push(too_long.clone());
    })
    .await;
    let before = snapshot(&app).await;
    let mut names: Vec<&str> = hostile.to_vec();
    names.push(&too_long);
    for name in names {
        let mentions = match name {
            "" => "plugin name is empty",
            n if n.len() > 200 => "longer than 200 bytes",
            _ => "must be a plain name without path separators",
        };
        let r = post(&app, "/queues", json!({"name": "evil", "plugin": name})).await;
        expect(
            &r,
            StatusCode::BAD_REQUEST,
            mentions,
            &format!("create with plugin {name:?}"),
        );
        assert!(r.error().contains("field \"plugin\""), "{}", r.error());
        let r = post(&app, "/queues/q", json!({"plugin": name})).await;
        expect(
            &r,
            StatusCode::BAD_REQUEST,
            mentions,
            &format!("update to plugin {name:?}"),
        );
    }
    for name in ["demo.wasm", "DEMO", "demo "] {
        let r = post(&app, "/queues", json!({"name": "evil", "plugin": name})).await;
        expect(
            &r,
            StatusCode::BAD_REQUEST,
            "is not an allowed plugin",
            &format!("create with plugin {name:?}"),
        );
        let r = post(&app, "/queues/q", json!({"plugin": name})).await;
        expect(
            &r,
            StatusCode::BAD_REQUEST,
            "is not an allowed plugin",
            &format!("update to plugin {name:?}"),
        );
    }
    assert_eq!(queue_names(&db).await, ["q"]);
    assert_eq!(snapshot(&app).await, before, "the plugin is still demo");
    still_serving(&app).await;
}

#[tokio::test]
async fn a_body_over_the_limit_is_413_and_the_server_stays_up() {
    let (db, app) = with_queue_and_node("hapi_limit", |s| s.body_limit = 1024).await;
    let before = snapshot(&app).await;
    let padding = "x".repeat(2048);
    let bodies = [
        ("/queues", json!({"name": padding, "plugin": "demo"})),
        ("/queues/q", json!({"name": padding})),
        ("/nodes/n1", json!({"maxthreads": 1, "pad": padding})),
        ("/tasks", json!({"queue": "q", "params": [{"pad": padding}]})),
    ];
    for (route, body) in &bodies {
        let r = post(&app, route, body.clone()).await;
        expect(&r, StatusCode::PAYLOAD_TOO_LARGE, "larger than the limit", route);
    }

    // A body of exactly the limit is read.
    let mut exact = json!({"name": "edge", "plugin": "demo", "sandbox": {"env": {"PAD": ""}}});
    let pad = 1024 - exact.to_string().len();
    exact["sandbox"]["env"]["PAD"] = json!("y".repeat(pad));
    assert_eq!(exact.to_string().len(), 1024);
    let r = post(&app, "/queues", exact).await;
    assert_eq!(r.status, StatusCode::OK, "a body of exactly the limit: {}", r.text);

    let addr = serve(app.clone()).await;
    for (route, body) in &bodies {
        let text = body.to_string();
        let (status, answer) = tcp_post(addr, route, text.as_bytes()).await;
        assert_eq!(status, Some(413), "POST {route} over TCP: {answer}");
        let chunked = format!(
            "POST {route} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{text}\r\n0\r\n\r\n",
            text.len()
        );
        let (status, answer) = raw_http(addr, chunked.as_bytes(), false).await;
        assert_eq!(status, Some(413), "chunked POST {route} over TCP: {answer}");
        assert!(raw_body(&answer).contains("larger than the limit"), "{answer}");
    }
    let (status, answer) = tcp_post(addr, "/tasks", &vec![b' '; 10 << 20]).await;
    assert_eq!(status, Some(413), "a 10 MiB body over TCP: {answer}");
    tcp_still_serving(addr).await;
    assert_eq!(queue_names(&db).await, ["edge", "q"]);
    assert_eq!(task_count(&db).await, 0);
    assert_eq!(snapshot(&app).await, before);
}

#[tokio::test]
async fn huge_params_round_trip_under_the_limit_and_are_413_over_it() {
    let (db, app) = with_queue_and_node("hapi_huge", |s| s.body_limit = 20 << 20).await;
    let blob: String = "0123456789abcdef".repeat(15_000_000 / 16);
    let params = json!({"blob": blob, "n": 1});
    let r = post(&app, "/tasks", json!({"queue": "q", "params": [params]})).await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "15 MB params: {}",
        &r.text[..r.text.len().min(300)]
    );
    let id = r.json()["ids"][0].as_str().unwrap().to_owned();
    let task = get(&app, &format!("/tasks/{id}")).await;
    assert_eq!(task.status, StatusCode::OK);
    assert_eq!(task.json()["params"], params, "the stored params round-trip");

    let over = json!({"queue": "q", "params": [{"blob": "z".repeat(21 << 20)}]});
    let r = post(&app, "/tasks", over).await;
    expect(
        &r,
        StatusCode::PAYLOAD_TOO_LARGE,
        "larger than the limit",
        "21 MiB of params",
    );
    assert_eq!(task_count(&db).await, 1);
    still_serving(&app).await;
}

#[tokio::test]
async fn params_too_large_for_a_task_document_are_400_not_a_database_error() {
    let (db, app) = with_queue_and_node("hapi_bson_size", |s| s.body_limit = 64 << 20).await;
    // Two million small numbers: 4 MB of JSON, 24 MB of BSON.
    let numbers = vec![1; 2_000_000];
    let r = post(
        &app,
        "/tasks",
        json!({"queue": "q", "params": [{"a": 1}, {"n": numbers}]}),
    )
    .await;
    expect(
        &r,
        StatusCode::BAD_REQUEST,
        "field \"params[1]\" is ",
        "params of 24 MB as BSON",
    );
    assert!(r.error().contains("bytes as BSON"), "{}", r.error());

    // From a collection: each document is 9 MB, its params take it twice.
    let big = "d".repeat(9 << 20);
    db.db
        .collection::<Document>("docs")
        .insert_one(doc! {"big": big})
        .await
        .unwrap();
    let r = post(
        &app,
        "/tasks",
        json!({"queue": "q", "collection": "docs", "filter": {}, "params": {"one": "document", "two": "document.big"}}),
    )
    .await;
    expect(
        &r,
        StatusCode::BAD_REQUEST,
        "field \"params[0]\" is ",
        "params of 18 MB from a collection",
    );
    assert_eq!(task_count(&db).await, 0, "no task of the batch was created");
    still_serving(&app).await;
}

#[tokio::test]
async fn limit_and_skip_out_of_range_are_400_naming_them() {
    let (db, app) = with_queue_and_node("hapi_paging", |_| {}).await;
    post(&app, "/tasks", json!({"queue": "q", "params": [{}, {}]})).await;
    let cases = [
        ("limit=10001", "\"limit\" must be at most 10000"),
        ("limit=18446744073709551616", "\"limit\" must be a non-negative integer"),
        (
            "limit=99999999999999999999999999",
            "\"limit\" must be a non-negative integer",
        ),
        ("limit=-1", "\"limit\" must be a non-negative integer"),
        ("limit=ten", "\"limit\" must be a non-negative integer"),
        ("limit=1e3", "\"limit\" must be a non-negative integer"),
        ("limit=0x10", "\"limit\" must be a non-negative integer"),
        // Given empty, `limit` is absent: no filter and no limit is an unbounded query.
        ("limit=", "refusing an unbounded query"),
        ("limit=%00", "\"limit\" must be a non-negative integer"),
        ("limit=5&skip=-1", "\"skip\" must be a non-negative integer"),
        ("limit=5&skip=abc", "\"skip\" must be a non-negative integer"),
        (
            "limit=5&skip=9223372036854775808",
            "\"skip\" must be at most 9223372036854775807",
        ),
        ("limit=5&skip=18446744073709551615", "\"skip\" must be at most"),
        ("queue=q&full=1&limit=11", "\"limit\" must be at most 10"),
    ];
    for (query, mentions) in cases {
        let r = get(&app, &format!("/tasks?{query}")).await;
        expect(&r, StatusCode::BAD_REQUEST, mentions, query);
    }
    let r = get(&app, "/tasks?limit=5&skip=9223372036854775807").await;
    assert_eq!(r.status, StatusCode::OK, "the largest skip: {}", r.text);
    assert_eq!(r.json(), json!([]));
    let r = get(&app, "/tasks?limit=10000").await;
    assert_eq!(r.json().as_array().map(Vec::len), Some(2), "{}", r.text);
    assert_eq!(task_count(&db).await, 2);
    still_serving(&app).await;
}

#[tokio::test]
async fn filters_on_unindexed_fields_and_code_operators_are_refused() {
    let (db, app) = with_queue_and_node("hapi_filters", |_| {}).await;
    db.db
        .collection::<Document>("people")
        .insert_one(doc! {"name": "ann"})
        .await
        .unwrap();
    let queries = [
        ("params.n=1", "cannot filter on \"params.n\""),
        ("ctime=1", "cannot filter on \"ctime\""),
        ("stdout=x", "cannot filter on \"stdout\""),
        ("%24where=1", "cannot filter on \"$where\""),
        (r#"filter={"params.n":1}"#, "cannot filter on \"params.n\""),
        (r#"filter={"$where":"sleep(10000)"}"#, "cannot filter on \"$where\""),
        (r#"filter={"$or":[{"status":1}]}"#, "cannot filter on \"$or\""),
        (r#"filter={"status":{"$where":"1"}}"#, "filter \"status\""),
        (r#"filter={"status":{"$gt":0}}"#, "filter \"status\""),
        (r#"filter={"queue":{"$ne":null}}"#, "filter \"queue\""),
        (r#"filter={"node":{"$regex":"."}}"#, "filter \"node\""),
        (r#"filter={"id":{"$gt":"0"}}"#, "filter \"id\""),
        ("filter=[]", "\"filter\" must be a JSON object, got an array"),
        ("filter=x", "\"filter\" is not valid JSON"),
    ];
    for (query, mentions) in queries {
        let (key, value) = query.split_once('=').unwrap();
        let uri = format!("/tasks?{key}={}", urlencode(value));
        let r = get(&app, &uri).await;
        expect(&r, StatusCode::BAD_REQUEST, mentions, query);
    }
    let code = [
        json!({"$where": "1"}),
        json!({"name": {"$where": "1"}}),
        json!({"$expr": {"$function": {"body": "function() {return true}", "args": [], "lang": "js"}}}),
        json!({"$and": [{"$expr": {"$accumulator": {}}}]}),
        json!({"$or": [{"name": "ann"}, {"$and": [{"$where": "this.name"}]}]}),
    ];
    for filter in code {
        let r = post(
            &app,
            "/tasks",
            json!({"queue": "q", "collection": "people", "filter": filter, "params": {"who": "document.name"}}),
        )
        .await;
        expect(
            &r,
            StatusCode::BAD_REQUEST,
            "is not allowed",
            &format!("filter {filter}"),
        );
        assert!(r.error().starts_with("field \"filter\": operator $"), "{}", r.error());
    }
    assert_eq!(task_count(&db).await, 0);
    still_serving(&app).await;
}

#[tokio::test]
async fn malformed_status_lists_are_400_not_a_panic() {
    let (_db, app) = with_queue_and_node("hapi_status", |_| {}).await;
    post(&app, "/tasks", json!({"queue": "q", "params": [{}]})).await;
    let filters = [
        json!({"status": [[]]}),
        json!({"status": [[1, 2]]}),
        json!({"status": [{"$in": []}]}),
        json!({"status": {"$in": [[]]}}),
        json!({"status": ["1,2"]}),
        json!({"status": [null]}),
        json!({"status": [true]}),
        json!({"status": {"$in": [], "$nin": [1]}}),
        json!({"status": 99_999_999_999i64}),
        json!({"status": "1,,2"}),
    ];
    for filter in filters {
        let uri = format!("/tasks?filter={}", urlencode(&filter.to_string()));
        let r = get(&app, &uri).await;
        expect(&r, StatusCode::BAD_REQUEST, "filter \"status\"", &filter.to_string());
    }
    // (`status=`, empty, is no filter at all: see api_contract.)
    for query in ["status=1,", "status=%5B%5D"] {
        let r = get(&app, &format!("/tasks?{query}")).await;
        expect(&r, StatusCode::BAD_REQUEST, "filter \"status\"", query);
    }
    let r = get(
        &app,
        &format!("/tasks?filter={}", urlencode(r#"{"status":{"$in":[]}}"#)),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "an empty $in matches nothing: {}", r.text);
    assert_eq!(r.json(), json!([]));
    let r = get(&app, &format!("/tasks?filter={}", urlencode(r#"{"status":[-2,"1"]}"#))).await;
    assert_eq!(r.json().as_array().map(Vec::len), Some(1), "{}", r.text);
    still_serving(&app).await;
}

#[tokio::test]
async fn every_write_route_needs_the_token_and_nothing_is_written_without_it() {
    const TOKEN: &str = "s3cret-token-0123";
    let (db, app) = with_queue_and_node("hapi_token", |s| s.api_token = Some(TOKEN.into())).await;
    let before = snapshot(&app).await;
    let writes: [(Method, &str, Option<&str>); 8] = [
        (Method::POST, "/queues", Some(r#"{"name":"new","plugin":"demo"}"#)),
        (Method::POST, "/queues/q", Some(r#"{"threads":9}"#)),
        (Method::POST, "/tasks", Some(r#"{"queue":"q","params":[{}]}"#)),
        (Method::POST, "/nodes/n1", Some(r#"{"maxthreads":9}"#)),
        (Method::DELETE, "/queues/q", None),
        (Method::POST, "/queues", Some("{not json")),
        (Method::PUT, "/queues/q", Some(r#"{"threads":9}"#)),
        (Method::POST, "/no/such/route", Some("{}")),
    ];
    // HTTP basic passes with the token as password (any user name), not otherwise.
    let basic = |credentials: &str| {
        use base64::Engine as _;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(credentials)
        )
    };
    let wrong_auth: Vec<(&str, Option<String>)> = vec![
        ("no Authorization", None),
        ("a wrong token", Some("Bearer wrong".into())),
        ("an empty token", Some("Bearer ".into())),
        (
            "a prefix of the token",
            Some(format!("Bearer {}", &TOKEN[..TOKEN.len() - 1])),
        ),
        ("the token and more", Some(format!("Bearer {TOKEN}4"))),
        (
            "the token in upper case",
            Some(format!("Bearer {}", TOKEN.to_uppercase())),
        ),
        ("no scheme", Some(TOKEN.into())),
        ("another scheme", Some(format!("Token {TOKEN}"))),
        ("basic auth with a wrong password", Some(basic("user:s3cret-token-012"))),
        (
            "basic auth with the token as user name",
            Some(basic(&format!("{TOKEN}:x"))),
        ),
        ("basic auth without a colon", Some(basic(TOKEN))),
    ];
    for (method, uri, body) in &writes {
        for (label, auth) in &wrong_auth {
            let r = send_bytes(
                &app,
                method.clone(),
                uri,
                body.unwrap_or_default().as_bytes().to_vec(),
                body.map(|_| "application/json"),
                auth.as_deref(),
            )
            .await;
            let case = format!("{method} {uri} with {label}");
            expect(&r, StatusCode::UNAUTHORIZED, "missing or invalid bearer token", &case);
            assert_eq!(r.headers[header::WWW_AUTHENTICATE], "Bearer", "{case}");
        }
    }
    for query in ["token", "access_token", "api_token"] {
        let r = send(&app, Method::DELETE, &format!("/queues/q?{query}={TOKEN}"), None, None).await;
        expect(
            &r,
            StatusCode::UNAUTHORIZED,
            "token",
            &format!("the token as ?{query}="),
        );
    }

    assert_eq!(queue_names(&db).await, ["q"], "no queue created or deleted");
    assert_eq!(task_count(&db).await, 0, "no task created");
    assert_eq!(snapshot(&app).await, before, "queue and node unchanged");
    still_serving(&app).await;

    // The same requests with the token go through, so the 401s were the token's doing.
    for (method, uri, body) in &writes[..5] {
        let r = send(&app, method.clone(), uri, *body, Some(TOKEN)).await;
        assert_eq!(r.status, StatusCode::OK, "{method} {uri} with the token: {}", r.text);
    }
    assert_eq!(queue_names(&db).await, ["new"]);
    assert_eq!(task_count(&db).await, 1);
    assert_eq!(get(&app, "/nodes/n1").await.json()["maxthreads"], 9);
}

#[tokio::test]
async fn a_body_not_declared_as_json_is_415_naming_the_content_type() {
    let (db, app) = with_queue_and_node("hapi_ctype", |_| {}).await;
    let before = snapshot(&app).await;
    let bodies = [
        ("/queues", r#"{"name":"new","plugin":"demo"}"#),
        ("/queues/q", r#"{"threads":9}"#),
        ("/nodes/n1", r#"{"maxthreads":9}"#),
        ("/tasks", r#"{"queue":"q","params":[{}]}"#),
    ];
    let refused = [
        None,
        Some("text/plain"),
        Some("text/plain;charset=UTF-8"),
        // (Forms are taken where Disbatch 4 took them: tests/api_perl_cli.rs.)
        Some("multipart/form-data; boundary=x"),
        Some("application/xml"),
        Some("application/jsonx"),
        Some("json"),
        Some(""),
        Some("text/json+plain"),
    ];
    for (route, body) in bodies {
        for ct in refused {
            let r = send_bytes(&app, Method::POST, route, body.as_bytes().to_vec(), ct, None).await;
            let case = format!("POST {route} with Content-Type {ct:?}");
            expect(
                &r,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "Content-Type: application/json",
                &case,
            );
            let named = match ct {
                None => "no Content-Type".to_owned(),
                Some(t) => format!("{t:?}"),
            };
            assert!(r.error().contains(&named), "{case}: {}", r.error());
        }
    }
    assert_eq!(queue_names(&db).await, ["q"]);
    assert_eq!(task_count(&db).await, 0);
    assert_eq!(snapshot(&app).await, before);

    for (i, ct) in [
        "application/json; charset=utf-8",
        "Application/JSON",
        "application/vnd.api+json",
    ]
    .iter()
    .enumerate()
    {
        let body = json!({"name": format!("ok{i}"), "plugin": "demo"}).to_string();
        let r = send_bytes(&app, Method::POST, "/queues", body.into_bytes(), Some(ct), None).await;
        assert_eq!(r.status, StatusCode::OK, "Content-Type {ct:?}: {}", r.text);
    }
    still_serving(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_queue_names_are_400_even_when_created_at_once() {
    let (db, app) = with_queue_and_node("hapi_dup", |_| {}).await;
    let r = post(&app, "/queues", json!({"name": "q", "plugin": "fail"})).await;
    expect(
        &r,
        StatusCode::BAD_REQUEST,
        "queue \"q\" already exists",
        "the same name",
    );
    let r = post(&app, "/queues", json!({"name": "  q  ", "plugin": "fail"})).await;
    expect(
        &r,
        StatusCode::BAD_REQUEST,
        "queue \"q\" already exists",
        "the same name padded",
    );
    post(&app, "/queues", json!({"name": "other", "plugin": "demo"})).await;
    let r = post(&app, "/queues/other", json!({"name": "q"})).await;
    expect(
        &r,
        StatusCode::BAD_REQUEST,
        "queue \"q\" already exists",
        "a rename onto it",
    );
    assert_eq!(queue_names(&db).await, ["other", "q"]);
    assert_eq!(get(&app, "/queues/q").await.json()["plugin"], "demo");

    let racers = (0..8).map(|i| {
        let app = app.clone();
        tokio::spawn(async move {
            let plugin = if i % 2 == 0 { "demo" } else { "fail" };
            post(&app, "/queues", json!({"name": "race", "plugin": plugin})).await
        })
    });
    let replies: Vec<Reply> = futures::future::join_all(racers)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let created = replies.iter().filter(|r| r.status == StatusCode::OK).count();
    assert_eq!(created, 1, "exactly one of 8 concurrent creates wins");
    for r in replies.iter().filter(|r| r.status != StatusCode::OK) {
        expect(
            r,
            StatusCode::BAD_REQUEST,
            "queue \"race\" already exists",
            "a losing create",
        );
    }
    assert_eq!(queue_names(&db).await, ["other", "q", "race"]);
    still_serving(&app).await;
}

#[tokio::test]
async fn wrong_methods_are_405_and_unknown_routes_404() {
    let (db, app) = with_queue_and_node("hapi_routes", |_| {}).await;
    let cases = [
        (
            Method::PUT,
            "/queues",
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed",
        ),
        (
            Method::PATCH,
            "/queues/q",
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed",
        ),
        (
            Method::DELETE,
            "/tasks",
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed",
        ),
        (
            Method::PUT,
            "/tasks/zzz",
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed",
        ),
        (
            Method::DELETE,
            "/nodes/n1",
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed",
        ),
        (
            Method::POST,
            "/info",
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed",
        ),
        (
            Method::DELETE,
            "/metrics",
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed",
        ),
        (
            Method::GET,
            "/queues/q/tasks",
            StatusCode::NOT_FOUND,
            "no route /queues/q/tasks",
        ),
        (Method::GET, "/tasks/a/b", StatusCode::NOT_FOUND, "no route /tasks/a/b"),
        (
            Method::PUT,
            "/balance",
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed",
        ),
        (Method::GET, "/%2e%2e/etc/passwd", StatusCode::NOT_FOUND, "no route"),
        (
            Method::DELETE,
            "/",
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed",
        ),
    ];
    for (method, uri, status, mentions) in cases {
        let r = send(&app, method.clone(), uri, Some("{}"), None).await;
        expect(&r, status, mentions, &format!("{method} {uri}"));
    }
    assert_eq!(queue_names(&db).await, ["q"]);
    assert_eq!(get(&app, "/nodes/n1").await.status, StatusCode::OK);
    still_serving(&app).await;
}

#[tokio::test]
async fn query_strings_that_are_not_utf8_or_repeat_keys_are_handled() {
    let (_db, app) = with_queue_and_node("hapi_query", |_| {}).await;
    post(&app, "/tasks", json!({"queue": "q", "params": [{}]})).await;
    let cases = [
        ("status=%FF", StatusCode::BAD_REQUEST, "filter \"status\""),
        (
            "%FF=1&limit=1",
            StatusCode::BAD_REQUEST,
            "cannot filter on \"\u{fffd}\"",
        ),
        ("filter=%FF", StatusCode::BAD_REQUEST, "\"filter\" is not valid JSON"),
        ("queue=%00", StatusCode::NOT_FOUND, "no queue \"\\0\""),
        ("queue=%FF", StatusCode::NOT_FOUND, "no queue \"\u{fffd}\""),
        ("id=%FF", StatusCode::BAD_REQUEST, "filter \"id\" must be a task id"),
        ("node=%FF&count=1", StatusCode::OK, ""),
        ("queue=q&fields=%FF,%00", StatusCode::OK, ""),
        // A repeated key matches any of its values; a queue filter takes one.
        (
            "queue=q&queue=nope",
            StatusCode::BAD_REQUEST,
            "filter \"queue\" takes one value",
        ),
        ("%=&limit=1", StatusCode::BAD_REQUEST, "cannot filter on \"%\""),
    ];
    for (query, status, mentions) in cases {
        let r = get(&app, &format!("/tasks?{query}")).await;
        if status == StatusCode::OK {
            assert_eq!(r.status, status, "{query}: {}", r.text);
            assert!(r.json().is_array() || r.json()["count"] == 0, "{query}: {}", r.text);
        } else {
            expect(&r, status, mentions, query);
        }
    }
    still_serving(&app).await;
}

#[tokio::test]
async fn truncated_and_garbage_requests_over_tcp_leave_the_server_up() {
    let (db, app) = with_queue_and_node("hapi_wire", |_| {}).await;
    let addr = serve(app).await;
    let truncated = "POST /queues HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\nConnection: close\r\n\r\n{\"name\":";
    let (status, answer) = raw_http(addr, truncated.as_bytes(), true).await;
    assert_eq!(status, Some(400), "a body cut short: {answer}");
    assert!(raw_body(&answer).contains("cannot read the request body"), "{answer}");

    let cases: [(&str, &[u8], u16); 4] = [
        ("a garbage request line", b"GARBAGE\r\n\r\n", 400),
        ("a raw 0xFF in the path", b"GET /queues/\xff HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", 400),
        (
            "a bad chunk size",
            b"POST /tasks HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
            400,
        ),
        (
            "a negative Content-Length",
            b"POST /tasks HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: -5\r\nConnection: close\r\n\r\n{}",
            400,
        ),
    ];
    for (label, request, expected) in cases {
        let (status, answer) = raw_http(addr, request, false).await;
        assert_eq!(status, Some(expected), "{label}: {answer}");
    }
    let many_headers: String = (0..200).map(|i| format!("X-H{i}: v\r\n")).collect();
    let request = format!("GET /queues HTTP/1.1\r\nHost: localhost\r\n{many_headers}Connection: close\r\n\r\n");
    let (status, answer) = raw_http(addr, request.as_bytes(), false).await;
    assert_eq!(status, Some(431), "200 headers: {answer}");

    tcp_still_serving(addr).await;
    assert_eq!(queue_names(&db).await, ["q"]);
    assert_eq!(task_count(&db).await, 0);
}

/// A port nothing listens on.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[test]
fn cli_url_that_is_not_http_is_exit_2_naming_it() {
    for url in [
        "ftp://example.com",
        "localhost:8080",
        "",
        "file:///etc/passwd",
        "http://[::1",
        "http://",
        "http://host:99999",
    ] {
        let out = run_disbatch(&["--url", url, "queues"], None, &[]);
        assert_eq!(out.status.code(), Some(2), "--url {url:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("--url"), "--url {url:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(&format!("{url:?}")),
            "--url {url:?}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn cli_unreachable_server_is_exit_3() {
    let url = format!("http://127.0.0.1:{}", closed_port());
    for args in [
        vec!["queues"],
        vec!["create-queue", "q", "demo"],
        vec!["create-tasks", "q", "[{}]"],
    ] {
        let mut all = vec!["--url", url.as_str()];
        all.extend(args.iter());
        let out = run_disbatch(&all, None, &[]);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(&format!("cannot reach {url}")),
            "{args:?}: {}",
            stderr(&out)
        );
    }
}

#[tokio::test]
async fn cli_a_401_is_exit_1_with_the_message_and_nothing_is_written() {
    let db = common::test_db("hapi_cli_401").await;
    db.store.heartbeat("n1", Duration::from_secs(30)).await.unwrap();
    let web = Web::start(&db.uri, &db.name, json!({"api_token": "cli-token-0123456789"}));
    web.ok(&[
        "--token",
        "cli-token-0123456789",
        "create-queue",
        "q",
        "demo",
        "--threads",
        "1",
    ]);
    let writes: [&[&str]; 5] = [
        &["create-queue", "new", "demo"],
        &["update-queue", "q", "threads", "9"],
        &["delete-queue", "q"],
        &["create-task", "q", "n", "1"],
        &["set-maxthreads", "n1", "9"],
    ];
    for args in writes {
        for token in [None, Some("wrong")] {
            let mut all: Vec<&str> = token.map_or(vec![], |t| vec!["--token", t]);
            all.extend_from_slice(args);
            let out = web.run(&all);
            let case = format!("disbatch {all:?}");
            assert_eq!(out.status.code(), Some(1), "{case}: {}", stderr(&out));
            let err = stderr(&out);
            assert!(err.contains("missing or invalid bearer token"), "{case}: {err}");
            assert!(err.contains("HTTP 401"), "{case}: {err}");
            assert!(err.contains("--token"), "{case}: {err}");
        }
    }
    let queues = db.store.queues().await.unwrap();
    assert_eq!(queues.len(), 1);
    assert_eq!((queues[0].name.as_str(), queues[0].threads), ("q", Some(1)));
    assert_eq!(task_count(&db).await, 0);
    assert_eq!(db.store.nodes().await.unwrap()[0].maxthreads, None);
    assert!(web.ok(&["queues"]).contains("demo"), "reads need no token");
}

#[tokio::test]
async fn cli_a_batch_refused_midway_reports_what_was_created() {
    let db = common::test_db("hapi_cli_partial").await;
    let web = Web::start(&db.uri, &db.name, json!({}));
    web.ok(&["create-queue", "q", "demo"]);
    // The second batch holds a task the API refuses (a NUL in a key), the first is fine.
    let mut list: Vec<serde_json::Value> = (0..disbatch::cli::TASK_BATCH).map(|n| json!({ "n": n })).collect();
    list.push(json!({ "bad\u{0}key": 1 }));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tasks.json");
    std::fs::write(&file, serde_json::to_string(&list).unwrap()).unwrap();
    let arg = format!("@{}", file.display());
    let out = web.run(&["create-tasks", "q", &arg]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    let note = format!("created {} of {} tasks before this error", list.len() - 1, list.len());
    assert!(err.contains(&note), "{err}");
    assert!(err.contains("the other 1 were not created"), "{err}");
    let created: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the created ids on stdout");
    assert_eq!(created["count"], list.len() - 1);
    assert_eq!(created["ids"].as_array().unwrap().len(), list.len() - 1);
    assert_eq!(task_count(&db).await, (list.len() - 1) as u64);

    // An empty list still needs an existing queue.
    let out = web.run(&["create-tasks", "nope", "[]"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("HTTP 404"), "{}", stderr(&out));
    let out = web.run(&["create-tasks", "q", "[]"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stderr(&out), "created 0 tasks\n");
    assert!(out.stdout.is_empty(), "no ids");
}

#[tokio::test]
async fn cli_bad_json_arguments_are_exit_2_naming_the_argument() {
    let db = common::test_db("hapi_cli_json").await;
    let web = Web::start(&db.uri, &db.name, json!({}));
    web.ok(&["create-queue", "q", "demo"]);
    let cases: [(&[&str], Option<&str>, &str); 9] = [
        (
            &["create-tasks", "q", "[not json"],
            None,
            "invalid JSON in the tasks argument",
        ),
        (&["create-tasks", "q", ""], None, "invalid JSON in the tasks argument"),
        (&["create-tasks", "q", "-"], Some("nope"), "invalid JSON in stdin"),
        (&["create-tasks", "q", r#"{"n":1}"#], None, "must be a JSON array"),
        (
            &["create-tasks", "q", "[1]"],
            None,
            "task 0 of the list is not a JSON object",
        ),
        (
            &["create-tasks", "q", r#"[{}, "x"]"#],
            None,
            "task 1 of the list is not a JSON object",
        ),
        (
            &["create-tasks", "--collection", "c", "q", "[]"],
            None,
            "with --collection",
        ),
        (&["tasks", "{bad"], None, "the filter is not valid JSON"),
        (
            &["set-maxthreads", "n1", "many"],
            None,
            "maxthreads must be a number or null, got \"many\"",
        ),
    ];
    for (args, stdin, mentions) in cases {
        let out = web.run_with(args, stdin, &[]);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(mentions), "{args:?}: {}", stderr(&out));
    }
    let out = web.run(&["tasks", "[1]"]);
    assert_eq!(out.status.code(), Some(1), "a filter the API refuses: {}", stderr(&out));
    assert!(
        stderr(&out).contains("\"filter\" must be a JSON object, got an array (HTTP 400)"),
        "{}",
        stderr(&out)
    );
    assert_eq!(task_count(&db).await, 0);
}

#[tokio::test]
async fn cli_an_at_file_that_cannot_be_read_is_exit_2_naming_it() {
    let db = common::test_db("hapi_cli_file").await;
    let web = Web::start(&db.uri, &db.name, json!({}));
    web.ok(&["create-queue", "q", "demo"]);
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-file.json");
    let missing = missing.to_str().unwrap();
    let directory = dir.path().to_str().unwrap();
    for (arg, names) in [
        (format!("@{missing}"), missing),
        (format!("@{directory}"), directory),
        ("@".to_owned(), "cannot read"),
    ] {
        let out = web.run(&["create-tasks", "q", &arg]);
        assert_eq!(out.status.code(), Some(2), "{arg}: {}", stderr(&out));
        assert!(stderr(&out).contains(names), "{arg}: {}", stderr(&out));
    }
    let out = web.run(&["create-tasks", "--collection", "c", "q", &format!("@{missing}")]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains(missing), "{}", stderr(&out));
    assert_eq!(task_count(&db).await, 0);
}
