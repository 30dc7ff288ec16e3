//! The sandbox: runs a task's plugin, a WASI preview-2 component, in wasmtime.
//!
//! One [`Runner`] per process owns the wasmtime engine (pooling allocator, epoch ticker)
//! and a cache of loaded plugins. [`Runner::run`] gives every task a fresh instance with
//! its own WASI context built from a [`Sandbox`] (nothing granted by default), a memory
//! limiter, an epoch deadline and capped output streams, calls the plugin's `run` export
//! once and classifies the result into an [`Outcome`].
//!
//! `run` is synchronous and CPU-bound: async callers run it on a blocking thread.

mod bindings;
mod cache;
mod classify;
mod clock;
mod compile;
mod control;
mod egress;
mod engine;
mod fds;
mod filestreams;
mod host;
mod http;
pub mod inspect;
mod kernelfs;
mod limits;
mod outcome;
mod output;
mod quota;
mod sandbox;
mod shape;
mod sockets;
mod special;
mod submit;
mod waits;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime::{CallHook, Engine, Store, StoreContextMut, UpdateDeadline};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

pub use cache::{default_key_path, grant_conflict, protected_paths};
pub(crate) use cache::{private_dir, write_atomically};
pub use compile::{serve_compile_child, DEFAULT_COMPILE_CPU, DEFAULT_COMPILE_MEMORY};
pub use control::{RunControl, StopReason};
pub use egress::{is_internal, parse_allow as parse_network_allow};
pub use engine::{build_engine, default_cache_dir, EngineOptions, EPOCH_TICK};
pub use fds::descriptor_budget;
pub use http::{
    HttpRule, BODY_CHUNK as HTTP_BODY_CHUNK, DEFAULT_MAX_BODY as DEFAULT_HTTP_MAX_BODY,
    DEFAULT_MAX_REQUESTS as DEFAULT_HTTP_MAX_REQUESTS, FIELD_SIZE_LIMIT as HTTP_FIELD_SIZE_LIMIT,
    MAX_OPEN as HTTP_MAX_OPEN,
};
pub use limits::{
    max_handles, MAX_CORE_INSTANCES_PER_TASK, MAX_MEMORIES_PER_TASK, MAX_TABLES_PER_TASK, TABLE_ELEMENT_BYTES,
};
use limits::{Slots, TaskLimiter};
pub use outcome::{Failure, Outcome, Progress, FAILED, SUCCEEDED};
pub use output::{escape_controls, human_bytes, truncation_marker, Captured, PLUGIN_LINE_PREFIX};
pub use quota::{DEFAULT_FILE_QUOTA, DEFAULT_WRITE_QUOTA};
pub use sandbox::{DirGrant, Sandbox, DEFAULT_MEMORY, DEFAULT_OUTPUT_CAP, DEFAULT_TIMEOUT, MAX_MEMORY};
pub use shape::{
    check as check_shape, FunctionShape, Shape, MAX_COMPONENT_BYTES, MAX_FUNCTION_COST, MAX_FUNCTION_OPS,
    MAX_TOTAL_COST, MAX_TOTAL_LOCALS, MAX_TOTAL_OPS,
};
pub use submit::{
    Submission, DEFAULT_SUBMIT_DEPTH, DEFAULT_SUBMIT_MAX, MAX_SUBMIT_DEPTH, MAX_SUBMIT_MAX, MAX_SUBMIT_PARAMS,
    MAX_SUBMIT_TOTAL,
};

use bindings::PluginPre;
use classify::classify;
use output::CappedOutput;

/// How many progress reports an [`Outcome`] keeps (the most recent ones).
pub const MAX_PROGRESS: usize = 100;
/// Longest progress message kept, in bytes.
pub const MAX_PROGRESS_INFO: usize = 1024;
/// Longest failure message kept (a plugin's `err(message)`, a trap's description), in
/// bytes; the rest is dropped and the drop stated.
pub const MAX_MESSAGE: usize = 4096;

