//! Documents as Perl Disbatch 4 and its DCI write them — numbers as strings, epoch-number
//! dates, `node: -1`, Disbatch 3's `parameters` — written straight into the real server: a
//! real `den` runs them, and the API lists, changes and deletes their queues; a queue
//! document that cannot be read is listed with its problem, never hidden.

use crate::common;

use common::http::{get, post, send};
use common::{count_tasks as count, find_docs, insert_queue, wait_for, DenProcess};

use std::time::Duration;

use axum::http::{Method, StatusCode};
use bson::{doc, Bson, Document};
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_den_runs_with_perl_written_node_queue_and_tasks() {
    let t = common::test_db("perl_docs").await;
    let now_secs = bson::DateTime::now().timestamp_millis() / 1000;
    // The DCI's `POST /nodes/:node {maxthreads}` stores the form value as a string. The
    // Disbatch 4 DEN that wrote it stopped a while ago (a fresh one keeps its name).
    t.db.collection::<Document>("nodes")
        .insert_one(doc! {"node": "perl", "timestamp": now_secs - 120, "maxthreads": "3"})
        .await
        .unwrap();
    let q = insert_queue(&t.db, "perlq", "demo", doc! {"threads": "2"}).await;
    let task = |i: i32| {
        doc! {
            "queue": q, "ctime": now_secs, "mtime": Bson::Double(now_secs as f64 * 1000.0),
            "node": Bson::Null, "status": -2, "params": {"message": format!("perl {i}")},
            "stdout": Bson::Null, "stderr": Bson::Null,
        }
    };
    let mut tasks: Vec<Document> = (0..3).map(task).collect();
    // Perl's DEN claims `{$or: [{node: null}, {node: -1}], status: -2}`.
    let mut unclaimed = task(3);
    unclaimed.insert("node", -1);
    tasks.push(unclaimed);
    // Disbatch 3 named the parameters `parameters`; Disbatch 4's task runner still reads them.
    let mut old = task(4);
    old.remove("params");
    old.insert("parameters", doc! {"message": "perl 4"});
    tasks.push(old);
    // Fields of Disbatch's own task lifecycle, written by another tool in shapes it never
    // writes, do not make a queued task unreadable (it runs as Disbatch 4 would run it).
    for (i, (field, value)) in [
        ("run_at", Bson::Null),
        ("run_at", Bson::String("2030-01-01T00:00:00Z".into())),
        ("stop", Bson::Int32(5)),
        ("progress", Bson::String("half".into())),
    ]
    .into_iter()
    .enumerate()
    {
        let mut odd = task(5 + i as i32);
        odd.insert(field, value);
        tasks.push(odd);
    }
    t.db.collection::<Document>("tasks").insert_many(tasks).await.unwrap();
    // A finished task as Perl left it, with `node: -1`, must not disturb the node.
    t.db.collection::<Document>("tasks")
        .insert_one(doc! {
            "queue": q, "ctime": now_secs, "mtime": now_secs, "node": -1, "status": "1",
            "params": {}, "stdout": "done", "stderr": Bson::Null,
        })
        .await
        .unwrap();

    let den = DenProcess::start(&t.uri, &t.name, "perl", serde_json::json!({}));
    wait_for(
        Duration::from_secs(60),
        "the den to run the Perl-written queue",
        || async { count(&t.db, doc! {"queue": q, "status": {"$in": [1, 2]}, "node": "perl"}).await == 9 },
    )
    .await;
    for d in find_docs(&t.db, "tasks", doc! {"queue": q, "node": "perl"}).await {
        let message = d
            .get_document("params")
            .or_else(|_| d.get_document("parameters"))
            .unwrap()
            .get_str("message")
            .unwrap()
            .to_owned();
        assert_eq!(d.get_i32("status").unwrap(), 1, "{d}\n{}", den.log());
        assert_eq!(d.get_str("stdout").unwrap().trim(), message, "{d}");
    }
    let node =
        t.db.collection::<Document>("nodes")
            .find_one(doc! {"node": "perl"})
            .await
            .unwrap()
            .unwrap();
    assert!(
        matches!(node.get("timestamp"), Some(Bson::DateTime(_))),
        "heartbeats refresh the node: {node}"
    );
    let log = den.log();
    assert!(
        !log.contains("the DEN's pass failed"),
        "no pass of the loop failed:\n{log}"
    );
    drop(den);
}

/// The entry of `GET /queues` with this id.
fn listed(queues: &Value, id: &bson::oid::ObjectId) -> Value {
    queues
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["id"] == id.to_hex())
        .unwrap_or_else(|| panic!("queue {id} is not listed: {queues}"))
        .clone()
}

