//! Claims of a queue that failed in a way retrying at once cannot help (a full or read-only
//! embedded database, a refused write): the queue is left alone for a while, doubling from
//! one tick up to [`MAX_BACKOFF`], instead of being claimed from again at once in a loop.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;

/// Longest wait between claims of a queue whose claims keep failing.
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Per queue: until when it is not claimed from, and the wait after its next failure.
#[derive(Default)]
pub(super) struct ClaimBackoff(Mutex<HashMap<ObjectId, (Instant, Duration)>>);

impl ClaimBackoff {
    /// Whether claims of `queue` wait now.
    pub(super) fn waiting(&self, queue: ObjectId) -> bool {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&queue).is_some_and(|(until, _)| Instant::now() < *until)
    }

    /// A claim of `queue` failed permanently: it waits `tick` after the first failure,
    /// twice as long after each next one, at most [`MAX_BACKOFF`]. Returns the wait.
    pub(super) fn failed(&self, queue: ObjectId, tick: Duration) -> Duration {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let wait = map.get(&queue).map_or(tick, |(_, next)| *next).min(MAX_BACKOFF);
        map.insert(queue, (Instant::now() + wait, wait.saturating_mul(2)));
        wait
    }

    /// A claim of `queue` succeeded (or found nothing): no more waiting.
    pub(super) fn succeeded(&self, queue: ObjectId) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(&queue);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_doubles_up_to_the_cap_and_a_success_ends_it() {
        let b = ClaimBackoff::default();
        let (q, other) = (ObjectId::new(), ObjectId::new());
        let tick = Duration::from_secs(10);
        assert!(!b.waiting(q));
        assert_eq!(b.failed(q, tick), tick);
        assert!(b.waiting(q));
        assert!(!b.waiting(other), "other queues are claimed from");
        assert_eq!(b.failed(q, tick), tick * 2);
        assert_eq!(b.failed(q, tick), tick * 4);
        assert_eq!(b.failed(q, tick), MAX_BACKOFF);
        assert_eq!(b.failed(q, tick), MAX_BACKOFF);
        b.succeeded(q);
        assert!(!b.waiting(q));
        assert_eq!(b.failed(q, tick), tick, "a success starts over");
    }
}
