//! How a verb's answer is shown to a person: tables of queues, nodes and tasks, a task's
//! text, the answer of a creation.

use serde_json::Value;

use super::lifecycle::lifecycle_lines;
use super::table::{cell, render};
use super::CliError;

/// A verb's answer and how to show it to a person, and for `wait` the outcome that sets
/// the exit code once it is shown.
pub(super) struct Output {
    pub(super) value: Value,
    pub(super) human: fn(&Value) -> String,
    pub(super) outcome: Option<CliError>,
}

impl Output {
    pub(super) fn new(value: Value, human: fn(&Value) -> String) -> Output {
        Output {
            value,
            human,
            outcome: None,
        }
    }
}

pub(super) fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default() + "\n"
}

pub(super) fn lines(v: &Value) -> String {
    v.as_array()
        .map(|a| a.iter().map(|x| cell(x) + "\n").collect())
        .unwrap_or_default()
}

pub(super) fn created(v: &Value) -> String {
    let ids = v["ids"].as_array().map(Vec::len).unwrap_or(0);
    // With keys, `created` counts the new tasks; the others were already there.
    let mut s = match v.get("created") {
        Some(n) => {
            let count = |k: &str| v[k].as_array().map(Vec::len).unwrap_or(0);
            let mut line = format!("created {} tasks", cell(n));
            for (k, what) in [("existing", "already there"), ("resubmitted", "submitted again")] {
                if count(k) > 0 {
                    line.push_str(&format!(", {} {what}", count(k)));
                }
            }
            line + "\n"
        }
        None => format!("created {} tasks\n", cell(&v["count"])),
    };
    if ids == 1 {
        s.push_str(&format!("{}\n", cell(&v["ids"][0])));
    }
    s
}

pub(super) fn rows(v: &Value, f: impl Fn(&Value) -> Vec<String>) -> Vec<Vec<String>> {
    v.as_array().map(|a| a.iter().map(f).collect()).unwrap_or_default()
}

pub(super) fn queues_table(v: &Value) -> String {
    let rows = rows(v, |q| {
        ["id", "name", "plugin", "threads", "queued", "running", "completed"]
            .iter()
            .map(|k| cell(&q[*k]))
            .collect()
    });
    let mut out = render(
        &["id", "name", "plugin", "threads", "queued", "running", "completed"],
        &rows,
    );
    // Why nodes cannot run a queue, under the table.
    for q in v.as_array().map(Vec::as_slice).unwrap_or_default() {
        if let Some(problem) = q["problem"].as_str() {
            out.push_str(&format!("queue {} cannot be read: {problem}\n", cell(&q["id"])));
        }
        for p in q["problems"].as_array().map(Vec::as_slice).unwrap_or_default() {
            out.push_str(&format!(
                "queue {} cannot run on {}: {}\n",
                cell(&q["name"]),
                cell(&p["node"]),
                cell(&p["reason"])
            ));
        }
    }
    out
}

pub(super) fn nodes_table(v: &Value) -> String {
    let rows = rows(v, |n| {
        vec![
            cell(&n["id"]),
            cell(&n["node"]),
            cell(&n["maxthreads"]),
            format!("{:.0}s", n["age_secs"].as_f64().unwrap_or(0.0)),
            if n["fresh"] == true { "fresh" } else { "stale" }.into(),
        ]
    });
    render(&["id", "node", "maxthreads", "heartbeat", "state"], &rows)
}

pub(super) fn tasks_table(v: &Value) -> String {
    let rows = rows(v, |t| {
        vec![
            cell(&t["id"]),
            cell(&t["queue"]),
            format!("{} ({})", cell(&t["status"]), cell(&t["status_name"])),
            cell(&t["node"]),
            cell(&t["mtime"]),
            t.get("params").map(|p| p.to_string()).unwrap_or_default(),
        ]
    });
    render(&["id", "queue", "status", "node", "mtime", "params"], &rows)
}

pub(super) fn task_text(t: &Value) -> String {
    let mut s = String::new();
    for k in ["id", "queue", "status", "status_name", "node", "ctime", "mtime"] {
        s.push_str(&format!("{k:<12}{}\n", cell(&t[k])));
    }
    s.push_str(&lifecycle_lines(t));
    s.push_str(&format!("{:<12}{}\n", "params", t["params"]));
    for k in ["stdout", "stderr"] {
        s.push_str(&format!("--- {k} ---\n{}", cell(&t[k])));
        if !s.ends_with('\n') {
            s.push('\n');
        }
    }
    s
}
