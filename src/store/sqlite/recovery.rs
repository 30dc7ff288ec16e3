//! Orphan recovery in the embedded store: the tasks of dead nodes, the spec's sweep of
//! stale claims, and the tasks a restarted node's earlier process left behind.

use std::collections::HashMap;

use bson::oid::ObjectId;
use bson::DateTime;
use rusqlite::{params, Transaction};

use super::retries::{appended, write_retry};
use super::rows::read_attempts;
use super::rows::{db_err, on_orphan_lenient, read_bson};
use super::{SqliteStore, Touched};
use crate::model::{status, OnOrphan, RetryPolicy};
use crate::store::retries::{recover_as, Recover};
use crate::store::{Recovery, StoreResult};

/// A queue's recovery policy: `on_orphan`, and `retry` when it can be read.
type Policy = (OnOrphan, Option<RetryPolicy>);

/// A task to recover: id, queue, node, whether someone asked to kill it, its `attempts`
/// column and priority.
type Candidate = (String, String, Option<String>, bool, Option<Vec<u8>>, i64);

/// Each queue's policies, by queue id in hex.
fn orphan_policies(tx: &Transaction<'_>) -> StoreResult<HashMap<String, Policy>> {
    let err = db_err("recover orphans");
    let mut policies = HashMap::new();
    let mut stmt = tx.prepare("SELECT id, doc FROM queues").map_err(&err)?;
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, Vec<u8>>(1)?)))
        .map_err(&err)?;
    for row in rows {
        let (id, bytes) = row.map_err(&err)?;
        let policy = read_bson("queues", &id, &bytes)
            .map(|d| {
                let retry = d.get("retry").and_then(|r| RetryPolicy::from_bson(r).ok());
                (on_orphan_lenient(&d), retry)
            })
            .unwrap_or_default();
        policies.insert(id, policy);
    }
    Ok(policies)
}

/// Orphans, requeues or retries the tasks found (the caller's transaction has read them).
fn recover_tasks(tx: &Transaction<'_>, candidates: Vec<Candidate>) -> StoreResult<Recovery> {
    let err = db_err("recover orphans");
    let policies = orphan_policies(tx)?;
    let now = DateTime::now();
    let mut recovery = Recovery::default();
    for (id, queue, node, kill, attempts, priority) in candidates {
        let Ok(oid) = ObjectId::parse_str(&id) else { continue };
        // Tasks of a queue that no longer exists are orphaned, and so are tasks someone
        // asked to kill: they must not run again.
        let (on_orphan, retry) = policies.get(&queue).cloned().unwrap_or_default();
        let made = crate::model::counted_runs(&read_attempts(&id, attempts.as_deref()));
        let how = recover_as(node.as_deref(), kill, on_orphan, retry.as_ref(), made, priority, now);
        let millis = now.timestamp_millis();
        match how {
            Recover::Requeue => {
                tx.execute(
                    "UPDATE tasks SET status = ?1, node = NULL, rerun = NULL, mtime = ?2 WHERE id = ?3",
                    params![status::QUEUED, millis, id],
                )
                .map_err(&err)?;
                recovery.requeued.push(oid);
            }
            Recover::Retry(r) => {
                write_retry(tx, &id, "?2 = ?3", (&1, &1), &r, now)?;
                recovery.retried.push(oid);
            }
            Recover::Orphan(record) => {
                let attempts = record.map(|a| appended(tx, &id, &a)).transpose()?;
                tx.execute(
                    "UPDATE tasks SET status = ?1, mtime = ?2, rerun = NULL, attempts = COALESCE(?4, attempts) WHERE id = ?3",
                    params![status::ORPHANED, millis, id, attempts],
                )
                .map_err(&err)?;
                recovery.orphaned.push(oid);
            }
        }
    }
    Ok(recovery)
}

