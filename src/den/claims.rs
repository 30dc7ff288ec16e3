//! Claims whose reply was lost.
//!
//! A claim is one write on the server. When the connection fails after the server made it
//! but before its reply arrived (a reset, a timeout), the DEN sees an error while the task
//! is claimed (-1) by this node in the database. Giving the claim's slot back then would
//! let another claim take the slot while that task still counts against the queue's
//! `threads`, and the task would sit claimed until the spec's five-minute sweep. So after
//! a failed claim the slot is given back only once every claimed task of this node in the
//! queue that no worker knows of is back in its queue ([`Den::settle_lost_claims`]); when
//! that cannot be done now, the slot is kept aside and both are tried again at a later
//! tick.
//!
//! Claims and the settling exclude each other ([`Den::claims`] guard): a claim holds it
//! (shared) from its write until its task is registered in `in_flight`, the settling
//! holds it alone, so a task claimed a moment ago by another worker is never taken for a
//! lost one.

use bson::oid::ObjectId;
use tracing::{debug, warn};

use super::Den;
use crate::model::{status, Task};
use crate::store::{Page, Slot, StoreResult, TaskFilter};

/// The most lost claims put back at once (one claim is lost at a time; more are put back
/// at the next attempt).
const LOST_PAGE: u64 = 100;

impl Den {
    /// Registers `task`, just claimed with `slot`, as in flight: from now on it is this
    /// DEN's to run.
    pub(super) fn register(&self, task: &Task, slot: &Slot) {
        self.in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(task.id, slot.clone());
    }

    /// Puts back in their queue the tasks of `queue` claimed (-1) by this node that no worker
    /// knows of: claims made on the server whose reply was lost. Returns how many.
    pub(super) async fn settle_lost_claims(&self, queue: ObjectId) -> StoreResult<usize> {
        let node = &self.settings.node;
        let _alone = self.claims.write().await;
        let filter = TaskFilter {
            queue: Some(queue),
            status: Some(vec![status::CLAIMED]),
            node: Some(Some(node.clone())),
            ..TaskFilter::default()
        };
        let page = Page {
            skip: 0,
            limit: LOST_PAGE,
            oldest_first: true,
        };
        let claimed = self.store.find_tasks(&filter, page).await?;
        let lost: Vec<ObjectId> = {
            let known = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
            claimed
                .iter()
                .map(|t| t.id)
                .filter(|id| !known.contains_key(id))
                .collect()
        };
        if lost.is_empty() {
            return Ok(0);
        }
        let back = crate::lifecycle::run::requeue_own(&*self.store, node, &lost).await?;
        warn!(tasks = ?back, "claims whose reply was lost put back in their queue (-2)");
        Ok(back.len())
    }

    /// After a claim with `slot` failed (it may have been made on the server): the slot to
    /// give back once the lost claims are settled, or None when they cannot be now (the
    /// slot is then kept aside, settled and given back at a later tick).
    pub(super) async fn after_failed_claim(&self, slot: Slot) -> Option<Slot> {
        match self.settle_lost_claims(slot.queue).await {
            Ok(_) => Some(slot),
            Err(e) => {
                debug!(error = %e, "cannot look for a claim whose reply was lost; keeping its slot until then");
                self.stray_slots
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((slot, true));
                None
            }
        }
    }
}
