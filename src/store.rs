//! The store boundary: every Disbatch operation the DEN and the DCI need, independent of
//! the database behind it.
//!
//! [`mongo::MongoStore`] is the production implementation (MongoDB, the distributed
//! engine); [`sqlite::SqliteStore`] is the embedded single-machine one (one SQLite file).
//! Operations are about Disbatch — claim, finish, heartbeat, recover, search on indexed
//! fields — never about query syntax. The documents and fields named below are the
//! Disbatch 4 data model; each store maps them onto its own storage, and the shared test
//! suite (`tests/store_shared.rs`) holds both to the same behaviour.

pub mod change;
mod files;
pub mod group;
pub mod heads;
pub mod mongo;
pub mod node_change;
pub mod plugins;
pub mod queue_doc;
mod rates;
pub mod schedule_doc;
pub mod slot_change;
mod slots;
pub mod sqlite;
#[doc(hidden)]
pub mod testing;
mod types;

pub use self::change::{NodeIs, StopIs, TaskChange, TaskFence, Write};
pub use self::files::{FileStore, StoredFile};
pub use self::heads::{HeadFilter, HeadNode, TaskHead};
pub use self::node_change::{NodeChange, NodeFence, NodeRecord};
pub use self::plugins::{PluginRef, PluginStore, PluginVersion, Pushed};
pub use self::queue_doc::QueueState;
pub use self::rates::{RateRow, RateStore};
pub use self::schedule_doc::{ScheduleMark, ScheduleRecord};
pub use self::slot_change::{
    BusyNode, BusyOf, Holder, Lease, Mark, RenewRule, RenewStep, SlotChange, SlotFence, SlotRow,
};
pub use self::slots::SlotStore;
pub use self::types::*;

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use bson::oid::ObjectId;
use bson::{DateTime, Document};

