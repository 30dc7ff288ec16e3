//! Scheduled tasks, cancel and kill through the REST API, against the real test database
//! server: what a caller sees, including the Disbatch 4 view of tasks without the new
//! fields.

mod common;

use axum::http::{Method, StatusCode};
use bson::oid::ObjectId;
use disbatch::store::Store;
use serde_json::json;

use common::http::{assert_bad, get, post, send, setup};

async fn queue(app: &axum::Router, name: &str) {
    let r = post(app, "/queues", json!({"name": name, "plugin": "demo", "threads": 0})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}

#[tokio::test]
async fn scheduled_tasks_from_both_forms_and_their_times() {
    let (_db, app) = setup("api_sched", |_| {}).await;
    queue(&app, "q").await;
    let r = post(
        &app,
        "/tasks",
        json!({"queue": "q", "tasks": [
            {"params": {"n": 1}, "run_at": "1h"},
            {"params": {"n": 2}, "run_at": "2001-02-03T04:05:06Z"},
            {"params": {"n": 3}},
        ]}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let ids: Vec<String> = r.json()["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let one = |i: usize| {
        let app = app.clone();
        let id = ids[i].clone();
        async move { get(&app, &format!("/tasks/{id}?epoch=1")).await.json() }
    };
    let t = one(0).await;
    assert_eq!(
        (t["status"].as_i64(), t["status_name"].as_str()),
        (Some(-7), Some("scheduled"))
    );
    let in_an_hour = t["run_at"].as_f64().unwrap() - t["ctime"].as_f64().unwrap();
    assert!((3590.0..3610.0).contains(&in_an_hour), "{t}");
    let t = one(1).await;
    assert_eq!(t["status"], -2, "a past time queues at once: {t}");
    assert_eq!(t["run_at"].as_f64(), Some(981173106.0));
    let t = one(2).await;
    assert_eq!(t["status"], -2);
    assert!(
        t.get("run_at").is_none() && t.get("stop").is_none(),
        "no new fields on a plain task: {t}"
    );

    // The Disbatch 4 form with a top-level run_at schedules every task.
    let r = post(
        &app,
        "/tasks",
        json!({"queue": "q", "params": [{}, {}], "run_at": 4102444800u64}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let id = r.json()["ids"][1].as_str().unwrap().to_string();
    let t = get(&app, &format!("/tasks/{id}")).await.json();
    assert_eq!(t["status"], -7);
    assert_eq!(t["run_at"]["$date"], "2100-01-01T00:00:00Z");
    // Priorities: per task, or one for the whole request; 0 when not given.
    let r = post(
        &app,
        "/tasks",
        json!({"queue": "q", "priority": -3, "tasks": [{"priority": 9}, {}]}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let ids = r.json()["ids"].clone();
    let p = |i: usize| {
        let app = app.clone();
        let id = ids[i].as_str().unwrap().to_string();
        async move { get(&app, &format!("/tasks/{id}")).await.json()["priority"].clone() }
    };
    assert_eq!((p(0).await, p(1).await), (json!(9), json!(-3)));
    let r = get(&app, "/tasks?filter=%7B%22status%22%3A-7%7D").await;
    assert_eq!(r.json().as_array().map(Vec::len), Some(3), "{}", r.text);
}

#[tokio::test]
async fn bad_schedules_name_the_field() {
    let (_db, app) = setup("api_sched_bad", |_| {}).await;
    queue(&app, "q").await;
    assert_bad(
        &post(
            &app,
            "/tasks",
            json!({"queue": "q", "params": [{}], "run_at": "someday"}),
        )
        .await,
        "run_at",
    );
    assert_bad(
        &post(&app, "/tasks", json!({"queue": "q", "params": [{}], "run_at": true})).await,
        "run_at",
    );
    assert_bad(
        &post(
            &app,
            "/tasks",
            json!({"queue": "q", "tasks": [{"params": {}, "run_at": []}]}),
        )
        .await,
        "tasks[0].run_at",
    );
    assert_bad(
        &post(&app, "/tasks", json!({"queue": "q", "tasks": [{"parms": {}}]})).await,
        "parms",
    );
    assert_bad(
        &post(&app, "/tasks", json!({"queue": "q", "tasks": [1]})).await,
        "tasks[0]",
    );
    assert_bad(
        &post(&app, "/tasks", json!({"queue": "q", "tasks": [], "params": []})).await,
        "tasks",
    );
    assert_bad(&post(&app, "/tasks", json!({"queue": "q", "tasks": {}})).await, "tasks");
    assert_bad(
        &post(&app, "/tasks", json!({"queue": "q", "params": [{}], "priority": 1.5})).await,
        "priority",
    );
    assert_bad(
        &post(&app, "/tasks", json!({"queue": "q", "tasks": [{"priority": "high"}]})).await,
        "tasks[0].priority",
    );
}

#[tokio::test]
async fn cancel_and_kill_answer_by_the_tasks_state() {
    let (db, app) = setup("api_cancel", |_| {}).await;
    queue(&app, "q").await;
    let r = post(&app, "/tasks", json!({"queue": "q", "params": [{}, {}, {}, {}]})).await;
    let ids: Vec<String> = r.json()["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();

    let r = post(
        &app,
        &format!("/tasks/{}/cancel", ids[0]),
        json!({"reason": "typo", "by": "ann"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let t = r.json();
    assert_eq!(
        (t["status"].as_i64(), t["status_name"].as_str()),
        (Some(-5), Some("cancelled"))
    );
    assert_eq!(
        (t["stop"]["action"].as_str(), t["stop"]["by"].as_str()),
        (Some("cancel"), Some("ann"))
    );
    assert_eq!(t["stop"]["reason"], "typo");
    let r = post(&app, &format!("/tasks/{}/cancel", ids[0]), json!({})).await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert!(r.error().contains("is cancelled (-5)"), "{}", r.error());

    // A running task: cancel says to kill; kill records the request for its DEN.
    let queue = db.store.queues().await.unwrap().remove(0);
    let running = db.store.claim(&queue, "den-1").await.unwrap().unwrap().id;
    assert!(db.store.start(running, "den-1").await.unwrap());
    let r = post(&app, &format!("/tasks/{running}/cancel"), json!({})).await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert!(r.error().contains("kill stops a running task"), "{}", r.error());
    let r = post(&app, &format!("/tasks/{running}/kill"), json!({"reason": "stuck"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        (r.json()["stop"]["action"].as_str(), r.json()["stop"]["by"].as_str()),
        (Some("kill"), Some("api"))
    );
    assert_eq!(r.json()["status"], 0, "the DEN ends it");
    let r = post(&app, &format!("/tasks/{running}/kill"), json!({})).await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert!(r.error().contains("already asked"), "{}", r.error());
    let waiting = &ids[3];
    let r = post(&app, &format!("/tasks/{waiting}/kill"), json!({})).await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert!(
        r.error().contains("cancel ends a task that has not started"),
        "{}",
        r.error()
    );

    // Ids and bodies.
    assert_eq!(
        post(&app, &format!("/tasks/{}/cancel", ObjectId::new()), json!({}))
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    assert_bad(&post(&app, "/tasks/nope/cancel", json!({})).await, "nope");
    assert_bad(
        &post(&app, &format!("/tasks/{}/cancel", ids[1]), json!({"why": 1})).await,
        "why",
    );
    assert_bad(
        &post(&app, &format!("/tasks/{}/cancel", ids[1]), json!({"reason": 5})).await,
        "reason",
    );
    let r = send(&app, Method::POST, &format!("/tasks/{}/cancel", ids[1]), None, None).await;
    assert_eq!(
        r.status,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "a bodiless POST is refused: {}",
        r.text
    );

    // The queue form cancels every waiting task and nothing else.
    let r = post(&app, "/tasks/cancel", json!({"queue": "q", "reason": "drain"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json()["count"], 2);
    let r = post(&app, "/tasks/kill", json!({"queue": "q"})).await;
    assert_eq!(r.json()["count"], 0, "the running task was asked already: {}", r.text);
    assert_bad(&post(&app, "/tasks/cancel", json!({})).await, "queue");
    assert_eq!(
        post(&app, "/tasks/cancel", json!({"queue": "none"})).await.status,
        StatusCode::NOT_FOUND
    );
    let counts = get(&app, "/queues/q").await.json();
    assert_eq!(counts["counts"]["-5"], 3, "{counts}");
}
