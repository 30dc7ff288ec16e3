//! The `den` binary as a real process: recovery after `kill -9` (by the stale window, and
//! at once when it restarts under its name), graceful shutdown on SIGTERM, and clear
//! errors for bad config files.

use crate::common;

use common::{count_tasks as count, insert_queue, insert_tasks, wait_for, DenProcess};

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use mongodb::Database;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tasks_of_a_killed_den_are_recovered_after_the_stale_window() {
    let t = common::test_db("den_kill9").await;
    let orphan_q = insert_queue(&t.db, "orphan", "demo", doc! {}).await;
    let requeue_q = insert_queue(&t.db, "requeue", "demo", doc! {"on_orphan": "requeue"}).await;
    let orphans = insert_tasks(&t.db, orphan_q, (0..2).map(|_| doc! {"sleep_ms": 3000})).await;
    let requeued = insert_tasks(&t.db, requeue_q, (0..2).map(|_| doc! {"sleep_ms": 3000})).await;

    let mut victim = DenProcess::start(&t.uri, &t.name, "victim", serde_json::json!({}));
    wait_for(Duration::from_secs(30), "the victim to run all 4 tasks", || async {
        count(&t.db, doc! {"node": "victim", "status": 0}).await == 4
    })
    .await;
    victim.signal(libc::SIGKILL);
    victim.wait_exit(Duration::from_secs(10));
    let killed = Instant::now();

    let _rescuer = DenProcess::start(&t.uri, &t.name, "rescuer", serde_json::json!({}));
    wait_for(
        Duration::from_secs(30),
        "the victim's tasks to be recovered",
        || async { count(&t.db, doc! {"_id": {"$in": &orphans}, "status": -6}).await == 2 },
    )
    .await;
    let recovered_after = killed.elapsed();
    for id in &orphans {
        let d =
            t.db.collection::<Document>("tasks")
                .find_one(doc! {"_id": id})
                .await
                .unwrap()
                .unwrap();
        assert_eq!(
            d.get_str("node").unwrap(),
            "victim",
            "an orphan keeps the node it ran on"
        );
    }
    wait_for(
        Duration::from_secs(30),
        "requeued tasks to succeed on the rescuer",
        || async { count(&t.db, doc! {"_id": {"$in": &requeued}, "status": 1, "node": "rescuer"}).await == 2 },
    )
    .await;
    println!(
        "kill -9: tasks recovered {:.2}s after the kill (stale window 2 s + 1 s tick)",
        recovered_after.as_secs_f64()
    );
    assert!(
        recovered_after < Duration::from_secs(2 + 1 + 3),
        "recovered after {recovered_after:?}"
    );
}

