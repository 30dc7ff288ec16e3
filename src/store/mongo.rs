//! [`MongoStore`]: the [`Store`] on MongoDB, the production and distributed store.
//!
//! Collections and documents are the spec's: `tasks`, `queues`, `nodes`, plus GridFS
//! output in `tasks.files` / `tasks.chunks` (see [`gridfs`]). One more collection,
//! `slots`, holds the leases that make a queue's `threads` a cluster-wide limit: one
//! document `{queue, n, holder, expires}` per slot `n` in `0..threads`, taken and renewed
//! with conditional updates and free again once its lease expires.
//!
//! Malformed queue documents never make [`Store::queues`] fail for every queue: an unknown
//! `sort` is taken as `default` (the spec's order when `sort` is unset) with a warning; a
//! queue whose `name`, `plugin`, `threads`, `sandbox` or `on_orphan` is of the wrong shape
//! is not run, since it cannot be run as its operators meant: it is listed by
//! [`Store::unreadable_queues`] with its problem, and can be changed and deleted. Node
//! documents that cannot be read are left out of the node list. Each distinct problem is
//! logged once per process.
//!
//! Parts: `connect` ([`MongoOptions`], TLS and credentials), `documents` (BSON ↔ model,
//! lenient parsing), `queues` (queue documents), `slots` (queue slot leases), `recovery`
//! (orphan recovery), `lifecycle` (scheduled tasks, cancel and kill), `errors` (driver errors as transient or permanent store errors),
//! `counts` (task counts per queue and status), `nodes` (heartbeats, the node-name guard,
//! Disbatch 4 DENs on the same database), `running` (the DEN's claim, start, progress and
//! finish), `indexes` (the collections' indexes).

mod balance;
mod batches;
mod connect;
mod counts;
mod deps;
mod documents;
mod errors;
pub mod gridfs;
mod indexes;
mod leader;
mod lifecycle;
mod nodes;
mod plugins;
mod queues;
mod recovery;
mod retries;
mod running;
mod slots;
mod stats;

pub use self::plugins::{PLUGIN_CHUNKS, PLUGIN_FILES};

pub use self::connect::MongoOptions;
pub use self::counts::queue_counts_pipeline;
pub use self::stats::MINUTE_STATS;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use futures::TryStreamExt;
use mongodb::options::{FindOneAndUpdateOptions, IndexOptions, ReturnDocument};
use mongodb::{Collection, Database, IndexModel};

use self::documents::{output_bson, task_filter_doc, task_from, task_or_problem};
use self::errors::{db_err, is_duplicate_key};
use super::{
    Batch, Dependency, FinishExtra, HandRetry, NewQueue, NewTask, OutputStream, OutputValue, Page, QueueState,
    QueueUpdate, Recovery, Resolved, Slot, SlotRenewal, StatusCounts, Store, StoreError, StoreResult, TaskFilter,
    TaskTarget,
};
use crate::model::{
    status, NameHolder, Node, NodeProcess, NodeStats, Output, Queue, RetryAt, Sort, StopRequest, Task, TaskProgress,
    UnreadableQueue,
};

/// Collection of task documents.
pub const TASKS: &str = "tasks";
/// Collection of queue documents.
pub const QUEUES: &str = "queues";
/// Collection of node (DEN) documents.
pub const NODES: &str = "nodes";
/// Collection of queue slot leases.
pub const SLOTS: &str = "slots";

/// The [`Store`] on a MongoDB database. Cloning is cheap: clones share the connection
/// pool and the caches.
#[derive(Clone)]
pub struct MongoStore {
    db: Database,
    tasks: Collection<Document>,
    queues: Collection<Document>,
    nodes: Collection<Document>,
    slots: Collection<Document>,
    /// `(queue, threads)` whose slot documents `0..threads` are known to exist.
    ensured_slots: Arc<Mutex<HashSet<(ObjectId, i64)>>>,
    /// Problems with documents already logged, so each is logged once.
    warned: Arc<Mutex<HashSet<String>>>,
    /// The names of nodes without a process marker (Disbatch 4 DENs), read at most once a
    /// second (see `mongo/nodes.rs`).
    foreign: Arc<Mutex<Option<nodes::ForeignNodes>>>,
}

