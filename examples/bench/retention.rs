//! The `retention` scenario: what deleting ended tasks costs the claims. The embedded store
//! gets 1,000,000 ended tasks a day old (100,000 with `--quick`), every 10th with an output
//! file, written straight into its file; then a queue of 50,000 tasks (5,000 with `--quick`)
//! is drained by claimers that claim and finish as a DEN does (`--threads` at once), once
//! with nothing else going on and once while the leader's retention looks run back to back
//! (`lifecycle::retention::sweep`, the bounds a DEN uses). Reports the claims' p99 both
//! ways, the tasks deleted and whether a file of a deleted task is left.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bson::oid::ObjectId;
use bson::{doc, DateTime, Document};
use disbatch::lifecycle::retention::{sweep, Bounds};
use disbatch::model::Retention;
use disbatch::store::sqlite::SqliteStore;
use disbatch::store::{NewQueue, NewTask, OutputValue, Store};

use super::{percentile, Bench};

/// Fills the embedded file with `n` ended tasks of `queue` a day old, every 10th with a
/// stdout file of 1 KiB, in one transaction.
fn fill(path: &std::path::Path, queue: ObjectId, n: usize) {
    let conn = rusqlite::Connection::open(path).unwrap();
    let then = DateTime::now().timestamp_millis() - 24 * 3600 * 1000;
    let q = queue.to_hex();
    conn.execute_batch(&format!(
        "BEGIN;
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {n})
         INSERT INTO tasks (id, queue, ctime, mtime, node, status, params, stdout, stdout_file, stderr)
         SELECT printf('ff%022x', i), '{q}', {then}, {then}, 'bench', CASE WHEN i % 20 = 0 THEN 2 ELSE 1 END,
                x'0500000000', CASE WHEN i % 10 = 0 THEN NULL ELSE '' END,
                CASE WHEN i % 10 = 0 THEN printf('fe%022x', i) END, ''
         FROM n;
         WITH RECURSIVE n(i) AS (SELECT 10 UNION ALL SELECT i + 10 FROM n WHERE i + 10 <= {n})
         INSERT INTO output_files (id, task, filename, length, upload_date, data)
         SELECT printf('fe%022x', i), printf('ff%022x', i), 'stdout', 1024, {then}, printf('%01024d', i)
         FROM n;
         COMMIT;"
    ))
    .unwrap();
}

fn count(path: &std::path::Path, sql: &str) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

/// Drains `queue` (`m` tasks queued now) with `threads` claimers: each claims and
/// finishes, as a DEN's worker does. The claims' latencies in milliseconds.
async fn drain(store: Arc<SqliteStore>, name: &str, m: usize, threads: usize) -> Vec<f64> {
    let queue = store
        .create_queue(NewQueue {
            name: name.into(),
            plugin: "demo".into(),
            threads: Some(threads as i64),
            sort: Default::default(),
            extra: Document::new(),
        })
        .await
        .unwrap();
    for chunk in (0..m).collect::<Vec<_>>().chunks(5_000) {
        let tasks = chunk
            .iter()
            .map(|i| NewTask::queued(ObjectId::new(), doc! { "i": *i as i64 }))
            .collect();
        store.insert_tasks(queue.id, tasks).await.unwrap();
    }
    let mut workers = Vec::new();
    for w in 0..threads {
        let store = store.clone();
        let queue = queue.clone();
        workers.push(tokio::spawn(async move {
            let node = format!("claimer-{w}");
            let mut took = Vec::new();
            loop {
                let start = Instant::now();
                let Some(t) = store.claim_to_run(&queue, &node).await.unwrap() else {
                    break;
                };
                took.push(start.elapsed().as_secs_f64() * 1e3);
                if t.status == disbatch::model::status::CLAIMED {
                    disbatch::lifecycle::run::start(&*store, t.id, &node).await.unwrap();
                }
                let empty = || OutputValue::Inline(String::new());
                disbatch::lifecycle::run::finish(&*store, t.id, &node, 1, empty(), empty())
                    .await
                    .unwrap();
            }
            took
        }));
    }
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.await.unwrap());
    }
    all
}

impl Bench {
    pub(super) async fn retention(&self) {
        let began = Instant::now();
        let (n, m) = if self.quick {
            (100_000, 5_000)
        } else {
            (1_000_000, 50_000)
        };
        let threads = usize::try_from(self.threads).unwrap_or(8).max(1);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("retention.db");
        let store = Arc::new(SqliteStore::open(&path).await.unwrap());
        store.ensure_indexes().await.unwrap();
        let old = store
            .create_queue(NewQueue {
                name: "old".into(),
                plugin: "demo".into(),
                threads: Some(0),
                sort: Default::default(),
                extra: doc! { "retention": { "succeeded": "1h", "failed": "1h" } },
            })
            .await
            .unwrap();
        let start = Instant::now();
        let p = path.clone();
        tokio::task::spawn_blocking(move || fill(&p, old.id, n)).await.unwrap();
        println!(
            "\n(embedded: {n} ended tasks, {} files, written in {:.1} s)",
            n / 10,
            start.elapsed().as_secs_f64()
        );

        let without = drain(store.clone(), "drain-without", m, threads).await;
        let p99_without = percentile(without.clone(), 0.99);

        let done = Arc::new(AtomicBool::new(false));
        let sweeper = tokio::spawn({
            let store = store.clone();
            let done = done.clone();
            async move {
                let mut deleted = 0;
                let mut during = None;
                let start = Instant::now();
                loop {
                    let swept = sweep(&*store, &Retention::default(), DateTime::now(), Bounds::default())
                        .await
                        .unwrap();
                    deleted += swept.deleted;
                    if during.is_none() && done.load(Ordering::SeqCst) {
                        during = Some(deleted);
                    }
                    if !swept.more {
                        break;
                    }
                }
                (deleted, during.unwrap_or(deleted), start.elapsed().as_secs_f64())
            }
        });
        let with = drain(store.clone(), "drain-with", m, threads).await;
        done.store(true, Ordering::SeqCst);
        let p99_with = percentile(with.clone(), 0.99);
        let (deleted, during, sweep_secs) = sweeper.await.unwrap();
        let left_files = count(
            &path,
            "SELECT COUNT(*) FROM output_files WHERE task NOT IN (SELECT id FROM tasks)",
        );
        let left_tasks = count(
            &path,
            &format!("SELECT COUNT(*) FROM tasks WHERE queue = '{}'", old.id.to_hex()),
        );
        assert_eq!(left_files, 0, "a file of a deleted task is left");
        let ratio = p99_with / p99_without;
        println!("\n## Retention (embedded store, {threads} claimers)\n");
        println!("| drain of {m} tasks | claim p50 ms | claim p99 ms |");
        println!("|---|---|---|");
        println!(
            "| without retention | {:.2} | {p99_without:.2} |",
            percentile(without, 0.5)
        );
        println!(
            "| while {deleted} tasks are deleted ({during} during the drain) | {:.2} | {p99_with:.2} |",
            percentile(with, 0.5)
        );
        println!(
            "\n(retention deleted {deleted} tasks in {sweep_secs:.1} s, {} files with them; {left_tasks} ended tasks left; scenario took {:.1} s)",
            n / 10,
            began.elapsed().as_secs_f64()
        );
        println!(
            "\nRESULT retention claim_p99_ms={p99_with:.2} claim_p99_ms_without={p99_without:.2} retention_p99_ratio={ratio:.2} deleted={deleted} deleted_during_drain={during} files_left={left_files} tasks={n} drained={m}"
        );
    }
}
