//! Orphan recovery: tasks of dead nodes and the spec's sweep of stale claims.
//!
//! A node is fresh when its `timestamp` is at or after `stale_before`. Claimed or running
//! tasks of any other node (stale, or without a node document) are recovered only once
//! their own `mtime` is before `stale_before` too, so a task claimed a moment ago by a
//! node that registered after the node list was read is left alone. Each task is updated
//! on the condition that its status, node and mtime are still the ones read, so a task
//! that moved on meanwhile is never touched.

use std::collections::HashMap;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use futures::TryStreamExt;

use super::documents::{as_date, as_int};
use super::retries::retry_update;
use super::{db_err, MongoStore};
use crate::model::{status, OnOrphan, RetryPolicy};
use crate::store::queue_doc::on_orphan_lenient;
use crate::store::retries::{recover_as, Recover};
use crate::store::{Recovery, StoreResult};

/// A queue's recovery policy: `on_orphan`, and `retry` when it can be read.
type Policy = (OnOrphan, Option<RetryPolicy>);

/// The filter of the tasks `node` holds: claimed (-1) or running (0) on it.
pub(super) fn held_by(node: &str) -> Document {
    doc! { "node": node, "status": { "$in": status::BUSY.to_vec() } }
}

/// Whether a task document carries a kill request.
fn asked_to_kill(t: &Document) -> bool {
    t.get_document("stop").ok().and_then(|s| s.get_str("action").ok()) == Some("kill")
}

impl MongoStore {
    /// [`Store::recover_orphans`](crate::store::Store::recover_orphans).
    pub(super) async fn recover(&self, claimed_before: DateTime, stale_before: DateTime) -> StoreResult<Recovery> {
        let (fresh, stale) = self.nodes_by_freshness(stale_before).await?;
        // A Disbatch 4 DEN's running tasks are never recovered here: its task runners
        // outlive it (it restarts with them running) and write their results themselves.
        // Only the spec's sweep of claims that never started applies to them.
        let mut spared = fresh;
        spared.extend(self.foreign_nodes().await?);
        let filter = doc! { "$or": [
            { "status": status::CLAIMED, "mtime": { "$lt": claimed_before } },
            {
                "status": { "$in": status::BUSY.to_vec() },
                "node": { "$nin": spared },
                "mtime": { "$lt": stale_before },
            },
        ]};
        self.recover_matching("recover orphans", filter, &stale, Some(DateTime::now()))
            .await
    }

    /// Recovers, at once, every claimed or running task of `node` and frees its slots:
    /// the tasks of a dead process whose name a new process just took (the new process
    /// has none yet).
    pub(super) async fn recover_node(&self, node: &str) -> StoreResult<Recovery> {
        let filter = held_by(node);
        let holders = [node.to_string()];
        self.recover_matching("recover the tasks of a restarted node", filter, &holders, None)
            .await
    }

    /// Recovers the tasks matching `filter` (by their queue's `on_orphan` policy), then
    /// frees the slots held by those of `holders` that have no claimed or running task
    /// left (only leases expired before `expired_before`, when given): slots are freed only
    /// after their tasks. A stale node's task written after its last heartbeat is not yet
    /// recovered (its own `mtime` is fresh), so that node keeps its slots until it is.
    async fn recover_matching(
        &self,
        what: &'static str,
        filter: Document,
        holders: &[String],
        expired_before: Option<DateTime>,
    ) -> StoreResult<Recovery> {
        let err = db_err(what);
        let policies = self.orphan_policies().await?;
        let candidates: Vec<Document> = self
            .tasks
            .find(filter)
            .projection(
                doc! { "queue": 1, "status": 1, "node": 1, "mtime": 1, "stop.action": 1, "attempts": 1, "priority": 1 },
            )
            .await
            .map_err(&err)?
            .try_collect()
            .await
            .map_err(&err)?;
        let recovery = self.recover_candidates(candidates, &policies).await?;
        let mut idle = Vec::with_capacity(holders.len());
        for holder in holders {
            let busy = self
                .tasks
                .count_documents(held_by(holder))
                .limit(1)
                .await
                .map_err(&err)?;
            if busy == 0 {
                idle.push(holder.clone());
            }
        }
        self.free_slots_of(&idle, expired_before).await?;
        Ok(recovery)
    }