impl std::fmt::Debug for MongoStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MongoStore")
            .field("database", &self.db.name())
            .finish_non_exhaustive()
    }
}

impl MongoStore {
    /// Uses an already connected database.
    pub fn from_database(db: Database) -> MongoStore {
        MongoStore {
            tasks: db.collection(TASKS),
            queues: db.collection(QUEUES),
            nodes: db.collection(NODES),
            slots: db.collection(SLOTS),
            db,
            ensured_slots: Arc::new(Mutex::new(HashSet::new())),
            warned: Arc::new(Mutex::new(HashSet::new())),
            foreign: Arc::new(Mutex::new(None)),
        }
    }

    /// The database in use.
    pub fn database(&self) -> &Database {
        &self.db
    }

    /// Logs a problem with a document once per process.
    fn warn_once(&self, message: String) {
        let first = self
            .warned
            .lock()
            .map(|mut w| w.insert(message.clone()))
            .unwrap_or(true);
        if first {
            tracing::warn!("{message}");
        }
    }
}

/// The `node` of an unclaimed task: null (or missing), or Disbatch 4's `-1` (its DEN
/// claims `{$or: [{node: null}, {node: -1}]}`).
pub(super) fn unclaimed() -> Bson {
    Bson::Document(doc! { "$in": [Bson::Null, -1] })
}

#[async_trait]
impl Store for MongoStore {
    async fn ensure_indexes(&self) -> StoreResult<()> {
        self.create_indexes().await
    }

    // ---- nodes (mongo/nodes.rs) --------------------------------------------------------

    async fn heartbeat(&self, node: &str, lease: Duration) -> StoreResult<Node> {
        self.beat_node(node, lease).await
    }

    async fn take_node(
        &self,
        node: &str,
        process: &NodeProcess,
        stale_before: DateTime,
    ) -> StoreResult<Option<NameHolder>> {
        self.take_node_name(node, process, stale_before).await
    }

    async fn report_queue_problems(&self, node: &str, problems: &BTreeMap<String, String>) -> StoreResult<()> {
        self.write_queue_problems(node, problems).await
    }

    async fn release_node(&self, node: &str, process: ObjectId) -> StoreResult<()> {
        self.give_up_node(node, process).await
    }

    async fn nodes(&self) -> StoreResult<Vec<Node>> {
        self.list_nodes().await
    }

    async fn set_maxthreads(&self, node: &str, maxthreads: Option<i64>) -> StoreResult<bool> {
        self.write_maxthreads(node, maxthreads).await
    }

    async fn report_stats(&self, node: &str, stats: &NodeStats) -> StoreResult<()> {
        self.write_stats(node, stats).await
    }

    // ---- queues ------------------------------------------------------------------------

    async fn queues(&self) -> StoreResult<Vec<Queue>> {
        Ok(self.read_queues().await?.0)
    }

    async fn unreadable_queues(&self) -> StoreResult<Vec<UnreadableQueue>> {
        Ok(self.read_queues().await?.1)
    }

    async fn create_queue(&self, queue: NewQueue) -> StoreResult<Queue> {
        self.insert_queue(queue).await
    }

    async fn update_queue(&self, id: ObjectId, update: QueueUpdate) -> StoreResult<Option<QueueState>> {
        self.change_queue(id, update).await
    }

    async fn delete_queue(&self, id: ObjectId) -> StoreResult<bool> {
        self.remove_queue(id).await
    }

    async fn queue_counts(&self) -> StoreResult<BTreeMap<ObjectId, StatusCounts>> {
        self.count_by_queue_and_status().await
    }

    async fn active_counts(&self) -> StoreResult<BTreeMap<ObjectId, StatusCounts>> {
        self.count_active().await
    }

    async fn newest_task_id(&self) -> StoreResult<Option<ObjectId>> {
        let newest = self
            .tasks
            .find_one(doc! {})
            .sort(doc! { "_id": -1 })
            .projection(doc! { "_id": 1 })
            .await
            .map_err(db_err("find the newest task"))?;
        Ok(newest.and_then(|d| d.get_object_id("_id").ok()))
    }

