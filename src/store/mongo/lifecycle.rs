//! A task's life beyond Disbatch 4's: scheduled tasks becoming due, cancel and kill
//! (progress reports are written with the task's other running-state updates).
//!
//! Scheduled tasks wait with status -7 (which no Disbatch 4 DEN claims) and a `run_at`
//! date; one `updateMany` over the `{status, run_at}` index queues those that are due.
//! A cancel or kill records `stop: {action, by, at, reason}` on the task. Updates over a
//! queue report the ids they changed by reading back the tasks carrying that exact `stop`
//! sub-document.

use bson::oid::ObjectId;
use bson::{doc, Document};
use futures::TryStreamExt;

use super::{db_err, MongoStore};
use crate::model::{status, StopRequest};
use crate::store::StoreResult;

impl MongoStore {
    /// [`Store::kill_requests`](crate::store::Store::kill_requests).
    pub(super) async fn kills_for(&self, node: &str) -> StoreResult<Vec<(ObjectId, StopRequest)>> {
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
