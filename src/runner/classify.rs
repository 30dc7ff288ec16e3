//! Turning what a plugin's `run` call returned (or how it trapped) into the task's status
//! and, when it failed, a [`Failure`] with a bounded one-line message.

use wasmtime::Trap;
use wasmtime_wasi::I32Exit;

use super::{human_bytes, limits, Failure, Sandbox, StopReason, FAILED, MAX_MESSAGE};

pub(super) fn classify(
    result: wasmtime::Result<Result<u32, String>>,
    sandbox: &Sandbox,
    refused_memory: bool,
    stopped: Option<StopReason>,
) -> (u32, Option<Failure>) {
    let memory = || Failure::Memory { limit: sandbox.memory };
    // A task stopped from outside (or whose wait was cut by its deadline) is reported as
    // such, even if the guest then returned quickly.
    match (stopped, &result) {
        (Some(StopReason::Timeout), _) => return (FAILED, Some(Failure::Timeout(sandbox.timeout))),
        // A kill that lost the race to a plugin returning success leaves that success.
        (Some(StopReason::Killed | StopReason::Stuck), Ok(Ok(status))) if *status > 0 => return (*status, None),
        (Some(r), _) => return (FAILED, Some(Failure::Trap(format!("plugin stopped: {r}")))),
        (None, _) => {}
    }
    match result {
        Ok(Ok(0)) => (FAILED, Some(Failure::NonPositiveStatus(0))),
        Ok(Ok(status)) => (status, None),
        Ok(Err(msg)) if refused_memory => (
            FAILED,
            Some(Failure::Plugin(format!(
                "{} (its memory limit of {} was reached)",
                bounded_message(&msg),
                human_bytes(sandbox.memory)
            ))),
        ),
        Ok(Err(msg)) => (FAILED, Some(Failure::Plugin(bounded_message(&msg)))),
        Err(e) => {
            let trap = e.downcast_ref::<Trap>();
            let failure = if trap == Some(&Trap::Interrupt) {
                Failure::Timeout(sandbox.timeout)
            } else if let Some(msg) = limits::cap_message(&e) {
                Failure::Trap(msg)
            } else if let Some(msg) = limits::host_limit_message(&e, sandbox.memory) {
                Failure::Trap(msg)
            } else if let Some(exit) = e.downcast_ref::<I32Exit>() {
                Failure::Trap(format!("plugin called exit({}) instead of returning a status", exit.0))
            } else if refused_memory && matches!(trap, None | Some(Trap::UnreachableCodeReached)) {
                // An instantiation refused its memory, or an allocator that could not grow
                // aborted with `unreachable`: that is the memory limit. Any other trap is
                // reported as itself.
                memory()
            } else if refused_memory {
                Failure::Trap(format!(
                    "{} (earlier, a memory growth past the limit of {} was refused)",
                    trap_message(&e),
                    human_bytes(sandbox.memory)
                ))
            } else {
                Failure::Trap(trap_message(&e))
            };
            (FAILED, Some(failure))
        }
    }
}

/// What went wrong, cause included, on one line: every message of the error's chain but
/// wasm backtraces, joined by ": ", bounded to [`MAX_MESSAGE`].
pub(super) fn trap_message(e: &wasmtime::Error) -> String {
    let parts: Vec<String> = e
        .chain()
        .map(|c| c.to_string())
        .filter(|m| !m.starts_with("error while executing at wasm backtrace"))
        .map(|m| m.lines().next().unwrap_or_default().trim().to_owned())
        .filter(|m| !m.is_empty())
        .collect();
    let mut joined = String::new();
    for p in parts {
        // A context often repeats its cause: keep each message once.
        if !joined.contains(&p) {
            if !joined.is_empty() {
                joined.push_str(": ");
            }
            joined.push_str(&p);
        }
    }
    if joined.is_empty() {
        joined = "unknown error".into();
    }
    bounded_message(&joined)
}

/// `msg` cut to [`MAX_MESSAGE`] bytes on a character boundary, saying how much was dropped.
fn bounded_message(msg: &str) -> String {
    if msg.len() <= MAX_MESSAGE {
        return msg.to_owned();
    }
    let mut end = MAX_MESSAGE;
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}… [message cut at {} bytes; {} more bytes were dropped]",
        &msg[..end],
        MAX_MESSAGE,
        msg.len() - end
    )
}
