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
//!   leniency as MongoDB's (an unknown `sort` is `default`; a queue with a malformed field
//!   is left out of the list with a warning).
//! - `nodes(id, node UNIQUE, timestamp, maxthreads)`.
//! - `slots(queue, n, holder, expires, want, want_until, reserved, reserved_until)`: the
//!   queue slot leases, same rules as MongoDB's (see `slots`).
//! - `leases(name, node, token, expires)`: the leader lease, same rules as MongoDB's.
//! - `output_files(id, task, filename, length, upload_date, data)`: large outputs, the
//!   GridFS files of the MongoDB store (`files`: written again in place, discarded when
//!   unused).
//!
//! [`Store::watch_queued`] yields for tasks queued (created, requeued, recovered as queued)
//! through this store or its clones, in this process: a DEN sharing the store with the DCI
//! (`disbatch dev`) claims them at once. Tasks queued by other processes wait for the
//! DEN's next poll.
//! SQLite calls block, so each operation runs on [`tokio::task::spawn_blocking`] with a
//! connection from a small pool.

mod balance;
mod batches;
mod deps;
mod files;
mod leader;
mod lifecycle;
mod plugins;
mod recovery;
mod retries;
mod rows;
mod slots;
mod stats;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bson::oid::ObjectId;
use bson::{Bson, DateTime, Document};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use self::rows::{
    bson_bytes, db_err, lease_end, queue_from, read_bson, sort_str, task_from_row, CLAIMED_COLUMNS, TASK_COLUMNS,
};
use super::{
    Batch, Dependency, FinishExtra, HandRetry, NewQueue, NewTask, OutputValue, Page, QueueUpdate, Recovery, Resolved,
    Slot, SlotRenewal, StatusCounts, Store, StoreError, StoreResult, TaskFilter, TaskTarget,
};
use crate::model::{
    status, NameHolder, Node, NodeProcess, NodeStats, Output, Queue, RetryAt, Sort, StopRequest, Task, TaskProgress,
};

/// How often a watcher of task changes looks for writes by other processes.
const OTHER_WRITERS_POLL: Duration = Duration::from_millis(250);

/// Table of output files.
pub const OUTPUT_FILES: &str = "output_files";

/// How long a connection waits for another's write lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Connections kept open for reuse.
const POOL_SIZE: usize = 8;

