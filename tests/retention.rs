//! Retention seen from outside, on MongoDB and on the embedded store: a leading DEN deletes
//! a queue's succeeded tasks once past their retention, with their output files, keeps the
//! failed ones (no retention for them), and `GET /stats` tells the same history after as
//! before; the API refuses a bad `retention` naming the field and shows a queue's own.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::Router;
use bson::oid::ObjectId;
use disbatch::api::{router, ApiState};
use disbatch::config::Gfs;
use disbatch::den::{Den, DenSettings};
use disbatch::model::{status, Output};
use disbatch::runner::Sandbox;
use disbatch::store::mongo::MongoStore;
use disbatch::store::sqlite::SqliteStore;
use disbatch::store::Store;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use common::http::{assert_bad, get, post};
use common::wait_for;

fn settings(node: &str) -> DenSettings {
    DenSettings {
        node: node.to_owned(),
        plugin_dir: common::plugins_dir(),
        plugins: vec!["demo".to_string()],
        active_queues: vec![],
        ignore_queues: vec![],
        gfs: Gfs::Always,
        heartbeat_stale: Duration::from_secs(30),
        orphan_claimed_after: Duration::from_secs(300),
        shutdown_grace: Duration::from_secs(10),
        stats_retention: disbatch::config::DEFAULT_STATS_RETENTION,
        retention: Default::default(),
        sandbox: Sandbox {
            timeout: Duration::from_secs(60),
            ..Sandbox::default()
        },
        tick: Duration::from_millis(100),
        max_instances: 8,
        protected: Vec::new(),
        balance: Default::default(),
    }
}

