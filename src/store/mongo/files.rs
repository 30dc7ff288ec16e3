//! Task output files on MongoDB: GridFS files with String chunks (see [`gridfs`]), as the
//! embedded store's `files` keeps them in its `output_files` table.

use bson::doc;
use bson::oid::ObjectId;
use futures::TryStreamExt;

use super::errors::db_err;
use super::{gridfs, MongoStore};
use crate::model::Output;
use crate::store::{one_piece, OutputStream, StoreError, StoreResult};

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
