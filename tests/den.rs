//! The DEN against the real database server: the task lifecycle field by field, claim
//! order, held statuses, allowlists, GridFS, failures, and the limits under several DENs.

use crate::common;

use common::{count_tasks as count, insert_queue, insert_task, task_doc_of as task_doc, wait_for, Recording};

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch::config::Gfs;
use disbatch::den::{Den, DenSettings};
use disbatch::model::Output;
use disbatch::runner::Sandbox;
use disbatch::store::testing::StoreExt;
use disbatch::store::*;
use futures::TryStreamExt;
use mongodb::Database;
use tokio_util::sync::CancellationToken;

fn settings(node: &str) -> DenSettings {
    DenSettings {
        node: node.to_owned(),
        plugin_dir: common::plugins_dir(),
        plugins: ["demo", "fail", "spin", "alloc", "flood", "escape"]
            .map(String::from)
            .to_vec(),
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
        tick: Duration::from_millis(200),
        max_instances: 64,
        protected: Vec::new(),
        balance: Default::default(),
    }
}

/// A DEN running in this process until dropped or stopped.
struct RunningDen {
    den: Arc<Den>,
    shutdown: CancellationToken,
    handle: Option<tokio::task::JoinHandle<()>>,
}

impl RunningDen {
    fn start(store: Arc<dyn Store>, settings: DenSettings) -> Self {
        let den = Den::new(store, common::shared_runner(), settings);
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn({
            let den = den.clone();
            let shutdown = shutdown.clone();
            async move { den.run(shutdown).await.expect("DEN failed") }
        });
        RunningDen {
            den,
            shutdown,
            handle: Some(handle),
        }
    }

    async fn stop(mut self) {
        self.shutdown.cancel();
        self.handle.take().unwrap().await.unwrap();
    }
}

impl Drop for RunningDen {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn status_of(db: &Database, id: ObjectId) -> i32 {
    task_doc(db, id).await.get_i32("status").unwrap()
}

async fn all_done(db: &Database, queue: ObjectId) -> bool {
    count(db, doc! {"queue": queue, "status": {"$lte": 0}}).await == 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lifecycle_fields_follow_the_spec() {
    let t = common::test_db("den_lifecycle").await;
    let q = insert_queue(&t.db, "demo", "demo", doc! {}).await;
    let id = insert_task(&t.db, q, -2, doc! {"message": "spec", "repeat": 2, "sleep_ms": 400}).await;
    let before = task_doc(&t.db, id).await;
    let den = RunningDen::start(Arc::new(t.store.clone()), settings("node-a"));

    wait_for(Duration::from_secs(20), "the task to be running", || async {
        status_of(&t.db, id).await == 0
    })
    .await;
    let running = task_doc(&t.db, id).await;
    assert_eq!(running.get_str("node").unwrap(), "node-a");
    assert_eq!(
        running.get("stdout"),
        Some(&Bson::Null),
        "stdout stays null while running"
    );

    wait_for(Duration::from_secs(20), "the task to finish", || async {
        status_of(&t.db, id).await > 0
    })
    .await;
    let done = task_doc(&t.db, id).await;
    assert_eq!(done.get("status"), Some(&Bson::Int32(1)));
    assert_eq!(done.get("node"), Some(&Bson::String("node-a".into())));
    assert_eq!(done.get("queue"), Some(&Bson::ObjectId(q)));
    assert_eq!(done.get("stdout"), Some(&Bson::String("spec\nspec\n".into())));
    assert_eq!(done.get("stderr"), Some(&Bson::String(String::new())));
    assert_eq!(done.get("params"), before.get("params"));
    assert_eq!(done.get("ctime"), before.get("ctime"));
    let (Some(Bson::DateTime(ctime)), Some(Bson::DateTime(mtime))) = (done.get("ctime"), done.get("mtime")) else {
        panic!("ctime and mtime are BSON dates: {done}");
    };
    assert!(mtime >= ctime);

    let nodes: Vec<Document> =
        t.db.collection::<Document>("nodes")
            .find(doc! {})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].get_str("node").unwrap(), "node-a");
    assert!(matches!(nodes[0].get("timestamp"), Some(Bson::DateTime(_))));
    den.stop().await;
}

