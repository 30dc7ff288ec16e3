//! The per-minute counters ([`crate::stats`]) in the embedded store:
//! `minute_stats(minute, queue, node, succeeded, failed, retried, seconds, buckets, depth)`,
//! keyed by (minute, queue, node), `buckets` a JSON object `{"<i>": n}`; rows grow in one
//! write transaction each, so two DENs adding to the same minute never lose a count.
//! Depth samples are rows of node `''`. Also the live counts of active tasks.

use std::collections::BTreeMap;

use bson::oid::ObjectId;
use rusqlite::{params, OptionalExtension};

use super::records::db_err;
use super::SqliteStore;
use crate::stats::{Counters, StatsRow};
use crate::store::{StatusCounts, StoreError, StoreResult, ACTIVE_STATUSES};

/// The `minute_stats` table.
pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS minute_stats (
    minute INTEGER NOT NULL,
    queue TEXT NOT NULL,
    node TEXT NOT NULL,
    succeeded INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    retried INTEGER NOT NULL DEFAULT 0,
    seconds REAL NOT NULL DEFAULT 0,
    buckets TEXT NOT NULL DEFAULT '{}',
    depth INTEGER,
    PRIMARY KEY (minute, queue, node)
);";

fn buckets_json(b: &BTreeMap<usize, u64>) -> String {
    let map: serde_json::Map<String, serde_json::Value> = b.iter().map(|(k, v)| (k.to_string(), (*v).into())).collect();
    serde_json::Value::Object(map).to_string()
}

fn buckets_from(text: &str) -> Option<BTreeMap<usize, u64>> {
    let map: BTreeMap<String, u64> = serde_json::from_str(text).ok()?;
    map.into_iter().map(|(k, v)| Some((k.parse().ok()?, v))).collect()
}

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// One row of `minute_stats`, or why it is unreadable.
fn row_from(r: &rusqlite::Row<'_>) -> StoreResult<StatsRow> {
    let minute: i64 = r.get(0).unwrap_or_default();
    let queue: String = r.get(1).unwrap_or_default();
    let node: String = r.get(2).unwrap_or_default();
    let malformed = |reason: &str| StoreError::Malformed {
        collection: "minute_stats",
        id: format!("{minute}/{queue}/{node}"),
        reason: reason.into(),
    };
    let read = || -> rusqlite::Result<_> {
        Ok((
            r.get::<_, i64>(0)?,
            (r.get::<_, i64>(3)?, r.get::<_, i64>(4)?, r.get::<_, i64>(5)?),
            (r.get::<_, f64>(6)?, r.get::<_, String>(7)?, r.get::<_, Option<i64>>(8)?),
        ))
    };
    let (_, (s, f, rt), (seconds, buckets, depth)) = read().map_err(|e| malformed(&e.to_string()))?;
    let queue = ObjectId::parse_str(&queue).map_err(|_| malformed("queue is not an id"))?;
    let buckets = buckets_from(&buckets).ok_or_else(|| malformed("buckets unreadable"))?;
    Ok(StatsRow {
        minute,
        queue,
        node,
        counters: Counters {
            succeeded: count(s),
            failed: count(f),
            retried: count(rt),
            seconds,
            buckets,
        },
        depth,
    })
}

impl SqliteStore {
    /// [`Store::add_stats`](crate::store::Store::add_stats), in one transaction.
    pub(super) async fn add_stats(&self, node: &str, rows: &[(i64, ObjectId, Counters)]) -> StoreResult<()> {
        let node = node.to_string();
        let rows = rows.to_vec();
        self.write_quiet("add the per-minute counters", move |tx| {
            let err = db_err("add the per-minute counters");
            for (minute, queue, c) in &rows {
                let queue = queue.to_hex();
                let before: Option<String> = tx
                    .query_row(
                        "SELECT buckets FROM minute_stats WHERE minute = ?1 AND queue = ?2 AND node = ?3",
                        params![minute, queue, node],
                        |r| r.get(0),
                    )
                    .optional()
                    .map_err(&err)?;
                let mut buckets = before.as_deref().and_then(buckets_from).unwrap_or_default();
                for (b, n) in &c.buckets {
                    *buckets.entry(*b).or_default() += n;
                }
                tx.execute(
                    "INSERT INTO minute_stats (minute, queue, node, succeeded, failed, retried, seconds, buckets)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                     ON CONFLICT (minute, queue, node) DO UPDATE SET
                         succeeded = succeeded + excluded.succeeded,
                         failed = failed + excluded.failed,
                         retried = retried + excluded.retried,
                         seconds = seconds + excluded.seconds,
                         buckets = excluded.buckets",
                    params![
                        minute,
                        queue,
                        node,
                        c.succeeded as i64,
                        c.failed as i64,
                        c.retried as i64,
                        c.seconds,
                        buckets_json(&buckets)
                    ],
                )
                .map_err(&err)?;
            }
            Ok(())
        })
        .await
    }

