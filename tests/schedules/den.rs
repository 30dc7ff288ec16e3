//! Schedules with real `den` processes: a 1-second schedule (`catch_up: "all"`) has 200
//! occurrences while, round after round, the leading DEN is killed, restarted under its
//! name, and a leader is paused (SIGSTOP) past its lease and resumed; then the database
//! holds exactly one task for every second from the schedule's creation to its last
//! occurrence, none missing. On MongoDB and on the embedded store.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use disbatch::api::{router, ApiState};
use disbatch::lifecycle::schedules::occurrence_key;
use disbatch::model::schedule::timestamp;
use disbatch::store::mongo::MongoStore;
use disbatch::store::sqlite::SqliteStore;
use disbatch::store::{Page, Store, TaskFilter};
use jiff::{SignedDuration, Timestamp};
use serde_json::json;

use crate::common::http::post;
use crate::common::{wait_for, DenProcess};

/// The leader lease's length (`heartbeat_stale`) of the DENs here, in seconds.
const STALE: u64 = 2;

/// How many occurrences the schedule has before it is paused and its tasks counted.
const OCCURRENCES: usize = 200;

async fn leader(store: &dyn Store) -> Option<String> {
    let lease = disbatch::lifecycle::leader::leader(store).await.unwrap()?;
    lease.holder(bson::DateTime::now()).map(str::to_owned)
}

/// How many tasks of the queue have each key.
async fn keys(store: &dyn Store, queue: bson::oid::ObjectId) -> BTreeMap<String, usize> {
    let filter = TaskFilter {
        queue: Some(queue),
        ..TaskFilter::default()
    };
    let page = Page {
        skip: 0,
        limit: 100_000,
        oldest_first: true,
    };
    let mut out = BTreeMap::new();
    for t in store.find_tasks(&filter, page).await.unwrap() {
        *out.entry(t.key.unwrap_or_default()).or_insert(0) += 1;
    }
    out
}

/// Waits until `n` more occurrences have tasks than now.
async fn more_ticks(store: &dyn Store, queue: bson::oid::ObjectId, n: usize, what: &str) {
    let before = keys(store, queue).await.len();
    wait_for(Duration::from_secs(30), what, || async {
        keys(store, queue).await.len() >= before + n
    })
    .await;
}

