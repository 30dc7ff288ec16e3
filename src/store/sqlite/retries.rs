//! Retries on the embedded store (see the MongoDB store's `retries`). The `attempts`
//! column holds the BSON of `{list: [record, …]}`; a record is appended by reading and
//! rewriting it in the same write transaction.

use bson::oid::ObjectId;
use bson::{Bson, DateTime};
use rusqlite::{params, OptionalExtension, Transaction};

use super::rows::{bson_bytes, db_err, read_bson, task_from_row, TASK_COLUMNS};
use super::SqliteStore;
use crate::model::{kept_output, status, Attempt, Output, RetryAt};
use crate::store::retries::{finished, Recover};
use crate::store::{HandRetry, StoreResult};

/// The records stored in an `attempts` column.
pub(super) fn read_attempts(id: &str, bytes: Option<&[u8]>) -> Vec<Attempt> {
    bytes
        .and_then(|b| read_bson("tasks", id, b).ok())
        .map(|d| Attempt::list_from(d.get("list")))
        .unwrap_or_default()
}

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

/// Sends task `id` back to wait for `retry`, when it still matches `fence` (SQL with
/// `?2`, `?3` bound to `fence_args`). Returns whether it did.
pub(super) fn write_retry(
    tx: &Transaction<'_>,
    id: &str,
    fence: &str,
    fence_args: (&dyn rusqlite::ToSql, &dyn rusqlite::ToSql),
    retry: &RetryAt,
    now: DateTime,
) -> StoreResult<bool> {
    let attempts = appended(tx, id, &retry.attempt)?;
    let n = tx
        .execute(
            &format!(
                "UPDATE tasks SET status = ?4, node = NULL, run_at = ?5, priority = ?6, avoid_node = ?7,
                 avoid_until = ?8, stdout = NULL, stdout_file = NULL, stderr = NULL, stderr_file = NULL,
                 progress = NULL, stop = NULL, attempts = ?9, mtime = ?10 WHERE id = ?1 AND {fence}"
            ),
            params![
                id,
                fence_args.0,
                fence_args.1,
                Recover::retry_status(retry, now),
                retry.run_at.timestamp_millis(),
                retry.priority,
                retry.avoid_node,
                retry.avoid_until.timestamp_millis(),
                attempts,
                now.timestamp_millis()
            ],
        )
        .map_err(db_err("retry task"))?;
    Ok(n == 1)
}

impl SqliteStore {
    /// [`Store::retry_later`](crate::store::Store::retry_later).
    pub(super) async fn retry_run(&self, task: ObjectId, node: &str, retry: &RetryAt) -> StoreResult<bool> {
        let (node, retry) = (node.to_owned(), retry.clone());
        let done = self
            .write("retry task", move |tx| {
                let fence = "node = ?2 AND status = ?3";
                write_retry(tx, &task.to_hex(), fence, (&node, &status::RUNNING), &retry, DateTime::now())
            })
            .await?;
        if done {
            self.signal_queued();
        }
        Ok(done)
    }

    /// [`Store::retry_by_hand`](crate::store::Store::retry_by_hand).
    pub(super) async fn retry_finished(&self, task: ObjectId, reason: &str) -> StoreResult<HandRetry> {
        let reason = reason.to_owned();
        let answer = self
            .write("retry task", move |tx| {
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
                if !finished(t.status) {
                    return Ok(HandRetry::NotFinished(t.status));
                }
                let kept = |o: &Option<Output>| match o {
                    Some(Output::Inline(s)) => kept_output(s),
                    other => other.clone(),
                };
                let attempt = Attempt {
                    node: t.node.clone(),
                    started: None,
                    ended: t.mtime,
                    status: t.status,
                    reason,
                    stdout: kept(&t.stdout),
                    stderr: kept(&t.stderr),
                };
                let attempts = appended(tx, &id, &attempt)?;
                tx.execute(
                    "UPDATE tasks SET status = ?1, node = NULL, stdout = NULL, stdout_file = NULL, stderr = NULL,
                     stderr_file = NULL, progress = NULL, stop = NULL, avoid_node = NULL, avoid_until = NULL,
                     attempts = ?2, mtime = ?3 WHERE id = ?4",
                    params![status::QUEUED, attempts, DateTime::now().timestamp_millis(), id],
                )
                .map_err(db_err("retry task"))?;
                Ok(HandRetry::Queued)
            })
            .await?;
        if answer == HandRetry::Queued {
            self.signal_queued();
        }
        Ok(answer)
    }
}
