//! Retries on the embedded store (see the MongoDB store's `retries`). The `attempts`
//! column holds the BSON of `{list: [record, …]}`; a record is appended by reading and
//! rewriting it in the same write transaction.

use bson::oid::ObjectId;
use bson::{Bson, DateTime};
use rusqlite::{params, OptionalExtension, Transaction};

use super::rows::{bson_bytes, db_err, output_columns, read_attempts, task_from_row, TASK_COLUMNS};
use super::SqliteStore;
use crate::model::{status, Attempt};
use crate::store::retries::{last_run, rerun_record};
use crate::store::{FinishExtra, HandRetry, NewTask, OutputValue, StoreResult};

/// The `attempts` column of task `id` with `attempt` appended.
pub(super) fn appended(tx: &Transaction<'_>, id: &str, attempt: &Attempt) -> StoreResult<Vec<u8>> {
    let stored: Option<Option<Vec<u8>>> = tx
        .query_row("SELECT attempts FROM tasks WHERE id = ?1", [id], |r| r.get(0))
        .optional()
        .map_err(db_err("read attempts"))?;
    let mut list: Vec<Bson> = read_attempts(id, stored.flatten().as_deref())
        .iter()
        .map(|a| Bson::Document(a.to_document()))
        .collect();
    list.push(Bson::Document(attempt.to_document()));
    bson_bytes(&bson::doc! { "list": list })
}

/// Gives task `id` the params (`bytes`), priority and `run_at` of `new`, and the status
/// they mean at `now`.
pub(super) fn replace_fields(
    tx: &Transaction<'_>,
    id: &str,
    bytes: &[u8],
    new: &NewTask,
    now: DateTime,
) -> StoreResult<()> {
    tx.execute(
        "UPDATE tasks SET params = ?1, priority = ?2, run_at = ?3, status = ?4, mtime = ?5 WHERE id = ?6",
        params![
            bytes,
            new.priority,
            new.run_at.map(|t| t.timestamp_millis()),
            new.initial_status(now),
            now.timestamp_millis(),
            id
        ],
    )
    .map_err(db_err("submit a task again"))?;
    Ok(())
}

/// [`Store::finish_with`](crate::store::Store::finish_with) in the caller's transaction:
/// `None` when the task is no longer running on `node`, `Some(true)` when it was queued
/// again (submitted again while it ran), `Some(false)` when it finished.
pub(super) fn finish(
    tx: &Transaction<'_>,
    task: ObjectId,
    node: &str,
    code: i32,
    stdout: &OutputValue,
    stderr: &OutputValue,
    extra: &FinishExtra,
) -> StoreResult<Option<bool>> {
    let id = task.to_hex();
    let err = db_err("finish task");
    // Submitted again but then killed (`stop` on a running task is a kill): it ends here.
    let rerun: Option<Option<i64>> = tx
        .prepare_cached(
            "SELECT CASE WHEN stop IS NULL THEN rerun END FROM tasks WHERE id = ?1 AND node = ?2 AND status = ?3",
        )
        .and_then(|mut s| s.query_row(params![id, node, status::RUNNING], |r| r.get(0)))
        .optional()
        .map_err(&err)?;
    let Some(rerun) = rerun else { return Ok(None) };
    let now = DateTime::now().timestamp_millis();
    if rerun.is_some_and(|r| r != 0) {
        let record = rerun_record(node, code, stdout, stderr, extra);
        let attempts = appended(tx, &id, &record)?;
        tx.execute(
            "UPDATE tasks SET status = ?1, node = NULL, stdout = NULL, stdout_file = NULL, stderr = NULL,
             stderr_file = NULL, progress = NULL, rerun = NULL, attempts = ?2, mtime = ?3 WHERE id = ?4",
            params![status::QUEUED, attempts, now, id],
        )
        .map_err(&err)?;
        return Ok(Some(true));
    }
    let progress = extra
        .progress
        .as_ref()
        .map(|p| bson_bytes(&p.to_document()))
        .transpose()?;
    let attempts = extra.attempt.as_ref().map(|a| appended(tx, &id, a)).transpose()?;
    let (out_text, out_file) = output_columns(stdout);
    let (err_text, err_file) = output_columns(stderr);
    tx.prepare_cached(
        "UPDATE tasks SET status = ?1, stdout = ?2, stdout_file = ?3, stderr = ?4, stderr_file = ?5,
         mtime = ?6, progress = COALESCE(?8, progress), attempts = COALESCE(?9, attempts), rerun = NULL
         WHERE id = ?7",
    )
    .and_then(|mut s| {
        s.execute(params![
            code, out_text, out_file, err_text, err_file, now, id, progress, attempts
        ])
    })
    .map_err(&err)?;
    Ok(Some(false))
}

impl SqliteStore {
    /// [`Store::retry_by_hand`](crate::store::Store::retry_by_hand).
    pub(super) async fn retry_finished(
        &self,
        task: ObjectId,
        reason: &str,
        replace: Option<&NewTask>,
    ) -> StoreResult<HandRetry> {
        let reason = reason.to_owned();
        let replace = replace
            .map(|t| bson_bytes(&t.params).map(|p| (p, t.clone())))
            .transpose()?;
        let answer = self
            .write_task("retry task", task, move |tx| {
                let id = task.to_hex();
                let row = tx
                    .query_row(
                        &format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?1"),
                        [&id],
                        task_from_row,
                    )
                    .optional()
                    .map_err(db_err("retry task"))?;
                let Some((_, t)) = row else {
                    return Ok(HandRetry::NotFound);
                };
                let t = t?;
                if !status::finished(t.status) {
                    return Ok(HandRetry::NotFinished(t.status));
                }
                let attempts = appended(tx, &id, &last_run(&t, &reason))?;
                let now = DateTime::now();
                tx.execute(
                    "UPDATE tasks SET status = ?1, node = NULL, stdout = NULL, stdout_file = NULL, stderr = NULL,
                     stderr_file = NULL, progress = NULL, stop = NULL, avoid_node = NULL, avoid_until = NULL,
                     rerun = NULL, attempts = ?2, mtime = ?3 WHERE id = ?4",
                    params![status::QUEUED, attempts, now.timestamp_millis(), id],
                )
                .map_err(db_err("retry task"))?;
                if let Some((bytes, new)) = &replace {
                    replace_fields(tx, &id, bytes, new, now)?;
                }
                Ok(HandRetry::Queued)
            })
            .await?;
        if answer == HandRetry::Queued {
            self.signal_queued();
        }
        Ok(answer)
    }
}
