//! Graceful shutdown of a DEN.

use bson::oid::ObjectId;
use tracing::{error, info, warn};

use super::Den;
use crate::store::Slot;

impl Den {
    /// Graceful shutdown: stop claiming, wait up to the grace period, then put what is still
    /// unfinished back in its queue and give up the slots.
    pub(super) async fn drain(&self) {
        self.stopping.cancel();
        let grace = self.settings.shutdown_grace;
        let n = self.running();
        if n > 0 {
            info!(
                running = n,
                grace_s = grace.as_secs_f64(),
                "shutting down: waiting for running tasks"
            );
        }
        let deadline = tokio::time::Instant::now() + grace;
        while self.running() > 0 {
            let notified = self.wake.notified();
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                break;
            }
        }
        let left: Vec<(ObjectId, Slot)> = self
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .collect();
        self.abandoned.cancel();
        if !left.is_empty() {
            let ids: Vec<ObjectId> = left.iter().map(|(id, _)| *id).collect();
            match self.store.requeue_own(&self.settings.node, &ids).await {
                Ok(requeued) => warn!(
                    count = requeued.len(),
                    tasks = ?requeued,
                    "shutdown grace period over: put unfinished tasks back in their queue (-2)"
                ),
                Err(e) => {
                    error!(error = %e, tasks = ?ids, "cannot requeue unfinished tasks; they will be recovered as orphans")
                }
            }
            for (_, slot) in &left {
                let _ = self.store.release_slot(slot, &self.settings.node).await;
            }
        }
        info!("DEN stopped");
    }
}
