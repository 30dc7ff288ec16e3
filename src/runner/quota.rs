//! Write quotas: how much one task may write into its writable grants.
//!
//! A writable grant would otherwise let one task fill the host's disk or its inode table.
//! Each task gets a budget of bytes written and of files and directories created, shared
//! by every writable grant it holds. Every path that writes through `wasi:filesystem`
//! draws on it: `descriptor.write`, the streams of `write-via-stream` and
//! `append-via-stream` (wrapped so every write is counted), `set-size` when it grows a
//! file, `open-at` with `create` for a path that does not exist yet, and
//! `create-directory-at`. A write over the budget fails with the `quota` error code (or a
//! failed stream write); nothing is written. The quota counts what a task writes, not what
//! the grant holds: rewriting the same bytes counts again, and tasks do not share a budget.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use wasmtime::component::{Linker, Resource};
use wasmtime::StoreContextMut;
use wasmtime_wasi::filesystem::WasiFilesystemView;
use wasmtime_wasi::p2::bindings::sync::filesystem::types::{Descriptor, ErrorCode, Filesize, HostDescriptor};
use wasmtime_wasi::p2::{DynOutputStream, OutputStream, Pollable, StreamError, StreamResult};

use super::fds::FdToken;
use super::filestreams::{answer, token_of, FsCall};
use super::TaskState;

pub use crate::sandbox_spec::{DEFAULT_FILE_QUOTA, DEFAULT_WRITE_QUOTA};

/// What is left of a task's budgets. Shared by the task's state and its file streams.
#[derive(Debug)]
pub(crate) struct WriteQuota {
    bytes: AtomicU64,
    files: AtomicU64,
    bytes_limit: u64,
    files_limit: u64,
}

impl WriteQuota {
    pub(crate) fn new(bytes: u64, files: u64) -> Arc<Self> {
        Arc::new(WriteQuota {
            bytes: AtomicU64::new(bytes),
            files: AtomicU64::new(files),
            bytes_limit: bytes,
            files_limit: files,
        })
    }

    fn take(counter: &AtomicU64, n: u64) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| left.checked_sub(n))
            .is_ok()
    }

    /// Takes `n` bytes of the budget, or none when fewer are left.
    pub(crate) fn take_bytes(&self, n: u64) -> bool {
        let ok = Self::take(&self.bytes, n);
        if !ok {
            tracing::debug!(limit = self.bytes_limit, "write quota exhausted");
        }
        ok
    }

    /// Takes one file of the budget, or none when it is spent.
    pub(crate) fn take_file(&self) -> bool {
        let ok = Self::take(&self.files, 1);
        if !ok {
            tracing::debug!(limit = self.files_limit, "file quota exhausted");
        }
        ok
    }

    fn exhausted(&self) -> StreamError {
        StreamError::LastOperationFailed(wasmtime::format_err!(
            "write quota of {} bytes for this task is exhausted",
            self.bytes_limit
        ))
    }
}

/// A file stream whose writes draw on the task's quota, holding its file's place in the
/// descriptor budget while it lives (see [`super::filestreams`]).
struct QuotaStream {
    inner: DynOutputStream,
    quota: Arc<WriteQuota>,
    _token: Option<FdToken>,
}

