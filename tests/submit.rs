//! Follow-up tasks a plugin submits through the `submit` host import: the grant, the
//! bounds and the params check in the runner (library and `runner exec`), components built
//! against 0.1.0 still running, and the DEN creating the follow-ups of a task that
//! succeeded, on both stores.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::http::StatusCode;
use axum::Router;
use disbatch::api::{router, ApiState};
use disbatch::runner::{EngineOptions, Outcome, Runner, Sandbox};
use disbatch::store::sqlite::SqliteStore;
use disbatch::store::Store;
use serde_json::{json, Value};

use common::http::{assert_bad, get, post};
use common::{wait_for, DenProcess};

fn runner() -> &'static Runner {
    static RUNNER: OnceLock<Runner> = OnceLock::new();
    RUNNER.get_or_init(|| {
        Runner::new(&EngineOptions {
            cache_dir: None,
            max_instances: 4,
        })
        .unwrap()
    })
}

fn plugin(name: &str) -> PathBuf {
    common::plugin_path(name)
}

fn run(name: &str, params: Value, sandbox: &Sandbox) -> Outcome {
    runner().run_file(&plugin(name), &params.to_string(), sandbox, None)
}

fn granted(queues: &[&str], max: u32) -> Sandbox {
    Sandbox {
        submit: queues.iter().map(|q| q.to_string()).collect(),
        submit_max: max,
        ..Sandbox::default()
    }
}

#[test]
fn nothing_is_granted_by_default() {
    let o = run(
        "submit",
        json!({"submit": [{"queue": "b", "params": {"n": 1}}]}),
        &Sandbox::default(),
    );
    let (stdout, stderr) = o.output_texts();
    assert!(o.succeeded(), "{stderr}");
    assert_eq!(
        stdout,
        "err b: cannot submit to queue \"b\": this task's sandbox.submit does not grant it (granted: none)\n"
    );
    assert!(o.submitted.is_empty());
}

#[test]
fn granted_follow_ups_are_kept_in_call_order() {
    let o = run(
        "submit",
        json!({"submit": [
            {"queue": "b", "params": {"n": 0}},
            {"queue": "c", "params": {"n": 1}},
            {"queue": "b", "params": {"n": 2, "deep": {"list": [1, 2]}}},
        ]}),
        &granted(&["b"], 100),
    );
    let (stdout, stderr) = o.output_texts();
    assert!(o.succeeded(), "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "ok b");
    assert!(lines[1]
        .starts_with("err c: cannot submit to queue \"c\": this task's sandbox.submit does not grant it (granted: b)"));
    assert_eq!(lines[2], "ok b");
    let got: Vec<(String, Value)> = o
        .submitted
        .iter()
        .map(|s| (s.queue.clone(), Value::Object(s.params.clone())))
        .collect();
    assert_eq!(
        got,
        vec![
            ("b".to_string(), json!({"n": 0})),
            ("b".to_string(), json!({"n": 2, "deep": {"list": [1, 2]}})),
        ]
    );
    assert!(
        !stderr.contains("[disbatch:"),
        "no note when nothing was refused: {stderr}"
    );
}

#[test]
fn calls_past_a_bound_are_refused_with_one_note() {
    let o = run(
        "submit",
        json!({"submit": [{"queue": "b", "params": {}}], "repeat": 5}),
        &granted(&["b"], 3),
    );
    let (stdout, stderr) = o.output_texts();
    assert!(o.succeeded(), "a refused call does not fail the task: {stderr}");
    assert_eq!(o.submitted.len(), 3);
    assert_eq!(stdout.matches("ok b\n").count(), 3, "{stdout}");
    assert_eq!(
        stdout
            .matches(
                "err b: follow-up refused: this task already submitted 3 follow-ups, its limit (sandbox.submit_max)\n"
            )
            .count(),
        2,
        "{stdout}"
    );
    assert_eq!(stderr.matches("[disbatch: ").count(), 1, "{stderr}");
    assert!(
        stderr.contains("[disbatch: 2 follow-up task(s) were refused for a bound (sandbox.submit_max 3"),
        "{stderr}"
    );

    // Params over 1 MiB.
    let big = "x".repeat(disbatch::runner::MAX_SUBMIT_PARAMS);
    let o = run(
        "submit",
        json!({"submit": [{"queue": "b", "params": {"big": big}}]}),
        &granted(&["b"], 3),
    );
    let (stdout, stderr) = o.output_texts();
    assert!(
        stdout.contains("over the limit of 1048576 bytes (1 MiB) per follow-up"),
        "{stdout}"
    );
    assert!(stderr.contains("1 follow-up task(s) were refused"), "{stderr}");
    assert!(o.submitted.is_empty());
}

#[test]
fn params_must_be_a_json_object() {
    let o = run(
        "submit",
        json!({"submit": [
            {"queue": "b", "text": "[1, 2]"},
            {"queue": "b", "text": "\"text\""},
            {"queue": "b", "text": "{not json"},
        ]}),
        &granted(&["b"], 10),
    );
    let (stdout, _) = o.output_texts();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "err b: follow-up params must be a JSON object, got an array");
    assert_eq!(lines[1], "err b: follow-up params must be a JSON object, got a string");
    assert!(
        lines[2].starts_with("err b: follow-up params are not valid JSON: "),
        "{stdout}"
    );
    assert!(o.submitted.is_empty());
}

