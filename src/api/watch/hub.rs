//! The notification hub of one API process ([`TaskWatch`]): it follows the store's task
//! changes and wakes each waiter of `GET /tasks/wait` and `GET /tasks/{id}/events` when one
//! of *its* tasks may have changed, so a change costs a look at the waiters of that task,
//! not a read by every waiter.
//!
//! A change named by task id wakes that task's waiters at once. A change seen only as
//! "something changed" (another process wrote the embedded file, a write that does not
//! list its tasks, a gap in notification) is answered by one coalesced read of the marks
//! ([`Store::task_marks`]) of every watched task, at most every [`LOOK_INTERVAL`] (and never
//! more than a fifth of the time: a slow read spaces the next one out), waking only the
//! waiters whose tasks' marks moved. Waiters and the ids they watch are capped
//! ([`WaitLimits`]): past either cap a new waiter is refused with 503 and `Retry-After`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bson::oid::ObjectId;
use futures::StreamExt;
use tokio::sync::{broadcast, Notify};
use tracing::debug;

use crate::api::ApiError;
use crate::store::Store;

/// Shortest time between two coalesced reads of the watched tasks' marks.
pub const LOOK_INTERVAL: Duration = Duration::from_millis(200);
/// Ids per [`Store::task_marks`] call.
const LOOK_CHUNK: usize = 1000;
/// Default [`WaitLimits::max_waiters`].
pub const DEFAULT_MAX_WAITERS: usize = 512;
/// Default [`WaitLimits::max_waited_ids`].
pub const DEFAULT_MAX_WAITED_IDS: usize = 256_000;
/// Default [`WaitLimits::max_event_stream`]: the longest wait.
pub const DEFAULT_MAX_EVENT_STREAM: Duration = super::MAX_WAIT;

/// Caps on what waiters may hold in one API process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitLimits {
    /// Waits (`GET /tasks/wait`) and event streams (`GET /tasks/{id}/events`) open at once.
    pub max_waiters: usize,
    /// Task ids those waiters name together (an id named by two waiters counts twice).
    pub max_waited_ids: usize,
    /// Longest life of one event stream (`GET /tasks/{id}/events`): it then ends, freeing
    /// its place; a client reconnects and gets the task as it is first.
    pub max_event_stream: Duration,
}

impl Default for WaitLimits {
    fn default() -> Self {
        WaitLimits {
            max_waiters: DEFAULT_MAX_WAITERS,
            max_waited_ids: DEFAULT_MAX_WAITED_IDS,
            max_event_stream: DEFAULT_MAX_EVENT_STREAM,
        }
    }
}

/// A change the followers of new tasks (`GET /tasks?new=`) may care about.
#[derive(Debug, Clone, Copy)]
pub(in crate::api) enum Change {
    /// This task changed.
    Task(ObjectId),
    /// Any task may have changed.
    Any,
}

/// One watched task id.
#[derive(Debug, Default)]
struct Watched {
    /// The waiters naming it.
    waiters: Vec<u64>,
    /// Its mark at the last coalesced read: `None` before the first, `Some(None)` when
    /// there was no such task.
    mark: Option<Option<u64>>,
}

/// The waiters and what they watch.
#[derive(Debug, Default)]
struct Registry {
    next: u64,
    waiters: HashMap<u64, (Arc<Notify>, Vec<ObjectId>)>,
    by_id: HashMap<ObjectId, Watched>,
    ids: usize,
    /// Something changed that was not named by id: a coalesced read is due.
    dirty: bool,
}

impl Registry {
    fn wake(&self, id: &ObjectId) {
        if let Some(w) = self.by_id.get(id) {
            for n in &w.waiters {
                if let Some((notify, _)) = self.waiters.get(n) {
                    notify.notify_one();
                }
            }
        }
    }

    fn wake_all(&self) {
        for (notify, _) in self.waiters.values() {
            notify.notify_one();
        }
    }
}

/// The notification hub of one API process.
#[derive(Debug)]
pub struct TaskWatch {
    tx: broadcast::Sender<Change>,
    started: AtomicBool,
    live: Arc<AtomicBool>,
    registry: Arc<Mutex<Registry>>,
}

