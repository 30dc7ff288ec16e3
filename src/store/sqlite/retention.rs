//! Retention on the embedded store: the ended tasks past their time, found on the
//! `tasks_status_mtime` index, and their deletion in one short write transaction, fenced
//! on each task's `status` and `mtime` as read, with their output files (`output_files`
//! rows) and their own `task_deps` rows. Which tasks go is decided above the store
//! (`lifecycle::retention`).

use bson::oid::ObjectId;
use bson::DateTime;
use rusqlite::params_from_iter;

use super::records::db_err;
use super::SqliteStore;
use crate::store::{ExpiredFilter, ExpiredTask, StoreResult};

/// The part of a task's filter that keeps every task still of use whatever its age.
const STILL_OF_NO_USE: &str = "COALESCE(dependents, 0) = 0 AND COALESCE(rerun, 0) = 0";

impl SqliteStore {
    /// [`Store::expired_tasks`](crate::store::Store::expired_tasks).
    pub(super) async fn expired_tasks(&self, f: &ExpiredFilter) -> StoreResult<Vec<ExpiredTask>> {
        let f = f.clone();
        self.with(move |conn| {
            let err = db_err("find tasks past their retention");
            let mut args: Vec<rusqlite::types::Value> = vec![
                i64::from(f.status).into(),
                f.before.timestamp_millis().into(),
                f.queue.to_hex().into(),
            ];
            // One batch's tasks are found on its own index, the rest by status and age.
            let index = if f.batch.is_some() {
                "tasks_batch"
            } else {
                "tasks_status_mtime"
            };
            let mut sql = format!(
                "SELECT id, status, mtime, batch FROM tasks INDEXED BY {index} \
                 WHERE status = ?1 AND mtime < ?2 AND queue = ?3 AND {STILL_OF_NO_USE}"
            );
            if !f.except_ids.is_empty() {
                let marks = vec!["?"; f.except_ids.len()].join(", ");
                sql.push_str(&format!(" AND id NOT IN ({marks})"));
                args.extend(f.except_ids.iter().map(|id| id.to_hex().into()));
            }
            if let Some(b) = &f.batch {
                sql.push_str(" AND batch = ?");
                args.push(b.clone().into());
            }
            if !f.except_batches.is_empty() {
                let marks = vec!["?"; f.except_batches.len()].join(", ");
                sql.push_str(&format!(" AND (batch IS NULL OR batch NOT IN ({marks}))"));
                args.extend(f.except_batches.iter().map(|b| b.clone().into()));
            }
            sql.push_str(" ORDER BY status, mtime LIMIT ?");
            args.push(i64::try_from(f.limit).unwrap_or(i64::MAX).into());
            let mut stmt = conn.prepare(&sql).map_err(&err)?;
            let rows = stmt
                .query_map(params_from_iter(args), |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, i32>(1)?,
                        r.get::<_, i64>(2)?,
                        r.get::<_, Option<String>>(3)?,
                    ))
                })
                .map_err(&err)?;
            let mut out = Vec::new();
            for row in rows {
                let (id, status, mtime, batch) = row.map_err(&err)?;
                if let Ok(id) = ObjectId::parse_str(&id) {
                    out.push(ExpiredTask {
                        id,
                        status,
                        mtime: DateTime::from_millis(mtime),
                        batch,
                    });
                }
            }
            Ok(out)
        })
        .await
    }

    /// [`Store::delete_tasks`](crate::store::Store::delete_tasks): one write transaction.
    pub(super) async fn delete_tasks(&self, tasks: &[ExpiredTask]) -> StoreResult<Vec<ObjectId>> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let tasks = tasks.to_vec();
        self.write("delete tasks past their retention", move |tx| {
            let err = db_err("delete tasks past their retention");
            let mut task = tx
                .prepare_cached(&format!(
                    "DELETE FROM tasks WHERE id = ?1 AND status = ?2 AND mtime = ?3 AND {STILL_OF_NO_USE}"
                ))
                .map_err(&err)?;
            let mut files = tx
                .prepare_cached("DELETE FROM output_files WHERE task = ?1")
                .map_err(&err)?;
            let mut deps = tx
                .prepare_cached("DELETE FROM task_deps WHERE child = ?1")
                .map_err(&err)?;
            let mut deleted = Vec::new();
            for t in &tasks {
                let id = t.id.to_hex();
                let n = task
                    .execute(rusqlite::params![id, t.status, t.mtime.timestamp_millis()])
                    .map_err(&err)?;
                if n == 1 {
                    files.execute([&id]).map_err(&err)?;
                    deps.execute([&id]).map_err(&err)?;
                    deleted.push(t.id);
                }
            }
            Ok(deleted)
        })
        .await
    }
}
