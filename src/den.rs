//! The DEN (Disbatch Execution Node): the daemon loop that claims tasks and runs them.
//!
//! Two loops run side by side, so that claims slow behind a slow link never hold a
//! heartbeat back (a late heartbeat lets the others count this node dead):
//!
//! - the upkeep, every tick and at least four times per `heartbeat_stale`
//!   ([`housekeeping`]): the DEN upserts its node document (renewing its slot leases) and
//!   reads its `maxthreads`; then, each in a task of its own, it reports its queue problems
//!   and duration histograms, and takes or renews the cluster's leader lease
//!   (`heartbeat_stale` long, so a dead leader's successor takes over within that and a
//!   tick); on the leader only, it recovers orphans: the spec's sweep of tasks claimed (-1)
//!   for over 5 minutes, plus claimed or running tasks of nodes whose heartbeat is stale
//!   (→ -6, or back to -2 when the queue has `on_orphan: "requeue"`);
//! - the claims, every tick (1 s by default) and at once when a worker frees a slot or a
//!   task is queued: each queue that is active here, whose plugin is allowed and loadable
//!   and whose sandbox settings are valid, while the node's `maxthreads` allows, takes a
//!   lease on one of the queue's `threads` slots and claims a task with the spec's
//!   `findOneAndUpdate`, then hands both to a worker. When every slot is held it asks the
//!   node holding the most (at least two more than this one) for one, reserved for it for
//!   three ticks.
//!
//! The first upkeep (heartbeat and orphan recovery) ends before the first claim.
//!
//! A worker runs its task in the sandbox (on a thread of its own), writes the result back in
//! one update fenced on `{_id, node}`, and claims the queue's next task with the same slot
//! while the queue still allows it and no other node asked for the slot, so a busy queue
//! costs three round trips per task (claim, start, finish) plus the slot's renewal.
//!
//! `threads` holds across DENs through the slot leases; `maxthreads` holds per node because
//! only this process claims for its node name.

mod backoff;
mod balance;
mod chain;
mod claims;
mod housekeeping;
mod lease;
mod lifecycle;
mod next;
mod node_name;
mod output;
mod plugins;
mod progress;
mod queues;
mod rate;
mod result;
mod retention;
mod retry;
mod schedules;
mod shutdown;
mod slots;
mod stats;
mod watch;
mod worker;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bson::oid::ObjectId;
use bson::DateTime;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, info_span, warn, Instrument};

use crate::config::{Config, Gfs};
use crate::model::{NameHolder, NodeProcess, NodeStats};
use crate::runner::{RunControl, Runner, Sandbox};
use crate::store::{Slot, Store, StoreError, StoreResult};

pub use node_name::DISBATCH4_TAKEOVER_MARGIN;
use node_name::{disbatch4_running, name_in_use};
pub use output::INLINE_BUDGET;
use queues::Queues;

/// How long to wait before watching for queued tasks again after the watch failed.
const WATCH_RETRY: Duration = Duration::from_secs(5);

/// Default interval of the DEN loop.
pub const DEFAULT_TICK: Duration = Duration::from_secs(1);

/// Failures that stop the DEN.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DenError {
    /// The store failed at start-up (indexes could not be ensured).
    #[error("cannot prepare the database: {0}")]
    Startup(#[source] StoreError),
    /// Another live DEN holds this node name.
    #[error("{}", name_in_use(node, holder))]
    NodeInUse {
        /// The node name.
        node: String,
        /// The process holding it.
        holder: NameHolder,
    },
    /// A Disbatch 4 DEN holding this node name kept heartbeating while this DEN waited
    /// `heartbeat_stale` plus [`DISBATCH4_TAKEOVER_MARGIN`] for its heartbeat to go stale.
    #[error("{}", disbatch4_running(node, *waited, *moves, *heartbeat_age))]
    Disbatch4Running {
        /// The node name.
        node: String,
        /// How long this DEN waited.
        waited: Duration,
        /// How often the heartbeat changed during the wait.
        moves: u32,
        /// How long ago the heartbeat last changed.
        heartbeat_age: Duration,
    },
}

