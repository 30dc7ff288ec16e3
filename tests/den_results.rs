//! A DEN writing results against the real database server when writes fail: a result the
//! database refuses fails the task with the reason and frees the worker; a retried output
//! write leaves one file; the files of a refused result are deleted.

use crate::common;

use common::{count_tasks as count, insert_queue, insert_task, task_doc_of as task_doc, wait_for, Recording};

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use disbatch::config::Gfs;
use disbatch::den::{Den, DenSettings};
use disbatch::runner::Sandbox;
use disbatch::store::Store;
use futures::TryStreamExt;
use mongodb::Database;
use tokio_util::sync::CancellationToken;

fn settings(node: &str, gfs: Gfs) -> DenSettings {
    DenSettings {
        node: node.to_owned(),
        plugin_dir: common::plugins_dir(),
        plugins: vec!["demo".to_string()],
        active_queues: vec![],
        ignore_queues: vec![],
        gfs,
        heartbeat_stale: Duration::from_secs(30),
        orphan_claimed_after: Duration::from_secs(300),
        shutdown_grace: Duration::from_secs(10),
        stats_retention: disbatch::config::DEFAULT_STATS_RETENTION,
        retention: Default::default(),
        sandbox: Sandbox {
            timeout: Duration::from_secs(60),
            ..Sandbox::default()
        },
        tick: Duration::from_millis(200),
        max_instances: 8,
        protected: Vec::new(),
        balance: Default::default(),
    }
}

/// Runs a DEN until `done` holds, then stops it; returns the DEN to inspect.
async fn run_until<F, Fut>(store: Arc<dyn Store>, settings: DenSettings, what: &str, done: F) -> Arc<Den>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let den = Den::new(store, common::shared_runner(), settings);
    let shutdown = CancellationToken::new();
    let handle = tokio::spawn({
        let (den, shutdown) = (den.clone(), shutdown.clone());
        async move { den.run(shutdown).await.expect("DEN failed") }
    });
    wait_for(Duration::from_secs(30), what, done).await;
    wait_for(Duration::from_secs(10), "the workers to free their slots", || async {
        den.running() == 0
    })
    .await;
    shutdown.cancel();
    handle.await.unwrap();
    den
}

/// Installs `validator` on the `tasks` collection, as an operator would.
async fn validate_tasks(db: &Database, validator: Document) {
    db.run_command(doc! { "collMod": "tasks", "validator": validator })
        .await
        .expect("collMod with a validator");
}

