//! The `disbatch` command line: `disbatch web` serves the DCI; every other verb talks HTTP
//! to a DCI (`--url`, default `http://localhost:8080`, env `DISBATCH_URL`) with the
//! Disbatch 4 CLI's verbs. Output is a human table, or the API's JSON with `--json`.
//!
//! Parts: `client` (HTTP + errors), `table` (text tables), `web` (the server verb), `dev`
//! (a DEN and the DCI in one process, for trying Disbatch on one machine).

mod after;
mod balance;
mod batches;
pub mod client;
pub mod dev;
mod lifecycle;
pub mod plugins;
pub mod scaffold;
pub mod table;
mod wait;
pub mod web;

use std::io::Read as _;

use clap::{Parser, Subcommand};
use serde_json::{json, Map, Value};

use self::after::AfterArgs;
use self::batches::{batch_text, BatchArgs};
use self::client::{encode, Client};
use self::lifecycle::{absolute_run_at, lifecycle_lines, stop_tasks, RetryArgs, StopArgs};
use self::table::{cell, render};
use self::wait::{wait_for_tasks, WaitArgs};
use crate::launch::{StartError, StoreArgs};

/// Tasks sent per `POST /tasks` when creating tasks from a list.
pub const TASK_BATCH: usize = 1000;

/// Errors of a CLI verb.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CliError {
    /// Bad arguments or input (exit code 2).
    #[error("{0}")]
    Usage(String),
    /// The API answered with an error (exit code 1).
    #[error("{message} (HTTP {status})")]
    Api {
        /// HTTP status.
        status: u16,
        /// The API's `error` message.
        message: String,
    },
    /// The API could not be reached (exit code 3).
    #[error("{0}")]
    Http(String),
    /// The tasks waited for ended, not all of them succeeded (exit code 4), or the wait
    /// timed out (exit code 5).
    #[error("{message}")]
    Outcome {
        /// What happened.
        message: String,
        /// The exit code.
        code: u8,
    },
    /// `disbatch web` or `disbatch dev` could not start or serve (exit code 1).
    #[error("{0}")]
    Server(String),
}

impl From<StartError> for CliError {
    fn from(e: StartError) -> Self {
        match e {
            StartError::Usage(m) => CliError::Usage(m),
            StartError::Failed(m) => CliError::Server(m),
        }
    }
}

impl CliError {
    /// This error with `note` appended to its message.
    fn with_note(self, note: &str) -> CliError {
        match self {
            CliError::Usage(m) => CliError::Usage(format!("{m}; {note}")),
            CliError::Api { status, message } => CliError::Api {
                status,
                message: format!("{message}; {note}"),
            },
            CliError::Http(m) => CliError::Http(format!("{m}; {note}")),
            CliError::Server(m) => CliError::Server(format!("{m}; {note}")),
            CliError::Outcome { message, code } => CliError::Outcome {
                message: format!("{message}; {note}"),
                code,
            },
        }
    }

    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => 2,
            CliError::Http(_) => 3,
            CliError::Outcome { code, .. } => *code,
            CliError::Api { .. } | CliError::Server(_) => 1,
        }
    }
}

/// `disbatch`: operate a Disbatch cluster through its DCI.
#[derive(Debug, Parser)]
#[command(
    name = "disbatch",
    version,
    about = "Disbatch command interface: serve the DCI, manage queues and tasks"
)]
pub struct Cli {
    /// URL of the DCI.
    #[arg(long, global = true, env = "DISBATCH_URL", default_value = "http://localhost:8080")]
    pub url: String,
    /// Bearer token for writes (the server's `api_token`).
    #[arg(long, global = true, env = "DISBATCH_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print the API's JSON instead of tables (`--pretty`, Disbatch 4's option, is the same).
    #[arg(long, global = true, visible_alias = "pretty")]
    pub json: bool,
    /// `tasks`: return at most this many.
    #[arg(long, global = true)]
    pub limit: Option<u64>,
    /// `tasks`: skip this many.
    #[arg(long, global = true)]
    pub skip: Option<u64>,
    /// `tasks`: print only the number of matching tasks.
    #[arg(long, global = true)]
    pub count: bool,
    /// `tasks`: only these fields (comma-separated).
    #[arg(long, global = true)]
    pub fields: Option<String>,
    /// The verb.
    #[command(subcommand)]
    pub command: Command,
}

