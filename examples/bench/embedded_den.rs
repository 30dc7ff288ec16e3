//! The embedded store as users run it: `target/release/den --embedded FILE` processes on a
//! file pre-filled with trivial `demo` tasks, and the driver-only loop on the same kind of
//! file (the SQLite ceiling). Shared by the `peers` and `scale` scenarios.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, DateTime, Document};
use disbatch::model::{status, Queue, Sort};
use disbatch::store::sqlite::SqliteStore;
use disbatch::store::testing::StoreExt;
use disbatch::store::{NewQueue, Store};
use rusqlite::{params, Connection, OptionalExtension};

use super::bin;

/// A fresh embedded file at `path` with one `fifo` queue of the `demo` plugin (`threads`)
/// holding `n` queued tasks with `params`.
pub(super) async fn prefill(path: &Path, threads: i64, n: usize, params: Document) -> Queue {
    let store = SqliteStore::open(path).await.expect("open the embedded file");
    let queue = store
        .create_queue(NewQueue {
            name: format!("q{}", ObjectId::new()),
            plugin: "demo".into(),
            threads: Some(threads),
            sort: Sort::Fifo,
            extra: doc! {},
        })
        .await
        .expect("create the queue");
    let mut left = n;
    while left > 0 {
        let part = left.min(5_000);
        store
            .create_tasks(queue.id, vec![params.clone(); part])
            .await
            .expect("insert tasks");
        left -= part;
    }
    queue
}

/// `den --embedded FILE` processes; killed (and reaped) when dropped.
pub(super) struct Dens {
    children: Vec<Child>,
    /// When the first was started (Unix ms).
    pub(super) started_ms: f64,
}

impl Dens {
    /// Starts `count` DENs on `file` (nodes `<prefix>-0`, `<prefix>-1`, …), each with the
    /// plugins of `plugins` and its own compiled-component cache in `cache`.
    pub(super) fn start(file: &Path, plugins: &Path, cache: &Path, prefix: &str, count: usize) -> Dens {
        let started_ms = unix_ms();
        let children = (0..count)
            .map(|i| {
                Command::new(bin("den"))
                    .arg("--embedded")
                    .arg(file)
                    .arg("--plugin-dir")
                    .arg(plugins)
                    .env("DISBATCH_NODE", format!("{prefix}-{i}"))
                    .env("DISBATCH_CACHE_DIR", cache.join(format!("{prefix}-{i}")))
                    .env("RUST_LOG", "warn")
                    .stdout(Stdio::null())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .unwrap_or_else(|e| panic!("starting {}: {e}", bin("den").display()))
            })
            .collect();
        Dens { children, started_ms }
    }

    pub(super) fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }

    /// Panics naming the exit status when a DEN has ended (it never should while measured).
    pub(super) fn check_alive(&mut self) {
        for c in &mut self.children {
            if let Ok(Some(status)) = c.try_wait() {
                panic!("a den --embedded process ended early ({status}); its log is above");
            }
        }
    }
}

impl Drop for Dens {
    fn drop(&mut self) {
        for c in &mut self.children {
            c.kill().ok();
            c.wait().ok();
        }
    }
}

pub(super) fn unix_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1e3)
        .unwrap_or(0.0)
}

/// A read-only look at the file, as a second process would take it.
fn reader(file: &Path) -> Connection {
    let c = Connection::open(file).expect("open the embedded file");
    c.busy_timeout(Duration::from_secs(30)).unwrap();
    c
}

/// Tasks of `queue` with status `s`.
pub(super) fn count(file: &Path, queue: &Queue, s: i32) -> u64 {
    reader(file)
        .query_row(
            "SELECT COUNT(*) FROM tasks WHERE queue = ?1 AND status = ?2",
            params![queue.id.to_hex(), s],
            |r| r.get(0),
        )
        .expect("count tasks")
}

