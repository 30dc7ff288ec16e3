//! `GET /info`, `GET /monitoring` (the Disbatch 4 check) and `GET /metrics`
//! (Prometheus text format).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use bson::DateTime;
use serde_json::{json, Map, Value};

use super::json::node_age;
use super::{ApiError, Shared, FRESH_NODE};
use crate::model::{status, Histogram, Node, NodeStats};
use crate::store::TaskFilter;

/// `GET /info`: `{name, version, database, plugins, token_required}` and, as Disbatch 4
/// gave them, `web_extensions` (none: this DCI loads no Perl route packages) and `routes`,
/// every route by method (`{"GET": ["/balance", …], "POST": […], "DELETE": […]}`).
pub(super) async fn info(State(state): State<Shared>) -> Json<Value> {
    let mut routes: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (method, path) in super::ROUTES {
        routes.entry(method).or_default().push(path);
    }
    Json(json!({
        "name": "disbatch",
        "version": env!("CARGO_PKG_VERSION"),
        "database": state.database,
        "web_extensions": [],
        "routes": routes,
        "plugins": state.plugins,
        "token_required": state.api_token.is_some(),
    }))
}

/// `GET /monitoring`, Disbatch 4's check: `{"disbatch": {"status", "message", "nodes":
/// {"fresh": {name: age}, "stale": {name: age}}}, "queuebalance": {"status", "message"}}`,
/// ages in whole seconds since the heartbeat. A node is fresh when its heartbeat is under
/// 60 s old. OK while one node is fresh, CRITICAL when none is (or the database is
/// unreachable), WARNING "No Disbatch nodes found" (without `nodes`) when there are none.
pub(super) async fn monitoring(State(state): State<Shared>) -> Json<Value> {
    if !state.monitoring {
        let off = json!({ "status": "OK", "message": "monitoring is disabled" });
        return Json(json!({ "disbatch": off, "queuebalance": off }));
    }
    let queuebalance = super::balance::check(&state).await;
    let disbatch = match state.store.nodes().await {
        Ok(nodes) => check_nodes(&nodes, DateTime::now()),
        Err(e) => json!({ "status": "CRITICAL", "message": format!("cannot read nodes: {e}") }),
    };
    Json(json!({ "disbatch": disbatch, "queuebalance": queuebalance }))
}

/// The `disbatch` part of `GET /monitoring`.
fn check_nodes(nodes: &[Node], now: DateTime) -> Value {
    if nodes.is_empty() {
        return json!({ "status": "WARNING", "message": "No Disbatch nodes found" });
    }
    let (mut fresh, mut stale) = (Map::new(), Map::new());
    for n in nodes {
        let age = node_age(n, now);
        let side = if age < FRESH_NODE.as_secs_f64() {
            &mut fresh
        } else {
            &mut stale
        };
        side.insert(n.node.clone(), json!(age.floor() as u64));
    }
    let names = |m: &Map<String, Value>| m.keys().cloned().collect::<Vec<_>>().join(", ");
    let (level, message) = if fresh.is_empty() {
        (
            "CRITICAL",
            format!(
                "no fresh Disbatch nodes: every heartbeat is over 60 s old ({})",
                names(&stale)
            ),
        )
    } else if stale.is_empty() {
        ("OK", format!("Disbatch is running on {} fresh nodes", fresh.len()))
    } else {
        (
            "OK",
            format!(
                "Disbatch is running on {} fresh nodes; stale: {}",
                fresh.len(),
                names(&stale)
            ),
        )
    };
    json!({ "status": level, "message": message, "nodes": { "fresh": fresh, "stale": stale } })
}

/// A Prometheus label value, escaped.
fn label(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// `GET /metrics`: task counts by queue and status, queue limits, per-node running tasks,
/// heartbeat ages and limits, in the Prometheus text format.
pub(super) async fn metrics(State(state): State<Shared>) -> Result<impl IntoResponse, ApiError> {
    let queues = state.store.queues().await?;
    let counts = state.counts.counts(state.store.as_ref()).await?;
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
            status: Some(status::BUSY.to_vec()),
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
    let (waiters, waited_ids) = state.watch.held();
    out.push_str(
        "# HELP disbatch_api_waiters Waits and event streams open on this DCI (GET /tasks/wait, /tasks/{id}/events).\n",
    );
    let _ = writeln!(out, "# TYPE disbatch_api_waiters gauge\ndisbatch_api_waiters {waiters}");
    out.push_str("# HELP disbatch_api_waited_ids Task ids those waiters name together.\n");
    let _ = writeln!(
        out,
        "# TYPE disbatch_api_waited_ids gauge\ndisbatch_api_waited_ids {waited_ids}"
    );
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
