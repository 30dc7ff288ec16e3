//! A task's life beyond Disbatch 4's, over HTTP: cancel and kill (`run_at` at creation is
//! read with the other task entries, in `entries`).
//!
//! - `POST /tasks/{id}/cancel` ends a task that has not started (queued or scheduled): it
//!   becomes cancelled (-5). `POST /tasks/cancel {queue}` does it for every waiting task
//!   of a queue.
//! - `POST /tasks/{id}/kill` asks the DEN running a task to stop its plugin: within a
//!   second the task ends failed (2), its stderr saying who killed it, when and why.
//!   `POST /tasks/kill {queue}` asks it for every claimed or running task of a queue.
//!
//! Each takes a JSON body with optional `reason` and `by`, both recorded in the task's
//! `stop` field: an empty body is `{}`, but it must still be declared `Content-Type:
//! application/json`, so that browsers cannot send it cross-site.

use axum::extract::State;
use axum::Json;
use serde_json::{json, Map, Value};

use super::body::{kind, OptionalFields, PathKey};
use super::json::{self, TaskView};
use super::{queues, ApiError, Shared};
use crate::lifecycle::run;
use crate::model::{status, StopAction, StopRequest};
use crate::store::TaskTarget;

/// Longest `reason` or `by` kept.
const MAX_NOTE: usize = 1000;
/// Most ids listed in the answer of a queue-wide cancel or kill (`count` has them all).
pub const MAX_LISTED_IDS: usize = 10_000;

/// `reason` and `by` from the body, checked.
fn request(action: StopAction, body: &Map<String, Value>, allowed: &[&str]) -> Result<StopRequest, ApiError> {
    if let Some(k) = body.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(ApiError::bad(format!(
            "unknown field {k:?}: expected {}",
            allowed.join(", ")
        )));
    }
    let text = |k: &str| note(body, k);
    let by = text("by")?;
    Ok(StopRequest::now(
        action,
        if by.is_empty() { "api".into() } else { by },
        text("reason")?,
    ))
}

/// The body's field `k` as a note (`reason`, `by`): a string of at most [`MAX_NOTE`]
/// bytes, empty when absent.
pub(super) fn note(body: &Map<String, Value>, k: &str) -> Result<String, ApiError> {
    match body.get(k) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) if s.len() <= MAX_NOTE => Ok(s.clone()),
        Some(Value::String(_)) => Err(ApiError::bad(format!("field {k:?} is longer than {MAX_NOTE} bytes"))),
        Some(other) => Err(ApiError::bad(format!(
            "field {k:?} must be a string, got {}",
            kind(other)
        ))),
    }
}

fn task_id(id: &str) -> Result<bson::oid::ObjectId, ApiError> {
    bson::oid::ObjectId::parse_str(id).map_err(|_| ApiError::bad(format!("invalid task id {id:?}")))
}

/// Why `action` did not apply to a task in `status`.
fn not_applicable(id: &str, action: StopAction, code: i32) -> ApiError {
    let name = status::name(code);
    let hint = match (action, code) {
        (StopAction::Cancel, status::CLAIMED | status::RUNNING) => "; kill stops a running task",
        (StopAction::Kill, status::QUEUED | status::SCHEDULED) => "; cancel ends a task that has not started",
        (StopAction::Kill, status::CLAIMED | status::RUNNING) => " and was already asked to stop",
        _ => "",
    };
    ApiError::Conflict(format!(
        "task {id} is {name} ({code}): it cannot be {}{hint}",
        match action {
            StopAction::Cancel => "cancelled",
            StopAction::Kill => "killed",
        }
    ))
}

async fn one(state: &Shared, id: &str, action: StopAction, body: &Map<String, Value>) -> Result<Value, ApiError> {
    let oid = task_id(id)?;
    let stop = request(action, body, &["reason", "by"])?;
    let done = match action {
        StopAction::Cancel => run::cancel_tasks(&*state.store, TaskTarget::Task(oid), &stop).await?,
        StopAction::Kill => run::request_kill(&*state.store, TaskTarget::Task(oid), &stop).await?,
    };
    let task = state
        .store
        .task(oid)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no task {id}")))?;
    if done.is_empty() {
        return Err(not_applicable(id, action, task.status));
    }
    Ok(json::task(&task, &TaskView::default()))
}

async fn queue(state: &Shared, action: StopAction, body: &Map<String, Value>) -> Result<Value, ApiError> {
    let stop = request(action, body, &["queue", "reason", "by"])?;
    let key = match body.get("queue") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        _ => return Err(ApiError::bad("field \"queue\" is required (a queue id or name)")),
    };
    let q = queues::find(state, &key).await?;
    let ids = match action {
        StopAction::Cancel => run::cancel_tasks(&*state.store, TaskTarget::Queue(q.id), &stop).await?,
        StopAction::Kill => run::request_kill(&*state.store, TaskTarget::Queue(q.id), &stop).await?,
    };
    let mut answer = json!({
        "queue": json::oid(&q.id),
        "count": ids.len(),
        "ids": ids.iter().take(MAX_LISTED_IDS).map(|i| i.to_hex()).collect::<Vec<_>>(),
    });
    if ids.len() > MAX_LISTED_IDS {
        answer["ids_truncated"] = json!(true);
    }
    Ok(answer)
}

/// `POST /tasks/{id}/cancel`.
pub(super) async fn cancel(
    State(state): State<Shared>,
    PathKey(id): PathKey,
    OptionalFields(body): OptionalFields,
) -> Result<Json<Value>, ApiError> {
    one(&state, &id, StopAction::Cancel, &body).await.map(Json)
}

/// `POST /tasks/{id}/kill`.
pub(super) async fn kill(
    State(state): State<Shared>,
    PathKey(id): PathKey,
    OptionalFields(body): OptionalFields,
) -> Result<Json<Value>, ApiError> {
    one(&state, &id, StopAction::Kill, &body).await.map(Json)
}

/// `POST /tasks/cancel`: `{queue, reason?, by?}`.
pub(super) async fn cancel_queue(
    State(state): State<Shared>,
    OptionalFields(body): OptionalFields,
) -> Result<Json<Value>, ApiError> {
    queue(&state, StopAction::Cancel, &body).await.map(Json)
}

/// `POST /tasks/kill`: `{queue, reason?, by?}`.
pub(super) async fn kill_queue(
    State(state): State<Shared>,
    OptionalFields(body): OptionalFields,
) -> Result<Json<Value>, ApiError> {
    queue(&state, StopAction::Kill, &body).await.map(Json)
}
