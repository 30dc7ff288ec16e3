//! Tasks read ahead for the claims to come ([`super::claims`]).
//!
//! A round of grouped claims (or a lone claim of a queue being drained, [`Ahead::busy`]) reads
//! [`READ_AHEAD`] more of the queue's next tasks than it claims and keeps the rest here, for
//! [`READ_AHEAD_FOR`] (`read_ahead` in the config): the next claims of the same queue by the
//! same node take them from here instead of reading the queue again, and a worker's next
//! claim goes with the end of its run in the same `bulkWrite` (see
//! [`MongoStore::finish_and_claim`](super::MongoStore)). A task taken from here is claimed
//! only by a fenced update (queued, unclaimed, its `mtime` as read), so one taken meanwhile
//! by another claimer, changed or cancelled is simply not claimed; the claim then reads the
//! queue again. Each task read is handed to one claim of this process only.
//!
//! The cost of reading ahead is order: a task queued after the read that comes first in the
//! queue's order (a higher `priority`, or any newer task of a `lifo` queue) may be claimed
//! after the tasks read, when their claims were taken from here within [`READ_AHEAD_FOR`]
//! of the read's start (a claim taken may then wait for its write) (or as long as the store was told,
//! [`MongoStore::read_ahead_for`](super::MongoStore::read_ahead_for)).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::Document;

use crate::model::Sort;

/// How many more tasks than it claims a round of grouped claims reads.
pub(super) const READ_AHEAD: usize = 32;

/// How long tasks read ahead are used for claims, unless the store says otherwise
/// ([`Ahead::use_for`]).
pub(super) const READ_AHEAD_FOR: Duration = Duration::from_millis(100);

/// How long a reader's lone claims hold off reading ahead after a read of theirs found no
/// more tasks than they claimed (a queue fed a task at a time gains nothing from a read
/// before each claim), or after a task read was taken by another claimer (a queue drained
/// by others too: each would read the same tasks and lose them): they are the spec's
/// `findOneAndUpdate` meanwhile.
pub(super) const HOLD_OFF_FOR: Duration = Duration::from_secs(1);

/// Whether `at` is less than `d` before `now`.
fn within(at: Option<Instant>, now: Instant, d: Duration) -> bool {
    at.is_some_and(|at| now.saturating_duration_since(at) < d)
}

/// Which claims may take a task read ahead: of this queue, in this order, by this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Reader {
    pub queue: ObjectId,
    pub sort: Sort,
    pub node: String,
}

/// The tasks read ahead of one reader.
struct Read {
    reader: Reader,
    at: Instant,
    tasks: VecDeque<Document>,
}

/// When a reader's claims last claimed a task, and last held off reading ahead.
struct Pace {
    reader: Reader,
    claimed: Option<Instant>,
    held_off: Option<Instant>,
}

/// The tasks read ahead by the claims of one store (cloning shares them).
#[derive(Clone)]
pub(super) struct Ahead {
    reads: Arc<Mutex<Vec<Read>>>,
    /// How long they are used, in microseconds.
    fresh_for: Arc<AtomicU64>,
    /// When each reader's claims last claimed a task, and last held off reading ahead.
    paces: Arc<Mutex<Vec<Pace>>>,
}

impl Default for Ahead {
    fn default() -> Self {
        Ahead {
            reads: Arc::default(),
            fresh_for: Arc::new(AtomicU64::new(READ_AHEAD_FOR.as_micros() as u64)),
            paces: Arc::default(),
        }
    }
}

