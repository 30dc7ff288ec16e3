//! Queue slots: what makes a queue's `threads` hold across every DEN.
//!
//! A queue has one slot row per number `n` in `0..threads` ([`SlotStore`]); a worker runs a
//! task only under a slot it holds. The rules are written here once: a slot is *in use*
//! while its lease runs, or after it ended while its holder still has a claimed or running
//! task of the queue ([`holder_busy`]: a slot is freed only with or after the recovery of
//! its tasks); it is *free* when unheld and not reserved for another node, or in use no
//! more. A node that finds no free slot asks the node holding the most for one
//! ([`fair_share_donor`], [`ask_rotation`]); that holder gives it up at its next renewal
//! ([`renew_step`]).
//!
//! Tasks Disbatch 4 DENs run hold no slot: they count against the queue's limit, and the
//! slots they leave no room for are the top ones.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::DateTime;

use crate::model::{Queue, Task};
pub use crate::store::lease_end;
use crate::store::{
    BusyNode, BusyOf, Holder, Lease, Mark, RenewStep, Slot, SlotChange, SlotFence, SlotRenewal, SlotRow, Store,
    StoreError, StoreResult,
};

/// How many times a renewal reads the slot again when its write lost a race.
const RENEW_ATTEMPTS: usize = 3;

/// The names of the nodes that have claimed or running tasks.
pub fn busy_names(busy: &[BusyNode]) -> BTreeSet<&str> {
    busy.iter().filter(|b| b.tasks > 0).map(|b| b.node.as_str()).collect()
}

/// Whether `holder` still has a claimed or running task (among `busy`, read for the
/// queue, or node-wide for recovery): its slot is not freed before that task is recovered.
pub fn holder_busy(holder: &str, busy: &BTreeSet<&str>) -> bool {
    busy.contains(holder)
}

/// The holders among `holders` with no claimed or running task left (`busy` read
/// node-wide): those whose slots recovery may free.
pub fn idle_holders<'a>(holders: &'a [String], busy: &[BusyNode]) -> Vec<&'a String> {
    let busy = busy_names(busy);
    holders.iter().filter(|h| !holder_busy(h, &busy)).collect()
}

/// Whether a slot is in use at `now`: held with its lease running, or held while its
/// holder still has a claimed or running task.
pub fn in_use(row: &SlotRow, busy: &BTreeSet<&str>, now: DateTime) -> bool {
    match &row.holder {
        None => false,
        Some(h) => row.expires > now || holder_busy(h, busy),
    }
}

/// How many slots numbered `from` or above are in use.
pub fn used_from(rows: &[SlotRow], busy: &BTreeSet<&str>, from: i64, now: DateTime) -> i64 {
    rows.iter().filter(|r| r.n >= from && in_use(r, busy, now)).count() as i64
}

/// A mark (ask or reservation) is no obstacle to `node` at `at`: none, `node`'s own, or
/// ended. The same rule as [`Mark::OpenTo`], which the stores apply as a fence.
fn open_to(mark: &Option<String>, until: Option<DateTime>, node: Option<&str>, at: DateTime) -> bool {
    match mark {
        None => true,
        Some(m) => Some(m.as_str()) == node || until.is_none_or(|u| u < at),
    }
}

/// The slots below `threads` that `node` may take at `now`, each with the fence that keeps
/// the take conditional on what made it free: unheld ones not reserved for another node
/// first, then those whose lease ended and whose holder has no claimed or running task
/// left; each group in slot order.
pub fn takeable(
    rows: &[SlotRow],
    node: &str,
    busy: &BTreeSet<&str>,
    threads: i64,
    now: DateTime,
) -> Vec<(i64, SlotFence)> {
    let below = || rows.iter().filter(|r| r.n < threads);
    let mut unheld: Vec<(i64, SlotFence)> = below()
        .filter(|r| r.holder.is_none() && open_to(&r.reserved, r.reserved_until, Some(node), now))
        .map(|r| {
            let fence = SlotFence {
                holder: Holder::Unheld,
                reserved: Mark::OpenTo {
                    node: Some(node.to_string()),
                    at: now,
                },
                ..SlotFence::default()
            };
            (r.n, fence)
        })
        .collect();
    let mut ended: Vec<(i64, SlotFence)> = below()
        .filter_map(|r| {
            let h = r.holder.as_ref()?;
            (r.expires < now && !holder_busy(h, busy)).then(|| {
                let fence = SlotFence {
                    holder: Holder::By(h.clone()),
                    lease: Lease::EndedAt(now),
                    ..SlotFence::default()
                };
                (r.n, fence)
            })
        })
        .collect();
    unheld.sort_by_key(|(n, _)| *n);
    ended.sort_by_key(|(n, _)| *n);
    unheld.extend(ended);
    unheld
}

