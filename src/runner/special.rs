//! Special files in granted directories are refused, and no symlink can be planted.
//!
//! A plugin may not create symlinks: one planted in a writable grant, pointing outside it,
//! is harmless to the plugin (its lookups stay inside the grant) but not to the host
//! tools that later read the directory. `descriptor.symlink-at` therefore always fails
//! with `not-permitted`.
//!
//! Opening or reading a FIFO, a socket or a device can block a host thread forever (a FIFO
//! with no writer), where no deadline reaches it. `descriptor.open-at` is therefore
//! redefined: it first stats the path through the same directory descriptor, with the same
//! symlink flag as the open, and refuses (`access`) anything that is not a regular file, a
//! directory or a symlink, before handing the call to wasmtime-wasi. The descriptor it
//! opens is taken from the process's descriptor budget (see [`super::fds`]; the streams
//! made from it hold it too, see [`super::filestreams`]) and checked not to be on a
//! kernel filesystem (see [`super::kernelfs`]).

use std::os::fd::AsFd;

use wasmtime::component::{Linker, Resource, ResourceType};
use wasmtime::StoreContextMut;
use wasmtime_wasi::filesystem::WasiFilesystemView;
use wasmtime_wasi::p2::bindings::sync::filesystem::types::{
    Descriptor, DescriptorFlags, DescriptorType, ErrorCode, Host, HostDescriptor, OpenFlags, PathFlags,
};

use super::TaskState;

/// The interface whose `open-at` is redefined (wasmtime-wasi's version).
const FILESYSTEM_TYPES: &str = "wasi:filesystem/types@0.2.12";

type OpenAtArgs = (Resource<Descriptor>, PathFlags, String, OpenFlags, DescriptorFlags);

fn open_at(
    mut store: StoreContextMut<'_, TaskState>,
    (fd, path_flags, path, oflags, flags): OpenAtArgs,
) -> wasmtime::Result<(Result<Resource<Descriptor>, ErrorCode>,)> {
    let quota = store.data().quota.clone();
    // The descriptor about to be opened is taken from the process's budget first.
    let Some(token) = store.data().fds.take("a file") else {
        return Ok((Err(ErrorCode::InsufficientMemory),));
    };
    let mut fs = store.data_mut().filesystem();
    let dir = Resource::<Descriptor>::new_borrow(fd.rep());
    match fs.stat_at(dir, path_flags, path.clone()) {
        Ok(stat) => {
            // wasmtime-wasi reports a FIFO as `unknown`: only the ordinary types pass.
            let ordinary = matches!(
                stat.type_,
                DescriptorType::RegularFile | DescriptorType::Directory | DescriptorType::SymbolicLink
            );
            if !ordinary {
                return Ok((Err(ErrorCode::Access),));
            }
        }
        // A file about to be created draws on the task's file quota.
        Err(_) if oflags.contains(OpenFlags::CREATE) => {
            if !quota.take_file() {
                return Ok((Err(ErrorCode::Quota),));
            }
        }
        Err(_) => {}
    }
    let opened = match fs.open_at(fd, path_flags, path, oflags, flags) {
        Ok(d) => d,
        Err(e) => return Ok((Err(fs.convert_error_code(e)?),)),
    };
    // What was opened may be on a kernel filesystem mounted inside the grant: one fstatfs.
    let kernel = match store.data().table.get(&opened)? {
        Descriptor::File(f) => super::kernelfs::of_fd(f.file.as_fd()),
        Descriptor::Dir(d) => super::kernelfs::of_fd(d.dir.as_fd()),
    };
    if !matches!(kernel, Ok(None)) {
        store.data_mut().table.delete(opened)?;
        return Ok((Err(ErrorCode::Access),));
    }
    store.data_mut().held.insert(opened.rep(), token);
    Ok((Ok(opened),))
}

/// Drops a descriptor and gives its place in the budget back.
fn drop_descriptor(mut store: StoreContextMut<'_, TaskState>, rep: u32) -> wasmtime::Result<()> {
    HostDescriptor::drop(&mut store.data_mut().filesystem(), Resource::new_own(rep))?;
    store.data_mut().held.remove(&rep);
    Ok(())
}

fn symlink_at(
    _store: StoreContextMut<'_, TaskState>,
    _args: (Resource<Descriptor>, String, String),
) -> wasmtime::Result<(Result<(), ErrorCode>,)> {
    Ok((Err(ErrorCode::NotPermitted),))
}

/// Replaces `descriptor.open-at` and `descriptor.symlink-at` in `linker` (after WASI was
/// added).
pub(crate) fn add_to_linker(linker: &mut Linker<TaskState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    {
        let mut types = linker.instance(FILESYSTEM_TYPES)?;
        types.func_wrap("[method]descriptor.open-at", open_at)?;
        types.func_wrap("[method]descriptor.symlink-at", symlink_at)?;
        types.resource("descriptor", ResourceType::host::<Descriptor>(), drop_descriptor)?;
    }
    super::quota::add_to_linker(linker, FILESYSTEM_TYPES)?;
    super::filestreams::add_to_linker(linker, FILESYSTEM_TYPES)?;
    super::sockets::add_to_linker(linker)?;
    linker.allow_shadowing(false);
    Ok(())
}
