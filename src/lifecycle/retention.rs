//! Retention: which ended tasks are deleted, decided once here for both stores.
//!
//! A queue's `retention` (over the config's default, status by status) says how long its
//! ended tasks of each status are kept, counted from their end (`mtime`). The leader looks
//! regularly ([`sweep`]); each task past its time is deleted with its output files, in
//! batches of at most [`Bounds::batch`] tasks, each one write of its own (so claims go on
//! between them), at most [`Bounds::batches`] of them a look. A task is kept, whatever its
//! age, while it still matters:
//!
//! - blocked tasks may wait for it (`dependents`, cleared once its end is settled:
//!   `lifecycle::deps`);
//! - it is marked to run again (`rerun`);
//! - its batch is still open (a task of it has not ended, it has fewer tasks than its
//!   `size` and is not closed: `lifecycle::batches::complete`), or blocked tasks wait for
//!   its batch;
//! - its batch has a task not yet past its own retention: a batch's tasks go together,
//!   once the last of them is past its time; the look closes the batch
//!   (`Store::close_batch`) before deleting the first, so the rest still read complete;
//! - it is the last task of a schedule with `overlap: "skip"` (its next occurrence looks
//!   at it).
//!
//! Each deletion is fenced on the task's `status` and `mtime` as read, so a task retried,
//! rerun or changed in any way since it was found stays. A task whose `status` or `mtime`
//! another tool wrote in another type is never found, so never deleted by mistake.
//!
//! Deleting a task frees its `key`. A schedule never creates an occurrence again, since its
//! mark only moves forward. A task submitted `after` a deleted task fails to wait, as after
//! any task that does not exist.

use std::collections::HashMap;
use std::time::Duration;

use bson::oid::ObjectId;
use bson::DateTime;

use crate::model::{Overlap, Retention, RETENTION_KEYS};
use crate::store::{ExpiredFilter, Store, StoreResult};

/// How many tasks one deletion takes, and how many deletions one look makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// The most tasks deleted in one write.
    pub batch: usize,
    /// The most writes of one look.
    pub batches: usize,
}

impl Default for Bounds {
    /// 500 tasks a write, 20 writes a look.
    fn default() -> Self {
        Bounds {
            batch: 500,
            batches: 20,
        }
    }
}

/// What one look did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Swept {
    /// The tasks deleted.
    pub deleted: u64,
    /// Whether the look stopped at its bound with tasks possibly left to delete: the next
    /// look should come soon.
    pub more: bool,
}

/// The retention of a queue whose own is `own`, over the cluster's `default`.
pub fn effective(own: Option<&Retention>, default: &Retention) -> Retention {
    own.map_or_else(|| default.clone(), |r| r.over(default))
}

/// When the ended tasks of a status kept for `keep` are due at `now`: those whose `mtime`
/// is before this.
pub fn due_before(now: DateTime, keep: Duration) -> DateTime {
    let millis = i64::try_from(keep.as_millis()).unwrap_or(i64::MAX);
    DateTime::from_millis(now.timestamp_millis().saturating_sub(millis))
}

/// One look at every readable queue at `now`: deletes the ended tasks past their
/// retention (the queue's own over `default`) that no longer matter, within `bounds`. A
/// queue that cannot be read keeps every task.
pub async fn sweep(
    store: &(impl Store + ?Sized),
    default: &Retention,
    now: DateTime,
    bounds: Bounds,
) -> StoreResult<Swept> {
    let queues = store.queues().await?;
    let plans: Vec<(ObjectId, Retention)> = queues
        .iter()
        .map(|q| (q.id, effective(q.retention.as_ref(), default)))
        .filter(|(_, r)| !r.is_empty())
        .collect();
    let mut swept = Swept::default();
    if plans.is_empty() {
        return Ok(swept);
    }
    let kept_ids = overlap_tasks(store).await?;
    let look = Look {
        plans: plans.clone(),
        now,
        kept_ids: kept_ids.clone(),
    };
    let mut batches = BatchCheck::default();
    let mut writes = 0;
    for (queue, retention) in plans {
        for (_, code) in RETENTION_KEYS {
            let Some(keep) = retention.of(code) else { continue };
            let mut filter = ExpiredFilter {
                queue,
                status: code,
                before: due_before(now, keep),
                except_ids: kept_ids.clone(),
                except_batches: batches.kept(),
                batch: None,
                limit: bounds.batch.max(1),
            };
            loop {
                if writes >= bounds.batches {
                    swept.more = true;
                    return Ok(swept);
                }
                let mut found = store.expired_tasks(&filter).await?;
                if found.is_empty() {
                    break;
                }
                let full = found.len() >= filter.limit;
                let mut newly_kept = false;
                for b in found.iter().filter_map(|t| t.batch.clone()).collect::<Vec<_>>() {
                    newly_kept |= batches.keeps(store, &b, &look).await?;
                }
                found.retain(|t| t.batch.as_ref().is_none_or(|b| !batches.is_kept(b)));
                if !found.is_empty() {
                    writes += 1;
                    swept.deleted += store.delete_tasks(&found).await?.len() as u64;
                    tokio::task::yield_now().await;
                }
                if newly_kept {
                    filter.except_batches = batches.kept();
                } else if !full {
                    break;
                }
            }
        }
    }
    Ok(swept)
}

