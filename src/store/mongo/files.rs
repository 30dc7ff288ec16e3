//! Task output files on MongoDB: GridFS files with String chunks (see [`gridfs`]), as the
//! embedded store's `files` keeps them in its `output_files` table.

use bson::oid::ObjectId;
use bson::{doc, Document};
use futures::TryStreamExt;

use super::errors::db_err;
use super::{gridfs, MongoStore};
use crate::model::Output;
use crate::store::{one_piece, FileStore, OutputStream, StoreError, StoreResult, StoredFile};

impl MongoStore {
    pub(super) async fn put_output_file(
        &self,
        file: ObjectId,
        task: ObjectId,
        filename: &str,
        text: &str,
    ) -> StoreResult<()> {
        Ok(gridfs::put_file(&self.db, file, task, filename, text).await?)
    }

    pub(super) async fn discard_output_files(&self, task: ObjectId, files: &[ObjectId]) -> StoreResult<()> {
        let used = self
            .tasks
            .find_one(doc! { "_id": task })
            .projection(doc! { "stdout": 1, "stderr": 1 })
            .await
            .map_err(db_err("read task outputs"))?
            .map(|d| {
                ["stdout", "stderr"]
                    .iter()
                    .filter_map(|k| d.get_object_id(k).ok())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        let unused: Vec<ObjectId> = files.iter().copied().filter(|f| !used.contains(f)).collect();
        Ok(gridfs::delete_files(&self.db, task, &unused).await?)
    }

    pub(super) async fn read_output(&self, output: &Output) -> StoreResult<String> {
        match output {
            Output::Inline(s) => Ok(s.clone()),
            Output::File(id) => Ok(gridfs::read_file(&self.db, *id).await?),
        }
    }

    pub(super) async fn output_stream(&self, output: &Output) -> StoreResult<OutputStream> {
        match output {
            Output::Inline(s) => Ok(one_piece(s.clone())),
            Output::File(id) => {
                let pieces = gridfs::stream_file(&self.db, *id).await?;
                Ok(Box::pin(pieces.map_err(StoreError::from)))
            }
        }
    }
}

#[async_trait::async_trait]
impl FileStore for MongoStore {
    async fn output_files(&self, after: Option<ObjectId>, limit: usize) -> StoreResult<Vec<StoredFile>> {
        // From the zero id, so that only ObjectId ids are listed (of one type, in order).
        let after = after.unwrap_or_else(|| ObjectId::from_bytes([0; 12]));
        let filter = doc! { "_id": { "$gt": after } };
        let docs: Vec<Document> = self
            .db
            .collection::<Document>(gridfs::FILES)
            .find(filter)
            .sort(doc! { "_id": 1 })
            .limit(i64::try_from(limit).unwrap_or(i64::MAX))
            .projection(doc! { "metadata.task_id": 1, "uploadDate": 1 })
            .await
            .map_err(db_err("list output files"))?
            .try_collect()
            .await
            .map_err(db_err("list output files"))?;
        Ok(docs
            .iter()
            .filter_map(|d| {
                Some(StoredFile {
                    id: d.get_object_id("_id").ok()?,
                    task: d
                        .get_document("metadata")
                        .ok()
                        .and_then(|m| m.get_object_id("task_id").ok()),
                    uploaded: d.get_datetime("uploadDate").ok().copied(),
                })
            })
            .collect())
    }
}
