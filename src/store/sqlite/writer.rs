//! The embedded store's writer: one thread per store (shared by its clones), with its own
//! connection, runs every write transaction of the store. The writes waiting when it takes
//! the file's write lock go into one `BEGIN IMMEDIATE` transaction, each in a savepoint of
//! its own, and one commit (a group commit): a write whose savepoint fails is rolled back
//! alone, and no write is answered before the commit that makes it durable returned.
//!
//! The writes of a group run one after the other, each seeing the ones before it, as they
//! would in transactions of their own; the group only shares the commit. A write waits at
//! most for the group before it, never for a timer.
//!
//! The writer also copies the write-ahead log into the file (a passive checkpoint) after a
//! commit leaves [`CHECKPOINT_FRAMES`] or more in the log, at most once per
//! [`CHECKPOINT_GAP`], and after [`IDLE_CHECKPOINT`] without a write (which also covers
//! the few writes made on pooled connections). The writer's connection does not checkpoint
//! on commit: SQLite's own checkpoint, once it cannot copy the whole log (a reader holding
//! an older snapshot), is tried again on every commit, each time syncing the log and the
//! file. Run between two groups, a checkpoint that copied all of the log lets the next
//! group start the log over.

use std::cell::Cell;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::{Connection, Transaction, TransactionBehavior};

use super::rows::is_transient;
use crate::store::{StoreError, StoreResult};

/// Most writes committed together.
const MAX_GROUP: usize = 64;

/// Pages in the log after a commit from which the writer checkpoints (SQLite's default
/// threshold).
const CHECKPOINT_FRAMES: i32 = 1000;

/// The shortest time between two checkpoints of the writer.
const CHECKPOINT_GAP: Duration = Duration::from_millis(50);

/// How long the writer waits for a write before it checkpoints whatever the log holds.
const IDLE_CHECKPOINT: Duration = Duration::from_secs(1);

thread_local! {
    /// Pages in the log after the writer thread's last commit (set by [`record_frames`]).
    static LOG_FRAMES: Cell<i32> = const { Cell::new(0) };
}

/// SQLite's hook after each commit of the writer's connection, on the writer's thread.
fn record_frames(_: &rusqlite::hooks::Wal, frames: std::os::raw::c_int) -> rusqlite::Result<()> {
    LOG_FRAMES.with(|f| f.set(frames));
    Ok(())
}

/// Checkpoints when the last commit left [`CHECKPOINT_FRAMES`] or more in the log and the
/// last checkpoint was [`CHECKPOINT_GAP`] ago or more. A failed checkpoint is tried again
/// after the next commit past the gap; the log grows meanwhile, nothing is lost.
fn checkpoint_if_due(c: &Connection, last: &mut Option<Instant>) {
    if LOG_FRAMES.with(Cell::get) < CHECKPOINT_FRAMES || last.is_some_and(|t| t.elapsed() < CHECKPOINT_GAP) {
        return;
    }
    *last = Some(Instant::now());
    checkpoint(c);
}

/// One passive checkpoint; the log's pages left uncopied count towards the next one.
fn checkpoint(c: &Connection) {
    let done = c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        Ok((r.get::<_, i32>(1)?, r.get::<_, i32>(2)?))
    });
    match done {
        Ok((log, copied)) => {
            LOG_FRAMES.with(|f| f.set(log.max(0)));
            if copied < log {
                tracing::debug!(
                    log,
                    copied,
                    "checkpoint copied part of the log (a reader holds an older snapshot)"
                );
            }
        }
        Err(e) => tracing::debug!(error = %e, "checkpoint failed; the writer tries again later"),
    }
}

/// Takes the next write; after [`IDLE_CHECKPOINT`] without one, checkpoints (opening the
/// connection if need be) and waits again. `None` when the store is gone.
fn next_job(
    queue: &mpsc::Receiver<Box<dyn Job>>,
    conn: &mut Option<Connection>,
    path: &Path,
    connect: Connect,
) -> Option<Box<dyn Job>> {
    loop {
        match queue.recv_timeout(IDLE_CHECKPOINT) {
            Ok(job) => return Some(job),
            Err(mpsc::RecvTimeoutError::Disconnected) => return None,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Ok(c) = connection(conn, path, connect) {
                    checkpoint(c);
                }
            }
        }
    }
}

/// Why a write's transaction did not commit: whether retrying can help, and the driver's
/// message.
struct Failed {
    transient: bool,
    message: String,
}

