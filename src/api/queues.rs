//! `GET|POST /queues` and `GET|POST|DELETE /queues/{queue}` (queue = `_id` hex or name).
//!
//! Writes take JSON or, as Disbatch 4's `disbatch` CLI sends them, forms, and answer the
//! queue together with the MongoDB result object Disbatch 4 answered
//! (`MongoDB::InsertOneResult`, `MongoDB::UpdateResult`, `MongoDB::DeleteResult`). In
//! Disbatch 4's shape (the default) a new queue's `id` is `{"$oid": …}`; the native shape
//! ([`Shape`]) gives the hex string. An unknown queue is 404 in both.
//!
//! The values of a queue's `sandbox.env` (how an HTTP plugin gets its API key) are shown
//! only to a request carrying the API token when one is configured; other reads see
//! [`HIDDEN`] in their place, and a write sending [`HIDDEN`] back keeps the stored value.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use bson::oid::ObjectId;
use serde_json::{json, Value};

use super::body::{Params, PathKey};
use super::form::{decode_json_fields, Shape};
use super::queue_fields::{check_next, check_pin, fields, queue_warnings, QUEUE_FIELDS};
use super::{json, ApiError, Shared};
use crate::model::{Queue, UnreadableQueue};
use crate::store::{NewQueue, QueueState, QueueUpdate};

/// What a hidden `sandbox.env` value reads as.
pub const HIDDEN: &str = "***";

/// `value` (a queue as shown) with its `sandbox.env` values hidden unless `headers` carry
/// the API token (or none is configured).
fn shown(state: &Shared, headers: &HeaderMap, mut value: Value) -> Value {
    if !super::auth::authorized(state, headers) {
        if let Some(env) = value.pointer_mut("/sandbox/env").and_then(Value::as_object_mut) {
            for v in env.values_mut() {
                *v = Value::String(HIDDEN.into());
            }
        }
    }
    value
}

/// Puts the stored value back for each `sandbox.env` value of an update given as
/// [`HIDDEN`] (a queue document read without the token and sent back); 400 naming the
/// variable when the queue has none of that name.
fn keep_hidden(body: &mut serde_json::Map<String, Value>, before: &Found) -> Result<(), ApiError> {
    let Some(env) = body
        .get_mut("sandbox")
        .and_then(|s| s.get_mut("env"))
        .and_then(Value::as_object_mut)
    else {
        return Ok(());
    };
    for (name, v) in env.iter_mut() {
        if v.as_str() != Some(HIDDEN) {
            continue;
        }
        let stored = match before {
            Found::Queue(q) => q.sandbox.env.get(name),
            Found::Unreadable(_) => None,
        };
        let Some(stored) = stored else {
            return Err(ApiError::bad(format!(
                "field \"sandbox.env.{name}\" is {HIDDEN:?}, which stands for a hidden value, but the queue has no variable {name:?} to keep: give its value"
            )));
        };
        *v = Value::String(stored.clone());
    }
    Ok(())
}

/// The fields of a queue a form may give as JSON text.
const JSON_FIELDS: [&str; 3] = ["sandbox", "retry", "rate"];

/// A queue found by `_id` or name: readable, or a document that cannot be read as a queue.
pub(super) enum Found {
    Queue(Box<Queue>),
    Unreadable(UnreadableQueue),
}

impl Found {
    fn id(&self) -> ObjectId {
        match self {
            Found::Queue(q) => q.id,
            Found::Unreadable(u) => u.id,
        }
    }

    fn name(&self) -> Option<&str> {
        match self {
            Found::Queue(q) => Some(&q.name),
            Found::Unreadable(u) => u.name.as_deref(),
        }
    }
}

/// The queue with this `_id` (hex) or name, readable or not.
async fn find_any(state: &Shared, key: &str) -> Result<Found, ApiError> {
    if let Ok(q) = find(state, key).await {
        return Ok(Found::Queue(Box::new(q)));
    }
    let id = ObjectId::parse_str(key).ok();
    let unreadable = state.store.unreadable_queues().await?;
    let found = match id {
        Some(id) => unreadable.iter().find(|q| q.id == id),
        None => None,
    }
    .or_else(|| unreadable.iter().find(|q| q.name.as_deref() == Some(key)));
    found
        .cloned()
        .map(Found::Unreadable)
        .ok_or_else(|| ApiError::NotFound(format!("no queue {key:?}")))
}