/// One round of failures: the leader is killed (the other takes over and catches up the
/// seconds in between), comes back under its name, and then a leader is paused past its
/// lease and resumed.
async fn through_failures(
    store: &dyn Store,
    queue: bson::oid::ObjectId,
    dens: &mut BTreeMap<String, DenProcess>,
    start: &impl Fn(&str) -> DenProcess,
    name: &str,
) {
    // The leader is killed: the other takes over and catches up the seconds in between.
    let first = leader(store).await.expect("a leader");
    let mut victim = dens.remove(&first).unwrap();
    victim.signal(libc::SIGKILL);
    victim.wait_exit(Duration::from_secs(10));
    wait_for(Duration::from_secs(30), "another DEN to lead", || async {
        leader(store).await.is_some_and(|l| l != first)
    })
    .await;
    more_ticks(store, queue, 2, "occurrences after the kill").await;

    // The killed DEN comes back under its name.
    dens.insert(first.clone(), start(&first));
    dens[&first].wait_for_log(Duration::from_secs(30), "DEN started").await;
    more_ticks(store, queue, 2, "occurrences after the restart").await;

    // The leader is paused past its lease, then goes on. On the embedded store a DEN
    // paused inside a write transaction holds the file's lock, so no one can take over
    // until it goes on: then it is resumed and paused again at another moment.
    let mut took_over = false;
    for attempt in 1..=3 {
        wait_for(Duration::from_secs(30), "a leader to pause", || async {
            leader(store).await.is_some()
        })
        .await;
        let Some(paused) = leader(store).await else { continue };
        dens[&paused].pause();
        let at = Instant::now();
        while at.elapsed() < Duration::from_secs(STALE * 4) && !took_over {
            took_over = leader(store).await.is_some_and(|l| l != paused);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if took_over {
            // A few occurrences under the new leader while the old one still sleeps.
            more_ticks(store, queue, 2, "occurrences while the leader is paused").await;
        }
        dens[&paused].resume();
        if took_over {
            break;
        }
        println!("{name}: attempt {attempt}: no other leader while {paused} was paused");
    }
    assert!(took_over, "no other DEN led while the leader was paused");
    more_ticks(store, queue, 3, "occurrences after the resume").await;
}

async fn every_second_through_failures(store: Arc<dyn Store>, start: impl Fn(&str) -> DenProcess, name: &str) {
    let began = Instant::now();
    let app = router(ApiState::new(store.clone(), vec!["demo".into()]));
    // A paused queue (no threads): the tasks stay queued, to be counted.
    let r = post(&app, "/queues", json!({"name": "ticks", "plugin": "demo"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let queue = r.json()["id"]["$oid"].as_str().map(str::to_owned);
    let queue =
        bson::oid::ObjectId::parse_str(queue.unwrap_or_else(|| r.json()["id"].as_str().unwrap().to_owned())).unwrap();
    let r = post(
        &app,
        "/schedules",
        json!({"name": "tick", "queue": "ticks", "every": "1s", "catch_up": "all", "params": {"message": "tick"}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let anchor: Timestamp = r.json()["anchor"].as_str().unwrap().parse().unwrap();

    let mut dens: BTreeMap<String, DenProcess> = ["a", "b"].iter().map(|n| (n.to_string(), start(n))).collect();
    more_ticks(&*store, queue, 3, "the first occurrences").await;
    // Round after round of failures until the schedule has had its occurrences.
    let mut rounds = 0;
    while keys(&*store, queue).await.len() < OCCURRENCES {
        rounds += 1;
        through_failures(&*store, queue, &mut dens, &start, name).await;
    }

    // Paused: no more occurrences; every one from the creation to the mark has one task.
    let r = post(&app, "/schedules/tick", json!({"paused": true})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let mark = store.schedule("tick").await.unwrap().unwrap().mark;
    let last = timestamp(mark.last);
    let found = keys(&*store, queue).await;
    let seconds = last.duration_since(anchor).as_secs();
    let expected: BTreeMap<String, usize> = (1..=seconds)
        .map(|i| {
            (
                occurrence_key("tick", anchor.checked_add(SignedDuration::from_secs(i)).unwrap()),
                1,
            )
        })
        .collect();
    // An occurrence a leader created as the pause landed may come after the mark.
    let within: BTreeMap<String, usize> = found
        .iter()
        .filter(|(k, _)| **k <= occurrence_key("tick", last))
        .map(|(k, n)| (k.clone(), *n))
        .collect();
    if within != expected {
        for (node, den) in &dens {
            println!("---- log of {node} ----\n{}", den.log());
        }
    }
    assert_eq!(
        within, expected,
        "{name}: one task for each second from the creation to the mark"
    );
    assert!(found.values().all(|n| *n == 1), "{found:?}");
    assert!(expected.len() >= OCCURRENCES, "{name}: {} occurrences", expected.len());
    println!(
        "{name}: {} occurrences, each once, through {rounds} rounds of a kill, a restart and a pause; {:.1} s",
        expected.len(),
        began.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_second_through_failures_on_mongodb() {
    let t = crate::common::test_db("schedules_den").await;
    let store: Arc<dyn Store> = Arc::new(MongoStore::from_database(t.db.clone()));
    let extra = json!({ "heartbeat_stale": STALE });
    every_second_through_failures(
        store,
        |node| DenProcess::start(&t.uri, &t.name, node, extra.clone()),
        "MongoDB",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_second_through_failures_on_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&file).await.unwrap());
    let extra = json!({ "heartbeat_stale": STALE });
    every_second_through_failures(
        store,
        |node| DenProcess::start_embedded(&file, node, extra.clone()),
        "SQLite",
    )
    .await;
}
