//! The store boundary: every Disbatch operation the DEN and the DCI need, independent of
//! the database behind it.
//!
//! [`mongo::MongoStore`] is the production implementation (MongoDB, the distributed
//! engine); [`sqlite::SqliteStore`] is the embedded single-machine one (one SQLite file).
//! Operations are about Disbatch — claim, finish, heartbeat, recover, search on indexed
//! fields — never about query syntax. The documents and fields named below are the
//! Disbatch 4 data model; each store maps them onto its own storage, and the shared test
//! suite (`tests/store_shared.rs`) holds both to the same behaviour.

pub mod deps;
pub mod keys;
pub mod mongo;
pub mod plugins;
pub mod queue_doc;
mod retries;
pub mod sqlite;
#[doc(hidden)]
pub mod testing;
mod types;

pub use self::keys::Keyed;
pub use self::plugins::{PluginRef, PluginStore, PluginVersion, Pushed};
pub use self::queue_doc::QueueState;
pub use self::retries::{FinishExtra, HandRetry};
pub use self::types::*;

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use bson::oid::ObjectId;
use bson::{DateTime, Document};

use crate::model::{
    NameHolder, Node, NodeProcess, NodeStats, Output, Queue, RetryAt, StopRequest, Task, UnreadableQueue,
};

/// Errors of a store operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database could not be reached or failed the operation in a way that may pass:
    /// a network error, a timeout, a primary stepping down, a busy embedded database.
    /// Retrying can help ([`StoreError::is_transient`]).
    #[error("database error: {0}")]
    Database(String),
    /// The database refused the operation, or failed it in a way that would repeat: not
    /// authorized, a document too large, a document failing the collection's validation, a
    /// bad value, a full or read-only embedded database. Retrying cannot help.
    #[error("database refused the operation (retrying cannot help): {0}")]
    Rejected(String),
    /// A document in the database is not of the expected shape.
    #[error("malformed {collection} document {id}: {reason}")]
    Malformed {
        /// Collection name.
        collection: &'static str,
        /// The document's `_id` (or "?" when it has none).
        id: String,
        /// What is wrong.
        reason: String,
    },
    /// A unique name is already taken.
    #[error("{what} {name:?} already exists")]
    Duplicate {
        /// What kind of thing ("queue", "node").
        what: &'static str,
        /// The name.
        name: String,
    },
    /// The request is invalid (names the field).
    #[error("{0}")]
    Invalid(String),
}

impl StoreError {
    /// Whether retrying the same operation may succeed: true for [`StoreError::Database`]
    /// (the database is unreachable or briefly unable), false for everything else — a
    /// refusal, a malformed document, a duplicate, an invalid request are the same on
    /// every attempt.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Database(_))
    }
}

/// Result of a store operation.
pub type StoreResult<T> = Result<T, StoreError>;

