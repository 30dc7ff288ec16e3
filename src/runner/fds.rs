//! The process-wide budget of file descriptors that plugins make the host hold.
//!
//! Every file or directory a plugin opens, every socket it creates and every HTTP request
//! it has open holds one of the process's descriptors, and the process has
//! `RLIMIT_NOFILE` of them for everything: the store's connections, the API's clients, the
//! compile cache, the instances' memory. Per-task handle caps do not bound the sum over
//! tasks, so plugins draw on one budget:
//!
//! - the budget is half the soft `RLIMIT_NOFILE` when it is first needed (after the DEN
//!   raised its soft limit), the other half being the process's own reserve;
//! - one task may hold at most a quarter of the budget (and never more than its handle cap
//!   allows), so tasks of other queues still find descriptors;
//! - past either, the call fails with an error code (`insufficient-memory` for an open,
//!   `new-socket-limit` for a socket, `connection-limit-reached` for a request) and the
//!   task's stderr gets a host note naming the limit; the process goes on.
//!
//! A descriptor is counted from the call that makes it until the plugin drops its handle,
//! or the task ends. The streams made from an open file (`read-via-stream`,
//! `write-via-stream`, `append-via-stream`) hold the same descriptor: its place is given
//! back only when the file's handle and every stream made from it are dropped (see
//! [`super::filestreams`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// What plugins together may hold: the soft `RLIMIT_NOFILE` over this.
pub const LIMIT_DIVISOR: usize = 2;
/// What one task may hold: the budget over this.
pub const TASK_DIVISOR: usize = 4;
/// The soft limit assumed when it cannot be read or is unlimited.
const FALLBACK_LIMIT: usize = 1 << 20;

/// The process-wide count.
struct Budget {
    limit: usize,
    used: AtomicUsize,
}

static BUDGET: OnceLock<Budget> = OnceLock::new();

/// The process's soft limit on open files.
fn soft_limit() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for getrlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 || lim.rlim_cur == libc::RLIM_INFINITY {
        return FALLBACK_LIMIT;
    }
    usize::try_from(lim.rlim_cur)
        .unwrap_or(FALLBACK_LIMIT)
        .min(FALLBACK_LIMIT)
}

fn budget() -> &'static Budget {
    BUDGET.get_or_init(|| Budget {
        limit: soft_limit() / LIMIT_DIVISOR,
        used: AtomicUsize::new(0),
    })
}

/// The descriptors plugins of this process may hold together, and one task of handle cap
/// `max_handles` alone.
pub fn descriptor_budget(max_handles: usize) -> (usize, usize) {
    let total = budget().limit;
    (total, (total / TASK_DIVISOR).min(max_handles))
}

/// One task's account on the budget. Shared by its state and its HTTP requests.
pub(crate) struct TaskFds {
    share: usize,
    held: AtomicUsize,
    /// The first refusal, reported as a host note.
    refused: Mutex<Option<String>>,
}

impl TaskFds {
    pub(crate) fn new(max_handles: usize) -> Arc<Self> {
        Arc::new(TaskFds {
            share: descriptor_budget(max_handles).1,
            held: AtomicUsize::new(0),
            refused: Mutex::new(None),
        })
    }

    /// Takes one descriptor for `what` ("a file", "a socket"…), or refuses it and notes why.
    pub(crate) fn take(self: &Arc<Self>, what: &str) -> Option<FdToken> {
        let mine = self.held.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
            (n < self.share).then_some(n + 1)
        });
        if mine.is_err() {
            self.refuse(format!(
                "the plugin could not open {what}: the task holds {} descriptors (files, sockets, HTTP connections), \
                 its share of the process's budget; close what it no longer uses (retrying cannot help)",
                self.share
            ));
            return None;
        }
        let b = budget();
        let all = b
            .used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < b.limit).then_some(n + 1));
        if all.is_err() {
            self.held.fetch_sub(1, Ordering::SeqCst);
            self.refuse(format!(
                "the plugin could not open {what}: the plugins of this process hold {} descriptors, the budget \
                 (half of its open-files limit); retrying later may help",
                b.limit
            ));
            return None;
        }
        Some(FdToken {
            _shared: Arc::new(Held(self.clone())),
        })
    }

    fn refuse(&self, message: String) {
        tracing::debug!("{message}");
        self.refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(message);
    }

    /// The host note of a refusal, if there was one.
    pub(crate) fn note(&self) -> Option<String> {
        self.refused.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// One descriptor taken from the budget. Its clones share it (a file's handle and the
/// streams made from it hold one descriptor); it is given back when the last is dropped.
#[derive(Clone)]
pub(crate) struct FdToken {
    _shared: Arc<Held>,
}

/// The descriptor behind an [`FdToken`] and its clones.
struct Held(Arc<TaskFds>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.held.fetch_sub(1, Ordering::SeqCst);
        budget().used.fetch_sub(1, Ordering::SeqCst);
    }
}

impl std::fmt::Debug for FdToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FdToken")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_takes_at_most_its_share_and_gives_it_back() {
        let task = TaskFds::new(3);
        let (_, share) = descriptor_budget(3);
        assert_eq!(share, 3);
        let tokens: Vec<_> = (0..3).map(|_| task.take("a file").unwrap()).collect();
        assert!(task.take("a file").is_none());
        assert!(task.note().unwrap().contains("its share"));
        drop(tokens);
        assert!(task.take("a file").is_some());
    }

    #[test]
    fn a_shared_descriptor_is_given_back_with_its_last_holder() {
        let task = TaskFds::new(1);
        let file = task.take("a file").unwrap();
        let stream = file.clone();
        drop(file);
        assert!(task.take("a file").is_none(), "the stream still holds the descriptor");
        drop(stream);
        assert!(task.take("a file").is_some());
    }
}
