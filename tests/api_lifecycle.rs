//! Scheduled tasks, cancel and kill through the REST API, against the real test database
//! server: what a caller sees, including the Disbatch 4 view of tasks without the new
//! fields.

use crate::common;

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
    assert!(disbatch::lifecycle::run::start(&db.store, running, "den-1")
        .await
        .unwrap());
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

#[tokio::test]
async fn retry_policies_and_retries_by_hand() {
    let (db, app) = setup("api_retry", |_| {}).await;
    // A queue's policy is checked field by field and read back as given.
    let r = post(
        &app,
        "/queues",
        json!({"name": "r", "plugin": "demo", "threads": 0, "activity_timeout": "5m",
               "retry": {"attempts": 4, "backoff": "2s", "exponential": true, "max_backoff": "1m",
                         "jitter": true, "on": ["trap", "orphaned"], "lower_priority": 1}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let q = get(&app, "/queues/r").await.json();
    assert_eq!(q["retry"]["attempts"], 4, "{q}");
    assert_eq!(q["retry"]["backoff"], "2s");
    assert_eq!(q["retry"]["on"], json!(["trap", "orphaned"]));
    assert_eq!(q["activity_timeout"], "5m");
    for (body, names) in [
        (json!({"retry": {"attempts": 0}}), "retry.attempts"),
        (json!({"retry": {"attempts": 2, "on": ["sometimes"]}}), "sometimes"),
        (json!({"retry": {"attempts": 2, "tries": 3}}), "tries"),
        (json!({"retry": 3}), "retry"),
        (json!({"activity_timeout": "soon"}), "activity_timeout"),
        (json!({"activity_timeout": -1}), "activity_timeout"),
    ] {
        assert_bad(&post(&app, "/queues/r", body.clone()).await, names);
    }
    let r = post(&app, "/queues/r", json!({"retry": null, "activity_timeout": null})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let q = get(&app, "/queues/r").await.json();
    assert!(q["retry"].is_null() && q["activity_timeout"].is_null(), "{q}");

    // By hand: a finished task runs again, its last run kept; others are refused.
    let r = post(&app, "/tasks", json!({"queue": "r", "params": [{}, {}]})).await;
    let ids: Vec<String> = r.json()["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let r = post(&app, &format!("/tasks/{}/retry", ids[0]), json!({})).await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert!(r.error().contains("is queued (-2)"), "{}", r.error());
    assert!(r.error().contains("only a finished task"), "{}", r.error());
    let queue = db.store.queues().await.unwrap().remove(0);
    // The claims below take the task just put back each time: in the queue's order at
    // every moment, so with no task read ahead (which may claim the tasks read first).
    let store = db.store.clone().read_ahead_for(std::time::Duration::ZERO);
    let t = store.claim(&queue, "den-1").await.unwrap().unwrap().id;
    assert!(disbatch::lifecycle::run::start(&store, t, "den-1").await.unwrap());
    let r = post(&app, &format!("/tasks/{t}/retry"), json!({})).await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert!(r.error().contains("kill stops a running task"), "{}", r.error());
    let text = |s: &str| disbatch::store::OutputValue::Inline(s.into());
    assert!(
        disbatch::lifecycle::run::finish(&db.store, t, "den-1", 2, text("half done"), text("disk full"))
            .await
            .unwrap()
    );
    let r = post(
        &app,
        &format!("/tasks/{t}/retry"),
        json!({"by": "ann", "reason": "disk cleaned"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let v = r.json();
    assert_eq!((v["status"].as_i64(), v["node"].as_str()), (Some(-2), None), "{v}");
    assert!(v["stdout"].is_null() && v["stderr"].is_null(), "{v}");
    let a = &v["attempts"][0];
    assert_eq!(
        (a["status"].as_i64(), a["status_name"].as_str()),
        (Some(2), Some("failed"))
    );
    assert_eq!(a["node"], "den-1");
    assert_eq!(a["reason"], "retried by hand by ann: disk cleaned");
    assert_eq!(
        (a["stdout"].as_str(), a["stderr"].as_str()),
        (Some("half done"), Some("disk full"))
    );
    assert_eq!(v["attempts_dropped"], 0, "{v}");
    // Past the cap the oldest records go, counted in `attempts_dropped`.
    let kept = disbatch::model::ATTEMPTS_KEPT;
    for n in 0..kept {
        let c = store.claim(&queue, "den-1").await.unwrap().unwrap().id;
        assert_eq!(c, t);
        assert!(disbatch::lifecycle::run::start(&store, t, "den-1").await.unwrap());
        let out = text(&format!("run {n}"));
        assert!(disbatch::lifecycle::run::finish(&store, t, "den-1", 2, out, text(""))
            .await
            .unwrap());
        let r = post(&app, &format!("/tasks/{t}/retry"), json!({})).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    }
    let v = get(&app, &format!("/tasks/{t}")).await.json();
    assert_eq!(v["attempts"].as_array().map(Vec::len), Some(kept), "{v}");
    assert_eq!(v["attempts_dropped"], 1, "the first record is dropped");
    assert_eq!(v["attempts"][0]["stdout"], "run 0");
    assert_eq!(v["attempts"][kept - 1]["stdout"], format!("run {}", kept - 1));
    assert_eq!(
        post(&app, &format!("/tasks/{}/retry", ObjectId::new()), json!({}))
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    assert_bad(
        &post(&app, &format!("/tasks/{t}/retry"), json!({"who": 1})).await,
        "who",
    );
    // A cancelled task can be retried too.
    let other = ids.iter().find(|i| **i != t.to_hex()).unwrap();
    post(&app, &format!("/tasks/{other}/cancel"), json!({})).await;
    let r = post(&app, &format!("/tasks/{other}/retry"), json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.json().get("stop").is_none(), "the cancel is cleared: {}", r.text);
    assert_eq!(r.json()["attempts"][0]["status_name"], "cancelled");
}

#[tokio::test]
async fn keys_make_submission_safe_to_repeat() {
    let (_db, app) = setup("api_keys", |_| {}).await;
    queue(&app, "k").await;
    queue(&app, "k2").await;
    let body = json!({"queue": "k", "tasks": [
        {"params": {"n": 1}, "key": "order-1"},
        {"params": {"n": 2}},
        {"params": {"n": 3}, "key": "order-1"},
    ]});
    let r = post(&app, "/tasks", body.clone()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let first = r.json();
    assert_eq!(first["created"], 2, "{first}");
    let id = first["ids"][0].as_str().unwrap().to_string();
    assert_eq!(first["ids"][2], id.as_str(), "the same key in one request is one task");
    assert_eq!(first["existing"], json!([id]));
    // The same request again (a client retrying after a lost reply): nothing new keyed.
    let again = post(&app, "/tasks", body).await.json();
    assert_eq!(again["ids"][0], id.as_str());
    assert_eq!(again["created"], 1, "only the keyless task is new: {again}");
    // GET by key, and the key's task shows its key.
    let t = get(&app, "/tasks/order-1").await.json();
    assert_eq!(
        (t["id"].as_str(), t["key"].as_str()),
        (Some(id.as_str()), Some("order-1"))
    );
    assert_eq!(t["params"]["n"], 1);
    assert_eq!(get(&app, "/tasks/order-9").await.status, StatusCode::NOT_FOUND);
    // resubmit: the waiting task takes the new params.
    let r = post(
        &app,
        "/tasks",
        json!({"queue": "k", "resubmit": true, "tasks": [{"params": {"n": 7}, "key": "order-1"}]}),
    )
    .await;
    assert_eq!(r.json()["resubmitted"], json!([id]), "{}", r.text);
    assert_eq!(get(&app, "/tasks/order-1").await.json()["params"]["n"], 7);
    // A key used in two queues needs the queue to be named.
    post(&app, "/tasks", json!({"queue": "k2", "tasks": [{"key": "order-1"}]})).await;
    let r = get(&app, "/tasks/order-1").await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    assert!(r.error().contains("?queue="), "{}", r.error());
    let q = get(&app, "/queues/k").await.json();
    let qid = q["id"].as_str().unwrap();
    assert_eq!(
        get(&app, &format!("/tasks/order-1?queue={qid}")).await.json()["id"],
        id.as_str()
    );
    // Bad keys and options name the field.
    assert_bad(
        &post(&app, "/tasks", json!({"queue": "k", "tasks": [{"key": 5}]})).await,
        "tasks[0].key",
    );
    assert_bad(
        &post(&app, "/tasks", json!({"queue": "k", "tasks": [{"key": ""}]})).await,
        "tasks[0].key",
    );
    assert_bad(
        &post(
            &app,
            "/tasks",
            json!({"queue": "k", "tasks": [{"key": "x".repeat(1001)}]}),
        )
        .await,
        "tasks[0].key",
    );
    assert_bad(
        &post(&app, "/tasks", json!({"queue": "k", "resubmit": "yes", "tasks": []})).await,
        "resubmit",
    );
    assert_bad(
        &post(&app, "/tasks", json!({"queue": "k", "resubmit": true, "params": [{}]})).await,
        "resubmit",
    );
}

#[tokio::test]
async fn rate_limits_are_checked_and_shown_with_their_use() {
    let (db, app) = setup("api_rate", |_| {}).await;
    let r = post(
        &app,
        "/queues",
        json!({"name": "rated", "plugin": "demo", "threads": 0, "rate": {"max": 3, "per": "1m"}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let q = get(&app, "/queues/rated").await.json();
    assert_eq!(q["rate"], json!({"max": 3, "per": "1m"}), "{q}");
    assert_eq!(q["rate_used"], 0, "{q}");
    for (body, names) in [
        (json!({"rate": {"max": 0, "per": "1s"}}), "rate.max"),
        (json!({"rate": {"max": -2, "per": "1s"}}), "rate.max"),
        (json!({"rate": {"max": 1.5, "per": "1s"}}), "rate.max"),
        (json!({"rate": {"max": "3", "per": "1s"}}), "rate.max"),
        (json!({"rate": {"max": 10_001, "per": "1d"}}), "rate.max"),
        (json!({"rate": {"max": 3, "per": "500us"}}), "rate.per"),
        (json!({"rate": {"max": 3, "per": "soon"}}), "rate.per"),
        (json!({"rate": {"max": 3, "per": 0}}), "rate.per"),
        (json!({"rate": {"max": 3, "per": "400 days"}}), "rate.per"),
        (json!({"rate": {"max": 3}}), "rate.per"),
        (json!({"rate": {"max": 3, "per": "1s", "burst": 9}}), "rate.burst"),
        (json!({"rate": 10}), "rate"),
    ] {
        assert_bad(&post(&app, "/queues/rated", body.clone()).await, names);
    }
    // Grants taken show as `rate_used`, in the listing too.
    let queue = db
        .store
        .queues()
        .await
        .unwrap()
        .into_iter()
        .find(|q| q.name == "rated")
        .unwrap();
    let rate = queue.rate.unwrap();
    for node in ["a", "b"] {
        let taken = disbatch::lifecycle::rate::take(&db.store, queue.id, &rate, node, bson::DateTime::now())
            .await
            .unwrap();
        assert!(matches!(taken, disbatch::lifecycle::rate::Take::Granted(_)));
    }
    let all = get(&app, "/queues").await.json();
    let listed = all.as_array().unwrap().iter().find(|q| q["name"] == "rated").unwrap();
    assert_eq!(listed["rate_used"], 2, "{listed}");
    // Changed, then removed with null.
    let r = post(&app, "/queues/rated", json!({"rate": {"max": 10, "per": 1}})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        get(&app, "/queues/rated").await.json()["rate"],
        json!({"max": 10, "per": "1s"})
    );
    let r = post(&app, "/queues/rated", json!({"rate": null})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let q = get(&app, "/queues/rated").await.json();
    assert!(q["rate"].is_null() && q.get("rate_used").is_none(), "{q}");
    // A `rate` written badly by another tool keeps the queue listed, starting nothing.
    db.db
        .collection::<bson::Document>("queues")
        .update_one(
            bson::doc! {"name": "rated"},
            bson::doc! {"$set": {"rate": {"max": "lots", "per": "1s"}}},
        )
        .await
        .unwrap();
    let q = get(&app, "/queues/rated").await.json();
    assert_eq!(q["rate"]["max"], 0, "{q}");
}
