//! Dependencies between tasks: a task submitted `after` others (tasks, or batches) is
//! blocked (-4) until each has succeeded. Readiness is event-driven: the end of a task
//! or batch that blocked tasks wait for is *settled* — each task blocked on it is released
//! (queued once it waits for nothing more) or, when it did not succeed, cancelled naming
//! it, which in turn settles that task's own dependents.
//!
//! Who settles: the DEN that ends a task marked `dependents` (at once, after writing its
//! result), the DCI for what a new submission waits on that has already ended, and the
//! cluster's leader for every end left unsettled (a DEN that died between the two writes,
//! a task cancelled or orphaned, a parent that gained a dependent while it ran): it looks
//! for ended tasks still marked `dependents` through an index, never through the blocked
//! tasks. Settling is idempotent, so any of them may repeat another's work.
//!
//! What one end means for one blocked task (cancel it, keep it waiting, or release it with
//! the status its `run_at` calls for) is decided here, once ([`step`]); the store applies
//! it by compare-and-set on the task's `pending` list ([`Store::resolve_pending`]).

use bson::oid::ObjectId;
use bson::DateTime;

use crate::model::{status, StopAction, StopRequest, Task};
use crate::store::{due_status, Dependency, PendingChange, Resolved, StatusCounts, Store, StoreError, StoreResult};

/// How often a compare-and-set on `pending` is tried before it is left to the next settle.
const CAS_TRIES: usize = 64;

/// Blocked tasks read per page while settling one end.
const PAGE: usize = 500;

/// Ends settled per sweep of the leader.
pub const SWEEP: usize = 1000;

/// What a dependency came to once it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It succeeded: the tasks waiting for it may run.
    Met,
    /// It did not: why, for the `stop` of the tasks cancelled for it.
    Failed(String),
}

/// What settling did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settled {
    /// Tasks queued (or scheduled) because they waited for nothing more.
    pub released: u64,
    /// Tasks cancelled because something they waited for failed.
    pub cancelled: u64,
}

/// The outcome of a task that ended with `code`; None while it has not ended.
pub fn task_outcome(id: ObjectId, code: i32) -> Option<Outcome> {
    if code == status::SUCCEEDED {
        Some(Outcome::Met)
    } else if status::finished(code) {
        Some(Outcome::Failed(format!(
            "task {id} ended {} (status {code})",
            status::name(code)
        )))
    } else {
        None
    }
}

/// The outcome of `dep` as the store has it now; None while it has not ended. A task that
/// does not exist (deleted) has failed; a batch is complete once it has all its tasks (its
/// size, when it has one) and each has ended, and met when each succeeded.
pub async fn outcome<S: Store + ?Sized>(store: &S, dep: &Dependency) -> StoreResult<Option<Outcome>> {
    match dep {
        Dependency::Task(id) => Ok(match store.task(*id).await? {
            None => Some(Outcome::Failed(format!("task {id} does not exist"))),
            Some(t) => task_outcome(t.id, t.status),
        }),
        Dependency::Batch(b) => batch_outcome(store, b).await,
    }
}

async fn batch_outcome<S: Store + ?Sized>(store: &S, b: &str) -> StoreResult<Option<Outcome>> {
    let Some(batch) = store.batch(b).await? else {
        return Ok(Some(Outcome::Failed(format!("batch {b:?} does not exist"))));
    };
    if let Some(closed) = super::batches::closed_at(&batch) {
        return Ok(Some(Outcome::Failed(format!(
            "batch {b:?} was closed by retention at {closed} and its tasks deleted"
        ))));
    }
    let counts: StatusCounts = store.batch_counts(b).await?;
    if !super::batches::complete(&batch, &counts) {
        return Ok(None);
    }
    let total: u64 = counts.values().sum();
    let ok = counts.get(&status::SUCCEEDED).copied().unwrap_or(0);
    Ok(Some(if ok == total {
        Outcome::Met
    } else {
        Outcome::Failed(format!(
            "batch {b:?} completed with {} of its {total} tasks not succeeded",
            total - ok
        ))
    }))
}