/// Whether a slot numbered `n`, taken under a limit of `seen`, may be kept now that the
/// limit as stored is `stored`: it must be below it, and when the limit was lowered no slot
/// at or above the stored limit may still be in use (`used_above`).
pub fn confirmed(n: i64, seen: i64, stored: i64, used_above: i64) -> bool {
    n < stored && (stored >= seen || used_above == 0)
}

/// The fence of a renewal that keeps `slot`: held by `node` through this lease's take,
/// its lease running and nobody else's ask on it at `now`.
fn held_fence(slot: &Slot, node: &str, now: DateTime) -> SlotFence {
    SlotFence {
        holder: Holder::By(node.to_string()),
        lease: Lease::LiveAt(now),
        want: Mark::OpenTo { node: None, at: now },
        taken: Some(slot.taken),
        ..SlotFence::default()
    }
}

/// The renew decision for `node`'s lease `slot` from the slot's row at `now`: the lease
/// runs on to `until` while `node` holds the slot through this lease's take, its lease runs
/// and no live ask is on it (Held); an asked slot is given up to the asker, reserved for it
/// until its ask ends (Yielded — also when the lease ended meanwhile); a slot held by
/// another node or through another take (a lease that ran out and was taken again), or
/// whose lease ended unasked (it may have been counted free since), is Lost and stays as
/// it is.
pub fn renew_step(row: &SlotRow, slot: &Slot, node: &str, now: DateTime, until: DateTime) -> RenewStep {
    if row.holder.as_deref() != Some(node) || row.taken != Some(slot.taken) {
        return RenewStep {
            renewal: SlotRenewal::Lost,
            write: None,
        };
    }
    if row.expires > now && open_to(&row.want, row.want_until, None, now) {
        return RenewStep {
            renewal: SlotRenewal::Held,
            write: Some((held_fence(slot, node, now), SlotChange::Renew { until })),
        };
    }
    match (&row.want, row.want_until) {
        (Some(to), Some(ask_until)) => RenewStep {
            renewal: SlotRenewal::Yielded { to: to.clone() },
            write: Some((
                SlotFence {
                    holder: Holder::By(node.to_string()),
                    want: Mark::By(to.clone()),
                    taken: Some(slot.taken),
                    ..SlotFence::default()
                },
                SlotChange::Yield {
                    to: to.clone(),
                    until: ask_until,
                },
            )),
        },
        _ => RenewStep {
            renewal: SlotRenewal::Lost,
            write: None,
        },
    }
}

/// The claimed and running tasks of `queue` on nodes Disbatch 4 DENs run.
async fn foreign_running(store: &(impl Store + ?Sized), queue: ObjectId) -> StoreResult<i64> {
    let busy = store.busy_nodes(Some(queue), BusyOf::Foreign).await?;
    Ok(busy.iter().filter(|b| b.foreign).map(|b| b.tasks).sum())
}

/// The limit of `queue` as stored now (0 when it is gone or cannot be read).
async fn stored_limit(store: &(impl Store + ?Sized), queue: ObjectId) -> StoreResult<i64> {
    match store.queue(queue).await {
        Ok(q) => Ok(q.map_or(0, |q| q.limit())),
        Err(StoreError::Malformed { .. }) => Ok(0),
        Err(e) => Err(e),
    }
}

