//! Slot rows as data and the closed vocabulary of conditional writes on them.
//!
//! A queue has one slot row per number `n` in `0..threads` ([`super::SlotStore`]). Every
//! write to a slot is a [`SlotChange`] applied only while the row matches a [`SlotFence`];
//! the stores translate both into one conditional update and decide nothing. Which change
//! to make under which fence is decided in `lifecycle::slots`.

use bson::oid::ObjectId;
use bson::DateTime;

use super::SlotRenewal;

/// A slot row as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRow {
    /// Slot number.
    pub n: i64,
    /// The node holding it, if any.
    pub holder: Option<String>,
    /// When the holder's lease ends (the epoch when never taken).
    pub expires: DateTime,
    /// The node asking for it, if any, and until when.
    pub want: Option<String>,
    /// End of the ask.
    pub want_until: Option<DateTime>,
    /// The node it is reserved for after its holder gave it up to an asker, if any.
    pub reserved: Option<String>,
    /// End of the reservation.
    pub reserved_until: Option<DateTime>,
    /// The take its holder's lease came from ([`super::Slot::taken`]), if any.
    pub taken: Option<ObjectId>,
}

impl SlotRow {
    /// A row never taken (what a missing row reads as).
    pub fn unheld(n: i64) -> SlotRow {
        SlotRow {
            n,
            holder: None,
            expires: DateTime::from_millis(0),
            want: None,
            want_until: None,
            reserved: None,
            reserved_until: None,
            taken: None,
        }
    }
}

/// Who must hold the slot for a change to apply.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Holder {
    /// Anyone or no one.
    #[default]
    Any,
    /// No one.
    Unheld,
    /// This node.
    By(String),
}

/// What the holder's lease must be at a given time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Lease {
    /// Anything.
    #[default]
    Any,
    /// Running: `expires` after the time.
    LiveAt(DateTime),
    /// Ended: `expires` before the time.
    EndedAt(DateTime),
}

/// What a node mark (an ask `want`/`want_until`, a reservation
/// `reserved`/`reserved_until`) must be.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Mark {
    /// Anything.
    #[default]
    Any,
    /// No mark, or one by `node` (when given), or one ended before `at`.
    OpenTo {
        /// The node whose own mark is no obstacle.
        node: Option<String>,
        /// The time a mark must have ended by.
        at: DateTime,
    },
    /// A mark by this node (whether ended or not).
    By(String),
}

/// The condition a slot row must meet for a [`SlotChange`] to apply: all of its parts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SlotFence {
    /// Who holds it.
    pub holder: Holder,
    /// The holder's lease.
    pub lease: Lease,
    /// The ask on it.
    pub want: Mark,
    /// The reservation on it.
    pub reserved: Mark,
    /// The take the holder's lease came from, when given: a lease that ran out and was
    /// taken again (by the same node too) is not renewed or given back through the old one.
    pub taken: Option<ObjectId>,
}

/// A write to one slot row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotChange {
    /// `holder` takes it until `until`, by the take `taken`; any ask and reservation is
    /// cleared.
    Take {
        /// The new holder.
        holder: String,
        /// End of its lease.
        until: DateTime,
        /// The take, new for each ([`super::Slot::taken`]).
        taken: ObjectId,
    },
    /// The lease runs on until `until`.
    Renew {
        /// End of the lease.
        until: DateTime,
    },
    /// Unheld; the ask is cleared.
    Release,
    /// Unheld, reserved for `to` until `until`; the ask is cleared.
    Yield {
        /// The node it is reserved for.
        to: String,
        /// End of the reservation.
        until: DateTime,
    },
    /// Asked for by `by` until `until`.
    Ask {
        /// The asking node.
        by: String,
        /// End of the ask.
        until: DateTime,
    },
    /// The ask is cleared.
    Unask,
}

/// A node with claimed or running tasks ([`super::SlotStore::busy_nodes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusyNode {
    /// The node's name.
    pub node: String,
    /// How many claimed (-1) or running (0) tasks it has.
    pub tasks: i64,
    /// Whether a Disbatch 4 DEN runs it (it takes no slots).
    pub foreign: bool,
}

/// Which nodes [`super::SlotStore::busy_nodes`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusyOf {
    /// Every node.
    All,
    /// Only the nodes Disbatch 4 DENs run (none on a store that never shares its
    /// database with them, answered without a query).
    Foreign,
}

/// The outcome of renewing a slot as decided from its row, and the write that carries it
/// out (under its fence), if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenewStep {
    /// The outcome, once `write` applied.
    pub renewal: SlotRenewal,
    /// The write to make, if any.
    pub write: Option<(SlotFence, SlotChange)>,
}

/// The renew decision, handed to [`super::Store::renew_and_claim`]: from the slot's row,
/// the lease being renewed, the renewing node, the time now and the lease's new end.
pub type RenewRule = fn(&SlotRow, &super::Slot, &str, DateTime, DateTime) -> RenewStep;
