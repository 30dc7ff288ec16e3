//! Following and paging task lists through the REST API on both stores: `GET /tasks?new=<id>`
//! answers the tasks created after `<id>`, oldest first, and when there are none waits for
//! one; a full page carries the cursor of the next (`disbatch-next`), and `next=<cursor>`
//! pages through a list that grows meanwhile without repeating or skipping a task.

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::Router;
use bson::oid::ObjectId;
use disbatch::api::{router, ApiState};
use disbatch::store::sqlite::SqliteStore;
use disbatch::store::Store;
use serde_json::{json, Value};

use common::http::{assert_bad, get, post, Reply};

async fn with_mongo() -> (Arc<dyn Store>, Box<dyn std::any::Any>) {
    let t = common::test_db("api_follow").await;
    (Arc::new(t.store.clone()), Box::new(t))
}

async fn with_sqlite() -> (Arc<dyn Store>, Box<dyn std::any::Any>) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("d.db")).await.unwrap();
    (Arc::new(store), Box::new(dir))
}

/// Submits `n` tasks to `q`; their ids, in submission order.
async fn submit(app: &Router, n: usize) -> Vec<String> {
    let params: Vec<Value> = (0..n).map(|i| json!({"i": i})).collect();
    let r = post(app, "/tasks", json!({"queue": "q", "params": params})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    r.json()["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

fn ids(r: &Reply) -> Vec<String> {
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    r.json()
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {}", r.text))
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect()
}

fn next(r: &Reply) -> Option<String> {
    r.headers.get("disbatch-next").map(|v| v.to_str().unwrap().to_owned())
}

async fn follow_and_page(store: Arc<dyn Store>, name: &str) {
    let app = router(ApiState::new(store.clone(), vec!["demo".into()]));
    let r = post(&app, "/queues", json!({"name": "q", "plugin": "demo", "threads": 0})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let first = submit(&app, 5).await;

    // Newer than the first: the other four, oldest first; newer than the last: a wait
    // that ends empty at its timeout.
    let r = get(&app, &format!("/tasks?new={}", first[0])).await;
    assert_eq!(ids(&r), first[1..].to_vec());
    let r = get(&app, &format!("/tasks?new={}&timeout=0.2", first[4])).await;
    assert_eq!(ids(&r), Vec::<String>::new());
    let r = get(&app, &format!("/tasks?new={}&limit=2", first[0])).await;
    assert_eq!(ids(&r), first[1..3].to_vec());

    // A waiting follower answers with the tasks submitted while it waits.
    let waiter = tokio::spawn({
        let (app, after) = (app.clone(), first[4].clone());
        async move {
            let r = get(&app, &format!("/tasks?new={after}&timeout=60s&queue=q")).await;
            (r, Instant::now())
        }
    });
    // Whether the waiter looked before the submission or after it, it answers with (some
    // of) the new tasks and nothing else.
    let later = submit(&app, 2).await;
    let submitted = Instant::now();
    let (r, answered) = waiter.await.unwrap();
    let got = ids(&r);
    assert!(
        !got.is_empty() && got.iter().all(|id| later.contains(id)),
        "{got:?} vs {later:?}"
    );
    let latency = answered.saturating_duration_since(submitted);
    println!(
        "{name}: new-task latency (submitted → follower answered): {} ms",
        latency.as_millis()
    );
    assert!(
        latency < Duration::from_secs(30),
        "answered by the submission, not the 60 s timeout"
    );

    // Paging by cursor, newest first, while tasks keep arriving: every task of the list
    // as it was at the first page shows up exactly once.
    let all: Vec<String> = first.iter().chain(&later).cloned().collect();
    let mut seen = Vec::new();
    let mut r = get(&app, "/tasks?queue=q&limit=3").await;
    loop {
        seen.extend(ids(&r));
        submit(&app, 1).await;
        match next(&r) {
            Some(cursor) => r = get(&app, &format!("/tasks?queue=q&limit=3&next={cursor}")).await,
            None => break,
        }
    }
    let unique: HashSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "a task was listed twice: {seen:?}");
    let mut expected = all.clone();
    expected.reverse();
    assert_eq!(seen, expected, "pages, newest first, of the list as it was");
    // A page that is not full has no next cursor; a full last page's cursor leads to [].
    let r = get(&app, "/tasks?queue=q&limit=1000").await;
    assert_eq!(next(&r), None);
    let r = get(&app, &format!("/tasks?queue=q&next={}", all[0])).await;
    assert_eq!(ids(&r), Vec::<String>::new());

    // Bad cursors and combinations are refused, naming the parameter.
    assert_bad(&get(&app, "/tasks?new=nope").await, "\"new\" must be a task id");
    assert_bad(&get(&app, "/tasks?queue=q&next=12").await, "\"next\" must be a task id");
    let id = ObjectId::new();
    assert_bad(
        &get(&app, &format!("/tasks?new={id}&next={id}")).await,
        "exclude each other",
    );
    assert_bad(
        &get(&app, &format!("/tasks?queue=q&next={id}&skip=3")).await,
        "exclude each other",
    );
    assert_bad(
        &get(&app, "/tasks?queue=q&timeout=5").await,
        "\"timeout\" is for \"new\"",
    );
    assert_bad(&get(&app, &format!("/tasks?new={id}&timeout=1h")).await, "timeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follow_and_page_on_mongodb() {
    let (store, _keep) = with_mongo().await;
    follow_and_page(store, "MongoDB").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follow_and_page_on_the_embedded_store() {
    let (store, _keep) = with_sqlite().await;
    follow_and_page(store, "SQLite").await;
}
