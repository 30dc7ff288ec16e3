//! QueueBalance, run by the leader when the config enables it (`balance.enabled`): about
//! once a second it shares the limit on running tasks in force now (`max_tasks`) between
//! the balanced queues' lanes, and writes each queue's share as its `maxthreads`, which
//! every DEN's slots enforce ([`Queue::limit`]).
//!
//! A share is never raised beyond what the budget holds: shares are lowered first, then
//! the slots in use are counted again (a DEN that took a slot under an older limit gives
//! it back before claiming, see [`slots::acquire_slot`](crate::lifecycle::slots::acquire_slot)), and a queue gets more only while
//! the sum over the balanced queues of max(slots in use, share) stays within `max_tasks`.
//! So the running tasks of the balanced queues never exceed it, even while the shares
//! move: a task already running is never stopped, a priority lane waits for a default
//! one to end.
//!
//! Share writes are fenced by the leader lease ([`Store::set_share`](crate::store::Store::set_share)):
//! a pass fences the queues with its token before it reads them, and a write refused by
//! the fence ends the pass, so a leader deposed in the middle of one changes nothing more.

use bson::{doc, DateTime};
use tracing::{debug, info, warn};

use super::Den;
use crate::lifecycle::slots;
use crate::model::balance::{allocate, Balance};
use crate::model::{status, Queue};
use crate::store::{StoreResult, TaskFilter};

/// What one pass reported in the `balance` document.
struct Report {
    status: &'static str,
    message: String,
    max_tasks_now: Option<i64>,
}

impl Report {
    fn ok(message: impl Into<String>) -> Report {
        Report {
            status: "OK",
            message: message.into(),
            max_tasks_now: None,
        }
    }
}

/// A balanced queue in one pass.
struct Member {
    queue: Queue,
    /// The share in force (the queue's limit).
    limit: i64,
    /// The share it should get.
    target: i64,
}

impl Den {
    /// One QueueBalance pass (the leader's). Reports its status in the document.
    pub(super) async fn balance_queues(&self) {
        let report = match self.balance_pass().await {
            Ok(r) => r,
            Err(crate::store::StoreError::Invalid(m)) if m == DEPOSED => {
                info!("QueueBalance: {m}");
                return;
            }
            Err(e) => Report {
                status: "CRITICAL",
                message: format!("QueueBalance cannot read or write the database: {e}"),
                max_tasks_now: None,
            },
        };
        if report.status != "OK" {
            warn!(status = report.status, "{}", report.message);
        }
        let mut fields = doc! {
            "status": report.status,
            "message": report.message,
            "timestamp": DateTime::now().timestamp_millis() / 1000,
        };
        if let Some(n) = report.max_tasks_now {
            fields.insert("max_tasks_now", n);
        }
        if let Err(e) = self.store.set_balance(fields).await {
            debug!(error = %e, "cannot report the QueueBalance status");
        }
    }

