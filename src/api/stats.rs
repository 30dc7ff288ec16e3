//! `GET /stats?since=&until=&step=&queue=`: throughput, failures, run-duration
//! percentiles and queue depth as series of fixed steps, read from the per-minute counters
//! the DENs write ([`crate::stats`]) — O(minutes × queues × nodes), never O(tasks) — and
//! each node's running tasks against its `maxthreads` (an index count per node).

use std::collections::HashMap;
use std::str::FromStr;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::Json;
use bson::oid::ObjectId;
use bson::DateTime;
use serde_json::{json, Value};

use super::{json, ApiError, Shared};
use crate::model::{status, Queue};
use crate::stats::{self, minute_of, minute_start, Counters, Point};
use crate::store::TaskFilter;

/// Most points a series may have.
pub const MAX_POINTS: i64 = 10_000;
/// Most points in all series of one answer (points × series).
pub const MAX_CELLS: i64 = 200_000;
/// The range when `since` is not given.
const DEFAULT_RANGE: Duration = Duration::from_secs(3600);
/// The parameters `GET /stats` takes.
const PARAMS: [&str; 4] = ["since", "until", "step", "queue"];

/// A time parameter: an RFC 3339 time, or a duration before now (`90m`, `1h`, `-1h`).
fn time_param(q: &HashMap<String, String>, name: &str, now: DateTime) -> Result<Option<DateTime>, ApiError> {
    let Some(raw) = super::body::query_value(q, name) else {
        return Ok(None);
    };
    if let Ok(t) = jiff::Timestamp::from_str(raw) {
        return Ok(Some(DateTime::from_millis(t.as_millisecond())));
    }
    match humantime::parse_duration(raw.trim_start_matches('-')) {
        Ok(d) => Ok(Some(DateTime::from_millis(
            now.timestamp_millis().saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        ))),
        Err(_) => Err(ApiError::bad(format!(
            "parameter {name:?} must be an RFC 3339 time (2026-01-31T12:00:00Z) or a duration before now (90m, 1h), got {raw:?}"
        ))),
    }
}

/// `step` in minutes: seconds (`300`) or a duration (`5m`, `1h`), a whole number of minutes.
fn step_param(q: &HashMap<String, String>) -> Result<i64, ApiError> {
    let Some(raw) = super::body::query_value(q, "step") else {
        return Ok(1);
    };
    let secs = if raw.bytes().all(|b| b.is_ascii_digit()) && !raw.is_empty() {
        raw.parse::<u64>().ok()
    } else {
        humantime::parse_duration(raw).ok().map(|d| d.as_secs())
    };
    match secs {
        Some(s) if s >= 60 && s % 60 == 0 => Ok(i64::try_from(s / 60).unwrap_or(i64::MAX)),
        _ => Err(ApiError::bad(format!(
            "parameter \"step\" must be a whole number of minutes, as seconds (60, 300) or a duration (1m, 5m, 1h), got {raw:?}"
        ))),
    }
}

fn secs(v: Option<f64>) -> Value {
    v.map_or(Value::Null, |s| json!(s))
}

fn summary(c: &Counters) -> Value {
    let runs = c.runs();
    json!({
        "succeeded": c.succeeded,
        "failed": c.failed,
        "retried": c.retried,
        "mean": secs((runs > 0).then(|| c.seconds / runs as f64)),
        "p50": secs(c.percentile(0.50)),
        "p95": secs(c.percentile(0.95)),
        "p99": secs(c.percentile(0.99)),
    })
}

/// The start of minute `m` as an RFC 3339 time.
fn iso(m: i64) -> Value {
    minute_start(m)
        .try_to_rfc3339_string()
        .map_or(Value::Null, Value::String)
}

fn point(p: &Point) -> Value {
    let mut v = summary(&p.counters);
    v["t"] = iso(p.minute);
    v["depth"] = p.depth.map_or(Value::Null, Value::from);
    v
}