impl Ahead {
    /// Uses tasks read ahead for `d` after their read (zero: reads none ahead).
    pub(super) fn use_for(&self, d: Duration) {
        self.fresh_for
            .store(d.as_micros().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    /// How long tasks read ahead are used.
    pub(super) fn fresh_for(&self) -> Duration {
        Duration::from_micros(self.fresh_for.load(Ordering::Relaxed))
    }

    /// [`Self::keep`], read at `at` (when the read was sent: what the read saw is no
    /// younger).
    pub(super) fn keep_at(&self, reader: &Reader, tasks: Vec<Document>, at: Instant) {
        let fresh_for = self.fresh_for();
        let mut reads = self.reads.lock().unwrap_or_else(|e| e.into_inner());
        reads.retain(|r| &r.reader != reader && at.saturating_duration_since(r.at) < fresh_for);
        if !tasks.is_empty() && !fresh_for.is_zero() {
            reads.push(Read {
                reader: reader.clone(),
                at,
                tasks: tasks.into(),
            });
        }
    }

    /// Takes up to `n` of the tasks kept for `reader`, in the queue's order, while they are
    /// fresh.
    pub(super) fn take(&self, reader: &Reader, n: usize) -> Vec<Document> {
        self.take_at(reader, n, Instant::now())
    }

    /// [`Self::take`] at `now`.
    fn take_at(&self, reader: &Reader, n: usize, now: Instant) -> Vec<Document> {
        let fresh_for = self.fresh_for();
        let mut reads = self.reads.lock().unwrap_or_else(|e| e.into_inner());
        reads.retain(|r| now.saturating_duration_since(r.at) < fresh_for && !r.tasks.is_empty());
        match reads.iter_mut().find(|r| &r.reader == reader) {
            Some(r) => {
                let k = n.min(r.tasks.len());
                r.tasks.drain(..k).collect()
            }
            None => Vec::new(),
        }
    }

    /// Notes that a claim of `reader` claimed a task.
    pub(super) fn claimed(&self, reader: &Reader) {
        self.pace_at(reader, Instant::now(), |p, now| p.claimed = Some(now));
    }

    /// Holds `reader`'s lone claims off reading ahead for [`HOLD_OFF_FOR`]: a read of theirs
    /// found no more tasks than they claimed, or a task read was lost to another claimer.
    pub(super) fn hold_off(&self, reader: &Reader) {
        self.pace_at(reader, Instant::now(), |p, now| p.held_off = Some(now));
    }

    /// Changes `reader`'s pace with `change` at `now`, forgetting those gone quiet.
    fn pace_at(&self, reader: &Reader, now: Instant, change: impl FnOnce(&mut Pace, Instant)) {
        let fresh_for = self.fresh_for();
        let mut paces = self.paces.lock().unwrap_or_else(|e| e.into_inner());
        paces.retain(|p| {
            &p.reader == reader || within(p.claimed, now, fresh_for) || within(p.held_off, now, HOLD_OFF_FOR)
        });
        let at = match paces.iter().position(|p| &p.reader == reader) {
            Some(at) => at,
            None => {
                paces.push(Pace {
                    reader: reader.clone(),
                    claimed: None,
                    held_off: None,
                });
                paces.len() - 1
            }
        };
        change(&mut paces[at], now);
    }

    /// Whether a lone claim of `reader` reads ahead: reading ahead is on, its claims
    /// claimed a task within as long as tasks read ahead are used (the queue is being
    /// drained), and they were not held off within [`HOLD_OFF_FOR`].
    pub(super) fn busy(&self, reader: &Reader) -> bool {
        self.busy_at(reader, Instant::now())
    }

    /// [`Self::busy`] at `now`.
    fn busy_at(&self, reader: &Reader, now: Instant) -> bool {
        let fresh_for = self.fresh_for();
        if fresh_for.is_zero() {
            return false;
        }
        let paces = self.paces.lock().unwrap_or_else(|e| e.into_inner());
        paces
            .iter()
            .any(|p| &p.reader == reader && within(p.claimed, now, fresh_for) && !within(p.held_off, now, HOLD_OFF_FOR))
    }

    /// Forgets what was kept for `reader` (a task of it was lost: the rest is likely stale).
    pub(super) fn forget(&self, reader: &Reader) {
        let mut reads = self.reads.lock().unwrap_or_else(|e| e.into_inner());
        reads.retain(|r| &r.reader != reader);
    }
}

#[cfg(test)]
mod tests {
    use bson::doc;

    use super::*;

    fn reader(node: &str) -> Reader {
        Reader {
            queue: ObjectId::from_bytes([1; 12]),
            sort: Sort::Fifo,
            node: node.into(),
        }
    }

    #[test]
    fn tasks_read_ahead_go_once_in_order_to_their_reader_only() {
        let ahead = Ahead::default();
        ahead.keep_at(&reader("a"), (0..5).map(|i| doc! { "i": i }).collect(), Instant::now());
        assert!(
            ahead.take(&reader("b"), 3).is_empty(),
            "another node's claims take none"
        );
        let first = ahead.take(&reader("a"), 2);
        assert_eq!(first, vec![doc! { "i": 0 }, doc! { "i": 1 }]);
        let rest = ahead.take(&reader("a"), 10);
        assert_eq!(rest, vec![doc! { "i": 2 }, doc! { "i": 3 }, doc! { "i": 4 }]);
        assert!(ahead.take(&reader("a"), 1).is_empty(), "each task is handed out once");
        ahead.keep_at(&reader("a"), vec![doc! { "i": 9 }], Instant::now());
        ahead.forget(&reader("a"));
        assert!(ahead.take(&reader("a"), 1).is_empty(), "forgotten");
    }

    #[test]
    fn a_reader_is_busy_while_its_claims_claim_unless_held_off() {
        let ahead = Ahead::default();
        let at = Instant::now();
        let claimed = |p: &mut Pace, now| p.claimed = Some(now);
        assert!(!ahead.busy_at(&reader("a"), at), "no claim yet");
        ahead.pace_at(&reader("a"), at, claimed);
        assert!(ahead.busy_at(&reader("a"), at + READ_AHEAD_FOR / 2));
        assert!(!ahead.busy_at(&reader("b"), at), "another node's claims are not");
        assert!(
            !ahead.busy_at(&reader("a"), at + READ_AHEAD_FOR),
            "a pause as long as tasks read ahead are used ends it"
        );
        ahead.pace_at(&reader("a"), at, |p, now| p.held_off = Some(now));
        ahead.pace_at(&reader("a"), at + HOLD_OFF_FOR / 2, claimed);
        assert!(
            !ahead.busy_at(&reader("a"), at + HOLD_OFF_FOR / 2),
            "held off: a read found the queue running out, or a task read was lost"
        );
        ahead.pace_at(&reader("a"), at + HOLD_OFF_FOR, claimed);
        assert!(
            ahead.busy_at(&reader("a"), at + HOLD_OFF_FOR),
            "until that is a second old"
        );
        ahead.use_for(Duration::ZERO);
        assert!(
            !ahead.busy_at(&reader("a"), at + HOLD_OFF_FOR),
            "never when reading ahead is off"
        );
    }

    #[test]
    fn tasks_read_ahead_are_not_used_past_their_time() {
        let ahead = Ahead::default();
        let kept = Instant::now();
        ahead.keep_at(&reader("a"), vec![doc! { "i": 1 }, doc! { "i": 2 }], kept);
        assert_eq!(ahead.take_at(&reader("a"), 1, kept), vec![doc! { "i": 1 }]);
        assert!(ahead.take_at(&reader("a"), 1, kept + READ_AHEAD_FOR).is_empty());
        assert!(
            ahead.take_at(&reader("a"), 1, kept).is_empty(),
            "dropped once seen past its time"
        );
    }
}
