//! What both stores share about retries: the extras of a finishing write and the answer of
//! a retry by hand.

use bson::DateTime;

use crate::model::{Attempt, TaskProgress};

/// What a finishing write stores beside the result ([`super::Store::finish_with`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FinishExtra {
    /// The plugin's last progress report.
    pub progress: Option<TaskProgress>,
    /// The run's record, appended to `attempts` (for a task of a queue with a `retry`
    /// policy, or one retried before).
    pub attempt: Option<Attempt>,
}

/// The answer of [`super::Store::retry_by_hand`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandRetry {
    /// Queued again.
    Queued,
    /// Not finished: still waiting or running, with this status.
    NotFinished(i32),
    /// No such task.
    NotFound,
}

/// The record of a finished task's last run, kept when it is queued again by hand or by
/// key: its outputs as the file they are in, or the end of their text.
pub(crate) fn last_run(t: &crate::model::Task, reason: &str) -> Attempt {
    let kept = |o: &Option<crate::model::Output>| match o {
        Some(crate::model::Output::Inline(s)) => crate::model::kept_output(s),
        other => other.clone(),
    };
    Attempt {
        node: t.node.clone(),
        started: None,
        ended: t.mtime,
        status: t.status,
        reason: reason.to_owned(),
        stdout: kept(&t.stdout),
        stderr: kept(&t.stderr),
    }
}

/// The record of a run that ends while its task was submitted again (it runs once more):
/// its outputs as the files they were written to, or the end of their text.
pub(crate) fn rerun_record(
    node: &str,
    status: i32,
    stdout: &super::OutputValue,
    stderr: &super::OutputValue,
    extra: &FinishExtra,
) -> Attempt {
    let kept = |o: &super::OutputValue| match o {
        super::OutputValue::Inline(s) => crate::model::kept_output(s),
        super::OutputValue::File(id) => Some(crate::model::Output::File(*id)),
    };
    let base = extra.attempt.clone().unwrap_or(Attempt {
        node: Some(node.to_owned()),
        started: None,
        ended: DateTime::now(),
        status,
        reason: String::new(),
        stdout: None,
        stderr: None,
    });
    Attempt {
        reason: if base.reason.is_empty() {
            "submitted again while it ran: it runs once more".to_owned()
        } else {
            format!("{}; submitted again while it ran: it runs once more", base.reason)
        },
        stdout: kept(stdout),
        stderr: kept(stderr),
        ..base
    }
}
