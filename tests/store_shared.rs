//! One suite, two stores: every store-level and DEN lifecycle test here is written once
//! against `Arc<dyn Store>` and run on [`MongoStore`] (a fresh database on the test
//! server) and on [`SqliteStore`] (a fresh file), so the two cannot drift.
//!
//! Each test gets two store instances on the same data (two `MongoStore`s on one
//! database, two `SqliteStore`s on one file) to stand for two DEN processes.

use crate::common;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch::config::Gfs;
use disbatch::den::{Den, DenError, DenSettings};
use disbatch::model::{status, NameHolder, NodeProcess, NodeStats, OnOrphan, Output, Queue, Sort};
use disbatch::runner::Sandbox;
use disbatch::store::mongo::MongoStore;
use disbatch::store::sqlite::SqliteStore;
use disbatch::store::testing::StoreExt;
use disbatch::store::{
    NewQueue, OutputValue, Page, QueueState, QueueUpdate, SlotRenewal, Store, StoreError, TaskFilter,
};
use tokio_util::sync::CancellationToken;

use common::wait_for;
use common::Recording;

const LEASE: Duration = Duration::from_secs(30);

/// Two store instances on the same data, and what keeps that data alive.
struct Stores {
    a: Arc<dyn Store>,
    b: Arc<dyn Store>,
    _keep: Box<dyn std::any::Any + Send>,
}

async fn mongo_stores(hint: &str) -> Stores {
    let t = common::test_db(hint).await;
    let b = MongoStore::from_database(t.db.clone());
    Stores {
        a: Arc::new(t.store.clone()),
        b: Arc::new(b),
        _keep: Box::new(t.db.clone()),
    }
}

async fn sqlite_stores(_hint: &str) -> Stores {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("disbatch.db");
    let a = SqliteStore::open(&path).await.expect("open SQLite store");
    let b = SqliteStore::open(&path).await.expect("open SQLite store again");
    Stores {
        a: Arc::new(a),
        b: Arc::new(b),
        _keep: Box::new(dir),
    }
}

/// Runs the suite's test `$name` on both stores.
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn mongo() {
                super::$name(super::mongo_stores(stringify!($name)).await).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                super::$name(super::sqlite_stores(stringify!($name)).await).await;
            }
        }
    )*};
}

on_both_stores!(
    created_claimed_started_finished_field_by_field,
    fifo_lifo_and_default_order,
    held_statuses_are_never_claimed,
    concurrent_claimers_get_every_task_exactly_once,
    slots_hold_threads_across_nodes,
    lowering_threads_blocks_while_higher_slots_are_held,
    expired_slots_are_free_and_heartbeats_renew_them,
    heartbeat_upserts_and_preserves_maxthreads,
    stale_nodes_tasks_are_recovered_and_fresh_nodes_left_alone,
    spec_sweep_orphans_old_claimed_tasks,
    finish_is_fenced_after_recovery,
    requeue_own_puts_back_only_our_unfinished_tasks,
    output_file_round_trip_of_20_mb_multibyte_text,
    queue_crud_and_duplicate_names,
    task_search_counts_and_paging,
    queue_counts_by_status,
    den_runs_a_demo_task_to_success,
    two_dens_never_claim_a_task_twice,
    a_node_name_is_held_by_one_live_process,
    a_second_den_with_a_live_name_refuses_to_start,
    den_writes_a_large_output_as_a_file,
    den_failures_end_as_status_2_with_the_reason,
    three_dens_hold_threads_and_maxthreads,
);

#[path = "store_shared/attempts.rs"]
mod attempts;
#[path = "store_shared/change.rs"]
mod change;
#[path = "store_shared/claims.rs"]
mod claims;
#[path = "store_shared/deps.rs"]
mod deps;
#[path = "store_shared/end_and_claim.rs"]
mod end_and_claim;
#[path = "store_shared/fair_slots.rs"]
mod fair_slots;
#[path = "store_shared/heads.rs"]
mod heads;
#[path = "store_shared/keys.rs"]
mod keys;
#[path = "store_shared/leader.rs"]
mod leader;
#[path = "store_shared/lifecycle.rs"]
mod lifecycle;
#[path = "store_shared/nodes.rs"]
mod nodes;
#[path = "store_shared/queues.rs"]
mod queues;
#[path = "store_shared/rate.rs"]
mod rate;
#[path = "store_shared/restarts.rs"]
mod restarts;
#[path = "store_shared/results.rs"]
mod results;
#[path = "store_shared/retention.rs"]
mod retention;
#[path = "store_shared/retries.rs"]
mod retries;
#[path = "store_shared/schedules.rs"]
mod schedules;
#[path = "store_shared/slot_changes.rs"]
mod slot_changes;
#[path = "store_shared/stats.rs"]
mod stats;

fn new_queue(name: &str, threads: Option<i64>, sort: Sort) -> NewQueue {
    NewQueue {
        name: name.to_string(),
        plugin: "demo".to_string(),
        threads,
        sort,
        extra: Document::new(),
    }
}

async fn queue(s: &dyn Store, name: &str, threads: i64, sort: Sort) -> Queue {
    s.create_queue(new_queue(name, Some(threads), sort)).await.unwrap()
}

/// Sets `q`'s `threads` to `threads`; the queue as updated.
async fn set_threads(s: &dyn Store, q: &Queue, threads: i64) -> Queue {
    let update = QueueUpdate {
        threads: Some(Some(threads)),
        ..Default::default()
    };
    s.update_queue(q.id, update)
        .await
        .unwrap()
        .and_then(QueueState::readable)
        .expect("the queue")
}

async fn task(s: &dyn Store, id: ObjectId) -> disbatch::model::Task {
    s.task(id).await.unwrap().expect("task exists")
}

async fn claim_run(s: &dyn Store, q: &Queue, node: &str) -> ObjectId {
    let t = s.claim(q, node).await.unwrap().expect("a task to claim");
    assert!(disbatch::lifecycle::run::start(s, t.id, node).await.unwrap());
    t.id
}

fn ago(millis: i64) -> DateTime {
    DateTime::from_millis(DateTime::now().timestamp_millis() - millis)
}

async fn pause() {
    tokio::time::sleep(Duration::from_millis(30)).await;
}

