//! A TCP fault proxy on 127.0.0.1 for putting network faults between a client (a DEN) and a
//! server (the test database): added latency per direction (fixed or jittered), resets of
//! every connection (now, or every T seconds), a freeze that holds every byte both ways
//! while the connections stay open, a hold of the requests that contain a given byte
//! string (one chosen command held up on its way, the others not), and refusal of new
//! connections.
//!
//! Bytes read from one side are forwarded to the other in order, each chunk no earlier
//! than its latency after it was read. While frozen nothing is forwarded (what arrives is
//! kept, in order, and forwarded after the thaw). A reset closes both sides of every
//! connection with an RST (`SO_LINGER` 0), so the client sees "connection reset".
//!
//! The proxy runs on the runtime it was started on and stops when dropped.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Latency added to one direction: every chunk waits `fixed` plus a uniformly random part
/// of `jitter` (never reordering bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Latency {
    /// Always added.
    pub fixed: Duration,
    /// Up to this much more, at random per chunk.
    pub jitter: Duration,
}

impl Latency {
    /// No latency.
    pub const NONE: Latency = Latency {
        fixed: Duration::ZERO,
        jitter: Duration::ZERO,
    };

    /// A fixed latency of `ms` milliseconds.
    pub fn fixed_ms(ms: u64) -> Latency {
        Latency {
            fixed: Duration::from_millis(ms),
            jitter: Duration::ZERO,
        }
    }

    /// A latency of up to `ms` milliseconds, uniformly random per chunk.
    pub fn up_to_ms(ms: u64) -> Latency {
        Latency {
            fixed: Duration::ZERO,
            jitter: Duration::from_millis(ms),
        }
    }
}

/// What the test controls, shared with the connections.
struct Faults {
    /// While set, a client → server chunk containing these bytes is held (with what
    /// follows it on its connection) until [`FaultProxy::release`].
    hold: watch::Sender<Option<Vec<u8>>>,
    /// Chunks held so far.
    held: AtomicU64,
    /// Client → server.
    up: Mutex<Latency>,
    /// Server → client.
    down: Mutex<Latency>,
    /// True while frozen.
    frozen: watch::Sender<bool>,
    /// Bumped by every reset; a connection ends when it changes.
    resets: watch::Sender<u64>,
    /// New connections are refused (reset at once) while set.
    refuse: AtomicBool,
    /// Connections accepted so far.
    accepted: AtomicU64,
    /// State of the jitter's random numbers (xorshift).
    random: AtomicU64,
}

impl Faults {
    fn delay(&self, latency: &Mutex<Latency>) -> Duration {
        let l = *latency.lock().unwrap();
        if l.jitter.is_zero() {
            return l.fixed;
        }
        let mut x = self.random.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.random.store(x, Ordering::Relaxed);
        let jitter = l.jitter.as_micros() as u64;
        l.fixed + Duration::from_micros(x % (jitter + 1))
    }
}

/// A fault proxy listening on 127.0.0.1 (a free port) in front of `upstream`.
pub struct FaultProxy {
    addr: SocketAddr,
    faults: Arc<Faults>,
    acceptor: JoinHandle<()>,
    resetter: Mutex<Option<JoinHandle<()>>>,
}