/// Settles the end of `dep` (with `outcome`): releases or cancels every task blocked on
/// it, then the dependents of each task this cancels, and so on; clears `dependents` of
/// each end settled.
pub async fn settle<S: Store + ?Sized>(store: &S, dep: Dependency, outcome: Outcome) -> StoreResult<Settled> {
    let mut done = Settled::default();
    let mut work = vec![(dep, outcome)];
    while let Some((dep, outcome)) = work.pop() {
        let stop = match &outcome {
            Outcome::Met => None,
            Outcome::Failed(why) => Some(StopRequest::now(
                StopAction::Cancel,
                "disbatch",
                format!("waited for {dep}, which failed: {why}"),
            )),
        };
        loop {
            let blocked = store.blocked_on(&dep, PAGE).await?;
            let mut progress = false;
            for task in &blocked {
                match resolve(store, *task, &dep, stop.as_ref()).await? {
                    Resolved::Released => {
                        done.released += 1;
                        progress = true;
                    }
                    Resolved::Waiting | Resolved::Gone => progress = true,
                    Resolved::Cancelled { dependents, batch } => {
                        done.cancelled += 1;
                        progress = true;
                        if dependents {
                            work.push((
                                Dependency::Task(*task),
                                Outcome::Failed(format!("task {task} was cancelled")),
                            ));
                        }
                        if let Some(b) = batch {
                            if let Some(o) = waited_batch_outcome(store, &b).await? {
                                work.push((Dependency::Batch(b), o));
                            }
                        }
                    }
                }
            }
            if blocked.len() < PAGE || !progress {
                break;
            }
        }
        store.settled(&dep).await?;
    }
    Ok(done)
}

/// What resolving `key` does to blocked task `t` at `now`; `failed` is the `stop` of a
/// cancel when what it waited for failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Cancel it: what it waited for failed, and it does not run anyway.
    Cancel,
    /// Take `key` off its list: it waits for more.
    Met,
    /// Release it with this status: it waits for nothing more (this was the last, or an
    /// earlier release was cut short).
    Release(i32),
    /// Nothing: it no longer waits for `key` (resolved before) but for others.
    Nothing,
}

/// The decision for blocked task `t` once `key` ended, failed or not (see [`Step`]). A task
/// that runs anyway (`after_failure: "run"`) takes a failure as met.
pub fn step(t: &Task, key: &str, failed: bool, now: DateTime) -> Step {
    let waits = t.pending.iter().any(|p| p == key);
    if failed && !t.after_failure_runs && waits {
        return Step::Cancel;
    }
    let others = t.pending.iter().any(|p| p != key);
    match (waits, others) {
        (true, true) => Step::Met,
        (false, true) => Step::Nothing,
        (_, false) => Step::Release(due_status(t.run_at, now)),
    }
}

/// Resolves what blocked task `task` waits for, now that `dep` ended: it succeeded
/// (`failed` is None), or it did not and `task` is cancelled with `failed` as its `stop` —
/// unless `task` runs anyway, which resolves it as met. A task left waiting for nothing is
/// queued (scheduled when its `run_at` is to come). Each write is a compare-and-set on the
/// task's `pending` list as read, tried again on a conflict: of two dependencies resolved
/// at once, neither is lost.
pub async fn resolve<S: Store + ?Sized>(
    store: &S,
    task: ObjectId,
    dep: &Dependency,
    failed: Option<&StopRequest>,
) -> StoreResult<Resolved> {
    let key = dep.key();
    for _ in 0..CAS_TRIES {
        let Some(t) = store.task(task).await?.filter(|t| t.status == status::BLOCKED) else {
            return Ok(Resolved::Gone);
        };
        let (change, resolved) = match (step(&t, &key, failed.is_some(), DateTime::now()), failed) {
            (Step::Cancel, Some(stop)) => (
                PendingChange::Stop(status::CANCELLED, stop),
                Resolved::Cancelled {
                    dependents: t.dependents,
                    batch: t.batch.clone(),
                },
            ),
            (Step::Met, _) => (PendingChange::Met(dep), Resolved::Waiting),
            (Step::Release(due), _) => (PendingChange::Release(due), Resolved::Released),
            (Step::Nothing | Step::Cancel, _) => return Ok(Resolved::Gone),
        };
        if store.resolve_pending(task, &t.pending, change).await? {
            return Ok(resolved);
        }
    }
    // Others kept changing the list: an error, so the end is not marked settled and the
    // next settle (the leader's sweep) tries again.
    Err(StoreError::Database(format!(
        "task {task}: its list of what it waits for kept changing; {key} is resolved later"
    )))
}

/// The outcome of batch `b` when tasks wait for it (marked, or blocked on it: a mark
/// cleared by a settle that raced with the batch gaining tasks) and it is complete.
async fn waited_batch_outcome<S: Store + ?Sized>(store: &S, b: &str) -> StoreResult<Option<Outcome>> {
    let dep = Dependency::Batch(b.to_string());
    match store.batch(b).await? {
        Some(batch) if batch.dependents || !store.blocked_on(&dep, 1).await?.is_empty() => {
            batch_outcome(store, b).await
        }
        _ => Ok(None),
    }
}

