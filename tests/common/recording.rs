//! [`Recording`]: a store wrapper that records which tasks a DEN claimed and started, for
//! the tests that prove no task is claimed or run twice, and can lose the replies of output
//! file writes and results that did apply, for the tests of retried writes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bson::oid::ObjectId;
use bson::DateTime;
use disbatch::model::{Node, Output, Queue, StopRequest};
use disbatch::store::*;

/// A store that records which tasks each DEN claimed and started.
pub struct Recording {
    inner: Arc<dyn Store>,
    pub claimed: Mutex<Vec<ObjectId>>,
    pub started: Mutex<Vec<ObjectId>>,
    /// The next this many `put_output_file` calls apply, then fail as if their reply had
    /// been lost (a transient error).
    pub lost_file_replies: AtomicUsize,
    /// The next this many results written (`lifecycle::run::finish_with`) apply, then fail
    /// as if their reply had been lost (a transient error).
    pub lost_finish_replies: AtomicUsize,
    /// How many times every task was counted ([`Store::queue_counts`]).
    pub full_counts: AtomicUsize,
}

impl Recording {
    pub fn new(inner: Arc<dyn Store>) -> Arc<Self> {
        Arc::new(Recording {
            inner,
            claimed: Mutex::default(),
            started: Mutex::default(),
            lost_file_replies: AtomicUsize::new(0),
            lost_finish_replies: AtomicUsize::new(0),
            full_counts: AtomicUsize::new(0),
        })
    }

    /// Records a task claimed, and started when the claim started it too.
    fn record_claim(&self, claimed: &Option<disbatch::model::Task>) {
        if let Some(t) = claimed {
            self.claimed.lock().unwrap().push(t.id);
            if t.status == disbatch::model::status::RUNNING {
                self.started.lock().unwrap().push(t.id);
            }
        }
    }
}

