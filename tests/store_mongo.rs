//! MongoStore against a real MongoDB-wire server over TCP, each test on its own database:
//! spec documents written by any client, claiming, slots, heartbeats, orphan recovery,
//! fencing and String-chunk GridFS.

use crate::common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::oid::ObjectId;
use bson::spec::ElementType;
use bson::{doc, Bson, DateTime, Document};
use disbatch::model::{status, OnOrphan, Output, Queue, Sort};
use disbatch::store::mongo::{MongoOptions, MongoStore};
use disbatch::store::testing::StoreExt;
use disbatch::store::{NewQueue, OutputValue, Page, QueueState, QueueUpdate, Store, StoreError, TaskFilter};
use futures::TryStreamExt;
use mongodb::{Collection, Database};

use common::{test_db, TestDb};

const LEASE: Duration = Duration::from_secs(30);

fn tasks(db: &Database) -> Collection<Document> {
    db.collection("tasks")
}

fn ago(millis: i64) -> DateTime {
    DateTime::from_millis(DateTime::now().timestamp_millis() - millis)
}

/// Inserts a queue document the way any Disbatch 4 client writes it.
async fn insert_queue(db: &Database, name: &str, threads: Bson, sort: &str, extra: Document) -> ObjectId {
    let id = ObjectId::new();
    let mut d = doc! { "_id": id, "name": name, "plugin": "demo", "threads": threads, "sort": sort };
    d.extend(extra);
    db.collection::<Document>("queues").insert_one(d).await.unwrap();
    id
}

async fn queue(store: &MongoStore, id: ObjectId) -> Queue {
    store
        .queues()
        .await
        .unwrap()
        .into_iter()
        .find(|q| q.id == id)
        .expect("queue listed")
}

/// A task document exactly as the spec describes a new one.
fn spec_task(queue: ObjectId, params: Document) -> Document {
    let now = DateTime::now();
    doc! {
        "_id": ObjectId::new(), "queue": queue, "ctime": now, "mtime": now, "node": null,
        "status": -2, "params": params, "stdout": null, "stderr": null,
    }
}

/// A task document in any state, for recovery tests.
fn task_in(queue: ObjectId, node: Option<&str>, status: i32, mtime: DateTime) -> Document {
    doc! {
        "_id": ObjectId::new(), "queue": queue, "ctime": mtime, "mtime": mtime,
        "node": node.map_or(Bson::Null, |n| Bson::String(n.to_string())),
        "status": status, "params": {}, "stdout": null, "stderr": null,
    }
}

async fn insert_tasks(db: &Database, docs: Vec<Document>) -> Vec<ObjectId> {
    let ids = docs.iter().map(|d| d.get_object_id("_id").unwrap()).collect();
    tasks(db).insert_many(docs).await.unwrap();
    ids
}

async fn raw(db: &Database, id: ObjectId) -> Document {
    tasks(db)
        .find_one(doc! { "_id": id })
        .await
        .unwrap()
        .expect("task exists")
}

fn kind(d: &Document, field: &str) -> ElementType {
    d.get(field)
        .unwrap_or_else(|| panic!("field {field} missing in {d}"))
        .element_type()
}

/// A node document as this implementation writes it (`process` null once its DEN
/// stopped; a document without `process` is a Disbatch 4 DEN's, see `tests/disbatch4.rs`).
async fn insert_node(db: &Database, node: &str, timestamp: DateTime) {
    db.collection::<Document>("nodes")
        .insert_one(doc! { "node": node, "timestamp": timestamp, "maxthreads": null, "process": null })
        .await
        .unwrap();
}

#[tokio::test]
async fn spec_documents_are_claimed_and_finished_field_by_field() {
    let t = test_db("spec_fields").await;
    let q = insert_queue(&t.db, "spec", Bson::Int32(2), "fifo", doc! {}).await;
    let task = spec_task(q, doc! { "user": "ashley@example.com", "n": 7 });
    let id = task.get_object_id("_id").unwrap();
    let ctime = task.get_datetime("ctime").unwrap().to_owned();
    tasks(&t.db).insert_one(task).await.unwrap();

    let queue = queue(&t.store, q).await;
    assert_eq!(
        (queue.name.as_str(), queue.plugin.as_str(), queue.threads),
        ("spec", "demo", Some(2))
    );
    assert_eq!(queue.sort, Sort::Fifo);
    assert!(t.store.has_queued(q).await.unwrap());

    let before = DateTime::now();
    let claimed = t.store.claim(&queue, "den-1").await.unwrap().expect("claims the task");
    assert_eq!(claimed.id, id);
    assert_eq!(claimed.queue, q);
    assert_eq!(claimed.status, status::CLAIMED);
    assert_eq!(claimed.node.as_deref(), Some("den-1"));
    assert_eq!(claimed.params, doc! { "user": "ashley@example.com", "n": 7 });
    assert_eq!(claimed.ctime, ctime);
    assert!(claimed.mtime >= before);
    assert_eq!((claimed.stdout.clone(), claimed.stderr.clone()), (None, None));
    assert!(!t.store.has_queued(q).await.unwrap());

    let d = raw(&t.db, id).await;
    assert_eq!(kind(&d, "queue"), ElementType::ObjectId);
    assert_eq!(kind(&d, "ctime"), ElementType::DateTime);
    assert_eq!(kind(&d, "mtime"), ElementType::DateTime);
    assert_eq!(kind(&d, "node"), ElementType::String);
    assert_eq!(d.get("status"), Some(&Bson::Int32(-1)));
    assert_eq!(kind(&d, "stdout"), ElementType::Null);
    assert_eq!(kind(&d, "stderr"), ElementType::Null);

    assert!(disbatch::lifecycle::run::start(&t.store, id, "den-1").await.unwrap());
    assert_eq!(raw(&t.db, id).await.get("status"), Some(&Bson::Int32(0)));
    assert!(
        disbatch::lifecycle::run::start(&t.store, id, "den-1").await.unwrap(),
        "a retried start of a task already running here succeeds"
    );

    let file = t
        .store
        .write_output_file(id, "stderr", "warning: é€😀\n")
        .await
        .unwrap();
    let finished = disbatch::lifecycle::run::finish(
        &t.store,
        id,
        "den-1",
        status::SUCCEEDED,
        OutputValue::Inline("done\n".into()),
        OutputValue::File(file),
    )
    .await
    .unwrap();
    assert!(finished);
    let d = raw(&t.db, id).await;
    assert_eq!(d.get("status"), Some(&Bson::Int32(1)));
    assert_eq!(d.get("node"), Some(&Bson::String("den-1".into())));
    assert_eq!(d.get("stdout"), Some(&Bson::String("done\n".into())));
    assert_eq!(d.get("stderr"), Some(&Bson::ObjectId(file)));
    assert_eq!(kind(&d, "mtime"), ElementType::DateTime);
    assert_eq!(d.get_datetime("ctime").unwrap(), &ctime);

    let task = t.store.task(id).await.unwrap().unwrap();
    assert_eq!(task.stdout, Some(Output::Inline("done\n".into())));
    assert_eq!(task.stderr, Some(Output::File(file)));
    assert_eq!(
        t.store.read_output(&Output::File(file)).await.unwrap(),
        "warning: é€😀\n"
    );
}

