//! A Disbatch 4 installation moving over: its config file loads as it is, its `web_root`
//! is served, and Disbatch 4 DENs (emulated here with the plain driver, writing what the
//! Perl `disbatchd` and `task_runner` write) share the database with a real `den`: their
//! tasks count against `threads`, their running tasks are left to their task runners, and
//! a node name a Disbatch 4 DEN's task runners still use is not taken.

use crate::common;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::http::{Method, StatusCode};
use bson::{doc, Bson, DateTime, Document};
use common::http::{get, send, setup};
use common::{count_tasks as count, insert_queue, insert_tasks, wait_for, DenProcess};
use disbatch::config::Config;
use disbatch::launch::StoreArgs;
use mongodb::Database;

#[test]
fn a_disbatch4_config_file_loads_as_it_is() {
    let path = Path::new("tests/fixtures/config/disbatch4.json");
    let c = Config::load_with_env(path, &|_| None).unwrap();
    assert_eq!(c.database, "disbatch");
    assert!(c.mongohost.contains("replicaSet=rs0"), "{}", c.mongohost);
    assert!(c.tls.enabled);
    assert_eq!(
        c.tls.ca_file.as_deref(),
        Some(Path::new("tests/fixtures/config/ca.pem"))
    );
    assert_eq!(
        c.auth.passwords.get("disbatchd").map(String::as_str),
        Some("den-secret")
    );
    assert_eq!(c.plugins, ["demo"]);
    assert!(c.monitoring);
    assert_eq!(c.web_root.as_deref(), Some(Path::new("/etc/disbatch/htdocs/")));
    // The Perl-only keys are reported, never fatal.
    for key in ["log4perl", "views_dir", "task_runner"] {
        assert!(c.warnings.iter().any(|w| w.contains(key)), "{key}: {:?}", c.warnings);
    }
    // As `den` and `disbatch web` load it: a web_root that is not there (a DEN-only host)
    // is a warning.
    let args = StoreArgs {
        config: Some(path.to_owned()),
        ..StoreArgs::default()
    };
    let c = args.load_config().unwrap();
    assert!(c.warnings.iter().any(|w| w.contains("web_root")), "{:?}", c.warnings);
}

#[tokio::test]
async fn web_root_files_are_served_at_their_paths() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("css")).unwrap();
    std::fs::write(root.path().join("css/style.css"), "body { color: red }").unwrap();
    std::fs::write(root.path().join("index.html"), "<p>old ui</p>").unwrap();
    std::fs::write(root.path().join("queues"), "a file named like a route").unwrap();
    std::fs::write(root.path().join(".htpasswd"), "secret").unwrap();
    std::fs::create_dir_all(root.path().join(".git")).unwrap();
    std::fs::write(root.path().join(".git/config"), "secret").unwrap();
    let outside = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(outside.path(), "secret").unwrap();
    let dir = root.path().to_owned();
    let (_db, app) = setup("web_root", move |s| s.web_root = Some(dir)).await;

    let css = get(&app, "/css/style.css").await;
    assert_eq!(css.status, StatusCode::OK);
    assert_eq!(css.text, "body { color: red }");
    assert!(css.headers["content-type"].to_str().unwrap().starts_with("text/css"));
    assert_eq!(get(&app, "/index.html").await.text, "<p>old ui</p>");
    // The API and the built-in UI come first.
    assert!(get(&app, "/queues").await.json().is_array());
    assert!(get(&app, "/").await.text.contains("<html") || get(&app, "/").await.text.contains("<!doctype"));
    // Nothing outside the directory, no listing, no other method.
    let name = outside.path().file_name().unwrap().to_string_lossy().into_owned();
    for path in [
        format!("/../{name}"),
        format!("/css/../../{name}"),
        "/css/".into(),
        "/css".into(),
        "/.htpasswd".into(),
        "/%2ehtpasswd".into(),
        "/.git/config".into(),
    ] {
        let r = get(&app, &path).await;
        assert!(
            r.status == StatusCode::NOT_FOUND || r.status == StatusCode::BAD_REQUEST,
            "{path}: {} {}",
            r.status,
            r.text
        );
        assert!(!r.text.contains("secret"), "{path}");
    }
    let r = send(&app, Method::POST, "/css/style.css", Some("{}"), None).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    assert!(r.error().contains("no route"), "{}", r.text);
}

