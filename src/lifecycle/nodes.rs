//! Node documents: what may be written to them and under which fence. The stores only
//! apply a [`NodeChange`] under a [`NodeFence`] ([`Store::change_node`]); the rules are
//! here, once.
//!
//! - A node name is held by one live process ([`take`], decided by [`holder`]): a DEN of
//!   this implementation holds it while its heartbeat is fresh; a Disbatch 4 DEN
//!   ([`NodeRecord::foreign`]) while its heartbeat is fresh or any of its tasks is claimed
//!   or running, since its task runners outlive it and write their own results.
//! - `maxthreads` is a count: at least 0, or none for no limit ([`check_count`]).
//! - A process gives its name up only while it still holds it: a later process that took
//!   the name (this one was presumed dead) keeps it.
//! - A DEN's stats and queue problems go to its own node document, never create one.

use std::collections::BTreeMap;

use std::time::Duration;

use bson::oid::ObjectId;
use bson::DateTime;

use crate::model::{status, NameHolder, NodeProcess, NodeStats};
use crate::store::queue_doc::check_count;
use crate::store::{NodeChange, NodeFence, NodeRecord, Store, StoreError, StoreResult, TaskFilter};

/// How many times [`take`] reads the node document again after another process wrote it
/// between the read and the take.
const TAKE_ATTEMPTS: usize = 3;

/// Takes the name `node` for `process`: records `process` and a heartbeat in the node
/// document (creating it) unless another live process holds the name ([`holder`]), fenced
/// on the document as read so two processes never both take it. Returns `None` when
/// taken, the holder otherwise. On taking it, the node's claimed (-1) and running (0)
/// tasks — a dead earlier process's, as the taking process has none yet — are recovered at
/// once and its slots freed ([`recover_node`](super::recovery::recover_node)); a Disbatch 4 holder is given up
/// only once it has none.
pub async fn take(
    store: &(impl Store + ?Sized),
    node: &str,
    process: &NodeProcess,
    stale_before: DateTime,
) -> StoreResult<Option<NameHolder>> {
    for _ in 0..TAKE_ATTEMPTS {
        let fence = match store.node(node).await? {
            None => NodeFence::Absent,
            Some(current) => {
                let tasks = if counts_tasks(&current, stale_before) {
                    store.count_tasks(&busy_on(node)).await?
                } else {
                    0
                };
                if let Some(holder) = holder(&current, process.id, stale_before, DateTime::now(), tasks) {
                    return Ok(Some(holder));
                }
                NodeFence::AsRead {
                    heartbeat: current.heartbeat,
                    process: current.node.process.map(|p| p.id),
                }
            }
        };
        if store
            .change_node(node, fence, NodeChange::Take(process.clone()))
            .await?
        {
            // Whatever the name still holds belongs to a process that is gone (a Disbatch 4
            // holder gets here only without claimed or running tasks). A document deleted
            // by hand may have left tasks behind too.
            super::recovery::recover_node(store, node).await?;
            return Ok(None);
        }
        // Someone wrote the document between the read and the take: read it again.
    }
    Err(StoreError::Database(format!(
        "cannot take node name {node:?}: its document keeps changing (retrying may help)"
    )))
}

/// Whether [`holder`] needs the count of `current`'s claimed and running tasks: a Disbatch
/// 4 holder whose heartbeat is stale keeps the name while it has any.
pub fn counts_tasks(current: &NodeRecord, stale_before: DateTime) -> bool {
    current.foreign && is_stale(current, stale_before)
}

/// Who holds the name of the node document `current` against `process`, read at `now`,
/// with `tasks` claimed or running tasks on it (counted only when [`counts_tasks`]):
/// - a Disbatch 4 DEN while its heartbeat is fresh, or while it has tasks;
/// - another process of this implementation while its heartbeat is fresh;
/// - nobody otherwise (a stale holder, no holder, or `process` itself).
pub fn holder(
    current: &NodeRecord,
    process: ObjectId,
    stale_before: DateTime,
    now: DateTime,
    tasks: u64,
) -> Option<NameHolder> {
    let stale = is_stale(current, stale_before);
    if current.foreign {
        return (!stale || tasks > 0).then(|| NameHolder::Foreign {
            heartbeat: current.heartbeat,
            heartbeat_age: age(now, current.heartbeat),
            tasks,
        });
    }
    if stale {
        return None;
    }
    current
        .node
        .process
        .clone()
        .filter(|p| p.id != process)
        .map(NameHolder::Den)
}

/// Whether the node's heartbeat is older than `stale_before` (or unreadable).
fn is_stale(current: &NodeRecord, stale_before: DateTime) -> bool {
    current.heartbeat.is_none_or(|t| t < stale_before)
}

