//! Group writes: calls that arrive while a write is on its way to the database wait and
//! go together in the next one, the way the embedded store's writer groups its commits. A
//! lone call goes at once, so grouping delays nothing when there is nothing to group; under
//! load, one database command carries the writes of every worker that finished meanwhile.
//!
//! A group may have a window: a round then waits up to that long for more calls before
//! it starts, unless it is full, so a lone call is delayed by the window at most.
//!
//! A round runs on a task of its own, so a caller that stops waiting (its future dropped)
//! never strands the calls grouped with it. Each call gets its own answer; a call the round
//! could not make (an earlier write of the round failed) goes into the next round, so one
//! call's failure is that call's alone.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::sync::oneshot;

/// What a round did with one call.
#[derive(Debug)]
pub enum Turn<R, A> {
    /// Made, with this answer.
    Done(A),
    /// Not made (an earlier write of the round failed before it): it goes again.
    Again(R),
}

/// Runs one round: the calls in the order they came, an answer for each in that order.
type Round<R, A> = dyn Fn(Vec<R>) -> BoxFuture<'static, Vec<Turn<R, A>>> + Send + Sync;

/// Calls waiting for their round, and whether a round is running.
struct State<R, A> {
    waiting: VecDeque<(R, oneshot::Sender<A>)>,
    running: bool,
}

struct Inner<R, A> {
    state: Mutex<State<R, A>>,
    round: Box<Round<R, A>>,
    /// Most calls in one round.
    most: usize,
    /// How long a round waits for more calls before it starts, unless it is full.
    gather: Duration,
    /// Told when the calls waiting fill a round.
    full: tokio::sync::Notify,
}

impl<R, A> Inner<R, A> {
    fn state(&self) -> MutexGuard<'_, State<R, A>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A group of calls of one kind (see the module's doc). Cloning shares the group.
pub struct Group<R, A> {
    inner: Arc<Inner<R, A>>,
}

impl<R, A> Clone for Group<R, A> {
    fn clone(&self) -> Self {
        Group {
            inner: self.inner.clone(),
        }
    }
}

impl<R: Send + 'static, A: Send + 'static> Group<R, A> {
    /// A group whose rounds `round` makes, each of at most `most` calls, each round
    /// waiting up to `gather` for more calls before it starts.
    pub fn new(
        most: usize,
        gather: Duration,
        round: impl Fn(Vec<R>) -> BoxFuture<'static, Vec<Turn<R, A>>> + Send + Sync + 'static,
    ) -> Self {
        Group {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    waiting: VecDeque::new(),
                    running: false,
                }),
                round: Box::new(round),
                most: most.max(1),
                gather,
                full: tokio::sync::Notify::new(),
            }),
        }
    }

    /// Makes `call` in the next round and answers what the round answered for it. `None`
    /// when no round could answer: the round's code panicked, or the runtime running it
    /// shut down. Whether such a call was made is unknown.
    pub async fn call(&self, call: R) -> Option<A> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut s = self.inner.state();
            s.waiting.push_back((call, tx));
            if s.waiting.len() == self.inner.most {
                self.inner.full.notify_waiters();
            }
            !std::mem::replace(&mut s.running, true)
        };
        if start {
            // The guard goes with the future, so a round task dropped before it ever ran
            // (its runtime shutting down) still leaves the group idle.
            tokio::spawn(rounds(self.inner.clone(), Idle(Some(self.inner.clone()))));
        }
        rx.await.ok()
    }
}

/// Marks the group idle when its rounds end early (the runtime shutting down while one
/// runs): the calls still waiting are answered with nothing, and the next call starts
/// rounds again.
struct Idle<R, A>(Option<Arc<Inner<R, A>>>);

impl<R, A> Drop for Idle<R, A> {
    fn drop(&mut self) {
        if let Some(inner) = self.0.take() {
            let mut s = inner.state();
            s.running = false;
            s.waiting.clear();
        }
    }
}

/// Rounds until no call waits.
async fn rounds<R: Send + 'static, A: Send + 'static>(inner: Arc<Inner<R, A>>, mut idle: Idle<R, A>) {
    loop {
        let gather = {
            let mut s = inner.state();
            if s.waiting.is_empty() {
                s.running = false;
                idle.0 = None;
                return;
            }
            !inner.gather.is_zero() && s.waiting.len() < inner.most
        };
        if gather {
            tokio::select! {
                _ = tokio::time::sleep(inner.gather) => {}
                _ = inner.full.notified() => {}
            }
        }
        let taken: Vec<(R, oneshot::Sender<A>)> = {
            let mut s = inner.state();
            let n = s.waiting.len().min(inner.most);
            s.waiting.drain(..n).collect()
        };
        let (calls, answers): (Vec<R>, Vec<oneshot::Sender<A>>) = taken.into_iter().unzip();
        let count = calls.len();
        // A panic, building the round or running it, or a round that lost count: its
        // callers get no answer.
        let Ok(round) = std::panic::catch_unwind(AssertUnwindSafe(|| (inner.round)(calls))) else {
            continue;
        };
        let turns = match AssertUnwindSafe(round).catch_unwind().await {
            Ok(turns) if turns.len() == count => turns,
            _ => continue,
        };
        let mut again = Vec::new();
        for (turn, tx) in turns.into_iter().zip(answers) {
            match turn {
                Turn::Done(a) => {
                    let _ = tx.send(a);
                }
                Turn::Again(r) => again.push((r, tx)),
            }
        }
        let mut s = inner.state();
        for call in again.into_iter().rev() {
            s.waiting.push_front(call);
        }
    }
}

#[cfg(test)]
mod tests;