/// Samples, until `stop`, the tasks at -1/0 of each queue as the database shows them;
/// returns the highest count seen per queue and the number of samples.
async fn sample_held(db: Database, queues: Vec<ObjectId>, stop: Arc<AtomicBool>) -> (Vec<u64>, u64) {
    let mut peaks = vec![0; queues.len()];
    let mut samples = 0;
    while !stop.load(Ordering::SeqCst) {
        for (q, peak) in queues.iter().zip(&mut peaks) {
            let n = count(&db, doc! {"queue": q, "status": {"$in": [-1, 0]}}).await;
            *peak = (*peak).max(n);
        }
        samples += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (peaks, samples)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_den_killed_mid_plugin_and_restarted_under_its_name_recovers_at_once() {
    let t = common::test_db("den_phoenix").await;
    let requeue = insert_queue(&t.db, "requeue", "demo", doc! {"threads": 2, "on_orphan": "requeue"}).await;
    let orphan = insert_queue(&t.db, "orphan", "demo", doc! {"threads": 1}).await;
    let again = insert_tasks(&t.db, requeue, (0..6).map(|_| doc! {"sleep_ms": 1500})).await;
    let lost = insert_tasks(&t.db, orphan, (0..1).map(|_| doc! {"sleep_ms": 600_000})).await;
    // A stale window far longer than the test: only the name take-over can recover in time.
    let config = serde_json::json!({"heartbeat_stale": 120});
    let mut first = DenProcess::start(&t.uri, &t.name, "phoenix", config.clone());
    wait_for(Duration::from_secs(60), "both queues' plugins to run", || async {
        count(&t.db, doc! {"queue": requeue, "status": 0}).await == 2
            && count(&t.db, doc! {"queue": orphan, "status": 0}).await == 1
    })
    .await;
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn(sample_held(t.db.clone(), vec![requeue, orphan], stop.clone()));
    let held: Vec<ObjectId> = common::find_docs(&t.db, "tasks", doc! {"node": "phoenix", "status": {"$in": [-1, 0]}})
        .await
        .iter()
        .map(|d| d.get_object_id("_id").unwrap())
        .collect();
    first.signal(libc::SIGKILL);
    first.wait_exit(Duration::from_secs(10));
    let killed = Instant::now();
    let second = DenProcess::start(&t.uri, &t.name, "phoenix", config);
    wait_for(
        Duration::from_secs(30),
        "the killed process's orphan-queue task to be orphaned",
        || async { count(&t.db, doc! {"_id": {"$in": &lost}, "status": -6}).await == 1 },
    )
    .await;
    let recovered_after = killed.elapsed();
    wait_for(
        Duration::from_secs(60),
        "the requeue queue to be run to the end by the restarted process",
        || async { count(&t.db, doc! {"_id": {"$in": &again}, "status": 1, "node": "phoenix"}).await == 6 },
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    let (peaks, samples) = sampler.await.unwrap();
    let held_slots = common::find_docs(&t.db, "slots", doc! {"holder": {"$ne": Bson::Null}}).await;
    println!(
        "kill -9 and restart under the same name: {} tasks held, recovered {:.2}s after the kill \
         (stale window 120 s); peaks at -1/0 {peaks:?} over {samples} samples",
        held.len(),
        recovered_after.as_secs_f64()
    );
    assert!(
        recovered_after < Duration::from_secs(20),
        "recovered after {recovered_after:?}:\n{}",
        second.log()
    );
    assert!(
        peaks[0] <= 2,
        "the requeue queue (threads 2) showed {} at -1/0",
        peaks[0]
    );
    assert!(
        peaks[1] <= 1,
        "the orphan queue (threads 1) showed {} at -1/0",
        peaks[1]
    );
    let orphaned = common::task_doc_of(&t.db, lost[0]).await;
    assert_eq!(orphaned.get_str("node").unwrap(), "phoenix", "{orphaned}");
    // The orphan queue's slot was freed with its task: nothing holds it any more.
    assert!(
        held_slots.iter().all(|s| s.get_object_id("queue").unwrap() != orphan),
        "the dead process's slot is still held: {held_slots:?}"
    );
    assert_eq!(count(&t.db, doc! {"status": 2}).await, 0, "no task failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_lets_short_tasks_finish_and_requeues_the_rest() {
    let t = common::test_db("den_sigterm").await;
    let q = insert_queue(&t.db, "mixed", "demo", doc! {"threads": 4}).await;
    let long = insert_tasks(&t.db, q, (0..2).map(|_| doc! {"sleep_ms": 60_000})).await;
    let short = insert_tasks(&t.db, q, (0..2).map(|_| doc! {"sleep_ms": 300})).await;
    let mut den = DenProcess::start(&t.uri, &t.name, "graceful", serde_json::json!({"shutdown_grace": 3}));
    wait_for(Duration::from_secs(30), "4 running tasks", || async {
        count(&t.db, doc! {"queue": q, "status": 0}).await == 4
    })
    .await;
    den.signal(libc::SIGTERM);
    let status = den.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "graceful shutdown exits 0: {status:?}\n{}", den.log());
    assert_eq!(
        count(&t.db, doc! {"_id": {"$in": &short}, "status": 1}).await,
        2,
        "short tasks finished"
    );
    assert_eq!(
        count(&t.db, doc! {"_id": {"$in": &long}, "status": -2, "node": Bson::Null}).await,
        2,
        "long tasks went back to the queue"
    );
    let held =
        t.db.collection::<Document>("slots")
            .count_documents(doc! {"holder": "graceful"})
            .await
            .unwrap();
    assert_eq!(held, 0, "no slot left held");
    let log = den.log();
    assert!(log.contains("put unfinished tasks back in their queue"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_signal_exits_at_once() {
    let t = common::test_db("den_twice").await;
    let q = insert_queue(&t.db, "long", "demo", doc! {}).await;
    insert_tasks(&t.db, q, (0..1).map(|_| doc! {"sleep_ms": 60_000})).await;
    let mut den = DenProcess::start(&t.uri, &t.name, "impatient", serde_json::json!({"shutdown_grace": 60}));
    wait_for(Duration::from_secs(30), "the task to run", || async {
        count(&t.db, doc! {"queue": q, "status": 0}).await == 1
    })
    .await;
    den.signal(libc::SIGINT);
    wait_for(Duration::from_secs(10), "the shutdown to start", || {
        let log = den.log();
        async move { log.contains("shutting down gracefully") }
    })
    .await;
    den.signal(libc::SIGINT);
    let status = den.wait_exit(Duration::from_secs(5));
    assert_eq!(status.code(), Some(130));
}

fn den_with_config(dir: &Path, name: &str, text: &str) -> (Option<i32>, String) {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_den"))
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn bad_config_files_fail_with_the_key_named() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "missing-db.json",
            r#"{"mongohost":"mongodb://127.0.0.1:1"}"#,
            "database",
        ),
        (
            "bad-type.json",
            r#"{"mongohost":"mongodb://127.0.0.1:1","database":"d","heartbeat_stale":"x"}"#,
            "heartbeat_stale",
        ),
        (
            "bad-uri.json",
            r#"{"mongohost":"http://x","database":"d"}"#,
            "mongohost",
        ),
        (
            "bad-plugin.json",
            r#"{"mongohost":"mongodb://h","database":"d","plugins":["../evil"]}"#,
            "plugins",
        ),
        (
            "bad-gfs.json",
            r#"{"mongohost":"mongodb://h","database":"d","gfs":"sometimes"}"#,
            "gfs",
        ),
        ("syntax.json", "{\"mongohost\": ", "syntax.json"),
    ];
    for (file, text, key) in cases {
        let (code, err) = den_with_config(dir.path(), file, text);
        assert_eq!(code, Some(2), "{file}: {err}");
        assert!(err.contains(key), "{file}: the error names {key}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{file}: one line: {err}");
    }
    let missing = Command::new(env!("CARGO_BIN_EXE_den"))
        .args(["--config", "/no/such/den.json"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/no/such/den.json"));
}
