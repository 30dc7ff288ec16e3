//! Taking the DEN's node name at start-up.
//!
//! A name held by a live DEN of ours is refused at once. A name held by a Disbatch 4 DEN
//! (a node document without a process marker, see `store::mongo::nodes`) whose heartbeat
//! is fresh is waited for, since during a move from Disbatch 4 the `disbatchd` that used
//! the name has usually just been stopped: the DEN watches the heartbeat for up to
//! `heartbeat_stale` plus [`DISBATCH4_TAKEOVER_MARGIN`] and takes the name once it is
//! stale, either by the clock (older than `heartbeat_stale`) or by watching (unchanged for
//! `heartbeat_stale`, whatever the other host's clock says). A heartbeat still fresh at
//! the end of the wait belongs to a `disbatchd` that still runs: the DEN stops, saying so.

use std::time::Duration;

use bson::DateTime;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{before, Den, DenError};
use crate::model::NameHolder;

/// How much longer than `heartbeat_stale` a starting DEN waits for the heartbeat of a
/// Disbatch 4 DEN holding its node name to go stale: room for a `disbatchd` stopped a few
/// seconds after this DEN started, and for its last heartbeat still on the way.
pub const DISBATCH4_TAKEOVER_MARGIN: Duration = Duration::from_secs(10);

/// The watch over a Disbatch 4 holder's heartbeat while the name is waited for.
struct Watch {
    /// When the wait began, on the wall clock (for the log).
    began: DateTime,
    began_at: Instant,
    /// When the wait ends.
    deadline: Instant,
    /// The heartbeat last read, and when it was first read with that value.
    last: Option<DateTime>,
    since: Instant,
    /// How often the heartbeat changed while watched.
    moves: u32,
}

impl Watch {
    fn new(heartbeat: Option<DateTime>, stale: Duration) -> Watch {
        let now = Instant::now();
        Watch {
            began: DateTime::now(),
            began_at: now,
            deadline: now + stale + DISBATCH4_TAKEOVER_MARGIN,
            last: heartbeat,
            since: now,
            moves: 0,
        }
    }

    /// Records the heartbeat as just read.
    fn saw(&mut self, heartbeat: Option<DateTime>) {
        if heartbeat != self.last {
            self.last = heartbeat;
            self.since = Instant::now();
            self.moves += 1;
        }
    }

    /// The `stale_before` to take the name with: by the clock, and past the heartbeat
    /// watched once it has not moved for `stale`.
    fn stale_before(&self, stale: Duration) -> DateTime {
        let by_clock = before(DateTime::now(), stale);
        match self.last {
            Some(t) if self.since.elapsed() >= stale => by_clock.max(DateTime::from_millis(t.timestamp_millis() + 1)),
            _ => by_clock,
        }
    }

    /// The wall-clock time the wait ends.
    fn deadline_wall(&self) -> DateTime {
        let left = self.deadline.saturating_duration_since(self.began_at);
        DateTime::from_millis(self.began.timestamp_millis() + left.as_millis() as i64)
    }
}

