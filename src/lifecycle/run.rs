//! A task's run on a DEN, and the actions on tasks that have not ended: start, progress,
//! the end of a run (finish or rerun), requeue at shutdown, scheduled tasks becoming due,
//! cancel and kill requests. Each decides its fence and change once ([`super::machine`])
//! and writes them through the store's fenced changes.

use bson::oid::ObjectId;
use bson::DateTime;

use super::machine;
use crate::model::{kept_output, status, Attempt, Output, Queue, StopAction, StopRequest, Task, TaskProgress};
use crate::store::{OutputValue, Store, StoreResult, TaskChange, TaskFence, TaskTarget};

/// What the end of a run stores beside the result ([`finish_with`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FinishExtra {
    /// The plugin's last progress report.
    pub progress: Option<TaskProgress>,
    /// The run's record, appended to `attempts` (for a task of a queue with a `retry`
    /// policy, or one retried before).
    pub attempt: Option<Attempt>,
}

/// Marks a task `node` claimed as running (0), fenced on `{_id, node, status: -1}`.
/// Idempotent: a task already running on `node` (a retry whose first reply was lost) also
/// answers true. False when the task is no longer `node`'s.
pub async fn start(store: &(impl Store + ?Sized), task: ObjectId, node: &str) -> StoreResult<bool> {
    start_with(store, task, node, None).await
}

/// [`start`] of a task of a rate-limited queue, writing `started` = `at` (the time of the
/// rate grant it starts under: `lifecycle::rate`) in the same write.
pub async fn start_at(store: &(impl Store + ?Sized), task: ObjectId, node: &str, at: DateTime) -> StoreResult<bool> {
    start_with(store, task, node, Some(at)).await
}

/// [`start`], writing `started` when given.
async fn start_with(
    store: &(impl Store + ?Sized),
    task: ObjectId,
    node: &str,
    started: Option<DateTime>,
) -> StoreResult<bool> {
    let change = TaskChange {
        started,
        ..machine::start()
    };
    let entry = [(task, machine::claimed_by(node), change)];
    if store.change_tasks(&entry).await?[0] {
        return Ok(true);
    }
    // A retry after a lost reply: the first attempt applied.
    let now = store.task(task).await?;
    Ok(now.is_some_and(|t| t.status == status::RUNNING && t.node.as_deref() == Some(node)))
}

/// Records `at` as the `started` of `task`, which the store claimed and started in one
/// write for `node` (a rate-limited queue's task: `at` is its grant's time). Whether the
/// task is still running on `node`.
pub async fn record_started(
    store: &(impl Store + ?Sized),
    task: ObjectId,
    node: &str,
    at: DateTime,
) -> StoreResult<bool> {
    let change = TaskChange {
        started: Some(at),
        ..TaskChange::default()
    };
    Ok(store.change_tasks(&[(task, machine::running_on(node), change)]).await?[0])
}

/// [`finish_with`] without extras.
pub async fn finish(
    store: &(impl Store + ?Sized),
    task: ObjectId,
    node: &str,
    code: i32,
    stdout: OutputValue,
    stderr: OutputValue,
) -> StoreResult<bool> {
    finish_with(store, task, node, code, stdout, stderr, &FinishExtra::default()).await
}

/// Ends a run of `task` on `node` with status `code` and its outputs (each inline text, or
/// an output file [`Store::put_output_file`] wrote before: a task never points at a
/// missing file), storing `extra` in the same write; fenced on `{_id, node, status: 0}`.
/// A task marked to run once more ([`super::retry::request_rerun`]) is queued again instead (-2,
/// node null, outputs and progress cleared) with the run's record — its outputs as a file
/// or the end of the text — appended; unless someone asked to kill it, then it ends here.
/// False, with nothing written, when the task is no longer running on `node` (recovered
/// meanwhile).
///
/// Two fenced attempts: the first is the end of a run nobody submitted again (one write
/// for almost every run); the second, one of the other two ends (killed, or run once
/// more), whose fences exclude each other.
pub async fn finish_with(
    store: &(impl Store + ?Sized),
    task: ObjectId,
    node: &str,
    code: i32,
    stdout: OutputValue,
    stderr: OutputValue,
    extra: &FinishExtra,
) -> StoreResult<bool> {
    let plain = plain_end(task, node, code, &stdout, &stderr, extra);
    end_from(store, plain, node, code, (&stdout, &stderr), extra).await
}

/// [`finish_with`] with its plain end already built.
async fn end_from(
    store: &(impl Store + ?Sized),
    plain: (ObjectId, TaskFence, TaskChange),
    node: &str,
    code: i32,
    outputs: (&OutputValue, &OutputValue),
    extra: &FinishExtra,
) -> StoreResult<bool> {
    let task = plain.0;
    if store.change_tasks(&[plain]).await?[0] {
        return Ok(true);
    }
    other_end(store, task, node, code, outputs, extra).await
}

