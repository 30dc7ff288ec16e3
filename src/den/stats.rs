//! The DEN's share of the per-minute counters ([`crate::stats`]): each run it ends is
//! counted in memory per (minute, queue); every [`FLUSH_EVERY`] the counts go to the store
//! in one upsert per (minute, queue) — never in a task's own write, and in a task of their
//! own, so a slow store never delays the heartbeat, claiming or the orphan sweep, and a
//! flush is never abandoned half-way. A row is taken out of the retry set as soon as it
//! is written (so a failure part-way through never adds the written rows twice); a row the
//! store refuses for good is dropped with a warning, and at most [`MAX_PENDING`] rows wait
//! for an unavailable store (the oldest minutes go first). While the node leads, it also
//! records each queue's depth once a minute and deletes the minutes older than
//! `stats_retention` (never less than [`MIN_RETENTION`]).

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
/// The shortest retention applied, whatever `stats_retention` says: a leader whose clock
/// runs ahead of the others' never deletes the minutes they are still adding to.
pub const MIN_RETENTION: Duration = Duration::from_secs(3600);
/// Most (minute, queue) rows a DEN keeps while the store cannot take them.
pub const MAX_PENDING: usize = 10_000;

/// What a DEN counted and not yet stored, and when its leader duties last ran.
#[derive(Debug, Default)]
pub(super) struct MinuteStats {
    pending: Mutex<BTreeMap<(i64, ObjectId), Counters>>,
    flushed: Mutex<Option<Instant>>,
    sampled: Mutex<Option<i64>>,
    /// Held while counters are written: one flush at a time.
    writing: tokio::sync::Mutex<()>,
    /// Whether [`Den::stats_duties`] runs.
    duties: std::sync::atomic::AtomicBool,
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
    /// (or at once with `now`, waiting for a flush under way). Rows are written one by one
    /// and each leaves the retry set once written; what cannot be written for now is kept
    /// for the next time, what the store refuses for good is dropped with a warning.
    pub(super) async fn flush_stats(&self, now: bool) {
        let _writing = if now {
            self.minute_stats.writing.lock().await
        } else {
            match self.minute_stats.writing.try_lock() {
                Ok(guard) => guard,
                Err(_) => return,
            }
        };
        {
            let mut flushed = self.minute_stats.flushed.lock().unwrap_or_else(|e| e.into_inner());
            if !now && flushed.is_some_and(|t| t.elapsed() < FLUSH_EVERY) {
                return;
            }
            *flushed = Some(Instant::now());
        }
        let taken = std::mem::take(&mut *self.minute_stats.pending.lock().unwrap_or_else(|e| e.into_inner()));
        let mut rows = taken.into_iter();
        while let Some(((minute, queue), c)) = rows.next() {
            match self
                .store
                .add_stats(&self.settings.node, &[(minute, queue, c.clone())])
                .await
            {
                Ok(()) => {}
                Err(e) if e.is_transient() => {
                    warn!(error = %e, "cannot store the per-minute counters; kept for the next try");
                    self.keep_pending(std::iter::once(((minute, queue), c)).chain(rows));
                    return;
                }
                Err(e) => warn!(
                    error = %e,
                    minute,
                    queue = %queue,
                    "the store refuses these per-minute counters; dropped"
                ),
            }
        }
    }

    /// Puts rows that could not be written back with those counted since, keeping at
    /// most [`MAX_PENDING`] (the newest minutes).
    fn keep_pending(&self, rows: impl Iterator<Item = ((i64, ObjectId), Counters)>) {
        let mut pending = self.minute_stats.pending.lock().unwrap_or_else(|e| e.into_inner());
        for (key, c) in rows {
            pending.entry(key).or_default().merge(&c);
        }
        let mut dropped = 0;
        while pending.len() > MAX_PENDING {
            pending.pop_first();
            dropped += 1;
        }
        if dropped > 0 {
            warn!(
                rows = dropped,
                "the store has been unavailable too long; dropped the oldest per-minute counters"
            );
        }
    }

    /// The counters' writes and the leader's statistics duties, in a task of their own
    /// (skipped while the previous one still runs).
    pub(super) fn stats_duties(self: &std::sync::Arc<Self>) {
        if self.minute_stats.duties.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let den = std::sync::Arc::clone(self);
        tokio::spawn(async move {
            den.flush_stats(false).await;
            if den.leads() {
                den.leader_stats().await;
            }
            den.minute_stats
                .duties
                .store(false, std::sync::atomic::Ordering::SeqCst);
        });
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
        let keep = (self.settings.stats_retention.max(MIN_RETENTION).as_secs() / 60) as i64;
        match self.store.prune_stats(minute - keep).await {
            Ok(0) => {}
            Ok(n) => debug!(rows = n, "deleted per-minute counters past the retention"),
            Err(e) => debug!(error = %e, "cannot delete old per-minute counters"),
        }
    }
}