/// How old a heartbeat at `at` is at `now` (zero when unreadable or in the future).
fn age(now: DateTime, at: Option<DateTime>) -> Duration {
    at.map_or(Duration::ZERO, |t| {
        Duration::from_millis(u64::try_from(now.timestamp_millis() - t.timestamp_millis()).unwrap_or(0))
    })
}

/// The claimed and running tasks on `node`.
fn busy_on(node: &str) -> TaskFilter {
    TaskFilter {
        status: Some(status::BUSY.to_vec()),
        node: Some(Some(node.to_string())),
        ..TaskFilter::default()
    }
}

/// Sets a node's `maxthreads` (None = no limit). Returns false when there is no such
/// node; a negative limit is [`StoreError::Invalid`](crate::store::StoreError::Invalid)
/// naming the field, and nothing is written.
pub async fn set_maxthreads(store: &(impl Store + ?Sized), node: &str, maxthreads: Option<i64>) -> StoreResult<bool> {
    check_count("maxthreads", maxthreads)?;
    store
        .change_node(node, NodeFence::Any, NodeChange::Maxthreads(maxthreads))
        .await
}

/// Gives the name `node` up when the process `process` holds it (graceful shutdown), so
/// another process may take it at once. Answers whether it held it.
pub async fn release(store: &(impl Store + ?Sized), node: &str, process: ObjectId) -> StoreResult<bool> {
    store
        .change_node(node, NodeFence::HeldBy(process), NodeChange::Release)
        .await
}

/// Stores the node's claim and run duration histograms in its document (`stats`).
/// Answers false when the node has no document.
pub async fn report_stats(store: &(impl Store + ?Sized), node: &str, stats: &NodeStats) -> StoreResult<bool> {
    store
        .change_node(node, NodeFence::Any, NodeChange::Stats(stats.clone()))
        .await
}

/// Stores why the node cannot run some queues (`queue_problems`: queue id in hex →
/// reason), replacing what it reported before. Answers false when the node has no
/// document.
pub async fn report_queue_problems(
    store: &(impl Store + ?Sized),
    node: &str,
    problems: &BTreeMap<String, String>,
) -> StoreResult<bool> {
    store
        .change_node(node, NodeFence::Any, NodeChange::QueueProblems(problems.clone()))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Node;

    const STALE_BEFORE: i64 = 1_000_000;

    fn record(heartbeat: Option<i64>, process: Option<&NodeProcess>, foreign: bool) -> NodeRecord {
        let heartbeat = heartbeat.map(DateTime::from_millis);
        NodeRecord {
            node: Node {
                id: ObjectId::new(),
                node: "n".into(),
                timestamp: heartbeat.unwrap_or(DateTime::from_millis(0)),
                maxthreads: None,
                stats: None,
                process: process.cloned(),
                queue_problems: Default::default(),
                problem: None,
            },
            heartbeat,
            foreign,
        }
    }

    fn decide(current: &NodeRecord, me: &NodeProcess, tasks: u64) -> Option<NameHolder> {
        let now = DateTime::from_millis(STALE_BEFORE + 5_000);
        holder(current, me.id, DateTime::from_millis(STALE_BEFORE), now, tasks)
    }

    #[test]
    fn a_name_is_held_by_another_live_process_only() {
        let (me, other) = (NodeProcess::this_process(), NodeProcess::this_process());
        let fresh = Some(STALE_BEFORE);
        let stale = Some(STALE_BEFORE - 1);
        assert_eq!(
            decide(&record(fresh, Some(&other), false), &me, 0),
            Some(NameHolder::Den(other.clone()))
        );
        assert_eq!(
            decide(&record(stale, Some(&other), false), &me, 0),
            None,
            "a stale holder"
        );
        assert_eq!(
            decide(&record(None, Some(&other), false), &me, 0),
            None,
            "an unreadable heartbeat"
        );
        assert_eq!(decide(&record(fresh, Some(&me), false), &me, 0), None, "its own holder");
        assert_eq!(decide(&record(fresh, None, false), &me, 0), None, "released");
    }

    #[test]
    fn a_disbatch4_holder_keeps_its_name_while_live_or_busy() {
        let me = NodeProcess::this_process();
        let fresh = record(Some(STALE_BEFORE + 1_000), None, true);
        assert!(!counts_tasks(&fresh, DateTime::from_millis(STALE_BEFORE)));
        assert_eq!(
            decide(&fresh, &me, 0),
            Some(NameHolder::Foreign {
                heartbeat: fresh.heartbeat,
                heartbeat_age: Duration::from_secs(4),
                tasks: 0,
            })
        );
        let stale = record(Some(STALE_BEFORE - 1), None, true);
        assert!(counts_tasks(&stale, DateTime::from_millis(STALE_BEFORE)));
        assert!(matches!(
            decide(&stale, &me, 2),
            Some(NameHolder::Foreign { tasks: 2, .. })
        ));
        assert_eq!(decide(&stale, &me, 0), None, "stale and idle: given up");
    }
}