/// Polls every 20 ms until `n` tasks of `queue` have status `s`; panics after `limit`.
pub(super) fn wait_for(file: &Path, queue: &Queue, s: i32, n: u64, limit: Duration, dens: &mut Dens) {
    let start = Instant::now();
    while count(file, queue, s) < n {
        dens.check_alive();
        assert!(
            start.elapsed() < limit,
            "{n} tasks of the embedded file did not reach status {s} in {} s",
            limit.as_secs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A drain's figures from the finishing `mtime`s of the succeeded tasks.
#[derive(Clone, Copy, Debug)]
pub(super) struct Drain {
    /// Steady rate: (finished − 1) over the first → last finish.
    pub(super) rate: f64,
    pub(super) finished: u64,
    pub(super) last_ms: f64,
    /// When the DENs were started (Unix ms; 0 for the driver loop).
    pub(super) started_ms: f64,
}

pub(super) fn drain_of(file: &Path, queue: &Queue) -> Drain {
    let (n, first, last): (u64, Option<i64>, Option<i64>) = reader(file)
        .query_row(
            "SELECT COUNT(*), MIN(mtime), MAX(mtime) FROM tasks WHERE queue = ?1 AND status = ?2",
            params![queue.id.to_hex(), status::SUCCEEDED],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .expect("read the drain");
    let (first, last) = (first.unwrap_or(0) as f64, last.unwrap_or(0) as f64);
    let span = (last - first).max(1.0) / 1e3;
    Drain {
        rate: n.saturating_sub(1) as f64 / span,
        finished: n,
        last_ms: last,
        started_ms: 0.0,
    }
}

/// `dens` DEN processes draining `n` trivial tasks from a fresh file in `dir`.
pub(super) async fn den_drain(dir: &Path, plugins: &Path, threads: i64, n: usize, dens: usize) -> Drain {
    let file = fresh_file(dir, "den");
    let queue = prefill(&file, threads, n, doc! {}).await;
    let cache = dir.join("cache");
    let file2 = file.clone();
    let plugins = plugins.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let mut running = Dens::start(&file2, &plugins, &cache, "bench-embedded", dens);
        wait_for(
            &file2,
            &queue,
            status::SUCCEEDED,
            n as u64,
            Duration::from_secs(900),
            &mut running,
        );
        let started_ms = running.started_ms;
        drop(running);
        let drain = Drain {
            started_ms,
            ..drain_of(&file2, &queue)
        };
        assert_eq!(drain.finished, n as u64, "every task must have succeeded");
        drain
    })
    .await
    .unwrap()
}

/// A new file name in `dir` (removed first along with its WAL).
pub(super) fn fresh_file(dir: &Path, stem: &str) -> PathBuf {
    let file = dir.join(format!("{stem}-{}.db", ObjectId::new()));
    for suffix in ["", "-wal", "-shm"] {
        std::fs::remove_file(format!("{}{suffix}", file.display())).ok();
    }
    file
}

/// An index that serves the embedded store's claim (`queue`, `status`, then its order).
pub(super) const CLAIM_INDEX: &str =
    "CREATE INDEX IF NOT EXISTS bench_tasks_claim ON tasks (queue, status, priority DESC, id)";

/// The SQLite ceiling: `threads` workers claiming with the embedded store's statement (one
/// `UPDATE … WHERE id = (SELECT … LIMIT 1) RETURNING` in a `BEGIN IMMEDIATE` transaction)
/// and finishing with one `UPDATE`, until `n` tasks are done, with the store's settings
/// (WAL, `synchronous = NORMAL`, a busy timeout) and prepared statements kept. With `shared`, the workers take turns on
/// one connection (SQLite has one writer at a time, so this is the file's own rate);
/// otherwise each has its own connection, as a pool of connections does, and waits for the
/// write lock in SQLite's busy handler. With `claim_index`, the file first gets the index
/// that serves the claim's `ORDER BY` (without it SQLite sorts the queue's queued tasks on
/// every claim).
pub(super) async fn sqlite_ceiling(dir: &Path, threads: i64, n: usize, shared: bool, claim_index: bool) -> Drain {
    let file = fresh_file(dir, "ceiling");
    let queue = prefill(&file, threads, n, doc! {}).await;
    if claim_index {
        Connection::open(&file)
            .and_then(|c| c.execute_batch(CLAIM_INDEX))
            .expect("create the claim index");
    }
    let q = queue.id.to_hex();
    let connect = || {
        let c = Connection::open(&file).unwrap();
        c.busy_timeout(Duration::from_secs(30)).unwrap();
        c.pragma_update(None, "journal_mode", "WAL").unwrap();
        c.pragma_update(None, "synchronous", "NORMAL").unwrap();
        Arc::new(Mutex::new(c))
    };
    let one = connect();
    let workers: Vec<_> = (0..threads)
        .map(|w| {
            let c = if shared { one.clone() } else { connect() };
            let q = q.clone();
            std::thread::spawn(move || {
                let node = format!("driver-{w}");
                loop {
                    let id: Option<String> = {
                        let mut c = c.lock().unwrap();
                        let tx = c
                            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                            .unwrap();
                        let id = tx
                            .prepare_cached(
                                "UPDATE tasks SET node = ?1, status = ?2, mtime = ?3
                                 WHERE id = (SELECT id FROM tasks WHERE queue = ?4 AND status = ?5 AND node IS NULL
                                             ORDER BY priority DESC, id ASC LIMIT 1)
                                 RETURNING id",
                            )
                            .and_then(|mut st| {
                                st.query_row(
                                    params![
                                        node,
                                        status::CLAIMED,
                                        DateTime::now().timestamp_millis(),
                                        q,
                                        status::QUEUED
                                    ],
                                    |r| r.get::<_, String>(0),
                                )
                                .optional()
                            })
                            .unwrap();
                        tx.commit().unwrap();
                        id
                    };
                    let Some(id) = id else { break };
                    let done = c
                        .lock()
                        .unwrap()
                        .prepare_cached(
                            "UPDATE tasks SET status = ?1, stdout = 'hello\n', stderr = '', mtime = ?2
                             WHERE id = ?3 AND node = ?4 AND status = ?5",
                        )
                        .and_then(|mut st| {
                            st.execute(params![
                                status::SUCCEEDED,
                                DateTime::now().timestamp_millis(),
                                id,
                                node,
                                status::CLAIMED
                            ])
                        })
                        .unwrap();
                    assert_eq!(done, 1, "the driver loop's finish must find its claimed task");
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("a driver thread panicked");
    }
    let drain = drain_of(&file, &queue);
    assert_eq!(drain.finished, n as u64, "the driver loop must finish every task");
    drain
}
