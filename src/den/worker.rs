//! Workers: each runs one claimed task in the sandbox, writes its result back, and goes on
//! with the queue's next task while its slot and the node's limits allow.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{debug, error, info, info_span, warn, Instrument};

use super::next::ClaimedWithEnd;
use super::progress::Latest;
use super::queues::QueueState;
use super::result::{Stop, TaskResult};
use super::watch::{Clock, Watched};
use super::Den;
use crate::lifecycle;
use crate::lifecycle::slots;
use crate::model::{status, Task};
use crate::runner::{Failure, Outcome, RunControl, StopReason};
use crate::store::{Slot, SlotRenewal, StoreResult};

/// How long the watch waits, past a plugin's timeout or stop, for a host call that does not
/// return before it gives the plugin's thread up (see [`super::watch`]).
pub(super) const HOST_CALL_GRACE: Duration = Duration::from_secs(1);

/// A worker whose plugin the watch gave up: its thread writes nothing more.
pub(super) struct Abandoned;

/// What a worker is started with: its DEN, queue, slot, first task and rate grant.
type Job = (Arc<Den>, Arc<QueueState>, Slot, Task, Option<bson::DateTime>);

/// Runs the worker of `job` (once, whoever takes it first) on the calling thread, in
/// `runtime`'s `block_on`.
fn work_on_this_thread(runtime: &tokio::runtime::Handle, job: &Mutex<Option<Job>>) {
    let Some((den, queue, slot, task, granted)) = job.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        return;
    };
    runtime.block_on(async move {
        // An abandoned worker's task and slot are the watch's.
        if let Ok(slot) = den.clone().work(queue, slot, task, granted).await {
            if let Some(slot) = slot {
                den.give_back(slot).await;
            }
            den.worker_done();
        }
    })
}

impl Den {
    /// Runs `task` with `slot`; `granted` is the time of the rate grant it starts under,
    /// for a task of a rate-limited queue (`rate`).
    ///
    /// The worker has a thread of its own: it runs its plugins there and waits for its
    /// writes there too (in the runtime's `block_on`), so a task costs no hand-off to a
    /// blocking thread and back. The [`watch`](super::watch) looks after the plugins meanwhile.
    pub(super) fn spawn_worker(
        self: &Arc<Self>,
        queue: Arc<QueueState>,
        slot: Slot,
        task: Task,
        granted: Option<bson::DateTime>,
    ) {
        self.running.fetch_add(1, Ordering::SeqCst);
        let job = Arc::new(Mutex::new(Some((self.clone(), queue, slot, task, granted))));
        let (taken, runtime) = (job.clone(), tokio::runtime::Handle::current());
        let spawned = std::thread::Builder::new()
            .name("den-worker".into())
            .spawn(move || work_on_this_thread(&runtime, &taken));
        if let Err(e) = spawned {
            // The blocking pool queues the worker until one of its threads is free.
            warn!(error = %e, "cannot start a worker thread; the worker waits for one of the blocking pool's");
            tokio::task::spawn_blocking(move || work_on_this_thread(&tokio::runtime::Handle::current(), &job));
        }
    }

