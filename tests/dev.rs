//! `disbatch dev` as a real process: one process with a store, a `demo` queue, a DEN and the
//! web UI; the command it prints works; SIGTERM stops it cleanly; a missing plugin
//! directory is a clear error.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::dev::Dev;
use common::web::{run_disbatch, stderr};
use common::{plugins_dir, wait_for};
use serde_json::Value;

const BUILD_PLUGINS: &str = "cargo build --release --target wasm32-wasip2 --manifest-path plugins/Cargo.toml";

/// Runs the suggested command, then waits until its task succeeded with the demo plugin's
/// output; returns the task.
async fn try_the_suggested_task(dev: &Dev) -> Value {
    let args = dev.try_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(args[..2], ["--url", dev.url.as_str()], "{args:?}");
    assert_eq!(args[2..], ["create-task", "demo", "message", "hello"], "{args:?}");
    let out = run_disbatch(&args, None, &[]);
    assert!(out.status.success(), "disbatch {args:?}: {}", stderr(&out));
    // Not a terminal: the id alone on stdout, the sentence on stderr.
    assert_eq!(stderr(&out), "created 1 task\n");
    let printed = String::from_utf8_lossy(&out.stdout);
    let id = printed
        .strip_suffix('\n')
        .filter(|id| id.len() == 24 && !id.contains('\n'))
        .unwrap_or_else(|| panic!("not one task id in {printed:?}"))
        .to_owned();
    let path = format!("/tasks/{id}");
    let path = path.as_str();
    wait_for(Duration::from_secs(60), "the demo task to succeed", || async move {
        dev.get_json(path).await["status"] == 1
    })
    .await;
    let task = dev.get_json(&format!("/tasks/{id}?output=1")).await;
    assert_eq!(task["stdout"], "hello\n", "{task}");
    task
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_serves_the_ui_and_runs_the_suggested_task_on_an_embedded_file() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.db");
    let plugins = plugins_dir();
    let args = [
        "--db",
        db.to_str().unwrap(),
        "--bind",
        "127.0.0.1:0",
        "--plugin-dir",
        plugins.to_str().unwrap(),
    ];
    let mut dev = Dev::start(dir.path(), &args);
    assert!(!dev.url.ends_with(":0"), "the real port is printed: {}", dev.url);
    assert_eq!(dev.lines[1], format!("disbatch dev: store {} (embedded)", db.display()));

    let queues = dev.get_json("/queues").await;
    let demo = queues
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == "demo")
        .unwrap_or_else(|| panic!("no demo queue: {queues}"));
    assert_eq!(
        (demo["plugin"].as_str(), demo["threads"].as_i64()),
        (Some("demo"), Some(4))
    );
    let task = try_the_suggested_task(&dev).await;
    assert_eq!(task["stderr"], "", "{task}");

    let (status, html) = dev.get("/").await;
    assert_eq!(status, 200);
    assert!(html.to_ascii_lowercase().contains("<html"), "{html}");
    let info = dev.get_json("/info").await;
    assert_eq!(info["database"], db.display().to_string());

    assert_eq!(dev.terminate(), Some(0), "{}", dev.log());
    assert!(dev.log().contains("DEN stopped"), "{}", dev.log());

    // A second start on the same file keeps the queue and its finished task.
    let mut again = Dev::start(dir.path(), &args);
    let queues = again.get_json("/queues").await;
    assert_eq!(queues.as_array().unwrap().len(), 1, "{queues}");
    assert_eq!(queues[0]["completed"], 1, "{queues}");
    assert_eq!(again.terminate(), Some(0), "{}", again.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_on_mongodb_with_the_default_plugin_dir() {
    let t = common::test_db("dev_mongo").await;
    plugins_dir();
    let uri = t.uri.clone();
    let mut dev = Dev::start(
        Path::new(env!("CARGO_MANIFEST_DIR")),
        &["--mongodb", &uri, "--database", &t.name, "--bind", "127.0.0.1:0"],
    );
    assert_eq!(
        dev.lines[1],
        format!(
            "disbatch dev: store {} database {} (MongoDB)",
            disbatch::config::redact_uri(&uri),
            t.name
        )
    );
    try_the_suggested_task(&dev).await;
    let stored =
        t.db.collection::<bson::Document>("queues")
            .find_one(bson::doc! {"name": "demo"})
            .await
            .unwrap();
    assert!(stored.is_some(), "the demo queue is in MongoDB");
    assert_eq!(dev.terminate(), Some(0), "{}", dev.log());
}

#[test]
fn dev_without_plugins_says_how_to_build_them() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_disbatch"))
        .args(["dev", "--bind", "127.0.0.1:0"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(BUILD_PLUGINS), "{err}");
    assert!(err.contains("--plugin-dir"), "{err}");
    assert!(err.contains("plugins/target/wasm32-wasip2/release/demo.wasm"), "{err}");
    assert!(
        !dir.path().join("disbatch.db").exists(),
        "no store file is made before the error"
    );

    let out = Command::new(env!("CARGO_BIN_EXE_disbatch"))
        .args(["dev", "--plugin-dir", "/no/such/plugins"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("/no/such/plugins"), "{err}");

    let out = Command::new(env!("CARGO_BIN_EXE_disbatch"))
        .args(["dev", "--mongodb", "http://nope", "--plugin-dir", "."])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--mongodb"), "{err}");
}

/// The plugins a newcomer is shown: the examples and templates of `plugins/` (the Python
/// and JavaScript ones when `plugins/build-py-js` built them), never a test fixture of
/// `plugins/tests/`.
const EXAMPLES: [&str; 7] = [
    "demo",
    "demo-js",
    "demo-python",
    "fetch",
    "template",
    "template-js",
    "template-python",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_offers_the_examples_and_templates_only() {
    // Builds the examples into the default plugin directory (and the fixtures elsewhere).
    plugins_dir();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.db");
    let mut dev = Dev::start(
        Path::new(env!("CARGO_MANIFEST_DIR")),
        &["--db", db.to_str().unwrap(), "--bind", "127.0.0.1:0"],
    );
    let offered = dev.get_json("/plugins").await;
    let offered: Vec<&str> = offered
        .as_array()
        .unwrap_or_else(|| panic!("GET /plugins: {offered}"))
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    for example in ["demo", "fetch", "template"] {
        assert!(offered.contains(&example), "{example} is not offered: {offered:?}");
    }
    let not_examples: Vec<&&str> = offered.iter().filter(|p| !EXAMPLES.contains(p)).collect();
    assert!(
        not_examples.is_empty(),
        "disbatch dev offers plugins that are no examples: {not_examples:?} (of {offered:?})"
    );
    assert_eq!(dev.terminate(), Some(0), "{}", dev.log());
}