#[async_trait]
impl Store for Recording {
    async fn ensure_indexes(&self) -> StoreResult<()> {
        self.inner.ensure_indexes().await
    }
    async fn heartbeat(&self, node: &str, lease: Duration) -> StoreResult<Node> {
        self.inner.heartbeat(node, lease).await
    }
    async fn nodes(&self) -> StoreResult<Vec<Node>> {
        self.inner.nodes().await
    }
    async fn node(&self, node: &str) -> StoreResult<Option<NodeRecord>> {
        self.inner.node(node).await
    }
    async fn change_node(
        &self,
        node: &str,
        fence: disbatch::store::NodeFence,
        change: disbatch::store::NodeChange,
    ) -> StoreResult<bool> {
        self.inner.change_node(node, fence, change).await
    }
    async fn change_tasks(&self, changes: &[(ObjectId, TaskFence, TaskChange)]) -> StoreResult<Vec<bool>> {
        use disbatch::model::status;
        let done = self.inner.change_tasks(changes).await?;
        // A start: claimed (-1) to running (0).
        let start = disbatch::lifecycle::machine::start();
        let mut finished = None;
        for ((id, fence, change), ok) in changes.iter().zip(&done) {
            if *ok && *change == start && fence.statuses.as_deref() == Some(&[status::CLAIMED][..]) {
                self.started.lock().unwrap().push(*id);
            }
            // The end of a run: running (0) to a result.
            if *ok
                && fence.statuses.as_deref() == Some(&[status::RUNNING][..])
                && change.status.is_some_and(status::finished)
            {
                finished = Some(*id);
            }
        }
        if let Some(task) = finished {
            let lose = self
                .lost_finish_replies
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if lose {
                return Err(StoreError::Database(format!("reply to the result of task {task} lost")));
            }
        }
        Ok(done)
    }
    async fn change_where(
        &self,
        target: TaskTarget,
        fence: &TaskFence,
        change: &TaskChange,
    ) -> StoreResult<Vec<ObjectId>> {
        self.inner.change_where(target, fence, change).await
    }
    async fn queues(&self) -> StoreResult<Vec<Queue>> {
        self.inner.queues().await
    }
    async fn queue(&self, id: ObjectId) -> StoreResult<Option<Queue>> {
        self.inner.queue(id).await
    }
    async fn unreadable_queues(&self) -> StoreResult<Vec<disbatch::model::UnreadableQueue>> {
        self.inner.unreadable_queues().await
    }
    async fn create_queue(&self, queue: NewQueue) -> StoreResult<Queue> {
        self.inner.create_queue(queue).await
    }
    async fn update_queue(&self, id: ObjectId, update: QueueUpdate) -> StoreResult<Option<QueueState>> {
        self.inner.update_queue(id, update).await
    }
    async fn delete_queue(&self, id: ObjectId) -> StoreResult<bool> {
        self.inner.delete_queue(id).await
    }
    async fn queue_counts(&self) -> StoreResult<BTreeMap<ObjectId, StatusCounts>> {
        self.full_counts.fetch_add(1, Ordering::SeqCst);
        self.inner.queue_counts().await
    }
    async fn active_counts(&self) -> StoreResult<BTreeMap<ObjectId, StatusCounts>> {
        self.inner.active_counts().await
    }
    async fn add_stats(&self, node: &str, rows: &[(i64, ObjectId, disbatch::stats::Counters)]) -> StoreResult<()> {
        self.inner.add_stats(node, rows).await
    }
    async fn record_depth(&self, minute: i64, depths: &[(ObjectId, i64)]) -> StoreResult<()> {
        self.inner.record_depth(minute, depths).await
    }
    async fn read_stats(
        &self,
        from: i64,
        to: i64,
        queue: Option<ObjectId>,
    ) -> StoreResult<Vec<disbatch::stats::StatsRow>> {
        self.inner.read_stats(from, to, queue).await
    }
    async fn prune_stats(&self, before: i64) -> StoreResult<u64> {
        self.inner.prune_stats(before).await
    }
    async fn insert_batch(&self, id: &str, size: Option<i64>) -> StoreResult<bool> {
        self.inner.insert_batch(id, size).await
    }
    async fn set_batch_size_if_unset(&self, id: &str, size: i64) -> StoreResult<bool> {
        self.inner.set_batch_size_if_unset(id, size).await
    }
    async fn batch(&self, id: &str) -> StoreResult<Option<Batch>> {
        self.inner.batch(id).await
    }
    async fn close_batch(&self, id: &str) -> StoreResult<()> {
        self.inner.close_batch(id).await
    }
    async fn batch_counts(&self, id: &str) -> StoreResult<StatusCounts> {
        self.inner.batch_counts(id).await
    }
    async fn mark_dependents(&self, deps: &[Dependency]) -> StoreResult<()> {
        self.inner.mark_dependents(deps).await
    }
    async fn blocked_on(&self, dep: &Dependency, limit: usize) -> StoreResult<Vec<ObjectId>> {
        self.inner.blocked_on(dep, limit).await
    }
    async fn resolve_pending(&self, task: ObjectId, expect: &[String], change: PendingChange<'_>) -> StoreResult<bool> {
        self.inner.resolve_pending(task, expect, change).await
    }
    async fn settled(&self, dep: &Dependency) -> StoreResult<()> {
        self.inner.settled(dep).await
    }
    async fn unsettled(&self, limit: usize) -> StoreResult<Vec<Dependency>> {
        self.inner.unsettled(limit).await
    }
    async fn lease(&self, name: &str) -> StoreResult<Option<Leader>> {
        self.inner.lease(name).await
    }
    async fn change_lease(&self, name: &str, expect: Option<&Leader>, new: &Leader) -> StoreResult<bool> {
        self.inner.change_lease(name, expect, new).await
    }
    async fn schedules(&self) -> StoreResult<Vec<ScheduleRecord>> {
        self.inner.schedules().await
    }
    async fn schedule(&self, name: &str) -> StoreResult<Option<ScheduleRecord>> {
        self.inner.schedule(name).await
    }
    async fn put_schedule(&self, schedule: &disbatch::model::Schedule, mark: Option<&ScheduleMark>) -> StoreResult<()> {
        self.inner.put_schedule(schedule, mark).await
    }
    async fn delete_schedule(&self, name: &str) -> StoreResult<bool> {
        self.inner.delete_schedule(name).await
    }
    async fn expired_tasks(
        &self,
        filter: &disbatch::store::ExpiredFilter,
    ) -> StoreResult<Vec<disbatch::store::ExpiredTask>> {
        self.inner.expired_tasks(filter).await
    }
    async fn delete_tasks(&self, tasks: &[disbatch::store::ExpiredTask]) -> StoreResult<Vec<ObjectId>> {
        self.inner.delete_tasks(tasks).await
    }
    async fn advance_schedule(&self, name: &str, expect: DateTime, new: &ScheduleMark) -> StoreResult<bool> {
        self.inner.advance_schedule(name, expect, new).await
    }
    async fn balance(&self) -> StoreResult<Option<bson::Document>> {
        self.inner.balance().await
    }
    async fn set_balance(&self, fields: bson::Document) -> StoreResult<()> {
        self.inner.set_balance(fields).await
    }
    async fn set_share(&self, queue: ObjectId, share: Option<i64>, token: i64) -> StoreResult<bool> {
        self.inner.set_share(queue, share, token).await
    }
    async fn fence_shares(&self, queues: &[ObjectId], token: i64) -> StoreResult<()> {
        self.inner.fence_shares(queues, token).await
    }
    async fn has_queued(&self, queue: ObjectId) -> StoreResult<bool> {
        self.inner.has_queued(queue).await
    }
    async fn claim(&self, queue: &Queue, node: &str) -> StoreResult<Option<disbatch::model::Task>> {
        let t = self.inner.claim(queue, node).await?;
        if let Some(t) = &t {
            self.claimed.lock().unwrap().push(t.id);
        }
        Ok(t)
    }
    async fn claim_before(
        &self,
        queue: &Queue,
        node: &str,
        until: bson::DateTime,
    ) -> StoreResult<Option<disbatch::model::Task>> {
        let t = self.inner.claim_before(queue, node, until).await?;
        self.record_claim(&t);
        Ok(t)
    }
    async fn claim_to_run(&self, queue: &Queue, node: &str) -> StoreResult<Option<disbatch::model::Task>> {
        let t = self.inner.claim_to_run(queue, node).await?;
        self.record_claim(&t);
        Ok(t)
    }
    async fn put_output_file(&self, file: ObjectId, task: ObjectId, filename: &str, text: &str) -> StoreResult<()> {
        self.inner.put_output_file(file, task, filename, text).await?;
        let lose = self
            .lost_file_replies
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if lose {
            return Err(StoreError::Database(format!("reply to the write of file {file} lost")));
        }
        Ok(())
    }
    async fn discard_output_files(&self, task: ObjectId, files: &[ObjectId]) -> StoreResult<()> {
        self.inner.discard_output_files(task, files).await
    }
    async fn task_heads(&self, filter: &HeadFilter, limit: usize) -> StoreResult<Vec<TaskHead>> {
        self.inner.task_heads(filter, limit).await
    }
    async fn insert_tasks(&self, queue: ObjectId, tasks: Vec<NewTask>) -> StoreResult<()> {
        self.inner.insert_tasks(queue, tasks).await
    }
    async fn kill_requests(&self, node: &str) -> StoreResult<Vec<(ObjectId, StopRequest)>> {
        self.inner.kill_requests(node).await
    }
    async fn newest_task_id(&self) -> StoreResult<Option<ObjectId>> {
        self.inner.newest_task_id().await
    }