/// Settles what a task's end means for the tasks waiting on it: called by the DEN that
/// wrote task `id`'s result. `dependents` is the task's mark as claimed; `batch` its
/// batch, whose completion this end may bring. The status is read back, not taken from
/// the result: a task submitted again while it ran was queued once more instead.
pub async fn task_ended<S: Store + ?Sized>(
    store: &S,
    id: ObjectId,
    dependents: bool,
    batch: Option<&str>,
) -> StoreResult<Settled> {
    let mut done = Settled::default();
    if dependents {
        if let Some(o) = outcome(store, &Dependency::Task(id)).await? {
            done = settle(store, Dependency::Task(id), o).await?;
        }
    }
    if let Some(b) = batch {
        if let Some(o) = waited_batch_outcome(store, b).await? {
            let more = settle(store, Dependency::Batch(b.to_string()), o).await?;
            done.released += more.released;
            done.cancelled += more.cancelled;
        }
    }
    Ok(done)
}

/// Marks what new blocked tasks wait for (`deps`: tasks and batches that existed before
/// them) and settles those that have already ended, so a task submitted after its parent
/// finished is released (or cancelled) at once. The mark comes first: a parent that ends
/// after it is settled by whoever ends it.
pub async fn submitted<S: Store + ?Sized>(store: &S, deps: &[Dependency]) -> StoreResult<Settled> {
    let mut done = Settled::default();
    if deps.is_empty() {
        return Ok(done);
    }
    store.mark_dependents(deps).await?;
    for dep in deps {
        if let Some(o) = outcome(store, dep).await? {
            let more = settle(store, dep.clone(), o).await?;
            done.released += more.released;
            done.cancelled += more.cancelled;
        }
    }
    Ok(done)
}

/// The leader's sweep: settles ends left unsettled (see the module). An end that fails
/// to settle is left for the next sweep; the others are settled all the same.
pub async fn sweep<S: Store + ?Sized>(store: &S) -> StoreResult<Settled> {
    let mut done = Settled::default();
    let mut failed = None;
    for dep in store.unsettled(SWEEP).await? {
        let settled = match outcome(store, &dep).await {
            Ok(Some(o)) => settle(store, dep, o).await,
            Ok(None) => Ok(Settled::default()),
            Err(e) => Err(e),
        };
        match settled {
            Ok(more) => {
                done.released += more.released;
                done.cancelled += more.cancelled;
            }
            Err(e) => failed = Some(e),
        }
    }
    match failed {
        Some(e) if done.released + done.cancelled == 0 => Err(e),
        _ => Ok(done),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::oid::ObjectId;

    fn blocked(pending: &[&str], runs_anyway: bool, run_at: Option<i64>) -> Task {
        let now = DateTime::from_millis(0);
        Task {
            id: ObjectId::new(),
            queue: ObjectId::new(),
            ctime: now,
            mtime: now,
            node: None,
            status: status::BLOCKED,
            params: bson::Document::new(),
            stdout: None,
            stderr: None,
            problem: None,
            run_at: run_at.map(DateTime::from_millis),
            started: None,
            priority: Some(0),
            stop: None,
            progress: None,
            attempts: Vec::new(),
            attempts_dropped: 0,
            key: None,
            batch: None,
            rerun: false,
            after: pending.iter().map(|p| p.to_string()).collect(),
            pending: pending.iter().map(|p| p.to_string()).collect(),
            after_failure_runs: runs_anyway,
            dependents: false,
        }
    }

    #[test]
    fn a_blocked_task_is_cancelled_kept_waiting_or_released() {
        let now = DateTime::from_millis(1_000);
        let t = blocked(&["a", "b"], false, None);
        assert_eq!(step(&t, "a", true, now), Step::Cancel, "what it waits for failed");
        assert_eq!(step(&t, "a", false, now), Step::Met, "it waits for b still");
        assert_eq!(step(&t, "c", true, now), Step::Nothing, "not waiting for c");
        let anyway = blocked(&["a"], true, None);
        assert_eq!(
            step(&anyway, "a", true, now),
            Step::Release(status::QUEUED),
            "runs anyway"
        );
        let later = blocked(&["a"], false, Some(2_000));
        assert_eq!(step(&later, "a", false, now), Step::Release(status::SCHEDULED));
        let due = blocked(&["a"], false, Some(1_000));
        assert_eq!(step(&due, "a", false, now), Step::Release(status::QUEUED));
        assert_eq!(
            step(&blocked(&[], false, None), "a", true, now),
            Step::Release(status::QUEUED),
            "a release cut short is finished"
        );
    }
}
