//! The embedded store's writer: one thread per store (shared by its clones), with its own
//! connection, runs every write transaction of the store. The writes waiting when it takes
//! the file's write lock go into one `BEGIN IMMEDIATE` transaction, each in a savepoint of
//! its own, and one commit (a group commit): a write whose savepoint fails is rolled back
//! alone, and no write is answered before the commit that makes it durable returned.
//!
//! The writes of a group run one after the other, each seeing the ones before it, as they
//! would in transactions of their own; the group only shares the commit. A write waits at
//! most for the group before it, never for a timer.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use rusqlite::{Connection, Transaction, TransactionBehavior};

use super::rows::is_transient;
use crate::store::{StoreError, StoreResult};

/// Most writes committed together.
const MAX_GROUP: usize = 64;

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

/// Answers a write once its group's commit is over (`None`: committed).
type Answer = Box<dyn FnOnce(Option<&Failed>) + Send>;

/// A write: run in the group's transaction (or told that none could begin), it gives the
/// answer to send after the commit.
type Job = Box<dyn FnOnce(Result<&Transaction<'_>, &Failed>) -> Answer + Send>;

/// Opens a connection with the store's settings.
pub(super) type Connect = fn(&Path) -> StoreResult<Connection>;

/// The sending side of a store's writer thread; the thread ends when every clone of the
/// store is gone.
pub(super) struct Writer {
    jobs: mpsc::Sender<Job>,
}

impl Writer {
    /// Starts the writer thread of the file at `path`.
    pub(super) fn start(path: PathBuf, connect: Connect) -> std::io::Result<Writer> {
        let (jobs, queue) = mpsc::channel();
        std::thread::Builder::new()
            .name("disbatch-sqlite-writer".into())
            .spawn(move || run(&path, connect, &queue))?;
        Ok(Writer { jobs })
    }

    /// Runs `f` in the writer's transaction, in a savepoint of its own, and answers once
    /// the commit returned: `f`'s error rolls back `f`'s writes only; a failed commit fails
    /// every write of the group.
    pub(super) async fn write<T, F>(&self, op: &'static str, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction<'_>) -> StoreResult<T> + Send + 'static,
    {
        let (reply, answer) = tokio::sync::oneshot::channel::<StoreResult<T>>();
        let job: Job = Box::new(move |tx| {
            let ran = match tx {
                Ok(tx) => in_savepoint(tx, op, f),
                Err(failed) => Err(failed.error(op)),
            };
            Box::new(move |commit: Option<&Failed>| {
                let result = match (ran, commit) {
                    (Ok(_), Some(failed)) => Err(failed.error(op)),
                    (ran, _) => ran,
                };
                let _ = reply.send(result);
            })
        });
        let stopped = || {
            StoreError::Rejected(format!(
                "{op}: the database writer stopped (a bug; restart the process)"
            ))
        };
        self.jobs.send(job).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// Runs `f` between `SAVEPOINT` and `RELEASE`, rolled back to the savepoint when it fails
/// or panics.
fn in_savepoint<T, F>(tx: &Transaction<'_>, op: &'static str, f: F) -> StoreResult<T>
where
    F: FnOnce(&Transaction<'_>) -> StoreResult<T>,
{
    let err = |e: rusqlite::Error| Failed::of(&e).error(op);
    tx.execute_batch("SAVEPOINT write").map_err(err)?;
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(tx)))
        .unwrap_or_else(|_| Err(StoreError::Rejected(format!("{op}: the write panicked"))));
    let end = if ran.is_ok() {
        "RELEASE write"
    } else {
        "ROLLBACK TO write; RELEASE write"
    };
    // A transaction SQLite rolled back on its own (a full disk, an I/O error) has no
    // savepoint left: the group's commit then fails, and says why.
    let _ = tx.execute_batch(end);
    ran
}

/// The writer thread: takes the waiting writes, up to [`MAX_GROUP`], runs them in one
/// transaction and commits, until the store is gone.
fn run(path: &Path, connect: Connect, queue: &mpsc::Receiver<Job>) {
    let mut conn: Option<Connection> = None;
    let mut waiting: VecDeque<Job> = VecDeque::new();
    loop {
        if waiting.is_empty() {
            match queue.recv() {
                Ok(job) => waiting.push_back(job),
                Err(_) => return,
            }
        }
        while waiting.len() < MAX_GROUP {
            match queue.try_recv() {
                Ok(job) => waiting.push_back(job),
                Err(_) => break,
            }
        }
        if conn.is_none() {
            match connect(path) {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    let failed = Failed {
                        transient: e.is_transient(),
                        message: e.to_string(),
                    };
                    for job in waiting.drain(..) {
                        job(Err(&failed))(None);
                    }
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        let tx = match c.transaction_with_behavior(TransactionBehavior::Immediate) {
            Ok(tx) => tx,
            Err(e) => {
                let failed = Failed::of(&e);
                for job in waiting.drain(..) {
                    job(Err(&failed))(None);
                }
                continue;
            }
        };
        let mut answers = Vec::with_capacity(waiting.len());
        while let Some(job) = waiting.pop_front() {
            answers.push(job(Ok(&tx)));
            if tx.is_autocommit() {
                // SQLite rolled the whole transaction back (a full disk, an I/O error):
                // the writes of the group so far are lost; the rest go into the next one.
                break;
            }
        }
        let commit = if tx.is_autocommit() {
            drop(tx);
            Some(Failed {
                transient: true,
                message: "the transaction was rolled back by the database after an error of a write in the same \
                          commit"
                    .into(),
            })
        } else {
            tx.commit().err().map(|e| Failed::of(&e))
        };
        for answer in answers {
            answer(commit.as_ref());
        }
    }
}
