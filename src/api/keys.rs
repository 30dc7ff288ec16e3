//! Tasks with keys over HTTP: `POST /tasks` with `tasks: [{params, key}, …]` creates each
//! key once per queue (submitting it again answers the existing task, or with `resubmit:
//! true` submits it again), and `GET /tasks/{key}` finds a task by its key.

use bson::oid::ObjectId;
use serde_json::{json, Value};

use super::error::PartlyCreated;
use super::{ApiError, Shared};
use crate::lifecycle::keys::Keyed;
use crate::model::Task;
use crate::store::NewTask;

/// Creates `tasks` of `queue` in order, each keyed one on its own. Answers `{queue, count,
/// ids, created, existing, resubmitted}`: `ids` in the request's order (the existing
/// task's id for a key already taken), `existing` and `resubmitted` the ids of keys
/// already taken, left as they were or submitted again.
pub(super) async fn create_keyed(
    state: &Shared,
    queue: ObjectId,
    tasks: Vec<NewTask>,
    resubmit: bool,
) -> Result<Value, ApiError> {
    let total = tasks.len();
    let (mut ids, mut created, mut existing, mut again) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for task in tasks {
        let id = task.id;
        let done = if task.key.is_some() {
            crate::lifecycle::keys::insert_keyed(&*state.store, queue, task, resubmit).await
        } else {
            state
                .store
                .insert_tasks(queue, vec![task])
                .await
                .map(|()| Keyed::Created)
        };
        match done {
            Ok(Keyed::Created) => {
                ids.push(id);
                created.push(id);
            }
            Ok(Keyed::Existing(t)) => {
                ids.push(t.id);
                existing.push(t.id);
            }
            Ok(Keyed::Resubmitted(t)) => {
                ids.push(t.id);
                again.push(t.id);
            }
            Err(error) => {
                return Err(ApiError::PartlyCreated(Box::new(PartlyCreated {
                    error,
                    queue,
                    total,
                    created,
                    unconfirmed: vec![id],
                })))
            }
        }
    }
    let hex = |v: &[ObjectId]| v.iter().map(|i| i.to_hex()).collect::<Vec<_>>();
    Ok(json!({
        "queue": queue.to_hex(),
        "count": ids.len(),
        "ids": hex(&ids),
        "created": created.len(),
        "existing": hex(&existing),
        "resubmitted": hex(&again),
    }))
}

/// The task `GET /tasks/{key}` names: by id when it is one, else by key (within `queue`
/// when given). A key several queues use answers 409 listing them.
pub(super) async fn find(state: &Shared, key: &str, queue: Option<ObjectId>) -> Result<Task, ApiError> {
    if let Ok(id) = ObjectId::parse_str(key) {
        if let Some(t) = state.store.task(id).await? {
            return Ok(t);
        }
    }
    let found = crate::lifecycle::keys::by_key(state.store.as_ref(), queue, key).await?;
    match found.as_slice() {
        [] => Err(ApiError::NotFound(format!("no task with id or key {key:?}"))),
        [t] => Ok(t.clone()),
        many => Err(ApiError::Conflict(format!(
            "key {key:?} names tasks of several queues ({}): add ?queue=<queue id>",
            many.iter().map(|t| t.queue.to_hex()).collect::<Vec<_>>().join(", ")
        ))),
    }
}