#[test]
fn a_web_root_holding_the_hosts_own_files_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    let write = |web_root: &Path| {
        let text = serde_json::json!({
            "mongohost": "mongodb://127.0.0.1:1", "database": "d", "web_root": web_root,
            "plugin_dir": dir.path().join("plugins"), "cache_dir": dir.path().join("cache"),
        });
        std::fs::write(&config, text.to_string()).unwrap();
    };
    let args = StoreArgs {
        config: Some(config.clone()),
        ..StoreArgs::default()
    };
    // The directory of the config file itself.
    write(dir.path());
    let e = args.load_config().unwrap_err();
    assert!(
        e.to_string().contains("web_root") && e.to_string().contains("config.json"),
        "{e}"
    );
    // Inside the plugin directory.
    std::fs::create_dir_all(dir.path().join("plugins/www")).unwrap();
    write(&dir.path().join("plugins/www"));
    let e = args.load_config().unwrap_err();
    assert!(e.to_string().contains("plugins"), "{e}");
    // A directory of its own is fine.
    std::fs::create_dir_all(dir.path().join("htdocs")).unwrap();
    write(&dir.path().join("htdocs"));
    args.load_config().unwrap();
}

// ---- Disbatch 4 DENs on the same database --------------------------------------------

/// Tasks of `queue` claimed or running on `node`.
async fn running_on(db: &Database, queue: bson::oid::ObjectId, node: &str) -> u64 {
    count(db, doc! {"queue": queue, "node": node, "status": {"$in": [-1, 0]}}).await
}

/// Writes a node document as Disbatch 4's `disbatchd` does: `{node, timestamp}`, no
/// process marker.
async fn perl_heartbeat(db: &Database, node: &str, at: DateTime) {
    db.collection::<Document>("nodes")
        .update_one(doc! {"node": node}, doc! {"$set": {"node": node, "timestamp": at}})
        .upsert(true)
        .await
        .unwrap();
}

/// A task as a Disbatch 4 DEN leaves it while its task runner works on it.
fn perl_task(queue: bson::oid::ObjectId, node: &str, status: i32, mtime: DateTime) -> Document {
    doc! {"queue": queue, "status": status, "node": node, "params": {"perl": true},
    "ctime": mtime, "mtime": mtime, "stdout": Bson::Null, "stderr": Bson::Null}
}

