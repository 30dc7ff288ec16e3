//! Chaos: real `den` processes against the real database server under faults. Each test
//! is bounded in time and prints its figures.
//!
//! `DISBATCH_CHAOS_TASKS` sets the size of the big drain (default 8,000).

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, DateTime, Document};
use common::{count_tasks as count, insert_queue, insert_tasks, wait_for, DenProcess, TestServer};
use futures::TryStreamExt;
use mongodb::Database;

/// Claimed and running tasks per (queue, node), in one aggregation.
async fn running_by_queue_and_node(db: &Database) -> Vec<(ObjectId, String, u64)> {
    let pipeline = [
        doc! {"$match": {"status": {"$in": [-1, 0]}}},
        doc! {"$group": {"_id": {"queue": "$queue", "node": "$node"}, "n": {"$sum": 1}}},
    ];
    let groups: Vec<Document> = db
        .collection::<Document>("tasks")
        .aggregate(pipeline)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    groups
        .iter()
        .map(|g| {
            let id = g.get_document("_id").unwrap();
            let n = match g.get("n") {
                Some(bson::Bson::Int32(n)) => *n as u64,
                Some(bson::Bson::Int64(n)) => *n as u64,
                other => panic!("count {other:?}"),
            };
            (
                id.get_object_id("queue").unwrap(),
                id.get_str("node").unwrap_or_default().to_owned(),
                n,
            )
        })
        .collect()
}

async fn unfinished(db: &Database) -> u64 {
    count(db, doc! {"status": {"$in": [-2, -1, 0]}}).await
}

/// The DEN of the drain that is paused (SIGSTOP) past `heartbeat_stale`, then resumed.
const PAUSED: &str = "chaos-2";