fn id_of(v: &Value) -> String {
    v["id"]
        .as_str()
        .map(str::to_owned)
        .or_else(|| v["id"]["$oid"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no id in {v}"))
}

/// The runs `GET /stats` counts for `queue`: (succeeded, failed).
async fn stats_of(app: &Router, queue: &str) -> (u64, u64) {
    let r = get(app, &format!("/stats?since=2h&queue={queue}")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let s = &r.json()["series"][0]["summary"];
    (s["succeeded"].as_u64().unwrap_or(0), s["failed"].as_u64().unwrap_or(0))
}

async fn task_ids(app: &Router, queue: &str) -> Vec<(String, i64)> {
    let r = get(app, &format!("/tasks?queue={queue}&limit=1000")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let v = r.json();
    let list = v
        .as_array()
        .cloned()
        .or_else(|| v["tasks"].as_array().cloned())
        .unwrap_or_default();
    list.iter().map(|t| (id_of(t), t["status"].as_i64().unwrap())).collect()
}

async fn succeeded_tasks_go_and_stats_stay(store: Arc<dyn Store>) {
    let app = router(ApiState::new(store.clone(), vec!["demo".into()]));

    // A bad retention is refused naming the field; a good one is shown as stored.
    for (bad, field) in [
        (json!({"succeeded": "soon"}), "retention.succeeded"),
        (json!({"queued": "1d"}), "retention.queued"),
        (json!({"failed": 0}), "retention.failed"),
        (json!({"failed": -3}), "retention.failed"),
        (json!("7d"), "retention"),
    ] {
        let r = post(
            &app,
            "/queues",
            json!({"name": "bad", "plugin": "demo", "retention": bad}),
        )
        .await;
        assert_bad(&r, field);
    }
    let r = post(
        &app,
        "/queues",
        json!({"name": "kept", "plugin": "demo", "threads": 4, "retention": {"succeeded": "1s"}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let queue = id_of(&r.json());
    let r = get(&app, "/queues").await;
    let queues = r.json();
    let list = queues
        .as_array()
        .cloned()
        .or_else(|| queues["queues"].as_array().cloned())
        .unwrap();
    let kept = list.iter().find(|q| q["name"] == "kept").unwrap();
    assert_eq!(kept["retention"], json!({"succeeded": "1s"}), "{kept}");
    let r = post(
        &app,
        &format!("/queues/{queue}"),
        json!({"retention": {"cancelled": "1x"}}),
    )
    .await;
    assert_bad(&r, "retention.cancelled");

    let params: Vec<Value> = (0..4)
        .map(|i| json!({"message": format!("ok {i}")}))
        .chain([json!({"status": 2, "stderr": "bad"})])
        .collect();
    let r = post(&app, "/tasks", json!({"queue": "kept", "params": params})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let den = Den::new(store.clone(), common::shared_runner(), settings("node-r"));
    let stop = CancellationToken::new();
    let handle = tokio::spawn({
        let stop = stop.clone();
        async move { den.run(stop).await.expect("DEN failed") }
    });

    // The runs are counted while the tasks are there.
    wait_for(Duration::from_secs(60), "the five runs counted", || async {
        stats_of(&app, &queue).await == (4, 1)
    })
    .await;
    let before: Vec<(String, i64)> = task_ids(&app, &queue).await;
    let failed: Vec<String> = before
        .iter()
        .filter(|(_, s)| *s == i64::from(status::FAILED))
        .map(|(id, _)| id.clone())
        .collect();
    assert_eq!(failed.len(), 1);
    // Each output is a file (gfs: always) while the task is there.
    let mut files = Vec::new();
    for (id, _) in &before {
        let t = store.task(ObjectId::parse_str(id).unwrap()).await.unwrap();
        if let Some(t) = t {
            for out in [t.stdout, t.stderr].into_iter().flatten() {
                if let Output::File(f) = out {
                    files.push((id.clone(), f));
                }
            }
        }
    }
    assert!(!files.is_empty(), "outputs stored as files");

    wait_for(Duration::from_secs(30), "the succeeded tasks deleted", || async {
        task_ids(&app, &queue)
            .await
            .iter()
            .all(|(_, s)| *s != i64::from(status::SUCCEEDED))
    })
    .await;
    let after = task_ids(&app, &queue).await;
    assert_eq!(
        after.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>(),
        failed,
        "the failed task is kept"
    );
    for (id, f) in &files {
        let read = store.read_output(&Output::File(*f)).await;
        if failed.contains(id) {
            assert!(read.is_ok(), "the kept task's file is there");
        } else {
            assert!(read.is_err(), "the file {f} of deleted task {id} is gone");
            let r = get(&app, &format!("/tasks/{id}")).await;
            assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
        }
    }
    assert_eq!(stats_of(&app, &queue).await, (4, 1), "/stats tells the same history");
    stop.cancel();
    handle.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn succeeded_tasks_go_and_stats_stay_on_mongodb() {
    let t = common::test_db("retention_den").await;
    let store: Arc<dyn Store> = Arc::new(MongoStore::from_database(t.db.clone()));
    succeeded_tasks_go_and_stats_stay(store).await;
    // No GridFS document of a deleted task is left.
    let mut tasks = std::collections::HashSet::new();
    let mut cursor =
        t.db.collection::<bson::Document>("tasks")
            .find(bson::doc! {})
            .await
            .unwrap();
    while cursor.advance().await.unwrap() {
        tasks.insert(cursor.deserialize_current().unwrap().get_object_id("_id").unwrap());
    }
    let files = t.db.collection::<bson::Document>("tasks.files");
    let mut cursor = files.find(bson::doc! {}).await.unwrap();
    let mut file_ids = Vec::new();
    while cursor.advance().await.unwrap() {
        let d = cursor.deserialize_current().unwrap();
        let task = d.get_document("metadata").unwrap().get_object_id("task_id").unwrap();
        assert!(tasks.contains(&task), "a file of deleted task {task} is left");
        file_ids.push(d.get_object_id("_id").unwrap());
    }
    let chunks = t.db.collection::<bson::Document>("tasks.chunks");
    let orphans = chunks
        .count_documents(bson::doc! { "files_id": { "$nin": file_ids } })
        .await
        .unwrap();
    assert_eq!(orphans, 0, "no chunk of a deleted file is left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn succeeded_tasks_go_and_stats_stay_on_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&file).await.unwrap());
    succeeded_tasks_go_and_stats_stay(store).await;
    let conn = rusqlite::Connection::open(&file).unwrap();
    let orphans: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM output_files WHERE task NOT IN (SELECT id FROM tasks)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(orphans, 0, "no output file of a deleted task is left");
}

/// Runs a DEN on `store` until `done` holds (the leader's first file sweep comes within a
/// few ticks).
async fn with_a_den<F, Fut>(store: Arc<dyn Store>, what: &str, done: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let den = Den::new(store, common::shared_runner(), settings("node-f"));
    let stop = CancellationToken::new();
    let handle = tokio::spawn({
        let stop = stop.clone();
        async move { den.run(stop).await.expect("DEN failed") }
    });
    wait_for(Duration::from_secs(60), what, done).await;
    stop.cancel();
    handle.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_leader_deletes_old_files_no_task_uses_on_mongodb() {
    use bson::{doc, Document};
    let t = common::test_db("file_sweep_den").await;
    let store: Arc<dyn Store> = Arc::new(MongoStore::from_database(t.db.clone()));
    let two_hours_ago = bson::DateTime::from_millis(bson::DateTime::now().timestamp_millis() - 7_200_000);
    // Files the way Disbatch 4 writes them: the file document, then String chunks.
    let files = t.db.collection::<Document>("tasks.files");
    let chunks = t.db.collection::<Document>("tasks.chunks");
    let queue = store
        .create_queue(disbatch::store::NewQueue {
            name: "q".into(),
            plugin: "demo".into(),
            threads: Some(0),
            sort: Default::default(),
            extra: Document::new(),
        })
        .await
        .unwrap();
    let used_by = ObjectId::new();
    let (used, unused, foreign) = (ObjectId::new(), ObjectId::new(), ObjectId::new());
    for (file, task) in [(used, Some(used_by)), (unused, Some(ObjectId::new())), (foreign, None)] {
        let mut d = doc! { "_id": file, "filename": "stdout", "chunkSize": 261_120,
        "length": 5_i64, "uploadDate": two_hours_ago };
        if let Some(task) = task {
            d.insert("metadata", doc! { "task_id": task });
        }
        files.insert_one(d).await.unwrap();
        chunks
            .insert_one(doc! { "files_id": file, "n": 0, "data": "hello" })
            .await
            .unwrap();
    }
    // An ended task pointing at its file, written as a Perl tool writes it.
    t.db.collection::<Document>("tasks")
        .insert_one(
            doc! { "_id": used_by, "queue": queue.id, "status": "1", "node": "perl-den",
            "params": {}, "ctime": 1_700_000_000_i64, "mtime": 1_700_000_000_i64,
            "stdout": used, "stderr": "" },
        )
        .await
        .unwrap();
    let left = || async {
        let n = files.count_documents(doc! { "_id": unused }).await.unwrap();
        let c = chunks.count_documents(doc! { "files_id": unused }).await.unwrap();
        n + c == 0
    };
    with_a_den(store.clone(), "the unused file deleted", left).await;
    for kept in [used, foreign] {
        assert_eq!(
            files.count_documents(doc! { "_id": kept }).await.unwrap(),
            1,
            "{kept} kept"
        );
        assert_eq!(chunks.count_documents(doc! { "files_id": kept }).await.unwrap(), 1);
    }
    let task = store.task(used_by).await.unwrap().unwrap();
    assert_eq!(store.read_output(task.stdout.as_ref().unwrap()).await.unwrap(), "hello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_leader_deletes_old_files_no_task_uses_on_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&file).await.unwrap());
    let (old, fresh) = (ObjectId::new(), ObjectId::new());
    for f in [old, fresh] {
        store
            .put_output_file(f, ObjectId::new(), "stdout", "left")
            .await
            .unwrap();
    }
    let two_hours_ago = bson::DateTime::now().timestamp_millis() - 7_200_000;
    let conn = rusqlite::Connection::open(&file).unwrap();
    conn.execute(
        "UPDATE output_files SET upload_date = ?1 WHERE id = ?2",
        rusqlite::params![two_hours_ago, old.to_hex()],
    )
    .unwrap();
    let listed = || async {
        let ids: Vec<ObjectId> = store
            .output_files(None, 10)
            .await
            .unwrap()
            .iter()
            .map(|f| f.id)
            .collect();
        ids == vec![fresh]
    };
    with_a_den(store.clone(), "the old unused file deleted, the fresh one kept", listed).await;
}
