//! How a verb's answer is shown to a person: tables of queues, nodes and tasks, a task's
//! text, the answer of a creation.

use serde_json::Value;

use super::lifecycle::lifecycle_lines;
use super::table::{cell, render};
use super::CliError;

/// A verb's answer and how to show it to a person, what a script reads of it (`ids`, for
/// the verbs that create tasks), and for `wait` the outcome that sets the exit code once
/// it is shown.
pub(super) struct Output {
    pub(super) value: Value,
    pub(super) human: fn(&Value) -> String,
    pub(super) ids: Option<fn(&Value) -> String>,
    pub(super) outcome: Option<CliError>,
}

impl Output {
    pub(super) fn new(value: Value, human: fn(&Value) -> String) -> Output {
        Output {
            value,
            human,
            ids: None,
            outcome: None,
        }
    }

    /// The answer of a verb that creates tasks: the sentence for a person, the ids for a
    /// script.
    pub(super) fn created(value: Value) -> Output {
        Output {
            ids: Some(created_ids),
            ..Output::new(value, created)
        }
    }

    /// Prints it: the API's answer with `json`; else for a verb with ids, only the ids on
    /// stdout and the sentence on stderr when `for_script` (stdout is not a terminal, or
    /// `--quiet`), both on stdout otherwise; else the text for a person.
    pub(super) fn print(&self, json: bool, for_script: bool) {
        if json {
            println!("{}", serde_json::to_string_pretty(&self.value).unwrap_or_default());
            return;
        }
        match self.ids {
            Some(ids) if for_script => {
                eprint!("{}", (self.human)(&self.value));
                print!("{}", ids(&self.value));
            }
            Some(ids) => print!("{}{}", (self.human)(&self.value), ids(&self.value)),
            None => print!("{}", (self.human)(&self.value)),
        }
        // What the server allowed but warns about goes where a person sees it, not into
        // the output a script reads.
        for w in self.value["warnings"].as_array().map(Vec::as_slice).unwrap_or_default() {
            eprintln!("disbatch: warning: {}", w.as_str().unwrap_or_default());
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

/// `n task(s)`, singular or plural.
pub(super) fn tasks_count(n: u64) -> String {
    format!("{n} task{}", if n == 1 { "" } else { "s" })
}

/// The sentence saying what a creation did: `created 1 task`, `created 0 tasks, 1 already
/// there`.
pub(super) fn created(v: &Value) -> String {
    let len = |k: &str| v[k].as_array().map_or(0, |a| a.len() as u64);
    // With keys, `created` counts the new tasks; the others were already there.
    let mut line = match v.get("created") {
        Some(n) => {
            let mut line = format!("created {}", tasks_count(n.as_u64().unwrap_or(0)));
            for (k, what) in [("existing", "already there"), ("resubmitted", "submitted again")] {
                if len(k) > 0 {
                    line.push_str(&format!(", {} {what}", len(k)));
                }
            }
            line
        }
        None => format!("created {}", tasks_count(v["count"].as_u64().unwrap_or(len("ids")))),
    };
    line.push('\n');
    line
}

/// The ids of the tasks a creation answered, one per line.
pub(super) fn created_ids(v: &Value) -> String {
    lines(&v["ids"])
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
