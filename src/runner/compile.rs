//! Compiling a component in a child process under limits.
//!
//! The shape check ([`super::shape`]) refuses what is known to be costly, but it is a
//! heuristic, and Cranelift cannot be interrupted. So a binary that calls
//! [`serve_compile_child`] first thing in `main` (`den`, `disbatch`, `runner`) compiles
//! every component in a child: the same executable (`/proc/self/exe`, so an upgrade of the
//! file on disk does not matter) started with a hidden first argument, reading the component
//! on its stdin and writing wasmtime's precompiled artifact on its stdout, with an engine of
//! the same configuration ([`super::engine::compile_config`]). The child runs under
//! `RLIMIT_DATA` (its heap: [`DEFAULT_COMPILE_MEMORY`]), `RLIMIT_CPU`
//! ([`DEFAULT_COMPILE_CPU`]) and a wall-clock deadline (four times the CPU limit) after
//! which it is killed; it dies with its parent (`PR_SET_PDEATHSIG`) and leaves no core file.
//! Its artifact comes back over a pipe only this process holds, so the parent may trust it
//! as its own compiler's output: it deserializes it and seals it into the cache
//! ([`super::cache`]) like one it compiled itself.
//!
//! Processes that never call [`serve_compile_child`] (a library user, an in-process test)
//! compile in-process, bounded by the shape check alone.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use wasmtime::Engine;

use super::shape::MAX_COMPONENT_BYTES;

/// The hidden first argument that makes a binary a compile child.
const CHILD_ARG: &str = "__disbatch-compile-component";
/// Default heap (`RLIMIT_DATA`) of a compile child: 4 GiB.
pub const DEFAULT_COMPILE_MEMORY: u64 = 4 << 30;
/// Default CPU time (`RLIMIT_CPU`, all its threads together) of a compile child: 120 s.
pub const DEFAULT_COMPILE_CPU: Duration = Duration::from_secs(120);
/// The environment variable overriding [`DEFAULT_COMPILE_MEMORY`], in MiB.
pub const MEMORY_VAR: &str = "DISBATCH_COMPILE_MEMORY_MIB";
/// The environment variable overriding [`DEFAULT_COMPILE_CPU`], in seconds.
pub const CPU_VAR: &str = "DISBATCH_COMPILE_CPU_SECS";
/// How much of the child's stderr is kept for the error message.
const STDERR_KEPT: u64 = 2048;

/// Whether this process compiles in a child.
static IN_CHILD: AtomicBool = AtomicBool::new(false);

/// First thing in a binary's `main`: when this process was started as a compile child, it
/// compiles the component on its stdin and exits; otherwise it makes this process compile
/// every component in such a child from now on.
pub fn serve_compile_child() {
    if std::env::args_os().nth(1).as_deref() == Some(OsStr::new(CHILD_ARG)) {
        std::process::exit(child_main());
    }
    IN_CHILD.store(true, Ordering::Relaxed);
}

/// Whether this process compiles in a child.
pub(crate) fn in_child() -> bool {
    IN_CHILD.load(Ordering::Relaxed)
}

/// The limits a compile child runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CompileLimits {
    /// Its heap (`RLIMIT_DATA`), in bytes.
    pub memory: u64,
    /// Its CPU time (`RLIMIT_CPU`).
    pub cpu: Duration,
}

impl CompileLimits {
    /// The defaults, or the values of [`MEMORY_VAR`] and [`CPU_VAR`] when set; a bad value
    /// is an error naming the variable.
    pub(crate) fn from_env() -> Result<CompileLimits, String> {
        CompileLimits::from_vars(|var| std::env::var_os(var))
    }

