//! The slot mechanics every store supplies ([`SlotStore`]): slot rows read as data and
//! written under fences ([`super::slot_change`]). The rules — which slot is free, when a
//! lease is renewed or given up, whom to ask — are in `lifecycle::slots`.

use async_trait::async_trait;
use bson::oid::ObjectId;

use super::slot_change::{BusyNode, BusyOf, SlotChange, SlotFence, SlotRow};
use super::{Slot, StoreResult};

/// Queue slot leases: one row per slot number of a queue, `{queue, n, holder, expires,
/// want, want_until, reserved, reserved_until}`.
#[async_trait]
pub trait SlotStore: Send + Sync {
    /// Every slot row of `queue`, in slot order.
    async fn slots(&self, queue: ObjectId) -> StoreResult<Vec<SlotRow>>;
    /// Creates the rows `0..threads` of `queue` that do not exist yet (unheld). Idempotent.
    async fn ensure_slots(&self, queue: ObjectId, threads: i64) -> StoreResult<()>;
    /// Applies `change` to the row of `slot` if it matches `fence`, in one conditional
    /// write. Whether it applied (false also when there is no such row).
    async fn change_slot(&self, slot: &Slot, fence: &SlotFence, change: &SlotChange) -> StoreResult<bool>;
    /// The nodes with claimed (-1) or running (0) tasks, of `queue` when given (else of
    /// any queue), with how many; only those Disbatch 4 DENs run with [`BusyOf::Foreign`].
    async fn busy_nodes(&self, queue: Option<ObjectId>, of: BusyOf) -> StoreResult<Vec<BusyNode>>;
    /// Every slot row held by one of `holders`, with its queue.
    async fn slots_held_by(&self, holders: &[String]) -> StoreResult<Vec<(ObjectId, SlotRow)>>;
}
