//! Outbound HTTP requests (`wasi:http/outgoing-handler`), by allowlist.
//!
//! Every request is refused unless its scheme, host and port match an entry of the queue's
//! sandbox `http` list (see [`policy`]). The host then resolves the name itself, checks
//! every address (internal ones only when the entry is explicit about them), and connects
//! to an address it checked, so a name cannot be re-resolved elsewhere between the check
//! and the connection. TLS is verified against the system's trust store.
//!
//! A task's requests are bounded: their number (`http_max_requests`), how many are open at
//! once ([`MAX_OPEN`]), the bytes of their bodies sent and received together
//! (`http_max_body_mib`), the bytes the host holds for them (header sets, a request body's
//! buffer, a response head), and their time (every request, name lookup included, ends at
//! the task's deadline, lease end or kill, whatever it is waiting for). Each refusal
//! is reported to the guest as a `wasi:http` error code and noted in the task's stderr as a
//! `[disbatch: …]` line saying what to change.

mod budget;
mod dns;
mod notes;
mod policy;

use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use ipnet::IpNet;
use tokio::net::TcpStream;
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpCtx, WasiHttpHooks};

use budget::{Budget, Counted};
pub(crate) use notes::Notes;
pub use policy::HttpRule;

use super::{clock, RunControl};

pub use crate::sandbox_spec::{DEFAULT_MAX_BODY, DEFAULT_MAX_REQUESTS};
/// How long a connection may take when the guest sets no `connect-timeout`.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Requests one task may have open at once (connecting, waiting, or reading a response).
pub const MAX_OPEN: u32 = 32;
/// The size of one set of headers a plugin builds, as `wasi:http` counts it (the bytes of
/// names and values plus 32 to 40 a field): its real footprint stays under
/// [`super::limits::HANDLE_BYTES`] even for thousands of empty fields.
pub const FIELD_SIZE_LIMIT: usize = 32 * 1024;
/// The largest write into a request body; the host buffers two of them per body.
pub const BODY_CHUNK: usize = 64 * 1024;
/// The largest response head (status line and headers) a server may send.
pub const MAX_RESPONSE_HEAD: usize = 64 * 1024;

/// The HTTP part of one task's host state.
pub(crate) struct TaskHttp {
    pub(crate) ctx: WasiHttpCtx,
    pub(crate) hooks: Hooks,
}

/// What decides and carries one task's requests. Nothing is allocated for a task that
/// sends none: the body budget and the notes are made at its first request.
pub(crate) struct Hooks {
    rules: Vec<HttpRule>,
    network_allow: Vec<IpNet>,
    max_requests: u32,
    max_body: u64,
    sent: u32,
    shared: Option<Budget>,
    /// Made at the first request that names a host rather than an address.
    resolver: Option<hickory_resolver::TokioResolver>,
    deadline: Instant,
    control: RunControl,
    /// The task's account on the process's descriptor budget: an open request holds a
    /// connection.
    fds: Arc<super::fds::TaskFds>,
}

impl TaskHttp {
    pub(crate) fn new(
        sandbox: &super::Sandbox,
        deadline: Instant,
        control: RunControl,
        fds: Arc<super::fds::TaskFds>,
    ) -> Self {
        let mut ctx = WasiHttpCtx::new();
        ctx.set_field_size_limit(FIELD_SIZE_LIMIT);
        TaskHttp {
            ctx,
            hooks: Hooks {
                rules: sandbox.http.clone(),
                network_allow: sandbox.network_allow.clone(),
                max_requests: sandbox.http_max_requests,
                max_body: sandbox.http_max_body,
                sent: 0,
                shared: None,
                resolver: None,
                deadline,
                control,
                fds,
            },
        }
    }
}

/// `rules` as written, each in quotes: `"a.example", "*.corp"`.
fn quoted(rules: &[HttpRule]) -> String {
    rules.iter().map(|r| format!("\"{r}\"")).collect::<Vec<_>>().join(", ")
}

/// Where a request goes, once admitted by the list.
struct Target {
    https: bool,
    host: String,
    port: u16,
    /// Every entry that matched: an address passes when any of them admits it.
    rules: Vec<HttpRule>,
    origin: String,
    /// Held while the request is open.
    open: Open,
}

/// One open request of a task and the descriptor of its connection; dropping it closes
/// its place.
struct Open {
    count: Arc<AtomicU32>,
    _fd: super::fds::FdToken,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How a request's host becomes addresses: an address as written, or a name to resolve.
enum Lookup {
    Literal(IpAddr),
    Name(Box<hickory_resolver::TokioResolver>),
}

type Sent = (
    http::Response<WasiBody>,
    Box<dyn std::future::Future<Output = Result<(), Error>> + Send>,
);

impl Hooks {
    /// The task's body budget and notes, made at its first request.
    fn budget(&mut self) -> &Budget {
        let limit = self.max_body;
        self.shared.get_or_insert_with(|| Budget {
            left: Arc::new(AtomicU64::new(limit)),
            limit,
            notes: Notes::default(),
            open: Arc::default(),
        })
    }

