//! The DEN's own upkeep: heartbeats (renewing slot leases and reading
//! `maxthreads`), the leader lease and the duties that go with it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bson::DateTime;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::{before, Den};
use crate::store::{StoreError, StoreResult};

/// The leader's duties (lease and orphan recovery) are given up after this many stale
/// windows and tried again at the next tick.
const LEADER_DUTIES_BOUND: u32 = 5;

impl Den {
    /// How often the upkeep runs: every tick, and at least four times per stale window, so
    /// a heartbeat lost to a dropped connection leaves time for the next ones before the
    /// others count this node dead.
    pub(super) fn upkeep_period(&self) -> Duration {
        let s = &self.settings;
        s.tick.min(s.heartbeat_stale / 4).max(Duration::from_millis(10))
    }

    /// Runs [`Den::upkeep`] every [`Den::upkeep_period`] until `stop` is cancelled: apart
    /// from the claims, so a claim pass that takes long behind a slow link does not hold a
    /// heartbeat back (and the node's lease with it).
    pub(super) async fn keep_up(self: Arc<Self>, stop: CancellationToken) {
        let mut interval = tokio::time::interval(self.upkeep_period());
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        interval.tick().await;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = interval.tick() => {}
            }
            let done = self.upkeep(false).await;
            self.note_outage(done);
        }
    }

    /// The heartbeat ([`Den::heartbeat_and_read`]), then, each in a task of its own so
    /// the next heartbeat never waits for them, the node's reports ([`Den::spawn_reports`])
    /// and the leader's duties ([`Den::spawn_leader_duties`]); the `first` pass awaits
    /// them (it recovers orphans before anything is claimed). Then the per-minute counters.
    pub(super) async fn upkeep(self: &Arc<Self>, first: bool) -> StoreResult<()> {
        let s = &self.settings;
        // A store call that never answers must not hold the upkeep: past the stale window
        // the others count this node dead anyway, and the next pass tries again.
        match tokio::time::timeout(s.heartbeat_stale, self.heartbeat_and_read()).await {
            Ok(done) => done?,
            Err(_) => {
                // As unreachable as a refused connection: the heartbeat did not land.
                return Err(StoreError::Database(format!(
                    "the heartbeat took longer than heartbeat_stale ({} s); trying again",
                    s.heartbeat_stale.as_secs_f64()
                )));
            }
        }
        let reports = self.spawn_reports();
        let duties = self.spawn_leader_duties();
        if first {
            for task in [reports, duties].into_iter().flatten() {
                let _ = task.await;
            }
        }
        self.stats_duties();
        Ok(())
    }

    /// Logs the database becoming unreachable, or reachable again, once per change.
    pub(super) fn note_outage(&self, result: StoreResult<()>) {
        match result {
            Ok(()) => {
                if self.in_outage.swap(false, Ordering::SeqCst) {
                    info!("database reachable again");
                }
            }
            Err(e @ StoreError::Database(_)) if !self.in_outage.swap(true, Ordering::SeqCst) => {
                error!(error = %e, "database unreachable; running tasks continue, claiming resumes when it is back");
            }
            Err(e @ StoreError::Database(_)) => debug!(error = %e, "database still unreachable"),
            Err(e) => error!(error = %e, "the DEN's pass failed"),
        }
    }

    /// A heartbeat alone, renewing the running tasks' leases when it succeeds (used while
    /// a shutdown waits for them).
    pub(super) async fn beat(&self) {
        let s = &self.settings;
        let sent = (Instant::now(), SystemTime::now());
        let heartbeat = self.store.heartbeat(&s.node, s.heartbeat_stale).await;
        if let Err(e) = &heartbeat {
            debug!(error = %e, "heartbeat during shutdown failed");
        }
        self.renew_leases(sent, heartbeat.is_ok());
    }

    /// The heartbeat (also renewing slot leases), and what the node's document says:
    /// `maxthreads`, another process under this node's name, a problem with the document.
    pub(super) async fn heartbeat_and_read(&self) -> StoreResult<()> {
        let s = &self.settings;
        let sent = (Instant::now(), SystemTime::now());
        let previous = self
            .last_heartbeat
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map(|(at, _)| at);
        let heartbeat = self.store.heartbeat(&s.node, s.heartbeat_stale).await;
        self.renew_leases(sent, heartbeat.is_ok());
        let me = heartbeat?;
        if previous.is_some_and(|at| sent.0.saturating_duration_since(at) > s.heartbeat_stale / 2) {
            // This node could not heartbeat for half a stale window or more (an outage, a
            // pause): the others likely could not either, and their heartbeats may look
            // stale until their next one lands. The leader waits a stale window before it
            // recovers anything.
            *self.outage_ended.lock().unwrap_or_else(|e| e.into_inner()) = Some(tokio::time::Instant::now());
        }
        if let Some(other) = me.process.filter(|p| p.id != self.process.id) {
            let mut seen = self.intruder.lock().unwrap_or_else(|e| e.into_inner());
            if seen.replace(other.id) != Some(other.id) {
                error!(
                    pid = other.pid,
                    host = %other.host,
                    "another DEN took this node name; give one of them another name (DISBATCH_NODE or `node`)"
                );
            }
        }
        *self.maxthreads.lock().unwrap_or_else(|e| e.into_inner()) = me.maxthreads;
        let mut seen = self.node_problem.lock().unwrap_or_else(|e| e.into_inner());
        if *seen != me.problem {
            match &me.problem {
                Some(problem) => error!("this node's document: {problem}"),
                None => info!("this node's document reads well again"),
            }
            seen.clone_from(&me.problem);
        }
        Ok(())
    }

    /// [`Den::reports`] in a task of its own, skipped while the previous one still runs.
    fn spawn_reports(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        if self.reports_busy.swap(true, Ordering::SeqCst) {
            return None;
        }
        let den = Arc::clone(self);
        Some(tokio::spawn(async move {
            if let Err(e) = den.reports().await {
                warn!(error = %e, "cannot report this node's queue problems; trying again");
            }
            den.reports_busy.store(false, Ordering::SeqCst);
        }))
    }

    /// What the node reports after a heartbeat: slots left to give back, the queues'
    /// problems (when they changed) and the duration histograms (when they changed).
    async fn reports(&self) -> StoreResult<()> {
        let s = &self.settings;
        self.give_back_strays().await;
        let changed = {
            let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::take(&mut stats.1).then(|| stats.0.clone())
        };
        if let Some(stats) = changed {
            if let Err(e) = crate::lifecycle::nodes::report_stats(&*self.store, &s.node, &stats).await {
                // Reported again next time; recovery must not wait for it.
                self.stats.lock().unwrap_or_else(|e| e.into_inner()).1 = true;
                warn!(error = %e, "cannot report the duration histograms; trying again");
            }
        }
        let problems = self.queues.problems();
        let reported = self.reported_problems.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if reported.as_ref() != Some(&problems) {
            crate::lifecycle::nodes::report_queue_problems(&*self.store, &s.node, &problems).await?;
            *self.reported_problems.lock().unwrap_or_else(|e| e.into_inner()) = Some(problems);
        }
        Ok(())
    }

    /// The leader's duties after a heartbeat, in a task of their own (skipped while the
    /// previous one still runs), bounded by [`LEADER_DUTIES_BOUND`] stale windows: over a
    /// slow link they take several round trips each, and cutting them short with the
    /// heartbeat's bound would leave a dead node's tasks unrecovered for as long as the
    /// link stays slow. A call that never answers holds up only these duties, and the
    /// lease they renew lapses meanwhile, so another node takes them over. Returns the
    /// task when it started one.
    pub(super) fn spawn_leader_duties(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        if self.leader_busy.swap(true, Ordering::SeqCst) {
            return None;
        }
        let den = Arc::clone(self);
        Some(tokio::spawn(async move {
            let bound = den.settings.heartbeat_stale.saturating_mul(LEADER_DUTIES_BOUND);
            match tokio::time::timeout(bound, den.leader_duties()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => warn!(error = %e, "orphan recovery failed; trying again next tick"),
                Err(_) => warn!(
                    limit_secs = bound.as_secs_f64(),
                    "the leader lease and orphan recovery took too long; trying again next tick"
                ),
            }
            den.leader_busy.store(false, Ordering::SeqCst);
        }))
    }

    /// Takes or renews the leader lease and, while this node leads, recovers orphans,
    /// creates the schedules' due tasks (`den/schedules.rs`) and deletes the ended tasks
    /// past their retention (`den/retention.rs`).
    async fn leader_duties(&self) -> StoreResult<()> {
        let s = &self.settings;
        let began = tokio::time::Instant::now();
        let leads = match self.lead().await {
            Ok(leads) => leads,
            Err(e) => {
                // A lease that cannot be read or written (an outage, a document someone
                // broke) stops this node's cluster duties, never its claiming.
                let was = self.leading.lock().unwrap_or_else(|e| e.into_inner()).take();
                if was.is_some() {
                    warn!(error = %e, "cannot renew the leader lease; not leading until it can");
                } else {
                    debug!(error = %e, "cannot take the leader lease");
                }
                false
            }
        };
        if !leads {
            return Ok(());
        }
        if began.elapsed() >= s.heartbeat_stale {
            // The store did not answer for a stale window (an outage this task waited
            // through): every other node's heartbeat may look stale for the same reason.
            *self.outage_ended.lock().unwrap_or_else(|e| e.into_inner()) = Some(tokio::time::Instant::now());
            return Ok(());
        }
        let since_outage = *self.outage_ended.lock().unwrap_or_else(|e| e.into_inner());
        if since_outage.is_some_and(|t| t.elapsed() < s.heartbeat_stale) {
            // Right after an outage every other node's heartbeat looks stale too.
            return Ok(());
        }
        let now = DateTime::now();
        let recovered = crate::lifecycle::recovery::recover_orphans(
            &*self.store,
            before(now, s.orphan_claimed_after),
            before(now, s.heartbeat_stale),
        )
        .await;
        // The schedules run whatever the sweep did, and the sweep's outcome is told after.
        self.run_schedules().await;
        self.run_retention().await;
        self.run_file_sweep().await;
        let recovered = recovered?;
        if !recovered.orphaned.is_empty() {
            warn!(count = recovered.orphaned.len(), tasks = ?recovered.orphaned, "marked orphaned tasks (-6)");
        }
        if !recovered.requeued.is_empty() {
            warn!(count = recovered.requeued.len(), tasks = ?recovered.requeued, "requeued tasks of a dead node (-2)");
        }
        Ok(())
    }

    /// Whether this node held the leader lease at its last tick.
    pub(super) fn leads(&self) -> bool {
        self.leading.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// Takes or renews the leader lease; whether this node leads now. Cluster-wide duties
    /// (the orphan sweep) run on the leader only, and only while its lease has not lapsed.
    pub(super) async fn lead(&self) -> StoreResult<bool> {
        let s = &self.settings;
        let lease = crate::lifecycle::leader::lead(self.store.as_ref(), &s.node, s.heartbeat_stale).await?;
        let leads = lease.held_by(&s.node, DateTime::now());
        let token = leads.then_some(lease.token);
        let before = std::mem::replace(&mut *self.leading.lock().unwrap_or_else(|e| e.into_inner()), token);
        match (before, token) {
            (None, Some(t)) => info!(
                token = t,
                "this node leads the cluster now (the orphan sweep runs here)"
            ),
            (Some(_), None) => warn!(leader = %lease.node, "this node no longer leads the cluster"),
            _ => {}
        }
        Ok(leads)
    }
}