/// [`wait_for`] that shows the DEN's log (at `log`) when it times out.
async fn wait_for_or<F, Fut>(limit: Duration, what: &str, log: &Path, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = std::time::Instant::now();
    while !cond().await {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}; the den's log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes a task's result as Disbatch 4's `task_runner` does.
async fn runner_finishes(tasks: &mongodb::Collection<Document>, id: bson::oid::ObjectId) {
    tasks
        .update_one(doc! {"_id": id}, doc! {"$set": {"status": 1, "stdout": "done"}})
        .await
        .unwrap();
}

fn minutes_ago(m: i64) -> DateTime {
    DateTime::from_millis(DateTime::now().timestamp_millis() - m * 60_000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tasks_a_disbatch4_den_runs_count_against_threads() {
    let t = common::test_db("perl_mixed_threads").await;
    let q = insert_queue(&t.db, "mixed", "demo", doc! {"threads": 3}).await;
    perl_heartbeat(&t.db, "perl-den", DateTime::now()).await;
    // A name one of our DENs held before a Disbatch 4 DEN took it back (a rollback): it
    // rewrites the whole document it reads with a new `timestamp`.
    let nodes = t.db.collection::<Document>("nodes");
    let before = minutes_ago(1);
    nodes
        .insert_one(doc! {"node": "perl-back", "process": Bson::Null, "timestamp": before, "beat": before, "maxthreads": Bson::Null})
        .await
        .unwrap();
    let mut whole = nodes.find_one(doc! {"node": "perl-back"}).await.unwrap().unwrap();
    whole.insert("timestamp", DateTime::now());
    nodes
        .update_one(doc! {"node": "perl-back"}, doc! {"$set": whole})
        .await
        .unwrap();
    let perl: Vec<bson::oid::ObjectId> = {
        let docs = vec![
            perl_task(q, "perl-den", 0, DateTime::now()),
            perl_task(q, "perl-back", 0, DateTime::now()),
        ];
        let r = t.db.collection::<Document>("tasks").insert_many(docs).await.unwrap();
        r.inserted_ids.values().map(|v| v.as_object_id().unwrap()).collect()
    };
    insert_tasks(
        &t.db,
        q,
        (0..40).map(|i| doc! {"message": format!("t{i}"), "sleep_ms": 150}),
    )
    .await;
    let den = DenProcess::start(&t.uri, &t.name, "rust-den", serde_json::json!({}));

    // While the Disbatch 4 DEN runs two, ours runs one at a time: never more than 3 in all.
    let peak = AtomicU64::new(0);
    let log = den.log_path();
    wait_for_or(
        Duration::from_secs(60),
        "the den to finish 5 tasks beside the Perl ones",
        &log,
        || {
            let (db, peak) = (&t.db, &peak);
            async move {
                peak.fetch_max(running_on(db, q, "rust-den").await, Ordering::SeqCst);
                count(db, doc! {"queue": q, "node": "rust-den", "status": 1}).await >= 5
            }
        },
    )
    .await;
    assert_eq!(
        peak.load(Ordering::SeqCst),
        1,
        "the Perl DEN's 2 running tasks leave 1 of 3 threads:\n{}",
        den.log()
    );

    // Once they finish, ours uses all 3.
    let tasks = t.db.collection::<Document>("tasks");
    tasks
        .update_many(
            doc! {"_id": {"$in": &perl}},
            doc! {"$set": {"status": 1, "mtime": DateTime::now()}},
        )
        .await
        .unwrap();
    wait_for(Duration::from_secs(60), "the den to run 3 at once", || async {
        running_on(&t.db, q, "rust-den").await == 3
    })
    .await;

    // When the Disbatch 4 DEN takes two again, ours gives slots back as its tasks end.
    tasks
        .insert_many(vec![
            perl_task(q, "perl-den", 0, DateTime::now()),
            perl_task(q, "perl-den", 0, DateTime::now()),
        ])
        .await
        .unwrap();
    wait_for(Duration::from_secs(60), "the den to come down to 1", || async {
        running_on(&t.db, q, "rust-den").await <= 1
    })
    .await;
    let finished = count(&t.db, doc! {"queue": q, "node": "rust-den", "status": 1}).await;
    let peak = AtomicU64::new(0);
    wait_for(Duration::from_secs(60), "5 more tasks", || {
        let (db, peak) = (&t.db, &peak);
        async move {
            peak.fetch_max(running_on(db, q, "rust-den").await, Ordering::SeqCst);
            count(db, doc! {"queue": q, "node": "rust-den", "status": 1}).await >= finished + 5
        }
    })
    .await;
    assert_eq!(peak.load(Ordering::SeqCst), 1, "{}", den.log());
    drop(den);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_disbatch4_dens_running_tasks_are_left_to_its_task_runners() {
    let t = common::test_db("perl_mixed_recovery").await;
    let q = insert_queue(&t.db, "mixed", "demo", doc! {"threads": 2}).await;
    // A Disbatch 4 node that stopped heartbeating ten minutes ago (disbatchd restarted or
    // retired; its task runners may still be at work), and one of ours that died.
    perl_heartbeat(&t.db, "perl-old", minutes_ago(10)).await;
    t.db.collection::<Document>("nodes")
        .insert_one(
            doc! {"node": "rust-old", "timestamp": minutes_ago(10), "process": Bson::Null, "maxthreads": Bson::Null},
        )
        .await
        .unwrap();
    let tasks = t.db.collection::<Document>("tasks");
    let insert = |d: Document| {
        let tasks = tasks.clone();
        async move { tasks.insert_one(d).await.unwrap().inserted_id.as_object_id().unwrap() }
    };
    let perl_running = insert(perl_task(q, "perl-old", 0, minutes_ago(10))).await;
    let perl_claimed = insert(perl_task(q, "perl-old", -1, minutes_ago(10))).await;
    let ours_running = insert(perl_task(q, "rust-old", 0, minutes_ago(10))).await;

    let den = DenProcess::start(&t.uri, &t.name, "rust-new", serde_json::json!({}));
    let status = |id| {
        let tasks = tasks.clone();
        async move {
            let d = tasks.find_one(doc! {"_id": id}).await.unwrap().unwrap();
            d.get_i32("status").unwrap()
        }
    };
    wait_for(Duration::from_secs(30), "recovery of the dead DEN's task", || async {
        status(ours_running).await == -6
    })
    .await;
    // The spec's sweep: a claim that never started for 5 minutes is orphaned.
    wait_for(
        Duration::from_secs(30),
        "the spec's sweep of the stale claim",
        || async { status(perl_claimed).await == -6 },
    )
    .await;
    // A new task runs, so at least one full pass happened after recovery.
    let fresh = insert(doc! {"queue": q, "status": -2, "node": Bson::Null, "params": {}, "ctime": DateTime::now(), "mtime": DateTime::now()}).await;
    wait_for(Duration::from_secs(30), "a new task to run", || async {
        status(fresh).await == 1
    })
    .await;
    assert_eq!(status(perl_running).await, 0, "left to its task runner:\n{}", den.log());
    // Its task runner finishes it as Disbatch 4's does.
    runner_finishes(&tasks, perl_running).await;
    assert_eq!(status(perl_running).await, 1);
    drop(den);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_name_a_disbatch4_den_uses_is_not_taken() {
    let t = common::test_db("perl_mixed_name").await;
    let q = insert_queue(&t.db, "mixed", "demo", doc! {"threads": 2}).await;
    let tasks = t.db.collection::<Document>("tasks");
    let perl_running = tasks
        .insert_one(perl_task(q, "shared", 0, minutes_ago(10)))
        .await
        .unwrap()
        .inserted_id
        .as_object_id()
        .unwrap();
    // A Disbatch 4 DEN stopped, but its task runner still works on a task: the name stays
    // its own. (The name of a live one, or of one just stopped: `disbatch4_takeover`.) Its
    // last heartbeat, as it stands a while after the stop.
    perl_heartbeat(&t.db, "shared", minutes_ago(1)).await;
    let mut refused = DenProcess::start(&t.uri, &t.name, "shared", serde_json::json!({}));
    assert!(!refused.wait_exit(Duration::from_secs(60)).success());
    let log = refused.log();
    assert!(log.contains("still has 1 claimed or running"), "{log}");
    assert_eq!(count(&t.db, doc! {"_id": perl_running, "status": 0}).await, 1, "{log}");

    // Once its task runner has written the result, the name is taken.
    runner_finishes(&tasks, perl_running).await;
    let den = DenProcess::start(&t.uri, &t.name, "shared", serde_json::json!({}));
    let id = tasks
        .insert_one(doc! {"queue": q, "status": -2, "node": Bson::Null, "params": {}, "ctime": DateTime::now(), "mtime": DateTime::now()})
        .await
        .unwrap()
        .inserted_id;
    wait_for(Duration::from_secs(30), "the den to run a task as `shared`", || async {
        count(&t.db, doc! {"_id": id.clone(), "status": 1, "node": "shared"}).await == 1
    })
    .await;
    let node =
        t.db.collection::<Document>("nodes")
            .find_one(doc! {"node": "shared"})
            .await
            .unwrap()
            .unwrap();
    assert!(node.get_document("process").is_ok(), "{node}");
    assert_eq!(node.get("beat"), node.get("timestamp"), "{node}");
    let done = tasks.find_one(doc! {"_id": perl_running}).await.unwrap().unwrap();
    assert_eq!(
        done.get_str("stdout").unwrap(),
        "done",
        "the runner's result stands: {done}"
    );
    drop(den);
}
