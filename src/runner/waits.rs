//! Blocking host calls that end when the task must stop.
//!
//! Epoch interruption stops guest code, not a host call the guest is blocked in. Besides
//! sleeps (see [`super::clock`]), a guest can block on anything it can wait for: a socket
//! that never answers, an HTTP response that never comes, a request body nobody reads.
//! Every blocking call of `wasi:io` (`poll`, `pollable.block`, the streams' `blocking-*`
//! methods, and dropping a stream, which waits for a socket's pending write) is therefore
//! redefined to race the task's deadline, lease and cancel flag: when
//! one of them comes first, the call traps with the reason and the task stops, within
//! about an epoch tick of its deadline whatever it was waiting for.

use std::future::Future;

use wasmtime::component::{Linker, Resource, ResourceType};
use wasmtime::StoreContextMut;
use wasmtime_wasi::p2::DynPollable;
use wasmtime_wasi::runtime::in_tokio;
use wasmtime_wasi_io::bindings::wasi::io::poll::{Host as _, HostPollable as _};
use wasmtime_wasi_io::bindings::wasi::io::streams::{
    Host as _, HostInputStream, HostOutputStream, StreamError as WitStreamError,
};
use wasmtime_wasi_io::streams::{DynInputStream, DynOutputStream, StreamError};

use super::{clock, Stopped, TaskState};

/// The interfaces whose blocking calls are redefined (wasmtime-wasi's versions; guests
/// built against any earlier 0.2.x resolve to them).
const POLL: &str = "wasi:io/poll@0.2.12";
const STREAMS: &str = "wasi:io/streams@0.2.12";

/// Runs `op` on the WASI runtime until it finishes or the task must stop.
fn bounded<R>(
    store: &mut StoreContextMut<'_, TaskState>,
    op: impl FnOnce(&mut wasmtime::component::ResourceTable) -> std::pin::Pin<Box<dyn Future<Output = R> + Send + '_>>,
) -> wasmtime::Result<R> {
    let state = store.data_mut();
    let (deadline, control) = (state.deadline, state.control.clone());
    in_tokio(async {
        tokio::select! {
            biased;
            r = op(&mut state.table) => Ok(r),
            reason = clock::stopped(deadline, &control) => Err(Stopped(reason).into()),
        }
    })
}

/// A stream call's result as the guest sees it: a stream error becomes the WIT variant, a
/// trap stays a trap.
fn lower<T>(
    store: &mut StoreContextMut<'_, TaskState>,
    r: Result<T, StreamError>,
) -> wasmtime::Result<(Result<T, WitStreamError>,)> {
    match r {
        Ok(v) => Ok((Ok(v),)),
        Err(e) => Ok((Err(store.data_mut().table.convert_stream_error(e)?),)),
    }
}

/// Replaces the blocking calls of `wasi:io/poll` and `wasi:io/streams` in `linker` (after
/// WASI was added).
pub(crate) fn add_to_linker(linker: &mut Linker<TaskState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut poll = linker.instance(POLL)?;
    poll.func_wrap(
        "poll",
        |mut store: StoreContextMut<'_, TaskState>, (list,): (Vec<Resource<DynPollable>>,)| {
            let ready = bounded(&mut store, |t| Box::pin(t.poll(list)))??;
            Ok((ready,))
        },
    )?;
    poll.func_wrap(
        "[method]pollable.block",
        |mut store: StoreContextMut<'_, TaskState>, (p,): (Resource<DynPollable>,)| {
            bounded(&mut store, |t| Box::pin(t.block(p)))??;
            Ok(())
        },
    )?;
    let mut streams = linker.instance(STREAMS)?;
    // Dropping a TCP stream waits for its pending write, which a peer that never reads
    // never lets finish.
    streams.resource(
        "output-stream",
        ResourceType::host::<DynOutputStream>(),
        |mut store: StoreContextMut<'_, TaskState>, rep| {
            let s = Resource::<DynOutputStream>::new_own(rep);
            bounded(&mut store, |t| Box::pin(HostOutputStream::drop(t, s)))?
        },
    )?;
    streams.resource(
        "input-stream",
        ResourceType::host::<DynInputStream>(),
        |mut store: StoreContextMut<'_, TaskState>, rep| {
            let s = Resource::<DynInputStream>::new_own(rep);
            bounded(&mut store, |t| Box::pin(HostInputStream::drop(t, s)))?
        },
    )?;
    streams.func_wrap(
        "[method]input-stream.blocking-read",
        |mut store: StoreContextMut<'_, TaskState>, (s, len): (Resource<DynInputStream>, u64)| {
            let r = bounded(&mut store, |t| Box::pin(t.blocking_read(s, len)))?;
            lower(&mut store, r)
        },
    )?;
    streams.func_wrap(
        "[method]input-stream.blocking-skip",
        |mut store: StoreContextMut<'_, TaskState>, (s, len): (Resource<DynInputStream>, u64)| {
            let r = bounded(&mut store, |t| Box::pin(t.blocking_skip(s, len)))?;
            lower(&mut store, r)
        },
    )?;
    streams.func_wrap(
        "[method]output-stream.blocking-write-and-flush",
        |mut store: StoreContextMut<'_, TaskState>, (s, bytes): (Resource<DynOutputStream>, Vec<u8>)| {
            let r = bounded(&mut store, |t| Box::pin(t.blocking_write_and_flush(s, bytes)))?;
            lower(&mut store, r)
        },
    )?;
    streams.func_wrap(
        "[method]output-stream.blocking-write-zeroes-and-flush",
        |mut store: StoreContextMut<'_, TaskState>, (s, len): (Resource<DynOutputStream>, u64)| {
            let r = bounded(&mut store, |t| Box::pin(t.blocking_write_zeroes_and_flush(s, len)))?;
            lower(&mut store, r)
        },
    )?;
    streams.func_wrap(
        "[method]output-stream.blocking-flush",
        |mut store: StoreContextMut<'_, TaskState>, (s,): (Resource<DynOutputStream>,)| {
            let r = bounded(&mut store, |t| Box::pin(t.blocking_flush(s)))?;
            lower(&mut store, r)
        },
    )?;
    streams.func_wrap(
        "[method]output-stream.blocking-splice",
        |mut store: StoreContextMut<'_, TaskState>,
         (dst, src, len): (Resource<DynOutputStream>, Resource<DynInputStream>, u64)| {
            let r = bounded(&mut store, |t| Box::pin(t.blocking_splice(dst, src, len)))?;
            lower(&mut store, r)
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}
