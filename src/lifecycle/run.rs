//! A task's run on a DEN, and the actions on tasks that have not ended: start, progress,
//! scheduled tasks becoming due, cancel and kill requests. Each decides its fence and
//! change once ([`super::machine`]) and writes them through the store's fenced changes.

use bson::oid::ObjectId;
use bson::DateTime;

use super::machine;
use crate::model::{status, StopAction, StopRequest, TaskProgress};
use crate::store::{Store, StoreResult, TaskTarget};

/// Marks a task `node` claimed as running (0), fenced on `{_id, node, status: -1}`.
/// Idempotent: a task already running on `node` (a retry whose first reply was lost) also
/// answers true. False when the task is no longer `node`'s.
pub async fn start(store: &(impl Store + ?Sized), task: ObjectId, node: &str) -> StoreResult<bool> {
    let entry = [(task, machine::claimed_by(node), machine::start())];
    if store.change_tasks(&entry).await?[0] {
        return Ok(true);
    }
    // A retry after a lost reply: the first attempt applied.
    let now = store.task(task).await?;
    Ok(now.is_some_and(|t| t.status == status::RUNNING && t.node.as_deref() == Some(node)))
}

/// Stores a running task's latest progress, fenced on `{_id, node, status: 0}`. False
/// when the task is no longer running on `node`.
pub async fn report_progress(
    store: &(impl Store + ?Sized),
    task: ObjectId,
    node: &str,
    progress: &TaskProgress,
) -> StoreResult<bool> {
    let entry = [(task, machine::running_on(node), machine::progress(progress))];
    Ok(store.change_tasks(&entry).await?[0])
}

/// Queues (-7 → -2, mtime now) every scheduled task whose `run_at` is not after `now`.
/// Answers how many were queued.
pub async fn promote_due(store: &(impl Store + ?Sized), now: DateTime) -> StoreResult<u64> {
    let queued = store
        .change_where(TaskTarget::All, &machine::due(now), &machine::promote())
        .await?;
    Ok(queued.len() as u64)
}

/// Cancels tasks that have not started: those of `target` that wait (queued, scheduled or
/// blocked) unclaimed become cancelled (-5) with `stop` recorded. Answers the ids
/// cancelled (none when the task is claimed, running or ended). `stop` must be a cancel
/// request.
pub async fn cancel_tasks(
    store: &(impl Store + ?Sized),
    target: TaskTarget,
    stop: &StopRequest,
) -> StoreResult<Vec<ObjectId>> {
    stop.expect(StopAction::Cancel)?;
    store
        .change_where(target, &machine::cancellable(), &machine::cancel(stop))
        .await
}

/// Asks for running tasks to be killed: records `stop` on those of `target` that are
/// claimed (-1) or running (0) and not already asked. The DEN running each stops its
/// plugin ([`Store::kill_requests`]) and ends the task failed. Answers the ids asked.
/// `stop` must be a kill request.
pub async fn request_kill(
    store: &(impl Store + ?Sized),
    target: TaskTarget,
    stop: &StopRequest,
) -> StoreResult<Vec<ObjectId>> {
    stop.expect(StopAction::Kill)?;
    store
        .change_where(target, &machine::killable(), &machine::kill_request(stop))
        .await
}
