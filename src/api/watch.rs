//! Waiting for tasks: `GET /tasks/wait?ids=a,b&timeout=30s` answers once every task has
//! ended (or at the timeout, with their states then), and `GET /tasks/{id}/events` is a
//! server-sent-events stream of a task's status and progress changes.
//!
//! Waiters never poll the database on a timer: they register with the process's
//! [`TaskWatch`] (see `hub`), which follows
//! [`Store::watch_tasks`](crate::store::Store::watch_tasks) and wakes a waiter only when
//! one of its tasks may have changed; the waiter then reads its tasks again. With a store
//! that cannot notify, waiters look again every 500 ms. Waiters are capped
//! ([`WaitLimits`]).

mod hub;

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::Json;
use bson::oid::ObjectId;
use futures::Stream;
use serde_json::{json, Value};
use tokio::sync::broadcast;

pub(super) use self::hub::Change;
use self::hub::Waiter;
pub use self::hub::{TaskWatch, WaitLimits, DEFAULT_MAX_EVENT_STREAM, DEFAULT_MAX_WAITED_IDS, DEFAULT_MAX_WAITERS};
use super::body::PathKey;
use super::json::{self, TaskView};
use super::{ApiError, Shared};
use crate::model::{status, Task};

/// Longest `timeout` of `GET /tasks/wait`.
pub const MAX_WAIT: Duration = Duration::from_secs(300);
/// `timeout` of `GET /tasks/wait` when none is given.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);
/// Most ids one wait may name.
pub const MAX_WAIT_IDS: usize = 1000;
/// How often a waiter looks again while the store cannot notify.
const UNWATCHED_POLL: Duration = Duration::from_millis(500);

/// Waits until `rx` says a task `wanted` (or any task) may have changed, or `limit` passes
/// (for the followers of new tasks, which watch no ids of their own). Returns false at the
/// limit.
pub(super) async fn changed(
    watch: &TaskWatch,
    rx: &mut broadcast::Receiver<Change>,
    wanted: impl Fn(&ObjectId) -> bool,
    limit: Duration,
) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let step = if watch.live() { limit } else { UNWATCHED_POLL.min(limit) };
        let until = deadline.min(tokio::time::Instant::now() + step);
        match tokio::time::timeout_at(until, rx.recv()).await {
            Ok(Ok(Change::Task(id))) if !wanted(&id) => continue,
            Ok(Ok(_)) | Ok(Err(broadcast::error::RecvError::Lagged(_))) => return true,
            Ok(Err(broadcast::error::RecvError::Closed)) => return true,
            Err(_) if tokio::time::Instant::now() >= deadline => return false,
            // Not followed: look again.
            Err(_) => return true,
        }
    }
}

/// The tasks `ids`, in order (an id without a task is left out), in one query.
async fn read(state: &Shared, ids: &[ObjectId]) -> Result<Vec<Task>, ApiError> {
    let filter = crate::store::TaskFilter {
        ids: Some(ids.to_vec()),
        ..Default::default()
    };
    let page = crate::store::Page {
        skip: 0,
        limit: ids.len() as u64,
        oldest_first: false,
    };
    let mut found: HashMap<ObjectId, Task> = state
        .store
        .find_tasks(&filter, page)
        .await?
        .into_iter()
        .map(|t| (t.id, t))
        .collect();
    Ok(ids.iter().filter_map(|id| found.remove(id)).collect())
}

/// `timeout=30s` (a duration, or seconds).
pub(super) fn timeout(q: &HashMap<String, String>) -> Result<Duration, ApiError> {
    let Some(t) = super::body::query_value(q, "timeout") else {
        return Ok(DEFAULT_WAIT);
    };
    let d = match t.parse::<f64>() {
        Ok(s) if s.is_finite() && s >= 0.0 => Duration::from_secs_f64(s.min(MAX_WAIT.as_secs_f64() + 1.0)),
        Ok(_) => {
            return Err(ApiError::bad(format!(
                "parameter \"timeout\" must not be negative, got {t:?}"
            )))
        }
        Err(_) => humantime::parse_duration(t).map_err(|e| {
            ApiError::bad(format!(
                "parameter \"timeout\" must be a duration like \"30s\": {t:?}: {e}"
            ))
        })?,
    };
    if d > MAX_WAIT {
        return Err(ApiError::bad(format!(
            "parameter \"timeout\" must be at most {} seconds, got {t:?}",
            MAX_WAIT.as_secs()
        )));
    }
    Ok(d)
}

