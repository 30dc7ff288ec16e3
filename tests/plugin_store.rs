//! Plugins kept in the store: pushed once through the API or the CLI, run by DENs whose
//! plugin directory is empty, on MongoDB and on the embedded store; fetched by digest,
//! verified, cached; a tampered cache entry or stored bytes that do not match their
//! digest are never run.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use bson::doc;
use common::web::{stderr, Web};
use common::{plugins::plugin_path, test_db, wait_for, DenProcess, TestDb};
use serde_json::{json, Value};

const LIMIT: Duration = Duration::from_secs(60);

/// Where the scenario runs: the DCI and DENs of one database.
enum Db {
    Mongo(TestDb),
    Embedded(PathBuf),
}

struct Setup {
    db: Db,
    web: Web,
    /// An empty plugin directory, for the DCI and every DEN.
    empty: tempfile::TempDir,
    work: tempfile::TempDir,
}

impl Setup {
    async fn new(embedded: bool) -> Setup {
        let work = tempfile::tempdir().unwrap();
        let empty = tempfile::tempdir().unwrap();
        let config = json!({"plugins": ["hello"], "plugin_dir": empty.path()});
        if embedded {
            let file = work.path().join("store.db");
            let path = work.path().join("web.json");
            std::fs::write(&path, config.to_string()).unwrap();
            let web = Web::start_embedded(&file, &["--config", path.to_str().unwrap()]);
            Setup {
                db: Db::Embedded(file),
                web,
                empty,
                work,
            }
        } else {
            let db = test_db("plugin_store").await;
            let web = Web::start(&db.uri, &db.name, config);
            Setup {
                db: Db::Mongo(db),
                web,
                empty,
                work,
            }
        }
    }

    /// A DEN as `node` with its own cache directory `cache`, allowed `hello` only, with an
    /// empty plugin directory.
    fn den(&self, node: &str, cache: &Path) -> DenProcess {
        let extra = json!({"plugins": ["hello"], "plugin_dir": self.empty.path(), "cache_dir": cache});
        match &self.db {
            Db::Mongo(db) => DenProcess::start(&db.uri, &db.name, node, extra),
            Db::Embedded(file) => DenProcess::start_embedded(file, node, extra),
        }
    }

    fn cache(&self, name: &str) -> PathBuf {
        self.work.path().join(name)
    }

    fn api(&self, path: &str) -> String {
        format!("{}{path}", self.web.url)
    }

    async fn get(&self, path: &str) -> Value {
        reqwest::get(self.api(path)).await.unwrap().json().await.unwrap()
    }

    /// Creates one task on `queue`; returns its id.
    async fn task(&self, queue: &str, message: &str) -> String {
        let v = self.web.json(&["create-task", queue, "message", message]);
        v["ids"][0].as_str().unwrap().to_owned()
    }

    /// Waits until task `id` has ended; returns it with its output.
    async fn ended(&self, id: &str) -> Value {
        let path = format!("/tasks/{id}");
        wait_for(LIMIT, &format!("task {id} to end"), || async {
            self.get(&path).await["status"].as_i64().is_some_and(|s| s > 0)
        })
        .await;
        self.get(&path).await
    }

    /// Replaces the stored bytes of version `sha` of `name` with `with`.
    async fn tamper_store(&self, name: &str, sha: &str, with: &[u8]) {
        match &self.db {
            Db::Mongo(db) => {
                let files = db.db.collection::<bson::Document>("plugins.files");
                let chunks = db.db.collection::<bson::Document>("plugins.chunks");
                let file = files
                    .find_one(doc! {"filename": name, "metadata.sha256": sha})
                    .await
                    .unwrap()
                    .unwrap();
                let id = file.get_object_id("_id").unwrap();
                chunks.delete_many(doc! {"files_id": id}).await.unwrap();
                let data = bson::Binary {
                    subtype: bson::spec::BinarySubtype::Generic,
                    bytes: with.to_vec(),
                };
                chunks
                    .insert_one(doc! {"files_id": id, "n": 0, "data": data})
                    .await
                    .unwrap();
                files
                    .update_one(doc! {"_id": id}, doc! {"$set": {"length": with.len() as i64}})
                    .await
                    .unwrap();
            }
            Db::Embedded(file) => {
                let conn = rusqlite::Connection::open(file).unwrap();
                conn.busy_timeout(Duration::from_secs(10)).unwrap();
                conn.execute(
                    "UPDATE plugins SET bytes = ?1, size = ?2 WHERE name = ?3 AND sha256 = ?4",
                    rusqlite::params![with, with.len() as i64, name, sha],
                )
                .unwrap();
            }
        }
    }
}

