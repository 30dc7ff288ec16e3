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
//!
//! The writes wait in two bounded queues (see [`queue`]): the liveness writes (heartbeats,
//! the leader lease, slot renewals) are taken first, and a group takes no more writes once
//! it ran for [`GROUP_TIME`], so a heartbeat waits for at most the group in progress, not
//! for every write queued before it. A full queue makes its callers wait for room.
//!
//! The writer counts the write transactions it commits ([`Writer::commits`]): a group
//! counts once however many writes share its commit, a write run again alone after a failed
//! group commit counts once when it commits, and a transaction that did not commit counts
//! nothing.

mod queue;

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::{Connection, Transaction, TransactionBehavior};

use super::records::is_transient;
use crate::store::{StoreError, StoreResult};
pub(crate) use queue::Priority;
use queue::{Queued, Queues};

/// Most writes committed together.
const MAX_GROUP: usize = 64;

/// How long a group takes more writes: past it, the group commits with those it ran, and
/// the writes still waiting (liveness writes first) go into the next.
const GROUP_TIME: Duration = Duration::from_millis(100);

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
fn next_job(queues: &Queues, conn: &mut Option<Connection>, path: &Path, connect: Connect) -> Option<Queued> {
    loop {
        match queues.pop(IDLE_CHECKPOINT) {
            Ok(job) => return Some(job),
            Err(true) => return None,
            Err(false) => {
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

/// The store's side of its writer thread; the thread ends when every clone of the store is
/// gone. A writer thread that died (a bug outside a write's own code) is started again by
/// the next write; the writes it held are answered with a transient error, those still
/// queued are run by the new thread.
pub(super) struct Writer {
    queues: Arc<Queues>,
    /// Whether the current thread still runs.
    alive: Mutex<Arc<AtomicBool>>,
    path: PathBuf,
    connect: Connect,
    /// Write transactions committed (see the module's text).
    commits: Arc<AtomicU64>,
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.queues.close();
    }
}

impl Writer {
    /// Starts the writer thread of the file at `path`.
    pub(super) fn start(path: PathBuf, connect: Connect) -> std::io::Result<Writer> {
        let queues = Queues::new();
        let commits = Arc::new(AtomicU64::new(0));
        let alive = spawn(&path, connect, &queues, &commits)?;
        Ok(Writer {
            queues,
            alive: Mutex::new(alive),
            path,
            connect,
            commits,
        })
    }

    /// The count of write transactions committed, by this writer's threads so far (one
    /// relaxed atomic add per commit).
    pub(super) fn commits(&self) -> &Arc<AtomicU64> {
        &self.commits
    }

    /// Runs `f` in the writer's transaction, in a savepoint of its own, and answers once
    /// the commit returned: `f`'s error rolls back `f`'s writes only. When the group's
    /// commit fails, every write of the group runs again alone, in a transaction of its
    /// own, and gets that transaction's outcome (so `f` may run more than once; only the
    /// last run's writes are committed). Waits for room in the queue when it is full.
    pub(super) async fn write<T, F>(&self, op: &'static str, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: Fn(&Transaction<'_>) -> StoreResult<T> + Send + 'static,
    {
        self.write_as(Priority::Ordinary, op, f).await
    }

    /// [`Self::write`] at `priority`.
    pub(super) async fn write_as<T, F>(&self, priority: Priority, op: &'static str, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: Fn(&Transaction<'_>) -> StoreResult<T> + Send + 'static,
    {
        let (job, answer) = pending(op, f);
        self.send(op, job, priority).await?;
        answer.await.map_err(|_| {
            StoreError::Database(format!(
                "{op}: the database writer stopped before answering (it is started again; retry)"
            ))
        })?
    }

    /// Queues `job`, starting the writer thread again if it died.
    async fn send(&self, op: &'static str, job: Box<dyn Job>, priority: Priority) -> StoreResult<()> {
        {
            let mut alive = self.alive.lock().unwrap_or_else(|e| e.into_inner());
            if !alive.load(Ordering::SeqCst) {
                tracing::error!("the database writer thread stopped; starting it again");
                *alive = spawn(&self.path, self.connect, &self.queues, &self.commits)
                    .map_err(|e| StoreError::Database(format!("{op}: cannot start the database writer: {e}")))?;
            }
        }
        self.queues.push(job, priority).await;
        Ok(())
    }
}

/// Marks its thread as gone when dropped (the thread returned or panicked).
struct Alive(Arc<AtomicBool>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// Starts a writer thread; answers the flag that says whether it still runs.
fn spawn(
    path: &Path,
    connect: Connect,
    queues: &Arc<Queues>,
    commits: &Arc<AtomicU64>,
) -> std::io::Result<Arc<AtomicBool>> {
    let alive = Arc::new(AtomicBool::new(true));
    let guard = Alive(alive.clone());
    let (path, queues, commits) = (path.to_path_buf(), queues.clone(), commits.clone());
    std::thread::Builder::new()
        .name("disbatch-sqlite-writer".into())
        .spawn(move || {
            let _guard = guard;
            run(&path, connect, &queues, &commits)
        })?;
    Ok(alive)
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

/// The writer thread: takes the waiting writes (liveness writes first), up to
/// [`MAX_GROUP`] or for [`GROUP_TIME`], runs them in one transaction and commits, until the
/// store is gone. When the group's commit fails (or SQLite rolled the transaction back),
/// nothing of it was written: each of its writes runs again alone, in a transaction of its
/// own, so that one write that makes the commit fail (a full disk, a deferred constraint)
/// fails alone, with its own error, and the others commit. Each commit is counted in
/// `commits` before its writes are answered.
fn run(path: &Path, connect: Connect, queues: &Queues, commits: &AtomicU64) {
    let mut conn: Option<Connection> = None;
    let mut checkpointed: Option<Instant> = None;
    loop {
        let Some(first) = next_job(queues, &mut conn, path, connect) else {
            return;
        };
        let c = match connection(&mut conn, path, connect) {
            Ok(c) => c,
            Err(failed) => {
                refuse(first, &failed);
                continue;
            }
        };
        let mut group = Vec::new();
        let commit = match c.transaction_with_behavior(TransactionBehavior::Immediate) {
            Err(e) => {
                refuse(first, &Failed::of(&e));
                continue;
            }
            Ok(tx) => {
                let began = Instant::now();
                let mut next = Some(first);
                while let Some(mut job) = next.take() {
                    job.job.run(Ok(&tx));
                    group.push(job);
                    if tx.is_autocommit() {
                        // SQLite rolled the whole transaction back (a full disk, an I/O
                        // error): the rest go into the next group.
                        break;
                    }
                    if group.len() < MAX_GROUP && began.elapsed() < GROUP_TIME {
                        next = queues.try_pop();
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
            Ok(()) => {
                commits.fetch_add(1, Ordering::Relaxed);
                group.into_iter().for_each(|job| job.answer(None));
            }
            Err(()) => group.into_iter().for_each(|job| alone(c, job, commits)),
        }
        checkpoint_if_due(c, &mut checkpointed);
    }
}

/// Answers `job` with the error that kept its transaction from beginning.
fn refuse(mut job: Queued, failed: &Failed) {
    job.job.run(Err(failed));
    job.answer(None);
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
        // The savepoint of each write of a group keeps the pages it changes in a
        // sub-journal, written to a temporary file past 64 KiB by default: in memory, a
        // write that changes more pages (an end and a claim) costs no file writes for it.
        c.pragma_update(None, "temp_store", "MEMORY")
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
/// transaction's outcome (its commit counted in `commits`).
fn alone(c: &mut Connection, mut job: Queued, commits: &AtomicU64) {
    let tx = match c.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => return refuse(job, &Failed::of(&e)),
    };
    job.job.run(Ok(&tx));
    let commit = if tx.is_autocommit() {
        drop(tx);
        Some(Failed {
            transient: true,
            message: "the transaction was rolled back by the database".into(),
        })
    } else {
        tx.commit().err().map(|e| Failed::of(&e))
    };
    if commit.is_none() {
        commits.fetch_add(1, Ordering::Relaxed);
    }
    job.answer(commit.as_ref());
}

#[cfg(test)]
mod tests;
