//! Retries on MongoDB: a failed run waiting to run again, and a finished task queued again
//! by hand. Each is one fenced `updateOne` that appends the run's record to `attempts`.

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};

use super::documents::task_from;
use super::{db_err, MongoStore};
use crate::model::status;
use crate::store::retries::last_run;
use crate::store::{HandRetry, NewTask, StoreResult};

/// The fields a task takes from a submission of its key: params, priority, `run_at` and
/// the status they mean at `now`.
pub(super) fn replaced_fields(new: &NewTask, now: DateTime) -> Document {
    doc! {
        "params": new.params.clone(),
        "priority": new.priority,
        "run_at": new.run_at.map_or(Bson::Null, Bson::DateTime),
        "status": new.initial_status(now),
    }
}

impl MongoStore {
    /// [`Store::retry_by_hand`](crate::store::Store::retry_by_hand).
    pub(super) async fn retry_finished(
        &self,
        task: ObjectId,
        reason: &str,
        replace: Option<&NewTask>,
    ) -> StoreResult<HandRetry> {
        let err = db_err("retry task");
        let Some(raw) = self.tasks.find_one(doc! { "_id": task }).await.map_err(&err)? else {
            return Ok(HandRetry::NotFound);
        };
        let t = task_from(&raw)?;
        if !status::finished(t.status) {
            return Ok(HandRetry::NotFinished(t.status));
        }
        let attempt = last_run(&t, reason);
        let now = DateTime::now();
        // Fenced on the values as stored (a Disbatch 4 tool may have written them as a
        // string and an epoch number).
        let stored = |k: &str| raw.get(k).cloned().unwrap_or(Bson::Null);
        let mut set = doc! {
            "status": status::QUEUED,
            "node": Bson::Null,
            "stdout": Bson::Null,
            "stderr": Bson::Null,
            "mtime": now,
        };
        if let Some(new) = replace {
            set.extend(replaced_fields(new, now));
        }
        let result = self
            .tasks
            .update_one(
                doc! { "_id": task, "status": stored("status"), "mtime": stored("mtime") },
                doc! {
                    "$set": set,
                    "$unset": { "progress": "", "stop": "", "avoid_node": "", "avoid_until": "", "rerun": "" },
                    "$push": { "attempts": attempt.to_document() },
                },
            )
            .await
            .map_err(&err)?;
        if result.matched_count == 1 {
            return Ok(HandRetry::Queued);
        }
        // Changed meanwhile (another retry won): say what it is now.
        let now_status = self
            .tasks
            .find_one(doc! { "_id": task })
            .await
            .map_err(&err)?
            .and_then(|d| d.get_i32("status").ok());
        Ok(match now_status {
            None => HandRetry::NotFound,
            Some(s) => HandRetry::NotFinished(s),
        })
    }
}
