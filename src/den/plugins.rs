//! Where a queue's plugin comes from: a version stored in the database, fetched by digest
//! once, verified and cached; or, for a plugin the store does not have, the component
//! `<plugin_dir>/<name>.wasm`.
//!
//! A stored version is kept in memory once loaded and on disk in `<cache>/fetched/
//! <sha256>.wasm`. Bytes are only ever used after their SHA-256 was checked against the
//! digest they are named by: a cached file that does not match is deleted and fetched
//! again; bytes from the store that do not match are refused, and the queue is skipped
//! with that reason.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use tracing::{info, warn};

use crate::runner::{private_dir, write_atomically, Plugin, Runner};
use crate::store::plugins::{digest, newest, MAX_PLUGIN_BYTES};
use crate::store::{PluginRef, PluginVersion, Store};

/// The stored plugins a DEN knows of and has loaded.
pub(crate) struct StoredPlugins {
    /// Newest first, as of the last listing; `None` before the first one succeeded.
    versions: Mutex<Option<Arc<Vec<PluginVersion>>>>,
    /// Loaded versions by digest.
    loaded: Mutex<HashMap<String, Arc<Plugin>>>,
    /// Versions refused for good, by digest and push time, with the reason.
    refused: Mutex<HashMap<(String, i64), String>>,
}

/// Which component a queue runs.
pub(crate) enum Source {
    /// A version in the store.
    Stored(PluginVersion),
    /// The file in the plugin directory.
    File,
}

impl StoredPlugins {
    pub fn new() -> Self {
        StoredPlugins {
            versions: Mutex::new(None),
            loaded: Mutex::new(HashMap::new()),
            refused: Mutex::new(HashMap::new()),
        }
    }

    /// Whether the stored versions were listed once.
    pub fn listed(&self) -> bool {
        self.versions.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// Lists the stored versions again; on failure the last listing stays in use.
    pub async fn refresh(&self, store: &dyn Store) {
        let listed = match store.plugin_versions(None).await {
            Ok(v) => v,
            Err(e) if e.is_transient() => {
                warn!(error = %e, "cannot list the plugins in the store for now; using the last listing");
                return;
            }
            Err(e) => {
                // Not allowed to read them, say: run what the plugin directory has.
                warn!(error = %e, "cannot list the plugins in the store; running plugin directory files only");
                Vec::new()
            }
        };
        *self.versions.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(listed));
    }

    /// The component `plugin` names: its pinned version, else the newest stored one, else
    /// the plugin directory's file (for an unpinned name the store does not have).
    pub fn source(&self, plugin: &PluginRef) -> Result<Source, String> {
        let Some(versions) = self.versions.lock().unwrap_or_else(|e| e.into_inner()).clone() else {
            return Err("the plugins in the store could not be listed yet".into());
        };
        let found = match &plugin.pin {
            Some(pin) => versions.iter().find(|v| v.name == plugin.name && v.sha256 == *pin),
            None => newest(&versions).into_iter().find(|v| v.name == plugin.name),
        };
        match (found, &plugin.pin) {
            (Some(v), _) => Ok(Source::Stored(v.clone())),
            (None, None) => Ok(Source::File),
            (None, Some(_)) => Err(format!(
                "plugin {plugin} is not in the store (push it with disbatch push-plugin, or name a stored version)"
            )),
        }
    }