/// What a DEN needs to know; built from the config file by the `den` binary.
#[derive(Debug, Clone)]
pub struct DenSettings {
    /// This DEN's node name (unique among DENs).
    pub node: String,
    /// Directory holding `<plugin>.wasm` files.
    pub plugin_dir: PathBuf,
    /// Allowed plugin names.
    pub plugins: Vec<String>,
    /// Only these queues, when not empty.
    pub active_queues: Vec<ObjectId>,
    /// Never these queues (ignored when `active_queues` is not empty).
    pub ignore_queues: Vec<ObjectId>,
    /// Where large outputs go.
    pub gfs: Gfs,
    /// A node whose heartbeat is older than this is dead; also the slot lease length.
    pub heartbeat_stale: Duration,
    /// A task claimed (-1) for longer than this is orphaned (the spec's 5 minutes).
    pub orphan_claimed_after: Duration,
    /// How long a graceful shutdown waits for running tasks.
    pub shutdown_grace: Duration,
    /// Sandbox defaults, overridden per queue by its `sandbox` sub-document.
    pub sandbox: Sandbox,
    /// Loop interval.
    pub tick: Duration,
    /// Most tasks this process runs at once, whatever `maxthreads` says (the sandbox pool).
    pub max_instances: u32,
    /// Host files no queue's grant may reach, besides the component cache and the plugin
    /// directory: the config file and the embedded database, when there are ones.
    pub protected: Vec<PathBuf>,
    /// QueueBalance settings: whether this DEN balances the queues while it leads.
    pub balance: crate::config::Balance,
    /// How long the per-minute counters are kept (`stats_retention`).
    pub stats_retention: Duration,
    /// How long ended tasks are kept by default (`retention`), under each queue's own.
    pub retention: crate::model::Retention,
}

impl DenSettings {
    /// The settings of a DEN run with `config`.
    pub fn from_config(config: &Config) -> Self {
        DenSettings {
            node: config.node.clone(),
            plugin_dir: config.plugin_dir.clone(),
            plugins: config.plugins.clone(),
            active_queues: config.active_queues.clone(),
            ignore_queues: config.ignore_queues.clone(),
            gfs: config.gfs,
            heartbeat_stale: config.heartbeat_stale,
            orphan_claimed_after: config.orphan_claimed_after,
            shutdown_grace: config.shutdown_grace,
            sandbox: config.sandbox.clone(),
            tick: DEFAULT_TICK,
            max_instances: config.max_instances,
            protected: Vec::new(),
            balance: config.balance.clone(),
            stats_retention: config.stats_retention,
            retention: config.retention.clone(),
        }
    }
}

