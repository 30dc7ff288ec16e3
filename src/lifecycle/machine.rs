//! The status sets a transition fences on, and the change each transition writes.
//!
//! Pure values: no store call here. The functions of [`super::run`], [`super::retry`]
//! and [`super::keys`] pair a fence with one of these changes and hand both to
//! [`Store::change_tasks`](crate::store::Store::change_tasks) or
//! [`Store::change_where`](crate::store::Store::change_where).

use bson::DateTime;

use crate::model::{status, Attempt, RetryAt, StopRequest, Task, TaskProgress};
use crate::store::{due_status, NewTask, NodeIs, OutputValue, StopIs, TaskChange, TaskFence, Write};

/// The stderr of a task that was asked to be killed while its DEN shut down
/// ([`super::run::requeue_own`] ends it failed instead of putting it back).
pub const KILLED_AT_SHUTDOWN: &str =
    "[disbatch: killed; its DEN stopped the plugin before it could store a result (the task's `stop` field says who asked and why)]\n";

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

// ---- the end of a run ----------------------------------------------------------------

/// A run on `node` that ends with its result: running there, not marked to run once more.
pub fn ends_plainly(node: &str) -> TaskFence {
    running_on(node).rerun(false)
}

/// A run on `node` marked to run once more, that someone asked to kill: it ends with its
/// result all the same (a kill wins over the rerun).
pub fn ends_killed(node: &str) -> TaskFence {
    running_on(node).rerun(true).stop(StopIs::Kill)
}

/// A run on `node` marked to run once more, not asked to kill: queued once more.
pub fn ends_for_rerun(node: &str) -> TaskFence {
    running_on(node).rerun(true).stop(StopIs::NotKill)
}

/// Running → ended with status `code` and its outputs; the plugin's last progress report
/// and the run's record (`attempt`, appended) when given; the rerun mark cleared.
pub fn finish(
    code: i32,
    stdout: &OutputValue,
    stderr: &OutputValue,
    progress: Option<&TaskProgress>,
    attempt: Option<&Attempt>,
) -> TaskChange {
    TaskChange {
        status: Some(code),
        stdout: Write::Set(stdout.clone()),
        stderr: Write::Set(stderr.clone()),
        progress: progress.map_or(Write::Keep, |p| Write::Set(p.clone())),
        rerun: Some(false),
        attempt: attempt.cloned(),
        touch: true,
        ..TaskChange::default()
    }
}

/// Running → queued once more (submitted again while it ran): unclaimed, outputs and
/// progress cleared, the rerun mark cleared, the run's `record` appended.
pub fn rerun_requeue(record: Attempt) -> TaskChange {
    TaskChange {
        status: Some(status::QUEUED),
        node: Write::Clear,
        stdout: Write::Clear,
        stderr: Write::Clear,
        progress: Write::Clear,
        rerun: Some(false),
        attempt: Some(record),
        touch: true,
        ..TaskChange::default()
    }
}

/// A task claimed or running on `node` that nobody asked to kill (a stopping DEN puts it
/// back).
pub fn own_unasked(node: &str) -> TaskFence {
    TaskFence::statuses(&status::BUSY)
        .on(NodeIs::Node(node.to_owned()))
        .stop(StopIs::NotKill)
}

/// A task claimed or running on `node` that someone asked to kill.
pub fn own_asked_to_kill(node: &str) -> TaskFence {
    TaskFence::statuses(&status::BUSY)
        .on(NodeIs::Node(node.to_owned()))
        .stop(StopIs::Kill)
}

/// Claimed or running → back in its queue (a DEN stopping before it ran it to the end):
/// unclaimed, the rerun mark cleared.
pub fn requeue() -> TaskChange {
    TaskChange {
        status: Some(status::QUEUED),
        node: Write::Clear,
        rerun: Some(false),
        touch: true,
        ..TaskChange::default()
    }
}

/// A task asked to be killed whose DEN stopped the plugin while shutting down ends failed
/// (2) with [`KILLED_AT_SHUTDOWN`] as stderr rather than running again.
pub fn fail_killed_at_shutdown() -> TaskChange {
    TaskChange {
        status: Some(status::FAILED),
        stdout: Write::Set(OutputValue::Inline(String::new())),
        stderr: Write::Set(OutputValue::Inline(KILLED_AT_SHUTDOWN.to_owned())),
        touch: true,
        ..TaskChange::default()
    }
}

/// The task exactly as `t` was read: its status and `mtime` (a compare-and-set: of two
/// writers that read it alike, one wins).
pub fn as_read(t: &Task) -> TaskFence {
    TaskFence {
        mtime: Some(t.mtime),
        ..TaskFence::statuses(&[t.status])
    }
}

