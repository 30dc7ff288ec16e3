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
    // A keyed task is inserted alone, so a duplicate key names it.
    let keyed = tasks.len() == 1 && tasks[0].key.is_some();
    let first_key = tasks[0].key.clone();
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
    let key = keyed.then(|| first_key.unwrap_or_default());
    match store.tasks.insert_many(docs).await {
        Ok(_) => Ok(()),
        Err(e) if key.is_some() && is_duplicate_key(&e) => Err(StoreError::Duplicate {
            what: "task key",
            name: key.unwrap_or_default(),
        }),
        Err(e) => Err(db_err("create tasks")(e)),
    }
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
