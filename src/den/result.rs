//! Writing a task's result back, and the retry rule for every store write a worker makes:
//! transient errors (the database unreachable, a primary stepping down, a busy embedded
//! database) are retried with backoff until the write succeeds or the drain gives up;
//! a permanent error (not authorized, document too large, validation, a bad value) ends
//! the retry at once, since the next attempt would be refused the same way.
//!
//! A result the database refuses fails the task instead: status 2, empty stdout, and the
//! reason in stderr. When even that is refused, a bare status 2 is tried; when that is
//! refused too, the problem is logged with the task's id and the worker frees its slot —
//! it never hangs on a write that cannot succeed. Output files written for a result that
//! was not stored (refused, given up, or the task recovered by another node meanwhile)
//! are deleted, so they do not stay behind as orphans.

use std::future::Future;
use std::time::Duration;

use bson::oid::ObjectId;
use tracing::{debug, error, info, warn};

use super::next::{ClaimWithEnd, ClaimedWithEnd};
use super::output::{self, OutputFiles};
use super::Den;
use crate::lifecycle::run::{self, FinishExtra};
use crate::model::{status, Task};
use crate::store::{OutputValue, StoreError, StoreResult};

/// Longest backoff between two attempts of a store write.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Why a retried store call ended without a value.
#[derive(Debug)]
pub(super) enum Stop {
    /// The database refused the call; retrying cannot help.
    Refused(StoreError),
    /// The drain gave up on running tasks while the database was still unreachable.
    GaveUp,
}

/// What a task's result is, before it is stored.
pub(super) struct TaskResult {
    /// The task's final status (positive).
    pub status: i32,
    /// The plugin's stdout.
    pub stdout: String,
    /// The plugin's stderr.
    pub stderr: String,
    /// The plugin's last progress report, stored with the result.
    pub progress: Option<crate::model::TaskProgress>,
    /// The run's record for `attempts`, when the task keeps them.
    pub attempt: Option<crate::model::Attempt>,
    /// The follow-up tasks the plugin submitted, created only when it succeeded.
    pub submitted: Vec<crate::runner::Submission>,
    /// How long the plugin ran (counted in the per-minute counters once stored).
    pub took: Duration,
}

impl Den {
    /// Stores `result` for `task`: outputs (files as needed), then the finishing update,
    /// each retried through transient errors. A refused write fails the task with the
    /// reason; files of a result that was not stored are deleted. The first attempt of the
    /// finishing update makes `next` with it ([`Den::end_and_claim`]); that claim, made or
    /// tried, is answered.
    pub(super) async fn write_result(
        &self,
        task: &Task,
        queue: &crate::model::Queue,
        result: TaskResult,
        next: Option<ClaimWithEnd>,
    ) -> Option<ClaimedWithEnd> {
        let claimed = std::sync::Mutex::new(None);
        self.write_result_claiming(task, queue, result, next, &claimed).await;
        claimed.into_inner().unwrap_or_else(|e| e.into_inner())
    }