async fn created_claimed_started_finished_field_by_field(s: Stores) {
    let q = queue(&*s.a, "spec", 2, Sort::Fifo).await;
    let params = doc! {
        "user": "ashley@example.com", "n": 7, "big": 1i64 << 40, "ratio": 2.0, "when": DateTime::from_millis(1_700_000_000_123),
        "nested": { "list": [1, "two", { "three": 3.5 }], "none": null, "flag": true },
    };
    let before = DateTime::now();
    let ids = s.a.create_tasks(q.id, vec![params.clone()]).await.unwrap();
    assert_eq!(ids.len(), 1);
    let id = ids[0];
    let created = task(&*s.b, id).await;
    assert_eq!(created.queue, q.id);
    assert_eq!(created.status, status::QUEUED);
    assert_eq!(created.node, None);
    assert_eq!((created.stdout.clone(), created.stderr.clone()), (None, None));
    assert_eq!(created.ctime, created.mtime);
    assert!(created.ctime >= DateTime::from_millis(before.timestamp_millis() - 1));
    assert_eq!(created.params, params);
    assert_eq!(created.params.get("n"), Some(&Bson::Int32(7)));
    assert_eq!(created.params.get("ratio"), Some(&Bson::Double(2.0)));
    assert!(s.a.has_queued(q.id).await.unwrap());

    let claimed = s.b.claim(&q, "den-1").await.unwrap().expect("claims the task");
    assert_eq!(claimed.id, id);
    assert_eq!(claimed.status, status::CLAIMED);
    assert_eq!(claimed.node.as_deref(), Some("den-1"));
    assert_eq!(claimed.params, params);
    assert_eq!(claimed.ctime, created.ctime);
    assert!(claimed.mtime >= created.mtime);
    assert!(!s.a.has_queued(q.id).await.unwrap());
    assert!(s.a.claim(&q, "den-2").await.unwrap().is_none());

    assert!(
        !disbatch::lifecycle::run::start(&*s.a, id, "den-2").await.unwrap(),
        "start is fenced on the node"
    );
    assert!(disbatch::lifecycle::run::start(&*s.a, id, "den-1").await.unwrap());
    assert_eq!(task(&*s.b, id).await.status, status::RUNNING);
    assert!(
        disbatch::lifecycle::run::start(&*s.a, id, "den-1").await.unwrap(),
        "a retried start of a task already running here succeeds (its first reply was lost)"
    );
    assert_eq!(task(&*s.b, id).await.stdout, None, "stdout stays null while running");

    assert!(!disbatch::lifecycle::run::finish(
        &*s.a,
        id,
        "den-2",
        1,
        OutputValue::Inline("x".into()),
        OutputValue::Inline(String::new())
    )
    .await
    .unwrap());
    assert!(disbatch::lifecycle::run::finish(
        &*s.a,
        id,
        "den-1",
        1,
        OutputValue::Inline("out\n".into()),
        OutputValue::Inline(String::new())
    )
    .await
    .unwrap());
    let done = task(&*s.b, id).await;
    assert_eq!(done.status, 1);
    assert_eq!(done.node.as_deref(), Some("den-1"));
    assert_eq!(done.stdout, Some(Output::Inline("out\n".into())));
    assert_eq!(done.stderr, Some(Output::Inline(String::new())));
    assert_eq!(done.params, params);
    assert_eq!(done.ctime, created.ctime);
    assert!(done.mtime >= claimed.mtime);
    assert!(!disbatch::lifecycle::run::finish(
        &*s.a,
        id,
        "den-1",
        2,
        OutputValue::Inline("again".into()),
        OutputValue::Inline(String::new())
    )
    .await
    .unwrap());
    assert_eq!(s.a.read_output(&Output::Inline("abc".into())).await.unwrap(), "abc");
}

async fn fifo_lifo_and_default_order(s: Stores) {
    for (name, sort) in [("fifo", Sort::Fifo), ("lifo", Sort::Lifo), ("default", Sort::Default)] {
        let q = queue(&*s.a, name, 4, sort).await;
        let mut ids = Vec::new();
        for i in 0..4 {
            ids.extend(s.a.create_tasks(q.id, vec![doc! { "i": i }]).await.unwrap());
        }
        let mut got = Vec::new();
        while let Some(t) = s.b.claim(&q, "n").await.unwrap() {
            got.push(t.id);
        }
        match sort {
            Sort::Fifo => assert_eq!(got, ids),
            Sort::Lifo => assert_eq!(got, ids.iter().rev().copied().collect::<Vec<_>>()),
            Sort::Default => {
                let (mut a, mut b) = (got.clone(), ids.clone());
                a.sort();
                b.sort();
                assert_eq!(a, b);
            }
        }
    }
}

async fn held_statuses_are_never_claimed(s: Stores) {
    let q = queue(&*s.a, "held", 4, Sort::Fifo).await;
    let ids = s.a.create_tasks(q.id, vec![doc! {}; 7]).await.unwrap();
    for (i, code) in [-6, -5, -4, -3, -7, 1, 2].into_iter().enumerate() {
        let id = claim_run(&*s.a, &q, "n").await;
        assert_eq!(id, ids[i]);
        assert!(disbatch::lifecycle::run::finish(
            &*s.a,
            id,
            "n",
            code,
            OutputValue::Inline(String::new()),
            OutputValue::Inline(String::new())
        )
        .await
        .unwrap());
    }
    assert!(!s.b.has_queued(q.id).await.unwrap());
    assert!(s.b.claim(&q, "other").await.unwrap().is_none());
    for (i, code) in [-6, -5, -4, -3, -7, 1, 2].into_iter().enumerate() {
        assert_eq!(task(&*s.b, ids[i]).await.status, code);
    }
}

async fn concurrent_claimers_get_every_task_exactly_once(s: Stores) {
    let q = queue(&*s.a, "race", 8, Sort::Fifo).await;
    let ids = s.a.create_tasks(q.id, vec![doc! {}; 200]).await.unwrap();
    let mut claimers = Vec::new();
    for c in 0..8 {
        let store = if c % 2 == 0 { s.a.clone() } else { s.b.clone() };
        let q = q.clone();
        claimers.push(tokio::spawn(async move {
            let node = format!("node-{c}");
            let mut got = Vec::new();
            while let Some(t) = store.claim(&q, &node).await.unwrap() {
                assert_eq!(t.node.as_deref(), Some(node.as_str()));
                got.push(t.id);
            }
            got
        }));
    }
    let mut all = Vec::new();
    for c in claimers {
        all.extend(c.await.unwrap());
    }
    let unique: HashSet<_> = all.iter().collect();
    assert_eq!(unique.len(), all.len(), "no task claimed twice");
    assert_eq!(unique, ids.iter().collect::<HashSet<_>>(), "every task claimed");
}