    /// A worker stopped: the claim loop refills at once.
    pub(super) fn worker_done(&self) {
        self.running.fetch_sub(1, Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// Runs `task`, then the queue's next tasks while the queue and node allow it.
    /// Returns the slot to release (None when the drain already gave it up), or
    /// [`Abandoned`] when the watch took its task over.
    async fn work(
        self: Arc<Self>,
        mut queue: Arc<QueueState>,
        slot: Slot,
        first: Task,
        mut granted: Option<bson::DateTime>,
    ) -> Result<Option<Slot>, Abandoned> {
        let mut task = first;
        // The slot's last renewal, claimed on until it is a tick old.
        let mut renewed = None;
        loop {
            // Registered in `in_flight` by its claim; a drain that took it since requeued it.
            if !self
                .in_flight
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains_key(&task.id)
            {
                return Ok(None);
            }
            let span = info_span!("task", task = %task.id, queue = %queue.queue.name);
            let with_end = self
                .execute(&queue, &task, (&slot, &renewed), granted.take())
                .instrument(span)
                .await?;
            let ours = self.forget(task.id);
            let (began, claimed) = match with_end {
                // Claimed with the end of the run: kept only while the worker would have
                // claimed after it.
                Some(with_end) => {
                    if !ours || self.stopping.is_cancelled() {
                        match &with_end.claimed {
                            Ok(Some(next)) => _ = self.put_back(next).await,
                            Ok(None) => {}
                            Err(_) if ours => return Ok(self.after_failed_claim(slot).await),
                            Err(_) => {}
                        }
                        return Ok(ours.then_some(slot));
                    }
                    queue = with_end.queue;
                    (with_end.began, with_end.claimed.map(|t| (SlotRenewal::Held, t)))
                }
                None => {
                    if !ours || self.stopping.is_cancelled() {
                        return Ok(ours.then_some(slot));
                    }
                    match self.claim_after_end(&mut queue, &slot, &mut renewed).await {
                        Some(claimed) => claimed,
                        None => return Ok(Some(slot)),
                    }
                }
            };
            match claimed {
                Ok((SlotRenewal::Held, Some(next))) => {
                    self.observe(|stats| stats.claim.observe(began.elapsed().as_secs_f64()));
                    // The lease may have lapsed while the write waited: a task claimed
                    // after it is not run; it goes back to its queue unless another node
                    // recovered it meanwhile.
                    if self.lease_lapsed() {
                        warn!(task = %next.id, "the node's lease lapsed while claiming; putting the task back");
                        let ours = self.put_back(&next).await;
                        return Ok(ours.then_some(slot));
                    }
                    task = next;
                }
                Ok((SlotRenewal::Held | SlotRenewal::OverLimit, _)) => return Ok(Some(slot)),
                Ok((SlotRenewal::Lost, _)) => {
                    warn!(queue = %queue.queue.name, "slot lease lost; not claiming more with it");
                    return Ok(None);
                }
                Ok((SlotRenewal::Yielded { to }, _)) => {
                    debug!(queue = %queue.queue.name, to = %to, "gave a slot to a node holding fewer of the queue's");
                    return Ok(None);
                }
                Err(e) => {
                    // The claim may have been made on the server with its reply lost.
                    debug!(error = %e, "cannot renew the slot lease or claim");
                    return Ok(self.after_failed_claim(slot).await);
                }
            }
        }
    }

    /// The claim of a worker after the end of its run was written (none was made with it):
    /// `queue`'s next task while everything still allows it, with the time it was sent.
    /// None when the worker gives its slot back instead.
    async fn claim_after_end(
        &self,
        queue: &mut Arc<QueueState>,
        slot: &Slot,
        renewed: &mut Option<slots::Renewed>,
    ) -> Option<(std::time::Instant, StoreResult<(SlotRenewal, Option<Task>)>)> {
        // Keep the slot for the queue's next task while everything still allows it; a
        // rate-limited queue's next task needs a grant of its own, taken by the claim loop.
        *queue = self.keeps_slot(queue.queue.id, slot)?;
        if queue.queue.rate.is_some() {
            return None;
        }
        // A queue the QueueBalance lowered gives slots back as its tasks end, whichever
        // slots they are, so a priority lane waits for the first of them, not for one.
        if queue.queue.maxthreads.is_some() {
            match slots::slots_in_use(&*self.store, queue.queue.id).await {
                Ok(n) if n > queue.queue.limit() => return None,
                Ok(_) => {}
                Err(e) => {
                    debug!(error = %e, "cannot count the queue's slots in use");
                    return None;
                }
            }
        }
        // Re-validate the slot lease before claiming, at least once a tick: a slot lost
        // (freed by recovery while this DEN was paused) must not be used for another
        // task, and one another node asked for goes to it.
        if self.lease_lapsed() {
            return None;
        }
        let began = std::time::Instant::now();
        let _claiming = self.claims.read().await;
        let claimed = slots::claim_next(
            &*self.store,
            slot,
            &queue.queue,
            &self.settings.node,
            (self.settings.heartbeat_stale, self.settings.tick),
            renewed,
        )
        .await;
        if let Ok((SlotRenewal::Held, Some(next))) = &claimed {
            self.register(next, slot);
        }
        Some((began, claimed))
    }

    /// Puts back a task this worker claimed and will not run (unless another node recovered
    /// it meanwhile) and forgets it. Whether it was still registered in flight.
    async fn put_back(&self, task: &Task) -> bool {
        self.recover_fenced(task).await;
        self.forget(task.id)
    }

    /// Takes `task` out of the tasks in flight: whether it was still there (not taken by
    /// the drain), so its slot is still the worker's to give back.
    pub(super) fn forget(&self, task: bson::oid::ObjectId) -> bool {
        self.in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&task)
            .is_some()
    }

    pub(super) fn over_node_limit(&self) -> bool {
        let max = *self.maxthreads.lock().unwrap_or_else(|e| e.into_inner());
        max.is_some_and(|m| self.running() as i64 > m)
    }

    /// One task: running (0) → sandbox → outputs → finished, each write retried through
    /// transient database errors (see [`super::result`]). The worker's next claim goes with
    /// the end where it can (see `next`); that claim, made or tried, is answered.
    async fn execute(
        &self,
        queue: &Arc<QueueState>,
        task: &Task,
        (slot, renewed): (&Slot, &Option<slots::Renewed>),
        granted: Option<bson::DateTime>,
    ) -> Result<Option<ClaimedWithEnd>, Abandoned> {
        let node = &self.settings.node;
        // A task the store claimed and started in one write needs no start; one started
        // under a rate grant records the grant's time as its `started`.
        let started = async {
            match (task.status == status::RUNNING, granted) {
                (true, None) => Ok(true),
                (true, Some(at)) => {
                    self.retry("record the start", || {
                        lifecycle::run::record_started(&*self.store, task.id, node, at)
                    })
                    .await
                }
                (false, Some(at)) => {
                    self.retry("mark running", || {
                        lifecycle::run::start_at(&*self.store, task.id, node, at)
                    })
                    .await
                }
                (false, None) => {
                    self.retry("mark running", || lifecycle::run::start(&*self.store, task.id, node))
                        .await
                }
            }
        };
        match started.await {
            Ok(true) => {}
            Ok(false) => {
                warn!("task was taken from this node before it started; not running it");
                return Ok(None);
            }
            Err(Stop::Refused(e)) => {
                error!(error = %e, "cannot mark the task running; not running it (it is recovered as a stale claim)");
                return Ok(None);
            }
            Err(Stop::GaveUp) => return Ok(None),
        }
        debug!("running");
        let control = self.new_control(task.id);
        let latest = Arc::new(Latest::default());
        let outcome = self
            .run_watched(queue, task, slot, (&control, &latest))
            .ok_or(Abandoned)?;
        let next = Some((slot, renewed));
        Ok(self.conclude(queue, task, (&control, &latest), outcome, next).await)
    }

    /// The end of a run: how it stopped, its retry or its result written, with the worker's
    /// next claim on `next` (a slot and its last renewal) where the end can carry it.
    pub(super) async fn conclude(
        &self,
        queue: &QueueState,
        task: &Task,
        (control, latest): (&RunControl, &Latest),
        mut outcome: Outcome,
        next: Option<(&Slot, &Option<slots::Renewed>)>,
    ) -> Option<ClaimedWithEnd> {
        let node = &self.settings.node;
        self.drop_control(task.id);
        match control.reason() {
            Some(StopReason::LeaseLost) => {
                warn!("plugin stopped: this node's lease lapsed; result not written, the task is left to recovery");
                self.recover_fenced(task).await;
                return None;
            }
            Some(StopReason::Shutdown) => {
                info!("plugin stopped by the shutdown; the task goes back to its queue");
                return None;
            }
            Some(StopReason::Killed) => {
                let stop = self.take_kill(task.id);
                // Only a run the kill interrupted ends as killed; a plugin that returned
                // success first keeps it (the request stays recorded in `stop`).
                if outcome.failure.is_some() {
                    outcome.status = status::FAILED as u32;
                    outcome.failure = Some(Failure::Killed(stop.to_string()));
                }
            }
            Some(StopReason::Stuck) if outcome.failure.is_some() => {
                outcome.status = status::FAILED as u32;
                outcome.failure = queue.queue.activity_timeout.map(Failure::Stuck);
            }
            _ => {}
        }
        self.observe(|stats| stats.run.observe(outcome.duration.as_secs_f64()));
        let final_status = super::output::stored_status(outcome.status);
        match &outcome.failure {
            None => info!(
                status = final_status,
                duration_ms = outcome.duration.as_millis() as u64,
                "finished"
            ),
            Some(f) => warn!(
                status = final_status,
                reason = f.kind(),
                duration_ms = outcome.duration.as_millis() as u64,
                "failed: {f}"
            ),
        }
        let (stdout, mut stderr) = outcome.output_texts();
        let status = if final_status > 0 { final_status } else { status::FAILED };
        let progress = latest.last();
        let attempt = match super::retry::next_run(task, &queue.queue, node, status, &outcome, &stdout, &stderr) {
            super::retry::NextRun::Retry(retry) => {
                if self.write_retry(task, &retry).await {
                    self.count_run(task.queue, crate::stats::End::Retried, outcome.duration);
                    return None;
                }
                None
            }
            super::retry::NextRun::Final { attempt, note } => {
                stderr.push_str(&note);
                attempt
            }
            super::retry::NextRun::Once => None,
        };
        let next = match next {
            Some((slot, renewed)) => self.claim_with_end(queue.queue.id, slot, renewed).await,
            None => None,
        };
        self.write_result(
            task,
            &queue.queue,
            TaskResult {
                status,
                stdout,
                stderr,
                progress,
                attempt,
                submitted: outcome.submitted,
                took: outcome.duration,
            },
            next,
        )
        .await
    }

    /// Runs the task's plugin on this thread under `control`, watched meanwhile (see
    /// [`watch`](super::watch)). None when the watch gave the plugin up first (blocked in a
    /// host call past its timeout or stop): the task's end is then the watch's to write.
    fn run_watched(
        &self,
        queue: &Arc<QueueState>,
        task: &Task,
        slot: &Slot,
        (control, latest): (&RunControl, &Arc<Latest>),
    ) -> Option<Outcome> {
        let sandbox = crate::runner::Sandbox {
            depth: super::chain::depth(task.key.as_deref()),
            ..queue.sandbox.clone()
        };
        let params = task.params_json();
        let sink = latest.sink(task.id);
        let watched = Watched {
            clock: Clock::new(
                control.clone(),
                latest.clone(),
                sandbox.timeout,
                queue.queue.activity_timeout,
            ),
            queue: queue.clone(),
            task: task.clone(),
            slot: slot.clone(),
        };
        let run = self.watch.add(task.id, watched);
        // Out of the runtime's context: the sandbox's host calls enter it themselves.
        let outcome = tokio::task::block_in_place(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.runner
                    .run_controlled(&queue.plugin, &params, &sandbox, Some(sink), control)
            }))
        })
        .unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Outcome::not_run(Failure::Trap(format!("the runner failed: {what}")))
        });
        self.watch.remove(task.id, run).then_some(outcome)
    }

    /// A task whose plugin was stopped because this node's lease lapsed: if no other node
    /// recovered it meanwhile (the write is fenced on this node and status -1/0), put it
    /// back in its queue, as a shutdown does with the plugins it stops.
    pub(super) async fn recover_fenced(&self, task: &Task) {
        let node = &self.settings.node;
        let ids = [task.id];
        match self
            .retry("requeue", || {
                crate::lifecycle::run::requeue_own(&*self.store, node, &ids)
            })
            .await
        {
            Ok(ids) if !ids.is_empty() => {
                info!("no other node had recovered the task; put it back in its queue (-2)")
            }
            Ok(_) => info!("another node had already recovered the task"),
            Err(_) => warn!("cannot requeue the task; another node recovers it once this one's heartbeat is stale"),
        }
    }
}
