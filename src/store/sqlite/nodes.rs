//! Nodes in the embedded store: heartbeats, node names, `maxthreads`, reported stats.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::DateTime;
use rusqlite::{params, Connection, OptionalExtension};

use super::records::{db_err, lease_end};
use super::{parse_oid, slots, SqliteStore};
use crate::model::Node;
use crate::store::{NodeChange, NodeFence, NodeRecord, StoreError, StoreResult};

impl SqliteStore {
    pub(super) async fn heartbeat(&self, node: &str, lease: Duration) -> StoreResult<Node> {
        let node = node.to_string();
        self.write_liveness("heartbeat", move |tx| {
            let now = DateTime::now();
            slots::renew_slots(tx, &node, lease_end(now, lease))?;
            let err = db_err("heartbeat");
            tx.execute(
                "INSERT INTO nodes (id, node, timestamp, maxthreads) VALUES (?1, ?2, ?3, NULL)
                 ON CONFLICT (node) DO UPDATE SET timestamp = excluded.timestamp",
                params![ObjectId::new().to_hex(), node, now.timestamp_millis()],
            )
            .map_err(&err)?;
            let row = read_node_row(tx, &node).map_err(&err)?;
            node_from(row.ok_or_else(|| StoreError::Database(format!("heartbeat of node {node:?} stored nothing")))?)
        })
        .await
    }

    /// [`Store::change_node`](crate::store::Store::change_node): the fence read and the
    /// change written in one write transaction.
    pub(super) async fn change_node(&self, node: &str, fence: NodeFence, change: NodeChange) -> StoreResult<bool> {
        // Serialized before the transaction, so a bad value is refused without writing.
        let json = match &change {
            NodeChange::Stats(stats) => {
                Some(serde_json::to_string(stats).map_err(|e| StoreError::Invalid(format!("node stats: {e}")))?)
            }
            NodeChange::QueueProblems(problems) => {
                Some(serde_json::to_string(problems).map_err(|e| StoreError::Invalid(format!("queue problems: {e}")))?)
            }
            NodeChange::Take(process) => {
                Some(serde_json::to_string(process).map_err(|e| StoreError::Invalid(format!("node process: {e}")))?)
            }
            NodeChange::Release | NodeChange::Maxthreads(_) => None,
        };
        let node = node.to_string();
        self.write_quiet("change node", move |tx| {
            let err = db_err("change node");
            let matched: bool = match fence {
                NodeFence::Any => tx.query_row("SELECT EXISTS (SELECT 1 FROM nodes WHERE node = ?1)", [&node], |r| {
                    r.get(0)
                }),
                NodeFence::HeldBy(process) => tx.query_row(
                    "SELECT EXISTS (SELECT 1 FROM nodes JOIN node_process ON node_process.node = nodes.node
                     WHERE nodes.node = ?1 AND node_process.id = ?2)",
                    params![node, process.to_hex()],
                    |r| r.get(0),
                ),
                NodeFence::Absent => tx.query_row(
                    "SELECT NOT EXISTS (SELECT 1 FROM nodes WHERE node = ?1)",
                    [&node],
                    |r| r.get(0),
                ),
                // Every timestamp here is a time: an unreadable one never matches.
                NodeFence::AsRead { heartbeat, process } => tx.query_row(
                    "SELECT EXISTS (SELECT 1 FROM nodes LEFT JOIN node_process ON node_process.node = nodes.node
                     WHERE nodes.node = ?1 AND nodes.timestamp = ?2 AND node_process.id IS ?3)",
                    params![
                        node,
                        heartbeat.map(|t| t.timestamp_millis()),
                        process.map(|p| p.to_hex())
                    ],
                    |r| r.get(0),
                ),
            }
            .map_err(&err)?;
            if !matched {
                return Ok(false);
            }
            match &change {
                NodeChange::Take(process) => {
                    tx.execute(
                        "INSERT INTO nodes (id, node, timestamp, maxthreads) VALUES (?1, ?2, ?3, NULL)
                         ON CONFLICT (node) DO UPDATE SET timestamp = excluded.timestamp",
                        params![ObjectId::new().to_hex(), node, DateTime::now().timestamp_millis()],
                    )
                    .map_err(&err)?;
                    tx.execute(
                        "INSERT INTO node_process (node, id, process) VALUES (?1, ?2, ?3)
                         ON CONFLICT (node) DO UPDATE SET id = excluded.id, process = excluded.process",
                        params![node, process.id.to_hex(), json],
                    )
                }
                NodeChange::Release => tx.execute("DELETE FROM node_process WHERE node = ?1", [&node]),
                NodeChange::Maxthreads(n) => {
                    tx.execute("UPDATE nodes SET maxthreads = ?2 WHERE node = ?1", params![node, n])
                }
                NodeChange::Stats(_) => tx.execute(
                    "INSERT INTO node_stats (node, stats) VALUES (?1, ?2)
                     ON CONFLICT (node) DO UPDATE SET stats = excluded.stats",
                    params![node, json],
                ),
                NodeChange::QueueProblems(_) => tx.execute(
                    "INSERT INTO node_queue_problems (node, problems) VALUES (?1, ?2)
                     ON CONFLICT (node) DO UPDATE SET problems = excluded.problems",
                    params![node, json],
                ),
            }
            .map_err(&err)?;
            Ok(true)
        })
        .await
    }

    /// [`Store::node`](crate::store::Store::node).
    pub(super) async fn node(&self, node: &str) -> StoreResult<Option<NodeRecord>> {
        let node = node.to_string();
        let row = self
            .with(move |conn| read_node_row(conn, &node).map_err(db_err("read node")))
            .await?;
        let Some(node) = row.map(node_from).transpose()? else {
            return Ok(None);
        };
        // Only DENs of this implementation share an embedded store.
        Ok(Some(NodeRecord {
            heartbeat: Some(node.timestamp),
            foreign: false,
            node,
        }))
    }

    pub(super) async fn nodes(&self) -> StoreResult<Vec<Node>> {
        let rows = self
            .with(|conn| {
                let err = db_err("list nodes");
                let mut stmt = conn
                    .prepare(&format!("{NODE_SELECT} ORDER BY nodes.node"))
                    .map_err(&err)?;
                let rows = stmt
                    .query_map([], node_row)
                    .map_err(&err)?
                    .collect::<Result<Vec<NodeRow>, _>>()
                    .map_err(&err)?;
                Ok(rows)
            })
            .await?;
        let mut nodes = Vec::with_capacity(rows.len());
        for row in rows {
            match node_from(row) {
                Ok(n) => nodes.push(n),
                Err(e) => self.warn_once(format!("ignoring node: {e}")),
            }
        }
        Ok(nodes)
    }
}