#[wasmtime_wasi::async_trait]
impl OutputStream for QuotaStream {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        if !self.quota.take_bytes(bytes.len() as u64) {
            return Err(self.quota.exhausted());
        }
        self.inner.write(bytes)
    }

    fn flush(&mut self) -> StreamResult<()> {
        self.inner.flush()
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        self.inner.check_write()
    }

    async fn blocking_write_and_flush(&mut self, bytes: Bytes) -> StreamResult<()> {
        if !self.quota.take_bytes(bytes.len() as u64) {
            return Err(self.quota.exhausted());
        }
        self.inner.blocking_write_and_flush(bytes).await
    }

    async fn cancel(&mut self) {
        self.inner.cancel().await
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for QuotaStream {
    async fn ready(&mut self) {
        self.inner.ready().await
    }
}

/// Wraps the output stream `res` in a [`QuotaStream`], holding the descriptor budget's
/// `token` of its file.
fn wrap_stream(
    store: &mut StoreContextMut<'_, TaskState>,
    res: Resource<DynOutputStream>,
    token: Option<FdToken>,
) -> wasmtime::Result<Resource<DynOutputStream>> {
    let quota = store.data().quota.clone();
    let table = &mut store.data_mut().table;
    let inner = table.delete(res)?;
    let wrapped: DynOutputStream = Box::new(QuotaStream {
        inner,
        quota,
        _token: token,
    });
    Ok(table.push(wrapped)?)
}

fn write(
    mut store: StoreContextMut<'_, TaskState>,
    (fd, buf, offset): (Resource<Descriptor>, Vec<u8>, Filesize),
) -> FsCall<Filesize> {
    if !store.data().quota.take_bytes(buf.len() as u64) {
        return Ok((Err(ErrorCode::Quota),));
    }
    let r = store.data_mut().filesystem().write(fd, buf, offset);
    answer(&mut store, r)
}

fn write_via_stream(
    mut store: StoreContextMut<'_, TaskState>,
    (fd, offset): (Resource<Descriptor>, Filesize),
) -> FsCall<Resource<DynOutputStream>> {
    let token = token_of(&store, &fd);
    match store.data_mut().filesystem().write_via_stream(fd, offset) {
        Ok(s) => Ok((Ok(wrap_stream(&mut store, s, token)?),)),
        Err(e) => answer(&mut store, Err(e)),
    }
}

fn append_via_stream(
    mut store: StoreContextMut<'_, TaskState>,
    (fd,): (Resource<Descriptor>,),
) -> FsCall<Resource<DynOutputStream>> {
    let token = token_of(&store, &fd);
    match store.data_mut().filesystem().append_via_stream(fd) {
        Ok(s) => Ok((Ok(wrap_stream(&mut store, s, token)?),)),
        Err(e) => answer(&mut store, Err(e)),
    }
}

fn set_size(mut store: StoreContextMut<'_, TaskState>, (fd, size): (Resource<Descriptor>, Filesize)) -> FsCall<()> {
    let borrowed = Resource::<Descriptor>::new_borrow(fd.rep());
    let current = match store.data_mut().filesystem().stat(borrowed) {
        Ok(stat) => stat.size,
        Err(e) => return answer(&mut store, Err(e)),
    };
    if size > current && !store.data().quota.take_bytes(size - current) {
        return Ok((Err(ErrorCode::Quota),));
    }
    let r = store.data_mut().filesystem().set_size(fd, size);
    answer(&mut store, r)
}

fn create_directory_at(
    mut store: StoreContextMut<'_, TaskState>,
    (fd, path): (Resource<Descriptor>, String),
) -> FsCall<()> {
    if !store.data().quota.take_file() {
        return Ok((Err(ErrorCode::Quota),));
    }
    let r = store.data_mut().filesystem().create_directory_at(fd, path);
    answer(&mut store, r)
}

/// Redefines the writing calls of `interface` (wasmtime-wasi's `wasi:filesystem/types`)
/// in `linker`, after WASI was added and with shadowing allowed.
pub(crate) fn add_to_linker(linker: &mut Linker<TaskState>, interface: &str) -> wasmtime::Result<()> {
    let mut types = linker.instance(interface)?;
    types.func_wrap("[method]descriptor.write", write)?;
    types.func_wrap("[method]descriptor.write-via-stream", write_via_stream)?;
    types.func_wrap("[method]descriptor.append-via-stream", append_via_stream)?;
    types.func_wrap("[method]descriptor.set-size", set_size)?;
    types.func_wrap("[method]descriptor.create-directory-at", create_directory_at)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_are_taken_whole_or_not_at_all() {
        let q = WriteQuota::new(10, 1);
        assert!(q.take_bytes(6));
        assert!(!q.take_bytes(5));
        assert!(q.take_bytes(4));
        assert!(!q.take_bytes(1));
        assert!(q.take_file());
        assert!(!q.take_file());
    }
}
