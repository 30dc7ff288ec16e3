//! The `disbatch` command line: `disbatch web` serves the DCI; every other verb talks HTTP
//! to a DCI (`--url`, default `http://localhost:8080`, env `DISBATCH_URL`) with the
//! Disbatch 4 CLI's verbs. Output is a human table, or the API's JSON with `--json`.
//!
//! Parts: `command` (the verbs and their arguments), `client` (HTTP + errors), `input`
//! (pairs and JSON arguments), `output` and `table` (what a person reads), `web` (the
//! server verb), `schedules`, `dev` (a DEN and the DCI in one process, for trying Disbatch on one
//! machine).

mod after;
mod balance;
mod batches;
pub mod client;
mod command;
pub mod dev;
mod input;
mod lifecycle;
mod options;
mod output;
pub mod plugins;
pub mod roles;
pub mod scaffold;
pub mod schedules;
pub mod table;
mod tasks;
pub mod users;
mod wait;
pub mod web;

use std::io::IsTerminal as _;

use serde_json::{json, Map, Value};

use self::batches::batch_text;
use self::client::{encode, Client};
pub use self::command::Command;
use self::input::{queue_fields, read_json, task_params};
use self::lifecycle::{absolute_run_at, stop_tasks};
pub use self::options::{Cli, DEFAULT_CONFIG, DEFAULT_TASKS_LIMIT};
use self::output::{created, lines, nodes_table, pretty, queues_table, task_text, Output};
use self::table::cell;
use self::wait::{wait_for_tasks, WaitArgs};
use crate::launch::StartError;

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

/// Runs a client verb (everything but `web`) and prints its result.
pub async fn run(cli: &Cli) -> Result<(), CliError> {
    if let Command::CreateUsers(args) = &cli.command {
        // Talks to MongoDB, not to a DCI.
        return users::run(cli.config.as_deref(), args).await;
    }
    let client = cli.client()?;
    let out = match &cli.command {
        Command::Web { .. } | Command::Dev(_) | Command::CreateUsers(_) => {
            return Err(CliError::Usage("`web` and `dev` are run by the binary".into()))
        }
        Command::Info => Output::new(client.get("/info").await?, pretty),
        Command::Plugins if !cli.full => Output::new(client.get("/plugins").await?, lines),
        Command::Plugins => Output::new(client.get("/plugins?full=1").await?, plugins::table),
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
            let v = client.post("/queues", &body).await?;
            if threads.is_none() {
                eprint!("{}", paused_warning(cli, name));
            }
            Output::new(v, |v| {
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
                if !cli.json {
                    eprint!("{}", created(&v));
                }
                wait_for_tasks(&client, &WaitArgs { ids, timeout: None }).await?
            } else {
                Output::created(v)
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
                    Output::created(client.post("/tasks", &Value::Object(body)).await?)
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
                    Output::created(create_in_batches(&client, queue, list, &extra).await?)
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
            Output::created(client.post("/tasks", &body).await?)
        }
        Command::Tasks { filter } => tasks::tasks(&client, cli, filter.as_deref()).await?,
        Command::Task { id } => {
            let epoch = if cli.epoch { "&epoch=1" } else { "" };
            Output::new(
                client.get(&format!("/tasks/{}?output=1{epoch}", encode(id))).await?,
                task_text,
            )
        }
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
        Command::Schedules => Output::new(client.get("/schedules").await?, schedules::schedules_table),
        Command::SetSchedule(args) => {
            let path = format!("/schedules/{}", encode(&args.name));
            Output::new(client.post(&path, &args.body()?).await?, schedules::set_text)
        }
        Command::DeleteSchedule { name } => Output::new(
            client.delete(&format!("/schedules/{}", encode(name))).await?,
            schedules::deleted_text,
        ),
        Command::Balance => Output::new(client.get("/balance").await?, balance::balance_text),
        Command::SetBalance { balance: text } => {
            Output::new(client.post("/balance", &read_json(text)?).await?, balance::set_text)
        }
    };
    out.print(cli.json, cli.quiet || !std::io::stdout().is_terminal());
    out.outcome.map_or(Ok(()), Err)
}

/// The warning of `create-queue` without `--threads`: the queue is paused (threads unset
/// runs none of its tasks, as in Disbatch 4) and the command that starts it.
fn paused_warning(cli: &Cli, queue: &str) -> String {
    let url = if cli.url == options::DEFAULT_URL {
        String::new()
    } else {
        format!(" --url {}", shell_word(&cli.url))
    };
    format!(
        "disbatch: warning: queue {queue} is paused: without --threads it runs none of its tasks; start it with\n  \
         disbatch{url} update-queue {} threads 1\n",
        shell_word(queue)
    )
}

/// `word` as one shell word: as it is when it needs no quoting, else in single quotes.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./:@%+=,".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
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
