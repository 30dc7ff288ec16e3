//! How recovery treats an orphan of a queue with a `retry` policy.

use bson::DateTime;

use crate::model::{status, Attempt, OnOrphan, RetryAt, RetryOn, RetryPolicy};

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
