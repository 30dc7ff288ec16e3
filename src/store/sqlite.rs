//! [`SqliteStore`]: the [`Store`] on one SQLite file, the embedded single-node store.
//!
//! The file is opened in WAL mode with a busy timeout, so several DEN processes on the
//! same machine can share it. Every operation that reads before it writes runs in a
//! `BEGIN IMMEDIATE` transaction (the file's write lock is taken first), so a claim is
//! one atomic "pick the next queued task and mark it claimed", exactly once across every
//! connection and process.
//!
//! Tables mirror the MongoDB collections:
//!
//! - `tasks(id, queue, ctime, mtime, node, status, params, stdout, stdout_file, stderr,
//!   stderr_file)`: ids are ObjectIds as 24 lowercase hex digits (so text order is `_id`
//!   order), times are milliseconds since the epoch, `params` is the BSON document's bytes
//!   (it reads back equal, types included), and an output is either text or the id of an
//!   output file. Indexed as the MongoDB store indexes `tasks`.
//! - `queues(id, name UNIQUE, doc)`: the whole queue document as BSON, parsed with the same
//!   reader as MongoDB's ([`crate::store::queue_doc`]: an unknown `sort` is `default`; a
//!   queue with a malformed field is not run and is listed by [`Store::unreadable_queues`]
//!   with its problem).
//! - `nodes(id, node UNIQUE, timestamp, maxthreads)`.
//! - `slots(queue, n, holder, expires, taken, want, want_until, reserved, reserved_until)`: the
//!   queue slot leases, same rules as MongoDB's (see `slots`).
//! - `leases(name, node, token, expires)`: the leader lease, same rules as MongoDB's.
//! - `schedules(name, doc, last, last_task)`: schedules, same rules as MongoDB's.
//! - `output_files(id, task, filename, length, upload_date, data)`: large outputs, the
//!   GridFS files of the MongoDB store (`files`: written again in place, discarded when
//!   unused).
//!
//! [`Store::watch_queued`] yields for tasks queued (created, requeued, recovered as queued)
//! through this store or its clones, in this process: a DEN sharing the store with the DCI
//! (`disbatch dev`) claims them at once. Tasks queued by other processes wait for the
//! DEN's next poll.
//! SQLite calls block: every write transaction runs on the store's writer thread (`writer`),
//! every read on [`tokio::task::spawn_blocking`] with a connection of its own, at most
//! eight at once (`readers`).
//!
//! Parts, named as the MongoDB store's for the same concern: `connect`, `records` (rows ↔
//! model), `schema` (tables, indexes, added columns), `writer` and `touched` (the writer
//! thread and what a write tells the watchers), `readers` (the read connections), `tasks`, `change` (fenced task changes),
//! `claims`, `queues`, `slots`, `nodes`, `leases`, `balance`, `schedules`, `batches`, `deps`, `kills`,
//! `stats`, `plugins`, `files` (output files) and `watch`.

mod balance;
mod batches;
mod change;
mod claims;
mod connect;
mod deps;
mod files;
mod kills;
mod leases;
mod nodes;
mod plugins;
mod queues;
mod rates;
mod readers;
mod records;
mod retention;
mod schedules;
mod schema;
mod slots;
mod stats;
mod tasks;
mod touched;
mod watch;
mod writer;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bson::oid::ObjectId;
use bson::DateTime;
use bson::Document;
use rusqlite::{params, Connection, OptionalExtension};

use self::records::{db_err, read_bson};
use self::touched::Touched;
use super::{
    Batch, Dependency, Leader, NewQueue, NewTask, Page, PendingChange, QueueState, QueueUpdate, Slot, SlotRenewal,
    StatusCounts, Store, StoreError, StoreResult, TaskChange, TaskFence, TaskFilter, TaskTarget,
};
use super::{HeadFilter, NodeChange, NodeFence, NodeRecord, TaskHead};
use crate::model::{Node, Output, Queue, StopRequest, Task, UnreadableQueue};

/// How often a watcher of task changes looks for writes by other processes.
const OTHER_WRITERS_POLL: Duration = Duration::from_millis(250);

/// Table of output files.
pub const OUTPUT_FILES: &str = "output_files";

/// Queued-task signals kept for a slow watcher (more coalesce into one).
const QUEUED_EVENTS: usize = 16;

/// Task-change signals kept for a slow watcher (past these, it is told "any task").
const TASK_EVENTS: usize = 1024;

