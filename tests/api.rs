//! The REST API in-process (`router(state)` + `oneshot`) against the real test database
//! server: every route's happy path, bad bodies, bad ids and the bearer token.

use crate::common;

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use bson::{doc, Document};
use disbatch::api::ROUTES;
use disbatch::store::testing::StoreExt;
use disbatch::store::{OutputValue, Store};
use serde_json::{json, Value};
use tower::ServiceExt;

use common::http::{assert_bad, get, post, send, setup, urlencode, PLUGINS};

#[tokio::test]
async fn queues_create_read_update_delete() {
    let (_db, app) = setup("api_queues", |_| {}).await;
    let r = post(
        &app,
        "/queues",
        json!({"name": "q1", "plugin": "demo", "threads": 2, "sort": "fifo"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let created = r.json();
    let id = created["id"].as_str().unwrap().to_owned();
    assert_eq!(created["name"], "q1");
    assert_eq!(created["threads"], 2);

    for key in [id.as_str(), "q1"] {
        let q = get(&app, &format!("/queues/{key}")).await.json();
        assert_eq!(q["id"], id.as_str());
        for k in ["plugin", "name", "threads", "queued", "running", "completed"] {
            assert!(q.get(k).is_some(), "missing {k} in {q}");
        }
    }
    let list = get(&app, "/queues").await.json();
    assert_eq!(list.as_array().unwrap().len(), 1);

    let r = post(&app, "/queues/q1", json!({"threads": 5, "plugin": "fail"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json()["threads"], 5);
    assert_eq!(r.json()["plugin"], "fail");
    let r = post(&app, &format!("/queues/{id}"), json!({"threads": null, "name": "q2"})).await;
    assert_eq!(r.json()["threads"], Value::Null);
    assert_eq!(r.json()["name"], "q2");
    let r = post(
        &app,
        "/queues/q2",
        json!({"sandbox": {"timeout": "5s", "memory_mib": 64}, "on_orphan": "requeue"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json()["on_orphan"], "requeue");
    assert_eq!(r.json()["sandbox"]["memory_mib"], 64);
    let r = post(
        &app,
        "/queues/q2",
        json!({"sandbox": {"http": ["api.example.com", "https://*.corp:8443"], "http_max_requests": 10}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json()["sandbox"]["http"][1], "https://*.corp:8443");
    assert_eq!(r.json()["sandbox"]["http_max_requests"], 10);
    assert_bad(
        &post(
            &app,
            "/queues/q2",
            json!({"sandbox": {"http": ["ok.example.com", "https://x/path"]}}),
        )
        .await,
        "http[1]",
    );

    let r = send(&app, Method::DELETE, "/queues/q2", None, None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json()["deleted"], true);
    assert_eq!(get(&app, "/queues/q2").await.status, StatusCode::NOT_FOUND);
    assert_eq!(get(&app, &format!("/queues/{id}")).await.status, StatusCode::NOT_FOUND);
    let r = send(&app, Method::DELETE, "/queues/q2", None, None).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert!(r.error().contains("q2"));
}

#[tokio::test]
async fn queue_bad_bodies_are_400_naming_the_field() {
    let (_db, app) = setup("api_queue_bad", |_| {}).await;
    assert_bad(&post(&app, "/queues", json!({"plugin": "demo"})).await, "\"name\"");
    assert_bad(&post(&app, "/queues", json!({"name": "x"})).await, "\"plugin\"");
    assert_bad(
        &post(&app, "/queues", json!({"name": "x", "plugin": "nope"})).await,
        "not an allowed plugin",
    );
    assert_bad(
        &post(&app, "/queues", json!({"name": "x", "plugin": "../demo"})).await,
        "\"plugin\"",
    );
    assert_bad(
        &post(&app, "/queues", json!({"name": "x", "plugin": "demo", "threads": -1})).await,
        "\"threads\"",
    );
    assert_bad(
        &post(
            &app,
            "/queues",
            json!({"name": "x", "plugin": "demo", "threads": "many"}),
        )
        .await,
        "\"threads\"",
    );
    assert_bad(
        &post(
            &app,
            "/queues",
            json!({"name": "x", "plugin": "demo", "sort": "random"}),
        )
        .await,
        "\"sort\"",
    );
    assert_bad(
        &post(&app, "/queues", json!({"name": "x", "plugin": "demo", "bogus": 1})).await,
        "\"bogus\"",
    );
    assert_bad(
        &post(
            &app,
            "/queues",
            json!({"name": "x", "plugin": "demo", "sandbox": {"cpu": 1}}),
        )
        .await,
        "\"sandbox\"",
    );
    assert_bad(
        &post(&app, "/queues", json!({"name": "", "plugin": "demo"})).await,
        "\"name\"",
    );
    assert_bad(&post(&app, "/queues", json!(["name"])).await, "JSON object");
    assert_bad(
        &send(&app, Method::POST, "/queues", Some("{not json"), None).await,
        "not valid JSON",
    );
    assert_bad(&send(&app, Method::POST, "/queues", Some(""), None).await, "empty");

    assert_eq!(
        post(&app, "/queues", json!({"name": "x", "plugin": "demo"}))
            .await
            .status,
        StatusCode::OK
    );
    assert_bad(
        &post(&app, "/queues", json!({"name": "x", "plugin": "demo"})).await,
        "already exists",
    );
    assert_bad(&post(&app, "/queues/x", json!({})).await, "nothing to change");
    assert_bad(&post(&app, "/queues/x", json!({"threads": 1.5})).await, "\"threads\"");
    assert_eq!(
        post(&app, "/queues/nope", json!({"threads": 1})).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(&app, "/queues/0123456789abcdef01234567").await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn tasks_from_params_search_and_read_back() {
    let (db, app) = setup("api_tasks", |_| {}).await;
    post(&app, "/queues", json!({"name": "work", "plugin": "demo", "threads": 1})).await;
    let r = post(
        &app,
        "/tasks",
        json!({"queue": "work", "params": [{"n": 1}, {"n": 2}, {"n": 3}]}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let ids: Vec<String> = serde_json::from_value(r.json()["ids"].clone()).unwrap();
    assert_eq!(ids.len(), 3);
    assert_eq!(r.json()["count"], 3);

    assert_bad(&get(&app, "/tasks").await, "unbounded");
    let all = get(&app, "/tasks?limit=10").await.json();
    assert_eq!(all.as_array().unwrap().len(), 3);
    let by_queue = get(&app, "/tasks?queue=work&status=-2").await.json();
    assert_eq!(by_queue.as_array().unwrap().len(), 3);
    assert_eq!(by_queue[0]["status"], -2);
    assert_eq!(by_queue[0]["node"], Value::Null);
    assert!(by_queue[0]["_id"]["$oid"].is_string());
    assert!(by_queue[0]["ctime"]["$date"].is_string());
    let page = get(&app, "/tasks?queue=work&limit=1&skip=1").await.json();
    assert_eq!(page.as_array().unwrap().len(), 1);
    assert_eq!(get(&app, "/tasks?queue=work&count=1").await.json()["count"], 3);
    let filtered = get(
        &app,
        &format!("/tasks?filter={}", urlencode(r#"{"status":[-2],"node":null}"#)),
    )
    .await;
    assert_eq!(filtered.json().as_array().unwrap().len(), 3, "{}", filtered.text);
    let terse = get(&app, "/tasks?queue=work&fields=status&epoch=1").await.json();
    assert_eq!(terse[0].as_object().unwrap().len(), 3, "{terse}");
    assert_bad(&get(&app, "/tasks?params.n=1").await, "indexed");
    assert_bad(&get(&app, "/tasks?status=queued").await, "\"status\"");
    assert_bad(&get(&app, "/tasks?limit=ten").await, "\"limit\"");
    assert_bad(&get(&app, "/tasks?limit=1000000").await, "\"limit\"");
    assert_bad(&get(&app, "/tasks?filter=%7B").await, "\"filter\"");
    assert_eq!(get(&app, "/tasks?queue=nosuch").await.status, StatusCode::NOT_FOUND);

    let one = get(&app, &format!("/tasks/{}", ids[0])).await;
    assert_eq!(one.status, StatusCode::OK);
    assert_eq!(one.json()["params"]["n"], 1);
    // Not an id: looked up as a task key.
    let r = get(&app, "/tasks/not-an-id").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    assert!(
        r.error().contains("no task with id or key \"not-an-id\""),
        "{}",
        r.error()
    );
    assert_eq!(
        get(&app, "/tasks/0123456789abcdef01234567").await.status,
        StatusCode::NOT_FOUND
    );

    // Run one by hand with stdout in GridFS, and read it back resolved.
    let queue = db.store.queues().await.unwrap().remove(0);
    let task = db.store.claim(&queue, "n1").await.unwrap().unwrap();
    assert!(disbatch::lifecycle::run::start(&db.store, task.id, "n1").await.unwrap());
    let big = "line\n".repeat(100_000);
    let file = db.store.write_output_file(task.id, "stdout", &big).await.unwrap();
    let done = disbatch::lifecycle::run::finish(
        &db.store,
        task.id,
        "n1",
        1,
        OutputValue::File(file),
        OutputValue::Inline("warn".into()),
    )
    .await
    .unwrap();
    assert!(done);
    let raw = get(&app, &format!("/tasks/{}", task.id.to_hex())).await.json();
    assert_eq!(raw["stdout"]["$oid"], file.to_hex());
    let resolved = get(&app, &format!("/tasks/{}?output=1", task.id.to_hex())).await.json();
    assert_eq!(resolved["stdout"].as_str().unwrap(), big);
    assert_eq!(resolved["stderr"], "warn");
    assert_eq!(resolved["status"], 1);

    // The raw outputs as text: a GridFS file streamed chunk by chunk, inline text at once.
    let path = format!("/tasks/{}/stdout", task.id.to_hex());
    let request = axum::http::Request::get(&path).body(axum::body::Body::empty()).unwrap();
    let resp = tower::ServiceExt::oneshot(app.clone(), request).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "text/plain; charset=utf-8");
    let mut body = resp.into_body();
    let (mut frames, mut streamed) = (0, Vec::new());
    while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
        if let Ok(data) = frame.unwrap().into_data() {
            frames += 1;
            streamed.extend_from_slice(&data);
        }
    }
    assert_eq!(String::from_utf8(streamed).unwrap(), big);
    let chunks = big.len().div_ceil(disbatch::store::mongo::gridfs::CHUNK_SIZE);
    assert_eq!(frames, chunks, "one piece per GridFS chunk");
    let stderr = get(&app, &format!("/tasks/{}/stderr", task.id.to_hex())).await;
    assert_eq!((stderr.status, stderr.text.as_str()), (StatusCode::OK, "warn"));
    let queued = ids.iter().find(|i| **i != task.id.to_hex()).unwrap();
    let pending = get(&app, &format!("/tasks/{queued}/stdout")).await;
    assert_eq!(pending.status, StatusCode::NOT_FOUND);
    assert!(
        pending.error().contains("has no stdout yet (status -2)"),
        "{}",
        pending.text
    );
    assert_bad(&get(&app, "/tasks/nope/stderr").await, "invalid task id");
    let q = get(&app, "/queues/work").await.json();
    assert_eq!(
        (q["queued"].as_u64(), q["completed"].as_u64()),
        (Some(2), Some(1)),
        "{q}"
    );
    assert_eq!(get(&app, "/tasks?node=n1").await.json().as_array().unwrap().len(), 1);

    // Disbatch 4's output options of a search: terse hides inline text, full reads files.
    let terse = get(&app, "/tasks?node=n1&terse=1").await.json();
    assert_eq!(terse[0]["stderr"], "[terse mode]");
    assert_eq!(terse[0]["stdout"]["$oid"], file.to_hex(), "a file id stays an id");
    let full = get(&app, "/tasks?node=n1&full=1").await.json();
    assert_eq!(full[0]["stdout"].as_str().unwrap(), big);
    assert_eq!(full[0]["stderr"], "warn");
    assert_bad(&get(&app, "/tasks?node=n1&full=1&limit=11").await, "\"limit\"");
    assert_bad(&get(&app, "/tasks?node=n1&full=1&terse=1").await, "\"terse\"");
    let pretty = get(&app, "/tasks?node=n1&fields=status&pretty=1").await;
    assert!(pretty.text.contains("\n  {\n"), "indented: {}", pretty.text);
    assert_eq!(pretty.json()[0]["status"], 1);
    assert_eq!(get(&app, "/tasks?node=n1&count=1&pretty=1").await.json()["count"], 1);
}

#[tokio::test]
async fn task_bad_bodies() {
    let (_db, app) = setup("api_task_bad", |_| {}).await;
    post(&app, "/queues", json!({"name": "w", "plugin": "demo"})).await;
    assert_bad(&post(&app, "/tasks", json!({"params": [{}]})).await, "\"queue\"");
    assert_bad(&post(&app, "/tasks", json!({"queue": "w"})).await, "\"params\"");
    // One object is one task, as Disbatch 4 took it.
    let one = post(&app, "/tasks", json!({"queue": "w", "params": {"a": 1}})).await;
    assert_eq!(one.json()["count"], 1, "{}", one.text);
    assert_bad(
        &post(&app, "/tasks", json!({"queue": "w", "params": "a=1"})).await,
        "\"params\"",
    );
    assert_bad(
        &post(&app, "/tasks", json!({"queue": "w", "params": [{}, 3]})).await,
        "params[1]",
    );
    assert_bad(
        &post(&app, "/tasks", json!({"queue": "w", "params": [], "x": 1})).await,
        "\"x\"",
    );
    assert_bad(
        &post(&app, "/tasks", json!({"queue": "w", "filter": {}, "params": []})).await,
        "\"collection\"",
    );
    let r = post(&app, "/tasks", json!({"queue": "nope", "params": [{}]})).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn tasks_from_a_collection() {
    let (db, app) = setup("api_tasks_coll", |_| {}).await;
    post(&app, "/queues", json!({"name": "users", "plugin": "demo"})).await;
    let users: Vec<Document> = (0..5)
        .map(|i| doc! {"name": format!("u{i}"), "age": 20 + i, "addr": {"city": format!("c{i}")}})
        .collect();
    db.db.collection::<Document>("people").insert_many(users).await.unwrap();
    let r = post(
        &app,
        "/tasks",
        json!({"queue": "users", "collection": "people", "filter": {"age": {"$gte": 22}},
               "params": {"user": "document.name", "city": "document.addr.city", "kind": "greeting"}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json()["count"], 3);
    let tasks = get(&app, "/tasks?queue=users").await.json();
    let mut got: Vec<(String, String)> = tasks
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            assert_eq!(t["params"]["kind"], "greeting");
            (
                t["params"]["user"].as_str().unwrap().to_owned(),
                t["params"]["city"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            ("u2".into(), "c2".into()),
            ("u3".into(), "c3".into()),
            ("u4".into(), "c4".into())
        ]
    );

    let r = post(
        &app,
        "/tasks",
        json!({"queue": "users", "collection": "people", "filter": {"$where": "1"}, "params": {}}),
    )
    .await;
    assert_bad(&r, "$where");
    assert_bad(
        &post(
            &app,
            "/tasks",
            json!({"queue": "users", "collection": "", "params": {}}),
        )
        .await,
        "\"collection\"",
    );
    assert_bad(
        &post(
            &app,
            "/tasks",
            json!({"queue": "users", "collection": "people", "params": ["x"]}),
        )
        .await,
        "\"params\"",
    );
}

#[tokio::test]
async fn collection_form_refused_without_a_document_source() {
    let (_db, app) = setup("api_no_source", |s| s.documents = None).await;
    post(&app, "/queues", json!({"name": "q", "plugin": "demo"})).await;
    let r = post(
        &app,
        "/tasks",
        json!({"queue": "q", "collection": "c", "filter": {}, "params": {}}),
    )
    .await;
    assert_bad(&r, "\"collection\"");
}

#[tokio::test]
async fn nodes_and_maxthreads() {
    let (db, app) = setup("api_nodes", |_| {}).await;
    let node = db.store.heartbeat("n1", Duration::from_secs(30)).await.unwrap();
    let list = get(&app, "/nodes").await.json();
    assert_eq!(list[0]["node"], "n1");
    assert_eq!(list[0]["fresh"], true);
    assert_eq!(
        get(&app, &format!("/nodes/{}", node.id.to_hex())).await.json()["node"],
        "n1"
    );
    let r = post(&app, "/nodes/n1", json!({"maxthreads": 3})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json()["maxthreads"], 3);
    assert_eq!(get(&app, "/nodes/n1").await.json()["maxthreads"], 3);
    let r = post(&app, "/nodes/n1", json!({"maxthreads": null})).await;
    assert_eq!(r.json()["maxthreads"], Value::Null);
    assert_bad(
        &post(&app, "/nodes/n1", json!({"maxthreads": "x"})).await,
        "\"maxthreads\"",
    );
    assert_bad(
        &post(&app, "/nodes/n1", json!({"maxthreads": -2})).await,
        "\"maxthreads\"",
    );
    assert_bad(&post(&app, "/nodes/n1", json!({})).await, "\"maxthreads\"");
    assert_bad(
        &post(&app, "/nodes/n1", json!({"maxthreads": 1, "x": 1})).await,
        "\"x\"",
    );
    assert_eq!(
        post(&app, "/nodes/n9", json!({"maxthreads": 1})).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(get(&app, "/nodes/n9").await.status, StatusCode::NOT_FOUND);

    // What a node reports it cannot run shows on the queue, while the node is fresh.
    let q = post(
        &app,
        "/queues",
        json!({"name": "broken", "plugin": "demo", "threads": 1}),
    )
    .await
    .json();
    let id = q["id"].as_str().unwrap().to_owned();
    assert_eq!(q["problems"], Value::Null, "a new queue has no report yet");
    let problems = std::collections::BTreeMap::from([(id.clone(), "plugin \"demo\" is not loadable".to_string())]);
    disbatch::lifecycle::nodes::report_queue_problems(&db.store, "n1", &problems)
        .await
        .unwrap();
    let expected = json!([{"node": "n1", "reason": "plugin \"demo\" is not loadable"}]);
    assert_eq!(get(&app, "/queues/broken").await.json()["problems"], expected);
    let listed = get(&app, "/queues").await.json();
    assert_eq!(listed[0]["problems"], expected);
    db.db
        .collection::<bson::Document>("nodes")
        .update_one(
            bson::doc! {"node": "n1"},
            bson::doc! {"$set": {"timestamp": bson::DateTime::from_millis(0)}},
        )
        .await
        .unwrap();
    assert_eq!(
        get(&app, "/queues/broken").await.json()["problems"],
        json!([]),
        "a stale node's report is not shown"
    );
}

#[tokio::test]
async fn monitoring_fresh_and_stale() {
    let (db, app) = setup("api_monitoring", |_| {}).await;
    let m = get(&app, "/monitoring").await.json();
    assert_eq!(
        m["disbatch"],
        json!({"status": "WARNING", "message": "No Disbatch nodes found"}),
        "{m}"
    );
    assert_eq!(
        m["queuebalance"],
        json!({"status": "OK", "message": "queuebalance disabled"}),
        "the config does not enable it: {m}"
    );
    let old = bson::DateTime::from_millis(bson::DateTime::now().timestamp_millis() - 120_000);
    db.db
        .collection::<Document>("nodes")
        .insert_one(doc! {"node": "dead", "timestamp": old, "maxthreads": null})
        .await
        .unwrap();
    let m = get(&app, "/monitoring").await.json();
    assert_eq!(m["disbatch"]["status"], "CRITICAL", "no node is fresh: {m}");
    let age = m["disbatch"]["nodes"]["stale"]["dead"].as_u64().unwrap();
    assert!((119..=130).contains(&age), "the age in seconds: {m}");
    assert_eq!(m["disbatch"]["nodes"]["fresh"], json!({}));
    db.store.heartbeat("alive", Duration::from_secs(30)).await.unwrap();
    let m = get(&app, "/monitoring").await.json();
    assert_eq!(m["disbatch"]["status"], "OK", "one fresh node is enough: {m}");
    assert!(m["disbatch"]["nodes"]["fresh"]["alive"].as_u64().unwrap() <= 1, "{m}");
    assert!(m["disbatch"]["nodes"]["stale"]["dead"].is_u64(), "{m}");
    assert!(m["disbatch"]["message"].as_str().unwrap().contains("dead"));
}

#[tokio::test]
async fn metrics_info_plugins_and_ui() {
    let (db, app) = setup("api_metrics", |_| {}).await;
    post(&app, "/queues", json!({"name": "m\"q", "plugin": "demo", "threads": 2})).await;
    post(&app, "/tasks", json!({"queue": "m\"q", "params": [{}, {}]})).await;
    db.store.heartbeat("n1", Duration::from_secs(30)).await.unwrap();
    let r = get(&app, "/metrics").await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.headers[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    assert!(r.text.contains("disbatch_tasks{queue=\"m\\\"q\","), "{}", r.text);
    assert!(r.text.contains("status=\"queued\",code=\"-2\"} 2"), "{}", r.text);
    assert!(r.text.contains("disbatch_node_running{node=\"n1\"} 0"), "{}", r.text);
    assert!(
        r.text.contains("disbatch_queue_threads{queue=\"m\\\"q\"} 2"),
        "{}",
        r.text
    );

    let info = get(&app, "/info").await.json();
    assert_eq!(info["database"], db.name.as_str());
    assert_eq!(info["token_required"], false);
    assert_eq!(get(&app, "/plugins").await.json(), json!(PLUGINS));
    let ui = get(&app, "/").await;
    assert_eq!(ui.status, StatusCode::OK);
    assert!(ui.text.contains("<html") || ui.text.contains("<!doctype html>"));
    assert_eq!(get(&app, "/ui/app.js").await.status, StatusCode::OK);
    // Every script and style the page loads is served.
    for part in ui.text.split("\"/ui/").skip(1) {
        let file = part.split('"').next().unwrap();
        let r = get(&app, &format!("/ui/{file}")).await;
        assert_eq!(r.status, StatusCode::OK, "/ui/{file}");
    }
    assert!(ui.text.matches("<script src=").count() >= 6);
    assert_eq!(get(&app, "/ui/nope.js").await.status, StatusCode::NOT_FOUND);
    let r = get(&app, "/no/such/route").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert!(r.error().contains("no route"));
    let r = send(&app, Method::PUT, "/queues", Some("{}"), None).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn token_guards_every_write() {
    let (_db, app) = setup("api_auth", |s| s.api_token = Some("s3cret".into())).await;
    let body = json!({"name": "q", "plugin": "demo"}).to_string();
    let r = send(&app, Method::POST, "/queues", Some(&body), None).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(r.error().contains("token"));
    assert_eq!(r.headers[header::WWW_AUTHENTICATE], "Bearer");
    let r = send(&app, Method::POST, "/queues", Some(&body), Some("wrong")).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let r = send(&app, Method::POST, "/queues", Some(&body), Some("s3cret")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    for (method, uri) in [
        (Method::POST, "/queues/q"),
        (Method::DELETE, "/queues/q"),
        (Method::POST, "/tasks"),
        (Method::POST, "/nodes/n1"),
    ] {
        let r = send(&app, method.clone(), uri, Some("{}"), None).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{method} {uri}");
    }
    assert_eq!(get(&app, "/queues").await.status, StatusCode::OK);
    assert_eq!(get(&app, "/info").await.json()["token_required"], true);
}

#[tokio::test]
async fn body_limit_and_cors() {
    let (_db, app) = setup("api_limits", |s| s.body_limit = 1024).await;
    let big = json!({"name": "x".repeat(4096), "plugin": "demo"}).to_string();
    let r = send(&app, Method::POST, "/queues", Some(&big), None).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", r.text);
    assert!(r.error().contains("limit"));

    let req = Request::get("/queues")
        .header(header::ORIGIN, "http://evil.example")
        .body(Body::empty())
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    assert!(resp.headers().get(header::ACCESS_CONTROL_ALLOW_ORIGIN).is_none());

    let (_db2, app) = setup("api_cors", |s| s.cors_origins = vec!["http://ui.example".into()]).await;
    let req = Request::get("/queues")
        .header(header::ORIGIN, "http://ui.example")
        .body(Body::empty())
        .unwrap();
    let resp = app.oneshot(req).await.unwrap();
    assert_eq!(resp.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN], "http://ui.example");
}

#[tokio::test]
async fn openapi_matches_the_routes() {
    let (_db, app) = setup("api_openapi", |_| {}).await;
    let doc = get(&app, "/openapi.json").await.json();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let mut documented = Vec::new();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for method in ops.as_object().unwrap().keys() {
            if method != "parameters" {
                documented.push((method.to_uppercase(), path.clone()));
            }
        }
    }
    documented.sort();
    let mut routes: Vec<(String, String)> = ROUTES.iter().map(|(m, p)| (m.to_string(), p.to_string())).collect();
    routes.sort();
    assert_eq!(documented, routes, "the OpenAPI paths and the router's routes differ");
    for (method, path) in &routes {
        let uri = path
            .replace("{node}", "n")
            .replace("{queue}", "q")
            .replace("{id}", "0123456789abcdef01234567");
        let body = (method != "GET").then_some("{}");
        let r = send(&app, method.parse().unwrap(), &uri, body, None).await;
        assert_ne!(r.status, StatusCode::METHOD_NOT_ALLOWED, "{method} {uri}");
        assert!(!r.text.contains("no route"), "{method} {uri} is not routed: {}", r.text);
        assert!(!r.status.is_server_error(), "{method} {uri}: {}", r.text);
    }
}
