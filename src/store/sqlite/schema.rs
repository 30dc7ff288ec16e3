//! The embedded store's tables (see the module documentation of `sqlite`); columns added
//! since are created by the `migrate` functions of the modules that use them.

use rusqlite::Connection;

use super::records::{add_columns, db_err};
use crate::model::status;
use crate::store::StoreResult;

pub(super) const SCHEMA: &str = "
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
CREATE TABLE IF NOT EXISTS rates (
    queue TEXT NOT NULL,
    n INTEGER NOT NULL,
    at INTEGER NOT NULL,
    node TEXT,
    PRIMARY KEY (queue, n)
);
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

/// Columns added to `tasks` after its first release, with their types: a database file
/// created before gets them on open.
const ADDED_COLUMNS: &[(&str, &str)] = &[
    ("run_at", "INTEGER"),
    ("stop", "BLOB"),
    ("progress", "BLOB"),
    ("priority", "INTEGER NOT NULL DEFAULT 0"),
    ("attempts", "BLOB"),
    ("avoid_node", "TEXT"),
    ("avoid_until", "INTEGER"),
    ("key", "TEXT"),
    ("rerun", "INTEGER"),
    ("batch", "TEXT"),
    ("after", "TEXT"),
    ("after_failure", "INTEGER"),
    ("dependents", "INTEGER"),
    ("started", "INTEGER"),
];

/// Adds the columns a database file created by an earlier release lacks, and their index.
pub(super) fn migrate(conn: &Connection) -> StoreResult<()> {
    let err = db_err("upgrade schema");
    add_columns(conn, "tasks", ADDED_COLUMNS)?;
    // Scheduled tasks only: a claim or a finish does not touch it (an index of every
    // task's status and `run_at` was rewritten by both, and `tasks_status_mtime` serves
    // the searches by status).
    conn.execute_batch(&format!(
        "DROP INDEX IF EXISTS tasks_scheduled;
         CREATE INDEX IF NOT EXISTS tasks_due ON tasks (run_at) WHERE status = {scheduled};
         CREATE UNIQUE INDEX IF NOT EXISTS tasks_key ON tasks (queue, key) WHERE key IS NOT NULL;
         CREATE INDEX IF NOT EXISTS tasks_key_only ON tasks (key) WHERE key IS NOT NULL;
         CREATE INDEX IF NOT EXISTS tasks_batch ON tasks (batch, status) WHERE batch IS NOT NULL;
         CREATE INDEX IF NOT EXISTS tasks_dependents ON tasks (dependents, status) WHERE dependents = 1;",
        scheduled = status::SCHEDULED
    ))
    .map_err(&err)?;
    Ok(())
}
