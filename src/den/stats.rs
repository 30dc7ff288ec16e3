//! The DEN's share of the per-minute counters ([`crate::stats`]): each run it ends is
//! counted in memory per (minute, queue); every [`FLUSH_EVERY`] the counts go to the store
//! in one upsert per (minute, queue) — never in a task's own write — and counts that could
//! not be written are kept for the next flush. While the node leads, it also records each
//! queue's depth once a minute and deletes the minutes older than `stats_retention`.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::DateTime;
use tracing::{debug, warn};

use super::Den;
use crate::model::status;
use crate::stats::{minute_of, Counters, End};

/// How often a DEN adds what it counted to the store.
pub const FLUSH_EVERY: Duration = Duration::from_secs(3);

/// What a DEN counted and not yet stored, and when its leader duties last ran.
#[derive(Debug, Default)]
pub(super) struct MinuteStats {
    pending: Mutex<BTreeMap<(i64, ObjectId), Counters>>,
    flushed: Mutex<Option<Instant>>,
    sampled: Mutex<Option<i64>>,
}

impl Den {
    /// Counts one run of `queue`'s task, ended as `end` after `took`.
    pub(super) fn count_run(&self, queue: ObjectId, end: End, took: Duration) {
        let minute = minute_of(DateTime::now());
        let mut pending = self.minute_stats.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending
            .entry((minute, queue))
            .or_default()
            .observe(end, took.as_secs_f64());
    }

    /// Counts a run whose final `status` was stored.
    pub(super) fn count_result(&self, queue: ObjectId, stored: i32, took: Duration) {
        let end = if stored == status::SUCCEEDED {
            End::Succeeded
        } else {
            End::Failed
        };
        self.count_run(queue, end, took);
    }

    /// Adds what was counted to the store, when `FLUSH_EVERY` passed since the last time
    /// (or at once with `now`). What cannot be written is kept for the next time.
    pub(super) async fn flush_stats(&self, now: bool) {
        {
            let mut flushed = self.minute_stats.flushed.lock().unwrap_or_else(|e| e.into_inner());
            if !now && flushed.is_some_and(|t| t.elapsed() < FLUSH_EVERY) {
                return;
            }
            *flushed = Some(Instant::now());
        }
        let taken = std::mem::take(&mut *self.minute_stats.pending.lock().unwrap_or_else(|e| e.into_inner()));
        if taken.is_empty() {
            return;
        }
        let rows: Vec<(i64, ObjectId, Counters)> = taken.iter().map(|((m, q), c)| (*m, *q, c.clone())).collect();
        if let Err(e) = self.store.add_stats(&self.settings.node, &rows).await {
            warn!(error = %e, "cannot store the per-minute counters; kept for the next try");
            let mut pending = self.minute_stats.pending.lock().unwrap_or_else(|e| e.into_inner());
            for (key, c) in taken {
                pending.entry(key).or_default().merge(&c);
            }
        }
    }

    /// The leader's share, once a minute: each queue's depth (queued tasks, 0 included)
    /// and the deletion of minutes past the retention.
    pub(super) async fn leader_stats(&self) {
        let minute = minute_of(DateTime::now());
        {
            let sampled = self.minute_stats.sampled.lock().unwrap_or_else(|e| e.into_inner());
            if *sampled == Some(minute) {
                return;
            }
        }
        let depths = async {
            let queues = self.store.queues().await?;
            let active = self.store.active_counts().await?;
            let depths: Vec<(ObjectId, i64)> = queues
                .iter()
                .map(|q| {
                    let queued = active.get(&q.id).and_then(|c| c.get(&status::QUEUED)).copied();
                    (q.id, queued.map_or(0, |n| n as i64))
                })
                .collect();
            self.store.record_depth(minute, &depths).await
        };
        if let Err(e) = depths.await {
            debug!(error = %e, "cannot record the queue depths; trying again next tick");
            return;
        }
        *self.minute_stats.sampled.lock().unwrap_or_else(|e| e.into_inner()) = Some(minute);
        let keep = (self.settings.stats_retention.as_secs() / 60) as i64;
        match self.store.prune_stats(minute - keep).await {
            Ok(0) => {}
            Ok(n) => debug!(rows = n, "deleted per-minute counters past the retention"),
            Err(e) => debug!(error = %e, "cannot delete old per-minute counters"),
        }
    }
}
