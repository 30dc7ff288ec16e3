//! `GET|POST /schedules` and `GET|POST|DELETE /schedules/{name}`: periodic tasks.
//!
//! A schedule is shown as `{name, queue, queue_name, params, cron, every, timezone,
//! catch_up, catch_up_limit, overlap, paused, anchor, last, last_task, next}`: times as
//! RFC 3339 strings in UTC, `last` the newest occurrence handled, `last_task` the task of
//! the newest occurrence created (`{id, status, status_name}`, null when none), `next` the
//! next [`NEXT`] occurrences (none while paused). Writes are JSON; each error names its
//! field. Which occurrences become tasks is decided by `lifecycle::schedules`.

use axum::extract::State;
use axum::Json;
use bson::Document;
use jiff::Timestamp;
use serde_json::{json, Map, Value};

use super::body::{kind, JsonBody, PathKey};
use super::entries::to_document;
use super::{ApiError, Shared};
use crate::lifecycle::schedules::mark_on_write;
use crate::model::schedule::{check_name, date, timestamp, DEFAULT_CATCH_UP_LIMIT};
use crate::model::{status, CatchUp, Overlap, Queue, Schedule};
use crate::store::ScheduleRecord;

/// How many next occurrences a schedule is shown with.
pub const NEXT: usize = 5;

/// The fields of a schedule a write may give.
const FIELDS: &str = "name, queue, params, cron, every, timezone, catch_up, catch_up_limit, overlap, paused";

fn rfc3339(d: bson::DateTime) -> String {
    timestamp(d).to_string()
}

/// A schedule as shown.
async fn shown(state: &Shared, r: &ScheduleRecord, queues: &[Queue]) -> Result<Value, ApiError> {
    let s = &r.schedule;
    let now = Timestamp::now();
    let next: Vec<String> = match s.timing(timestamp(s.anchor)) {
        Ok(t) if !s.paused => t
            .upcoming(now.max(timestamp(r.mark.last)), NEXT)
            .iter()
            .map(ToString::to_string)
            .collect(),
        _ => Vec::new(),
    };
    let last_task = match r.mark.task {
        Some(id) => match state.store.task(id).await? {
            Some(t) => json!({ "id": id.to_hex(), "status": t.status, "status_name": status::name(t.status) }),
            None => json!({ "id": id.to_hex(), "status": null, "status_name": "deleted" }),
        },
        None => Value::Null,
    };
    Ok(json!({
        "name": s.name,
        "queue": s.queue.to_hex(),
        "queue_name": queues.iter().find(|q| q.id == s.queue).map(|q| q.name.clone()),
        "params": bson::Bson::Document(s.params.clone()).into_relaxed_extjson(),
        "cron": s.cron,
        "every": s.every,
        "timezone": s.timezone,
        "catch_up": s.catch_up.as_str(),
        "catch_up_limit": s.catch_up_limit,
        "overlap": s.overlap.as_str(),
        "paused": s.paused,
        "anchor": rfc3339(s.anchor),
        "last": rfc3339(r.mark.last),
        "last_task": last_task,
        "next": next,
    }))
}

/// `GET /schedules`: every schedule, by name.
pub(super) async fn list(State(state): State<Shared>) -> Result<Json<Value>, ApiError> {
    let queues = state.store.queues().await?;
    let mut out = Vec::new();
    for r in state.store.schedules().await? {
        out.push(shown(&state, &r, &queues).await?);
    }
    Ok(Json(Value::Array(out)))
}

/// The schedule named `name`, or 404.
async fn find(state: &Shared, name: &str) -> Result<ScheduleRecord, ApiError> {
    state
        .store
        .schedule(name)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no schedule {name:?}")))
}

/// `GET /schedules/{name}`.
pub(super) async fn one(State(state): State<Shared>, PathKey(name): PathKey) -> Result<Json<Value>, ApiError> {
    let r = find(&state, &name).await?;
    let queues = state.store.queues().await?;
    Ok(Json(shown(&state, &r, &queues).await?))
}

/// `POST /schedules {name, queue, cron | every, …}`: creates the schedule, or replaces it
/// whole (fields not given take their defaults; its mark and anchor stay).
pub(super) async fn put(State(state): State<Shared>, JsonBody(body): JsonBody) -> Result<Json<Value>, ApiError> {
    let name = match body.get("name") {
        Some(Value::String(n)) => n.clone(),
        Some(other) => {
            return Err(ApiError::bad(format!(
                "field \"name\" must be a string, got {}",
                kind(other)
            )))
        }
        None => return Err(ApiError::bad("field \"name\" is required")),
    };
    write(&state, &name, body, false).await
}

/// `POST /schedules/{name} {…}`: changes the fields given of an existing schedule (a
/// `cron` given drops its `every`, and the reverse), e.g. `{"paused": true}`; creates it
/// when there is none, as `POST /schedules` does.
pub(super) async fn update(
    State(state): State<Shared>,
    PathKey(name): PathKey,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    match body.get("name") {
        None => {}
        Some(Value::String(n)) if *n == name => {}
        Some(_) => {
            return Err(ApiError::bad(format!(
                "field \"name\" must be {name:?}, the schedule's name in the path (a schedule cannot be renamed)"
            )))
        }
    }
    if body.is_empty() {
        return Err(ApiError::bad(format!("nothing to change: give one of {FIELDS}")));
    }
    write(&state, &name, body, true).await
}

