//! Which queues this DEN processes, with their loaded plugin and effective sandbox, and
//! why the others are skipped (logged once per change of reason).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bson::oid::ObjectId;
use tracing::{info, warn};

use super::DenSettings;
use crate::model::Queue;
use crate::runner::{Plugin, Runner, Sandbox};
use crate::store::Slot;

/// A queue ready to run tasks here.
#[derive(Debug)]
pub(crate) struct QueueState {
    pub queue: Queue,
    pub plugin: Arc<Plugin>,
    pub sandbox: Sandbox,
}

impl QueueState {
    /// Whether a worker holding `slot` may claim another task of this queue.
    pub fn allows_slot(&self, slot: &Slot) -> bool {
        slot.queue == self.queue.id && self.queue.threads.unwrap_or(0) > slot.n
    }
}

/// The queues of the last tick.
pub(crate) struct Queues {
    plugin_dir: PathBuf,
    plugins: Vec<String>,
    active: Vec<ObjectId>,
    ignore: Vec<ObjectId>,
    defaults: Sandbox,
    /// Host paths beyond the runner's own that no grant may reach.
    protected: Vec<PathBuf>,
    current: Mutex<HashMap<ObjectId, Arc<QueueState>>>,
    skipped: Mutex<HashMap<ObjectId, String>>,
}

impl Queues {
    pub fn new(s: &DenSettings) -> Self {
        Queues {
            plugin_dir: s.plugin_dir.clone(),
            plugins: s.plugins.clone(),
            active: s.active_queues.clone(),
            ignore: s.ignore_queues.clone(),
            defaults: s.sandbox.clone(),
            protected: std::iter::once(s.plugin_dir.clone())
                .chain(s.protected.iter().cloned())
                .collect(),
            current: Mutex::new(HashMap::new()),
            skipped: Mutex::new(HashMap::new()),
        }
    }

    /// Why queues are skipped that an operator must fix (queue id in hex → reason): not
    /// those paused or not active here by configuration.
    pub fn problems(&self) -> std::collections::BTreeMap<String, String> {
        let skipped = self.skipped.lock().unwrap_or_else(|e| e.into_inner());
        skipped
            .iter()
            .filter(|(_, reason)| !is_by_choice(reason))
            .map(|(id, reason)| (id.to_hex(), reason.clone()))
            .collect()
    }

    /// The current state of a queue, if it is (still) ready.
    pub fn current(&self, id: ObjectId) -> Option<Arc<QueueState>> {
        self.current.lock().unwrap_or_else(|e| e.into_inner()).get(&id).cloned()
    }

    /// Re-evaluates all queues; returns those ready to run tasks here.
    pub async fn refresh(&self, runner: &Runner, all: Vec<Queue>) -> Vec<Arc<QueueState>> {
        let mut ready = Vec::new();
        let mut reasons = HashMap::new();
        for queue in all {
            match self.check(runner, &queue).await {
                Ok((plugin, sandbox)) => {
                    let state = match self.current(queue.id) {
                        Some(s) if s.queue == queue && Arc::ptr_eq(&s.plugin, &plugin) => s,
                        _ => Arc::new(QueueState { queue, plugin, sandbox }),
                    };
                    ready.push(state);
                }
                Err(reason) => {
                    reasons.insert(queue.id, (queue.name.clone(), reason));
                }
            }
        }
        self.log_changes(&ready, &reasons);
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) =
            ready.iter().map(|s| (s.queue.id, s.clone())).collect();
        ready
    }

    fn log_changes(&self, ready: &[Arc<QueueState>], reasons: &HashMap<ObjectId, (String, String)>) {
        let mut skipped = self.skipped.lock().unwrap_or_else(|e| e.into_inner());
        for s in ready {
            if skipped.remove(&s.queue.id).is_some() {
                info!(queue = %s.queue.name, plugin = %s.queue.plugin, "queue is ready again");
            }
        }
        for (id, (name, reason)) in reasons {
            if skipped.get(id) != Some(reason) {
                if is_by_choice(reason) {
                    info!(queue = %name, "skipping queue: {reason}");
                } else {
                    warn!(queue = %name, "skipping queue: {reason}");
                }
                skipped.insert(*id, reason.clone());
            }
        }
        skipped.retain(|id, _| reasons.contains_key(id) || ready.iter().any(|s| s.queue.id == *id));
    }

    async fn check(&self, runner: &Runner, queue: &Queue) -> Result<(Arc<Plugin>, Sandbox), String> {
        if !self.active.is_empty() {
            if !self.active.contains(&queue.id) {
                return Err("not active on this node (not in activequeues)".into());
            }
        } else if self.ignore.contains(&queue.id) {
            return Err("not active on this node (in ignorequeues)".into());
        }
        if queue.threads.unwrap_or(0) <= 0 {
            return Err("paused (threads is 0 or null)".into());
        }
        let path = self.plugin_path(&queue.plugin)?;
        let sandbox = queue.sandbox.resolve(&self.defaults)?;
        let mut protected = runner.protected_paths();
        protected.extend(self.protected.iter().cloned());
        sandbox.check_grants(&protected)?;
        let runner = runner.clone();
        let plugin = tokio::task::spawn_blocking(move || runner.load(&path))
            .await
            .map_err(|e| format!("plugin loading failed: {e}"))?
            .map_err(|e| format!("plugin {:?} is not loadable: {e}", queue.plugin))?;
        Ok((plugin, sandbox))
    }

    fn plugin_path(&self, name: &str) -> Result<PathBuf, String> {
        crate::config::plugin_file(&self.plugin_dir, &self.plugins, name)
    }
}

/// Whether a queue is skipped by the operators' choice (paused, or not active here).
fn is_by_choice(reason: &str) -> bool {
    reason.starts_with("paused") || reason.starts_with("not active")
}
