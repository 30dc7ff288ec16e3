//! Nodes in the embedded store: heartbeats, node names, `maxthreads`, reported stats.

use std::collections::BTreeMap;
use std::time::Duration;

use bson::oid::ObjectId;
use bson::DateTime;
use rusqlite::{params, Connection, OptionalExtension};

use super::rows::{db_err, lease_end};
use super::{parse_oid, recovery, SqliteStore, Touched};
use crate::model::{NameHolder, Node, NodeProcess, NodeStats};
use crate::store::{StoreError, StoreResult};

impl SqliteStore {
    pub(super) async fn heartbeat(&self, node: &str, lease: Duration) -> StoreResult<Node> {
        let node = node.to_string();
        self.write_liveness("heartbeat", move |tx| {
            let now = DateTime::now();
            renew_slots(tx, &node, lease_end(now, lease))?;
            let err = db_err("heartbeat");
            tx.execute(
                "INSERT INTO nodes (id, node, timestamp, maxthreads) VALUES (?1, ?2, ?3, NULL)
                 ON CONFLICT (node) DO UPDATE SET timestamp = excluded.timestamp",
                params![ObjectId::new().to_hex(), node, now.timestamp_millis()],
            )
            .map_err(&err)?;
            let row = read_node(tx, &node).map_err(&err)?;
            node_from(row.ok_or_else(|| StoreError::Database(format!("heartbeat of node {node:?} stored nothing")))?)
        })
        .await
    }

    pub(super) async fn take_node(
        &self,
        node: &str,
        process: &NodeProcess,
        stale_before: DateTime,
    ) -> StoreResult<Option<NameHolder>> {
        let text = serde_json::to_string(process).map_err(|e| StoreError::Invalid(format!("node process: {e}")))?;
        let node = node.to_string();
        let id = process.id;
        // Ok(holder) when the name is held, Err(whether tasks were requeued) when taken.
        let taken: Result<NodeProcess, bool> = self
            .write_touching(
                "take node name",
                move |tx| {
                    let err = db_err("take node name");
                    if let Some(current) = read_node(tx, &node).map_err(&err)? {
                        let current = node_from(current)?;
                        if let Some(holder) = current.process {
                            if holder.id != id && current.timestamp >= stale_before {
                                return Ok(Ok(holder));
                            }
                        }
                    }
                    tx.execute(
                        "INSERT INTO nodes (id, node, timestamp, maxthreads) VALUES (?1, ?2, ?3, NULL)
                 ON CONFLICT (node) DO UPDATE SET timestamp = excluded.timestamp",
                        params![ObjectId::new().to_hex(), node, DateTime::now().timestamp_millis()],
                    )
                    .map_err(&err)?;
                    tx.execute(
                        "INSERT INTO node_process (node, id, process) VALUES (?1, ?2, ?3)
                 ON CONFLICT (node) DO UPDATE SET id = excluded.id, process = excluded.process",
                        params![node, id.to_hex(), text],
                    )
                    .map_err(&err)?;
                    // Whatever the node's name still holds belongs to a process that is gone.
                    let recovered = recovery::recover_node(tx, &node)?;
                    Ok(Err(!recovered.requeued.is_empty()))
                },
                |taken| if taken.is_ok() { Touched::Nothing } else { Touched::Any },
            )
            .await?;
        match taken {
            Ok(holder) => Ok(Some(NameHolder::Den(holder))),
            Err(requeued) => {
                if requeued {
                    self.signal_queued();
                }
                Ok(None)
            }
        }
    }

    pub(super) async fn report_queue_problems(
        &self,
        node: &str,
        problems: &BTreeMap<String, String>,
    ) -> StoreResult<()> {
        let text = serde_json::to_string(problems).map_err(|e| StoreError::Invalid(format!("queue problems: {e}")))?;
        let node = node.to_string();
        self.with(move |conn| {
            conn.execute(
                "INSERT INTO node_queue_problems (node, problems) VALUES (?1, ?2)
                 ON CONFLICT (node) DO UPDATE SET problems = excluded.problems",
                params![node, text],
            )
            .map_err(db_err("report queue problems"))?;
            Ok(())
        })
        .await
    }

    pub(super) async fn release_node(&self, node: &str, process: ObjectId) -> StoreResult<()> {
        let node = node.to_string();
        self.with(move |conn| {
            conn.execute(
                "DELETE FROM node_process WHERE node = ?1 AND id = ?2",
                params![node, process.to_hex()],
            )
            .map_err(db_err("release node name"))?;
            Ok(())
        })
        .await
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

    pub(super) async fn set_maxthreads(&self, node: &str, maxthreads: Option<i64>) -> StoreResult<bool> {
        crate::store::queue_doc::check_count("maxthreads", maxthreads)?;
        let node = node.to_string();
        self.with(move |conn| {
            let n = conn
                .execute(
                    "UPDATE nodes SET maxthreads = ?1 WHERE node = ?2",
                    params![maxthreads, node],
                )
                .map_err(db_err("set maxthreads"))?;
            Ok(n > 0)
        })
        .await
    }

    pub(super) async fn report_stats(&self, node: &str, stats: &NodeStats) -> StoreResult<()> {
        let text = serde_json::to_string(stats).map_err(|e| StoreError::Invalid(format!("node stats: {e}")))?;
        let node = node.to_string();
        self.with(move |conn| {
            conn.execute(
                "INSERT INTO node_stats (node, stats) VALUES (?1, ?2)
                 ON CONFLICT (node) DO UPDATE SET stats = excluded.stats",
                params![node, text],
            )
            .map_err(db_err("report node stats"))?;
            Ok(())
        })
        .await
    }
}

/// Renews the leases of every slot `node` holds, but not one that expired: it may have
/// been counted free since.
fn renew_slots(tx: &rusqlite::Transaction<'_>, node: &str, until: i64) -> StoreResult<()> {
    tx.execute(
        "UPDATE slots SET expires = ?1 WHERE holder = ?2 AND expires > ?3",
        params![until, node, DateTime::now().timestamp_millis()],
    )
    .map_err(db_err("renew slot leases"))?;
    Ok(())
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
fn read_node(conn: &Connection, node: &str) -> rusqlite::Result<Option<NodeRow>> {
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
