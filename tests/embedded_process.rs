//! `den --embedded` and `disbatch web --embedded` as real processes on one SQLite file:
//! two DENs drain a queue exactly once within its limits, the CLI works through an
//! embedded DCI, and a DEN runs without a config file.

use crate::common;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bson::{doc, Document};
use common::web::{run_disbatch, stderr, Web};
use common::{plugins_dir, wait_for, DenProcess};
use disbatch::model::Sort;
use disbatch::store::sqlite::SqliteStore;
use disbatch::store::testing::StoreExt;
use disbatch::store::{NewQueue, Page, Store, TaskFilter};
use serde_json::json;

async fn count(store: &SqliteStore, filter: TaskFilter) -> u64 {
    store.count_tasks(&filter).await.unwrap()
}

fn statuses(s: &[i32]) -> TaskFilter {
    TaskFilter {
        status: Some(s.to_vec()),
        ..Default::default()
    }
}

async fn create_queue(
    store: &SqliteStore,
    name: &str,
    plugin: &str,
    threads: i64,
    extra: Document,
) -> bson::oid::ObjectId {
    store
        .create_queue(NewQueue {
            name: name.into(),
            plugin: plugin.into(),
            threads: Some(threads),
            sort: Sort::Fifo,
            extra,
        })
        .await
        .unwrap()
        .id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_dens_on_one_file_drain_every_task_exactly_once() {
    const TOTAL: usize = 300;
    const THREADS: i64 = 6;
    const PER_NODE: i64 = 3;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("shared.db");
    let store = SqliteStore::open(&file).await.unwrap();
    let marks = tempfile::tempdir().unwrap();
    let grant = format!("{}:/out:rw", marks.path().display());
    let q = create_queue(&store, "marks", "mark", THREADS, doc! {"sandbox": {"dirs": [&grant]}}).await;
    let nodes = ["embedded-a", "embedded-b"];
    for node in nodes {
        store.heartbeat(node, Duration::from_secs(30)).await.unwrap();
        assert!(disbatch::lifecycle::nodes::set_maxthreads(&store, node, Some(PER_NODE))
            .await
            .unwrap());
    }
    let params = (0..TOTAL).map(|k| doc! {"path": format!("/out/{k}"), "sleep_ms": 10});
    store.create_tasks(q, params.collect()).await.unwrap();

    let extra = json!({"plugins": ["mark"], "heartbeat_stale": 30});
    let dens: Vec<DenProcess> = nodes
        .iter()
        .map(|node| DenProcess::start_embedded(&file, node, extra.clone()))
        .collect();

    let start = Instant::now();
    let mut peak_queue = 0;
    let mut peak_node: BTreeMap<&str, u64> = BTreeMap::new();
    loop {
        peak_queue = peak_queue.max(count(&store, statuses(&[-1, 0])).await);
        for node in nodes {
            let filter = TaskFilter {
                node: Some(Some(node.into())),
                ..statuses(&[-1, 0])
            };
            let n = count(&store, filter).await;
            let p = peak_node.entry(node).or_default();
            *p = (*p).max(n);
        }
        if count(&store, statuses(&[-2, -1, 0])).await == 0 {
            break;
        }
        let logs: Vec<String> = dens.iter().map(DenProcess::log).collect();
        assert!(
            start.elapsed() < Duration::from_secs(240),
            "drain took over 4 minutes:\n{logs:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = start.elapsed();
    drop(dens);

    let succeeded = count(&store, statuses(&[1])).await;
    let files = std::fs::read_dir(marks.path()).unwrap().count();
    let mut by_node: BTreeMap<String, u64> = BTreeMap::new();
    let all = Page {
        skip: 0,
        limit: TOTAL as u64 + 1,
        oldest_first: false,
    };
    for t in store.find_tasks(&TaskFilter::default(), all).await.unwrap() {
        *by_node.entry(t.node.unwrap_or_default()).or_default() += 1;
    }
    println!(
        "embedded drain: {TOTAL} tasks, 2 DENs on one file, {:.1}s; peak running {peak_queue} (threads {THREADS}), \
         per node {peak_node:?} (maxthreads {PER_NODE}); ran by node {by_node:?}; succeeded {succeeded}, marks {files}",
        elapsed.as_secs_f64()
    );
    assert_eq!(succeeded as usize, TOTAL, "every task succeeded (a second run fails)");
    assert_eq!(
        files,
        TOTAL,
        "every task ran exactly once: claimed twice {}",
        files as i64 - TOTAL as i64
    );
    assert!(
        peak_queue <= THREADS as u64,
        "queue threads {THREADS} exceeded: {peak_queue}"
    );
    for (node, peak) in &peak_node {
        assert!(
            *peak <= PER_NODE as u64,
            "{node} exceeded maxthreads {PER_NODE}: {peak}"
        );
    }
    for node in nodes {
        assert!(
            by_node.get(node).is_some_and(|n| *n > 0),
            "{node} ran no task: {by_node:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_and_a_den_without_config_share_an_embedded_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cli.db");
    let plugins = plugins_dir();
    let web = Web::start_embedded(&file, &["--plugin-dir", plugins.to_str().unwrap()]);

    let info = web.json(&["info"]);
    assert_eq!(info["database"], file.display().to_string());
    let allowed = web.json(&["plugins"]);
    assert!(allowed.as_array().unwrap().contains(&json!("demo")), "{allowed}");
    assert!(allowed.as_array().unwrap().contains(&json!("mark")), "{allowed}");
    web.json(&["create-queue", "greet", "demo", "--threads", "2"]);
    web.json(&["update-queue", "greet", "on_orphan", "requeue"]);
    let id = web.json(&["create-task", "greet", "message", "from-embedded", "repeat:=2"])["ids"][0]
        .as_str()
        .unwrap()
        .to_owned();
    let out = run_disbatch(
        &["create-tasks", "--collection", "people", "greet", r#"{"filter":{}}"#],
        None,
        &[("DISBATCH_URL", &web.url)],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot read other collections"),
        "{}",
        stderr(&out)
    );

    let cache = dir.path().join("cache");
    let mut den = Command::new(env!("CARGO_BIN_EXE_den"))
        .arg("--embedded")
        .arg(&file)
        .arg("--plugin-dir")
        .arg(&plugins)
        .env_remove("DISBATCH_CONFIG")
        .env("DISBATCH_NODE", "no-config")
        .env("DISBATCH_CACHE_DIR", &cache)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(Duration::from_secs(60), "the task to succeed", || {
        let task = web.json(&["task", &id]);
        async move { task["status"] == 1 }
    })
    .await;
    let task = web.json(&["task", &id]);
    assert_eq!(task["stdout"], "from-embedded\nfrom-embedded\n");
    assert_eq!(task["node"], "no-config");
    let nodes = web.json(&["nodes"]);
    assert_eq!(nodes[0]["node"], "no-config", "{nodes}");
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(den.id() as i32, libc::SIGTERM) }, 0);
    let status = den.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

#[test]
fn embedded_flags_fail_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let den = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_den"))
            .args(args)
            .env_remove("DISBATCH_CONFIG")
            .current_dir(dir.path())
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = den(&[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--config") && err.contains("--embedded"), "{err}");
    let (code, err) = den(&["--embedded", "--plugin-dir", "/no/such/plugins"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("/no/such/plugins"), "{err}");
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"heartbeat_stale": "soon"}"#).unwrap();
    let (code, err) = den(&["--embedded", "--config", bad.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("heartbeat_stale") && err.contains("bad.json"), "{err}");
    let (code, err) = den(&["--embedded", "/no/such/dir/x.db", "--plugin-dir", "."]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("/no/such/dir/x.db"), "{err}");
}

#[tokio::test]
async fn tasks_queued_through_the_store_wake_its_watchers() {
    use futures::StreamExt;
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("watch.db")).await.unwrap();
    let mut events = store
        .watch_queued()
        .await
        .unwrap()
        .expect("the embedded store notifies");
    let q = create_queue(&store, "w", "demo", 1, doc! {}).await;
    let other = store.clone();
    other.create_tasks(q, vec![doc! {}]).await.unwrap();
    let event = tokio::time::timeout(Duration::from_secs(10), events.next()).await;
    assert!(matches!(event, Ok(Some(Ok(())))), "{event:?}");
}

/// The pid of the process holding node name `node`, if any.
async fn holder(store: &SqliteStore, node: &str) -> Option<u32> {
    let nodes = store.nodes().await.unwrap();
    nodes.into_iter().find(|n| n.node == node)?.process.map(|p| p.pid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_name_is_held_by_one_den_and_taken_over_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("twins.db");
    let store = SqliteStore::open(&file).await.unwrap();
    let q = create_queue(&store, "demo", "demo", 2, doc! {}).await;
    // A heartbeat window far longer than the test: only the pid check can free the name.
    let extra = json!({"heartbeat_stale": 300});
    let mut first = DenProcess::start_embedded(&file, "twin", extra.clone());
    let first_pid = first.pid();
    wait_for(Duration::from_secs(20), "the first DEN to take its name", || async {
        holder(&store, "twin").await == Some(first_pid)
    })
    .await;

    let mut second = DenProcess::start_embedded(&file, "twin", extra.clone());
    let status = second.wait_exit(Duration::from_secs(20));
    assert_eq!(status.code(), Some(1), "{}", second.log());
    let log = second.log();
    assert!(
        log.contains(&format!(
            "node name \"twin\" is held by a running DEN (pid {first_pid} on "
        )),
        "{log}"
    );
    assert!(log.contains("DISBATCH_NODE"), "{log}");
    assert_eq!(
        holder(&store, "twin").await,
        Some(first_pid),
        "the refused DEN took nothing"
    );

    first.signal(libc::SIGKILL);
    first.wait_exit(Duration::from_secs(10));
    let third = DenProcess::start_embedded(&file, "twin", extra);
    let third_pid = third.pid();
    wait_for(
        Duration::from_secs(20),
        "a restarted DEN to take the name of the dead one",
        || async { holder(&store, "twin").await == Some(third_pid) },
    )
    .await;
    let id = store.create_tasks(q, vec![doc! {"message": "after"}]).await.unwrap()[0];
    wait_for(Duration::from_secs(20), "the restarted DEN to run a task", || async {
        store.task(id).await.unwrap().is_some_and(|t| t.status == 1)
    })
    .await;
    assert!(
        third.log().contains("taking over the node name of a DEN that is gone"),
        "{}",
        third.log()
    );
}

/// The store's connections do not checkpoint on commit; its writer copies the write-ahead
/// log into the file as the log fills, and the log starts over rather than growing with
/// every write: across rounds of writes the log is restarted again and again (the
/// checkpoint sequence number in its header goes up at each restart) and never holds all
/// that was written, and once writes stop the whole log is copied into the file. Without
/// the writer's checkpoints the log is never restarted and holds every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_write_ahead_log_is_copied_into_the_file_and_starts_over() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("wal.db");
    let wal = dir.path().join("wal.db-wal");
    let store = SqliteStore::open(&file).await.unwrap();
    let q = create_queue(&store, "w", "demo", 1, doc! {}).await;
    let size = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
    // The checkpoint sequence number of the log's header (bytes 12..16, big-endian).
    let restarts = || {
        std::fs::read(&wal)
            .ok()
            .filter(|h| h.len() >= 32)
            .map_or(0, |h| u32::from_be_bytes([h[12], h[13], h[14], h[15]]))
    };
    let pad = "x".repeat(1000);
    const ROUNDS: usize = 8;
    const PER_ROUND: usize = 3_000;
    let mut seen = Vec::new();
    for round in 0..ROUNDS {
        for chunk in 0..PER_ROUND / 100 {
            let first = round * PER_ROUND + chunk * 100;
            let tasks = (0..100).map(|i| doc! {"i": (first + i) as i64, "pad": &pad});
            store.create_tasks(q, tasks.collect()).await.unwrap();
        }
        seen.push((size(&wal), restarts()));
    }
    assert_eq!(count(&store, TaskFilter::default()).await, (ROUNDS * PER_ROUND) as u64);
    // About 24 MB of tasks were written, 3 MB a round.
    let total = (ROUNDS * PER_ROUND * 1000) as u64;
    let (log, restarted) = seen[ROUNDS - 1];
    assert!(
        restarted - seen[0].1 >= (ROUNDS / 2) as u32,
        "the log was restarted {} times over {} rounds (log bytes, restarts after each: {seen:?})",
        restarted - seen[0].1,
        ROUNDS - 1
    );
    assert!(
        log < total,
        "the log ({log} bytes) holds all of the {total} bytes written: {seen:?}"
    );
    // With no write coming, the writer copies the rest of the log within seconds: the file
    // then holds every task.
    wait_for(Duration::from_secs(60), "the whole log copied while idle", || async {
        size(&file) >= total
    })
    .await;
    println!(
        "log bytes and restarts after each round: {seen:?}; file {} bytes",
        size(&file)
    );
}

/// A file from a release with the index of every task's status and `run_at` loses it for
/// the index of scheduled tasks only, and promoting due tasks uses that index.
#[tokio::test]
async fn an_older_file_gets_the_index_of_scheduled_tasks_only() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("old.db");
    drop(SqliteStore::open(&file).await.unwrap());
    let raw = rusqlite::Connection::open(&file).unwrap();
    raw.execute_batch("DROP INDEX tasks_due; CREATE INDEX tasks_scheduled ON tasks (status, run_at);")
        .unwrap();
    drop(raw);
    drop(SqliteStore::open(&file).await.unwrap());
    let raw = rusqlite::Connection::open(&file).unwrap();
    let indexes: Vec<String> = raw
        .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'tasks' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(indexes.contains(&"tasks_due".to_string()), "{indexes:?}");
    assert!(!indexes.contains(&"tasks_scheduled".to_string()), "{indexes:?}");
    let plan: Vec<String> = raw
        .prepare(&format!(
            "EXPLAIN QUERY PLAN UPDATE tasks INDEXED BY tasks_due SET status = -2 WHERE status = {} AND run_at <= 1",
            disbatch::model::status::SCHEDULED
        ))
        .unwrap()
        .query_map([], |r| r.get(3))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(plan.iter().any(|p| p.contains("tasks_due")), "{plan:?}");
}

/// A task row another tool damaged is listed and shown with its problem, as on MongoDB;
/// the other tasks of the same read are not hidden by it.
#[tokio::test]
async fn an_unreadable_task_row_is_shown_with_its_problem_not_hiding_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("odd.db");
    let store = SqliteStore::open(&file).await.unwrap();
    let q = create_queue(&store, "odd", "demo", 1, doc! {}).await;
    let ids = store
        .create_tasks(q, vec![doc! {"n": 1}, doc! {"n": 2}, doc! {"n": 3}])
        .await
        .unwrap();
    let raw = rusqlite::Connection::open(&file).unwrap();
    raw.execute(
        "UPDATE tasks SET status = 1099511627776, params = x'00ff', stdout_file = 'not-an-id' WHERE id = ?1",
        [ids[1].to_hex()],
    )
    .unwrap();
    drop(raw);

    let listed = store
        .find_tasks(
            &TaskFilter::default(),
            Page {
                skip: 0,
                limit: 10,
                oldest_first: true,
            },
        )
        .await
        .unwrap();
    assert_eq!(listed.len(), 3, "every task is listed");
    let bad = listed
        .iter()
        .find(|t| t.id == ids[1])
        .expect("the damaged task is listed");
    let problem = bad.problem.as_deref().expect("its problem is named");
    for named in [ids[1].to_hex().as_str(), "`status`", "`params`", "`stdout`"] {
        assert!(problem.contains(named), "{named} in {problem}");
    }
    assert_eq!(bad.status, disbatch::model::Task::UNREADABLE_STATUS);
    for good in [ids[0], ids[2]] {
        let t = listed.iter().find(|t| t.id == good).unwrap();
        assert!(t.problem.is_none(), "{:?}", t.problem);
        assert_eq!(t.status, -2);
    }
    let shown = store
        .task(ids[1])
        .await
        .unwrap()
        .expect("the damaged task is found by id");
    assert_eq!(shown.problem.as_deref(), Some(problem));
}