/// Slots of `queue` numbered `from` or above in use now.
async fn slots_used_from(store: &(impl Store + ?Sized), queue: ObjectId, from: i64) -> StoreResult<i64> {
    let rows = store.slots(queue).await?;
    if !rows.iter().any(|r| r.n >= from && r.holder.is_some()) {
        return Ok(0);
    }
    let busy = store.busy_nodes(Some(queue), BusyOf::All).await?;
    Ok(used_from(&rows, &busy_names(&busy), from, DateTime::now()))
}

/// Takes a lease on a free slot of `queue` for `node` until now + `lease`. Slot numbers
/// run `0..threads`; a slot is free as [`takeable`] says. Returns None when all `threads`
/// slots are taken, or while slots numbered `threads` or above are still in use (the
/// queue's limit was lowered and it is still over it). A slot taken under a limit the
/// stored queue no longer allows (`queue` was read before `threads` or `maxthreads` was
/// lowered) is given back before anything is claimed with it. This is what makes
/// `threads` hold across DENs.
pub async fn acquire_slot(
    store: &(impl Store + ?Sized),
    queue: &Queue,
    node: &str,
    lease: Duration,
) -> StoreResult<Option<Slot>> {
    let limit = queue.limit();
    if limit <= 0 {
        return Ok(None);
    }
    store.ensure_slots(queue.id, limit).await?;
    let foreign = foreign_running(store, queue.id).await?;
    let threads = limit - foreign;
    if threads <= 0 {
        return Ok(None);
    }
    let rows = store.slots(queue.id).await?;
    let now = DateTime::now();
    // Who has claimed or running tasks matters only for a slot held past its lease, or
    // held at or above the limit: without one, the count is not read.
    let busy = if rows
        .iter()
        .any(|r| r.holder.is_some() && (r.expires <= now || r.n >= threads))
    {
        store.busy_nodes(Some(queue.id), BusyOf::All).await?
    } else {
        Vec::new()
    };
    let busy = busy_names(&busy);
    if used_from(&rows, &busy, threads, now) > 0 {
        return Ok(None);
    }
    let taken = ObjectId::new();
    let take = SlotChange::Take {
        holder: node.to_string(),
        until: lease_end(now, lease),
        taken,
    };
    for (n, fence) in takeable(&rows, node, &busy, threads, now) {
        let slot = Slot {
            queue: queue.id,
            n,
            taken,
        };
        if store.change_slot(&slot, &fence, &take).await? {
            return confirm_slot(store, slot, node, threads, foreign).await;
        }
    }
    Ok(None)
}

/// Keeps a slot just taken under the caller's view of the limit (`seen`) only if the
/// limit as stored now allows it ([`confirmed`]); else gives it back.
async fn confirm_slot(
    store: &(impl Store + ?Sized),
    slot: Slot,
    node: &str,
    seen: i64,
    foreign: i64,
) -> StoreResult<Option<Slot>> {
    let checked = async {
        let stored = stored_limit(store, slot.queue).await? - foreign;
        let used_above = if stored < seen {
            slots_used_from(store, slot.queue, stored).await?
        } else {
            0
        };
        Ok::<_, StoreError>(confirmed(slot.n, seen, stored, used_above))
    }
    .await;
    if !matches!(checked, Ok(true)) {
        // Not allowed, or not known to be: given back before anything is claimed with it.
        release_slot(store, &slot, node).await?;
    }
    Ok(checked?.then_some(slot))
}

/// Gives a slot back (only if `node` still holds it through this lease's take).
pub async fn release_slot(store: &(impl Store + ?Sized), slot: &Slot, node: &str) -> StoreResult<()> {
    let fence = SlotFence {
        holder: Holder::By(node.to_string()),
        taken: Some(slot.taken),
        ..SlotFence::default()
    };
    store.change_slot(slot, &fence, &SlotChange::Release).await?;
    Ok(())
}

/// Whether Disbatch 4 DENs' tasks leave no room for the slot (its number is at or above
/// the stored limit less their claimed and running tasks).
async fn over_limit(store: &(impl Store + ?Sized), slot: &Slot) -> StoreResult<bool> {
    let foreign = foreign_running(store, slot.queue).await?;
    Ok(foreign > 0 && slot.n >= stored_limit(store, slot.queue).await? - foreign)
}

