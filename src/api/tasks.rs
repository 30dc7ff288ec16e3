//! `GET /tasks` (search on indexed fields), `GET /tasks/{id}` and its outputs; `POST
//! /tasks` is in [`super::create`].

use std::collections::HashMap;

use axum::extract::{Query, Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bson::oid::ObjectId;
use serde_json::{json, Value};

use super::body::PathKey;
use super::form::Shape;
use super::json::TaskView;
use super::search::{self, Input};
use super::{json, ApiError, Shared, MAX_TASK_LIMIT};
use crate::model::Output;
use crate::store::{Page, TaskFilter};

/// The response header carrying the cursor of the next page of a full page of tasks.
pub const NEXT_HEADER: &str = "disbatch-next";
/// Followers (`GET /tasks?new=`) one API process holds waiting at once.
pub const MAX_FOLLOWERS: usize = 256;
/// The shortest time between two looks of one follower: a burst of changes costs it one
/// query per interval, not one per change.
const FOLLOW_INTERVAL: std::time::Duration = std::time::Duration::from_millis(200);

/// Whether a query flag is on (`1`, `true`, `yes`, `on`, or present without a value).
pub(super) fn truthy(v: Option<&String>) -> bool {
    matches!(v.map(String::as_str), Some("1" | "true" | "yes" | "on" | ""))
}

/// Most tasks one `GET /tasks?full=1` may return, since each may read files back.
pub const MAX_FULL_LIMIT: u64 = 10;

/// Most bytes of one file-backed output that `GET /tasks?full=1` puts in its answer; a
/// longer output is cut there (at a character boundary) and marked with `<name>_cut`, which
/// links to `GET /tasks/{id}/<name>` for the whole text.
pub const FULL_OUTPUT_CAP: usize = 1 << 20;

/// What stands for an inline stdout/stderr with `terse`, as in Disbatch 4.
pub const TERSE: &str = "[terse mode]";

/// JSON, indented when `pretty`.
fn reply(value: Value, pretty: bool) -> Response {
    if !pretty {
        return Json(value).into_response();
    }
    let mut text = serde_json::to_string_pretty(&value).unwrap_or_default();
    text.push('\n');
    ([(header::CONTENT_TYPE, "application/json")], text).into_response()
}

/// `GET /tasks?queue=&status=&node=&id=&batch=&after=&filter={json}&limit=&skip=&count=&fields=&epoch=&terse=&full=&pretty=`:
/// tasks newest first, or `{"count": n}`. The same filters and options may come in a JSON
/// body, options also with Disbatch 4's leading dot (see [`super::search`]). A query
/// without a filter needs a limit. `terse` replaces inline stdout/stderr with `"[terse
/// mode]"`; `full` reads file-backed ones back as text (limit at most [`MAX_FULL_LIMIT`]);
/// `pretty` indents the JSON. In Disbatch 4's shape, `.limit` 1 answers the one task found
/// (not a list), or `{}` when none is.
///
/// A full page carries the cursor of the next one in the [`NEXT_HEADER`] header; `next=<cursor>`
/// asks for that page (stable while tasks are added, unlike `skip`). `new=<id>` lists the
/// tasks created after task `<id>`, oldest first, and when there are none yet waits for one
/// (up to `timeout`, 30 s by default, at most 300 s) before answering `[]`.
pub(super) async fn search(State(state): State<Shared>, shape: Shape, request: Request) -> Result<Response, ApiError> {
    let input = Input::read(request).await?;
    answer(&state, shape, &input, false).await
}

/// The answer to a search for `input`'s filters and options, newest first unless
/// `oldest_first` (or `new`, which lists oldest first).
pub(super) async fn answer(
    state: &Shared,
    shape: Shape,
    input: &Input,
    oldest_first: bool,
) -> Result<Response, ApiError> {
    let mut filter = search::filter(state, &input.filters).await?;
    let cursor = |key: &str| -> Result<Option<ObjectId>, ApiError> {
        input
            .text(key)
            .map(|v| {
                ObjectId::parse_str(v.trim())
                    .map_err(|_| ApiError::bad(format!("\"{key}\" must be a task id (24 hex digits), got {v:?}")))
            })
            .transpose()
    };
    let (new, next) = (cursor("new")?, cursor("next")?);
    let given = |k: &str| input.options.get(k).is_some_and(|v| !v.is_null());
    // Options that are off (`.skip: 0`, `.count: 0`, as Disbatch 4's CLI sends them) do not count.
    let on = |k: &str| -> Result<bool, ApiError> {
        Ok(match k {
            "skip" => input.number("skip")?.unwrap_or(0) > 0,
            "count" => input.flag("count")?,
            _ => given(k),
        })
    };
    for (a, b) in [("new", "next"), ("new", "skip"), ("next", "skip"), ("new", "count")] {
        if on(a)? && on(b)? {
            return Err(ApiError::bad(format!("\"{a}\" and \"{b}\" exclude each other")));
        }
    }
    if given("timeout") && new.is_none() {
        return Err(ApiError::bad(
            "\"timeout\" is for \"new\": it says how long to wait for new tasks",
        ));
    }
    let wait = if new.is_some() { Some(input.timeout()?) } else { None };
    filter.newer_than = new;
    filter.older_than = next;
    let pretty = input.flag("pretty")?;
    if input.flag("count")? {
        let n = state.store.count_tasks(&filter).await?;
        return Ok(reply(json!({ "count": n }), pretty));
    }
    let (terse, full) = (input.flag("terse")?, input.flag("full")?);
    if terse && full {
        return Err(ApiError::bad("\"terse\" and \"full\" exclude each other"));
    }
    // 0 is no limit, as in Disbatch 4.
    let limit = input.number("limit")?.filter(|l| *l > 0);
    let skip = input.number("skip")?.unwrap_or(0);
    if i64::try_from(skip).is_err() {
        return Err(ApiError::bad(format!(
            "\"skip\" must be at most {}, got {skip}",
            i64::MAX
        )));
    }
    if filter == TaskFilter::default() && limit.is_none() {
        return Err(ApiError::bad(
            "refusing an unbounded query: give a filter (queue, status, node, id) or a \"limit\"",
        ));
    }
    // Disbatch 4 answered `.limit` 1 with the task itself.
    let single = !shape.native && limit == Some(1) && input.dotted.iter().any(|d| d == "limit");
    let limit = limit.unwrap_or(if full { MAX_FULL_LIMIT } else { MAX_TASK_LIMIT });
    if limit > MAX_TASK_LIMIT {
        return Err(ApiError::bad(format!(
            "\"limit\" must be at most {MAX_TASK_LIMIT}, got {limit}"
        )));
    }
    let (fields, without) = input.fields()?;
    let view = TaskView {
        epoch: input.flag("epoch")?,
        fields,
        without,
    };
    if full && limit > MAX_FULL_LIMIT {
        return Err(ApiError::bad(format!(
            "\"full\" reads outputs back: \"limit\" must be at most {MAX_FULL_LIMIT} with it, got {limit}"
        )));
    }
    let page = Page {
        skip,
        limit,
        oldest_first: oldest_first || new.is_some(),
    };
    let tasks = match wait {
        Some(wait) => newer(state, &filter, page, wait).await?,
        None => state.store.find_tasks(&filter, page).await?,
    };
    let next = match tasks.last() {
        Some(last) if !page.oldest_first && tasks.len() as u64 == limit => Some(last.id.to_hex()),
        _ => None,
    };
    let mut out = Vec::with_capacity(tasks.len());
    for t in &tasks {
        let mut value = json::task(t, &view);
        for (name, stream) in [("stdout", &t.stdout), ("stderr", &t.stderr)] {
            if value.get(name).is_none() {
                continue;
            }
            match stream {
                Some(Output::Inline(_)) if terse => value[name] = Value::String(TERSE.into()),
                Some(o @ Output::File(_)) if full => {
                    let (text, cut) = head(state, o, FULL_OUTPUT_CAP).await?;
                    if cut {
                        value[format!("{name}_cut")] = json!({
                            "shown_bytes": text.len(),
                            "full_text": format!("/tasks/{}/{name}", t.id),
                        });
                    }
                    value[name] = Value::String(text);
                }
                _ => {}
            }
        }
        out.push(value);
    }
    let answer = match out.pop() {
        Some(one) if single => one,
        None if single => json!({}),
        last => Value::Array(out.into_iter().chain(last).collect()),
    };
    let mut response = reply(answer, pretty);
    if let Some(next) = next.and_then(|n| header::HeaderValue::from_str(&n).ok()) {
        response.headers_mut().insert(NEXT_HEADER, next);
    }
    Ok(response)
}

/// The first `cap` bytes of an output (cut back to a character boundary) and whether it
/// had more, read piece by piece so that no more than a piece past `cap` is held.
async fn head(state: &Shared, output: &Output, cap: usize) -> Result<(String, bool), ApiError> {
    use futures::StreamExt;
    let mut pieces = state.store.output_stream(output).await?;
    let mut text = String::new();
    while let Some(piece) = pieces.next().await {
        let piece = piece?;
        if text.len() + piece.len() > cap {
            let mut end = cap - text.len();
            while !piece.is_char_boundary(end) {
                end -= 1;
            }
            text.push_str(&piece[..end]);
            return Ok((text, true));
        }
        text.push_str(&piece);
    }
    Ok((text, false))
}

/// The tasks `filter` finds, waiting up to `wait` for the first of them to be created.
async fn newer(
    state: &Shared,
    filter: &TaskFilter,
    page: Page,
    wait: std::time::Duration,
) -> Result<Vec<crate::model::Task>, ApiError> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static FOLLOWERS: AtomicUsize = AtomicUsize::new(0);
    struct Follower;
    impl Drop for Follower {
        fn drop(&mut self) {
            FOLLOWERS.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let after = filter.newer_than;
    let started = tokio::time::Instant::now();
    // Subscribed before the first look: a task created between the look and the wait is seen.
    let mut rx = state.watch.subscribe(&state.store);
    let tasks = state.store.find_tasks(filter, page).await?;
    if !tasks.is_empty() || wait.is_zero() {
        return Ok(tasks);
    }
    if FOLLOWERS.fetch_add(1, Ordering::SeqCst) >= MAX_FOLLOWERS {
        FOLLOWERS.fetch_sub(1, Ordering::SeqCst);
        return Err(ApiError::Unavailable(format!(
            "{MAX_FOLLOWERS} requests already wait for new tasks on this server; try again shortly, or with a shorter \"timeout\""
        )));
    }
    let _follower = Follower;
    loop {
        let left = wait.saturating_sub(started.elapsed());
        let newer = |id: &ObjectId| after.is_none_or(|a| *id > a);
        let woken = !left.is_zero() && super::watch::changed(&state.watch, &mut rx, newer, left).await;
        if woken {
            // Changes that arrive meanwhile are covered by the next look.
            let pause = FOLLOW_INTERVAL.min(wait.saturating_sub(started.elapsed()));
            tokio::time::sleep(pause).await;
            while rx.try_recv().is_ok() {}
        }
        let tasks = state.store.find_tasks(filter, page).await?;
        if !tasks.is_empty() || !woken {
            return Ok(tasks);
        }
    }
}

/// `GET /tasks/{id}?output=1&epoch=1`: one task; with `output`, GridFS-backed stdout/stderr
/// are read back as text.
pub(super) async fn one(
    State(state): State<Shared>,
    PathKey(id): PathKey,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let queue = match super::body::query_value(&q, "queue") {
        None => None,
        Some(v) => Some(ObjectId::parse_str(v).map_err(|_| ApiError::bad(format!("invalid queue id {v:?}")))?),
    };
    let task = super::keys::find(&state, &id, queue).await?;
    let view = TaskView {
        epoch: truthy(q.get("epoch")),
        ..TaskView::default()
    };
    let mut value = json::task(&task, &view);
    if truthy(q.get("output")) {
        for (name, out) in [("stdout", &task.stdout), ("stderr", &task.stderr)] {
            if let Some(o @ Output::File(_)) = out {
                let text = state.store.read_output(o).await?;
                value[name] = Value::String(text);
                value[format!("{name}_file")] = json::output(out);
            }
        }
    }
    Ok(Json(value))
}

/// The task `id` (24 hex digits): 400 when it is not an id, 404 when there is no such task.
async fn find(state: &Shared, id: &str) -> Result<crate::model::Task, ApiError> {
    let oid = ObjectId::parse_str(id).map_err(|_| ApiError::bad(format!("invalid task id {id:?}")))?;
    state
        .store
        .task(oid)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no task {id}")))
}

/// `GET /tasks/{id}/stdout`: the task's stdout as `text/plain`, streamed.
pub(super) async fn stdout(state: State<Shared>, id: PathKey) -> Result<Response, ApiError> {
    output_text(state, id, "stdout").await
}

/// `GET /tasks/{id}/stderr`: the task's stderr as `text/plain`, streamed.
pub(super) async fn stderr(state: State<Shared>, id: PathKey) -> Result<Response, ApiError> {
    output_text(state, id, "stderr").await
}

/// One output of a task as text: inline text as is, a GridFS file chunk by chunk, so a
/// large output never sits whole in the server's memory. A file found corrupt midway
/// aborts the response (its status line has gone out already).
async fn output_text(State(state): State<Shared>, PathKey(id): PathKey, name: &str) -> Result<Response, ApiError> {
    use futures::TryStreamExt;
    let task = find(&state, &id).await?;
    let output = if name == "stdout" { &task.stdout } else { &task.stderr };
    let Some(output) = output else {
        return Err(ApiError::NotFound(format!(
            "task {id} has no {name} yet (status {})",
            task.status
        )));
    };
    let pieces = state.store.output_stream(output).await?;
    let body = axum::body::Body::from_stream(
        pieces
            .map_ok(bytes::Bytes::from)
            .map_err(|e| std::io::Error::other(e.to_string())),
    );
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response())
}
