//! The embedded store's tables (see the module documentation of `sqlite`); columns added
//! since are created by the `migrate` functions of the modules that use them.

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
