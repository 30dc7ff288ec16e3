//! The actions on tasks, Disbatch 4's `POST /tasks/search`, `/metrics` read by the
//! Prometheus client's own parser, and the CLI's output for scripts and people: `disbatch
//! web` and `den` as real processes on an embedded store, spoken to over HTTP and through
//! the `disbatch` binary.

use crate::common;

use std::path::Path;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use common::web::{stderr, Web};
use common::{plugins_dir, wait_for, DenProcess};

/// The Prometheus client whose text-format parser reads `/metrics`.
const PROMETHEUS_CLIENT: &str = "prometheus-client==0.26.0";

/// `disbatch web --embedded <dir>/<name>.db`, every built plugin allowed.
fn web(dir: &Path, name: &str) -> Web {
    let plugins = plugins_dir();
    Web::start_embedded(
        &dir.join(format!("{name}.db")),
        &["--plugin-dir", plugins.to_str().unwrap()],
    )
}

/// `POST path` with `body` as it is, declared JSON: the status and the answer.
async fn post_raw(web: &Web, path: &str, body: &str) -> (StatusCode, Value) {
    let r = reqwest::Client::new()
        .post(format!("{}{path}", web.url))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let status = r.status();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

/// The ids a `create-task(s)` printed for a script, one per line.
fn ids(web: &Web, args: &[&str]) -> Vec<String> {
    web.ok(args).lines().map(str::to_owned).collect()
}

#[tokio::test]
async fn actions_take_an_empty_json_body_as_no_fields() {
    let dir = tempfile::tempdir().unwrap();
    let web = web(dir.path(), "actions");
    web.ok(&["create-queue", "q", "demo", "--threads", "0"]);
    let id = ids(&web, &["create-task", "q", "n", "1"]).remove(0);

    // Cancel with an empty body: the defaults, as with `{}`.
    let (status, task) = post_raw(&web, &format!("/tasks/{id}/cancel"), "").await;
    assert_eq!(status, StatusCode::OK, "{task}");
    assert_eq!(task["status"], -5, "{task}");
    assert_eq!(task["stop"]["by"], "api", "{task}");
    // Retry and kill too (a queued task cannot be killed: 409 says why, not 400).
    let (status, task) = post_raw(&web, &format!("/tasks/{id}/retry"), " \n").await;
    assert_eq!(status, StatusCode::OK, "{task}");
    assert_eq!(task["status"], -2, "{task}");
    let (status, answer) = post_raw(&web, &format!("/tasks/{id}/kill"), "").await;
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("cancel ends a task"),
        "{answer}"
    );
    // The queue forms: an empty body lacks only the queue, and says so.
    for verb in ["cancel", "kill"] {
        let (status, answer) = post_raw(&web, &format!("/tasks/{verb}"), "").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
        assert!(
            answer["error"].as_str().unwrap().contains("\"queue\" is required"),
            "{answer}"
        );
    }
    let (status, answer) = post_raw(&web, "/tasks/cancel", r#"{"queue": "q"}"#).await;
    assert_eq!((status, &answer["count"]), (StatusCode::OK, &json!(1)), "{answer}");
    // Still JSON only: an empty body of another type (a browser's cross-site form) is 415.
    let r = reqwest::Client::new()
        .post(format!("{}/tasks/{id}/retry", web.url))
        .header("content-type", "text/plain")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // Bad fields are still named.
    let (status, answer) = post_raw(&web, &format!("/tasks/{id}/retry"), r#"{"why": 1}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("\"why\""), "{answer}");
}

/// A web and a DEN on one file, a queue `work` whose tasks all ran: three that printed
/// their message and one that failed.
struct Ran {
    web: Web,
    _den: DenProcess,
    _dir: tempfile::TempDir,
    queue: String,
    ids: Vec<String>,
}

async fn ran(name: &str) -> Ran {
    let dir = tempfile::tempdir().unwrap();
    let web = web(dir.path(), name);
    let queue = web.json(&["create-queue", "work", "demo", "--threads", "2"])["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut ids = ids(
        &web,
        &[
            "create-tasks",
            "work",
            r#"[{"message":"one"},{"message":"two"},{"message":"three"}]"#,
        ],
    );
    ids.extend(self::ids(&web, &["create-task", "work", "status:=2"]));
    let den = DenProcess::start_embedded(&dir.path().join(format!("{name}.db")), "den-1", json!({}));
    let (url, client) = (web.url.clone(), reqwest::Client::new());
    wait_for(Duration::from_secs(120), "the four tasks to end", || {
        let (url, client) = (url.clone(), client.clone());
        async move {
            let r = client
                .get(format!("{url}/tasks?queue=work&status=1,2&count=1"))
                .send()
                .await;
            match r {
                Ok(r) => r.json::<Value>().await.is_ok_and(|v| v["count"] == 4),
                Err(_) => false,
            }
        }
    })
    .await;
    Ran {
        web,
        _den: den,
        _dir: dir,
        queue,
        ids,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_tasks_search_answers_as_disbatch_4() {
    let r = ran("search").await;
    let search = |body: Value| {
        let web = &r.web;
        async move { post_raw(web, "/tasks/search", &body.to_string()).await }
    };
    // Disbatch 4's CLI: `{filter, count, terse, pretty, options}`, the queue an id.
    let (status, answer) = search(json!({"filter": {"queue": r.queue}, "count": 1, "terse": 1,
        "pretty": 0, "options": null}))
    .await;
    assert_eq!((status, answer), (StatusCode::OK, json!({"count": 4})));
    // The tasks oldest first, dates in epoch seconds, inline outputs terse by default.
    let (status, list) = search(json!({"filter": {"queue": {"$oid": r.queue}}})).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let list = list.as_array().unwrap();
    let found: Vec<&str> = list.iter().map(|t| t["_id"]["$oid"].as_str().unwrap()).collect();
    assert_eq!(found, r.ids, "oldest first");
    assert!(
        list.iter().all(|t| t["ctime"].is_f64() || t["ctime"].is_u64()),
        "{list:?}"
    );
    assert_eq!(list[0]["stdout"], "[terse mode]");
    assert_eq!(list[0]["params"], json!({"message": "one"}));
    // Not terse: the outputs themselves; a status filter; the options of MongoDB's find.
    let (_, list) = search(json!({"filter": {"status": 1}, "terse": false,
        "options": {"limit": 2, "skip": 1, "sort": {"_id": -1}, "projection": {"stdout": 1}}}))
    .await;
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 2, "{list:?}");
    assert_eq!(list[0]["stdout"], "two\n", "{list:?}");
    assert_eq!(list[1]["stdout"], "one\n", "{list:?}");
    assert!(
        list[0].get("params").is_none(),
        "projection keeps stdout only: {list:?}"
    );
    // An empty body is every task, up to 100; nothing found is `[]`.
    let (status, all) = post_raw(&r.web, "/tasks/search", "").await;
    assert_eq!((status, all.as_array().map(Vec::len)), (StatusCode::OK, Some(4)));
    let (_, none) = search(json!({"filter": {"status": -5}})).await;
    assert_eq!(none, json!([]));
    // Disbatch 4's errors, and ours where its MongoDB would have taken any filter.
    for (body, error) in [
        (json!({"filter": []}), "filter and options must be name/value objects"),
        (json!({"options": {"limit": 101}}), "limit cannot exceed 100"),
        (json!({"filter": {"params.message": "one"}}), "\"params.message\""),
        (json!({"options": {"hint": "x"}}), "options.hint"),
        (json!({"filter": {"queue": "nowhere"}}), "nowhere"),
    ] {
        let (status, answer) = search(body.clone()).await;
        assert!(status.is_client_error(), "{body}: {status} {answer}");
        let message = answer["error"].as_str().unwrap_or_default();
        assert!(message.contains(error), "{body}: {message}");
    }
}

/// The text of `GET /metrics`.
async fn scrape(client: &reqwest::Client, url: &str) -> String {
    let r = client.get(format!("{url}/metrics")).send().await.unwrap();
    r.text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_with_the_prometheus_client() {
    let r = ran("metrics").await;
    let den_node = "den-1";
    // The DEN's duration histograms reach the store with its heartbeat.
    let (url, client) = (r.web.url.clone(), reqwest::Client::new());
    wait_for(Duration::from_secs(60), "the DEN's run durations in /metrics", || {
        let (url, client) = (url.clone(), client.clone());
        async move {
            scrape(&client, &url)
                .await
                .contains(&format!("disbatch_run_duration_seconds_count{{node=\"{den_node}\"}} 4"))
        }
    })
    .await;
    let text = scrape(&client, &url).await;

    let python = common::python::python_with(PROMETHEUS_CLIENT);
    let script = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
families = [{"name": f.name, "type": f.type, "help": f.documentation,
             "samples": [[s.name, s.labels, s.value] for s in f.samples]}
            for f in text_string_to_metric_families(sys.stdin.read())]
print(json.dumps(families))
"#;
    let mut child = std::process::Command::new(&python)
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the Prometheus parser refused /metrics: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let families: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    // Every family declared with HELP and TYPE (a sample of an undeclared one would be a
    // family of type "unknown" without help).
    for f in &families {
        assert!(
            f["help"].as_str().is_some_and(|h| !h.is_empty()) && f["type"] != "unknown",
            "family {} lacks HELP or TYPE: {f}\n{text}",
            f["name"]
        );
    }
    // Every sample line was read, none dropped.
    let lines = text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')).count();
    let samples: usize = families.iter().map(|f| f["samples"].as_array().unwrap().len()).sum();
    assert_eq!(samples, lines, "{text}");
    // No series twice (Prometheus refuses a scrape that has one).
    let mut series: Vec<String> = families
        .iter()
        .flat_map(|f| {
            f["samples"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| format!("{}{}", s[0], s[1]))
        })
        .collect();
    series.sort();
    let all = series.len();
    series.dedup();
    assert_eq!(series.len(), all, "a series is given twice: {text}");
    let family = |name: &str| {
        families
            .iter()
            .find(|f| f["name"] == name)
            .unwrap_or_else(|| panic!("no family {name}: {text}"))
    };
    // The labelled series of the tasks that ran.
    let tasks = family("disbatch_tasks");
    assert_eq!(tasks["type"], "gauge");
    let series = |status: &str| {
        tasks["samples"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s[1]["queue"] == "work" && s[1]["status"] == status)
            .and_then(|s| s[2].as_f64())
    };
    assert_eq!(series("succeeded"), Some(3.0), "{text}");
    assert_eq!(series("failed"), Some(1.0), "{text}");
    let run = family("disbatch_run_duration_seconds");
    assert_eq!(run["type"], "histogram");
    assert!(
        run["samples"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s[0] == "disbatch_run_duration_seconds_bucket"
                && s[1]["node"] == den_node
                && s[1]["le"] == "+Inf"
                && s[2].as_f64() == Some(4.0)),
        "{text}"
    );
    for name in [
        "disbatch_queue_threads",
        "disbatch_node_running",
        "disbatch_node_heartbeat_age_seconds",
        "disbatch_node_maxthreads",
        "disbatch_claim_duration_seconds",
        "disbatch_api_waiters",
        "disbatch_api_waited_ids",
    ] {
        family(name);
    }
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
