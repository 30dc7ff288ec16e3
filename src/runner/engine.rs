//! The process-wide wasmtime [`Engine`]: configuration, the epoch ticker that enforces
//! deadlines, and where the on-disk cache of compiled components lives (see [`super::cache`]).

use std::path::PathBuf;
use std::time::Duration;

use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::limits::{MAX_CORE_INSTANCES_PER_TASK, MAX_MEMORIES_PER_TASK, MAX_TABLES_PER_TASK};
use super::RunnerError;
use crate::sandbox_spec::MAX_MEMORY;

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

/// What decides the compiled code: the one configuration a compile child
/// ([`super::compile`]) and this process's engine share, so that the child's artifacts
/// deserialize here. The instance allocator added by [`build_engine`] does not change the
/// code.
pub(crate) fn compile_config() -> Config {
    let mut cfg = Config::new();
    cfg.epoch_interruption(true);
    cfg.wasm_component_model(true);
    cfg
}

/// Builds the engine with a pooling allocator sized for `opts.max_instances` tasks, each at
/// its per-task caps (so tasks holding a slot never find the pool full). A pool that cannot
/// be reserved is an error naming the setting to lower; there is no fallback.
///
/// [`Runner::new`](super::Runner::new) builds its engine here (and starts the epoch ticker
/// on it); public so that an engine with the runner's exact settings can be had without a
/// `Runner`, e.g. to time bare wasmtime against [`Runner::run`](super::Runner::run).
pub fn build_engine(opts: &EngineOptions) -> Result<Engine, RunnerError> {
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
    let mut cfg = compile_config();
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
#[cfg(test)]
pub(crate) fn deadline_ticks(timeout: Duration) -> u64 {
    let tick = EPOCH_TICK.as_nanos();
    (timeout.as_nanos().div_ceil(tick) as u64).max(1)
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
}
