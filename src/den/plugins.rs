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
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tracing::{info, warn};

use crate::runner::{Plugin, Runner};
use crate::store::plugins::{digest, newest};
use crate::store::{PluginRef, PluginVersion, Store};

/// The stored plugins a DEN knows of and has loaded.
pub(crate) struct StoredPlugins {
    /// Newest first, as of the last listing; `None` before the first one succeeded.
    versions: Mutex<Option<Arc<Vec<PluginVersion>>>>,
    /// Loaded versions by digest.
    loaded: Mutex<HashMap<String, Arc<Plugin>>>,
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
        }
    }

    /// Whether the stored versions were listed once.
    pub fn listed(&self) -> bool {
        self.versions.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// Lists the stored versions again; on failure the last listing stays in use.
    pub async fn refresh(&self, store: &dyn Store) {
        match store.plugin_versions(None).await {
            Ok(v) => *self.versions.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(v)),
            Err(e) => warn!(error = %e, "cannot list the plugins in the store; using the last listing"),
        }
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
    /// (verified), else fetched from the store (verified, then cached).
    pub async fn load(&self, store: &dyn Store, runner: &Runner, v: &PluginVersion) -> Result<Arc<Plugin>, String> {
        if let Some(p) = self.loaded.lock().unwrap_or_else(|e| e.into_inner()).get(&v.sha256) {
            return Ok(p.clone());
        }
        let label = format!("plugin {}@sha256:{}", v.name, v.sha256);
        let cached = runner.cache_dir().map(|d| component_path(d, &v.sha256));
        let bytes = match cached.as_deref().and_then(|path| read_verified(path, &v.sha256)) {
            Some(bytes) => bytes,
            None => {
                let bytes = store
                    .plugin_bytes(&v.name, &v.sha256)
                    .await
                    .map_err(|e| format!("cannot fetch {label} from the store: {e}"))?
                    .ok_or_else(|| format!("{label} is no longer in the store"))?;
                let got = digest(&bytes);
                if got != v.sha256 {
                    return Err(format!(
                        "{label} as stored has SHA-256 {got}: its bytes do not match its digest, refused (push the plugin again)"
                    ));
                }
                info!(plugin = %v.name, sha256 = %v.sha256, bytes = bytes.len(), "fetched a plugin from the store");
                if let Some(path) = &cached {
                    if let Err(e) = write_atomically(path, &bytes) {
                        warn!(path = %path.display(), error = %e, "cannot cache a fetched plugin");
                    }
                }
                bytes
            }
        };
        let runner = runner.clone();
        let name = PathBuf::from(&label);
        let plugin = tokio::task::spawn_blocking(move || runner.load_bytes(&bytes, &name))
            .await
            .map_err(|e| format!("plugin loading failed: {e}"))?
            .map_err(|e| format!("{label} is not loadable: {e}"))?;
        let plugin = Arc::new(plugin);
        self.loaded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(v.sha256.clone(), plugin.clone());
        Ok(plugin)
    }

    /// Forgets the loaded versions no queue uses any more.
    pub fn retain(&self, in_use: &HashSet<String>) {
        self.loaded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|digest, _| in_use.contains(digest));
    }
}

/// The cache file of the component with digest `sha256`.
pub fn component_path(cache_dir: &Path, sha256: &str) -> PathBuf {
    cache_dir.join("fetched").join(format!("{sha256}.wasm"))
}

/// The cached component at `path` when its digest is `sha256`; a file that does not match
/// is deleted (and `None` returned, so the component is fetched again).
fn read_verified(path: &Path, sha256: &str) -> Option<Vec<u8>> {
    let bytes = std::fs::read(path).ok()?;
    let got = digest(&bytes);
    if got == sha256 {
        return Some(bytes);
    }
    warn!(
        path = %path.display(),
        sha256 = %got,
        "a cached plugin does not match its digest: discarded, fetching it again"
    );
    if let Err(e) = std::fs::remove_file(path) {
        warn!(path = %path.display(), error = %e, "cannot delete a cached plugin that does not match its digest");
    }
    None
}

/// Writes `bytes` to `path` through a temporary file renamed into place, so a reader sees
/// the whole file or none.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile_in(dir)?;
    tmp.1.write_all(bytes)?;
    tmp.1.sync_all()?;
    std::fs::rename(&tmp.0, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp.0);
    })
}

fn tempfile_in(dir: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    use std::os::unix::fs::OpenOptionsExt;
    let name = dir.join(format!(
        ".fetch-{}-{}",
        std::process::id(),
        bson::oid::ObjectId::new().to_hex()
    ));
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&name)?;
    Ok((name, file))
}