/// The store boundary. All methods are safe to call from many DENs and DCIs at once.
#[async_trait]
pub trait Store: PluginStore + Send + Sync + 'static {
    /// Creates collections and indexes as needed. Idempotent.
    async fn ensure_indexes(&self) -> StoreResult<()>;

    // ---- nodes -------------------------------------------------------------------------

    /// Upserts this node's document (`node`, `timestamp` = now; `maxthreads` left as the
    /// operators set it) and renews the leases on every slot `node` holds until
    /// now + `lease`. Returns the node document.
    async fn heartbeat(&self, node: &str, lease: Duration) -> StoreResult<Node>;
    /// Takes the name `node` for `process`, atomically: records `process` and a heartbeat
    /// in the node document (creating it) unless another process holds the name, that is
    /// the document names a different `process.id` and its heartbeat is not older than
    /// `stale_before`, or (MongoDB) the document has no `process` field at all — a
    /// Disbatch 4 DEN's — and its heartbeat is not older than `stale_before`. Returns `None`
    /// when taken, the holder otherwise. On taking it, the node's claimed (-1) and running
    /// (0) tasks — a dead earlier process's, as the taking process has none yet — are
    /// recovered at once as by [`Store::recover_orphans`], and the node's slots are freed;
    /// but a name a Disbatch 4 DEN held keeps its tasks (its task runners outlive it and
    /// may still finish them), left to the spec's sweep of stale claims.
    async fn take_node(
        &self,
        node: &str,
        process: &NodeProcess,
        stale_before: DateTime,
    ) -> StoreResult<Option<NameHolder>>;
    /// Gives the name `node` up when the process `process` holds it (graceful shutdown), so
    /// another process may take it at once.
    async fn release_node(&self, node: &str, process: ObjectId) -> StoreResult<()>;
    /// All node documents.
    async fn nodes(&self) -> StoreResult<Vec<Node>>;
    /// Sets a node's `maxthreads` (None = no limit). Returns false when no such node.
    async fn set_maxthreads(&self, node: &str, maxthreads: Option<i64>) -> StoreResult<bool>;
    /// Stores the node's claim and run duration histograms in its document (`stats`).
    async fn report_stats(&self, node: &str, stats: &NodeStats) -> StoreResult<()>;
    /// Stores why the node cannot run some queues (`queue_problems`: queue id in hex →
    /// reason), replacing what it reported before.
    async fn report_queue_problems(&self, node: &str, problems: &BTreeMap<String, String>) -> StoreResult<()>;

    // ---- queues ------------------------------------------------------------------------

    /// All queues that can be read (those that cannot are left out: see
    /// [`Store::unreadable_queues`]).
    async fn queues(&self) -> StoreResult<Vec<Queue>>;
    /// The queue documents that cannot be read as queues (written by another tool, or
    /// raw), each with its problem, so they are shown rather than hidden.
    async fn unreadable_queues(&self) -> StoreResult<Vec<UnreadableQueue>>;
    /// Creates a queue; fails with [`StoreError::Duplicate`] when the name is taken.
    async fn create_queue(&self, queue: NewQueue) -> StoreResult<Queue>;
    /// Changes a queue. Returns the queue as changed, or None when there is no such queue.
    /// An error means nothing was written: a change that would make a readable queue
    /// unreadable is [`StoreError::Invalid`]. A queue that was already unreadable (a bad
    /// field written by another tool) is changed and returned as
    /// [`QueueState::Unreadable`] with its problem (see [`queue_doc::updated`]).
    async fn update_queue(&self, id: ObjectId, update: QueueUpdate) -> StoreResult<Option<QueueState>>;
    /// Deletes a queue (its tasks stay). Returns false when there is no such queue.
    async fn delete_queue(&self, id: ObjectId) -> StoreResult<bool>;
    /// Task counts by status for each queue: a walk over every task's index entry, so
    /// the DCI reads it through a cache (see `api/counts.rs`).
    async fn queue_counts(&self) -> StoreResult<BTreeMap<ObjectId, StatusCounts>>;
    /// Task counts of the active statuses ([`ACTIVE_STATUSES`]: scheduled, blocked,
    /// queued, claimed, running) for each queue, read from the `{queue, status}` index
    /// over those statuses only: its cost grows with the tasks not yet finished, never
    /// with the finished ones.
    async fn active_counts(&self) -> StoreResult<BTreeMap<ObjectId, StatusCounts>>;
    /// The id of the newest task (an `_id` index lookup reading the id alone), which
    /// changes when tasks are created.
    async fn newest_task_id(&self) -> StoreResult<Option<ObjectId>> {
        let page = Page {
            skip: 0,
            limit: 1,
            oldest_first: false,
        };
        Ok(self
            .find_tasks(&TaskFilter::default(), page)
            .await?
            .first()
            .map(|t| t.id))
    }

    // ---- per-minute counters (see [`crate::stats`]) -------------------------------------

    /// Adds `node`'s counters to the rows of each (minute, queue): one upsert per row.
    async fn add_stats(&self, node: &str, rows: &[(i64, ObjectId, crate::stats::Counters)]) -> StoreResult<()>;
    /// Records each queue's depth (queued tasks) sampled during `minute`, replacing an
    /// earlier sample of the same minute.
    async fn record_depth(&self, minute: i64, depths: &[(ObjectId, i64)]) -> StoreResult<()>;
    /// Every counter row and depth sample of the minutes `from..to`, of `queue` only when
    /// given. Malformed rows are left out with a warning (once).
    async fn read_stats(&self, from: i64, to: i64, queue: Option<ObjectId>)
        -> StoreResult<Vec<crate::stats::StatsRow>>;
    /// Deletes the rows of the minutes before `before`. Returns how many were deleted.
    async fn prune_stats(&self, before: i64) -> StoreResult<u64>;
    /// Records batch `id` at its first submission, with `size` when given (a batch recorded
    /// without a size takes the first size given later). Answers the batch as recorded,
    /// whose size may differ from `size`: the caller refuses such a submission.
    async fn open_batch(&self, id: &str, size: Option<i64>) -> StoreResult<Batch>;
    /// A batch as recorded, if any.
    async fn batch(&self, id: &str) -> StoreResult<Option<Batch>>;
    /// Counts by status of the tasks of batch `id` (an index walk over its tasks).
    async fn batch_counts(&self, id: &str) -> StoreResult<StatusCounts>;

    // ---- dependencies (see [`deps`]) ----------------------------------------------------

    /// Marks tasks and batches as waited for by blocked tasks (`dependents`), so that their
    /// end is settled ([`deps::settle`]) even when the DEN that ended them died first.
    async fn mark_dependents(&self, deps: &[Dependency]) -> StoreResult<()>;
    /// Up to `limit` blocked (-4) tasks still waiting for `dep` (an index walk).
    async fn blocked_on(&self, dep: &Dependency, limit: usize) -> StoreResult<Vec<ObjectId>>;
    /// Resolves what blocked task `task` waits for, now that `dep` ended: it succeeded
    /// (`failed` is None), or it did not and `task` is cancelled with `failed` as its
    /// `stop` — unless `task` runs anyway (`after_failure: "run"`), which resolves it as
    /// met. A task left waiting for nothing is queued (scheduled when its `run_at` is to
    /// come). Atomic per task: of two dependencies resolved at once, neither is lost.
    async fn resolve_dependency(
        &self,
        task: ObjectId,
        dep: &Dependency,
        failed: Option<&StopRequest>,
    ) -> StoreResult<Resolved>;
    /// Clears `dependents` of an ended task (or a complete batch): its end was settled.
    async fn settled(&self, dep: &Dependency) -> StoreResult<()>;
    /// Up to `limit` ended tasks, and batches, still marked `dependents`: ends not yet
    /// settled, for the leader's sweep.
    async fn unsettled(&self, limit: usize) -> StoreResult<Vec<Dependency>>;

    // ---- claiming and running (the DEN) ------------------------------------------------

    /// Takes a lease on a free slot of `queue` for `node` until now + `lease`. Slot numbers
    /// run `0..threads`; a slot is free when unheld (and not reserved for another node by
    /// its [ask](Store::want_slot)), or when its lease expired and its holder has no claimed
    /// or running task left in the queue: a slot is freed only with or after the recovery of
    /// its tasks. Returns None when all `threads` slots are taken, or while slots numbered
    /// `threads` or above are still held (the queue's limit was lowered and it is still over
    /// it). This is what makes `threads` hold across DENs.
    async fn acquire_slot(&self, queue: &Queue, node: &str, lease: Duration) -> StoreResult<Option<Slot>>;
    /// Gives a slot back (only if `node` still holds it).
    async fn release_slot(&self, slot: &Slot, node: &str) -> StoreResult<()>;
    /// Re-validates a slot lease before a claim: renews it until now + `lease` while `node`
    /// holds it and no other node asked for it; gives it up, reserved for the asker until
    /// its ask ends, when one did ([`Store::want_slot`]).
    async fn renew_slot(&self, slot: &Slot, node: &str, lease: Duration) -> StoreResult<SlotRenewal>;
    /// Asks for a fair share of `queue`'s slots when `node` found none free: marks, for
    /// `ask`, one slot of the node holding the most of them, if that is at least two more
    /// than `node` holds. Its holder gives the slot up before its next claim (see
    /// [`Store::renew_slot`]) and only `node` may take it until the ask ends. Without this a
    /// DEN that joins a busy queue late (or comes back from a pause) would wait for as long
    /// as the others keep finding tasks. Answers the node asked, if any.
    async fn want_slot(&self, queue: &Queue, node: &str, ask: Duration) -> StoreResult<Option<String>>;
    /// Takes the cluster's leader lease for `node` until now + `ttl` when it is free or has
    /// lapsed (its token grows by one), or renews it when `node` holds it; answers the
    /// lease as it stands after the attempt, whoever holds it.
    async fn lead(&self, node: &str, ttl: Duration) -> StoreResult<Leader>;
    /// The leader lease as stored (possibly lapsed), if any DEN ever took it.
    async fn leader(&self) -> StoreResult<Option<Leader>>;
    /// How many of `queue`'s slots are in use: held and unexpired, or expired while their
    /// holder still has a claimed or running task of the queue. No more of its tasks are
    /// claimed or running than this (each runs under a slot).
    async fn slots_in_use(&self, queue: ObjectId) -> StoreResult<i64>;
    /// The QueueBalance document (Disbatch 4's `balance` collection), if one was written.
    /// A permanent error when the collection holds more than one document.
    async fn balance(&self) -> StoreResult<Option<Document>>;
    /// Sets `fields` in the QueueBalance document, creating it when there is none.
    async fn set_balance(&self, fields: Document) -> StoreResult<()>;
    /// Writes a QueueBalance share: `queue`'s `maxthreads` (`None` clears it), for the
    /// leader that holds the lease as `token`. Fenced: changes nothing and answers `false`
    /// when the lease is no longer held as `token`, or when a leader with a higher token
    /// wrote or fenced the queue's share (`balance_token` on the queue); `false` too when the
    /// queue is gone. See [`Store::fence_shares`].
    async fn set_share(&self, queue: ObjectId, share: Option<i64>, token: i64) -> StoreResult<bool>;
    /// Marks `queues` as balanced by the leader holding the lease as `token` (their
    /// `balance_token`, raised, never lowered), so that no share write of an earlier leader
    /// lands after it. A new leader calls it before it reads the queues for a pass.
    async fn fence_shares(&self, queues: &[ObjectId], token: i64) -> StoreResult<()>;
    /// Whether `queue` has a claimable task (`{node: null, status: -2, queue}`): a cheap
    /// probe so an idle DEN does not take slot leases for empty queues.
    async fn has_queued(&self, queue: ObjectId) -> StoreResult<bool>;
    /// A stream that yields whenever tasks may have become claimable, so an idle DEN
    /// claims at once instead of at its next poll. `Ok(None)` when the store cannot
    /// notify; the stream ends or errs when notification stops (the DEN keeps polling).
    async fn watch_queued(&self) -> StoreResult<Option<QueuedEvents>> {
        Ok(None)
    }
    /// A stream that yields when tasks change (created, claimed, started, finished,
    /// progress reported, cancelled, requeued…), so waiters answer at once without
    /// polling. MongoDB rides a change stream (changes by any process); the embedded
    /// store signals the changes made through it in this process. `Ok(None)` when the
    /// store cannot notify; the stream ends or errs when notification stops.
    async fn watch_tasks(&self) -> StoreResult<Option<TaskEvents>> {
        Ok(None)
    }
    /// For each of `ids` (at most a thousand) that names a task, a number that changes
    /// whenever the task's `status`, `mtime` or progress changes: the waiters' hub compares
    /// these after a "something changed" notice instead of every waiter reading its tasks.
    /// The default reads the tasks; a store may read less.
    async fn task_marks(&self, ids: &[ObjectId]) -> StoreResult<Vec<(ObjectId, u64)>> {
        let filter = TaskFilter {
            ids: Some(ids.to_vec()),
            ..Default::default()
        };
        let page = Page {
            skip: 0,
            limit: ids.len() as u64,
            oldest_first: false,
        };
        let tasks = self.find_tasks(&filter, page).await?;
        Ok(tasks.iter().map(|t| (t.id, task_mark(t))).collect())
    }
    /// Claims the next queued task of `queue` for `node` in one atomic step: the first
    /// task matching `{node: null, status: -2, queue}` that `node` is not leaving to the
    /// others (`avoid_node` is `node` and `avoid_until` is still to come: a retry prefers
    /// another node for a moment) (highest `priority` first, then
    /// oldest `_id` first for `fifo`, newest for `lifo`, any for `default`; a task without
    /// a `priority`, written by a Disbatch 4 tool, comes after every task with one) gets `{node, status: -1, mtime: now}`. No two
    /// callers ever get the same task. On MongoDB this is the spec's `findOneAndUpdate`;
    /// the embedded store does it in one write transaction.
    async fn claim(&self, queue: &Queue, node: &str) -> StoreResult<Option<Task>>;
    /// Marks a claimed task running (0), fenced on `{_id, node, status: -1}`.
    /// Idempotent: a task already `{node, status: 0}` (a retry whose first reply was lost)
    /// also returns true. Returns false when the task is no longer ours.
    async fn start(&self, task: ObjectId, node: &str) -> StoreResult<bool>;
    /// [`Store::claim`] for a DEN about to run the task: the task may come back already
    /// running (0), claimed and started in one write (the embedded store does so, in one
    /// transaction), or claimed (-1), to be started with [`Store::start`] (MongoDB, whose
    /// claim is the spec's). Either way exactly one caller gets it.
    async fn claim_to_run(&self, queue: &Queue, node: &str) -> StoreResult<Option<Task>> {
        self.claim(queue, node).await
    }
    /// A worker's next claim with the slot it holds: [`Store::renew_slot`], then, only when
    /// the slot is still held, [`Store::claim_to_run`] of `queue`. The embedded store does
    /// both in one transaction. An error of either step is returned as is (a claimed task
    /// that cannot be read was failed by the store, as [`Store::claim`] does). Done as two
    /// writes, the claim is sent only within [`claim_window`] of the renewal being sent: a
    /// process paused after the renewal (its lease may have run out and its slot gone to
    /// another node) claims nothing when it wakes. MongoDB also has the server refuse a
    /// claim reaching it after that window (by the renewal's wall clock), so a claim held
    /// up on its way (the process stopped just after the check, a slow network) claims
    /// nothing either.
    async fn renew_and_claim(
        &self,
        slot: &Slot,
        queue: &Queue,
        node: &str,
        lease: Duration,
    ) -> StoreResult<(SlotRenewal, Option<Task>)> {
        let window = claim_window(lease);
        let sent = std::time::Instant::now();
        let until = lease_end(DateTime::now(), window);
        match self.renew_slot(slot, node, lease).await? {
            SlotRenewal::Held if sent.elapsed() >= window => Ok((SlotRenewal::Held, None)),
            SlotRenewal::Held => Ok((SlotRenewal::Held, self.claim_before(queue, node, until).await?)),
            other => Ok((other, None)),
        }
    }
    /// [`Store::claim_to_run`], made only while the database's clock is before `until`: the
    /// claim of [`Store::renew_and_claim`] done as two writes. MongoDB has the server check
    /// it (`$$NOW`); the default claims without the check.
    async fn claim_before(&self, queue: &Queue, node: &str, until: DateTime) -> StoreResult<Option<Task>> {
        let _ = until;
        self.claim_to_run(queue, node).await
    }
    /// Stores an output stream too large for the task document as the file `file` tied to
    /// `task` (`filename` is `stdout` or `stderr`). MongoDB keeps it in GridFS
    /// (`tasks.files` / `tasks.chunks`, String chunks), the embedded store as a blob.
    /// Called before [`Store::finish`], so a task never points at a missing file.
    /// Idempotent: writing the same `file` again replaces whatever an earlier attempt (cut
    /// short, or whose reply was lost) left, so a retried write leaves one whole file.
    async fn put_output_file(&self, file: ObjectId, task: ObjectId, filename: &str, text: &str) -> StoreResult<()>;
    /// Deletes output files written for `task` that its result does not use (the result
    /// write failed, was refused, or the task was recovered meanwhile), each with all its
    /// pieces. A file the task document points at is kept (a finish whose reply was lost
    /// did apply), and so is a file of another task; ids never written are ignored.
    async fn discard_output_files(&self, task: ObjectId, files: &[ObjectId]) -> StoreResult<()>;
    /// Finishes a task: status, stdout, stderr and mtime in one update, fenced on
    /// `{_id, node, status: 0}`. Returns false when the task was recovered meanwhile (then
    /// nothing is written).
    async fn finish(
        &self,
        task: ObjectId,
        node: &str,
        status: i32,
        stdout: OutputValue,
        stderr: OutputValue,
    ) -> StoreResult<bool> {
        self.finish_with(task, node, status, stdout, stderr, &FinishExtra::default())
            .await
    }
    /// [`Store::finish`], also storing the plugin's last progress report and appending the
    /// run's record to `attempts` in the same update. A task marked to run again
    /// ([`Store::request_rerun`]) is queued again instead (-2, node null, outputs cleared),
    /// with the run's record — its outputs as a file or the end of the text — appended.
    async fn finish_with(
        &self,
        task: ObjectId,
        node: &str,
        status: i32,
        stdout: OutputValue,
        stderr: OutputValue,
        extra: &FinishExtra,
    ) -> StoreResult<bool>;
    /// Ends a failed run that its queue's `retry` policy runs again, fenced on `{_id, node,
    /// status: 0}`: appends `retry.attempt` to `attempts`, and the task waits (-7, node
    /// null) until `retry.run_at` — or is queued (-2) at once when that is not after now —
    /// at `retry.priority`, left by `retry.avoid_node` to the others until
    /// `retry.avoid_until`. Its outputs and progress are cleared.
    /// Returns false when the task is no longer running on `node`, or someone asked to
    /// kill it (it must not run again: the caller stores the failure as its result) and
    /// `retry.after_kill` is not set.
    async fn retry_later(&self, task: ObjectId, node: &str, retry: &RetryAt) -> StoreResult<bool>;
    /// Queues a finished task again by hand (succeeded, failed or any other positive
    /// status, orphaned, cancelled or terminated): its last run becomes a record in
    /// `attempts` (with `reason`, and its outputs: a file kept as is, a text's last
    /// 4 KiB), and it is queued (-2, node null) with its outputs, progress and stop
    /// request cleared. Fenced on the status and mtime read, so of two concurrent retries
    /// one wins.
    ///
    /// With `replace`, the task also takes its params, priority and `run_at` (waiting as
    /// scheduled when that is still to come): a finished task submitted again by key.
    async fn retry_by_hand(&self, task: ObjectId, reason: &str, replace: Option<&NewTask>) -> StoreResult<HandRetry>;
    /// Inserts one task with a key ([`NewTask::key`]) unique within its queue. When the
    /// key is taken, answers the task that has it, or with `resubmit` submits that task
    /// again: one still waiting (queued or scheduled, unclaimed) takes the new params,
    /// priority and `run_at`; a claimed or running one is marked to run once more when
    /// this run ends ([`Store::request_rerun`]); a finished one is queued again with the
    /// new params ([`Store::retry_by_hand`]); a held one is left as it is.
    async fn insert_keyed(&self, queue: ObjectId, task: NewTask, resubmit: bool) -> StoreResult<Keyed> {
        keys::insert_keyed(self, queue, task, resubmit).await
    }
    /// Gives a waiting task (`status` queued or scheduled, unclaimed) `task`'s params,
    /// priority and `run_at`, and the status they mean now. False when it changed meanwhile.
    async fn resubmit_waiting(&self, id: ObjectId, status: i32, task: &NewTask) -> StoreResult<bool>;
    /// Marks a claimed or running task to run once more when its run ends (`rerun`):
    /// [`Store::finish_with`] then queues it again, the run's record in `attempts`. False
    /// when it is no longer claimed or running.
    async fn request_rerun(&self, id: ObjectId) -> StoreResult<bool>;
    /// Stores a running task's latest progress (`progress`), fenced on `{_id, node,
    /// status: 0}`. Returns false when the task is no longer running on `node`.
    async fn report_progress(
        &self,
        task: ObjectId,
        node: &str,
        progress: &crate::model::TaskProgress,
    ) -> StoreResult<bool>;
    /// Puts tasks of `node` that are claimed or running back in their queue (-2, node
    /// null), for a graceful shutdown. Returns the ids requeued. A task someone asked to
    /// kill is not put back: it ends failed (2) with [`KILLED_AT_SHUTDOWN`] as stderr.
    async fn requeue_own(&self, node: &str, tasks: &[ObjectId]) -> StoreResult<Vec<ObjectId>>;
    /// Recovers orphans: claimed (-1) tasks whose mtime is older than `claimed_before`
    /// (the spec's sweep), and claimed or running tasks of any node that is not fresh
    /// (heartbeat older than `stale_before`, or no node document) once the task's own
    /// mtime is older than `stale_before` too, so a task claimed a moment ago by a node
    /// that registered after the node list was read is left alone. Each task is changed
    /// only if its status, node and mtime are still the ones read. Each becomes orphaned
    /// (-6), or queued again (-2, node null) when its queue's `on_orphan` is `requeue` and
    /// nobody asked to kill it;
    /// mtime is set to now. Slots held by stale nodes are freed; slots of nodes without a
    /// document are not freed here but expire with their lease.
    async fn recover_orphans(&self, claimed_before: DateTime, stale_before: DateTime) -> StoreResult<Recovery>;

    // ---- tasks (the DCI) ---------------------------------------------------------------

    /// Inserts tasks (node null, stdout/stderr null, ctime = mtime = now) with the given
    /// ids and params, in order: queued (-2), or scheduled (-7) when their `run_at` is
    /// still to come. On an error the embedded store created none of them (one
    /// transaction); MongoDB may have created a first part of them (an ordered insert cut
    /// short, or one whose reply was lost).
    async fn insert_tasks(&self, queue: ObjectId, tasks: Vec<NewTask>) -> StoreResult<()>;
    /// Queues (-7 → -2, mtime now) every scheduled task whose `run_at` is not after
    /// `now`, in one indexed update whatever the number of tasks still scheduled. Returns
    /// how many were queued.
    async fn promote_due(&self, now: DateTime) -> StoreResult<u64>;
    /// Cancels tasks that have not started: those of `target` that are queued (-2) or
    /// scheduled (-7) and unclaimed become cancelled (-5) with `stop` recorded. Returns
    /// the ids cancelled (none when the task is claimed, running or finished).
    async fn cancel_tasks(&self, target: TaskTarget, stop: &StopRequest) -> StoreResult<Vec<ObjectId>>;
    /// Asks for running tasks to be killed: records `stop` on those of `target` that are
    /// claimed (-1) or running (0) and not already asked. The DEN running each stops its
    /// plugin ([`Store::kill_requests`]) and ends the task failed. Returns the ids asked.
    async fn request_kill(&self, target: TaskTarget, stop: &StopRequest) -> StoreResult<Vec<ObjectId>>;
    /// The kill requests on tasks `node` has claimed or is running.
    async fn kill_requests(&self, node: &str) -> StoreResult<Vec<(ObjectId, StopRequest)>>;

    /// Tasks matching `filter`, newest first.
    async fn find_tasks(&self, filter: &TaskFilter, page: Page) -> StoreResult<Vec<Task>>;
    /// Number of tasks matching `filter`.
    async fn count_tasks(&self, filter: &TaskFilter) -> StoreResult<u64>;
    /// One task.
    async fn task(&self, id: ObjectId) -> StoreResult<Option<Task>>;
    /// The text of a stored output: inline text as is, a file read back whole.
    async fn read_output(&self, output: &Output) -> StoreResult<String>;
    /// The text of a stored output as a stream of pieces in order, to serve large files
    /// without holding them whole: MongoDB yields one GridFS chunk at a time. The default
    /// reads the output whole and yields it at once (the embedded store's file is one row).
    /// A corrupt file ends the stream with an error after the pieces read so far.
    async fn output_stream(&self, output: &Output) -> StoreResult<OutputStream> {
        Ok(one_piece(self.read_output(output).await?))
    }
}

