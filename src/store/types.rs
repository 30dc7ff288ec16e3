//! The values the [`Store`](super::Store) boundary takes and gives: new queues and tasks,
//! searches and pages, leases, and what recovery did.

use std::collections::BTreeMap;
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{DateTime, Document};

use super::{StoreError, StoreResult};
use crate::model::{Sort, StopRequest};

/// How a finishing task's stdout or stderr is to be stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputValue {
    /// In the task document.
    Inline(String),
    /// Already written as a file with [`super::Store::put_output_file`].
    File(ObjectId),
}

/// What an orphan sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Tasks set to orphaned (-6).
    pub orphaned: Vec<ObjectId>,
    /// Tasks put back in their queue (-2, node null).
    pub requeued: Vec<ObjectId>,
    /// Tasks to run again later by their queue's `retry` policy (-7 or -2, node null).
    pub retried: Vec<ObjectId>,
}

/// A lease on one of a queue's `threads` slots.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Slot {
    /// The queue.
    pub queue: ObjectId,
    /// Slot number, `0..threads`.
    pub n: i64,
    /// The take this lease came from, written on the slot when it was taken: renewals and
    /// the release are fenced on it, so a lease that ran out and was taken again (by its
    /// holder's node too) is not renewed or given back through the old one.
    pub taken: ObjectId,
}

impl Slot {
    /// Slot `n` of `queue` as another node's lease is addressed (its take unknown): an ask
    /// on it, which is fenced on its holder, never on the take.
    pub fn numbered(queue: ObjectId, n: i64) -> Slot {
        Slot {
            queue,
            n,
            taken: ObjectId::from_bytes([0; 12]),
        }
    }
}

/// A batch of tasks as recorded at its first submission (`crate::lifecycle::batches::open_batch`).
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Its id, chosen by whoever submits it.
    pub id: String,
    /// How many tasks it will have, when that was given: it is complete once it has that
    /// many and all have ended.
    pub size: Option<i64>,
    /// When its first tasks were submitted.
    pub ctime: DateTime,
    /// Whether tasks wait for it to complete (`after` naming it).
    pub dependents: bool,
    /// When retention judged it complete, just before deleting its tasks: from then on it
    /// is complete with fewer tasks than its `size` (`lifecycle::batches::complete`).
    pub closed: Option<DateTime>,
}

/// What re-validating a slot lease before a claim found (`lifecycle::slots::renew_slot`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotRenewal {
    /// Still held by this node; the lease runs on.
    Held,
    /// Held by another node now (recovered while this node was paused or cut off).
    Lost,
    /// Still held, but the queue's limit no longer covers it: Disbatch 4 DENs sharing the
    /// database run some of the queue's tasks (they take no slots). The holder gives it
    /// back instead of claiming with it.
    OverLimit,
    /// Another node asked for a share of the queue's slots: this node gave the slot up,
    /// reserved for that node for a while.
    Yielded {
        /// The node the slot is reserved for.
        to: String,
    },
}

/// What [`Store::finish_and_claim`](super::Store::finish_and_claim) wrote: the end of a run,
/// and the worker's next claim made with it.
#[derive(Debug)]
pub struct EndAndClaim {
    /// Whether the end of the run was written (its fence held).
    pub ended: bool,
    /// The next claim: the task claimed (started on the embedded store, claimed on MongoDB),
    /// or none (on the embedded store: the end was not written; the claim's deadline had
    /// passed, or no task is queued); an error for a claimed task that cannot be read as one
    /// (marked failed, as [`Store::claim`](super::Store::claim) does), or for a claim made
    /// again on its own that failed (MongoDB).
    pub claimed: StoreResult<Option<crate::model::Task>>,
}

/// A new queue.
#[derive(Debug, Clone, PartialEq)]
pub struct NewQueue {
    /// Unique name.
    pub name: String,
    /// Plugin name.
    pub plugin: String,
    /// Concurrency limit (None pauses).
    pub threads: Option<i64>,
    /// Claim order.
    pub sort: Sort,
    /// Extra fields stored as given (`sandbox`, `on_orphan`, …), already validated.
    pub extra: Document,
}

/// Which ended tasks [`super::Store::expired_tasks`] looks for: those of `queue` with
/// `status` whose `mtime` is before `before`, except `except_ids` and the tasks of the
/// batches `except_batches`.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpiredFilter {
    /// The queue.
    pub queue: ObjectId,
    /// The ended status.
    pub status: i32,
    /// Only tasks whose `mtime` is before this.
    pub before: DateTime,
    /// Never these tasks.
    pub except_ids: Vec<ObjectId>,
    /// Never the tasks of these batches.
    pub except_batches: Vec<String>,
    /// Only the tasks of this batch.
    pub batch: Option<String>,
    /// The most tasks answered.
    pub limit: usize,
}

