//! Rate grants: the `rates` collection, one document `{queue, n, at, node}` per grant row
//! `n` of a rate-limited queue, read as [`RateRow`]s and written by compare-and-set on
//! `at` and `node`. The rule is in `lifecycle::rate`.

use async_trait::async_trait;
use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use futures::TryStreamExt;

use super::records::as_int;
use super::{db_err, is_duplicate_key, MongoStore, RATES};
use crate::store::{RateRow, RateStore, StoreError, StoreResult};

/// A grant document read as a row (an `at` of another shape reads as now: the row is not
/// granted again before a window has passed).
fn row_from(d: &Document) -> StoreResult<RateRow> {
    let n = d.get("n").and_then(as_int).ok_or_else(|| StoreError::Malformed {
        collection: RATES,
        id: d.get("_id").map_or("?".to_string(), ToString::to_string),
        reason: "field `n` must be an integer".to_string(),
    })?;
    Ok(RateRow {
        n,
        at: d.get_datetime("at").ok().copied().unwrap_or_else(DateTime::now),
        node: d.get_str("node").ok().map(str::to_owned),
    })
}

fn node_bson(node: &Option<String>) -> Bson {
    node.as_ref().map_or(Bson::Null, |n| Bson::String(n.clone()))
}

#[async_trait]
impl RateStore for MongoStore {
    async fn rates(&self, queue: ObjectId) -> StoreResult<Vec<RateRow>> {
        let err = db_err("read the queue's rate grants");
        let docs: Vec<Document> = self
            .rates
            .find(doc! { "queue": queue })
            .sort(doc! { "n": 1 })
            .await
            .map_err(&err)?
            .try_collect()
            .await
            .map_err(&err)?;
        docs.iter().map(row_from).collect()
    }

    /// Creates the missing documents (an unordered insert whose duplicate keys are
    /// ignored); `lifecycle::rate` calls it only when rows are missing.
    async fn ensure_rates(&self, queue: ObjectId, max: i64) -> StoreResult<()> {
        if max <= 0 {
            return Ok(());
        }
        let docs: Vec<Document> = (0..max)
            .map(|n| doc! { "queue": queue, "n": n, "at": DateTime::from_millis(0), "node": null })
            .collect();
        match self.rates.insert_many(docs).ordered(false).await {
            Ok(_) => {}
            Err(e) if is_duplicate_key(&e) => {}
            Err(e) => return Err(db_err("create rate grants")(e)),
        }
        Ok(())
    }

    async fn change_rate(&self, queue: ObjectId, n: i64, from: &RateRow, to: &RateRow) -> StoreResult<bool> {
        let done = self
            .rates
            .update_one(
                doc! { "queue": queue, "n": n, "at": from.at, "node": node_bson(&from.node) },
                doc! { "$set": { "at": to.at, "node": node_bson(&to.node) } },
            )
            .await
            .map_err(db_err("change a rate grant"))?;
        Ok(done.matched_count == 1)
    }
}