impl Failed {
    fn of(e: &rusqlite::Error) -> Failed {
        Failed {
            transient: is_transient(e),
            message: e.to_string(),
        }
    }

    fn error(&self, op: &str) -> StoreError {
        let message = format!("{op}: {}", self.message);
        if self.transient {
            StoreError::Database(message)
        } else {
            StoreError::Rejected(message)
        }
    }
}

/// A write waiting for the writer: run in a transaction (or told that none could begin),
/// then answered once that transaction's commit is over. A write can run more than once:
/// when its group's commit fails, it runs again alone (see [`run`]).
trait Job: Send {
    /// Runs the write in `tx`, in a savepoint of its own, keeping its outcome.
    fn run(&mut self, tx: Result<&Transaction<'_>, &Failed>);
    /// Answers the caller: `commit` is `None` when the transaction committed.
    fn answer(self: Box<Self>, commit: Option<&Failed>);
}

struct Pending<T, F> {
    op: &'static str,
    f: F,
    ran: Option<StoreResult<T>>,
    reply: tokio::sync::oneshot::Sender<StoreResult<T>>,
}

impl<T, F> Job for Pending<T, F>
where
    T: Send + 'static,
    F: Fn(&Transaction<'_>) -> StoreResult<T> + Send + 'static,
{
    fn run(&mut self, tx: Result<&Transaction<'_>, &Failed>) {
        self.ran = Some(match tx {
            Ok(tx) => in_savepoint(tx, self.op, &self.f),
            Err(failed) => Err(failed.error(self.op)),
        });
    }

    fn answer(self: Box<Self>, commit: Option<&Failed>) {
        let op = self.op;
        let result = match (self.ran, commit) {
            (None, _) => Err(StoreError::Database(format!("{op}: the write did not run"))),
            (Some(Ok(_)), Some(failed)) => Err(failed.error(op)),
            (Some(ran), _) => ran,
        };
        let _ = self.reply.send(result);
    }
}

/// A write and the receiver of its answer.
fn pending<T, F>(op: &'static str, f: F) -> (Box<dyn Job>, tokio::sync::oneshot::Receiver<StoreResult<T>>)
where
    T: Send + 'static,
    F: Fn(&Transaction<'_>) -> StoreResult<T> + Send + 'static,
{
    let (reply, answer) = tokio::sync::oneshot::channel();
    let job = Pending {
        op,
        f,
        ran: None,
        reply,
    };
    (Box::new(job), answer)
}

/// Opens a connection with the store's settings.
pub(super) type Connect = fn(&Path) -> StoreResult<Connection>;

/// The sending side of a store's writer thread; the thread ends when every clone of the
/// store is gone. A writer thread that died (a bug outside a write's own code) is started
/// again by the next write; the writes it held are answered with a transient error.
pub(super) struct Writer {
    jobs: Mutex<mpsc::Sender<Box<dyn Job>>>,
    path: PathBuf,
    connect: Connect,
}

impl Writer {
    /// Starts the writer thread of the file at `path`.
    pub(super) fn start(path: PathBuf, connect: Connect) -> std::io::Result<Writer> {
        let jobs = spawn(&path, connect)?;
        Ok(Writer {
            jobs: Mutex::new(jobs),
            path,
            connect,
        })
    }

    /// Runs `f` in the writer's transaction, in a savepoint of its own, and answers once
    /// the commit returned: `f`'s error rolls back `f`'s writes only. When the group's
    /// commit fails, every write of the group runs again alone, in a transaction of its
    /// own, and gets that transaction's outcome (so `f` may run more than once; only the
    /// last run's writes are committed).
    pub(super) async fn write<T, F>(&self, op: &'static str, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: Fn(&Transaction<'_>) -> StoreResult<T> + Send + 'static,
    {
        let (job, answer) = pending(op, f);
        self.send(op, job)?;
        answer.await.map_err(|_| {
            StoreError::Database(format!(
                "{op}: the database writer stopped before answering (it is started again; retry)"
            ))
        })?
    }

    /// Queues `job`, starting the writer thread again if it died.
    fn send(&self, op: &'static str, job: Box<dyn Job>) -> StoreResult<()> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let Err(mpsc::SendError(job)) = jobs.send(job) else {
            return Ok(());
        };
        tracing::error!("the database writer thread stopped; starting it again");
        *jobs = spawn(&self.path, self.connect)
            .map_err(|e| StoreError::Database(format!("{op}: cannot start the database writer: {e}")))?;
        jobs.send(job)
            .map_err(|_| StoreError::Database(format!("{op}: the database writer stopped; retry")))
    }
}

/// Starts a writer thread.
fn spawn(path: &Path, connect: Connect) -> std::io::Result<mpsc::Sender<Box<dyn Job>>> {
    let (jobs, queue) = mpsc::channel();
    let path = path.to_path_buf();
    std::thread::Builder::new()
        .name("disbatch-sqlite-writer".into())
        .spawn(move || run(&path, connect, &queue))?;
    Ok(jobs)
}

/// Runs `f` between `SAVEPOINT` and `RELEASE`, rolled back to the savepoint when it fails
/// or panics.
fn in_savepoint<T, F>(tx: &Transaction<'_>, op: &'static str, f: &F) -> StoreResult<T>
where
    F: Fn(&Transaction<'_>) -> StoreResult<T>,
{
    let err = |e: rusqlite::Error| Failed::of(&e).error(op);
    tx.prepare_cached("SAVEPOINT write")
        .and_then(|mut s| s.execute([]))
        .map_err(err)?;
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(tx)))
        .unwrap_or_else(|_| Err(StoreError::Rejected(format!("{op}: the write panicked"))));
    // A transaction SQLite rolled back on its own (a full disk, an I/O error) has no
    // savepoint left: the group's commit then fails, and says why.
    let end = |sql: &str| tx.prepare_cached(sql).and_then(|mut s| s.execute([]));
    if ran.is_err() {
        let _ = end("ROLLBACK TO write");
    }
    let _ = end("RELEASE write");
    ran
}

/// The writer thread: takes the waiting writes, up to [`MAX_GROUP`], runs them in one
/// transaction and commits, until the store is gone. When the group's commit fails (or
/// SQLite rolled the transaction back), nothing of it was written: each of its writes runs
/// again alone, in a transaction of its own, so that one write that makes the commit fail
/// (a full disk, a deferred constraint) fails alone, with its own error, and the others
/// commit.
fn run(path: &Path, connect: Connect, queue: &mpsc::Receiver<Box<dyn Job>>) {
    let mut conn: Option<Connection> = None;
    let mut waiting: VecDeque<Box<dyn Job>> = VecDeque::new();
    let mut checkpointed: Option<Instant> = None;
    loop {
        if waiting.is_empty() {
            match next_job(queue, &mut conn, path, connect) {
                Some(job) => waiting.push_back(job),
                None => return,
            }
        }
        while waiting.len() < MAX_GROUP {
            match queue.try_recv() {
                Ok(job) => waiting.push_back(job),
                Err(_) => break,
            }
        }
        let c = match connection(&mut conn, path, connect) {
            Ok(c) => c,
            Err(failed) => {
                for mut job in waiting.drain(..) {
                    job.run(Err(&failed));
                    job.answer(None);
                }
                continue;
            }
        };
        let mut group = Vec::with_capacity(waiting.len());
        let commit = match c.transaction_with_behavior(TransactionBehavior::Immediate) {
            Err(e) => {
                let failed = Failed::of(&e);
                for mut job in waiting.drain(..) {
                    job.run(Err(&failed));
                    job.answer(None);
                }
                continue;
            }
            Ok(tx) => {
                while let Some(mut job) = waiting.pop_front() {
                    job.run(Ok(&tx));
                    group.push(job);
                    if tx.is_autocommit() {
                        // SQLite rolled the whole transaction back (a full disk, an I/O
                        // error): the rest go into the next group.
                        break;
                    }
                }
                if tx.is_autocommit() {
                    Err(())
                } else {
                    tx.commit().map_err(|_| ())
                }
            }
        };
        match commit {
            Ok(()) => group.into_iter().for_each(|job| job.answer(None)),
            Err(()) => group.into_iter().for_each(|job| alone(c, job)),
        }
        checkpoint_if_due(c, &mut checkpointed);
    }
}

/// The writer's connection, opened if it is not.
fn connection<'c>(
    conn: &'c mut Option<Connection>,
    path: &Path,
    connect: Connect,
) -> Result<&'c mut Connection, Failed> {
    if conn.is_none() {
        let c = connect(path).map_err(|e| Failed {
            transient: e.is_transient(),
            message: e.to_string(),
        })?;
        // Checkpoints are the writer's own (see the module's text); the pragma replaces
        // the commit hook, so it comes first.
        c.pragma_update(None, "wal_autocheckpoint", 0)
            .map_err(|e| Failed::of(&e))?;
        c.wal_hook(Some(record_frames));
        *conn = Some(c);
    }
    conn.as_mut().ok_or_else(|| Failed {
        transient: true,
        message: "no connection".into(),
    })
}

