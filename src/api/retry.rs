//! `POST /tasks/{id}/retry`: queues a finished task again by hand. Its last run (status,
//! node, end time, outputs) becomes a record in its `attempts` list, with who asked and
//! why as the record's `reason`.

use axum::extract::State;
use axum::Json;
use serde_json::Value;

use super::body::{OptionalFields, PathKey};
use super::json::{self, TaskView};
use super::{ApiError, Shared};
use crate::lifecycle::retry::{self, HandRetry};
use crate::model::status;

/// `POST /tasks/{id}/retry {reason?, by?}`.
pub(super) async fn retry(
    State(state): State<Shared>,
    PathKey(id): PathKey,
    OptionalFields(body): OptionalFields,
) -> Result<Json<Value>, ApiError> {
    let oid = bson::oid::ObjectId::parse_str(&id).map_err(|_| ApiError::bad(format!("invalid task id {id:?}")))?;
    if let Some(k) = body.keys().find(|k| !["reason", "by"].contains(&k.as_str())) {
        return Err(ApiError::bad(format!("unknown field {k:?}: expected reason, by")));
    }
    let text = |k: &str| super::lifecycle::note(&body, k);
    let (by, why) = (text("by")?, text("reason")?);
    let mut reason = format!(
        "{} by {}",
        crate::model::BY_HAND,
        if by.is_empty() { "api" } else { &by }
    );
    if !why.is_empty() {
        reason = format!("{reason}: {why}");
    }
    match retry::retry_by_hand(&*state.store, oid, &reason, None).await? {
        HandRetry::Queued => {}
        HandRetry::NotFound => return Err(ApiError::NotFound(format!("no task {id}"))),
        HandRetry::NotFinished(code) => {
            let hint = match code {
                status::CLAIMED | status::RUNNING => "; kill stops a running task",
                _ => "; it has not run yet",
            };
            return Err(ApiError::Conflict(format!(
                "task {id} is {} ({code}): only a finished task can be retried{hint}",
                status::name(code)
            )));
        }
    }
    let task = state
        .store
        .task(oid)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no task {id}")))?;
    Ok(Json(json::task(&task, &TaskView::default())))
}