    /// What the sandbox refused, one note each.
    pub(crate) fn take_notes(&self) -> Vec<String> {
        self.shared.as_ref().map(|b| b.notes.take()).unwrap_or_default()
    }

    /// Checks `req` against the list and the request budget.
    fn admit(&mut self, req: &http::Request<WasiBody>) -> Result<Target, Error> {
        let (notes, open) = {
            let b = self.budget();
            (b.notes.clone(), b.open.clone())
        };
        let uri = req.uri();
        let https = uri.scheme() == Some(&http::uri::Scheme::HTTPS);
        let host = policy::normalize_host(uri.host().unwrap_or_default());
        let port = uri.port_u16().unwrap_or(policy::default_port(https));
        let scheme = if https { "https" } else { "http" };
        let origin = if host.contains(':') {
            format!("{scheme}://[{host}]:{port}")
        } else {
            format!("{scheme}://{host}:{port}")
        };
        let rules = policy::matching(&self.rules, https, &host, port);
        if rules.is_empty() {
            let listed = if self.rules.is_empty() {
                "the queue's sandbox has no \"http\" list".to_owned()
            } else {
                format!(
                    "the queue's sandbox \"http\" list ({}) does not name it",
                    quoted(&self.rules)
                )
            };
            notes.push(format!(
                "HTTP request to {origin} refused: {listed}; add \"{0}\" to sandbox.http (runner exec: --http {0}) to allow it",
                if port == policy::default_port(https) {
                    host.clone()
                } else {
                    format!("{scheme}://{host}:{port}")
                }
            ));
            return Err(Error::HttpRequestDenied);
        }
        if self.sent >= self.max_requests {
            notes.push(format!(
                "HTTP request to {origin} refused: the task already sent {} requests, its limit (sandbox.http_max_requests)",
                self.max_requests
            ));
            return Err(Error::ConnectionLimitReached);
        }
        if open.fetch_add(1, Ordering::SeqCst) >= MAX_OPEN {
            open.fetch_sub(1, Ordering::SeqCst);
            notes.push(format!(
                "HTTP request to {origin} refused: the task has {MAX_OPEN} requests open, the most it may have at once; \
                 read or drop a response before sending the next request"
            ));
            return Err(Error::ConnectionLimitReached);
        }
        let Some(fd) = self.fds.take(&format!("a connection to {origin}")) else {
            open.fetch_sub(1, Ordering::SeqCst);
            return Err(Error::ConnectionLimitReached);
        };
        let open = Open { count: open, _fd: fd };
        self.sent += 1;
        Ok(Target {
            https,
            host,
            port,
            rules,
            origin,
            open,
        })
    }
}

impl WasiHttpHooks for Hooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: Box<dyn std::future::Future<Output = Result<(), Error>> + Send>,
    ) -> Box<dyn std::future::Future<Output = Result<Sent, Error>> + Send> {
        let target = match self.admit(&request) {
            Ok(t) => t,
            Err(e) => return Box::new(std::future::ready(Err(e))),
        };
        let lookup = match target.host.parse::<IpAddr>() {
            Ok(ip) => Lookup::Literal(ip),
            Err(_) => match &self.resolver {
                Some(r) => Lookup::Name(Box::new(r.clone())),
                None => match dns::resolver() {
                    Ok(r) => Lookup::Name(Box::new(self.resolver.insert(r).clone())),
                    Err(e) => return Box::new(std::future::ready(Err(e))),
                },
            },
        };
        let (deadline, control) = (self.deadline, self.control.clone());
        let allow: Arc<[IpNet]> = self.network_allow.clone().into();
        let body = self.budget().clone();
        Box::new(async move {
            tokio::select! {
                r = send(request, target, lookup, options, &allow, body) => r,
                _ = clock::stopped(deadline, &control) => Err(Error::ConnectionTimeout),
            }
        })
    }

    fn p2_outgoing_body_chunk_size(&mut self) -> usize {
        BODY_CHUNK
    }
}

