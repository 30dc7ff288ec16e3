//! A worker's next claim made with the end of its run: where the store writes both in one
//! transaction ([`Store::finish_and_claim`](crate::store::Store::finish_and_claim)), a
//! worker that would claim its queue's next task on its slot's last renewal right after
//! the end of a run ([`slots::claim_next`]) makes that claim in the same write, under the
//! same deadline ([`slots::claim_on_renewal`]). Every other case (the slot due for its
//! renewal, a queue the QueueBalance lowered, a store that does not offer it) claims apart,
//! after the end is written, as before.

use std::sync::Arc;
use std::time::Instant;

use bson::oid::ObjectId;
use bson::DateTime;
use tracing::debug;

use super::queues::QueueState;
use super::Den;
use crate::lifecycle::run::{self, FinishExtra};
use crate::lifecycle::slots::{self, Renewed};
use crate::model::Task;
use crate::store::{OutputValue, Slot, StoreError, StoreResult};

/// The claim to make with the end of a run.
pub(super) struct ClaimWithEnd {
    /// The queue as it stands now, whose next task is claimed.
    queue: Arc<QueueState>,
    /// The slot the claim is made with.
    slot: Slot,
    /// The claim's deadline (the end of the window of the slot's last renewal).
    until: DateTime,
}

/// A claim made with the end of a run (or tried: an error may hide a claim made).
pub(super) struct ClaimedWithEnd {
    /// The queue of the claimed task, as it stood when the claim was decided.
    pub queue: Arc<QueueState>,
    /// When the write was sent.
    pub began: Instant,
    /// The task claimed (registered in flight), none, or why the write failed.
    pub claimed: StoreResult<Option<Task>>,
}

impl Den {
    /// The queue a worker holding `slot` may go on claiming from after a task of queue
    /// `queue` ended: the queue as it stands now, while it still allows the slot and the
    /// node is not over its `maxthreads`.
    pub(super) fn keeps_slot(&self, queue: ObjectId, slot: &Slot) -> Option<Arc<QueueState>> {
        self.queues
            .current(queue)
            .filter(|q| q.allows_slot(slot) && !self.over_node_limit())
    }

    /// The claim to make with the end of a run of `queue`'s task, when the worker would make
    /// it on its slot's last renewal right after: not stopping, the queue keeping the slot
    /// ([`Self::keeps_slot`]), no QueueBalance share on the queue (the slots in use are
    /// counted before such a claim), no `rate` (each task needs its own grant: `rate`), the node's lease running, and the renewal still in use
    /// ([`slots::claim_on_renewal`]). None otherwise: the worker decides after the end.
    pub(super) async fn claim_with_end(
        &self,
        queue: ObjectId,
        slot: &Slot,
        renewed: &Option<Renewed>,
    ) -> Option<ClaimWithEnd> {
        if self.stopping.is_cancelled() {
            return None;
        }
        let queue = self.keeps_slot(queue, slot)?;
        if queue.queue.maxthreads.is_some() || queue.queue.rate.is_some() || self.lease_lapsed() {
            return None;
        }
        let timing = (self.settings.heartbeat_stale, self.settings.tick);
        match slots::claim_on_renewal(&*self.store, slot, timing, renewed).await {
            Ok(until) => until.map(|until| ClaimWithEnd {
                queue,
                slot: slot.clone(),
                until,
            }),
            Err(e) => {
                debug!(error = %e, "cannot check the slot before claiming with the end of a run");
                None
            }
        }
    }

    /// Ends the run of `task` ([`run::finish_and_claim`]) and makes `next` with it; the task
    /// claimed is registered in flight before the claims' guard is let go (see `claims`).
    /// Answers whether the end was written; the claim, made or tried, goes to `claimed`.
    pub(super) async fn end_and_claim(
        &self,
        task: ObjectId,
        code: i32,
        outputs: (OutputValue, OutputValue),
        extra: &FinishExtra,
        next: ClaimWithEnd,
        claimed: &std::sync::Mutex<Option<ClaimedWithEnd>>,
    ) -> StoreResult<bool> {
        let began = Instant::now();
        let _claiming = self.claims.read().await;
        let node = &self.settings.node;
        let on = (&next.queue.queue, next.until);
        let done = run::finish_and_claim(&*self.store, task, node, code, outputs, extra, on).await;
        let (ended, made) = match done {
            Ok((ended, made)) => (Ok(ended), made),
            // The write may have been made with its reply lost: the worker then treats it as
            // a failed claim.
            Err(e) => {
                let again = match &e {
                    StoreError::Database(m) => StoreError::Database(m.clone()),
                    other => StoreError::Rejected(other.to_string()),
                };
                (Err(e), Some(Err(again)))
            }
        };
        if let Some(made) = made {
            if let Ok(Some(t)) = &made {
                self.register(t, &next.slot);
            }
            *claimed.lock().unwrap_or_else(|e| e.into_inner()) = Some(ClaimedWithEnd {
                queue: next.queue,
                began,
                claimed: made,
            });
        }
        ended
    }
}