/// `GET /stats`: see the module documentation and `docs/api.md`.
pub(super) async fn series(
    State(state): State<Shared>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    if let Some(k) = q.keys().find(|k| !PARAMS.contains(&k.as_str())) {
        return Err(ApiError::bad(format!(
            "unknown parameter {k:?}; GET /stats takes since, until, step and queue"
        )));
    }
    let now = DateTime::now();
    let until = time_param(&q, "until", now)?.unwrap_or(now);
    let since = time_param(&q, "since", now)?
        .unwrap_or_else(|| DateTime::from_millis(until.timestamp_millis() - DEFAULT_RANGE.as_millis() as i64));
    if since >= until {
        return Err(ApiError::bad(
            "parameter \"since\" must be before \"until\" (default now)",
        ));
    }
    let step = step_param(&q)?;
    // Whole steps, aligned on multiples of the step, up to the one holding `until`.
    let from = minute_of(since).div_euclid(step) * step;
    let end = minute_of(until) + 1;
    let points = (end - from + step - 1).div_euclid(step);
    if points > MAX_POINTS {
        return Err(ApiError::bad(format!(
            "parameter \"step\": {points} points from \"since\" to \"until\"; at most {MAX_POINTS}, use a larger step or a shorter range"
        )));
    }
    let to = from + points * step;
    let queues = state.store.queues().await?;
    let only: Option<Vec<ObjectId>> = match super::body::query_value(&q, "queue") {
        Some(key) => {
            let found = Queue::find(&queues, key)
                .ok_or_else(|| ApiError::NotFound(format!("parameter \"queue\": no queue {key:?}")))?;
            Some(vec![found.id])
        }
        None => None,
    };
    let series_count = only.as_ref().map_or(queues.len() + 1, |_| 2) as i64;
    if points * series_count > MAX_CELLS {
        return Err(ApiError::bad(format!(
            "parameter \"step\": {points} points for each of {series_count} series; at most {MAX_CELLS} in all, use a larger step, a shorter range or \"queue\""
        )));
    }
    let rows = state
        .store
        .read_stats(from, to, only.as_ref().and_then(|o| o.first().copied()))
        .await?;
    let mut by_queue = stats::series(&rows, from, to, step, only.as_deref());
    // Every queue is shown, with zeros when nothing was counted.
    for queue in &queues {
        if only.as_ref().is_none_or(|o| o.contains(&queue.id)) {
            by_queue.entry(Some(queue.id)).or_insert_with(|| {
                (0..points)
                    .map(|i| Point {
                        minute: from + i * step,
                        ..Point::default()
                    })
                    .collect()
            });
        }
    }
    let series: Vec<Value> = by_queue
        .iter()
        .map(|(id, points)| {
            let mut all = Counters::default();
            for p in points {
                all.merge(&p.counters);
            }
            let name = id.and_then(|id| queues.iter().find(|q| q.id == id).map(|q| q.name.clone()));
            json!({
                "queue": id.map(|id| id.to_hex()),
                "name": if id.is_none() { Some("total".to_string()) } else { name },
                "summary": summary(&all),
                "points": points.iter().map(point).collect::<Vec<_>>(),
            })
        })
        .collect();
    Ok(Json(json!({
        "since": iso(from),
        "until": iso(to),
        "step": step * 60,
        "bounds": (0..stats::BOUNDS).map(stats::bound).collect::<Vec<_>>(),
        "series": series,
        "nodes": nodes(&state, now).await?,
    })))
}

/// Each node: running (claimed or running) tasks, `maxthreads`, freshness, leadership.
async fn nodes(state: &Shared, now: DateTime) -> Result<Vec<Value>, ApiError> {
    let lease = crate::lifecycle::leader::leader(state.store.as_ref()).await?;
    let leader = lease.as_ref().and_then(|l| l.holder(now)).map(str::to_string);
    let mut out = Vec::new();
    for n in state.store.nodes().await? {
        let filter = TaskFilter {
            node: Some(Some(n.node.clone())),
            status: Some(status::BUSY.to_vec()),
            ..TaskFilter::default()
        };
        let running = state.store.count_tasks(&filter).await?;
        let age = json::node_age(&n, now);
        out.push(json!({
            "node": n.node,
            "running": running,
            "maxthreads": n.maxthreads,
            "age_secs": age,
            "fresh": age < super::FRESH_NODE.as_secs_f64(),
            "leader": leader.as_deref() == Some(n.node.as_str()),
        }));
    }
    Ok(out)
}
