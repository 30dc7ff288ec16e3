//! The process-wide wasmtime [`Engine`]: configuration, the epoch ticker that enforces
//! deadlines, and where the on-disk cache of compiled components lives (see [`super::cache`]).

use std::path::PathBuf;
use std::time::Duration;

use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

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

/// Builds the engine: pooling allocator sized by `opts`, falling back to on-demand
/// allocation when the pool cannot be reserved (for example under a tight `ulimit -v`).
pub(crate) fn build_engine(opts: &EngineOptions) -> Result<Engine, RunnerError> {
    let n = opts.max_instances.max(1);
    let mut pool = PoolingAllocationConfig::new();
    pool.total_component_instances(n)
        .total_core_instances(n.saturating_mul(8))
        .total_memories(n.saturating_mul(2))
        .total_tables(n.saturating_mul(4))
        .max_memory_size(MAX_MEMORY as usize)
        .linear_memory_keep_resident(2 << 20)
        .table_keep_resident(64 << 10)
        .pagemap_scan(Enabled::Auto);
    let mut cfg = base_config();
    cfg.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    match Engine::new(&cfg) {
        Ok(engine) => Ok(engine),
        Err(e) => {
            tracing::warn!(error = %e, "pooling allocator unavailable; using on-demand allocation");
            Engine::new(&base_config()).map_err(|e| RunnerError::Engine(e.to_string()))
        }
    }
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