async fn docs(db: &Database, coll: &str) -> Vec<Document> {
    db.collection::<Document>(coll)
        .find(doc! {})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_result_the_database_refuses_fails_the_task_with_the_reason() {
    let t = common::test_db("den_refused_result").await;
    // One slot: the second task runs only once the first worker has let its slot go.
    let q = insert_queue(&t.db, "refused", "demo", doc! {"threads": 1}).await;
    validate_tasks(
        &t.db,
        doc! { "$jsonSchema": { "properties": { "stdout": { "bsonType": ["null", "string"], "maxLength": 100 } } } },
    )
    .await;
    let refused = insert_task(&t.db, q, -2, doc! {"message": "y".repeat(200)}).await;
    let after = insert_task(&t.db, q, -2, doc! {"message": "fits"}).await;
    run_until(
        Arc::new(t.store.clone()),
        settings("node-refused", Gfs::Auto),
        "both tasks to end",
        || async { count(&t.db, doc! {"queue": q, "status": {"$gt": 0}}).await == 2 },
    )
    .await;
    let d = task_doc(&t.db, refused).await;
    assert_eq!(d.get_i32("status").unwrap(), 2, "{d}");
    assert_eq!(d.get_str("stdout").unwrap(), "", "{d}");
    let stderr = d.get_str("stderr").unwrap();
    assert!(stderr.contains("could not be stored"), "{stderr}");
    assert!(stderr.contains(&refused.to_hex()), "names the task: {stderr}");
    assert!(stderr.contains("write result"), "says what was refused: {stderr}");
    assert!(stderr.contains("retrying cannot help"), "{stderr}");
    let ok = task_doc(&t.db, after).await;
    assert_eq!(ok.get_i32("status").unwrap(), 1, "{ok}");
    assert_eq!(ok.get_str("stdout").unwrap(), "fits\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retried_output_write_leaves_one_file() {
    let t = common::test_db("den_retried_file").await;
    let q = insert_queue(&t.db, "files", "demo", doc! {}).await;
    let id = insert_task(&t.db, q, -2, doc! {"message": "to a file", "stderr": "also"}).await;
    let store = Recording::new(Arc::new(t.store.clone()));
    // The first file write applies but its reply is lost: the worker retries it.
    store.lost_file_replies.store(1, Ordering::SeqCst);
    run_until(
        store.clone(),
        settings("node-files", Gfs::Always),
        "the task to end",
        || async { count(&t.db, doc! {"_id": id, "status": {"$gt": 0}}).await == 1 },
    )
    .await;
    assert_eq!(store.lost_file_replies.load(Ordering::SeqCst), 0, "the fault fired");
    let d = task_doc(&t.db, id).await;
    assert_eq!(d.get_i32("status").unwrap(), 1, "{d}");
    let used: HashSet<ObjectId> = ["stdout", "stderr"]
        .iter()
        .map(|k| d.get_object_id(k).unwrap_or_else(|_| panic!("{k} is a file: {d}")))
        .collect();
    let files: HashSet<ObjectId> = docs(&t.db, "tasks.files")
        .await
        .iter()
        .map(|f| f.get_object_id("_id").unwrap())
        .collect();
    assert_eq!(files, used, "no file but the task's");
    let chunks = docs(&t.db, "tasks.chunks").await;
    assert_eq!(chunks.len(), 2, "one chunk per file: {chunks:?}");
    for c in &chunks {
        assert!(used.contains(&c.get_object_id("files_id").unwrap()), "orphan chunk {c}");
    }
    let task = t.store.task(id).await.unwrap().unwrap();
    let text = t.store.read_output(task.stdout.as_ref().unwrap()).await.unwrap();
    assert_eq!(text, "to a file\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_result_whose_reply_was_lost_keeps_its_files() {
    let t = common::test_db("den_lost_result").await;
    let q = insert_queue(&t.db, "files", "demo", doc! {}).await;
    let id = insert_task(&t.db, q, -2, doc! {"message": "kept", "stderr": "also kept"}).await;
    let store = Recording::new(Arc::new(t.store.clone()));
    // The result's write applies but its reply is lost: the retry finds the task ended.
    store.lost_finish_replies.store(1, Ordering::SeqCst);
    run_until(
        store.clone(),
        settings("node-lost-result", Gfs::Always),
        "the task to end",
        || async { count(&t.db, doc! {"_id": id, "status": {"$gt": 0}}).await == 1 },
    )
    .await;
    assert_eq!(store.lost_finish_replies.load(Ordering::SeqCst), 0, "the fault fired");
    let task = t.store.task(id).await.unwrap().unwrap();
    assert_eq!(task.status, 1);
    // The files the stored result points at are still there.
    let stdout = t.store.read_output(task.stdout.as_ref().unwrap()).await.unwrap();
    assert_eq!(stdout, "kept\n");
    let stderr = t.store.read_output(task.stderr.as_ref().unwrap()).await.unwrap();
    assert!(stderr.contains("also kept"), "{stderr}");
    assert_eq!(docs(&t.db, "tasks.files").await.len(), 2, "both files kept");
    // The run is counted as the success it is (the DEN flushed its counts at shutdown).
    let rows = t.store.read_stats(0, i64::MAX, Some(q)).await.unwrap();
    let succeeded: u64 = rows.iter().map(|r| r.counters.succeeded).sum();
    assert_eq!(succeeded, 1, "{rows:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_files_of_a_refused_result_are_deleted() {
    let t = common::test_db("den_refused_files").await;
    let q = insert_queue(&t.db, "inline-only", "demo", doc! {}).await;
    // The operators accept inline output only: a result pointing at files is refused.
    validate_tasks(
        &t.db,
        doc! { "$jsonSchema": { "properties": { "stdout": { "bsonType": ["null", "string"] } } } },
    )
    .await;
    let id = insert_task(&t.db, q, -2, doc! {"message": "to a file", "stderr": "also"}).await;
    run_until(
        Arc::new(t.store.clone()),
        settings("node-refused-files", Gfs::Always),
        "the task to end",
        || async { count(&t.db, doc! {"_id": id, "status": {"$gt": 0}}).await == 1 },
    )
    .await;
    let d = task_doc(&t.db, id).await;
    assert_eq!(d.get_i32("status").unwrap(), 2, "{d}");
    assert!(
        matches!(d.get("stderr"), Some(Bson::String(s)) if s.contains("could not be stored")),
        "{d}"
    );
    assert_eq!(
        docs(&t.db, "tasks.files").await,
        Vec::<Document>::new(),
        "no orphan file"
    );
    assert_eq!(
        docs(&t.db, "tasks.chunks").await,
        Vec::<Document>::new(),
        "no orphan chunk"
    );
}
