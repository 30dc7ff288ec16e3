//! The `disbatch` binary: `disbatch web` as a real process on a test database, and every
//! client verb run as a process against it (tables, `--json`, errors and exit codes).

use crate::common;

use std::time::Duration;

use bson::{doc, Document};
use disbatch::store::Store;
use serde_json::{json, Value};

use common::web::{stderr, Web};

#[tokio::test]
async fn queues_tasks_and_nodes_through_the_cli() {
    let db = common::test_db("cli_flow").await;
    let web = Web::start(&db.uri, &db.name, json!({}));

    assert_eq!(web.ok(&["plugins"]), "demo\nfail\n");
    let q = web.json(&["create-queue", "jobs", "demo", "--threads", "2"]);
    assert_eq!(q["name"], "jobs");
    let table = web.ok(&["queues"]);
    assert!(table.starts_with("ID"), "{table}");
    assert!(table.contains("jobs") && table.contains("demo"), "{table}");
    assert_eq!(web.ok(&["status"]), table);
    let q = web.json(&["update-queue", "jobs", "threads", "4", "sort", "lifo"]);
    assert_eq!((q["threads"].as_i64(), q["sort"].as_str()), (Some(4), Some("lifo")));
    // A warning of the server goes to stderr, after the answer on stdout.
    let out = web.run(&["update-queue", "jobs", "sandbox", r#"{"submit": ["jobs"]}"#]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("jobs"));
    assert!(
        stderr(&out).starts_with(
            "disbatch: warning: queue \"jobs\" can reach itself through sandbox.submit grants (jobs → jobs)"
        ),
        "{}",
        stderr(&out)
    );
    let out = web.run(&["update-queue", "jobs", "sandbox", "{}"]);
    assert_eq!(stderr(&out), "");

    let t = web.json(&["create-task", "jobs", "message", "hi", "repeat", "2"]);
    assert_eq!(t["count"], 1);
    let id = t["ids"][0].as_str().unwrap().to_owned();
    let task = web.json(&["task", &id]);
    // Values are strings, as Disbatch 4 sends them; `key:=JSON` is typed.
    assert_eq!(task["params"], json!({"message": "hi", "repeat": "2"}));
    assert!(web.ok(&["task", &id]).contains("status_name queued"));
    let t = web.json(&["create-task", "jobs", "repeat:=2", "tags:=[\"a\"]", "note", "x:=y"]);
    let task = web.json(&["task", t["ids"][0].as_str().unwrap()]);
    assert_eq!(task["params"], json!({"repeat": 2, "tags": ["a"], "note": "x:=y"}));
    let out = web.run(&["create-task", "jobs", "n:=two"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("must be JSON"), "{}", stderr(&out));
    // Dates as epoch seconds.
    let task = web.json(&["task", &id, "--epoch"]);
    assert!(task["ctime"].is_number(), "{task}");

    let t = web.json(&["create-tasks", "jobs", r#"[{"n":1},{"n":2}]"#]);
    assert_eq!(t["count"], 2);
    let list: Vec<Value> = (0..2500).map(|n| json!({ "n": n })).collect();
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), serde_json::to_string(&list).unwrap()).unwrap();
    let t = web.json(&["create-tasks", "jobs", &format!("@{}", file.path().display())]);
    assert_eq!(t["count"], 2500);
    let out = web.run_with(&["create-tasks", "jobs", "-"], Some(r#"[{"from":"stdin"}]"#), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Not on a terminal: the id alone on stdout, the sentence on stderr.
    assert_eq!(stderr(&out), "created 1 task\n");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim().len(), 24, "one task id");

    // A batch of three from two commands (in a queue of its own); the report says how far
    // it is.
    web.json(&["create-queue", "side", "demo", "--threads", "0"]);
    let t = web.json(&[
        "create-tasks",
        "--batch",
        "b1",
        "--batch-size",
        "3",
        "side",
        r#"[{"n":1},{"n":2}]"#,
    ]);
    assert_eq!((t["count"].as_i64(), t["batch"].as_str()), (Some(2), Some("b1")));
    let t = web.json(&["create-task", "--batch", "b1", "side", "n", "3"]);
    assert_eq!(t["batch"], "b1");
    assert_eq!(
        web.ok(&["batch", "b1"]),
        "batch b1: 3 of 3 tasks, 0 ended, not complete\n  queued 3\n"
    );
    assert_eq!(web.json(&["batch", "b1"])["total"], 3);

    // Dependencies: a DAG in one request, a task after a batch and one after a task.
    let dag = web.json(&[
        "create-dag",
        "side",
        r#"[{"params":{"n":1},"key":"first"},{"params":{"n":2},"after":[{"ref":0}]},{"params":{"n":3},"after":["first"]}]"#,
    ]);
    let first = dag["ids"][0].as_str().unwrap().to_owned();
    let second = dag["ids"][1].as_str().unwrap().to_owned();
    assert_eq!(web.json(&["task", &second])["status"], -4, "{dag}");
    let t = web.json(&[
        "create-task",
        "--after",
        "batch:b1",
        "--after",
        &first,
        "--after-failure",
        "run",
        "side",
    ]);
    let fan_in = web.json(&["task", t["ids"][0].as_str().unwrap()]);
    assert_eq!(fan_in["after"], json!(["batch:b1", first]), "{fan_in}");
    assert_eq!(fan_in["after_failure"], "run");
    let children = web.json(&["tasks", &format!(r#"{{"after": "{first}"}}"#)]);
    assert_eq!(children.as_array().map(Vec::len), Some(3), "{children}");
    let cycle = web.run_with(&["create-dag", "side", r#"[{"after":[{"ref":0}]}]"#], None, &[]);
    assert!(!cycle.status.success());
    assert!(stderr(&cycle).contains("cycle"), "{}", stderr(&cycle));

    db.db
        .collection::<Document>("people")
        .insert_many([doc! {"name": "ann"}, doc! {"name": "bob"}])
        .await
        .unwrap();
    let t = web.json(&[
        "create-tasks",
        "--collection",
        "people",
        "jobs",
        r#"{"filter":{"name":"bob"},"params":{"who":"document.name"}}"#,
    ]);
    assert_eq!(t["count"], 1);

    assert_eq!(web.ok(&["--count", "tasks", r#"{"queue":"jobs"}"#]).trim(), "2506");
    // 20 by default, as Disbatch 4; `--limit 0` is all of them, page by page (100 a page
    // with --full), the options after the verb as well as before it.
    let page = web.json(&["tasks", r#"{"queue":"jobs"}"#]);
    assert_eq!(page.as_array().unwrap().len(), 20);
    let all = web.json(&[
        "tasks",
        r#"{"queue":"jobs"}"#,
        "--limit",
        "0",
        "--full",
        "--fields",
        "status",
    ]);
    let all = all.as_array().unwrap();
    assert_eq!(all.len(), 2506);
    let mut ids: Vec<&str> = all.iter().map(|t| t["id"].as_str().unwrap()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 2506, "every task once");
    let skipped = web.json(&["--limit", "0", "--skip", "2500", "tasks", r#"{"queue":"jobs"}"#]);
    assert_eq!(skipped.as_array().unwrap().len(), 6);
    let t = web.json(&["--epoch", "--terse", "--limit", "1", "tasks"]);
    assert!(t[0]["mtime"].is_number(), "{t}");
    let page = web.json(&[
        "--limit",
        "3",
        "--skip",
        "1",
        "tasks",
        r#"{"queue":"jobs","status":-2}"#,
    ]);
    assert_eq!(page.as_array().unwrap().len(), 3);
    let newest = web.json(&["--limit", "1", "tasks", r#"{"queue":"jobs"}"#]);
    assert_eq!(newest[0]["params"]["who"], "bob");
    let table = web.ok(&["--limit", "2", "tasks"]);
    assert_eq!(table.lines().count(), 3, "{table}");

    db.store.heartbeat("node-a", Duration::from_secs(30)).await.unwrap();
    let nodes = web.ok(&["nodes"]);
    assert!(nodes.contains("node-a") && nodes.contains("fresh"), "{nodes}");
    let n = web.json(&["set-maxthreads", "node-a", "3"]);
    assert_eq!(n["maxthreads"], 3);
    let n = web.json(&["set-maxthreads", "node-a", "null"]);
    assert_eq!(n["maxthreads"], Value::Null);
    let m = web.ok(&["monitoring"]);
    assert!(m.starts_with("OK") && m.contains("queuebalance OK"), "{m}");

    assert!(web.ok(&["balance"]).contains("balance document not found"));
    let set = web.ok(&[
        "set-balance",
        r#"{"max_tasks": {"* 07:00": "5", "5 19:00": 8}, "queues": [["jobs"]]}"#,
    ]);
    assert!(set.contains("success: queuebalance modified"), "{set}");
    let b = web.ok(&["balance"]);
    assert!(
        b.contains("default lane 0: jobs") && b.contains("from * 07:00: 5") && b.contains("from 5 19:00: 8"),
        "{b}"
    );
    let out = web.run(&["set-balance", r#"{"max_tasks": {}, "queues": [["nope"]]}"#]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("\"nope\""), "{}", stderr(&out));

    assert!(web.ok(&["delete-queue", "jobs"]).contains("deleted queue jobs"));
    assert!(!web.ok(&["queues"]).contains("jobs"));
}

#[tokio::test]
async fn errors_and_exit_codes() {
    let db = common::test_db("cli_errors").await;
    let web = Web::start(&db.uri, &db.name, json!({}));

    let out = web.run(&["create-queue", "q", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("not an allowed plugin"), "{}", stderr(&out));
    assert!(stderr(&out).contains("HTTP 400"));
    let out = web.run(&["task", "0123456789abcdef01234567"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("HTTP 404"));
    // Without a filter or --limit, the 20 newest (the server refuses unbounded queries).
    assert_eq!(web.json(&["tasks"]), json!([]));
    for (args, says) in [
        (&["--terse", "tasks", "--noterse"][..], "contradict"),
        (&["-n", "me", "queues"][..], "together"),
        (
            &["--url", "https://127.0.0.1:1", "--ssl-ca-file", "/no/ca.pem", "queues"][..],
            "/no/ca.pem",
        ),
        (&["--config", "/no/config.json", "queues"][..], "/no/config.json"),
    ] {
        let out = web.run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
    let out = web.run(&["create-tasks", "q", "[not json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("invalid JSON"));
    let out = web.run(&["create-tasks", "q", "@/no/such/file.json"]);
    assert_eq!(out.status.code(), Some(2));
    let out = web.run(&["update-queue", "q", "threads"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = web.run(&["set-maxthreads", "n", "many"]);
    assert_eq!(out.status.code(), Some(2));
    let out = web.run(&["--url", "http://127.0.0.1:1", "queues"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("cannot reach"));
}

#[tokio::test]
async fn token_from_flag_or_env() {
    let db = common::test_db("cli_token").await;
    let web = Web::start(&db.uri, &db.name, json!({"api_token": "t0k"}));
    let out = web.run(&["create-queue", "q", "demo"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("--token"), "{}", stderr(&out));
    assert!(web
        .run(&["--token", "t0k", "create-queue", "q", "demo"])
        .status
        .success());
    let out = web.run_with(&["delete-queue", "q"], None, &[("DISBATCH_TOKEN", "t0k")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(web.run(&["queues"]).status.success());

    // HTTP basic as Disbatch 4's CLI: any user name, the token as password.
    let out = web.run(&["-n", "someone", "--password", "t0k", "create-queue", "q2", "demo"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = web.run(&["delete-queue", "q2", "--username", "x", "--password", "wrong"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("HTTP 401") && stderr(&out).contains("api_token"),
        "{}",
        stderr(&out)
    );

    // The token from a config file (relaxed JSON, as Disbatch 4 reads it).
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    std::fs::write(
        &config,
        "{ # the client reads api_token and attributes only\n \"api_token\": \"t0k\", }",
    )
    .unwrap();
    let out = web.run(&["delete-queue", "q2", "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// What LWP (Disbatch 4's CLI) needs: a write without credentials answers 401 with a
/// `Basic realm="disbatch"` challenge, and the same request with basic credentials (any
/// user, the token as password) then passes.
#[tokio::test]
async fn basic_auth_challenge_for_disbatch_4_clients() {
    let db = common::test_db("cli_basic").await;
    let web = Web::start(&db.uri, &db.name, json!({"api_token": "t0k-basic"}));
    let http = reqwest::Client::new();
    let post = || {
        http.post(format!("{}/queues", web.url))
            .json(&json!({"name": "lwp", "plugin": "demo"}))
    };
    let r = post().send().await.unwrap();
    assert_eq!(r.status(), 401);
    let challenges: Vec<&str> = r
        .headers()
        .get_all(reqwest::header::WWW_AUTHENTICATE)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert!(challenges.contains(&"Basic realm=\"disbatch\""), "{challenges:?}");
    assert!(challenges.contains(&"Bearer"), "{challenges:?}");
    let r = post().basic_auth("lwp-user", Some("wrong")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let r = post().basic_auth("lwp-user", Some("t0k-basic")).send().await.unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let r = post().bearer_auth("t0k-basic").send().await.unwrap();
    assert_ne!(r.status(), 401, "the bearer token passes too");
}

#[tokio::test]
async fn a_den_runs_what_the_cli_submits() {
    let db = common::test_db("cli_den").await;
    let web = Web::start(&db.uri, &db.name, json!({"plugin_dir": common::plugins_dir()}));
    web.ok(&["create-queue", "run", "demo", "--threads", "1"]);
    let id = web.json(&["create-task", "run", "message", "from-the-cli"])["ids"][0]
        .as_str()
        .unwrap()
        .to_owned();
    let _den = common::DenProcess::start(&db.uri, &db.name, "cli-den", json!({}));
    let store = db.store.clone();
    let oid = bson::oid::ObjectId::parse_str(&id).unwrap();
    common::wait_for(Duration::from_secs(60), "the task to finish", || {
        let store = store.clone();
        async move { store.task(oid).await.unwrap().is_some_and(|t| t.status == 1) }
    })
    .await;
    let text = web.ok(&["task", &id]);
    assert!(text.contains("from-the-cli"), "{text}");
    let q = web.json(&["queues"]);
    assert_eq!(q[0]["completed"], 1);

    // wait: the outcome sets the exit code. An ended task answers at once.
    assert_eq!(web.ok(&["wait", &id]), format!("{id} 1 (succeeded)\n"));
    // create-task --wait submits and waits: 0 when it succeeds, 4 when it fails.
    let out = web.run_with(&["create-task", "--wait", "run", "message", "waited"], None, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(shown.ends_with(" 1 (succeeded)\n"), "{shown}");
    assert!(stderr(&out).starts_with("created 1 task\n"), "{}", stderr(&out));
    let out = web.run_with(&["create-task", "--wait", "run", "status:=2"], None, &[]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("1 of 1 tasks did not succeed"),
        "{}",
        stderr(&out)
    );
    // A task that cannot end in time: 5 at --timeout.
    web.ok(&["update-queue", "run", "threads", "0"]);
    let stuck = web.json(&["create-task", "run"])["ids"][0].as_str().unwrap().to_owned();
    let out = web.run_with(&["wait", "--timeout", "1s", &stuck], None, &[]);
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("-2 (queued)"));
}

#[tokio::test]
async fn schedule_cancel_and_kill_through_the_cli() {
    let db = common::test_db("cli_lifecycle").await;
    let web = Web::start(&db.uri, &db.name, json!({}));
    web.json(&["create-queue", "jobs", "demo", "--threads", "0"]);

    let t = web.json(&["create-task", "--run-at", "1h", "jobs", "n", "1"]);
    let later = t["ids"][0].as_str().unwrap().to_owned();
    let task = web.json(&["task", &later]);
    assert_eq!(
        (task["status"].as_i64(), task["status_name"].as_str()),
        (Some(-7), Some("scheduled"))
    );
    assert!(web.ok(&["task", &later]).contains("status_name scheduled"));
    let t = web.json(&["create-tasks", "--run-at", "2h", "jobs", r#"[{"n":2},{"n":3}]"#]);
    assert_eq!(t["count"], 2);
    let now = web.json(&["create-task", "jobs", "n", "4"])["ids"][0]
        .as_str()
        .unwrap()
        .to_owned();

    let out = web.ok(&["cancel", &later, "--reason", "not needed", "--by", "ann"]);
    assert_eq!(out, format!("{later} -5 (cancelled)\n"));
    let task = web.json(&["task", &later]);
    assert_eq!(
        (task["stop"]["by"].as_str(), task["stop"]["reason"].as_str()),
        (Some("ann"), Some("not needed"))
    );

    // A task that is not running cannot be killed: the error says what applies instead.
    let out = web.run_with(&["kill", &now], None, &[]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("cancel ends a task that has not started"),
        "{}",
        stderr(&out)
    );

    // A running task shows its progress, and a kill names who asked.
    let queue = db.store.queues().await.unwrap().remove(0);
    let running = db.store.claim(&queue, "den-1").await.unwrap().unwrap().id;
    assert!(disbatch::lifecycle::run::start(&db.store, running, "den-1")
        .await
        .unwrap());
    let half = disbatch::model::TaskProgress {
        percent: Some(50.0),
        info: "half way".into(),
        at: bson::DateTime::now(),
    };
    assert!(
        disbatch::lifecycle::run::report_progress(&db.store, running, "den-1", &half)
            .await
            .unwrap()
    );
    let shown = web.ok(&["task", &running.to_hex()]);
    assert!(shown.contains("progress    [#####.....]  50% half way\n"), "{shown}");
    assert_eq!(web.json(&["task", &running.to_hex()])["progress"]["percent"], 50.0);
    web.ok(&["kill", &running.to_hex(), "--by", "bob", "--reason", "stuck"]);
    let shown = web.ok(&["task", &running.to_hex()]);
    assert!(
        shown.contains("stop        kill by bob at ") && shown.contains(": stuck\n"),
        "{shown}"
    );

    assert_eq!(web.ok(&["cancel", "--queue", "jobs"]), "cancelled 2 tasks\n");
    assert_eq!(web.ok(&["kill", "--queue", "jobs"]), "asked to kill 0 tasks\n");
    let out = web.run_with(&["cancel"], None, &[]);
    assert!(!out.status.success(), "ids or --queue are required");

    // A finished (here cancelled) task runs again by hand; `task` lists its earlier run.
    let out = web.ok(&["retry", &later, "--by", "cy", "--reason", "needed after all"]);
    assert_eq!(out, format!("{later} -2 (queued)\n"));
    let shown = web.ok(&["task", &later]);
    assert!(shown.contains("attempts    1\n"), "{shown}");
    assert!(
        shown.contains("  #1 -5 (cancelled) on - at ") && shown.contains(": retried by hand by cy: needed after all\n"),
        "{shown}"
    );
    // A key makes create-task safe to repeat.
    let one = web.ok(&["create-task", "--key", "nightly", "jobs", "n:=1"]);
    let two = web.run(&["create-task", "--key", "nightly", "jobs", "n:=2"]);
    assert_eq!(one, String::from_utf8_lossy(&two.stdout), "the same task both times");
    assert_eq!(stderr(&two), "created 0 tasks, 1 already there\n");
    let by_key = web.json(&["task", "nightly"]);
    assert_eq!(by_key["params"]["n"], 1);
    web.ok(&["create-task", "--key", "nightly", "--resubmit", "jobs", "n:=3"]);
    assert_eq!(web.json(&["task", "nightly"])["params"]["n"], 3);

    let out = web.run_with(&["retry", &later], None, &[]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("only a finished task can be retried"),
        "{}",
        stderr(&out)
    );
}
