//! Faults a DEN must survive without running a task twice or hanging: deadlines measured
//! in wall time, host calls that block, a paused (SIGSTOP) DEN whose lease lapsed, and a
//! shutdown with plugins still running.

use crate::common;

use common::{count_tasks as count, insert_queue, insert_task, task_doc_of, wait_for, DenProcess};

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use bson::doc;
use disbatch::runner::{Failure, RunControl, Sandbox, StopReason};

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) on a NUL-terminated path.
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o600) },
        0,
        "mkfifo {}",
        path.display()
    );
}

fn sandbox(timeout: Duration) -> Sandbox {
    Sandbox {
        timeout,
        ..Sandbox::default()
    }
}

#[test]
fn a_wait_cut_by_the_deadline_is_a_timeout() {
    let runner = common::shared_runner();
    let plugin = runner.load(&common::plugin_path("demo")).unwrap();
    let o = runner.run(
        &plugin,
        r#"{"sleep_ms": 600000}"#,
        &sandbox(Duration::from_millis(300)),
        None,
    );
    assert!(
        matches!(o.failure, Some(Failure::Timeout(_))),
        "a sleep of 10 min under a 300 ms timeout: {:?}",
        o.failure
    );
    println!("sleep past the timeout stopped after {:?}", o.duration);
}

#[test]
fn a_busy_loop_times_out_by_wall_time() {
    let runner = common::shared_runner();
    let plugin = runner.load(&common::plugin_path("spin")).unwrap();
    let o = runner.run(&plugin, "{}", &sandbox(Duration::from_millis(300)), None);
    assert!(matches!(o.failure, Some(Failure::Timeout(_))), "{:?}", o.failure);
    assert!(
        o.duration >= Duration::from_millis(300),
        "stopped early: {:?}",
        o.duration
    );
    println!("busy loop under a 300 ms timeout stopped after {:?}", o.duration);
}

#[test]
fn a_cancelled_plugin_stops_and_its_waits_end() {
    let runner = common::shared_runner();
    let plugin = runner.load(&common::plugin_path("demo")).unwrap();
    let control = RunControl::new();
    let canceller = control.clone();
    let t = std::thread::spawn(move || {
        runner.run_controlled(
            &plugin,
            r#"{"sleep_ms": 600000}"#,
            &sandbox(Duration::from_secs(3600)),
            None,
            &canceller,
        )
    });
    control.cancel(StopReason::Shutdown);
    let o = t.join().unwrap();
    assert!(o.failure.is_some(), "a cancelled plugin does not succeed");
    assert_eq!(control.reason(), Some(StopReason::Shutdown));
}