/// An ended task as [`super::Store::expired_tasks`] read it: what a deletion is fenced on.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpiredTask {
    /// `_id`.
    pub id: ObjectId,
    /// Its status as read.
    pub status: i32,
    /// Its `mtime` as read.
    pub mtime: DateTime,
    /// Its batch, if any.
    pub batch: Option<String>,
}

/// Fields of a queue to change; `None` leaves a field as it is.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueUpdate {
    /// New name.
    pub name: Option<String>,
    /// New plugin.
    pub plugin: Option<String>,
    /// New threads (`Some(None)` sets null).
    pub threads: Option<Option<i64>>,
    /// New sort.
    pub sort: Option<Sort>,
    /// Other fields to set (`sandbox`, `on_orphan`), already validated.
    pub extra: Document,
}

/// A task search on indexed fields only.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaskFilter {
    /// Only this task.
    pub id: Option<ObjectId>,
    /// Only these tasks.
    pub ids: Option<Vec<ObjectId>>,
    /// Only this queue.
    pub queue: Option<ObjectId>,
    /// Only these statuses.
    pub status: Option<Vec<i32>>,
    /// Only this node (`Some(None)` = unclaimed).
    pub node: Option<Option<String>>,
    /// Only the task with this key.
    pub key: Option<String>,
    /// Only the tasks of this batch.
    pub batch: Option<String>,
    /// Only the tasks submitted after this task or batch (its children).
    pub after: Option<Dependency>,
    /// Only tasks created after this one (`_id` greater).
    pub newer_than: Option<ObjectId>,
    /// Only tasks created before this one (`_id` less): the cursor of the next page.
    pub older_than: Option<ObjectId>,
}

/// A task to insert ([`super::Store::insert_tasks`]).
#[derive(Debug, Clone, PartialEq)]
pub struct NewTask {
    /// Its `_id`.
    pub id: ObjectId,
    /// Its params.
    pub params: Document,
    /// When it becomes due: until then it is scheduled (-7), not queued (-2). `None` or a
    /// time already past queues it at once (the time is kept as `run_at` either way).
    pub run_at: Option<DateTime>,
    /// Claim priority within the queue: higher first (0 when not given).
    pub priority: i64,
    /// A key unique within the queue (`lifecycle::keys::insert_keyed`).
    pub key: Option<String>,
    /// The batch it belongs to (`crate::lifecycle::batches::open_batch`).
    pub batch: Option<String>,
    /// What it waits for (`after`): it is inserted blocked (-4) until each has succeeded.
    pub after: Vec<Dependency>,
    /// Whether it runs anyway once what it waits for ended without succeeding
    /// (`after_failure: "run"`), rather than being cancelled.
    pub after_failure_runs: bool,
    /// Whether tasks inserted with it wait for it (`dependents`), so the DEN that ends it
    /// releases them at once.
    pub dependents: bool,
}

impl NewTask {
    /// A task queued at once, at priority 0.
    pub fn queued(id: ObjectId, params: Document) -> NewTask {
        NewTask {
            id,
            params,
            run_at: None,
            priority: 0,
            key: None,
            batch: None,
            after: Vec::new(),
            after_failure_runs: false,
            dependents: false,
        }
    }

    /// The status it is inserted with at `now`: blocked while it waits for other tasks.
    pub fn initial_status(&self, now: DateTime) -> i32 {
        if !self.after.is_empty() {
            return crate::model::status::BLOCKED;
        }
        due_status(self.run_at, now)
    }
}

/// The status of a task that may run once `run_at` (if any) has come: scheduled (-7)
/// before, queued (-2) after.
pub fn due_status(run_at: Option<DateTime>, now: DateTime) -> i32 {
    match run_at {
        Some(t) if t > now => crate::model::status::SCHEDULED,
        _ => crate::model::status::QUEUED,
    }
}

/// What a blocked task waits for: another task to succeed, or a batch to complete with
/// every task succeeded. Stored as a string key: a task's id in hex, `batch:<id>` for a
/// batch.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dependency {
    /// A task.
    Task(ObjectId),
    /// A batch (`crate::lifecycle::batches::open_batch`).
    Batch(String),
}

impl Dependency {
    /// Its stored key.
    pub fn key(&self) -> String {
        match self {
            Dependency::Task(id) => id.to_hex(),
            Dependency::Batch(b) => format!("batch:{b}"),
        }
    }

    /// The dependency a stored key names, if it names one.
    pub fn parse(key: &str) -> Option<Dependency> {
        match key.strip_prefix("batch:") {
            Some(b) => Some(Dependency::Batch(b.to_string())),
            None => ObjectId::parse_str(key).ok().map(Dependency::Task),
        }
    }
}

