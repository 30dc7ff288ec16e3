//! Watching MongoDB for queued tasks and task changes: change streams on `tasks`, as the
//! embedded store's `watch` does with its own signals.

use bson::doc;
use futures::TryStreamExt;

use super::errors::db_err;
use super::MongoStore;
use crate::model::status;
use crate::store::{QueuedEvents, StoreResult, TaskEvents};

impl MongoStore {
    /// A change stream on `tasks`: inserts of queued tasks and updates that set a task's
    /// status back to queued.
    pub(super) async fn watch_queued(&self) -> StoreResult<Option<QueuedEvents>> {
        let pipeline = [doc! { "$match": { "$or": [
            { "operationType": "insert", "fullDocument.status": status::QUEUED },
            { "operationType": "update", "updateDescription.updatedFields.status": status::QUEUED },
        ] } }];
        let stream = self
            .tasks
            .watch()
            .pipeline(pipeline)
            .await
            .map_err(db_err("watch for queued tasks"))?;
        let events = stream.map_ok(|_| ()).map_err(db_err("watch for queued tasks"));
        Ok(Some(Box::pin(events)))
    }

    pub(super) async fn watch_tasks(&self) -> StoreResult<Option<TaskEvents>> {
        let pipeline = [doc! { "$project": { "documentKey": 1, "operationType": 1 } }];
        let stream = self
            .tasks
            .watch()
            .pipeline(pipeline)
            .await
            .map_err(db_err("watch tasks"))?;
        let events = stream
            .map_ok(|e| e.document_key.and_then(|k| k.get_object_id("_id").ok()))
            .map_err(db_err("watch tasks"));
        Ok(Some(Box::pin(events)))
    }
}
