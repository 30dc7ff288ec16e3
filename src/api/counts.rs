//! Task counts per queue and status for `GET /queues`, `GET /queues/{queue}` and
//! `GET /metrics`, without walking every finished task on each request.
//!
//! The active statuses (scheduled, blocked, queued, claimed, running) are counted live on
//! every request from the `{queue, status}` index over those statuses only
//! ([`Store::active_counts`]): their cost grows with the work not yet done, never with
//! the history. The ended statuses (succeeded, failed, cancelled, orphaned, terminated…)
//! come from a snapshot of the full count ([`Store::queue_counts`]) that this DCI takes
//! again when:
//!
//! - the active counts, or the newest task's id, differ from those seen with the snapshot
//!   (tasks were created, ended, retried or cancelled: by our DENs, a Disbatch 4 DEN or
//!   any other writer) — at once when the last full count took under [`SLOW_COUNT`],
//!   otherwise once the time since it is ten times what it took (so a DCI spends at most
//!   a tenth of its time counting: a 300 ms count of a million tasks is redone at most
//!   every 3 s while tasks move), or
//! - the snapshot is older than [`MAX_AGE`] (a change that left the active counts as they
//!   were, such as tasks deleted by hand).
//!
//! An idle system, however large, is answered from the index of its active tasks alone.
//! Readers arriving while a full count runs wait for it and share it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;

use crate::store::{StatusCounts, Store, StoreResult, ACTIVE_STATUSES};

/// Longest time ended counts are served from one snapshot.
pub const MAX_AGE: Duration = Duration::from_secs(30);
/// A full count that took less is taken again as soon as anything changed.
pub const SLOW_COUNT: Duration = Duration::from_millis(50);

/// Counts per queue and status.
pub type Counts = BTreeMap<ObjectId, StatusCounts>;

#[derive(Debug)]
struct Snapshot {
    /// Counts of the ended statuses.
    ended: Counts,
    /// The active counts and the newest task read with the full count.
    active: Counts,
    newest: Option<ObjectId>,
    /// When the full count began, and how long it took.
    taken: Instant,
    took: Duration,
}

/// The snapshot of ended counts one DCI keeps.
#[derive(Debug, Default)]
pub struct CountsCache {
    snapshot: tokio::sync::Mutex<Option<Snapshot>>,
}

impl CountsCache {
    /// Counts per queue and status: active ones live, ended ones from the snapshot (see
    /// the module documentation).
    pub async fn counts(&self, store: &dyn Store) -> StoreResult<Counts> {
        let mut snapshot = self.snapshot.lock().await;
        // Read under the lock, so they are never older than the snapshot they are merged
        // with (a task ended since would be counted twice).
        let mut active = store.active_counts().await?;
        let newest = newest_task(store).await?;
        let fresh = snapshot.as_ref().is_some_and(|s| {
            let age = s.taken.elapsed();
            let same = s.active == active && s.newest == newest;
            age < MAX_AGE && (same || (s.took >= SLOW_COUNT && age < s.took * 10))
        });
        if !fresh {
            let began = Instant::now();
            let all = store.queue_counts().await?;
            let took = began.elapsed();
            let ended: Counts = all
                .into_iter()
                .map(|(q, counts)| {
                    let ended: StatusCounts = counts
                        .into_iter()
                        .filter(|(code, _)| !ACTIVE_STATUSES.contains(code))
                        .collect();
                    (q, ended)
                })
                .filter(|(_, counts)| !counts.is_empty())
                .collect();
            // What later reads compare with is what was read BEFORE the full count: a
            // task that ended during it changed the active counts since, so the next
            // read counts again rather than miss it for up to MAX_AGE.
            *snapshot = Some(Snapshot {
                ended,
                active,
                newest,
                taken: began,
                took,
            });
            // The active tasks as of after the full count: one that ended during it is
            // in the ended counts and no longer here.
            active = store.active_counts().await?;
        }
        let ended = snapshot.as_ref().map(|s| s.ended.clone()).unwrap_or_default();
        drop(snapshot);
        for (q, counts) in ended {
            let entry = active.entry(q).or_default();
            for (code, n) in counts {
                entry.insert(code, n);
            }
        }
        Ok(active)
    }
}

/// The id of the newest task, which changes when tasks are created.
async fn newest_task(store: &dyn Store) -> StoreResult<Option<ObjectId>> {
    store.newest_task_id().await
}