#[test]
fn a_component_built_against_0_1_0_still_runs() {
    let v01 = runner().load(&plugin("v01")).unwrap();
    assert_eq!(v01.wit_version(), Some("0.1.0"));
    let demo = runner().load(&plugin("demo")).unwrap();
    assert_eq!(demo.wit_version(), Some("0.2.0"));
    let o = runner().run(&v01, r#"{"a":1}"#, &Sandbox::default(), None);
    assert!(o.succeeded(), "{:?}", o.output_texts());
    assert_eq!(o.output_texts().0, "v01 got {\"a\":1}\n");
    assert_eq!(o.progress.len(), 1);
    assert_eq!(o.progress[0].percent, Some(50.0));
    assert_eq!(o.progress[0].info.as_deref(), Some("halfway"));

    let o = runner_cli(&["check", plugin("v01").to_str().unwrap()]);
    let shown = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{shown}");
    assert!(
        shown.contains("disbatch:plugin 0.1.0): this host can run it"),
        "{shown}"
    );
}

fn runner_cli(args: &[&str]) -> Output {
    static CACHE: OnceLock<PathBuf> = OnceLock::new();
    let cache = CACHE.get_or_init(|| tempfile::tempdir().unwrap().keep());
    Command::new(env!("CARGO_BIN_EXE_runner"))
        .args(args)
        .env("DISBATCH_CACHE_DIR", cache)
        .output()
        .expect("run the runner binary")
}

#[test]
fn runner_exec_shows_the_follow_ups_and_creates_nothing() {
    let submit = plugin("submit");
    let params = r#"{"submit":[{"queue":"b","params":{"n":1}},{"queue":"c","params":{}}]}"#;
    let o = runner_cli(&["exec", submit.to_str().unwrap(), "--submit", "b", "--params", params]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert_eq!(
        stderr
            .lines()
            .filter(|l| l.starts_with("runner: submitted to "))
            .collect::<Vec<_>>(),
        vec![r#"runner: submitted to b: {"n":1}"#]
    );
    let o = runner_cli(&[
        "exec",
        submit.to_str().unwrap(),
        "--submit",
        "b",
        "--submit-max",
        "1",
        "--json",
        "--params",
        r#"{"submit":[{"queue":"b","params":{"n":1}}],"repeat":2}"#,
    ]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["submitted"], json!([{"queue": "b", "params": {"n": 1}}]));
    assert!(
        v["stderr"]
            .as_str()
            .unwrap()
            .contains("1 follow-up task(s) were refused for a bound (sandbox.submit_max 1"),
        "{v}"
    );
    // Without --submit nothing is granted.
    let o = runner_cli(&["exec", submit.to_str().unwrap(), "--json", "--params", params]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["submitted"], json!([]));
    assert!(
        v["stdout"]
            .as_str()
            .unwrap()
            .contains("does not grant it (granted: none)"),
        "{v}"
    );
}

async fn create(app: &Router, queue: &str, params: Value) -> String {
    let r = post(app, "/tasks", json!({"queue": queue, "params": [params]})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    r.json()["ids"][0].as_str().unwrap().to_string()
}

async fn task(app: &Router, id: &str) -> Value {
    let r = get(app, &format!("/tasks/{id}")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    r.json()
}

async fn ended(app: &Router, id: &str) -> Value {
    wait_for(Duration::from_secs(30), &format!("task {id} to end"), || async {
        task(app, id).await["status"].as_i64().is_some_and(|s| s > 0)
    })
    .await;
    task(app, id).await
}

async fn follow_ups(app: &Router, id: &str) -> Vec<Value> {
    let r = get(app, &format!("/tasks?after={id}&limit=50")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let mut list = r.json().as_array().unwrap().clone();
    list.sort_by_key(|t| t["key"].as_str().unwrap_or_default().to_string());
    list
}

async fn follow_ups_on(store: Arc<dyn Store>, start_den: impl Fn() -> DenProcess) {
    let app = router(ApiState::new(store.clone(), vec!["demo".into(), "submit".into()]));
    assert_bad(
        &post(
            &app,
            "/queues",
            json!({"name": "x", "plugin": "submit", "sandbox": {"submit_max": 10001}}),
        )
        .await,
        "field \"sandbox.submit_max\" must be an integer from 0 to 10000, got 10001",
    );
    assert_bad(
        &post(
            &app,
            "/queues",
            json!({"name": "x", "plugin": "submit", "sandbox": {"submit": "b"}}),
        )
        .await,
        "field \"sandbox.submit\" must be a list of queue names or ids",
    );
    assert_bad(
        &post(
            &app,
            "/queues",
            json!({"name": "x", "plugin": "submit", "sandbox": {"submit": ["b", 7]}}),
        )
        .await,
        "field \"sandbox.submit[1]\" must be a queue name or id",
    );
    for q in [
        json!({"name": "a", "plugin": "submit", "threads": 2, "sandbox": {"submit": ["b", "gone"], "submit_max": 3}}),
        json!({"name": "b", "plugin": "submit", "threads": 2}),
    ] {
        let r = post(&app, "/queues", q).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    }
    let r = get(&app, "/queues/a").await;
    assert_eq!(r.json()["sandbox"]["submit"], json!(["b", "gone"]), "{}", r.text);
    let _den = start_den();

    // Granted: the follow-ups are created once the task succeeded, and run.
    let ok = create(
        &app,
        "a",
        json!({"submit": [
            {"queue": "b", "params": {"n": 0}},
            {"queue": "c", "params": {}},
            {"queue": "b", "params": {"n": 1}},
        ]}),
    )
    .await;
    let t = ended(&app, &ok).await;
    assert_eq!(t["status"], 1, "{t}");
    assert!(
        t["stdout"]
            .as_str()
            .unwrap()
            .contains("err c: cannot submit to queue \"c\": this task's sandbox.submit does not grant it"),
        "{t}"
    );
    let mut next = follow_ups(&app, &ok).await;
    assert_eq!(next.len(), 2, "{next:?}");
    for (n, f) in next.iter().enumerate() {
        assert_eq!(f["key"], format!("submit:{ok}:{n}"));
        assert_eq!(f["after"], json!([ok.clone()]));
        assert_eq!(f["params"], json!({"n": n}));
    }
    for f in &mut next {
        *f = ended(&app, f["id"].as_str().unwrap()).await;
        assert_eq!(f["status"], 1, "{f}");
        assert_eq!(f["stdout"], "ran\n");
    }

    // Not granted to queue b's plugin.
    let denied = create(&app, "b", json!({"submit": [{"queue": "a", "params": {}}]})).await;
    let t = ended(&app, &denied).await;
    assert!(
        t["stdout"]
            .as_str()
            .unwrap()
            .contains("does not grant it (granted: none)"),
        "{t}"
    );
    assert!(follow_ups(&app, &denied).await.is_empty());

    // A failed task submits nothing.
    let failed = create(
        &app,
        "a",
        json!({"submit": [{"queue": "b", "params": {"n": 9}}], "fail": true}),
    )
    .await;
    let t = ended(&app, &failed).await;
    assert_eq!(t["status"], 2, "{t}");
    assert_eq!(t["stdout"], "ok b\n");
    assert!(follow_ups(&app, &failed).await.is_empty());

    // Past the bound: refused calls, one note, the accepted follow-ups created.
    let bounded = create(
        &app,
        "a",
        json!({"submit": [{"queue": "b", "params": {}}], "repeat": 5}),
    )
    .await;
    let t = ended(&app, &bounded).await;
    assert_eq!(t["status"], 1, "{t}");
    assert_eq!(
        t["stdout"].as_str().unwrap().matches("(sandbox.submit_max)").count(),
        2,
        "{t}"
    );
    assert!(
        t["stderr"]
            .as_str()
            .unwrap()
            .contains("[disbatch: 2 follow-up task(s) were refused for a bound"),
        "{t}"
    );
    assert_eq!(follow_ups(&app, &bounded).await.len(), 3);

    // Params that are not an object.
    let array = create(&app, "a", json!({"submit": [{"queue": "b", "text": "[1]"}]})).await;
    let t = ended(&app, &array).await;
    assert_eq!(
        t["stdout"],
        "err b: follow-up params must be a JSON object, got an array\n"
    );
    assert!(follow_ups(&app, &array).await.is_empty());

    // A granted queue that does not exist fails the task; what was created is cancelled.
    let gone = create(
        &app,
        "a",
        json!({"submit": [{"queue": "b", "params": {"k": 1}}, {"queue": "gone", "params": {}}]}),
    )
    .await;
    let t = ended(&app, &gone).await;
    assert_eq!(t["status"], 2, "{t}");
    assert!(
        t["stderr"]
            .as_str()
            .unwrap()
            .contains("could not be created, so it failed: ")
            && t["stderr"]
                .as_str()
                .unwrap()
                .contains("names queue \"gone\", which does not exist"),
        "{t}"
    );
    wait_for(
        Duration::from_secs(30),
        "the created follow-up to be cancelled",
        || async {
            let next = follow_ups(&app, &gone).await;
            next.len() == 1 && next[0]["status"] == -5
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follow_ups_on_mongodb() {
    let t = common::test_db("submit").await;
    let store: Arc<dyn Store> = Arc::new(t.store.clone());
    let plugins = json!({"plugins": ["demo", "submit"]});
    follow_ups_on(store, || {
        DenProcess::start(&t.uri, &t.name, "submit-den", plugins.clone())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follow_ups_on_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&file).await.unwrap());
    let file: &Path = &file;
    let plugins = json!({"plugins": ["demo", "submit"]});
    follow_ups_on(store, || {
        DenProcess::start_embedded(file, "submit-den", plugins.clone())
    })
    .await;
}

/// A queue granted `submit` to itself, whose every task submits two copies of itself:
/// the lineage stops at `sandbox.submit_depth` 3, so exactly 1 + 2 + 4 + 8 tasks exist
/// once the DEN is idle, and the deepest tasks show the refused calls.
async fn a_self_granting_queue_stops_at_the_depth_bound(store: Arc<dyn Store>, start_den: impl Fn() -> DenProcess) {
    let app = router(ApiState::new(store.clone(), vec!["submit".into()]));
    let r = post(
        &app,
        "/queues",
        json!({"name": "loop", "plugin": "submit", "threads": 4,
               "sandbox": {"submit": ["loop"], "submit_depth": 3}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // Allowed (a recursive workflow is legitimate), with a warning naming the cycle and
    // the bound that stops it.
    let warning = r.json()["warnings"][0].as_str().unwrap_or_default().to_string();
    assert!(
        warning.contains("queue \"loop\" can reach itself through sandbox.submit grants (loop → loop)")
            && warning.contains("sandbox.submit_depth (3)")
            && warning.contains("sandbox.submit_max (unset, so the DEN's default (100"),
        "{}",
        r.text
    );
    // A cycle of two queues warns on the write that closes it, and on every later write
    // of a queue on it; a queue on none has no warnings.
    let r = post(
        &app,
        "/queues",
        json!({"name": "ping", "plugin": "submit", "sandbox": {"submit": ["pong"]}}),
    )
    .await;
    assert_eq!(r.json().get("warnings"), None, "{}", r.text);
    let r = post(
        &app,
        "/queues",
        json!({"name": "pong", "plugin": "submit", "sandbox": {"submit": ["ping"]}}),
    )
    .await;
    assert!(r.text.contains("(pong → ping → pong)"), "{}", r.text);
    let r = post(
        &app,
        "/queues/ping",
        json!({"sandbox": {"submit": ["pong"], "submit_max": 2}}),
    )
    .await;
    assert!(
        r.text.contains("(ping → pong → ping)") && r.text.contains("sandbox.submit_max (2)"),
        "{}",
        r.text
    );
    let r = post(&app, "/queues/ping", json!({"sandbox": {"submit": []}})).await;
    assert_eq!(r.json().get("warnings"), None, "{}", r.text);
    assert_bad(
        &post(
            &app,
            "/queues",
            json!({"name": "x", "plugin": "submit", "sandbox": {"submit_depth": 1001}}),
        )
        .await,
        "field \"sandbox.submit_depth\" must be an integer from 0 to 1000, got 1001",
    );
    let root = create(&app, "loop", json!({"again": {"queue": "loop", "times": 2}})).await;
    let _den = start_den();
    let tasks = || async {
        let r = get(&app, "/tasks?queue=loop&limit=1000").await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        r.json().as_array().unwrap().clone()
    };
    wait_for(Duration::from_secs(120), "15 tasks to end", || async {
        let all = tasks().await;
        all.len() >= 15 && all.iter().all(|t| t["status"].as_i64().is_some_and(|s| s > 0))
    })
    .await;
    let all = tasks().await;
    assert_eq!(all.len(), 15, "the lineage grew past submit_depth 3");
    let mut deepest = 0;
    for listed in &all {
        let t = task(&app, listed["_id"]["$oid"].as_str().unwrap()).await;
        assert_eq!(t["status"], 1, "{t}");
        let stdout = t["stdout"].as_str().unwrap();
        if stdout.contains("err loop") {
            deepest += 1;
            assert_eq!(
                stdout
                    .matches("err loop: follow-up refused: it would be at depth 4 of its lineage of follow-ups, past sandbox.submit_depth 3")
                    .count(),
                2,
                "{t}"
            );
            assert!(
                t["stderr"]
                    .as_str()
                    .unwrap()
                    .contains("2 follow-up task(s) were refused for a bound (sandbox.submit_max 100, sandbox.submit_depth 3 at depth 3"),
                "{t}"
            );
            assert!(listed["key"].as_str().unwrap().ends_with(":3"), "{listed}");
        } else {
            assert_eq!(stdout, "ok loop\nok loop\n", "{t}");
        }
    }
    assert_eq!(deepest, 8, "the 8 tasks at depth 3 were refused");
    assert!(all.iter().any(|t| t["_id"]["$oid"] == root.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_self_granting_queue_stops_at_the_depth_bound_on_mongodb() {
    let t = common::test_db("submit_depth").await;
    let store: Arc<dyn Store> = Arc::new(t.store.clone());
    let plugins = json!({"plugins": ["submit"]});
    a_self_granting_queue_stops_at_the_depth_bound(store, || {
        DenProcess::start(&t.uri, &t.name, "depth-den", plugins.clone())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_self_granting_queue_stops_at_the_depth_bound_on_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&file).await.unwrap());
    let file: &Path = &file;
    let plugins = json!({"plugins": ["submit"]});
    a_self_granting_queue_stops_at_the_depth_bound(store, || {
        DenProcess::start_embedded(file, "depth-den", plugins.clone())
    })
    .await;
}
