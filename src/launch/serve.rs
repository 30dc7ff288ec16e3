//! The DCI's HTTP server: hyper's HTTP/1 connections, each served under the timeouts of
//! [`HttpSettings`], at most [`connection_cap`] of them at once.
//!
//! - **The cap.** Every connection holds a file descriptor, and so do the DEN's plugins
//!   (`disbatch dev`), the database pools and the store's files. The cap is the smaller
//!   of `http_max_connections` and the open-files limit less a reserve for the rest of
//!   the process ([`fd_reserve`]). At the cap the server stops accepting: connections
//!   past it wait in the kernel's listen backlog (no descriptor of ours) and are served in
//!   order as slots free, which the timeouts below guarantee for idle ones. Accepting and
//!   closing them instead would cost a descriptor and a wake-up each and turn a wait
//!   into a failure for every honest client that comes during a flood.
//! - **The header timeout.** A connection must deliver a complete request head within
//!   `http_header_timeout` of its opening, and of the first byte of each later head:
//!   a client that sends nothing, or half a head (slowloris), is dropped.
//! - **The idle timeout.** A keep-alive connection with no request in progress is closed
//!   `http_idle_timeout` after its last answer. A request in progress (a long-poll of
//!   `GET /tasks/wait`, a stream of `GET /tasks/{id}/events`) is never cut by either.
//! - **The write timeout.** An answer the client does not read (its socket accepts no
//!   byte) for `http_idle_timeout` closes the connection: a client that asks and never
//!   reads cannot hold its slot for good.
//! - **Bodies.** Every request body is read under `http_body_timeout`
//!   ([`crate::api::TimedBody`]).
//! - **Graceful shutdown.** When `shutdown` is cancelled the listener closes, idle
//!   connections close, requests in progress are answered, and after [`DRAIN_LIMIT`]
//!   the connections still open are dropped.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use super::StartError;
use crate::api::TimedBody;
use crate::config::HttpSettings;

/// The fewest file descriptors kept for the rest of the process, whatever the limit.
pub const FD_RESERVE_MIN: u64 = 256;
/// How long a graceful shutdown waits for requests in progress.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(10);

/// File descriptors kept for the rest of the process under an open-files limit of
/// `limit`: a quarter of it, at least [`FD_RESERVE_MIN`].
pub fn fd_reserve(limit: u64) -> u64 {
    (limit / 4).max(FD_RESERVE_MIN)
}

/// The most connections served at once: `configured`, less when the open-files limit
/// (`RLIMIT_NOFILE`'s soft limit) minus [`fd_reserve`] leaves less room; at least 1.
pub fn connection_cap(configured: usize) -> usize {
    let limit = open_files_limit();
    let room = limit.saturating_sub(fd_reserve(limit));
    configured.min(usize::try_from(room).unwrap_or(usize::MAX)).max(1)
}

fn open_files_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for getrlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 || lim.rlim_cur == libc::RLIM_INFINITY {
        return u64::MAX;
    }
    lim.rlim_cur
}

/// Serves `app` on `listener` under `http` until `shutdown` is cancelled, then shuts down
/// gracefully.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    http: &HttpSettings,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    let cap = connection_cap(http.max_connections);
    if cap < http.max_connections {
        tracing::info!(
            max_connections = cap,
            configured = http.max_connections,
            "the open-files limit leaves room for fewer connections than http_max_connections"
        );
    }
    let slots = Arc::new(Semaphore::new(cap));
    let mut builder = hyper::server::conn::http1::Builder::new();
    // Our own header timeout below; hyper's would also cut idle keep-alive connections.
    builder.header_read_timeout(None);
    let builder = Arc::new(builder);
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => p.map_err(|e| StartError::Failed(format!("the web server failed: {e}")))?,
            () = shutdown.cancelled() => break,
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    accept_failed(&e).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let conn = Connection {
            builder: builder.clone(),
            app: app.clone(),
            http: http.clone(),
            shutdown: shutdown.clone(),
        };
        tokio::spawn(conn.run(stream, permit));
    }
    drop(listener);
    let all = u32::try_from(cap).unwrap_or(u32::MAX);
    if tokio::time::timeout(DRAIN_LIMIT, slots.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!(
            "requests still in progress {}s after the shutdown began are dropped",
            DRAIN_LIMIT.as_secs()
        );
    }
    Ok(())
}

