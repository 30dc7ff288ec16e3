//! Queue slot leases: the `slots` collection, one document `{queue, n, holder, expires,
//! taken, want, want_until, reserved, reserved_until}` per slot `n` of a queue, read as
//! [`SlotRow`]s and written with one conditional update per [`SlotChange`] under its
//! [`SlotFence`]. The rules are in `lifecycle::slots`.

use async_trait::async_trait;
use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use futures::TryStreamExt;

use super::records::as_int;
use super::{db_err, is_duplicate_key, MongoStore, SLOTS};
use crate::model::status;
use crate::store::{
    BusyNode, BusyOf, Holder, Lease, Mark, Slot, SlotChange, SlotFence, SlotRow, SlotStore, StoreError, StoreResult,
};

/// A slot document read as a row.
fn row_from(d: &Document) -> StoreResult<SlotRow> {
    let n = d.get("n").and_then(as_int).ok_or_else(|| StoreError::Malformed {
        collection: SLOTS,
        id: d.get("_id").map_or("?".to_string(), ToString::to_string),
        reason: "field `n` must be an integer".to_string(),
    })?;
    let text = |f: &str| d.get_str(f).ok().map(str::to_owned);
    let date = |f: &str| d.get_datetime(f).ok().copied();
    Ok(SlotRow {
        n,
        holder: text("holder"),
        expires: date("expires").unwrap_or(DateTime::from_millis(0)),
        want: text("want"),
        want_until: date("want_until"),
        reserved: text("reserved"),
        reserved_until: date("reserved_until"),
        taken: d.get_object_id("taken").ok(),
    })
}

/// The condition on one mark's fields (`field`, `{field}_until`), if any.
fn mark_filter(field: &str, mark: &Mark) -> Option<Document> {
    let until = format!("{field}_until");
    match mark {
        Mark::Any => None,
        Mark::By(node) => Some(doc! { field: node }),
        Mark::OpenTo { node, at } => {
            let mut open = vec![doc! { field: Bson::Null }, doc! { until: { "$lt": *at } }];
            if let Some(node) = node {
                open.push(doc! { field: node });
            }
            Some(doc! { "$or": open })
        }
    }
}

