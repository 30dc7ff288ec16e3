//! Chains: a queue's `next_queue` turns each succeeded task's result into a task of that
//! queue. Its params are the JSON object the plugin printed as its last non-empty stdout
//! line; a last line that is other JSON, or not JSON, is given as `{"result": …}` (the
//! value, or the line as a string); no output gives `{}`.
//!
//! The follow-up is created before the task's result is written, keyed
//! `chain:<task id>` in the next queue and waiting for the task (`after`), so it exists
//! exactly once whatever happens to the write: a task run again (recovered, retried) meets
//! its existing follow-up, which is released when the task succeeds and cancelled when it
//! ends otherwise, like any dependent.

use bson::oid::ObjectId;
use bson::Document;

use crate::model::{Queue, Task};
use crate::store::{Dependency, NewTask, Store, StoreError, StoreResult};

/// The params of the follow-up of a task whose stdout is `stdout`.
pub(crate) fn follow_up_params(stdout: &str) -> Document {
    let Some(line) = stdout.lines().rev().map(str::trim).find(|l| !l.is_empty()) else {
        return Document::new();
    };
    match serde_json::from_str::<serde_json::Value>(line) {
        Ok(v @ serde_json::Value::Object(_)) => match bson::Bson::try_from(v) {
            Ok(bson::Bson::Document(d)) => d,
            _ => bson::doc! { "result": line },
        },
        Ok(other) => bson::Bson::try_from(other)
            .map(|b| bson::doc! { "result": b })
            .unwrap_or_else(|_| bson::doc! { "result": line }),
        Err(_) => bson::doc! { "result": line },
    }
}

/// The key of `task`'s follow-up in its next queue.
pub(crate) fn follow_up_key(task: ObjectId) -> String {
    format!("chain:{task}")
}

/// Creates (once) the follow-up of `task`, which succeeded with `stdout`, in `queue`'s
/// next queue, and marks `task` as waited for. Returns the follow-up's id.
pub(crate) async fn follow_up<S: Store + ?Sized>(
    store: &S,
    queue: &Queue,
    task: &Task,
    stdout: &str,
) -> StoreResult<Option<ObjectId>> {
    let Some(next) = &queue.next_queue else {
        return Ok(None);
    };
    let queues = store.queues().await?;
    let Some(target) = Queue::find(&queues, next) else {
        return Err(StoreError::Invalid(format!(
            "queue {:?} names next_queue {next:?}, which does not exist",
            queue.name
        )));
    };
    let new = NewTask {
        key: Some(follow_up_key(task.id)),
        after: vec![Dependency::Task(task.id)],
        ..NewTask::queued(ObjectId::new(), follow_up_params(stdout))
    };
    store.mark_dependents(&[Dependency::Task(task.id)]).await?;
    let id = match store.insert_keyed(target.id, new.clone(), false).await? {
        crate::store::Keyed::Created => new.id,
        crate::store::Keyed::Existing(t) | crate::store::Keyed::Resubmitted(t) => t.id,
    };
    Ok(Some(id))
}

#[cfg(test)]
mod tests {
    use super::follow_up_params;
    use bson::doc;

    #[test]
    fn the_last_line_becomes_the_params() {
        assert_eq!(follow_up_params("working\n{\"n\": 2}\n\n"), doc! {"n": 2});
        assert_eq!(follow_up_params("7\n"), doc! {"result": 7});
        assert_eq!(follow_up_params("[1, 2]"), doc! {"result": [1, 2]});
        assert_eq!(follow_up_params("done: ok"), doc! {"result": "done: ok"});
        assert_eq!(follow_up_params(""), doc! {});
    }
}
