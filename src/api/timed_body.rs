//! [`TimedBody`]: a request body that must keep coming. A client that stops sending the
//! body it announced (or trickles it) would otherwise hold its connection, and for
//! `POST /plugins` the single upload turn, for as long as it stays connected.
//!
//! The rule: no pause longer than the timeout (`http_body_timeout`), and from the
//! timeout on, on average at least [`MIN_BODY_RATE`] bytes a second since the handler
//! started reading. A body that breaks it ends with [`BodyTimeout`], which the handlers
//! answer with 408 ([`timed_out`] finds it in an error's chain).

use std::error::Error;
use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

/// The slowest average rate a request body may arrive at once the grace (the timeout) has
/// passed: 16 KiB/s.
pub const MIN_BODY_RATE: u64 = 16 * 1024;

/// Why a request body was cut.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "the request body {what}: it was cut after {received} bytes; send it again \
     (http_body_timeout allows pauses of up to {}s and then at least {} KiB/s on average)",
    .timeout.as_secs_f64(),
    MIN_BODY_RATE / 1024
)]
pub struct BodyTimeout {
    /// `stalled` or `arrived too slowly`, with the figures.
    what: String,
    received: u64,
    timeout: Duration,
}

/// A body cut with [`BodyTimeout`] when it pauses longer than `timeout` or, after
/// `timeout`, arrives slower than [`MIN_BODY_RATE`] on average. The clock starts when the
/// body is first read.
pub struct TimedBody<B> {
    inner: B,
    timeout: Duration,
    started: Option<Instant>,
    last: Instant,
    received: u64,
    sleep: Pin<Box<Sleep>>,
}

impl<B> TimedBody<B> {
    /// `inner` under `timeout`.
    pub fn new(inner: B, timeout: Duration) -> TimedBody<B> {
        let now = Instant::now();
        TimedBody {
            inner,
            timeout,
            started: None,
            last: now,
            received: 0,
            sleep: Box::pin(tokio::time::sleep_until(now + timeout)),
        }
    }

    /// When the body breaks the rule if nothing more arrives, and which part it breaks.
    fn deadline(&self, started: Instant) -> (Instant, bool) {
        let pause = self.last + self.timeout;
        let rate = started + self.timeout + Duration::from_secs_f64(self.received as f64 / MIN_BODY_RATE as f64);
        if rate < pause {
            (rate, true)
        } else {
            (pause, false)
        }
    }

    fn error(&self, slow: bool, started: Instant) -> BodyTimeout {
        let what = if slow {
            format!(
                "arrived too slowly ({} bytes in {:.0}s)",
                self.received,
                started.elapsed().as_secs_f64()
            )
        } else {
            format!("stalled (nothing for {}s)", self.timeout.as_secs_f64())
        };
        BodyTimeout {
            what,
            received: self.received,
            timeout: self.timeout,
        }
    }
}

impl<B> Body for TimedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn Error + Send + Sync>;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        let started = match this.started {
            Some(started) => started,
            None => {
                let now = Instant::now();
                this.started = Some(now);
                this.last = now;
                now
            }
        };
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.received += data.len() as u64;
                    this.last = Instant::now();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                let (deadline, slow) = this.deadline(started);
                if this.sleep.deadline() != deadline {
                    this.sleep.as_mut().reset(deadline);
                }
                match this.sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(this.error(slow, started))))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The [`BodyTimeout`] in the chain of `e`, if any.
pub(super) fn timed_out<'a>(e: &'a (dyn Error + 'static)) -> Option<&'a BodyTimeout> {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(t) = e.downcast_ref::<BodyTimeout>() {
            return Some(t);
        }
        next = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt as _;
    use http_body_util::{BodyExt, StreamBody};

    type Chunks = StreamBody<futures::stream::BoxStream<'static, Result<Frame<Bytes>, std::io::Error>>>;

    /// `sizes` at once, then nothing more ever when `stall`.
    fn body(sizes: Vec<usize>, stall: bool) -> Chunks {
        let chunks = futures::stream::iter(sizes).map(|len| Ok(Frame::data(Bytes::from(vec![b'x'; len]))));
        let s = if stall {
            chunks.chain(futures::stream::pending()).boxed()
        } else {
            chunks.boxed()
        };
        StreamBody::new(s)
    }

    #[tokio::test]
    async fn a_whole_body_passes_a_stalled_one_is_cut() {
        let ok = TimedBody::new(body(vec![200_000, 200_000], false), Duration::from_millis(100));
        assert_eq!(ok.collect().await.unwrap().to_bytes().len(), 400_000);

        let stalled = TimedBody::new(body(vec![10], true), Duration::from_millis(100));
        let e = stalled.collect().await.unwrap_err();
        let e = timed_out(&*e).expect("a BodyTimeout").to_string();
        assert!(e.contains("stalled") && e.contains("after 10 bytes"), "{e}");
    }

    #[tokio::test]
    async fn after_the_grace_a_trickle_is_held_to_the_minimum_rate() {
        let t = Duration::from_secs(10);
        let mut b = TimedBody::new(body(vec![], false), t);
        let started = Instant::now();
        // A byte a second never pauses 10 s, but 60 bytes after a minute is far under the rate.
        b.last = started + Duration::from_secs(59);
        b.received = 60;
        let (deadline, slow) = b.deadline(started);
        assert!(slow);
        assert!(
            deadline < started + t + Duration::from_millis(10),
            "{:?}",
            deadline - started
        );
        // At the rate, the deadline moves on with every byte.
        b.received = MIN_BODY_RATE * 60;
        b.last = started + Duration::from_secs(60);
        let (deadline, slow) = b.deadline(started);
        assert!(!slow);
        assert_eq!(deadline, started + Duration::from_secs(70));
    }
}
