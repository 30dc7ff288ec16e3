//! Output files of the embedded store: one row of `output_files` per file, written under
//! an id chosen by the caller so that a retried write replaces the row, and deleted when
//! the result that would use them is not stored.

use bson::oid::ObjectId;
use bson::DateTime;
use rusqlite::params;

use super::rows::db_err;
use super::SqliteStore;
use crate::store::StoreResult;

impl SqliteStore {
    /// [`Store::put_output_file`](crate::store::Store::put_output_file): one row, replaced
    /// when the same file is written again.
    pub(super) async fn put_file(&self, file: ObjectId, task: ObjectId, filename: &str, text: &str) -> StoreResult<()> {
        let (filename, text) = (filename.to_string(), text.to_string());
        self.with(move |conn| {
            let length = i64::try_from(text.len()).unwrap_or(i64::MAX);
            conn.execute(
                "INSERT OR REPLACE INTO output_files (id, task, filename, length, upload_date, data)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    file.to_hex(),
                    task.to_hex(),
                    filename,
                    length,
                    DateTime::now().timestamp_millis(),
                    text
                ],
            )
            .map_err(db_err("write output file"))?;
            Ok(())
        })
        .await
    }

    /// [`Store::discard_output_files`](crate::store::Store::discard_output_files): in one
    /// transaction, each row unless the task row points at it.
    pub(super) async fn discard_files(&self, task: ObjectId, files: &[ObjectId]) -> StoreResult<()> {
        let files: Vec<String> = files.iter().map(|f| f.to_hex()).collect();
        self.write("discard output files", move |tx| {
            for file in &files {
                tx.execute(
                    "DELETE FROM output_files WHERE id = ?1 AND task = ?2 AND NOT EXISTS
                     (SELECT 1 FROM tasks WHERE id = ?2 AND (stdout_file = ?1 OR stderr_file = ?1))",
                    params![file, task.to_hex()],
                )
                .map_err(db_err("discard output files"))?;
            }
            Ok(())
        })
        .await
    }
}