    /// [`Store::record_depth`](crate::store::Store::record_depth).
    pub(super) async fn record_depth(&self, minute: i64, depths: &[(ObjectId, i64)]) -> StoreResult<()> {
        let depths = depths.to_vec();
        self.write_quiet("record the queue depths", move |tx| {
            let err = db_err("record the queue depths");
            for (queue, depth) in &depths {
                tx.execute(
                    "INSERT INTO minute_stats (minute, queue, node, depth) VALUES (?1, ?2, '', ?3)
                     ON CONFLICT (minute, queue, node) DO UPDATE SET depth = excluded.depth",
                    params![minute, queue.to_hex(), depth],
                )
                .map_err(&err)?;
            }
            Ok(())
        })
        .await
    }

    /// [`Store::read_stats`](crate::store::Store::read_stats).
    pub(super) async fn read_stats(&self, from: i64, to: i64, queue: Option<ObjectId>) -> StoreResult<Vec<StatsRow>> {
        let queue = queue.map(|q| q.to_hex());
        let rows = self
            .with(move |conn| {
                let err = db_err("read the per-minute counters");
                let mut stmt = conn
                    .prepare(
                        "SELECT minute, queue, node, succeeded, failed, retried, seconds, buckets, depth
                         FROM minute_stats WHERE minute >= ?1 AND minute < ?2 AND (?3 IS NULL OR queue = ?3)",
                    )
                    .map_err(&err)?;
                let rows = stmt
                    .query_map(params![from, to, queue], |r| Ok(row_from(r)))
                    .map_err(&err)?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(&err)?;
                Ok(rows)
            })
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            match row {
                Ok(row) => out.push(row),
                Err(e) => self.warn_once(format!("{e}; left out of the statistics")),
            }
        }
        Ok(out)
    }

    /// [`Store::prune_stats`](crate::store::Store::prune_stats).
    pub(super) async fn prune_stats(&self, before: i64) -> StoreResult<u64> {
        self.write_quiet("delete old per-minute counters", move |tx| {
            let n = tx
                .execute("DELETE FROM minute_stats WHERE minute < ?1", [before])
                .map_err(db_err("delete old per-minute counters"))?;
            Ok(n as u64)
        })
        .await
    }

    /// [`Store::active_counts`](crate::store::Store::active_counts): for each queue, a
    /// range of the `tasks_queue_status` index per active status.
    pub(super) async fn active_counts(&self) -> StoreResult<BTreeMap<ObjectId, StatusCounts>> {
        self.with(|conn| {
            let err = db_err("count active tasks by queue");
            let queues: Vec<String> = conn
                .prepare("SELECT id FROM queues")
                .map_err(&err)?
                .query_map([], |r| r.get(0))
                .map_err(&err)?
                .collect::<Result<_, _>>()
                .map_err(&err)?;
            let mut stmt = conn
                .prepare("SELECT COUNT(*) FROM tasks INDEXED BY tasks_queue_status WHERE queue = ?1 AND status = ?2")
                .map_err(&err)?;
            let mut counts: BTreeMap<ObjectId, StatusCounts> = BTreeMap::new();
            for queue in queues {
                let Ok(id) = ObjectId::parse_str(&queue) else { continue };
                for code in ACTIVE_STATUSES {
                    let n: i64 = stmt.query_row(params![queue, code], |r| r.get(0)).map_err(&err)?;
                    if n > 0 {
                        counts.entry(id).or_default().insert(code, count(n));
                    }
                }
            }
            Ok(counts)
        })
        .await
    }
}
