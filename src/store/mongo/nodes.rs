//! Node documents: heartbeats, the node-name guard, and the DENs of Disbatch 4 that share
//! the database during a migration.
//!
//! A node document written by this implementation always has a `process` field (the
//! holding process, or null once it stopped), and each of its heartbeats writes the same
//! time to `timestamp` and `beat`. A Disbatch 4 DEN writes `{node, timestamp}`: on a new
//! name it writes no `process`, and on a name ours held before it reads the document and
//! writes it back whole with a new `timestamp`, so `beat` falls behind. Either way the node
//! is *foreign* ([`is_foreign`]). Foreign DENs claim tasks without taking slots, so their
//! claimed and running tasks are counted against each queue's limit here (see
//! `foreign_running`), and a foreign node's name is not taken while its heartbeat is fresh
//! or while it has claimed or running tasks.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use futures::TryStreamExt;
use mongodb::options::ReturnDocument;

use super::documents::{as_date, node_from};
use super::errors::{db_err, is_duplicate_key};
use super::{slots, MongoStore};
use crate::model::{status, NameHolder, Node, NodeProcess, NodeStats};
use crate::store::queue_doc::opt_int_bson;
use crate::store::{StoreError, StoreResult};

/// How long the list of foreign nodes is used before it is read again.
const FOREIGN_TTL: Duration = Duration::from_secs(1);

/// The names of the foreign nodes, as read at `read`.
pub(super) struct ForeignNodes {
    read: Instant,
    names: Vec<String>,
}

impl MongoStore {
    pub(super) async fn beat_node(&self, node: &str, lease: Duration) -> StoreResult<Node> {
        let now = DateTime::now();
        self.renew_slots(node, slots::lease_end(now, lease)).await?;
        // `process` and `beat` mark a document of this implementation (see the module's doc).
        let update = doc! {
            "$set": { "timestamp": now, "beat": now },
            "$setOnInsert": { "maxthreads": null, "process": null },
        };
        let mut attempt = 0;
        let found = loop {
            let result = self
                .nodes
                .find_one_and_update(doc! { "node": node }, update.clone())
                .upsert(true)
                .return_document(ReturnDocument::After)
                .await;
            match result {
                // Two upserts of a new node raced; the other one inserted it.
                Err(e) if is_duplicate_key(&e) && attempt == 0 => attempt += 1,
                other => break other.map_err(db_err("heartbeat"))?,
            }
        };
        let found =
            found.ok_or_else(|| StoreError::Database(format!("heartbeat of node {node:?} returned nothing")))?;
        node_from(&found)
    }

    /// [`Store::take_node`](crate::store::Store::take_node): reads the node document and
    /// takes the name with an update fenced on what was read, so two processes never both
    /// take it.
    pub(super) async fn take_node_name(
        &self,
        node: &str,
        process: &NodeProcess,
        stale_before: DateTime,
    ) -> StoreResult<Option<NameHolder>> {
        let err = db_err("take node name");
        let process_doc = bson::to_document(process).map_err(|e| StoreError::Invalid(format!("node process: {e}")))?;
        for _ in 0..3 {
            let now = DateTime::now();
            let Some(current) = self.nodes.find_one(doc! { "node": node }).await.map_err(&err)? else {
                let new = doc! { "node": node, "process": process_doc.clone(), "timestamp": now, "beat": now, "maxthreads": null };
                match self.nodes.insert_one(new).await {
                    Ok(_) => {
                        // A node document deleted by hand may have left tasks behind.
                        self.recover_node(node).await?;
                        return Ok(None);
                    }
                    // Another process created it meanwhile: read it again.
                    Err(e) if is_duplicate_key(&e) => continue,
                    Err(e) => return Err(err(e)),
                }
            };
            let heartbeat = current.get("timestamp").and_then(as_date);
            let stale = heartbeat.is_none_or(|t| t < stale_before);
            let foreign = is_foreign(&current);
            if foreign {
                // Its task runners outlive it and write their own results: the name stays
                // theirs while the DEN lives or any of its tasks is claimed or running.
                let tasks = if stale {
                    self.tasks
                        .count_documents(super::recovery::held_by(node))
                        .await
                        .map_err(&err)?
                } else {
                    0
                };
                if !stale || tasks > 0 {
                    return Ok(Some(NameHolder::Foreign {
                        heartbeat,
                        heartbeat_age: age(now, heartbeat),
                        tasks,
                    }));
                }
            }
            if !foreign && !stale {
                if let Some(holder) = node_from(&current)?.process.filter(|p| p.id != process.id) {
                    return Ok(Some(NameHolder::Den(holder)));
                }
            }
            let taken = self
                .nodes
                .update_one(
                    unchanged(&current),
                    doc! { "$set": { "process": process_doc.clone(), "timestamp": now, "beat": now } },
                )
                .await
                .map_err(&err)?;
            if taken.matched_count == 0 {
                // Someone wrote the document between the read and the update.
                continue;
            }
            // Whatever the node's name still holds belongs to a process that is gone (a
            // foreign node gets here only without claimed or running tasks).
            self.recover_node(node).await?;
            return Ok(None);
        }
        Err(StoreError::Database(format!(
            "cannot take node name {node:?}: its document keeps changing"
        )))
    }