/// Queued-task signals kept for a slow watcher (more coalesce into one).
const QUEUED_EVENTS: usize = 16;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS tasks (
    id TEXT PRIMARY KEY NOT NULL,
    queue TEXT NOT NULL,
    ctime INTEGER NOT NULL,
    mtime INTEGER NOT NULL,
    node TEXT,
    status INTEGER NOT NULL,
    params BLOB NOT NULL,
    stdout TEXT,
    stdout_file TEXT,
    stderr TEXT,
    stderr_file TEXT,
    run_at INTEGER,
    stop BLOB,
    progress BLOB,
    priority INTEGER NOT NULL DEFAULT 0,
    attempts BLOB,
    avoid_node TEXT,
    avoid_until INTEGER,
    key TEXT,
    rerun INTEGER
);
CREATE INDEX IF NOT EXISTS tasks_node_status ON tasks (node, status);
CREATE INDEX IF NOT EXISTS tasks_status_mtime ON tasks (status, mtime);
CREATE INDEX IF NOT EXISTS tasks_queue_status ON tasks (queue, status);
CREATE TABLE IF NOT EXISTS queues (
    id TEXT PRIMARY KEY NOT NULL,
    name TEXT NOT NULL UNIQUE,
    doc BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS nodes (
    id TEXT PRIMARY KEY NOT NULL,
    node TEXT NOT NULL UNIQUE,
    timestamp INTEGER NOT NULL,
    maxthreads INTEGER
);
CREATE TABLE IF NOT EXISTS node_stats (
    node TEXT PRIMARY KEY NOT NULL,
    stats TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS node_queue_problems (
    node TEXT PRIMARY KEY NOT NULL,
    problems TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS node_process (
    node TEXT PRIMARY KEY NOT NULL,
    id TEXT NOT NULL,
    process TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS slots (
    queue TEXT NOT NULL,
    n INTEGER NOT NULL,
    holder TEXT,
    expires INTEGER NOT NULL,
    PRIMARY KEY (queue, n)
);
CREATE INDEX IF NOT EXISTS slots_holder ON slots (holder);
CREATE TABLE IF NOT EXISTS balance (
    id INTEGER PRIMARY KEY NOT NULL CHECK (id = 1),
    doc BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS leases (
    name TEXT PRIMARY KEY NOT NULL,
    node TEXT NOT NULL,
    token INTEGER NOT NULL,
    expires INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS output_files (
    id TEXT PRIMARY KEY NOT NULL,
    task TEXT NOT NULL,
    filename TEXT NOT NULL,
    length INTEGER NOT NULL,
    upload_date INTEGER NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS output_files_task ON output_files (task);
CREATE INDEX IF NOT EXISTS output_files_name ON output_files (filename, upload_date);
";

/// The [`Store`] on a SQLite file. Cloning is cheap: clones share the connection pool.
#[derive(Clone)]
pub struct SqliteStore {
    path: Arc<PathBuf>,
    pool: Arc<Mutex<Vec<Connection>>>,
    /// Problems with stored queues already logged, so each is logged once.
    warned: Arc<Mutex<HashSet<String>>>,
    /// Signals tasks queued through this store, for [`Store::watch_queued`].
    queued: tokio::sync::broadcast::Sender<()>,
    /// Signals writes through this store, for [`Store::watch_tasks`].
    changed: tokio::sync::broadcast::Sender<()>,
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
        let store = SqliteStore {
            path: Arc::new(path.as_ref().to_path_buf()),
            pool: Arc::new(Mutex::new(Vec::new())),
            warned: Arc::new(Mutex::new(HashSet::new())),
            queued: tokio::sync::broadcast::channel(QUEUED_EVENTS).0,
            changed: tokio::sync::broadcast::channel(QUEUED_EVENTS).0,
        };
        store.ensure_indexes().await?;
        Ok(store)
    }

    /// The file in use.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn connect(path: &Path) -> StoreResult<Connection> {
        let open = db_err("open database");
        let conn = Connection::open(path).map_err(&open)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(&open)?;
        conn.pragma_update(None, "journal_mode", "WAL").map_err(&open)?;
        conn.pragma_update(None, "synchronous", "NORMAL").map_err(&open)?;
        Ok(conn)
    }

    /// Runs `f` on a pooled connection on the blocking thread pool.
    async fn with<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> StoreResult<T> + Send + 'static,
    {
        let pool = self.pool.clone();
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            let pooled = pool.lock().ok().and_then(|mut p| p.pop());
            let mut conn = match pooled {
                Some(c) => c,
                None => Self::connect(&path)?,
            };
            let result = f(&mut conn);
            if let Ok(mut p) = pool.lock() {
                if p.len() < POOL_SIZE {
                    p.push(conn);
                }
            }
            result
        })
        .await
        .map_err(|e| StoreError::Rejected(format!("database task failed: {e}")))?
    }

    /// Runs `f` in a `BEGIN IMMEDIATE` transaction, committed when `f` succeeds.
    async fn write<T, F>(&self, op: &'static str, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&rusqlite::Transaction<'_>) -> StoreResult<T> + Send + 'static,
    {
        let value = self
            .with(move |conn| {
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(db_err(op))?;
                let value = f(&tx)?;
                tx.commit().map_err(db_err(op))?;
                Ok(value)
            })
            .await?;
        self.signal_changed();
        Ok(value)
    }

    /// Tells the watchers of [`Store::watch_tasks`] that tasks changed.
    fn signal_changed(&self) {
        let _ = self.changed.send(());
    }

    /// Tells the watchers of [`Store::watch_queued`] that tasks were queued.
    fn signal_queued(&self) {
        let _ = self.queued.send(());
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

/// Keys of a queue document that `extra` fields may not set.
const QUEUE_CORE_FIELDS: [&str; 5] = ["_id", "name", "plugin", "threads", "sort"];

fn check_extra(extra: &Document) -> StoreResult<()> {
    match extra.keys().find(|k| QUEUE_CORE_FIELDS.contains(&k.as_str())) {
        Some(k) => Err(StoreError::Invalid(format!("extra queue field {k:?} is not allowed"))),
        None => Ok(()),
    }
}

fn check_threads(threads: Option<i64>) -> StoreResult<()> {
    match threads {
        Some(t) if t < 0 => Err(StoreError::Invalid(format!("threads must be non-negative, got {t}"))),
        _ => Ok(()),
    }
}

fn opt_int_bson(n: Option<i64>) -> Bson {
    n.map_or(Bson::Null, |n| i32::try_from(n).map_or(Bson::Int64(n), Bson::Int32))
}

fn is_unique_violation(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
        || f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY)
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

/// Appends the SQL conditions and parameters of a task search.
fn filter_sql(filter: &TaskFilter) -> (String, Vec<rusqlite::types::Value>) {
    use rusqlite::types::Value;
    let mut clauses = Vec::new();
    let mut args = Vec::new();
    if let Some(id) = filter.id {
        clauses.push("id = ?".to_string());
        args.push(Value::Text(id.to_hex()));
    }
    if let Some(queue) = filter.queue {
        clauses.push("queue = ?".to_string());
        args.push(Value::Text(queue.to_hex()));
    }
    if let Some(statuses) = &filter.status {
        if statuses.is_empty() {
            clauses.push("0".to_string());
        } else {
            clauses.push(format!("status IN ({})", vec!["?"; statuses.len()].join(", ")));
            args.extend(statuses.iter().map(|s| Value::Integer(i64::from(*s))));
        }
    }
    if let Some(ids) = &filter.ids {
        if ids.is_empty() {
            clauses.push("0".to_string());
        } else {
            clauses.push(format!("id IN ({})", vec!["?"; ids.len()].join(", ")));
            args.extend(ids.iter().map(|i| Value::Text(i.to_hex())));
        }
    }
    if let Some(key) = &filter.key {
        clauses.push("key = ?".to_string());
        args.push(Value::Text(key.clone()));
    }
    if let Some(batch) = &filter.batch {
        clauses.push("batch = ?".to_string());
        args.push(Value::Text(batch.clone()));
    }
    if let Some(dep) = &filter.after {
        clauses.push("id IN (SELECT child FROM task_deps WHERE dep = ?)".to_string());
        args.push(Value::Text(dep.key()));
    }
    if let Some(id) = filter.newer_than {
        clauses.push("id > ?".to_string());
        args.push(Value::Text(id.to_hex()));
    }
    if let Some(id) = filter.older_than {
        clauses.push("id < ?".to_string());
        args.push(Value::Text(id.to_hex()));
    }
    match &filter.node {
        Some(None) => clauses.push("node IS NULL".to_string()),
        Some(Some(n)) => {
            clauses.push("node = ?".to_string());
            args.push(Value::Text(n.clone()));
        }
        None => {}
    }
    let sql = if clauses.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", clauses.join(" AND "))
    };
    (sql, args)
}

/// Renews the leases of every slot `node` holds, but not one that expired: it may have
/// been counted free since.
fn renew_slots(tx: &rusqlite::Transaction<'_>, node: &str, until: i64) -> StoreResult<()> {
    tx.execute(
        "UPDATE slots SET expires = ?1 WHERE holder = ?2 AND expires > ?3",
        params![until, node, DateTime::now().timestamp_millis()],
    )
    .map_err(db_err("renew slot leases"))?;
    Ok(())
}

#[async_trait]
impl Store for SqliteStore {
    async fn ensure_indexes(&self) -> StoreResult<()> {
        self.with(|conn| {
            conn.execute_batch(SCHEMA).map_err(db_err("create schema"))?;
            conn.execute_batch(plugins::SCHEMA).map_err(db_err("create schema"))?;
            conn.execute_batch(batches::SCHEMA).map_err(db_err("create schema"))?;
            conn.execute_batch(deps::SCHEMA).map_err(db_err("create schema"))?;
            conn.execute_batch(stats::SCHEMA).map_err(db_err("create schema"))?;
            lifecycle::migrate(conn)?;
            deps::migrate(conn)?;
            slots::migrate(conn)
        })
        .await
    }

    // ---- nodes -------------------------------------------------------------------------

    async fn heartbeat(&self, node: &str, lease: Duration) -> StoreResult<Node> {
        let node = node.to_string();
        self.write("heartbeat", move |tx| {
            let now = DateTime::now();
            renew_slots(tx, &node, lease_end(now, lease))?;
            let err = db_err("heartbeat");
            tx.execute(
                "INSERT INTO nodes (id, node, timestamp, maxthreads) VALUES (?1, ?2, ?3, NULL)
                 ON CONFLICT (node) DO UPDATE SET timestamp = excluded.timestamp",
                params![ObjectId::new().to_hex(), node, now.timestamp_millis()],
            )
            .map_err(&err)?;
            let row = read_node(tx, &node).map_err(&err)?;
            node_from(row.ok_or_else(|| StoreError::Database(format!("heartbeat of node {node:?} stored nothing")))?)
        })
        .await
    }

    async fn take_node(
        &self,
        node: &str,
        process: &NodeProcess,
        stale_before: DateTime,
    ) -> StoreResult<Option<NameHolder>> {
        let text = serde_json::to_string(process).map_err(|e| StoreError::Invalid(format!("node process: {e}")))?;
        let node = node.to_string();
        let id = process.id;
        // Ok(holder) when the name is held, Err(whether tasks were requeued) when taken.
        let taken: Result<NodeProcess, bool> = self
            .write("take node name", move |tx| {
                let err = db_err("take node name");
                if let Some(current) = read_node(tx, &node).map_err(&err)? {
                    let current = node_from(current)?;
                    if let Some(holder) = current.process {
                        if holder.id != id && current.timestamp >= stale_before {
                            return Ok(Ok(holder));
                        }
                    }
                }
                tx.execute(
                    "INSERT INTO nodes (id, node, timestamp, maxthreads) VALUES (?1, ?2, ?3, NULL)
                 ON CONFLICT (node) DO UPDATE SET timestamp = excluded.timestamp",
                    params![ObjectId::new().to_hex(), node, DateTime::now().timestamp_millis()],
                )
                .map_err(&err)?;
                tx.execute(
                    "INSERT INTO node_process (node, id, process) VALUES (?1, ?2, ?3)
                 ON CONFLICT (node) DO UPDATE SET id = excluded.id, process = excluded.process",
                    params![node, id.to_hex(), text],
                )
                .map_err(&err)?;
                // Whatever the node's name still holds belongs to a process that is gone.
                let recovered = recovery::recover_node(tx, &node)?;
                Ok(Err(!recovered.requeued.is_empty()))
            })
            .await?;
        match taken {
            Ok(holder) => Ok(Some(NameHolder::Den(holder))),
            Err(requeued) => {
                if requeued {
                    self.signal_queued();
                }
                Ok(None)
            }
        }
    }

    async fn report_queue_problems(&self, node: &str, problems: &BTreeMap<String, String>) -> StoreResult<()> {
        let text = serde_json::to_string(problems).map_err(|e| StoreError::Invalid(format!("queue problems: {e}")))?;
        let node = node.to_string();
        self.with(move |conn| {
            conn.execute(
                "INSERT INTO node_queue_problems (node, problems) VALUES (?1, ?2)
                 ON CONFLICT (node) DO UPDATE SET problems = excluded.problems",
                params![node, text],
            )
            .map_err(db_err("report queue problems"))?;
            Ok(())
        })
        .await
    }

    async fn release_node(&self, node: &str, process: ObjectId) -> StoreResult<()> {
        let node = node.to_string();
        self.with(move |conn| {
            conn.execute(
                "DELETE FROM node_process WHERE node = ?1 AND id = ?2",
                params![node, process.to_hex()],
            )
            .map_err(db_err("release node name"))?;
            Ok(())
        })
        .await
    }

    async fn nodes(&self) -> StoreResult<Vec<Node>> {
        let rows = self
            .with(|conn| {
                let err = db_err("list nodes");
                let mut stmt = conn
                    .prepare(&format!("{NODE_SELECT} ORDER BY nodes.node"))
                    .map_err(&err)?;
                let rows = stmt
                    .query_map([], node_row)
                    .map_err(&err)?
                    .collect::<Result<Vec<NodeRow>, _>>()
                    .map_err(&err)?;
                Ok(rows)
            })
            .await?;
        let mut nodes = Vec::with_capacity(rows.len());
        for row in rows {
            match node_from(row) {
                Ok(n) => nodes.push(n),
                Err(e) => self.warn_once(format!("ignoring node: {e}")),
            }
        }
        Ok(nodes)
    }

    async fn set_maxthreads(&self, node: &str, maxthreads: Option<i64>) -> StoreResult<bool> {
        if let Some(m) = maxthreads.filter(|m| *m < 0) {
            return Err(StoreError::Invalid(format!("maxthreads must be non-negative, got {m}")));
        }
        let node = node.to_string();
        self.with(move |conn| {
            let n = conn
                .execute(
                    "UPDATE nodes SET maxthreads = ?1 WHERE node = ?2",
                    params![maxthreads, node],
                )
                .map_err(db_err("set maxthreads"))?;
            Ok(n > 0)
        })
        .await
    }

    async fn report_stats(&self, node: &str, stats: &NodeStats) -> StoreResult<()> {
        let text = serde_json::to_string(stats).map_err(|e| StoreError::Invalid(format!("node stats: {e}")))?;
        let node = node.to_string();
        self.with(move |conn| {
            conn.execute(
                "INSERT INTO node_stats (node, stats) VALUES (?1, ?2)
                 ON CONFLICT (node) DO UPDATE SET stats = excluded.stats",
                params![node, text],
            )
            .map_err(db_err("report node stats"))?;
            Ok(())
        })
        .await
    }

    // ---- queues ------------------------------------------------------------------------

    async fn queues(&self) -> StoreResult<Vec<Queue>> {
        let rows = self
            .with(|conn| {
                let err = db_err("list queues");
                let mut stmt = conn.prepare("SELECT id, doc FROM queues ORDER BY id").map_err(&err)?;
                let rows = stmt
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                    .map_err(&err)?
                    .collect::<Result<Vec<(String, Vec<u8>)>, _>>()
                    .map_err(&err)?;
                Ok(rows)
            })
            .await?;
        let mut queues = Vec::with_capacity(rows.len());
        for (id, bytes) in rows {
            let d = match queue_doc("queues", &id, &bytes) {
                Ok(d) => d,
                Err(e) => {
                    self.warn_once(format!("ignoring queue {id}: {e}"));
                    continue;
                }
            };
            match queue_from(&d) {
                Ok((q, problems)) => {
                    for p in problems {
                        self.warn_once(format!("queue {:?} ({}): {p}", q.name, q.id));
                    }
                    queues.push(q);
                }
                Err(e) => self.warn_once(format!("ignoring queue {:?}: {e}", d.get_str("name").unwrap_or("?"))),
            }
        }
        Ok(queues)
    }

    async fn create_queue(&self, queue: NewQueue) -> StoreResult<Queue> {
        check_extra(&queue.extra)?;
        check_threads(queue.threads)?;
        let id = ObjectId::new();
        let mut d = bson::doc! {
            "_id": id,
            "name": queue.name.clone(),
            "plugin": queue.plugin.clone(),
            "threads": opt_int_bson(queue.threads),
            "sort": sort_str(queue.sort),
        };
        d.extend(queue.extra);
        let (parsed, _) = queue_from(&d).map_err(|e| StoreError::Invalid(e.to_string()))?;
        d.remove("_id");
        let bytes = bson_bytes(&d)?;
        let name = queue.name;
        self.with(move |conn| {
            match conn.execute(
                "INSERT INTO queues (id, name, doc) VALUES (?1, ?2, ?3)",
                params![id.to_hex(), name, bytes],
            ) {
                Ok(_) => Ok(parsed),
                Err(e) if is_unique_violation(&e) => Err(StoreError::Duplicate { what: "queue", name }),
                Err(e) => Err(db_err("create queue")(e)),
            }
        })
        .await
    }

    async fn update_queue(&self, id: ObjectId, update: QueueUpdate) -> StoreResult<Option<Queue>> {
        check_extra(&update.extra)?;
        if let Some(threads) = update.threads {
            check_threads(threads)?;
        }
        self.write("update queue", move |tx| {
            let hex = id.to_hex();
            let found: Option<Vec<u8>> = tx
                .query_row("SELECT doc FROM queues WHERE id = ?1", [&hex], |r| r.get(0))
                .optional()
                .map_err(db_err("update queue"))?;
            let Some(bytes) = found else {
                return Ok(None);
            };
            let mut d = queue_doc("queues", &hex, &bytes)?;
            if let Some(name) = &update.name {
                d.insert("name", name.clone());
            }
            if let Some(plugin) = update.plugin {
                d.insert("plugin", plugin);
            }
            if let Some(threads) = update.threads {
                d.insert("threads", opt_int_bson(threads));
            }
            if let Some(sort) = update.sort {
                d.insert("sort", sort_str(sort));
            }
            d.extend(update.extra);
            let (parsed, _) = queue_from(&d)?;
            d.remove("_id");
            let bytes = bson_bytes(&d)?;
            match tx.execute(
                "UPDATE queues SET name = ?1, doc = ?2 WHERE id = ?3",
                params![parsed.name, bytes, hex],
            ) {
                Ok(_) => Ok(Some(parsed)),
                Err(e) if is_unique_violation(&e) => Err(StoreError::Duplicate {
                    what: "queue",
                    name: update.name.unwrap_or_default(),
                }),
                Err(e) => Err(db_err("update queue")(e)),
            }
        })
        .await
    }

    async fn delete_queue(&self, id: ObjectId) -> StoreResult<bool> {
        self.write("delete queue", move |tx| {
            let err = db_err("delete queue");
            let n = tx
                .execute("DELETE FROM queues WHERE id = ?1", [id.to_hex()])
                .map_err(&err)?;
            tx.execute("DELETE FROM slots WHERE queue = ?1", [id.to_hex()])
                .map_err(&err)?;
            Ok(n > 0)
        })
        .await
    }

    async fn active_counts(&self) -> StoreResult<BTreeMap<ObjectId, StatusCounts>> {
        self.count_active().await
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

    async fn queue_counts(&self) -> StoreResult<BTreeMap<ObjectId, StatusCounts>> {
        let rows = self
            .with(|conn| {
                let err = db_err("count tasks by queue");
                let mut stmt = conn
                    .prepare("SELECT queue, status, COUNT(*) FROM tasks GROUP BY queue, status")
                    .map_err(&err)?;
                let rows = stmt
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .map_err(&err)?
                    .collect::<Result<Vec<(String, i64, i64)>, _>>()
                    .map_err(&err)?;
                Ok(rows)
            })
            .await?;
        let mut counts: BTreeMap<ObjectId, StatusCounts> = BTreeMap::new();
        for (queue, code, n) in rows {
            match (
                ObjectId::parse_str(&queue).ok(),
                i32::try_from(code).ok(),
                u64::try_from(n).ok(),
            ) {
                (Some(q), Some(c), Some(n)) => *counts.entry(q).or_default().entry(c).or_default() += n,
                _ => self.warn_once(format!(
                    "tasks with a malformed queue or status are not counted: {queue} {code}"
                )),
            }
        }
        Ok(counts)
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
        let node = node.to_owned();
        // Not `write`: a lease renewal is no change of tasks for their watchers.
        self.with(move |conn| {
            let err = db_err("take the leader lease");
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(&err)?;
            let lease = leader::lead(&tx, &node, ttl)?;
            tx.commit().map_err(&err)?;
            Ok(lease)
        })
        .await
    }

    async fn leader(&self) -> StoreResult<Option<crate::store::Leader>> {
        self.with(|conn| leader::read(conn)).await
    }

    async fn slots_in_use(&self, queue: ObjectId) -> StoreResult<i64> {
        let q = queue.to_hex();
        self.with(move |conn| slots::occupied(conn, &q)).await
    }

    async fn balance(&self) -> StoreResult<Option<Document>> {
        self.with(|conn| balance::read(conn)).await
    }

    async fn set_balance(&self, fields: Document) -> StoreResult<()> {
        // Not `write`: the balance is no change of tasks for their watchers.
        self.with(move |conn| balance::set(conn, &fields)).await
    }

    async fn watch_queued(&self) -> StoreResult<Option<super::QueuedEvents>> {
        use tokio::sync::broadcast::error::RecvError;
        let events = futures::stream::unfold(self.queued.subscribe(), |mut rx| async move {
            match rx.recv().await {
                Ok(()) | Err(RecvError::Lagged(_)) => Some((Ok(()), rx)),
                Err(RecvError::Closed) => None,
            }
        });
        Ok(Some(Box::pin(events)))
    }

    /// Writes through this store are signalled at once; writes by other processes on the
    /// same file (a DEN beside `disbatch web`) are seen by a look at `PRAGMA data_version`
    /// every [`OTHER_WRITERS_POLL`], one per watching process.
    async fn watch_tasks(&self) -> StoreResult<Option<super::TaskEvents>> {
        use tokio::sync::broadcast::error::RecvError;
        let here = futures::stream::unfold(self.changed.subscribe(), |mut rx| async move {
            match rx.recv().await {
                Ok(()) | Err(RecvError::Lagged(_)) => Some((Ok(None), rx)),
                Err(RecvError::Closed) => None,
            }
        });
        let conn = Self::connect(&self.path)?;
        let version = |c: &Connection| {
            c.query_row("PRAGMA data_version", [], |r| r.get::<_, i64>(0))
                .map_err(db_err("watch tasks"))
        };
        let first = version(&conn)?;
        let elsewhere = futures::stream::unfold((conn, first), move |(conn, last)| async move {
            loop {
                tokio::time::sleep(OTHER_WRITERS_POLL).await;
                match version(&conn) {
                    Ok(v) if v == last => continue,
                    Ok(v) => return Some((Ok(None), (conn, v))),
                    Err(e) => return Some((Err(e), (conn, last))),
                }
            }
        });
        Ok(Some(Box::pin(futures::stream::select(here, elsewhere))))
    }

    async fn has_queued(&self, queue: ObjectId) -> StoreResult<bool> {
        self.with(move |conn| {
            conn.query_row(
                "SELECT EXISTS (SELECT 1 FROM tasks WHERE queue = ?1 AND status = ?2 AND node IS NULL)",
                params![queue.to_hex(), status::QUEUED],
                |r| r.get(0),
            )
            .map_err(db_err("look for queued tasks"))
        })
        .await
    }

    /// Claims with one `UPDATE … WHERE id = (SELECT … LIMIT 1) RETURNING …` in an
    /// immediate transaction. A claimed row that cannot be read as a task is marked failed
    /// (status 2, the reason in `stderr`) and the error returned.
    async fn claim(&self, queue: &Queue, node: &str) -> StoreResult<Option<Task>> {
        let order = match queue.sort {
            Sort::Fifo => "ORDER BY priority DESC, id ASC",
            Sort::Lifo => "ORDER BY priority DESC, id DESC",
            Sort::Default => "ORDER BY priority DESC",
        };
        let sql = format!(
            "UPDATE tasks SET node = ?1, status = ?2, mtime = ?3
             WHERE id = (SELECT id FROM tasks WHERE queue = ?4 AND status = ?5 AND node IS NULL
                         AND (avoid_node IS NULL OR avoid_node <> ?1 OR avoid_until <= ?3) {order} LIMIT 1)
             RETURNING {CLAIMED_COLUMNS}"
        );
        let (q, node) = (queue.id.to_hex(), node.to_string());
        self.write("claim task", move |tx| {
            let now = DateTime::now().timestamp_millis();
            let claimed = tx
                .query_row(
                    &sql,
                    params![node, status::CLAIMED, now, q, status::QUEUED],
                    task_from_row,
                )
                .optional()
                .map_err(db_err("claim task"))?;
            match claimed {
                None => Ok(Ok(None)),
                Some((_, Ok(task))) => Ok(Ok(Some(task))),
                Some((id, Err(e))) => {
                    tx.execute(
                        "UPDATE tasks SET status = ?1, stderr = ?2, stderr_file = NULL, mtime = ?3 WHERE id = ?4",
                        params![status::FAILED, format!("disbatch: cannot run this task: {e}"), now, id],
                    )
                    .map_err(db_err("fail malformed task"))?;
                    Ok(Err(e))
                }
            }
        })
        .await?
    }

    async fn start(&self, task: ObjectId, node: &str) -> StoreResult<bool> {
        let node = node.to_string();
        let started = self
            .with(move |conn| {
                let n = conn
                    .execute(
                        "UPDATE tasks SET status = ?1, mtime = ?2 WHERE id = ?3 AND node = ?4 AND status = ?5",
                        params![
                            status::RUNNING,
                            DateTime::now().timestamp_millis(),
                            task.to_hex(),
                            node,
                            status::CLAIMED
                        ],
                    )
                    .map_err(db_err("start task"))?;
                if n == 1 {
                    return Ok(true);
                }
                // A retry after a lost reply: the first attempt applied.
                conn.query_row(
                    "SELECT EXISTS (SELECT 1 FROM tasks WHERE id = ?1 AND node = ?2 AND status = ?3)",
                    params![task.to_hex(), node, status::RUNNING],
                    |r| r.get(0),
                )
                .map_err(db_err("start task"))
            })
            .await;
        self.signal_changed();
        started
    }

    async fn put_output_file(&self, file: ObjectId, task: ObjectId, filename: &str, text: &str) -> StoreResult<()> {
        self.put_file(file, task, filename, text).await
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
        let (node, extra) = (node.to_string(), extra.clone());
        let done = self
            .write("finish task", move |tx| {
                retries::finish(tx, task, &node, status, &stdout, &stderr, &extra)
            })
            .await?;
        if done == Some(true) {
            self.signal_queued();
        }
        Ok(done.is_some())
    }

    async fn requeue_own(&self, node: &str, tasks: &[ObjectId]) -> StoreResult<Vec<ObjectId>> {
        let (node, tasks) = (node.to_string(), tasks.to_vec());
        let requeued = self
            .write("requeue task", move |tx| {
                let now = DateTime::now().timestamp_millis();
                let mut requeued = Vec::new();
                for id in tasks {
                    let n = tx
                        .execute(
                            "UPDATE tasks SET status = ?1, node = NULL, rerun = NULL, mtime = ?2
                         WHERE id = ?3 AND node = ?4 AND status IN (?5, ?6) AND stop IS NULL",
                            params![status::QUEUED, now, id.to_hex(), node, status::CLAIMED, status::RUNNING],
                        )
                        .map_err(db_err("requeue task"))?;
                    if n == 1 {
                        requeued.push(id);
                        continue;
                    }
                    // A task someone asked to kill ends failed rather than running again.
                    tx.execute(
                        "UPDATE tasks SET status = ?1, stdout = '', stdout_file = NULL, stderr = ?2,
                             stderr_file = NULL, mtime = ?3
                         WHERE id = ?4 AND node = ?5 AND status IN (?6, ?7) AND stop IS NOT NULL",
                        params![
                            status::FAILED,
                            super::KILLED_AT_SHUTDOWN,
                            now,
                            id.to_hex(),
                            node,
                            status::CLAIMED,
                            status::RUNNING
                        ],
                    )
                    .map_err(db_err("end killed task"))?;
                }
                Ok(requeued)
            })
            .await?;
        if !requeued.is_empty() {
            self.signal_queued();
        }
        Ok(requeued)
    }

    /// Recovers as the MongoDB store does, in one transaction: a node is fresh when its
    /// `timestamp` is at or after `stale_before`; claimed or running tasks of any other
    /// node are recovered once their own `mtime` is before `stale_before` too.
    async fn recover_orphans(&self, claimed_before: DateTime, stale_before: DateTime) -> StoreResult<Recovery> {
        let (claimed_before, stale_before) = (claimed_before.timestamp_millis(), stale_before.timestamp_millis());
        let recovery = self
            .write("recover orphans", move |tx| {
                recovery::recover_orphans(tx, claimed_before, stale_before)
            })
            .await?;
        if !recovery.requeued.is_empty() || !recovery.retried.is_empty() {
            self.signal_queued();
        }
        Ok(recovery)
    }

    // ---- tasks (the DCI) ---------------------------------------------------------------

    async fn insert_tasks(&self, queue: ObjectId, tasks: Vec<NewTask>) -> StoreResult<()> {
        if tasks.is_empty() {
            return Ok(());
        }
        let now = DateTime::now();
        let encoded = tasks
            .iter()
            .map(|t| {
                let run_at = t.run_at.map(|d| d.timestamp_millis());
                bson_bytes(&t.params).map(|bytes| {
                    (
                        t.id.to_hex(),
                        bytes,
                        t.initial_status(now),
                        run_at,
                        t.priority,
                        t.key.clone(),
                        t.batch.clone(),
                        (t.after.clone(), t.after_failure_runs, t.dependents),
                    )
                })
            })
            .collect::<StoreResult<Vec<_>>>()?;
        self.write("create tasks", move |tx| {
            let err = db_err("create tasks");
            let q = queue.to_hex();
            let mut stmt = tx
                .prepare_cached(
                    "INSERT INTO tasks (id, queue, ctime, mtime, node, status, params, run_at, priority, key, batch,
                                        after, after_failure, dependents)
                     VALUES (?1, ?2, ?3, ?3, NULL, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                )
                .map_err(&err)?;
            for (id, bytes, status, run_at, priority, key, batch, (after, runs_anyway, dependents)) in encoded {
                deps::insert_deps(tx, &id, &after)?;
                match stmt.execute(params![
                    id,
                    q,
                    now.timestamp_millis(),
                    status,
                    bytes,
                    run_at,
                    priority,
                    key,
                    batch,
                    deps::after_column(&after),
                    runs_anyway.then_some(1),
                    dependents.then_some(1)
                ]) {
                    Ok(_) => {}
                    Err(rusqlite::Error::SqliteFailure(e, _))
                        if e.code == rusqlite::ErrorCode::ConstraintViolation && key.is_some() =>
                    {
                        return Err(StoreError::Duplicate {
                            what: "task key",
                            name: key.unwrap_or_default(),
                        })
                    }
                    Err(e) => return Err(err(e)),
                }
            }
            Ok(())
        })
        .await?;
        self.signal_queued();
        Ok(())
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
        self.resubmit(id, status, task).await
    }

    async fn request_rerun(&self, id: ObjectId) -> StoreResult<bool> {
        self.rerun(id).await
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

    async fn report_progress(&self, task: ObjectId, node: &str, progress: &TaskProgress) -> StoreResult<bool> {
        self.store_progress(task, node, progress).await
    }

    async fn find_tasks(&self, filter: &TaskFilter, page: Page) -> StoreResult<Vec<Task>> {
        if page.limit == 0 {
            return Ok(Vec::new());
        }
        let (clause, mut args) = filter_sql(filter);
        args.push(rusqlite::types::Value::Integer(
            i64::try_from(page.limit).unwrap_or(i64::MAX),
        ));
        args.push(rusqlite::types::Value::Integer(
            i64::try_from(page.skip).unwrap_or(i64::MAX),
        ));
        let order = if page.oldest_first { "ASC" } else { "DESC" };
        let sql = format!("SELECT {TASK_COLUMNS} FROM tasks{clause} ORDER BY id {order} LIMIT ? OFFSET ?");
        self.with(move |conn| {
            let err = db_err("find tasks");
            let mut stmt = conn.prepare(&sql).map_err(&err)?;
            let rows = stmt
                .query_map(rusqlite::params_from_iter(args), task_from_row)
                .map_err(&err)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(&err)?;
            rows.into_iter().map(|(_, t)| t).collect()
        })
        .await
    }

    async fn count_tasks(&self, filter: &TaskFilter) -> StoreResult<u64> {
        let (clause, args) = filter_sql(filter);
        let sql = format!("SELECT COUNT(*) FROM tasks{clause}");
        let n: i64 = self
            .with(move |conn| {
                conn.query_row(&sql, rusqlite::params_from_iter(args), |r| r.get(0))
                    .map_err(db_err("count tasks"))
            })
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn task(&self, id: ObjectId) -> StoreResult<Option<Task>> {
        let sql = format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?1");
        let found = self
            .with(move |conn| {
                conn.query_row(&sql, [id.to_hex()], task_from_row)
                    .optional()
                    .map_err(db_err("find task"))
            })
            .await?;
        found.map(|(_, t)| t).transpose()
    }

    async fn read_output(&self, output: &Output) -> StoreResult<String> {
        let id = match output {
            Output::Inline(s) => return Ok(s.clone()),
            Output::File(id) => *id,
        };
        let found: Option<(String, i64)> = self
            .with(move |conn| {
                conn.query_row(
                    "SELECT data, length FROM output_files WHERE id = ?1",
                    [id.to_hex()],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
                .map_err(db_err("read output file"))
            })
            .await?;
        let Some((text, length)) = found else {
            return Err(StoreError::Malformed {
                collection: OUTPUT_FILES,
                id: id.to_hex(),
                reason: "no such file".to_string(),
            });
        };
        if usize::try_from(length).ok() != Some(text.len()) {
            return Err(StoreError::Malformed {
                collection: OUTPUT_FILES,
                id: id.to_hex(),
                reason: format!("length is {length} but the data has {} bytes", text.len()),
            });
        }
        Ok(text)
    }
}

/// A node row as a node.
/// A row of `nodes` with its `node_stats`, `node_process` and `node_queue_problems` JSON.
type NodeRow = (
    String,
    String,
    i64,
    Option<i64>,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// A node with its `node_stats`, `node_process` and `node_queue_problems` rows, read as a
/// [`NodeRow`] by [`node_row`]; a `WHERE` or `ORDER BY` may follow.
const NODE_SELECT: &str = "SELECT nodes.id, nodes.node, nodes.timestamp, nodes.maxthreads, node_stats.stats,
        node_process.process, node_queue_problems.problems
    FROM nodes LEFT JOIN node_stats ON node_stats.node = nodes.node
               LEFT JOIN node_process ON node_process.node = nodes.node
               LEFT JOIN node_queue_problems ON node_queue_problems.node = nodes.node";

/// A row of [`NODE_SELECT`].
fn node_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<NodeRow> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
    ))
}

/// The node `node`, if it has a document.
fn read_node(conn: &Connection, node: &str) -> rusqlite::Result<Option<NodeRow>> {
    conn.query_row(&format!("{NODE_SELECT} WHERE nodes.node = ?1"), params![node], node_row)
        .optional()
}

fn node_from((id, node, timestamp, maxthreads, stats, process, problems): NodeRow) -> StoreResult<Node> {
    let maxthreads = match maxthreads {
        Some(m) if m < 0 => {
            return Err(StoreError::Malformed {
                collection: "nodes",
                id,
                reason: format!("field `maxthreads` must be a non-negative integer or null, found {m}"),
            })
        }
        other => other,
    };
    Ok(Node {
        id: parse_oid("nodes", &id)?,
        node,
        timestamp: DateTime::from_millis(timestamp),
        maxthreads,
        stats: stats.and_then(|s| serde_json::from_str(&s).ok()),
        process: process.and_then(|p| serde_json::from_str(&p).ok()),
        queue_problems: problems.and_then(|p| serde_json::from_str(&p).ok()).unwrap_or_default(),
        problem: None,
    })
}