/// The filter matching the row of `slot` under `fence`.
fn fence_filter(slot: &Slot, fence: &SlotFence) -> Document {
    let mut filter = doc! { "queue": slot.queue, "n": slot.n };
    match &fence.holder {
        Holder::Any => {}
        Holder::Unheld => {
            filter.insert("holder", Bson::Null);
        }
        Holder::By(node) => {
            filter.insert("holder", node);
        }
    }
    match fence.lease {
        Lease::Any => {}
        Lease::LiveAt(t) => {
            filter.insert("expires", doc! { "$gt": t });
        }
        Lease::EndedAt(t) => {
            filter.insert("expires", doc! { "$lt": t });
        }
    }
    let marks: Vec<Document> = [
        mark_filter("want", &fence.want),
        mark_filter("reserved", &fence.reserved),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !marks.is_empty() {
        filter.insert("$and", marks);
    }
    if let Some(taken) = fence.taken {
        filter.insert("taken", taken);
    }
    filter
}

/// The update making `change`.
fn change_update(change: &SlotChange) -> Document {
    let set = match change {
        SlotChange::Take { holder, until, taken } => {
            doc! { "holder": holder, "expires": *until, "taken": taken, "reserved": null, "want": null, "want_until": null }
        }
        SlotChange::Renew { until } => doc! { "expires": *until },
        SlotChange::Release => doc! { "holder": null, "want": null, "want_until": null },
        SlotChange::Yield { to, until } => {
            doc! { "holder": null, "reserved": to, "reserved_until": *until, "want": null, "want_until": null }
        }
        SlotChange::Ask { by, until } => doc! { "want": by, "want_until": *until },
        SlotChange::Unask => doc! { "want": null, "want_until": null },
    };
    doc! { "$set": set }
}

#[async_trait]
impl SlotStore for MongoStore {
    async fn slots(&self, queue: ObjectId) -> StoreResult<Vec<SlotRow>> {
        let err = db_err("read the queue's slots");
        let docs: Vec<Document> = self
            .slots
            .find(doc! { "queue": queue })
            .sort(doc! { "n": 1 })
            .await
            .map_err(&err)?
            .try_collect()
            .await
            .map_err(&err)?;
        docs.iter().map(row_from).collect()
    }

    /// Creates the documents unless known to exist (an unordered insert whose duplicate
    /// keys are ignored).
    async fn ensure_slots(&self, queue: ObjectId, threads: i64) -> StoreResult<()> {
        let known = self
            .ensured_slots
            .lock()
            .map(|s| s.contains(&(queue, threads)))
            .unwrap_or(false);
        if known || threads <= 0 {
            return Ok(());
        }
        let docs: Vec<Document> = (0..threads)
            .map(|n| doc! { "queue": queue, "n": n, "holder": null, "expires": DateTime::from_millis(0) })
            .collect();
        match self.slots.insert_many(docs).ordered(false).await {
            Ok(_) => {}
            Err(e) if is_duplicate_key(&e) => {}
            Err(e) => return Err(db_err("create slots")(e)),
        }
        if let Ok(mut s) = self.ensured_slots.lock() {
            s.insert((queue, threads));
        }
        Ok(())
    }

    async fn change_slot(&self, slot: &Slot, fence: &SlotFence, change: &SlotChange) -> StoreResult<bool> {
        let done = self
            .slots
            .update_one(fence_filter(slot, fence), change_update(change))
            .await
            .map_err(db_err("change a slot"))?;
        Ok(done.matched_count == 1)
    }

    /// One aggregation over the `{queue, status}` index entries of the claimed and running
    /// tasks; a node is foreign as [`super::nodes::is_foreign`] says (the node list is
    /// cached), so without Disbatch 4 DENs [`BusyOf::Foreign`] costs no query.
    async fn busy_nodes(&self, queue: Option<ObjectId>, of: BusyOf) -> StoreResult<Vec<BusyNode>> {
        let foreign = self.foreign_nodes().await?;
        let mut filter = doc! { "status": { "$in": status::BUSY.to_vec() } };
        if let Some(q) = queue {
            filter.insert("queue", q);
        }
        match of {
            BusyOf::All => filter.insert("node", doc! { "$type": "string" }),
            BusyOf::Foreign if foreign.is_empty() => return Ok(Vec::new()),
            BusyOf::Foreign => filter.insert("node", doc! { "$in": &foreign }),
        };
        let err = db_err("count the claimed and running tasks by node");
        let groups: Vec<Document> = self
            .tasks
            .aggregate(vec![
                doc! { "$match": filter },
                doc! { "$group": { "_id": "$node", "tasks": { "$sum": 1 } } },
            ])
            .await
            .map_err(&err)?
            .try_collect()
            .await
            .map_err(&err)?;
        Ok(groups
            .iter()
            .filter_map(|g| {
                let node = g.get_str("_id").ok()?.to_string();
                let tasks = g.get("tasks").and_then(as_int).unwrap_or(0);
                let foreign = foreign.contains(&node);
                Some(BusyNode { node, tasks, foreign })
            })
            .collect())
    }

    async fn slots_held_by(&self, holders: &[String]) -> StoreResult<Vec<(ObjectId, SlotRow)>> {
        if holders.is_empty() {
            return Ok(Vec::new());
        }
        let err = db_err("read the slots of nodes");
        let docs: Vec<Document> = self
            .slots
            .find(doc! { "holder": { "$in": holders } })
            .await
            .map_err(&err)?
            .try_collect()
            .await
            .map_err(&err)?;
        docs.iter()
            .filter_map(|d| d.get_object_id("queue").ok().map(|q| (q, d)))
            .map(|(q, d)| Ok((q, row_from(d)?)))
            .collect()
    }
}

impl MongoStore {
    /// Renews the leases of every slot `node` holds until `until`, but not one that expired:
    /// it may have been counted free since.
    pub(super) async fn renew_slots(&self, node: &str, until: DateTime) -> StoreResult<()> {
        self.slots
            .update_many(
                doc! { "holder": node, "expires": { "$gt": DateTime::now() } },
                doc! { "$set": { "expires": until } },
            )
            .await
            .map_err(db_err("renew slot leases"))?;
        Ok(())
    }
}