/// `DELETE /schedules/{name}`: deletes the schedule (its tasks stay).
pub(super) async fn delete(State(state): State<Shared>, PathKey(name): PathKey) -> Result<Json<Value>, ApiError> {
    if !state.store.delete_schedule(&name).await? {
        return Err(ApiError::NotFound(format!("no schedule {name:?}")));
    }
    Ok(Json(json!({ "name": name, "deleted": true })))
}

/// Writes the schedule `name` from `body`: over the stored one's fields when `merge` (and
/// it exists), else over the defaults.
async fn write(state: &Shared, name: &str, body: Map<String, Value>, merge: bool) -> Result<Json<Value>, ApiError> {
    check_name(name).map_err(field_error)?;
    let old = state.store.schedule(name).await?;
    let queues = state.store.queues().await?;
    let now = Timestamp::now();
    let base = match (&old, merge) {
        (Some(r), true) => r.schedule.clone(),
        _ => Schedule {
            name: name.to_owned(),
            queue: bson::oid::ObjectId::from_bytes([0; 12]),
            params: Document::new(),
            cron: None,
            every: None,
            timezone: "UTC".into(),
            catch_up: CatchUp::None,
            catch_up_limit: DEFAULT_CATCH_UP_LIMIT,
            overlap: Overlap::Allow,
            paused: false,
            anchor: old
                .as_ref()
                .map_or_else(|| date(whole_seconds(now)), |r| r.schedule.anchor),
        },
    };
    let had_queue = merge && old.is_some();
    let s = apply(base, &body, &queues, had_queue)?;
    s.timing(now).map_err(field_error)?;
    let mark = mark_on_write(old.as_ref(), &s, now);
    state.store.put_schedule(&s, mark.as_ref()).await?;
    let stored = find(state, name).await?;
    Ok(Json(shown(state, &stored, &queues).await?))
}

/// `now` without its fraction of a second: an interval's anchor.
fn whole_seconds(now: Timestamp) -> Timestamp {
    Timestamp::from_second(now.as_second()).unwrap_or(now)
}

fn field_error(e: crate::model::schedule::FieldError) -> ApiError {
    ApiError::bad(format!("field \"{}\": {}", e.field, e.message))
}

fn string<'a>(field: &str, v: &'a Value) -> Result<&'a str, ApiError> {
    v.as_str()
        .ok_or_else(|| ApiError::bad(format!("field \"{field}\" must be a string, got {}", kind(v))))
}

/// `base` with the fields of `body`, each checked for its type; the queue must exist
/// (`has_queue`: `base` has one already).
fn apply(mut s: Schedule, body: &Map<String, Value>, queues: &[Queue], has_queue: bool) -> Result<Schedule, ApiError> {
    if body.contains_key("cron") && body.contains_key("every") && !body["cron"].is_null() && !body["every"].is_null() {
        return Err(ApiError::bad(
            "field \"cron\": give either \"cron\" or \"every\", not both",
        ));
    }
    let mut queue_given = false;
    for (k, v) in body {
        match k.as_str() {
            "name" => {}
            "queue" => {
                let key = string("queue", v)?;
                s.queue = Queue::find(queues, key)
                    .ok_or_else(|| ApiError::bad(format!("field \"queue\": no queue {key:?}")))?
                    .id;
                queue_given = true;
            }
            "params" => {
                s.params = match v {
                    Value::Null => Document::new(),
                    v => to_document(v).map_err(|e| ApiError::bad(format!("field \"params\" {e}")))?,
                }
            }
            "cron" => {
                s.cron = match v {
                    Value::Null => None,
                    v => Some(string("cron", v)?.to_owned()),
                };
                if s.cron.is_some() {
                    s.every = None;
                }
            }
            "every" => {
                s.every = match v {
                    Value::Null => None,
                    v => Some(string("every", v)?.to_owned()),
                };
                if s.every.is_some() {
                    s.cron = None;
                }
            }
            "timezone" => s.timezone = string("timezone", v)?.to_owned(),
            "catch_up" => {
                s.catch_up = serde_json::from_value(v.clone())
                    .map_err(|_| ApiError::bad("field \"catch_up\" must be \"none\", \"last\" or \"all\""))?
            }
            "catch_up_limit" => {
                s.catch_up_limit = v.as_i64().ok_or_else(|| {
                    ApiError::bad(format!("field \"catch_up_limit\" must be an integer, got {}", kind(v)))
                })?
            }
            "overlap" => {
                s.overlap = serde_json::from_value(v.clone())
                    .map_err(|_| ApiError::bad("field \"overlap\" must be \"allow\" or \"skip\""))?
            }
            "paused" => {
                s.paused = v
                    .as_bool()
                    .ok_or_else(|| ApiError::bad(format!("field \"paused\" must be a boolean, got {}", kind(v))))?
            }
            other => {
                return Err(ApiError::bad(format!(
                    "unknown field {other:?}: a schedule has {FIELDS}"
                )))
            }
        }
    }
    if !queue_given && !has_queue {
        return Err(ApiError::bad("field \"queue\" is required (a queue name or id)"));
    }
    Ok(s)
}
