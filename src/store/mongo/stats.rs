//! The per-minute counters ([`crate::stats`]) in the `minute_stats` collection, and the
//! live counts of active tasks.
//!
//! A row is `{_id: "<minute>/<queue>/<node>", minute, queue, node, succeeded, failed,
//! retried, seconds, buckets: {"<i>": n}, depth?}`, indexed on `minute`; counters grow by
//! `$inc` in one upsert, so two DENs adding to the same minute never lose a count. Depth
//! samples are rows of node `""`.

use std::collections::BTreeMap;
use std::future::IntoFuture;

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use futures::TryStreamExt;

use super::records::as_int;
use super::{db_err, MongoStore};
use crate::stats::{Counters, StatsRow};
use crate::store::{StatusCounts, StoreError, StoreResult, ACTIVE_STATUSES};

/// The collection of per-minute counters.
pub const MINUTE_STATS: &str = "minute_stats";

fn row_id(minute: i64, queue: ObjectId, node: &str) -> String {
    format!("{minute}/{}/{node}", queue.to_hex())
}

fn count(doc: &Document, key: &str) -> u64 {
    doc.get(key)
        .and_then(as_int)
        .and_then(|n| u64::try_from(n).ok())
        .unwrap_or(0)
}

fn row_from(doc: &Document) -> StoreResult<StatsRow> {
    let malformed = |reason: &str| StoreError::Malformed {
        collection: MINUTE_STATS,
        id: doc.get("_id").map_or("?".into(), |v| v.to_string()),
        reason: reason.into(),
    };
    let minute = doc
        .get("minute")
        .and_then(as_int)
        .ok_or_else(|| malformed("no minute"))?;
    let queue = doc.get_object_id("queue").map_err(|_| malformed("no queue"))?;
    let mut buckets = BTreeMap::new();
    if let Ok(b) = doc.get_document("buckets") {
        for (k, v) in b {
            let i: usize = k.parse().map_err(|_| malformed("a bucket that is not a number"))?;
            let n = as_int(v).and_then(|n| u64::try_from(n).ok());
            buckets.insert(i, n.ok_or_else(|| malformed("a bucket count that is not a count"))?);
        }
    }
    Ok(StatsRow {
        minute,
        queue,
        node: doc.get_str("node").unwrap_or_default().to_string(),
        counters: Counters {
            succeeded: count(doc, "succeeded"),
            failed: count(doc, "failed"),
            retried: count(doc, "retried"),
            seconds: doc.get_f64("seconds").unwrap_or(0.0),
            buckets,
        },
        depth: doc.get("depth").and_then(as_int),
    })
}

impl MongoStore {
    fn minute_stats(&self) -> mongodb::Collection<Document> {
        self.db.collection(MINUTE_STATS)
    }

    /// The index of the counters.
    pub(super) async fn create_stats_indexes(&self) -> StoreResult<()> {
        let index = mongodb::IndexModel::builder().keys(doc! { "minute": 1 }).build();
        self.minute_stats()
            .create_index(index)
            .await
            .map_err(db_err("create indexes"))?;
        Ok(())
    }

    /// [`Store::add_stats`](crate::store::Store::add_stats).
    pub(super) async fn add_stats(&self, node: &str, rows: &[(i64, ObjectId, Counters)]) -> StoreResult<()> {
        let err = db_err("add the per-minute counters");
        for (minute, queue, c) in rows {
            let mut inc = doc! {
                "succeeded": c.succeeded as i64,
                "failed": c.failed as i64,
                "retried": c.retried as i64,
                "seconds": c.seconds,
            };
            for (b, n) in &c.buckets {
                inc.insert(format!("buckets.{b}"), *n as i64);
            }
            self.minute_stats()
                .update_one(
                    doc! { "_id": row_id(*minute, *queue, node) },
                    doc! {
                        "$inc": inc,
                        "$setOnInsert": { "minute": *minute, "queue": *queue, "node": node },
                    },
                )
                .upsert(true)
                .await
                .map_err(&err)?;
        }
        Ok(())
    }

    /// [`Store::record_depth`](crate::store::Store::record_depth).
    pub(super) async fn record_depth(&self, minute: i64, depths: &[(ObjectId, i64)]) -> StoreResult<()> {
        let err = db_err("record the queue depths");
        for (queue, depth) in depths {
            self.minute_stats()
                .update_one(
                    doc! { "_id": row_id(minute, *queue, "") },
                    doc! {
                        "$set": { "depth": *depth },
                        "$setOnInsert": { "minute": minute, "queue": *queue, "node": "" },
                    },
                )
                .upsert(true)
                .await
                .map_err(&err)?;
        }
        Ok(())
    }

    /// [`Store::read_stats`](crate::store::Store::read_stats).
    pub(super) async fn read_stats(&self, from: i64, to: i64, queue: Option<ObjectId>) -> StoreResult<Vec<StatsRow>> {
        let err = db_err("read the per-minute counters");
        let mut filter = doc! { "minute": { "$gte": from, "$lt": to } };
        if let Some(queue) = queue {
            filter.insert("queue", queue);
        }
        let mut cursor = self.minute_stats().find(filter).await.map_err(&err)?;
        let mut rows = Vec::new();
        while let Some(doc) = cursor.try_next().await.map_err(&err)? {
            match row_from(&doc) {
                Ok(row) => rows.push(row),
                Err(e) => self.warn_once(format!("{e}; left out of the statistics")),
            }
        }
        Ok(rows)
    }

    /// [`Store::prune_stats`](crate::store::Store::prune_stats).
    pub(super) async fn prune_stats(&self, before: i64) -> StoreResult<u64> {
        let deleted = self
            .minute_stats()
            .delete_many(doc! { "minute": { "$lt": before } })
            .await
            .map_err(db_err("delete old per-minute counters"))?;
        Ok(deleted.deleted_count)
    }

    /// [`Store::active_counts`](crate::store::Store::active_counts): the pairs (queue,
    /// active status) of the `{queue, status}` index, counted from the index alone.
    pub(super) async fn active_counts(&self) -> StoreResult<BTreeMap<ObjectId, StatusCounts>> {
        let err = db_err("count active tasks by queue");
        let mut cursor = self
            .queues
            .find(doc! {})
            .projection(doc! { "_id": 1 })
            .await
            .map_err(&err)?;
        let mut queues: Vec<Bson> = Vec::new();
        while let Some(q) = cursor.try_next().await.map_err(&err)? {
            if let Some(id @ Bson::ObjectId(_)) = q.get("_id") {
                queues.push(id.clone());
            }
        }
        // One count per (queue, active status): an equality on both fields of the index,
        // answered from its keys (a COUNT_SCAN), run side by side.
        let pairs: Vec<(ObjectId, i32)> = queues
            .iter()
            .filter_map(|q| q.as_object_id())
            .flat_map(|q| ACTIVE_STATUSES.iter().map(move |s| (q, *s)))
            .collect();
        let counted = futures::future::try_join_all(pairs.iter().map(|(q, s)| {
            self.tasks
                .count_documents(doc! { "queue": *q, "status": *s })
                .into_future()
        }))
        .await
        .map_err(&err)?;
        let mut counts: BTreeMap<ObjectId, StatusCounts> = BTreeMap::new();
        for ((q, s), n) in pairs.into_iter().zip(counted) {
            if n > 0 {
                counts.entry(q).or_default().insert(s, n);
            }
        }
        Ok(counts)
    }
}