impl std::fmt::Display for Dependency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dependency::Task(id) => write!(f, "task {id}"),
            Dependency::Batch(b) => write!(f, "batch {b:?}"),
        }
    }
}

/// How [`super::Store::resolve_pending`] changes a blocked task.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PendingChange<'a> {
    /// This dependency is met: it is taken off `pending`, and the task stays blocked.
    Met(&'a Dependency),
    /// It waits for nothing more: `pending` is emptied and the task takes this status
    /// (mtime now).
    Release(i32),
    /// It is stopped: it takes this status with this `stop` recorded (mtime now); `pending`
    /// is kept as it was.
    Stop(i32, &'a StopRequest),
}

/// What resolving one dependency of a blocked task did (`crate::lifecycle::deps::resolve`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// It waits for more.
    Waiting,
    /// It waited for nothing more: queued (or scheduled, when its `run_at` is to come).
    Released,
    /// What it waited for failed: it is cancelled.
    Cancelled {
        /// Whether tasks wait for it in turn.
        dependents: bool,
        /// Its batch, which may be complete now.
        batch: Option<String>,
    },
    /// It is no longer blocked on this (resolved before, or cancelled by hand).
    Gone,
}

impl StopRequest {
    /// Refuses a request of another action than `want` (a caller's mistake).
    pub(crate) fn expect(&self, want: crate::model::StopAction) -> StoreResult<()> {
        if self.action == want {
            return Ok(());
        }
        Err(StoreError::Invalid(format!(
            "a {} request cannot be used to {}",
            self.action.as_str(),
            want.as_str()
        )))
    }
}

/// The tasks a cancel or kill is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskTarget {
    /// One task.
    Task(ObjectId),
    /// Every task of a queue that the action applies to.
    Queue(ObjectId),
    /// Every task that the action applies to.
    All,
}

/// Paging of a task search: newest first unless `oldest_first`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Page {
    /// Skip this many.
    pub skip: u64,
    /// Return at most this many.
    pub limit: u64,
    /// Oldest first (by `_id`), as a follower of new tasks reads them.
    pub oldest_first: bool,
}

/// The pieces of a stored output's text, in order ([`super::Store::output_stream`]).
pub type OutputStream = futures::stream::BoxStream<'static, StoreResult<String>>;

/// An [`OutputStream`] of one piece.
pub fn one_piece(text: String) -> OutputStream {
    Box::pin(futures::stream::once(async move { Ok(text) }))
}

/// Signals that tasks may have become claimable (inserted or put back as queued).
pub type QueuedEvents = futures::stream::BoxStream<'static, StoreResult<()>>;

/// Changes of tasks ([`super::Store::watch_tasks`]): `Some(id)` when task `id` changed, `None`
/// when some tasks may have (look again at those of interest).
pub type TaskEvents = futures::stream::BoxStream<'static, StoreResult<Option<ObjectId>>>;

/// Number of tasks per status code, for one queue.
pub type StatusCounts = BTreeMap<i32, u64>;

/// The statuses of tasks not yet ended, counted live by [`super::Store::active_counts`]:
/// scheduled, blocked, queued, claimed, running.
pub const ACTIVE_STATUSES: [i32; 5] = [
    crate::model::status::SCHEDULED,
    crate::model::status::BLOCKED,
    crate::model::status::QUEUED,
    crate::model::status::CLAIMED,
    crate::model::status::RUNNING,
];

/// The name of the cluster's leader lease ([`super::Store::lease`]).
pub const LEADER_LEASE: &str = "leader";

/// A lease as stored ([`super::Store::lease`]), such as the cluster's leader lease
/// (`crate::lifecycle::leader`): one DEN at a time holds it, until `expires` unless it
/// renews; `token` grows at every change of holder (a fencing token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The node holding (or that last held) the lease.
    pub node: String,
    /// Grows by one each time the lease is taken (not when it is renewed).
    pub token: i64,
    /// When the lease ends unless renewed.
    pub expires: DateTime,
}

impl Leader {
    /// Whether `node` holds the lease at `now`.
    pub fn held_by(&self, node: &str, now: DateTime) -> bool {
        self.node == node && self.expires > now
    }

    /// The holder at `now`, if the lease has not lapsed.
    pub fn holder(&self, now: DateTime) -> Option<&str> {
        (self.expires > now).then_some(self.node.as_str())
    }

    /// A lease's end: `ttl` after `now`.
    pub fn end(now: DateTime, ttl: Duration) -> DateTime {
        let millis = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        DateTime::from_millis(now.timestamp_millis().saturating_add(millis))
    }
}
