//! Queue documents: listing (readable queues, and unreadable ones with their problem),
//! creating, changing and deleting them; and their task counts by status
//! ([`Store::queue_counts`](crate::store::Store::queue_counts)), asked for on every
//! `GET /queues`, `GET /metrics` and web UI refresh.
//!
//! The count is one aggregation that sorts on the `{queue: 1, status: 1}` index before
//! grouping: the group needs no other field, so the server answers from the index alone
//! (a covered index scan, `PROJECTION_COVERED` over `IXSCAN` in its plan) and never reads a
//! task document, whose params and inline output may be megabytes. The result is the same
//! as a plain `$group` over the collection.

use std::collections::BTreeMap;

use bson::oid::ObjectId;
use bson::{doc, Document};
use futures::TryStreamExt;

use super::records::as_int;
use super::{db_err, is_duplicate_key, MongoStore};
use crate::model::{Queue, UnreadableQueue};
use crate::store::queue_doc::{self, QueueState};
use crate::store::{NewQueue, QueueUpdate, StatusCounts, StoreError, StoreResult};

/// How many times a change is tried again when the document changed between its read and
/// its write.
const CHANGE_ATTEMPTS: usize = 5;

impl MongoStore {
    /// Every queue document: those read as queues, and those that cannot be, each with
    /// its problem (logged once). A tolerated problem (an unknown `sort`) is logged once.
    pub(super) async fn read_queues(&self) -> StoreResult<(Vec<Queue>, Vec<UnreadableQueue>)> {
        let docs: Vec<Document> = self
            .queues
            .find(doc! {})
            .sort(doc! { "_id": 1 })
            .await
            .map_err(db_err("list queues"))?
            .try_collect()
            .await
            .map_err(db_err("list queues"))?;
        Ok(queue_doc::sort_out(&docs, |m| self.warn_once(m)))
    }

    /// [`Store::create_queue`](crate::store::Store::create_queue).
    pub(super) async fn insert_queue(&self, queue: NewQueue) -> StoreResult<Queue> {
        let name = queue.name.clone();
        let (d, parsed) = queue_doc::new_doc(ObjectId::new(), queue)?;
        match self.queues.insert_one(&d).await {
            Ok(_) => Ok(parsed),
            Err(e) if is_duplicate_key(&e) => Err(StoreError::Duplicate { what: "queue", name }),
            Err(e) => Err(db_err("create queue")(e)),
        }
    }

    /// [`Store::update_queue`](crate::store::Store::update_queue): the change is applied
    /// to the document as read and checked ([`queue_doc::updated`]) before it is written,
    /// and written only if the document is still as read.
    pub(super) async fn update_queue(&self, id: ObjectId, update: QueueUpdate) -> StoreResult<Option<QueueState>> {
        let set = queue_doc::set_fields(&update)?;
        for _ in 0..CHANGE_ATTEMPTS {
            let found = self
                .queues
                .find_one(doc! { "_id": id })
                .await
                .map_err(db_err("find queue"))?;
            let Some(before) = found else {
                return Ok(None);
            };
            let (_, state) = queue_doc::updated(&before, set.clone())?;
            if set.is_empty() {
                return Ok(Some(state));
            }
            // The fence: every field as read, so a concurrent change is not overwritten
            // with a check made on what it replaced.
            let result = self
                .queues
                .update_one(before.clone(), doc! { "$set": set.clone() })
                .await;
            match result {
                Ok(r) if r.matched_count > 0 => return Ok(Some(state)),
                Ok(_) => continue,
                Err(e) if is_duplicate_key(&e) => {
                    return Err(StoreError::Duplicate {
                        what: "queue",
                        name: update.name.unwrap_or_default(),
                    })
                }
                Err(e) => return Err(db_err("update queue")(e)),
            }
        }
        Err(StoreError::Database(format!(
            "update queue {id}: the queue kept changing while it was updated; retrying may succeed"
        )))
    }

    /// [`Store::delete_queue`](crate::store::Store::delete_queue), with its slots.
    pub(super) async fn delete_queue(&self, id: ObjectId) -> StoreResult<bool> {
        let result = self
            .queues
            .delete_one(doc! { "_id": id })
            .await
            .map_err(db_err("delete queue"))?;
        self.slots
            .delete_many(doc! { "queue": id })
            .await
            .map_err(db_err("delete queue slots"))?;
        if let Ok(mut s) = self.ensured_slots.lock() {
            s.retain(|(q, _)| *q != id);
        }
        Ok(result.deleted_count > 0)
    }
}

/// The aggregation pipeline of [`Store::queue_counts`](crate::store::Store::queue_counts)
/// on the `tasks` collection: `{_id: {queue, status}, n}` per pair.
pub fn queue_counts_pipeline() -> Vec<Document> {
    vec![
        doc! { "$sort": { "queue": 1, "status": 1 } },
        doc! { "$group": {
            "_id": { "queue": "$queue", "status": "$status" },
            "n": { "$sum": 1 },
        }},
    ]
}

impl MongoStore {
    /// Task counts by status for each queue; groups with a malformed queue or status are
    /// left out with a warning (once).
    pub(super) async fn queue_counts(&self) -> StoreResult<BTreeMap<ObjectId, StatusCounts>> {
        let mut cursor = self
            .tasks
            .aggregate(queue_counts_pipeline())
            .allow_disk_use(true)
            .await
            .map_err(db_err("count tasks by queue"))?;
        let mut counts: BTreeMap<ObjectId, StatusCounts> = BTreeMap::new();
        while let Some(group) = cursor.try_next().await.map_err(db_err("count tasks by queue"))? {
            let key = group.get_document("_id").ok();
            let queue = key.and_then(|k| k.get_object_id("queue").ok());
            let code = key
                .and_then(|k| k.get("status"))
                .and_then(as_int)
                .and_then(|s| i32::try_from(s).ok());
            let n = group.get("n").and_then(as_int).and_then(|n| u64::try_from(n).ok());
            match (queue, code, n) {
                (Some(q), Some(c), Some(n)) => *counts.entry(q).or_default().entry(c).or_default() += n,
                _ => self.warn_once(format!(
                    "tasks with a malformed queue or status are not counted: {group}"
                )),
            }
        }
        Ok(counts)
    }
}
