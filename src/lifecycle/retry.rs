//! Running a task again: after a failed run (its queue's `retry` policy), when its key is
//! submitted again while it waits or runs.

use bson::oid::ObjectId;
use bson::DateTime;

use super::machine;
use crate::model::{status, RetryAt};
use crate::store::{NewTask, StopIs, Store, StoreResult, TaskFence};

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
