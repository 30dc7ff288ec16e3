//! A task's life beyond Disbatch 4's on the embedded store: scheduled tasks becoming due,
//! cancel, kill and progress (see the MongoDB store's `lifecycle` for the model). The
//! `run_at` column holds milliseconds since the epoch, `stop` and `progress` the BSON of
//! those sub-documents.

use bson::oid::ObjectId;
use rusqlite::{params, Connection};

use super::rows::{add_columns, db_err, read_bson};
use super::SqliteStore;
use crate::model::{status, StopAction, StopRequest};
use crate::store::StoreResult;

/// Columns added to `tasks` after its first release, with their types: a database file
/// created before gets them on open.
const ADDED_COLUMNS: &[(&str, &str)] = &[
    ("run_at", "INTEGER"),
    ("stop", "BLOB"),
    ("progress", "BLOB"),
    ("priority", "INTEGER NOT NULL DEFAULT 0"),
    ("attempts", "BLOB"),
    ("avoid_node", "TEXT"),
    ("avoid_until", "INTEGER"),
    ("key", "TEXT"),
    ("rerun", "INTEGER"),
    ("batch", "TEXT"),
    ("after", "TEXT"),
    ("after_failure", "INTEGER"),
    ("dependents", "INTEGER"),
];

/// Adds the columns a database file created by an earlier release lacks, and their index.
pub(super) fn migrate(conn: &Connection) -> StoreResult<()> {
    let err = db_err("upgrade schema");
    add_columns(conn, "tasks", ADDED_COLUMNS)?;
    // Scheduled tasks only: a claim or a finish does not touch it (an index of every
    // task's status and `run_at` was rewritten by both, and `tasks_status_mtime` serves
    // the searches by status).
    conn.execute_batch(&format!(
        "DROP INDEX IF EXISTS tasks_scheduled;
         CREATE INDEX IF NOT EXISTS tasks_due ON tasks (run_at) WHERE status = {scheduled};
         CREATE UNIQUE INDEX IF NOT EXISTS tasks_key ON tasks (queue, key) WHERE key IS NOT NULL;
         CREATE INDEX IF NOT EXISTS tasks_key_only ON tasks (key) WHERE key IS NOT NULL;
         CREATE INDEX IF NOT EXISTS tasks_batch ON tasks (batch, status) WHERE batch IS NOT NULL;
         CREATE INDEX IF NOT EXISTS tasks_dependents ON tasks (dependents, status) WHERE dependents = 1;",
        scheduled = status::SCHEDULED
    ))
    .map_err(&err)?;
    Ok(())
}

impl SqliteStore {
    /// [`Store::kill_requests`](crate::store::Store::kill_requests).
    pub(super) async fn kills_for(&self, node: &str) -> StoreResult<Vec<(ObjectId, StopRequest)>> {
        let node = node.to_string();
        let rows: Vec<(String, Vec<u8>)> = self
            .with(move |conn| {
                let err = db_err("read kill requests");
                let mut stmt = conn
                    .prepare_cached(
                        "SELECT id, stop FROM tasks WHERE node = ?1 AND status IN (?2, ?3) AND stop IS NOT NULL",
                    )
                    .map_err(&err)?;
                let rows = stmt
                    .query_map(params![node, status::CLAIMED, status::RUNNING], |r| {
                        Ok((r.get(0)?, r.get(1)?))
                    })
                    .map_err(&err)?;
                rows.collect::<Result<Vec<_>, _>>().map_err(&err)
            })
            .await?;
        let mut out = Vec::new();
        for (id, bytes) in rows {
            let Ok(oid) = ObjectId::parse_str(&id) else { continue };
            let stop = StopRequest::stored_kill(read_bson("tasks", &id, &bytes).map_err(|e| e.to_string()));
            if stop.action == StopAction::Kill {
                out.push((oid, stop));
            }
        }
        Ok(out)
    }
}
