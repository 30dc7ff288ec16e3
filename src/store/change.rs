//! Fenced task changes: the closed vocabulary of conditional task writes that
//! [`Store::change_tasks`](super::Store::change_tasks) and
//! [`Store::change_where`](super::Store::change_where) take.
//!
//! A [`TaskFence`] says what a task must still be for the write to apply (its status, its
//! node, its `mtime`, whether someone asked to kill it, …); a [`TaskChange`] says what the
//! write sets. Neither holds a rule: which fence and which change make a transition is
//! decided above the store (`crate::lifecycle`). Each store translates both into one
//! conditional write of its own query language, and a fence that no longer holds changes
//! nothing.

use bson::{DateTime, Document};

use super::{OutputValue, StoreError, StoreResult};
use crate::model::{Attempt, StopRequest, TaskProgress};

/// Which node a fenced task must have.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum NodeIs {
    /// Any node, or none.
    #[default]
    Any,
    /// None: the task is unclaimed (a Disbatch 4 tool's `-1` counts as none on MongoDB).
    Unclaimed,
    /// This node.
    Node(String),
}

/// What a fenced task's stop request (`stop`) must be. "Asked to kill" means a stop
/// request whose `action` is `kill`, on both stores: a stop request of another action, or
/// one that cannot be read, is not a kill request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StopIs {
    /// Anything, or nothing.
    #[default]
    Any,
    /// No stop request at all.
    None,
    /// A kill request.
    Kill,
    /// No kill request: none, or a request of another action.
    NotKill,
}

/// What a task must still be for a change to apply. The default holds for every task.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaskFence {
    /// Its status is one of these (`None`: any status).
    pub statuses: Option<Vec<i32>>,
    /// Its node.
    pub node: NodeIs,
    /// Its `mtime` is exactly this (a compare-and-set on what was read).
    pub mtime: Option<DateTime>,
    /// Its stop request.
    pub stop: StopIs,
    /// `Some(true)`: it is marked to run once more (`rerun`); `Some(false)`: it is not.
    pub rerun: Option<bool>,
    /// Its `run_at` is set and not after this time.
    pub due_by: Option<DateTime>,
}

impl TaskFence {
    /// A fence on the status alone.
    pub fn statuses(statuses: &[i32]) -> TaskFence {
        TaskFence {
            statuses: Some(statuses.to_vec()),
            ..TaskFence::default()
        }
    }

    /// This fence, also requiring `node`.
    pub fn on(self, node: NodeIs) -> TaskFence {
        TaskFence { node, ..self }
    }

    /// This fence, also requiring the stop request `stop`.
    pub fn stop(self, stop: StopIs) -> TaskFence {
        TaskFence { stop, ..self }
    }

    /// This fence, also requiring `rerun` to be `marked` or not.
    pub fn rerun(self, marked: bool) -> TaskFence {
        TaskFence {
            rerun: Some(marked),
            ..self
        }
    }
}

/// How a change writes one field: leaves it, clears it, or sets it.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Write<T> {
    /// Left as it is.
    #[default]
    Keep,
    /// Cleared (null, or absent: as each store keeps an unset field of that name).
    Clear,
    /// Set to this value.
    Set(T),
}

impl<T> Write<T> {
    /// Whether the field is left as it is.
    pub fn is_keep(&self) -> bool {
        matches!(self, Write::Keep)
    }
}

/// What a fenced write sets on a task. The default changes nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaskChange {
    /// New status.
    pub status: Option<i32>,
    /// New node (cleared: unclaimed).
    pub node: Write<String>,
    /// New stdout.
    pub stdout: Write<OutputValue>,
    /// New stderr.
    pub stderr: Write<OutputValue>,
    /// New progress report.
    pub progress: Write<TaskProgress>,
    /// New stop request.
    pub stop: Write<StopRequest>,
    /// `Some(true)` marks it to run once more when its run ends, `Some(false)` clears the mark.
    pub rerun: Option<bool>,
    /// New `run_at`.
    pub run_at: Write<DateTime>,
    /// New `started`: when the run starts.
    pub started: Option<DateTime>,
    /// New claim priority.
    pub priority: Option<i64>,
    /// New preference to leave it to other nodes: `avoid_node` until `avoid_until`.
    pub avoid: Write<(String, DateTime)>,
    /// New params.
    pub params: Option<Document>,
    /// A record appended to `attempts`.
    pub attempt: Option<Attempt>,
    /// Sets `mtime` to the time of the write.
    pub touch: bool,
}

impl TaskChange {
    /// Whether the change writes nothing (a store refuses it: it would be a read).
    pub fn is_empty(&self) -> bool {
        *self == TaskChange::default()
    }

    /// Whether a store may apply the change to tasks it names
    /// ([`Store::change_tasks`](crate::store::Store::change_tasks)): an empty change is
    /// [`StoreError::Invalid`].
    pub fn check_for_named(&self) -> StoreResult<()> {
        if self.is_empty() {
            return Err(StoreError::Invalid("a task change that changes nothing".into()));
        }
        Ok(())
    }

    /// Whether a store may apply the change to every task a fence matches
    /// ([`Store::change_where`](crate::store::Store::change_where)): besides being
    /// non-empty, it must set `mtime` (MongoDB reads back the tasks it wrote by it) and
    /// append no attempt.
    pub fn check_for_matching(&self) -> StoreResult<()> {
        self.check_for_named()?;
        if !self.touch || self.attempt.is_some() {
            return Err(StoreError::Invalid(
                "a change of every matching task must set mtime and append no attempt".into(),
            ));
        }
        Ok(())
    }
}
