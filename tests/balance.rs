//! QueueBalance on both stores, with two real DEN processes: `GET|POST /balance` as
//! Disbatch 4 serves them, the limit on running tasks held across DENs and queues (the
//! database never shows more running), a priority lane served before the default lane's
//! backlog, `disabled` lifting the limits, and the `queuebalance` check of `/monitoring`.
//! A leader paused past its lease is replaced and every task still succeeds.
//! A slot taken under an older view of a queue is given back.

use crate::common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::Router;
use disbatch::api::{router, ApiState};
use disbatch::lifecycle::slots;
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
    // The leader writes its report after the shares the DENs claim under: awaited.
    wait_for(Duration::from_secs(60), "the leader's report of the limit", || async {
        let shown = get(&app, "/balance").await.json();
        shown["status"] == "OK" && shown["max_tasks_now"] == MAX
    })
    .await;
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
    let (peak, over) = sampler.await.unwrap();
    assert_eq!(
        peak, MAX,
        "the database showed {peak} tasks running at once; the limit is {MAX}; over it {over}"
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
    // The pass that lifted them reports it once the shares are written: awaited.
    wait_for(
        Duration::from_secs(30),
        "the leader to report the balance disabled",
        || async {
            let shown = get(&app, "/balance").await.json();
            shown["message"].as_str().is_some_and(|m| m.contains("disabled until"))
        },
    )
    .await;
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

/// Samples the tasks at -1/0 every 5 ms until `done`; answers the most seen at once, and
/// the tasks at -1/0 read right after the first sample over [`MAX`] (status and node).
fn sample_peak(store: Arc<dyn Store>, done: Arc<AtomicBool>) -> tokio::task::JoinHandle<(u64, String)> {
    tokio::spawn(async move {
        let mut peak = 0;
        let mut over = String::new();
        while !done.load(Ordering::SeqCst) {
            let n = running(&*store).await;
            if n > MAX && over.is_empty() {
                over = busy_tasks(&*store).await;
            }
            peak = peak.max(n);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (peak, over)
    })
}

/// The time now, to line the test's steps up with the DENs' logs.
fn now_text() -> String {
    bson::DateTime::now().try_to_rfc3339_string().unwrap_or_default()
}

/// The tasks at -1/0 as `id status node`, for a failure's message.
async fn busy_tasks(store: &dyn Store) -> String {
    let filter = TaskFilter {
        status: Some(vec![status::CLAIMED, status::RUNNING]),
        ..TaskFilter::default()
    };
    let page = disbatch::store::Page {
        skip: 0,
        limit: 100,
        oldest_first: true,
    };
    let tasks = store.find_tasks(&filter, page).await.unwrap();
    let at = now_text();
    let list: Vec<String> = tasks
        .iter()
        .map(|t| format!("{} {} {}", t.id, t.status, t.node.as_deref().unwrap_or("-")))
        .collect();
    format!("at {at}: [{}]", list.join(", "))
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
        println!("attempt {attempt}: {name} paused at {}", now_text());
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_secs(20) && !took_over {
            took_over = leader().await.is_some_and(|l| l != name);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        paused.resume();
        println!("attempt {attempt}: {name} resumed at {}", now_text());
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
    let (peak, over) = sampler.await.unwrap();
    println!("paused leader: at most {peak} tasks running at once (limit {MAX})");
    if peak > MAX {
        for den in &dens {
            println!("---- log of a DEN ----\n{}", den.log());
        }
    }
    assert!(
        peak <= MAX,
        "the database showed {peak} tasks running at once through the takeover; the limit is {MAX}; over it {over}"
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

/// The claim a DEN sends to MongoDB right after renewing its slot, as it reaches the
/// server: a `findAndModify` of the `tasks` collection (a BSON string element).
const TASKS_CLAIM: &[u8] = b"findAndModify\x00\x06\x00\x00\x00tasks\x00";

/// A claim held up on its way to MongoDB past its slot's lease (its DEN stopped between
/// the renewal and the claim, or a slow network) claims nothing once it arrives: by then
/// another node has taken the slot and claims with it, and a late claim would put one
/// task more at -1/0 than the queue's `threads`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_held_up_past_its_slot_lease_claims_nothing_on_mongodb() {
    let t = common::test_db("balance_late_claim").await;
    let proxy = common::FaultProxy::in_front_of(&t.uri).await;
    let client = mongodb::Client::with_uri_str(proxy.uri()).await.unwrap();
    let late: Arc<dyn Store> = Arc::new(disbatch::store::mongo::MongoStore::from_database(
        client.database(&t.name),
    ));
    let store = &t.store;
    let q = store
        .create_queue(disbatch::store::NewQueue {
            name: "late".into(),
            plugin: "demo".into(),
            threads: Some(1),
            sort: disbatch::model::Sort::Fifo,
            extra: bson::Document::new(),
        })
        .await
        .unwrap();
    let tasks = (0..2)
        .map(|i| disbatch::store::NewTask::queued(bson::oid::ObjectId::new(), bson::doc! { "n": i }))
        .collect();
    store.insert_tasks(q.id, tasks).await.unwrap();
    let lease = Duration::from_secs(2);
    let slot = slots::acquire_slot(&*late, &q, "a", lease)
        .await
        .unwrap()
        .expect("a slot under threads 1");
    // Node a renews its slot; its claim is held on the way.
    proxy.hold_matching(TASKS_CLAIM);
    let claim = {
        let (late, q) = (late.clone(), q.clone());
        tokio::spawn(async move { slots::renew_and_claim(&*late, &slot, &q, "a", lease).await })
    };
    wait_for(Duration::from_secs(60), "a's claim to be held on its way", || async {
        proxy.held() > 0
    })
    .await;
    // Its slot's lease runs out; node b takes the slot (a holds no task of the queue) and
    // claims with it.
    let start = std::time::Instant::now();
    let taken = loop {
        if let Some(s) = slots::acquire_slot(store, &q, "b", lease).await.unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "b never got the slot whose lease ran out"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (_, got) = slots::renew_and_claim(store, &taken, &q, "b", lease).await.unwrap();
    assert!(got.is_some(), "b claims with the slot it took");
    // Node a's claim arrives.
    proxy.release();
    let (_, got) = claim.await.unwrap().unwrap();
    let busy = running(store).await;
    assert_eq!(
        busy,
        1,
        "the database shows {busy} tasks at -1/0 in a queue of threads 1 (a's late claim: {:?})",
        got.as_ref().map(|t| t.id)
    );
    assert!(got.is_none(), "a claimed after its slot went to b");
}

/// A node whose slot lease ran out takes the slot again (it holds no task of the queue):
/// giving it back, or renewing it, through the lease that ran out changes nothing, so a
/// worker left with the old lease cannot free the slot another of the node's workers now
/// claims with (which would let a third take it: one task more than `threads`).
async fn retaken_slot(store: Arc<dyn Store>) {
    let q = store
        .create_queue(disbatch::store::NewQueue {
            name: "retaken".into(),
            plugin: "demo".into(),
            threads: Some(1),
            sort: disbatch::model::Sort::Fifo,
            extra: bson::Document::new(),
        })
        .await
        .unwrap();
    let short = Duration::from_millis(200);
    let old = slots::acquire_slot(&*store, &q, "b", short)
        .await
        .unwrap()
        .expect("a slot under threads 1");
    let start = std::time::Instant::now();
    let new = loop {
        if let Some(s) = slots::acquire_slot(&*store, &q, "b", Duration::from_secs(60))
            .await
            .unwrap()
        {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "b never took its slot again once its lease ran out"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!((new.queue, new.n), (old.queue, old.n), "one slot under threads 1");
    assert_eq!(
        slots::renew_slot(&*store, &old, "b", Duration::from_secs(60))
            .await
            .unwrap(),
        disbatch::store::SlotRenewal::Lost,
        "the lease that ran out is not renewed"
    );
    slots::release_slot(&*store, &old, "b").await.unwrap();
    assert_eq!(
        slots::acquire_slot(&*store, &q, "c", Duration::from_secs(60))
            .await
            .unwrap(),
        None,
        "the slot b took again stays b's: the old lease gave nothing back"
    );
    assert_eq!(slots::slots_in_use(&*store, q.id).await.unwrap(), 1);
    slots::release_slot(&*store, &new, "b").await.unwrap();
    assert!(slots::acquire_slot(&*store, &q, "c", short).await.unwrap().is_some());
}

#[tokio::test]
async fn a_slot_taken_again_is_not_given_back_through_its_old_lease_on_mongodb() {
    let t = common::test_db("balance_retaken").await;
    retaken_slot(Arc::new(t.store.clone())).await;
}

#[tokio::test]
async fn a_slot_taken_again_is_not_given_back_through_its_old_lease_on_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    retaken_slot(Arc::new(SqliteStore::open(&dir.path().join("r.db")).await.unwrap())).await;
}