/// The verbs.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the DCI (REST API and web UI) for a config file, or for an embedded store.
    Web {
        /// The config and the store.
        #[command(flatten)]
        store: StoreArgs,
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
    Plugins {
        /// Show sources, versions and digests.
        #[arg(long)]
        full: bool,
    },
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
        /// Pairs of field and value (name, plugin, threads, sort, sandbox, on_orphan).
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
        /// Pairs of param name and value.
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
    /// Search tasks: `tasks '{"queue":"q","status":-2}'` (indexed fields only).
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
    /// Set the QueueBalance: `{"max_tasks": {"* 07:00": 5, …}, "queues": [["bulk"],
    /// ["urgent"]], "disabled": null}` as JSON text, `@file` or `-` (standard input).
    SetBalance {
        /// The balance as JSON.
        #[arg(value_name = "JSON")]
        balance: String,
    },
}

/// Runs a client verb (everything but `web`) and prints its result.
pub async fn run(cli: &Cli) -> Result<(), CliError> {
    let client = Client::new(&cli.url, cli.token.clone())?;
    let out = match &cli.command {
        Command::Web { .. } | Command::Dev(_) => {
            return Err(CliError::Usage("`web` and `dev` are run by the binary".into()))
        }
        Command::Info => Output::new(client.get("/info").await?, pretty),
        Command::Plugins { full: false } => Output::new(client.get("/plugins").await?, lines),
        Command::Plugins { full: true } => Output::new(client.get("/plugins?full=1").await?, plugins::table),
        Command::NewPlugin(args) => {
            let root = scaffold::create(args)?;
            print!("{}", scaffold::done(&root, &args.name, args.lang));
            return Ok(());
        }
        Command::PushPlugin(args) => Output::new(plugins::push(&client, args).await?, plugins::pushed),
        Command::PluginVersions { name } => Output::new(client.get(&plugins::path(name)).await?, plugins::versions),
        Command::DeletePlugin { name } => Output::new(client.delete(&plugins::path(name)).await?, |v| {
            format!(
                "deleted {} stored versions of plugin {}\n",
                cell(&v["deleted"]),
                cell(&v["name"])
            )
        }),
        Command::Queues => Output::new(client.get("/queues").await?, queues_table),
        Command::CreateQueue {
            name,
            plugin,
            threads,
            sort,
        } => {
            let mut body = json!({"name": name, "plugin": plugin});
            if let Some(t) = threads {
                body["threads"] = json!(t);
            }
            if let Some(s) = sort {
                body["sort"] = json!(s);
            }
            Output::new(client.post("/queues", &body).await?, |v| {
                format!("created queue {} ({})\n", cell(&v["name"]), cell(&v["id"]))
            })
        }
        Command::UpdateQueue { queue, pairs } => {
            let body = queue_fields(pairs)?;
            let v = client.post(&format!("/queues/{}", encode(queue)), &body).await?;
            Output::new(v, |v| queues_table(&Value::Array(vec![v.clone()])))
        }
        Command::DeleteQueue { queue } => {
            Output::new(client.delete(&format!("/queues/{}", encode(queue))).await?, |v| {
                format!("deleted queue {} ({})\n", cell(&v["name"]), cell(&v["id"]))
            })
        }
        Command::CreateTask {
            run_at,
            priority,
            key,
            resubmit,
            wait,
            batch,
            after,
            queue,
            pairs,
        } => {
            let params = task_params(pairs)?;
            let mut body = match key {
                Some(k) => json!({"queue": queue, "tasks": [{"params": params, "key": k}], "resubmit": resubmit}),
                None => json!({"queue": queue, "params": [params]}),
            };
            if let Some(p) = priority {
                body["priority"] = json!(p);
            }
            if let Some(t) = run_at {
                body["run_at"] = json!(absolute_run_at(t));
            }
            if let Some(m) = body.as_object_mut() {
                batch.add_to(m);
                after.add_to(m);
            }
            let v = client.post("/tasks", &body).await?;
            if *wait {
                let ids: Vec<String> = v["ids"]
                    .as_array()
                    .map(|a| a.iter().map(cell).collect())
                    .unwrap_or_default();
                eprint!("{}", created(&v));
                wait_for_tasks(&client, &WaitArgs { ids, timeout: None }).await?
            } else {
                Output::new(v, created)
            }
        }
        Command::Wait(args) => wait_for_tasks(&client, args).await?,
        Command::Cancel(args) => stop_tasks(&client, "cancel", args).await?,
        Command::Kill(args) => stop_tasks(&client, "kill", args).await?,
        Command::Retry(args) => stop_tasks(&client, "retry", &args.clone().into()).await?,
        Command::CreateTasks {
            run_at,
            priority,
            collection,
            batch,
            after,
            queue,
            tasks: text,
        } => {
            let value = read_json(text)?;
            match collection {
                Some(c) => {
                    let Value::Object(mut body) = value else {
                        return Err(CliError::Usage(
                            "with --collection the JSON must be an object {\"filter\": {…}, \"params\": {…}}".into(),
                        ));
                    };
                    body.insert("queue".into(), json!(queue));
                    body.insert("collection".into(), json!(c));
                    if let Some(t) = run_at {
                        body.insert("run_at".into(), json!(absolute_run_at(t)));
                    }
                    if let Some(p) = priority {
                        body.insert("priority".into(), json!(p));
                    }
                    batch.add_to(&mut body);
                    after.add_to(&mut body);
                    Output::new(client.post("/tasks", &Value::Object(body)).await?, created)
                }
                None => {
                    let Value::Array(list) = value else {
                        return Err(CliError::Usage(
                            "the tasks must be a JSON array of params objects".into(),
                        ));
                    };
                    let mut extra = Map::new();
                    if let Some(t) = run_at {
                        extra.insert("run_at".into(), json!(absolute_run_at(t)));
                    }
                    if let Some(p) = priority {
                        extra.insert("priority".into(), json!(p));
                    }
                    batch.add_to(&mut extra);
                    after.add_to(&mut extra);
                    Output::new(create_in_batches(&client, queue, list, &extra).await?, created)
                }
            }
        }
        Command::CreateDag { queue, tasks: text } => {
            let Value::Array(list) = read_json(text)? else {
                return Err(CliError::Usage(
                    "the DAG must be a JSON array of {params, key, after} entries".into(),
                ));
            };
            let body = json!({"queue": queue, "tasks": list});
            Output::new(client.post("/tasks", &body).await?, created)
        }
        Command::Tasks { filter } => {
            let mut q = Vec::new();
            if let Some(f) = filter {
                let value: Value = serde_json::from_str(f)
                    .map_err(|e| CliError::Usage(format!("the filter is not valid JSON: {e}")))?;
                q.push(format!("filter={}", encode(&value.to_string())));
            }
            if let Some(l) = cli.limit {
                q.push(format!("limit={l}"));
            }
            if let Some(s) = cli.skip {
                q.push(format!("skip={s}"));
            }
            if cli.count {
                q.push("count=1".into());
            }
            if let Some(f) = &cli.fields {
                q.push(format!("fields={}", encode(f)));
            }
            let v = client.get(&format!("/tasks?{}", q.join("&"))).await?;
            if cli.count {
                Output::new(v, |v| format!("{}\n", cell(&v["count"])))
            } else {
                Output::new(v, tasks_table)
            }
        }
        Command::Task { id } => Output::new(client.get(&format!("/tasks/{}?output=1", encode(id))).await?, task_text),
        Command::Batch { id } => Output::new(client.get(&format!("/batches/{}", encode(id))).await?, batch_text),
        Command::Nodes => Output::new(client.get("/nodes").await?, nodes_table),
        Command::SetMaxthreads { node, maxthreads } => {
            let value = match maxthreads.as_str() {
                "null" | "none" => Value::Null,
                n => json!(n
                    .parse::<i64>()
                    .map_err(|_| CliError::Usage(format!("maxthreads must be a number or null, got {n:?}")))?),
            };
            let v = client
                .post(&format!("/nodes/{}", encode(node)), &json!({"maxthreads": value}))
                .await?;
            Output::new(v, |v| nodes_table(&Value::Array(vec![v.clone()])))
        }
        Command::Monitoring => Output::new(client.get("/monitoring").await?, |v| {
            let (d, b) = (&v["disbatch"], &v["queuebalance"]);
            let mut out = format!("{}: {}\n", cell(&d["status"]), cell(&d["message"]));
            if b.is_object() {
                out.push_str(&format!(
                    "queuebalance {}: {}\n",
                    cell(&b["status"]),
                    cell(&b["message"])
                ));
            }
            out
        }),
        Command::Balance => Output::new(client.get("/balance").await?, balance::balance_text),
        Command::SetBalance { balance: text } => {
            Output::new(client.post("/balance", &read_json(text)?).await?, balance::set_text)
        }
    };
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&out.value).unwrap_or_default());
    } else {
        print!("{}", (out.human)(&out.value));
    }
    out.outcome.map_or(Ok(()), Err)
}