    async fn add_stats(&self, node: &str, rows: &[(i64, ObjectId, crate::stats::Counters)]) -> StoreResult<()> {
        self.increment_stats(node, rows).await
    }

    async fn record_depth(&self, minute: i64, depths: &[(ObjectId, i64)]) -> StoreResult<()> {
        self.write_depth(minute, depths).await
    }

    async fn read_stats(
        &self,
        from: i64,
        to: i64,
        queue: Option<ObjectId>,
    ) -> StoreResult<Vec<crate::stats::StatsRow>> {
        self.find_stats(from, to, queue).await
    }

    async fn prune_stats(&self, before: i64) -> StoreResult<u64> {
        self.delete_stats(before).await
    }

    // ---- claiming and running (the DEN) ------------------------------------------------

    async fn open_batch(&self, id: &str, size: Option<i64>) -> StoreResult<Batch> {
        self.record_batch(id, size).await
    }

    async fn batch(&self, id: &str) -> StoreResult<Option<Batch>> {
        self.read_batch(id).await
    }

    async fn batch_counts(&self, id: &str) -> StoreResult<StatusCounts> {
        self.count_batch(id).await
    }

    async fn mark_dependents(&self, deps: &[Dependency]) -> StoreResult<()> {
        self.mark_waited(deps).await
    }

    async fn blocked_on(&self, dep: &Dependency, limit: usize) -> StoreResult<Vec<ObjectId>> {
        self.find_blocked(dep, limit).await
    }

    async fn resolve_dependency(
        &self,
        task: ObjectId,
        dep: &Dependency,
        failed: Option<&StopRequest>,
    ) -> StoreResult<Resolved> {
        self.resolve(task, dep, failed).await
    }

    async fn settled(&self, dep: &Dependency) -> StoreResult<()> {
        self.clear_waited(dep).await
    }

    async fn unsettled(&self, limit: usize) -> StoreResult<Vec<Dependency>> {
        self.find_unsettled(limit).await
    }

    async fn acquire_slot(&self, queue: &Queue, node: &str, lease: Duration) -> StoreResult<Option<Slot>> {
        self.take_slot(queue, node, lease).await
    }

    async fn release_slot(&self, slot: &Slot, node: &str) -> StoreResult<()> {
        self.give_back_slot(slot, node).await
    }

    async fn renew_slot(&self, slot: &Slot, node: &str, lease: Duration) -> StoreResult<SlotRenewal> {
        self.renew_one_slot(slot, node, lease).await
    }

    async fn want_slot(&self, queue: &Queue, node: &str, ask: Duration) -> StoreResult<Option<String>> {
        self.ask_for_slot(queue, node, ask).await
    }

    async fn lead(&self, node: &str, ttl: Duration) -> StoreResult<crate::store::Leader> {
        self.take_lead(node, ttl).await
    }

    async fn leader(&self) -> StoreResult<Option<crate::store::Leader>> {
        self.read_lead().await
    }

    async fn slots_in_use(&self, queue: ObjectId) -> StoreResult<i64> {
        self.occupied_slots(queue).await
    }

    async fn balance(&self) -> StoreResult<Option<Document>> {
        self.read_balance().await
    }

    async fn set_balance(&self, fields: Document) -> StoreResult<()> {
        self.write_balance(fields).await
    }

    async fn set_share(&self, queue: ObjectId, share: Option<i64>, token: i64) -> StoreResult<bool> {
        self.write_share(queue, share, token).await
    }

    async fn fence_shares(&self, queues: &[ObjectId], token: i64) -> StoreResult<()> {
        self.fence_queue_shares(queues, token).await
    }

    /// A change stream on `tasks`: inserts of queued tasks and updates that set a task's
    /// status back to queued.
    async fn watch_queued(&self) -> StoreResult<Option<super::QueuedEvents>> {
        let pipeline = [doc! { "$match": { "$or": [
            { "operationType": "insert", "fullDocument.status": status::QUEUED },
            { "operationType": "update", "updateDescription.updatedFields.status": status::QUEUED },
        ] } }];
        let stream = self
            .tasks
            .watch()
            .pipeline(pipeline)
            .await
            .map_err(db_err("watch for queued tasks"))?;
        let events = stream.map_ok(|_| ()).map_err(db_err("watch for queued tasks"));
        Ok(Some(Box::pin(events)))
    }

