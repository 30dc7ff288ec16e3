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
//! Parts, named as the embedded store's for the same concern: `connect` ([`MongoOptions`],
//! TLS and credentials), `records` (BSON ↔ model, lenient parsing), `schema` (the
//! collections' indexes), `errors` (driver errors as transient or permanent store errors),
//! `tasks` (inserting and finding tasks), `change` (fenced task changes), `bulk` (those
//! changes grouped into shared `bulkWrite` commands), `claims` (the
//! spec's claim, in groups), `ahead` (tasks read ahead for the claims to come), `queues` (queue documents and their task counts), `slots` (queue slot
//! leases), `nodes` (heartbeats, the node-name guard, Disbatch 4 DENs on the same
//! database), `leases`, `balance`, `schedules`, `batches`, `deps`, `kills`, `stats`, `plugins`, `files`
//! (task output files, kept in GridFS by `gridfs`) and `watch` (change streams).

mod ahead;
mod balance;
mod batches;
mod bulk;
mod change;
mod claims;
mod connect;
mod deps;
mod errors;
mod files;
pub mod gridfs;
mod kills;
mod leases;
mod nodes;
mod plugins;
mod queues;
mod rates;
mod records;
mod retention;
mod schedules;
mod schema;
mod slots;
mod stats;
mod tasks;
mod watch;

pub use self::plugins::{PLUGIN_CHUNKS, PLUGIN_FILES};

pub use self::connect::MongoOptions;
pub use self::queues::queue_counts_pipeline;
pub use self::stats::MINUTE_STATS;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use mongodb::options::{FindOneAndUpdateOptions, IndexOptions, ReturnDocument};
use mongodb::{Collection, Database, IndexModel};

use self::errors::{db_err, is_duplicate_key};
use self::records::{task_filter_doc, task_from, task_or_problem};
use super::{
    Batch, Dependency, Leader, NewQueue, NewTask, OutputStream, Page, PendingChange, QueueState, QueueUpdate,
    StatusCounts, Store, StoreError, StoreResult, TaskChange, TaskFence, TaskFilter, TaskTarget,
};
use super::{EndAndClaim, HeadFilter, TaskHead};
use super::{NodeChange, NodeFence, NodeRecord};
use crate::model::{status, Node, Output, Queue, Sort, StopRequest, Task, UnreadableQueue};

