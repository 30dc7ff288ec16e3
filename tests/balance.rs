//! QueueBalance on both stores, with two real DEN processes: `GET|POST /balance` as
//! Disbatch 4 serves them, the limit on running tasks held across DENs and queues (the
//! database never shows more running), a priority lane served before the default lane's
//! backlog, `disabled` lifting the limits, and the `queuebalance` check of `/monitoring`.
//! A leader paused past its lease is replaced and every task still succeeds.
//! A slot taken under an older view of a queue is given back.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::Router;
use disbatch::api::{router, ApiState};
use disbatch::model::status;
use disbatch::store::sqlite::SqliteStore;
use disbatch::store::{Store, TaskFilter};
use serde_json::{json, Value};

use common::http::{get, post};
use common::{wait_for, DenProcess};

/// Most tasks of the balanced queues running at once.
const MAX: u64 = 3;

async fn queue(app: &Router, name: &str) -> Value {
    let r = get(app, &format!("/queues/{name}")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    r.json()
}

async fn running(store: &dyn Store) -> u64 {
    let filter = TaskFilter {
        status: Some(vec![status::CLAIMED, status::RUNNING]),
        ..TaskFilter::default()
    };
    store.count_tasks(&filter).await.unwrap()
}

async fn count(store: &dyn Store, queue: &Value, code: i32) -> u64 {
    let id = bson::oid::ObjectId::parse_str(queue["id"].as_str().unwrap()).unwrap();
    let filter = TaskFilter {
        queue: Some(id),
        status: Some(vec![code]),
        ..TaskFilter::default()
    };
    store.count_tasks(&filter).await.unwrap()
}

async fn balance(store: Arc<dyn Store>, start_den: impl Fn(&str) -> DenProcess) {
    let mut state = ApiState::new(store.clone(), vec!["demo".into()]);
    state.balance.enabled = true;
    let app = router(state);
    for name in ["bulk", "urgent", "other"] {
        let r = post(&app, "/queues", json!({"name": name, "plugin": "demo", "threads": 10})).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    }

    // Before any document: a notice, the queues and the settings.
    let shown = get(&app, "/balance").await.json();
    assert_eq!(shown["notice"], "balance document not found", "{shown}");
    assert_eq!(shown["known_queues"], json!(["bulk", "urgent", "other"]), "{shown}");
    assert_eq!(shown["settings"]["enabled"], true, "{shown}");
    // Refused as Disbatch 4 refuses, naming the fault.
    for (body, fault) in [
        (json!({"max_tasks": {"* 00:00": 3}, "queues": [["nope"]]}), "\"nope\""),
        (json!({"max_tasks": {"* 0:00": 3}, "queues": []}), "\"* 0:00\""),
        (json!({"max_tasks": {}, "queues": [["bulk"], ["bulk"]]}), "twice"),
        (json!({"max_tasks": {}, "queues": [], "limit": 1}), "\"limit\""),
    ] {
        let r = post(&app, "/balance", body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
        let e = r.json();
        assert!(e["error"].as_str().unwrap().contains(fault), "{e} should name {fault}");
        assert!(
            e["status"].as_str().unwrap().starts_with("failed: invalid json passed"),
            "{e}"
        );
    }
    // Numbers as strings, as Disbatch 4's web form sends them.
    let r = post(
        &app,
        "/balance",
        json!({"max_tasks": {"* 00:00": MAX.to_string()}, "queues": [["bulk"], ["urgent"]]}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json()["status"], "success: queuebalance modified");
    // A queue new to the balance claims nothing until the leader shares.
    assert_eq!(queue(&app, "bulk").await["maxthreads"], 0);
    assert_eq!(queue(&app, "other").await["maxthreads"], Value::Null);
    let m = get(&app, "/monitoring").await.json();
    assert_eq!(
        m["queuebalance"]["status"], "CRITICAL",
        "no leader has balanced yet: {m}"
    );

    let bulk = queue(&app, "bulk").await;
    let urgent = queue(&app, "urgent").await;
    let params: Vec<Value> = (0..40)
        .map(|i| json!({"message": format!("b{i}"), "sleep_ms": 500}))
        .collect();
    let r = post(&app, "/tasks", json!({"queue": "bulk", "params": params})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    // Sample what the database shows running for as long as the DENs work.
    let done = Arc::new(AtomicBool::new(false));
    let sampler = sample_peak(store.clone(), done.clone());
    let dens = [start_den("balance-a"), start_den("balance-b")];
    wait_for(
        Duration::from_secs(60),
        "the bulk lane to use the whole limit",
        || async { count(&*store, &bulk, status::RUNNING).await + count(&*store, &bulk, status::CLAIMED).await == MAX },
    )
    .await;
    let shown = get(&app, "/balance").await.json();
    assert_eq!(shown["status"], "OK", "{shown}");
    assert_eq!(shown["max_tasks_now"], MAX, "{shown}");
    let m = get(&app, "/monitoring").await.json();
    assert_eq!(m["queuebalance"]["status"], "OK", "{m}");

    // The priority lane is served before the default lane's backlog.
    let r = post(
        &app,
        "/tasks",
        json!({"queue": "urgent", "params": [{"message": "u1"}, {"message": "u2"}]}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    wait_for(Duration::from_secs(60), "the urgent tasks to end", || async {
        count(&*store, &urgent, status::SUCCEEDED).await == 2
    })
    .await;
    let left = count(&*store, &bulk, status::QUEUED).await;
    assert!(left > 0, "the urgent tasks waited for the whole bulk backlog");
    wait_for(Duration::from_secs(120), "the bulk tasks to end", || async {
        count(&*store, &bulk, status::SUCCEEDED).await == 40
    })
    .await;
    done.store(true, Ordering::SeqCst);
    let peak = sampler.await.unwrap();
    assert_eq!(
        peak, MAX,
        "the database showed {peak} tasks running at once; the limit is {MAX}"
    );

    // Disabled for an hour: the limits are lifted; enabled again: back.
    let later = bson::DateTime::now().timestamp_millis() / 1000 + 3600;
    let r = post(
        &app,
        "/balance",
        json!({"max_tasks": {"* 00:00": MAX}, "queues": [["bulk"], ["urgent"]], "disabled": later}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    wait_for(Duration::from_secs(30), "the limits to be lifted", || async {
        queue(&app, "bulk").await["maxthreads"].is_null() && queue(&app, "urgent").await["maxthreads"].is_null()
    })
    .await;
    let shown = get(&app, "/balance").await.json();
    assert!(shown["message"].as_str().unwrap().contains("disabled until"), "{shown}");
    let r = post(
        &app,
        "/balance",
        json!({"max_tasks": {"* 00:00": MAX}, "queues": [["bulk"]], "disabled": null}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    wait_for(Duration::from_secs(30), "bulk to be balanced again", || async {
        queue(&app, "bulk").await["maxthreads"].is_i64()
    })
    .await;
    assert_eq!(
        queue(&app, "urgent").await["maxthreads"],
        Value::Null,
        "urgent left the balance"
    );
    for den in &dens {
        assert!(!den.log().contains("panicked"), "{}", den.log());
    }
}

/// Samples the tasks at -1/0 every 5 ms until `done`; answers the most seen at once.
fn sample_peak(store: Arc<dyn Store>, done: Arc<AtomicBool>) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut peak = 0;
        while !done.load(Ordering::SeqCst) {
            peak = peak.max(running(&*store).await);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        peak
    })
}

/// The leader is paused (SIGSTOP) past its lease while its tasks run, then resumed: the
/// other DEN leads and balances, and the paused one's tasks are recovered and run again
/// until every task has succeeded, and the database never shows more than the limit
/// running at once.
async fn paused_leader(store: Arc<dyn Store>, start_den: impl Fn(&str) -> DenProcess) {
    let mut state = ApiState::new(store.clone(), vec!["demo".into()]);
    state.balance.enabled = true;
    let app = router(state);
    let r = post(
        &app,
        "/queues",
        json!({"name": "work", "plugin": "demo", "threads": 10, "on_orphan": "requeue"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = post(
        &app,
        "/balance",
        json!({"max_tasks": {"* 00:00": MAX}, "queues": [["work"]]}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let params: Vec<Value> = (0..30)
        .map(|i| json!({"message": format!("w{i}"), "sleep_ms": 400}))
        .collect();
    let r = post(&app, "/tasks", json!({"queue": "work", "params": params})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let work = queue(&app, "work").await;
    let done = Arc::new(AtomicBool::new(false));
    let sampler = sample_peak(store.clone(), done.clone());
    let dens = [start_den("paused-a"), start_den("paused-b")];
    let leader = || async {
        let nodes = get(&app, "/nodes").await.json();
        nodes
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["leader"] == true)
            .map(|n| n["node"].as_str().unwrap().to_string())
    };
    wait_for(Duration::from_secs(60), "tasks to run on the leader", || async {
        let Some(name) = leader().await else { return false };
        let filter = TaskFilter {
            node: Some(Some(name)),
            status: Some(vec![status::RUNNING]),
            ..TaskFilter::default()
        };
        store.count_tasks(&filter).await.unwrap() > 0
    })
    .await;
    // On the embedded store a DEN paused inside a write transaction holds the file's
    // write lock, so nobody can take the lease until it goes on (SQLite's lock belongs to
    // the process): then it is resumed and paused again at another moment.
    let mut took_over = false;
    for attempt in 1..=3 {
        // After a resume the lease may have lapsed: wait until a node leads again, so that
        // every attempt pauses a leader.
        let mut name = None;
        let start = std::time::Instant::now();
        while name.is_none() && start.elapsed() < Duration::from_secs(30) {
            name = leader().await;
            if name.is_none() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let Some(name) = name else {
            println!("attempt {attempt}: no leader within 30 s");
            continue;
        };
        let paused = if name == "paused-a" { &dens[0] } else { &dens[1] };
        paused.pause();
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_secs(20) && !took_over {
            took_over = leader().await.is_some_and(|l| l != name);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        paused.resume();
        if took_over {
            break;
        }
        println!("attempt {attempt}: no other leader while {name} was paused (paused inside a write?)");
    }
    assert!(took_over, "the other DEN never led while the leader was paused");
    wait_for(Duration::from_secs(120), "every task to succeed", || async {
        count(&*store, &work, status::SUCCEEDED).await == 30
    })
    .await;
    done.store(true, Ordering::SeqCst);
    let peak = sampler.await.unwrap();
    println!("paused leader: at most {peak} tasks running at once (limit {MAX})");
    assert!(
        peak <= MAX,
        "the database showed {peak} tasks running at once through the takeover; the limit is {MAX}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_leader_keeps_the_limit_on_mongodb() {
    let t = common::test_db("balance_paused").await;
    let store: Arc<dyn Store> = Arc::new(t.store.clone());
    paused_leader(store, |node| DenProcess::start(&t.uri, &t.name, node, den_config())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_leader_keeps_the_limit_on_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&file).await.unwrap());
    let file: &Path = &file;
    paused_leader(store, |node| DenProcess::start_embedded(file, node, den_config())).await;
}

fn den_config() -> Value {
    json!({"balance": {"enabled": true, "log": true}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_balance_on_mongodb() {
    let t = common::test_db("balance").await;
    let store: Arc<dyn Store> = Arc::new(t.store.clone());
    balance(store, |node| DenProcess::start(&t.uri, &t.name, node, den_config())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_balance_on_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("b.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&file).await.unwrap());
    let file: &Path = &file;
    balance(store, |node| DenProcess::start_embedded(file, node, den_config())).await;
}

/// A slot taken with an older copy of the queue (no `maxthreads` yet) is refused when the
/// stored limit does not allow it.
async fn stale_view(store: Arc<dyn Store>) {
    let q = store
        .create_queue(disbatch::store::NewQueue {
            name: "stale".into(),
            plugin: "demo".into(),
            threads: Some(4),
            sort: disbatch::model::Sort::Fifo,
            extra: bson::Document::new(),
        })
        .await
        .unwrap();
    let lease = Duration::from_secs(10);
    let first = disbatch::lifecycle::slots::acquire_slot(&*store, &q, "n1", lease)
        .await
        .unwrap()
        .expect("a slot under threads 4");
    let update = disbatch::store::QueueUpdate {
        extra: bson::doc! { "maxthreads": 1_i64 },
        ..Default::default()
    };
    store.update_queue(q.id, update).await.unwrap();
    assert_eq!(
        disbatch::lifecycle::slots::acquire_slot(&*store, &q, "n2", lease)
            .await
            .unwrap(),
        None,
        "the stored limit (maxthreads 1) is held, whatever the caller's copy says"
    );
    assert_eq!(
        disbatch::lifecycle::slots::slots_in_use(&*store, q.id).await.unwrap(),
        1
    );
    disbatch::lifecycle::slots::release_slot(&*store, &first, "n1")
        .await
        .unwrap();
    assert!(disbatch::lifecycle::slots::acquire_slot(&*store, &q, "n2", lease)
        .await
        .unwrap()
        .is_some());
}

#[tokio::test]
async fn a_stale_queue_view_takes_no_slot_on_mongodb() {
    let t = common::test_db("balance_stale").await;
    stale_view(Arc::new(t.store.clone())).await;
}

#[tokio::test]
async fn a_stale_queue_view_takes_no_slot_on_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    stale_view(Arc::new(SqliteStore::open(&dir.path().join("s.db")).await.unwrap())).await;
}
