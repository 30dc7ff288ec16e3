//! Tasks with a key unique within their queue: submitting an existing key answers the
//! existing task, or re-submits it, CouchDB's way: a task still waiting takes the new
//! params, priority and time; a running one runs once more when this run ends; a finished
//! one is queued again with the new params.

use bson::oid::ObjectId;

use super::retry::{request_rerun, resubmit_waiting, retry_by_hand, HandRetry};
use crate::model::{status, Task};
use crate::store::{NewTask, Page, Store, StoreError, StoreResult, TaskFilter};

/// What [`insert_keyed`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Keyed {
    /// The key was new: the task was created.
    Created,
    /// The key was taken: this is the task that has it, unchanged.
    Existing(Task),
    /// The key was taken and the task submitted again (as it is after the change).
    Resubmitted(Task),
}

/// The reason recorded in `attempts` for a finished task submitted again.
pub use crate::model::RESUBMITTED;

/// The task of `queue` with `key`.
pub async fn by_key(s: &(impl Store + ?Sized), queue: Option<ObjectId>, key: &str) -> StoreResult<Vec<Task>> {
    let filter = TaskFilter {
        queue,
        key: Some(key.to_owned()),
        ..TaskFilter::default()
    };
    s.find_tasks(
        &filter,
        Page {
            skip: 0,
            limit: 10,
            oldest_first: false,
        },
    )
    .await
}

/// Inserts one task with a key ([`NewTask::key`]) unique within its queue. When the
/// key is taken, answers the task that has it, or with `resubmit` submits that task
/// again: one still waiting (queued or scheduled, unclaimed) takes the new params,
/// priority and `run_at`; a claimed or running one is marked to run once more when
/// this run ends ([`request_rerun`]); a finished one is queued again with the new params
/// ([`retry_by_hand`]); a held one is left as it is.
pub async fn insert_keyed(
    s: &(impl Store + ?Sized),
    queue: ObjectId,
    task: NewTask,
    resubmit: bool,
) -> StoreResult<Keyed> {
    let Some(key) = task.key.clone() else {
        return Err(StoreError::Invalid("insert_keyed needs a task with a key".into()));
    };
    match s.insert_tasks(queue, vec![task.clone()]).await {
        Ok(()) => return Ok(Keyed::Created),
        Err(StoreError::Duplicate { .. }) => {}
        Err(e) => return Err(e),
    }
    // The task changes state between the read and the fenced write at most a few times
    // (queued → running → finished); each pass reads it again.
    for _ in 0..5 {
        let Some(existing) = by_key(s, Some(queue), &key).await?.into_iter().next() else {
            // Deleted meanwhile: create it after all.
            match s.insert_tasks(queue, vec![task.clone()]).await {
                Ok(()) => return Ok(Keyed::Created),
                Err(StoreError::Duplicate { .. }) => continue,
                Err(e) => return Err(e),
            }
        };
        if !resubmit {
            return Ok(Keyed::Existing(existing));
        }
        let done = match existing.status {
            status::QUEUED | status::SCHEDULED if existing.node.is_none() => {
                resubmit_waiting(s, existing.id, existing.status, &task).await?
            }
            status::CLAIMED | status::RUNNING => request_rerun(s, existing.id).await?,
            code if status::finished(code) => {
                retry_by_hand(s, existing.id, RESUBMITTED, Some(&task)).await? == HandRetry::Queued
            }
            // Held (blocked, or a status of another tool): left as it is.
            _ => return Ok(Keyed::Existing(existing)),
        };
        if done {
            let now = s.task(existing.id).await?.unwrap_or(existing);
            return Ok(Keyed::Resubmitted(now));
        }
    }
    Err(StoreError::Database(format!(
        "task key {key:?}: the task kept changing while it was submitted again; try again"
    )))
}
