//! The bytes a task's HTTP bodies may carry (`http_max_body_mib`), counted as they pass.

use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use wasmtime_wasi_http::Error;

use super::notes::Notes;

/// The bytes a task's request and response bodies may still carry.
#[derive(Clone)]
pub(super) struct Budget {
    pub(super) left: Arc<AtomicU64>,
    pub(super) limit: u64,
    pub(super) notes: Notes,
    /// Requests open now.
    pub(super) open: Arc<AtomicU32>,
}

impl Budget {
    fn take(&self, n: u64) -> bool {
        self.left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| left.checked_sub(n))
            .is_ok()
    }
}

/// A body whose bytes are taken from the task's budget.
pub(super) struct Counted<B> {
    inner: B,
    budget: Budget,
    sending: bool,
    over: bool,
}

impl<B> Counted<B> {
    pub(super) fn new(inner: B, budget: Budget, sending: bool) -> Self {
        Counted {
            inner,
            budget,
            sending,
            over: false,
        }
    }
}

impl<B> Body for Counted<B>
where
    B: Body<Data = Bytes, Error = Error> + Unpin,
{
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        if self.over {
            return Poll::Ready(None);
        }
        let frame = std::task::ready!(Pin::new(&mut self.inner).poll_frame(cx));
        if let Some(Ok(f)) = &frame {
            let n = f.data_ref().map_or(0, |d| d.len() as u64);
            if !self.budget.take(n) {
                self.over = true;
                let limit = self.budget.limit;
                self.budget.notes.push(format!(
                    "HTTP body refused: the task's requests and responses passed {} of body, its limit (sandbox.http_max_body_mib)",
                    crate::runner::human_bytes(limit)
                ));
                return Poll::Ready(Some(Err(if self.sending {
                    Error::HttpRequestBodySize(Some(limit))
                } else {
                    Error::HttpResponseBodySize(Some(limit))
                })));
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.over || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
