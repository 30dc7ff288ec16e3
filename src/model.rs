//! The Disbatch 4 documents as types: tasks, queues, nodes and status codes.
//!
//! Field names and BSON types are exactly the spec's (`queue` is an ObjectId, `ctime` and
//! `mtime` are dates, `node` is null until claimed, `stdout`/`stderr` are null until the
//! task finishes and then a string or a GridFS file id). Fields we add are optional, so
//! documents written by any other Disbatch 4 client read fine.
//!
//! Parts: `queue` (a queue and its `sandbox` sub-document), `node` (a node and the process
//! holding its name), `task` (a task and its outputs), `stats` (a node's histograms),
//! `stop` (a task's `stop` and `progress`), `retry` (retry policies and attempts), `retention` (how long ended tasks are kept),
//! [`balance`] (the QueueBalance's settings), [`schedule`] (periodic tasks' definitions and
//! times) and `lenient` (values as other clients write
//! them).

pub mod balance;
mod lenient;
mod node;
mod queue;
mod rate;
mod retention;
mod retry;
pub mod schedule;
mod stats;
mod stop;
mod task;

pub(crate) use self::lenient::opt_duration;
pub use self::lenient::{lenient_int, MAX_EXACT_DOUBLE};
pub use self::node::{NameHolder, Node, NodeProcess};
pub use self::queue::{OnOrphan, Queue, QueueSandbox, Sort, UnreadableQueue};
pub use self::rate::Rate;
pub use self::retention::{Retention, MAX_RETENTION, RETENTION_KEYS};
pub use self::retry::{
    activity_timeout_from, attempts_dropped, counted_runs, kept_output, queue_lifecycle, Attempt, QueueLifecycle,
    RetryAt, RetryOn, RetryPolicy, ATTEMPTS_KEPT, BY_HAND, MAX_ATTEMPTS, PREFER_OTHER_NODE, RESUBMITTED,
};
pub use self::schedule::{CatchUp, Overlap, Schedule};
pub use self::stats::{Histogram, NodeStats, CLAIM_BUCKETS, RUN_BUCKETS};
pub use self::stop::{StopAction, StopRequest, TaskProgress};
pub use self::task::{Output, Task};

/// Task status codes of the Disbatch 4 spec.
pub mod status {
    /// Scheduled: waiting for its `run_at` time, then queued (-2). Not a Disbatch 4 code:
    /// the spec's DENs claim only -2, so they never run a task before its time.
    pub const SCHEDULED: i32 = -7;
    /// Orphaned: was being worked on, then the work was disrupted.
    pub const ORPHANED: i32 = -6;
    /// Cancelled (formerly defined; blocks claiming).
    pub const CANCELLED: i32 = -5;
    /// Blocked: waiting for the tasks it was submitted `after` (Disbatch 4 defines the
    /// code and never claims it).
    pub const BLOCKED: i32 = -4;
    /// Terminated (formerly defined; blocks claiming).
    pub const TERMINATED: i32 = -3;
    /// Queued: waiting to be claimed.
    pub const QUEUED: i32 = -2;
    /// Claimed by a DEN, not yet started.
    pub const CLAIMED: i32 = -1;
    /// Running.
    pub const RUNNING: i32 = 0;
    /// Succeeded.
    pub const SUCCEEDED: i32 = 1;
    /// Failed.
    pub const FAILED: i32 = 2;

    /// The statuses at or below zero of a task that has ended: with every positive status
    /// (succeeded, failed, or a plugin's own code), what [`finished`] means.
    pub const ENDED_HELD: [i32; 3] = [ORPHANED, CANCELLED, TERMINATED];

    /// The statuses of a task waiting to be claimed, the ones a cancel may stop.
    pub const WAITING: [i32; 3] = [QUEUED, SCHEDULED, BLOCKED];

    /// The statuses of a task a node holds (claimed or running), the ones a kill may stop
    /// and recovery looks at.
    pub const BUSY: [i32; 2] = [CLAIMED, RUNNING];

    /// The statuses of a task that has not ended: the complement of [`finished`].
    pub const UNENDED: [i32; 5] = [SCHEDULED, BLOCKED, QUEUED, CLAIMED, RUNNING];

    /// Whether a task with this status has ended (any positive status, orphaned,
    /// cancelled or terminated): it runs no more unless it is retried.
    pub fn finished(code: i32) -> bool {
        code > 0 || ENDED_HELD.contains(&code)
    }

    /// A short name of a status code.
    pub fn name(code: i32) -> &'static str {
        match code {
            SCHEDULED => "scheduled",
            ORPHANED => "orphaned",
            CANCELLED => "cancelled",
            BLOCKED => "blocked",
            TERMINATED => "terminated",
            QUEUED => "queued",
            CLAIMED => "claimed",
            RUNNING => "running",
            SUCCEEDED => "succeeded",
            FAILED => "failed",
            c if c > 0 => "finished",
            _ => "held",
        }
    }
}
