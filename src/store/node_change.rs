//! The closed vocabulary of writes to a node document ([`Store::change_node`]): which
//! document a write may touch (a [`NodeFence`]) and what it sets there (a
//! [`NodeChange`]). No rule lives here: whether a change is allowed and which fence it
//! needs is decided in [`lifecycle::nodes`](crate::lifecycle::nodes); each store only
//! translates the pair into one conditional write.
//!
//! [`Store::change_node`]: crate::store::Store::change_node

use std::collections::BTreeMap;

use bson::oid::ObjectId;
use bson::DateTime;

use crate::model::{Node, NodeProcess, NodeStats};

/// A node document as read ([`Store::node`](crate::store::Store::node)), with what a
/// decision about its name needs beyond the [`Node`].
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRecord {
    /// The node.
    pub node: Node,
    /// Its heartbeat (`timestamp`) as stored, when it can be read as a time (an
    /// unreadable one reads as the epoch in [`Node::timestamp`]).
    pub heartbeat: Option<DateTime>,
    /// Whether its last heartbeat came from a DEN that writes no process marker (a
    /// Disbatch 4 DEN sharing a MongoDB database during a migration). Such a DEN's task
    /// runners outlive it and write their own results.
    pub foreign: bool,
}

/// Which node document a [`NodeChange`] applies to, besides its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeFence {
    /// The document named so, whoever holds the name.
    Any,
    /// The document named so while the process with this id holds the name (its
    /// `process.id`).
    HeldBy(ObjectId),
    /// No document named so: the change creates it.
    Absent,
    /// The document named so as it was read: its heartbeat ([`NodeRecord::heartbeat`],
    /// `None` when unreadable) and its holding process's id (`None`: no process holds
    /// it) unchanged since.
    AsRead {
        /// The heartbeat as read.
        heartbeat: Option<DateTime>,
        /// The holding process as read.
        process: Option<ObjectId>,
    },
}

/// What a write sets in a node document. Nothing else of the document changes.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeChange {
    /// Records `process` as the holder of the name and a heartbeat now; under
    /// [`NodeFence::Absent`] creates the document (no `maxthreads`).
    Take(NodeProcess),
    /// Clears the holding process (`process` null): the name is free to take at once.
    Release,
    /// Sets `maxthreads` (None = no limit). The value is stored as given: the caller
    /// checked it.
    Maxthreads(Option<i64>),
    /// Replaces the claim and run duration histograms (`stats`).
    Stats(NodeStats),
    /// Replaces why the node cannot run some queues (`queue_problems`: queue id in hex →
    /// reason).
    QueueProblems(BTreeMap<String, String>),
}