impl Default for TaskWatch {
    fn default() -> Self {
        TaskWatch {
            tx: broadcast::channel(4096).0,
            started: AtomicBool::new(false),
            live: Arc::new(AtomicBool::new(false)),
            registry: Arc::default(),
        }
    }
}

fn lock(registry: &Mutex<Registry>) -> MutexGuard<'_, Registry> {
    registry.lock().unwrap_or_else(|p| p.into_inner())
}

/// A registered waiter: woken when one of its tasks may have changed; unregistered when
/// dropped.
#[derive(Debug)]
pub(in crate::api) struct Waiter {
    key: u64,
    notify: Arc<Notify>,
    registry: Arc<Mutex<Registry>>,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut r = lock(&self.registry);
        let Some((_, ids)) = r.waiters.remove(&self.key) else {
            return;
        };
        r.ids -= ids.len();
        for id in ids {
            if let Some(w) = r.by_id.get_mut(&id) {
                w.waiters.retain(|k| *k != self.key);
                if w.waiters.is_empty() {
                    r.by_id.remove(&id);
                }
            }
        }
    }
}

impl Waiter {
    /// Waits until one of the waiter's tasks may have changed (true), or `limit` passes
    /// (false). While the store's changes are not followed, it says true every
    /// `unwatched_poll` so the waiter looks again.
    pub(in crate::api) async fn changed(&self, watch: &TaskWatch, limit: Duration, unwatched_poll: Duration) -> bool {
        let step = if watch.live() { limit } else { unwatched_poll.min(limit) };
        match tokio::time::timeout(step, self.notify.notified()).await {
            Ok(()) => true,
            Err(_) => step < limit,
        }
    }
}

impl TaskWatch {
    fn start(&self, store: &Arc<dyn Store>) {
        if !self.started.swap(true, Ordering::SeqCst) {
            let follow = Follow {
                store: store.clone(),
                tx: self.tx.clone(),
                live: self.live.clone(),
                registry: self.registry.clone(),
            };
            tokio::spawn(follow.run());
        }
    }

    /// A receiver of every change, following the store from the first call on.
    pub(in crate::api) fn subscribe(&self, store: &Arc<dyn Store>) -> broadcast::Receiver<Change> {
        let rx = self.tx.subscribe();
        self.start(store);
        rx
    }

    /// Registers a waiter for `ids` (call it before reading them, so no change between the
    /// read and the wait is missed); 503 with `Retry-After` when `limits` are reached. The
    /// marks of ids no waiter watched yet are read first, so that a later coalesced read
    /// wakes the waiter only if they moved after its own read.
    pub(in crate::api) async fn register(
        &self,
        store: &Arc<dyn Store>,
        ids: &[ObjectId],
        limits: WaitLimits,
    ) -> Result<Waiter, ApiError> {
        let waiter = self.enter(store, ids, limits)?;
        let fresh: Vec<ObjectId> = {
            let r = lock(&self.registry);
            ids.iter()
                .filter(|id| r.by_id.get(id).is_some_and(|w| w.mark.is_none()))
                .copied()
                .collect()
        };
        for chunk in fresh.chunks(LOOK_CHUNK) {
            let found: HashMap<ObjectId, u64> = store.task_marks(chunk).await?.into_iter().collect();
            let mut r = lock(&self.registry);
            for id in chunk {
                if let Some(w) = r.by_id.get_mut(id) {
                    // A coalesced read that got there first compared (and woke) already.
                    if w.mark.is_none() {
                        w.mark = Some(found.get(id).copied());
                    }
                }
            }
        }
        Ok(waiter)
    }