async fn slots_hold_threads_across_nodes(s: Stores) {
    let q = queue(&*s.a, "slots", 2, Sort::Fifo).await;
    let first = disbatch::lifecycle::slots::acquire_slot(&*s.a, &q, "node-a", LEASE)
        .await
        .unwrap()
        .expect("slot");
    let second = disbatch::lifecycle::slots::acquire_slot(&*s.b, &q, "node-b", LEASE)
        .await
        .unwrap()
        .expect("slot");
    assert_ne!(first.n, second.n);
    assert!([first.n, second.n].iter().all(|n| (0..2).contains(n)));
    assert!(disbatch::lifecycle::slots::acquire_slot(&*s.a, &q, "node-a", LEASE)
        .await
        .unwrap()
        .is_none());
    assert!(disbatch::lifecycle::slots::acquire_slot(&*s.b, &q, "node-c", LEASE)
        .await
        .unwrap()
        .is_none());
    disbatch::lifecycle::slots::release_slot(&*s.b, &first, "node-b")
        .await
        .unwrap();
    assert!(
        disbatch::lifecycle::slots::acquire_slot(&*s.b, &q, "node-c", LEASE)
            .await
            .unwrap()
            .is_none(),
        "only the holder gives a slot back"
    );
    disbatch::lifecycle::slots::release_slot(&*s.a, &first, "node-a")
        .await
        .unwrap();
    let again = disbatch::lifecycle::slots::acquire_slot(&*s.b, &q, "node-c", LEASE)
        .await
        .unwrap()
        .expect("freed slot");
    assert_eq!(again.n, first.n);
    let paused = queue(&*s.a, "paused", 0, Sort::Fifo).await;
    assert!(
        disbatch::lifecycle::slots::acquire_slot(&*s.a, &paused, "node-a", LEASE)
            .await
            .unwrap()
            .is_none()
    );
}

async fn lowering_threads_blocks_while_higher_slots_are_held(s: Stores) {
    let q = queue(&*s.a, "lower", 3, Sort::Fifo).await;
    let mut held = Vec::new();
    for node in ["a", "b", "c"] {
        held.push(
            disbatch::lifecycle::slots::acquire_slot(&*s.a, &q, node, LEASE)
                .await
                .unwrap()
                .expect("slot"),
        );
    }
    held.sort_by_key(|s| s.n);
    let q = set_threads(&*s.a, &q, 1).await;
    assert_eq!(q.threads, Some(1));
    disbatch::lifecycle::slots::release_slot(&*s.a, &held[0], "a")
        .await
        .unwrap();
    assert!(
        disbatch::lifecycle::slots::acquire_slot(&*s.b, &q, "d", LEASE)
            .await
            .unwrap()
            .is_none(),
        "slots 1 and 2 are still held"
    );
    disbatch::lifecycle::slots::release_slot(&*s.a, &held[1], "b")
        .await
        .unwrap();
    disbatch::lifecycle::slots::release_slot(&*s.a, &held[2], "c")
        .await
        .unwrap();
    let slot = disbatch::lifecycle::slots::acquire_slot(&*s.b, &q, "d", LEASE)
        .await
        .unwrap()
        .expect("slot under the new limit");
    assert_eq!(slot.n, 0);
    assert!(disbatch::lifecycle::slots::acquire_slot(&*s.b, &q, "e", LEASE)
        .await
        .unwrap()
        .is_none());
}

async fn expired_slots_are_free_and_heartbeats_renew_them(s: Stores) {
    let short = Duration::from_millis(300);
    let q = queue(&*s.a, "expire", 1, Sort::Fifo).await;
    disbatch::lifecycle::slots::acquire_slot(&*s.a, &q, "alive", short)
        .await
        .unwrap()
        .expect("slot");
    s.a.heartbeat("alive", LEASE).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        disbatch::lifecycle::slots::acquire_slot(&*s.b, &q, "other", LEASE)
            .await
            .unwrap()
            .is_none(),
        "a heartbeat renews its node's leases"
    );
    let q2 = queue(&*s.a, "expire-2", 1, Sort::Fifo).await;
    disbatch::lifecycle::slots::acquire_slot(&*s.a, &q2, "dead", short)
        .await
        .unwrap()
        .expect("slot");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        disbatch::lifecycle::slots::acquire_slot(&*s.b, &q2, "other", LEASE)
            .await
            .unwrap()
            .is_some(),
        "an expired lease is free"
    );
}

async fn heartbeat_upserts_and_preserves_maxthreads(s: Stores) {
    let n = s.a.heartbeat("node-1", LEASE).await.unwrap();
    assert_eq!((n.node.as_str(), n.maxthreads), ("node-1", None));
    assert!(disbatch::lifecycle::nodes::set_maxthreads(&*s.b, "node-1", Some(3))
        .await
        .unwrap());
    pause().await;
    let again = s.a.heartbeat("node-1", LEASE).await.unwrap();
    assert_eq!(again.id, n.id);
    assert_eq!(again.maxthreads, Some(3));
    assert!(again.timestamp > n.timestamp);
    s.b.heartbeat("node-0", LEASE).await.unwrap();
    let nodes = s.a.nodes().await.unwrap();
    let names: Vec<_> = nodes.iter().map(|n| n.node.as_str()).collect();
    assert_eq!(names, ["node-0", "node-1"]);
    assert!(!disbatch::lifecycle::nodes::set_maxthreads(&*s.a, "ghost", Some(1))
        .await
        .unwrap());
    assert!(matches!(
        disbatch::lifecycle::nodes::set_maxthreads(&*s.a, "node-1", Some(-1)).await,
        Err(StoreError::Invalid(_))
    ));
    assert!(disbatch::lifecycle::nodes::set_maxthreads(&*s.a, "node-1", None)
        .await
        .unwrap());
    assert_eq!(s.a.heartbeat("node-1", LEASE).await.unwrap().maxthreads, None);

    assert_eq!(again.stats, None, "no stats before the DEN reports any");
    let mut stats = NodeStats::default();
    stats.claim.observe(0.004);
    stats.run.observe(2.5);
    disbatch::lifecycle::nodes::report_stats(&*s.a, "node-1", &stats)
        .await
        .unwrap();
    let beat = s.b.heartbeat("node-1", LEASE).await.unwrap();
    assert_eq!(
        beat.stats.as_ref(),
        Some(&stats),
        "the heartbeat keeps and returns the stats"
    );
    let listed = s.b.nodes().await.unwrap();
    assert_eq!(listed[1].stats.as_ref(), Some(&stats));
    assert_eq!(listed[0].stats, None);

    assert!(
        beat.queue_problems.is_empty(),
        "no queue problems before the DEN reports any"
    );
    let q = ObjectId::new().to_hex();
    let problems = std::collections::BTreeMap::from([(q.clone(), "plugin \"x\" is not loadable".to_string())]);
    disbatch::lifecycle::nodes::report_queue_problems(&*s.a, "node-1", &problems)
        .await
        .unwrap();
    assert_eq!(s.b.heartbeat("node-1", LEASE).await.unwrap().queue_problems, problems);
    assert_eq!(s.b.nodes().await.unwrap()[1].queue_problems, problems);
    assert!(s.b.nodes().await.unwrap()[0].queue_problems.is_empty());
    disbatch::lifecycle::nodes::report_queue_problems(&*s.a, "node-1", &Default::default())
        .await
        .unwrap();
    assert!(
        s.b.nodes().await.unwrap()[1].queue_problems.is_empty(),
        "a new report replaces the old"
    );
}

