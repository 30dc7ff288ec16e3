//! The cluster's leader: one DEN at a time holds the leader lease (a document with an expiry
//! and a fencing token), `GET /nodes` marks it, and when it is killed another DEN takes over
//! within `heartbeat_stale` and a tick, with a greater token. On MongoDB and on the embedded
//! store, with real `den` processes.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use disbatch::api::{router, ApiState};
use disbatch::model::{status, Sort};
use disbatch::store::mongo::MongoStore;
use disbatch::store::sqlite::SqliteStore;
use disbatch::store::{Leader, NewQueue, NewTask, Store};
use serde_json::Value;

use common::http::get;
use common::{wait_for, DenProcess};

/// `heartbeat_stale` of the DENs here, in seconds (the lease's length).
const STALE: u64 = 2;

/// The node `GET /nodes` marks as the leader, if exactly one is marked.
async fn marked(app: &axum::Router) -> Option<String> {
    let r = get(app, "/nodes").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let nodes = r.json();
    let leaders: Vec<&Value> = nodes
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["leader"] == Value::Bool(true))
        .collect();
    assert!(leaders.len() <= 1, "two leaders at once: {nodes}");
    leaders
        .first()
        .map(|n| n["node"].as_str().unwrap_or_default().to_owned())
}

async fn lease(store: &Arc<dyn Store>) -> Leader {
    disbatch::lifecycle::leader::leader(&**store)
        .await
        .unwrap()
        .expect("a leader lease")
}

/// Starts DENs `a` and `b` with `start`, waits for a leader, kills it, and checks that the
/// other takes over in time with a greater token.
async fn a_killed_leader_is_replaced(store: Arc<dyn Store>, start: impl Fn(&str) -> DenProcess, name: &str) {
    let app = router(ApiState::new(store.clone(), vec!["demo".into()]));
    let mut dens = vec![("a", start("a")), ("b", start("b"))];
    wait_for(Duration::from_secs(30), "a leader to be elected", || async {
        marked(&app).await.is_some()
    })
    .await;
    let first = marked(&app).await.unwrap();
    let before = lease(&store).await;
    assert_eq!(before.node, first);
    // Both DENs run their ticks: the leader keeps its lease, the other does not take it.
    let (mut victim, survivor) = {
        let i = dens.iter().position(|(n, _)| *n == first).unwrap();
        let victim = dens.remove(i);
        (victim.1, dens.remove(0))
    };
    wait_for(Duration::from_secs(30), "the leader to renew its lease", || async {
        lease(&store).await.expires > before.expires
    })
    .await;
    assert_eq!(lease(&store).await.token, before.token, "a renewal keeps the token");

    victim.signal(libc::SIGKILL);
    victim.wait_exit(Duration::from_secs(10));
    let killed = Instant::now();
    wait_for(Duration::from_secs(30), "the other DEN to take over", || async {
        marked(&app).await.as_deref() == Some(survivor.0)
    })
    .await;
    let took = killed.elapsed();
    let after = lease(&store).await;
    assert_eq!(after.node, survivor.0);
    assert!(after.token > before.token, "{before:?} then {after:?}");
    // The lease is written before the DEN logs that it leads.
    survivor
        .1
        .wait_for_log(Duration::from_secs(30), "leads the cluster")
        .await;
    println!(
        "{name}: leader killed → replaced after {:.2} s (heartbeat_stale {STALE} s + 1 s tick)",
        took.as_secs_f64()
    );
    // Within heartbeat_stale + a tick, with room for a loaded machine.
    assert!(took < Duration::from_secs(STALE + 1 + 3), "replaced after {took:?}");

    // The new leader queues scheduled tasks when they are due (a duty of the leader).
    let q = store
        .create_queue(NewQueue {
            name: "after-takeover".into(),
            plugin: "demo".into(),
            threads: Some(1),
            sort: Sort::Fifo,
            extra: bson::Document::new(),
        })
        .await
        .unwrap();
    let due = bson::DateTime::from_millis(bson::DateTime::now().timestamp_millis() + 300);
    let task = NewTask {
        run_at: Some(due),
        ..NewTask::queued(bson::oid::ObjectId::new(), bson::doc! {"message": "due"})
    };
    let id = task.id;
    store.insert_tasks(q.id, vec![task]).await.unwrap();
    assert_eq!(store.task(id).await.unwrap().unwrap().status, status::SCHEDULED);
    wait_for(Duration::from_secs(30), "the scheduled task to run", || async {
        store.task(id).await.unwrap().unwrap().status == status::SUCCEEDED
    })
    .await;
    let ran = store.task(id).await.unwrap().unwrap();
    assert_eq!(ran.node.as_deref(), Some(survivor.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_leader_is_replaced_on_mongodb() {
    let t = common::test_db("leader").await;
    let store: Arc<dyn Store> = Arc::new(MongoStore::from_database(t.db.clone()));
    let extra = serde_json::json!({ "heartbeat_stale": STALE });
    a_killed_leader_is_replaced(
        store,
        |node| DenProcess::start(&t.uri, &t.name, node, extra.clone()),
        "MongoDB",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_leader_is_replaced_on_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&file).await.unwrap());
    let extra = serde_json::json!({ "heartbeat_stale": STALE });
    a_killed_leader_is_replaced(
        store,
        |node| DenProcess::start_embedded(&file, node, extra.clone()),
        "SQLite",
    )
    .await;
}
