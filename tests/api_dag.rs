//! Dependencies through the REST API on both stores, run by a real DEN process: a DAG
//! submitted in one request (references by entry, by key and by id), the refusals (a
//! cycle, a task, key or batch that does not exist), a failure cancelling down the chain
//! (or running a task anyway), a task submitted after its parent ended, a blocked task
//! cancelled by hand, and a batch's fan-in.

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

async fn create(app: &Router, body: Value) -> Vec<String> {
    let r = post(app, "/tasks", body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let ids = r.json()["ids"].as_array().unwrap().clone();
    ids.iter().map(|v| v.as_str().unwrap().to_string()).collect()
}

async fn task(app: &Router, id: &str) -> Value {
    let r = get(app, &format!("/tasks/{id}")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    r.json()
}

async fn status(app: &Router, id: &str) -> i64 {
    task(app, id).await["status"].as_i64().unwrap()
}

/// A task's `mtime` in milliseconds (the API gives it as RFC 3339 text, whose fraction has
/// no fixed width, so it is parsed rather than compared as text).
fn mtime(t: &Value) -> i64 {
    let text = t["mtime"]["$date"].as_str().unwrap_or_else(|| panic!("mtime of {t}"));
    bson::DateTime::parse_rfc3339_str(text)
        .unwrap_or_else(|e| panic!("mtime {text:?}: {e}"))
        .timestamp_millis()
}

async fn dag(store: Arc<dyn Store>, start_den: impl Fn() -> DenProcess) {
    let app = router(ApiState::new(store.clone(), vec!["demo".into()]));
    let r = post(&app, "/queues", json!({"name": "q", "plugin": "demo", "threads": 0})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    // A diamond a → (b, c) → d, and e after b by key; the children come first in the list.
    let ids = create(
        &app,
        json!({"queue": "q", "tasks": [
            {"params": {"message": "d"}, "after": [{"ref": 2}, "c-key"]},
            {"params": {"message": "e"}, "after": "b-key"},
            {"params": {"message": "b"}, "key": "b-key", "after": [{"ref": 3}]},
            {"params": {"message": "a", "sleep_ms": 300}},
            {"params": {"message": "c"}, "key": "c-key", "after": [{"ref": 3}]},
        ]}),
    )
    .await;
    let [d, e, b, a, c] = [0, 1, 2, 3, 4].map(|i| ids[i].clone());
    let t = task(&app, &d).await;
    assert_eq!(t["status"], -4, "{t}");
    assert_eq!(t["after"], json!([b.clone(), c.clone()]), "{t}");
    assert_eq!(t["pending"], t["after"]);
    assert_eq!(task(&app, &a).await["dependents"], true);
    assert_eq!(status(&app, &a).await, -2);
    let children = get(&app, &format!("/tasks?after={a}&limit=10")).await.json();
    let mut listed: Vec<&str> = children
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["_id"]["$oid"].as_str().unwrap())
        .collect();
    listed.sort();
    let mut want = vec![b.as_str(), c.as_str()];
    want.sort();
    assert_eq!(listed, want, "{children}");

    // A failure: f fails, g and h wait in a chain, i runs anyway.
    let ids = create(
        &app,
        json!({"queue": "q", "tasks": [
            {"params": {"message": "f", "status": 2}},
            {"params": {"message": "g"}, "after": [{"ref": 0}]},
            {"params": {"message": "h"}, "after": [{"ref": 1}]},
            {"params": {"message": "i"}, "after": [{"ref": 0}], "after_failure": "run"},
        ]}),
    )
    .await;
    let [f, g, h, i] = [0, 1, 2, 3].map(|k| ids[k].clone());

    // A blocked task cancelled by hand cancels what waits for it.
    let ids = create(
        &app,
        json!({"queue": "q", "tasks": [
            {"params": {"message": "slow", "sleep_ms": 1500}},
            {"params": {"message": "m"}, "after": [{"ref": 0}]},
            {"params": {"message": "n"}, "after": [{"ref": 1}]},
        ]}),
    )
    .await;
    let [_slow, m, n] = [0, 1, 2].map(|k| ids[k].clone());

    // A batch and its fan-in (a task of another request, after the batch).
    let r = post(
        &app,
        "/tasks",
        json!({"queue": "q", "params": [{"message": "x"}, {"message": "y"}], "batch": "fan", "batch_size": 2}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let z = create(
        &app,
        json!({"queue": "q", "params": [{"message": "z"}], "after": [{"batch": "fan"}]}),
    )
    .await;
    let z = z[0].clone();

    // Refusals, each naming the problem; nothing of a refused request is created.
    let before = get(&app, "/tasks?count=1").await.json();
    assert_bad(
        &post(
            &app,
            "/tasks",
            json!({"queue": "q", "tasks": [{"after": [{"ref": 1}]}, {"after": [{"ref": 2}]}, {"after": [{"ref": 0}]}]}),
        )
        .await,
        "cycle of dependencies: tasks[0] → tasks[1] → tasks[2] → tasks[0]",
    );
    assert_bad(
        &post(
            &app,
            "/tasks",
            json!({"queue": "q", "tasks": [{"after": [{"ref": 0}]}]}),
        )
        .await,
        "tasks[0] → tasks[0]",
    );
    let ghost = bson::oid::ObjectId::new().to_hex();
    assert_bad(
        &post(
            &app,
            "/tasks",
            json!({"queue": "q", "params": [{}], "after": [ghost.clone()]}),
        )
        .await,
        &format!("field \"after[0]\" names task {ghost}, which does not exist"),
    );
    assert_bad(
        &post(&app, "/tasks", json!({"queue": "q", "tasks": [{"after": ["nobody"]}]})).await,
        "field \"tasks[0].after[0]\" names key \"nobody\"",
    );
    assert_bad(
        &post(
            &app,
            "/tasks",
            json!({"queue": "q", "tasks": [{"after": [{"ref": 5}]}]}),
        )
        .await,
        "names entry 5",
    );
    assert_bad(
        &post(
            &app,
            "/tasks",
            json!({"queue": "q", "params": [{}], "after": [{"batch": "never"}]}),
        )
        .await,
        "batch \"never\", which does not exist",
    );
    assert_bad(
        &post(
            &app,
            "/tasks",
            json!({"queue": "q", "params": [{}], "batch": "fan2", "after": [{"batch": "fan2"}]}),
        )
        .await,
        "batch \"fan2\"",
    );
    assert_bad(
        &post(
            &app,
            "/tasks",
            json!({"queue": "q", "params": [{}], "after_failure": "maybe", "after": [a.clone()]}),
        )
        .await,
        "\"after_failure\"",
    );
    assert_bad(
        &post(
            &app,
            "/tasks",
            json!({"queue": "q", "tasks": [{"key": "k1"}, {"key": "k1"}, {"after": [{"ref": 1}]}]}),
        )
        .await,
        "key \"k1\" is also the key of tasks[0]",
    );
    assert_eq!(get(&app, "/tasks?count=1").await.json(), before, "nothing was created");
    // Batches never wait for each other in a circle: a task that waits cannot join a batch
    // that tasks wait for.
    let r = post(
        &app,
        "/tasks",
        json!({"queue": "q", "params": [{}], "batch": "ring", "batch_size": 3}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let waiter = create(
        &app,
        json!({"queue": "q", "params": [{}], "batch": "ring2", "after": [{"batch": "ring"}]}),
    )
    .await;
    assert_bad(
        &post(
            &app,
            "/tasks",
            json!({"queue": "q", "params": [{}], "batch": "ring", "after": [{"batch": "ring2"}]}),
        )
        .await,
        "tasks wait for batch \"ring\"",
    );
    let r = post(&app, &format!("/tasks/{}/cancel", waiter[0]), json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    // The DEN runs it all.
    let r = post(&app, "/queues/q", json!({"threads": 3})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let den = start_den();
    let r = post(&app, &format!("/tasks/{m}/cancel"), json!({"reason": "not needed"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let all = [&a, &b, &c, &d, &e, &f, &g, &h, &i, &m, &n, &z];
    wait_for(Duration::from_secs(60), "every task to end", || async {
        for id in all {
            if [-7, -4, -2, -1, 0].contains(&status(&app, id).await) {
                return false;
            }
        }
        true
    })
    .await;
    for id in [&a, &b, &c, &d, &e, &i, &z] {
        assert_eq!(status(&app, id).await, 1, "{}", task(&app, id).await);
    }
    assert_eq!(status(&app, &f).await, 2);
    for (id, parent) in [(&g, &f), (&h, &g), (&n, &m)] {
        let t = task(&app, id).await;
        assert_eq!(t["status"], -5, "{t}");
        let reason = t["stop"]["reason"].as_str().unwrap();
        assert!(reason.contains(parent.as_str()), "{reason}");
    }
    // Each child ended after its parents did.
    for (child, parents) in [(&b, vec![&a]), (&c, vec![&a]), (&d, vec![&b, &c]), (&e, vec![&b])] {
        let end = mtime(&task(&app, child).await);
        for p in parents {
            assert!(
                mtime(&task(&app, p).await) <= end,
                "{child} ended before its parent {p}"
            );
        }
    }

    // Submitted after its parent ended: released (or cancelled) at once.
    let late = create(
        &app,
        json!({"queue": "q", "params": [{"message": "late"}], "after": [a.clone()]}),
    )
    .await;
    let doomed = create(&app, json!({"queue": "q", "params": [{}], "after": [f.clone()]})).await;
    assert_ne!(
        status(&app, &late[0]).await,
        -4,
        "a parent that succeeded does not block"
    );
    assert_eq!(
        status(&app, &doomed[0]).await,
        -5,
        "a parent that failed cancels at once"
    );
    wait_for(Duration::from_secs(30), "the late task to run", || async {
        status(&app, &late[0]).await == 1
    })
    .await;
    chains(&app).await;
    drop(den);
}

/// A queue's `next_queue`: each succeeded task's last stdout line becomes a task of the
/// next queue, waiting for it; a loop or a queue that does not exist is refused.
async fn chains(app: &Router) {
    let r = post(
        app,
        "/queues",
        json!({"name": "second", "plugin": "demo", "threads": 2}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = post(
        app,
        "/queues",
        json!({"name": "first", "plugin": "demo", "threads": 2, "next_queue": "second"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json()["next_queue"], "second");
    assert_bad(
        &post(app, "/queues/second", json!({"next_queue": "first"})).await,
        "loop: second → first → second",
    );
    assert_bad(
        &post(app, "/queues/second", json!({"next_queue": "second"})).await,
        "loop: second → second",
    );
    assert_bad(
        &post(
            app,
            "/queues",
            json!({"name": "x", "plugin": "demo", "next_queue": "nowhere"}),
        )
        .await,
        "\"nowhere\", which does not exist",
    );
    let ok = create(
        app,
        json!({"queue": "first", "params": [{"message": "{\"message\": \"hi from first\"}"}]}),
    )
    .await;
    let bad = create(app, json!({"queue": "first", "params": [{"status": 2}]})).await;
    let follow = |id: String| async move {
        let r = get(app, &format!("/tasks?after={id}&limit=5")).await.json();
        r.as_array().unwrap().clone()
    };
    wait_for(Duration::from_secs(30), "the follow-up to run", || async {
        follow(ok[0].clone()).await.first().is_some_and(|t| t["status"] == 1)
    })
    .await;
    let next = follow(ok[0].clone()).await;
    assert_eq!(next.len(), 1, "one follow-up: {next:?}");
    assert_eq!(next[0]["params"], json!({"message": "hi from first"}));
    assert_eq!(next[0]["stdout"], "hi from first\n");
    assert_eq!(next[0]["key"], format!("chain:{}", ok[0]));
    assert_eq!(next[0]["after"], json!([ok[0].clone()]));
    wait_for(Duration::from_secs(30), "the failing task to end", || async {
        status(app, &bad[0]).await == 2
    })
    .await;
    assert!(
        follow(bad[0].clone()).await.is_empty(),
        "a failed task has no follow-up"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dag_on_mongodb() {
    let t = common::test_db("api_dag").await;
    let store: Arc<dyn Store> = Arc::new(t.store.clone());
    dag(store, || DenProcess::start(&t.uri, &t.name, "dag-den", json!({}))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dag_on_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&file).await.unwrap());
    let file: &Path = &file;
    dag(store, || DenProcess::start_embedded(file, "dag-den", json!({}))).await;
}
