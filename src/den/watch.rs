//! The watch over running plugins. A worker runs its plugin on its own thread and cannot
//! look up while it does, so one loop per DEN looks at every running plugin each
//! [`WATCH_TICK`]: it writes the plugin's newest progress report once per
//! [`PROGRESS_INTERVAL`], stops a plugin silent past its queue's `activity_timeout`, and
//! takes over the task of a plugin still running [`HOST_CALL_GRACE`] past its timeout or
//! its stop (blocked in a host call that does not return): the task's end is written and
//! its slot freed without the worker, whose thread is abandoned and writes nothing if the
//! plugin ever returns.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info_span, Instrument};

use super::progress::{Latest, PROGRESS_INTERVAL};
use super::queues::QueueState;
use super::worker::HOST_CALL_GRACE;
use super::Den;
use crate::lifecycle;
use crate::model::{Task, TaskProgress};
use crate::runner::{Failure, Outcome, RunControl, StopReason};
use crate::store::Slot;

/// How often the watch looks at the running plugins.
pub(super) const WATCH_TICK: Duration = Duration::from_millis(50);

/// What a worker leaves for the watch while its plugin runs.
pub(super) struct Watched {
    pub(super) clock: Clock,
    /// What the task's end needs when the watch writes it instead of the worker.
    pub(super) queue: Arc<QueueState>,
    pub(super) task: Task,
    pub(super) slot: Slot,
}

/// The times the watch keeps for one running plugin.
pub(super) struct Clock {
    pub(super) control: RunControl,
    pub(super) latest: Arc<Latest>,
    pub(super) started: Instant,
    /// The plugin's timeout.
    timeout: Duration,
    /// The queue's `activity_timeout`.
    activity: Option<Duration>,
    /// The number of the progress report last written, when the next write is due, and
    /// whether one is under way (at most one is).
    seen: u64,
    report_due: Instant,
    reporting: Arc<AtomicBool>,
    /// When the watch first saw the plugin stopped.
    stop_seen: Option<Instant>,
}

impl Clock {
    /// From now, for a plugin run under `control` that reports to `latest`, with its
    /// `timeout` and its queue's `activity_timeout`.
    pub(super) fn new(control: RunControl, latest: Arc<Latest>, timeout: Duration, activity: Option<Duration>) -> Self {
        let started = Instant::now();
        Clock {
            control,
            latest,
            started,
            timeout,
            activity,
            seen: 0,
            report_due: started + PROGRESS_INTERVAL,
            reporting: Arc::default(),
            stop_seen: None,
        }
    }

    /// One look at `now`: stops the plugin when it has been silent too long or ran past its
    /// timeout, and answers what is due: a progress report to write, or the end of a plugin
    /// to give up on (with the failure it ends with).
    fn look(&mut self, now: Instant) -> Due {
        // A lapsed lease (a pause of the whole process) is the reason to stop, before the
        // timeout it may also have outlasted.
        self.control.check();
        if let Some(limit) = self.activity {
            if self
                .latest
                .last_heard(self.started)
                .checked_add(limit)
                .is_some_and(|due| now >= due)
            {
                self.control.cancel(StopReason::Stuck);
            }
        }
        if now >= self.started + self.timeout + HOST_CALL_GRACE {
            self.control.cancel(StopReason::Timeout);
            return Due::GiveUp(Failure::Timeout(self.timeout), "its timeout");
        }
        if let Some(reason) = self.control.reason() {
            let seen = *self.stop_seen.get_or_insert(now);
            if now >= seen + HOST_CALL_GRACE {
                let failure = match reason {
                    StopReason::Timeout => Failure::Timeout(self.timeout),
                    r => Failure::Trap(format!("plugin stopped: {r}")),
                };
                return Due::GiveUp(failure, "its stop");
            }
        }
        if now >= self.report_due && !self.reporting.load(Ordering::SeqCst) {
            self.report_due = now + PROGRESS_INTERVAL;
            if let Some(p) = self.latest.newer(&mut self.seen) {
                self.reporting.store(true, Ordering::SeqCst);
                return Due::Report(p, self.reporting.clone());
            }
        }
        Due::Nothing
    }
}

