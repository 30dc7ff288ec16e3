//! QueueBalance from the command line: `disbatch balance` (`GET /balance`) and
//! `disbatch set-balance <json|@file|->` (`POST /balance`).

use serde_json::Value;

use super::table::cell;

/// `QueueBalance OK: QueueBalance is running (max_tasks now 3)`, the lanes, then the
/// `max_tasks` entries.
pub fn balance_text(v: &Value) -> String {
    if let Some(notice) = v["notice"].as_str() {
        return format!("{notice} (set one with `disbatch set-balance`)\n");
    }
    let now = match v["max_tasks_now"].as_i64() {
        Some(n) => format!(" (max_tasks now {n})"),
        None => String::new(),
    };
    let mut out = format!("QueueBalance {}: {}{now}\n", cell(&v["status"]), cell(&v["message"]));
    if let Some(until) = v["disabled"].as_i64() {
        out.push_str(&format!("  disabled until {until} (epoch seconds)\n"));
    }
    for (i, lane) in v["queues"].as_array().into_iter().flatten().enumerate() {
        let names: Vec<String> = lane.as_array().into_iter().flatten().map(cell).collect();
        let kind = if i == 0 { "default lane" } else { "priority lane" };
        out.push_str(&format!("  {kind} {i}: {}\n", names.join(", ")));
    }
    let mut entries: Vec<(&String, &Value)> = v["max_tasks"].as_object().into_iter().flatten().collect();
    entries.sort_by(|a, b| a.0.cmp(b.0));
    for (when, max) in entries {
        out.push_str(&format!("  from {when}: {}\n", cell(max)));
    }
    out
}

/// The answer of `POST /balance`.
pub fn set_text(v: &Value) -> String {
    format!("{}\n", cell(&v["status"]))
}