/// [`finish_with`], and with it the same worker's next claim where the store writes both in
/// one transaction ([`Store::finish_and_claim`]): [`Store::claim_before`] of `queue` with
/// `until`, made when the run ended plainly (the first of [`finish_with`]'s attempts
/// applied), or made beside an end that did not. Answers whether the run's end was written,
/// and that claim: `None` when none was made (the store does not offer it, or the run did
/// not end plainly and nothing was claimed), for the caller to claim apart.
#[allow(clippy::too_many_arguments)]
pub async fn finish_and_claim(
    store: &(impl Store + ?Sized),
    task: ObjectId,
    node: &str,
    code: i32,
    (stdout, stderr): (OutputValue, OutputValue),
    extra: &FinishExtra,
    (queue, until): (&Queue, DateTime),
) -> StoreResult<(bool, Option<StoreResult<Option<Task>>>)> {
    let plain = plain_end(task, node, code, &stdout, &stderr, extra);
    match store.finish_and_claim(&plain, queue, node, until).await? {
        None => Ok((
            end_from(store, plain, node, code, (&stdout, &stderr), extra).await?,
            None,
        )),
        Some(done) if done.ended => Ok((true, Some(done.claimed))),
        Some(done) => {
            let ended = match other_end(store, task, node, code, (&stdout, &stderr), extra).await {
                Ok(ended) => ended,
                Err(e) => {
                    // The worker learns only of the error: a task claimed beside the end goes
                    // back to its queue now (fenced on this node's claim).
                    if let Ok(Some(t)) = &done.claimed {
                        let _ = requeue_own(store, node, &[t.id]).await;
                    }
                    return Err(e);
                }
            };
            // A task claimed beside an end that did not apply plainly (a store that makes
            // both in one command whatever the end's fence found) is the worker's all the
            // same; with none claimed, the worker claims apart.
            let claimed = match done.claimed {
                Ok(None) => None,
                made => Some(made),
            };
            Ok((ended, claimed))
        }
    }
}

/// The end of a run nobody submitted again, fenced on `{_id, node, status: 0}` and no rerun
/// asked: [`finish_with`]'s first attempt.
fn plain_end(
    task: ObjectId,
    node: &str,
    code: i32,
    stdout: &OutputValue,
    stderr: &OutputValue,
    extra: &FinishExtra,
) -> (ObjectId, TaskFence, TaskChange) {
    let done = machine::finish(code, stdout, stderr, extra.progress.as_ref(), extra.attempt.as_ref());
    (task, machine::ends_plainly(node), done)
}

/// [`finish_with`]'s second attempt, after the plain end's fence did not hold: the end of a
/// run someone asked to kill, or of one to run once more; their fences exclude each other.
async fn other_end(
    store: &(impl Store + ?Sized),
    task: ObjectId,
    node: &str,
    code: i32,
    (stdout, stderr): (&OutputValue, &OutputValue),
    extra: &FinishExtra,
) -> StoreResult<bool> {
    let done = machine::finish(code, stdout, stderr, extra.progress.as_ref(), extra.attempt.as_ref());
    let record = rerun_record(node, code, stdout, stderr, extra);
    let other = [
        (task, machine::ends_killed(node), done),
        (task, machine::ends_for_rerun(node), machine::rerun_requeue(record)),
    ];
    Ok(store.change_tasks(&other).await?.contains(&true))
}

/// Puts `tasks` that `node` claimed or runs back in their queue (-2, node null), for a
/// graceful shutdown or claims it will not run. Answers the ids requeued. A task someone
/// asked to kill is not put back: it ends failed (2) with
/// [`KILLED_AT_SHUTDOWN`](super::machine::KILLED_AT_SHUTDOWN) as stderr. Tasks no longer
/// `node`'s are left alone. One [`Store::change_tasks`] call: two entries per task, whose
/// fences exclude each other.
pub async fn requeue_own(store: &(impl Store + ?Sized), node: &str, tasks: &[ObjectId]) -> StoreResult<Vec<ObjectId>> {
    if tasks.is_empty() {
        return Ok(Vec::new());
    }
    let entries: Vec<_> = tasks
        .iter()
        .flat_map(|&id| {
            [
                (id, machine::own_unasked(node), machine::requeue()),
                (id, machine::own_asked_to_kill(node), machine::fail_killed_at_shutdown()),
            ]
        })
        .collect();
    let done = store.change_tasks(&entries).await?;
    Ok(tasks
        .iter()
        .zip(done.chunks(2))
        .filter(|(_, d)| d[0])
        .map(|(id, _)| *id)
        .collect())
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

/// The record of a run that ends while its task was submitted again (it runs once more):
/// its outputs as the files they were written to, or the end of their text.
fn rerun_record(node: &str, status: i32, stdout: &OutputValue, stderr: &OutputValue, extra: &FinishExtra) -> Attempt {
    let kept = |o: &OutputValue| match o {
        OutputValue::Inline(s) => kept_output(s),
        OutputValue::File(id) => Some(Output::File(*id)),
    };
    let base = extra.attempt.clone().unwrap_or(Attempt {
        node: Some(node.to_owned()),
        started: None,
        ended: DateTime::now(),
        status,
        reason: String::new(),
        stdout: None,
        stderr: None,
    });
    Attempt {
        reason: if base.reason.is_empty() {
            "submitted again while it ran: it runs once more".to_owned()
        } else {
            format!("{}; submitted again while it ran: it runs once more", base.reason)
        },
        stdout: kept(stdout),
        stderr: kept(stderr),
        ..base
    }
}