/// A verb's answer and how to show it to a person, and for `wait` the outcome that sets
/// the exit code once it is shown.
struct Output {
    value: Value,
    human: fn(&Value) -> String,
    outcome: Option<CliError>,
}

impl Output {
    fn new(value: Value, human: fn(&Value) -> String) -> Output {
        Output {
            value,
            human,
            outcome: None,
        }
    }
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default() + "\n"
}

fn lines(v: &Value) -> String {
    v.as_array()
        .map(|a| a.iter().map(|x| cell(x) + "\n").collect())
        .unwrap_or_default()
}

fn created(v: &Value) -> String {
    let ids = v["ids"].as_array().map(Vec::len).unwrap_or(0);
    // With keys, `created` counts the new tasks; the others were already there.
    let mut s = match v.get("created") {
        Some(n) => {
            let count = |k: &str| v[k].as_array().map(Vec::len).unwrap_or(0);
            let mut line = format!("created {} tasks", cell(n));
            for (k, what) in [("existing", "already there"), ("resubmitted", "submitted again")] {
                if count(k) > 0 {
                    line.push_str(&format!(", {} {what}", count(k)));
                }
            }
            line + "\n"
        }
        None => format!("created {} tasks\n", cell(&v["count"])),
    };
    if ids == 1 {
        s.push_str(&format!("{}\n", cell(&v["ids"][0])));
    }
    s
}

