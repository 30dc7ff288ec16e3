//! The DEN's side of queue rate limits (`lifecycle::rate`): a task of a rate-limited queue
//! is claimed only under a grant taken before the claim, and started with the grant's time
//! as its `started`. A grant whose claim found no task is given back. When no grant is
//! free the queue's tasks stay queued: the claim loop moves on, and a timer wakes it when
//! the first grant frees (or at its next tick, whichever comes first).
//!
//! A rate-limited queue's task is claimed as any other with the slot just taken (the
//! renewal, then the claim within its window), and its start records the grant's time
//! (`lifecycle::run::start_at`, or `lifecycle::run::record_started` for a task the store
//! claimed and started in one write); it is never claimed with the end of a run nor on a
//! slot's last renewal: each of its tasks needs its own grant, and its worker gives its
//! slot back after each run.

use std::sync::Arc;
use std::time::Duration;

use bson::DateTime;
use tracing::{debug, warn};

use super::Den;
use crate::lifecycle::rate::{self, Grant, Take};
use crate::model::{Queue, Rate};
use crate::store::StoreResult;

/// The shortest a timer waits, so a time already past never makes the loop spin.
const SHORTEST_WAIT: Duration = Duration::from_millis(5);

/// The longest a timer waits for a grant to free; the claim loop's ticks go on meanwhile.
const LONGEST_WAIT: Duration = Duration::from_secs(3600);

impl Den {
    /// A grant of `queue`'s `rate` for this node, or None when none is free (the loop is
    /// then woken when the first one frees). An error retrying cannot help (a grant row
    /// another tool wrote badly) is logged and leaves this queue's tasks waiting until the
    /// next tick, without stopping the claims of the other queues; a transient one is
    /// returned.
    pub(super) async fn take_grant(self: &Arc<Self>, queue: &Queue, rate: &Rate) -> StoreResult<Option<Grant>> {
        let taken = rate::take(&*self.store, queue.id, rate, &self.settings.node, DateTime::now()).await;
        match taken {
            Err(e) if e.is_transient() => Err(e),
            Err(e) => {
                warn!(queue = %queue.name, error = %e, "cannot take a rate grant; the queue's tasks wait");
                Ok(None)
            }
            Ok(Take::Granted(g)) => Ok(Some(g)),
            Ok(Take::WaitUntil(until)) => {
                debug!(queue = %queue.name, until = %until, "no rate grant free; the queue's tasks wait");
                self.wake_at(until);
                Ok(None)
            }
        }
    }

    /// Gives back a grant that started nothing (kept used when that cannot be done: the
    /// safe side).
    pub(super) async fn give_grant_back(&self, grant: &Grant) {
        if let Err(e) = rate::give_back(&*self.store, grant, &self.settings.node).await {
            debug!(error = %e, "cannot give a rate grant back; it stays used until its window ends");
        }
    }

    /// Wakes the claim loop at `until` (by this DEN's clock), unless a wake at or before it
    /// is already set; a wake set is dropped when the DEN stops.
    fn wake_at(self: &Arc<Self>, until: DateTime) {
        let wait = Duration::from_millis(
            u64::try_from(
                until
                    .timestamp_millis()
                    .saturating_sub(DateTime::now().timestamp_millis()),
            )
            .unwrap_or(0),
        )
        .clamp(SHORTEST_WAIT, LONGEST_WAIT);
        let at = tokio::time::Instant::now() + wait;
        {
            let mut next = self.rate_wake.lock().unwrap_or_else(|e| e.into_inner());
            if next.is_some_and(|n| n <= at && n > tokio::time::Instant::now()) {
                return;
            }
            *next = Some(at);
        }
        let den = self.clone();
        let stopping = self.stopping.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stopping.cancelled() => {}
                _ = tokio::time::sleep_until(at) => den.wake.notify_one(),
            }
        });
    }
}
