//! `disbatch wait <id>…` (and `create-task --wait`): long-polls `GET /tasks/wait` until
//! the tasks end, drawing their progress on a terminal, and exits by their outcome.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::client::Client;
use super::lifecycle::{progress_text, states};
use super::table::cell;
use super::{CliError, Output};

/// `wait <id>… [--timeout D]`.
#[derive(Debug, Clone, clap::Args)]
pub struct WaitArgs {
    /// Task ids.
    #[arg(required = true)]
    pub ids: Vec<String>,
    /// Give up after this long (`30s`, `2h`): exit code 5 (default: wait as long as it takes).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub timeout: Option<Duration>,
}

/// How long one request waits before the progress line is drawn again.
const STEP: Duration = Duration::from_secs(2);

/// Waits for `args.ids`; the answer is the last of `GET /tasks/wait`, `{done, tasks}` with
/// each task's final state.
pub(super) async fn wait_for_tasks(client: &Client, args: &WaitArgs) -> Result<Output, CliError> {
    let started = Instant::now();
    let draw = std::io::stderr().is_terminal();
    let ids = args.ids.join(",");
    let answer = loop {
        let step = match args.timeout {
            Some(t) => t.saturating_sub(started.elapsed()).min(STEP),
            None => STEP,
        };
        let path = format!("/tasks/wait?ids={ids}&timeout={}ms", step.as_millis());
        let v = client.get(&path).await?;
        let out_of_time = args.timeout.is_some_and(|t| started.elapsed() >= t);
        if v["done"] == true || out_of_time {
            break v;
        }
        if draw {
            eprint!("\r\x1b[K{}", progress_line(&v["tasks"]));
            let _ = std::io::stderr().flush();
        }
    };
    if draw {
        eprint!("\r\x1b[K");
    }
    let list = answer["tasks"].as_array().cloned().unwrap_or_default();
    let outcome = if answer["done"] != true {
        Some(CliError::Outcome {
            message: format!(
                "gave up waiting after {}",
                humantime::format_duration(Duration::from_secs(started.elapsed().as_secs()))
            ),
            code: 5,
        })
    } else {
        let failed: Vec<String> = list
            .iter()
            .filter(|t| t["status"] != 1)
            .map(|t| {
                format!(
                    "{} {} ({})",
                    cell(&t["id"]),
                    cell(&t["status"]),
                    cell(&t["status_name"])
                )
            })
            .collect();
        (!failed.is_empty()).then(|| CliError::Outcome {
            message: format!(
                "{} of {} tasks did not succeed: {}",
                failed.len(),
                list.len(),
                failed.join(", ")
            ),
            code: 4,
        })
    };
    let mut out = Output::new(answer, |v| states(&v["tasks"]));
    out.outcome = outcome;
    Ok(out)
}

/// One line for the tasks being waited for: a single task's progress bar, or how many of
/// several have ended.
fn progress_line(tasks: &Value) -> String {
    let list = tasks.as_array().cloned().unwrap_or_default();
    match list.as_slice() {
        [t] => {
            let state = format!("{} ({})", cell(&t["status"]), cell(&t["status_name"]));
            match t.get("progress").filter(|p| p.is_object()) {
                Some(p) => format!("{} {state}", progress_text(p)),
                None => state,
            }
        }
        many => {
            let ended = many
                .iter()
                .filter(|t| {
                    t["status"]
                        .as_i64()
                        .is_some_and(|s| crate::model::status::finished(s as i32))
                })
                .count();
            format!("{ended}/{} ended", many.len())
        }
    }
}
