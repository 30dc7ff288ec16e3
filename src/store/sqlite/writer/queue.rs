//! The writes waiting for the writer thread: two queues, the liveness writes (heartbeats,
//! the leader lease, slot renewals) taken before any other, and each bounded — a caller
//! waits for room (backpressure) rather than the queue growing.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Job;

/// Most ordinary writes queued or in the writer's hands at once.
pub(crate) const MAX_QUEUED: usize = 256;
/// Most liveness writes queued or in the writer's hands at once (a DEN has a few at a time:
/// its heartbeat, its lease, a renewal per slot).
pub(crate) const MAX_URGENT: usize = 256;

/// Which queue a write goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Priority {
    /// A write that keeps a lease alive: taken before every ordinary write.
    Liveness,
    /// Any other write.
    Ordinary,
}

/// A write in a queue, with its place (given back when it has been answered).
pub(super) struct Queued {
    pub(super) job: Box<dyn Job>,
    _room: OwnedSemaphorePermit,
}

impl Queued {
    /// Answers the write: `commit` is `None` when its transaction committed.
    pub(super) fn answer(self, commit: Option<&super::Failed>) {
        self.job.answer(commit);
    }
}

#[derive(Default)]
struct Waiting {
    urgent: VecDeque<Queued>,
    ordinary: VecDeque<Queued>,
    /// The store is gone: the writer ends once the queues are empty.
    closed: bool,
}

/// The two queues, shared by the store and its writer thread.
pub(super) struct Queues {
    waiting: Mutex<Waiting>,
    ready: Condvar,
    urgent_room: Arc<Semaphore>,
    ordinary_room: Arc<Semaphore>,
}

impl Queues {
    pub(super) fn new() -> Arc<Queues> {
        Arc::new(Queues {
            waiting: Mutex::new(Waiting::default()),
            ready: Condvar::new(),
            urgent_room: Arc::new(Semaphore::new(MAX_URGENT)),
            ordinary_room: Arc::new(Semaphore::new(MAX_QUEUED)),
        })
    }

    /// Queues `job` once its queue has room (waiting for it meanwhile).
    pub(super) async fn push(&self, job: Box<dyn Job>, priority: Priority) {
        let room = match priority {
            Priority::Liveness => &self.urgent_room,
            Priority::Ordinary => &self.ordinary_room,
        };
        let Ok(room) = room.clone().acquire_owned().await else {
            unreachable!("the writer's semaphores are never closed")
        };
        let queued = Queued { job, _room: room };
        let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        match priority {
            Priority::Liveness => w.urgent.push_back(queued),
            Priority::Ordinary => w.ordinary.push_back(queued),
        }
        drop(w);
        self.ready.notify_one();
    }

    /// The next write, liveness writes first, if one is waiting.
    pub(super) fn try_pop(&self) -> Option<Queued> {
        let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        w.urgent.pop_front().or_else(|| w.ordinary.pop_front())
    }

    /// The next write, waiting up to `idle` for one: `Err(true)` when the store is gone and
    /// nothing waits, `Err(false)` when `idle` passed.
    pub(super) fn pop(&self, idle: Duration) -> Result<Queued, bool> {
        let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(q) = w.urgent.pop_front().or_else(|| w.ordinary.pop_front()) {
                return Ok(q);
            }
            if w.closed {
                return Err(true);
            }
            let (next, timeout) = self.ready.wait_timeout(w, idle).unwrap_or_else(|e| e.into_inner());
            w = next;
            if timeout.timed_out() && w.urgent.is_empty() && w.ordinary.is_empty() {
                return Err(w.closed);
            }
        }
    }

    /// Tells the writer the store is gone.
    pub(super) fn close(&self) {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
        self.ready.notify_all();
    }

    /// Writes queued or in the writer's hands, of each priority (liveness, ordinary).
    #[cfg(test)]
    pub(super) fn held(&self) -> (usize, usize) {
        (
            MAX_URGENT - self.urgent_room.available_permits(),
            MAX_QUEUED - self.ordinary_room.available_permits(),
        )
    }
}
