//! Batches through the REST API on both stores, run by a real DEN process: `POST /tasks`
//! with `batch` and `batch_size` over several requests, `GET /batches/{id}` counting by
//! status until the batch is complete, `GET /tasks?batch=`, and the refusals (a size that
//! differs, more tasks than the size, bad ids, a batch closed by retention).

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::Router;
use disbatch::api::{router, ApiState};
use disbatch::store::sqlite::SqliteStore;
use disbatch::store::Store;
use serde_json::{json, Value};

use common::http::{assert_bad, get, post};
use common::{wait_for, DenProcess};

/// Submits `n` tasks in batch `batch` (with `size` when given); the reply.
async fn submit(app: &Router, n: usize, batch: &str, size: Option<i64>) -> common::http::Reply {
    let params: Vec<Value> = (0..n).map(|i| json!({"message": format!("task {i}")})).collect();
    let mut body = json!({"queue": "q", "params": params, "batch": batch});
    if let Some(s) = size {
        body["batch_size"] = json!(s);
    }
    post(app, "/tasks", body).await
}

async fn report(app: &Router, batch: &str) -> Value {
    let r = get(app, &format!("/batches/{batch}")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    r.json()
}

/// The scenario, with `start_den` starting a DEN on the same data once tasks are in.
async fn batches(store: Arc<dyn Store>, start_den: impl Fn() -> DenProcess) {
    let app = router(ApiState::new(store.clone(), vec!["demo".into()]));
    let r = post(&app, "/queues", json!({"name": "q", "plugin": "demo", "threads": 0})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    // A batch of five over two requests; a third that would pass the size is refused.
    let r = submit(&app, 3, "nightly", Some(5)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json()["batch"], "nightly");
    let v = report(&app, "nightly").await;
    assert_eq!(
        (v["total"].clone(), v["size"].clone(), v["complete"].clone()),
        (json!(3), json!(5), json!(false))
    );
    assert_eq!(v["counts"], json!({"queued": 3}));
    let r = submit(&app, 3, "nightly", None).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    assert!(r.error().contains("3 of its 5"), "{}", r.text);
    let r = submit(&app, 1, "nightly", Some(6)).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    assert!(r.error().contains("size 5, not 6"), "{}", r.text);
    let r = submit(&app, 2, "nightly", Some(5)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let listed = get(&app, "/tasks?batch=nightly&limit=10").await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.text);
    let listed = listed.json();
    assert_eq!(listed.as_array().unwrap().len(), 5);
    assert!(
        listed.as_array().unwrap().iter().all(|t| t["batch"] == "nightly"),
        "{listed}"
    );

    // A batch without a size: complete once every task it has has ended.
    let r = submit(&app, 2, "open", None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    // Bad input names the field; an unknown batch is 404.
    assert_bad(
        &post(&app, "/tasks", json!({"queue": "q", "params": [{}], "batch": 7})).await,
        "\"batch\"",
    );
    assert_bad(
        &post(&app, "/tasks", json!({"queue": "q", "params": [{}], "batch": ""})).await,
        "\"batch\"",
    );
    assert_bad(
        &post(&app, "/tasks", json!({"queue": "q", "params": [{}], "batch_size": 2})).await,
        "needs field \"batch\"",
    );
    assert_bad(
        &post(
            &app,
            "/tasks",
            json!({"queue": "q", "params": [{}], "batch": "x", "batch_size": 0}),
        )
        .await,
        "\"batch_size\"",
    );
    assert_eq!(get(&app, "/batches/never").await.status, StatusCode::NOT_FOUND);

    // A real DEN runs them; the reports follow until both batches are complete.
    let r = post(&app, "/queues/q", json!({"threads": 2})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let den = start_den();
    for batch in ["nightly", "open"] {
        wait_for(Duration::from_secs(60), "the batch to complete", || async {
            report(&app, batch).await["complete"] == json!(true)
        })
        .await;
    }
    let v = report(&app, "nightly").await;
    assert_eq!(v["counts"], json!({"succeeded": 5}), "{v}");
    assert_eq!((v["total"].clone(), v["ended"].clone()), (json!(5), json!(5)));
    assert_eq!(v["by_code"], json!({"1": 5}));
    assert_eq!(report(&app, "open").await["counts"], json!({"succeeded": 2}));
    assert_eq!(v["closed"], Value::Null, "{v}");

    // Closed by retention (which does so before deleting a batch's first task): still
    // complete, it takes no more tasks, and a task submitted after it fails to wait, as
    // after a deleted task.
    store.close_batch("nightly").await.unwrap();
    let v = report(&app, "nightly").await;
    assert!(v["closed"]["$date"].is_string(), "{v}");
    assert_eq!(v["complete"], json!(true), "{v}");
    let r = submit(&app, 1, "nightly", None).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    assert!(r.error().contains("closed by retention"), "{}", r.text);
    let r = post(
        &app,
        "/tasks",
        json!({"queue": "q", "params": [{"message": "after"}], "after": [{"batch": "nightly"}]}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let id = r.json()["ids"][0].as_str().unwrap().to_owned();
    let t = get(&app, &format!("/tasks/{id}?shape=native")).await.json();
    assert_eq!(t["status"], -5, "{t}");
    let reason = t["stop"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("closed by retention"), "{t}");
    drop(den);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batches_on_mongodb() {
    let t = common::test_db("api_batches").await;
    let store: Arc<dyn Store> = Arc::new(t.store.clone());
    batches(store, || DenProcess::start(&t.uri, &t.name, "batch-den", json!({}))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batches_on_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&file).await.unwrap());
    let file: &Path = &file;
    batches(store, || DenProcess::start_embedded(file, "batch-den", json!({}))).await;
}
