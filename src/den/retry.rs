//! What a DEN does with a run by its queue's `retry` policy: run it again later, or end it
//! with its record kept in `attempts` and a note in stderr saying how many runs it had.

use bson::DateTime;
use tracing::{error, info};

use super::result::Stop;
use super::Den;
use crate::lifecycle;
use crate::model::{kept_output, status, Attempt, Queue, RetryAt, RetryOn, Task};
use crate::runner::{Failure, Outcome};

/// What follows a run.
pub(super) enum NextRun {
    /// A queue without a policy, and a task never retried: the result as Disbatch 4 stores it.
    Once,
    /// The run failed in a way its policy retries, with attempts left.
    Retry(RetryAt),
    /// The last run: its record, and a note for stderr (may be empty).
    Final { attempt: Option<Attempt>, note: String },
}

/// Which of a policy's kinds a failed run is (`None`: never retried, the plugin itself is
/// not loadable).
fn kind_of(status: i32, failure: Option<&Failure>) -> Option<RetryOn> {
    Some(match failure {
        None if status == status::FAILED => RetryOn::Status,
        None => return None,
        Some(Failure::Plugin(_)) => RetryOn::Err,
        Some(Failure::NonPositiveStatus(_)) => RetryOn::Status,
        Some(Failure::Timeout(_)) => RetryOn::Timeout,
        Some(Failure::Memory { .. }) => RetryOn::Memory,
        Some(Failure::Trap(_)) => RetryOn::Trap,
        Some(Failure::Sandbox(_)) => RetryOn::Sandbox,
        Some(Failure::Killed(_)) => RetryOn::Killed,
        Some(Failure::Stuck(_)) => RetryOn::Stuck,
        Some(_) => return None,
    })
}

/// What follows `task`'s run on `node` that ended with `status`.
pub(super) fn next_run(
    task: &Task,
    queue: &Queue,
    node: &str,
    status: i32,
    outcome: &Outcome,
    stdout: &str,
    stderr: &str,
) -> NextRun {
    let Some(policy) = &queue.retry else {
        if task.attempts.is_empty() {
            return NextRun::Once;
        }
        // Retried by hand, or under a policy since removed: keep the list whole.
        return NextRun::Final {
            attempt: Some(record(node, status, outcome, None, None)),
            note: String::new(),
        };
    };
    let since = crate::model::counted_runs(&task.attempts);
    let made = u32::try_from(since).unwrap_or(u32::MAX).saturating_add(1);
    let failed = status == status::FAILED;
    let kind = if failed {
        kind_of(status, outcome.failure.as_ref())
    } else {
        None
    };
    if kind.is_some_and(|k| policy.retries(k, made)) {
        let attempt = record(node, status, outcome, kept_output(stdout), kept_output(stderr));
        let now = DateTime::now();
        let mut retry = policy.retry_at(attempt, made, task.priority.unwrap_or(0), now);
        retry.after_kill = kind == Some(RetryOn::Killed);
        return NextRun::Retry(retry);
    }
    let note = match kind {
        _ if !failed => String::new(),
        Some(k) if policy.on.contains(&k) => {
            format!("\n[disbatch: failed after {made} attempts, all its queue's retry policy allows]\n")
        }
        Some(k) => format!(
            "\n[disbatch: attempt {made} failed ({}), a failure its queue's retry policy does not retry]\n",
            k.as_str()
        ),
        None => format!("\n[disbatch: attempt {made} failed in a way no retry can fix]\n"),
    };
    NextRun::Final {
        attempt: Some(record(node, status, outcome, None, None)),
        note,
    }
}

/// The record of this run.
fn record(
    node: &str,
    status: i32,
    outcome: &Outcome,
    stdout: Option<crate::model::Output>,
    stderr: Option<crate::model::Output>,
) -> Attempt {
    let ended = DateTime::now();
    let ran = i64::try_from(outcome.duration.as_millis()).unwrap_or(i64::MAX);
    let reason = match &outcome.failure {
        Some(f) => f.to_string(),
        None if status == status::FAILED => "the plugin returned status 2 (failed)".to_owned(),
        None => format!("finished with status {status}"),
    };
    Attempt {
        node: Some(node.to_owned()),
        started: Some(DateTime::from_millis(ended.timestamp_millis().saturating_sub(ran))),
        ended,
        status,
        reason,
        stdout,
        stderr,
    }
}

impl Den {
    /// Sends `task` back to wait for `retry`. False when that could not be written and the
    /// failure is to be stored as the task's result instead.
    pub(super) async fn write_retry(&self, task: &Task, retry: &RetryAt) -> bool {
        let node = &self.settings.node;
        match self
            .retry("retry task", || {
                lifecycle::retry::retry_later(&*self.store, task.id, node, retry)
            })
            .await
        {
            Ok(true) => {
                info!(
                    attempt = task.attempts.len() + 1,
                    run_at = %retry.run_at.try_to_rfc3339_string().unwrap_or_default(),
                    "failed; it runs again by its queue's retry policy"
                );
                true
            }
            Ok(false) => {
                info!(task = %task.id, "no retry: the task was asked to be killed (or recovered meanwhile)");
                false
            }
            Err(Stop::Refused(e)) => {
                error!(task = %task.id, error = %e, "cannot write the retry; storing the failure instead");
                false
            }
            Err(Stop::GaveUp) => {
                error!(task = %task.id, "retry lost: the database stayed unreachable past the shutdown");
                true
            }
        }
    }
}