    /// [`Self::write_result`], the claim made with the end going to `claimed`.
    async fn write_result_claiming(
        &self,
        task: &Task,
        queue: &crate::model::Queue,
        mut result: TaskResult,
        next: Option<ClaimWithEnd>,
        claimed: &std::sync::Mutex<Option<ClaimedWithEnd>>,
    ) {
        let node = &self.settings.node;
        // The follow-ups the plugin submitted and a chain's follow-up go in first, waiting
        // for this task (see `chain`).
        let mut chained = false;
        if result.status == status::SUCCEEDED && !result.submitted.is_empty() {
            chained = true;
            if !self.create_submitted(task, &mut result).await {
                return;
            }
        }
        if result.status == status::SUCCEEDED && queue.next_queue.is_some() {
            match self
                .retry("create the follow-up", || {
                    super::chain::follow_up(self.store.as_ref(), queue, task, &result.stdout)
                })
                .await
            {
                Ok(Some(next)) => {
                    debug!(task = %task.id, next = %next, "follow-up in the next queue");
                    chained = true;
                }
                Ok(None) => {}
                Err(Stop::Refused(e)) => {
                    error!(task = %task.id, error = %e, "cannot create the follow-up in the next queue")
                }
                Err(Stop::GaveUp) => {
                    error!(task = %task.id, "follow-up not created: the database stayed unreachable past the shutdown")
                }
            }
        }
        let files = OutputFiles::new();
        let params_len = bson::to_vec(&task.params).map(|v| v.len()).unwrap_or(0);
        let outputs = self
            .retry("store output", || {
                output::store_outputs(
                    self.store.as_ref(),
                    self.settings.gfs,
                    task.id,
                    files,
                    params_len,
                    result.stdout.clone(),
                    result.stderr.clone(),
                )
            })
            .await;
        let (out, err) = match outputs {
            Ok(v) => v,
            Err(Stop::Refused(e)) => {
                self.discard_files(task.id, files).await;
                self.fail_refused(task, "store output", &e, result.took).await;
                return;
            }
            Err(Stop::GaveUp) => {
                error!(task = %task.id, "result lost: the database stayed unreachable past the shutdown");
                return;
            }
        };
        let extra = FinishExtra {
            progress: result.progress.clone(),
            attempt: result.attempt.clone(),
        };
        let tries = std::sync::atomic::AtomicU32::new(0);
        let mut next = next;
        let written = self
            .retry("write result", || {
                tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let (next, outputs) = (next.take(), (out.clone(), err.clone()));
                let (status, extra) = (result.status, &extra);
                async move {
                    match next {
                        Some(next) => self.end_and_claim(task.id, status, outputs, extra, next, claimed).await,
                        None => {
                            run::finish_with(&*self.store, task.id, node, status, outputs.0, outputs.1, extra).await
                        }
                    }
                }
            })
            .await;
        // A write retried after an error may have applied with its reply lost: the fenced
        // write then finds the task ended and answers false. The stored task tells which.
        let written = match written {
            Ok(false) if tries.into_inner() > 1 && self.result_landed(task.id, result.status, &out, &err).await => {
                Ok(true)
            }
            other => other,
        };
        match written {
            Ok(true) => {
                self.count_result(task.queue, result.status, result.took);
                self.settle_end(task, chained).await
            }
            Ok(false) => {
                warn!(task = %task.id, "task was recovered by another node meanwhile; result not written");
                self.discard_files(task.id, files).await;
            }
            Err(Stop::Refused(e)) => {
                self.discard_files(task.id, files).await;
                self.fail_refused(task, "write result", &e, result.took).await;
            }
            Err(Stop::GaveUp) => {
                error!(task = %task.id, "result lost: the database stayed unreachable past the shutdown")
            }
        }
    }

    /// Creates the follow-ups `task` submitted, retried through transient errors. A
    /// permanent error (a queue that does not exist) fails the task with the reason in its
    /// stderr. Returns false when the database stayed unreachable past the shutdown: the
    /// result must then not be written, so the task is left to recovery, whose next run
    /// meets the follow-ups created so far.
    async fn create_submitted(&self, task: &Task, result: &mut TaskResult) -> bool {
        let created = self
            .retry("create the submitted follow-ups", || {
                super::chain::submitted(self.store.as_ref(), task, &result.submitted)
            })
            .await;
        match created {
            Ok(()) => {
                debug!(task = %task.id, count = result.submitted.len(), "submitted follow-ups created");
                true
            }
            Err(Stop::Refused(e)) => {
                error!(task = %task.id, error = %e, "cannot create the submitted follow-ups; the task fails");
                result.status = status::FAILED;
                if let Some(a) = &mut result.attempt {
                    a.status = status::FAILED;
                }
                if !result.stderr.is_empty() && !result.stderr.ends_with('\n') {
                    result.stderr.push('\n');
                }
                result.stderr.push_str(&format!(
                    "[disbatch: the follow-up tasks this task submitted could not be created, so it failed: {e}]\n"
                ));
                true
            }
            Err(Stop::GaveUp) => {
                error!(task = %task.id, "result not written: the database stayed unreachable past the shutdown while creating its follow-ups");
                false
            }
        }
    }

    /// Releases (or cancels) the tasks waiting for `task`, whose result was just written,
    /// and for its batch if that completed; what fails here is left to the leader's sweep.
    async fn settle_end(&self, task: &Task, chained: bool) {
        let dependents = task.dependents || chained;
        if !dependents && task.batch.is_none() {
            return;
        }
        let store = self.store.as_ref();
        match crate::lifecycle::deps::task_ended(store, task.id, dependents, task.batch.as_deref()).await {
            Ok(done) if done.released > 0 => self.wake.notify_one(),
            Ok(_) => {}
            Err(e) => {
                warn!(task = %task.id, error = %e, "cannot release the tasks waiting for it; the leader's sweep will")
            }
        }
    }