    /// [`CompileLimits::from_env`] with the variables read by `get`.
    fn from_vars(get: impl Fn(&str) -> Option<std::ffi::OsString>) -> Result<CompileLimits, String> {
        let read = |var: &str, min: u64| -> Result<Option<u64>, String> {
            let Some(v) = get(var) else { return Ok(None) };
            let Some(v) = v.to_str() else {
                return Err(format!("{var} is not valid UTF-8"));
            };
            if v.trim().is_empty() {
                return Ok(None);
            }
            match v.trim().parse::<u64>() {
                Ok(n) if n >= min && n <= 1 << 20 => Ok(Some(n)),
                _ => Err(format!("{var}={v:?} is not a whole number from {min} to {}", 1 << 20)),
            }
        };
        Ok(CompileLimits {
            memory: read(MEMORY_VAR, 64)?.map_or(DEFAULT_COMPILE_MEMORY, |mib| mib << 20),
            cpu: read(CPU_VAR, 1)?.map_or(DEFAULT_COMPILE_CPU, Duration::from_secs),
        })
    }

    /// When the child is killed whatever it is doing: four times its CPU time, since a
    /// loaded machine gives it less than a core.
    fn wall(&self) -> Duration {
        self.cpu * 4
    }
}

/// Why compiling in a child failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ChildError {
    /// The component is not valid (wasmtime's message).
    #[error("{0}")]
    Invalid(String),
    /// The compilation went past a limit, or the child failed.
    #[error("{0}")]
    Limit(String),
}

/// The reason a failed compilation gives: a child's limit as it is, anything else as an
/// invalid component.
pub(crate) fn failure_reason(e: &wasmtime::Error) -> String {
    match e.downcast_ref::<ChildError>() {
        Some(ChildError::Limit(why)) => why.clone(),
        Some(ChildError::Invalid(why)) => format!("not a valid component: {why}"),
        // The instance pool refuses, when the component is loaded, one that a task could
        // not instantiate within its caps of core instances, memories and tables.
        None => super::limits::cap_message(e)
            .unwrap_or_else(|| format!("not a valid component: {}", super::classify::trap_message(e))),
    }
}

/// Compiles `bytes` in a child under `limits`; the artifact for `Component::deserialize`.
pub(crate) fn compile_in_child(bytes: &[u8], limits: &CompileLimits) -> Result<Vec<u8>, ChildError> {
    let failed = |what: String| ChildError::Limit(format!("cannot compile in a child process: {what}"));
    // Never above what this process may have: raising a hard limit is not allowed.
    let memory = limits.memory.min(hard_limit(libc::RLIMIT_DATA));
    let cpu = limits
        .cpu
        .as_secs()
        .max(1)
        .min(hard_limit(libc::RLIMIT_CPU).saturating_sub(1));
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg(CHILD_ARG)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: the closure only calls async-signal-safe functions (setrlimit, prctl).
    unsafe {
        cmd.pre_exec(move || {
            let set = |resource, soft: u64, hard: u64| {
                let lim = libc::rlimit {
                    rlim_cur: soft,
                    rlim_max: hard,
                };
                if libc::setrlimit(resource, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            };
            set(libc::RLIMIT_DATA, memory, memory)?;
            set(libc::RLIMIT_CPU, cpu, cpu.saturating_add(1))?;
            set(libc::RLIMIT_CORE, 0, 0)?;
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| failed(format!("cannot start it: {e}")))?;
    let pid = child.id() as libc::pid_t;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let wall = limits.wall();
    let (output, err_text, timed_out) = std::thread::scope(|s| {
        // A child that dies early closes the pipe: the write fails and the status says why.
        s.spawn(move || {
            let _ = stdin.write_all(bytes);
        });
        let errs = s.spawn(move || {
            let mut kept = Vec::new();
            let _ = (&mut stderr).take(STDERR_KEPT).read_to_end(&mut kept);
            let _ = std::io::copy(&mut stderr, &mut std::io::sink());
            String::from_utf8_lossy(&kept).into_owned()
        });
        let watchdog = s.spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(wall) {
                // SAFETY: the child is not reaped before this thread is joined, so `pid`
                // is still this child's.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                return true;
            }
            false
        });
        // The artifact cannot be larger than the heap it was built in.
        let mut output = Vec::new();
        let read = (&mut stdout).take(memory).read_to_end(&mut output);
        drop(stdout);
        drop(stop);
        let timed_out = watchdog.join().unwrap_or(false);
        let err_text = errs.join().unwrap_or_default();
        (read.map(|_| output), err_text, timed_out)
    });
    let status = child.wait().map_err(|e| failed(format!("cannot wait for it: {e}")))?;
    let limit_hit = |what: String| ChildError::Limit(format!("{what} (retrying cannot help)"));
    if timed_out {
        return Err(ChildError::Limit(format!(
            "compiling it took longer than {} s, the limit (four times the {cpu} s of CPU time a compilation may use, \
             {CPU_VAR}; retrying may help when the host is less loaded)",
            wall.as_secs()
        )));
    }
    match status.signal() {
        Some(libc::SIGXCPU) => {
            return Err(limit_hit(format!(
                "compiling it used more than {cpu} s of CPU time, the limit ({CPU_VAR})"
            )))
        }
        Some(libc::SIGKILL) => {
            return Err(failed(
                "it was killed (SIGKILL), perhaps by the system when short of memory; retrying may help".into(),
            ))
        }
        Some(_) if err_text.contains("memory allocation of") => {
            return Err(limit_hit(format!(
                "compiling it needed more than {} MiB of memory, the limit ({MEMORY_VAR})",
                memory >> 20
            )))
        }
        _ => {}
    }
    let output = output.map_err(|e| failed(format!("cannot read its answer: {e}")))?;
    match output.split_first() {
        Some((b'0', artifact)) if status.success() => Ok(artifact.to_vec()),
        Some((b'1', message)) if status.success() => {
            Err(ChildError::Invalid(String::from_utf8_lossy(message).into_owned()))
        }
        _ => Err(failed(format!(
            "it ended with {status} without an answer: {}",
            err_text.lines().next().unwrap_or("no message")
        ))),
    }
}

/// The hard limit of `resource` for this process (`RLIM_INFINITY` when unknown).
fn hard_limit(resource: libc::__rlimit_resource_t) -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: getrlimit only writes the struct it is given.
    if unsafe { libc::getrlimit(resource, &mut lim) } != 0 {
        return libc::RLIM_INFINITY;
    }
    lim.rlim_max
}

