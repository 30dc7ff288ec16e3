//! Running a task again: after a failed run (its queue's `retry` policy), by hand once it
//! finished, when its key is submitted again while it waits or runs.

use bson::oid::ObjectId;
use bson::DateTime;

use super::machine;
use crate::model::{kept_output, status, Attempt, Output, RetryAt, Task};
use crate::store::{NewTask, StopIs, Store, StoreError, StoreResult, TaskFence};

/// The answer of [`retry_by_hand`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandRetry {
    /// Queued again.
    Queued,
    /// Not finished: still waiting or running, with this status.
    NotFinished(i32),
    /// No such task.
    NotFound,
}

/// Queues a finished task again by hand (succeeded, failed or any other positive status,
/// orphaned, cancelled or terminated): its last run becomes a record in `attempts` (with
/// `reason`, and its outputs: a file kept as is, a text's last 4 KiB), and it is queued
/// (-2, node null) with its outputs, progress and stop request cleared. Fenced on the
/// status and `mtime` read, so of two concurrent retries one wins.
///
/// With `replace`, the task also takes its params, priority and `run_at` (waiting as
/// scheduled when that is still to come): a finished task submitted again by key.
/// [`StoreError::Malformed`] when the task cannot be read.
pub async fn retry_by_hand(
    store: &(impl Store + ?Sized),
    task: ObjectId,
    reason: &str,
    replace: Option<&NewTask>,
) -> StoreResult<HandRetry> {
    let Some(t) = store.task(task).await? else {
        return Ok(HandRetry::NotFound);
    };
    if let Some(problem) = &t.problem {
        return Err(StoreError::Malformed {
            collection: "tasks",
            id: task.to_hex(),
            reason: problem.clone(),
        });
    }
    if !status::finished(t.status) {
        return Ok(HandRetry::NotFinished(t.status));
    }
    let change = machine::hand_retry(last_run(&t, reason), replace, DateTime::now());
    if store.change_tasks(&[(task, machine::as_read(&t), change)]).await?[0] {
        return Ok(HandRetry::Queued);
    }
    // Changed meanwhile (another retry won): say what it is now.
    Ok(match store.task(task).await? {
        None => HandRetry::NotFound,
        Some(now) => HandRetry::NotFinished(now.status),
    })
}

/// The record of a finished task's last run, kept when it is queued again by hand or by
/// key: its outputs as the file they are in, or the end of their text.
pub(crate) fn last_run(t: &Task, reason: &str) -> Attempt {
    let kept = |o: &Option<Output>| match o {
        Some(Output::Inline(s)) => kept_output(s),
        other => other.clone(),
    };
    Attempt {
        node: t.node.clone(),
        started: None,
        ended: t.mtime,
        status: t.status,
        reason: reason.to_owned(),
        stdout: kept(&t.stdout),
        stderr: kept(&t.stderr),
    }
}

/// Ends a failed run that its queue's `retry` policy runs again, fenced on `{_id, node,
/// status: 0}`: appends `retry.attempt` to `attempts`, and the task waits (-7, node null)
/// until `retry.run_at` — or is queued (-2) at once when that is not after now — at
/// `retry.priority`, left by `retry.avoid_node` to the others until `retry.avoid_until`.
/// Its outputs and progress are cleared. False when the task is no longer running on
/// `node`, or someone asked to kill it (it must not run again: the caller stores the
/// failure as its result) and `retry.after_kill` is not set.
pub async fn retry_later(
    store: &(impl Store + ?Sized),
    task: ObjectId,
    node: &str,
    retry: &RetryAt,
) -> StoreResult<bool> {
    let fence = retry_fence(node, retry);
    let entry = [(task, fence, machine::retry(retry, DateTime::now()))];
    Ok(store.change_tasks(&entry).await?[0])
}

/// The fence of [`retry_later`]: running on `node`, and not asked to kill unless the
/// policy retries kills.
fn retry_fence(node: &str, retry: &RetryAt) -> TaskFence {
    let running = machine::running_on(node);
    if retry.after_kill {
        running
    } else {
        running.stop(StopIs::NotKill)
    }
}

/// Gives a waiting task (`status` queued or scheduled, unclaimed) `task`'s params,
/// priority and `run_at`, and the status they mean now. False when it changed meanwhile.
pub async fn resubmit_waiting(
    store: &(impl Store + ?Sized),
    id: ObjectId,
    status: i32,
    task: &NewTask,
) -> StoreResult<bool> {
    let entry = [(
        id,
        machine::waiting_as(status),
        machine::resubmit(task, DateTime::now()),
    )];
    Ok(store.change_tasks(&entry).await?[0])
}

/// Marks a claimed or running task to run once more when its run ends (`rerun`): its
/// finish then queues it again, the run's record in `attempts`. False when it is no longer
/// claimed or running.
pub async fn request_rerun(store: &(impl Store + ?Sized), id: ObjectId) -> StoreResult<bool> {
    let entry = [(id, TaskFence::statuses(&status::BUSY), machine::rerun_request())];
    Ok(store.change_tasks(&entry).await?[0])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Attempt;

    #[test]
    fn a_kill_request_stops_a_retry_unless_the_policy_retries_kills() {
        let mut retry = RetryAt {
            attempt: Attempt {
                node: None,
                started: None,
                ended: DateTime::from_millis(0),
                status: status::FAILED,
                reason: String::new(),
                stdout: None,
                stderr: None,
            },
            run_at: DateTime::from_millis(0),
            priority: 0,
            avoid_node: "n".into(),
            avoid_until: DateTime::from_millis(0),
            after_kill: false,
        };
        assert_eq!(retry_fence("n", &retry).stop, StopIs::NotKill);
        retry.after_kill = true;
        assert_eq!(retry_fence("n", &retry).stop, StopIs::Any);
        assert_eq!(retry_fence("n", &retry).statuses, Some(vec![status::RUNNING]));
    }
}
