//! Which queues this DEN processes, with their loaded plugin and effective sandbox, and
//! why the others are skipped (logged once per change of reason).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bson::oid::ObjectId;
use tracing::{info, warn};

use super::plugins::{Source, StoredPlugins};
use super::DenSettings;
use crate::model::Queue;
use crate::runner::{Plugin, Runner, Sandbox};
use crate::store::{PluginRef, Slot, Store};

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
        slot.queue == self.queue.id && self.queue.limit() > slot.n
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
    /// The plugins in the store.
    stored: StoredPlugins,
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
            stored: StoredPlugins::new(),
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

    /// Re-evaluates all queues; returns those ready to run tasks here. `list_plugins` lists
    /// the plugins in the store again (else the last listing is used).
    pub async fn refresh(
        &self,
        store: &dyn Store,
        runner: &Runner,
        all: Vec<Queue>,
        list_plugins: bool,
    ) -> Vec<Arc<QueueState>> {
        if list_plugins || !self.stored.listed() {
            self.stored.refresh(store).await;
        }
        let mut ready = Vec::new();
        let mut reasons = HashMap::new();
        for queue in all {
            match self.check(store, runner, &queue).await {
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
        self.stored
            .retain(&ready.iter().map(|s| s.plugin.hash().to_owned()).collect());
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

    async fn check(&self, store: &dyn Store, runner: &Runner, queue: &Queue) -> Result<(Arc<Plugin>, Sandbox), String> {
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
        let plugin = PluginRef::parse(&queue.plugin)?;
        let path = self.plugin_path(&plugin.name)?;
        let sandbox = queue.sandbox.resolve(&self.defaults)?;
        let mut protected = runner.protected_paths();
        protected.extend(self.protected.iter().cloned());
        sandbox.check_grants(&protected)?;
        let loaded = match self.stored.source(&plugin)? {
            Source::Stored(version) => self.stored.load(store, runner, &version).await?,
            Source::File => {
                let runner = runner.clone();
                tokio::task::spawn_blocking(move || runner.load(&path))
                    .await
                    .map_err(|e| format!("plugin loading failed: {e}"))?
                    .map_err(|e| format!("plugin {:?} is not loadable: {e}", queue.plugin))?
            }
        };
        Ok((loaded, sandbox))
    }

    fn plugin_path(&self, name: &str) -> Result<PathBuf, String> {
        crate::config::plugin_file(&self.plugin_dir, &self.plugins, name)
    }
}

/// Whether a queue is skipped by the operators' choice (paused, or not active here).
fn is_by_choice(reason: &str) -> bool {
    reason.starts_with("paused") || reason.starts_with("not active")
}
