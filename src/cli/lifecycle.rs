//! The verbs and views of a task's life beyond Disbatch 4's: `cancel`, `kill`, `--run-at`
//! and the progress bar of `task`.

use serde_json::{json, Value};

use super::client::{encode, Client};
use super::table::cell;
use super::{CliError, Output};

/// The arguments of `cancel` and `kill`.
#[derive(Debug, Clone, clap::Args)]
pub struct StopArgs {
    /// Task ids.
    #[arg(required_unless_present = "queue", conflicts_with = "queue")]
    pub ids: Vec<String>,
    /// Every task of this queue (id or name) the action applies to.
    #[arg(long)]
    pub queue: Option<String>,
    /// Why (kept in the task's `stop.reason`).
    #[arg(long)]
    pub reason: Option<String>,
    /// Who (kept in `stop.by`; default: `$USER`).
    #[arg(long)]
    pub by: Option<String>,
}

/// `retry <id>…`.
#[derive(Debug, Clone, clap::Args)]
pub struct RetryArgs {
    /// Task ids.
    #[arg(required = true)]
    pub ids: Vec<String>,
    /// Why (kept in the reason of the task's last attempt).
    #[arg(long)]
    pub reason: Option<String>,
    /// Who (default: `$USER`).
    #[arg(long)]
    pub by: Option<String>,
}

impl From<RetryArgs> for StopArgs {
    fn from(a: RetryArgs) -> StopArgs {
        StopArgs {
            ids: a.ids,
            queue: None,
            reason: a.reason,
            by: a.by,
        }
    }
}

/// Runs `cancel`, `kill` or `retry` (`verb`) and prints one line per task.
pub(super) async fn stop_tasks(client: &Client, verb: &str, args: &StopArgs) -> Result<Output, CliError> {
    let mut body = json!({});
    if let Some(r) = &args.reason {
        body["reason"] = json!(r);
    }
    let by = args.by.clone().or_else(|| std::env::var("USER").ok());
    if let Some(b) = by {
        body["by"] = json!(b);
    }
    if let Some(q) = &args.queue {
        body["queue"] = json!(q);
        let v = client.post(&format!("/tasks/{verb}"), &body).await?;
        fn cancelled(v: &Value) -> String {
            format!("cancelled {} tasks\n", cell(&v["count"]))
        }
        fn killing(v: &Value) -> String {
            format!("asked to kill {} tasks\n", cell(&v["count"]))
        }
        return Ok(Output::new(v, if verb == "cancel" { cancelled } else { killing }));
    }
    let mut results: Vec<Value> = Vec::new();
    for id in &args.ids {
        match client.post(&format!("/tasks/{}/{verb}", encode(id)), &body).await {
            Ok(v) => results.push(v),
            Err(e) if results.is_empty() => return Err(e),
            Err(e) => {
                let done: Vec<String> = results.iter().map(|t| cell(&t["id"])).collect();
                let note = format!(
                    "before this error, {verb} applied to {}: {}",
                    done.len(),
                    done.join(" ")
                );
                return Err(e.with_note(&note));
            }
        }
    }
    Ok(Output::new(Value::Array(results), states))
}

/// `ID STATUS (NAME)`, a line per task of a list.
pub(super) fn states(v: &Value) -> String {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|t| {
                    format!(
                        "{} {} ({})\n",
                        cell(&t["id"]),
                        cell(&t["status"]),
                        cell(&t["status_name"])
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The lines of `task` for the fields of a task's life: priority, run_at, stop, progress
/// and its earlier attempts.
pub(super) fn lifecycle_lines(t: &Value) -> String {
    let mut s = String::new();
    for k in ["priority", "run_at"] {
        if t.get(k).is_some() {
            s.push_str(&format!("{k:<12}{}\n", cell(&t[k])));
        }
    }
    if let Some(stop) = t.get("stop").filter(|v| v.is_object()) {
        let reason = stop["reason"].as_str().filter(|r| !r.is_empty());
        s.push_str(&format!(
            "{:<12}{} by {} at {}{}\n",
            "stop",
            cell(&stop["action"]),
            cell(&stop["by"]),
            cell(&stop["at"]),
            reason.map(|r| format!(": {r}")).unwrap_or_default()
        ));
    }
    if let Some(p) = t.get("progress").filter(|v| v.is_object()) {
        s.push_str(&format!("{:<12}{}\n", "progress", progress_text(p)));
    }
    if let Some(list) = t.get("attempts").and_then(Value::as_array) {
        let dropped = t.get("attempts_dropped").and_then(Value::as_u64).unwrap_or(0);
        if dropped > 0 {
            s.push_str(&format!(
                "{:<12}{} (the last kept; {dropped} older not kept)\n",
                "attempts",
                list.len()
            ));
        } else {
            s.push_str(&format!("{:<12}{}\n", "attempts", list.len()));
        }
        for (i, a) in list.iter().enumerate() {
            s.push_str(&format!(
                "  #{} {} ({}) on {} at {}: {}\n",
                u64::try_from(i)
                    .unwrap_or(u64::MAX)
                    .saturating_add(dropped)
                    .saturating_add(1),
                cell(&a["status"]),
                cell(&a["status_name"]),
                cell(&a["node"]),
                cell(&a["ended"]),
                cell(&a["reason"])
            ));
        }
    }
    s
}

/// `[#####.....]  50% info` for a `progress` object (no bar without a percent).
pub(super) fn progress_text(p: &Value) -> String {
    let info = p["info"].as_str().unwrap_or_default();
    match p["percent"].as_f64() {
        Some(pct) => {
            let filled = ((pct.clamp(0.0, 100.0) / 10.0).round()) as usize;
            format!("[{}{}] {pct:>3.0}% {info}", "#".repeat(filled), ".".repeat(10 - filled))
        }
        None => info.to_string(),
    }
}

/// A `--run-at` value as the server takes it: a delay (`10m`) becomes the time it ends,
/// so every batch of a request gets the same time; anything else is sent as given.
pub(super) fn absolute_run_at(text: &str) -> String {
    // Up to the end of year 9999, the last time RFC 3339 can write; past it the server
    // names the problem.
    const LAST: std::time::Duration = std::time::Duration::from_secs(253_402_300_799);
    let at = humantime::parse_duration(text)
        .ok()
        .and_then(|d| std::time::SystemTime::now().checked_add(d))
        .filter(|t| t.duration_since(std::time::UNIX_EPOCH).is_ok_and(|e| e <= LAST));
    match at {
        Some(t) => humantime::format_rfc3339_millis(t).to_string(),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_attempts_line_says_how_many_records_went() {
        let run = serde_json::json!({"status": 2, "status_name": "failed", "node": "n", "ended": "t", "reason": "r"});
        let t = serde_json::json!({"attempts": [run.clone(), run], "attempts_dropped": 7});
        let text = lifecycle_lines(&t);
        assert!(
            text.contains("attempts    2 (the last kept; 7 older not kept)\n"),
            "{text}"
        );
        assert!(
            text.contains("  #8 2 (failed)") && text.contains("  #9 2 (failed)"),
            "runs numbered from the first: {text}"
        );
        let t = serde_json::json!({"attempts": [{"status": 1}], "attempts_dropped": 0});
        assert!(lifecycle_lines(&t).starts_with("attempts    1\n"));
    }
}
