//! Guest sleeps that end at the task's deadline.
//!
//! Epoch interruption stops guest code, but not a host call the guest is blocked in, such
//! as a `sleep` of an hour. The monotonic clock's `subscribe-duration` and
//! `subscribe-instant` are therefore redefined so no wait outlasts the task's deadline (or
//! its lease): a wait cut there stops the task (a timeout), and a stopped task's waits end
//! at once.

use std::time::{Duration, Instant};

use wasmtime::component::{Linker, Resource};
use wasmtime::StoreContextMut;
use wasmtime_wasi::p2::{subscribe, DynPollable, Pollable};
use wasmtime_wasi::HostMonotonicClock;

use super::{RunControl, StopReason, TaskState, EPOCH_TICK};

/// The interface whose subscriptions are redefined (wasmtime-wasi's version; guests built
/// against any earlier 0.2.x resolve to it).
const MONOTONIC_CLOCK: &str = "wasi:clocks/monotonic-clock@0.2.12";

/// The task's monotonic clock: nanoseconds since the task started.
pub(crate) struct TaskClock {
    pub base: Instant,
}

impl HostMonotonicClock for TaskClock {
    fn resolution(&self) -> u64 {
        1
    }

    fn now(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }
}

/// A guest wait: ends at its natural end, at the task's deadline or lease end (renewals
/// move the latter), or when the task is stopped. A wait cut short stops the task, so the
/// guest cannot return a result as if its wait had completed.
struct Sleep {
    until: Instant,
    deadline: Instant,
    control: RunControl,
}

#[wasmtime_wasi::async_trait]
impl Pollable for Sleep {
    async fn ready(&mut self) {
        tokio::select! {
            _ = tokio::time::sleep_until(self.until.into()) => {}
            _ = stopped(self.deadline, &self.control) => {}
        }
    }
}

/// Resolves when the task must stop: its deadline passed (which cancels it as a timeout),
/// its lease lapsed, or it was cancelled. Renewals that move the lease are followed.
pub(crate) async fn stopped(deadline: Instant, control: &RunControl) -> StopReason {
    loop {
        if Instant::now() >= deadline {
            control.cancel(StopReason::Timeout);
        }
        if let Some(r) = control.check() {
            return r;
        }
        let end = control.lease_until().map_or(deadline, |l| l.min(deadline));
        tokio::select! {
            _ = tokio::time::sleep_until(end.into()) => {}
            _ = control.cancelled() => {}
        }
    }
}

impl TaskState {
    /// A wait of `wait` from now, cut at the deadline or the lease end.
    fn subscribe_for(&mut self, wait: Duration) -> wasmtime::Result<Resource<DynPollable>> {
        let now = Instant::now();
        let sleep = Sleep {
            until: now.checked_add(wait).unwrap_or(self.deadline + EPOCH_TICK),
            deadline: self.deadline,
            control: self.control.clone(),
        };
        let sleep = self.table.push(sleep)?;
        subscribe(&mut self.table, sleep)
    }
}

/// Replaces the monotonic clock's subscriptions in `linker` (after WASI was added).
pub(crate) fn add_to_linker(linker: &mut Linker<TaskState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut clock = linker.instance(MONOTONIC_CLOCK)?;
    clock.func_wrap(
        "subscribe-duration",
        |mut store: StoreContextMut<'_, TaskState>, (nanos,): (u64,)| {
            Ok((store.data_mut().subscribe_for(Duration::from_nanos(nanos))?,))
        },
    )?;
    clock.func_wrap(
        "subscribe-instant",
        |mut store: StoreContextMut<'_, TaskState>, (when,): (u64,)| {
            let state = store.data_mut();
            let now = state.clock_base.elapsed().as_nanos() as u64;
            Ok((state.subscribe_for(Duration::from_nanos(when.saturating_sub(now)))?,))
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}