    async fn balance_pass(&self) -> StoreResult<Report> {
        let store = self.store.as_ref();
        let Some(token) = self.token() else {
            return Err(deposed());
        };
        // Fenced before the queues are read: a share write of an earlier leader either
        // landed before (and is read here) or changes nothing.
        let ids: Vec<_> = store.queues().await?.iter().map(|q| q.id).collect();
        store.fence_shares(&ids, token).await?;
        let queues = store.queues().await?;
        let doc = match store.balance().await {
            Ok(Some(d)) => d,
            Ok(None) => doc! {},
            Err(crate::store::StoreError::Malformed { reason, .. }) => {
                return Ok(critical(format!("balance: {reason}")));
            }
            Err(e) => return Err(e),
        };
        let balance = match Balance::from_document(&doc) {
            Ok(b) => b,
            Err(e) => return Ok(critical(format!("balance: {e}; the shares are left as they are"))),
        };
        let now = jiff::Zoned::now();
        if let Some(until) = balance.disabled {
            if until > now.timestamp().as_second() {
                self.lift(&queues, |_| true).await?;
                let until = jiff::Timestamp::from_second(until).map_or(until.to_string(), |t| t.to_string());
                return Ok(Report::ok(format!(
                    "QueueBalance disabled until {until}; queues run at their threads"
                )));
            }
        }
        let mut unknown = Vec::new();
        let mut twice = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut lanes: Vec<Vec<&Queue>> = Vec::new();
        for lane in &balance.lanes {
            let mut members = Vec::new();
            for name in lane {
                match Queue::find(&queues, name) {
                    None => unknown.push(name.as_str()),
                    Some(q) if !seen.insert(q.id) => twice.push(name.as_str()),
                    Some(q) => members.push(q),
                }
            }
            lanes.push(members);
        }
        let balanced: Vec<_> = lanes.iter().flatten().map(|q| q.id).collect();
        self.lift(&queues, |q| !balanced.contains(&q.id)).await?;
        if balanced.is_empty() {
            return Ok(Report::ok("QueueBalance is running (no queues to balance)"));
        }
        let weekday = now.weekday().to_sunday_zero_offset() as u8;
        let minute = u32::from(now.hour() as u8) * 60 + u32::from(now.minute() as u8);
        let Some(budget) = balance.max_tasks_at(weekday, minute) else {
            self.lift(&queues, |_| true).await?;
            return Ok(critical(
                "balance: `max_tasks` has no entries, so no limit: the queues run at their threads".into(),
            ));
        };
        let mut demands = Vec::new();
        for lane in &lanes {
            let mut d = Vec::new();
            for q in lane {
                let queued = store
                    .count_tasks(&TaskFilter {
                        queue: Some(q.id),
                        status: Some(vec![status::QUEUED]),
                        ..TaskFilter::default()
                    })
                    .await?;
                let in_use = slots::slots_in_use(store, q.id).await?;
                let own = q.threads.unwrap_or(0).max(0);
                d.push(own.min(in_use.saturating_add(i64::try_from(queued).unwrap_or(i64::MAX))));
            }
            demands.push(d);
        }
        let targets = allocate(budget, &demands, now.timestamp().as_second().unsigned_abs() as usize);
        let mut members: Vec<Member> = Vec::new();
        // Priority order: the lanes after the first, then the default lane.
        for l in (1..lanes.len()).chain(std::iter::once(0)) {
            for (q, target) in lanes[l].iter().zip(&targets[l]) {
                members.push(Member {
                    limit: q.limit(),
                    queue: (*q).clone(),
                    target: *target,
                });
            }
        }
        let changed = self.apply_shares(&mut members, budget).await?;
        if self.settings.balance.verbose {
            let shares: Vec<String> = members
                .iter()
                .map(|m| format!("{}={} (wants {})", m.queue.name, m.limit, m.target))
                .collect();
            info!(max_tasks = budget, shares = %shares.join(", "), "QueueBalance pass");
        }
        let mut message = "QueueBalance is running".to_string();
        if changed && self.settings.balance.pretend {
            message.push_str(" (pretend: shares computed, not written)");
        }
        if !unknown.is_empty() || !twice.is_empty() {
            let mut faults = Vec::new();
            if !unknown.is_empty() {
                faults.push(format!("no queue is named {}", unknown.join(", ")));
            }
            if !twice.is_empty() {
                faults.push(format!("{} named again (its first lane counts)", twice.join(", ")));
            }
            return Ok(Report {
                status: "WARNING",
                message: format!("QueueBalance: {}; the others are balanced", faults.join("; ")),
                max_tasks_now: Some(budget),
            });
        }
        Ok(Report {
            status: "OK",
            message,
            max_tasks_now: Some(budget),
        })
    }