/// A node row as a node.
/// A row of `nodes` with its `node_stats`, `node_process` and `node_queue_problems` JSON.
type NodeRow = (
    String,
    String,
    i64,
    rusqlite::types::Value,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// A node with its `node_stats`, `node_process` and `node_queue_problems` rows, read as a
/// [`NodeRow`] by [`node_row`]; a `WHERE` or `ORDER BY` may follow.
const NODE_SELECT: &str = "SELECT nodes.id, nodes.node, nodes.timestamp, nodes.maxthreads, node_stats.stats,
        node_process.process, node_queue_problems.problems
    FROM nodes LEFT JOIN node_stats ON node_stats.node = nodes.node
               LEFT JOIN node_process ON node_process.node = nodes.node
               LEFT JOIN node_queue_problems ON node_queue_problems.node = nodes.node";

/// A row of [`NODE_SELECT`].
fn node_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<NodeRow> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
    ))
}

/// The node `node`, if it has a document.
fn read_node_row(conn: &Connection, node: &str) -> rusqlite::Result<Option<NodeRow>> {
    conn.query_row(&format!("{NODE_SELECT} WHERE nodes.node = ?1"), params![node], node_row)
        .optional()
}

fn node_from((id, node, timestamp, maxthreads, stats, process, problems): NodeRow) -> StoreResult<Node> {
    // Read as MongoDB reads it: a value written by hand that is not a non-negative
    // integer is taken as 0, with the problem recorded, and the node kept.
    let (maxthreads, problem) = crate::store::queue_doc::node_maxthreads(column_bson(maxthreads).as_ref());
    Ok(Node {
        id: parse_oid("nodes", &id)?,
        node,
        timestamp: DateTime::from_millis(timestamp),
        maxthreads,
        stats: stats.and_then(|s| serde_json::from_str(&s).ok()),
        process: process.and_then(|p| serde_json::from_str(&p).ok()),
        queue_problems: problems.and_then(|p| serde_json::from_str(&p).ok()).unwrap_or_default(),
        problem,
    })
}

/// A column's value as BSON (a blob as binary), for readers shared with MongoDB.
fn column_bson(value: rusqlite::types::Value) -> Option<bson::Bson> {
    use rusqlite::types::Value;
    match value {
        Value::Null => None,
        Value::Integer(n) => Some(bson::Bson::Int64(n)),
        Value::Real(f) => Some(bson::Bson::Double(f)),
        Value::Text(s) => Some(bson::Bson::String(s)),
        Value::Blob(b) => Some(bson::Bson::Binary(bson::Binary {
            subtype: bson::spec::BinarySubtype::Generic,
            bytes: b,
        })),
    }
}
