//! Run control: what may stop a running plugin from outside its own code.
//!
//! A [`RunControl`] is shared between whoever runs a task (the DEN's worker, `runner exec`)
//! and the task's store. It holds a cancel flag with its reason, and an optional lease end.
//! The store's epoch callback checks it at every epoch tick and its call hook before every
//! host call, so a cancelled task (or one whose lease lapsed) runs at most one more tick of
//! guest code and makes no further host call; guest waits end when it is cancelled.
//!
//! The lease end is kept both as a monotonic [`Instant`] and as a wall-clock [`SystemTime`]:
//! a frozen VM stops the monotonic clock, a stopped process does not stop either, a wall
//! clock step is caught by the monotonic one. The lease has lapsed when either says so.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio_util::sync::CancellationToken;

/// Why a task was stopped from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The task's timeout passed.
    Timeout,
    /// The DEN is shutting down and put the task back in its queue.
    Shutdown,
    /// The DEN could not renew its lease in time: another node may run the task now.
    LeaseLost,
    /// Someone asked for the task to be killed (`POST /tasks/{id}/kill`).
    Killed,
    /// It reported no progress within its queue's `activity_timeout`.
    Stuck,
}

impl StopReason {
    fn code(self) -> u8 {
        match self {
            StopReason::Timeout => 1,
            StopReason::Shutdown => 2,
            StopReason::LeaseLost => 3,
            StopReason::Killed => 4,
            StopReason::Stuck => 5,
        }
    }

    fn from_code(c: u8) -> Option<Self> {
        match c {
            1 => Some(StopReason::Timeout),
            2 => Some(StopReason::Shutdown),
            3 => Some(StopReason::LeaseLost),
            4 => Some(StopReason::Killed),
            5 => Some(StopReason::Stuck),
            _ => None,
        }
    }
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StopReason::Timeout => "its timeout passed",
            StopReason::Shutdown => "the DEN is shutting down",
            StopReason::LeaseLost => "this node's lease lapsed (another node may run the task)",
            StopReason::Killed => "it was killed",
            StopReason::Stuck => "it reported no progress within its queue's activity_timeout",
        })
    }
}

#[derive(Clone, Copy)]
struct Lease {
    until: Instant,
    until_wall: SystemTime,
}

/// Shared stop state of one running task. Cheap to clone.
#[derive(Clone, Default)]
pub struct RunControl {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    /// 0 = running, else a [`StopReason`] code; the first reason wins.
    stopped: AtomicU8,
    /// Woken when stopped, so guest waits end.
    token: CancellationToken,
    lease: Mutex<Option<Lease>>,
}

impl RunControl {
    /// A control with no lease (only cancel and the task's own timeout stop it).
    pub fn new() -> Self {
        RunControl::default()
    }

    /// A control whose lease lasts `len` from `from` (monotonic) / `from_wall` (wall clock).
    pub fn with_lease(from: Instant, from_wall: SystemTime, len: Duration) -> Self {
        let c = RunControl::new();
        *c.lock_lease() = Some(Lease {
            until: from + len,
            until_wall: from_wall + len,
        });
        c
    }

    fn lock_lease(&self) -> std::sync::MutexGuard<'_, Option<Lease>> {
        self.inner.lease.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stops the task for `reason` (no effect when it is already stopped).
    pub fn cancel(&self, reason: StopReason) {
        let _ = self
            .inner
            .stopped
            .compare_exchange(0, reason.code(), Ordering::SeqCst, Ordering::SeqCst);
        self.inner.token.cancel();
    }

    /// Why the task was stopped, if it was.
    pub fn reason(&self) -> Option<StopReason> {
        StopReason::from_code(self.inner.stopped.load(Ordering::SeqCst))
    }

    /// Extends the lease to `len` after `sent`/`sent_wall` (when the renewal was sent),
    /// unless it has already lapsed at that time: a lapsed lease never comes back.
    /// Returns whether the lease is still held.
    pub fn renew(&self, sent: Instant, sent_wall: SystemTime, len: Duration) -> bool {
        let mut lease = self.lock_lease();
        match *lease {
            Some(l) if sent < l.until && sent_wall < l.until_wall => {
                *lease = Some(Lease {
                    until: (sent + len).max(l.until),
                    until_wall: (sent_wall + len).max(l.until_wall),
                });
                true
            }
            Some(_) => false,
            None => true,
        }
    }

    /// Checks the lease and the cancel flag now: the reason to stop, if any. A lapsed lease
    /// cancels the task.
    pub fn check(&self) -> Option<StopReason> {
        if let Some(r) = self.reason() {
            return Some(r);
        }
        let lapsed = self
            .lock_lease()
            .is_some_and(|l| Instant::now() >= l.until || SystemTime::now() >= l.until_wall);
        if lapsed {
            self.cancel(StopReason::LeaseLost);
            return self.reason();
        }
        None
    }

    /// Resolves when the task is stopped.
    pub(crate) fn cancelled(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.inner.token.cancelled()
    }

    /// The lease's monotonic end, if any.
    pub(crate) fn lease_until(&self) -> Option<Instant> {
        self.lock_lease().map(|l| l.until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lapsed_lease_is_never_renewed() {
        let t0 = Instant::now();
        let w0 = SystemTime::now();
        let c = RunControl::with_lease(t0, w0, Duration::from_millis(50));
        assert!(c.renew(t0 + Duration::from_millis(10), w0, Duration::from_millis(50)));
        assert!(!c.renew(
            t0 + Duration::from_secs(5),
            w0 + Duration::from_secs(5),
            Duration::from_secs(50)
        ));
        std::thread::sleep(Duration::from_millis(70));
        assert_eq!(c.check(), Some(StopReason::LeaseLost));
    }

    #[test]
    fn the_first_reason_wins() {
        let c = RunControl::new();
        assert_eq!(c.check(), None);
        c.cancel(StopReason::Shutdown);
        c.cancel(StopReason::Timeout);
        assert_eq!(c.check(), Some(StopReason::Shutdown));
    }
}