/// Claimed or running tasks matching `condition` (SQL over `tasks`, with parameters).
fn candidates(tx: &Transaction<'_>, condition: &str, params: impl rusqlite::Params) -> StoreResult<Vec<Candidate>> {
    let err = db_err("recover orphans");
    let mut stmt = tx
        .prepare(&format!(
            "SELECT id, queue, node, stop, attempts, priority FROM tasks WHERE {condition}"
        ))
        .map_err(&err)?;
    let rows = stmt
        .query_map(params, |r| {
            let stop: Option<Vec<u8>> = r.get(3)?;
            let id: String = r.get(0)?;
            let kill = stop.is_some_and(|b| {
                read_bson("tasks", &id, &b)
                    .ok()
                    .and_then(|d| d.get_str("action").ok().map(str::to_owned))
                    == Some("kill".to_owned())
            });
            Ok((id, r.get(1)?, r.get(2)?, kill, r.get(4)?, r.get(5)?))
        })
        .map_err(&err)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(&err)?;
    Ok(rows)
}

/// [`Store::recover_orphans`](crate::store::Store::recover_orphans) in one transaction.
pub(super) fn recover_orphans(tx: &Transaction<'_>, claimed_before: i64, stale_before: i64) -> StoreResult<Recovery> {
    let found = candidates(
        tx,
        "(status = ?1 AND mtime < ?3)
         OR (status IN (?1, ?2) AND mtime < ?4
             AND (node IS NULL OR node NOT IN (SELECT node FROM nodes WHERE timestamp >= ?4)))",
        params![status::CLAIMED, status::RUNNING, claimed_before, stale_before],
    )?;
    let recovery = recover_tasks(tx, found)?;
    // Slots are freed only after their tasks: a stale node's task written after its last
    // heartbeat is not recovered yet (its own mtime is fresh), so its slots stay held,
    // and only leases that have run out are freed.
    tx.execute(
        "UPDATE slots SET holder = NULL, want = NULL, want_until = NULL
         WHERE holder IS NOT NULL AND holder NOT IN (SELECT node FROM nodes WHERE timestamp >= ?1)
           AND holder IN (SELECT node FROM nodes)
           AND expires < ?2
           AND NOT EXISTS (SELECT 1 FROM tasks WHERE tasks.node = slots.holder AND tasks.status IN (?3, ?4))",
        params![
            stale_before,
            DateTime::now().timestamp_millis(),
            status::CLAIMED,
            status::RUNNING
        ],
    )
    .map_err(db_err("recover orphans"))?;
    Ok(recovery)
}

/// Recovers every claimed or running task of `node` and frees its slots, when a new
/// process takes the name (it has no tasks yet; these are a dead process's).
fn recover_node(tx: &Transaction<'_>, node: &str) -> StoreResult<Recovery> {
    let found = candidates(
        tx,
        "node = ?1 AND status IN (?2, ?3)",
        params![node, status::CLAIMED, status::RUNNING],
    )?;
    let recovery = recover_tasks(tx, found)?;
    tx.execute(
        "UPDATE slots SET holder = NULL, want = NULL, want_until = NULL WHERE holder = ?1",
        [node],
    )
    .map_err(db_err("free the slots of a restarted node"))?;
    Ok(recovery)
}

impl SqliteStore {
    /// [`Store::recover_node`](crate::store::Store::recover_node) in one transaction.
    pub(super) async fn recover_node(&self, node: &str) -> StoreResult<Recovery> {
        let node = node.to_string();
        let recovery = self
            .write_touching(
                "recover the tasks of a restarted node",
                move |tx| recover_node(tx, &node),
                |r| {
                    Touched::Tasks(
                        [&r.orphaned, &r.requeued, &r.retried]
                            .into_iter()
                            .flatten()
                            .copied()
                            .collect(),
                    )
                },
            )
            .await?;
        if !recovery.requeued.is_empty() || !recovery.retried.is_empty() {
            self.signal_queued();
        }
        Ok(recovery)
    }
}