/// Resolves, checks, connects and sends: the response's body stays bounded by the body
/// budget and ends when the task must stop.
async fn send(
    req: http::Request<WasiBody>,
    t: Target,
    lookup: Lookup,
    options: Option<RequestOptions>,
    allow: &[IpNet],
    body: Budget,
) -> Result<Sent, Error> {
    let notes = &body.notes;
    let connect_timeout = options
        .and_then(|o| o.connect_timeout)
        .unwrap_or(DEFAULT_CONNECT_TIMEOUT);
    let literal = match &lookup {
        Lookup::Literal(ip) => Some(*ip),
        Lookup::Name(_) => None,
    };
    let addrs: Vec<IpAddr> = match lookup {
        Lookup::Literal(ip) => vec![ip],
        Lookup::Name(resolver) => {
            let found = tokio::time::timeout(connect_timeout, dns::lookup(&resolver, &t.host))
                .await
                .unwrap_or(Err(Error::DnsTimeout));
            match found {
                Ok(found) => found,
                Err(e) => {
                    notes.push(format!(
                        "HTTP request to {} failed: cannot resolve {}: {e}",
                        t.origin, t.host
                    ));
                    return Err(e);
                }
            }
        }
    };
    let (usable, refused): (Vec<IpAddr>, Vec<IpAddr>) = addrs
        .into_iter()
        .partition(|ip| t.rules.iter().any(|r| r.admits(*ip, allow)));
    if usable.is_empty() {
        // The first few: a name can carry thousands of addresses.
        let more = refused.len().saturating_sub(8);
        let mut refused: Vec<String> = refused.iter().take(8).map(IpAddr::to_string).collect();
        if more > 0 {
            refused.push(format!("and {more} more"));
        }
        notes.push(format!(
            "HTTP request to {} refused: {} is at {}, internal to this host's network, and no matching entry ({}) names that address; \
             list the address itself in sandbox.http or add its range to sandbox.network_allow",
            t.origin,
            t.host,
            refused.join(", "),
            quoted(&t.rules),
        ));
        return Err(Error::DestinationIpProhibited);
    }
    let mut last = Error::DestinationUnavailable;
    let mut stream = None;
    for ip in usable {
        match tokio::time::timeout(connect_timeout, TcpStream::connect((ip, t.port))).await {
            Ok(Ok(s)) => {
                stream = Some(s);
                break;
            }
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => last = Error::ConnectionRefused,
            Ok(Err(e)) => last = Error::Connect(e),
            Err(_) => last = Error::ConnectionTimeout,
        }
    }
    let stream = stream.ok_or(last)?;
    let first_byte = options.and_then(|o| o.first_byte_timeout);
    if t.https {
        let name = match literal {
            Some(ip) => tokio_rustls::rustls::pki_types::ServerName::from(ip),
            None => tokio_rustls::rustls::pki_types::ServerName::try_from(t.host.clone())
                .map_err(|_| Error::HttpRequestUriInvalid)?,
        };
        let tls = tokio_rustls::TlsConnector::from(TLS.clone())
            .connect(name, stream)
            .await
            .map_err(Error::Tls)?;
        exchange(req, TokioIo::new(tls), first_byte, body, t.open).await
    } else {
        exchange(req, TokioIo::new(stream), first_byte, body, t.open).await
    }
}

/// Sends `req` over `io` (HTTP/1.1) and returns the response with a counted body.
async fn exchange<I>(
    mut req: http::Request<WasiBody>,
    io: I,
    first_byte: Option<Duration>,
    budget: Budget,
    open: Open,
) -> Result<Sent, Error>
where
    I: hyper::rt::Read + hyper::rt::Write + Send + Unpin + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(MAX_RESPONSE_HEAD)
        .handshake(io)
        .await?;
    let conn = wasmtime_wasi::runtime::spawn(conn);
    // On the wire, the request line carries the path only (the Host header names the host).
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str()).to_owned();
    *req.uri_mut() = http::Uri::builder()
        .path_and_query(path)
        .build()
        .map_err(|_| Error::HttpRequestUriInvalid)?;
    let outgoing = req.map(|b| Counted::new(b, budget.clone(), true).boxed_unsync());
    let response = sender.send_request(outgoing);
    let response = match first_byte {
        Some(limit) => tokio::time::timeout(limit, response)
            .await
            .map_err(|_| Error::ConnectionReadTimeout)??,
        None => response.await?,
    };
    let response = response.map(|b| Counted::new(b.map_err(Error::from), budget, false).boxed_unsync());
    // The request stays open, counted, until its connection closes.
    let io = async move {
        let _open = open;
        conn.await.map_err(Error::from)
    };
    Ok((response, Box::new(io)))
}

/// The client TLS configuration: the system's trust store (or, where it has none, the
/// Mozilla roots).
static TLS: LazyLock<Arc<tokio_rustls::rustls::ClientConfig>> = LazyLock::new(|| {
    use tokio_rustls::rustls;
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    let (added, _) = roots.add_parsable_certificates(native.certs);
    if added == 0 {
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("the ring provider supports the default TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    // No session cache: it would be shared by every task and queue, outside their limits,
    // and would let a server link the tasks of different queues.
    config.resumption = rustls::client::Resumption::disabled();
    Arc::new(config)
});