/// Failures of the host side of the runner (never caused by a task's params).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunnerError {
    /// The wasmtime engine could not be created.
    #[error("cannot create the wasmtime engine: {0}")]
    Engine(String),
    /// The plugin file could not be read.
    #[error("cannot read plugin {path}: {source}")]
    Io {
        /// The plugin file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a loadable Disbatch plugin.
    #[error("{path}: {reason}")]
    InvalidComponent {
        /// The plugin file (or the name given to [`Runner::load_bytes`]).
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

/// Called on every progress report while a task runs.
pub type ProgressSink = Arc<dyn Fn(&Progress) + Send + Sync>;

/// A loaded plugin, ready to instantiate cheaply for every task.
pub struct Plugin {
    pre: PluginPre<TaskState>,
    hash: String,
    wit: Option<String>,
    from_cache: bool,
}

impl Plugin {
    /// Hex SHA-256 of the component's bytes.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// Version of the `disbatch:plugin` interface the component imports (`0.2.0`), when it
    /// imports one: a plugin that never reports progress imports none.
    pub fn wit_version(&self) -> Option<&str> {
        self.wit.as_deref()
    }

    /// Whether the compiled code came from the on-disk cache (no compilation was needed).
    pub fn from_cache(&self) -> bool {
        self.from_cache
    }
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin").field("hash", &self.hash).finish()
    }
}

#[derive(Clone, PartialEq, Eq)]
struct FileStamp {
    len: u64,
    modified: Option<SystemTime>,
}

struct Inner {
    engine: Engine,
    linker: Linker<TaskState>,
    cache_dir: Option<PathBuf>,
    /// Limits of a compile child.
    compile_limits: compile::CompileLimits,
    loaded: Mutex<HashMap<PathBuf, (FileStamp, Arc<Plugin>)>>,
    /// One per task the instance pool is sized for.
    slots: Slots,
}

/// The plugin runner. Cheap to clone; one per process is enough.
#[derive(Clone)]
pub struct Runner {
    inner: Arc<Inner>,
}

/// Per-task host state.
struct TaskState {
    wasi: WasiCtx,
    table: ResourceTable,
    http: http::TaskHttp,
    limiter: TaskLimiter,
    /// What the task may still write into its grants.
    quota: Arc<quota::WriteQuota>,
    /// The task's account on the process's descriptor budget.
    fds: Arc<fds::TaskFds>,
    /// The descriptors the task holds, by the handle (resource rep) that holds each: given
    /// back when the plugin drops the handle (and every stream made from it) or the task
    /// ends. The grants' preopened
    /// directories are held under no handle.
    held: HashMap<u32, fds::FdToken>,
    _preopens: Vec<fds::FdToken>,
    started: Instant,
    /// Base of the guest's monotonic clock.
    clock_base: Instant,
    /// When the task's time is up.
    deadline: Instant,
    /// Cancel flag and lease, shared with whoever runs the task.
    control: RunControl,
    progress: Vec<Progress>,
    sink: Option<ProgressSink>,
    /// The follow-up tasks the plugin submitted.
    submits: submit::TaskSubmits,
}

impl TaskState {
    /// Why the task must stop now, if it must: its deadline passed (measured in wall time,
    /// not in epoch ticks), it was cancelled, or its lease lapsed.
    fn must_stop(&self) -> Option<StopReason> {
        if Instant::now() >= self.deadline {
            self.control.cancel(StopReason::Timeout);
        }
        self.control.check()
    }
}

/// The error a store's epoch callback or call hook stops a task with.
#[derive(Debug)]
struct Stopped(StopReason);

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "plugin stopped: {}", self.0)
    }
}

impl std::error::Error for Stopped {}

/// Checked at every epoch tick: stop, or run one more tick.
fn epoch_check(ctx: StoreContextMut<'_, TaskState>) -> wasmtime::Result<UpdateDeadline> {
    match ctx.data().must_stop() {
        Some(r) => Err(Stopped(r).into()),
        None => Ok(UpdateDeadline::Continue(1)),
    }
}

/// Checked before every host call: a stopped task makes no further host call.
fn host_call_check(ctx: StoreContextMut<'_, TaskState>, kind: CallHook) -> wasmtime::Result<()> {
    if matches!(kind, CallHook::CallingHost) {
        if let Some(r) = ctx.data().must_stop() {
            return Err(Stopped(r).into());
        }
    }
    Ok(())
}