/// A running DEN. Create with [`Den::new`], drive with [`Den::run`].
pub struct Den {
    store: Arc<dyn Store>,
    runner: Runner,
    settings: DenSettings,
    queues: Queues,
    /// Woken when a worker stops, so the loop refills at once.
    wake: Notify,
    /// Workers (= tasks in flight) of this process.
    running: AtomicUsize,
    /// `maxthreads` of this node as last read (None = no limit).
    maxthreads: Mutex<Option<i64>>,
    /// Slots to give back that could not be given back when their worker stopped, each
    /// with whether its last claim failed (its lost claims are settled first, see `claims`).
    stray_slots: Mutex<Vec<(Slot, bool)>>,
    /// Held (shared) by each claim until its task is in `in_flight`, alone by the settling
    /// of lost claims (see `claims`).
    claims: tokio::sync::RwLock<()>,
    /// When this DEN's heartbeats last landed again after a gap of half a stale window or
    /// more (an outage, a pause); recovery by stale heartbeat waits until then plus
    /// `heartbeat_stale`, so live nodes cut off alike can heartbeat first.
    outage_ended: Mutex<Option<tokio::time::Instant>>,
    /// Whether the database is unreachable as far as the loops know (for the log).
    in_outage: std::sync::atomic::AtomicBool,
    /// Tasks in flight: task id → the slot it holds.
    in_flight: Mutex<HashMap<ObjectId, Slot>>,
    /// The running plugins, looked after while their workers run them.
    watch: watch::Watch,
    /// Run controls of the running plugins, by task id.
    controls: Mutex<HashMap<ObjectId, RunControl>>,
    /// Kill requests carried out, by task id, until the worker writes the result.
    kills: Mutex<HashMap<ObjectId, crate::model::StopRequest>>,
    /// When the last successful heartbeat was sent (monotonic, wall clock).
    last_heartbeat: Mutex<Option<(Instant, SystemTime)>>,
    /// Cancelled when claiming must stop.
    stopping: CancellationToken,
    /// Cancelled when the drain is over: workers stop retrying writes.
    abandoned: CancellationToken,
    /// Claim and run durations since start, and whether they changed since last reported.
    stats: Mutex<(NodeStats, bool)>,
    /// This process's claim on its node name.
    process: NodeProcess,
    /// Another process last seen holding this node name, reported once.
    intruder: Mutex<Option<ObjectId>>,
    /// The queue problems last written to the node document.
    reported_problems: Mutex<Option<std::collections::BTreeMap<String, String>>>,
    /// The problem last seen with this node's own document, logged once.
    node_problem: Mutex<Option<String>>,
    /// The leader lease's token while this node holds it.
    leading: Mutex<Option<i64>>,
    /// Whether the leader's duties (lease, orphan recovery) are running.
    leader_busy: std::sync::atomic::AtomicBool,
    /// Whether the node's reports after a heartbeat are running.
    reports_busy: std::sync::atomic::AtomicBool,
    /// The last error of each schedule, logged once until it changes (`den/schedules.rs`).
    schedule_errors: Mutex<std::collections::HashMap<String, String>>,
    /// When the leader last looked for tasks past their retention, and whether that look
    /// left some (`den/retention.rs`).
    retention_look: Mutex<Option<(tokio::time::Instant, bool)>>,
    /// When the leader last swept output files used by nothing, and where the next page
    /// starts (`den/retention.rs`).
    file_sweep: Mutex<Option<(tokio::time::Instant, Option<bson::oid::ObjectId>)>>,
    /// Runs counted per (minute, queue), not yet stored.
    minute_stats: stats::MinuteStats,
    /// Queues whose claims failed permanently, left alone for a while.
    claim_backoff: backoff::ClaimBackoff,
    /// When a timer set for the first rate grant to free wakes the claim loop (`rate`).
    rate_wake: Mutex<Option<tokio::time::Instant>>,
}

impl Den {
    /// A DEN on `store`, running plugins with `runner`.
    pub fn new(store: Arc<dyn Store>, runner: Runner, settings: DenSettings) -> Arc<Self> {
        Arc::new(Den {
            queues: Queues::new(&settings),
            store,
            runner,
            settings,
            wake: Notify::new(),
            running: AtomicUsize::new(0),
            maxthreads: Mutex::new(None),
            stray_slots: Mutex::new(Vec::new()),
            claims: tokio::sync::RwLock::new(()),
            outage_ended: Mutex::new(None),
            in_outage: std::sync::atomic::AtomicBool::new(false),
            in_flight: Mutex::new(HashMap::new()),
            watch: watch::Watch::default(),
            controls: Mutex::new(HashMap::new()),
            kills: Mutex::new(HashMap::new()),
            last_heartbeat: Mutex::new(None),
            stopping: CancellationToken::new(),
            abandoned: CancellationToken::new(),
            stats: Mutex::new((NodeStats::default(), false)),
            process: NodeProcess::this_process(),
            intruder: Mutex::new(None),
            reported_problems: Mutex::new(None),
            node_problem: Mutex::new(None),
            leading: Mutex::new(None),
            leader_busy: std::sync::atomic::AtomicBool::new(false),
            reports_busy: std::sync::atomic::AtomicBool::new(false),
            schedule_errors: Mutex::default(),
            retention_look: Mutex::new(None),
            file_sweep: Mutex::new(None),
            minute_stats: stats::MinuteStats::default(),
            claim_backoff: backoff::ClaimBackoff::default(),
            rate_wake: Mutex::new(None),
        })
    }

