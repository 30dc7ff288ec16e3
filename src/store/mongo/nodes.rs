//! Node documents: heartbeats, the node-name guard, and the DENs of Disbatch 4 that share
//! the database during a migration.
//!
//! A node document written by this implementation always has a `process` field (the
//! holding process, or null once it stopped), and each of its heartbeats writes the same
//! time to `timestamp` and `beat`. A Disbatch 4 DEN writes `{node, timestamp}`: on a new
//! name it writes no `process`, and on a name ours held before it reads the document and
//! writes it back whole with a new `timestamp`, so `beat` falls behind. Either way the node
//! is *foreign* ([`is_foreign`], read as [`NodeRecord::foreign`]). Foreign DENs claim
//! tasks without taking slots, so their claimed and running tasks are counted against each
//! queue's limit (`busy_nodes` in `slots`, used by `lifecycle::slots`); when a foreign
//! node's name may be taken is decided in [`lifecycle::nodes`](crate::lifecycle::nodes).

use std::time::{Duration, Instant};

use bson::{doc, Bson, DateTime, Document};
use futures::TryStreamExt;
use mongodb::options::ReturnDocument;

use super::errors::{db_err, is_duplicate_key};
use super::records::{as_date, node_from};
use super::MongoStore;
use crate::model::{Node, NodeProcess};
use crate::store::queue_doc::opt_int_bson;
use crate::store::{NodeChange, NodeFence, NodeRecord, StoreError, StoreResult};

/// How long the list of foreign nodes is used before it is read again.
const FOREIGN_TTL: Duration = Duration::from_secs(1);

/// The names of the foreign nodes, as read at `read`.
pub(super) struct ForeignNodes {
    read: Instant,
    names: Vec<String>,
}

impl MongoStore {
    pub(super) async fn heartbeat(&self, node: &str, lease: Duration) -> StoreResult<Node> {
        let now = DateTime::now();
        self.renew_slots(node, crate::store::lease_end(now, lease)).await?;
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

    /// [`Store::change_node`](crate::store::Store::change_node): one `update_one` on the
    /// node's name, and its `process.id` under [`NodeFence::HeldBy`].
    pub(super) async fn change_node(&self, node: &str, fence: NodeFence, change: NodeChange) -> StoreResult<bool> {
        let mut filter = doc! { "node": node };
        match fence {
            NodeFence::Any => {}
            NodeFence::HeldBy(process) => {
                filter.insert("process.id", process);
            }
            NodeFence::Absent => return self.insert_node(node, change).await,
            NodeFence::AsRead { heartbeat, process } => {
                match heartbeat {
                    Some(at) => {
                        filter.insert("$or", heartbeat_as_read(at));
                    }
                    None => {
                        filter.insert("timestamp", unreadable_date());
                    }
                }
                filter.insert(
                    "process.id",
                    process.map_or_else(|| doc! { "$exists": false }.into(), Bson::ObjectId),
                );
            }
        }
        let set = match change {
            NodeChange::Take(process) => {
                let now = DateTime::now();
                // `process` and `beat` mark a document of this implementation (see the module's doc).
                doc! { "process": process_bson(&process)?, "timestamp": now, "beat": now }
            }
            NodeChange::Release => doc! { "process": null },
            NodeChange::Maxthreads(n) => doc! { "maxthreads": opt_int_bson(n) },
            NodeChange::Stats(stats) => {
                let stats = bson::to_bson(&stats).map_err(|e| StoreError::Invalid(format!("node stats: {e}")))?;
                doc! { "stats": stats }
            }
            NodeChange::QueueProblems(problems) => {
                let problems: Document = problems.into_iter().map(|(k, v)| (k, Bson::String(v))).collect();
                doc! { "queue_problems": problems }
            }
        };
        let result = self
            .nodes
            .update_one(filter, doc! { "$set": set })
            .await
            .map_err(db_err("change node"))?;
        Ok(result.matched_count > 0)
    }

    /// [`NodeFence::Absent`]: creates the node document with `change` applied; false when
    /// it exists already.
    async fn insert_node(&self, node: &str, change: NodeChange) -> StoreResult<bool> {
        let NodeChange::Take(process) = change else {
            return Ok(false);
        };
        let now = DateTime::now();
        let new = doc! { "node": node, "process": process_bson(&process)?, "timestamp": now, "beat": now, "maxthreads": null };
        match self.nodes.insert_one(new).await {
            Ok(_) => Ok(true),
            Err(e) if is_duplicate_key(&e) => Ok(false),
            Err(e) => Err(db_err("create node")(e)),
        }
    }

    /// [`Store::node`](crate::store::Store::node).
    pub(super) async fn node(&self, node: &str) -> StoreResult<Option<NodeRecord>> {
        let found = self
            .nodes
            .find_one(doc! { "node": node })
            .await
            .map_err(db_err("read node"))?;
        let Some(found) = found else { return Ok(None) };
        Ok(Some(NodeRecord {
            node: node_from(&found)?,
            heartbeat: found.get("timestamp").and_then(as_date),
            foreign: is_foreign(&found),
        }))
    }

    pub(super) async fn nodes(&self) -> StoreResult<Vec<Node>> {
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

/// A node's `process` sub-document.
fn process_bson(process: &NodeProcess) -> StoreResult<Document> {
    bson::to_document(process).map_err(|e| StoreError::Invalid(format!("node process: {e}")))
}

/// The filter of a `timestamp` the reader ([`as_date`]) reads as `at`: the date itself, or
/// the epoch number in seconds or in milliseconds that rounds to it (Disbatch 4 writes
/// epoch seconds, whole or fractional), or its decimal string. A heartbeat written since
/// the read moves it out of all of them.
fn heartbeat_as_read(at: DateTime) -> Bson {
    let ms = at.timestamp_millis();
    let (lo, hi) = (ms as f64 - 0.5, ms as f64 + 0.5);
    Bson::Array(vec![
        doc! { "timestamp": at }.into(),
        doc! { "timestamp": { "$gte": lo / 1000.0, "$lt": hi / 1000.0 } }.into(),
        doc! { "timestamp": { "$gte": lo, "$lt": hi } }.into(),
        doc! { "timestamp": { "$in": [(ms / 1000).to_string(), ms.to_string()] } }.into(),
    ])
}

/// The filter of a `timestamp` that cannot be read as a time (taken as stale).
fn unreadable_date() -> Bson {
    Bson::Document(doc! { "$not": { "$type": "date" } })
}