/// Re-validates a slot lease before a claim ([`renew_step`]): renews it until now +
/// `lease` while `node` holds it and no other node asked for it; gives it up, reserved for
/// the asker until its ask ends, when one did; OverLimit when Disbatch 4 DENs' tasks leave
/// no room for it.
pub async fn renew_slot(
    store: &(impl Store + ?Sized),
    slot: &Slot,
    node: &str,
    lease: Duration,
) -> StoreResult<SlotRenewal> {
    if over_limit(store, slot).await? {
        return Ok(SlotRenewal::OverLimit);
    }
    renew_fenced(store, slot, node, lease).await
}

/// [`renew_step`] applied under its fence: first the renewal that keeps the slot, without
/// a read (the usual case); when it does not apply, the step decided from the row as read,
/// read again when its write lost a race (Lost after [`RENEW_ATTEMPTS`]).
async fn renew_fenced(
    store: &(impl Store + ?Sized),
    slot: &Slot,
    node: &str,
    lease: Duration,
) -> StoreResult<SlotRenewal> {
    let now = DateTime::now();
    let until = lease_end(now, lease);
    if store
        .change_slot(slot, &held_fence(slot, node, now), &SlotChange::Renew { until })
        .await?
    {
        return Ok(SlotRenewal::Held);
    }
    for _ in 0..RENEW_ATTEMPTS {
        let rows = store.slots(slot.queue).await?;
        let row = rows
            .into_iter()
            .find(|r| r.n == slot.n)
            .unwrap_or_else(|| SlotRow::unheld(slot.n));
        let step = renew_step(&row, slot, node, DateTime::now(), until);
        match &step.write {
            None => return Ok(step.renewal),
            Some((fence, change)) if store.change_slot(slot, fence, change).await? => return Ok(step.renewal),
            Some(_) => {}
        }
    }
    Ok(SlotRenewal::Lost)
}

/// A worker's next claim with the slot it holds: [`renew_slot`], then, only when the slot
/// is still held, [`Store::claim_to_run`] of `queue` — in one transaction where the store
/// offers it ([`Store::renew_and_claim`]), else in steps ([`renew_then_claim`]).
pub async fn renew_and_claim(
    store: &(impl Store + ?Sized),
    slot: &Slot,
    queue: &Queue,
    node: &str,
    lease: Duration,
) -> StoreResult<(SlotRenewal, Option<Task>)> {
    if over_limit(store, slot).await? {
        return Ok((SlotRenewal::OverLimit, None));
    }
    if let Some(done) = store.renew_and_claim(slot, queue, node, lease, renew_step).await? {
        return Ok(done);
    }
    renew_then_claim(store, slot, queue, node, lease).await
}

/// A worker's last renewal of its slot that kept it: when it was sent, and the end of its
/// [`claim_window`] by the DEN's clock. Its next claims reuse it for a while
/// ([`claim_next`]).
#[derive(Debug, Clone, Copy)]
pub struct Renewed {
    sent: Instant,
    until: DateTime,
}

/// How long a worker claims on one renewal of its slot before renewing it again: one
/// `tick`, so it answers another node's ask for the slot (which stays open for three ticks)
/// in time, and never more than half the claim window.
pub fn reuse_for(tick: Duration, lease: Duration) -> Duration {
    tick.min(claim_window(lease) / 2)
}