    /// The loaded component of stored version `v`: from memory, else from the disk cache
    /// (verified), else fetched from the store (verified, then cached). A version refused
    /// for good (bytes that do not match its digest, a component that does not load) is
    /// not fetched again until it is pushed again.
    pub async fn load(&self, store: &dyn Store, runner: &Runner, v: &PluginVersion) -> Result<Arc<Plugin>, String> {
        if let Some(p) = self.loaded.lock().unwrap_or_else(|e| e.into_inner()).get(&v.sha256) {
            return Ok(p.clone());
        }
        let attempt = (v.sha256.clone(), v.uploaded.timestamp_millis());
        if let Some(reason) = self.refused.lock().unwrap_or_else(|e| e.into_inner()).get(&attempt) {
            return Err(reason.clone());
        }
        let label = format!("plugin {}@sha256:{}", v.name, v.sha256);
        let dir = runner.cache_dir().map(|d| d.join("fetched"));
        let sha = v.sha256.clone();
        let cached = {
            let dir = dir.clone();
            tokio::task::spawn_blocking(move || dir.and_then(|d| read_cached(&d, &sha)))
                .await
                .map_err(|e| format!("plugin loading failed: {e}"))?
        };
        let fetched = cached.is_none();
        let bytes = match cached {
            Some(bytes) => bytes,
            None => store
                .plugin_bytes(&v.name, &v.sha256)
                .await
                .map_err(|e| format!("cannot fetch {label} from the store: {e}"))?
                .ok_or_else(|| format!("{label} is no longer in the store"))?,
        };
        let (runner, version) = (runner.clone(), v.clone());
        let loaded = tokio::task::spawn_blocking(move || prepare(&runner, &version, bytes, fetched, dir.as_deref()))
            .await
            .map_err(|e| format!("plugin loading failed: {e}"))?;
        match loaded {
            Ok(plugin) => {
                let plugin = Arc::new(plugin);
                self.loaded
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(v.sha256.clone(), plugin.clone());
                Ok(plugin)
            }
            Err(reason) => {
                self.refused
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(attempt, reason.clone());
                Err(reason)
            }
        }
    }

    /// Forgets the loaded versions no queue uses any more, and the refusals of versions no
    /// longer listed.
    pub fn retain(&self, in_use: &HashSet<String>) {
        self.loaded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|digest, _| in_use.contains(digest));
        let listed = self.versions.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(listed) = listed {
            self.refused
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|(sha, at), _| {
                    listed
                        .iter()
                        .any(|v| v.sha256 == *sha && v.uploaded.timestamp_millis() == *at)
                });
        }
    }
}

/// Checks fetched bytes against their digest (caching them when they match) and loads
/// the component; errors are final for this version.
fn prepare(
    runner: &Runner,
    v: &PluginVersion,
    bytes: Vec<u8>,
    fetched: bool,
    dir: Option<&Path>,
) -> Result<Plugin, String> {
    let label = format!("plugin {}@sha256:{}", v.name, v.sha256);
    if fetched {
        let got = digest(&bytes);
        if got != v.sha256 {
            return Err(format!(
                "{label} as stored has SHA-256 {got}: its bytes do not match its digest, refused (push the plugin again)"
            ));
        }
        info!(plugin = %v.name, sha256 = %v.sha256, bytes = bytes.len(), "fetched a plugin from the store");
        if let Some(dir) = dir {
            if let Err(e) = private_dir(dir, 0o077).and_then(|()| {
                write_atomically(&dir.join(format!("{}.wasm", v.sha256)), &[&bytes]).map_err(|e| e.to_string())
            }) {
                warn!(dir = %dir.display(), error = %e, "cannot cache a fetched plugin");
            }
        }
    }
    runner
        .load_bytes(&bytes, Path::new(&label))
        .map_err(|e| format!("{label} is not loadable: {e}"))
}

/// The cached component with digest `sha256` in `dir` when it is a regular file of at most
/// [`MAX_PLUGIN_BYTES`] whose digest matches; a file that does not match is deleted (and
/// `None` returned, so the component is fetched again). Symbolic links are not followed,
/// and a directory that is not this user's and closed to others is not used.
fn read_cached(dir: &Path, sha256: &str) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    if !crate::store::plugins::is_digest(sha256) || !dir.exists() {
        return None;
    }
    if let Err(e) = private_dir(dir, 0o077) {
        warn!("not using the cache of fetched plugins: {e}");
        return None;
    }
    let path = dir.join(format!("{sha256}.wasm"));
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() > MAX_PLUGIN_BYTES as u64 {
        warn!(path = %path.display(), "a cached plugin is not a regular file of at most 128 MiB: ignored");
        return None;
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.read_to_end(&mut bytes).ok()?;
    let got = digest(&bytes);
    if got == sha256 {
        return Some(bytes);
    }
    warn!(
        path = %path.display(),
        sha256 = %got,
        "a cached plugin does not match its digest: discarded, fetching it again"
    );
    if let Err(e) = std::fs::remove_file(&path) {
        warn!(path = %path.display(), error = %e, "cannot delete a cached plugin that does not match its digest");
    }
    None
}