/// The readable queue with this `_id` (hex) or name.
pub(super) async fn find(state: &Shared, key: &str) -> Result<Queue, ApiError> {
    let queues = state.store.queues().await?;
    Queue::find(&queues, key)
        .cloned()
        .ok_or_else(|| ApiError::NotFound(format!("no queue {key:?}")))
}

/// `GET /queues`: every queue with its counts and problems; a queue document that cannot
/// be read is listed too, with its `problem`.
pub(super) async fn list(State(state): State<Shared>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    let queues = state.store.queues().await?;
    let unreadable = state.store.unreadable_queues().await?;
    let counts = state.counts.counts(state.store.as_ref()).await?;
    let reports = problem_reports(&state).await?;
    let mut readable = Vec::with_capacity(queues.len());
    for q in &queues {
        let value = with_rate_used(&state, q, json::queue(q, counts.get(&q.id))).await?;
        readable.push(with_problems(value, q.id, &reports));
    }
    let readable = readable.into_iter();
    let unreadable = unreadable
        .iter()
        .map(|u| with_problems(json::unreadable_queue(u, counts.get(&u.id)), u.id, &reports));
    let readable = readable.map(|v| shown(&state, &headers, v));
    Ok(Json(Value::Array(readable.chain(unreadable).collect())))
}

/// `GET /queues/{queue}`: `{id, plugin, name, threads, queued, running, completed, problems, …}`,
/// and `problem` for a document that cannot be read as a queue; an unknown queue is 404.
pub(super) async fn one(
    State(state): State<Shared>,
    headers: HeaderMap,
    PathKey(key): PathKey,
) -> Result<Json<Value>, ApiError> {
    let found = find_any(&state, &key).await?;
    let counts = state.counts.counts(state.store.as_ref()).await?;
    let reports = problem_reports(&state).await?;
    let value = match &found {
        Found::Queue(q) => with_rate_used(&state, q, json::queue(q, counts.get(&q.id))).await?,
        Found::Unreadable(u) => json::unreadable_queue(u, counts.get(&u.id)),
    };
    Ok(Json(shown(
        &state,
        &headers,
        with_problems(value, found.id(), &reports),
    )))
}

/// A queue's JSON with `rate_used` (the grants its window holds now, read from its grant
/// rows: `lifecycle::rate`) when it has a `rate`.
async fn with_rate_used(state: &Shared, q: &Queue, mut value: Value) -> Result<Value, ApiError> {
    if let Some(rate) = &q.rate {
        let used = crate::lifecycle::rate::in_use(state.store.as_ref(), q.id, rate).await?;
        value["rate_used"] = serde_json::json!(used);
    }
    Ok(value)
}

/// The queue problems of the fresh nodes: `(node, queue id in hex → reason)`.
async fn problem_reports(
    state: &Shared,
) -> Result<Vec<(String, std::collections::BTreeMap<String, String>)>, ApiError> {
    let now = bson::DateTime::now();
    let nodes = state.store.nodes().await?;
    Ok(nodes
        .into_iter()
        .filter(|n| !n.queue_problems.is_empty() && json::node_age(n, now) < super::FRESH_NODE.as_secs_f64())
        .map(|n| (n.node, n.queue_problems))
        .collect())
}

/// `value` with `problems`: `[{node, reason}]`, why fresh nodes cannot run queue `id`.
fn with_problems(
    mut value: Value,
    id: ObjectId,
    reports: &[(String, std::collections::BTreeMap<String, String>)],
) -> Value {
    let hex = id.to_hex();
    let problems: Vec<Value> = reports
        .iter()
        .filter_map(|(node, problems)| problems.get(&hex).map(|reason| json!({"node": node, "reason": reason})))
        .collect();
    value["problems"] = Value::Array(problems);
    value
}

/// The fields of a `POST` to a queue route: from a form, the JSON text of `sandbox` and
/// `retry` decoded.
fn queue_body(params: Params) -> Result<serde_json::Map<String, Value>, ApiError> {
    let mut body = params.fields;
    if params.form {
        decode_json_fields(&mut body, &JSON_FIELDS)?;
    }
    Ok(body)
}