impl WasiView for TaskState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl wasmtime_wasi_http::WasiHttpView for TaskState {
    fn http(&mut self) -> wasmtime_wasi_http::WasiHttpCtxView<'_> {
        wasmtime_wasi_http::WasiHttpCtxView {
            ctx: &mut self.http.ctx,
            table: &mut self.table,
            hooks: &mut self.http.hooks,
        }
    }
}

impl Runner {
    /// Creates the engine (with its epoch ticker) and the linker with WASI and the host API.
    pub fn new(opts: &EngineOptions) -> Result<Self, RunnerError> {
        let compile_limits = compile::CompileLimits::from_env().map_err(RunnerError::Engine)?;
        let engine = engine::build_engine(opts)?;
        engine::start_epoch_ticker(&engine);
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(|e| RunnerError::Engine(e.to_string()))?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_sync(&mut linker)
            .map_err(|e| RunnerError::Engine(e.to_string()))?;
        bindings::Plugin::add_to_linker::<TaskState, HasSelf<TaskState>>(&mut linker, |s| s)
            .map_err(|e| RunnerError::Engine(e.to_string()))?;
        submit::add_v01_to_linker(&mut linker).map_err(|e| RunnerError::Engine(e.to_string()))?;
        clock::add_to_linker(&mut linker).map_err(|e| RunnerError::Engine(e.to_string()))?;
        special::add_to_linker(&mut linker).map_err(|e| RunnerError::Engine(e.to_string()))?;
        waits::add_to_linker(&mut linker).map_err(|e| RunnerError::Engine(e.to_string()))?;
        Ok(Runner {
            inner: Arc::new(Inner {
                engine,
                linker,
                cache_dir: opts.cache_dir.clone(),
                compile_limits,
                loaded: Mutex::new(HashMap::new()),
                slots: Slots::new(opts.max_instances),
            }),
        })
    }

    /// The host paths this runner trusts, which no sandbox grant may reach: the component
    /// cache and its key's directory (see [`Sandbox::check_grants`]).
    pub fn protected_paths(&self) -> Vec<PathBuf> {
        protected_paths(self.inner.cache_dir.as_deref())
    }

    /// The directory of compiled components, when caching is on.
    pub fn cache_dir(&self) -> Option<&Path> {
        self.inner.cache_dir.as_deref()
    }

