//! The node's lease on its running tasks, and the fencing that follows from it.
//!
//! Another node may recover this node's tasks once its heartbeat is older than
//! `heartbeat_stale`. So a running task's lease ends `heartbeat_stale` (less a safety margin)
//! after the last heartbeat that was *sent* before it succeeded; each successful heartbeat
//! extends the lease of every running task, a failed one does not. A lease that has lapsed
//! (the process was stopped, the VM frozen, the database unreachable) is never renewed: the
//! task's plugin is stopped at its next epoch tick or host call, and its result is not
//! written (see [`crate::runner::RunControl`]).

use std::time::{Duration, Instant, SystemTime};

use bson::oid::ObjectId;

use super::Den;
use crate::runner::{RunControl, StopReason, EPOCH_TICK};

/// Taken off the lease so a plugin stops (at most one epoch tick later) before another node
/// may recover its task.
pub(super) const LEASE_MARGIN: Duration = Duration::from_millis(3 * EPOCH_TICK.as_millis() as u64);

impl Den {
    fn lease_len(&self) -> Duration {
        self.settings.heartbeat_stale.saturating_sub(LEASE_MARGIN)
    }

    /// Whether this node's lease has lapsed: its last successful heartbeat is older than
    /// the lease (the process was stopped, or the database unreachable). Then it claims
    /// nothing: its slots may have been counted free, and its tasks recovered, meanwhile.
    pub(super) fn lease_lapsed(&self) -> bool {
        let last = *self.last_heartbeat.lock().unwrap_or_else(|e| e.into_inner());
        last.is_some_and(|(at, _)| at.elapsed() > self.lease_len())
    }

    /// A run control for a task starting now, leased from the last successful heartbeat
    /// (or from now when there was none yet), registered with the running tasks.
    pub(super) fn new_control(&self, task: ObjectId) -> RunControl {
        let (at, at_wall) = self
            .last_heartbeat
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or_else(|| (Instant::now(), SystemTime::now()));
        let control = RunControl::with_lease(at, at_wall, self.lease_len());
        self.controls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(task, control.clone());
        control
    }

    /// Forgets the control of a task that ended.
    pub(super) fn drop_control(&self, task: ObjectId) {
        self.controls.lock().unwrap_or_else(|e| e.into_inner()).remove(&task);
    }

    /// After a heartbeat sent at `sent`: extends the running tasks' leases when it
    /// succeeded; in any case stops the tasks whose lease has lapsed.
    pub(super) fn renew_leases(&self, sent: (Instant, SystemTime), succeeded: bool) {
        if succeeded {
            *self.last_heartbeat.lock().unwrap_or_else(|e| e.into_inner()) = Some(sent);
        }
        let len = self.lease_len();
        for c in self.controls.lock().unwrap_or_else(|e| e.into_inner()).values() {
            if succeeded {
                c.renew(sent.0, sent.1, len);
            }
            c.check();
        }
    }

    /// Stops every running plugin for `reason`.
    pub(super) fn stop_all(&self, reason: StopReason) {
        for c in self.controls.lock().unwrap_or_else(|e| e.into_inner()).values() {
            c.cancel(reason);
        }
    }
}