    fn enter(&self, store: &Arc<dyn Store>, ids: &[ObjectId], limits: WaitLimits) -> Result<Waiter, ApiError> {
        let notify = Arc::new(Notify::new());
        let key = {
            let mut r = lock(&self.registry);
            if r.waiters.len() >= limits.max_waiters {
                return Err(ApiError::Busy(format!(
                    "{} waits and event streams are open on this server, its limit (max_waiters); try again shortly",
                    limits.max_waiters
                )));
            }
            if r.ids + ids.len() > limits.max_waited_ids {
                return Err(ApiError::Busy(format!(
                    "waits on this server already name {} task ids and this one names {} more, past its limit of {} (max_waited_ids); try again shortly, or wait on fewer tasks",
                    r.ids,
                    ids.len(),
                    limits.max_waited_ids
                )));
            }
            r.next += 1;
            let key = r.next;
            r.ids += ids.len();
            for id in ids {
                r.by_id.entry(*id).or_default().waiters.push(key);
            }
            r.waiters.insert(key, (notify.clone(), ids.to_vec()));
            key
        };
        self.start(store);
        Ok(Waiter {
            key,
            notify,
            registry: self.registry.clone(),
        })
    }

    /// The waiters registered now and the ids they name together.
    pub(in crate::api) fn held(&self) -> (usize, usize) {
        let r = lock(&self.registry);
        (r.waiters.len(), r.ids)
    }

    /// Whether changes are being followed now.
    pub(in crate::api) fn live(&self) -> bool {
        self.live.load(Ordering::SeqCst)
    }
}

/// The task that follows the store's changes.
struct Follow {
    store: Arc<dyn Store>,
    tx: broadcast::Sender<Change>,
    live: Arc<AtomicBool>,
    registry: Arc<Mutex<Registry>>,
}

impl Follow {
    /// Follows the store's task changes for as long as the process runs, starting again
    /// after an error; every (re)start counts as "any task changed", so a change missed in
    /// a gap is looked at.
    async fn run(self) {
        loop {
            match self.store.watch_tasks().await {
                Ok(Some(events)) => {
                    self.live.store(true, Ordering::SeqCst);
                    self.any();
                    self.follow(events).await;
                    self.live.store(false, Ordering::SeqCst);
                    let _ = self.tx.send(Change::Any);
                    // Waiters poll while not followed.
                    lock(&self.registry).wake_all();
                }
                Ok(None) => return,
                Err(e) => debug!(error = %e, "cannot follow task changes; waiters look again every 500 ms"),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    fn any(&self) {
        let _ = self.tx.send(Change::Any);
        lock(&self.registry).dirty = true;
    }

    /// Dispatches the events until they end or fail.
    async fn follow(&self, mut events: crate::store::TaskEvents) {
        let mut next_look = tokio::time::Instant::now();
        loop {
            let dirty = lock(&self.registry).dirty;
            let event = if dirty {
                tokio::select! {
                    e = events.next() => Some(e),
                    () = tokio::time::sleep_until(next_look) => None,
                }
            } else {
                Some(events.next().await)
            };
            match event {
                None => {
                    let started = tokio::time::Instant::now();
                    self.look().await;
                    next_look = tokio::time::Instant::now() + LOOK_INTERVAL.max(started.elapsed() * 4);
                }
                Some(Some(Ok(Some(id)))) => {
                    let _ = self.tx.send(Change::Task(id));
                    lock(&self.registry).wake(&id);
                }
                Some(Some(Ok(None))) => self.any(),
                Some(Some(Err(e))) => {
                    debug!(error = %e, "task notification stopped; starting it again");
                    return;
                }
                Some(None) => return,
            }
        }
    }

    /// One coalesced read of the watched tasks' marks, waking the waiters of those whose
    /// mark moved (or was not known yet).
    async fn look(&self) {
        let ids: Vec<ObjectId> = {
            let mut r = lock(&self.registry);
            r.dirty = false;
            r.by_id.keys().copied().collect()
        };
        let mut marks = HashMap::with_capacity(ids.len());
        for chunk in ids.chunks(LOOK_CHUNK) {
            match self.store.task_marks(chunk).await {
                Ok(found) => marks.extend(found),
                Err(e) => {
                    debug!(error = %e, "cannot read the watched tasks; their waiters look themselves");
                    lock(&self.registry).wake_all();
                    return;
                }
            }
        }
        let mut r = lock(&self.registry);
        let mut moved = Vec::new();
        for id in ids {
            let now = Some(marks.get(&id).copied());
            if let Some(w) = r.by_id.get_mut(&id) {
                if w.mark != now {
                    w.mark = now;
                    moved.push(id);
                }
            }
        }
        for id in &moved {
            r.wake(id);
        }
    }
}