fn sha256(bytes: &[u8]) -> String {
    disbatch::store::plugins::digest(bytes)
}

/// The whole life of a pushed plugin on one store.
async fn pushed_plugin_runs_everywhere(embedded: bool) {
    let s = Setup::new(embedded).await;
    let demo = std::fs::read(plugin_path("demo")).unwrap();
    let fail = std::fs::read(plugin_path("fail")).unwrap();
    let demo_file = plugin_path("demo");

    // Pushed with the CLI under another name than its file's.
    let out = s
        .web
        .run(&["push-plugin", demo_file.to_str().unwrap(), "--name", "hello"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        shown.starts_with(&format!("pushed hello@sha256:{}", sha256(&demo))),
        "{shown}"
    );
    let list = s.get("/plugins?full=1").await;
    assert_eq!(list[0]["name"], "hello");
    assert_eq!(list[0]["sha256"], sha256(&demo));
    assert_eq!(list[0]["size"], demo.len());
    assert_eq!(list[0]["source"], "store");
    assert_eq!(list[0]["wit"], "0.2.0");
    assert!(
        list[0]["uploaded_by"].as_str().is_some_and(|u| u.contains('@')),
        "{list}"
    );
    assert_eq!(s.get("/plugins").await, json!(["hello"]));

    s.web.ok(&["create-queue", "hello", "hello", "--threads", "2"]);
    let first = s.task("hello", "from the store").await;

    // A DEN with an empty plugin directory fetches, verifies, caches and runs it.
    let cache_a = s.cache("cache-a");
    let a = s.den("node-a", &cache_a);
    let t = s.ended(&first).await;
    assert_eq!(t["status"], 1, "{t}\n{}", a.log());
    assert_eq!(t["stdout"], "from the store\n", "{t}");
    assert_eq!(t["node"], "node-a");
    let cached = cache_a.join("fetched").join(format!("{}.wasm", sha256(&demo)));
    assert_eq!(
        std::fs::read(&cached).unwrap(),
        demo,
        "the fetched component is cached by digest"
    );

    // A second node fetches the same digest for itself.
    drop(a);
    let cache_b = s.cache("cache-b");
    let b = s.den("node-b", &cache_b);
    let second = s.task("hello", "on node b").await;
    let t = s.ended(&second).await;
    assert_eq!(
        (t["status"].as_i64(), t["node"].as_str()),
        (Some(1), Some("node-b")),
        "{t}"
    );
    assert!(b.log().contains("fetched a plugin from the store"), "{}", b.log());
    drop(b);

    // A cache entry swapped for another valid component is discarded, never run.
    std::fs::write(&cached, &fail).unwrap();
    let a = s.den("node-a", &cache_a);
    let third = s.task("hello", "not the tampered one").await;
    let t = s.ended(&third).await;
    assert_eq!(t["status"], 1, "{t}\n{}", a.log());
    assert_eq!(t["stdout"], "not the tampered one\n");
    assert!(a.log().contains("does not match its digest: discarded"), "{}", a.log());
    assert_eq!(std::fs::read(&cached).unwrap(), demo, "fetched again");
    drop(a);

    // A newer version is what an unpinned queue runs; a pinned queue keeps its version.
    let pin = format!("hello@sha256:{}", sha256(&demo));
    s.web.ok(&["create-queue", "pinned", &pin, "--threads", "1"]);
    let fail_file = s.work.path().join("fail.wasm");
    std::fs::write(&fail_file, &fail).unwrap();
    s.web
        .ok(&["push-plugin", fail_file.to_str().unwrap(), "--name", "hello"]);
    let versions = s.get("/plugins/hello").await;
    let digests: Vec<&str> = versions["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["sha256"].as_str().unwrap())
        .collect();
    assert_eq!(digests, [sha256(&fail), sha256(&demo)], "newest first");
    let a = s.den("node-a", &cache_a);
    let newest = s.task("hello", "x").await;
    let pinned = s.task("pinned", "pinned run").await;
    assert_eq!(s.ended(&newest).await["status"], 2, "{}", a.log());
    let t = s.ended(&pinned).await;
    assert_eq!(
        (t["status"].as_i64(), t["stdout"].as_str()),
        (Some(1), Some("pinned run\n"))
    );
    drop(a);

    // Stored bytes that do not match their digest are refused: the queue is skipped with
    // the reason, its task stays queued.
    s.tamper_store("hello", &sha256(&fail), &demo).await;
    let c = s.den("node-c", &s.cache("cache-c"));
    let refused = s.task("hello", "never").await;
    wait_for(LIMIT, "the refusal to be reported", || async {
        let q = s.get("/queues/hello").await;
        q["problems"].to_string().contains("do not match its digest")
    })
    .await;
    let t = s.get(&format!("/tasks/{refused}")).await;
    assert_eq!(t["status"], -2, "{t}");
    assert!(!s
        .cache("cache-c")
        .join("fetched")
        .join(format!("{}.wasm", sha256(&fail)))
        .exists());
    drop(c);

    // Deleted: the name is gone from the store.
    let gone = s.web.ok(&["delete-plugin", "hello"]);
    assert_eq!(gone, "deleted 2 stored versions of plugin hello\n");
    let out = s.web.run(&["plugin-versions", "hello"]);
    assert!(
        stderr(&out).contains("no plugin \"hello\" in the store"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushed_plugin_runs_on_mongodb() {
    pushed_plugin_runs_everywhere(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushed_plugin_runs_on_the_embedded_store() {
    pushed_plugin_runs_everywhere(true).await;
}

/// Two DENs on different nodes run one pushed digest at the same time; the upload's time
/// to the first task run on the second node is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_run_one_pushed_digest() {
    let s = Setup::new(false).await;
    s.web.ok(&["create-queue", "hello", "hello", "--threads", "4"]);
    let a = s.den("node-a", &s.cache("a"));
    let b = s.den("node-b", &s.cache("b"));
    let demo_file = plugin_path("demo");
    let pushed_at = std::time::Instant::now();
    s.web
        .ok(&["push-plugin", demo_file.to_str().unwrap(), "--name", "hello"]);
    let ids: Vec<String> = {
        let body = json!((0..20).map(|i| json!({"message": format!("m{i}")})).collect::<Vec<_>>());
        let v = s.web.json(&["create-tasks", "hello", &body.to_string()]);
        v["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_str().unwrap().to_owned())
            .collect()
    };
    let mut nodes = std::collections::BTreeSet::new();
    for id in &ids {
        let t = s.ended(id).await;
        assert_eq!(t["status"], 1, "{t}\n{}\n{}", a.log(), b.log());
        nodes.insert(t["node"].as_str().unwrap().to_owned());
    }
    println!(
        "upload to every task ended on two fresh nodes: {:?}; nodes used: {nodes:?}",
        pushed_at.elapsed()
    );
    // Each DEN fetches the pushed version at its first full pass after the push, which
    // may come after the other one ran every task.
    for den in [&a, &b] {
        den.wait_for_log(LIMIT, "fetched a plugin from the store").await;
    }
}
