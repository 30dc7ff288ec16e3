//! The web UI in Debian's headless Chromium, driven by playwright-core (npm), with a real
//! `den` process running the tasks: create a queue, edit its threads, submit a task and
//! watch it finish, edit a node's maxthreads and open a finished task's GridFS-backed
//! output, set the QueueBalance and see the leader's share; and the operator's pages (the
//! overview, a queue's page, a task's page) whose plots must show the numbers of `GET /stats`.
//! Screenshots are saved under `target/browser-artifacts/{ui,dashboard}/`.
//!
//! Needs `/usr/bin/chromium` (`apt-get install -y chromium`) and npm; playwright-core is
//! installed by the test into `target/browser-test/` from `tests/browser/package-lock.json`.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use disbatch::model::Sort;
use disbatch::store::testing::StoreExt;
use disbatch::store::{NewQueue, OutputValue, PluginStore, Store};
use serde_json::json;

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
}

/// `target/browser-artifacts/<name>/`, emptied.
fn artifacts(name: &str) -> PathBuf {
    let dir = target_dir().join("browser-artifacts").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn chromium() -> PathBuf {
    let path = std::env::var_os("CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    assert!(
        path.is_file(),
        "Chromium is missing at {}: install it with `apt-get update && apt-get install -y chromium` \
         (or set CHROMIUM to its path)",
        path.display()
    );
    path
}

/// `target/browser-test/` with the driver script and playwright-core installed, once per
/// test process: the browser tests run side by side, and a second `npm ci` would delete
/// the `node_modules` the first one's Node is loading.
fn driver_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(install_driver).clone()
}

fn install_driver() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    let dir = target_dir().join("browser-test");
    std::fs::create_dir_all(&dir).unwrap();
    for f in [
        "package.json",
        "package-lock.json",
        "launch.mjs",
        "ui.mjs",
        "dashboard.mjs",
    ] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap_or_else(|e| panic!("copy tests/browser/{f}: {e}"));
    }
    if !dir.join("node_modules/playwright-core/package.json").is_file() {
        let status = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .current_dir(&dir)
            .status();
        assert!(
            matches!(status, Ok(s) if s.success()),
            "installing playwright-core failed ({status:?}); run `npm ci --prefix {}` (needs Node.js and npm)",
            dir.display()
        );
    }
    dir
}

#[tokio::test]
async fn ui_creates_a_queue_submits_a_task_edits_limits_and_shows_output() {
    let chromium = chromium();
    let driver = driver_dir();
    let db = common::test_db("browser_ui").await;

    db.store.heartbeat("ui-node", Duration::from_secs(30)).await.unwrap();
    let queue = db
        .store
        .create_queue(NewQueue {
            name: "done-q".into(),
            plugin: "demo".into(),
            threads: Some(1),
            sort: Sort::Fifo,
            extra: bson::Document::new(),
        })
        .await
        .unwrap();
    let ids = db
        .store
        .create_tasks(queue.id, vec![bson::doc! {"message": "shown in the browser"}])
        .await
        .unwrap();
    let task = db.store.claim(&queue, "ui-node").await.unwrap().unwrap();
    assert_eq!(task.id, ids[0]);
    assert!(disbatch::lifecycle::run::start(&db.store, task.id, "ui-node")
        .await
        .unwrap());
    let stdout = "shown in the browser\n".repeat(20_000);
    let file = db.store.write_output_file(task.id, "stdout", &stdout).await.unwrap();
    assert!(disbatch::lifecycle::run::finish(
        &db.store,
        task.id,
        "ui-node",
        1,
        OutputValue::File(file),
        OutputValue::Inline(String::new())
    )
    .await
    .unwrap());

    let balance = json!({"balance": {"enabled": true}});
    let _den = common::DenProcess::start(&db.uri, &db.name, "ui-node", balance.clone());

    let web = common::Web::start(&db.uri, &db.name, balance);
    let url = web.url.clone();

    let artifacts = artifacts("ui");
    let out = tokio::process::Command::new("node")
        .arg(driver.join("ui.mjs"))
        .args([&url, &task.id.to_hex(), "shown in the browser"])
        .arg(&artifacts)
        .arg(common::plugins::plugin_path("demo"))
        .env("CHROMIUM", &chromium)
        .current_dir(&driver)
        .output()
        .await
        .expect("run node (install Node.js)");
    assert!(
        out.status.success(),
        "the browser script failed (screenshots in {}):\n{}\n{}",
        artifacts.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let queues = db.store.queues().await.unwrap();
    let created = queues
        .iter()
        .find(|q| q.name == "browser-q")
        .expect("queue created by the UI");
    assert_eq!(created.threads, Some(7));
    assert_eq!(created.plugin, "demo");
    let demo = std::fs::read(common::plugins::plugin_path("demo")).unwrap();
    let uploaded = db.store.plugin_versions(Some("demo")).await.unwrap();
    assert_eq!(uploaded.len(), 1, "the UI's upload is stored");
    assert_eq!(uploaded[0].sha256, disbatch::store::plugins::digest(&demo));
    let nodes = db.store.nodes().await.unwrap();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].maxthreads, Some(3));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the script's JSON report");
    let submitted: bson::oid::ObjectId = report["submitted"].as_str().unwrap().parse().unwrap();
    let ran = db
        .store
        .task(submitted)
        .await
        .unwrap()
        .expect("the task submitted in the UI");
    assert_eq!(
        (ran.queue, ran.status, ran.node.as_deref()),
        (created.id, 1, Some("ui-node"))
    );
    assert_eq!(ran.params, bson::doc! {"message": "typed in the browser", "repeat": 3});
    let shots = std::fs::read_dir(&artifacts).unwrap().count();
    assert!(shots >= 5, "expected screenshots in {}", artifacts.display());
}

