//! Retries on MongoDB: the update that sends an orphan back to wait for its retry.

use bson::{doc, Bson, DateTime, Document};

use crate::model::RetryAt;
use crate::store::retries::Recover;

/// The update that sends a task back to wait for its retry.
pub(super) fn retry_update(retry: &RetryAt, now: DateTime) -> Document {
    doc! {
        "$set": {
            "status": Recover::retry_status(retry, now),
            "node": Bson::Null,
            "run_at": retry.run_at,
            "priority": retry.priority,
            "avoid_node": &retry.avoid_node,
            "avoid_until": retry.avoid_until,
            "stdout": Bson::Null,
            "stderr": Bson::Null,
            "mtime": now,
        },
        "$unset": { "progress": "", "stop": "", "rerun": "" },
        "$push": { "attempts": retry.attempt.to_document() },
    }
}
