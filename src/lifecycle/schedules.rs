//! Schedules: which occurrences become tasks, decided once here for both stores.
//!
//! Each schedule has a progress mark, `last`: the newest occurrence handled. The leader
//! looks at every schedule each tick ([`run_schedules`]); the occurrences in
//! `(last, now]` are due, and [`plan`] picks those to create by `catch_up`:
//!
//! - `none`: those at most [`GRACE`] old (the leader ticks about once a second, so none is
//!   missed while a leader runs); older ones are skipped.
//! - `last`: the newest one only.
//! - `all`: each, oldest first, the newest `catch_up_limit` of them; older ones skipped.
//!
//! Each occurrence's task carries the key `schedule:<name>:<time as RFC 3339 in UTC>`
//! ([`occurrence_key`]), unique within its queue, so a second insert of the same
//! occurrence (by a second leader, a leader paused past its lease, or after a crash
//! between the insert and the mark) finds the task there and creates none. The mark moves
//! by compare-and-set ([`Store::advance_schedule`]) only after the occurrence's task
//! exists, so an occurrence is never skipped by a leader dying in between. With
//! `overlap: "skip"` an occurrence whose previous task (`last_task`) has not ended is
//! skipped. A skipped occurrence still moves the mark. A paused schedule creates nothing,
//! and its mark moves to the time it is resumed ([`mark_on_write`]), so a pause is never
//! caught up.

use bson::oid::ObjectId;
use jiff::{SignedDuration, Timestamp};

use super::keys::by_key;
use crate::model::schedule::{date, key_time, timestamp, Timing};
use crate::model::{status, CatchUp, Overlap, Schedule};
use crate::store::{NewTask, ScheduleMark, ScheduleRecord, Store, StoreError, StoreResult};

/// How old an occurrence may be and still be created with `catch_up: "none"`.
pub const GRACE: SignedDuration = SignedDuration::from_secs(10);

/// The most occurrences one look walks through: past it (a mark far behind a frequent
/// schedule) those walked are skipped and the next look goes on from there.
pub const MAX_STEPS: usize = 100_000;

/// The most occurrences one look at a schedule creates: the rest wait for the next look
/// (the mark stops at the last created), so a schedule far behind holds up neither the
/// other schedules nor the leader's other duties for long.
pub const MOST_PER_LOOK: usize = 100;

/// The occurrences to handle at one look.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// The occurrences to create, oldest first.
    pub create: Vec<Timestamp>,
    /// The occurrences skipped by `catch_up`: from the first to the last of them (with
    /// `none`, the last may be the time up to which occurrences were skipped unseen).
    pub skipped: Option<(Timestamp, Timestamp)>,
    /// Where the mark goes once all is handled, when anything is due.
    pub newest: Option<Timestamp>,
}

/// The occurrences due at `now` after the mark `last`, by `catch_up`. The occurrences are
/// always walked forward from the mark (each the next one after the one before), so every
/// leader reading the same mark finds the same occurrences, across daylight-saving
/// changes too; with `none`, those more than [`GRACE`] old are skipped.
pub fn plan(timing: &Timing, catch_up: CatchUp, limit: i64, last: Timestamp, now: Timestamp) -> Plan {
    let keep = match catch_up {
        CatchUp::Last => 1,
        CatchUp::None | CatchUp::All => usize::try_from(limit.max(1)).unwrap_or(1),
    };
    // With `none`, occurrences at or before this are too old to create.
    let too_old = match catch_up {
        CatchUp::None => now.checked_sub(GRACE).unwrap_or(now),
        CatchUp::Last | CatchUp::All => last,
    };
    let mut skipped: Option<(Timestamp, Timestamp)> = None;
    let skip = |o: Timestamp, skipped: &mut Option<(Timestamp, Timestamp)>| {
        *skipped = Some((skipped.map_or(o, |(first, _)| first), o));
    };
    let mut due = std::collections::VecDeque::with_capacity(keep.min(1024));
    let mut at = last;
    let mut steps = 0;
    while let Some(o) = timing.next_after(at).filter(|o| *o <= now) {
        if o <= too_old {
            skip(o, &mut skipped);
        } else {
            if due.len() == keep {
                let dropped = due.pop_front().unwrap_or(o);
                skip(dropped, &mut skipped);
            }
            due.push_back(o);
        }
        at = o;
        steps += 1;
        if steps == MAX_STEPS {
            // Too far behind to walk at once: all walked is skipped, the next look goes on.
            let first = skipped.map_or(due.front().copied().unwrap_or(at), |(first, _)| first);
            return Plan {
                create: Vec::new(),
                skipped: Some((first, at)),
                newest: Some(at),
            };
        }
    }
    // The mark moves only when something was due or skipped: a look with nothing to do
    // writes nothing.
    let newest = (!due.is_empty() || skipped.is_some()).then_some(at);
    Plan {
        create: due.into(),
        skipped,
        newest,
    }
}

