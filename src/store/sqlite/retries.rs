//! Retries on the embedded store (see the MongoDB store's `retries`). The `attempts`
//! column holds the BSON of `{list: [record, …]}`; a record is appended by reading and
//! rewriting it in the same write transaction.

use bson::{Bson, DateTime};
use rusqlite::{params, OptionalExtension, Transaction};

use super::rows::{bson_bytes, db_err, read_attempts};
use crate::model::{Attempt, RetryAt};
use crate::store::retries::Recover;
use crate::store::StoreResult;

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
                 progress = NULL, stop = NULL, rerun = NULL, attempts = ?9, mtime = ?10 WHERE id = ?1 AND {fence}"
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
