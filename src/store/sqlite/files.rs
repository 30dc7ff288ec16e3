//! Output files of the embedded store: one row of `output_files` per file, written under
//! an id chosen by the caller so that a retried write replaces the row, and deleted when
//! the result that would use them is not stored.

use bson::oid::ObjectId;
use bson::DateTime;
use rusqlite::{params, OptionalExtension};

use super::records::db_err;
use super::{SqliteStore, OUTPUT_FILES};
use crate::model::Output;
use crate::store::{one_piece, FileStore, OutputStream, StoreError, StoreResult, StoredFile};

impl SqliteStore {
    /// [`Store::put_output_file`](crate::store::Store::put_output_file): one row, replaced
    /// when the same file is written again.
    pub(super) async fn put_output_file(
        &self,
        file: ObjectId,
        task: ObjectId,
        filename: &str,
        text: &str,
    ) -> StoreResult<()> {
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
    pub(super) async fn discard_output_files(&self, task: ObjectId, files: &[ObjectId]) -> StoreResult<()> {
        let files: Vec<String> = files.iter().map(|f| f.to_hex()).collect();
        self.write_quiet("discard output files", move |tx| {
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

#[async_trait::async_trait]
impl FileStore for SqliteStore {
    async fn output_files(&self, after: Option<ObjectId>, limit: usize) -> StoreResult<Vec<StoredFile>> {
        let after = after.map(|a| a.to_hex()).unwrap_or_default();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows: Vec<(String, String, i64)> = self
            .with(move |conn| {
                let err = db_err("list output files");
                let mut st = conn
                    .prepare_cached("SELECT id, task, upload_date FROM output_files WHERE id > ?1 ORDER BY id LIMIT ?2")
                    .map_err(&err)?;
                let rows = st
                    .query_map(params![after, limit], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .map_err(&err)?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(&err)?;
                Ok(rows)
            })
            .await?;
        // Ids are written by this store as 24 hex digits, so their text order is id order.
        Ok(rows
            .into_iter()
            .filter_map(|(id, task, at)| {
                Some(StoredFile {
                    id: ObjectId::parse_str(&id).ok()?,
                    task: ObjectId::parse_str(&task).ok(),
                    uploaded: Some(DateTime::from_millis(at)),
                })
            })
            .collect())
    }
}

/// Bytes of an output file read at a time by [`SqliteStore::output_stream`].
const PIECE: usize = 256 << 10;

impl SqliteStore {
    /// [`Store::output_stream`](crate::store::Store::output_stream): a file is read
    /// [`PIECE`] bytes at a time through SQLite's incremental blob I/O, so serving it holds
    /// one piece, not the whole text.
    pub(super) async fn output_stream(&self, output: &Output) -> StoreResult<OutputStream> {
        let id = match output {
            Output::Inline(s) => return Ok(one_piece(s.clone())),
            Output::File(id) => *id,
        };
        let malformed = move |reason: String| StoreError::Malformed {
            collection: OUTPUT_FILES,
            id: id.to_hex(),
            reason,
        };
        let found: Option<(i64, i64)> = self
            .with(move |conn| {
                conn.query_row(
                    "SELECT rowid, length FROM output_files WHERE id = ?1",
                    [id.to_hex()],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
                .map_err(db_err("read output file"))
            })
            .await?;
        let (rowid, length) = found.ok_or_else(|| malformed("no such file".into()))?;
        let length = usize::try_from(length).map_err(|_| malformed(format!("length is {length}")))?;
        let store = self.clone();
        // (offset read so far, bytes of a character cut at the end of the last piece)
        let pieces = futures::stream::try_unfold((0usize, Vec::new()), move |(offset, carry)| {
            let store = store.clone();
            async move {
                if offset >= length {
                    if !carry.is_empty() {
                        return Err(malformed("the text ends inside a UTF-8 character".into()));
                    }
                    return Ok(None);
                }
                let want = PIECE.min(length - offset);
                let mut bytes = store
                    .with(move |conn| {
                        let err = db_err("read output file");
                        // One read snapshot: the row is still this file's (a rowid alone may
                        // have gone to another file since the last piece) as the piece is read.
                        let tx = conn.transaction().map_err(&err)?;
                        let same: Option<i64> = tx
                            .query_row(
                                "SELECT 1 FROM output_files WHERE rowid = ?1 AND id = ?2",
                                params![rowid, id.to_hex()],
                                |r| r.get(0),
                            )
                            .optional()
                            .map_err(&err)?;
                        if same.is_none() {
                            return Err(StoreError::Database(format!(
                                "output file {id} was replaced or deleted while it was read; read it again"
                            )));
                        }
                        let blob = tx
                            .blob_open(rusqlite::MAIN_DB, OUTPUT_FILES, "data", rowid, true)
                            .map_err(&err)?;
                        if blob.len() != length {
                            return Err(malformed(format!(
                                "length is {length} but the data has {} bytes",
                                blob.len()
                            )));
                        }
                        let mut buf = vec![0u8; want];
                        blob.read_at_exact(&mut buf, offset).map_err(&err)?;
                        Ok(buf)
                    })
                    .await?;
                let mut piece = carry;
                piece.append(&mut bytes);
                let valid = match std::str::from_utf8(&piece) {
                    Ok(_) => piece.len(),
                    Err(e) if e.error_len().is_none() => e.valid_up_to(),
                    Err(e) => return Err(malformed(format!("not UTF-8 text: {e}"))),
                };
                let rest = piece.split_off(valid);
                let text = String::from_utf8(piece).map_err(|e| malformed(format!("not UTF-8 text: {e}")))?;
                Ok(Some((text, (offset + want, rest))))
            }
        });
        Ok(Box::pin(pieces))
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt as _;

    use super::*;

    #[tokio::test]
    async fn a_file_replaced_while_read_is_not_read_as_another_files_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("f.db")).await.unwrap();
        let (a, b) = (ObjectId::new(), ObjectId::new());
        let (task_a, task_b) = (ObjectId::new(), ObjectId::new());
        let len = 3 * PIECE;
        store
            .put_output_file(a, task_a, "stdout", &"a".repeat(len))
            .await
            .unwrap();
        let mut pieces = store.output_stream(&Output::File(a)).await.unwrap();
        let first = pieces.next().await.unwrap().unwrap();
        assert!(!first.is_empty() && first.bytes().all(|c| c == b'a'));

        // The file goes, and another task's file of the same length takes its rowid.
        store.discard_output_files(task_a, &[a]).await.unwrap();
        store
            .put_output_file(b, task_b, "stdout", &"b".repeat(len))
            .await
            .unwrap();
        let rowids: Vec<i64> = store
            .with(|conn| {
                let mut st = conn.prepare("SELECT rowid FROM output_files").unwrap();
                let rows = st.query_map([], |r| r.get(0)).unwrap();
                Ok(rows.map(Result::unwrap).collect())
            })
            .await
            .unwrap();
        assert_eq!(rowids, vec![1], "the rowid is reused");

        let rest: Vec<_> = pieces.collect().await;
        assert!(
            rest.iter().flatten().all(|p| !p.contains('b')),
            "read the other file's bytes"
        );
        let e = rest.iter().find_map(|p| p.as_ref().err()).expect("an error");
        assert!(e.to_string().contains(&a.to_hex()), "{e}");
    }
}