fn rows(v: &Value, f: impl Fn(&Value) -> Vec<String>) -> Vec<Vec<String>> {
    v.as_array().map(|a| a.iter().map(f).collect()).unwrap_or_default()
}

fn queues_table(v: &Value) -> String {
    let rows = rows(v, |q| {
        ["id", "name", "plugin", "threads", "queued", "running", "completed"]
            .iter()
            .map(|k| cell(&q[*k]))
            .collect()
    });
    let mut out = render(
        &["id", "name", "plugin", "threads", "queued", "running", "completed"],
        &rows,
    );
    // Why nodes cannot run a queue, under the table.
    for q in v.as_array().map(Vec::as_slice).unwrap_or_default() {
        if let Some(problem) = q["problem"].as_str() {
            out.push_str(&format!("queue {} cannot be read: {problem}\n", cell(&q["id"])));
        }
        for p in q["problems"].as_array().map(Vec::as_slice).unwrap_or_default() {
            out.push_str(&format!(
                "queue {} cannot run on {}: {}\n",
                cell(&q["name"]),
                cell(&p["node"]),
                cell(&p["reason"])
            ));
        }
    }
    out
}

fn nodes_table(v: &Value) -> String {
    let rows = rows(v, |n| {
        vec![
            cell(&n["id"]),
            cell(&n["node"]),
            cell(&n["maxthreads"]),
            format!("{:.0}s", n["age_secs"].as_f64().unwrap_or(0.0)),
            if n["fresh"] == true { "fresh" } else { "stale" }.into(),
        ]
    });
    render(&["id", "node", "maxthreads", "heartbeat", "state"], &rows)
}

fn tasks_table(v: &Value) -> String {
    let rows = rows(v, |t| {
        vec![
            cell(&t["id"]),
            cell(&t["queue"]),
            format!("{} ({})", cell(&t["status"]), cell(&t["status_name"])),
            cell(&t["node"]),
            cell(&t["mtime"]),
            t.get("params").map(|p| p.to_string()).unwrap_or_default(),
        ]
    });
    render(&["id", "queue", "status", "node", "mtime", "params"], &rows)
}

fn task_text(t: &Value) -> String {
    let mut s = String::new();
    for k in ["id", "queue", "status", "status_name", "node", "ctime", "mtime"] {
        s.push_str(&format!("{k:<12}{}\n", cell(&t[k])));
    }
    s.push_str(&lifecycle_lines(t));
    s.push_str(&format!("{:<12}{}\n", "params", t["params"]));
    for k in ["stdout", "stderr"] {
        s.push_str(&format!("--- {k} ---\n{}", cell(&t[k])));
        if !s.ends_with('\n') {
            s.push('\n');
        }
    }
    s
}