#[tokio::test]
async fn created_tasks_are_spec_documents() {
    let t = test_db("create_tasks").await;
    let q = insert_queue(&t.db, "q", Bson::Int32(1), "fifo", doc! {}).await;
    let ids = t
        .store
        .create_tasks(q, vec![doc! { "a": 1 }, doc! { "a": 2 }])
        .await
        .unwrap();
    assert_eq!(ids.len(), 2);
    assert!(t.store.create_tasks(q, vec![]).await.unwrap().is_empty());
    for (i, id) in ids.iter().enumerate() {
        let d = raw(&t.db, *id).await;
        assert_eq!(d.get("queue"), Some(&Bson::ObjectId(q)));
        assert_eq!(kind(&d, "ctime"), ElementType::DateTime);
        assert_eq!(d.get("ctime"), d.get("mtime"));
        assert_eq!(d.get("node"), Some(&Bson::Null));
        assert_eq!(d.get("status"), Some(&Bson::Int32(-2)));
        assert_eq!(d.get_document("params").unwrap(), &doc! { "a": i as i32 + 1 });
        assert_eq!(d.get("stdout"), Some(&Bson::Null));
        assert_eq!(d.get("stderr"), Some(&Bson::Null));
    }
}

#[tokio::test]
async fn numbers_written_by_other_clients_are_read_leniently() {
    let t = test_db("lenient").await;
    let q = insert_queue(&t.db, "wide", Bson::Double(4.0), "lifo", doc! {}).await;
    let mut task = spec_task(q, doc! {});
    task.insert("status", Bson::Int64(-2));
    let id = task.get_object_id("_id").unwrap();
    tasks(&t.db).insert_one(task).await.unwrap();
    let queue = queue(&t.store, q).await;
    assert_eq!(queue.threads, Some(4));
    let claimed = t
        .store
        .claim(&queue, "n")
        .await
        .unwrap()
        .expect("Int64 status -2 is claimable");
    assert_eq!(claimed.id, id);

    let nodes = t.db.collection::<Document>("nodes");
    nodes
        .insert_one(doc! { "node": "old", "timestamp": DateTime::now(), "maxthreads": Bson::Int64(3) })
        .await
        .unwrap();
    let listed = t.store.nodes().await.unwrap();
    assert_eq!(listed.iter().find(|n| n.node == "old").unwrap().maxthreads, Some(3));

    let mut bad = spec_task(q, doc! {});
    bad.insert("status", "queued");
    let bad_id = bad.get_object_id("_id").unwrap();
    tasks(&t.db).insert_one(bad).await.unwrap();
    // An unreadable task is shown with its problem, never hidden.
    let shown = t.store.task(bad_id).await.unwrap().expect("the task is listed");
    let problem = shown.problem.expect("its problem is named");
    assert!(problem.contains(&bad_id.to_hex()), "{problem}");
    assert!(problem.contains("`status`"), "{problem}");
}

#[tokio::test]
async fn fifo_lifo_and_default_order() {
    let t = test_db("order").await;
    for (sort, name) in [("fifo", "f"), ("lifo", "l"), ("default", "d")] {
        let q = insert_queue(&t.db, name, Bson::Int32(1), sort, doc! {}).await;
        let ids = insert_tasks(&t.db, (0..5).map(|i| spec_task(q, doc! { "i": i })).collect()).await;
        let queue = queue(&t.store, q).await;
        let mut claimed = Vec::new();
        while let Some(task) = t.store.claim(&queue, "n").await.unwrap() {
            claimed.push(task.id);
        }
        match sort {
            "fifo" => assert_eq!(claimed, ids),
            "lifo" => assert_eq!(claimed, ids.iter().rev().copied().collect::<Vec<_>>()),
            _ => assert_eq!(
                claimed.iter().collect::<HashSet<_>>(),
                ids.iter().collect::<HashSet<_>>()
            ),
        }
    }
}

