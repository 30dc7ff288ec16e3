//! Batches: `POST /tasks` with `batch` (and optionally `batch_size`) puts its tasks in a
//! batch; `GET /batches/{id}` reports the batch's counts by status and whether it is
//! complete (it has all its tasks, when a size was given, and every one has ended).

use axum::extract::{Path, State};
use axum::Json;
use serde_json::{json, Map, Value};

use super::body::kind;
use super::{ApiError, Shared};
use crate::model::status;
use crate::store::TaskFilter;

/// Longest batch id.
pub const MAX_BATCH_ID: usize = 200;

/// The `batch` and `batch_size` of a `POST /tasks` body, checked.
pub(super) fn parse(body: &Map<String, Value>) -> Result<Option<(String, Option<i64>)>, ApiError> {
    let size = match body.get("batch_size") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_i64().filter(|n| *n >= 1) {
            Some(n) => Some(n),
            None => {
                let got = match v {
                    Value::Number(n) => n.to_string(),
                    other => kind(other).to_string(),
                };
                return Err(ApiError::bad(format!(
                    "field \"batch_size\" must be a whole number of at least 1, got {got}"
                )));
            }
        },
    };
    let id = match body.get("batch") {
        None | Some(Value::Null) if size.is_some() => {
            return Err(ApiError::bad(
                "field \"batch_size\" needs field \"batch\" (the batch's id)",
            ))
        }
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) if !s.is_empty() && s.len() <= MAX_BATCH_ID && !s.chars().any(char::is_control) => {
            s.clone()
        }
        Some(Value::String(_)) => {
            return Err(ApiError::bad(format!(
                "field \"batch\" must be 1 to {MAX_BATCH_ID} bytes without control characters"
            )))
        }
        Some(other) => {
            return Err(ApiError::bad(format!(
                "field \"batch\" must be a string, got {}",
                kind(other)
            )))
        }
    };
    Ok(Some((id, size)))
}

/// Records the batch (at its first submission) and checks that `adding` more tasks fit:
/// a size different from the recorded one, more tasks than the size, or a batch closed by
/// retention is refused (409).
/// Two submissions at the same moment to a batch with room for one of them can both pass;
/// `GET /batches/{id}` then shows `total` above `size`.
pub(super) async fn admit(state: &Shared, id: &str, size: Option<i64>, adding: usize) -> Result<(), ApiError> {
    let batch = crate::lifecycle::batches::open_batch(state.store.as_ref(), id, size).await?;
    if let Some(closed) = crate::lifecycle::batches::closed_at(&batch) {
        return Err(ApiError::Conflict(format!(
            "batch {id:?} was closed by retention at {closed} (its tasks are deleted or about to be); submit under a new batch id"
        )));
    }
    if let (Some(recorded), Some(given)) = (batch.size, size) {
        if recorded != given {
            return Err(ApiError::Conflict(format!(
                "batch {id:?} has size {recorded}, not {given}"
            )));
        }
    }
    if let Some(recorded) = batch.size {
        let has = state.store.count_tasks(&filter(id)).await?;
        if has + adding as u64 > recorded as u64 {
            return Err(ApiError::Conflict(format!(
                "batch {id:?} has {has} of its {recorded} tasks; {adding} more would go past its size"
            )));
        }
    }
    Ok(())
}

fn filter(id: &str) -> TaskFilter {
    TaskFilter {
        batch: Some(id.to_string()),
        ..Default::default()
    }
}

/// `GET /batches/{id}`: `{batch, size, ctime, total, counts: {status name: n}, by_code:
/// {code: n}, ended, complete, closed}`; 404 when no task was ever submitted in it.
pub(super) async fn show(State(state): State<Shared>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let Some(batch) = state.store.batch(&id).await? else {
        return Err(ApiError::NotFound(format!("no batch {id:?}")));
    };
    let counts = state.store.batch_counts(&id).await?;
    let total: u64 = counts.values().sum();
    let ended: u64 = counts
        .iter()
        .filter(|(c, _)| status::finished(**c))
        .map(|(_, n)| n)
        .sum();
    let mut named = Map::new();
    let mut by_code = Map::new();
    for (code, n) in &counts {
        let name = status::name(*code);
        let sum = named.get(name).and_then(Value::as_u64).unwrap_or(0) + n;
        named.insert(name.to_string(), json!(sum));
        by_code.insert(code.to_string(), json!(n));
    }
    let complete = crate::lifecycle::batches::complete(&batch, &counts);
    Ok(Json(json!({
        "batch": batch.id,
        "size": batch.size,
        "ctime": super::json::date(&batch.ctime, false),
        "total": total,
        "counts": named,
        "by_code": by_code,
        "ended": ended,
        "complete": complete,
        "closed": batch.closed.as_ref().map(|d| super::json::date(d, false)),
    })))
}
