//! Batches in the embedded store: `batches(id, size, ctime, dependents, closed)`, recorded at a batch's first
//! submission, by the rules of MongoDB's `batches` collection; its tasks carry `batch`,
//! counted by status through the `tasks_batch` index.

use bson::DateTime;
use rusqlite::{params, OptionalExtension};

use super::records::db_err;
use super::SqliteStore;
use crate::store::{Batch, StatusCounts, StoreResult};

/// The `batches` table.
pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY NOT NULL,
    size INTEGER,
    ctime INTEGER NOT NULL
);";

fn read(conn: &rusqlite::Connection, id: &str) -> StoreResult<Option<Batch>> {
    conn.query_row(
        "SELECT id, size, ctime, dependents, closed FROM batches WHERE id = ?1",
        [id],
        |r| {
            Ok(Batch {
                id: r.get(0)?,
                size: r.get(1)?,
                ctime: DateTime::from_millis(r.get(2)?),
                dependents: r.get::<_, Option<i64>>(3)?.is_some_and(|d| d != 0),
                // Only the milliseconds this store wrote: a value of another type is not a close.
                closed: match r.get::<_, rusqlite::types::Value>(4)? {
                    rusqlite::types::Value::Integer(ms) => Some(DateTime::from_millis(ms)),
                    _ => None,
                },
            })
        },
    )
    .optional()
    .map_err(db_err("read the batch"))
}

impl SqliteStore {
    /// [`Store::insert_batch`](crate::store::Store::insert_batch).
    pub(super) async fn insert_batch(&self, id: &str, size: Option<i64>) -> StoreResult<bool> {
        let id = id.to_string();
        self.write_quiet("record the batch", move |tx| {
            let n = tx
                .execute(
                    "INSERT OR IGNORE INTO batches (id, size, ctime) VALUES (?1, ?2, ?3)",
                    params![id, size, DateTime::now().timestamp_millis()],
                )
                .map_err(db_err("record the batch"))?;
            Ok(n == 1)
        })
        .await
    }

    /// [`Store::set_batch_size_if_unset`](crate::store::Store::set_batch_size_if_unset).
    pub(super) async fn set_batch_size_if_unset(&self, id: &str, size: i64) -> StoreResult<bool> {
        let id = id.to_string();
        self.write_quiet("record the batch size", move |tx| {
            let n = tx
                .execute(
                    "UPDATE batches SET size = ?2 WHERE id = ?1 AND size IS NULL",
                    params![id, size],
                )
                .map_err(db_err("record the batch size"))?;
            Ok(n == 1)
        })
        .await
    }

    /// [`Store::batch`](crate::store::Store::batch).
    pub(super) async fn batch(&self, id: &str) -> StoreResult<Option<Batch>> {
        let id = id.to_string();
        self.with(move |conn| read(conn, &id)).await
    }

    /// [`Store::close_batch`](crate::store::Store::close_batch).
    pub(super) async fn close_batch(&self, id: &str) -> StoreResult<()> {
        let id = id.to_string();
        self.write_quiet("close the batch", move |tx| {
            tx.execute(
                "UPDATE batches SET closed = ?2 WHERE id = ?1 AND closed IS NULL",
                params![id, DateTime::now().timestamp_millis()],
            )
            .map_err(db_err("close the batch"))?;
            Ok(())
        })
        .await
    }

    /// [`Store::batch_counts`](crate::store::Store::batch_counts).
    pub(super) async fn batch_counts(&self, id: &str) -> StoreResult<StatusCounts> {
        let id = id.to_string();
        self.with(move |conn| {
            let err = db_err("count the tasks of a batch");
            let mut stmt = conn
                .prepare_cached("SELECT status, COUNT(*) FROM tasks WHERE batch = ?1 GROUP BY status")
                .map_err(&err)?;
            let rows = stmt
                .query_map([&id], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))
                .map_err(&err)?;
            let mut counts = StatusCounts::new();
            for row in rows {
                let (status, n) = row.map_err(&err)?;
                if let (Ok(s), Ok(n)) = (i32::try_from(status), u64::try_from(n)) {
                    *counts.entry(s).or_default() += n;
                }
            }
            Ok(counts)
        })
        .await
    }
}