#[test]
fn a_fifo_in_a_granted_dir_does_not_hang_runner_exec() {
    let dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    mkfifo(&dir.path().join("fifo"));
    let grant = format!("{}:/in", dir.path().display());
    let started = Instant::now();
    let o = Command::new(env!("CARGO_BIN_EXE_runner"))
        .args(["exec", common::plugin_path("h3_fifo").to_str().unwrap()])
        .args([
            "--dir",
            &grant,
            "--timeout",
            "500ms",
            "--params",
            r#"{"path":"/in/fifo"}"#,
        ])
        .env("DISBATCH_CACHE_DIR", cache.path().join("cache"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    println!("runner exec on a FIFO ended after {:?}: {stderr}", started.elapsed());
    assert_ne!(o.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("cannot read /in/fifo") || stderr.contains("timeout"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fifo_in_a_granted_dir_does_not_hold_a_den() {
    let t = common::test_db("faults_fifo").await;
    let dir = tempfile::tempdir().unwrap();
    mkfifo(&dir.path().join("fifo"));
    let grant = format!("{}:/in", dir.path().display());
    let q = insert_queue(
        &t.db,
        "fifo",
        "h3_fifo",
        doc! {"sandbox": {"dirs": [&grant], "timeout": 0.5}},
    )
    .await;
    let id = insert_task(&t.db, q, -2, doc! {"path": "/in/fifo"}).await;
    let mut den = DenProcess::start(&t.uri, &t.name, "fifo", serde_json::json!({"plugins": ["h3_fifo"]}));
    wait_for(Duration::from_secs(60), "the FIFO task to end", || async {
        count(&t.db, doc! {"_id": id, "status": 2}).await == 1
    })
    .await;
    let d = task_doc_of(&t.db, id).await;
    let stderr = d.get_str("stderr").unwrap_or_default().to_owned();
    assert!(
        stderr.contains("cannot read /in/fifo") || stderr.contains("timeout"),
        "{d}"
    );
    den.signal(libc::SIGINT);
    den.wait_exit(Duration::from_secs(30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_den_does_not_run_its_task_again() {
    let t = common::test_db("faults_pause").await;
    let marks = tempfile::tempdir().unwrap();
    let grant = format!("{}:/out:rw", marks.path().display());
    let q = insert_queue(
        &t.db,
        "marks",
        "mark",
        doc! {"on_orphan": "requeue", "sandbox": {"dirs": [&grant]}},
    )
    .await;
    let id = insert_task(&t.db, q, -2, doc! {"path": "/out/once", "sleep_ms": 4000}).await;
    let extra = serde_json::json!({"plugins": ["mark"]});
    let paused = DenProcess::start(&t.uri, &t.name, "paused", extra.clone());
    wait_for(Duration::from_secs(60), "the task to run on the first DEN", || async {
        count(&t.db, doc! {"_id": id, "status": 0, "node": "paused"}).await == 1
    })
    .await;
    paused.pause();
    let _other = DenProcess::start(&t.uri, &t.name, "other", extra);
    let finished = Instant::now();
    while count(&t.db, doc! {"_id": id, "status": 1, "node": "other"}).await != 1 {
        if finished.elapsed() > Duration::from_secs(60) {
            let d = task_doc_of(&t.db, id).await;
            panic!("the other DEN did not finish the task: {d}\n{}", _other.log());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    paused.resume();
    wait_for(
        Duration::from_secs(30),
        "the resumed DEN to stop its plugin",
        || async { paused.log().contains("lease lapsed") },
    )
    .await;
    let d = task_doc_of(&t.db, id).await;
    assert_eq!(d.get_i32("status").unwrap(), 1, "{d}");
    assert_eq!(d.get_str("node").unwrap(), "other", "{d}");
    assert!(d.get_str("stdout").unwrap_or_default().contains("marked"), "{d}");
    assert_eq!(std::fs::read_to_string(marks.path().join("once")).unwrap(), "ran");
    let log = paused.log();
    assert!(
        !log.contains("already ran"),
        "the paused DEN's plugin acted after resuming:\n{log}"
    );
    assert!(!log.contains("finished"), "the paused DEN reported a result:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_stops_plugins_before_requeueing() {
    let t = common::test_db("faults_shutdown").await;
    let out = tempfile::tempdir().unwrap();
    let grant = format!("{}:/out:rw", out.path().display());
    let q = insert_queue(
        &t.db,
        "tick",
        "h3_ticker",
        doc! {"sandbox": {"dirs": [&grant], "timeout": 3600}},
    )
    .await;
    let id = insert_task(&t.db, q, -2, doc! {"path": "/out/count"}).await;
    let mut den = DenProcess::start(
        &t.uri,
        &t.name,
        "stopper",
        serde_json::json!({"plugins": ["h3_ticker"], "shutdown_grace": 1}),
    );
    let counter = out.path().join("count");
    wait_for(Duration::from_secs(60), "the ticker to run", || async {
        count(&t.db, doc! {"_id": id, "status": 0}).await == 1 && counter.exists()
    })
    .await;
    let term = Instant::now();
    den.signal(libc::SIGTERM);
    den.wait_exit(Duration::from_secs(30));
    println!("exited {:?} after SIGTERM (grace 1 s)", term.elapsed());
    let d = task_doc_of(&t.db, id).await;
    assert_eq!(d.get_i32("status").unwrap(), -2, "{d}");
    let log = den.log();
    let stopped = log.find("plugin stopped by the shutdown").expect(&log);
    let requeued = log.find("put unfinished tasks back").expect(&log);
    assert!(stopped < requeued, "plugins stopped before the requeue:\n{log}");
    let last = std::fs::read_to_string(&counter).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(std::fs::read_to_string(&counter).unwrap(), last);
}