    /// The database refused `task`'s result (`what` failed with `e`): fail the task with
    /// the reason in stderr, or with a bare status when even that is refused; a failure
    /// written is counted as a failed run of `took`.
    async fn fail_refused(&self, task: &Task, what: &str, e: &StoreError, took: std::time::Duration) {
        let node = &self.settings.node;
        let reason = format!(
            "disbatch: the result of task {} could not be stored, so the task failed: {what}: {e}",
            task.id
        );
        error!(task = %task.id, error = %e, "{what} refused; failing the task with the reason");
        let attempts = [
            ("write failure", OutputValue::Inline(reason)),
            ("write failed status", OutputValue::Inline(String::new())),
        ];
        for (step, stderr) in attempts {
            let written = self
                .retry(step, || {
                    run::finish(
                        &*self.store,
                        task.id,
                        node,
                        status::FAILED,
                        OutputValue::Inline(String::new()),
                        stderr.clone(),
                    )
                })
                .await;
            match written {
                Ok(true) => {
                    self.count_result(task.queue, status::FAILED, took);
                    return;
                }
                Ok(false) => {
                    warn!(task = %task.id, "task was recovered by another node meanwhile; failure not written");
                    return;
                }
                Err(Stop::Refused(again)) => {
                    error!(task = %task.id, error = %again, "{step} refused too");
                }
                Err(Stop::GaveUp) => {
                    error!(task = %task.id, "failure lost: the database stayed unreachable past the shutdown");
                    return;
                }
            }
        }
        error!(
            task = %task.id,
            "the database refuses every write of this task's result; it stays running (0) on this node \
             and its slot is freed; fix the cause (permissions, validation) and set its status by hand"
        );
    }

    /// Whether the stored task holds this node's result: its status and outputs as written.
    /// When it cannot be read, the result is taken as not stored.
    async fn result_landed(&self, task: ObjectId, status: i32, out: &OutputValue, err: &OutputValue) -> bool {
        let same = |stored: &Option<crate::model::Output>, sent: &OutputValue| match (stored, sent) {
            (Some(crate::model::Output::Inline(a)), OutputValue::Inline(b)) => a == b,
            (Some(crate::model::Output::File(a)), OutputValue::File(b)) => a == b,
            _ => false,
        };
        match self.store.task(task).await {
            Ok(Some(t)) => {
                t.node.as_deref() == Some(self.settings.node.as_str())
                    && t.status == status
                    && same(&t.stdout, out)
                    && same(&t.stderr, err)
            }
            _ => false,
        }
    }

    /// Deletes the output files of a result that was not stored (one attempt: when the
    /// database is unreachable they stay, and the log names them).
    async fn discard_files(&self, task: ObjectId, files: OutputFiles) {
        if let Err(e) = self.store.discard_output_files(task, &files.ids()).await {
            warn!(
                task = %task,
                stdout_file = %files.stdout,
                stderr_file = %files.stderr,
                error = %e,
                "cannot delete the output files of a result that was not stored"
            );
        }
    }

    /// Retries `op` through transient database errors, with backoff, until it succeeds or
    /// the drain gives up on running tasks. A permanent error ends the retry at once.
    pub(super) async fn retry<T, F, Fut>(&self, what: &str, mut op: F) -> Result<T, Stop>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = StoreResult<T>>,
    {
        let mut backoff = Duration::from_millis(100);
        let mut logged = false;
        loop {
            match op().await {
                Ok(v) => {
                    if logged {
                        info!("{what}: database reachable again");
                    }
                    return Ok(v);
                }
                Err(e) if e.is_transient() => {
                    if !logged {
                        warn!(error = %e, "{what}: database unreachable; retrying");
                        logged = true;
                    }
                }
                Err(e) => {
                    error!(error = %e, "{what} failed; not retrying");
                    return Err(Stop::Refused(e));
                }
            }
            tokio::select! {
                _ = self.abandoned.cancelled() => return Err(Stop::GaveUp),
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}