/// The compile child: the component on stdin, `0` and the artifact or `1` and wasmtime's
/// message on stdout; the exit code.
fn child_main() -> i32 {
    let mut bytes = Vec::new();
    if let Err(e) = std::io::stdin()
        .take(MAX_COMPONENT_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
    {
        eprintln!("cannot read the component: {e}");
        return 1;
    }
    let engine = match Engine::new(&super::engine::compile_config()) {
        Ok(engine) => engine,
        Err(e) => {
            eprintln!("cannot create the wasmtime engine: {e:#}");
            return 1;
        }
    };
    let compiled = engine.precompile_component(&bytes);
    drop(bytes);
    let message;
    let (tag, answer): (&[u8], &[u8]) = match &compiled {
        Ok(artifact) => (b"0", artifact),
        Err(e) => {
            message = super::classify::trap_message(e);
            (b"1", message.as_bytes())
        }
    };
    let mut out = std::io::stdout().lock();
    match out
        .write_all(tag)
        .and_then(|_| out.write_all(answer))
        .and_then(|_| out.flush())
    {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("cannot write the artifact: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_come_from_the_environment_or_the_defaults() {
        let limits = |vars: &[(&str, &str)]| {
            let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            CompileLimits::from_vars(move |var| vars.iter().find(|(k, _)| k == var).map(|(_, v)| v.into()))
        };
        let d = limits(&[]).unwrap();
        assert_eq!((d.memory, d.cpu), (DEFAULT_COMPILE_MEMORY, DEFAULT_COMPILE_CPU));
        let l = limits(&[(MEMORY_VAR, "512"), (CPU_VAR, "7")]).unwrap();
        assert_eq!((l.memory, l.cpu), (512 << 20, Duration::from_secs(7)));
        assert_eq!(limits(&[(MEMORY_VAR, " ")]).unwrap().memory, DEFAULT_COMPILE_MEMORY);
        assert!(limits(&[(MEMORY_VAR, "lots")]).unwrap_err().contains(MEMORY_VAR));
        assert!(limits(&[(CPU_VAR, "0")]).unwrap_err().contains(CPU_VAR));
    }
}
