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
//!
//! The follow-ups a plugin submitted through the `submit` host import are created the
//! same way, when the task succeeded: keyed `submit:<task id>:<n>` (n the 0-based index of
//! the accepted call) in the queue each names, waiting for the task. A queue that does not
//! exist (any more) is a permanent error: the worker fails the task with it.
//!
//! Lineage: the key also records how deep a follow-up is in its lineage (see [`depth`]). A
//! task submitted through the API is at depth 0; a follow-up a plugin submitted is one
//! deeper than its parent, a chain's follow-up as deep as its parent (a chain makes one
//! task of one, it cannot multiply them). The runner refuses a `submit` past the queue's
//! `sandbox.submit_depth`, so a queue granted `submit` to itself, or a cycle of grants
//! (through chains too), stops growing there.

use bson::oid::ObjectId;
use bson::Document;

use crate::lifecycle::keys::{insert_keyed, Keyed};
use crate::model::{Queue, Task};
use crate::runner::Submission;
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

/// The key of `task`'s follow-up in its next queue, `task` being at `depth` (carried on
/// when it is not 0).
pub(crate) fn follow_up_key(task: ObjectId, depth: u32) -> String {
    match depth {
        0 => format!("chain:{task}"),
        d => format!("chain:{task}:{d}"),
    }
}

/// The depth in its lineage of follow-ups of a task keyed `key`: `submit:<parent>:<n>`
/// is at depth 1, `submit:<parent>:<n>:<depth>` and `chain:<parent>:<depth>` at `depth`;
/// any other task (submitted through the API, `chain:<parent>`) at 0. Disbatch 4 readers
/// ignore keys.
pub(crate) fn depth(key: Option<&str>) -> u32 {
    let Some(key) = key else { return 0 };
    let (rest, first) = if let Some(rest) = key.strip_prefix("submit:") {
        (rest, 1)
    } else if let Some(rest) = key.strip_prefix("chain:") {
        (rest, 0)
    } else {
        return 0;
    };
    let parts: Vec<&str> = rest.split(':').collect();
    let given = if first == 1 { parts.get(2) } else { parts.get(1) };
    given.and_then(|d| d.parse().ok()).unwrap_or(first)
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
    store.mark_dependents(&[Dependency::Task(task.id)]).await?;
    let id = create_after(
        store,
        target.id,
        task.id,
        follow_up_key(task.id, depth(task.key.as_deref())),
        follow_up_params(stdout),
    )
    .await?;
    Ok(Some(id))
}

/// The key of the follow-up `task` submitted in its `n`-th accepted `submit` call, the
/// follow-up being at `depth` (left out when 1).
pub(crate) fn submitted_key(task: ObjectId, n: usize, depth: u32) -> String {
    match depth {
        1 => format!("submit:{task}:{n}"),
        d => format!("submit:{task}:{n}:{d}"),
    }
}

/// Creates (once each) the follow-ups `task`, which succeeded, submitted, in call order,
/// and marks `task` as waited for. A queue that does not exist ends it with
/// [`StoreError::Invalid`] naming the queue; the follow-ups created before it stay, waiting
/// for `task`, and are cancelled when it ends failed.
pub(crate) async fn submitted<S: Store + ?Sized>(store: &S, task: &Task, submitted: &[Submission]) -> StoreResult<()> {
    if submitted.is_empty() {
        return Ok(());
    }
    let queues = store.queues().await?;
    store.mark_dependents(&[Dependency::Task(task.id)]).await?;
    let below = depth(task.key.as_deref()).saturating_add(1);
    for (n, s) in submitted.iter().enumerate() {
        let Some(target) = Queue::find(&queues, &s.queue) else {
            return Err(StoreError::Invalid(format!(
                "follow-up {n} names queue {:?}, which does not exist (retrying cannot help; create the queue or change sandbox.submit)",
                s.queue
            )));
        };
        let params = match bson::Bson::try_from(serde_json::Value::Object(s.params.clone())) {
            Ok(bson::Bson::Document(d)) => d,
            _ => {
                return Err(StoreError::Invalid(format!(
                    "follow-up {n} to queue {:?} has params that cannot be stored",
                    s.queue
                )))
            }
        };
        create_after(store, target.id, task.id, submitted_key(task.id, n, below), params).await?;
    }
    Ok(())
}

