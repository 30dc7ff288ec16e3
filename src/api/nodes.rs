//! `GET /nodes`, `GET /nodes/{node}` and `POST /nodes/{node} {maxthreads}`.
//!
//! As in Disbatch 4, a node's `timestamp` is in epoch milliseconds; the native shape
//! ([`Shape`]) gives `{"$date"}`. An unknown node is 404 in both.

use axum::extract::State;
use axum::Json;
use bson::oid::ObjectId;
use bson::DateTime;
use serde_json::Value;

use super::body::{kind, Params, PathKey};
use super::form::Shape;
use super::{json, ApiError, Shared};
use crate::model::Node;

/// The node with this `_id` (hex) or name.
async fn lookup(state: &Shared, key: &str) -> Result<Option<Node>, ApiError> {
    let id = ObjectId::parse_str(key).ok();
    Ok(state
        .store
        .nodes()
        .await?
        .into_iter()
        .find(|n| Some(n.id) == id || n.node == key))
}

/// The node with this `_id` (hex) or name; 404 when there is none.
async fn find(state: &Shared, key: &str) -> Result<Node, ApiError> {
    lookup(state, key)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no node {key:?}")))
}

/// The node's JSON with `leader`: whether it holds the leader lease now.
async fn shown(state: &Shared, nodes: &[Node], shape: Shape) -> Result<Vec<Value>, ApiError> {
    let now = DateTime::now();
    let lease = crate::lifecycle::leader::leader(state.store.as_ref()).await?;
    let leader = lease.as_ref().and_then(|l| l.holder(now));
    Ok(nodes
        .iter()
        .map(|n| {
            let mut v = json::node(n, now, shape.native);
            v["leader"] = Value::Bool(leader == Some(n.node.as_str()));
            v
        })
        .collect())
}

/// `GET /nodes`: every node, fresh or stale; `leader: true` on the one leading the cluster.
pub(super) async fn list(State(state): State<Shared>, shape: Shape) -> Result<Json<Value>, ApiError> {
    let nodes = state.store.nodes().await?;
    Ok(Json(Value::Array(shown(&state, &nodes, shape).await?)))
}

/// `GET /nodes/{node}`: the node; an unknown one is 404.
pub(super) async fn one(
    State(state): State<Shared>,
    shape: Shape,
    PathKey(key): PathKey,
) -> Result<Json<Value>, ApiError> {
    let node = match lookup(&state, &key).await? {
        Some(node) => node,
        None => return Err(ApiError::NotFound(format!("no node {key:?}"))),
    };
    let mut shown = shown(&state, std::slice::from_ref(&node), shape).await?;
    Ok(Json(shown.remove(0)))
}

/// `POST /nodes/{node} {"maxthreads": n|null}` (JSON, or a form with `maxthreads=n`): the
/// node's limit (null = no limit). Answers the node with Disbatch 4's
/// `MongoDB::UpdateResult`.
pub(super) async fn set_maxthreads(
    State(state): State<Shared>,
    shape: Shape,
    PathKey(key): PathKey,
    Params { fields: body, .. }: Params,
) -> Result<Json<Value>, ApiError> {
    if let Some(k) = body.keys().find(|k| *k != "maxthreads") {
        return Err(ApiError::bad(format!(
            "unknown field {k:?}: only \"maxthreads\" can be set"
        )));
    }
    let maxthreads = match body.get("maxthreads") {
        None => {
            return Err(ApiError::bad(
                "field \"maxthreads\" is required (a non-negative integer or null)",
            ))
        }
        Some(v) => count("maxthreads", v)?,
    };
    let node = find(&state, &key).await?;
    if !crate::lifecycle::nodes::set_maxthreads(&*state.store, &node.node, maxthreads).await? {
        return Err(ApiError::NotFound(format!("no node {key:?}")));
    }
    let modified = node.maxthreads != maxthreads;
    let node = state
        .store
        .node(&node.node)
        .await?
        .map(|r| r.node)
        .ok_or_else(|| ApiError::NotFound(format!("no node {key:?}")))?;
    let value = json::node(&node, DateTime::now(), shape.native);
    Ok(Json(json::mongo::with(value, json::mongo::update(true, modified))))
}

/// A count field (`threads`, `maxthreads`): null is none; a number or a numeric string (as
/// the Perl DCI took form values) is read as an integer and checked by the stores' own rule
/// ([`check_count`](crate::store::queue_doc::check_count)), so "at least 0" is written once.
pub(super) fn count(field: &str, v: &Value) -> Result<Option<i64>, ApiError> {
    let n = match v {
        Value::Null => return Ok(None),
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse::<i64>().ok(),
        _ => None,
    };
    let n = n.ok_or_else(|| {
        ApiError::bad(format!(
            "field {field:?} must be a non-negative integer or null, got {}",
            kind(v)
        ))
    })?;
    crate::store::queue_doc::check_count(field, Some(n)).map_err(|e| ApiError::bad(e.to_string()))?;
    Ok(Some(n))
}
