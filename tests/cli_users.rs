//! `disbatch create-users` against a test server that requires authentication: the root
//! user, the roles and users of the config's passwords, `--drop-roles`; then a DEN (as
//! `disbatchd`) and `disbatch web` (as `disbatch_web`) logging in to the Disbatch database
//! with them and running a task the CLI submits; and what a role does not allow is refused.

use crate::common;

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use disbatch::config::Config;
use disbatch::store::mongo::MongoStore;
use disbatch::store::Store;
use serde_json::{json, Value};

use common::web::{run_disbatch, stderr, Web};
use common::DenProcess;

const ROOT_PASSWORD: &str = "root-pw-0123";

/// A `secantusd-rs --auth` of this test, on a free port; killed when dropped.
struct AuthServer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl AuthServer {
    fn start() -> AuthServer {
        let binary = std::env::var_os("SECANTUSD")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/opt/secantus/bin/secantusd-rs"));
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(&binary)
            .args(["--auth", "--host", "127.0.0.1", "--port", "0", "--cache-size", "256M"])
            .args(["--log-file-max", "16MB", "--storage-path"])
            .arg(dir.path().join("data"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", binary.display()));
        // The server says where it listens on stdout or stderr; read both until it does.
        let (tx, rx) = std::sync::mpsc::channel();
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if let Some((_, addr)) = line.split_once("listening on ") {
                        if let Some(port) = addr.trim().rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok()) {
                            let _ = tx.send(port);
                        }
                    }
                }
            });
        }
        let port = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("secantusd-rs --auth did not say where it listens");
        AuthServer { child, port, _dir: dir }
    }

    fn uri(&self) -> String {
        format!("mongodb://127.0.0.1:{}/?directConnection=true", self.port)
    }
}

impl Drop for AuthServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn passwords() -> Value {
    json!({"disbatchd": "den-pw", "disbatch_web": "web-pw", "task_runner": "tr-pw",
           "queuebalance": "qb-pw", "plugin": "pl-pw"})
}

fn write_config(dir: &Path, uri: &str, auth: Value) -> PathBuf {
    let path = dir.join("config.json");
    let config = json!({"mongohost": uri, "database": "dsb", "auth": auth, "plugins": ["demo"],
                        "plugin_dir": dir});
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

fn create_users(config: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "--config",
        config.to_str().unwrap(),
        "create-users",
        "--root-user",
        "root",
    ];
    args.extend_from_slice(extra);
    run_disbatch(&args, None, &[("DISBATCH_ROOT_PASSWORD", ROOT_PASSWORD)])
}

