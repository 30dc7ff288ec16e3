//! The status sets a transition fences on, and the change each transition writes.
//!
//! Pure values: no store call here. The functions of [`super::run`], [`super::retry`]
//! and [`super::keys`] pair a fence with one of these changes and hand both to
//! [`Store::change_tasks`](crate::store::Store::change_tasks) or
//! [`Store::change_where`](crate::store::Store::change_where).

use bson::DateTime;

use crate::model::{status, Attempt, RetryAt, StopRequest, TaskProgress};
use crate::store::{due_status, NewTask, NodeIs, StopIs, TaskChange, TaskFence, Write};

/// Statuses a task may be cancelled from: waiting to run (queued, scheduled, blocked).
pub const CANCELLABLE: [i32; 3] = status::WAITING;

/// Statuses a task may be asked to be killed in: claimed or running.
pub const KILLABLE: [i32; 2] = status::BUSY;

/// The status a retry is written with at `now`: scheduled while its time is to come,
/// queued once it has come.
pub fn retry_status(retry: &RetryAt, now: DateTime) -> i32 {
    due_status(Some(retry.run_at), now)
}

/// A task `node` claimed (-1) and has not started.
pub fn claimed_by(node: &str) -> TaskFence {
    TaskFence::statuses(&[status::CLAIMED]).on(NodeIs::Node(node.to_owned()))
}

/// A task running (0) on `node`.
pub fn running_on(node: &str) -> TaskFence {
    TaskFence::statuses(&[status::RUNNING]).on(NodeIs::Node(node.to_owned()))
}

/// A task waiting with `status`, unclaimed.
pub fn waiting_as(status: i32) -> TaskFence {
    TaskFence::statuses(&[status]).on(NodeIs::Unclaimed)
}

/// Claimed → running.
pub fn start() -> TaskChange {
    TaskChange {
        status: Some(status::RUNNING),
        touch: true,
        ..TaskChange::default()
    }
}

/// A running task's latest progress report (its `mtime` is left as it is).
pub fn progress(p: &TaskProgress) -> TaskChange {
    TaskChange {
        progress: Write::Set(p.clone()),
        ..TaskChange::default()
    }
}

/// A failed run ends waiting for its retry: its record appended, unclaimed, scheduled (or
/// queued when its time has come) at the retry's priority, left to other nodes for a
/// while; outputs, progress, stop request and rerun mark cleared.
pub fn retry(retry: &RetryAt, now: DateTime) -> TaskChange {
    TaskChange {
        status: Some(retry_status(retry, now)),
        node: Write::Clear,
        stdout: Write::Clear,
        stderr: Write::Clear,
        progress: Write::Clear,
        stop: Write::Clear,
        rerun: Some(false),
        run_at: Write::Set(retry.run_at),
        priority: Some(retry.priority),
        avoid: Write::Set((retry.avoid_node.clone(), retry.avoid_until)),
        attempt: Some(retry.attempt.clone()),
        touch: true,
        ..TaskChange::default()
    }
}

/// The fields a task takes from a submission of its key: params, priority, `run_at` and
/// the status they mean at `now`.
pub fn resubmit(new: &NewTask, now: DateTime) -> TaskChange {
    TaskChange {
        status: Some(new.initial_status(now)),
        params: Some(new.params.clone()),
        priority: Some(new.priority),
        run_at: new.run_at.map_or(Write::Clear, Write::Set),
        touch: true,
        ..TaskChange::default()
    }
}

/// Marks a claimed or running task to run once more when its run ends.
pub fn rerun_request() -> TaskChange {
    TaskChange {
        rerun: Some(true),
        ..TaskChange::default()
    }
}

/// A scheduled task whose time has come is queued.
pub fn promote() -> TaskChange {
    TaskChange {
        status: Some(status::QUEUED),
        touch: true,
        ..TaskChange::default()
    }
}

/// A task that has not started is cancelled, the request recorded.
pub fn cancel(stop: &StopRequest) -> TaskChange {
    TaskChange {
        status: Some(status::CANCELLED),
        stop: Write::Set(stop.clone()),
        touch: true,
        ..TaskChange::default()
    }
}

/// A claimed or running task is asked to be killed: the request recorded, for its DEN.
pub fn kill_request(stop: &StopRequest) -> TaskChange {
    TaskChange {
        stop: Write::Set(stop.clone()),
        touch: true,
        ..TaskChange::default()
    }
}

