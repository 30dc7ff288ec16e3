//! Hostile plugins and inputs through a running DEN: every case ends with a clear outcome
//! (status 2 with the reason in stderr, a capped or repaired output, or a queue skipped for
//! a stated reason), and the DEN goes on serving other queues.

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch::config::Gfs;
use disbatch::den::{Den, DenSettings};
use disbatch::runner::Sandbox;
use mongodb::Database;
use tokio_util::sync::CancellationToken;

const PLUGINS: [&str; 11] = [
    "demo",
    "fail",
    "spin",
    "alloc",
    "flood",
    "escape",
    "recurse",
    "badutf8",
    "panic",
    "wrongworld",
    "badimport",
];

/// A DEN over `db` with its own plugin directory: the built plugins plus `extra` files.
struct Fixture {
    db: Database,
    dir: tempfile::TempDir,
    shutdown: CancellationToken,
    handle: tokio::task::JoinHandle<()>,
}

impl Fixture {
    async fn start(hint: &str, extra_files: &[(&str, &[u8])], extra_allowed: &[&str]) -> Fixture {
        let t = common::test_db(hint).await;
        let dir = tempfile::tempdir().unwrap();
        for p in PLUGINS {
            std::fs::copy(common::plugin_path(p), dir.path().join(format!("{p}.wasm"))).unwrap();
        }
        for (name, bytes) in extra_files {
            std::fs::write(dir.path().join(name), bytes).unwrap();
        }
        let mut plugins: Vec<String> = PLUGINS.iter().map(|s| s.to_string()).collect();
        plugins.extend(extra_allowed.iter().map(|s| s.to_string()));
        let settings = DenSettings {
            node: format!("hostile-{hint}"),
            plugin_dir: dir.path().to_owned(),
            plugins,
            active_queues: vec![],
            ignore_queues: vec![],
            gfs: Gfs::Auto,
            heartbeat_stale: Duration::from_secs(30),
            orphan_claimed_after: Duration::from_secs(300),
            shutdown_grace: Duration::from_secs(5),
            stats_retention: disbatch::config::DEFAULT_STATS_RETENTION,
            retention: Default::default(),
            sandbox: Sandbox {
                timeout: Duration::from_secs(20),
                memory: 256 << 20,
                output_cap: 4 << 20,
                ..Sandbox::default()
            },
            tick: Duration::from_millis(100),
            max_instances: 32,
            protected: Vec::new(),
            balance: Default::default(),
        };
        let den = Den::new(Arc::new(t.store.clone()), common::shared_runner(), settings);
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { den.run(shutdown).await.expect("DEN failed") }
        });
        Fixture {
            db: t.db,
            dir,
            shutdown,
            handle,
        }
    }

    async fn queue(&self, name: &str, plugin: &str, extra: Document) -> ObjectId {
        let mut q = doc! {"name": name, "plugin": plugin, "threads": 2};
        q.extend(extra);
        self.db
            .collection::<Document>("queues")
            .insert_one(q)
            .await
            .unwrap()
            .inserted_id
            .as_object_id()
            .unwrap()
    }

    async fn task(&self, queue: ObjectId, params: impl Into<Bson>) -> ObjectId {
        let now = DateTime::now();
        self.db
            .collection::<Document>("tasks")
            .insert_one(
                doc! {"queue": queue, "status": -2, "node": Bson::Null, "params": params.into(),
                "ctime": now, "mtime": now, "stdout": Bson::Null, "stderr": Bson::Null},
            )
            .await
            .unwrap()
            .inserted_id
            .as_object_id()
            .unwrap()
    }

    async fn doc(&self, id: ObjectId) -> Document {
        self.db
            .collection::<Document>("tasks")
            .find_one(doc! {"_id": id})
            .await
            .unwrap()
            .unwrap()
    }

    /// Waits until the DEN reports a problem with `queue` in its node document; returns it.
    async fn problem_of(&self, queue: ObjectId) -> String {
        let start = Instant::now();
        loop {
            let nodes = common::find_docs(&self.db, "nodes", doc! {}).await;
            let found = nodes.iter().find_map(|n| {
                let problems = n.get_document("queue_problems").ok()?;
                problems.get_str(queue.to_hex()).ok().map(str::to_owned)
            });
            if let Some(problem) = found {
                return problem;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no problem reported for queue {queue}: {nodes:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the task finished and returns its document.
    async fn finished(&self, id: ObjectId) -> Document {
        let start = Instant::now();
        loop {
            let d = self.doc(id).await;
            if d.get_i32("status").unwrap_or(-2) > 0 {
                return d;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "task {id} did not finish: {d}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The DEN still serves: a fresh demo task on a fresh queue succeeds.
    async fn still_serving(&self) {
        let q = self
            .queue(&format!("canary-{}", ObjectId::new()), "demo", doc! {})
            .await;
        let id = self.task(q, doc! {"message": "still here"}).await;
        let d = self.finished(id).await;
        assert_eq!(d.get_i32("status").unwrap(), 1);
        assert_eq!(d.get_str("stdout").unwrap(), "still here\n");
    }

    /// Asserts a task stays queued while the DEN serves another queue for a few ticks.
    async fn stays_queued(&self, id: ObjectId) {
        self.still_serving().await;
        self.still_serving().await;
        let d = self.doc(id).await;
        assert_eq!(d.get_i32("status").unwrap(), -2, "{d}");
        assert_eq!(d.get("node"), Some(&Bson::Null));
    }

    fn plugin_dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.handle.abort();
    }
}

/// A task of `plugin` with `params` under the queue's `sandbox` fails with `reason`.
macro_rules! fails_with {
    ($name:ident, $plugin:expr, $params:expr, $sandbox:expr, $reason:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $name() {
            let f = Fixture::start(stringify!($name), &[], &[]).await;
            let q = f.queue("q", $plugin, doc! {"sandbox": $sandbox}).await;
            let id = f.task(q, $params).await;
            let d = f.finished(id).await;
            assert_eq!(d.get_i32("status").unwrap(), 2, "{d}");
            let stderr = d.get_str("stderr").unwrap();
            assert!(
                stderr.contains($reason),
                "expected {:?} in stderr: {stderr}",
                $reason
            );
            f.still_serving().await;
        }
    };
}

fails_with!(
    infinite_loop_times_out,
    "spin",
    doc! {},
    doc! {"timeout": "300ms"},
    "[disbatch: timeout: plugin still running after 300ms]"
);
fails_with!(
    sleeping_past_the_timeout_times_out,
    "demo",
    doc! {"sleep_ms": 600_000},
    doc! {"timeout": 0.3},
    "timeout: plugin still running after 300ms"
);
fails_with!(
    unbounded_recursion_is_a_trap,
    "recurse",
    doc! {},
    doc! {},
    "[disbatch: trap: wasm trap: out of bounds memory access"
);
fails_with!(
    memory_bomb_hits_the_limit,
    "alloc",
    doc! {"mib": 1024},
    doc! {"memory_mib": 32},
    "memory limit"
);
fails_with!(
    a_panic_is_a_trap_with_its_message,
    "panic",
    doc! {"message": "kaboom"},
    doc! {},
    "kaboom"
);
fails_with!(a_panic_says_trap, "panic", doc! {}, doc! {}, "[disbatch: trap: ");
fails_with!(
    status_zero_is_refused,
    "demo",
    doc! {"status": 0},
    doc! {},
    "plugin returned status 0; a finished task's status must be positive"
);
fails_with!(
    plugin_error_is_reported,
    "fail",
    doc! {"message": "no route"},
    doc! {},
    "[disbatch: plugin error: no route]"
);
fails_with!(
    params_of_the_wrong_shape_are_refused_by_the_plugin,
    "demo",
    doc! {"repeat": "many"},
    doc! {},
    "invalid params"
);
fails_with!(
    unknown_params_are_refused_by_a_strict_plugin,
    "demo",
    doc! {"mesage": "typo"},
    doc! {},
    "unknown field `mesage`"
);
fails_with!(
    params_that_are_an_array_fail_the_task,
    "demo",
    Bson::Array(vec![Bson::Int32(1)]),
    doc! {},
    "params"
);
fails_with!(
    params_that_are_a_string_fail_the_task,
    "demo",
    Bson::String("hello".into()),
    doc! {},
    "params"
);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stdout_flood_is_capped_with_a_marker() {
    let f = Fixture::start("flood_out", &[], &[]).await;
    let q = f.queue("q", "flood", doc! {"sandbox": {"output_cap_mib": 1}}).await;
    let id = f.task(q, doc! {"mib": 16}).await;
    let d = f.finished(id).await;
    assert_eq!(d.get_i32("status").unwrap(), 1, "printing a lot is not a failure");
    let out = d.get_str("stdout").unwrap();
    assert!(out.ends_with("[disbatch: output truncated at 1 MiB (1048576 bytes); 15728640 more bytes were dropped]\n"));
    f.still_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flood_on_both_streams_is_capped_on_both() {
    let f = Fixture::start("flood_both", &[], &[]).await;
    let q = f.queue("q", "flood", doc! {"sandbox": {"output_cap_mib": 1}}).await;
    let id = f.task(q, doc! {"mib": 4, "stderr": true}).await;
    let d = f.finished(id).await;
    assert_eq!(d.get_i32("status").unwrap(), 1);
    assert!(d.get_str("stdout").unwrap().contains("3145728 more bytes were dropped"));
    assert!(d.get_str("stderr").unwrap().contains("3145728 more bytes were dropped"));
    f.still_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn invalid_utf8_output_is_replaced_and_said_so() {
    let f = Fixture::start("badutf8", &[], &[]).await;
    let q = f.queue("q", "badutf8", doc! {}).await;
    let id = f.task(q, doc! {}).await;
    let d = f.finished(id).await;
    assert_eq!(d.get_i32("status").unwrap(), 1);
    assert_eq!(d.get_str("stdout").unwrap(), "before \u{fffd}\u{fffd} after\n");
    let err = d.get_str("stderr").unwrap();
    assert!(err.starts_with("err \u{fffd}( end\n"), "{err}");
    assert!(err.contains("[disbatch: invalid UTF-8 in stdout was replaced with U+FFFD]"));
    assert!(err.contains("[disbatch: invalid UTF-8 in stderr was replaced with U+FFFD]"));
    f.still_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn huge_params_run_and_large_output_moves_to_gridfs() {
    let f = Fixture::start("huge_params", &[], &[]).await;
    let q = f.queue("q", "demo", doc! {"sandbox": {"output_cap_mib": 32}}).await;
    let message = "p".repeat(15 * 1024 * 1024);
    let id = f.task(q, doc! {"message": &message}).await;
    let d = f.finished(id).await;
    assert_eq!(
        d.get_i32("status").unwrap(),
        1,
        "{}",
        d.get_str("stderr").unwrap_or_default()
    );
    // params take the document's room: the 15 MiB echo goes to a GridFS file.
    let file = d.get_object_id("stdout").expect("stdout stored as a GridFS file");
    let store = disbatch::store::mongo::MongoStore::from_database(f.db.clone());
    let text = disbatch::store::Store::read_output(&store, &disbatch::model::Output::File(file))
        .await
        .unwrap();
    assert_eq!(text.len(), message.len() + 1);
    f.still_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn escape_cannot_read_files_env_or_network() {
    let f = Fixture::start("escape", &[], &[]).await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let q = f.queue("q", "escape", doc! {}).await;
    let id = f
        .task(q, doc! {"read": ["/etc/passwd", "/proc/self/environ", "../../etc/passwd"], "write": ["/tmp/x"], "connect": &addr})
        .await;
    let d = f.finished(id).await;
    assert_eq!(d.get_i32("status").unwrap(), 1);
    let report: serde_json::Value = serde_json::from_str(d.get_str("stdout").unwrap()).unwrap();
    for (path, result) in report["read"].as_object().unwrap() {
        assert!(result.as_str().unwrap().starts_with("err:"), "{path}: {result}");
    }
    assert!(report["write"]["/tmp/x"].as_str().unwrap().starts_with("err:"));
    assert_eq!(report["env"], serde_json::json!({}));
    assert!(report["connect"].as_str().unwrap().starts_with("err:"));
    listener.set_nonblocking(true).unwrap();
    assert!(listener.accept().is_err());
    f.still_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn granted_directories_are_the_only_ones_visible() {
    let f = Fixture::start("grants", &[], &[]).await;
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("in.txt"), "granted").unwrap();
    let grant = format!("{}:/data", data.path().display());
    let q = f
        .queue(
            "q",
            "escape",
            doc! {"sandbox": {"dirs": [grant], "env": {"MODE": "prod"}}},
        )
        .await;
    let id = f
        .task(
            q,
            doc! {"read": ["/data/in.txt", "/data/../etc/passwd"], "write": ["/data/new.txt"]},
        )
        .await;
    let d = f.finished(id).await;
    let report: serde_json::Value = serde_json::from_str(d.get_str("stdout").unwrap()).unwrap();
    assert_eq!(report["read"]["/data/in.txt"], "ok: granted");
    assert!(report["read"]["/data/../etc/passwd"]
        .as_str()
        .unwrap()
        .starts_with("err:"));
    assert!(
        report["write"]["/data/new.txt"].as_str().unwrap().starts_with("err:"),
        "read-only by default"
    );
    assert_eq!(report["env"], serde_json::json!({"MODE": "prod"}));
    f.still_serving().await;
}

/// A queue whose plugin is `plugin` (with these plugin files present) is skipped; with a
/// `reason`, the DEN reports it in its node document's `queue_problems` (which the API
/// shows as the queue's `problems`).
macro_rules! queue_skipped {
    ($name:ident, $plugin:expr, $files:expr, $allowed:expr, $extra:expr) => {
        queue_skipped!($name, $plugin, $files, $allowed, $extra, None);
    };
    ($name:ident, $plugin:expr, $files:expr, $allowed:expr, $extra:expr, $reason:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $name() {
            let files: &[(&str, &[u8])] = $files;
            let f = Fixture::start(stringify!($name), files, $allowed).await;
            let q = f.queue("skipped", $plugin, $extra).await;
            let id = f.task(q, doc! {}).await;
            f.stays_queued(id).await;
            let reason: Option<&str> = $reason;
            if let Some(reason) = reason {
                let problem = f.problem_of(q).await;
                assert!(
                    problem.contains(reason),
                    "expected {reason:?} in the reported problem {problem:?}"
                );
            }
        }
    };
}

queue_skipped!(
    a_text_file_is_not_a_plugin,
    "notes",
    &[("notes.wasm", b"just text")],
    &["notes"],
    doc! {},
    Some("not a WebAssembly file")
);
queue_skipped!(
    a_core_module_is_not_a_plugin,
    "core",
    &[("core.wasm", b"\0asm\x01\0\0\0")],
    &["core"],
    doc! {},
    Some("core WebAssembly module")
);
queue_skipped!(
    a_truncated_component_is_not_a_plugin,
    "cut",
    &[("cut.wasm", b"\0asm\x0d\0\x01\0\x01")],
    &["cut"],
    doc! {},
    Some("not a valid component")
);
queue_skipped!(
    a_component_of_another_world_is_refused,
    "wrongworld",
    &[],
    &[],
    doc! {},
    Some("does not implement the disbatch:plugin/plugin world")
);
queue_skipped!(
    a_component_importing_unknown_interfaces_is_refused,
    "badimport",
    &[],
    &[],
    doc! {},
    Some("imports something the host does not provide")
);
queue_skipped!(
    a_plugin_outside_the_allowlist_is_refused,
    "secret",
    &[("secret.wasm", b"")],
    &[],
    doc! {},
    Some("is not in the plugins allowlist")
);
queue_skipped!(
    path_traversal_in_plugin_names_is_refused,
    "../demo",
    &[],
    &["../demo"],
    doc! {}
);
queue_skipped!(absolute_plugin_names_are_refused, "/bin/sh", &[], &["/bin/sh"], doc! {});
queue_skipped!(
    an_allowed_plugin_without_a_file_is_refused,
    "ghost",
    &[],
    &["ghost"],
    doc! {},
    Some("plugin \"ghost\" is not loadable: ")
);
queue_skipped!(
    an_invalid_queue_sandbox_skips_the_queue,
    "demo",
    &[],
    &[],
    doc! {"sandbox": {"memory_mib": 999_999}},
    Some("sandbox: memory")
);
queue_skipped!(
    a_granted_directory_that_does_not_exist_skips_the_queue,
    "demo",
    &[],
    &[],
    doc! {"sandbox": {"dirs": ["/no/such/dir"]}},
    Some("/no/such/dir")
);
queue_skipped!(
    unknown_sandbox_keys_skip_the_queue,
    "demo",
    &[],
    &[],
    doc! {"sandbox": {"memroy_mib": 1}}
);
queue_skipped!(
    threads_of_the_wrong_type_skip_the_queue,
    "demo",
    &[],
    &[],
    doc! {"threads": "many"}
);
queue_skipped!(negative_threads_pause_the_queue, "demo", &[], &[], doc! {"threads": -3});

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plugin_file_that_disappears_stops_new_tasks_only() {
    let f = Fixture::start("disappears", &[], &[]).await;
    let q = f.queue("vanish", "demo", doc! {"threads": 1}).await;
    let running = f.task(q, doc! {"sleep_ms": 1500, "message": "finished anyway"}).await;
    let start = Instant::now();
    while f.doc(running).await.get_i32("status").unwrap() != 0 {
        assert!(start.elapsed() < Duration::from_secs(20));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    std::fs::remove_file(f.plugin_dir().join("demo.wasm")).unwrap();
    let waiting = f.task(q, doc! {}).await;
    let d = f.finished(running).await;
    assert_eq!(
        d.get_i32("status").unwrap(),
        1,
        "the running task keeps its loaded plugin"
    );
    assert_eq!(d.get_str("stdout").unwrap(), "finished anyway\n");
    // Without its file the queue is skipped: the next task waits.
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(800) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(f.doc(waiting).await.get_i32("status").unwrap(), -2);
    // Put the file back: the queue runs again.
    std::fs::copy(common::plugin_path("demo"), f.plugin_dir().join("demo.wasm")).unwrap();
    assert_eq!(f.finished(waiting).await.get_i32("status").unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queue_with_an_unknown_sort_still_runs() {
    let f = Fixture::start("badsort", &[], &[]).await;
    let q = f.queue("q", "demo", doc! {"sort": "random"}).await;
    let id = f.task(q, doc! {}).await;
    assert_eq!(f.finished(id).await.get_i32("status").unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tasks_with_held_or_odd_statuses_are_left_alone() {
    let f = Fixture::start("odd_status", &[], &[]).await;
    let q = f.queue("q", "demo", doc! {}).await;
    let now = DateTime::now();
    let odd =
        f.db.collection::<Document>("tasks")
            .insert_one(doc! {"queue": q, "status": "-2", "node": Bson::Null, "params": {}, "ctime": now, "mtime": now})
            .await
            .unwrap()
            .inserted_id
            .as_object_id()
            .unwrap();
    f.still_serving().await;
    f.still_serving().await;
    assert_eq!(
        f.doc(odd).await.get_str("status").unwrap(),
        "-2",
        "a string status is not the spec's -2"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queue_granting_the_plugin_directory_is_refused_and_says_why() {
    let f = Fixture::start("grant_plugins", &[], &[]).await;
    let grant = format!("{}:/plugins:rw", f.plugin_dir().display());
    let q = f
        .queue("overreach", "demo", doc! {"threads": 1, "sandbox": {"dirs": [grant]}})
        .await;
    let id = f.task(q, doc! {}).await;
    f.stays_queued(id).await;
    let problem = f.problem_of(q).await;
    assert!(problem.contains("protected host path"), "{problem}");
    assert!(problem.contains(&f.plugin_dir().display().to_string()), "{problem}");
    // A grant beside it is fine.
    let other = tempfile::tempdir().unwrap();
    let q = f
        .queue(
            "beside",
            "demo",
            doc! {"threads": 1, "sandbox": {"dirs": [other.path().display().to_string()]}},
        )
        .await;
    let id = f.task(q, doc! {}).await;
    assert_eq!(f.finished(id).await.get_i32("status").unwrap(), 1);
}