    async fn watch_tasks(&self) -> StoreResult<Option<super::TaskEvents>> {
        let pipeline = [doc! { "$project": { "documentKey": 1, "operationType": 1 } }];
        let stream = self
            .tasks
            .watch()
            .pipeline(pipeline)
            .await
            .map_err(db_err("watch tasks"))?;
        let events = stream
            .map_ok(|e| e.document_key.and_then(|k| k.get_object_id("_id").ok()))
            .map_err(db_err("watch tasks"));
        Ok(Some(Box::pin(events)))
    }

    async fn has_queued(&self, queue: ObjectId) -> StoreResult<bool> {
        let found = self
            .tasks
            .find_one(doc! { "node": unclaimed(), "status": status::QUEUED, "queue": queue })
            .projection(doc! { "_id": 1 })
            .await
            .map_err(db_err("look for queued tasks"))?;
        Ok(found.is_some())
    }

    async fn claim(&self, queue: &Queue, node: &str) -> StoreResult<Option<Task>> {
        self.claim_task(queue, node).await
    }

    async fn claim_before(&self, queue: &Queue, node: &str, until: DateTime) -> StoreResult<Option<Task>> {
        self.claim_task_until(queue, node, Some(until)).await
    }

    async fn start(&self, task: ObjectId, node: &str) -> StoreResult<bool> {
        self.start_task(task, node).await
    }

    async fn put_output_file(&self, file: ObjectId, task: ObjectId, filename: &str, text: &str) -> StoreResult<()> {
        Ok(gridfs::put_file(&self.db, file, task, filename, text).await?)
    }

    async fn discard_output_files(&self, task: ObjectId, files: &[ObjectId]) -> StoreResult<()> {
        self.discard_files(task, files).await
    }

    async fn finish_with(
        &self,
        task: ObjectId,
        node: &str,
        status: i32,
        stdout: OutputValue,
        stderr: OutputValue,
        extra: &FinishExtra,
    ) -> StoreResult<bool> {
        self.finish_task(task, node, status, stdout, stderr, extra).await
    }

    async fn report_progress(&self, task: ObjectId, node: &str, progress: &TaskProgress) -> StoreResult<bool> {
        self.write_progress(task, node, progress).await
    }

    async fn requeue_own(&self, node: &str, tasks: &[ObjectId]) -> StoreResult<Vec<ObjectId>> {
        self.requeue_mine(node, tasks).await
    }

    async fn recover_orphans(&self, claimed_before: DateTime, stale_before: DateTime) -> StoreResult<Recovery> {
        self.recover(claimed_before, stale_before).await
    }

    // ---- tasks (the DCI) ---------------------------------------------------------------

    async fn insert_tasks(&self, queue: ObjectId, tasks: Vec<NewTask>) -> StoreResult<()> {
        if tasks.is_empty() {
            return Ok(());
        }
        let now = DateTime::now();
        // A keyed task is inserted alone, so a duplicate key names it.
        let keyed = tasks.len() == 1 && tasks[0].key.is_some();
        let first_key = tasks[0].key.clone();
        let docs = tasks.into_iter().map(|t| {
            let mut d = doc! {
                "_id": t.id,
                "queue": queue,
                "ctime": now,
                "mtime": now,
                "node": null,
                "status": t.initial_status(now),
                "priority": t.priority,
                "params": t.params,
                "stdout": null,
                "stderr": null,
            };
            if let Some(at) = t.run_at {
                d.insert("run_at", at);
            }
            if let Some(k) = &t.key {
                d.insert("key", k);
            }
            if let Some(b) = &t.batch {
                d.insert("batch", b);
            }
            if !t.after.is_empty() {
                let keys: Vec<String> = t.after.iter().map(Dependency::key).collect();
                d.insert("after", keys.clone());
                d.insert("pending", keys);
                if t.after_failure_runs {
                    d.insert("after_failure", "run");
                }
            }
            if t.dependents {
                d.insert("dependents", true);
            }
            d
        });
        let key = keyed.then(|| first_key.unwrap_or_default());
        match self.tasks.insert_many(docs).await {
            Ok(_) => Ok(()),
            Err(e) if key.is_some() && is_duplicate_key(&e) => Err(StoreError::Duplicate {
                what: "task key",
                name: key.unwrap_or_default(),
            }),
            Err(e) => Err(db_err("create tasks")(e)),
        }
    }

