//! Orphan recovery: the tasks of nodes that stopped answering, the spec's sweep of stale
//! claims, the tasks a dead process left under a name a new process took, and the slots
//! those nodes held.
//!
//! Candidates are read as [`TaskHead`]s ([`Store::task_heads`]); each is decided here
//! ([`recover_as`], by its queue's `on_orphan` and `retry` policies, read once per pass
//! from the readable queues) and written fenced on its status, node and `mtime` as read
//! ([`machine::as_read`]), so a task that moved on meanwhile is never touched. Slots are
//! freed only after their tasks: only those of holders with no claimed or running task
//! left ([`slots::idle_holders`]), and, for stale nodes, only leases that have ended.

use std::collections::HashMap;

use bson::oid::ObjectId;
use bson::DateTime;

use super::{machine, slots};
use crate::model::{counted_runs, status, Attempt, Node, OnOrphan, RetryAt, RetryOn, RetryPolicy};
use crate::store::{
    BusyOf, HeadFilter, HeadNode, Holder, Lease, Recovery, Slot, SlotChange, SlotFence, Store, StoreResult, TaskChange,
    TaskFence, TaskHead,
};

/// Most task heads read and written in one round.
const ROUND: usize = 1000;

/// How recovery ends an orphan.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Recover {
    /// Orphaned (-6), with the record of its run when a `retry` policy governed it.
    Orphan(Option<Attempt>),
    /// Put back in its queue (-2, node null): the queue's `on_orphan: requeue`.
    Requeue,
    /// Run again later by the queue's `retry` policy.
    Retry(RetryAt),
}

/// How recovery ends an orphan of `node`, of a queue with `on_orphan` and `retry`, that was
/// run `made` times before this run, at `priority`; `kill` when someone asked to kill it
/// (it must not run again).
pub(crate) fn recover_as(
    node: Option<&str>,
    kill: bool,
    on_orphan: OnOrphan,
    retry: Option<&RetryPolicy>,
    made: usize,
    priority: i64,
    now: DateTime,
) -> Recover {
    // A policy that retries orphans governs them; otherwise `on_orphan` does.
    let Some(policy) = retry.filter(|p| p.on.contains(&RetryOn::Orphaned)) else {
        return if on_orphan == OnOrphan::Requeue && !kill {
            Recover::Requeue
        } else {
            Recover::Orphan(None)
        };
    };
    let attempt = Attempt {
        node: node.map(str::to_owned),
        started: None,
        ended: now,
        status: status::ORPHANED,
        reason: format!(
            "orphaned: its node {} stopped answering while it ran",
            node.unwrap_or("(none)")
        ),
        stdout: None,
        stderr: None,
    };
    let this = u32::try_from(made).unwrap_or(u32::MAX).saturating_add(1);
    if !kill && policy.retries(RetryOn::Orphaned, this) {
        Recover::Retry(policy.retry_at(attempt, this, priority, now))
    } else {
        Recover::Orphan(Some(attempt))
    }
}

/// A queue's recovery policy: `on_orphan` and `retry`.
type Policy = (OnOrphan, Option<RetryPolicy>);

/// The policies of the readable queues. A task of a queue that is gone or cannot be read
/// gets the default: orphaned, never retried (a policy that cannot be read is not trusted
/// to run a task again).
async fn policies(store: &(impl Store + ?Sized)) -> StoreResult<HashMap<ObjectId, Policy>> {
    let queues = store.queues().await?;
    Ok(queues.into_iter().map(|q| (q.id, (q.on_orphan, q.retry))).collect())
}

/// The decision on `head` under its queue's `policy` at `now`, and the fenced change
/// that carries it out.
pub(crate) fn decide(head: &TaskHead, policy: &Policy, now: DateTime) -> (Recover, TaskFence, TaskChange) {
    let (on_orphan, retry) = policy;
    let how = recover_as(
        head.node.as_deref(),
        head.kill,
        *on_orphan,
        retry.as_ref(),
        counted_runs(&head.attempts),
        head.priority,
        now,
    );
    let change = match &how {
        Recover::Requeue => machine::requeue_orphan(),
        Recover::Retry(r) => machine::retry(r, now),
        Recover::Orphan(record) => machine::orphan(record.clone()),
    };
    let fence = machine::orphan_as_read(head.status, head.node.as_deref(), head.mtime);
    (how, fence, change)
}

/// Recovers the tasks matching `filter`, a round of at most [`ROUND`] at a time, adding
/// them to `recovery`. Stops after a short round, or one that changed nothing (the tasks
/// read all moved on meanwhile: the next pass sees them as they are).
async fn recover_matching(
    store: &(impl Store + ?Sized),
    filter: &HeadFilter,
    policies: &HashMap<ObjectId, Policy>,
    recovery: &mut Recovery,
) -> StoreResult<()> {
    loop {
        let heads = store.task_heads(filter, ROUND).await?;
        if heads.is_empty() {
            return Ok(());
        }
        let now = DateTime::now();
        let none = Policy::default();
        let decided: Vec<(ObjectId, Recover, TaskFence, TaskChange)> = heads
            .iter()
            .map(|h| {
                let policy = h.queue.and_then(|q| policies.get(&q)).unwrap_or(&none);
                let (how, fence, change) = decide(h, policy, now);
                (h.id, how, fence, change)
            })
            .collect();
        let entries: Vec<_> = decided
            .iter()
            .map(|(id, _, fence, change)| (*id, fence.clone(), change.clone()))
            .collect();
        let done = store.change_tasks(&entries).await?;
        for ((id, how, _, _), _) in decided.iter().zip(&done).filter(|(_, d)| **d) {
            match how {
                Recover::Requeue => recovery.requeued.push(*id),
                Recover::Retry(_) => recovery.retried.push(*id),
                Recover::Orphan(_) => recovery.orphaned.push(*id),
            }
        }
        if heads.len() < ROUND || !done.contains(&true) {
            return Ok(());
        }
    }
}