/// Runs `job` again alone, in a transaction of its own, and answers it with that
/// transaction's outcome.
fn alone(c: &mut Connection, mut job: Box<dyn Job>) {
    let tx = match c.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => {
            let failed = Failed::of(&e);
            job.run(Err(&failed));
            return job.answer(None);
        }
    };
    job.run(Ok(&tx));
    let commit = if tx.is_autocommit() {
        drop(tx);
        Some(Failed {
            transient: true,
            message: "the transaction was rolled back by the database".into(),
        })
    } else {
        tx.commit().err().map(|e| Failed::of(&e))
    };
    job.answer(commit.as_ref());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plain connection with foreign keys checked, so that a deferred constraint makes
    /// COMMIT fail.
    fn connect(path: &Path) -> StoreResult<Connection> {
        let c = Connection::open(path).map_err(|e| StoreError::Database(e.to_string()))?;
        c.execute_batch("PRAGMA foreign_keys = ON")
            .map_err(|e| StoreError::Database(e.to_string()))?;
        Ok(c)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_group_commit_runs_each_write_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.db");
        connect(&path)
            .unwrap()
            .execute_batch(
                "CREATE TABLE parent (id INTEGER PRIMARY KEY);
                 CREATE TABLE child (id INTEGER PRIMARY KEY,
                     parent INTEGER REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED);",
            )
            .unwrap();
        let writer = Writer::start(path.clone(), connect).unwrap();

        // A first write holds the writer until the next two are queued behind it, so that
        // those two go into one group.
        let (started_tx, started) = mpsc::channel();
        let (release, released) = mpsc::channel::<()>();
        let released = Mutex::new(released);
        let (blocker, blocked) = pending("block", move |tx| {
            let _ = started_tx.send(());
            let _ = released.lock().unwrap().recv();
            tx.execute("INSERT INTO parent (id) VALUES (1)", []).unwrap();
            Ok(())
        });
        writer.send("block", blocker).unwrap();
        started.recv().unwrap();
        // Its savepoint succeeds; the deferred foreign key fails the group's commit.
        let (bad, bad_answer) = pending("bad", |tx| {
            tx.execute("INSERT INTO child (id, parent) VALUES (10, 99)", [])
                .map_err(|e| StoreError::Rejected(e.to_string()))?;
            Ok(())
        });
        let (good, good_answer) = pending("good", |tx| {
            tx.execute("INSERT INTO child (id, parent) VALUES (11, 1)", [])
                .map_err(|e| StoreError::Rejected(e.to_string()))?;
            Ok(())
        });
        writer.send("bad", bad).unwrap();
        writer.send("good", good).unwrap();
        release.send(()).unwrap();

        blocked.await.unwrap().unwrap();
        let bad = bad_answer.await.unwrap();
        assert!(
            matches!(&bad, Err(StoreError::Rejected(m)) if m.contains("FOREIGN KEY")),
            "{bad:?}"
        );
        good_answer.await.unwrap().unwrap();
        let rows: Vec<i64> = {
            let c = connect(&path).unwrap();
            let mut stmt = c.prepare("SELECT id FROM child ORDER BY id").unwrap();
            stmt.query_map([], |r| r.get(0))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap()
        };
        assert_eq!(rows, vec![11], "only the good write is committed");
    }

    #[tokio::test]
    async fn a_write_panicking_is_answered_and_the_writer_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.db");
        connect(&path)
            .unwrap()
            .execute_batch("CREATE TABLE t (id INTEGER)")
            .unwrap();
        let writer = Writer::start(path.clone(), connect).unwrap();
        let panicked = writer
            .write("panics", |_tx| -> StoreResult<()> { panic!("boom") })
            .await;
        assert!(matches!(panicked, Err(StoreError::Rejected(_))), "{panicked:?}");
        writer
            .write("insert", |tx| {
                tx.execute("INSERT INTO t (id) VALUES (1)", [])
                    .map_err(|e| StoreError::Rejected(e.to_string()))
            })
            .await
            .unwrap();
    }
}
