//! Queue documents: listing (readable queues, and unreadable ones with their problem),
//! creating, changing and deleting them.

use bson::oid::ObjectId;
use bson::{doc, Document};
use futures::TryStreamExt;

use super::{db_err, is_duplicate_key, MongoStore};
use crate::model::{Queue, UnreadableQueue};
use crate::store::queue_doc::{self, QueueState};
use crate::store::{NewQueue, QueueUpdate, StoreError, StoreResult};

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
    pub(super) async fn change_queue(&self, id: ObjectId, update: QueueUpdate) -> StoreResult<Option<QueueState>> {
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
    pub(super) async fn remove_queue(&self, id: ObjectId) -> StoreResult<bool> {
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
