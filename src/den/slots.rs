//! The DEN's side of the queues' slots: claiming with a slot just taken, giving slots
//! back (and those that could not be given back before), and asking the node holding the
//! most of a queue's slots for one.

use tracing::debug;

use super::Den;
use crate::lifecycle::slots;
use crate::model::{Queue, Task};
use crate::store::{Slot, SlotRenewal, StoreResult};

impl Den {
    /// Gives a slot back; one that cannot be given back now (the database failed) is kept
    /// aside and given back at a later tick, since heartbeats renew every slot this node
    /// holds and the slot would otherwise stay taken, and counted in use, for good.
    pub(super) async fn give_back(&self, slot: Slot) {
        if let Err(e) = slots::release_slot(&*self.store, &slot, &self.settings.node).await {
            debug!(error = %e, "cannot give a slot back; trying again next tick");
            self.stray_slots
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((slot, false));
        }
    }

    /// Gives back the slots that could not be given back before.
    pub(super) async fn give_back_strays(&self) {
        let strays = std::mem::take(&mut *self.stray_slots.lock().unwrap_or_else(|e| e.into_inner()));
        for (slot, failed_claim) in strays {
            let slot = if failed_claim {
                match self.after_failed_claim(slot).await {
                    Some(slot) => slot,
                    None => continue,
                }
            } else {
                slot
            };
            self.give_back(slot).await;
        }
    }

    /// With room here and tasks queued but every slot of `queue` held, asks the node holding
    /// the most for one ([`slots::want_slot`]); it is reserved for this node for three ticks.
    /// Whether it asked.
    pub(super) async fn ask_for_slot(&self, queue: &Queue) -> bool {
        let ask = self.settings.tick.saturating_mul(3);
        match slots::want_slot(&*self.store, queue, &self.settings.node, ask).await {
            Ok(Some(from)) => {
                debug!(queue = %queue.name, from = %from, "asked for a share of the queue's slots");
                true
            }
            Ok(None) => false,
            Err(e) => {
                debug!(queue = %queue.name, error = %e, "cannot ask for a slot");
                false
            }
        }
    }

    /// The spec's claim ([`Store::claim_to_run`]: the task may come back running), its
    /// duration recorded when it got a task.
    pub(super) async fn claim_with(&self, slot: &Slot, queue: &Queue) -> StoreResult<Option<Task>> {
        let began = std::time::Instant::now();
        let s = &self.settings;
        let claimed = match slots::renew_and_claim(&*self.store, slot, queue, &s.node, s.heartbeat_stale).await? {
            (SlotRenewal::Held, claimed) => claimed,
            (renewal, _) => {
                debug!(queue = %queue.name, ?renewal, "the slot just taken was lost before the claim");
                None
            }
        };
        if claimed.is_some() {
            self.observe(|stats| stats.claim.observe(began.elapsed().as_secs_f64()));
        }
        Ok(claimed)
    }
}