/// The last tasks of the schedules with `overlap: "skip"`.
async fn overlap_tasks(store: &(impl Store + ?Sized)) -> StoreResult<Vec<ObjectId>> {
    Ok(store
        .schedules()
        .await?
        .into_iter()
        .filter(|r| r.schedule.overlap == Overlap::Skip)
        .filter_map(|r| r.mark.task)
        .collect())
}

/// The batches looked at in one look, and whether each keeps its tasks.
#[derive(Default)]
struct BatchCheck {
    seen: HashMap<String, bool>,
}

impl BatchCheck {
    /// Whether batch `b` keeps its tasks, read once a look; true when it was read now and
    /// keeps them.
    async fn keeps(&mut self, store: &(impl Store + ?Sized), b: &str, look: &Look) -> StoreResult<bool> {
        if self.seen.contains_key(b) {
            return Ok(false);
        }
        let keep = batch_matters(store, b, look).await?;
        self.seen.insert(b.to_owned(), keep);
        Ok(keep)
    }

    fn is_kept(&self, b: &str) -> bool {
        self.seen.get(b).copied().unwrap_or(false)
    }

    fn kept(&self) -> Vec<String> {
        self.seen.iter().filter(|(_, k)| **k).map(|(b, _)| b.clone()).collect()
    }
}

/// What one look knows: the queues with a retention and theirs, its time, and the tasks
/// kept whatever their age.
struct Look {
    plans: Vec<(ObjectId, Retention)>,
    now: DateTime,
    kept_ids: Vec<ObjectId>,
}

/// Whether batch `b` still matters: blocked tasks wait for it, a task of it has not ended,
/// it has fewer tasks than its `size` (more are to come), or a task of it is not yet
/// past its retention (the tasks of a batch go together).
async fn batch_matters(store: &(impl Store + ?Sized), b: &str, look: &Look) -> StoreResult<bool> {
    let Some(batch) = store.batch(b).await? else {
        return Ok(false);
    };
    if batch.dependents {
        return Ok(true);
    }
    let counts = store.batch_counts(b).await?;
    if !super::batches::complete(&batch, &counts) {
        return Ok(true);
    }
    // A status no queue deletes keeps the batch, with no need to count the rest.
    if counts
        .keys()
        .any(|code| look.plans.iter().all(|(_, r)| r.of(*code).is_none()))
    {
        return Ok(true);
    }
    for (code, n) in counts {
        if n > 0 && past_retention(store, b, code, n, look).await? < n {
            return Ok(true);
        }
    }
    if batch.closed.is_none() {
        store.close_batch(b).await?;
    }
    Ok(false)
}

/// How many of batch `b`'s tasks of status `code` are past their queue's retention and of
/// no other use (up to `n`, the batch's tasks of that status), over every queue with a
/// retention for it.
async fn past_retention(store: &(impl Store + ?Sized), b: &str, code: i32, n: u64, look: &Look) -> StoreResult<u64> {
    let mut past = 0;
    for (queue, retention) in &look.plans {
        let Some(keep) = retention.of(code) else { continue };
        let filter = ExpiredFilter {
            queue: *queue,
            status: code,
            before: due_before(look.now, keep),
            except_ids: look.kept_ids.clone(),
            except_batches: Vec::new(),
            batch: Some(b.to_owned()),
            limit: usize::try_from(n - past).unwrap_or(usize::MAX),
        };
        past += store.expired_tasks(&filter).await?.len() as u64;
        if past >= n {
            break;
        }
    }
    Ok(past)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::status;
    use bson::{doc, Bson};

    #[test]
    fn due_before_counts_back_from_now() {
        let now = DateTime::from_millis(10_000_000);
        assert_eq!(
            due_before(now, Duration::from_secs(60)),
            DateTime::from_millis(10_000_000 - 60_000)
        );
        assert!(due_before(now, Duration::MAX) < DateTime::from_millis(0));
    }

    #[test]
    fn a_queue_without_its_own_takes_the_default() {
        let d = Retention::from_bson(&Bson::Document(doc! { "failed": "1d" })).unwrap();
        assert_eq!(effective(None, &d), d);
        let own = Retention::from_bson(&Bson::Document(doc! { "succeeded": "1h" })).unwrap();
        let r = effective(Some(&own), &d);
        assert_eq!(r.of(status::SUCCEEDED), Some(Duration::from_secs(3600)));
        assert_eq!(r.of(status::FAILED), Some(Duration::from_secs(86400)));
    }

    #[test]
    fn a_queue_whose_retention_cannot_be_read_keeps_every_task_over_the_default() {
        let d = Retention::from_bson(&Bson::Document(doc! { "succeeded": "1d" })).unwrap();
        let r = effective(Some(&Retention::keep_all()), &d);
        assert!(r.is_empty());
        assert_eq!(r.of(status::SUCCEEDED), None);
    }
}