#[tokio::test]
async fn statuses_other_than_queued_are_never_claimed() {
    let t = test_db("held").await;
    let q = insert_queue(&t.db, "held", Bson::Int32(5), "fifo", doc! {}).await;
    let other = insert_queue(&t.db, "other", Bson::Int32(5), "fifo", doc! {}).await;
    let mut docs: Vec<Document> = [-6, -5, -4, -3, -7, -1, 0, 1, 2]
        .iter()
        .map(|s| task_in(q, None, *s, DateTime::now()))
        .collect();
    docs.push(task_in(q, Some("someone"), -2, DateTime::now()));
    docs.push(spec_task(other, doc! {}));
    insert_tasks(&t.db, docs).await;
    let queue = queue(&t.store, q).await;
    assert!(!t.store.has_queued(q).await.unwrap());
    assert_eq!(t.store.claim(&queue, "n").await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claimers_get_every_task_exactly_once() {
    let t = test_db("concurrent_claims").await;
    let q = insert_queue(&t.db, "busy", Bson::Int32(8), "fifo", doc! {}).await;
    let params: Vec<Document> = (0..500).map(|i| doc! { "i": i }).collect();
    let created = t.store.create_tasks(q, params).await.unwrap();
    let queue = queue(&t.store, q).await;

    let mut claimers = Vec::new();
    for c in 0..8 {
        // Each claimer is its own DEN with its own connection pool.
        let store = MongoStore::connect(&t.uri, &t.name, MongoOptions::default())
            .await
            .unwrap();
        let queue = queue.clone();
        claimers.push(tokio::spawn(async move {
            let node = format!("den-{c}");
            let mut got = Vec::new();
            while let Some(task) = store.claim(&queue, &node).await.unwrap() {
                assert_eq!(task.node.as_deref(), Some(node.as_str()));
                got.push(task.id);
            }
            got
        }));
    }
    let mut all = Vec::new();
    for c in claimers {
        all.extend(c.await.unwrap());
    }
    let unique: HashSet<_> = all.iter().collect();
    assert_eq!(all.len(), 500, "claimed {} tasks", all.len());
    assert_eq!(unique.len(), 500, "a task was claimed twice");
    assert_eq!(unique, created.iter().collect());
    let claimed = TaskFilter {
        queue: Some(q),
        status: Some(vec![status::CLAIMED]),
        ..Default::default()
    };
    assert_eq!(t.store.count_tasks(&claimed).await.unwrap(), 500);
}

async fn held_slots(db: &Database, q: ObjectId) -> u64 {
    db.collection::<Document>("slots")
        .count_documents(doc! { "queue": q, "holder": { "$ne": null }, "expires": { "$gt": DateTime::now() } })
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slots_hold_threads_across_nodes() {
    let t = test_db("slots_limit").await;
    let q = insert_queue(&t.db, "limited", Bson::Int32(3), "fifo", doc! {}).await;
    let queue = Arc::new(queue(&t.store, q).await);
    let in_use = Arc::new(AtomicUsize::new(0));
    let max_seen = Arc::new(AtomicUsize::new(0));
    let acquired = Arc::new(AtomicUsize::new(0));

    let mut workers = Vec::new();
    for node in ["den-a", "den-b"] {
        let store = Arc::new(
            MongoStore::connect(&t.uri, &t.name, MongoOptions::default())
                .await
                .unwrap(),
        );
        for _ in 0..4 {
            let (store, queue) = (store.clone(), queue.clone());
            let (in_use, max_seen, acquired) = (in_use.clone(), max_seen.clone(), acquired.clone());
            workers.push(tokio::spawn(async move {
                for _ in 0..15 {
                    if let Some(slot) = disbatch::lifecycle::slots::acquire_slot(&*store, &queue, node, LEASE)
                        .await
                        .unwrap()
                    {
                        assert!(slot.n >= 0 && slot.n < 3, "slot {slot:?}");
                        let now = in_use.fetch_add(1, Ordering::SeqCst) + 1;
                        max_seen.fetch_max(now, Ordering::SeqCst);
                        acquired.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        in_use.fetch_sub(1, Ordering::SeqCst);
                        disbatch::lifecycle::slots::release_slot(&*store, &slot, node)
                            .await
                            .unwrap();
                    } else {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                }
            }));
        }
    }
    for w in workers {
        w.await.unwrap();
    }
    assert!(max_seen.load(Ordering::SeqCst) <= 3, "more than 3 slots held at once");
    assert!(acquired.load(Ordering::SeqCst) >= 3, "slots were hardly ever acquired");
    assert_eq!(held_slots(&t.db, q).await, 0);

    // All three taken: a fourth acquirer gets nothing, until one is released.
    let mut held = Vec::new();
    for node in ["den-a", "den-b", "den-a"] {
        held.push(
            disbatch::lifecycle::slots::acquire_slot(&t.store, &queue, node, LEASE)
                .await
                .unwrap()
                .expect("a free slot"),
        );
    }
    assert_eq!(held_slots(&t.db, q).await, 3);
    assert_eq!(
        disbatch::lifecycle::slots::acquire_slot(&t.store, &queue, "den-b", LEASE)
            .await
            .unwrap(),
        None
    );
    disbatch::lifecycle::slots::release_slot(&t.store, &held[0], "den-b")
        .await
        .unwrap(); // not the holder: no effect
    assert_eq!(
        disbatch::lifecycle::slots::acquire_slot(&t.store, &queue, "den-b", LEASE)
            .await
            .unwrap(),
        None
    );
    disbatch::lifecycle::slots::release_slot(&t.store, &held[0], "den-a")
        .await
        .unwrap();
    let again = disbatch::lifecycle::slots::acquire_slot(&t.store, &queue, "den-b", LEASE)
        .await
        .unwrap()
        .expect("released slot is free");
    assert_eq!(again.n, held[0].n);

    let paused = Queue {
        threads: Some(0),
        ..(*queue).clone()
    };
    assert_eq!(
        disbatch::lifecycle::slots::acquire_slot(&t.store, &paused, "den-a", LEASE)
            .await
            .unwrap(),
        None
    );
    let unlimited = Queue {
        threads: None,
        ..(*queue).clone()
    };
    assert_eq!(
        disbatch::lifecycle::slots::acquire_slot(&t.store, &unlimited, "den-a", LEASE)
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn expired_slots_are_free_and_heartbeats_renew_them() {
    let t = test_db("slots_expiry").await;
    let q = insert_queue(&t.db, "short", Bson::Int32(1), "fifo", doc! {}).await;
    let queue = queue(&t.store, q).await;
    let short = Duration::from_millis(400);

    disbatch::lifecycle::slots::acquire_slot(&t.store, &queue, "dying", short)
        .await
        .unwrap()
        .expect("free");
    assert_eq!(
        disbatch::lifecycle::slots::acquire_slot(&t.store, &queue, "other", LEASE)
            .await
            .unwrap(),
        None
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    let taken = disbatch::lifecycle::slots::acquire_slot(&t.store, &queue, "other", short)
        .await
        .unwrap()
        .expect("expired lease is free");
    assert_eq!(taken.n, 0);

    // The holder's heartbeat extends its lease.
    t.store.heartbeat("other", LEASE).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        disbatch::lifecycle::slots::acquire_slot(&t.store, &queue, "dying", LEASE)
            .await
            .unwrap(),
        None
    );
    // The former holder cannot release it.
    disbatch::lifecycle::slots::release_slot(&t.store, &taken, "dying")
        .await
        .unwrap();
    assert_eq!(held_slots(&t.db, q).await, 1);
}

#[tokio::test]
async fn lowering_threads_blocks_while_higher_slots_are_held() {
    let t = test_db("slots_lowered").await;
    let q = insert_queue(&t.db, "shrinking", Bson::Int32(3), "fifo", doc! {}).await;
    let three = queue(&t.store, q).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(
            disbatch::lifecycle::slots::acquire_slot(&t.store, &three, "den", LEASE)
                .await
                .unwrap()
                .expect("free"),
        );
    }
    held.sort_by_key(|s| s.n);
    assert_eq!(held.iter().map(|s| s.n).collect::<Vec<_>>(), vec![0, 1, 2]);

    let updated = t
        .store
        .update_queue(
            q,
            QueueUpdate {
                threads: Some(Some(2)),
                ..Default::default()
            },
        )
        .await;
    let two = updated.unwrap().and_then(QueueState::readable).expect("queue exists");
    assert_eq!(two.threads, Some(2));
    disbatch::lifecycle::slots::release_slot(&t.store, &held[0], "den")
        .await
        .unwrap();
    assert_eq!(
        disbatch::lifecycle::slots::acquire_slot(&t.store, &two, "den", LEASE)
            .await
            .unwrap(),
        None,
        "slot 2 is still held: the queue is over its new limit"
    );
    disbatch::lifecycle::slots::release_slot(&t.store, &held[2], "den")
        .await
        .unwrap();
    let slot = disbatch::lifecycle::slots::acquire_slot(&t.store, &two, "den", LEASE)
        .await
        .unwrap()
        .expect("under the limit again");
    assert_eq!(slot.n, 0);
    assert_eq!(
        disbatch::lifecycle::slots::acquire_slot(&t.store, &two, "den", LEASE)
            .await
            .unwrap(),
        None,
        "slots 0 and 1 are held"
    );
}

#[tokio::test]
async fn heartbeat_upserts_and_preserves_maxthreads() {
    let t = test_db("heartbeat").await;
    let first = t.store.heartbeat("den-1", LEASE).await.unwrap();
    assert_eq!((first.node.as_str(), first.maxthreads), ("den-1", None));
    let nodes = t.db.collection::<Document>("nodes");
    let d = nodes.find_one(doc! { "node": "den-1" }).await.unwrap().unwrap();
    assert_eq!(kind(&d, "_id"), ElementType::ObjectId);
    assert_eq!(kind(&d, "timestamp"), ElementType::DateTime);
    assert_eq!(d.get("maxthreads"), Some(&Bson::Null));

    // An operator sets maxthreads directly, the way another DCI would.
    nodes
        .update_one(doc! { "node": "den-1" }, doc! { "$set": { "maxthreads": 5 } })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let second = t.store.heartbeat("den-1", LEASE).await.unwrap();
    assert_eq!(second.id, first.id);
    assert_eq!(second.maxthreads, Some(5));
    assert!(second.timestamp > first.timestamp);

    assert!(disbatch::lifecycle::nodes::set_maxthreads(&t.store, "den-1", Some(2))
        .await
        .unwrap());
    assert_eq!(t.store.heartbeat("den-1", LEASE).await.unwrap().maxthreads, Some(2));
    assert!(disbatch::lifecycle::nodes::set_maxthreads(&t.store, "den-1", None)
        .await
        .unwrap());
    assert_eq!(t.store.heartbeat("den-1", LEASE).await.unwrap().maxthreads, None);
    assert!(!disbatch::lifecycle::nodes::set_maxthreads(&t.store, "nobody", Some(1))
        .await
        .unwrap());
    assert!(matches!(
        disbatch::lifecycle::nodes::set_maxthreads(&t.store, "den-1", Some(-1)).await,
        Err(StoreError::Invalid(_))
    ));

    t.store.heartbeat("den-2", LEASE).await.unwrap();
    let names: Vec<String> = t.store.nodes().await.unwrap().into_iter().map(|n| n.node).collect();
    assert_eq!(names, vec!["den-1", "den-2"]);
    assert_eq!(nodes.count_documents(doc! {}).await.unwrap(), 2);
}

#[tokio::test]
async fn stale_nodes_tasks_are_recovered_and_fresh_nodes_left_alone() {
    let t = test_db("recover_stale").await;
    let orphaning = insert_queue(&t.db, "orphaning", Bson::Int32(5), "fifo", doc! {}).await;
    let requeueing = insert_queue(
        &t.db,
        "requeueing",
        Bson::Int32(5),
        "fifo",
        doc! { "on_orphan": "requeue" },
    )
    .await;
    let deleted_queue = ObjectId::new();
    insert_node(&t.db, "dead", ago(120_000)).await;
    insert_node(&t.db, "alive", DateTime::now()).await;
    let minute_ago = ago(60_000);

    let dead_claimed = insert_tasks(&t.db, vec![task_in(orphaning, Some("dead"), -1, minute_ago)]).await[0];
    let dead_running = insert_tasks(&t.db, vec![task_in(orphaning, Some("dead"), 0, minute_ago)]).await[0];
    let dead_claimed_rq = insert_tasks(&t.db, vec![task_in(requeueing, Some("dead"), -1, minute_ago)]).await[0];
    let dead_running_rq = insert_tasks(&t.db, vec![task_in(requeueing, Some("dead"), 0, minute_ago)]).await[0];
    let dead_finished = insert_tasks(&t.db, vec![task_in(orphaning, Some("dead"), 1, minute_ago)]).await[0];
    let ghost_running = insert_tasks(&t.db, vec![task_in(orphaning, Some("ghost"), 0, minute_ago)]).await[0];
    let lost_queue = insert_tasks(&t.db, vec![task_in(deleted_queue, Some("dead"), 0, minute_ago)]).await[0];
    let alive_claimed = insert_tasks(&t.db, vec![task_in(orphaning, Some("alive"), -1, minute_ago)]).await[0];
    let alive_running = insert_tasks(&t.db, vec![task_in(requeueing, Some("alive"), 0, ago(3_600_000))]).await[0];
    let queued = insert_tasks(&t.db, vec![task_in(orphaning, None, -2, minute_ago)]).await[0];

    // Slots held by both nodes.
    let q = queue(&t.store, orphaning).await;
    // The dead node's lease has run out (a stale node's slot is freed once it has).
    let short = Duration::from_millis(50);
    let dead_slot = disbatch::lifecycle::slots::acquire_slot(&t.store, &q, "dead", short)
        .await
        .unwrap()
        .unwrap();
    let alive_slot = disbatch::lifecycle::slots::acquire_slot(&t.store, &q, "alive", LEASE)
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(short * 2).await;

    let recovery = disbatch::lifecycle::recovery::recover_orphans(&t.store, ago(300_000), ago(30_000))
        .await
        .unwrap();
    let orphaned: HashSet<_> = recovery.orphaned.iter().copied().collect();
    let requeued: HashSet<_> = recovery.requeued.iter().copied().collect();
    assert_eq!(
        orphaned,
        HashSet::from([dead_claimed, dead_running, ghost_running, lost_queue])
    );
    assert_eq!(requeued, HashSet::from([dead_claimed_rq, dead_running_rq]));

    for id in [dead_claimed, dead_running, ghost_running, lost_queue] {
        let d = raw(&t.db, id).await;
        assert_eq!(d.get("status"), Some(&Bson::Int32(-6)), "{d}");
        assert!(d.get_datetime("mtime").unwrap() > &minute_ago);
    }
    for id in [dead_claimed_rq, dead_running_rq] {
        let d = raw(&t.db, id).await;
        assert_eq!(d.get("status"), Some(&Bson::Int32(-2)), "{d}");
        assert_eq!(d.get("node"), Some(&Bson::Null));
    }
    assert_eq!(raw(&t.db, dead_finished).await.get("status"), Some(&Bson::Int32(1)));
    assert_eq!(raw(&t.db, alive_claimed).await.get("status"), Some(&Bson::Int32(-1)));
    assert_eq!(raw(&t.db, alive_running).await.get("status"), Some(&Bson::Int32(0)));
    assert_eq!(raw(&t.db, queued).await.get("status"), Some(&Bson::Int32(-2)));

    // The dead node's slot is free again; the live node's is not.
    let slots = t.db.collection::<Document>("slots");
    let holder = |n: i64| {
        let slots = slots.clone();
        async move {
            slots
                .find_one(doc! { "queue": orphaning, "n": n })
                .await
                .unwrap()
                .unwrap()
                .get("holder")
                .cloned()
        }
    };
    assert_eq!(holder(dead_slot.n).await, Some(Bson::Null));
    assert_eq!(holder(alive_slot.n).await, Some(Bson::String("alive".into())));

    // A second sweep finds nothing more; requeued tasks can be claimed again.
    let again = disbatch::lifecycle::recovery::recover_orphans(&t.store, ago(300_000), ago(30_000))
        .await
        .unwrap();
    assert!(again.orphaned.is_empty() && again.requeued.is_empty(), "{again:?}");
    let rq = queue(&t.store, requeueing).await;
    assert_eq!(
        t.store.claim(&rq, "alive").await.unwrap().map(|t| t.id),
        Some(dead_claimed_rq)
    );
}

#[tokio::test]
async fn spec_sweep_orphans_old_claimed_tasks_of_any_node() {
    let t = test_db("recover_sweep").await;
    let q = insert_queue(&t.db, "q", Bson::Int32(5), "fifo", doc! {}).await;
    insert_node(&t.db, "alive", DateTime::now()).await;
    let old_claim = insert_tasks(&t.db, vec![task_in(q, Some("alive"), -1, ago(600_000))]).await[0];
    let new_claim = insert_tasks(&t.db, vec![task_in(q, Some("alive"), -1, ago(60_000))]).await[0];
    let long_run = insert_tasks(&t.db, vec![task_in(q, Some("alive"), 0, ago(600_000))]).await[0];

    let recovery = disbatch::lifecycle::recovery::recover_orphans(&t.store, ago(300_000), ago(30_000))
        .await
        .unwrap();
    assert_eq!(recovery.orphaned, vec![old_claim]);
    assert!(recovery.requeued.is_empty());
    assert_eq!(raw(&t.db, old_claim).await.get("status"), Some(&Bson::Int32(-6)));
    assert_eq!(raw(&t.db, new_claim).await.get("status"), Some(&Bson::Int32(-1)));
    assert_eq!(raw(&t.db, long_run).await.get("status"), Some(&Bson::Int32(0)));
}

#[tokio::test]
async fn start_and_finish_are_fenced_against_recovery() {
    let t = test_db("fenced").await;
    let q = insert_queue(&t.db, "q", Bson::Int32(5), "fifo", doc! {}).await;
    let queue = queue(&t.store, q).await;
    t.store.create_tasks(q, vec![doc! {}, doc! {}]).await.unwrap();
    t.store.heartbeat("den", LEASE).await.unwrap();

    // Claimed, then the node is declared dead before it starts the task.
    let first = t.store.claim(&queue, "den").await.unwrap().unwrap();
    // Running, then recovered while it runs.
    let second = t.store.claim(&queue, "den").await.unwrap().unwrap();
    assert!(disbatch::lifecycle::run::start(&t.store, second.id, "den")
        .await
        .unwrap());

    let nodes = t.db.collection::<Document>("nodes");
    let last_beat = ago(120_000);
    nodes
        // A DEN of ours that stopped heartbeating leaves `beat` equal to `timestamp`; a
        // `timestamp` moved alone would read as a Disbatch 4 DEN's heartbeat.
        .update_one(
            doc! { "node": "den" },
            doc! { "$set": { "timestamp": last_beat, "beat": last_beat } },
        )
        .await
        .unwrap();
    tasks(&t.db)
        .update_many(doc! { "queue": q }, doc! { "$set": { "mtime": ago(60_000) } })
        .await
        .unwrap();
    let recovery = disbatch::lifecycle::recovery::recover_orphans(&t.store, ago(300_000), ago(30_000))
        .await
        .unwrap();
    assert_eq!(recovery.orphaned.len(), 2);

    assert!(!disbatch::lifecycle::run::start(&t.store, first.id, "den")
        .await
        .unwrap());
    let file = t.store.write_output_file(second.id, "stdout", "late").await.unwrap();
    let written = disbatch::lifecycle::run::finish(
        &t.store,
        second.id,
        "den",
        status::SUCCEEDED,
        OutputValue::File(file),
        OutputValue::Inline(String::new()),
    )
    .await
    .unwrap();
    assert!(!written, "finish of a recovered task must not write");
    let d = raw(&t.db, second.id).await;
    assert_eq!(d.get("status"), Some(&Bson::Int32(-6)));
    assert_eq!(d.get("stdout"), Some(&Bson::Null));
    assert_eq!(d.get("stderr"), Some(&Bson::Null));

    // Another node cannot finish our task either.
    let third = t.store.create_tasks(q, vec![doc! {}]).await.unwrap()[0];
    let claimed = t.store.claim(&queue, "den").await.unwrap().unwrap();
    assert_eq!(claimed.id, third);
    assert!(disbatch::lifecycle::run::start(&t.store, third, "den").await.unwrap());
    let other = disbatch::lifecycle::run::finish(
        &t.store,
        third,
        "intruder",
        1,
        OutputValue::Inline("x".into()),
        OutputValue::Inline("".into()),
    );
    assert!(!other.await.unwrap());
}

#[tokio::test]
async fn requeue_own_puts_back_only_our_unfinished_tasks() {
    let t = test_db("requeue_own").await;
    let q = insert_queue(&t.db, "q", Bson::Int32(5), "fifo", doc! {}).await;
    let queue = queue(&t.store, q).await;
    t.store.create_tasks(q, vec![doc! {}, doc! {}, doc! {}]).await.unwrap();
    let a = t.store.claim(&queue, "den").await.unwrap().unwrap().id;
    let b = t.store.claim(&queue, "den").await.unwrap().unwrap().id;
    let c = t.store.claim(&queue, "other").await.unwrap().unwrap().id;
    assert!(disbatch::lifecycle::run::start(&t.store, b, "den").await.unwrap());
    let requeued = disbatch::lifecycle::run::requeue_own(&t.store, "den", &[a, b, c])
        .await
        .unwrap();
    assert_eq!(requeued, vec![a, b]);
    for id in [a, b] {
        let d = raw(&t.db, id).await;
        assert_eq!(
            (d.get("status"), d.get("node")),
            (Some(&Bson::Int32(-2)), Some(&Bson::Null))
        );
    }
    assert_eq!(raw(&t.db, c).await.get("status"), Some(&Bson::Int32(-1)));
}

#[tokio::test]
async fn gridfs_round_trip_of_20_mb_multibyte_text() {
    let t = test_db("gridfs_20mb").await;
    let task = ObjectId::new();
    let unit = "line of ASCII text é€😀 and more\n";
    let text = unit.repeat(20 * 1024 * 1024 / unit.len() + 1);
    assert!(text.len() >= 20 * 1024 * 1024);

    let before = DateTime::now();
    let file = t.store.write_output_file(task, "stdout", &text).await.unwrap();
    let files = t.db.collection::<Document>("tasks.files");
    let f = files
        .find_one(doc! { "_id": file })
        .await
        .unwrap()
        .expect("files document");
    assert_eq!(f.get("filename"), Some(&Bson::String("stdout".into())));
    assert_eq!(f.get_document("metadata").unwrap(), &doc! { "task_id": task });
    assert_eq!(f.get("chunkSize"), Some(&Bson::Int32(261_120)));
    assert_eq!(f.get("length"), Some(&Bson::Int64(text.len() as i64)));
    assert!(f.get_datetime("uploadDate").unwrap() >= &before);

    let chunks: Vec<Document> =
        t.db.collection::<Document>("tasks.chunks")
            .find(doc! { "files_id": file })
            .sort(doc! { "n": 1 })
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
    assert!(chunks.len() >= text.len() / 261_120);
    let mut joined = String::with_capacity(text.len());
    for (i, c) in chunks.iter().enumerate() {
        assert_eq!(c.get("n"), Some(&Bson::Int32(i as i32)));
        match c.get("data") {
            Some(Bson::String(s)) => {
                assert!(s.len() <= 261_120, "chunk {i} has {} bytes", s.len());
                joined.push_str(s);
            }
            other => panic!("chunk {i} data is {:?}, not a String", other.map(Bson::element_type)),
        }
    }
    assert!(joined == text, "chunks do not concatenate to the text");
    let back = t.store.read_output(&Output::File(file)).await.unwrap();
    assert_eq!(back.len(), text.len());
    assert!(back == text, "read back differs");
}

#[tokio::test]
async fn gridfs_reads_binary_chunks_and_rejects_damaged_files() {
    let t = test_db("gridfs_checks").await;
    let files = t.db.collection::<Document>("tasks.files");
    let chunks = t.db.collection::<Document>("tasks.chunks");

    // A file written by a tool that stores Binary chunks, cut inside a character.
    let bytes = "aé€😀b".as_bytes();
    let binary = ObjectId::new();
    files
        .insert_one(
            doc! { "_id": binary, "filename": "stdout", "chunkSize": 4, "length": bytes.len() as i32,
            "uploadDate": DateTime::now(), "metadata": { "task_id": ObjectId::new() } },
        )
        .await
        .unwrap();
    for (n, part) in bytes.chunks(4).enumerate() {
        let data = Bson::Binary(bson::Binary {
            subtype: bson::spec::BinarySubtype::Generic,
            bytes: part.to_vec(),
        });
        chunks
            .insert_one(doc! { "files_id": binary, "n": n as i32, "data": data })
            .await
            .unwrap();
    }
    assert_eq!(t.store.read_output(&Output::File(binary)).await.unwrap(), "aé€😀b");

    // A missing chunk, a wrong length, a missing file: errors naming the file.
    let text = "x".repeat(600_000);
    let gap = t
        .store
        .write_output_file(ObjectId::new(), "stdout", &text)
        .await
        .unwrap();
    chunks.delete_one(doc! { "files_id": gap, "n": 1 }).await.unwrap();
    let short = t
        .store
        .write_output_file(ObjectId::new(), "stderr", &text)
        .await
        .unwrap();
    files
        .update_one(doc! { "_id": short }, doc! { "$set": { "length": 5 } })
        .await
        .unwrap();
    for id in [gap, short, ObjectId::new()] {
        match t.store.read_output(&Output::File(id)).await {
            Err(StoreError::Malformed {
                collection, id: named, ..
            }) => {
                assert_eq!(collection, "tasks.files");
                assert_eq!(named, id.to_hex());
            }
            other => panic!("expected an error for file {id}, got {other:?}"),
        }
    }

    // An empty text is a file without chunks.
    let empty = t.store.write_output_file(ObjectId::new(), "stdout", "").await.unwrap();
    assert_eq!(t.store.read_output(&Output::File(empty)).await.unwrap(), "");
}

#[tokio::test]
async fn queue_crud_and_malformed_queues() {
    let t = test_db("queues").await;
    let extra = doc! { "on_orphan": "requeue", "sandbox": { "timeout": "10s", "memory_mib": 32 } };
    let new = |name: &str, extra: Document| NewQueue {
        name: name.to_string(),
        plugin: "demo".to_string(),
        threads: Some(2),
        sort: Sort::Lifo,
        extra,
    };
    let created = t.store.create_queue(new("alpha", extra)).await.unwrap();
    assert_eq!(created.on_orphan, OnOrphan::Requeue);
    assert_eq!(created.sandbox.memory_mib, Some(32));
    let d =
        t.db.collection::<Document>("queues")
            .find_one(doc! { "_id": created.id })
            .await
            .unwrap()
            .unwrap();
    assert_eq!(d.get("threads"), Some(&Bson::Int32(2)));
    assert_eq!(d.get("sort"), Some(&Bson::String("lifo".into())));
    assert_eq!(d.get("plugin"), Some(&Bson::String("demo".into())));

    match t.store.create_queue(new("alpha", doc! {})).await {
        Err(StoreError::Duplicate { what: "queue", name }) => assert_eq!(name, "alpha"),
        other => panic!("expected Duplicate, got {other:?}"),
    }
    assert!(matches!(
        t.store.create_queue(new("bad", doc! { "name": "x" })).await,
        Err(StoreError::Invalid(_))
    ));
    assert!(matches!(
        t.store
            .create_queue(new("bad", doc! { "sandbox": { "nope": 1 } }))
            .await,
        Err(StoreError::Invalid(_))
    ));

    let beta = t.store.create_queue(new("beta", doc! {})).await.unwrap();
    let rename = QueueUpdate {
        name: Some("alpha".into()),
        ..Default::default()
    };
    assert!(matches!(
        t.store.update_queue(beta.id, rename).await,
        Err(StoreError::Duplicate { .. })
    ));
    let update = QueueUpdate {
        name: Some("gamma".into()),
        threads: Some(None),
        sort: Some(Sort::Fifo),
        ..Default::default()
    };
    let gamma = t
        .store
        .update_queue(beta.id, update)
        .await
        .unwrap()
        .and_then(QueueState::readable)
        .unwrap();
    assert_eq!(
        (gamma.name.as_str(), gamma.threads, gamma.sort),
        ("gamma", None, Sort::Fifo)
    );
    assert_eq!(
        t.store
            .update_queue(ObjectId::new(), QueueUpdate::default())
            .await
            .unwrap(),
        None
    );

    // Queues written badly by hand: an unknown sort is read as default, a bad sandbox or
    // threads leaves that queue out, and neither breaks the listing.
    let odd_sort = insert_queue(&t.db, "odd-sort", Bson::Int32(1), "random", doc! {}).await;
    insert_queue(
        &t.db,
        "bad-sandbox",
        Bson::Int32(1),
        "fifo",
        doc! { "sandbox": { "timeout": "soon" } },
    )
    .await;
    insert_queue(&t.db, "bad-threads", Bson::String("many".into()), "fifo", doc! {}).await;
    let listed = t.store.queues().await.unwrap();
    let names: Vec<&str> = listed.iter().map(|q| q.name.as_str()).collect();
    assert_eq!(names, vec!["alpha", "gamma", "odd-sort"]);
    assert_eq!(listed.iter().find(|q| q.id == odd_sort).unwrap().sort, Sort::Default);

    assert!(t.store.delete_queue(gamma.id).await.unwrap());
    assert!(!t.store.delete_queue(gamma.id).await.unwrap());
    assert_eq!(t.store.queues().await.unwrap().len(), 2);
}

#[tokio::test]
async fn task_search_counts_and_paging() {
    let t = test_db("search").await;
    let a = insert_queue(&t.db, "a", Bson::Int32(5), "fifo", doc! {}).await;
    let b = insert_queue(&t.db, "b", Bson::Int32(5), "fifo", doc! {}).await;
    let ids = t
        .store
        .create_tasks(a, (0..10).map(|i| doc! { "i": i }).collect())
        .await
        .unwrap();
    t.store.create_tasks(b, vec![doc! {}, doc! {}]).await.unwrap();
    let qa = queue(&t.store, a).await;
    let claimed = t.store.claim(&qa, "den").await.unwrap().unwrap();

    let in_a = TaskFilter {
        queue: Some(a),
        ..Default::default()
    };
    assert_eq!(t.store.count_tasks(&in_a).await.unwrap(), 10);
    assert_eq!(t.store.count_tasks(&TaskFilter::default()).await.unwrap(), 12);
    let page = t
        .store
        .find_tasks(
            &in_a,
            Page {
                skip: 2,
                limit: 3,
                oldest_first: false,
            },
        )
        .await
        .unwrap();
    let newest_first: Vec<ObjectId> = ids.iter().rev().skip(2).take(3).copied().collect();
    assert_eq!(page.iter().map(|t| t.id).collect::<Vec<_>>(), newest_first);
    assert!(t
        .store
        .find_tasks(
            &in_a,
            Page {
                skip: 0,
                limit: 0,
                oldest_first: false
            }
        )
        .await
        .unwrap()
        .is_empty());

    let by_node = TaskFilter {
        node: Some(Some("den".into())),
        ..Default::default()
    };
    assert_eq!(
        t.store
            .find_tasks(
                &by_node,
                Page {
                    skip: 0,
                    limit: 10,
                    oldest_first: false
                }
            )
            .await
            .unwrap()[0]
            .id,
        claimed.id
    );
    let unclaimed = TaskFilter {
        queue: Some(a),
        node: Some(None),
        ..Default::default()
    };
    assert_eq!(t.store.count_tasks(&unclaimed).await.unwrap(), 9);
    let by_status = TaskFilter {
        status: Some(vec![status::CLAIMED, status::RUNNING]),
        ..Default::default()
    };
    assert_eq!(t.store.count_tasks(&by_status).await.unwrap(), 1);
    let by_id = TaskFilter {
        id: Some(ids[3]),
        ..Default::default()
    };
    assert_eq!(t.store.count_tasks(&by_id).await.unwrap(), 1);
    assert_eq!(t.store.task(ObjectId::new()).await.unwrap(), None);

    let counts = t.store.queue_counts().await.unwrap();
    assert_eq!(counts[&a].get(&status::QUEUED), Some(&9));
    assert_eq!(counts[&a].get(&status::CLAIMED), Some(&1));
    assert_eq!(counts[&b].get(&status::QUEUED), Some(&2));
}

#[tokio::test]
async fn indexes_are_created_idempotently() {
    let TestDb { db, store, .. } = test_db("indexes").await;
    store.ensure_indexes().await.unwrap();
    let keys = |coll: &'static str| {
        let db = db.clone();
        async move {
            let specs: Vec<mongodb::IndexModel> = db
                .collection::<Document>(coll)
                .list_indexes()
                .await
                .unwrap()
                .try_collect()
                .await
                .unwrap();
            specs
                .into_iter()
                .map(|m| (m.keys, m.options.and_then(|o| o.unique).unwrap_or(false)))
                .collect::<Vec<_>>()
        }
    };
    let has = |list: &[(Document, bool)], want: Document, unique: bool| {
        assert!(
            list.iter().any(|(k, u)| *k == want && *u == unique),
            "missing index {want} (unique {unique}) in {list:?}"
        );
    };
    let nodes = keys("nodes").await;
    has(&nodes, doc! { "node": 1 }, true);
    has(&keys("queues").await, doc! { "name": 1 }, true);
    let t = keys("tasks").await;
    has(
        &t,
        doc! { "queue": 1, "status": 1, "node": 1, "priority": -1, "_id": 1 },
        false,
    );
    has(&t, doc! { "status": 1, "run_at": 1 }, false);
    has(&t, doc! { "queue": 1, "key": 1 }, true);
    has(&t, doc! { "key": 1 }, false);
    has(&t, doc! { "node": 1, "status": 1 }, false);
    has(&t, doc! { "status": 1, "mtime": 1 }, false);
    has(&t, doc! { "queue": 1, "status": 1 }, false);
    let f = keys("tasks.files").await;
    has(&f, doc! { "filename": 1, "uploadDate": 1 }, false);
    has(&f, doc! { "metadata.task_id": 1 }, false);
    has(&keys("tasks.chunks").await, doc! { "files_id": 1, "n": 1 }, true);
    let s = keys("slots").await;
    has(&s, doc! { "queue": 1, "n": 1 }, true);
    has(&s, doc! { "holder": 1 }, false);

    insert_node(&db, "twice", DateTime::now()).await;
    let nodes = db.collection::<Document>("nodes");
    let dup = nodes
        .insert_one(doc! { "node": "twice", "timestamp": DateTime::now() })
        .await;
    assert!(dup.is_err(), "nodes.node is unique");
}

#[tokio::test]
async fn private_server_keeps_data_across_stop_kill_and_restart() {
    let mut server = common::TestServer::start_private();
    assert!(server.is_running());
    let port = server.port();
    let t = common::test_db_at(&server.uri(), "private_restart").await;
    let q = insert_queue(&t.db, "q", Bson::Int32(1), "fifo", doc! {}).await;
    let ids = t
        .store
        .create_tasks(q, vec![doc! { "i": 1 }, doc! { "i": 2 }])
        .await
        .unwrap();

    server.stop();
    assert!(!server.is_running());
    let down = MongoStore::connect(
        &server.uri(),
        &t.name,
        MongoOptions {
            server_selection_timeout: Some(Duration::from_millis(300)),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(
        matches!(down.task(ids[0]).await, Err(StoreError::Database(_))),
        "server is down"
    );

    server.restart();
    assert!(server.is_running());
    assert_eq!(server.port(), port, "restart keeps the port");
    // The client from before the restart reconnects by itself.
    assert_eq!(
        t.store.task(ids[0]).await.unwrap().map(|t| t.params),
        Some(doc! { "i": 1 })
    );

    server.kill();
    assert!(!server.is_running());
    server.restart();
    let again = common::test_db_at(&server.uri(), "after_crash").await;
    let reopened = MongoStore::connect(&again.uri, &t.name, MongoOptions::default())
        .await
        .unwrap();
    assert_eq!(
        reopened.count_tasks(&TaskFilter::default()).await.unwrap(),
        2,
        "data survives a crash"
    );
    assert!(server.log().contains("listening on"));
}

#[tokio::test]
async fn a_malformed_claimed_task_is_failed_with_the_reason() {
    let t = test_db("malformed_claim").await;
    let q = insert_queue(&t.db, "q", Bson::Int32(1), "fifo", doc! {}).await;
    let mut bad = spec_task(q, doc! {});
    bad.insert("params", "not an object");
    let bad_id = bad.get_object_id("_id").unwrap();
    let good = spec_task(q, doc! {});
    let good_id = good.get_object_id("_id").unwrap();
    insert_tasks(&t.db, vec![bad, good]).await;
    let queue = queue(&t.store, q).await;

    assert!(matches!(
        t.store.claim(&queue, "den").await,
        Err(StoreError::Malformed { .. })
    ));
    let d = raw(&t.db, bad_id).await;
    assert_eq!(d.get("status"), Some(&Bson::Int32(status::FAILED)));
    assert!(d.get_str("stderr").unwrap().contains("`params`"), "{d}");
    assert_eq!(t.store.claim(&queue, "den").await.unwrap().map(|t| t.id), Some(good_id));
}
