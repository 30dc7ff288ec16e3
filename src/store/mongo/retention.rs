//! Retention on MongoDB: the ended tasks past their time, found on the `{status, mtime}`
//! index, and their deletion, fenced on each task's `status` and `mtime` as read, with
//! their GridFS files (`tasks.files` whose `metadata.task_id` is a task deleted, and those
//! files' chunks). Which tasks go is decided above the store (`lifecycle::retention`).

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use futures::TryStreamExt;

use super::gridfs::{CHUNKS, FILES};
use super::{db_err, MongoStore};
use crate::store::{ExpiredFilter, ExpiredTask, StoreResult};

/// The part of a task's filter that keeps every task still of use whatever its age.
fn still_of_no_use() -> Document {
    doc! { "dependents": { "$ne": true }, "rerun": { "$ne": true } }
}

impl MongoStore {
    /// [`Store::expired_tasks`](crate::store::Store::expired_tasks).
    pub(super) async fn expired_tasks(&self, f: &ExpiredFilter) -> StoreResult<Vec<ExpiredTask>> {
        let mut filter = doc! {
            "status": f.status,
            "mtime": { "$type": "date", "$lt": f.before },
            "queue": f.queue,
        };
        filter.extend(still_of_no_use());
        if !f.except_ids.is_empty() {
            filter.insert("_id", doc! { "$nin": f.except_ids.clone() });
        }
        match (&f.batch, f.except_batches.is_empty()) {
            (Some(b), _) if !f.except_batches.contains(b) => {
                filter.insert("batch", b.clone());
            }
            (Some(_), _) => return Ok(Vec::new()),
            (None, false) => {
                filter.insert("batch", doc! { "$nin": f.except_batches.clone() });
            }
            (None, true) => {}
        }
        let docs: Vec<Document> = self
            .tasks
            .find(filter)
            .sort(doc! { "status": 1, "mtime": 1 })
            .limit(i64::try_from(f.limit).unwrap_or(i64::MAX))
            .projection(doc! { "_id": 1, "status": 1, "mtime": 1, "batch": 1 })
            .await
            .map_err(db_err("find tasks past their retention"))?
            .try_collect()
            .await
            .map_err(db_err("find tasks past their retention"))?;
        Ok(docs
            .into_iter()
            .filter_map(|d| {
                Some(ExpiredTask {
                    id: d.get_object_id("_id").ok()?,
                    status: match d.get("status")? {
                        Bson::Int32(n) => *n,
                        Bson::Int64(n) => i32::try_from(*n).ok()?,
                        Bson::Double(n) if n.fract() == 0.0 => *n as i32,
                        _ => return None,
                    },
                    mtime: *d.get_datetime("mtime").ok()?,
                    batch: d.get_str("batch").ok().map(str::to_owned),
                })
            })
            .collect())
    }

    /// [`Store::delete_tasks`](crate::store::Store::delete_tasks).
    pub(super) async fn delete_tasks(&self, tasks: &[ExpiredTask]) -> StoreResult<Vec<ObjectId>> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let fences: Vec<Document> = tasks
            .iter()
            .map(|t| {
                let mut d = doc! { "_id": t.id, "status": t.status, "mtime": t.mtime };
                d.extend(still_of_no_use());
                d
            })
            .collect();
        let ids: Vec<ObjectId> = tasks.iter().map(|t| t.id).collect();
        self.tasks
            .delete_many(doc! { "$or": fences })
            .await
            .map_err(db_err("delete tasks past their retention"))?;
        // The tasks still there were not deleted (their fence did not hold).
        let kept: Vec<Document> = self
            .tasks
            .find(doc! { "_id": { "$in": ids.clone() } })
            .projection(doc! { "_id": 1 })
            .await
            .map_err(db_err("read the tasks kept"))?
            .try_collect()
            .await
            .map_err(db_err("read the tasks kept"))?;
        let kept: Vec<ObjectId> = kept.iter().filter_map(|d| d.get_object_id("_id").ok()).collect();
        let deleted: Vec<ObjectId> = ids.into_iter().filter(|id| !kept.contains(id)).collect();
        self.delete_files_of(&deleted).await?;
        Ok(deleted)
    }

    /// Deletes every GridFS output file tied to one of `tasks`, chunks first.
    async fn delete_files_of(&self, tasks: &[ObjectId]) -> StoreResult<()> {
        if tasks.is_empty() {
            return Ok(());
        }
        let files = self.db.collection::<Document>(FILES);
        let docs: Vec<Document> = files
            .find(doc! { "metadata.task_id": { "$in": tasks.to_vec() } })
            .projection(doc! { "_id": 1 })
            .await
            .map_err(db_err("find the files of deleted tasks"))?
            .try_collect()
            .await
            .map_err(db_err("find the files of deleted tasks"))?;
        let ids: Vec<Bson> = docs.into_iter().filter_map(|mut d| d.remove("_id")).collect();
        if ids.is_empty() {
            return Ok(());
        }
        self.db
            .collection::<Document>(CHUNKS)
            .delete_many(doc! { "files_id": { "$in": ids.clone() } })
            .await
            .map_err(db_err("delete the file chunks of deleted tasks"))?;
        files
            .delete_many(doc! { "_id": { "$in": ids } })
            .await
            .map_err(db_err("delete the files of deleted tasks"))?;
        Ok(())
    }
}