/// How the keys of the schedules' tasks begin: reserved for them (a task submitted with
/// such a key could stand for an occurrence to come).
pub const KEY_PREFIX: &str = "schedule:";

/// The key of the task of `schedule`'s occurrence at `at`.
pub fn occurrence_key(schedule: &str, at: Timestamp) -> String {
    format!("{KEY_PREFIX}{schedule}:{}", key_time(at))
}

/// What happened to one occurrence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Occurrence {
    /// Its task was created now.
    Created(Timestamp, ObjectId),
    /// Its task existed already (created by another leader, or before a restart).
    Existed(Timestamp, ObjectId),
    /// Skipped: the previous occurrence's task had not ended (`overlap: "skip"`).
    Overlapped(Timestamp),
}

/// What one look at a schedule did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Outcome {
    /// Each occurrence handled, oldest first.
    pub occurrences: Vec<Occurrence>,
    /// The occurrences skipped by `catch_up` (first and last).
    pub skipped: Option<(Timestamp, Timestamp)>,
    /// Another leader moved the mark first: this look stopped there.
    pub lost: bool,
}

/// Looks at one schedule at `now`: creates its due occurrences' tasks and moves its mark.
pub async fn run_schedule(
    store: &(impl Store + ?Sized),
    record: &ScheduleRecord,
    now: Timestamp,
) -> StoreResult<Outcome> {
    let s = &record.schedule;
    let mut outcome = Outcome::default();
    if s.paused {
        return Ok(outcome);
    }
    let timing = times(s)?;
    let last = timestamp(record.mark.last);
    let plan = plan(&timing, s.catch_up, s.catch_up_limit, last, now);
    outcome.skipped = plan.skipped;
    let mut mark = record.mark.clone();
    let more = plan.create.len() > MOST_PER_LOOK;
    for at in plan.create.into_iter().take(MOST_PER_LOOK) {
        let next = if s.overlap == Overlap::Skip && still_running(store, mark.task).await? {
            outcome.occurrences.push(Occurrence::Overlapped(at));
            ScheduleMark {
                last: date(at),
                task: mark.task,
            }
        } else {
            let (id, created) = create_occurrence(store, s, at).await?;
            outcome.occurrences.push(if created {
                Occurrence::Created(at, id)
            } else {
                Occurrence::Existed(at, id)
            });
            ScheduleMark {
                last: date(at),
                task: Some(id),
            }
        };
        if !store.advance_schedule(&s.name, mark.last, &next).await? {
            outcome.lost = true;
            return Ok(outcome);
        }
        mark = next;
    }
    // Only skipped occurrences (or some past the last created): the mark moves over them,
    // unless occurrences to create are left for the next look.
    if let Some(newest) = plan.newest.filter(|n| !more && date(*n) > mark.last) {
        let next = ScheduleMark {
            last: date(newest),
            task: mark.task,
        };
        outcome.lost = !store.advance_schedule(&s.name, mark.last, &next).await?;
    }
    Ok(outcome)
}