/// Collection of task documents.
pub const TASKS: &str = "tasks";
/// Collection of queue documents.
pub const QUEUES: &str = "queues";
/// Collection of node (DEN) documents.
pub const NODES: &str = "nodes";
/// Collection of queue slot leases.
pub const SLOTS: &str = "slots";
/// Collection of rate grants (`lifecycle::rate`).
pub const RATES: &str = "rates";

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
    rates: Collection<Document>,
    /// Problems with documents already logged, so each is logged once.
    warned: Arc<Mutex<HashSet<String>>>,
    /// The names of nodes without a process marker (Disbatch 4 DENs), read at most once a
    /// second (see `mongo/nodes.rs`).
    foreign: Arc<Mutex<Option<nodes::ForeignNodes>>>,
    /// Fenced task updates, grouped (see `mongo/bulk.rs`).
    updates: bulk::Updates,
    /// Claims, grouped (see `mongo/claims.rs`).
    claims: claims::Claims,
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
        Self::from_database_grouping(db, Duration::ZERO)
    }

    /// Uses an already connected database, each grouped write (claims, task changes)
    /// waiting up to `window` for more to join it before it is sent (see `mongo/bulk.rs`).
    pub fn from_database_grouping(db: Database, window: Duration) -> MongoStore {
        let updates = bulk::Updates::new(db.client().clone(), db.collection(TASKS), window);
        MongoStore {
            claims: claims::Claims::new(db.collection(TASKS), updates.clone(), window),
            updates,
            tasks: db.collection(TASKS),
            queues: db.collection(QUEUES),
            nodes: db.collection(NODES),
            slots: db.collection(SLOTS),
            rates: db.collection(RATES),
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
        self.ensure_indexes().await
    }

    // ---- nodes (mongo/nodes.rs) --------------------------------------------------------

    async fn heartbeat(&self, node: &str, lease: Duration) -> StoreResult<Node> {
        self.heartbeat(node, lease).await
    }

    async fn nodes(&self) -> StoreResult<Vec<Node>> {
        self.nodes().await
    }

    async fn node(&self, node: &str) -> StoreResult<Option<NodeRecord>> {
        self.node(node).await
    }

    async fn change_node(&self, node: &str, fence: NodeFence, change: NodeChange) -> StoreResult<bool> {
        self.change_node(node, fence, change).await
    }

    // ---- queues ------------------------------------------------------------------------

    async fn queues(&self) -> StoreResult<Vec<Queue>> {
        Ok(self.read_queues().await?.0)
    }

    async fn unreadable_queues(&self) -> StoreResult<Vec<UnreadableQueue>> {
        Ok(self.read_queues().await?.1)
    }

    async fn queue(&self, id: ObjectId) -> StoreResult<Option<Queue>> {
        let found = self
            .queues
            .find_one(doc! { "_id": id })
            .await
            .map_err(db_err("read a queue"))?;
        found.map(|d| super::queue_doc::read(&d).map(|(q, _)| q)).transpose()
    }

    async fn create_queue(&self, queue: NewQueue) -> StoreResult<Queue> {
        self.insert_queue(queue).await
    }

    async fn update_queue(&self, id: ObjectId, update: QueueUpdate) -> StoreResult<Option<QueueState>> {
        self.update_queue(id, update).await
    }

    async fn delete_queue(&self, id: ObjectId) -> StoreResult<bool> {
        self.delete_queue(id).await
    }

    async fn queue_counts(&self) -> StoreResult<BTreeMap<ObjectId, StatusCounts>> {
        self.queue_counts().await
    }

    async fn active_counts(&self) -> StoreResult<BTreeMap<ObjectId, StatusCounts>> {
        self.active_counts().await
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
        self.add_stats(node, rows).await
    }

    async fn record_depth(&self, minute: i64, depths: &[(ObjectId, i64)]) -> StoreResult<()> {
        self.record_depth(minute, depths).await
    }

    async fn read_stats(
        &self,
        from: i64,
        to: i64,
        queue: Option<ObjectId>,
    ) -> StoreResult<Vec<crate::stats::StatsRow>> {
        self.read_stats(from, to, queue).await
    }

    async fn prune_stats(&self, before: i64) -> StoreResult<u64> {
        self.prune_stats(before).await
    }

    // ---- claiming and running (the DEN) ------------------------------------------------

    async fn insert_batch(&self, id: &str, size: Option<i64>) -> StoreResult<bool> {
        self.insert_batch(id, size).await
    }

    async fn set_batch_size_if_unset(&self, id: &str, size: i64) -> StoreResult<bool> {
        self.set_batch_size_if_unset(id, size).await
    }

    async fn batch(&self, id: &str) -> StoreResult<Option<Batch>> {
        self.batch(id).await
    }

    async fn close_batch(&self, id: &str) -> StoreResult<()> {
        self.close_batch(id).await
    }
    async fn batch_counts(&self, id: &str) -> StoreResult<StatusCounts> {
        self.batch_counts(id).await
    }

    async fn mark_dependents(&self, deps: &[Dependency]) -> StoreResult<()> {
        self.mark_dependents(deps).await
    }

    async fn blocked_on(&self, dep: &Dependency, limit: usize) -> StoreResult<Vec<ObjectId>> {
        self.blocked_on(dep, limit).await
    }

    async fn resolve_pending(&self, task: ObjectId, expect: &[String], change: PendingChange<'_>) -> StoreResult<bool> {
        deps::resolve_pending(self, task, expect, change).await
    }

    async fn settled(&self, dep: &Dependency) -> StoreResult<()> {
        self.settled(dep).await
    }

    async fn unsettled(&self, limit: usize) -> StoreResult<Vec<Dependency>> {
        self.unsettled(limit).await
    }

    async fn lease(&self, name: &str) -> StoreResult<Option<Leader>> {
        leases::lease(self, name).await
    }

    async fn change_lease(&self, name: &str, expect: Option<&Leader>, new: &Leader) -> StoreResult<bool> {
        leases::change_lease(self, name, expect, new).await
    }

    async fn schedules(&self) -> StoreResult<Vec<super::ScheduleRecord>> {
        self.schedules().await
    }

    async fn schedule(&self, name: &str) -> StoreResult<Option<super::ScheduleRecord>> {
        self.schedule(name).await
    }

    async fn put_schedule(
        &self,
        schedule: &crate::model::Schedule,
        mark: Option<&super::ScheduleMark>,
    ) -> StoreResult<()> {
        self.put_schedule(schedule, mark).await
    }

    async fn delete_schedule(&self, name: &str) -> StoreResult<bool> {
        self.delete_schedule(name).await
    }

    async fn expired_tasks(&self, filter: &super::ExpiredFilter) -> StoreResult<Vec<super::ExpiredTask>> {
        self.expired_tasks(filter).await
    }

    async fn delete_tasks(&self, tasks: &[super::ExpiredTask]) -> StoreResult<Vec<ObjectId>> {
        self.delete_tasks(tasks).await
    }

    async fn advance_schedule(&self, name: &str, expect: DateTime, new: &super::ScheduleMark) -> StoreResult<bool> {
        self.advance_schedule(name, expect, new).await
    }

    async fn balance(&self) -> StoreResult<Option<Document>> {
        self.balance().await
    }

    async fn set_balance(&self, fields: Document) -> StoreResult<()> {
        self.set_balance(fields).await
    }

    async fn set_share(&self, queue: ObjectId, share: Option<i64>, token: i64) -> StoreResult<bool> {
        self.set_share(queue, share, token).await
    }

    async fn fence_shares(&self, queues: &[ObjectId], token: i64) -> StoreResult<()> {
        self.fence_shares(queues, token).await
    }

    async fn watch_queued(&self) -> StoreResult<Option<super::QueuedEvents>> {
        self.watch_queued().await
    }

    async fn watch_tasks(&self) -> StoreResult<Option<super::TaskEvents>> {
        self.watch_tasks().await
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
        self.claim_task_until(queue, node, None).await
    }

    async fn claim_before(&self, queue: &Queue, node: &str, until: DateTime) -> StoreResult<Option<Task>> {
        self.claim_task_until(queue, node, Some(until)).await
    }

    async fn finish_and_claim(
        &self,
        end: &(ObjectId, TaskFence, TaskChange),
        queue: &Queue,
        node: &str,
        until: DateTime,
    ) -> StoreResult<Option<EndAndClaim>> {
        self.end_and_claim(end, queue, node, until).await
    }

    async fn put_output_file(&self, file: ObjectId, task: ObjectId, filename: &str, text: &str) -> StoreResult<()> {
        self.put_output_file(file, task, filename, text).await
    }

    async fn discard_output_files(&self, task: ObjectId, files: &[ObjectId]) -> StoreResult<()> {
        self.discard_output_files(task, files).await
    }

    async fn task_heads(&self, filter: &HeadFilter, limit: usize) -> StoreResult<Vec<TaskHead>> {
        tasks::heads(self, filter, limit).await
    }

    // ---- tasks (the DCI) ---------------------------------------------------------------

    async fn change_tasks(&self, changes: &[(ObjectId, TaskFence, TaskChange)]) -> StoreResult<Vec<bool>> {
        self.change_tasks(changes).await
    }

    async fn change_where(
        &self,
        target: TaskTarget,
        fence: &TaskFence,
        change: &TaskChange,
    ) -> StoreResult<Vec<ObjectId>> {
        self.change_where(target, fence, change).await
    }

    async fn insert_tasks(&self, queue: ObjectId, tasks: Vec<NewTask>) -> StoreResult<()> {
        tasks::insert(self, queue, tasks).await
    }

    async fn kill_requests(&self, node: &str) -> StoreResult<Vec<(ObjectId, StopRequest)>> {
        self.kill_requests(node).await
    }

    async fn find_tasks(&self, filter: &TaskFilter, page: Page) -> StoreResult<Vec<Task>> {
        tasks::find(self, filter, page).await
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
        self.read_output(output).await
    }

    async fn output_stream(&self, output: &Output) -> StoreResult<OutputStream> {
        self.output_stream(output).await
    }
}