/// Where the drain's pause of [`PAUSED`] stands.
#[derive(Debug)]
enum Pause {
    /// Waiting for a fifth of the tasks to succeed with [`PAUSED`] busy.
    Before,
    /// Stopped `since` (`wall` on the wall clock); resumed once `heartbeat_stale` has passed
    /// and the others recovered what it held.
    Paused { since: Instant, wall: DateTime },
    /// Stopped at `paused` (its last heartbeat at `last_beat`), resumed at `at` after
    /// `after`, with `unfinished` tasks to run.
    Resumed {
        paused: DateTime,
        last_beat: DateTime,
        at: DateTime,
        after: Duration,
        unfinished: u64,
    },
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_dens_drain_many_tasks_exactly_once_within_limits() {
    let total: usize = std::env::var("DISBATCH_CHAOS_TASKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8_000);
    let t = common::test_db("chaos_drain").await;
    let marks = tempfile::tempdir().unwrap();
    let grant = format!("{}:/out:rw", marks.path().display());
    let limits = [("small", 3), ("medium", 6), ("large", 10)];
    let mut queues = Vec::new();
    for (name, threads) in limits {
        let q = insert_queue(
            &t.db,
            name,
            "mark",
            doc! {"threads": threads, "sandbox": {"dirs": [&grant]}},
        )
        .await;
        queues.push((q, threads));
    }
    let mut n = 0usize;
    for (i, (q, _)) in queues.iter().enumerate() {
        let share = total / 3 + usize::from(i < total % 3);
        let params = (n..n + share).map(|k| doc! {"path": format!("/out/{k}"), "sleep_ms": 10});
        insert_tasks(&t.db, *q, params).await;
        n += share;
    }
    let maxthreads = [
        ("chaos-1", Some(2)),
        ("chaos-2", Some(4)),
        ("chaos-3", None),
        ("chaos-4", None),
    ];
    for (node, max) in maxthreads {
        if let Some(m) = max {
            t.db.collection::<Document>("nodes")
                // No heartbeat yet: a fresh `timestamp` without `process` is a Disbatch 4 DEN's.
                .insert_one(doc! {"node": node, "maxthreads": m})
                .await
                .unwrap();
        }
    }
    let stale = Duration::from_secs(30);
    let extra = serde_json::json!({"plugins": ["mark"], "heartbeat_stale": stale.as_secs()});
    let dens: Vec<DenProcess> = maxthreads
        .iter()
        .map(|(node, _)| DenProcess::start(&t.uri, &t.name, node, extra.clone()))
        .collect();
    let paused = &dens[maxthreads.iter().position(|(n, _)| *n == PAUSED).unwrap()];

    let start = Instant::now();
    let mut samples = 0u64;
    let mut peak_queue: BTreeMap<ObjectId, u64> = BTreeMap::new();
    let mut peak_node: BTreeMap<String, u64> = BTreeMap::new();
    let mut pause = Pause::Before;
    // One snapshot every 50 ms: the claimed and running tasks grouped by queue and node, in
    // one query so the per-queue and per-node figures come from the same instant. Each is
    // checked against its limit as it is taken.
    let mut every = tokio::time::interval(Duration::from_millis(50));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let mut by_queue: BTreeMap<ObjectId, u64> = BTreeMap::new();
        let mut by_node: BTreeMap<String, u64> = BTreeMap::new();
        for (queue, node, n) in running_by_queue_and_node(&t.db).await {
            *by_queue.entry(queue).or_default() += n;
            *by_node.entry(node).or_default() += n;
        }
        let at = start.elapsed().as_secs_f64();
        for (q, threads) in &queues {
            let n = by_queue.get(q).copied().unwrap_or(0);
            assert!(
                n <= *threads as u64,
                "{at:.1}s ({pause:?}): queue {q} with threads {threads} shows {n} tasks at -1/0"
            );
        }
        for (node, max) in &maxthreads {
            let n = by_node.get(*node).copied().unwrap_or(0);
            if let Some(m) = max {
                assert!(
                    n <= *m as u64,
                    "{at:.1}s ({pause:?}): node {node} with maxthreads {m} shows {n} tasks at -1/0"
                );
            }
        }
        for (q, n) in by_queue {
            let p = peak_queue.entry(q).or_default();
            *p = (*p).max(n);
        }
        for (node, n) in &by_node {
            let p = peak_node.entry(node.clone()).or_default();
            *p = (*p).max(*n);
        }
        samples += 1;
        let held_by_paused = by_node.get(PAUSED).copied().unwrap_or(0);
        match pause {
            // Checked once a second: it counts the succeeded tasks.
            Pause::Before
                if samples.is_multiple_of(20)
                    && held_by_paused > 0
                    && count(&t.db, doc! {"status": 1}).await as usize >= total / 5 =>
            {
                paused.pause();
                pause = Pause::Paused {
                    since: Instant::now(),
                    wall: DateTime::now(),
                };
            }
            // The others recovered what it held (after `heartbeat_stale`): let it go on.
            Pause::Paused { since, wall } if held_by_paused == 0 && since.elapsed() >= stale => {
                // Its last heartbeat, read while it is still stopped: on a loaded machine
                // it may be well before the pause.
                let node = common::find_docs(&t.db, "nodes", doc! {"node": PAUSED}).await;
                let last_beat = *node[0].get_datetime("timestamp").unwrap();
                paused.resume();
                if count(&t.db, doc! {"status": -6}).await == 0 {
                    // Its last tasks ended as it stopped: nothing was recovered; again later.
                    pause = Pause::Before;
                } else {
                    pause = Pause::Resumed {
                        paused: wall,
                        last_beat,
                        at: DateTime::now(),
                        after: since.elapsed(),
                        unfinished: unfinished(&t.db).await,
                    };
                }
            }
            _ => {}
        }
        // The end of the drain is checked once a second: it counts every unfinished task,
        // which would slow the 50 ms samples down on a large queue.
        if samples.is_multiple_of(20) && unfinished(&t.db).await == 0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(1500),
            "drain took over 25 minutes"
        );
    }
    let elapsed = start.elapsed();
    let Pause::Resumed {
        paused: paused_at,
        last_beat,
        at: resumed_at,
        after: paused_for,
        unfinished: left_at_resume,
    } = pause
    else {
        panic!("the drain ended before {PAUSED} was paused and resumed: {pause:?}");
    };
    let paused_log = paused.log();
    drop(dens);
    let succeeded = count(&t.db, doc! {"status": 1}).await;
    let orphaned = count(&t.db, doc! {"status": -6}).await;
    let failed = count(&t.db, doc! {"status": 2}).await;
    let files = std::fs::read_dir(marks.path()).unwrap().count() as u64;
    println!(
        "chaos drain: {total} tasks, 4 DENs, {:.1}s ({:.0} tasks/s), {samples} samples, one every {:.0} ms",
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1000.0 / samples as f64
    );
    println!(
        "  {PAUSED} paused {:.1}s (stale window {}s): {orphaned} of its tasks orphaned, {left_at_resume} unfinished at its resume",
        paused_for.as_secs_f64(),
        stale.as_secs()
    );
    for (q, threads) in &queues {
        println!(
            "  queue threads {threads}: peak at -1/0 {}",
            peak_queue.get(q).copied().unwrap_or(0)
        );
    }
    for (node, max) in &maxthreads {
        println!(
            "  node {node} maxthreads {max:?}: peak at -1/0 {}",
            peak_node.get(*node).copied().unwrap_or(0)
        );
    }
    println!("  succeeded {succeeded}, orphaned {orphaned}, failed {failed}, ran (marks) {files}, unfinished 0");
    assert_eq!(failed, 0, "no task failed (a second run of a task fails)");
    assert_eq!(
        succeeded + orphaned,
        total as u64,
        "every task succeeded or was orphaned"
    );
    assert!(orphaned > 0, "the paused DEN held tasks that were recovered");
    let orphans = common::find_docs(&t.db, "tasks", doc! {"status": -6}).await;
    // Recovered only once its last heartbeat was older than the stale window.
    let not_before = last_beat.timestamp_millis() + stale.as_millis() as i64;
    for d in &orphans {
        assert_eq!(
            d.get_str("node").unwrap(),
            PAUSED,
            "only the paused DEN's tasks are orphaned: {d}"
        );
        let recovered = d.get_datetime("mtime").unwrap().timestamp_millis();
        assert!(
            recovered >= not_before,
            "recovered {} ms after its last heartbeat ({} ms before the pause), within the stale window: {d}",
            recovered - last_beat.timestamp_millis(),
            paused_at.timestamp_millis() - last_beat.timestamp_millis()
        );
        assert!(
            d.get("stdout").is_some_and(|v| *v == bson::Bson::Null),
            "the paused DEN wrote no result: {d}"
        );
    }
    // Each succeeded task ran once; an orphaned one at most once (before the pause).
    assert!(
        (succeeded..=succeeded + orphaned).contains(&files),
        "runs (marks) {files} for {succeeded} succeeded and {orphaned} orphaned tasks"
    );
    assert!(
        !paused_log.contains("already ran"),
        "the paused DEN's plugins acted after resuming:\n{paused_log}"
    );
    if left_at_resume > 1000 {
        let after = count(&t.db, doc! {"node": PAUSED, "status": 1, "mtime": {"$gt": resumed_at}}).await;
        assert!(after > 0, "the resumed DEN ran tasks again:\n{paused_log}");
    }
    for (q, threads) in &queues {
        let peak = peak_queue.get(q).copied().unwrap_or(0);
        assert!(peak > 0, "the samples saw queue {q} running");
        assert!(peak <= *threads as u64, "queue limit {threads} exceeded: {peak}");
    }
    for (node, max) in &maxthreads {
        let peak = peak_node.get(*node).copied().unwrap_or(0);
        assert!(peak > 0, "the samples saw {node} running");
        if let Some(m) = max {
            assert!(peak <= *m as u64, "{node} exceeded maxthreads {m}: {peak}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_a_den_mid_run_loses_nothing() {
    let t = common::test_db("chaos_kill").await;
    let requeue = insert_queue(&t.db, "requeue", "demo", doc! {"threads": 6, "on_orphan": "requeue"}).await;
    let orphan = insert_queue(&t.db, "orphan", "demo", doc! {"threads": 6}).await;
    insert_tasks(&t.db, requeue, (0..300).map(|_| doc! {"sleep_ms": 200})).await;
    insert_tasks(&t.db, orphan, (0..300).map(|_| doc! {"sleep_ms": 200})).await;
    let stale = 2;
    let extra = serde_json::json!({"heartbeat_stale": stale});
    let mut victim = DenProcess::start(&t.uri, &t.name, "victim", extra.clone());
    let _a = DenProcess::start(&t.uri, &t.name, "survivor-a", extra.clone());
    let _b = DenProcess::start(&t.uri, &t.name, "survivor-b", extra.clone());
    wait_for(
        Duration::from_secs(60),
        "the run to be under way with the victim busy",
        || async {
            count(&t.db, doc! {"status": 1}).await >= 30
                && count(&t.db, doc! {"node": "victim", "status": {"$in": [-1, 0]}}).await > 0
        },
    )
    .await;
    victim.signal(libc::SIGKILL);
    victim.wait_exit(Duration::from_secs(10));
    let killed = Instant::now();
    let held = common::find_docs(&t.db, "tasks", doc! {"node": "victim", "status": {"$in": [-1, 0]}}).await;
    let held_ids: Vec<ObjectId> = held.iter().map(|d| d.get_object_id("_id").unwrap()).collect();
    wait_for(
        Duration::from_secs(30),
        "the victim's tasks to be recovered",
        || async {
            count(
                &t.db,
                doc! {"_id": {"$in": &held_ids}, "node": "victim", "status": {"$in": [-1, 0]}},
            )
            .await
                == 0
        },
    )
    .await;
    let recovered_after = killed.elapsed();
    wait_for(
        Duration::from_secs(120),
        "every task to finish or be orphaned",
        || async { unfinished(&t.db).await == 0 },
    )
    .await;
    let orphaned = count(&t.db, doc! {"status": -6}).await;
    let requeue_ok = count(&t.db, doc! {"queue": requeue, "status": 1}).await;
    println!(
        "kill -9: victim held {} tasks; recovered {:.2}s after the kill (stale window {stale} s); {orphaned} orphaned (-6), requeue queue {requeue_ok}/300 succeeded",
        held_ids.len(),
        recovered_after.as_secs_f64()
    );
    assert!(
        recovered_after <= Duration::from_secs(stale + 2),
        "recovered after {recovered_after:?}"
    );
    assert_eq!(requeue_ok, 300, "with on_orphan requeue every task ends succeeded");
    // Every orphan is the victim's, and every task it held in the orphan queue is one. (A
    // claim it sent just before dying can land after `held` was read: one more orphan.)
    let held_orphan: Vec<ObjectId> = held
        .iter()
        .filter(|d| d.get_object_id("queue").unwrap() == orphan)
        .map(|d| d.get_object_id("_id").unwrap())
        .collect();
    assert_eq!(
        count(&t.db, doc! {"status": -6, "node": {"$ne": "victim"}}).await,
        0,
        "only the victim's tasks are orphaned"
    );
    assert_eq!(
        count(&t.db, doc! {"_id": {"$in": &held_orphan}, "status": -6}).await,
        held_orphan.len() as u64,
        "every task the victim held in the orphan queue is orphaned"
    );
    assert_eq!(count(&t.db, doc! {"queue": orphan, "status": 1}).await + orphaned, 300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_outage_loses_nothing() {
    let mut server = tokio::task::spawn_blocking(TestServer::start_private).await.unwrap();
    let t = common::test_db_at(&server.uri(), "chaos_outage").await;
    // `mark` creates /out/<k> exclusively: a task run twice fails, and the files count the runs.
    let marks = tempfile::tempdir().unwrap();
    let grant = format!("{}:/out:rw", marks.path().display());
    let q = insert_queue(
        &t.db,
        "outage",
        "mark",
        doc! {"threads": 8, "sandbox": {"dirs": [&grant]}},
    )
    .await;
    let params = (0..300).map(|k| doc! {"path": format!("/out/{k}"), "sleep_ms": 200});
    let ids = insert_tasks(&t.db, q, params).await;
    let extra = serde_json::json!({"plugins": ["mark"], "heartbeat_stale": 30});
    let a = DenProcess::start(&t.uri, &t.name, "outage-a", extra.clone());
    let b = DenProcess::start(&t.uri, &t.name, "outage-b", extra.clone());
    wait_for(Duration::from_secs(60), "100 tasks", || async {
        count(&t.db, doc! {"status": 1}).await >= 100
    })
    .await;
    let running: Vec<(ObjectId, String)> = common::find_docs(&t.db, "tasks", doc! {"status": 0})
        .await
        .iter()
        .map(|d| (d.get_object_id("_id").unwrap(), d.get_str("node").unwrap().to_owned()))
        .collect();
    let running_before = running.len();
    let port = server.port();
    let stopped = Instant::now();
    server = tokio::task::spawn_blocking(move || {
        server.stop();
        std::thread::sleep(Duration::from_secs(5));
        server.restart();
        server
    })
    .await
    .unwrap();
    assert_eq!(server.port(), port, "the server came back on the same port");
    let outage = stopped.elapsed();
    wait_for(
        Duration::from_secs(180),
        "every task to finish after the outage",
        || async { count(&t.db, doc! {"_id": {"$in": &ids}, "status": 1}).await == 300 },
    )
    .await;
    let recovered = stopped.elapsed();
    let lost = count(&t.db, doc! {"status": {"$ne": 1}}).await;
    println!(
        "db outage: {running_before} tasks running when the server stopped for {:.1}s; all 300 finished {:.1}s after the stop; {lost} lost or stuck",
        outage.as_secs_f64(),
        recovered.as_secs_f64()
    );
    assert_eq!(lost, 0);
    let runs = std::fs::read_dir(marks.path()).unwrap().count();
    println!(
        "  runs (marks) {runs}, tasks running at the stop {running_before}, all finished by the node that ran them"
    );
    assert_eq!(runs, 300, "every task ran exactly once");
    for (id, node) in &running {
        let d = common::task_doc_of(&t.db, *id).await;
        assert_eq!(
            d.get_str("node").unwrap(),
            node,
            "task {id} kept by its node through the outage"
        );
    }
    // The outage and the recovery are logged. A DEN logs "reachable again" after its first
    // call that succeeds again, which may land after the last task's result is written.
    for den in [&a, &b] {
        den.wait_for_log(Duration::from_secs(30), "database unreachable").await;
        den.wait_for_log(Duration::from_secs(30), "reachable again").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_under_load_leaves_nothing_claimed() {
    let t = common::test_db("chaos_sigterm").await;
    let q = insert_queue(&t.db, "load", "demo", doc! {"threads": 12}).await;
    insert_tasks(&t.db, q, (0..400).map(|_| doc! {"sleep_ms": 150})).await;
    let extra = serde_json::json!({"heartbeat_stale": 30, "shutdown_grace": 1});
    let mut leaving = DenProcess::start(&t.uri, &t.name, "leaving", extra.clone());
    let _staying = DenProcess::start(&t.uri, &t.name, "staying", extra.clone());
    wait_for(Duration::from_secs(60), "the leaving DEN to be busy", || async {
        count(&t.db, doc! {"node": "leaving", "status": 0}).await >= 1
    })
    .await;
    let held = count(&t.db, doc! {"node": "leaving", "status": {"$in": [-1, 0]}}).await;
    leaving.signal(libc::SIGTERM);
    let status = leaving.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "{status:?}\n{}", leaving.log());
    let left = count(&t.db, doc! {"node": "leaving", "status": {"$in": [-1, 0]}}).await;
    assert_eq!(left, 0, "nothing left claimed or running by the stopped DEN");
    wait_for(
        Duration::from_secs(120),
        "the staying DEN to finish everything",
        || async { unfinished(&t.db).await == 0 },
    )
    .await;
    let ok = count(&t.db, doc! {"status": 1}).await;
    println!("sigterm under load: the leaving DEN held {held} tasks; 0 left claimed; {ok}/400 succeeded");
    assert_eq!(ok, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_outage_longer_than_the_stale_window_orphans_no_live_node() {
    let mut server = tokio::task::spawn_blocking(TestServer::start_private).await.unwrap();
    let t = common::test_db_at(&server.uri(), "chaos_long_outage").await;
    let q = insert_queue(&t.db, "long", "demo", doc! {"threads": 4}).await;
    let ids = insert_tasks(&t.db, q, (0..4).map(|_| doc! {"sleep_ms": 9000})).await;
    // Heartbeats go stale after 2 s; the outage lasts 5 s.
    let extra = serde_json::json!({"heartbeat_stale": 2});
    let a = DenProcess::start(&t.uri, &t.name, "long-a", extra.clone());
    let b = DenProcess::start(&t.uri, &t.name, "long-b", extra.clone());
    wait_for(Duration::from_secs(60), "4 running tasks", || async {
        count(&t.db, doc! {"status": 0}).await == 4
    })
    .await;
    server = tokio::task::spawn_blocking(move || {
        server.stop();
        std::thread::sleep(Duration::from_secs(5));
        server.restart();
        server
    })
    .await
    .unwrap();
    let start = Instant::now();
    while count(&t.db, doc! {"_id": {"$in": &ids}, "status": {"$gt": 0}}).await < 4 {
        if start.elapsed() > Duration::from_secs(40) {
            let docs = common::find_docs(&t.db, "tasks", doc! {}).await;
            panic!("tasks did not finish: {docs:?}\n{}\n{}", a.log(), b.log());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ok = count(&t.db, doc! {"_id": {"$in": &ids}, "status": 1}).await;
    let orphaned = count(&t.db, doc! {"status": -6}).await;
    println!("long outage: 4 tasks running through a 5 s outage with a 2 s stale window: {ok} succeeded, {orphaned} orphaned");
    assert_eq!(
        orphaned,
        0,
        "no live node's task is orphaned after the outage:\n{}\n{}",
        a.log(),
        b.log()
    );
    assert_eq!(ok, 4);
    drop(server);
}