impl FaultProxy {
    /// Starts a proxy to `upstream` (`host:port`) on the current tokio runtime.
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the fault proxy");
        let addr = listener.local_addr().unwrap();
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1;
        let faults = Arc::new(Faults {
            hold: watch::channel(None).0,
            held: AtomicU64::new(0),
            up: Mutex::new(Latency::NONE),
            down: Mutex::new(Latency::NONE),
            frozen: watch::channel(false).0,
            resets: watch::channel(0).0,
            refuse: AtomicBool::new(false),
            accepted: AtomicU64::new(0),
            random: AtomicU64::new(seed),
        });
        let f = faults.clone();
        let acceptor = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                if f.refuse.load(Ordering::SeqCst) {
                    abort(&client);
                    drop(client);
                    continue;
                }
                f.accepted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(connection(client, upstream, f.clone()));
            }
        });
        FaultProxy {
            addr,
            faults,
            acceptor,
            resetter: Mutex::new(None),
        }
    }

    /// Starts a proxy in front of the server of `uri` (`mongodb://host:port/...`).
    pub async fn in_front_of(uri: &str) -> FaultProxy {
        let rest = uri.strip_prefix("mongodb://").expect("a mongodb:// URI");
        let host_port = rest.split(['/', '?']).next().unwrap();
        let upstream = tokio::net::lookup_host(host_port)
            .await
            .expect("resolve the server")
            .next()
            .expect("an address of the server");
        FaultProxy::start(upstream).await
    }

    /// Where the proxy listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A MongoDB URI reaching the server through this proxy.
    pub fn uri(&self) -> String {
        format!("mongodb://{}/?directConnection=true", self.addr)
    }

    /// Sets the latency added to each direction.
    pub fn set_latency(&self, up: Latency, down: Latency) {
        *self.faults.up.lock().unwrap() = up;
        *self.faults.down.lock().unwrap() = down;
    }

    /// Resets every open connection now.
    pub fn reset_all(&self) {
        self.faults.resets.send_modify(|n| *n += 1);
    }

    /// Resets every open connection every `period` from now on (None: no more).
    pub fn reset_every(&self, period: Option<Duration>) {
        let mut slot = self.resetter.lock().unwrap();
        if let Some(old) = slot.take() {
            old.abort();
        }
        if let Some(period) = period {
            let f = self.faults.clone();
            *slot = Some(tokio::spawn(async move {
                let mut every = tokio::time::interval_at(Instant::now() + period, period);
                loop {
                    every.tick().await;
                    f.resets.send_modify(|n| *n += 1);
                }
            }));
        }
    }

    /// Holds every byte, both ways, until [`FaultProxy::thaw`]; connections stay open and
    /// new ones are accepted (and held too).
    pub fn freeze(&self) {
        self.faults.frozen.send_replace(true);
    }

    /// Forwards again what was held, in order, and what comes next.
    pub fn thaw(&self) {
        self.faults.frozen.send_replace(false);
    }

    /// From now on holds every client → server chunk that contains `bytes`, and what
    /// follows it on its connection, until [`FaultProxy::release`]; other connections go on.
    pub fn hold_matching(&self, bytes: &[u8]) {
        self.faults.hold.send_replace(Some(bytes.to_vec()));
    }

    /// Forwards what [`FaultProxy::hold_matching`] held, and holds nothing more.
    pub fn release(&self) {
        self.faults.hold.send_replace(None);
    }

    /// Chunks [`FaultProxy::hold_matching`] held so far.
    pub fn held(&self) -> u64 {
        self.faults.held.load(Ordering::SeqCst)
    }

    /// Refuses (resets at once) new connections while `refuse` holds.
    pub fn refuse_new(&self, refuse: bool) {
        self.faults.refuse.store(refuse, Ordering::SeqCst);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.faults.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.acceptor.abort();
        if let Some(r) = self.resetter.lock().unwrap().take() {
            r.abort();
        }
        // Ends every connection.
        self.faults.resets.send_modify(|n| *n += 1);
    }
}

/// Closes `stream` with an RST when it is dropped. (A zero linger never blocks the
/// thread on drop: the connection is dropped at once.)
#[allow(deprecated)]
fn abort(stream: &TcpStream) {
    let _ = stream.set_linger(Some(Duration::ZERO));
}

/// One proxied connection, until either side closes or a reset.
async fn connection(mut client: TcpStream, upstream: SocketAddr, f: Arc<Faults>) {
    let mut resets = f.resets.subscribe();
    let server = tokio::select! {
        s = TcpStream::connect(upstream) => s,
        _ = resets.changed() => {
            abort(&client);
            return;
        }
    };
    let Ok(mut server) = server else {
        abort(&client);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    abort(&client);
    abort(&server);
    // Borrowed halves: dropping them sends nothing; dropping the streams (linger 0) at the
    // end sends the RST both ways.
    let (client_read, client_write) = client.split();
    let (server_read, server_write) = server.split();
    let up = pump(client_read, server_write, f.clone(), true);
    let down = pump(server_read, client_write, f.clone(), false);
    tokio::select! {
        _ = async { tokio::join!(up, down) } => {}
        _ = resets.changed() => {}
    }
}

/// Forwards `from` → `to`, each chunk delayed by the direction's latency, held while frozen
/// (and, client → server, while it matches [`FaultProxy::hold_matching`]).
async fn pump(mut from: ReadHalf<'_>, mut to: WriteHalf<'_>, f: Arc<Faults>, up: bool) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>, bool)>();
    let faults = f.clone();
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        let mut last = Instant::now();
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let latency = if up { &faults.up } else { &faults.down };
                    // In order: never before the chunk read earlier.
                    let at = (Instant::now() + faults.delay(latency)).max(last);
                    last = at;
                    let chunk = &buf[..n];
                    let held = up
                        && faults
                            .hold
                            .borrow()
                            .as_ref()
                            .is_some_and(|p| !p.is_empty() && chunk.windows(p.len()).any(|w| w == p.as_slice()));
                    if held {
                        faults.held.fetch_add(1, Ordering::SeqCst);
                    }
                    if tx.send((at, chunk.to_vec(), held)).is_err() {
                        break;
                    }
                }
            }
        }
    };
    let writer = async move {
        let mut frozen = f.frozen.subscribe();
        let mut hold = f.hold.subscribe();
        while let Some((at, bytes, held)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if frozen.wait_for(|f| !*f).await.is_err() {
                return;
            }
            if held && hold.wait_for(|h| h.is_none()).await.is_err() {
                return;
            }
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}
