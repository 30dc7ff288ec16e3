//! Sockets draw on the process's descriptor budget (see [`super::fds`]).
//!
//! `create-tcp-socket` and `create-udp-socket` are redefined to take one descriptor from
//! the task's account before the socket is made (past it they fail with
//! `new-socket-limit`), and the sockets' resource drops to give it back.

use wasmtime::component::{Linker, Resource, ResourceType};
use wasmtime::StoreContextMut;
use wasmtime_wasi::p2::bindings::sockets::network::{ErrorCode, IpAddressFamily};
use wasmtime_wasi::p2::bindings::sockets::tcp_create_socket;
use wasmtime_wasi::p2::bindings::sync::sockets::{tcp, udp, udp_create_socket};
use wasmtime_wasi::p2::{TcpSocket, UdpSocket};
use wasmtime_wasi::sockets::WasiSocketsView;

use super::TaskState;

/// The interfaces redefined (wasmtime-wasi's version).
const TCP_CREATE: &str = "wasi:sockets/tcp-create-socket@0.2.12";
const TCP: &str = "wasi:sockets/tcp@0.2.12";
const UDP_CREATE: &str = "wasi:sockets/udp-create-socket@0.2.12";
const UDP: &str = "wasi:sockets/udp@0.2.12";

type Created<S> = wasmtime::Result<(Result<Resource<S>, ErrorCode>,)>;

fn create_tcp(mut store: StoreContextMut<'_, TaskState>, (family,): (IpAddressFamily,)) -> Created<TcpSocket> {
    let Some(token) = store.data().fds.take("a socket") else {
        return Ok((Err(ErrorCode::NewSocketLimit),));
    };
    match tcp_create_socket::Host::create_tcp_socket(&mut store.data_mut().sockets(), family) {
        Ok(s) => {
            store.data_mut().held.insert(s.rep(), token);
            Ok((Ok(s),))
        }
        Err(e) => Ok((Err(e.downcast()?),)),
    }
}

fn create_udp(mut store: StoreContextMut<'_, TaskState>, (family,): (IpAddressFamily,)) -> Created<UdpSocket> {
    let Some(token) = store.data().fds.take("a socket") else {
        return Ok((Err(ErrorCode::NewSocketLimit),));
    };
    match udp_create_socket::Host::create_udp_socket(&mut store.data_mut().sockets(), family) {
        Ok(s) => {
            store.data_mut().held.insert(s.rep(), token);
            Ok((Ok(s),))
        }
        Err(e) => Ok((Err(e.downcast()?),)),
    }
}

fn drop_tcp(mut store: StoreContextMut<'_, TaskState>, rep: u32) -> wasmtime::Result<()> {
    tcp::HostTcpSocket::drop(&mut store.data_mut().sockets(), Resource::new_own(rep))?;
    store.data_mut().held.remove(&rep);
    Ok(())
}

fn drop_udp(mut store: StoreContextMut<'_, TaskState>, rep: u32) -> wasmtime::Result<()> {
    udp::HostUdpSocket::drop(&mut store.data_mut().sockets(), Resource::new_own(rep))?;
    store.data_mut().held.remove(&rep);
    Ok(())
}

/// Redefines socket creation and drops in `linker` (after WASI was added, with shadowing
/// allowed).
pub(crate) fn add_to_linker(linker: &mut Linker<TaskState>) -> wasmtime::Result<()> {
    linker
        .instance(TCP_CREATE)?
        .func_wrap("create-tcp-socket", create_tcp)?;
    linker
        .instance(UDP_CREATE)?
        .func_wrap("create-udp-socket", create_udp)?;
    linker
        .instance(TCP)?
        .resource("tcp-socket", ResourceType::host::<TcpSocket>(), drop_tcp)?;
    linker
        .instance(UDP)?
        .resource("udp-socket", ResourceType::host::<UdpSocket>(), drop_udp)?;
    Ok(())
}
