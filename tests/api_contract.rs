//! The OpenAPI document as a contract outside tools can trust, checked against a real
//! `disbatch web` on each store, with and without an API token:
//!
//! - the served `/openapi.json` passes `openapi-spec-validator`, and declares security
//!   exactly as the server applies it (none without a token; with one, on every write,
//!   which answers 401 without it);
//! - the fuzzer schemathesis (`--checks all`) finds no request the server and the
//!   document disagree on: no server error, no undocumented status code, no answer
//!   violating its schema, no schema-valid request refused and no invalid one taken;
//! - the disagreements it found, one by one: empty query values are absent, an unknown
//!   queue or node is 404 (never 200 `null`).
//!
//! The tools come from PyPI at the versions pinned in `scripts/api-tools/requirements.txt`,
//! installed once by `scripts/api-tools/install`.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::{json, Value};

use common::{plugins_dir, test_db, Web};

const TOKEN: &str = "a-long-enough-api-token-0123456789";

/// The venv holding the API tools, installed on first use (once per machine).
fn tools() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/api-tools/install");
    let out = Command::new(&script).output().expect("run scripts/api-tools/install");
    assert!(
        out.status.success(),
        "scripts/api-tools/install failed (it needs python3 with venv and PyPI): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// `disbatch web` on a new embedded file, with the API token when `token`.
fn embedded(token: bool) -> (Web, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = json!({"plugins": ["demo", "fail"], "plugin_dir": plugins_dir()});
    if token {
        config["api_token"] = json!(TOKEN);
    }
    let path = dir.path().join("web.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let web = Web::start_embedded(&dir.path().join("c.db"), &["--config", path.to_str().unwrap()]);
    (web, dir)
}

/// `disbatch web` on a fresh database of the MongoDB test server, with the token when `token`.
async fn mongo(token: bool, hint: &str) -> (Web, common::TestDb) {
    let db = test_db(hint).await;
    let mut extra = json!({"plugin_dir": plugins_dir()});
    if token {
        extra["api_token"] = json!(TOKEN);
    }
    let web = Web::start(&db.uri, &db.name, extra);
    (web, db)
}

async fn get(web: &Web, path: &str) -> (u16, String) {
    let r = reqwest::get(format!("{}{path}", web.url)).await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The served document, saved in `dir` for the tools.
async fn document(web: &Web, dir: &Path) -> (Value, PathBuf) {
    let (status, text) = get(web, "/openapi.json").await;
    assert_eq!(status, 200, "{text}");
    let path = dir.join("openapi.json");
    std::fs::write(&path, &text).unwrap();
    (serde_json::from_str(&text).unwrap(), path)
}

/// Every `(method, path, operation)` of the document.
fn operations(doc: &Value) -> Vec<(String, String, Value)> {
    let mut all = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            if ["get", "post", "delete", "put", "patch"].contains(&method.as_str()) {
                all.push((method.to_uppercase(), path.clone(), op.clone()));
            }
        }
    }
    all
}

#[tokio::test(flavor = "multi_thread")]
async fn served_document_is_valid_and_declares_security_as_applied() {
    let tools = tools();
    for token in [false, true] {
        let (web, dir) = embedded(token);
        let (doc, path) = document(&web, dir.path()).await;
        let out = Command::new(tools.join("bin/openapi-spec-validator"))
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "token {token}: openapi-spec-validator refuses /openapi.json: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(doc["openapi"], "3.1.0");
        for (method, path, op) in operations(&doc) {
            let secured = op.get("security").is_some();
            let write = method != "GET";
            assert_eq!(
                secured,
                token && write,
                "token {token}: {method} {path} security {secured}"
            );
            assert_eq!(
                op["responses"].get("401").is_some(),
                token && write,
                "{method} {path} 401"
            );
        }
        // What the document says is what a write without the token gets.
        let r = reqwest::Client::new()
            .post(format!("{}/queues", web.url))
            .json(&json!({"name": "q", "plugin": "demo"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), if token { 401 } else { 200 }, "token {token}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn empty_query_values_are_absent() {
    let (web, _dir) = embedded(false);
    let r = reqwest::Client::new()
        .post(format!("{}/queues", web.url))
        .json(&json!({"name": "q", "plugin": "demo"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = reqwest::Client::new()
        .post(format!("{}/tasks", web.url))
        .json(&json!({"queue": "q", "params": [{}]}))
        .send()
        .await
        .unwrap();
    let created: Value = r.json().await.unwrap();
    let id = created["ids"][0].as_str().unwrap().to_owned();
    for path in [
        "/stats?since=&until=&step=&queue=".to_owned(),
        format!("/tasks/{id}?queue="),
        "/tasks?queue=&status=&node=&batch=&after=&id=&filter=&fields=&next=&new=&timeout=&limit=1".to_owned(),
        format!("/tasks/wait?ids={id}&timeout="),
    ] {
        let (status, text) = get(&web, &path).await;
        assert!(status == 200, "GET {path}: {status} {text}");
    }
    // A flag given empty is on; any other parameter given empty is absent.
    let (_, text) = get(&web, "/tasks?queue=&limit=&count=").await;
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["count"], 1, "bare count is on, empty limit absent: {v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_or_deleted_queue_is_404_in_every_shape() {
    let (web, _dir) = embedded(false);
    let client = reqwest::Client::new();
    let r = client
        .post(format!("{}/queues", web.url))
        .json(&json!({"name": "gone", "plugin": "demo"}))
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    let id = v["_id"]["$oid"].as_str().unwrap().to_owned();
    let r = client.delete(format!("{}/queues/{id}", web.url)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    for path in [format!("/queues/{id}"), "/queues/gone".into(), "/nodes/nope".into()] {
        for shape in ["disbatch4", "native"] {
            let r = client
                .get(format!("{}{path}", web.url))
                .header("Disbatch-Shape", shape)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap();
            assert_eq!(status, 404, "GET {path} ({shape}): {body}");
            assert!(body["error"].is_string(), "{body}");
        }
    }
}

/// Runs schemathesis with `--checks all` against `web` (its own document) and fails on any
/// failure it reports; prints its summary and run time.
fn fuzz(web: &Web, token: bool, what: &str) {
    let tools = tools();
    let work = tempfile::tempdir().unwrap();
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/api-tools/schemathesis.toml");
    let examples = std::env::var("DISBATCH_FUZZ_EXAMPLES").unwrap_or_else(|_| "25".into());
    let seed = std::env::var("DISBATCH_FUZZ_SEED").unwrap_or_else(|_| "1".into());
    let mut cmd = Command::new(tools.join("bin/schemathesis"));
    cmd.arg("--config-file")
        .arg(&config)
        .args(["run", &format!("{}/openapi.json", web.url), "--checks", "all"])
        .args([
            "--max-examples",
            &examples,
            "--seed",
            &seed,
            "--workers",
            "1",
            "--no-color",
        ])
        .args(["--request-timeout", "30"])
        .current_dir(work.path())
        .env("HOME", work.path());
    if token {
        cmd.args(["--header", &format!("Authorization: Bearer {TOKEN}")]);
    }
    let start = Instant::now();
    let out = cmd.output().expect("run schemathesis");
    let text = String::from_utf8_lossy(&out.stdout);
    let summary = text.rsplit("SUMMARY").next().unwrap_or(&text);
    println!(
        "schemathesis on {what}: {:.1} s, {}",
        start.elapsed().as_secs_f64(),
        summary.trim()
    );
    assert!(
        out.status.success(),
        "schemathesis found disagreements between the server and /openapi.json on {what}:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn schemathesis_finds_nothing_on_the_embedded_store() {
    for token in [false, true] {
        let (web, _dir) = embedded(token);
        fuzz(&web, token, &format!("the embedded store, token {token}"));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn schemathesis_finds_nothing_on_mongodb() {
    for token in [false, true] {
        let (web, _db) = mongo(token, "api_contract_fuzz").await;
        fuzz(&web, token, &format!("MongoDB, token {token}"));
    }
}
