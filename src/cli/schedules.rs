//! Schedules from the command line: `disbatch schedules` (`GET /schedules`),
//! `disbatch set-schedule NAME …` (`POST /schedules/{name}`: creates it, or changes the
//! fields given) and `disbatch delete-schedule NAME` (`DELETE /schedules/{name}`).

use serde_json::{json, Value};

use super::input::read_json;
use super::table::{cell, render};
use super::CliError;

/// The arguments of `set-schedule`.
#[derive(Debug, clap::Args)]
pub struct SetScheduleArgs {
    /// Schedule name (letters, digits, `.`, `_`, `-`).
    pub name: String,
    /// Queue id or name (required for a new schedule).
    #[arg(long)]
    pub queue: Option<String>,
    /// A cron expression: 5 fields (minute first), 6 (seconds first), or a shorthand such
    /// as `@hourly`.
    #[arg(long, conflicts_with = "every")]
    pub cron: Option<String>,
    /// A fixed interval: `30s`, `5m`, `1h30m`, `1d`.
    #[arg(long)]
    pub every: Option<String>,
    /// The tasks' params as a JSON object (inline, `@file` or `-`).
    #[arg(long, value_name = "JSON")]
    pub params: Option<String>,
    /// IANA time zone of the cron expression (default UTC).
    #[arg(long)]
    pub timezone: Option<String>,
    /// Past occurrences: none (default), last or all.
    #[arg(long)]
    pub catch_up: Option<String>,
    /// With `--catch-up all`: at most this many past occurrences at once (default 100).
    #[arg(long)]
    pub catch_up_limit: Option<i64>,
    /// While the previous occurrence's task runs: allow (default) or skip.
    #[arg(long)]
    pub overlap: Option<String>,
    /// Pause it: it creates no task until resumed.
    #[arg(long, conflicts_with = "resume")]
    pub paused: bool,
    /// Resume it (occurrences during the pause are not caught up).
    #[arg(long)]
    pub resume: bool,
}

impl SetScheduleArgs {
    /// The body of `POST /schedules/{name}`: the fields given.
    pub fn body(&self) -> Result<Value, CliError> {
        let mut body = json!({});
        let mut set = |k: &str, v: Value| body[k] = v;
        if let Some(q) = &self.queue {
            set("queue", json!(q));
        }
        if let Some(c) = &self.cron {
            set("cron", json!(c));
        }
        if let Some(e) = &self.every {
            set("every", json!(e));
        }
        if let Some(p) = &self.params {
            set("params", read_json(p)?);
        }
        if let Some(t) = &self.timezone {
            set("timezone", json!(t));
        }
        if let Some(c) = &self.catch_up {
            set("catch_up", json!(c));
        }
        if let Some(n) = self.catch_up_limit {
            set("catch_up_limit", json!(n));
        }
        if let Some(o) = &self.overlap {
            set("overlap", json!(o));
        }
        if self.paused {
            set("paused", json!(true));
        }
        if self.resume {
            set("paused", json!(false));
        }
        if body.as_object().is_some_and(serde_json::Map::is_empty) {
            return Err(CliError::Usage(
                "nothing to set: give --queue with --cron or --every, or another option".into(),
            ));
        }
        Ok(body)
    }
}

/// When a schedule fires: its cron expression (and zone) or interval.
fn when(s: &Value) -> String {
    match (&s["cron"], &s["every"]) {
        (Value::String(c), _) => format!("cron {c} ({})", cell(&s["timezone"])),
        (_, Value::String(e)) => format!("every {e}"),
        _ => "-".into(),
    }
}

/// The table of `disbatch schedules`.
pub fn schedules_table(v: &Value) -> String {
    let rows: Vec<Vec<String>> = v
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|s| {
            let last_task = match &s["last_task"] {
                Value::Null => "-".into(),
                t => format!("{} ({})", cell(&t["id"]), cell(&t["status_name"])),
            };
            vec![
                cell(&s["name"]),
                s["queue_name"]
                    .as_str()
                    .map_or_else(|| cell(&s["queue"]), str::to_owned),
                when(s),
                if s["paused"].as_bool() == Some(true) {
                    "paused".into()
                } else {
                    "active".into()
                },
                s["next"].get(0).map_or_else(|| "-".into(), cell),
                last_task,
            ]
        })
        .collect();
    render(&["name", "queue", "when", "state", "next", "last task"], &rows)
}

/// The answer of `set-schedule`.
pub fn set_text(v: &Value) -> String {
    let next = v["next"].get(0).map_or_else(|| "-".into(), cell);
    let state = if v["paused"].as_bool() == Some(true) {
        ", paused"
    } else {
        ""
    };
    format!("schedule {}: {}{state}; next {next}\n", cell(&v["name"]), when(v))
}

/// The answer of `delete-schedule`.
pub fn deleted_text(v: &Value) -> String {
    format!("deleted schedule {}\n", cell(&v["name"]))
}