    /// Number of tasks this DEN is running now.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    /// Runs until `shutdown` is cancelled, then shuts down gracefully: no new claims,
    /// running tasks get `shutdown_grace` to finish, the rest go back to their queue.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) -> Result<(), DenError> {
        let node = self.settings.node.clone();
        async {
            self.store.ensure_indexes().await.map_err(DenError::Startup)?;
            if !self.take_node_name(&shutdown).await? {
                info!("stopped while waiting for the node name");
                return Ok(());
            }
            info!(
                plugins = ?self.settings.plugins,
                plugin_dir = %self.settings.plugin_dir.display(),
                "DEN started"
            );
            let mut interval = tokio::time::interval(self.settings.tick);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let watcher = tokio::spawn(self.clone().watch_queued(shutdown.clone()));
            // Kill requests are carried out until the drain is over, not only until the signal.
            let lifecycle_stop = CancellationToken::new();
            let lifecycle = tokio::spawn(self.clone().lifecycle(lifecycle_stop.clone()));
            let watch = tokio::spawn(self.clone().watch_runs(lifecycle_stop.clone()));
            // The first pass heartbeats and recovers orphans before anything is claimed; from
            // then on the upkeep runs on its own, so slow claims never hold a heartbeat back.
            let first = self.upkeep(true).await;
            self.note_outage(first);
            let upkeep_stop = CancellationToken::new();
            let upkeep = tokio::spawn(self.clone().keep_up(upkeep_stop.clone()));
            loop {
                let ticked = tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = interval.tick() => true,
                    _ = self.wake.notified() => false,
                };
                let claimed = self.tick(ticked).await;
                self.note_outage(claimed);
            }
            upkeep_stop.cancel();
            let _ = upkeep.await;
            watcher.abort();
            self.drain().await;
            lifecycle_stop.cancel();
            let _ = lifecycle.await;
            let _ = watch.await;
            self.flush_stats(true).await;
            let stats = self.stats.lock().unwrap_or_else(|e| e.into_inner()).0.clone();
            if let Err(e) = crate::lifecycle::nodes::report_stats(&*self.store, &node, &stats).await {
                debug!(error = %e, "cannot report the last durations");
            }
            if let Err(e) = crate::lifecycle::nodes::release(&*self.store, &node, self.process.id).await {
                debug!(error = %e, "cannot give the node name up");
            }
            Ok(())
        }
        .instrument(info_span!("den", node = %node))
        .await
    }

    /// One pass of the claim loop: each ready queue's tasks claimed while this node has
    /// room. A `full` pass (every tick, rather than a wake by a freed slot or a queued task)
    /// also reads the queues' plugins again and asks for slots held elsewhere.
    async fn tick(self: &Arc<Self>, full: bool) -> StoreResult<()> {
        let s = &self.settings;
        let all = self.store.queues().await?;
        let ready = self.queues.refresh(&*self.store, &self.runner, all, full).await;
        // Asks for slots held elsewhere, at most one per task this node has room for.
        let mut asked = 0;
        for q in ready {
            if self.stopping.is_cancelled() {
                break;
            }
            if self.claim_backoff.waiting(q.queue.id) {
                continue;
            }
            while self.has_room() && !self.lease_lapsed() {
                if !self.store.has_queued(q.queue.id).await? {
                    break;
                }
                // A rate-limited queue's task is claimed only under a grant (`rate`).
                let grant = match &q.queue.rate {
                    None => None,
                    Some(rate) => match self.take_grant(&q.queue, rate).await? {
                        Some(g) => Some(g),
                        None => break,
                    },
                };
                let Some(slot) =
                    crate::lifecycle::slots::acquire_slot(&*self.store, &q.queue, &s.node, s.heartbeat_stale).await?
                else {
                    if let Some(g) = &grant {
                        self.give_grant_back(g).await;
                    }
                    if full && asked < self.room() && self.ask_for_slot(&q.queue).await {
                        asked += 1;
                    }
                    break;
                };
                if self.lease_lapsed() {
                    self.give_back(slot).await;
                    if let Some(g) = &grant {
                        self.give_grant_back(g).await;
                    }
                    break;
                }
                // Claimed only while the slot is still held (renewed in the same
                // transaction on the embedded store): a DEN paused here past its lease may
                // have lost the slot to another node, which then runs the queue's limit.
                let (claimed, lapsed) = {
                    let _claiming = self.claims.read().await;
                    let claimed = self.claim_with(&slot, &q.queue).await;
                    let lapsed = matches!(claimed, Ok(Some(_))) && self.lease_lapsed();
                    if let (Ok(Some(task)), false) = (&claimed, lapsed) {
                        self.register(task, &slot);
                    }
                    (claimed, lapsed)
                };
                match claimed {
                    Ok(Some(task)) if lapsed => {
                        warn!(task = %task.id, "the node's lease lapsed while claiming; putting the task back");
                        self.recover_fenced(&task).await;
                        self.give_back(slot).await;
                        break;
                    }
                    Ok(Some(task)) => {
                        self.claim_backoff.succeeded(q.queue.id);
                        self.spawn_worker(q.clone(), slot, task, grant.map(|g| g.at))
                    }
                    Ok(None) => {
                        self.claim_backoff.succeeded(q.queue.id);
                        self.give_back(slot).await;
                        // Nothing started under it: the window keeps it.
                        if let Some(g) = &grant {
                            self.give_grant_back(g).await;
                        }
                        break;
                    }
                    Err(e @ StoreError::Database(_)) => {
                        // The claim may have been made on the server with its reply lost.
                        if let Some(slot) = self.after_failed_claim(slot).await {
                            self.give_back(slot).await;
                        }
                        return Err(e);
                    }
                    Err(e @ StoreError::Rejected(_)) => {
                        // Retrying at once cannot help: leave the queue alone for a while.
                        self.give_back(slot).await;
                        let wait = self.claim_backoff.failed(q.queue.id, s.tick);
                        error!(queue = %q.queue.name, error = %e, wait_secs = wait.as_secs_f64(),
                            "cannot claim; trying the queue again later");
                        break;
                    }
                    Err(e) => {
                        // A task that cannot be read was failed by the store; go on.
                        error!(queue = %q.queue.name, error = %e, "claimed a malformed task");
                        self.give_back(slot).await;
                    }
                }
            }
        }
        Ok(())
    }

    fn observe(&self, record: impl FnOnce(&mut NodeStats)) {
        let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        record(&mut stats.0);
        stats.1 = true;
    }

    /// Follows the store's notifications of queued tasks, waking the loop for each; when
    /// they stop, the loop's polling carries on and watching is tried again later.
    async fn watch_queued(self: Arc<Self>, stop: CancellationToken) {
        use futures::StreamExt;
        loop {
            match self.store.watch_queued().await {
                Ok(Some(mut events)) => {
                    debug!("watching for queued tasks");
                    loop {
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            event = events.next() => match event {
                                Some(Ok(())) => self.wake.notify_one(),
                                Some(Err(e)) => {
                                    debug!(error = %e, "watching for queued tasks stopped; polling");
                                    break;
                                }
                                None => break,
                            },
                        }
                    }
                }
                Ok(None) => return,
                Err(e) => debug!(error = %e, "cannot watch for queued tasks; polling"),
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(WATCH_RETRY) => {}
            }
        }
    }

    /// Whether this node may start one more task.
    fn has_room(&self) -> bool {
        self.room() > 0
    }

    /// How many more tasks this node may run now (`max_instances`, `maxthreads`).
    fn room(&self) -> i64 {
        let running = self.running() as i64;
        let max = *self.maxthreads.lock().unwrap_or_else(|e| e.into_inner());
        let limit = max.map_or(i64::from(self.settings.max_instances), |m| {
            m.min(i64::from(self.settings.max_instances))
        });
        limit - running
    }
}

/// `d` before `now`.
fn before(now: DateTime, d: Duration) -> DateTime {
    DateTime::from_millis(now.timestamp_millis() - d.as_millis() as i64)
}