/// A stored schedule's times (checked when it was written; checked again, since another
/// tool may have written it).
fn times(s: &Schedule) -> StoreResult<Timing> {
    // `timing` refuses an expression that no longer fires; that is no error here.
    match s.timing(timestamp(s.anchor)) {
        Ok(t) => Ok(t),
        Err(e) => Err(StoreError::Invalid(format!("schedule {:?}: {e}", s.name))),
    }
}

/// Whether the task `id` exists and has not ended.
async fn still_running(store: &(impl Store + ?Sized), id: Option<ObjectId>) -> StoreResult<bool> {
    let Some(id) = id else { return Ok(false) };
    Ok(store
        .task(id)
        .await?
        .is_some_and(|t| status::UNENDED.contains(&t.status)))
}

/// Creates the task of `s`'s occurrence at `at` unless it exists: its id, and whether it
/// was created now.
async fn create_occurrence(
    store: &(impl Store + ?Sized),
    s: &Schedule,
    at: Timestamp,
) -> StoreResult<(ObjectId, bool)> {
    let key = occurrence_key(&s.name, at);
    let mut task = NewTask::queued(ObjectId::new(), s.params.clone());
    task.key = Some(key.clone());
    for _ in 0..3 {
        match store.insert_tasks(s.queue, vec![task.clone()]).await {
            Ok(()) => return Ok((task.id, true)),
            Err(StoreError::Duplicate { .. }) => {}
            Err(e) => return Err(e),
        }
        if let Some(existing) = by_key(store, Some(s.queue), &key).await?.into_iter().next() {
            return Ok((existing.id, false));
        }
        // Deleted between the insert and the read: insert it again.
    }
    Err(StoreError::Database(format!(
        "schedule {:?}: the task {key:?} kept changing",
        s.name
    )))
}

/// Every schedule looked at once at `now` ([`run_schedule`]), each on its own: the
/// outcome of each, by name, errors included, so one schedule's failure stops no other.
pub async fn run_schedules(
    store: &(impl Store + ?Sized),
    now: Timestamp,
) -> StoreResult<Vec<(String, StoreResult<Outcome>)>> {
    let mut out = Vec::new();
    let schedules = store.schedules().await?;
    if schedules.is_empty() {
        return Ok(out);
    }
    let mut queues: Vec<ObjectId> = store.queues().await?.iter().map(|q| q.id).collect();
    queues.extend(store.unreadable_queues().await?.iter().map(|q| q.id));
    for record in schedules {
        let result = if queues.contains(&record.schedule.queue) {
            run_schedule(store, &record, now).await
        } else {
            Err(StoreError::Invalid(format!(
                "schedule {:?}: its queue {} no longer exists; give it another queue or delete it",
                record.schedule.name, record.schedule.queue
            )))
        };
        out.push((record.schedule.name.clone(), result));
    }
    Ok(out)
}

/// The mark a schedule gets when it is written at `now`: a new one starts at `now` (no
/// occurrence before its creation); one resumed from a pause, whose times changed
/// (`cron`, `every`, `timezone`) or whose queue changed moves up to `now` (its pause, or
/// the old times, are not caught up, and no occurrence handled in the old queue is
/// created again in the new one); otherwise `None`: the stored mark stays.
pub fn mark_on_write(old: Option<&ScheduleRecord>, new: &Schedule, now: Timestamp) -> Option<ScheduleMark> {
    let Some(r) = old else {
        return Some(ScheduleMark {
            last: date(now),
            task: None,
        });
    };
    let o = &r.schedule;
    let resumed = o.paused && !new.paused;
    let retimed = (&o.cron, &o.every, &o.timezone, o.queue) != (&new.cron, &new.every, &new.timezone, new.queue);
    ((resumed || retimed) && r.mark.last < date(now)).then(|| ScheduleMark {
        last: date(now),
        task: r.mark.task,
    })
}

#[cfg(test)]
#[path = "schedules/tests.rs"]
mod tests;
