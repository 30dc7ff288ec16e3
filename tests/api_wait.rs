//! Waiting for tasks through the REST API on both stores: `GET /tasks/wait` answers as soon
//! as the tasks end (the latency is printed), or at its timeout with their states, and
//! `GET /tasks/{id}/events` streams each status and progress change until the task ends.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use bson::oid::ObjectId;
use disbatch::api::{router, ApiState};
use disbatch::model::TaskProgress;
use disbatch::store::sqlite::SqliteStore;
use disbatch::store::{OutputValue, Store};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use common::http::{assert_bad, get, post};

async fn with_mongo() -> (Arc<dyn Store>, Box<dyn std::any::Any>) {
    let t = common::test_db("api_wait").await;
    (Arc::new(t.store.clone()), Box::new(t))
}

async fn with_sqlite() -> (Arc<dyn Store>, Box<dyn std::any::Any>) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("d.db")).await.unwrap();
    (Arc::new(store), Box::new(dir))
}

/// An API over `store` with a queue `q` holding `n` tasks; their ids.
async fn app_with_tasks(store: &Arc<dyn Store>, n: usize) -> (Router, Vec<String>) {
    let app = router(ApiState::new(store.clone(), vec!["demo".into()]));
    let r = post(&app, "/queues", json!({"name": "q", "plugin": "demo", "threads": 0})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let params: Vec<Value> = (0..n).map(|i| json!({"i": i})).collect();
    let r = post(&app, "/tasks", json!({"queue": "q", "params": params})).await;
    let ids = r.json()["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    (app, ids)
}

/// Claims, starts and finishes the next task of `q` with `status`.
async fn run_one(store: &Arc<dyn Store>, status: i32) -> ObjectId {
    let q = store.queues().await.unwrap().remove(0);
    let t = store.claim(&q, "den-1").await.unwrap().expect("a queued task").id;
    assert!(disbatch::lifecycle::run::start(&**store, t, "den-1").await.unwrap());
    let empty = OutputValue::Inline(String::new());
    assert!(
        disbatch::lifecycle::run::finish(&**store, t, "den-1", status, empty.clone(), empty)
            .await
            .unwrap()
    );
    t
}

async fn wait_answers_when_the_tasks_end(store: Arc<dyn Store>, name: &str) {
    let (app, ids) = app_with_tasks(&store, 2).await;
    let url = format!("/tasks/wait?ids={},{}&timeout=60s", ids[0], ids[1]);
    // Not done within the timeout: the states as they are.
    let r = get(&app, &format!("/tasks/wait?ids={}&timeout=0.2", ids[0])).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        (r.json()["done"].as_bool(), r.json()["tasks"][0]["status"].as_i64()),
        (Some(false), Some(-2))
    );
    let waiter = tokio::spawn({
        let app = app.clone();
        async move {
            let r = get(&app, &url).await;
            (r, Instant::now())
        }
    });
    run_one(&store, 1).await;
    let last = run_one(&store, 2).await;
    let finished = Instant::now();
    let (r, answered) = waiter.await.unwrap();
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let v = r.json();
    assert_eq!(v["done"], true, "{v}");
    let statuses: Vec<i64> = v["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["status"].as_i64().unwrap())
        .collect();
    assert_eq!(statuses.len(), 2);
    assert!(statuses.contains(&1) && statuses.contains(&2), "{v}");
    assert!(v["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["id"] == last.to_hex().as_str()));
    println!(
        "{name}: wait latency (last task finished → waiter answered): {} ms",
        answered.saturating_duration_since(finished).as_millis()
    );
    assert!(
        answered.saturating_duration_since(finished) < Duration::from_secs(30),
        "answered by the finish, not the 60 s timeout"
    );
    // Already ended: answered at once. Unknown ids, bad ids and timeouts are refused.
    let r = get(&app, &format!("/tasks/wait?ids={}", ids[0])).await;
    assert_eq!(r.json()["done"], true);
    let r = get(&app, &format!("/tasks/wait?ids={}", ObjectId::new())).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    assert_bad(&get(&app, "/tasks/wait?ids=nope").await, "invalid task id \"nope\"");
    assert_bad(&get(&app, "/tasks/wait").await, "ids");
    assert_bad(
        &get(&app, &format!("/tasks/wait?ids={}&timeout=1h", ids[0])).await,
        "timeout",
    );
    assert_bad(
        &get(&app, &format!("/tasks/wait?ids={}&timeout=soon", ids[0])).await,
        "timeout",
    );
}

/// The next server-sent event's data as JSON, or `None` when the stream ended.
async fn next_event(body: &mut Body, buffer: &mut String) -> Option<Value> {
    loop {
        if let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let data: Vec<&str> = block.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
            if data.is_empty() {
                continue; // a keep-alive comment
            }
            assert!(block.contains("event: task"), "{block}");
            return Some(serde_json::from_str(&data.join("\n")).unwrap());
        }
        let frame = tokio::time::timeout(Duration::from_secs(60), body.frame())
            .await
            .expect("an event within 60 s")?
            .unwrap();
        if let Ok(data) = frame.into_data() {
            buffer.push_str(std::str::from_utf8(&data).unwrap());
        }
    }
}

async fn events_follow_a_task_until_it_ends(store: Arc<dyn Store>, _name: &str) {
    let (app, ids) = app_with_tasks(&store, 1).await;
    let id = ObjectId::parse_str(&ids[0]).unwrap();
    let resp = app
        .clone()
        .oneshot(Request::get(format!("/tasks/{id}/events")).body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let mut body = resp.into_body();
    let mut buf = String::new();
    assert_eq!(next_event(&mut body, &mut buf).await.unwrap()["status"], -2);
    let q = store.queues().await.unwrap().remove(0);
    assert_eq!(store.claim(&q, "den-1").await.unwrap().unwrap().id, id);
    assert_eq!(next_event(&mut body, &mut buf).await.unwrap()["status"], -1);
    assert!(disbatch::lifecycle::run::start(&*store, id, "den-1").await.unwrap());
    assert_eq!(next_event(&mut body, &mut buf).await.unwrap()["status"], 0);
    let half = TaskProgress {
        percent: Some(50.0),
        info: "half".into(),
        at: bson::DateTime::now(),
    };
    assert!(disbatch::lifecycle::run::report_progress(&*store, id, "den-1", &half)
        .await
        .unwrap());
    let e = next_event(&mut body, &mut buf).await.unwrap();
    assert_eq!(
        (e["status"].as_i64(), e["progress"]["percent"].as_f64()),
        (Some(0), Some(50.0))
    );
    let empty = OutputValue::Inline(String::new());
    assert!(
        disbatch::lifecycle::run::finish(&*store, id, "den-1", 1, empty.clone(), empty)
            .await
            .unwrap()
    );
    assert_eq!(next_event(&mut body, &mut buf).await.unwrap()["status"], 1);
    assert!(
        next_event(&mut body, &mut buf).await.is_none(),
        "the stream ends with the task"
    );
    // An unknown task is 404, not an empty stream.
    assert_eq!(
        get(&app, &format!("/tasks/{}/events", ObjectId::new())).await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wait_on_mongodb() {
    let (store, _keep) = with_mongo().await;
    wait_answers_when_the_tasks_end(store, "MongoDB").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wait_on_the_embedded_store() {
    let (store, _keep) = with_sqlite().await;
    wait_answers_when_the_tasks_end(store, "SQLite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_on_mongodb() {
    let (store, _keep) = with_mongo().await;
    events_follow_a_task_until_it_ends(store, "MongoDB").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_on_the_embedded_store() {
    let (store, _keep) = with_sqlite().await;
    events_follow_a_task_until_it_ends(store, "SQLite").await;
}