/// Tasks that may be cancelled: waiting and unclaimed.
pub fn cancellable() -> TaskFence {
    TaskFence::statuses(&CANCELLABLE).on(NodeIs::Unclaimed)
}

/// Tasks that may be asked to be killed: claimed or running, not asked yet.
pub fn killable() -> TaskFence {
    TaskFence::statuses(&KILLABLE).stop(StopIs::NotKill)
}

// ---- orphan recovery (see `super::recovery`) ------------------------------------------

/// A task whose node stopped answering, recovered as it was read: its status, its node
/// (none when unclaimed) and its `mtime` (when stored as a time) unchanged since.
pub fn as_read(status: i32, node: Option<&str>, mtime: Option<DateTime>) -> TaskFence {
    TaskFence {
        mtime,
        ..TaskFence::statuses(&[status]).on(node.map_or(NodeIs::Unclaimed, |n| NodeIs::Node(n.to_owned())))
    }
}

/// An orphan ends orphaned (-6), with the record of its run when a `retry` policy
/// governed it; it does not run again, so a rerun mark is dropped.
pub fn orphan(record: Option<Attempt>) -> TaskChange {
    TaskChange {
        status: Some(status::ORPHANED),
        rerun: Some(false),
        attempt: record,
        touch: true,
        ..TaskChange::default()
    }
}

/// An orphan is put back in its queue (-2, unclaimed): the queue's `on_orphan: requeue`.
/// Its rerun mark is dropped (it runs again anyway).
pub fn requeue_orphan() -> TaskChange {
    TaskChange {
        status: Some(status::QUEUED),
        node: Write::Clear,
        rerun: Some(false),
        touch: true,
        ..TaskChange::default()
    }
}

/// Scheduled tasks whose `run_at` is not after `now`.
pub fn due(now: DateTime) -> TaskFence {
    TaskFence {
        due_by: Some(now),
        ..TaskFence::statuses(&[status::SCHEDULED])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retry_at(run_at: DateTime) -> RetryAt {
        RetryAt {
            attempt: Attempt {
                node: Some("n".into()),
                started: None,
                ended: DateTime::from_millis(0),
                status: status::FAILED,
                reason: "r".into(),
                stdout: None,
                stderr: None,
            },
            run_at,
            priority: -1,
            avoid_node: "n".into(),
            avoid_until: run_at,
            after_kill: false,
        }
    }

    #[test]
    fn a_retry_waits_while_its_time_is_to_come() {
        let now = DateTime::from_millis(1_000);
        assert_eq!(
            retry_status(&retry_at(DateTime::from_millis(1_001)), now),
            status::SCHEDULED
        );
        assert_eq!(retry_status(&retry_at(now), now), status::QUEUED);
        let c = retry(&retry_at(DateTime::from_millis(5_000)), now);
        assert_eq!(c.status, Some(status::SCHEDULED));
        assert_eq!((c.node, c.stop, c.rerun), (Write::Clear, Write::Clear, Some(false)));
        assert!(c.attempt.is_some() && c.touch);
    }

    #[test]
    fn cancel_and_kill_fence_on_their_status_sets() {
        assert_eq!(cancellable().statuses.as_deref(), Some(&status::WAITING[..]));
        assert_eq!(cancellable().node, NodeIs::Unclaimed);
        assert_eq!(killable().statuses.as_deref(), Some(&status::BUSY[..]));
        assert_eq!(killable().stop, StopIs::NotKill);
        let stop = StopRequest::now(crate::model::StopAction::Cancel, "me", "why");
        assert_eq!(cancel(&stop).status, Some(status::CANCELLED));
        assert_eq!(kill_request(&stop).status, None, "a kill request leaves the status");
    }

    #[test]
    fn a_resubmission_is_scheduled_until_its_time() {
        let now = DateTime::from_millis(1_000);
        let mut new = NewTask::queued(bson::oid::ObjectId::new(), bson::doc! {"a": 1});
        assert_eq!(resubmit(&new, now).status, Some(status::QUEUED));
        assert_eq!(resubmit(&new, now).run_at, Write::Clear);
        new.run_at = Some(DateTime::from_millis(2_000));
        assert_eq!(resubmit(&new, now).status, Some(status::SCHEDULED));
    }
}
