//! The streams made from an open file hold its descriptor, and so its place in the
//! process's descriptor budget (see [`super::fds`]).
//!
//! `read-via-stream`, `write-via-stream` and `append-via-stream` each keep their own
//! handle on the open file, and the plugin may drop the file's handle while a stream
//! lives: the descriptor stays open. So each stream is wrapped to carry a clone of the
//! file's [`FdToken`]; the descriptor's place is given back when the last of the file's
//! handle and its streams is dropped (or the task ends). `read-via-stream` is redefined
//! here; the two writing streams are already wrapped for the write quota (see
//! [`super::quota`]), whose wrapper holds the token too.

use bytes::Bytes;
use wasmtime::component::{Linker, Resource};
use wasmtime::StoreContextMut;
use wasmtime_wasi::filesystem::WasiFilesystemView;
use wasmtime_wasi::p2::bindings::sync::filesystem::types::{Descriptor, ErrorCode, Filesize, Host, HostDescriptor};
use wasmtime_wasi::p2::{DynInputStream, InputStream, Pollable, StreamResult};

use super::fds::FdToken;
use super::TaskState;

/// What a redefined `wasi:filesystem` call returns: its WIT result, or a trap.
pub(crate) type FsCall<T> = wasmtime::Result<(Result<T, ErrorCode>,)>;

/// Hands `result` to the guest, converting a host error into its error code.
pub(crate) fn answer<T>(
    store: &mut StoreContextMut<'_, TaskState>,
    result: wasmtime_wasi::p2::FsResult<T>,
) -> FsCall<T> {
    match result {
        Ok(v) => Ok((Ok(v),)),
        Err(e) => Ok((Err(store.data_mut().filesystem().convert_error_code(e)?),)),
    }
}

/// The budget's token held by the open file `fd`, if it holds one.
pub(crate) fn token_of(store: &StoreContextMut<'_, TaskState>, fd: &Resource<Descriptor>) -> Option<FdToken> {
    store.data().held.get(&fd.rep()).cloned()
}

/// A stream that holds its file's descriptor in the budget while it lives.
struct Holding<S> {
    inner: S,
    _token: FdToken,
}

/// `inner`, made to hold `token` while it lives.
fn holding_input(inner: DynInputStream, token: Option<FdToken>) -> DynInputStream {
    match token {
        Some(token) => Box::new(Holding { inner, _token: token }),
        None => inner,
    }
}

#[wasmtime_wasi::async_trait]
impl InputStream for Holding<DynInputStream> {
    fn read(&mut self, size: usize) -> StreamResult<Bytes> {
        self.inner.read(size)
    }

    async fn blocking_read(&mut self, size: usize) -> StreamResult<Bytes> {
        self.inner.blocking_read(size).await
    }

    fn skip(&mut self, nelem: usize) -> StreamResult<usize> {
        self.inner.skip(nelem)
    }

    async fn blocking_skip(&mut self, nelem: usize) -> StreamResult<usize> {
        self.inner.blocking_skip(nelem).await
    }

    async fn cancel(&mut self) {
        self.inner.cancel().await
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Holding<DynInputStream> {
    async fn ready(&mut self) {
        self.inner.ready().await
    }
}

fn read_via_stream(
    mut store: StoreContextMut<'_, TaskState>,
    (fd, offset): (Resource<Descriptor>, Filesize),
) -> FsCall<Resource<DynInputStream>> {
    let token = token_of(&store, &fd);
    match store.data_mut().filesystem().read_via_stream(fd, offset) {
        Ok(s) => {
            let table = &mut store.data_mut().table;
            let inner = table.delete(s)?;
            Ok((Ok(table.push(holding_input(inner, token))?),))
        }
        Err(e) => answer(&mut store, Err(e)),
    }
}

/// Redefines `descriptor.read-via-stream` of `interface` (wasmtime-wasi's
/// `wasi:filesystem/types`) in `linker`, after WASI was added and with shadowing allowed.
pub(crate) fn add_to_linker(linker: &mut Linker<TaskState>, interface: &str) -> wasmtime::Result<()> {
    linker
        .instance(interface)?
        .func_wrap("[method]descriptor.read-via-stream", read_via_stream)?;
    Ok(())
}