/// Logs a failed accept and, when it is the process's (out of descriptors or memory)
/// rather than one connection's, waits a little before the next.
async fn accept_failed(e: &io::Error) {
    use io::ErrorKind::*;
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionReset | ConnectionRefused | Interrupted
    ) {
        return;
    }
    tracing::warn!(error = %e, "cannot accept a connection; trying again in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// What serving one connection needs.
struct Connection {
    builder: Arc<hyper::server::conn::http1::Builder>,
    app: Router,
    http: HttpSettings,
    shutdown: CancellationToken,
}

impl Connection {
    /// Serves `stream` until it closes, times out or the shutdown ends it; the connection's
    /// slot (`_permit`) is given back then.
    async fn run(self, stream: TcpStream, _permit: OwnedSemaphorePermit) {
        let activity = Arc::new(Activity::new());
        let io = TokioIo::new(Watched {
            stream,
            activity: activity.clone(),
        });
        let (app, body_timeout) = (self.app, self.http.body_timeout);
        let requests = activity.clone();
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let guard = RequestGuard::start(requests.clone());
            let request = request.map(|b| Body::new(TimedBody::new(b, body_timeout)));
            let app = app.clone();
            async move {
                let response = app.oneshot(request).await?;
                Ok::<_, std::convert::Infallible>(response.map(|body| Body::new(Tracked { body, _guard: guard })))
            }
        });
        let conn = self.builder.serve_connection(io, service);
        tokio::pin!(conn);
        let mut draining = false;
        loop {
            let wake = activity
                .deadline(&self.http)
                .unwrap_or_else(|| Instant::now() + self.http.idle_timeout.min(self.http.header_timeout));
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "HTTP connection ended");
                    }
                    return;
                }
                () = self.shutdown.cancelled(), if !draining => {
                    conn.as_mut().graceful_shutdown();
                    draining = true;
                }
                () = tokio::time::sleep_until(wake) => {
                    if activity.deadline(&self.http).is_some_and(|d| d <= Instant::now()) {
                        tracing::debug!("HTTP connection closed: no complete request head in time, idle, or its answer not read");
                        return;
                    }
                }
            }
        }
    }
}

/// Where a connection is: waiting for (or reading) a request head since an instant,
/// idle after an answer since an instant, or serving requests.
#[derive(Debug, Clone, Copy)]
enum Phase {
    Head(Instant),
    Idle(Instant),
    Busy(usize),
}

/// A connection's [`Phase`], and since when its socket has taken no byte of an answer
/// (`None` while writes go through), shared by its socket, its service and its watchdog.
struct Activity(Mutex<Phase>, Mutex<Option<Instant>>);

impl Activity {
    fn new() -> Activity {
        Activity(Mutex::new(Phase::Head(Instant::now())), Mutex::new(None))
    }

    fn with<T>(&self, f: impl FnOnce(&mut Phase) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// A write went through (`true`) or found the socket full (`false`).
    fn wrote(&self, through: bool) {
        let mut blocked = self.1.lock().unwrap_or_else(|e| e.into_inner());
        match (through, *blocked) {
            (true, _) => *blocked = None,
            (false, None) => *blocked = Some(Instant::now()),
            (false, Some(_)) => {}
        }
    }

    /// Bytes came in: an idle connection starts a request head.
    fn read(&self) {
        self.with(|p| {
            if let Phase::Idle(_) = p {
                *p = Phase::Head(Instant::now());
            }
        });
    }

    /// When the connection is to be closed if nothing changes; `None` while serving
    /// (unless the client stopped reading the answer).
    fn deadline(&self, http: &HttpSettings) -> Option<Instant> {
        match self.with(|p| *p) {
            Phase::Head(since) => Some(since + http.header_timeout),
            Phase::Idle(since) => Some(since + http.idle_timeout),
            Phase::Busy(_) => {
                (*self.1.lock().unwrap_or_else(|e| e.into_inner())).map(|since| since + http.idle_timeout)
            }
        }
    }
}

/// A request in progress on a connection, from its head to the end of its answer.
struct RequestGuard(Arc<Activity>);

impl RequestGuard {
    fn start(activity: Arc<Activity>) -> RequestGuard {
        activity.with(|p| {
            *p = match *p {
                Phase::Busy(n) => Phase::Busy(n + 1),
                _ => Phase::Busy(1),
            }
        });
        RequestGuard(activity)
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.with(|p| {
            *p = match *p {
                Phase::Busy(n) if n > 1 => Phase::Busy(n - 1),
                _ => Phase::Idle(Instant::now()),
            }
        });
    }
}

/// An answer's body, which ends its request when it is dropped (sent, or the connection
/// gone).
struct Tracked {
    body: Body,
    _guard: RequestGuard,
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The socket, telling the connection's [`Activity`] when bytes come in.
struct Watched {
    stream: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read();
        }
        r
    }
}

impl Watched {
    /// Tells the [`Activity`] whether a write went through.
    fn wrote<T>(&self, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match &r {
            Poll::Pending => self.activity.wrote(false),
            Poll::Ready(_) => self.activity.wrote(true),
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.wrote(r)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.wrote(r)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_and_the_cap() {
        assert_eq!(fd_reserve(400), 256);
        assert_eq!(fd_reserve(20_000), 5_000);
        assert!(connection_cap(usize::MAX) < usize::MAX);
        assert_eq!(connection_cap(1), 1);
    }
}