async fn stale_nodes_tasks_are_recovered_and_fresh_nodes_left_alone(s: Stores) {
    let q = queue(&*s.a, "orphans", 8, Sort::Fifo).await;
    let rq =
        s.a.create_queue(NewQueue {
            extra: doc! { "on_orphan": "requeue" },
            ..new_queue("requeue", Some(8), Sort::Fifo)
        })
        .await
        .unwrap();
    assert_eq!(rq.on_orphan, OnOrphan::Requeue);
    s.a.create_tasks(q.id, vec![doc! {}; 4]).await.unwrap();
    s.a.create_tasks(rq.id, vec![doc! {}; 1]).await.unwrap();

    s.a.heartbeat("stale", LEASE).await.unwrap();
    // A stale node's slot is freed once its lease has run out too: a short one here.
    let short = Duration::from_millis(50);
    let stale_slot = disbatch::lifecycle::slots::acquire_slot(&*s.a, &q, "stale", short)
        .await
        .unwrap()
        .expect("slot");
    let stale_claimed = s.a.claim(&q, "stale").await.unwrap().unwrap().id;
    let stale_running = claim_run(&*s.a, &q, "stale").await;
    let requeued = claim_run(&*s.a, &rq, "stale").await;
    let nodeless = claim_run(&*s.a, &q, "no-such-node").await;
    let fresh_running = claim_run(&*s.b, &q, "fresh").await;
    pause().await;
    let cut = DateTime::now();
    pause().await;
    s.b.heartbeat("fresh", LEASE).await.unwrap();

    tokio::time::sleep(short * 2).await;
    let r = disbatch::lifecycle::recovery::recover_orphans(&*s.b, ago(3_600_000), cut)
        .await
        .unwrap();
    let orphaned: HashSet<_> = r.orphaned.iter().copied().collect();
    assert_eq!(orphaned, HashSet::from([stale_claimed, stale_running, nodeless]));
    assert_eq!(r.requeued, vec![requeued]);
    for id in [stale_claimed, stale_running, nodeless] {
        let t = task(&*s.a, id).await;
        assert_eq!(t.status, status::ORPHANED);
        assert!(t.node.is_some(), "an orphan keeps its node");
    }
    let t = task(&*s.a, requeued).await;
    assert_eq!((t.status, t.node), (status::QUEUED, None));
    assert!(s.a.has_queued(rq.id).await.unwrap());
    assert_eq!(task(&*s.a, fresh_running).await.status, status::RUNNING);
    // The stale node's slot was freed.
    let q1 =
        s.a.update_queue(
            q.id,
            QueueUpdate {
                threads: Some(Some(1)),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .and_then(QueueState::readable)
        .unwrap();
    assert_eq!(stale_slot.n, 0);
    assert!(disbatch::lifecycle::slots::acquire_slot(&*s.b, &q1, "fresh", LEASE)
        .await
        .unwrap()
        .is_some());
    let again = disbatch::lifecycle::recovery::recover_orphans(&*s.b, ago(3_600_000), cut)
        .await
        .unwrap();
    assert!(again.orphaned.is_empty() && again.requeued.is_empty());
}

async fn spec_sweep_orphans_old_claimed_tasks(s: Stores) {
    let q = queue(&*s.a, "sweep", 8, Sort::Fifo).await;
    s.a.create_tasks(q.id, vec![doc! {}; 3]).await.unwrap();
    s.a.heartbeat("live", LEASE).await.unwrap();
    let old_claimed = s.a.claim(&q, "live").await.unwrap().unwrap().id;
    let old_running = claim_run(&*s.a, &q, "live").await;
    pause().await;
    let cut = DateTime::now();
    pause().await;
    let new_claimed = s.a.claim(&q, "live").await.unwrap().unwrap().id;
    s.a.heartbeat("live", LEASE).await.unwrap();
    let r = disbatch::lifecycle::recovery::recover_orphans(&*s.b, cut, ago(3_600_000))
        .await
        .unwrap();
    assert_eq!(r.orphaned, vec![old_claimed]);
    assert!(r.requeued.is_empty());
    assert_eq!(task(&*s.a, old_running).await.status, status::RUNNING);
    assert_eq!(task(&*s.a, new_claimed).await.status, status::CLAIMED);
}

async fn finish_is_fenced_after_recovery(s: Stores) {
    let q = queue(&*s.a, "fence", 8, Sort::Fifo).await;
    s.a.create_tasks(q.id, vec![doc! {}; 2]).await.unwrap();
    s.a.heartbeat("gone", LEASE).await.unwrap();
    let claimed = s.a.claim(&q, "gone").await.unwrap().unwrap().id;
    let running = claim_run(&*s.a, &q, "gone").await;
    pause().await;
    let r = disbatch::lifecycle::recovery::recover_orphans(&*s.b, ago(3_600_000), DateTime::now())
        .await
        .unwrap();
    assert_eq!(r.orphaned.len(), 2);
    assert!(!disbatch::lifecycle::run::start(&*s.a, claimed, "gone").await.unwrap());
    assert!(!disbatch::lifecycle::run::finish(
        &*s.a,
        running,
        "gone",
        1,
        OutputValue::Inline("late".into()),
        OutputValue::Inline(String::new())
    )
    .await
    .unwrap());
    let t = task(&*s.b, running).await;
    assert_eq!((t.status, t.stdout), (status::ORPHANED, None));
    assert_eq!(task(&*s.b, claimed).await.status, status::ORPHANED);
}

async fn requeue_own_puts_back_only_our_unfinished_tasks(s: Stores) {
    let q = queue(&*s.a, "requeue-own", 8, Sort::Fifo).await;
    s.a.create_tasks(q.id, vec![doc! {}; 4]).await.unwrap();
    let claimed = s.a.claim(&q, "me").await.unwrap().unwrap().id;
    let running = claim_run(&*s.a, &q, "me").await;
    let done = claim_run(&*s.a, &q, "me").await;
    assert!(disbatch::lifecycle::run::finish(
        &*s.a,
        done,
        "me",
        1,
        OutputValue::Inline(String::new()),
        OutputValue::Inline(String::new())
    )
    .await
    .unwrap());
    let theirs = claim_run(&*s.b, &q, "them").await;
    let mut back = disbatch::lifecycle::run::requeue_own(&*s.a, "me", &[claimed, running, done, theirs])
        .await
        .unwrap();
    back.sort();
    let mut want = vec![claimed, running];
    want.sort();
    assert_eq!(back, want);
    for id in [claimed, running] {
        let t = task(&*s.b, id).await;
        assert_eq!((t.status, t.node), (status::QUEUED, None));
    }
    assert_eq!(task(&*s.b, done).await.status, 1);
    assert_eq!(task(&*s.b, theirs).await.status, status::RUNNING);
    assert_eq!(s.b.claim(&q, "next").await.unwrap().map(|t| t.id), Some(claimed));
}

async fn output_file_round_trip_of_20_mb_multibyte_text(s: Stores) {
    let q = queue(&*s.a, "big", 1, Sort::Fifo).await;
    s.a.create_tasks(q.id, vec![doc! {}]).await.unwrap();
    let id = claim_run(&*s.a, &q, "n").await;
    let line = "ascii, café, Ωμέγα, 漢字, 🦀 emoji\n";
    let text = line.repeat(20 * 1024 * 1024 / line.len() + 1);
    assert!(text.len() >= 20 * 1024 * 1024);
    let file =
        s.a.write_output_file(id, &format!("{id}-stdout.txt"), &text)
            .await
            .unwrap();
    let empty =
        s.a.write_output_file(id, &format!("{id}-stderr.txt"), "")
            .await
            .unwrap();
    assert!(
        disbatch::lifecycle::run::finish(&*s.a, id, "n", 1, OutputValue::File(file), OutputValue::File(empty))
            .await
            .unwrap()
    );
    let t = task(&*s.b, id).await;
    assert_eq!(t.stdout, Some(Output::File(file)));
    assert_eq!(t.stderr, Some(Output::File(empty)));
    let back = s.b.read_output(&Output::File(file)).await.unwrap();
    assert_eq!(back.len(), text.len());
    assert!(back == text, "the file reads back as written");
    assert_eq!(s.b.read_output(&Output::File(empty)).await.unwrap(), "");
    assert!(matches!(
        s.b.read_output(&Output::File(ObjectId::new())).await,
        Err(StoreError::Malformed { .. })
    ));

    // Streamed, the pieces concatenate to the same text.
    let mut pieces = s.b.output_stream(&Output::File(file)).await.unwrap();
    let mut streamed = String::new();
    while let Some(piece) = futures::TryStreamExt::try_next(&mut pieces).await.unwrap() {
        streamed.push_str(&piece);
    }
    assert!(streamed == text, "the streamed pieces make the file");
    let inline = s.b.output_stream(&Output::Inline("short".into())).await.unwrap();
    let inline: Vec<String> = futures::TryStreamExt::try_collect(inline).await.unwrap();
    assert_eq!(inline.concat(), "short");
    assert!(s.b.output_stream(&Output::File(ObjectId::new())).await.is_err());
}

async fn queue_crud_and_duplicate_names(s: Stores) {
    let created =
        s.a.create_queue(NewQueue {
            extra: doc! { "sandbox": { "timeout": "30s", "memory_mib": 64 }, "on_orphan": "requeue" },
            ..new_queue("alpha", Some(2), Sort::Lifo)
        })
        .await
        .unwrap();
    assert_eq!(created.name, "alpha");
    assert_eq!(created.plugin, "demo");
    assert_eq!(created.threads, Some(2));
    assert_eq!(created.sort, Sort::Lifo);
    assert_eq!(created.sandbox.timeout, Some(Duration::from_secs(30)));
    assert_eq!(created.sandbox.memory_mib, Some(64));
    assert_eq!(created.on_orphan, OnOrphan::Requeue);
    assert_eq!(s.b.queues().await.unwrap(), vec![created.clone()]);

    let dup = s.b.create_queue(new_queue("alpha", None, Sort::Default)).await;
    assert!(matches!(dup, Err(StoreError::Duplicate { what: "queue", ref name }) if name == "alpha"));
    assert!(matches!(
        s.a.create_queue(new_queue("neg", Some(-1), Sort::Default)).await,
        Err(StoreError::Invalid(_))
    ));
    assert!(matches!(
        s.a.create_queue(NewQueue {
            extra: doc! { "name": "sneaky" },
            ..new_queue("x", None, Sort::Default)
        })
        .await,
        Err(StoreError::Invalid(_))
    ));
    let beta = s.a.create_queue(new_queue("beta", None, Sort::Default)).await.unwrap();
    assert_eq!(beta.threads, None);

    let renamed =
        s.b.update_queue(
            created.id,
            QueueUpdate {
                name: Some("gamma".into()),
                plugin: Some("fail".into()),
                threads: Some(None),
                sort: Some(Sort::Fifo),
                extra: doc! { "on_orphan": "orphan" },
            },
        )
        .await
        .unwrap()
        .and_then(QueueState::readable)
        .expect("queue exists");
    assert_eq!(
        (
            renamed.name.as_str(),
            renamed.plugin.as_str(),
            renamed.threads,
            renamed.sort
        ),
        ("gamma", "fail", None, Sort::Fifo)
    );
    assert_eq!(renamed.on_orphan, OnOrphan::Orphan);
    assert_eq!(renamed.sandbox.memory_mib, Some(64), "other fields are kept");
    let clash =
        s.a.update_queue(
            beta.id,
            QueueUpdate {
                name: Some("gamma".into()),
                ..Default::default()
            },
        )
        .await;
    assert!(matches!(clash, Err(StoreError::Duplicate { .. })));
    let unchanged =
        s.a.update_queue(beta.id, QueueUpdate::default())
            .await
            .unwrap()
            .and_then(QueueState::readable);
    assert_eq!(unchanged, Some(beta.clone()));
    assert_eq!(
        s.a.update_queue(ObjectId::new(), QueueUpdate::default()).await.unwrap(),
        None
    );

    let tasks = s.a.create_tasks(beta.id, vec![doc! {}]).await.unwrap();
    assert!(s.b.delete_queue(beta.id).await.unwrap());
    assert!(!s.b.delete_queue(beta.id).await.unwrap());
    assert!(s.a.task(tasks[0]).await.unwrap().is_some(), "its tasks stay");
    let names: Vec<_> = s.a.queues().await.unwrap().into_iter().map(|q| q.name).collect();
    assert_eq!(names, ["gamma"]);
    s.a.create_queue(new_queue("beta", None, Sort::Default)).await.unwrap();
}

async fn task_search_counts_and_paging(s: Stores) {
    let q1 = queue(&*s.a, "one", 8, Sort::Fifo).await;
    let q2 = queue(&*s.a, "two", 8, Sort::Fifo).await;
    let ids1 =
        s.a.create_tasks(q1.id, (0..10).map(|i| doc! { "i": i }).collect())
            .await
            .unwrap();
    let ids2 = s.a.create_tasks(q2.id, vec![doc! {}; 3]).await.unwrap();
    let claimed = s.a.claim(&q1, "n1").await.unwrap().unwrap().id;
    let all = Page {
        skip: 0,
        limit: 100,
        oldest_first: false,
    };

    let found = s.b.find_tasks(&TaskFilter::default(), all).await.unwrap();
    assert_eq!(found.len(), 13);
    let mut newest_first: Vec<_> = ids1.iter().chain(&ids2).copied().collect();
    newest_first.sort();
    newest_first.reverse();
    assert_eq!(found.iter().map(|t| t.id).collect::<Vec<_>>(), newest_first);

    let in_q1 = TaskFilter {
        queue: Some(q1.id),
        ..Default::default()
    };
    assert_eq!(s.b.count_tasks(&in_q1).await.unwrap(), 10);
    let page =
        s.b.find_tasks(
            &in_q1,
            Page {
                skip: 3,
                limit: 4,
                oldest_first: false,
            },
        )
        .await
        .unwrap();
    let want: Vec<_> = ids1.iter().rev().skip(3).take(4).copied().collect();
    assert_eq!(page.iter().map(|t| t.id).collect::<Vec<_>>(), want);
    assert!(s
        .b
        .find_tasks(
            &in_q1,
            Page {
                skip: 0,
                limit: 0,
                oldest_first: false
            }
        )
        .await
        .unwrap()
        .is_empty());
    assert!(s
        .b
        .find_tasks(
            &in_q1,
            Page {
                skip: 20,
                limit: 5,
                oldest_first: false
            }
        )
        .await
        .unwrap()
        .is_empty());

    let queued_unclaimed = TaskFilter {
        queue: Some(q1.id),
        status: Some(vec![status::QUEUED]),
        node: Some(None),
        ..Default::default()
    };
    assert_eq!(s.b.count_tasks(&queued_unclaimed).await.unwrap(), 9);
    let by_node = TaskFilter {
        node: Some(Some("n1".into())),
        ..Default::default()
    };
    let mine = s.b.find_tasks(&by_node, all).await.unwrap();
    assert_eq!(mine.iter().map(|t| t.id).collect::<Vec<_>>(), vec![claimed]);
    let statuses = TaskFilter {
        status: Some(vec![status::CLAIMED, status::RUNNING]),
        ..Default::default()
    };
    assert_eq!(s.b.count_tasks(&statuses).await.unwrap(), 1);
    let one = TaskFilter {
        id: Some(ids2[1]),
        ..Default::default()
    };
    let got = s.b.find_tasks(&one, all).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].queue, q2.id);
    let none = TaskFilter {
        id: Some(ids2[1]),
        queue: Some(q1.id),
        ..Default::default()
    };
    assert_eq!(s.b.count_tasks(&none).await.unwrap(), 0);
    assert!(s.b.task(ObjectId::new()).await.unwrap().is_none());
}