/// `key value …` pairs → a JSON object; each value is JSON when it parses, else a string.
fn pairs_object(pairs: &[String]) -> Result<Map<String, Value>, CliError> {
    if !pairs.len().is_multiple_of(2) {
        return Err(CliError::Usage(format!(
            "expected pairs of key and value, got an odd number of words: {}",
            pairs.join(" ")
        )));
    }
    Ok(pairs
        .chunks(2)
        .map(|kv| {
            let v = serde_json::from_str::<Value>(&kv[1]).unwrap_or_else(|_| Value::String(kv[1].clone()));
            (kv[0].clone(), v)
        })
        .collect())
}

fn task_params(pairs: &[String]) -> Result<Value, CliError> {
    pairs_object(pairs).map(Value::Object)
}

/// Queue fields from pairs: `name`, `plugin`, `sort` and `on_orphan` stay strings; `threads`
/// is a number or null; `sandbox` is JSON.
fn queue_fields(pairs: &[String]) -> Result<Value, CliError> {
    let mut m = pairs_object(pairs)?;
    for kv in pairs.chunks(2) {
        if matches!(kv[0].as_str(), "name" | "plugin" | "sort" | "on_orphan") {
            m.insert(kv[0].clone(), Value::String(kv[1].clone()));
        }
    }
    Ok(Value::Object(m))
}

/// JSON given inline, as `@file`, or `-` for stdin.
fn read_json(arg: &str) -> Result<Value, CliError> {
    let (text, source) = if arg == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| CliError::Usage(format!("cannot read stdin: {e}")))?;
        (s, "stdin".to_owned())
    } else if let Some(path) = arg.strip_prefix('@') {
        let text = std::fs::read_to_string(path).map_err(|e| CliError::Usage(format!("cannot read {path}: {e}")))?;
        (text, format!("file {path}"))
    } else {
        (arg.to_owned(), "the tasks argument".to_owned())
    };
    serde_json::from_str(&text).map_err(|e| CliError::Usage(format!("invalid JSON in {source}: {e}")))
}

/// Posts `list` in batches of [`TASK_BATCH`], with a progress bar on a terminal when there
/// is more than one batch, each request with the fields of `extra` (`run_at`, `priority`).
/// Answers like one `POST /tasks`.
async fn create_in_batches(
    client: &Client,
    queue: &str,
    list: Vec<Value>,
    extra: &Map<String, Value>,
) -> Result<Value, CliError> {
    if let Some(i) = list.iter().position(|p| !p.is_object()) {
        return Err(CliError::Usage(format!("task {i} of the list is not a JSON object")));
    }
    let bar = (list.len() > TASK_BATCH).then(|| {
        let bar = indicatif::ProgressBar::new(list.len() as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} tasks {elapsed_precise} eta {eta}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let mut ids = Vec::with_capacity(list.len());
    let mut queue_id = Value::Null;
    for chunk in list.chunks(TASK_BATCH) {
        let mut body = json!({"queue": queue, "params": chunk});
        for (k, v) in extra {
            body[k] = v.clone();
        }
        let v = match client.post("/tasks", &body).await {
            Ok(v) => v,
            Err(e) if ids.is_empty() => return Err(e),
            Err(e) => {
                // Earlier batches exist: say which, so nothing is submitted twice or lost.
                println!("{}", json!({"queue": queue_id, "count": ids.len(), "ids": ids}));
                let note = format!(
                    "created {} of {} tasks before this error (their ids are on stdout); the other {} were not created",
                    ids.len(),
                    list.len(),
                    list.len() - ids.len()
                );
                return Err(e.with_note(&note));
            }
        };
        queue_id = v["queue"].clone();
        ids.extend(v["ids"].as_array().cloned().unwrap_or_default());
        if let Some(b) = &bar {
            b.inc(chunk.len() as u64);
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if list.is_empty() {
        // Nothing to create, but a queue that does not exist is still an error.
        let q = client.get(&format!("/queues/{}", encode(queue))).await?;
        queue_id = q["id"].clone();
    }
    let mut answer = json!({"queue": queue_id, "count": ids.len(), "ids": ids});
    if let Some(b) = extra.get("batch") {
        answer["batch"] = b.clone();
    }
    Ok(answer)
}
