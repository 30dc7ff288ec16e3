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

use bson::oid::ObjectId;

use super::{Dependency, Resolved, Store, StoreResult, TaskFilter};
use crate::model::{status, StopAction, StopRequest};

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
    let open = TaskFilter {
        batch: Some(b.to_string()),
        status: Some(status::UNENDED.to_vec()),
        ..TaskFilter::default()
    };
    if store.count_tasks(&open).await? > 0 {
        return Ok(None);
    }
    let counts = store.batch_counts(b).await?;
    let total: u64 = counts.values().sum();
    if total == 0 || batch.size.is_some_and(|s| total < u64::try_from(s).unwrap_or(0)) {
        return Ok(None);
    }
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
                match store.resolve_dependency(*task, &dep, stop.as_ref()).await? {
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