/// The [`Store`] on a SQLite file. Cloning is cheap: clones share the connection pool.
#[derive(Clone)]
pub struct SqliteStore {
    path: Arc<PathBuf>,
    readers: Arc<readers::Readers>,
    /// Runs every write transaction of this store and its clones, committing the writes
    /// that wait together (see `writer`).
    writer: Arc<writer::Writer>,
    /// Problems with stored queues already logged, so each is logged once.
    warned: Arc<Mutex<HashSet<String>>>,
    /// Signals tasks queued through this store, for [`Store::watch_queued`].
    queued: tokio::sync::broadcast::Sender<()>,
    /// Signals task changes through this store, for [`Store::watch_tasks`]: the ids
    /// changed, or `None` for any task.
    changed: tokio::sync::broadcast::Sender<Option<Arc<[ObjectId]>>>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (creating as needed) the store in the file at `path` and creates its schema.
    pub async fn open(path: impl AsRef<Path>) -> StoreResult<SqliteStore> {
        let path = Arc::new(path.as_ref().to_path_buf());
        let writer = writer::Writer::start(path.to_path_buf(), connect::connect)
            .map_err(|e| StoreError::Database(format!("cannot start the database writer thread: {e}")))?;
        let store = SqliteStore {
            readers: Arc::new(readers::Readers::new(path.clone(), writer.commits().clone())),
            path,
            writer: Arc::new(writer),
            warned: Arc::new(Mutex::new(HashSet::new())),
            queued: tokio::sync::broadcast::channel(QUEUED_EVENTS).0,
            changed: tokio::sync::broadcast::channel(TASK_EVENTS).0,
        };
        store.ensure_indexes().await?;
        Ok(store)
    }

