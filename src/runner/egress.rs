//! The network policy of a sandbox that was granted `network`.
//!
//! A grant of the network is a grant of the public internet, not of the host's own
//! neighbourhood: by default a plugin may not reach loopback (the DEN's API, its database),
//! private and shared ranges (the LAN, the cloud's internal network), link-local addresses
//! (the cloud metadata service at 169.254.169.254, Azure's WireServer at 168.63.129.16),
//! the unspecified address (which connects to the host itself), the host's own addresses
//! on every interface (a service bound to all interfaces answers there too), broadcast or
//! multicast. A queue opens exactly the ranges
//! it needs with `network_allow` (CIDRs or single addresses). Listening for connections is
//! never allowed. Every address a socket is about to use is checked, so an IPv4 address
//! hidden in an IPv6 one (`::ffff:127.0.0.1`) is judged as the IPv4 address it is.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use wasmtime_wasi::sockets::SocketAddrUse;

/// Whether an address is in a range a plugin may not reach unless it is allowed.
pub fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => internal_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => internal_v4(v4),
            None => internal_v6(v6),
        },
    }
}

/// How long the list of the host's own addresses is trusted before it is read again.
const OWN_REFRESH: Duration = Duration::from_secs(5);

/// Whether `ip` is an address of one of this host's interfaces, public ones included.
/// When the interfaces cannot be listed, every address counts as the host's own: the
/// check fails closed.
fn is_own(ip: IpAddr) -> bool {
    /// When the list was read, and the list (`None`: it could not be read).
    type Own = Option<(Instant, Option<Arc<[IpAddr]>>)>;
    static OWN: Mutex<Own> = Mutex::new(None);
    let own = {
        let mut cached = OWN.lock().unwrap_or_else(|e| e.into_inner());
        match &*cached {
            Some((at, own)) if at.elapsed() < OWN_REFRESH => own.clone(),
            _ => {
                let own: Option<Arc<[IpAddr]>> = match if_addrs::get_if_addrs() {
                    Ok(found) => Some(found.into_iter().map(|i| i.ip()).collect()),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot list this host's interface addresses: plugins reach no address until they can be listed");
                        None
                    }
                };
                *cached = Some((Instant::now(), own.clone()));
                own
            }
        }
    };
    own.is_none_or(|own| own.contains(&ip))
}

fn internal_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || a == 0
        // Shared address space (carrier-grade NAT), 100.64.0.0/10.
        || (a == 100 && (64..128).contains(&b))
        // IETF protocol assignments, 192.0.0.0/24.
        || ip.octets()[..3] == [192, 0, 0]
        // Reserved, 240.0.0.0/4.
        || a >= 240
        // Benchmarking, 198.18.0.0/15 (used inside some networks).
        || (a == 198 && (b & 0xfe) == 18)
        // Azure's WireServer (the platform's agent and DNS endpoint).
        || ip == Ipv4Addr::new(168, 63, 129, 16)
        || is_own(IpAddr::V4(ip))
}

fn internal_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        // Unique local fc00::/7 and link-local fe80::/10.
        || (first & 0xfe00) == 0xfc00
        || (first & 0xffc0) == 0xfe80
        // Site-local fec0::/10 (deprecated, still routed by some hosts).
        || (first & 0xffc0) == 0xfec0
        // IPv4-compatible ::a.b.c.d and NAT64 64:ff9b::/96 carry an IPv4 address.
        || ip.to_ipv4().is_some_and(internal_v4)
        || (ip.segments()[..6] == [0x64, 0xff9b, 0, 0, 0, 0] && {
            let s = ip.segments();
            internal_v4(Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8))
        })
        // 6to4 2002::/16 carries an IPv4 address in its second and third groups.
        || (first == 0x2002 && {
            let s = ip.segments();
            internal_v4(Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8))
        })
        // Local-use NAT64 64:ff9b:1::/48: a network's own translator, whatever it embeds.
        || ip.segments()[..3] == [0x64, 0xff9b, 1]
        || is_own(IpAddr::V6(ip))
}