async fn finish_order(sort: &str) -> Vec<i32> {
    let t = common::test_db(&format!("den_{sort}")).await;
    let q = insert_queue(&t.db, sort, "demo", doc! {"threads": 1, "sort": sort}).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(insert_task(&t.db, q, -2, doc! {"message": i.to_string(), "sleep_ms": 30}).await);
    }
    let den = RunningDen::start(Arc::new(t.store.clone()), settings("node-order"));
    wait_for(Duration::from_secs(30), "all tasks to finish", || all_done(&t.db, q)).await;
    den.stop().await;
    let mut done: Vec<(DateTime, i32)> = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        done.push((*task_doc(&t.db, *id).await.get_datetime("mtime").unwrap(), i as i32));
    }
    done.sort();
    done.into_iter().map(|(_, i)| i).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifo_runs_oldest_first_and_lifo_newest_first() {
    assert_eq!(finish_order("fifo").await, vec![0, 1, 2, 3, 4]);
    assert_eq!(finish_order("lifo").await, vec![4, 3, 2, 1, 0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn held_statuses_are_never_claimed() {
    let t = common::test_db("den_held").await;
    let q = insert_queue(&t.db, "held", "demo", doc! {}).await;
    let mut held = Vec::new();
    for s in [-6, -5, -4, -3, -7] {
        held.push((insert_task(&t.db, q, s, doc! {}).await, s));
    }
    let queued: Vec<ObjectId> = futures::future::join_all((0..5).map(|_| insert_task(&t.db, q, -2, doc! {}))).await;
    let den = RunningDen::start(Arc::new(t.store.clone()), settings("node-held"));
    wait_for(Duration::from_secs(20), "queued tasks to finish", || async {
        count(&t.db, doc! {"_id": {"$in": &queued}, "status": 1}).await == 5
    })
    .await;
    // Let the DEN go through a few more ticks with only held tasks left.
    let ticks = Instant::now();
    while ticks.elapsed() < Duration::from_millis(800) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (id, s) in held {
        let d = task_doc(&t.db, id).await;
        assert_eq!(d.get_i32("status").unwrap(), s);
        assert_eq!(d.get("node"), Some(&Bson::Null));
    }
    den.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queues_run_only_when_allowed_loadable_and_active() {
    let t = common::test_db("den_allow").await;
    let ok = insert_queue(&t.db, "ok", "demo", doc! {}).await;
    let not_allowed = insert_queue(&t.db, "not-allowed", "secret", doc! {}).await;
    let traversal = insert_queue(&t.db, "traversal", "../release/demo", doc! {}).await;
    let missing = insert_queue(&t.db, "missing", "ghost", doc! {}).await;
    let paused = insert_queue(&t.db, "paused", "demo", doc! {"threads": 0}).await;
    let paused_null = insert_queue(&t.db, "paused-null", "demo", doc! {"threads": Bson::Null}).await;
    let ignored = insert_queue(&t.db, "ignored", "demo", doc! {}).await;
    let mut s = settings("node-allow");
    s.plugins.push("ghost".into());
    s.ignore_queues = vec![ignored];
    let all = [ok, not_allowed, traversal, missing, paused, paused_null, ignored];
    let mut tasks = BTreeMap::new();
    for q in all {
        tasks.insert(q, insert_task(&t.db, q, -2, doc! {}).await);
    }
    let den = RunningDen::start(Arc::new(t.store.clone()), s.clone());
    wait_for(Duration::from_secs(20), "the allowed queue's task", || async {
        status_of(&t.db, tasks[&ok]).await == 1
    })
    .await;
    let ticks = Instant::now();
    while ticks.elapsed() < Duration::from_millis(600) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for q in &all[1..] {
        assert_eq!(status_of(&t.db, tasks[q]).await, -2, "queue {q} must be skipped");
    }
    den.stop().await;

    // activequeues wins over ignorequeues: only the listed queue runs.
    let mut s2 = settings("node-active");
    s2.active_queues = vec![ignored];
    s2.ignore_queues = vec![ignored];
    let extra_ok = insert_task(&t.db, ok, -2, doc! {}).await;
    let den = RunningDen::start(Arc::new(t.store.clone()), s2);
    wait_for(Duration::from_secs(20), "the active queue's task", || async {
        status_of(&t.db, tasks[&ignored]).await == 1
    })
    .await;
    assert_eq!(
        status_of(&t.db, extra_ok).await,
        -2,
        "queues not in activequeues are skipped"
    );
    den.stop().await;
}

/// Reads a GridFS file written with String chunks, with plain finds.
async fn read_gridfs(db: &Database, file: ObjectId, task: ObjectId, name: &str) -> String {
    let f = db
        .collection::<Document>("tasks.files")
        .find_one(doc! {"_id": file})
        .await
        .unwrap()
        .expect("files document exists");
    assert_eq!(f.get_str("filename").unwrap(), name);
    assert_eq!(
        f.get_document("metadata").unwrap().get_object_id("task_id").unwrap(),
        task
    );
    let chunks: Vec<Document> = db
        .collection::<Document>("tasks.chunks")
        .find(doc! {"files_id": file})
        .sort(doc! {"n": 1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let mut text = String::new();
    for (i, c) in chunks.iter().enumerate() {
        assert_eq!(
            c.get_i32("n").map(i64::from).or_else(|_| c.get_i64("n")).unwrap(),
            i as i64
        );
        let Some(Bson::String(s)) = c.get("data") else {
            panic!("chunk data must be a String");
        };
        text.push_str(s);
    }
    assert_eq!(
        text.len() as i64,
        f.get_i64("length")
            .map_err(|_| ())
            .or_else(|_| f.get_i32("length").map(i64::from).map_err(|_| ()))
            .unwrap()
    );
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn large_outputs_follow_the_gfs_setting() {
    // 20 MB of stdout: 1,000,000 lines of 19 characters + newline.
    let line = "0123456789abcdefghi";
    let big = doc! {"message": line, "repeat": 1_000_000, "stderr": "small"};
    let expected_len = 20 * 1_000_000;
    for gfs in [Gfs::Auto, Gfs::Always, Gfs::Never] {
        let t = common::test_db(&format!("den_gfs_{gfs:?}")).await;
        let q = insert_queue(&t.db, "big", "demo", doc! {}).await;
        let big_task = insert_task(&t.db, q, -2, big.clone()).await;
        let small_task = insert_task(&t.db, q, -2, doc! {"message": "tiny"}).await;
        let mut s = settings("node-gfs");
        s.gfs = gfs;
        let den = RunningDen::start(Arc::new(t.store.clone()), s);
        wait_for(Duration::from_secs(120), "both tasks", || all_done(&t.db, q)).await;
        den.stop().await;
        let d = task_doc(&t.db, big_task).await;
        assert_eq!(d.get_i32("status").unwrap(), 1, "{gfs:?}");
        let small = task_doc(&t.db, small_task).await;
        match gfs {
            Gfs::Auto => {
                let out = read_gridfs(&t.db, d.get_object_id("stdout").unwrap(), big_task, "stdout").await;
                assert_eq!(out.len(), expected_len);
                assert!(out.lines().all(|l| l == line));
                assert_eq!(d.get_str("stderr").unwrap(), "small\n", "the small stream stays inline");
                assert_eq!(small.get_str("stdout").unwrap(), "tiny\n");
            }
            Gfs::Always => {
                let out = read_gridfs(&t.db, d.get_object_id("stdout").unwrap(), big_task, "stdout").await;
                assert_eq!(out.len(), expected_len);
                let err = read_gridfs(&t.db, d.get_object_id("stderr").unwrap(), big_task, "stderr").await;
                assert_eq!(err, "small\n");
                let tiny = read_gridfs(&t.db, small.get_object_id("stdout").unwrap(), small_task, "stdout").await;
                assert_eq!(tiny, "tiny\n");
            }
            _ => {
                let out = d.get_str("stdout").unwrap();
                assert!(out.len() < 16 * 1024 * 1024);
                assert!(out.starts_with(line));
                assert!(
                    out.contains("stdout truncated to fit the task document"),
                    "marker present"
                );
                assert_eq!(count_files(&t.db).await, 0);
            }
        }
        let via_store = t.store.task(big_task).await.unwrap().unwrap();
        let text = t.store.read_output(via_store.stdout.as_ref().unwrap()).await.unwrap();
        if gfs != Gfs::Never {
            assert_eq!(text.len(), expected_len);
            assert!(matches!(via_store.stdout, Some(Output::File(_))));
        }
    }
}

async fn count_files(db: &Database) -> u64 {
    db.collection::<Document>("tasks.files")
        .count_documents(doc! {})
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failures_end_as_status_2_with_the_reason_in_stderr() {
    let t = common::test_db("den_failures").await;
    // Only the spinning plugin meets the short timeout: on a loaded machine the others
    // (the allocation up to its limit above all) may need longer than 300 ms to end.
    let sandbox = doc! {"sandbox": {"timeout": "60s", "memory_mib": 64}};
    let demo = insert_queue(&t.db, "demo", "demo", sandbox.clone()).await;
    let fail = insert_queue(&t.db, "fail", "fail", sandbox.clone()).await;
    let spin_sandbox = doc! {"sandbox": {"timeout": "300ms", "memory_mib": 64}};
    let spin = insert_queue(&t.db, "spin", "spin", spin_sandbox).await;
    let alloc = insert_queue(&t.db, "alloc", "alloc", sandbox.clone()).await;
    let cases = [
        (insert_task(&t.db, demo, -2, doc! {"status": 0}).await, "status 0"),
        (
            insert_task(&t.db, fail, -2, doc! {"message": "broken pipe"}).await,
            "plugin error: broken pipe",
        ),
        (
            insert_task(&t.db, spin, -2, doc! {}).await,
            "timeout: plugin still running after 300ms",
        ),
        (insert_task(&t.db, alloc, -2, doc! {"mib": 512}).await, "memory limit"),
    ];
    let den = RunningDen::start(Arc::new(t.store.clone()), settings("node-fail"));
    for (id, reason) in &cases {
        wait_for(Duration::from_secs(30), reason, || async {
            status_of(&t.db, *id).await > 0
        })
        .await;
        let d = task_doc(&t.db, *id).await;
        assert_eq!(d.get_i32("status").unwrap(), 2, "{reason}");
        let stderr = d.get_str("stderr").unwrap();
        assert!(stderr.contains(reason), "{reason}: {stderr}");
    }
    // The result is written before the worker lets its task go.
    wait_for(Duration::from_secs(5), "the workers to finish", || async {
        den.den.running() == 0
    })
    .await;
    den.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claim_and_run_durations_reach_the_metrics() {
    let t = common::test_db("den_durations").await;
    let q = insert_queue(&t.db, "timed", "demo", doc! {"threads": 2}).await;
    t.store.create_tasks(q, vec![doc! {"sleep_ms": 30}; 6]).await.unwrap();
    let den = RunningDen::start(Arc::new(t.store.clone()), settings("node-timed"));
    wait_for(Duration::from_secs(60), "all tasks", || all_done(&t.db, q)).await;
    den.stop().await;

    let nodes = t.store.nodes().await.unwrap();
    let stats = nodes[0].stats.as_ref().expect("the DEN reported its durations");
    assert_eq!((stats.claim.count, stats.run.count), (6, 6));
    assert!(stats.run.sum >= 6.0 * 0.03, "six runs of 30 ms: {}", stats.run.sum);
    let under_10ms = stats.run.cumulative()[1].1;
    assert_eq!(under_10ms, 0, "no 30 ms run falls in the ≤ 10 ms buckets");

    let state = disbatch::api::ApiState::new(Arc::new(t.store.clone()), vec!["demo".into()]);
    let response = tower::ServiceExt::oneshot(
        disbatch::api::router(state),
        axum::http::Request::get("/metrics")
            .body(axum::body::Body::empty())
            .unwrap(),
    )
    .await
    .unwrap();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
    let text = String::from_utf8(body.to_vec()).unwrap();
    for line in [
        "# TYPE disbatch_claim_duration_seconds histogram",
        "disbatch_claim_duration_seconds_count{node=\"node-timed\"} 6",
        "disbatch_run_duration_seconds_bucket{node=\"node-timed\",le=\"0.01\"} 0",
        "disbatch_run_duration_seconds_bucket{node=\"node-timed\",le=\"+Inf\"} 6",
        "disbatch_run_duration_seconds_count{node=\"node-timed\"} 6",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_dens_on_one_queue_never_claim_a_task_twice() {
    let t = common::test_db("den_two").await;
    let q = insert_queue(&t.db, "shared", "demo", doc! {"threads": 8}).await;
    let ids = t.store.create_tasks(q, vec![doc! {}; 400]).await.unwrap();
    let a = Recording::new(Arc::new(t.store.clone()));
    let b = Recording::new(Arc::new(t.store.clone()));
    let den_a = RunningDen::start(a.clone(), settings("node-a"));
    let den_b = RunningDen::start(b.clone(), settings("node-b"));
    wait_for(Duration::from_secs(120), "all tasks", || all_done(&t.db, q)).await;
    den_a.stop().await;
    den_b.stop().await;
    let (ca, cb) = (a.claimed.lock().unwrap().clone(), b.claimed.lock().unwrap().clone());
    let sa: HashSet<_> = ca.iter().collect();
    let sb: HashSet<_> = cb.iter().collect();
    println!("node-a claimed {}, node-b claimed {}", ca.len(), cb.len());
    assert_eq!(sa.len(), ca.len(), "node-a never claims a task twice");
    assert_eq!(sb.len(), cb.len(), "node-b never claims a task twice");
    assert!(sa.is_disjoint(&sb), "no task claimed by both DENs");
    assert_eq!(sa.len() + sb.len(), ids.len(), "every task claimed once");
    assert_eq!(
        a.started.lock().unwrap().len() + b.started.lock().unwrap().len(),
        ids.len()
    );
    assert_eq!(count(&t.db, doc! {"queue": q, "status": 1}).await, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn threads_and_maxthreads_hold_while_three_dens_drain_2000_tasks() {
    let t = common::test_db("den_limits").await;
    let q1 = insert_queue(&t.db, "q1", "demo", doc! {"threads": 3}).await;
    let q2 = insert_queue(&t.db, "q2", "demo", doc! {"threads": 5}).await;
    t.store
        .create_tasks(q1, vec![doc! {"sleep_ms": 2}; 1000])
        .await
        .unwrap();
    t.store
        .create_tasks(q2, vec![doc! {"sleep_ms": 2}; 1000])
        .await
        .unwrap();
    // node-b is limited to 2 tasks by its operator before it starts (a document with no
    // heartbeat yet: one with a fresh `timestamp` and no `process` is a Disbatch 4 DEN's).
    t.db.collection::<Document>("nodes")
        .insert_one(doc! {"node": "node-b", "maxthreads": 2})
        .await
        .unwrap();
    let store: Arc<dyn Store> = Arc::new(t.store.clone());
    let dens = ["node-a", "node-b", "node-c"].map(|n| RunningDen::start(store.clone(), settings(n)));

    let mut samples = 0u64;
    let mut max_q: BTreeMap<ObjectId, u64> = BTreeMap::new();
    let mut max_b = 0;
    let start = Instant::now();
    loop {
        for q in [q1, q2] {
            let n = count(&t.db, doc! {"queue": q, "status": {"$in": [-1, 0]}}).await;
            let m = max_q.entry(q).or_default();
            *m = (*m).max(n);
        }
        max_b = max_b.max(count(&t.db, doc! {"node": "node-b", "status": {"$in": [-1, 0]}}).await);
        samples += 1;
        if all_done(&t.db, q1).await && all_done(&t.db, q2).await {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(600), "draining took too long");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = start.elapsed();
    for d in dens {
        d.stop().await;
    }
    println!(
        "drained 2000 tasks with 3 DENs in {:.1}s; {samples} samples; max running q1={} (threads 3), q2={} (threads 5), node-b={} (maxthreads 2)",
        elapsed.as_secs_f64(),
        max_q[&q1],
        max_q[&q2],
        max_b
    );
    assert!(max_q[&q1] <= 3);
    assert!(max_q[&q2] <= 5);
    assert!(max_b <= 2);
    assert_eq!(count(&t.db, doc! {"status": 1}).await, 2000);
    assert!(max_q[&q2] >= 2, "the sampler saw the queues busy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_den_claims_an_inserted_task_without_waiting_for_its_poll() {
    let t = common::test_db("den_wake").await;
    let q = insert_queue(&t.db, "wake", "demo", doc! {}).await;
    let first = insert_task(&t.db, q, -2, doc! {}).await;
    let mut s = settings("node-wake");
    s.tick = Duration::from_secs(3600);
    let den = RunningDen::start(Arc::new(t.store.clone()), s);
    // The first tick runs at once and takes the first task.
    wait_for(Duration::from_secs(20), "the first task", || async {
        status_of(&t.db, first).await == 1
    })
    .await;
    wait_for(Duration::from_secs(20), "the worker to stop", || async {
        den.den.running() == 0
    })
    .await;
    // The next poll is an hour away: only the insert notification can start this one.
    let second = insert_task(&t.db, q, -2, doc! {}).await;
    wait_for(Duration::from_secs(20), "the inserted task", || async {
        status_of(&t.db, second).await == 1
    })
    .await;
    den.stop().await;
}
