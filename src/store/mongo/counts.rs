//! Task counts per queue and status ([`Store::queue_counts`](crate::store::Store::queue_counts)),
//! asked for on every `GET /queues`, `GET /metrics` and web UI refresh.
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

use super::documents::as_int;
use super::{db_err, MongoStore};
use crate::store::{StatusCounts, StoreResult};

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
    pub(super) async fn count_by_queue_and_status(&self) -> StoreResult<BTreeMap<ObjectId, StatusCounts>> {
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
