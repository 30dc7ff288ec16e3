//! `GET /info`, `GET /monitoring` (the Disbatch 4 check) and `GET /metrics`
//! (Prometheus text format).

use std::fmt::Write as _;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use bson::DateTime;
use serde_json::{json, Value};

use super::json::node_age;
use super::{ApiError, Shared, FRESH_NODE};
use crate::model::{status, Histogram, Node, NodeStats};
use crate::store::TaskFilter;

/// `GET /info`: `{name, version, database, plugins, token_required}`.
pub(super) async fn info(State(state): State<Shared>) -> Json<Value> {
    Json(json!({
        "name": "disbatch",
        "version": env!("CARGO_PKG_VERSION"),
        "database": state.database,
        "plugins": state.plugins,
        "token_required": state.api_token.is_some(),
    }))
}

/// `GET /monitoring`: `{"disbatch": {"status": "OK"|"WARNING"|"CRITICAL", "message",
/// "nodes": {"fresh": [...], "stale": [...]}}}`; a node is fresh when its heartbeat is
/// under 60 s old. CRITICAL when no node is fresh (or the database is unreachable),
/// WARNING when some node is stale.
pub(super) async fn monitoring(State(state): State<Shared>) -> Json<Value> {
    if !state.monitoring {
        let off = json!({ "status": "OK", "message": "monitoring is disabled" });
        return Json(json!({ "disbatch": off, "queuebalance": off }));
    }
    let queuebalance = super::balance::check(&state).await;
    let nodes = match state.store.nodes().await {
        Ok(n) => n,
        Err(e) => {
            return Json(json!({ "disbatch": {
                "status": "CRITICAL",
                "message": format!("cannot read nodes: {e}"),
                "nodes": { "fresh": [], "stale": [] },
            }, "queuebalance": queuebalance }))
        }
    };
    let now = DateTime::now();
    let (fresh, stale): (Vec<_>, Vec<_>) = nodes.iter().partition(|n| node_age(n, now) < FRESH_NODE.as_secs_f64());
    let fresh: Vec<&str> = fresh.iter().map(|n| n.node.as_str()).collect();
    let stale: Vec<&str> = stale.iter().map(|n| n.node.as_str()).collect();
    let (level, message) = if fresh.is_empty() {
        ("CRITICAL", "no fresh nodes".to_string())
    } else if !stale.is_empty() {
        ("WARNING", format!("stale nodes: {}", stale.join(", ")))
    } else {
        ("OK", format!("{} fresh nodes", fresh.len()))
    };
    Json(json!({ "disbatch": {
        "status": level,
        "message": message,
        "nodes": { "fresh": fresh, "stale": stale },
    }, "queuebalance": queuebalance }))
}

/// A Prometheus label value, escaped.
fn label(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// `GET /metrics`: task counts by queue and status, queue limits, per-node running tasks,
/// heartbeat ages and limits, in the Prometheus text format.
pub(super) async fn metrics(State(state): State<Shared>) -> Result<impl IntoResponse, ApiError> {
    let queues = state.store.queues().await?;
    let counts = state.store.queue_counts().await?;
    let nodes = state.store.nodes().await?;
    let now = DateTime::now();
    let mut out = String::new();
    out.push_str("# HELP disbatch_tasks Tasks by queue and status.\n# TYPE disbatch_tasks gauge\n");
    for q in &queues {
        for (code, n) in counts.get(&q.id).into_iter().flatten() {
            let _ = writeln!(
                out,
                "disbatch_tasks{{queue=\"{}\",queue_id=\"{}\",status=\"{}\",code=\"{code}\"}} {n}",
                label(&q.name),
                q.id.to_hex(),
                status::name(*code),
            );
        }
    }
    out.push_str("# HELP disbatch_queue_threads The queue's threads limit (0 when paused).\n");
    out.push_str("# TYPE disbatch_queue_threads gauge\n");
    for q in &queues {
        let _ = writeln!(
            out,
            "disbatch_queue_threads{{queue=\"{}\"}} {}",
            label(&q.name),
            q.threads.unwrap_or(0)
        );
    }
    out.push_str("# HELP disbatch_node_running Tasks claimed or running per node.\n");
    out.push_str("# TYPE disbatch_node_running gauge\n");
    for n in &nodes {
        let filter = TaskFilter {
            node: Some(Some(n.node.clone())),
            status: Some(vec![status::CLAIMED, status::RUNNING]),
            ..TaskFilter::default()
        };
        let running = state.store.count_tasks(&filter).await?;
        let _ = writeln!(out, "disbatch_node_running{{node=\"{}\"}} {running}", label(&n.node));
    }
    out.push_str("# HELP disbatch_node_heartbeat_age_seconds Seconds since the node's last heartbeat.\n");
    out.push_str("# TYPE disbatch_node_heartbeat_age_seconds gauge\n");
    for n in &nodes {
        let _ = writeln!(
            out,
            "disbatch_node_heartbeat_age_seconds{{node=\"{}\"}} {}",
            label(&n.node),
            node_age(n, now)
        );
    }
    out.push_str("# HELP disbatch_node_maxthreads The node's maxthreads (-1 when unlimited).\n");
    out.push_str("# TYPE disbatch_node_maxthreads gauge\n");
    for n in &nodes {
        let _ = writeln!(
            out,
            "disbatch_node_maxthreads{{node=\"{}\"}} {}",
            label(&n.node),
            n.maxthreads.unwrap_or(-1)
        );
    }
    histograms(
        &mut out,
        "disbatch_claim_duration_seconds",
        "Seconds per successful claim (the findOneAndUpdate round trip), per node since its DEN started.",
        &nodes,
        |s| &s.claim,
    );
    histograms(
        &mut out,
        "disbatch_run_duration_seconds",
        "Seconds per plugin run, per node since its DEN started.",
        &nodes,
        |s| &s.run,
    );
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        out,
    ))
}

/// One Prometheus histogram family with a series per node that reported `stats`.
fn histograms(out: &mut String, name: &str, help: &str, nodes: &[Node], pick: impl Fn(&NodeStats) -> &Histogram) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    for n in nodes {
        let Some(h) = n.stats.as_ref().map(&pick) else {
            continue;
        };
        let node = label(&n.node);
        for (bound, count) in h.cumulative() {
            let le = if bound.is_infinite() {
                "+Inf".to_string()
            } else {
                bound.to_string()
            };
            let _ = writeln!(out, "{name}_bucket{{node=\"{node}\",le=\"{le}\"}} {count}");
        }
        let _ = writeln!(out, "{name}_sum{{node=\"{node}\"}} {}", h.sum);
        let _ = writeln!(out, "{name}_count{{node=\"{node}\"}} {}", h.count);
    }
}