/// A finished task queued again by hand: its last run's record (`last`) appended, queued
/// (-2) and unclaimed, its outputs, progress, stop request, avoidance and rerun mark
/// cleared. With `replace` (submitted again by key) it also takes that submission's
/// params, priority and `run_at`, and the status they mean at `now`.
pub fn hand_retry(last: Attempt, replace: Option<&NewTask>, now: DateTime) -> TaskChange {
    let mut change = TaskChange {
        status: Some(status::QUEUED),
        node: Write::Clear,
        stdout: Write::Clear,
        stderr: Write::Clear,
        progress: Write::Clear,
        stop: Write::Clear,
        rerun: Some(false),
        avoid: Write::Clear,
        attempt: Some(last),
        touch: true,
        ..TaskChange::default()
    };
    if let Some(new) = replace {
        let again = resubmit(new, now);
        change.status = again.status;
        change.params = again.params;
        change.priority = again.priority;
        change.run_at = again.run_at;
    }
    change
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
pub fn orphan_as_read(status: i32, node: Option<&str>, mtime: Option<DateTime>) -> TaskFence {
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

    #[test]
    fn the_end_of_a_run_is_decided_by_one_fence_of_three() {
        let f = [ends_plainly("n"), ends_killed("n"), ends_for_rerun("n")];
        // (rerun, kill) → which fences hold.
        for (rerun, kill) in [(false, false), (false, true), (true, false), (true, true)] {
            let holds = |fence: &TaskFence| {
                fence.rerun.is_none_or(|r| r == rerun)
                    && match fence.stop {
                        StopIs::Kill => kill,
                        StopIs::NotKill => !kill,
                        _ => true,
                    }
            };
            let n = f.iter().filter(|x| holds(x)).count();
            assert_eq!(n, 1, "rerun {rerun}, kill {kill}");
            assert_eq!(holds(&f[2]), rerun && !kill, "only an unkilled rerun runs again");
        }
        for x in &f {
            assert_eq!(x.statuses.as_deref(), Some(&[status::RUNNING][..]));
            assert_eq!(x.node, NodeIs::Node("n".into()));
        }
        let out = OutputValue::Inline("o".into());
        let done = finish(status::SUCCEEDED, &out, &out, None, None);
        assert_eq!(
            (done.status, done.rerun, done.progress),
            (Some(1), Some(false), Write::Keep)
        );
        let again = rerun_requeue(Attempt {
            node: None,
            started: None,
            ended: DateTime::from_millis(0),
            status: 1,
            reason: String::new(),
            stdout: None,
            stderr: None,
        });
        assert_eq!(
            (again.status, again.node, again.stdout),
            (Some(status::QUEUED), Write::Clear, Write::Clear)
        );
    }

    #[test]
    fn a_stopping_den_requeues_unless_asked_to_kill() {
        assert_eq!(own_unasked("n").stop, StopIs::NotKill);
        assert_eq!(own_asked_to_kill("n").stop, StopIs::Kill);
        assert_eq!(requeue().status, Some(status::QUEUED));
        let failed = fail_killed_at_shutdown();
        assert_eq!(failed.status, Some(status::FAILED));
        assert_eq!(
            failed.stderr,
            Write::Set(OutputValue::Inline(KILLED_AT_SHUTDOWN.into()))
        );
    }

    #[test]
    fn a_retry_by_hand_clears_the_run_and_may_take_a_resubmission() {
        let last = Attempt {
            node: Some("n".into()),
            started: None,
            ended: DateTime::from_millis(0),
            status: 1,
            reason: "by hand".into(),
            stdout: None,
            stderr: None,
        };
        let now = DateTime::from_millis(1_000);
        let plain = hand_retry(last.clone(), None, now);
        assert_eq!(plain.status, Some(status::QUEUED));
        assert_eq!((plain.params.clone(), plain.run_at.clone()), (None, Write::Keep));
        let mut new = NewTask::queued(bson::oid::ObjectId::new(), bson::doc! {"a": 1});
        new.run_at = Some(DateTime::from_millis(2_000));
        let replaced = hand_retry(last, Some(&new), now);
        assert_eq!(replaced.status, Some(status::SCHEDULED));
        assert_eq!(replaced.params, Some(bson::doc! {"a": 1}));
        let cleared = |c: &TaskChange| {
            (
                c.node.clone(),
                c.stop.clone(),
                c.avoid.clone(),
                c.rerun,
                c.attempt.is_some(),
            )
        };
        assert_eq!(cleared(&plain), cleared(&replaced));
    }
}