    /// Each queue's `on_orphan` and `retry` policies (a `retry` that cannot be read is
    /// left out, so its tasks are still recovered).
    async fn orphan_policies(&self) -> StoreResult<HashMap<ObjectId, Policy>> {
        let err = db_err("recover orphans");
        let mut policies: HashMap<ObjectId, Policy> = HashMap::new();
        let mut cursor = self
            .queues
            .find(doc! {})
            .projection(doc! { "on_orphan": 1, "retry": 1 })
            .await
            .map_err(&err)?;
        while let Some(q) = cursor.try_next().await.map_err(&err)? {
            if let Ok(id) = q.get_object_id("_id") {
                let retry = q.get("retry").and_then(|r| RetryPolicy::from_bson(r).ok());
                policies.insert(id, (on_orphan_lenient(&q), retry));
            }
        }
        Ok(policies)
    }

    /// Orphans or requeues each candidate task, fenced on its status, node and mtime.
    async fn recover_candidates(
        &self,
        candidates: Vec<Document>,
        policies: &HashMap<ObjectId, Policy>,
    ) -> StoreResult<Recovery> {
        let err = db_err("recover orphans");
        let mut recovery = Recovery::default();
        let now = DateTime::now();
        for t in candidates {
            let Ok(id) = t.get_object_id("_id") else { continue };
            let observed = |field: &str| t.get(field).cloned().unwrap_or(Bson::Null);
            let fence = doc! {
                "_id": id,
                "status": observed("status"),
                "node": observed("node"),
                "mtime": observed("mtime"),
            };
            // Tasks of a queue that no longer exists are orphaned, and so are tasks someone
            // asked to kill: they must not run again.
            let (on_orphan, retry) = match t.get("queue") {
                Some(Bson::ObjectId(q)) => policies.get(q).cloned().unwrap_or_default(),
                _ => Policy::default(),
            };
            let made = crate::model::counted_runs(&crate::model::Attempt::list_from(t.get("attempts")));
            let priority = t.get("priority").and_then(as_int).unwrap_or(0);
            let how = recover_as(
                t.get_str("node").ok(),
                asked_to_kill(&t),
                on_orphan,
                retry.as_ref(),
                made,
                priority,
                now,
            );
            let update = match &how {
                Recover::Requeue => doc! {
                    "$set": { "status": status::QUEUED, "node": null, "mtime": now },
                    "$unset": { "rerun": "" },
                },
                Recover::Retry(r) => retry_update(r, now),
                Recover::Orphan(None) => doc! {
                    "$set": { "status": status::ORPHANED, "mtime": now },
                    "$unset": { "rerun": "" },
                },
                Recover::Orphan(Some(a)) => doc! {
                    "$set": { "status": status::ORPHANED, "mtime": now },
                    "$unset": { "rerun": "" },
                    "$push": { "attempts": a.to_document() },
                },
            };
            let result = self.tasks.update_one(fence, update).await.map_err(&err)?;
            if result.modified_count == 1 {
                match how {
                    Recover::Requeue => recovery.requeued.push(id),
                    Recover::Retry(_) => recovery.retried.push(id),
                    Recover::Orphan(_) => recovery.orphaned.push(id),
                }
            }
        }
        Ok(recovery)
    }

    /// The names of fresh nodes and of stale ones (including those without a readable
    /// `timestamp`; an epoch number is read as other clients write it).
    async fn nodes_by_freshness(&self, stale_before: DateTime) -> StoreResult<(Vec<String>, Vec<String>)> {
        let err = db_err("list nodes");
        let (mut fresh, mut stale) = (Vec::new(), Vec::new());
        let mut cursor = self
            .nodes
            .find(doc! {})
            .projection(doc! { "node": 1, "timestamp": 1 })
            .await
            .map_err(&err)?;
        while let Some(n) = cursor.try_next().await.map_err(&err)? {
            let Ok(name) = n.get_str("node") else { continue };
            match n.get("timestamp").and_then(as_date) {
                Some(t) if t >= stale_before => fresh.push(name.to_string()),
                _ => stale.push(name.to_string()),
            }
        }
        Ok((fresh, stale))
    }
}
