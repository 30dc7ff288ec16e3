//! The process-wide wasmtime [`Engine`]: configuration, the epoch ticker that enforces
//! deadlines, and the on-disk cache of compiled components.

use std::fs;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::limits::{MAX_CORE_INSTANCES_PER_TASK, MAX_MEMORIES_PER_TASK, MAX_TABLES_PER_TASK};
use super::sandbox::MAX_MEMORY;
use super::RunnerError;

/// How often the epoch advances; deadlines are precise to about this much.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Where compiled components are cached (`None` disables the disk cache).
    pub cache_dir: Option<PathBuf>,
    /// How many plugin instances may exist at once (pooling allocator slots).
    pub max_instances: u32,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            cache_dir: default_cache_dir(),
            max_instances: 1000,
        }
    }
}

/// `$DISBATCH_CACHE_DIR`, else `$XDG_CACHE_HOME/disbatch/components`, else
/// `~/.cache/disbatch/components`.
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DISBATCH_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("disbatch").join("components"))
}

fn base_config() -> Config {
    let mut cfg = Config::new();
    cfg.epoch_interruption(true);
    cfg.wasm_component_model(true);
    cfg
}

/// Builds the engine with a pooling allocator sized for `opts.max_instances` tasks, each at
/// its per-task caps (so tasks holding a slot never find the pool full). A pool that cannot
/// be reserved is an error naming the setting to lower; there is no fallback.
pub(crate) fn build_engine(opts: &EngineOptions) -> Result<Engine, RunnerError> {
    let n = opts.max_instances.max(1);
    let per_task = |cap: usize| n.saturating_mul(cap as u32);
    let mut pool = PoolingAllocationConfig::new();
    pool.total_component_instances(n)
        .total_core_instances(per_task(MAX_CORE_INSTANCES_PER_TASK))
        .total_memories(per_task(MAX_MEMORIES_PER_TASK))
        .total_tables(per_task(MAX_TABLES_PER_TASK))
        .max_core_instances_per_component(MAX_CORE_INSTANCES_PER_TASK as u32)
        .max_memories_per_component(MAX_MEMORIES_PER_TASK as u32)
        .max_tables_per_component(MAX_TABLES_PER_TASK as u32)
        .max_memory_size(MAX_MEMORY as usize)
        .linear_memory_keep_resident(2 << 20)
        .table_keep_resident(64 << 10)
        .pagemap_scan(Enabled::Auto);
    let mut cfg = base_config();
    cfg.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Engine::new(&cfg).map_err(|e| {
        RunnerError::Engine(format!(
            "cannot reserve the instance pool for max_instances = {n} ({} memories of up to {} each): {e:#}; \
             lower max_instances or raise the address-space limit (ulimit -v)",
            per_task(MAX_MEMORIES_PER_TASK),
            super::human_bytes(MAX_MEMORY),
        ))
    })
}

/// Starts the thread that advances the engine's epoch every [`EPOCH_TICK`]; it ends when
/// the engine is dropped.
pub(crate) fn start_epoch_ticker(engine: &Engine) {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("disbatch-epoch".into())
        .spawn(move || loop {
            std::thread::sleep(EPOCH_TICK);
            match weak.upgrade() {
                Some(engine) => engine.increment_epoch(),
                None => break,
            }
        })
        .expect("spawn epoch ticker thread");
}

/// Number of epoch ticks covering `timeout` (at least one).
pub(crate) fn deadline_ticks(timeout: Duration) -> u64 {
    let tick = EPOCH_TICK.as_nanos();
    (timeout.as_nanos().div_ceil(tick) as u64).max(1)
}

struct ShaHasher(Sha256);

impl Hasher for ShaHasher {
    fn finish(&self) -> u64 {
        0
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

/// Hex SHA-256 of a component's bytes.
pub(crate) fn content_hash(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The cache file of a component: keyed by its content hash and the engine's
/// compatibility hash, so a wasmtime upgrade or a config change never loads a stale artifact.
fn cache_path(engine: &Engine, dir: &Path, hash: &str) -> PathBuf {
    let mut h = ShaHasher(Sha256::new());
    engine.precompile_compatibility_hash().hash(&mut h);
    let engine_key = hex::encode(&h.0.finalize()[..8]);
    dir.join(format!("{hash}-{engine_key}.cwasm"))
}

/// Whether `dir` is a directory we may trust with executable artifacts: owned by us and
/// writable by nobody else. Creates it (mode 0700) when missing.
fn trusted_cache_dir(dir: &Path) -> Result<(), String> {
    if !dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let meta = fs::metadata(dir).map_err(|e| format!("cannot stat {}: {e}", dir.display()))?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if !meta.is_dir() || meta.uid() != me || meta.permissions().mode() & 0o022 != 0 {
        return Err(format!(
            "{} is not a directory owned by this user and closed to others",
            dir.display()
        ));
    }
    Ok(())
}

/// Compiles `bytes`, or loads the compiled artifact from the cache directory; the flag
/// tells whether it came from the cache.
pub(crate) fn compile_cached(
    engine: &Engine,
    bytes: &[u8],
    hash: &str,
    cache_dir: Option<&Path>,
) -> Result<(Component, bool), wasmtime::Error> {
    let dir = match cache_dir.map(|d| (d, trusted_cache_dir(d))) {
        Some((d, Ok(()))) => Some(d),
        Some((_, Err(why))) => {
            tracing::warn!("component cache disabled: {why}");
            None
        }
        None => None,
    };
    let Some(dir) = dir else {
        return Ok((Component::new(engine, bytes)?, false));
    };
    let path = cache_path(engine, dir, hash);
    if path.is_file() {
        // SAFETY: the artifact was written by `Component::serialize` of an engine with the same
        // compatibility hash, into a directory only this user can write.
        match unsafe { Component::deserialize_file(engine, &path) } {
            Ok(c) => return Ok((c, true)),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "discarding unusable cached component");
                let _ = fs::remove_file(&path);
            }
        }
    }
    let component = Component::new(engine, bytes)?;
    if let Err(e) = write_atomically(&path, &component.serialize()?) {
        tracing::warn!(path = %path.display(), error = %e, "cannot cache compiled component");
    }
    Ok((component, false))
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut f = fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_round_up_to_whole_ticks() {
        assert_eq!(deadline_ticks(Duration::from_millis(1)), 1);
        assert_eq!(deadline_ticks(Duration::from_millis(10)), 1);
        assert_eq!(deadline_ticks(Duration::from_millis(11)), 2);
        assert_eq!(deadline_ticks(Duration::from_secs(1)), 100);
    }

    #[test]
    fn cache_dir_must_be_private() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("c");
        trusted_cache_dir(&dir).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(trusted_cache_dir(&dir).unwrap_err().contains("closed to others"));
    }
}