async fn queue_counts_by_status(s: Stores) {
    let q1 = queue(&*s.a, "one", 8, Sort::Fifo).await;
    let q2 = queue(&*s.a, "two", 8, Sort::Fifo).await;
    s.a.create_tasks(q1.id, vec![doc! {}; 5]).await.unwrap();
    s.a.create_tasks(q2.id, vec![doc! {}; 2]).await.unwrap();
    s.a.claim(&q1, "n").await.unwrap().unwrap();
    let run = claim_run(&*s.a, &q1, "n").await;
    let done = claim_run(&*s.a, &q1, "n").await;
    assert!(disbatch::lifecycle::run::finish(
        &*s.a,
        done,
        "n",
        1,
        OutputValue::Inline(String::new()),
        OutputValue::Inline(String::new())
    )
    .await
    .unwrap());
    let _ = run;
    let counts = s.b.queue_counts().await.unwrap();
    assert_eq!(counts.len(), 2);
    let c1: Vec<_> = counts[&q1.id].iter().map(|(k, v)| (*k, *v)).collect();
    assert_eq!(c1, vec![(-2, 2), (-1, 1), (0, 1), (1, 1)]);
    let c2: Vec<_> = counts[&q2.id].iter().map(|(k, v)| (*k, *v)).collect();
    assert_eq!(c2, vec![(-2, 2)]);
}

