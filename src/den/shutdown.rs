//! Graceful shutdown of a DEN.

use std::time::Duration;

use bson::oid::ObjectId;
use tracing::{error, info, warn};

use super::watch::WATCH_TICK;
use super::worker::HOST_CALL_GRACE;
use super::Den;
use crate::lifecycle::slots;
use crate::runner::{StopReason, EPOCH_TICK};
use crate::store::Slot;

impl Den {
    /// Graceful shutdown: stop claiming, wait up to the grace period, then stop the plugins
    /// still running (bounded wait), put their tasks back in their queue and give up the
    /// slots. A plugin stuck in a host call is abandoned: the process exits anyway.
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
        self.wait_idle(tokio::time::Instant::now() + grace).await;
        // Take the unfinished tasks before stopping their plugins, so their workers see the
        // tasks are no longer theirs and write nothing.
        let left: Vec<(ObjectId, Slot)> = self
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .collect();
        if !left.is_empty() {
            self.stop_all(StopReason::Shutdown);
            let bound = HOST_CALL_GRACE + EPOCH_TICK * 10 + WATCH_TICK * 2 + Duration::from_millis(100);
            self.wait_idle(tokio::time::Instant::now() + bound).await;
            let still = self.running();
            if still > 0 {
                warn!(
                    running = still,
                    "plugins still running after being stopped; abandoning them"
                );
            }
        }
        self.abandoned.cancel();
        if !left.is_empty() {
            let ids: Vec<ObjectId> = left.iter().map(|(id, _)| *id).collect();
            match crate::lifecycle::run::requeue_own(&*self.store, &self.settings.node, &ids).await {
                Ok(requeued) => warn!(
                    count = requeued.len(),
                    tasks = ?requeued,
                    "shutdown grace period over: stopped the plugins and put unfinished tasks back in their queue (-2)"
                ),
                Err(e) => {
                    error!(error = %e, tasks = ?ids, "cannot requeue unfinished tasks; they will be recovered as orphans")
                }
            }
            for (_, slot) in &left {
                let _ = slots::release_slot(&*self.store, slot, &self.settings.node).await;
            }
        }
        info!("DEN stopped");
    }

    /// Waits until no worker runs or until `deadline`.
    /// Waits until no task runs or `deadline` passes, heartbeating every tick meanwhile so
    /// the running tasks keep their leases through the grace period.
    async fn wait_idle(&self, deadline: tokio::time::Instant) {
        let mut next_beat = tokio::time::Instant::now() + self.settings.tick;
        while self.running() > 0 {
            let notified = self.wake.notified();
            if self.running() == 0 {
                break;
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                break;
            }
            if now >= next_beat {
                self.beat().await;
                next_beat = tokio::time::Instant::now() + self.settings.tick;
                continue;
            }
            let _ = tokio::time::timeout_at(deadline.min(next_beat), notified).await;
        }
    }
}
