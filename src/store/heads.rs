//! Task heads: the few fields of a task that a decision about it needs, read in bulk
//! ([`Store::task_heads`](super::Store::task_heads)) instead of whole tasks. Orphan
//! recovery (`lifecycle::recovery`) selects its candidates with a [`HeadFilter`] and
//! writes each decision fenced on the head as read (status, node, `mtime`).

use bson::oid::ObjectId;
use bson::DateTime;

use crate::model::Attempt;

/// Which node a task whose head is read must have.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum HeadNode {
    /// Any node, or none.
    #[default]
    Any,
    /// This node.
    Is(String),
    /// None, or one not among these names.
    NoneOf(Vec<String>),
}

/// Which tasks [`Store::task_heads`](super::Store::task_heads) reads: all of its parts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeadFilter {
    /// Its status is one of these.
    pub statuses: Vec<i32>,
    /// Its node.
    pub node: HeadNode,
    /// Its `mtime` is before this time.
    pub mtime_before: Option<DateTime>,
}

/// The head of a task: what a decision about it reads.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskHead {
    /// `_id`.
    pub id: ObjectId,
    /// Its queue (None when the stored value is not a queue id).
    pub queue: Option<ObjectId>,
    /// Its status.
    pub status: i32,
    /// Its node (None: unclaimed).
    pub node: Option<String>,
    /// Its `mtime`, when stored as a time.
    pub mtime: Option<DateTime>,
    /// Whether someone asked to kill it (a stop request whose `action` is `kill`).
    pub kill: bool,
    /// Its `priority` (0 when it has none).
    pub priority: i64,
    /// The records of its earlier runs (`attempts`; records that cannot be read are left
    /// out).
    pub attempts: Vec<Attempt>,
}