    async fn find_tasks(&self, filter: &TaskFilter, page: Page) -> StoreResult<Vec<disbatch::model::Task>> {
        self.inner.find_tasks(filter, page).await
    }
    async fn count_tasks(&self, filter: &TaskFilter) -> StoreResult<u64> {
        self.inner.count_tasks(filter).await
    }
    async fn task(&self, id: ObjectId) -> StoreResult<Option<disbatch::model::Task>> {
        self.inner.task(id).await
    }
    async fn read_output(&self, output: &Output) -> StoreResult<String> {
        self.inner.read_output(output).await
    }
}

#[async_trait]
impl SlotStore for Recording {
    async fn slots(&self, queue: ObjectId) -> StoreResult<Vec<SlotRow>> {
        self.inner.slots(queue).await
    }
    async fn ensure_slots(&self, queue: ObjectId, threads: i64) -> StoreResult<()> {
        self.inner.ensure_slots(queue, threads).await
    }
    async fn change_slot(&self, slot: &Slot, fence: &SlotFence, change: &SlotChange) -> StoreResult<bool> {
        self.inner.change_slot(slot, fence, change).await
    }
    async fn busy_nodes(&self, queue: Option<ObjectId>, of: BusyOf) -> StoreResult<Vec<BusyNode>> {
        self.inner.busy_nodes(queue, of).await
    }
    async fn slots_held_by(&self, holders: &[String]) -> StoreResult<Vec<(ObjectId, SlotRow)>> {
        self.inner.slots_held_by(holders).await
    }
}

#[async_trait]
impl FileStore for Recording {
    async fn output_files(&self, after: Option<ObjectId>, limit: usize) -> StoreResult<Vec<StoredFile>> {
        self.inner.output_files(after, limit).await
    }
}

#[async_trait]
impl RateStore for Recording {
    async fn rates(&self, queue: ObjectId) -> StoreResult<Vec<RateRow>> {
        self.inner.rates(queue).await
    }
    async fn ensure_rates(&self, queue: ObjectId, max: i64) -> StoreResult<()> {
        self.inner.ensure_rates(queue, max).await
    }
    async fn change_rate(&self, queue: ObjectId, n: i64, from: &RateRow, to: &RateRow) -> StoreResult<bool> {
        self.inner.change_rate(queue, n, from, to).await
    }
}

#[async_trait]
impl PluginStore for Recording {
    async fn put_plugin(&self, version: &PluginVersion, bytes: &[u8]) -> StoreResult<Pushed> {
        self.inner.put_plugin(version, bytes).await
    }
    async fn plugin_versions(&self, name: Option<&str>) -> StoreResult<Vec<PluginVersion>> {
        self.inner.plugin_versions(name).await
    }
    async fn plugin_bytes(&self, name: &str, sha256: &str) -> StoreResult<Option<Vec<u8>>> {
        self.inner.plugin_bytes(name, sha256).await
    }
    async fn delete_plugin(&self, name: &str) -> StoreResult<u64> {
        self.inner.delete_plugin(name).await
    }
}