/// Creates, unless a task keyed `key` already exists in queue `target`, a task of `target`
/// with `params` waiting for `parent`; returns the id of the task that has the key.
async fn create_after<S: Store + ?Sized>(
    store: &S,
    target: ObjectId,
    parent: ObjectId,
    key: String,
    params: Document,
) -> StoreResult<ObjectId> {
    let new = NewTask {
        key: Some(key),
        after: vec![Dependency::Task(parent)],
        ..NewTask::queued(ObjectId::new(), params)
    };
    Ok(match insert_keyed(store, target, new.clone(), false).await? {
        Keyed::Created => new.id,
        Keyed::Existing(t) | Keyed::Resubmitted(t) => t.id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn the_last_line_becomes_the_params() {
        assert_eq!(follow_up_params("working\n{\"n\": 2}\n\n"), doc! {"n": 2});
        assert_eq!(follow_up_params("7\n"), doc! {"result": 7});
        assert_eq!(follow_up_params("[1, 2]"), doc! {"result": [1, 2]});
        assert_eq!(follow_up_params("done: ok"), doc! {"result": "done: ok"});
        assert_eq!(follow_up_params(""), doc! {});
    }

    #[test]
    fn the_key_records_the_depth() {
        let parent = ObjectId::new();
        let at = |key: Option<String>| depth(key.as_deref());
        assert_eq!(at(None), 0);
        assert_eq!(at(Some("mine".into())), 0);
        assert_eq!(at(Some(follow_up_key(parent, 0))), 0);
        assert_eq!(at(Some(follow_up_key(parent, 4))), 4);
        assert_eq!(at(Some(submitted_key(parent, 3, 1))), 1);
        assert_eq!(at(Some(submitted_key(parent, 3, 7))), 7);
    }

    #[tokio::test]
    async fn submitted_follow_ups_are_created_once_each() {
        use crate::store::{NewQueue, Page, TaskFilter};
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::sqlite::SqliteStore::open(dir.path().join("s.db"))
            .await
            .unwrap();
        let queue = |name: &str| NewQueue {
            name: name.into(),
            plugin: "submit".into(),
            threads: None,
            sort: Default::default(),
            extra: Document::new(),
        };
        let a = store.create_queue(queue("a")).await.unwrap();
        let b = store.create_queue(queue("b")).await.unwrap();
        let parent = NewTask::queued(ObjectId::new(), doc! {});
        store.insert_tasks(a.id, vec![parent.clone()]).await.unwrap();
        let task = store.task(parent.id).await.unwrap().unwrap();
        let params = |n: i32| serde_json::json!({ "n": n }).as_object().unwrap().clone();
        let subs = [
            Submission {
                queue: "b".into(),
                params: params(0),
            },
            Submission {
                queue: b.id.to_hex(),
                params: params(1),
            },
        ];
        submitted(&store, &task, &subs).await.unwrap();
        // A rerun (the DEN died before the finish write) meets the first run's follow-ups.
        submitted(&store, &task, &subs).await.unwrap();
        let filter = TaskFilter {
            queue: Some(b.id),
            ..TaskFilter::default()
        };
        let page = Page {
            skip: 0,
            limit: 10,
            oldest_first: true,
        };
        let found = store.find_tasks(&filter, page).await.unwrap();
        let keys: Vec<_> = found
            .iter()
            .map(|t| (t.key.clone().unwrap(), t.params.clone()))
            .collect();
        assert_eq!(
            keys,
            vec![
                (submitted_key(task.id, 0, 1), doc! {"n": 0}),
                (submitted_key(task.id, 1, 1), doc! {"n": 1})
            ]
        );
        let gone = [Submission {
            queue: "gone".into(),
            params: params(2),
        }];
        match submitted(&store, &task, &gone).await {
            Err(StoreError::Invalid(m)) => assert!(m.contains("names queue \"gone\", which does not exist"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
