//! A task's life beyond Disbatch 4's, over HTTP: `run_at` at creation, cancel and kill.
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
use bson::DateTime;
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

/// A `run_at` value as a time: an RFC 3339 string or `{"$date": …}`, a delay from `now`
/// such as `"10m"` or `"1h 30m"`, or a number of seconds since the epoch.
pub(super) fn run_at(v: &Value, now: DateTime) -> Result<DateTime, String> {
    match v {
        Value::String(s) => match DateTime::parse_rfc3339_str(s) {
            Ok(t) => Ok(t),
            Err(_) => humantime::parse_duration(s)
                .map_err(|e| format!("must be a time (RFC 3339) or a delay like \"10m\": {s:?}: {e}"))
                .and_then(|d| {
                    i64::try_from(d.as_millis())
                        .ok()
                        .and_then(|ms| now.timestamp_millis().checked_add(ms))
                        .map(DateTime::from_millis)
                        .ok_or_else(|| format!("delay {s:?} is too long"))
                }),
        },
        Value::Number(n) => n
            .as_f64()
            .filter(|s| s.is_finite() && *s >= 0.0 && *s < 1e13)
            .map(|s| DateTime::from_millis((s * 1000.0) as i64))
            .ok_or_else(|| format!("must be seconds since the epoch, got {n}")),
        Value::Object(_) => match bson::Bson::try_from(v.clone()) {
            Ok(bson::Bson::DateTime(t)) => Ok(t),
            _ => Err("must be a time, a delay or {\"$date\": …}".to_string()),
        },
        other => Err(format!(
            "must be a time (RFC 3339), a delay like \"10m\" or epoch seconds, got {}",
            kind(other)
        )),
    }
}

/// One entry of the `tasks` list of `POST /tasks`.
pub(super) struct Entry {
    pub params: bson::Document,
    pub run_at: Option<DateTime>,
    pub priority: Option<i64>,
    pub key: Option<String>,
    pub after: super::after::After,
}

/// Longest task `key`.
pub const MAX_KEY: usize = 1000;

/// A `priority`: an integer (of either sign).
pub(super) fn priority(v: &Value) -> Result<i64, String> {
    v.as_i64().ok_or_else(|| {
        format!(
            "must be an integer, got {}",
            if v.is_number() {
                v.to_string()
            } else {
                kind(v).to_string()
            }
        )
    })
}

/// The `tasks` list of `POST /tasks`: `[{params, run_at, priority, key, after, after_failure}, …]`.
pub(super) fn task_entries(v: Option<&Value>, now: DateTime) -> Result<Vec<Entry>, ApiError> {
    let list = match v {
        Some(Value::Array(a)) => a,
        Some(other) => {
            return Err(ApiError::bad(format!(
                "field \"tasks\" must be an array of objects, got {}",
                kind(other)
            )))
        }
        None => return Err(ApiError::bad("field \"tasks\" is required")),
    };
    let mut entries = Vec::with_capacity(list.len());
    for (i, entry) in list.iter().enumerate() {
        let Value::Object(m) = entry else {
            return Err(ApiError::bad(format!(
                "field \"tasks[{i}]\" must be an object {{params, run_at, priority}}, got {}",
                kind(entry)
            )));
        };
        if let Some(k) = m
            .keys()
            .find(|k| !["params", "run_at", "priority", "key", "after", "after_failure"].contains(&k.as_str()))
        {
            return Err(ApiError::bad(format!(
                "field \"tasks[{i}]\": unknown field {k:?}: expected params, run_at, priority, key, after and after_failure"
            )));
        }
        let after = super::after::parse(m, &format!("tasks[{i}]."))?;
        let key = match m.get("key") {
            None | Some(Value::Null) => None,
            Some(Value::String(k)) if !k.is_empty() && k.len() <= MAX_KEY => Some(k.clone()),
            Some(other) => {
                return Err(ApiError::bad(format!(
                    "field \"tasks[{i}].key\" must be a non-empty string of at most {MAX_KEY} bytes, got {}",
                    if other.is_string() {
                        "one too long or empty"
                    } else {
                        kind(other)
                    }
                )))
            }
        };
        let params = match m.get("params") {
            None | Some(Value::Null) => bson::Document::new(),
            Some(p) => {
                super::create::to_document(p).map_err(|e| ApiError::bad(format!("field \"tasks[{i}].params\" {e}")))?
            }
        };
        let run_at = match m.get("run_at") {
            None | Some(Value::Null) => None,
            Some(t) => Some(run_at(t, now).map_err(|e| ApiError::bad(format!("field \"tasks[{i}].run_at\" {e}")))?),
        };
        let priority = match m.get("priority") {
            None | Some(Value::Null) => None,
            Some(p) => Some(priority(p).map_err(|e| ApiError::bad(format!("field \"tasks[{i}].priority\" {e}")))?),
        };
        entries.push(Entry {
            params,
            run_at,
            priority,
            key,
            after,
        });
    }
    Ok(entries)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_at_takes_times_delays_and_epochs() {
        let now = DateTime::from_millis(1_000_000);
        assert_eq!(
            run_at(&json!("10m"), now).unwrap().timestamp_millis(),
            1_000_000 + 600_000
        );
        assert_eq!(
            run_at(&json!("2030-01-01T00:00:00Z"), now).unwrap().timestamp_millis(),
            1_893_456_000_000
        );
        assert_eq!(
            run_at(&json!(1700000000), now).unwrap().timestamp_millis(),
            1_700_000_000_000
        );
        assert_eq!(
            run_at(&json!({"$date": "2030-01-01T00:00:00Z"}), now)
                .unwrap()
                .timestamp_millis(),
            1_893_456_000_000
        );
        assert!(run_at(&json!("soon"), now).unwrap_err().contains("\"soon\""));
        assert!(run_at(&json!(true), now).unwrap_err().contains("boolean"));
        assert!(run_at(&json!(-5), now).is_err());
    }
}
