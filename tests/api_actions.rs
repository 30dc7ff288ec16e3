//! The actions on tasks, Disbatch 4's `POST /tasks/search`, `/metrics` read by the
//! Prometheus client's own parser, and the CLI's output for scripts and people: `disbatch
//! web` and `den` as real processes on an embedded store, spoken to over HTTP and through
//! the `disbatch` binary.

mod common;

use std::path::Path;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use common::web::{stderr, Web};
use common::{plugins_dir, wait_for, DenProcess};

/// `disbatch web --embedded <dir>/<name>.db`, every built plugin allowed.
fn web(dir: &Path, name: &str) -> Web {
    let plugins = plugins_dir();
    Web::start_embedded(
        &dir.join(format!("{name}.db")),
        &["--plugin-dir", plugins.to_str().unwrap()],
    )
}

/// The ids a `create-task(s)` printed for a script, one per line.
fn ids(web: &Web, args: &[&str]) -> Vec<String> {
    web.ok(args).lines().map(str::to_owned).collect()
}

#[tokio::test]
async fn the_cli_prints_ids_for_scripts_and_sentences_for_people() {
    let dir = tempfile::tempdir().unwrap();
    let web = web(dir.path(), "cli");

    // Without --threads the queue is paused: a warning says so, with the command to start it.
    let out = web.run(&["create-queue", "idle", "demo"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let warning = stderr(&out);
    assert!(warning.contains("queue idle is paused"), "{warning}");
    let start = format!("disbatch --url {} update-queue idle threads 1\n", web.url);
    assert!(warning.ends_with(&start), "{warning}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("created queue idle ("));
    // The command it names starts the queue.
    let words: Vec<&str> = start.split_whitespace().skip(1).collect();
    assert_eq!(web.json(&words)["threads"], 1);
    let out = web.run(&["create-queue", "busy", "demo", "--threads", "2"]);
    assert_eq!(stderr(&out), "", "no warning with --threads");

    // Stdout is not a terminal here: the ids alone, one per line; the sentence on stderr,
    // singular and plural right.
    let out = web.run(&["create-task", "busy", "n", "1"]);
    assert_eq!(stderr(&out), "created 1 task\n");
    let one = String::from_utf8(out.stdout).unwrap();
    assert_eq!(one.len(), 25, "{one:?}");
    let out = web.run(&["create-tasks", "busy", r#"[{"n":2},{"n":3}]"#]);
    assert_eq!(stderr(&out), "created 2 tasks\n");
    let two: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(two.len(), 2);
    let out = web.run(&["--quiet", "create-dag", "busy", r#"[{"params":{"n":4}}]"#]);
    assert_eq!(stderr(&out), "created 1 task\n");
    let listed = web.json(&["tasks", r#"{"queue": "busy"}"#]);
    let listed: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    for id in two.iter().chain([&one.trim().to_owned()]) {
        assert!(listed.contains(&id.as_str()), "{id} in {listed:?}");
    }

    // --json is the API's answer: POST /tasks's, and GET /tasks/wait's for `wait`.
    let created = web.json(&["create-task", "busy", "n", "5"]);
    assert_eq!(
        (created["count"].clone(), created["ids"].as_array().map(Vec::len)),
        (json!(1), Some(1))
    );
    let id = created["ids"][0].as_str().unwrap();
    web.ok(&["cancel", id]);
    let out = web.run(&["--json", "wait", id]);
    assert_eq!(out.status.code(), Some(4), "a cancelled task did not succeed");
    let waited: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(waited["done"], true, "{waited}");
    assert_eq!(waited["tasks"][0]["status"], -5, "{waited}");
}