#[tokio::test]
async fn created_users_run_the_den_and_the_dci_in_the_disbatch_database() {
    let server = AuthServer::start();
    let dir = tempfile::tempdir().unwrap();

    // Every missing password is named, before anything is done.
    let partial = write_config(dir.path(), &server.uri(), json!({"disbatchd": "x"}));
    let out = create_users(&partial, &["--create-root"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    for role in [
        "auth.disbatch_web",
        "auth.task_runner",
        "auth.queuebalance",
        "auth.plugin",
    ] {
        assert!(stderr(&out).contains(role), "{role}: {}", stderr(&out));
    }

    let config = write_config(dir.path(), &server.uri(), passwords());
    let out = create_users(&config, &["--create-root"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("created the roles and users"), "{said}");

    // Again: the roles exist; --drop-roles replaces them.
    let out = create_users(&config, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("--drop-roles"), "{}", stderr(&out));
    let out = create_users(&config, &["--drop-roles"]);
    assert!(out.status.success(), "{}", stderr(&out));

    // A wrong root password is refused.
    let out = run_disbatch(
        &[
            "--config",
            config.to_str().unwrap(),
            "create-users",
            "--root-user",
            "root",
        ],
        None,
        &[("DISBATCH_ROOT_PASSWORD", "wrong")],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));

    // The DEN's user logs in to the Disbatch database (no auth_source in the config).
    let loaded = Config::load(&config).unwrap();
    let den_store = MongoStore::connect(&server.uri(), "dsb", loaded.mongo_options("disbatchd"))
        .await
        .unwrap();
    den_store.ensure_indexes().await.unwrap();
    den_store.heartbeat("n-auth", Duration::from_secs(30)).await.unwrap();
    assert!(den_store.nodes().await.unwrap().iter().any(|n| n.node == "n-auth"));
    // A wrong password is refused.
    let mut wrong = loaded.mongo_options("disbatchd");
    wrong.password = Some("nope".into());
    let bad = MongoStore::connect(&server.uri(), "dsb", wrong).await.unwrap();
    assert!(bad.nodes().await.is_err(), "a wrong password must not log in");

    // The DCI as disbatch_web, the DEN as disbatchd: a task submitted with the CLI runs.
    let web = Web::start(&server.uri(), "dsb", json!({"auth": passwords()}));
    web.json(&["create-queue", "q", "demo", "--threads", "1"]);
    let den = DenProcess::start(&server.uri(), "dsb", "den-auth", json!({"auth": passwords()}));
    let id = web.json(&["create-task", "q", "message", "hi", "repeat:=2"])["ids"][0]
        .as_str()
        .unwrap()
        .to_owned();
    let out = web.run(&["wait", &id, "--timeout", "60s"]);
    assert!(out.status.success(), "{}\n--- den ---\n{}", stderr(&out), den.log());
    let task = web.json(&["task", &id]);
    assert_eq!(task["stdout"], "hi\nhi\n", "{task}");
    assert_eq!(task["params"], json!({"message": "hi", "repeat": 2}));
    // Nothing the DEN did was refused (its heartbeat, lease, slots, plugin reads…).
    let log = den.log();
    assert!(
        !log.contains("not authorized") && !log.contains("Unauthorized") && !log.contains("requires authentication"),
        "{log}"
    );
}

#[tokio::test]
async fn roles_refuse_what_they_do_not_allow() {
    let server = AuthServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &server.uri(), passwords());
    let out = create_users(&config, &["--create-root"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let loaded = Config::load(&config).unwrap();

    let client = loaded.mongo_options("plugin").client(&server.uri()).await.unwrap();
    let db = client.database("dsb");
    let read = db.collection::<bson::Document>("tasks").find_one(bson::doc! {}).await;
    assert!(read.is_err(), "the plugin role has no privileges: {read:?}");

    let client = loaded.mongo_options("disbatchd").client(&server.uri()).await.unwrap();
    let queues = client.database("dsb").collection::<bson::Document>("queues");
    queues.find_one(bson::doc! {}).await.unwrap();
    let removed = queues.delete_many(bson::doc! {}).await;
    assert!(removed.is_err(), "disbatchd may not remove queues: {removed:?}");
}

#[test]
fn dry_run_prints_the_roles_without_passwords() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "mongodb://127.0.0.1:1/", passwords());
    let out = run_disbatch(
        &["create-users", "--config", config.to_str().unwrap(), "--dry-run"],
        None,
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["database"], "dsb");
    let commands = v["commands"].as_array().unwrap();
    assert_eq!(commands.len(), 10);
    assert_eq!(commands[0]["createRole"], "disbatchd");
    assert_eq!(commands[1]["createUser"], "disbatchd");
    assert_eq!(commands[1]["roles"], json!([{"role": "disbatchd", "db": "dsb"}]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("den-pw") && !text.contains("pwd"), "{text}");
    let slots = &commands[0]["privileges"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["resource"]["collection"] == "slots")
        .unwrap()["actions"];
    assert_eq!(slots, &json!(["find", "insert", "update", "createIndex"]));

    // No config: the error says to give one.
    let out = run_disbatch(&["create-users", "--dry-run"], None, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--config"), "{}", stderr(&out));
}
