//! Kill requests on MongoDB: a cancel or kill records `stop: {action, by, at, reason}` on
//! the task (written as a fenced change by `lifecycle::run`); a DEN reads the kill requests
//! on the tasks it runs.

use bson::oid::ObjectId;
use bson::{doc, Document};
use futures::TryStreamExt;

use super::{db_err, MongoStore};
use crate::model::{status, StopRequest};
use crate::store::StoreResult;

impl MongoStore {
    /// [`Store::kill_requests`](crate::store::Store::kill_requests).
    pub(super) async fn kill_requests(&self, node: &str) -> StoreResult<Vec<(ObjectId, StopRequest)>> {
        let docs: Vec<Document> = self
            .tasks
            .find(doc! {
                "node": node,
                "status": { "$in": status::BUSY.to_vec() },
                "stop.action": "kill",
            })
            .projection(doc! { "_id": 1, "stop": 1 })
            .await
            .map_err(db_err("read kill requests"))?
            .try_collect()
            .await
            .map_err(db_err("read kill requests"))?;
        let mut out = Vec::with_capacity(docs.len());
        for d in docs {
            let Ok(id) = d.get_object_id("_id") else { continue };
            let stop = StopRequest::stored_kill(d.get_document("stop").cloned().map_err(|e| e.to_string()));
            out.push((id, stop));
        }
        Ok(out)
    }
}
