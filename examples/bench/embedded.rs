//! The `embedded` scenario: in-process DENs on the embedded store (`den --embedded`), 1, 2
//! and 4 of them, each on its own `SqliteStore` of one file, draining N trivial `demo`
//! tasks (every one run in the sandbox and written back), against the file's ceiling: a
//! driver-only loop of `threads` connections claiming and finishing on the same file with
//! the DEN's pragmas (WAL, synchronous=NORMAL), no sandbox.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::doc;
use bson::oid::ObjectId;
use disbatch::model::Sort;
use disbatch::store::sqlite::SqliteStore;
use disbatch::store::{NewQueue, NewTask, Store};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::{median, Bench};

/// Finishing rate of the tasks with status 1 in `file`: (count − 1) over the span between
/// the first and the last finishing `mtime` (start-up left out, as `finish_rate` does).
fn finish_rate(file: &Path) -> (f64, i64) {
    let conn = Connection::open(file).unwrap();
    let (n, first, last): (i64, Option<i64>, Option<i64>) = conn
        .query_row(
            "SELECT COUNT(*), MIN(mtime), MAX(mtime) FROM tasks WHERE status = 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    let span = (last.unwrap_or(0) - first.unwrap_or(0)).max(1) as f64 / 1e3;
    ((n - 1).max(0) as f64 / span, n)
}

/// A fresh store file in `dir` with one `demo` queue of `threads` and `n` queued tasks.
async fn prepared(dir: &Path, threads: i64, n: usize) -> (std::path::PathBuf, ObjectId) {
    let file = dir.join(format!("bench-{}.db", ObjectId::new()));
    let store = SqliteStore::open(&file).await.unwrap();
    let queue = store
        .create_queue(NewQueue {
            name: "embedded".into(),
            plugin: "demo".into(),
            threads: Some(threads),
            sort: Sort::Fifo,
            extra: bson::Document::new(),
        })
        .await
        .unwrap();
    let tasks: Vec<NewTask> = (0..n).map(|_| NewTask::queued(ObjectId::new(), doc! {})).collect();
    for chunk in tasks.chunks(5_000) {
        store.insert_tasks(queue.id, chunk.to_vec()).await.unwrap();
    }
    (file, queue.id)
}

/// Finished (status 1) tasks in `file`.
fn finished(conn: &Connection) -> i64 {
    conn.query_row("SELECT COUNT(*) FROM tasks WHERE status = 1", [], |r| r.get(0))
        .unwrap()
}

/// The driver-only loop: `threads` connections, each claiming the oldest queued task
/// (one immediate transaction) and finishing it (another), as the DEN's store does without
/// the DEN. Returns tasks/s.
fn driver_loop(file: &Path, queue: ObjectId, threads: i64, n: usize) -> f64 {
    let claimed = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..threads)
        .map(|w| {
            let (file, claimed) = (file.to_path_buf(), claimed.clone());
            std::thread::spawn(move || {
                let mut conn = Connection::open(&file).unwrap();
                conn.busy_timeout(Duration::from_secs(30)).unwrap();
                conn.pragma_update(None, "journal_mode", "WAL").unwrap();
                conn.pragma_update(None, "synchronous", "NORMAL").unwrap();
                let node = format!("driver-{w}");
                let q = queue.to_hex();
                while claimed.fetch_add(1, Ordering::SeqCst) < n {
                    let now = bson::DateTime::now().timestamp_millis();
                    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
                    let id: Option<String> = tx
                        .prepare_cached(
                            "UPDATE tasks SET node = ?1, status = -1, mtime = ?2
                             WHERE id = (SELECT id FROM tasks WHERE queue = ?3 AND status = -2 AND node IS NULL
                                         ORDER BY priority DESC, id ASC LIMIT 1)
                             RETURNING id",
                        )
                        .unwrap()
                        .query_row(params![node, now, q], |r| r.get(0))
                        .optional()
                        .unwrap();
                    tx.commit().unwrap();
                    let Some(id) = id else { break };
                    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
                    tx.prepare_cached(
                        "UPDATE tasks SET status = 1, stdout = 'hello', stderr = '', mtime = ?1
                         WHERE id = ?2 AND node = ?3 AND status = -1",
                    )
                    .unwrap()
                    .execute(params![bson::DateTime::now().timestamp_millis(), id, node])
                    .unwrap();
                    tx.commit().unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    finish_rate(file).0
}

impl Bench {
    /// Tasks/s of `dens` in-process DENs, each on its own store of the file, draining `n`.
    async fn embedded_drain(&self, dir: &Path, n: usize, dens: usize) -> f64 {
        let (file, _) = prepared(dir, self.threads, n).await;
        let mut running = Vec::new();
        for i in 0..dens {
            let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&file).await.unwrap());
            running.push(self.den_on(store, &format!("embedded-{i}")));
        }
        let watch = Connection::open(&file).unwrap();
        let began = Instant::now();
        while finished(&watch) < n as i64 {
            assert!(
                began.elapsed() < Duration::from_secs(600),
                "{dens} embedded DEN(s) did not drain {n} tasks in 10 minutes"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for (stop, handle) in running {
            stop.cancel();
            handle.await.unwrap();
        }
        let (rate, done) = finish_rate(&file);
        assert_eq!(done, n as i64, "every task finished exactly once");
        std::fs::remove_file(&file).ok();
        rate
    }

    pub(super) async fn embedded(&self) {
        // The DENs' log, when RUST_LOG asks for it.
        if std::env::var_os("RUST_LOG").is_some() {
            let filter = tracing_subscriber::EnvFilter::from_default_env();
            let _ = tracing_subscriber::fmt().with_env_filter(filter).try_init();
        }
        let n = self
            .sizes
            .last()
            .copied()
            .unwrap_or(2_000)
            .max(if self.quick { 2_000 } else { 20_000 });
        let dir = tempfile::tempdir().unwrap();
        let counts = [1usize, 2, 4];
        let (mut ceiling, mut dens) = (Vec::new(), vec![Vec::new(); counts.len()]);
        for _ in 0..self.rounds {
            let (file, queue) = prepared(dir.path(), self.threads, n).await;
            let threads = self.threads;
            let path = file.clone();
            ceiling.push(
                tokio::task::spawn_blocking(move || driver_loop(&path, queue, threads, n))
                    .await
                    .unwrap(),
            );
            std::fs::remove_file(&file).ok();
            for (i, &k) in counts.iter().enumerate() {
                dens[i].push(self.embedded_drain(dir.path(), n, k).await);
            }
        }
        let ceiling = median(ceiling);
        let dens: Vec<f64> = dens.into_iter().map(median).collect();
        println!(
            "\n## embedded: in-process DENs on one SQLite file draining {n} trivial demo tasks, queue threads {} (median of {} rounds)",
            self.threads, self.rounds
        );
        println!("| runner | tasks/s | ÷ ceiling |\n|---|---|---|");
        println!(
            "| ceiling: driver-only claim + finish, {} connections, no sandbox | {ceiling:.0} | 1.00 |",
            self.threads
        );
        for (k, rate) in counts.iter().zip(&dens) {
            println!(
                "| {k} DEN(s), sandbox and write-back | {rate:.0} | {:.2} |",
                rate / ceiling
            );
        }
        println!(
            "RESULT embedded n={n} threads={} tasks_per_s={:.0} ratio_to_ceiling={:.2} ceiling_per_s={ceiling:.0} two_dens_per_s={:.0} four_dens_per_s={:.0}",
            self.threads,
            dens[0],
            dens[0] / ceiling,
            dens[1],
            dens[2]
        );
    }
}