/// The check a task's sockets go through: `allow` lists the internal ranges it may reach.
pub(crate) fn checker(
    allow: &[IpNet],
) -> impl Fn(SocketAddr, SocketAddrUse) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + Sync>>
       + Send
       + Sync
       + 'static {
    let allow: Arc<[IpNet]> = allow.into();
    move |addr, usage| {
        let ok = permitted(&allow, addr, usage);
        if !ok {
            tracing::debug!(%addr, ?usage, "socket address refused by the sandbox's network policy");
        }
        Box::pin(std::future::ready(ok))
    }
}

/// Whether a socket may use `addr` for `usage` under the allow-list `allow`.
pub fn permitted(allow: &[IpNet], addr: SocketAddr, usage: SocketAddrUse) -> bool {
    let ip = addr.ip();
    let allowed = || in_allowed(allow, ip);
    match usage {
        SocketAddrUse::TcpListen | SocketAddrUse::TcpAccept => false,
        // Implicit binds use the wildcard address: that is the OS picking a local port.
        SocketAddrUse::TcpBind | SocketAddrUse::UdpBind => ip.is_unspecified() || allowed(),
        _ => !is_internal(ip) || allowed(),
    }
}

/// Whether `ip` (or the IPv4 address inside an IPv4-mapped one) lies in a range of `allow`.
pub(crate) fn in_allowed(allow: &[IpNet], ip: IpAddr) -> bool {
    let plain = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    };
    allow.iter().any(|net| net.contains(&ip) || net.contains(&plain))
}

pub use crate::sandbox_spec::parse_network_allow as parse_allow;

#[cfg(test)]
mod tests {
    use super::*;

    fn connect(allow: &[&str], addr: &str) -> bool {
        let allow: Vec<IpNet> = allow.iter().map(|a| parse_allow(a).unwrap()).collect();
        permitted(&allow, addr.parse().unwrap(), SocketAddrUse::TcpConnect)
    }

    #[test]
    fn internal_ranges_are_refused_unless_allowed() {
        for addr in [
            "127.0.0.1:27017",
            "127.8.9.10:80",
            "10.1.2.3:80",
            "172.16.0.1:80",
            "192.168.1.1:80",
            "169.254.169.254:80",
            "0.0.0.0:8080",
            "100.64.0.1:80",
            "255.255.255.255:9",
            "224.0.0.1:9",
            "[::1]:80",
            "[::]:80",
            "[::ffff:127.0.0.1]:80",
            "[::ffff:10.0.0.1]:80",
            "[fd00::1]:80",
            "[fe80::1]:80",
            "[64:ff9b::7f00:1]:80",
            "[64:ff9b:1::808:808]:80",
            "[2002:7f00:1::]:80",
            "198.18.0.1:80",
            "168.63.129.16:80",
        ] {
            assert!(!connect(&[], addr), "{addr} must be refused");
        }
        for addr in ["93.184.216.34:443", "[2606:2800:220:1::]:443", "8.8.8.8:53"] {
            assert!(connect(&[], addr), "{addr} must be allowed");
        }
        assert!(connect(&["127.0.0.1"], "127.0.0.1:27017"));
        assert!(connect(&["127.0.0.1"], "[::ffff:127.0.0.1]:27017"));
        assert!(!connect(&["127.0.0.1"], "127.0.0.2:27017"));
        assert!(connect(&["10.0.0.0/8"], "10.200.0.1:80"));
    }

    #[test]
    fn every_address_of_this_host_is_internal() {
        let own = if_addrs::get_if_addrs().unwrap();
        assert!(!own.is_empty(), "this host has no interface addresses");
        for iface in own {
            let addr = SocketAddr::new(iface.ip(), 80);
            assert!(
                !connect(&[], &addr.to_string()),
                "{addr} ({}) must be refused",
                iface.name
            );
            assert!(
                connect(&[&iface.ip().to_string()], &addr.to_string()),
                "{addr} allowed by name"
            );
        }
    }

    #[test]
    fn listening_is_never_allowed_and_wildcard_binds_are() {
        let any: SocketAddr = "0.0.0.0:0".parse().unwrap();
        assert!(!permitted(&[], any, SocketAddrUse::TcpListen));
        assert!(permitted(&[], any, SocketAddrUse::TcpBind));
        assert!(!permitted(&[], "127.0.0.1:0".parse().unwrap(), SocketAddrUse::UdpBind));
        assert!(parse_allow("nonsense").unwrap_err().contains("nonsense"));
    }
}
