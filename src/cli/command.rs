//! The verbs of `disbatch` and their arguments.

use clap::Subcommand;

use super::after::AfterArgs;
use super::batches::BatchArgs;
use super::lifecycle::{RetryArgs, StopArgs};
use super::wait::WaitArgs;
use std::path::PathBuf;

use super::{dev, plugins, scaffold, schedules, users};
use crate::launch::DEFAULT_EMBEDDED_PATH;

/// The verbs.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the DCI (REST API and web UI) for a config file (the global `--config`), or
    /// for an embedded store.
    Web {
        /// Use the embedded store, a SQLite file (default ./disbatch.db), instead of MongoDB.
        #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = DEFAULT_EMBEDDED_PATH)]
        embedded: Option<PathBuf>,
        /// Directory of plugin components, over the config's `plugin_dir`. Without a config
        /// file every `*.wasm` in it is an allowed plugin.
        #[arg(long, value_name = "DIR")]
        plugin_dir: Option<PathBuf>,
        /// Address to listen on (default: the config's `bind`, 127.0.0.1:8080).
        #[arg(long)]
        bind: Option<String>,
    },
    /// Try Disbatch on one machine: an embedded store (or MongoDB), a `demo` queue, a DEN
    /// and the web UI in one process.
    Dev(dev::DevArgs),
    /// Server information.
    Info,
    /// The allowed plugins; with --full, every allowed or stored plugin and its newest
    /// stored version.
    Plugins,
    /// Upload a plugin component to the store; every DEN whose config allows the name
    /// runs it.
    PushPlugin(plugins::PushArgs),
    /// Create a new plugin project from the templates (`--lang rust|python|js`); needs no
    /// server.
    NewPlugin(scaffold::NewPluginArgs),
    /// The stored versions of a plugin, newest first.
    PluginVersions {
        /// Plugin name.
        name: String,
    },
    /// Delete every stored version of a plugin.
    DeletePlugin {
        /// Plugin name.
        name: String,
    },
    /// Queues with their queued/running/completed counts.
    #[command(alias = "status")]
    Queues,
    /// Create a queue.
    CreateQueue {
        /// Queue name.
        name: String,
        /// Plugin name (one of `disbatch plugins`).
        plugin: String,
        /// Concurrency limit across all nodes.
        #[arg(long)]
        threads: Option<i64>,
        /// Claim order: fifo, lifo or default.
        #[arg(long)]
        sort: Option<String>,
    },
    /// Change a queue: `update-queue <queue> threads 4 plugin demo …`.
    UpdateQueue {
        /// Queue id or name.
        queue: String,
        /// Pairs of field and value (name, plugin, threads, sort, sandbox, on_orphan, retry,
        /// activity_timeout, next_queue, rate as JSON `{"max": 10, "per": "1s"}`).
        #[arg(required = true, num_args = 2..)]
        pairs: Vec<String>,
    },
    /// Delete a queue (its tasks stay).
    DeleteQueue {
        /// Queue id or name.
        queue: String,
    },
    /// Create one task: `create-task <queue> key value …` (values parsed as JSON when they can be).
    CreateTask {
        /// Run it at this time (RFC 3339) or after this delay (`10m`); until then it is
        /// scheduled (-7).
        #[arg(long, value_name = "TIME|DELAY")]
        run_at: Option<String>,
        /// Claim priority within the queue: higher first (default 0).
        #[arg(long, allow_hyphen_values = true)]
        priority: Option<i64>,
        /// A key unique within the queue: when it is taken, the task that has it is the
        /// answer and nothing is created.
        #[arg(long)]
        key: Option<String>,
        /// With `--key`: submit the task that has the key again (new params if it waits or
        /// has finished, once more after its run if it is running).
        #[arg(long, requires = "key")]
        resubmit: bool,
        /// Then wait for it to end, as `wait` does.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        batch: BatchArgs,
        #[command(flatten)]
        after: AfterArgs,
        /// Queue id or name.
        queue: String,
        /// Params: `name value` pairs, each value sent as a string (as Disbatch 4 does), or
        /// `name:=JSON` for a typed value (`n:=3`, `tags:='["a"]'`).
        pairs: Vec<String>,
    },
    /// Create tasks from a JSON array of params (inline, `@file` or `-` for stdin), or with
    /// `--collection` one per document: `{"filter": {…}, "params": {"k": "document.field"}}`.
    CreateTasks {
        /// Schedule every task: a time (RFC 3339) or a delay (`10m`).
        #[arg(long, value_name = "TIME|DELAY")]
        run_at: Option<String>,
        /// Claim priority of every task: higher first (default 0).
        #[arg(long, allow_hyphen_values = true)]
        priority: Option<i64>,
        /// Create one task per document of this collection.
        #[arg(long)]
        collection: Option<String>,
        #[command(flatten)]
        batch: BatchArgs,
        #[command(flatten)]
        after: AfterArgs,
        /// Queue id or name.
        queue: String,
        /// The JSON (array of params, or `{filter, params}` with --collection).
        #[arg(value_name = "JSON")]
        tasks: String,
    },
    /// Create a DAG of tasks in one request: a JSON array (inline, `@file` or `-`) of
    /// `{params, key, after: [{"ref": n} | key | id | {"batch": id}], after_failure}`;
    /// refused whole when it has a cycle or names what does not exist.
    CreateDag {
        /// Queue id or name.
        queue: String,
        /// The JSON array of entries.
        #[arg(value_name = "JSON")]
        tasks: String,
    },
    /// Search tasks: `tasks '{"queue":"q","status":-2}'` (indexed fields only), newest first,
    /// 20 unless `--limit N` (0 = all).
    Tasks {
        /// JSON filter on queue, status, node, id.
        filter: Option<String>,
    },
    /// One task with its stdout and stderr.
    Task {
        /// Task id.
        id: String,
    },
    /// A batch: its tasks' counts by status and whether it is complete.
    Batch {
        /// Batch id.
        id: String,
    },
    /// Cancel tasks that have not started (queued or scheduled): `cancel <id>…`, or
    /// `cancel --queue <queue>` for all of a queue's.
    Cancel(StopArgs),
    /// Kill running tasks: their plugins are stopped within a second and the tasks end
    /// failed. `kill <id>…`, or `kill --queue <queue>` for all of a queue's.
    Kill(StopArgs),
    /// Queue finished tasks again (succeeded, failed, orphaned, cancelled); each keeps its
    /// last run in its `attempts` list.
    Retry(RetryArgs),
    /// Wait for tasks to end, showing progress on a terminal: exit 0 when all succeeded,
    /// 4 when one did not, 5 at `--timeout`.
    Wait(WaitArgs),
    /// Nodes (DENs) with their heartbeat and maxthreads.
    Nodes,
    /// Set a node's maxthreads (`null` for no limit).
    SetMaxthreads {
        /// Node id or name.
        node: String,
        /// A non-negative number or `null`.
        maxthreads: String,
    },
    /// The monitoring check (OK, WARNING or CRITICAL), with the QueueBalance's.
    Monitoring,
    /// The QueueBalance: its limit now, lanes and `max_tasks` entries.
    Balance,
    /// Schedules with their queue, times, next occurrence and last task.
    Schedules,
    /// Create a schedule, or change the options given of one: `set-schedule nightly
    /// --queue q --cron '0 3 * * *' --timezone Europe/Berlin`, `set-schedule nightly --paused`.
    SetSchedule(schedules::SetScheduleArgs),
    /// Delete a schedule (its tasks stay).
    DeleteSchedule {
        /// Schedule name.
        name: String,
    },
    /// Create the MongoDB roles and users of Disbatch in the config's database, as a root
    /// user (`--config FILE --root-user U`); `--dry-run` prints them.
    CreateUsers(users::CreateUsersArgs),
    /// Set the QueueBalance: `{"max_tasks": {"* 07:00": 5, …}, "queues": [["bulk"],
    /// ["urgent"]], "disabled": null}` as JSON text, `@file` or `-` (standard input).
    SetBalance {
        /// The balance as JSON.
        #[arg(value_name = "JSON")]
        balance: String,
    },
}