/// The names of the nodes whose heartbeat is before `stale_before` (or unreadable, read
/// as the epoch) and of the others.
pub(crate) fn by_freshness(nodes: &[Node], stale_before: DateTime) -> (Vec<String>, Vec<String>) {
    let (fresh, stale): (Vec<&Node>, Vec<&Node>) = nodes.iter().partition(|n| n.timestamp >= stale_before);
    let names = |v: Vec<&Node>| v.into_iter().map(|n| n.node.clone()).collect();
    (names(fresh), names(stale))
}

/// Frees the slots of those of `holders` that have no claimed or running task left, only
/// leases ended before `ended_before` when given (a node that came back renewed its own),
/// each fenced on its holder and that ended lease.
async fn free_idle_slots(
    store: &(impl Store + ?Sized),
    holders: &[String],
    ended_before: Option<DateTime>,
) -> StoreResult<()> {
    if holders.is_empty() {
        return Ok(());
    }
    let busy = store.busy_nodes(None, BusyOf::All).await?;
    let idle: Vec<String> = slots::idle_holders(holders, &busy).into_iter().cloned().collect();
    if idle.is_empty() {
        return Ok(());
    }
    for (queue, row) in store.slots_held_by(&idle).await? {
        let Some(holder) = row.holder else { continue };
        if ended_before.is_some_and(|t| row.expires >= t) {
            continue;
        }
        let fence = SlotFence {
            holder: Holder::By(holder),
            lease: ended_before.map_or(Lease::Any, Lease::EndedAt),
            ..SlotFence::default()
        };
        store
            .change_slot(&Slot::numbered(queue, row.n), &fence, &SlotChange::Release)
            .await?;
    }
    Ok(())
}

/// Recovers orphans: claimed (-1) tasks whose `mtime` is before `claimed_before` (the
/// spec's sweep, on any node), and claimed or running tasks of any node that is not fresh
/// (heartbeat before `stale_before`, or no node document) once the task's own `mtime` is
/// before `stale_before` too, so a task claimed a moment ago by a node that registered
/// after the node list was read is left alone. The running tasks of a Disbatch 4 DEN are
/// not recovered this way: its task runners outlive it and write their own results.
/// Each becomes orphaned (-6), is queued again (-2, node null) when its queue's
/// `on_orphan` is `requeue` and nobody asked to kill it, or waits for its retry by its
/// queue's `retry` policy; `mtime` is set to now. Then the slots of stale nodes with no
/// claimed or running task left are freed, once their leases have ended; slots of nodes
/// without a document are not freed here but expire with their lease.
pub async fn recover_orphans(
    store: &(impl Store + ?Sized),
    claimed_before: DateTime,
    stale_before: DateTime,
) -> StoreResult<Recovery> {
    let (mut spared, stale) = by_freshness(&store.nodes().await?, stale_before);
    let foreign = store.busy_nodes(None, BusyOf::Foreign).await?;
    spared.extend(foreign.into_iter().filter(|b| b.foreign).map(|b| b.node));
    let policies = policies(store).await?;
    let mut recovery = Recovery::default();
    let sweep = HeadFilter {
        statuses: vec![status::CLAIMED],
        node: HeadNode::Any,
        mtime_before: Some(claimed_before),
    };
    let of_stale_nodes = HeadFilter {
        statuses: status::BUSY.to_vec(),
        node: HeadNode::NoneOf(spared),
        mtime_before: Some(stale_before),
    };
    for filter in [sweep, of_stale_nodes] {
        recover_matching(store, &filter, &policies, &mut recovery).await?;
    }
    free_idle_slots(store, &stale, Some(DateTime::now())).await?;
    Ok(recovery)
}

/// Recovers, at once, every claimed (-1) or running (0) task of `node` as
/// [`recover_orphans`] does, then frees the slots `node` holds once it has none left: the
/// tasks of a dead process whose name a new process just took
/// ([`super::nodes::take`]; the new process has none yet).
pub async fn recover_node(store: &(impl Store + ?Sized), node: &str) -> StoreResult<Recovery> {
    let policies = policies(store).await?;
    let mut recovery = Recovery::default();
    let filter = HeadFilter {
        statuses: status::BUSY.to_vec(),
        node: HeadNode::Is(node.to_string()),
        mtime_before: None,
    };
    recover_matching(store, &filter, &policies, &mut recovery).await?;
    free_idle_slots(store, &[node.to_string()], None).await?;
    Ok(recovery)
}

#[cfg(test)]
mod tests;
