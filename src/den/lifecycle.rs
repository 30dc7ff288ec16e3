//! The DEN's part in a task's life beyond Disbatch 4's: queueing scheduled tasks when
//! they are due, settling ends of tasks that others wait for (see `lifecycle::deps`), and
//! stopping the plugins of tasks someone asked to kill.
//!
//! Both run every [`LIFECYCLE_TICK`], so a due task is queued, and a killed plugin
//! interrupted, within about that much (plus the claim, or the next epoch tick). Queueing
//! due tasks is a duty of the cluster's leader: one indexed update, whatever the number of
//! tasks still scheduled (while no node leads, after a leader died, due tasks wait for the
//! next one). Looking for kill requests is one indexed query, made only while this DEN
//! runs tasks.

use std::sync::Arc;
use std::time::Duration;

use bson::oid::ObjectId;
use bson::DateTime;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::Den;
use crate::model::StopRequest;
use crate::runner::StopReason;

/// How often due tasks are queued and kill requests are looked for.
pub(super) const LIFECYCLE_TICK: Duration = Duration::from_millis(200);

/// Every how many ticks the leader settles ends of tasks waited for that no DEN settled
/// (about once a second): a task cancelled or orphaned, a DEN that died before it could.
const SETTLE_EVERY: u64 = 5;

impl Den {
    /// Queues due scheduled tasks and carries out kill requests until `stop`.
    pub(super) async fn lifecycle(self: Arc<Self>, stop: CancellationToken) {
        let mut interval = tokio::time::interval(LIFECYCLE_TICK);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ticks: u64 = 0;
        loop {
            ticks += 1;
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = interval.tick() => {}
            }
            if self.leads() {
                match crate::lifecycle::run::promote_due(&*self.store, DateTime::now()).await {
                    Ok(0) => {}
                    Ok(n) => {
                        debug!(count = n, "queued scheduled tasks that are due");
                        self.wake.notify_one();
                    }
                    Err(e) => debug!(error = %e, "cannot queue due scheduled tasks"),
                }
                if ticks.is_multiple_of(SETTLE_EVERY) {
                    if self.settings.balance.enabled {
                        self.balance_queues().await;
                    } else {
                        self.lift_leftover_shares().await;
                    }
                    match crate::lifecycle::deps::sweep(self.store.as_ref()).await {
                        Ok(d) if d.released + d.cancelled > 0 => {
                            debug!(
                                released = d.released,
                                cancelled = d.cancelled,
                                "settled ends of tasks waited for"
                            );
                            self.wake.notify_one();
                        }
                        Ok(_) => {}
                        Err(e) => debug!(error = %e, "cannot settle ends of tasks waited for"),
                    }
                }
            }
            self.carry_out_kills().await;
        }
    }

    async fn carry_out_kills(&self) {
        let running: Vec<ObjectId> = self
            .controls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .copied()
            .collect();
        if running.is_empty() {
            return;
        }
        let requests = match self.store.kill_requests(&self.settings.node).await {
            Ok(r) => r,
            Err(e) => {
                debug!(error = %e, "cannot read kill requests");
                return;
            }
        };
        for (task, stop) in requests {
            let control = self
                .controls
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&task)
                .cloned();
            let Some(control) = control else { continue };
            if control.reason().is_some() {
                continue;
            }
            info!(task = %task, "stopping the plugin: {stop}");
            self.kills.lock().unwrap_or_else(|e| e.into_inner()).insert(task, stop);
            control.cancel(StopReason::Killed);
            if control.reason() != Some(StopReason::Killed) {
                // Stopped for another reason meanwhile: the worker will not take it.
                self.kills.lock().unwrap_or_else(|e| e.into_inner()).remove(&task);
            }
        }
    }

    /// The kill request that stopped `task`, taken (once) by the worker that ran it.
    pub(super) fn take_kill(&self, task: ObjectId) -> StopRequest {
        self.kills
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&task)
            .unwrap_or_else(|| {
                warn!(task = %task, "killed without a recorded request");
                StopRequest::now(crate::model::StopAction::Kill, "", "")
            })
    }
}