#[derive(Debug)]
enum Due {
    Nothing,
    /// A report to write, and the flag to clear once it is written.
    Report(TaskProgress, Arc<AtomicBool>),
    GiveUp(Failure, &'static str),
}

/// The running plugins of a DEN, by task id, each with the number of its run: a task run
/// again on this node while the thread of an earlier run it gave up is still stuck is
/// another run, which that thread must never take for its own.
#[derive(Default)]
pub(super) struct Watch {
    runs: Mutex<HashMap<ObjectId, (u64, Watched)>>,
    added: Notify,
    last_run: AtomicU64,
}

impl Watch {
    fn runs(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectId, (u64, Watched)>> {
        self.runs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Watches the plugin of `task` from now; answers the number of this run.
    pub(super) fn add(&self, task: ObjectId, watched: Watched) -> u64 {
        let run = self.last_run.fetch_add(1, Ordering::SeqCst) + 1;
        let first = {
            let mut runs = self.runs();
            runs.insert(task, (run, watched));
            runs.len() == 1
        };
        if first {
            self.added.notify_one();
        }
        run
    }

    /// Stops watching run `run` of `task` as its plugin returned. False when the watch gave
    /// the plugin up first: the task's end is then the watch's to write, not the worker's.
    pub(super) fn remove(&self, task: ObjectId, run: u64) -> bool {
        take_run(&mut self.runs(), task, run)
    }
}

/// Takes run `run` of `task` out of `runs`; false when that run is not there (whatever
/// other run of the task is).
fn take_run<T>(runs: &mut HashMap<ObjectId, (u64, T)>, task: ObjectId, run: u64) -> bool {
    if runs.get(&task).is_some_and(|(r, _)| *r == run) {
        runs.remove(&task);
        return true;
    }
    false
}

impl Den {
    /// Looks at the running plugins every [`WATCH_TICK`] while there are any, until `stop`.
    pub(super) async fn watch_runs(self: Arc<Self>, stop: CancellationToken) {
        loop {
            let added = self.watch.added.notified();
            if self.watch.runs().is_empty() {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = added => {}
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(WATCH_TICK) => {}
            }
            let now = Instant::now();
            let mut reports = Vec::new();
            let mut due_up = Vec::new();
            let mut given_up = Vec::new();
            {
                let mut runs = self.watch.runs();
                for (task, (_, w)) in runs.iter_mut() {
                    match w.clock.look(now) {
                        Due::Nothing => {}
                        Due::Report(p, reporting) => reports.push((*task, p, reporting)),
                        Due::GiveUp(failure, past) => due_up.push((*task, failure, past)),
                    }
                }
                // Out of the map under the same lock: a worker whose plugin returns since
                // finds its task gone and writes nothing.
                for (task, failure, past) in due_up {
                    if let Some((_, w)) = runs.remove(&task) {
                        given_up.push((w, failure, past));
                    }
                }
            }
            for (task, p, reporting) in reports {
                let den = self.clone();
                tokio::spawn(async move {
                    let node = &den.settings.node;
                    if let Err(e) = lifecycle::run::report_progress(&*den.store, task, node, &p).await {
                        debug!(task = %task, error = %e, "cannot store progress; the next report tries again");
                    }
                    reporting.store(false, Ordering::SeqCst);
                });
            }
            for (w, failure, past) in given_up {
                tokio::spawn(self.clone().take_over(w, failure, past));
            }
        }
    }

    /// Ends the task of a plugin given up in a host call that does not return, as its worker
    /// would have (its timeout or stop recorded), then frees its slot.
    async fn take_over(self: Arc<Self>, w: Watched, failure: Failure, past: &'static str) {
        let span = info_span!("task", task = %w.task.id, queue = %w.queue.queue.name);
        async {
            error!(
                grace_ms = HOST_CALL_GRACE.as_millis() as u64,
                "plugin blocked in a host call past {past}; its thread is abandoned and its slot freed"
            );
            let mut outcome = Outcome::not_run(failure);
            outcome.duration = w.clock.started.elapsed();
            let _ = self
                .conclude(&w.queue, &w.task, (&w.clock.control, &w.clock.latest), outcome, None)
                .await;
            if self.forget(w.task.id) {
                self.give_back(w.slot).await;
            }
            self.worker_done();
        }
        .instrument(span)
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::{Progress, RunControl};

    fn clock(timeout: u64, activity: Option<u64>) -> Clock {
        let activity = activity.map(Duration::from_millis);
        Clock::new(
            RunControl::new(),
            Arc::new(Latest::default()),
            Duration::from_millis(timeout),
            activity,
        )
    }

    #[test]
    fn a_plugin_within_its_limits_is_left_alone() {
        let mut c = clock(10_000, Some(5_000));
        assert!(matches!(c.look(c.started + Duration::from_millis(900)), Due::Nothing));
        assert_eq!(c.control.reason(), None);
    }

    #[test]
    fn a_plugin_past_its_timeout_and_the_grace_is_given_up_as_timed_out() {
        let mut c = clock(500, None);
        let t = c.started;
        // Past its timeout the runner stops it; the watch waits the grace for the host call.
        assert!(matches!(c.look(t + Duration::from_millis(600)), Due::Nothing));
        match c.look(t + Duration::from_millis(500) + HOST_CALL_GRACE) {
            Due::GiveUp(Failure::Timeout(d), past) => {
                assert_eq!(d, Duration::from_millis(500));
                assert_eq!(past, "its timeout");
            }
            d => panic!("{d:?}"),
        }
        assert_eq!(c.control.reason(), Some(StopReason::Timeout));
    }

    #[test]
    fn a_stopped_plugin_gets_the_grace_from_when_the_stop_was_seen() {
        let mut c = clock(60_000, None);
        let t = c.started + Duration::from_secs(5);
        c.control.cancel(StopReason::Killed);
        assert!(matches!(c.look(t), Due::Nothing));
        assert!(matches!(c.look(t + HOST_CALL_GRACE / 2), Due::Nothing));
        match c.look(t + HOST_CALL_GRACE) {
            Due::GiveUp(Failure::Trap(m), "its stop") => assert!(m.contains("killed"), "{m}"),
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn a_silent_plugin_is_stopped_as_stuck_and_one_that_reports_is_not() {
        let mut c = clock(60_000, Some(1_000));
        let t = c.started;
        assert!(matches!(c.look(t + Duration::from_millis(999)), Due::Nothing));
        assert_eq!(c.control.reason(), None);
        (c.latest.sink(ObjectId::new()))(&Progress {
            at: Duration::ZERO,
            percent: Some(10.0),
            info: None,
        });
        let heard = c.latest.last_heard(t);
        c.look(heard + Duration::from_millis(999));
        assert_eq!(c.control.reason(), None, "a report keeps the plugin alive");
        c.look(heard + Duration::from_millis(1_000));
        assert_eq!(c.control.reason(), Some(StopReason::Stuck));
    }

    #[test]
    fn progress_is_due_once_per_interval_only_when_new_and_one_write_at_a_time() {
        let mut c = clock(60_000, None);
        let t = c.started;
        let sink = c.latest.sink(ObjectId::new());
        let report = |info: &str| Progress {
            at: Duration::ZERO,
            percent: Some(1.0),
            info: Some(info.into()),
        };
        sink(&report("one"));
        assert!(
            matches!(c.look(t + PROGRESS_INTERVAL / 2), Due::Nothing),
            "not before the interval"
        );
        let at = t + PROGRESS_INTERVAL;
        let writing = match c.look(at) {
            Due::Report(p, writing) => {
                assert_eq!(p.info, "one");
                writing
            }
            d => panic!("{d:?}"),
        };
        sink(&report("two"));
        assert!(
            matches!(c.look(at + PROGRESS_INTERVAL / 2), Due::Nothing),
            "one write per interval"
        );
        assert!(
            matches!(c.look(at + PROGRESS_INTERVAL), Due::Nothing),
            "no second write while the first is under way"
        );
        writing.store(false, Ordering::SeqCst);
        match c.look(at + PROGRESS_INTERVAL) {
            Due::Report(p, _) => assert_eq!(p.info, "two"),
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn a_lapsed_lease_is_the_reason_even_past_the_timeout() {
        let past = Instant::now() - Duration::from_secs(5);
        let control = RunControl::with_lease(
            past,
            std::time::SystemTime::now() - Duration::from_secs(5),
            Duration::from_secs(1),
        );
        let mut c = Clock::new(control, Arc::new(Latest::default()), Duration::from_millis(10), None);
        // A pause of the whole process outlasted both the lease and the timeout.
        let d = c.look(c.started + Duration::from_millis(10) + HOST_CALL_GRACE);
        assert!(matches!(d, Due::GiveUp(Failure::Timeout(_), _)), "{d:?}");
        assert_eq!(c.control.reason(), Some(StopReason::LeaseLost));
    }

    #[test]
    fn a_later_run_of_the_same_task_is_not_taken_by_the_earlier_one() {
        let task = ObjectId::new();
        // Run 1 was given up (taken out by the watch); run 2 of the same task runs here.
        let mut runs = HashMap::from([(task, (2, ()))]);
        assert!(!take_run(&mut runs, task, 1), "the earlier run's thread takes nothing");
        assert!(take_run(&mut runs, task, 2));
        assert!(!take_run(&mut runs, task, 2), "taken once");
    }
}
