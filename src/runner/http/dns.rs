//! Name resolution for a task's requests.
//!
//! Names are resolved in the async runtime, from `/etc/hosts` and the nameservers of
//! `/etc/resolv.conf`, never through the C library's resolver: that one blocks a thread
//! of the runtime's blocking pool (the pool the DEN's running plugins and embedded store
//! use) for as long as a nameserver keeps silent, and cannot be stopped. A lookup here is
//! a future: it ends when the request does (its task's deadline, lease end or kill), and
//! leaves nothing running behind it.

use std::net::IpAddr;
use std::sync::{Arc, LazyLock};

use hickory_resolver::config::{ResolveHosts, ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::NetError;
use hickory_resolver::{Hosts, Resolver, TokioResolver};
use wasmtime_wasi_http::Error;

/// Answers one task keeps: the names a plugin asks for again are not asked again.
const CACHE_SIZE: u64 = 64;

/// The host's resolver configuration, read once.
static SYSTEM: LazyLock<(ResolverConfig, ResolverOpts)> = LazyLock::new(|| {
    match hickory_resolver::system_conf::read_system_conf() {
        Ok(conf) => conf,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read /etc/resolv.conf: plugins' HTTP requests resolve names from /etc/hosts only");
            (
                ResolverConfig::from_parts(None, Vec::new(), Vec::new()),
                ResolverOpts::default(),
            )
        }
    }
});

/// The host's `/etc/hosts`, read once.
static HOSTS: LazyLock<Arc<Hosts>> = LazyLock::new(|| Arc::new(Hosts::from_system().unwrap_or_default()));

/// One task's resolver, with the host's configuration.
pub(super) fn resolver() -> Result<TokioResolver, Error> {
    let (config, opts) = SYSTEM.clone();
    let mut resolver = with(config, opts)?;
    resolver.set_hosts(HOSTS.clone());
    Ok(resolver)
}

fn with(config: ResolverConfig, mut opts: ResolverOpts) -> Result<TokioResolver, Error> {
    opts.cache_size = CACHE_SIZE;
    // The hosts file is the shared copy set by `resolver`, not read again for each task.
    opts.use_hosts_file = ResolveHosts::Never;
    Resolver::builder_with_config(config, TokioRuntimeProvider::default())
        .with_options(opts)
        .build()
        .map_err(|e| Error::InternalError(Some(format!("cannot start a DNS resolver: {e}"))))
}

/// The addresses of `host`, as a `wasi:http` error code when there are none.
pub(super) async fn lookup(resolver: &TokioResolver, host: &str) -> Result<Vec<IpAddr>, Error> {
    match resolver.lookup_ip(host).await {
        Ok(found) => Ok(found.iter().collect()),
        Err(NetError::Timeout) => Err(Error::DnsTimeout),
        Err(e) => Err(Error::DnsError {
            rcode: Some(e.to_string()),
            info_code: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ProtocolConfig};

    use super::*;

    /// A resolver whose only nameserver is `port` on loopback.
    fn at(port: u16) -> TokioResolver {
        let mut udp = ConnectionConfig::new(ProtocolConfig::Udp);
        udp.port = port;
        let server = NameServerConfig::new(IpAddr::from([127, 0, 0, 1]), true, vec![udp]);
        let mut opts = ResolverOpts::default();
        opts.timeout = Duration::from_secs(30);
        opts.attempts = 1;
        with(ResolverConfig::from_parts(None, Vec::new(), vec![server]), opts).unwrap()
    }

    /// The runtime's only blocking thread is taken for the whole test: a lookup that
    /// needed one would never end.
    fn without_blocking_threads(f: impl std::future::Future<Output = ()>) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .max_blocking_threads(1)
            .build()
            .unwrap();
        let (release, held) = std::sync::mpsc::channel::<()>();
        rt.spawn_blocking(move || held.recv());
        rt.block_on(f);
        release.send(()).unwrap();
    }

    #[test]
    fn a_silent_nameserver_holds_no_thread_and_its_lookup_ends_when_dropped() {
        let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = silent.local_addr().unwrap().port();
        without_blocking_threads(async move {
            let resolver = at(port);
            // The lookup waits for an answer that never comes, until it is dropped.
            let lookup = lookup(&resolver, "never.answered.example.");
            let cut = tokio::time::timeout(Duration::from_millis(200), lookup).await;
            assert!(
                cut.is_err(),
                "a lookup against a silent server cannot have ended: {cut:?}"
            );
            // The query did go out: the server received it.
            let mut buf = [0u8; 512];
            silent.set_nonblocking(true).unwrap();
            assert!(silent.recv(&mut buf).is_ok(), "the nameserver was never asked");
        });
    }

    #[test]
    fn the_hosts_file_answers_without_a_thread() {
        without_blocking_threads(async {
            let found = lookup(&resolver().unwrap(), "localhost").await.unwrap();
            assert!(found.iter().any(|ip| ip.is_loopback()), "{found:?}");
        });
    }
}
