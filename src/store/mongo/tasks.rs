//! Inserting and finding task documents.

use bson::oid::ObjectId;
use bson::{doc, DateTime, Document};
use futures::TryStreamExt;

use super::errors::{db_err, is_duplicate_key};
use super::records::{as_int, task_filter_doc, task_or_problem};
use super::MongoStore;
use crate::model::{Attempt, Task};
use crate::store::{Dependency, HeadFilter, HeadNode, NewTask, Page, StoreError, StoreResult, TaskFilter, TaskHead};

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

/// The filter of `filter`.
fn head_filter(filter: &HeadFilter) -> Document {
    let mut f = doc! { "status": { "$in": filter.statuses.clone() } };
    match &filter.node {
        HeadNode::Any => {}
        HeadNode::Is(n) => {
            f.insert("node", n.as_str());
        }
        HeadNode::NoneOf(names) => {
            f.insert("node", doc! { "$nin": names.clone() });
        }
    }
    if let Some(t) = filter.mtime_before {
        f.insert("mtime", doc! { "$lt": t });
    }
    f
}

/// A task document (projected to its head's fields) as a head; None without an `_id`.
fn head_from(d: &Document) -> Option<TaskHead> {
    Some(TaskHead {
        id: d.get_object_id("_id").ok()?,
        queue: d.get_object_id("queue").ok(),
        status: d.get("status").and_then(as_int).and_then(|s| i32::try_from(s).ok())?,
        node: d.get_str("node").ok().map(str::to_owned),
        mtime: d.get_datetime("mtime").ok().copied(),
        kill: d.get_document("stop").ok().and_then(|s| s.get_str("action").ok()) == Some("kill"),
        priority: d.get("priority").and_then(as_int).unwrap_or(0),
        attempts: Attempt::list_from(d.get("attempts")),
    })
}

/// [`Store::task_heads`](crate::store::Store::task_heads).
pub(super) async fn heads(store: &MongoStore, filter: &HeadFilter, limit: usize) -> StoreResult<Vec<TaskHead>> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let err = db_err("read task heads");
    let docs: Vec<Document> = store
        .tasks
        .find(head_filter(filter))
        .projection(
            doc! { "queue": 1, "status": 1, "node": 1, "mtime": 1, "stop.action": 1, "attempts": 1, "priority": 1 },
        )
        .limit(i64::try_from(limit).unwrap_or(i64::MAX))
        .await
        .map_err(&err)?
        .try_collect()
        .await
        .map_err(&err)?;
    Ok(docs.iter().filter_map(head_from).collect())
}
