//! A DAG of 1,000 tasks with random fan-in and fan-out, submitted in one request and run by
//! four DEN processes, while the leader is killed (`kill -9`) midway: a new leader takes
//! over within `heartbeat_stale` + 1 s, every task ends succeeded, each ran once (a task
//! the killed DEN held may have run twice: its run was cut short and put back), and no
//! task ran before every one of its parents had finished.
//!
//! Each task appends a line to its own file (the `mark` plugin with `append`), so the
//! lines count its runs and the file's modification time is the end of its last run.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::http::StatusCode;
use bson::doc;
use bson::oid::ObjectId;
use common::http::post;
use common::{count_tasks as count, wait_for, DenProcess};
use disbatch::api::{router, ApiState};
use disbatch::store::Store;
use serde_json::json;

const TASKS: usize = 1000;
const STALE: u64 = 2;
const NODES: [&str; 4] = ["dag-1", "dag-2", "dag-3", "dag-4"];

/// A small deterministic generator (the seed is printed, so a failing DAG can be rebuilt).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

/// Each task's parents: up to 3 among the 40 before it (fan-in), so that tasks near the
/// start have many children (fan-out) and the DAG is some 30 levels deep.
fn random_dag(seed: u64) -> Vec<BTreeSet<usize>> {
    let mut rng = Lcg(seed);
    (0..TASKS)
        .map(|k| {
            if k == 0 {
                return BTreeSet::new();
            }
            let n = rng.below(4);
            (0..n).map(|_| k - 1 - rng.below(k.min(40))).collect()
        })
        .collect()
}

fn modified(path: &Path) -> SystemTime {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .expect("the task's file")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dag_runs_in_order_while_the_leader_is_killed() {
    let t = common::test_db("chaos_dag").await;
    let store: Arc<dyn Store> = Arc::new(t.store.clone());
    let app = router(ApiState::new(store.clone(), vec!["mark".into()]));
    let marks = tempfile::tempdir().unwrap();
    let grant = format!("{}:/out:rw", marks.path().display());
    let r = post(
        &app,
        "/queues",
        json!({"name": "dag", "plugin": "mark", "threads": 8, "on_orphan": "requeue",
            "sandbox": {"dirs": [grant]}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    let seed = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    println!("DAG seed {seed}");
    let parents = random_dag(seed);
    let mut depth = vec![0usize; TASKS];
    for (k, ps) in parents.iter().enumerate() {
        depth[k] = 1 + ps.iter().map(|p| depth[*p]).max().unwrap_or(0);
    }
    let levels = depth.iter().max().copied().unwrap_or(0);
    let entries: Vec<_> = parents
        .iter()
        .enumerate()
        .map(|(k, ps)| {
            json!({
                "params": {"path": format!("/out/{k}"), "sleep_ms": 20, "append": true},
                "after": ps.iter().map(|p| json!({"ref": p})).collect::<Vec<_>>(),
            })
        })
        .collect();
    let r = post(&app, "/tasks", json!({"queue": "dag", "tasks": entries})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let ids: Vec<ObjectId> = r.json()["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| ObjectId::parse_str(v.as_str().unwrap()).unwrap())
        .collect();
    assert_eq!(ids.len(), TASKS);
    let roots = parents.iter().filter(|p| p.is_empty()).count() as u64;
    assert_eq!(
        count(&t.db, doc! {"status": -2}).await,
        roots,
        "only the roots are queued"
    );

    let started = Instant::now();
    let extra = json!({"plugins": ["mark"], "heartbeat_stale": STALE});
    let mut dens: Vec<Option<DenProcess>> = NODES
        .iter()
        .map(|n| Some(DenProcess::start(&t.uri, &t.name, n, extra.clone())))
        .collect();
    wait_for(
        Duration::from_secs(60),
        "a fifth of the DAG to succeed and a leader",
        || async {
            count(&t.db, doc! {"status": 1}).await >= (TASKS / 5) as u64
                && disbatch::lifecycle::leader::leader(&*store)
                    .await
                    .unwrap()
                    .is_some_and(|l| l.holder(bson::DateTime::now()).is_some())
        },
    )
    .await;
    let leader = disbatch::lifecycle::leader::leader(&*store).await.unwrap().unwrap();
    let victim = NODES
        .iter()
        .position(|n| *n == leader.node)
        .expect("a DEN of the test leads");
    let mut den = dens[victim].take().unwrap();
    den.signal(libc::SIGKILL);
    den.wait_exit(Duration::from_secs(10));
    let killed = Instant::now();
    let held: Vec<ObjectId> =
        common::find_docs(&t.db, "tasks", doc! {"node": &leader.node, "status": {"$in": [-1, 0]}})
            .await
            .iter()
            .map(|d| d.get_object_id("_id").unwrap())
            .collect();
    let deadline = killed + Duration::from_secs(30);
    let (after, new_leader, token) = loop {
        let l = disbatch::lifecycle::leader::leader(&*store).await.unwrap().unwrap();
        if l.holder(bson::DateTime::now()).is_some_and(|h| h != leader.node) {
            break (killed.elapsed(), l.node, l.token);
        }
        assert!(Instant::now() < deadline, "no new leader 30 s after the kill");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!(
        "leader {} killed with {} tasks held; {new_leader} leads after {:.2} s (token {} → {token})",
        leader.node,
        held.len(),
        after.as_secs_f64(),
        leader.token
    );
    assert!(token > leader.token, "the fencing token grew");
    assert!(
        after <= Duration::from_secs(STALE + 1),
        "replaced after {after:?}, over heartbeat_stale {STALE} s + 1 s"
    );

    wait_for(Duration::from_secs(240), "the whole DAG to succeed", || async {
        count(&t.db, doc! {"status": 1}).await == TASKS as u64
            || count(&t.db, doc! {"status": {"$nin": [-4, -2, -1, 0, 1]}}).await > 0
    })
    .await;
    println!(
        "{TASKS} tasks in {levels} levels ran in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let bad = common::find_docs(&t.db, "tasks", doc! {"status": {"$ne": 1}}).await;
    assert!(bad.is_empty(), "tasks that did not succeed: {bad:?}");
    for (k, ps) in parents.iter().enumerate() {
        let file = marks.path().join(k.to_string());
        let runs = std::fs::read_to_string(&file).unwrap().lines().count();
        let allowed = if held.contains(&ids[k]) { 2 } else { 1 };
        assert!((1..=allowed).contains(&runs), "task {k} ({}) ran {runs} times", ids[k]);
        let end = modified(&file);
        for p in ps {
            let parent_end = modified(&marks.path().join(p.to_string()));
            assert!(parent_end <= end, "task {k} ran before its parent {p} ended");
        }
    }
    assert_eq!(
        count(&t.db, doc! {"dependents": true}).await,
        0,
        "every end was settled"
    );
    drop(dens);
}