    /// Loads the plugin at `path`, reusing the loaded copy while the file is unchanged.
    pub fn load(&self, path: &Path) -> Result<Arc<Plugin>, RunnerError> {
        let io = |source| RunnerError::Io {
            path: path.to_owned(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        let stamp = FileStamp {
            len: meta.len(),
            modified: meta.modified().ok(),
        };
        if let Some((s, p)) = self.lock_loaded().get(path) {
            if *s == stamp {
                return Ok(p.clone());
            }
        }
        shape::check_size(meta.len()).map_err(|reason| RunnerError::InvalidComponent {
            path: path.to_owned(),
            reason,
        })?;
        let bytes = std::fs::read(path).map_err(io)?;
        let plugin = Arc::new(self.load_bytes(&bytes, path)?);
        self.lock_loaded().insert(path.to_owned(), (stamp, plugin.clone()));
        Ok(plugin)
    }

    fn lock_loaded(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, (FileStamp, Arc<Plugin>)>> {
        self.inner.loaded.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Compiles (or loads from the disk cache) a plugin from its bytes; `name` is used in
    /// error messages.
    pub fn load_bytes(&self, bytes: &[u8], name: &Path) -> Result<Plugin, RunnerError> {
        let invalid = |reason: String| RunnerError::InvalidComponent {
            path: name.to_owned(),
            reason,
        };
        shape::check_header(bytes).map_err(invalid)?;
        shape::check(bytes).map_err(invalid)?;
        let hash = cache::content_hash(bytes);
        let limits = compile::in_child().then_some(&self.inner.compile_limits);
        let (component, from_cache) = cache::compile_cached(
            &self.inner.engine,
            bytes,
            &hash,
            self.inner.cache_dir.as_deref(),
            limits,
        )
        .map_err(|e| invalid(compile::failure_reason(&e)))?;
        let instance_pre = self
            .inner
            .linker
            .instantiate_pre(&component)
            .map_err(|e| invalid(format!("imports something the host does not provide: {e:#}")))?;
        let pre = PluginPre::new(instance_pre)
            .map_err(|e| invalid(format!("does not implement the disbatch:plugin/plugin world: {e:#}")))?;
        let engine = &self.inner.engine;
        let wit = component
            .component_type()
            .imports(engine)
            .find_map(|(name, _)| name.strip_prefix("disbatch:plugin/host@").map(str::to_owned));
        Ok(Plugin {
            pre,
            hash,
            wit,
            from_cache,
        })
    }

    /// Runs one task: `params` is the task's params as JSON text.
    ///
    /// Blocks the calling thread until the plugin returns, fails or hits a limit.
    pub fn run(&self, plugin: &Plugin, params: &str, sandbox: &Sandbox, sink: Option<ProgressSink>) -> Outcome {
        self.run_controlled(plugin, params, sandbox, sink, &RunControl::new())
    }

    /// [`Runner::run`] under `control`: cancelling it (or its lease lapsing) stops the
    /// plugin at its next epoch tick or host call, whichever comes first.
    pub fn run_controlled(
        &self,
        plugin: &Plugin,
        params: &str,
        sandbox: &Sandbox,
        sink: Option<ProgressSink>,
        control: &RunControl,
    ) -> Outcome {
        let _slot = self.inner.slots.take();
        let started = Instant::now();
        let stdout = CappedOutput::new(sandbox.output_cap);
        let stderr = CappedOutput::new(sandbox.output_cap);
        let clock = clock::TaskClock { base: started };
        let fds = fds::TaskFds::new(limits::max_handles(sandbox.memory));
        let preopens: Option<Vec<_>> = sandbox.dirs.iter().map(|_| fds.take("a granted directory")).collect();
        let Some(preopens) = preopens else {
            return Outcome::not_run(Failure::Sandbox(fds.note().unwrap_or_default()));
        };
        let wasi = match sandbox.wasi_ctx(stdout.clone(), stderr.clone(), clock) {
            Ok(w) => w,
            Err(e) => return Outcome::not_run(Failure::Sandbox(e)),
        };
        let deadline = started + sandbox.timeout;
        let mut table = ResourceTable::new();
        table.set_max_capacity(limits::max_handles(sandbox.memory));
        let mut store = Store::new(
            &self.inner.engine,
            TaskState {
                wasi,
                table,
                http: http::TaskHttp::new(sandbox, deadline, control.clone(), fds.clone()),
                limiter: TaskLimiter::new(sandbox.memory),
                quota: quota::WriteQuota::new(sandbox.write_quota, sandbox.file_quota),
                fds,
                held: HashMap::new(),
                _preopens: preopens,
                started,
                clock_base: started,
                deadline,
                control: control.clone(),
                progress: Vec::new(),
                sink,
                submits: submit::TaskSubmits::new(sandbox),
            },
        );
        store.limiter(|s| &mut s.limiter);
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(epoch_check);
        store.call_hook(host_call_check);

        let result = plugin
            .pre
            .instantiate(&mut store)
            .and_then(|instance| instance.call_run(&mut store, params));
        let duration = started.elapsed();
        let state = store.into_data();
        let (status, failure) = classify(result, sandbox, state.limiter.refused, control.reason());
        drop(state.wasi);
        let mut sandbox_notes = state.http.hooks.take_notes();
        sandbox_notes.extend(state.submits.note());
        sandbox_notes.extend(state.fds.note());
        Outcome {
            status,
            stdout: stdout.take(),
            stderr: stderr.take(),
            duration,
            progress: state.progress,
            failure,
            sandbox_notes,
            submitted: state.submits.accepted,
        }
    }

    /// Loads and runs the plugin file at `path`; a file that cannot be loaded gives an
    /// outcome with [`Failure::InvalidComponent`].
    pub fn run_file(&self, path: &Path, params: &str, sandbox: &Sandbox, sink: Option<ProgressSink>) -> Outcome {
        match self.load(path) {
            Ok(plugin) => self.run(&plugin, params, sandbox, sink),
            Err(e) => Outcome::not_run(Failure::InvalidComponent(e.to_string())),
        }
    }
}
