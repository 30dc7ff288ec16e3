//! What both stores share about retries: the extras of a finishing write, the answer of a
//! retry by hand, and how recovery treats an orphan of a queue with a `retry` policy.

use bson::DateTime;

use crate::model::{status, Attempt, OnOrphan, RetryAt, RetryOn, RetryPolicy, TaskProgress};

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

/// How recovery ends an orphan.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Recover {
    /// Orphaned (-6), with the record of its run when a `retry` policy governed it.
    Orphan(Option<Attempt>),
    /// Put back in its queue (-2, node null): the queue's `on_orphan: requeue`.
    Requeue,
    /// Run again later by the queue's `retry` policy.
    Retry(RetryAt),
}

impl Recover {
    /// The status a retry is written with at `now`.
    pub(crate) fn retry_status(retry: &RetryAt, now: DateTime) -> i32 {
        super::due_status(Some(retry.run_at), now)
    }
}

/// How recovery ends an orphan of `node`, of a queue with `on_orphan` and `retry`, that was
/// run `made` times before this run, at `priority`; `kill` when someone asked to kill it
/// (it must not run again).
pub(crate) fn recover_as(
    node: Option<&str>,
    kill: bool,
    on_orphan: OnOrphan,
    retry: Option<&RetryPolicy>,
    made: usize,
    priority: i64,
    now: DateTime,
) -> Recover {
    // A policy that retries orphans governs them; otherwise `on_orphan` does.
    let Some(policy) = retry.filter(|p| p.on.contains(&RetryOn::Orphaned)) else {
        return if on_orphan == OnOrphan::Requeue && !kill {
            Recover::Requeue
        } else {
            Recover::Orphan(None)
        };
    };
    let attempt = Attempt {
        node: node.map(str::to_owned),
        started: None,
        ended: now,
        status: status::ORPHANED,
        reason: format!(
            "orphaned: its node {} stopped answering while it ran",
            node.unwrap_or("(none)")
        ),
        stdout: None,
        stderr: None,
    };
    let this = u32::try_from(made).unwrap_or(u32::MAX).saturating_add(1);
    if !kill && policy.retries(RetryOn::Orphaned, this) {
        Recover::Retry(policy.retry_at(attempt, this, priority, now))
    } else {
        Recover::Orphan(Some(attempt))
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