/// `GET /tasks/wait?ids=a,b,c&timeout=30s`: `{done, tasks: [Task]}` once every task has
/// ended (`done: true`), or at the timeout with their states then (`done: false`). An
/// unknown id is 404 at once.
pub(super) async fn wait(
    State(state): State<Shared>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let list = q.get("ids").map(String::as_str).unwrap_or_default();
    let ids: Vec<ObjectId> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| ObjectId::parse_str(s).map_err(|_| ApiError::bad(format!("parameter \"ids\": invalid task id {s:?}"))))
        .collect::<Result<_, _>>()?;
    if ids.is_empty() {
        return Err(ApiError::bad(
            "parameter \"ids\" is required: task ids separated by commas",
        ));
    }
    if ids.len() > MAX_WAIT_IDS {
        return Err(ApiError::bad(format!(
            "parameter \"ids\" names {} tasks; at most {MAX_WAIT_IDS} per wait",
            ids.len()
        )));
    }
    let limit = timeout(&q)?;
    let started = tokio::time::Instant::now();
    let waiter = state.watch.register(&state.store, &ids, state.wait_limits).await?;
    let answer = |tasks: &[Task], done: bool| {
        let view = TaskView::default();
        Json(json!({
            "done": done,
            "waited_ms": started.elapsed().as_millis() as u64,
            "tasks": tasks.iter().map(|t| json::task(t, &view)).collect::<Vec<_>>(),
        }))
    };
    loop {
        let tasks = read(&state, &ids).await?;
        if let Some(missing) = ids.iter().find(|id| !tasks.iter().any(|t| t.id == **id)) {
            return Err(ApiError::NotFound(format!("no task {missing}")));
        }
        if tasks.iter().all(|t| status::finished(t.status)) {
            return Ok(answer(&tasks, true));
        }
        let left = limit.saturating_sub(started.elapsed());
        if left.is_zero() || !waiter.changed(&state.watch, left, UNWATCHED_POLL).await {
            let tasks = read(&state, &ids).await?;
            let done = tasks.iter().all(|t| status::finished(t.status));
            return Ok(answer(&tasks, done));
        }
    }
}

/// What an event shows of a task: its status and progress.
fn shown(t: &Task) -> (i32, Option<(Option<u64>, String, i64)>) {
    let progress = t
        .progress
        .as_ref()
        .map(|p| (p.percent.map(f64::to_bits), p.info.clone(), p.at.timestamp_millis()));
    (t.status, progress)
}

/// `GET /tasks/{id}/events`: a server-sent-events stream of the task (`event: task`, the
/// task's JSON as data), first as it is, then at each change of its status or progress;
/// it ends after the task has ended, or once it has lasted
/// [`WaitLimits::max_event_stream`] (a client reconnects and gets the task as it is then).
pub(super) async fn events(
    State(state): State<Shared>,
    PathKey(id): PathKey,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let oid = ObjectId::parse_str(&id).map_err(|_| ApiError::bad(format!("invalid task id {id:?}")))?;
    let waiter = state.watch.register(&state.store, &[oid], state.wait_limits).await?;
    let until = tokio::time::Instant::now() + state.wait_limits.max_event_stream;
    let first = state
        .store
        .task(oid)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no task {id}")))?;
    let event = |t: &Task| {
        let data = json::task(t, &TaskView::default()).to_string();
        Event::default().event("task").data(data)
    };
    struct Follow {
        state: Shared,
        waiter: Waiter,
        last: Option<Task>,
        ended: bool,
    }
    let start = Follow {
        state,
        waiter,
        last: None,
        ended: false,
    };
    let stream = futures::stream::unfold((start, Some(first)), move |(mut f, pending)| {
        async move {
            if let Some(t) = pending {
                f.ended = status::finished(t.status);
                let e = event(&t);
                f.last = Some(t);
                return Some((Ok(e), (f, None)));
            }
            if f.ended {
                return None;
            }
            loop {
                let left = until.saturating_duration_since(tokio::time::Instant::now());
                // At its lifetime the stream ends, and its waiter place is freed.
                if left.is_zero() || !f.waiter.changed(&f.state.watch, left, UNWATCHED_POLL).await {
                    return None;
                }
                let t = match f.state.store.task(oid).await {
                    Ok(Some(t)) => t,
                    // Deleted: the stream ends.
                    Ok(None) => return None,
                    // Unreadable for now: look again at the next change.
                    Err(_) => continue,
                };
                if f.last.as_ref().map(shown) != Some(shown(&t)) {
                    f.ended = status::finished(t.status);
                    let e = event(&t);
                    f.last = Some(t);
                    return Some((Ok(e), (f, None)));
                }
            }
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}