use crate::model::{Node, Output, Queue, Schedule, StopRequest, Task, UnreadableQueue};

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
pub trait Store: PluginStore + SlotStore + RateStore + FileStore + Send + Sync + 'static {
    /// Creates collections and indexes as needed. Idempotent.
    async fn ensure_indexes(&self) -> StoreResult<()>;

    // ---- nodes -------------------------------------------------------------------------

    /// Upserts this node's document (`node`, `timestamp` = now; `maxthreads` left as the
    /// operators set it) and renews the leases on every slot `node` holds until
    /// now + `lease`. Returns the node document.
    async fn heartbeat(&self, node: &str, lease: Duration) -> StoreResult<Node>;
    /// All node documents.
    async fn nodes(&self) -> StoreResult<Vec<Node>>;
    /// The node document named `node`, if any, as read for a decision about its name.
    async fn node(&self, node: &str) -> StoreResult<Option<NodeRecord>>;
    /// Applies `change` to the node document named `node` when `fence` holds, in one
    /// conditional write. Answers whether a document matched (it may already have held the
    /// value). The store decides nothing: [`crate::lifecycle::nodes`] does.
    async fn change_node(&self, node: &str, fence: NodeFence, change: NodeChange) -> StoreResult<bool>;

    // ---- queues ------------------------------------------------------------------------

    /// All queues that can be read (those that cannot are left out: see
    /// [`Store::unreadable_queues`]).
    async fn queues(&self) -> StoreResult<Vec<Queue>>;
    /// The queue documents that cannot be read as queues (written by another tool, or
    /// raw), each with its problem, so they are shown rather than hidden.
    async fn unreadable_queues(&self) -> StoreResult<Vec<UnreadableQueue>>;
    /// One queue, None when there is no such queue; [`StoreError::Malformed`] when its
    /// document cannot be read as a queue.
    async fn queue(&self, id: ObjectId) -> StoreResult<Option<Queue>>;
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
    /// Records batch `id` (with `size`, ctime now) unless it is recorded already. True when
    /// this call recorded it. (The first size given wins: `lifecycle::batches`.)
    async fn insert_batch(&self, id: &str, size: Option<i64>) -> StoreResult<bool>;
    /// Sets batch `id`'s `size` when it has none recorded. True when this call set it.
    async fn set_batch_size_if_unset(&self, id: &str, size: i64) -> StoreResult<bool>;
    /// A batch as recorded, if any.
    async fn batch(&self, id: &str) -> StoreResult<Option<Batch>>;
    /// Records that batch `id` was judged complete and its tasks are to be deleted
    /// (`closed`, now), unless it is recorded already.
    async fn close_batch(&self, id: &str) -> StoreResult<()>;
    /// Counts by status of the tasks of batch `id` (an index walk over its tasks).
    async fn batch_counts(&self, id: &str) -> StoreResult<StatusCounts>;

    // ---- dependencies (see `lifecycle::deps`) -------------------------------------------

    /// Marks tasks and batches as waited for by blocked tasks (`dependents`), so that their
    /// end is settled (`lifecycle::deps::settle`) even when the DEN that ended them died
    /// first.
    async fn mark_dependents(&self, deps: &[Dependency]) -> StoreResult<()>;
    /// Up to `limit` blocked (-4) tasks still waiting for `dep` (an index walk).
    async fn blocked_on(&self, dep: &Dependency, limit: usize) -> StoreResult<Vec<ObjectId>>;
    /// Compare-and-set on a blocked task: applies `change` when `task` is still blocked (-4)
    /// and still waits for exactly `expect` (its `pending` as [`Store::task`] read it);
    /// false, with nothing written, otherwise. What the change is, is decided by
    /// `lifecycle::deps`.
    async fn resolve_pending(&self, task: ObjectId, expect: &[String], change: PendingChange<'_>) -> StoreResult<bool>;
    /// Clears `dependents` of an ended task (or a complete batch): its end was settled.
    async fn settled(&self, dep: &Dependency) -> StoreResult<()>;
    /// Up to `limit` ended tasks, and batches, still marked `dependents`: ends not yet
    /// settled, for the leader's sweep.
    async fn unsettled(&self, limit: usize) -> StoreResult<Vec<Dependency>>;

    // ---- schedules (see `lifecycle::schedules`) -----------------------------------------

    /// Every schedule, by name. Malformed ones are left out with a warning (once).
    async fn schedules(&self) -> StoreResult<Vec<ScheduleRecord>>;
    /// The schedule named `name`, if any.
    async fn schedule(&self, name: &str) -> StoreResult<Option<ScheduleRecord>>;
    /// Inserts the schedule `schedule.name`, or replaces its definition. `mark` given is a
    /// new schedule's progress mark; an existing schedule's `last` moves up to its `last`,
    /// never back (a leader may have moved it since it was read), and keeps its task.
    /// `None` keeps the stored mark (a new schedule without a mark is
    /// [`StoreError::Invalid`]). The store checks nothing of the definition.
    async fn put_schedule(&self, schedule: &Schedule, mark: Option<&ScheduleMark>) -> StoreResult<()>;
    /// Deletes a schedule (its tasks stay). False when there is no such schedule.
    async fn delete_schedule(&self, name: &str) -> StoreResult<bool>;
    /// Compare-and-set of a schedule's mark: writes `new` when its `last` stands at
    /// `expect`; false, with nothing written, otherwise (another leader moved it first, or
    /// the schedule is gone).
    async fn advance_schedule(&self, name: &str, expect: DateTime, new: &ScheduleMark) -> StoreResult<bool>;

    // ---- retention (see `lifecycle::retention`) -----------------------------------------

    /// Up to `filter.limit` tasks matching `filter` ([`ExpiredFilter`]), oldest `mtime`
    /// first, leaving out every task marked `dependents` (blocked tasks may wait for it)
    /// or `rerun`. A task whose `status` is not stored as a number or whose `mtime` is not
    /// stored as a date (written by another tool) is never found.
    async fn expired_tasks(&self, filter: &ExpiredFilter) -> StoreResult<Vec<ExpiredTask>>;
    /// Deletes each of `tasks` whose `status` and `mtime` still stand as read (and that is
    /// still marked neither `dependents` nor `rerun`), then every output file tied to a
    /// task deleted: the task first, so no task ever points at a missing file. The
    /// embedded store does it in one write transaction; MongoDB in one fenced delete of
    /// the tasks, then one of their files' chunks and one of the files. Answers the ids
    /// deleted.
    async fn delete_tasks(&self, tasks: &[ExpiredTask]) -> StoreResult<Vec<ObjectId>>;

    // ---- claiming and running (the DEN) ------------------------------------------------

    /// The lease `name` as stored (possibly lapsed), if any node ever took it (the leader
    /// lease is [`LEADER_LEASE`], taken by `lifecycle::leader`).
    async fn lease(&self, name: &str) -> StoreResult<Option<Leader>>;
    /// Compare-and-set of the lease `name`: writes `new` when the lease stands as `expect`
    /// (`None`: never taken, then `new` is inserted). False, with nothing written, when it
    /// stands otherwise (another node changed it first).
    async fn change_lease(&self, name: &str, expect: Option<&Leader>, new: &Leader) -> StoreResult<bool>;
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
    /// callers ever get the same task. On MongoDB this is the spec's `findOneAndUpdate`, or,
    /// for claims made together or of a queue being drained, a fenced update of a task read
    /// ahead (`store/mongo/claims.rs`); the embedded store does it in one write transaction.
    async fn claim(&self, queue: &Queue, node: &str) -> StoreResult<Option<Task>>;
    /// [`Store::claim`] for a DEN about to run the task: the task may come back already
    /// running (0), claimed and started in one write (the embedded store does so, in one
    /// transaction), or claimed (-1), to be started with `lifecycle::run::start` (MongoDB, whose
    /// claim is the spec's). Either way exactly one caller gets it.
    async fn claim_to_run(&self, queue: &Queue, node: &str) -> StoreResult<Option<Task>> {
        self.claim(queue, node).await
    }
    /// [`Store::claim_to_run`], made only while the database's clock is before `until`:
    /// the claim after a slot's renewal, which must not land past the renewal's
    /// `lifecycle::slots::claim_window` (held up on its way, by a stopped process or a slow
    /// network, its slot may have gone to another node meanwhile). MongoDB has the server
    /// check it (`$$NOW`); the embedded store checks its clock inside the write
    /// transaction.
    async fn claim_before(&self, queue: &Queue, node: &str, until: DateTime) -> StoreResult<Option<Task>>;
    /// Capability: a worker's next claim with the slot it holds, in one transaction: reads
    /// the slot's row, applies the step `rule` decides for it (`lease` from now), and when
    /// that step's outcome is [`SlotRenewal::Held`], [`Store::claim_to_run`] of `queue`.
    /// `None` (the default) when the store does not offer it or the step's write did not
    /// apply: the caller then renews and claims in separate writes (`lifecycle::slots`).
    async fn renew_and_claim(
        &self,
        _slot: &Slot,
        _queue: &Queue,
        _node: &str,
        _lease: Duration,
        _rule: RenewRule,
    ) -> StoreResult<Option<(SlotRenewal, Option<Task>)>> {
        Ok(None)
    }
    /// Capability: the end of a worker's run and its next claim in one write: writes `end`
    /// (one entry of [`Store::change_tasks`]) and [`Store::claim_before`] of `queue` for
    /// `node` with `until`. The embedded store claims in the end's transaction, only when
    /// the end's fence held; MongoDB sends the fenced claim of a task it read ahead in the
    /// end's `bulkWrite`, whether or not the end's fence holds (the task claimed is the
    /// caller's either way). `None` (the default) when the store does not offer it, or has no
    /// task read ahead at hand: the caller then ends the run and claims in separate writes
    /// (`lifecycle::run::finish_and_claim`). On an error nothing is known to be written: the
    /// reply may have been lost after the write, as for any write.
    async fn finish_and_claim(
        &self,
        _end: &(ObjectId, TaskFence, TaskChange),
        _queue: &Queue,
        _node: &str,
        _until: DateTime,
    ) -> StoreResult<Option<EndAndClaim>> {
        Ok(None)
    }
    /// Stores an output stream too large for the task document as the file `file` tied to
    /// `task` (`filename` is `stdout` or `stderr`). MongoDB keeps it in GridFS
    /// (`tasks.files` / `tasks.chunks`, String chunks), the embedded store as a blob.
    /// Called before the result that points at it is written
    /// (`lifecycle::run::finish_with`), so a task never points at a missing file.
    /// Idempotent: writing the same `file` again replaces whatever an earlier attempt (cut
    /// short, or whose reply was lost) left, so a retried write leaves one whole file.
    async fn put_output_file(&self, file: ObjectId, task: ObjectId, filename: &str, text: &str) -> StoreResult<()>;
    /// Deletes output files written for `task` that its result does not use (the result
    /// write failed, was refused, or the task was recovered meanwhile), each with all its
    /// pieces. A file the task document points at is kept (a finish whose reply was lost
    /// did apply), and so is a file of another task; ids never written are ignored.
    async fn discard_output_files(&self, task: ObjectId, files: &[ObjectId]) -> StoreResult<()>;
    /// The heads of up to `limit` tasks matching `filter` ([`heads`]), in no particular
    /// order: what orphan recovery (`lifecycle::recovery`) decides on.
    async fn task_heads(&self, filter: &HeadFilter, limit: usize) -> StoreResult<Vec<TaskHead>>;

    // ---- tasks (the DCI) ---------------------------------------------------------------

    /// Inserts tasks (node null, stdout/stderr null, ctime = mtime = now) with the given
    /// ids and params, in order: queued (-2), or scheduled (-7) when their `run_at` is
    /// still to come. On an error the embedded store created none of them (one
    /// transaction); MongoDB may have created a first part of them (an ordered insert cut
    /// short, or one whose reply was lost).
    async fn insert_tasks(&self, queue: ObjectId, tasks: Vec<NewTask>) -> StoreResult<()>;
    /// Applies each `(task, fence, change)` in order: `change` is written to `task` only
    /// while `fence` holds for it (see [`change`]). Answers, for each entry, whether it was
    /// written; a fence that does not hold (or a task that does not exist) changes nothing
    /// and answers false. The embedded store writes all entries in one transaction;
    /// MongoDB sends one fenced update per entry, in order, so on an error the entries
    /// before it may have been written. An empty change is [`StoreError::Invalid`].
    async fn change_tasks(&self, changes: &[(ObjectId, TaskFence, TaskChange)]) -> StoreResult<Vec<bool>>;
    /// Writes `change` to every task of `target` for which `fence` holds; answers the ids
    /// written. The change must set `mtime` ([`TaskChange::touch`]) and append no
    /// attempt, else it is [`StoreError::Invalid`]. Tasks changed by others at the same
    /// time are left out when their fence no longer holds.
    async fn change_where(
        &self,
        target: TaskTarget,
        fence: &TaskFence,
        change: &TaskChange,
    ) -> StoreResult<Vec<ObjectId>>;
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
pub fn lease_end(now: DateTime, lease: Duration) -> DateTime {
    let millis = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
    DateTime::from_millis(now.timestamp_millis().saturating_add(millis))
}
