//! Batches: the `batches` collection records each batch at its first submission
//! (`{_id: <batch id>, size, ctime}`, with `closed` once retention judged it complete); its tasks carry `batch`, counted by status through
//! the `{batch, status}` index.

use bson::{doc, DateTime, Document};
use futures::TryStreamExt;

use super::records::{as_date, as_int};
use super::{db_err, is_duplicate_key, MongoStore};
use crate::store::{Batch, StatusCounts, StoreError, StoreResult};

/// Collection of batches.
pub const BATCHES: &str = "batches";

/// A batch document as a [`Batch`].
fn batch_from(d: &Document) -> StoreResult<Batch> {
    let id = d.get_str("_id").map_err(|_| StoreError::Malformed {
        collection: BATCHES,
        id: d.get("_id").map_or("?".into(), ToString::to_string),
        reason: "field `_id` must be a string".into(),
    })?;
    Ok(Batch {
        id: id.to_string(),
        size: d.get("size").and_then(as_int),
        ctime: d.get("ctime").and_then(as_date).unwrap_or(DateTime::from_millis(0)),
        dependents: d.get_bool("dependents").unwrap_or(false),
        // Only a date this store wrote: a value of another type is not a close.
        closed: d.get_datetime("closed").ok().copied(),
    })
}

impl MongoStore {
    fn batches(&self) -> mongodb::Collection<Document> {
        self.db.collection(BATCHES)
    }

    /// [`Store::insert_batch`](crate::store::Store::insert_batch): one insert; a duplicate
    /// `_id` means the batch was recorded already.
    pub(super) async fn insert_batch(&self, id: &str, size: Option<i64>) -> StoreResult<bool> {
        let first = doc! { "_id": id, "size": size, "ctime": DateTime::now() };
        match self.batches().insert_one(first).await {
            Ok(_) => Ok(true),
            Err(e) if is_duplicate_key(&e) => Ok(false),
            Err(e) => Err(db_err("record the batch")(e)),
        }
    }

    /// [`Store::set_batch_size_if_unset`](crate::store::Store::set_batch_size_if_unset).
    pub(super) async fn set_batch_size_if_unset(&self, id: &str, size: i64) -> StoreResult<bool> {
        let done = self
            .batches()
            .update_one(doc! { "_id": id, "size": null }, doc! { "$set": { "size": size } })
            .await
            .map_err(db_err("record the batch size"))?;
        Ok(done.matched_count == 1)
    }

    /// [`Store::batch`](crate::store::Store::batch).
    pub(super) async fn batch(&self, id: &str) -> StoreResult<Option<Batch>> {
        let d = self
            .batches()
            .find_one(doc! { "_id": id })
            .await
            .map_err(db_err("read the batch"))?;
        d.as_ref().map(batch_from).transpose()
    }

    /// [`Store::close_batch`](crate::store::Store::close_batch).
    pub(super) async fn close_batch(&self, id: &str) -> StoreResult<()> {
        self.batches()
            .update_one(
                doc! { "_id": id, "closed": null },
                doc! { "$set": { "closed": DateTime::now() } },
            )
            .await
            .map_err(db_err("close the batch"))?;
        Ok(())
    }

    /// [`Store::batch_counts`](crate::store::Store::batch_counts).
    pub(super) async fn batch_counts(&self, id: &str) -> StoreResult<StatusCounts> {
        let err = db_err("count the tasks of a batch");
        let mut cursor = self
            .tasks
            .aggregate([
                doc! { "$match": { "batch": id } },
                doc! { "$group": { "_id": "$status", "n": { "$sum": 1 } } },
            ])
            .await
            .map_err(&err)?;
        let mut counts = StatusCounts::new();
        while let Some(group) = cursor.try_next().await.map_err(&err)? {
            let code = group.get("_id").and_then(as_int).and_then(|s| i32::try_from(s).ok());
            let n = group.get("n").and_then(as_int).and_then(|n| u64::try_from(n).ok());
            match (code, n) {
                (Some(c), Some(n)) => *counts.entry(c).or_default() += n,
                _ => self.warn_once(format!(
                    "tasks of batch {id:?} with a malformed status are not counted: {group}"
                )),
            }
        }
        Ok(counts)
    }
}