    async fn promote_due(&self, now: DateTime) -> StoreResult<u64> {
        self.promote(now).await
    }

    async fn retry_later(&self, task: ObjectId, node: &str, retry: &RetryAt) -> StoreResult<bool> {
        self.retry_run(task, node, retry).await
    }

    async fn retry_by_hand(&self, task: ObjectId, reason: &str, replace: Option<&NewTask>) -> StoreResult<HandRetry> {
        self.retry_finished(task, reason, replace).await
    }

    async fn resubmit_waiting(&self, id: ObjectId, status: i32, task: &NewTask) -> StoreResult<bool> {
        let now = DateTime::now();
        let mut set = retries::replaced_fields(task, now);
        set.insert("mtime", now);
        let result = self
            .tasks
            .update_one(
                doc! { "_id": id, "status": status, "node": unclaimed() },
                doc! { "$set": set },
            )
            .await
            .map_err(db_err("submit a task again"))?;
        Ok(result.matched_count == 1)
    }

    async fn request_rerun(&self, id: ObjectId) -> StoreResult<bool> {
        let result = self
            .tasks
            .update_one(
                doc! { "_id": id, "status": { "$in": status::BUSY.to_vec() } },
                doc! { "$set": { "rerun": true } },
            )
            .await
            .map_err(db_err("submit a running task again"))?;
        Ok(result.matched_count == 1)
    }

    async fn cancel_tasks(&self, target: TaskTarget, stop: &StopRequest) -> StoreResult<Vec<ObjectId>> {
        self.cancel(target, stop).await
    }

    async fn request_kill(&self, target: TaskTarget, stop: &StopRequest) -> StoreResult<Vec<ObjectId>> {
        self.kill(target, stop).await
    }

    async fn kill_requests(&self, node: &str) -> StoreResult<Vec<(ObjectId, StopRequest)>> {
        self.kills_for(node).await
    }

    async fn find_tasks(&self, filter: &TaskFilter, page: Page) -> StoreResult<Vec<Task>> {
        if page.limit == 0 {
            return Ok(Vec::new());
        }
        let limit = i64::try_from(page.limit).unwrap_or(i64::MAX);
        let docs: Vec<Document> = self
            .tasks
            .find(task_filter_doc(filter))
            .sort(doc! { "_id": if page.oldest_first { 1 } else { -1 } })
            .skip(page.skip)
            .limit(limit)
            .await
            .map_err(db_err("find tasks"))?
            .try_collect()
            .await
            .map_err(db_err("find tasks"))?;
        Ok(docs.iter().filter_map(task_or_problem).collect())
    }

    async fn count_tasks(&self, filter: &TaskFilter) -> StoreResult<u64> {
        self.tasks
            .count_documents(task_filter_doc(filter))
            .await
            .map_err(db_err("count tasks"))
    }

    async fn task(&self, id: ObjectId) -> StoreResult<Option<Task>> {
        let found = self
            .tasks
            .find_one(doc! { "_id": id })
            .await
            .map_err(db_err("find task"))?;
        Ok(found.as_ref().and_then(task_or_problem))
    }

    async fn read_output(&self, output: &Output) -> StoreResult<String> {
        match output {
            Output::Inline(s) => Ok(s.clone()),
            Output::File(id) => Ok(gridfs::read_file(&self.db, *id).await?),
        }
    }

    async fn output_stream(&self, output: &Output) -> StoreResult<OutputStream> {
        match output {
            Output::Inline(s) => Ok(super::one_piece(s.clone())),
            Output::File(id) => {
                let pieces = gridfs::stream_file(&self.db, *id).await?;
                Ok(Box::pin(pieces.map_err(StoreError::from)))
            }
        }
    }
}
