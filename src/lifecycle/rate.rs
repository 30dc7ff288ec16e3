//! Queue rate limits: what makes a queue's `rate: {max, per}` hold across every DEN.
//!
//! A rate-limited queue has one grant row per number `n` in `0..max` ([`RateStore`]),
//! each recording when it was last granted (`at`) and to which node. A task starts only
//! under a grant: a row whose `at` is a whole window `per` or more before now, taken by
//! one compare-and-set on what was read (`at` = now, `node` = the taker). A row is so
//! granted at most once in any window of `per`, and there are `max` rows: at most `max`
//! grants, and so starts, in any window of `per`, whichever DENs take them, with no count
//! kept in memory. Rows numbered `max` or above (the limit was lowered) are never granted.
//!
//! The task started under a grant records its time as its `started`
//! (`lifecycle::run::start_at`), so the database shows each start. A grant whose claim
//! found no task is given back ([`give_back`]: the row's `at` set back to what it was,
//! only while it is still this grant), so an empty queue polled often does not use up
//! its window.
//!
//! The clock is the taking DEN's (the one that writes `mtime`): DENs whose clocks
//! disagree by `d` may start up to `max` more in a window of `per` shortened by `d`.

use bson::oid::ObjectId;
use bson::DateTime;

use crate::model::Rate;
use crate::store::{RateRow, RateStore, StoreResult};

/// How many times a take reads the rows again when every write lost a race.
const TAKE_ATTEMPTS: usize = 3;

/// A grant taken: row `n` of `queue`, granted at `at` to the taker, and the row as it was
/// before (what [`give_back`] restores).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The queue.
    pub queue: ObjectId,
    /// The row.
    pub n: i64,
    /// When it was granted: the `started` of the task started under it.
    pub at: DateTime,
    /// The row as it was before.
    before: RateRow,
}

/// The outcome of a take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Take {
    /// A grant: one task may start.
    Granted(Grant),
    /// No row is free: none is before this time (the earliest row's `at` + `per`; the
    /// far future while the rate's `max` is 0).
    WaitUntil(DateTime),
}

/// `t` moved by `per` rounded up to a whole millisecond (the stores' precision), saturating:
/// a grant is never free again before a whole `per` has passed.
fn plus(t: DateTime, per: std::time::Duration) -> DateTime {
    let millis = i64::try_from(per.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX);
    DateTime::from_millis(t.timestamp_millis().saturating_add(millis))
}

/// Whether a row may be granted at `now`: its last grant is a whole `per` or more ago.
pub fn free(row: &RateRow, per: std::time::Duration, now: DateTime) -> bool {
    plus(row.at, per) <= now
}

/// The rows below `rate.max` free at `now`, least recently granted first.
pub fn free_rows<'a>(rows: &'a [RateRow], rate: &Rate, now: DateTime) -> Vec<&'a RateRow> {
    let mut free: Vec<&RateRow> = rows
        .iter()
        .filter(|r| r.n < rate.max && free(r, rate.per, now))
        .collect();
    free.sort_by_key(|r| (r.at, r.n));
    free
}

/// When the first row below `rate.max` becomes free (a missing row is free at once).
pub fn next_free(rows: &[RateRow], rate: &Rate) -> DateTime {
    if rate.max <= 0 {
        return DateTime::MAX;
    }
    let present = rows.iter().filter(|r| r.n < rate.max).count() as i64;
    if present < rate.max {
        return DateTime::from_millis(0);
    }
    rows.iter()
        .filter(|r| r.n < rate.max)
        .map(|r| plus(r.at, rate.per))
        .min()
        .unwrap_or(DateTime::from_millis(0))
}

/// When the window ending at `now` already holds `rate.max` grants or more, counting the
/// rows at or above `max` (granted before `max` was lowered): the first time one of them
/// frees. None while there is room.
pub fn full_until(rows: &[RateRow], rate: &Rate, now: DateTime) -> Option<DateTime> {
    let busy: Vec<DateTime> = rows
        .iter()
        .filter(|r| !free(r, rate.per, now))
        .map(|r| plus(r.at, rate.per))
        .collect();
    (busy.len() as i64 >= rate.max).then(|| busy.into_iter().min().unwrap_or(now))
}

/// How many grants of the window ending at `now` the rows below `rate.max` hold (the
/// queue's `rate_used`).
pub fn used(rows: &[RateRow], rate: &Rate, now: DateTime) -> i64 {
    rows.iter()
        .filter(|r| r.n < rate.max && !free(r, rate.per, now))
        .count() as i64
}

/// Takes a grant of `queue`'s `rate` for `node` at `now` (the DEN's clock): creates the
/// rows `0..max` when some are missing, then takes a free row by compare-and-set on its `at`
/// and `node` as read, reading again (up to [`TAKE_ATTEMPTS`] times) when other takers won
/// every race. [`Take::WaitUntil`] when no row is free.
pub async fn take(
    store: &(impl RateStore + ?Sized),
    queue: ObjectId,
    rate: &Rate,
    node: &str,
    now: DateTime,
) -> StoreResult<Take> {
    if rate.max <= 0 {
        return Ok(Take::WaitUntil(DateTime::MAX));
    }
    let mut rows = store.rates(queue).await?;
    if rows.iter().filter(|r| r.n < rate.max).count() < usize::try_from(rate.max).unwrap_or(0) {
        // A new queue, a raised `max`, or rows deleted by hand: created again.
        store.ensure_rates(queue, rate.max).await?;
        rows = store.rates(queue).await?;
    }
    for _ in 0..TAKE_ATTEMPTS {
        // Grants of rows at or above `max` (made before it was lowered) still count in
        // their window.
        if let Some(until) = full_until(&rows, rate, now) {
            return Ok(Take::WaitUntil(until));
        }
        let free = free_rows(&rows, rate, now);
        if free.is_empty() {
            return Ok(Take::WaitUntil(next_free(&rows, rate)));
        }
        for row in free {
            let to = RateRow {
                n: row.n,
                at: now,
                node: Some(node.to_owned()),
            };
            if store.change_rate(queue, row.n, row, &to).await? {
                return Ok(Take::Granted(Grant {
                    queue,
                    n: row.n,
                    at: now,
                    before: row.clone(),
                }));
            }
        }
        rows = store.rates(queue).await?;
    }
    Ok(Take::WaitUntil(next_free(&rows, rate)))
}

/// Gives a grant that started nothing back to `node`'s queue: the row's `at` and `node`
/// are set back to what they were, only while the row still holds this grant (fenced on
/// its `at` and `node`). Whether it was given back.
pub async fn give_back(store: &(impl RateStore + ?Sized), grant: &Grant, node: &str) -> StoreResult<bool> {
    let held = RateRow {
        n: grant.n,
        at: grant.at,
        node: Some(node.to_owned()),
    };
    store.change_rate(grant.queue, grant.n, &held, &grant.before).await
}

/// How many grants of `queue`'s `rate` the window ending now holds (`rate_used`).
pub async fn in_use(store: &(impl RateStore + ?Sized), queue: ObjectId, rate: &Rate) -> StoreResult<i64> {
    let rows = store.rates(queue).await?;
    Ok(used(&rows, rate, DateTime::now()))
}

#[cfg(test)]
mod tests;
