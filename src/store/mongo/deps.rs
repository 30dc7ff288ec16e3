//! Dependencies on MongoDB: a blocked task (-4) keeps what it was submitted `after` (task
//! ids in hex, `batch:<id>`) and, in `pending`, what it still waits for; the `{pending}`
//! index finds the tasks blocked on one of them. A task or batch that blocked tasks wait
//! for carries `dependents: true` until its end has been settled (the `{dependents}` index
//! finds those left unsettled by a DEN that died). Resolving a dependency is one
//! compare-and-set on the task's `pending` list, so two parents ending at once never both
//! leave it blocked.

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use futures::TryStreamExt;

use super::documents::as_date;
use super::{batches::BATCHES, db_err, MongoStore};
use crate::model::{status, StopRequest};
use crate::store::{due_status, Dependency, Resolved, StoreResult};

/// How often a compare-and-set on `pending` is tried before it is left to the next settle.
const CAS_TRIES: usize = 64;

/// The statuses of an ended task, as a query on `status`.
pub(super) fn ended() -> Document {
    doc! { "$or": [
        { "status": { "$gt": 0 } },
        { "status": { "$in": status::ENDED_HELD.to_vec() } },
    ] }
}

impl MongoStore {
    /// [`Store::mark_dependents`](crate::store::Store::mark_dependents).
    pub(super) async fn mark_waited(&self, deps: &[Dependency]) -> StoreResult<()> {
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
    pub(super) async fn find_blocked(&self, dep: &Dependency, limit: usize) -> StoreResult<Vec<ObjectId>> {
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

    /// [`Store::resolve_dependency`](crate::store::Store::resolve_dependency).
    pub(super) async fn resolve(
        &self,
        task: ObjectId,
        dep: &Dependency,
        failed: Option<&StopRequest>,
    ) -> StoreResult<Resolved> {
        let err = db_err("release a blocked task");
        let key = dep.key();
        for _ in 0..CAS_TRIES {
            let Some(d) = self
                .tasks
                .find_one(doc! { "_id": task, "status": status::BLOCKED })
                .projection(doc! { "pending": 1, "after_failure": 1, "run_at": 1, "dependents": 1, "batch": 1 })
                .await
                .map_err(&err)?
            else {
                return Ok(Resolved::Gone);
            };
            let pending: Vec<Bson> = match d.get("pending") {
                Some(Bson::Array(a)) => a.clone(),
                _ => Vec::new(),
            };
            let waits = pending.iter().any(|p| p.as_str() == Some(key.as_str()));
            let runs_anyway = d.get_str("after_failure") == Ok("run");
            if let (Some(stop), false, true) = (failed, runs_anyway, waits) {
                let done = self
                    .tasks
                    .update_one(
                        doc! { "_id": task, "status": status::BLOCKED },
                        doc! { "$set": {
                            "status": status::CANCELLED,
                            "stop": stop.to_document(),
                            "mtime": DateTime::now(),
                        } },
                    )
                    .await
                    .map_err(&err)?;
                if done.matched_count == 0 {
                    continue;
                }
                return Ok(Resolved::Cancelled {
                    dependents: d.get_bool("dependents").unwrap_or(false),
                    batch: d.get_str("batch").ok().map(str::to_owned),
                });
            }
            let rest: Vec<Bson> = pending
                .iter()
                .filter(|p| p.as_str() != Some(key.as_str()))
                .cloned()
                .collect();
            if waits && !rest.is_empty() {
                let done = self
                    .tasks
                    .update_one(
                        doc! { "_id": task, "status": status::BLOCKED, "pending": pending },
                        doc! { "$set": { "pending": rest } },
                    )
                    .await
                    .map_err(&err)?;
                if done.matched_count == 1 {
                    return Ok(Resolved::Waiting);
                }
                continue;
            }
            if !rest.is_empty() {
                return Ok(Resolved::Gone);
            }
            // Nothing more to wait for (this was the last, or a release was cut short).
            let now = DateTime::now();
            let run_at = d.get("run_at").and_then(as_date);
            let done = self
                .tasks
                .update_one(
                    doc! { "_id": task, "status": status::BLOCKED, "pending": pending },
                    doc! { "$set": { "pending": [], "status": due_status(run_at, now), "mtime": now } },
                )
                .await
                .map_err(&err)?;
            if done.matched_count == 1 {
                return Ok(Resolved::Released);
            }
        }
        // Others kept changing the list: an error, so the end is not marked settled and
        // the next settle (the leader's sweep) tries again.
        Err(crate::store::StoreError::Database(format!(
            "task {task}: its list of what it waits for kept changing; {key} is resolved later"
        )))
    }

    /// [`Store::settled`](crate::store::Store::settled).
    pub(super) async fn clear_waited(&self, dep: &Dependency) -> StoreResult<()> {
        let err = db_err("mark a dependency settled");
        let unset = doc! { "$unset": { "dependents": "" } };
        match dep {
            Dependency::Task(id) => {
                let mut filter = ended();
                filter.insert("_id", id);
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
    pub(super) async fn find_unsettled(&self, limit: usize) -> StoreResult<Vec<Dependency>> {
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
