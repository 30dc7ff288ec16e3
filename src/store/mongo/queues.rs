//! Queue documents: listing (readable queues, and unreadable ones with their problem),
//! creating, changing and deleting them.

use bson::oid::ObjectId;
use bson::{doc, Document};
use futures::TryStreamExt;
use mongodb::options::ReturnDocument;

use super::documents::{opt_int_bson, queue_from, sort_str, unreadable_queue};
use super::{db_err, is_duplicate_key, MongoStore};
use crate::model::{Queue, UnreadableQueue};
use crate::store::{NewQueue, QueueUpdate, StoreError, StoreResult};

/// Keys of a queue document that `extra` fields may not set.
const QUEUE_CORE_FIELDS: [&str; 5] = ["_id", "name", "plugin", "threads", "sort"];

fn check_extra(extra: &Document) -> StoreResult<()> {
    match extra
        .keys()
        .find(|k| QUEUE_CORE_FIELDS.contains(&k.as_str()) || k.starts_with('$'))
    {
        Some(k) => Err(StoreError::Invalid(format!(
            "field {k:?} cannot be set as an extra queue field"
        ))),
        None => Ok(()),
    }
}

fn check_threads(threads: Option<i64>) -> StoreResult<()> {
    match threads {
        Some(t) if t < 0 => Err(StoreError::Invalid(format!("threads must be non-negative, got {t}"))),
        _ => Ok(()),
    }
}

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
        let mut queues = Vec::with_capacity(docs.len());
        let mut unreadable = Vec::new();
        for d in &docs {
            match queue_from(d) {
                Ok((q, problems)) => {
                    for p in problems {
                        self.warn_once(format!("queue {:?} ({}): {p}", q.name, q.id));
                    }
                    queues.push(q);
                }
                Err(e) => {
                    let name = d.get_str("name").unwrap_or("?");
                    self.warn_once(format!("cannot run queue {name:?}: {e}"));
                    unreadable.extend(unreadable_queue(d, &e));
                }
            }
        }
        Ok((queues, unreadable))
    }

    async fn find_queue(&self, id: ObjectId) -> StoreResult<Option<Queue>> {
        let found = self
            .queues
            .find_one(doc! { "_id": id })
            .await
            .map_err(db_err("find queue"))?;
        found.map(|d| queue_from(&d).map(|(q, _)| q)).transpose()
    }

    /// [`Store::create_queue`](crate::store::Store::create_queue).
    pub(super) async fn insert_queue(&self, queue: NewQueue) -> StoreResult<Queue> {
        check_extra(&queue.extra)?;
        check_threads(queue.threads)?;
        let mut d = doc! {
            "_id": ObjectId::new(),
            "name": queue.name.clone(),
            "plugin": queue.plugin.clone(),
            "threads": opt_int_bson(queue.threads),
            "sort": sort_str(queue.sort),
        };
        d.extend(queue.extra);
        let (parsed, _) = queue_from(&d).map_err(|e| StoreError::Invalid(e.to_string()))?;
        match self.queues.insert_one(&d).await {
            Ok(_) => Ok(parsed),
            Err(e) if is_duplicate_key(&e) => Err(StoreError::Duplicate {
                what: "queue",
                name: queue.name,
            }),
            Err(e) => Err(db_err("create queue")(e)),
        }
    }

    /// [`Store::update_queue`](crate::store::Store::update_queue): a document that is
    /// still unreadable after the change is [`StoreError::Malformed`].
    pub(super) async fn change_queue(&self, id: ObjectId, update: QueueUpdate) -> StoreResult<Option<Queue>> {
        check_extra(&update.extra)?;
        let mut set = Document::new();
        if let Some(name) = &update.name {
            set.insert("name", name.clone());
        }
        if let Some(plugin) = update.plugin {
            set.insert("plugin", plugin);
        }
        if let Some(threads) = update.threads {
            check_threads(threads)?;
            set.insert("threads", opt_int_bson(threads));
        }
        if let Some(sort) = update.sort {
            set.insert("sort", sort_str(sort));
        }
        set.extend(update.extra);
        if set.is_empty() {
            return self.find_queue(id).await;
        }
        let result = self
            .queues
            .find_one_and_update(doc! { "_id": id }, doc! { "$set": set })
            .return_document(ReturnDocument::After)
            .await;
        match result {
            Ok(found) => found.map(|d| queue_from(&d).map(|(q, _)| q)).transpose(),
            Err(e) if is_duplicate_key(&e) => Err(StoreError::Duplicate {
                what: "queue",
                name: update.name.unwrap_or_default(),
            }),
            Err(e) => Err(db_err("update queue")(e)),
        }
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