#[tokio::test]
async fn a_perl_written_queue_is_listed_changed_and_deleted() {
    let (t, app) = common::http::setup("perl_api", |_| {}).await;
    let q = insert_queue(&t.db, "perlq", "demo", doc! {"threads": "2", "sort": Bson::Null}).await;
    let r = get(&app, "/queues").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let entry = listed(&r.json(), &q);
    assert_eq!(entry["threads"], 2, "{entry}");
    assert!(entry.get("problem").is_none(), "{entry}");
    let r = post(&app, &format!("/queues/{q}"), json!({"threads": 3})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json()["threads"], 3);
    let stored = find_docs(&t.db, "queues", doc! {"_id": q}).await;
    assert_eq!(stored[0].get("threads"), Some(&Bson::Int32(3)), "{stored:?}");
    let r = post(&app, "/queues/perlq", json!({"name": "renamed"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = send(&app, Method::DELETE, "/queues/renamed", None, None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(find_docs(&t.db, "queues", doc! {"_id": q}).await.is_empty());
}

#[tokio::test]
async fn an_unreadable_queue_is_listed_with_its_problem_fixed_and_deleted() {
    let (t, app) = common::http::setup("perl_bad_queue", |_| {}).await;
    let good = insert_queue(&t.db, "good", "demo", doc! {}).await;
    let bad_sandbox = insert_queue(&t.db, "bad-sandbox", "demo", doc! {"sandbox": {"bogus": 1}}).await;
    let bad_threads = insert_queue(&t.db, "bad-threads", "demo", doc! {"threads": "many"}).await;
    common::insert_task(&t.db, bad_threads, -2, doc! {}).await;

    let r = get(&app, "/queues").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let all = r.json();
    assert!(listed(&all, &good).get("problem").is_none());
    let entry = listed(&all, &bad_sandbox);
    assert_eq!(entry["name"], "bad-sandbox", "{entry}");
    assert!(entry["problem"].as_str().unwrap().contains("`sandbox`"), "{entry}");
    let entry = listed(&all, &bad_threads);
    assert!(entry["problem"].as_str().unwrap().contains("`threads`"), "{entry}");
    assert_eq!(entry["queued"], 1, "its tasks are counted: {entry}");
    let r = get(&app, "/queues/bad-threads").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.json()["problem"].as_str().unwrap().contains("`threads`"));

    // A change that leaves the bad field shows the queue with its problem still.
    let r = post(&app, &format!("/queues/{bad_sandbox}"), json!({"threads": 1})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(
        r.json()["problem"].as_str().unwrap().contains("`sandbox`"),
        "{}",
        r.text
    );
    // Fixing the field makes it a queue again.
    let r = post(&app, &format!("/queues/{bad_sandbox}"), json!({"sandbox": {}})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.json().get("problem").is_none(), "{}", r.text);
    assert_eq!(r.json()["threads"], 1);
    let r = post(&app, "/queues/bad-threads", json!({"threads": 2})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json()["threads"], 2);

    // An unreadable queue can be deleted.
    let worse = insert_queue(&t.db, "worse", "demo", doc! {"on_orphan": 7}).await;
    let r = send(&app, Method::DELETE, &format!("/queues/{worse}"), None, None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json()["name"], "worse");
    let r = get(&app, "/queues").await;
    let all = r.json();
    assert_eq!(all.as_array().unwrap().len(), 3, "{all}");
    assert!(
        all.as_array().unwrap().iter().all(|q| q["id"] != worse.to_hex()),
        "{all}"
    );
}

/// A task Perl Disbatch 4 finished (its status a string, its `mtime` epoch seconds) is
/// retried by hand through the API like any other: the compare-and-set on the task as
/// read matches the forms the reader accepts.
#[tokio::test]
async fn a_perl_finished_task_is_retried_by_hand() {
    let (t, app) = common::http::setup("perl_retry", |_| {}).await;
    let q = insert_queue(&t.db, "perlq", "demo", doc! {}).await;
    let now_secs = bson::DateTime::now().timestamp_millis() / 1000;
    let id = bson::oid::ObjectId::new();
    t.db.collection::<Document>("tasks")
        .insert_one(doc! {
            "_id": id, "queue": q, "ctime": now_secs, "mtime": now_secs, "node": "perl",
            "status": "2", "params": {}, "stdout": "", "stderr": "died",
        })
        .await
        .unwrap();
    let r = post(&app, &format!("/tasks/{id}/retry"), json!({"reason": "flaky"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let stored = find_docs(&t.db, "tasks", doc! {"_id": id}).await;
    assert_eq!(stored[0].get("status"), Some(&Bson::Int32(-2)), "{stored:?}");
    assert_eq!(stored[0].get("node"), Some(&Bson::Null), "{stored:?}");
    // Retried once: a second retry finds it queued.
    let r = post(&app, &format!("/tasks/{id}/retry"), json!({})).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
}
