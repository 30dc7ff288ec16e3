//! A task's life beyond Disbatch 4's: scheduled tasks becoming due, cancel and kill
//! (progress reports are written with the task's other running-state updates).
//!
//! Scheduled tasks wait with status -7 (which no Disbatch 4 DEN claims) and a `run_at`
//! date; one `updateMany` over the `{status, run_at}` index queues those that are due.
//! A cancel or kill records `stop: {action, by, at, reason}` on the task. Updates over a
//! queue report the ids they changed by reading back the tasks carrying that exact `stop`
//! sub-document.

use bson::oid::ObjectId;
use bson::{doc, DateTime, Document};
use futures::TryStreamExt;

use super::{db_err, MongoStore};
use crate::model::{status, StopAction, StopRequest};
use crate::store::{StoreResult, TaskTarget};

/// The condition selecting `target`'s tasks.
fn target_filter(target: TaskTarget) -> Document {
    match target {
        TaskTarget::Task(id) => doc! { "_id": id },
        TaskTarget::Queue(q) => doc! { "queue": q },
    }
}

impl MongoStore {
    /// [`Store::promote_due`](crate::store::Store::promote_due).
    pub(super) async fn promote(&self, now: DateTime) -> StoreResult<u64> {
        let result = self
            .tasks
            .update_many(
                doc! { "status": status::SCHEDULED, "run_at": { "$lte": now } },
                doc! { "$set": { "status": status::QUEUED, "mtime": DateTime::now() } },
            )
            .await
            .map_err(db_err("queue due scheduled tasks"))?;
        Ok(result.modified_count)
    }

    /// Records `stop` on the tasks of `target` that match `fence`, returning their ids.
    async fn stop_where(
        &self,
        target: TaskTarget,
        mut fence: Document,
        set: Document,
        stop: &StopRequest,
        op: &'static str,
    ) -> StoreResult<Vec<ObjectId>> {
        fence.extend(target_filter(target));
        let record = stop.to_document();
        let mut update = set;
        update.insert("stop", record.clone());
        update.insert("mtime", DateTime::now());
        let result = self
            .tasks
            .update_many(fence, doc! { "$set": update })
            .await
            .map_err(db_err(op))?;
        if result.modified_count == 0 {
            return Ok(Vec::new());
        }
        // Read from the primary, which made the change, and only among the tasks it could
        // have changed.
        let mut read_back = doc! { "stop": record };
        if stop.action == StopAction::Cancel {
            read_back.insert("status", status::CANCELLED);
        }
        read_back.extend(target_filter(target));
        let docs: Vec<Document> = self
            .tasks
            .find(read_back)
            .selection_criteria(mongodb::options::SelectionCriteria::ReadPreference(
                mongodb::options::ReadPreference::Primary,
            ))
            .projection(doc! { "_id": 1 })
            .await
            .map_err(db_err(op))?
            .try_collect()
            .await
            .map_err(db_err(op))?;
        Ok(docs.iter().filter_map(|d| d.get_object_id("_id").ok()).collect())
    }

    /// [`Store::cancel_tasks`](crate::store::Store::cancel_tasks).
    pub(super) async fn cancel(&self, target: TaskTarget, stop: &StopRequest) -> StoreResult<Vec<ObjectId>> {
        stop.expect(StopAction::Cancel)?;
        let fence = doc! {
            "status": { "$in": status::WAITING.to_vec() },
            "node": super::unclaimed(),
        };
        self.stop_where(
            target,
            fence,
            doc! { "status": status::CANCELLED },
            stop,
            "cancel tasks",
        )
        .await
    }

    /// [`Store::request_kill`](crate::store::Store::request_kill).
    pub(super) async fn kill(&self, target: TaskTarget, stop: &StopRequest) -> StoreResult<Vec<ObjectId>> {
        stop.expect(StopAction::Kill)?;
        let fence = doc! {
            "status": { "$in": status::BUSY.to_vec() },
            "stop.action": { "$ne": "kill" },
        };
        self.stop_where(target, fence, Document::new(), stop, "ask to kill tasks")
            .await
    }

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
