//! Dependencies on MongoDB: a blocked task (-4) keeps what it was submitted `after` (task
//! ids in hex, `batch:<id>`) and, in `pending`, what it still waits for; the `{pending}`
//! index finds the tasks blocked on one of them. A task or batch that blocked tasks wait
//! for carries `dependents: true` until its end has been settled (the `{dependents}` index
//! finds those left unsettled by a DEN that died). Resolving a dependency is one
//! compare-and-set on the task's `pending` list ([`resolve_pending`]), so two parents
//! ending at once never both leave it blocked.

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use futures::TryStreamExt;

use super::{batches::BATCHES, db_err, MongoStore};
use crate::model::status;
use crate::store::{Dependency, PendingChange, StoreResult};

/// The statuses of an ended task, as a query on `status`.
pub(super) fn ended() -> Document {
    doc! { "$or": [
        { "status": { "$gt": 0 } },
        { "status": { "$in": status::ENDED_HELD.to_vec() } },
    ] }
}

impl MongoStore {
    /// [`Store::mark_dependents`](crate::store::Store::mark_dependents).
    pub(super) async fn mark_dependents(&self, deps: &[Dependency]) -> StoreResult<()> {
        let err = db_err("mark tasks waited for");
        let (mut tasks, mut batches) = (Vec::new(), Vec::new());
        for d in deps {
            match d {
                Dependency::Task(id) => tasks.push(Bson::ObjectId(*id)),
                Dependency::Batch(b) => batches.push(Bson::String(b.clone())),
            }
        }
        let set = doc! { "$set": { "dependents": true } };
        if !tasks.is_empty() {
            self.tasks
                .update_many(doc! { "_id": { "$in": tasks } }, set.clone())
                .await
                .map_err(&err)?;
        }
        if !batches.is_empty() {
            self.db
                .collection::<Document>(BATCHES)
                .update_many(doc! { "_id": { "$in": batches } }, set)
                .await
                .map_err(&err)?;
        }
        Ok(())
    }

    /// [`Store::blocked_on`](crate::store::Store::blocked_on).
    pub(super) async fn blocked_on(&self, dep: &Dependency, limit: usize) -> StoreResult<Vec<ObjectId>> {
        let err = db_err("find tasks blocked on another");
        let docs: Vec<Document> = self
            .tasks
            .find(doc! { "pending": dep.key(), "status": status::BLOCKED })
            .projection(doc! { "_id": 1 })
            .limit(i64::try_from(limit).unwrap_or(i64::MAX))
            .await
            .map_err(&err)?
            .try_collect()
            .await
            .map_err(&err)?;
        Ok(docs.iter().filter_map(|d| d.get_object_id("_id").ok()).collect())
    }

    /// [`Store::settled`](crate::store::Store::settled).
    pub(super) async fn settled(&self, dep: &Dependency) -> StoreResult<()> {
        let err = db_err("mark a dependency settled");
        let unset = doc! { "$unset": { "dependents": "" } };
        match dep {
            Dependency::Task(id) => {
                let filter = super::change::id_first(*id, ended());
                self.tasks.update_one(filter, unset).await.map_err(&err)?;
            }
            Dependency::Batch(b) => {
                self.db
                    .collection::<Document>(BATCHES)
                    .update_one(doc! { "_id": b }, unset)
                    .await
                    .map_err(&err)?;
            }
        }
        Ok(())
    }

    /// [`Store::unsettled`](crate::store::Store::unsettled).
    pub(super) async fn unsettled(&self, limit: usize) -> StoreResult<Vec<Dependency>> {
        let err = db_err("find unsettled dependencies");
        let n = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut filter = ended();
        filter.insert("dependents", true);
        let tasks: Vec<Document> = self
            .tasks
            .find(filter)
            .projection(doc! { "_id": 1 })
            .limit(n)
            .await
            .map_err(&err)?
            .try_collect()
            .await
            .map_err(&err)?;
        let batches: Vec<Document> = self
            .db
            .collection::<Document>(BATCHES)
            .find(doc! { "dependents": true })
            .projection(doc! { "_id": 1 })
            .limit(n)
            .await
            .map_err(&err)?
            .try_collect()
            .await
            .map_err(&err)?;
        let mut out: Vec<Dependency> = tasks
            .iter()
            .filter_map(|d| d.get_object_id("_id").ok().map(Dependency::Task))
            .collect();
        out.extend(
            batches
                .iter()
                .filter_map(|d| d.get_str("_id").ok().map(|b| Dependency::Batch(b.to_string()))),
        );
        Ok(out)
    }
}

/// [`Store::resolve_pending`](crate::store::Store::resolve_pending): one update fenced on
/// `{_id, status: -4, pending}` as read.
pub(super) async fn resolve_pending(
    store: &MongoStore,
    task: ObjectId,
    expect: &[String],
    change: PendingChange<'_>,
) -> StoreResult<bool> {
    let now = DateTime::now();
    let set = match change {
        PendingChange::Met(dep) => {
            let key = dep.key();
            let rest: Vec<&String> = expect.iter().filter(|p| **p != key).collect();
            doc! { "pending": rest }
        }
        PendingChange::Release(to) => doc! { "pending": [], "status": to, "mtime": now },
        PendingChange::Stop(to, stop) => doc! { "status": to, "stop": stop.to_document(), "mtime": now },
    };
    let done = store
        .tasks
        .update_one(
            doc! { "_id": task, "status": status::BLOCKED, "pending": expect },
            doc! { "$set": set },
        )
        .await
        .map_err(db_err("resolve what a blocked task waits for"))?;
    Ok(done.matched_count == 1)
}
