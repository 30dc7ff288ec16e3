//! The `dag` scenario: what dependencies cost, on both stores. A chain run one task at a
//! time against as many independent tasks one at a time gives the release latency (a
//! parent's end → its child claimable and claimed); a DAG of 10,000 tasks (each waiting for
//! up to two of the 100 before it) against 10,000 independent tasks, 8 at a time, gives the
//! overhead per task.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::doc;
use bson::oid::ObjectId;
use disbatch::model::{status, Queue, Sort};
use disbatch::store::mongo::MongoStore;
use disbatch::store::sqlite::SqliteStore;
use disbatch::store::{Dependency, NewQueue, NewTask, Store, TaskFilter};

use super::Bench;

/// How tasks are linked.
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    Independent,
    /// Each waits for the one before.
    Chain,
    /// Each waits for up to two of the 100 before it.
    Dag,
}

fn tasks(n: usize, shape: Shape) -> Vec<NewTask> {
    let ids: Vec<ObjectId> = (0..n).map(|_| ObjectId::new()).collect();
    let mut parents: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut seed: u64 = 42;
    let mut below = |m: usize| {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((seed >> 33) % m as u64) as usize
    };
    for (k, ps) in parents.iter_mut().enumerate().skip(1) {
        match shape {
            Shape::Independent => {}
            Shape::Chain => ps.push(k - 1),
            Shape::Dag => {
                for _ in 0..below(3) {
                    let p = k - 1 - below(k.min(100));
                    if !ps.contains(&p) {
                        ps.push(p);
                    }
                }
            }
        }
    }
    let mut has_children = vec![false; n];
    for p in parents.iter().flatten() {
        has_children[*p] = true;
    }
    (0..n)
        .map(|k| NewTask {
            after: parents[k].iter().map(|p| Dependency::Task(ids[*p])).collect(),
            dependents: has_children[k],
            ..NewTask::queued(ids[k], doc! {})
        })
        .collect()
}

/// Seconds one DEN takes to run `n` tasks of `shape` at `threads` at a time on `store`,
/// from the first task's start (the DEN is up and has loaded the plugin) to the last end.
async fn run(bench: &Bench, store: Arc<dyn Store>, n: usize, shape: Shape, threads: i64) -> f64 {
    let queue: Queue = store
        .create_queue(NewQueue {
            name: format!("q{}", ObjectId::new()),
            plugin: "demo".into(),
            threads: Some(0),
            sort: Sort::Fifo,
            extra: doc! {},
        })
        .await
        .unwrap();
    for part in tasks(n, shape).chunks(1000) {
        store.insert_tasks(queue.id, part.to_vec()).await.unwrap();
    }
    let (stop, handle) = bench.den_on(store.clone(), &format!("dag-{}", ObjectId::new()));
    // Let the DEN start before the queue opens, so the plugin's load is not timed.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let update = disbatch::store::QueueUpdate {
        threads: Some(Some(threads)),
        ..Default::default()
    };
    store.update_queue(queue.id, update).await.unwrap();
    let start = Instant::now();
    let done = TaskFilter {
        queue: Some(queue.id),
        status: Some(vec![status::SUCCEEDED]),
        ..Default::default()
    };
    loop {
        if store.count_tasks(&done).await.unwrap() == n as u64 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(900),
            "{n} tasks not run in 15 minutes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = start.elapsed().as_secs_f64();
    stop.cancel();
    handle.await.unwrap();
    took
}

impl Bench {
    pub(super) async fn dag(&self) {
        // The MongoDB test server's queries slow down as a collection grows, so its DAG is
        // smaller (`MONGODB_URI` to a real server takes the full size).
        let (chain, big) = if self.quick { (100, 1_000) } else { (300, 10_000) };
        let mongo_big = if self._server.is_some() { big.min(2_000) } else { big };
        println!("\n## dag: dependencies (one DEN, trivial demo tasks)");
        println!("| store | chain of {chain}, 1 at a time: ms per task | {chain} independent, 1 at a time | release latency ms | DAG size | DAG, {t} at a time: tasks/s | as many independent | overhead µs per task |", t = self.threads);
        println!("|---|---|---|---|---|---|---|---|");
        let mut results = Vec::new();
        for store_name in ["mongodb", "embedded"] {
            let dir = tempfile::tempdir().unwrap();
            let make = |round: usize| {
                let dir = dir.path().to_path_buf();
                async move {
                    let store: Arc<dyn Store> = if store_name == "mongodb" {
                        let db = self.db(&format!("dag{round}")).await;
                        Arc::new(MongoStore::from_database(db))
                    } else {
                        let s = SqliteStore::open(&dir.join(format!("d{round}.db"))).await.unwrap();
                        s.ensure_indexes().await.unwrap();
                        Arc::new(s)
                    };
                    store
                }
            };
            let chained = run(self, make(0).await, chain, Shape::Chain, 1).await * 1e3 / chain as f64;
            let alone = run(self, make(1).await, chain, Shape::Independent, 1).await * 1e3 / chain as f64;
            let big = if store_name == "mongodb" { mongo_big } else { big };
            let dag = big as f64 / run(self, make(2).await, big, Shape::Dag, self.threads).await;
            let free = big as f64 / run(self, make(3).await, big, Shape::Independent, self.threads).await;
            let overhead = (1.0 / dag - 1.0 / free) * 1e6;
            println!(
                "| {store_name} | {chained:.2} | {alone:.2} | {:.2} | {big} | {dag:.0} | {free:.0} | {overhead:.0} |",
                chained - alone
            );
            results.push(format!(
                "{store_name}_release_ms={:.2} {store_name}_dag_n={big} {store_name}_dag_per_s={dag:.0} {store_name}_independent_per_s={free:.0} {store_name}_overhead_us={overhead:.0}",
                chained - alone
            ));
        }
        println!("RESULT dag {}", results.join(" "));
    }
}