    /// Lowers the shares that must go down, counts the slots in use again, then raises
    /// shares, in priority order, while the budget holds them. Whether any share changed.
    async fn apply_shares(&self, members: &mut [Member], budget: i64) -> StoreResult<bool> {
        let token = self.token();
        let mut changed = false;
        // Lowered, or given a share for the first time (never more than it may run now).
        for m in members
            .iter_mut()
            .filter(|m| m.queue.maxthreads.is_none_or(|s| s > m.target))
        {
            self.set_share(&m.queue, Some(m.target), m.limit).await?;
            m.limit = m.limit.min(m.target);
            m.queue.maxthreads = Some(m.target);
            changed = true;
        }
        let mut in_use = Vec::with_capacity(members.len());
        for m in members.iter() {
            in_use.push(slots::slots_in_use(&*self.store, m.queue.id).await?);
        }
        if !self.still_leads(token).await? {
            warn!("QueueBalance: the leader lease passed on during the pass; raising no share");
            return Ok(changed);
        }
        let mut bound: i64 = members.iter().zip(&in_use).map(|(m, u)| m.limit.max(*u)).sum();
        for (m, used) in members.iter_mut().zip(&in_use) {
            let share = m.queue.maxthreads.unwrap_or(0);
            let now = m.limit.max(*used);
            let room = (budget - bound).max(0);
            let new = m.target.min(now + room);
            if new > share {
                self.set_share(&m.queue, Some(new), m.limit).await?;
                let limit = m.queue.threads.unwrap_or(0).max(0).min(new);
                bound += limit.max(*used) - now;
                m.limit = limit;
                m.queue.maxthreads = Some(new);
                changed = true;
            }
        }
        Ok(changed)
    }

    /// The token of the leader lease this node held at its last tick, if it led.
    fn token(&self) -> Option<i64> {
        *self.leading.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this node still holds the leader lease it held as `token`, with at least a
    /// quarter of `heartbeat_stale` left: shares are raised only then, so a leader paused in
    /// the middle of a pass past its lease raises nothing on counts its successor has moved
    /// on from.
    async fn still_leads(&self, token: Option<i64>) -> StoreResult<bool> {
        let Some(token) = token else { return Ok(false) };
        let margin = self.settings.heartbeat_stale / 4;
        let soon = crate::store::Leader::end(DateTime::now(), margin);
        Ok(crate::lifecycle::leader::leader(self.store.as_ref())
            .await?
            .is_some_and(|l| l.token == token && l.held_by(&self.settings.node, soon)))
    }

    /// With the QueueBalance not enabled here, clears the shares a balance left on queues,
    /// so they run at their `threads` again.
    pub(super) async fn lift_leftover_shares(&self) {
        let lifted = async { self.lift(&self.store.queues().await?, |_| true).await };
        if let Err(e) = lifted.await {
            debug!(error = %e, "cannot lift QueueBalance shares");
        }
    }

    /// Clears `maxthreads` of the queues `which` selects that have one.
    async fn lift(&self, queues: &[Queue], which: impl Fn(&Queue) -> bool) -> StoreResult<()> {
        for q in queues.iter().filter(|q| q.maxthreads.is_some() && which(q)) {
            self.set_share(q, None, q.limit()).await?;
        }
        Ok(())
    }

    /// Writes a queue's share (`maxthreads`), unless pretending, fenced by the leader
    /// lease this node held at its last tick: a write after the lease passed on changes
    /// nothing and ends the pass with [`StoreError::Invalid`](crate::store::StoreError).
    async fn set_share(&self, queue: &Queue, share: Option<i64>, was: i64) -> StoreResult<()> {
        let Some(token) = self.token() else {
            return Err(deposed());
        };
        let b = &self.settings.balance;
        if b.log || b.verbose {
            let to = share.map_or("its threads".to_string(), |s| s.to_string());
            info!(queue = %queue.name, "QueueBalance: {was} → {to}{}", if b.pretend { " (pretend)" } else { "" });
        }
        if b.pretend {
            return Ok(());
        }
        if !self.store.set_share(queue.id, share, token).await? {
            return Err(deposed());
        }
        Ok(())
    }
}

/// Why a share write was refused by the fence.
const DEPOSED: &str = "the leader lease passed on (or the queue is gone); this node writes no share";

/// A share write refused by the fence: another node leads now.
fn deposed() -> crate::store::StoreError {
    crate::store::StoreError::Invalid(DEPOSED.into())
}

fn critical(message: String) -> Report {
    Report {
        status: "CRITICAL",
        message,
        max_tasks_now: None,
    }
}
