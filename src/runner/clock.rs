//! Guest sleeps that end at the task's deadline.
//!
//! Epoch interruption stops guest code, but not a host call the guest is blocked in, such
//! as a `sleep` of an hour. The monotonic clock's `subscribe-duration` and
//! `subscribe-instant` are therefore redefined so no wait outlasts the task's deadline: the
//! guest wakes at the deadline and the epoch check interrupts it right after.

use std::time::{Duration, Instant};

use wasmtime::component::{Linker, Resource, ResourceTable};
use wasmtime::StoreContextMut;
use wasmtime_wasi::p2::{subscribe, DynPollable, Pollable};
use wasmtime_wasi::HostMonotonicClock;

use super::{TaskState, EPOCH_TICK};

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

/// A wait until a host instant.
struct Sleep(tokio::time::Instant);

#[wasmtime_wasi::async_trait]
impl Pollable for Sleep {
    async fn ready(&mut self) {
        tokio::time::sleep_until(self.0).await;
    }
}

fn subscribe_for(table: &mut ResourceTable, wait: Duration) -> wasmtime::Result<Resource<DynPollable>> {
    let sleep = table.push(Sleep(tokio::time::Instant::now() + wait))?;
    subscribe(table, sleep)
}

impl TaskState {
    /// `wait`, cut to end one epoch tick after the deadline.
    fn clamp_wait(&self, wait: Duration) -> Duration {
        let left = self.deadline.saturating_duration_since(Instant::now()) + EPOCH_TICK;
        wait.min(left)
    }
}

/// Replaces the monotonic clock's subscriptions in `linker` (after WASI was added).
pub(crate) fn add_to_linker(linker: &mut Linker<TaskState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut clock = linker.instance(MONOTONIC_CLOCK)?;
    clock.func_wrap(
        "subscribe-duration",
        |mut store: StoreContextMut<'_, TaskState>, (nanos,): (u64,)| {
            let state = store.data_mut();
            let wait = state.clamp_wait(Duration::from_nanos(nanos));
            Ok((subscribe_for(&mut state.table, wait)?,))
        },
    )?;
    clock.func_wrap(
        "subscribe-instant",
        |mut store: StoreContextMut<'_, TaskState>, (when,): (u64,)| {
            let state = store.data_mut();
            let now = state.clock_base.elapsed().as_nanos() as u64;
            let wait = state.clamp_wait(Duration::from_nanos(when.saturating_sub(now)));
            Ok((subscribe_for(&mut state.table, wait)?,))
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}