    /// The file in use.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Write transactions this store and its clones committed to the file since it was
    /// opened: each commit of the writer thread (a group of writes sharing one `BEGIN
    /// IMMEDIATE` … `COMMIT` counts once) and each one of a pooled connection (the few
    /// writes made outside the writer: the schema, a new queue, an output file too large to
    /// keep inline, the QueueBalance status). Reads count nothing.
    pub fn write_transactions(&self) -> u64 {
        self.writer.commits().load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Runs `f` on a read connection (see `readers`).
    async fn with<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> StoreResult<T> + Send + 'static,
    {
        self.readers.with(f).await
    }

    /// Logs a problem with a stored document once per process.
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

fn parse_oid(collection: &'static str, text: &str) -> StoreResult<ObjectId> {
    ObjectId::parse_str(text).map_err(|e| StoreError::Malformed {
        collection,
        id: text.to_string(),
        reason: format!("id is not an ObjectId: {e}"),
    })
}

/// Reads one queue row `(id, doc)` as a queue document.
fn queue_doc(collection: &'static str, id: &str, bytes: &[u8]) -> StoreResult<Document> {
    let mut d = read_bson(collection, id, bytes)?;
    d.insert("_id", parse_oid(collection, id)?);
    Ok(d)
}

#[async_trait]
impl Store for SqliteStore {
    async fn ensure_indexes(&self) -> StoreResult<()> {
        self.with(|conn| {
            conn.execute_batch(schema::SCHEMA).map_err(db_err("create schema"))?;
            conn.execute_batch(plugins::SCHEMA).map_err(db_err("create schema"))?;
            conn.execute_batch(batches::SCHEMA).map_err(db_err("create schema"))?;
            conn.execute_batch(deps::SCHEMA).map_err(db_err("create schema"))?;
            conn.execute_batch(stats::SCHEMA).map_err(db_err("create schema"))?;
            conn.execute_batch(schedules::SCHEMA).map_err(db_err("create schema"))?;
            schema::migrate(conn)?;
            claims::migrate(conn)?;
            deps::migrate(conn)?;
            slots::migrate(conn)
        })
        .await
    }

    // ---- nodes -------------------------------------------------------------------------

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
        let q = id.to_hex();
        let bytes: Option<Vec<u8>> = self
            .with(move |conn| {
                conn.query_row("SELECT doc FROM queues WHERE id = ?1", params![q], |r| r.get(0))
                    .optional()
                    .map_err(db_err("read a queue"))
            })
            .await?;
        bytes
            .map(|b| queue_doc("queues", &id.to_hex(), &b).and_then(|d| super::queue_doc::read(&d).map(|(q, _)| q)))
            .transpose()
    }

    async fn create_queue(&self, queue: NewQueue) -> StoreResult<Queue> {
        self.create_queue(queue).await
    }

    async fn update_queue(&self, id: ObjectId, update: QueueUpdate) -> StoreResult<Option<QueueState>> {
        self.update_queue(id, update).await
    }

    async fn delete_queue(&self, id: ObjectId) -> StoreResult<bool> {
        self.delete_queue(id).await
    }

    async fn active_counts(&self) -> StoreResult<BTreeMap<ObjectId, StatusCounts>> {
        self.active_counts().await
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

    async fn queue_counts(&self) -> StoreResult<BTreeMap<ObjectId, StatusCounts>> {
        self.queue_counts().await
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
        let name = name.to_owned();
        self.with(move |conn| leases::lease(conn, &name)).await
    }

    async fn change_lease(&self, name: &str, expect: Option<&Leader>, new: &Leader) -> StoreResult<bool> {
        let (name, expect, new) = (name.to_owned(), expect.cloned(), new.clone());
        // On the writer thread, so that it never waits behind it for the write lock; not
        // `write`: a lease renewal is no change of tasks for their watchers.
        self.writer
            .write_as(writer::Priority::Liveness, "change a lease", move |tx| {
                leases::change_lease(tx, &name, expect.as_ref(), &new)
            })
            .await
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
        self.with(|conn| balance::read(conn)).await
    }

    async fn set_balance(&self, fields: Document) -> StoreResult<()> {
        // Not `write`: the balance is no change of tasks for their watchers.
        self.with(move |conn| balance::set(conn, &fields)).await
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

    async fn output_stream(&self, output: &Output) -> StoreResult<super::OutputStream> {
        self.output_stream(output).await
    }

    async fn task_marks(&self, ids: &[ObjectId]) -> StoreResult<Vec<(ObjectId, u64)>> {
        self.task_marks(ids).await
    }

    async fn has_queued(&self, queue: ObjectId) -> StoreResult<bool> {
        self.has_queued(queue).await
    }

    async fn claim(&self, queue: &Queue, node: &str) -> StoreResult<Option<Task>> {
        self.claim(queue, node).await
    }

    async fn claim_to_run(&self, queue: &Queue, node: &str) -> StoreResult<Option<Task>> {
        self.claim_to_run(queue, node).await
    }

    async fn claim_before(&self, queue: &Queue, node: &str, until: DateTime) -> StoreResult<Option<Task>> {
        self.claim_before(queue, node, until).await
    }

    /// Offered: the slot's row is read, the step `rule` decides is written and the task
    /// claimed and started, in one transaction.
    async fn renew_and_claim(
        &self,
        slot: &Slot,
        queue: &Queue,
        node: &str,
        lease: Duration,
        rule: super::RenewRule,
    ) -> StoreResult<Option<(SlotRenewal, Option<Task>)>> {
        self.renew_and_claim(slot, queue, node, lease, rule).await
    }

    /// Offered: the end and the claim in one transaction.
    async fn finish_and_claim(
        &self,
        end: &(ObjectId, TaskFence, TaskChange),
        queue: &Queue,
        node: &str,
        until: DateTime,
    ) -> StoreResult<Option<super::EndAndClaim>> {
        self.finish_and_claim(end, queue, node, until).await.map(Some)
    }

    async fn put_output_file(&self, file: ObjectId, task: ObjectId, filename: &str, text: &str) -> StoreResult<()> {
        self.put_output_file(file, task, filename, text).await
    }

    async fn discard_output_files(&self, task: ObjectId, files: &[ObjectId]) -> StoreResult<()> {
        self.discard_output_files(task, files).await
    }

    async fn task_heads(&self, filter: &HeadFilter, limit: usize) -> StoreResult<Vec<TaskHead>> {
        self.task_heads(filter, limit).await
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
        self.insert_tasks(queue, tasks).await
    }

    async fn kill_requests(&self, node: &str) -> StoreResult<Vec<(ObjectId, StopRequest)>> {
        self.kill_requests(node).await
    }

    async fn find_tasks(&self, filter: &TaskFilter, page: Page) -> StoreResult<Vec<Task>> {
        self.find_tasks(filter, page).await
    }

    async fn count_tasks(&self, filter: &TaskFilter) -> StoreResult<u64> {
        self.count_tasks(filter).await
    }

    async fn task(&self, id: ObjectId) -> StoreResult<Option<Task>> {
        self.task(id).await
    }

    async fn read_output(&self, output: &Output) -> StoreResult<String> {
        self.read_output(output).await
    }
}