/// `POST /queues {name, plugin[, threads, sort, sandbox, on_orphan, …]}`: creates a queue.
/// Answers the queue with `MongoDB::InsertOneResult`; its `id` is `{"$oid": …}` as in
/// Disbatch 4, the hex string in the native shape.
pub(super) async fn create(State(state): State<Shared>, shape: Shape, params: Params) -> Result<Json<Value>, ApiError> {
    let body = queue_body(params)?;
    let f = fields(&state, &body)?;
    let name = f.name.ok_or_else(|| ApiError::bad("field \"name\" is required"))?;
    let plugin = f.plugin.ok_or_else(|| ApiError::bad("field \"plugin\" is required"))?;
    check_pin(&state, &plugin).await?;
    if ObjectId::parse_str(&name).is_ok() {
        return Err(ApiError::bad("field \"name\" must not look like an ObjectId"));
    }
    check_next(&state, &f.extra, None, &name).await?;
    let queue = state
        .store
        .create_queue(NewQueue {
            name,
            plugin,
            threads: f.threads.unwrap_or(None),
            sort: f.sort.unwrap_or_default(),
            extra: f.extra,
        })
        .await?;
    let mut value = json::mongo::with(json::queue(&queue, None), json::mongo::insert_one(&queue.id));
    if !shape.native {
        value["id"] = json::oid(&queue.id);
    }
    with_warnings(&mut value, queue_warnings(&state, queue.id).await?);
    Ok(Json(value))
}

/// Adds `warnings` (things the write allowed but that may not be meant) to an answer, when
/// there are any.
fn with_warnings(value: &mut Value, warnings: Vec<String>) {
    if !warnings.is_empty() {
        value["warnings"] = json!(warnings);
    }
}

/// A queue as shown, without counts: what an update compares to see whether it changed.
fn plain(found: &Found) -> Value {
    match found {
        Found::Queue(q) => json::queue(q, None),
        Found::Unreadable(u) => json::unreadable_queue(u, None),
    }
}

/// `POST /queues/{queue} {name|plugin|threads|sort|sandbox|on_orphan…}`: changes a queue.
/// Answers the queue with `MongoDB::UpdateResult` (`modified_count` 0 when nothing changed).
pub(super) async fn update(
    State(state): State<Shared>,
    PathKey(key): PathKey,
    params: Params,
) -> Result<Json<Value>, ApiError> {
    let mut body = queue_body(params)?;
    if body.is_empty() {
        return Err(ApiError::bad(format!("nothing to change: give one of {QUEUE_FIELDS}")));
    }
    let before = find_any(&state, &key).await?;
    keep_hidden(&mut body, &before)?;
    let f = fields(&state, &body)?;
    if let Some(p) = &f.plugin {
        check_pin(&state, p).await?;
    }
    if let Some(n) = &f.name {
        if ObjectId::parse_str(n).is_ok() {
            return Err(ApiError::bad("field \"name\" must not look like an ObjectId"));
        }
    }
    let id = before.id();
    let own = match &f.name {
        Some(n) => n.clone(),
        None => before.name().unwrap_or_default().to_string(),
    };
    check_next(&state, &f.extra, Some(id), &own).await?;
    let update = QueueUpdate {
        name: f.name,
        plugin: f.plugin,
        threads: f.threads,
        sort: f.sort,
        extra: f.extra,
    };
    let changed = state
        .store
        .update_queue(id, update)
        .await?
        .map(|changed| match changed {
            QueueState::Readable(q) => Found::Queue(q),
            // Changed, but still not readable (the change left the bad field as it was).
            QueueState::Unreadable(u) => Found::Unreadable(u),
        });
    let changed = changed.ok_or_else(|| ApiError::NotFound(format!("no queue {key:?}")))?;
    let result = json::mongo::update(true, plain(&before) != plain(&changed));
    let counts = state.counts.counts(state.store.as_ref()).await?;
    let value = match &changed {
        Found::Queue(q) => json::queue(q, counts.get(&q.id)),
        Found::Unreadable(u) => json::unreadable_queue(u, counts.get(&u.id)),
    };
    let mut value = json::mongo::with(value, result);
    with_warnings(&mut value, queue_warnings(&state, id).await?);
    Ok(Json(value))
}

/// `DELETE /queues/{queue}`: deletes a queue (its tasks stay), readable or not. Answers
/// `{id, name, deleted: true}` with `MongoDB::DeleteResult`.
pub(super) async fn delete(State(state): State<Shared>, PathKey(key): PathKey) -> Result<Json<Value>, ApiError> {
    let found = find_any(&state, &key).await?;
    if !state.store.delete_queue(found.id()).await? {
        return Err(ApiError::NotFound(format!("no queue {key:?}")));
    }
    let value = json!({ "id": found.id().to_hex(), "name": found.name(), "deleted": true });
    Ok(Json(json::mongo::with(value, json::mongo::delete(true))))
}