/// The default [`Store::task_marks`] of one task: a hash of its status, `mtime` and progress.
pub fn task_mark(t: &Task) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (t.status, t.mtime.timestamp_millis()).hash(&mut h);
    if let Some(p) = &t.progress {
        (p.percent.map(f64::to_bits), &p.info, p.at.timestamp_millis()).hash(&mut h);
    }
    h.finish()
}

/// A lease of `lease` from `now` as a date, saturating.
pub(crate) fn lease_end(now: DateTime, lease: Duration) -> DateTime {
    let millis = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
    DateTime::from_millis(now.timestamp_millis().saturating_add(millis))
}

/// How long after a slot's renewal was sent a claim with it may still be made
/// ([`Store::renew_and_claim`]): half the slot's `lease`. Whoever takes the slot once its
/// lease has run out finds the claim made (the task held by the slot's holder) and leaves
/// the slot; the other half of the lease is the margin for clocks that disagree.
pub fn claim_window(lease: Duration) -> Duration {
    lease / 2
}

/// The node a slot should be asked from ([`Store::want_slot`]): of the holders of a queue's
/// live slots (one name per slot), the one holding the most, when that is at least two more
/// than `node` holds (so a slot moving never leaves the asker holding more than the giver,
/// and two nodes never pass a slot back and forth). Ties go to the first name in order.
pub(crate) fn fair_share_donor<'a>(holders: impl Iterator<Item = &'a str>, node: &str) -> Option<String> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for h in holders {
        *counts.entry(h).or_default() += 1;
    }
    let mine = counts.remove(node).unwrap_or(0);
    let (most, held) = counts
        .into_iter()
        .fold(None, |best: Option<(&str, usize)>, (h, n)| match best {
            Some((_, m)) if m >= n => best,
            _ => Some((h, n)),
        })?;
    (held >= mine + 2).then(|| most.to_string())
}

#[cfg(test)]
mod tests {
    use super::fair_share_donor;

    #[test]
    fn a_slot_is_asked_from_the_node_holding_the_most() {
        let ask = |held: &[&str], node| fair_share_donor(held.iter().copied(), node);
        assert_eq!(ask(&["a", "b", "b", "c", "c", "c"], "d").as_deref(), Some("c"));
        assert_eq!(
            ask(&["a", "a", "b", "b"], "d").as_deref(),
            Some("a"),
            "ties go to the first name"
        );
        assert_eq!(ask(&["a", "a", "d"], "d"), None, "one more is fair enough");
        assert_eq!(ask(&["a", "a", "a", "d"], "d").as_deref(), Some("a"));
        assert_eq!(ask(&["d", "d", "d"], "d"), None, "never from itself");
        assert_eq!(ask(&[], "d"), None);
        assert_eq!(ask(&["a"], "d"), None, "a single slot stays where it is");
    }
}