    pub(super) async fn write_queue_problems(
        &self,
        node: &str,
        problems: &BTreeMap<String, String>,
    ) -> StoreResult<()> {
        let problems: Document = problems
            .iter()
            .map(|(k, v)| (k.clone(), Bson::String(v.clone())))
            .collect();
        self.nodes
            .update_one(doc! { "node": node }, doc! { "$set": { "queue_problems": problems } })
            .await
            .map_err(db_err("report queue problems"))?;
        Ok(())
    }

    pub(super) async fn give_up_node(&self, node: &str, process: ObjectId) -> StoreResult<()> {
        self.nodes
            .update_one(
                doc! { "node": node, "process.id": process },
                doc! { "$set": { "process": null } },
            )
            .await
            .map_err(db_err("release node name"))?;
        Ok(())
    }

    pub(super) async fn list_nodes(&self) -> StoreResult<Vec<Node>> {
        let docs: Vec<Document> = self
            .nodes
            .find(doc! {})
            .sort(doc! { "node": 1 })
            .await
            .map_err(db_err("list nodes"))?
            .try_collect()
            .await
            .map_err(db_err("list nodes"))?;
        let mut nodes = Vec::with_capacity(docs.len());
        for d in &docs {
            match node_from(d) {
                Ok(n) => nodes.push(n),
                Err(e) => self.warn_once(format!("ignoring node document: {e}")),
            }
        }
        Ok(nodes)
    }

    pub(super) async fn write_maxthreads(&self, node: &str, maxthreads: Option<i64>) -> StoreResult<bool> {
        crate::store::queue_doc::check_count("maxthreads", maxthreads)?;
        let result = self
            .nodes
            .update_one(
                doc! { "node": node },
                doc! { "$set": { "maxthreads": opt_int_bson(maxthreads) } },
            )
            .await
            .map_err(db_err("set maxthreads"))?;
        Ok(result.matched_count > 0)
    }

    pub(super) async fn write_stats(&self, node: &str, stats: &NodeStats) -> StoreResult<()> {
        let stats = bson::to_bson(stats).map_err(|e| StoreError::Invalid(format!("node stats: {e}")))?;
        self.nodes
            .update_one(doc! { "node": node }, doc! { "$set": { "stats": stats } })
            .await
            .map_err(db_err("report node stats"))?;
        Ok(())
    }

    /// The names of the nodes without a process marker (Disbatch 4 DENs), read at most
    /// once per [`FOREIGN_TTL`].
    pub(super) async fn foreign_nodes(&self) -> StoreResult<Vec<String>> {
        if let Ok(cached) = self.foreign.lock() {
            if let Some(f) = cached.as_ref().filter(|f| f.read.elapsed() < FOREIGN_TTL) {
                return Ok(f.names.clone());
            }
        }
        let err = db_err("list Disbatch 4 nodes");
        let names: Vec<String> = self
            .nodes
            .find(doc! {})
            .projection(doc! { "node": 1, "process": 1, "beat": 1, "timestamp": 1 })
            .await
            .map_err(&err)?
            .try_collect::<Vec<Document>>()
            .await
            .map_err(&err)?
            .iter()
            .filter(|d| is_foreign(d))
            .filter_map(|d| d.get_str("node").ok().map(str::to_owned))
            .collect();
        if let Ok(mut cached) = self.foreign.lock() {
            *cached = Some(ForeignNodes {
                read: Instant::now(),
                names: names.clone(),
            });
        }
        Ok(names)
    }

    /// The claimed (-1) and running (0) tasks of `queue` on foreign nodes, which hold no
    /// slot: they count against the queue's limit as Disbatch 4 counts ours against it.
    /// Without foreign nodes this costs no query beyond the cached node list.
    pub(super) async fn foreign_running(&self, queue: ObjectId) -> StoreResult<i64> {
        let names = self.foreign_nodes().await?;
        if names.is_empty() {
            return Ok(0);
        }
        let n = self
            .tasks
            .count_documents(doc! {
                "queue": queue,
                "status": { "$in": status::BUSY.to_vec() },
                "node": { "$in": names },
            })
            .await
            .map_err(db_err("count the tasks of Disbatch 4 nodes"))?;
        Ok(i64::try_from(n).unwrap_or(i64::MAX))
    }
}

/// Whether a node document was last heartbeaten by a Disbatch 4 DEN: it has no `process`,
/// or its `beat` differs from its `timestamp` (a document of ours written back whole with a
/// new `timestamp`). A document with `process` and no `beat` was written by an earlier
/// version of this implementation.
pub(super) fn is_foreign(node: &Document) -> bool {
    match (node.get("process"), node.get("beat")) {
        (None, _) => true,
        (Some(_), Some(beat)) => node.get("timestamp") != Some(beat),
        (Some(_), None) => false,
    }
}

/// How old a heartbeat at `at` is at `now` (zero when unreadable or in the future).
fn age(now: DateTime, at: Option<DateTime>) -> Duration {
    at.map_or(Duration::ZERO, |t| {
        Duration::from_millis(u64::try_from(now.timestamp_millis() - t.timestamp_millis()).unwrap_or(0))
    })
}

/// The filter matching `current` as read, field for field where the take depends on it:
/// its `timestamp` and its `process` (or that it has none).
fn unchanged(current: &Document) -> Document {
    let mut fence = doc! { "_id": current.get("_id").cloned().unwrap_or(Bson::Null) };
    for field in ["timestamp", "process"] {
        match current.get(field) {
            Some(v) => fence.insert(field, v.clone()),
            None => fence.insert(field, doc! { "$exists": false }),
        };
    }
    fence
}
