//! Inserting and finding task documents.

use bson::oid::ObjectId;
use bson::{doc, DateTime, Document};
use futures::TryStreamExt;

use super::documents::{task_filter_doc, task_or_problem};
use super::errors::{db_err, is_duplicate_key};
use super::MongoStore;
use crate::model::Task;
use crate::store::{Dependency, NewTask, Page, StoreError, StoreResult, TaskFilter};

/// [`Store::insert_tasks`](crate::store::Store::insert_tasks).
pub(super) async fn insert(store: &MongoStore, queue: ObjectId, tasks: Vec<NewTask>) -> StoreResult<()> {
    if tasks.is_empty() {
        return Ok(());
    }
    let now = DateTime::now();
    let keys: Vec<Option<String>> = tasks.iter().map(|t| t.key.clone()).collect();
    let docs = tasks.into_iter().map(|t| {
        let mut d = doc! {
            "_id": t.id,
            "queue": queue,
            "ctime": now,
            "mtime": now,
            "node": null,
            "status": t.initial_status(now),
            "priority": t.priority,
            "params": t.params,
            "stdout": null,
            "stderr": null,
        };
        if let Some(at) = t.run_at {
            d.insert("run_at", at);
        }
        if let Some(k) = &t.key {
            d.insert("key", k);
        }
        if let Some(b) = &t.batch {
            d.insert("batch", b);
        }
        if !t.after.is_empty() {
            let keys: Vec<String> = t.after.iter().map(Dependency::key).collect();
            d.insert("after", keys.clone());
            d.insert("pending", keys);
            if t.after_failure_runs {
                d.insert("after_failure", "run");
            }
        }
        if t.dependents {
            d.insert("dependents", true);
        }
        d
    });
    match store.tasks.insert_many(docs).await {
        Ok(_) => Ok(()),
        Err(e) => match key_clash(store, queue, &keys, &e).await? {
            Some(key) => Err(StoreError::Duplicate {
                what: "task key",
                name: key,
            }),
            None => Err(db_err("create tasks")(e)),
        },
    }
}

/// The key of the task whose insert failed with `e`, when `e` is a clash on that key: a
/// task of `queue` holds it (possibly the very task, inserted before by a write whose reply
/// was lost). A clash on an `_id` alone is not one.
async fn key_clash(
    store: &MongoStore,
    queue: ObjectId,
    keys: &[Option<String>],
    e: &mongodb::error::Error,
) -> StoreResult<Option<String>> {
    if !is_duplicate_key(e) {
        return Ok(None);
    }
    // An ordered insert stops at its first failure.
    let at = match e.kind.as_ref() {
        mongodb::error::ErrorKind::InsertMany(m) => m.write_errors.as_ref().and_then(|w| w.first()).map(|w| w.index),
        _ => Some(0),
    };
    let Some(Some(key)) = at.and_then(|i| keys.get(i)) else {
        return Ok(None);
    };
    let held = store
        .tasks
        .find_one(doc! { "queue": queue, "key": key })
        .projection(doc! { "_id": 1 })
        .await
        .map_err(db_err("create tasks"))?;
    Ok(held.map(|_| key.clone()))
}

/// [`Store::find_tasks`](crate::store::Store::find_tasks).
pub(super) async fn find(store: &MongoStore, filter: &TaskFilter, page: Page) -> StoreResult<Vec<Task>> {
    if page.limit == 0 {
        return Ok(Vec::new());
    }
    let limit = i64::try_from(page.limit).unwrap_or(i64::MAX);
    let docs: Vec<Document> = store
        .tasks
        .find(task_filter_doc(filter))
        .sort(doc! { "_id": if page.oldest_first { 1 } else { -1 } })
        .skip(page.skip)
        .limit(limit)
        .await
        .map_err(db_err("find tasks"))?
        .try_collect()
        .await
        .map_err(db_err("find tasks"))?;
    Ok(docs.iter().filter_map(task_or_problem).collect())
}
