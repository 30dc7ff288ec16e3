//! A task's life beyond Disbatch 4's on the embedded store: scheduled tasks becoming due,
//! cancel, kill and progress (see the MongoDB store's `lifecycle` for the model). The
//! `run_at` column holds milliseconds since the epoch, `stop` and `progress` the BSON of
//! those sub-documents.

use bson::oid::ObjectId;
use bson::DateTime;
use rusqlite::{params, Connection};

use super::rows::{add_columns, bson_bytes, db_err, read_bson};
use super::{SqliteStore, Touched};
use crate::model::{status, StopAction, StopRequest, TaskProgress};
use crate::store::{StoreResult, TaskTarget};

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

fn target_clause(target: TaskTarget) -> (&'static str, String) {
    match target {
        TaskTarget::Task(id) => ("id = ?3", id.to_hex()),
        TaskTarget::Queue(q) => ("queue = ?3", q.to_hex()),
    }
}

impl SqliteStore {
    /// [`Store::promote_due`](crate::store::Store::promote_due).
    pub(super) async fn promote(&self, now: DateTime) -> StoreResult<u64> {
        let n = self
            .write_touching(
                "queue due scheduled tasks",
                move |tx| {
                    // Through the index of scheduled tasks, which holds only those (the
                    // status is written out, not bound, so that it applies).
                    tx.execute(
                        &format!(
                            "UPDATE tasks INDEXED BY tasks_due SET status = ?1, mtime = ?2
                         WHERE status = {} AND run_at <= ?3",
                            status::SCHEDULED
                        ),
                        params![
                            status::QUEUED,
                            DateTime::now().timestamp_millis(),
                            now.timestamp_millis()
                        ],
                    )
                    .map_err(db_err("queue due scheduled tasks"))
                },
                |n| if *n > 0 { Touched::Any } else { Touched::Nothing },
            )
            .await?;
        if n > 0 {
            self.signal_queued();
        }
        Ok(n as u64)
    }

    /// Records `stop` on the tasks of `target` whose status is one of `statuses` and that
    /// match `fence` (SQL), also setting `set` (SQL, may be empty); returns their ids.
    async fn stop_where(
        &self,
        op: &'static str,
        target: TaskTarget,
        stop: &StopRequest,
        statuses: &[i32],
        fence: &str,
        set: &str,
    ) -> StoreResult<Vec<ObjectId>> {
        let record = bson_bytes(&stop.to_document())?;
        let (clause, key) = target_clause(target);
        let sql = format!(
            "UPDATE tasks SET stop = ?1, mtime = ?2{set} WHERE {clause} AND status IN ({}) AND {fence} RETURNING id",
            statuses.iter().map(i32::to_string).collect::<Vec<_>>().join(", ")
        );
        let list = self
            .write_touching(
                op,
                move |tx| {
                    let mut stmt = tx.prepare(&sql).map_err(db_err(op))?;
                    let now = DateTime::now().timestamp_millis();
                    let rows = stmt
                        .query_map(params![record, now, key], |r| r.get::<_, String>(0))
                        .map_err(db_err(op))?;
                    rows.collect::<Result<Vec<_>, _>>().map_err(db_err(op))
                },
                |ids| Touched::Tasks(ids.iter().filter_map(|s| ObjectId::parse_str(s).ok()).collect()),
            )
            .await?;
        Ok(list.iter().filter_map(|s| ObjectId::parse_str(s).ok()).collect())
    }

    /// [`Store::cancel_tasks`](crate::store::Store::cancel_tasks).
    pub(super) async fn cancel(&self, target: TaskTarget, stop: &StopRequest) -> StoreResult<Vec<ObjectId>> {
        stop.expect(StopAction::Cancel)?;
        let set = format!(", status = {}", status::CANCELLED);
        let waiting = status::WAITING;
        self.stop_where("cancel tasks", target, stop, &waiting, "node IS NULL", &set)
            .await
    }

    /// [`Store::request_kill`](crate::store::Store::request_kill).
    pub(super) async fn kill(&self, target: TaskTarget, stop: &StopRequest) -> StoreResult<Vec<ObjectId>> {
        stop.expect(StopAction::Kill)?;
        let busy = status::BUSY;
        self.stop_where("ask to kill tasks", target, stop, &busy, "stop IS NULL", "")
            .await
    }

    /// [`Store::report_progress`](crate::store::Store::report_progress).
    pub(super) async fn store_progress(
        &self,
        task: ObjectId,
        node: &str,
        progress: &TaskProgress,
    ) -> StoreResult<bool> {
        let bytes = bson_bytes(&progress.to_document())?;
        let node = node.to_string();
        let stored = self
            .with(move |conn| {
                let n = conn
                    .prepare_cached("UPDATE tasks SET progress = ?1 WHERE id = ?2 AND node = ?3 AND status = ?4")
                    .and_then(|mut s| s.execute(params![bytes, task.to_hex(), node, status::RUNNING]))
                    .map_err(db_err("report progress"))?;
                Ok(n == 1)
            })
            .await;
        self.signal_task(task);
        stored
    }

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