impl Den {
    /// Takes this DEN's node name, or fails when another live DEN holds it. A holder whose
    /// heartbeat is stale, or that ran on this machine and whose pid is gone (a DEN
    /// restarted after a crash), gives the name up; a Disbatch 4 holder whose heartbeat is
    /// fresh is waited for (see the module's doc). Returns false when `shutdown` came
    /// during that wait, the name not taken.
    pub(super) async fn take_node_name(&self, shutdown: &CancellationToken) -> Result<bool, DenError> {
        let s = &self.settings;
        let take = |stale_before| crate::lifecycle::nodes::take(&*self.store, &s.node, &self.process, stale_before);
        let mut watch: Option<Watch> = None;
        loop {
            let stale_before = watch.as_ref().map_or_else(
                || before(DateTime::now(), s.heartbeat_stale),
                |w| w.stale_before(s.heartbeat_stale),
            );
            let holder = match take(stale_before).await.map_err(DenError::Startup)? {
                Some(NameHolder::Den(gone)) if gone.is_dead_here() => {
                    info!(pid = gone.pid, "taking over the node name of a DEN that is gone");
                    // Every holder counts as stale now.
                    let always = DateTime::from_millis(i64::MAX);
                    take(always).await.map_err(DenError::Startup)?
                }
                other => other,
            };
            // A Disbatch 4 holder's tasks are counted only once its heartbeat is stale:
            // none means the heartbeat is fresh.
            let (heartbeat, heartbeat_age) = match holder {
                None => {
                    if let Some(w) = &watch {
                        info!(
                            waited_secs = w.began_at.elapsed().as_secs_f64(),
                            "the heartbeat of the Disbatch 4 DEN that held this node name went stale; took the name over"
                        );
                    }
                    return Ok(true);
                }
                Some(NameHolder::Foreign {
                    heartbeat,
                    heartbeat_age,
                    tasks: 0,
                }) => (heartbeat, heartbeat_age),
                Some(holder) => {
                    return Err(DenError::NodeInUse {
                        node: s.node.clone(),
                        holder,
                    })
                }
            };
            let w = match watch.take() {
                Some(mut w) => {
                    w.saw(heartbeat);
                    w
                }
                None => {
                    let w = Watch::new(heartbeat, s.heartbeat_stale);
                    warn!(
                        "node name {:?} is held by a Disbatch 4 DEN (its node document has no process marker) \
                         whose last heartbeat{} is {:.0} s old; waiting until {} (heartbeat_stale, {} s, plus {} s) \
                         for it to go stale before taking the name; if that disbatchd still runs, stop it",
                        s.node,
                        heartbeat
                            .and_then(|t| t.try_to_rfc3339_string().ok())
                            .map_or_else(String::new, |t| format!(", at {t},")),
                        heartbeat_age.as_secs_f64(),
                        w.deadline_wall().try_to_rfc3339_string().unwrap_or_default(),
                        s.heartbeat_stale.as_secs_f64(),
                        DISBATCH4_TAKEOVER_MARGIN.as_secs(),
                    );
                    w
                }
            };
            let now = Instant::now();
            if now >= w.deadline {
                return Err(DenError::Disbatch4Running {
                    node: s.node.clone(),
                    waited: now - w.began_at,
                    moves: w.moves,
                    heartbeat_age: w.since.elapsed(),
                });
            }
            let pause = s.tick.min(w.deadline - now);
            watch = Some(w);
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(false),
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }
}

/// The message of [`DenError::NodeInUse`].
pub(super) fn name_in_use(node: &str, holder: &NameHolder) -> String {
    let advice = "give this DEN another name with DISBATCH_NODE or the config's `node`, or stop the other one";
    match holder {
        NameHolder::Den(p) => format!(
            "node name {node:?} is held by a running DEN (pid {} on {}, since {}); {advice}",
            p.pid,
            p.host,
            p.started.try_to_rfc3339_string().unwrap_or_default()
        ),
        NameHolder::Foreign {
            heartbeat_age,
            tasks: 0,
            ..
        } => format!(
            "node name {node:?} is held by a DEN without a process marker (a Disbatch 4 disbatchd?) whose \
             heartbeat is {:.0} s old; {advice}, and wait until its heartbeat is older than heartbeat_stale",
            heartbeat_age.as_secs_f64()
        ),
        NameHolder::Foreign { tasks, .. } => format!(
            "node name {node:?} was a Disbatch 4 node and still has {tasks} claimed or running tasks, which its \
             task runners may still finish; give this DEN another name with DISBATCH_NODE or the config's \
             `node`, or start it once they have ended"
        ),
    }
}

/// The message of [`DenError::Disbatch4Running`].
pub(super) fn disbatch4_running(node: &str, waited: Duration, moves: u32, heartbeat_age: Duration) -> String {
    format!(
        "node name {node:?} is held by a Disbatch 4 disbatchd that is still running: its heartbeat (a node \
         document without a process marker) moved {moves} time{} during the {:.0} s this DEN waited for it to \
         go stale, the last time {:.0} s ago; stop that disbatchd and start this DEN again, or give this DEN \
         another name with DISBATCH_NODE or the config's `node`",
        if moves == 1 { "" } else { "s" },
        waited.as_secs_f64(),
        heartbeat_age.as_secs_f64(),
    )
}