/// A worker's next claim with the slot it holds. Within [`reuse_for`] of its last renewal
/// (`renewed`) the claim is made on that renewal, only while the database's clock is
/// before the renewal's window ends ([`Store::claim_before`]), so a busy worker writes its
/// slot once a tick, not once a task (the heartbeat keeps every held lease running
/// meanwhile); past it, [`renew_and_claim`] checks the slot again. `renewed` is kept up to
/// date: set by a renewal that kept the slot, cleared by any other outcome.
pub async fn claim_next(
    store: &(impl Store + ?Sized),
    slot: &Slot,
    queue: &Queue,
    node: &str,
    (lease, tick): (Duration, Duration),
    renewed: &mut Option<Renewed>,
) -> StoreResult<(SlotRenewal, Option<Task>)> {
    if let Some(r) = reusable(renewed, (lease, tick)) {
        if over_limit(store, slot).await? {
            *renewed = None;
            return Ok((SlotRenewal::OverLimit, None));
        }
        return Ok((SlotRenewal::Held, store.claim_before(queue, node, r.until).await?));
    }
    *renewed = None;
    let sent = Instant::now();
    let until = lease_end(DateTime::now(), claim_window(lease));
    let done = renew_and_claim(store, slot, queue, node, lease).await?;
    if done.0 == SlotRenewal::Held && sent.elapsed() < claim_window(lease) {
        *renewed = Some(Renewed { sent, until });
    }
    Ok(done)
}

/// The worker's last renewal while its next claims may still be made on it (within
/// [`reuse_for`] of its sending).
fn reusable(renewed: &Option<Renewed>, (lease, tick): (Duration, Duration)) -> Option<Renewed> {
    renewed.filter(|r| r.sent.elapsed() < reuse_for(tick, lease))
}

/// The deadline of a worker's next claim when [`claim_next`] would make it on the worker's
/// last renewal now (within [`reuse_for`] of it, and the slot not over the queue's limit),
/// so that it may go with the end of the worker's run (`lifecycle::run::finish_and_claim`)
/// under the same deadline ([`Store::claim_before`]). None otherwise: the slot is due for
/// its renewal, or is over the limit, and [`claim_next`] decides after the end is written.
pub async fn claim_on_renewal(
    store: &(impl Store + ?Sized),
    slot: &Slot,
    timing: (Duration, Duration),
    renewed: &Option<Renewed>,
) -> StoreResult<Option<DateTime>> {
    let Some(r) = reusable(renewed, timing) else {
        return Ok(None);
    };
    Ok((!over_limit(store, slot).await?).then_some(r.until))
}

/// How long after a slot's renewal was sent a claim with it may still be made: half the
/// slot's `lease`. Whoever takes the slot once its lease has run out finds the claim made
/// (the task held by the slot's holder) and leaves the slot; the other half of the lease
/// is the margin for clocks that disagree.
pub fn claim_window(lease: Duration) -> Duration {
    lease / 2
}

/// [`renew_and_claim`] as two writes. The claim is sent only within [`claim_window`] of the
/// renewal being sent: a process paused after the renewal (its lease may have run out and
/// its slot gone to another node) claims nothing when it wakes. The claim is also made only
/// while the database's clock is before the window's end by the renewal's wall clock
/// ([`Store::claim_before`]), so a claim held up on its way (the process stopped just after
/// the check, a slow network) claims nothing either. An error of either step is returned
/// as is.
pub async fn renew_then_claim(
    store: &(impl Store + ?Sized),
    slot: &Slot,
    queue: &Queue,
    node: &str,
    lease: Duration,
) -> StoreResult<(SlotRenewal, Option<Task>)> {
    let window = claim_window(lease);
    let sent = Instant::now();
    let until = lease_end(DateTime::now(), window);
    match renew_fenced(store, slot, node, lease).await? {
        SlotRenewal::Held if sent.elapsed() >= window => Ok((SlotRenewal::Held, None)),
        SlotRenewal::Held => Ok((SlotRenewal::Held, store.claim_before(queue, node, until).await?)),
        other => Ok((other, None)),
    }
}

/// How many of `queue`'s slots are in use ([`in_use`]), plus the claimed and running tasks
/// Disbatch 4 DENs run in it. No more of its tasks are claimed or running than this (each
/// runs under a slot).
pub async fn slots_in_use(store: &(impl Store + ?Sized), queue: ObjectId) -> StoreResult<i64> {
    Ok(slots_used_from(store, queue, 0).await? + foreign_running(store, queue).await?)
}

mod asks;

pub use asks::{ask_rotation, fair_share_donor, want_slot};

#[cfg(test)]
mod tests;
