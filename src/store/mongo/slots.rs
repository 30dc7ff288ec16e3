//! Queue slot leases: the `slots` collection that makes a queue's `threads` hold across
//! every DEN.
//!
//! A queue has one document `{queue, n, holder, expires}` per slot `n` in `0..threads`,
//! created on first use. A slot is taken with one conditional update when it is unheld or
//! its lease has expired, renewed by its holder's heartbeat, and given back by its holder.
//!
//! A node that finds no free slot asks for one by setting `want` (its name) and
//! `want_until` on a slot of the node holding the most; that holder, before its next claim
//! with the slot, gives it up with `reserved` and `reserved_until` copied from the ask, so
//! only the asker takes it until then.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, DateTime, Document};
use futures::TryStreamExt;
use mongodb::options::ReturnDocument;

use super::documents::as_int;
use super::{db_err, is_duplicate_key, MongoStore, SLOTS};
use crate::model::{status, Queue};
use crate::store::{Slot, SlotRenewal, StoreError, StoreResult};

pub(super) use crate::store::lease_end;

impl MongoStore {
    /// Creates the slot documents `0..threads` of `queue` unless known to exist.
    async fn ensure_slots(&self, queue: bson::oid::ObjectId, threads: i64) -> StoreResult<()> {
        let known = self
            .ensured_slots
            .lock()
            .map(|s| s.contains(&(queue, threads)))
            .unwrap_or(false);
        if known {
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

    /// [`Store::acquire_slot`](crate::store::Store::acquire_slot): refuses while a slot at
    /// or above the limit is in use (held and unexpired, or expired with its holder's task
    /// not yet recovered), else takes the lowest free slot below it.
    pub(super) async fn take_slot(&self, queue: &Queue, node: &str, lease: Duration) -> StoreResult<Option<Slot>> {
        let limit = queue.limit();
        if limit <= 0 {
            return Ok(None);
        }
        self.ensure_slots(queue.id, limit).await?;
        // Tasks Disbatch 4 DENs run hold no slot; the slots they use are the top ones.
        let foreign = self.foreign_running(queue.id).await?;
        let threads = limit - foreign;
        if threads <= 0 {
            return Ok(None);
        }
        if self.slots_used_from(queue.id, threads).await? > 0 {
            return Ok(None);
        }
        let now = DateTime::now();
        let lease_until = lease_end(now, lease);
        let take = ObjectId::new();
        let mut taken = self
            .slots
            .find_one_and_update(
                doc! {
                    "queue": queue.id,
                    "n": { "$lt": threads },
                    "holder": null,
                    "$or": [{ "reserved": null }, { "reserved": node }, { "reserved_until": { "$lt": now } }],
                },
                doc! { "$set": { "holder": node, "taken": take, "expires": lease_until, "reserved": null, "want": null, "want_until": null } },
            )
            .sort(doc! { "n": 1 })
            .return_document(ReturnDocument::After)
            .await
            .map_err(db_err("acquire slot"))?;
        if taken.is_none() {
            taken = self
                .take_expired_slot(queue, threads, node, take, now, lease_until)
                .await?;
        }
        let Some(taken) = taken else {
            return Ok(None);
        };
        let n = taken.get("n").and_then(as_int).ok_or_else(|| StoreError::Malformed {
            collection: SLOTS,
            id: taken.get("_id").map_or("?".to_string(), ToString::to_string),
            reason: "field `n` must be an integer".to_string(),
        })?;
        let slot = Slot {
            queue: queue.id,
            n,
            taken: take,
        };
        self.confirm_slot(slot, node, threads, foreign).await
    }

    /// Keeps a slot just taken under the caller's view of the queue's limit (`seen`) only
    /// if the limit as stored now allows it: a DEN whose copy of the queue is older than a
    /// lowered `threads` or `maxthreads` (the leader's QueueBalance) gives the slot back
    /// before it claims anything with it. When the stored limit is lower than `seen`, the
    /// check for slots held above it is made again under the stored limit.
    async fn confirm_slot(&self, slot: Slot, node: &str, seen: i64, foreign: i64) -> StoreResult<Option<Slot>> {
        let checked = self.check_taken_slot(&slot, seen, foreign).await;
        if !matches!(checked, Ok(true)) {
            // Not allowed, or not known to be: given back before anything is claimed with it.
            self.give_back_slot(&slot, node).await?;
        }
        Ok(checked?.then_some(slot))
    }

    /// Whether the stored limit, less `foreign` tasks, allows a slot taken under `seen`
    /// (see `confirm_slot`).
    async fn check_taken_slot(&self, slot: &Slot, seen: i64, foreign: i64) -> StoreResult<bool> {
        let stored = self.stored_limit(slot.queue, foreign).await?;
        Ok(slot.n < stored && (stored >= seen || self.slots_used_from(slot.queue, stored).await? == 0))
    }

    /// The limit of `queue` as stored now, less the `foreign` tasks Disbatch 4 DENs run in
    /// it (0 when the queue is gone or unreadable).
    async fn stored_limit(&self, queue: bson::oid::ObjectId, foreign: i64) -> StoreResult<i64> {
        let stored = self
            .queues
            .find_one(doc! { "_id": queue })
            .await
            .map_err(db_err("read the queue's limit"))?
            .and_then(|d| crate::store::queue_doc::read(&d).ok())
            .map_or(0, |(q, _)| q.limit());
        Ok(stored - foreign)
    }

    /// [`Store::slots_in_use`](crate::store::Store::slots_in_use).
    pub(super) async fn occupied_slots(&self, queue: bson::oid::ObjectId) -> StoreResult<i64> {
        Ok(self.slots_used_from(queue, 0).await? + self.foreign_running(queue).await?)
    }

    /// The slots of `queue` numbered `from` or above in use: held and unexpired, or
    /// expired while their holder still has a claimed or running task of the queue.
    async fn slots_used_from(&self, queue: bson::oid::ObjectId, from: i64) -> StoreResult<i64> {
        let err = db_err("count the queue's slots in use");
        let now = DateTime::now();
        let held: Vec<Document> = self
            .slots
            .find(doc! { "queue": queue, "n": { "$gte": from }, "holder": { "$ne": null } })
            .projection(doc! { "holder": 1, "expires": 1 })
            .await
            .map_err(&err)?
            .try_collect()
            .await
            .map_err(&err)?;
        let mut in_use = 0;
        for slot in held {
            let live = slot.get_datetime("expires").is_ok_and(|e| *e > now);
            let busy = || async {
                let holder = slot.get("holder").cloned().unwrap_or(bson::Bson::Null);
                self.tasks
                    .count_documents(doc! {
                        "queue": queue,
                        "node": holder,
                        "status": { "$in": status::BUSY.to_vec() },
                    })
                    .limit(1)
                    .await
                    .map_err(&err)
            };
            if live || busy().await? > 0 {
                in_use += 1;
            }
        }
        Ok(in_use)
    }

    /// Takes a slot whose lease expired, but only from a holder that has no claimed or
    /// running task left in the queue: a slot is freed only with (or after) the recovery
    /// of its holder's tasks, so the tasks at -1/0 never outnumber `threads`.
    async fn take_expired_slot(
        &self,
        queue: &Queue,
        threads: i64,
        node: &str,
        take: ObjectId,
        now: DateTime,
        lease_until: DateTime,
    ) -> StoreResult<Option<Document>> {
        let err = db_err("acquire an expired slot");
        let expired: Vec<Document> = self
            .slots
            .find(doc! {
                "queue": queue.id,
                "n": { "$lt": threads },
                "holder": { "$ne": null },
                "expires": { "$lt": now },
            })
            .sort(doc! { "n": 1 })
            .await
            .map_err(&err)?
            .try_collect()
            .await
            .map_err(&err)?;
        for slot in expired {
            let (Ok(id), Some(holder)) = (slot.get_object_id("_id"), slot.get("holder").cloned()) else {
                continue;
            };
            let busy = self
                .tasks
                .count_documents(doc! {
                    "queue": queue.id,
                    "node": holder.clone(),
                    "status": { "$in": status::BUSY.to_vec() },
                })
                .limit(1)
                .await
                .map_err(&err)?;
            if busy > 0 {
                continue;
            }
            let taken = self
                .slots
                .find_one_and_update(
                    doc! { "_id": id, "holder": holder, "expires": { "$lt": now } },
                    doc! { "$set": { "holder": node, "taken": take, "expires": lease_until, "want": null, "want_until": null } },
                )
                .return_document(ReturnDocument::After)
                .await
                .map_err(&err)?;
            if taken.is_some() {
                return Ok(taken);
            }
        }
        Ok(None)
    }

    /// [`Store::renew_slot`](crate::store::Store::renew_slot): renews the lease when
    /// `node` still holds the slot and nobody asked for it; gives it up to an asker.
    pub(super) async fn renew_one_slot(&self, slot: &Slot, node: &str, lease: Duration) -> StoreResult<SlotRenewal> {
        let err = db_err("renew slot lease");
        let foreign = self.foreign_running(slot.queue).await?;
        if foreign > 0 && slot.n >= self.stored_limit(slot.queue, foreign).await? {
            return Ok(SlotRenewal::OverLimit);
        }
        let now = DateTime::now();
        let mine = doc! { "queue": slot.queue, "n": slot.n, "holder": node, "taken": slot.taken };
        // An expired lease is not renewed: the slot may have been counted free since.
        let mut live = mine.clone();
        live.insert("expires", doc! { "$gt": now });
        let mut unasked = live.clone();
        unasked.insert(
            "$or",
            vec![doc! { "want": null }, doc! { "want_until": { "$lt": now } }],
        );
        let renew = doc! { "$set": { "expires": lease_end(now, lease) } };
        if self
            .slots
            .update_one(unasked, renew.clone())
            .await
            .map_err(&err)?
            .matched_count
            == 1
        {
            return Ok(SlotRenewal::Held);
        }
        let Some(current) = self.slots.find_one(mine.clone()).await.map_err(&err)? else {
            return Ok(SlotRenewal::Lost);
        };
        if let (Ok(to), Ok(until)) = (current.get_str("want"), current.get_datetime("want_until")) {
            let mut asked = mine.clone();
            asked.insert("want", to);
            let give = doc! {
                "$set": { "holder": null, "reserved": to, "reserved_until": until, "want": null, "want_until": null },
            };
            if self.slots.update_one(asked, give).await.map_err(&err)?.matched_count == 1 {
                return Ok(SlotRenewal::Yielded { to: to.to_string() });
            }
        }
        // The ask ended or changed meanwhile: keep the slot if it is still ours.
        let held = self.slots.update_one(live, renew).await.map_err(&err)?.matched_count == 1;
        Ok(if held { SlotRenewal::Held } else { SlotRenewal::Lost })
    }

    /// [`Store::want_slot`](crate::store::Store::want_slot). Not while the queue is over
    /// its limit (a slot given up then could not be taken). One live ask per node and
    /// queue, moved to the donor's next slot at each ask, so a slot busy with a long task
    /// does not hold the asker up.
    pub(super) async fn ask_for_slot(&self, queue: &Queue, node: &str, ask: Duration) -> StoreResult<Option<String>> {
        // A slot Disbatch 4 DENs' tasks leave no room for could not be taken.
        let threads = queue.limit() - self.foreign_running(queue.id).await?;
        if threads <= 0 {
            return Ok(None);
        }
        let err = db_err("ask for a slot");
        let now = DateTime::now();
        let live: Vec<Document> = self
            .slots
            .find(doc! { "queue": queue.id, "holder": { "$ne": null }, "expires": { "$gt": now } })
            .projection(doc! { "holder": 1, "n": 1, "want": 1, "want_until": 1 })
            .await
            .map_err(&err)?
            .try_collect()
            .await
            .map_err(&err)?;
        let n_of = |d: &Document| d.get("n").and_then(as_int).unwrap_or(i64::MAX);
        if live.iter().any(|d| n_of(d) >= threads) {
            return Ok(None);
        }
        let holders = live.iter().filter_map(|d| d.get_str("holder").ok());
        let Some(most) = crate::store::fair_share_donor(holders, node) else {
            return Ok(None);
        };
        // The donor's slot after the one asked last (in slot order, round).
        let askable = |d: &Document| match d.get_str("want") {
            Ok(w) => w == node || d.get_datetime("want_until").map_or(true, |u| *u < now),
            Err(_) => true,
        };
        let mut theirs: Vec<(i64, bool)> = live
            .iter()
            .filter(|d| d.get_str("holder") == Ok(most.as_str()) && askable(d))
            .map(|d| (n_of(d), d.get_str("want") == Ok(node)))
            .collect();
        if theirs.is_empty() {
            // Every slot of the donor is asked for by others already.
            return Ok(None);
        }
        theirs.sort_unstable();
        let last = theirs.iter().position(|(_, mine)| *mine);
        let (n, _) = theirs[last.map_or(0, |i| (i + 1) % theirs.len())];
        self.slots
            .update_many(
                doc! { "queue": queue.id, "want": node, "n": { "$ne": n } },
                doc! { "$set": { "want": null, "want_until": null } },
            )
            .await
            .map_err(&err)?;
        let asked = self
            .slots
            .update_one(
                doc! {
                    "queue": queue.id,
                    "n": n,
                    "holder": &most,
                    "$or": [{ "want": null }, { "want_until": { "$lt": now } }, { "want": node }],
                },
                doc! { "$set": { "want": node, "want_until": lease_end(now, ask) } },
            )
            .await
            .map_err(&err)?;
        Ok((asked.matched_count == 1).then_some(most))
    }

    /// [`Store::release_slot`](crate::store::Store::release_slot), fenced on the holder.
    pub(super) async fn give_back_slot(&self, slot: &Slot, node: &str) -> StoreResult<()> {
        self.slots
            .update_one(
                doc! { "queue": slot.queue, "n": slot.n, "holder": node, "taken": slot.taken },
                doc! { "$set": { "holder": null, "want": null, "want_until": null } },
            )
            .await
            .map_err(db_err("release slot"))?;
        Ok(())
    }

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

    /// Frees every slot held by one of `nodes` (only those whose lease expired before
    /// `expired_before`, when given: a node that came back has renewed its leases).
    pub(super) async fn free_slots_of(&self, nodes: &[String], expired_before: Option<DateTime>) -> StoreResult<()> {
        if nodes.is_empty() {
            return Ok(());
        }
        let mut filter = doc! { "holder": { "$in": nodes } };
        if let Some(t) = expired_before {
            filter.insert("expires", doc! { "$lt": t });
        }
        self.slots
            .update_many(
                filter,
                doc! { "$set": { "holder": null, "want": null, "want_until": null } },
            )
            .await
            .map_err(db_err("free slots of stale nodes"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_end_adds_and_saturates() {
        let now = DateTime::from_millis(1_000);
        assert_eq!(lease_end(now, Duration::from_secs(30)), DateTime::from_millis(31_000));
        assert_eq!(lease_end(now, Duration::MAX), DateTime::from_millis(i64::MAX));
    }
}