// ---- the DEN over each store ---------------------------------------------------------

fn settings(node: &str) -> DenSettings {
    DenSettings {
        node: node.to_owned(),
        plugin_dir: common::plugins_dir(),
        plugins: vec!["demo".to_string()],
        active_queues: vec![],
        ignore_queues: vec![],
        gfs: Gfs::Auto,
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
        max_instances: 64,
        protected: Vec::new(),
        balance: Default::default(),
    }
}

/// A DEN running in this process until stopped or dropped.
struct RunningDen {
    shutdown: CancellationToken,
    handle: Option<tokio::task::JoinHandle<()>>,
}

impl RunningDen {
    fn start(store: Arc<dyn Store>, settings: DenSettings) -> Self {
        let den = Den::new(store, common::shared_runner(), settings);
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { den.run(shutdown).await.expect("DEN failed") }
        });
        RunningDen {
            shutdown,
            handle: Some(handle),
        }
    }

    async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(h) = self.handle.take() {
            h.await.expect("DEN task panicked");
        }
    }
}

impl Drop for RunningDen {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn unfinished(s: &dyn Store, queue: ObjectId) -> u64 {
    let filter = TaskFilter {
        queue: Some(queue),
        status: Some(vec![status::QUEUED, status::CLAIMED, status::RUNNING]),
        ..Default::default()
    };
    s.count_tasks(&filter).await.unwrap()
}

async fn den_runs_a_demo_task_to_success(s: Stores) {
    let q = queue(&*s.a, "demo", 4, Sort::Fifo).await;
    let params = doc! { "message": "spec", "repeat": 2, "sleep_ms": 100 };
    let id = s.a.create_tasks(q.id, vec![params.clone()]).await.unwrap()[0];
    let den = RunningDen::start(s.b.clone(), settings("node-a"));
    wait_for(Duration::from_secs(30), "the task to finish", || async {
        task(&*s.a, id).await.status > 0
    })
    .await;
    den.stop().await;
    let done = task(&*s.a, id).await;
    assert_eq!(done.status, 1);
    assert_eq!(done.node.as_deref(), Some("node-a"));
    assert_eq!(done.params, params);
    assert!(done.mtime >= done.ctime);
    let out = done.stdout.expect("stdout set");
    assert_eq!(s.a.read_output(&out).await.unwrap(), "spec\nspec\n");
    let err = done.stderr.expect("stderr set");
    assert_eq!(s.a.read_output(&err).await.unwrap(), "");
    let nodes = s.a.nodes().await.unwrap();
    assert_eq!(nodes.iter().map(|n| n.node.as_str()).collect::<Vec<_>>(), ["node-a"]);
}

async fn two_dens_never_claim_a_task_twice(s: Stores) {
    let q = queue(&*s.a, "shared", 8, Sort::Fifo).await;
    let ids = s.a.create_tasks(q.id, vec![doc! {}; 200]).await.unwrap();
    let a = Recording::new(s.a.clone());
    let b = Recording::new(s.b.clone());
    let den_a = RunningDen::start(a.clone(), settings("node-a"));
    let den_b = RunningDen::start(b.clone(), settings("node-b"));
    wait_for(Duration::from_secs(120), "all tasks to finish", || async {
        unfinished(&*s.a, q.id).await == 0
    })
    .await;
    den_a.stop().await;
    den_b.stop().await;
    let ca = a.claimed.lock().expect("lock").clone();
    let cb = b.claimed.lock().expect("lock").clone();
    let (sa, sb): (HashSet<_>, HashSet<_>) = (ca.iter().collect(), cb.iter().collect());
    println!("node-a claimed {}, node-b claimed {}", ca.len(), cb.len());
    assert_eq!(sa.len(), ca.len(), "node-a never claims a task twice");
    assert_eq!(sb.len(), cb.len(), "node-b never claims a task twice");
    assert!(sa.is_disjoint(&sb), "no task claimed by both DENs");
    assert_eq!(sa.len() + sb.len(), ids.len(), "every task claimed once");
    let succeeded = TaskFilter {
        queue: Some(q.id),
        status: Some(vec![1]),
        ..Default::default()
    };
    assert_eq!(s.a.count_tasks(&succeeded).await.unwrap(), 200);
}

/// `stale_before` for a heartbeat window of `LEASE`.
fn stale_before() -> DateTime {
    DateTime::from_millis(DateTime::now().timestamp_millis() - LEASE.as_millis() as i64)
}

async fn a_node_name_is_held_by_one_live_process(s: Stores) {
    let p1 = NodeProcess::this_process();
    let p2 = NodeProcess::this_process();
    assert_eq!(
        disbatch::lifecycle::nodes::take(&*s.a, "n", &p1, stale_before())
            .await
            .unwrap(),
        None,
        "a new name is free"
    );
    let node = s.a.heartbeat("n", LEASE).await.unwrap();
    assert_eq!(
        node.process.as_ref(),
        Some(&p1),
        "the heartbeat answers who holds the name"
    );
    assert_eq!(node.maxthreads, None);

    let refused = disbatch::lifecycle::nodes::take(&*s.b, "n", &p2, stale_before())
        .await
        .unwrap();
    assert_eq!(
        refused,
        Some(NameHolder::Den(p1.clone())),
        "a fresh holder keeps the name"
    );
    assert_eq!(
        disbatch::lifecycle::nodes::take(&*s.b, "n", &p1, stale_before())
            .await
            .unwrap(),
        None,
        "the holder may take it again"
    );
    assert!(disbatch::lifecycle::nodes::set_maxthreads(&*s.a, "n", Some(3))
        .await
        .unwrap());

    // A holder whose heartbeat is older than `stale_before` loses the name.
    let future = DateTime::from_millis(DateTime::now().timestamp_millis() + 1000);
    assert_eq!(
        disbatch::lifecycle::nodes::take(&*s.b, "n", &p2, future).await.unwrap(),
        None
    );
    let nodes = s.a.nodes().await.unwrap();
    assert_eq!(nodes.len(), 1, "still one node document");
    assert_eq!(nodes[0].process.as_ref(), Some(&p2));
    assert_eq!(
        nodes[0].maxthreads,
        Some(3),
        "taking the name keeps the operators' maxthreads"
    );

    // Only the holder can give the name up.
    disbatch::lifecycle::nodes::release(&*s.a, "n", p1.id).await.unwrap();
    assert_eq!(
        disbatch::lifecycle::nodes::take(&*s.a, "n", &p1, stale_before())
            .await
            .unwrap(),
        Some(NameHolder::Den(p2.clone()))
    );
    disbatch::lifecycle::nodes::release(&*s.b, "n", p2.id).await.unwrap();
    assert_eq!(s.a.nodes().await.unwrap()[0].process, None);
    assert_eq!(
        disbatch::lifecycle::nodes::take(&*s.a, "n", &p1, stale_before())
            .await
            .unwrap(),
        None,
        "a released name is free"
    );
}

async fn a_second_den_with_a_live_name_refuses_to_start(s: Stores) {
    let q = queue(&*s.a, "demo", 4, Sort::Fifo).await;
    let first = RunningDen::start(s.a.clone(), settings("node-twin"));
    wait_for(Duration::from_secs(30), "the first DEN to take its name", || async {
        s.a.nodes().await.unwrap().iter().any(|n| n.process.is_some())
    })
    .await;
    let second = Den::new(s.b.clone(), common::shared_runner(), settings("node-twin"));
    let err = second
        .run(CancellationToken::new())
        .await
        .expect_err("the name is held");
    let DenError::NodeInUse {
        node,
        holder: NameHolder::Den(holder),
    } = &err
    else {
        panic!("expected NodeInUse, got {err}");
    };
    assert_eq!((node.as_str(), holder.pid), ("node-twin", std::process::id()));
    let text = err.to_string();
    assert!(text.contains("node-twin") && text.contains("DISBATCH_NODE"), "{text}");

    // The first DEN still works, and gives its name up when it stops.
    let id = s.a.create_tasks(q.id, vec![doc! {}]).await.unwrap()[0];
    wait_for(Duration::from_secs(30), "the task to finish", || async {
        task(&*s.a, id).await.status > 0
    })
    .await;
    assert_eq!(task(&*s.a, id).await.node.as_deref(), Some("node-twin"));
    first.stop().await;
    assert_eq!(
        s.a.nodes().await.unwrap()[0].process,
        None,
        "a stopped DEN releases its name"
    );
    let again = RunningDen::start(s.b.clone(), settings("node-twin"));
    wait_for(Duration::from_secs(30), "a new DEN to take the name", || async {
        s.a.nodes().await.unwrap()[0].process.is_some()
    })
    .await;
    again.stop().await;
}

/// Settings of a DEN allowed the failing fixtures too.
fn settings_all_plugins(node: &str) -> DenSettings {
    let mut s = settings(node);
    s.plugins = ["demo", "fail", "spin", "alloc"].map(String::from).to_vec();
    s
}

async fn queue_with(s: &dyn Store, name: &str, plugin: &str, threads: i64, extra: Document) -> Queue {
    let mut q = new_queue(name, Some(threads), Sort::Fifo);
    q.plugin = plugin.to_string();
    q.extra = extra;
    s.create_queue(q).await.unwrap()
}

async fn den_writes_a_large_output_as_a_file(s: Stores) {
    // 20 MB of stdout: 1,000,000 lines of 19 characters + newline; stderr stays small.
    let line = "0123456789abcdefghi";
    let q = queue(&*s.a, "big", 1, Sort::Fifo).await;
    let params = doc! {"message": line, "repeat": 1_000_000, "stderr": "small"};
    let id = s.a.create_tasks(q.id, vec![params]).await.unwrap()[0];
    let den = RunningDen::start(s.b.clone(), settings("node-big"));
    wait_for(Duration::from_secs(120), "the task to finish", || async {
        task(&*s.a, id).await.status > 0
    })
    .await;
    den.stop().await;
    let done = task(&*s.a, id).await;
    assert_eq!(done.status, 1);
    let stdout = done.stdout.expect("stdout set");
    assert!(matches!(stdout, Output::File(_)), "20 MB goes to a file: {stdout:?}");
    let text = s.a.read_output(&stdout).await.unwrap();
    assert_eq!(text.len(), 20 * 1_000_000);
    assert!(text.lines().all(|l| l == line));
    assert_eq!(
        done.stderr,
        Some(Output::Inline("small\n".into())),
        "the small stream stays inline"
    );
}

async fn den_failures_end_as_status_2_with_the_reason(s: Stores) {
    let mut cases = Vec::new();
    // Only `spin` has a short timeout: on a loaded machine `alloc` may take longer than
    // 300 ms to reach its memory limit, and must fail for that limit, not for time.
    for (plugin, params, timeout, reason) in [
        ("demo", doc! {"status": 0}, "30s", "status 0"),
        (
            "fail",
            doc! {"message": "broken pipe"},
            "30s",
            "plugin error: broken pipe",
        ),
        ("spin", doc! {}, "300ms", "timeout: plugin still running after 300ms"),
        ("alloc", doc! {"mib": 512}, "30s", "memory limit"),
    ] {
        let sandbox = doc! {"sandbox": {"timeout": timeout, "memory_mib": 64}};
        let q = queue_with(&*s.a, plugin, plugin, 1, sandbox).await;
        cases.push((s.a.create_tasks(q.id, vec![params]).await.unwrap()[0], reason));
    }
    let den = RunningDen::start(s.b.clone(), settings_all_plugins("node-fail"));
    for (id, reason) in &cases {
        wait_for(Duration::from_secs(30), reason, || async {
            task(&*s.a, *id).await.status > 0
        })
        .await;
        let done = task(&*s.a, *id).await;
        assert_eq!(done.status, 2, "{reason}");
        let stderr =
            s.a.read_output(done.stderr.as_ref().expect("stderr set"))
                .await
                .unwrap();
        assert!(stderr.contains(reason), "{reason}: {stderr}");
    }
    den.stop().await;
}

async fn three_dens_hold_threads_and_maxthreads(s: Stores) {
    let q1 = queue(&*s.a, "q1", 3, Sort::Fifo).await;
    let q2 = queue(&*s.a, "q2", 5, Sort::Fifo).await;
    for q in [&q1, &q2] {
        s.a.create_tasks(q.id, vec![doc! {"sleep_ms": 5}; 300]).await.unwrap();
    }
    // node-b is limited to 2 tasks by its operator before it starts, and starts alone, so
    // the 8 slots of the queues would let it run more.
    s.a.heartbeat("node-b", LEASE).await.unwrap();
    assert!(disbatch::lifecycle::nodes::set_maxthreads(&*s.a, "node-b", Some(2))
        .await
        .unwrap());
    let mut dens = vec![RunningDen::start(s.b.clone(), settings("node-b"))];
    let busy = |queue: Option<ObjectId>, node: Option<&str>| TaskFilter {
        queue,
        node: node.map(|n| Some(n.to_string())),
        status: Some(vec![status::CLAIMED, status::RUNNING]),
        ..Default::default()
    };
    let done_by_b = TaskFilter {
        node: Some(Some("node-b".into())),
        status: Some(vec![1]),
        ..Default::default()
    };
    let (mut max_q1, mut max_q2, mut max_b, mut samples) = (0, 0, 0, 0u64);
    let start = std::time::Instant::now();
    loop {
        if dens.len() == 1 && s.a.count_tasks(&done_by_b).await.unwrap() >= 40 {
            dens.extend(["node-a", "node-c"].map(|n| RunningDen::start(s.b.clone(), settings(n))));
        }
        max_q1 = max_q1.max(s.a.count_tasks(&busy(Some(q1.id), None)).await.unwrap());
        max_q2 = max_q2.max(s.a.count_tasks(&busy(Some(q2.id), None)).await.unwrap());
        max_b = max_b.max(s.a.count_tasks(&busy(None, Some("node-b"))).await.unwrap());
        samples += 1;
        if unfinished(&*s.a, q1.id).await + unfinished(&*s.a, q2.id).await == 0 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(300), "draining took too long");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for d in dens {
        d.stop().await;
    }
    println!(
        "3 DENs drained 600 tasks in {:.1}s; {samples} samples; max running q1={max_q1} (threads 3), q2={max_q2} (threads 5), node-b={max_b} (maxthreads 2)",
        start.elapsed().as_secs_f64()
    );
    assert!(max_q1 <= 3 && max_q2 <= 5 && max_b <= 2);
    assert!(max_q2 >= 2 && max_b >= 1, "the sampler saw the queues and node-b busy");
    let succeeded = TaskFilter {
        status: Some(vec![1]),
        ..Default::default()
    };
    assert_eq!(s.a.count_tasks(&succeeded).await.unwrap(), 600);
}