#[tokio::test]
async fn dashboard_plots_show_what_a_real_den_ran() {
    let chromium = chromium();
    let driver = driver_dir();
    let db = common::test_db("browser_dash").await;
    let den = common::DenProcess::start(&db.uri, &db.name, "dash-node", json!({}));
    let web = common::Web::start(&db.uri, &db.name, json!({}));
    let url = web.url.clone();
    let client = reqwest::Client::new();
    let post = |path: &str, body: serde_json::Value| {
        let req = client.post(format!("{url}{path}")).json(&body);
        async move {
            let resp = req.send().await.unwrap();
            assert!(resp.status().is_success(), "{}", resp.text().await.unwrap());
            resp.json::<serde_json::Value>().await.unwrap()
        }
    };
    post("/queues", json!({"name": "dash-q", "plugin": "demo", "threads": 3})).await;
    let mut params: Vec<serde_json::Value> = (0..9)
        .map(|i| json!({"message": format!("run {i}"), "sleep_ms": 20 * i}))
        .collect();
    params.push(json!({"status": 2, "stderr": "bad input"}));
    params.push(json!({"status": 2, "stderr": "bad input"}));
    let created = post("/tasks", json!({"queue": "dash-q", "params": params})).await;
    let ids: Vec<String> = serde_json::from_value(created["ids"].clone()).unwrap();
    let first: bson::oid::ObjectId = ids[0].parse().unwrap();
    common::wait_for(Duration::from_secs(60), "the tasks to finish", || async {
        let unfinished = disbatch::store::TaskFilter {
            status: Some(vec![-2, -1, 0]),
            ..Default::default()
        };
        db.store.count_tasks(&unfinished).await.unwrap() == 0
    })
    .await;
    post("/nodes/dash-node", json!({"maxthreads": 3})).await;

    let artifacts = artifacts("dashboard");
    let out = tokio::process::Command::new("node")
        .arg(driver.join("dashboard.mjs"))
        .args([url.as_str(), "dash-q", "9", "2", &first.to_hex()])
        .arg(&artifacts)
        .env("CHROMIUM", &chromium)
        .current_dir(&driver)
        .output()
        .await
        .expect("run node (install Node.js)");
    assert!(
        out.status.success(),
        "the dashboard script failed (screenshots in {}):\n{}\n{}\nDEN log:\n{}",
        artifacts.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        den.log()
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the script's JSON report");
    assert_eq!(report["points"], 61);
    let shots = std::fs::read_dir(&artifacts).unwrap().count();
    assert!(
        shots >= 6,
        "expected screenshots of each page in {}",
        artifacts.display()
    );
    let queue = db
        .store
        .queues()
        .await
        .unwrap()
        .into_iter()
        .find(|q| q.name == "dash-q")
        .unwrap();
    assert_eq!(
        (queue.threads, queue.on_orphan),
        (Some(3), disbatch::model::OnOrphan::Requeue),
        "the settings saved from the queue page"
    );
}
