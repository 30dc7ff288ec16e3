//! What reads may cost and show, against a real `disbatch web` on an embedded file: a GET's
//! body and its lists of ids are bounded (413, 400 naming the field) before the store sees
//! them; `full=1` cuts large outputs, with a link to the streamed whole, so the server's
//! memory does not grow with the outputs; and a queue's `sandbox.env` values are shown only
//! to requests carrying the API token.

use crate::common;

use disbatch::api::FULL_OUTPUT_CAP;
use disbatch::store::sqlite::SqliteStore;
use disbatch::store::testing::StoreExt;
use disbatch::store::{OutputValue, Store};
use serde_json::{json, Value};

use common::web::{run_disbatch, stderr};
use common::{plugins_dir, Web};

const TOKEN: &str = "a-long-enough-api-token-0123456789";

/// `disbatch web` on a new embedded file with `api_token` set; the web process and the file.
fn web_with_token() -> (Web, std::path::PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("r.db");
    let config = json!({"plugins": ["demo"], "plugin_dir": plugins_dir(), "api_token": TOKEN});
    let path = dir.path().join("web.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let web = Web::start_embedded(&file, &["--config", path.to_str().unwrap()]);
    (web, file, dir)
}

/// The peak resident memory of process `pid` (VmHWM), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

/// A request with the token.
fn authed(r: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    r.bearer_auth(TOKEN)
}

async fn answer(r: reqwest::RequestBuilder) -> (u16, Value) {
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_body_and_its_id_lists_are_bounded_before_the_store_sees_them() {
    let (web, _file, _dir) = web_with_token();
    let client = reqwest::Client::new();
    let url = format!("{}/tasks", web.url);

    // A body just past 1 MiB: 413 naming the limit. The server answers without reading
    // the rest and closes the connection, so a client still sending may see it closed
    // before the answer: such a send is made again (on a new connection).
    let padding = "x".repeat((1 << 20) + 1024);
    let mut tries = 0;
    let (status, body) = loop {
        tries += 1;
        match client
            .get(&url)
            .json(&json!({"queue": "q", "pad": &padding}))
            .send()
            .await
        {
            Ok(r) => {
                let status = r.status().as_u16();
                let text = r.text().await.unwrap_or_default();
                break (status, serde_json::from_str(&text).unwrap_or(Value::String(text)));
            }
            Err(e) if tries < 5 => eprintln!("send {tries}: {e}"),
            Err(e) => panic!("no answer to an oversized body in {tries} sends: {e}"),
        }
    };
    assert_eq!(status, 413, "{body}");
    assert!(body["error"].as_str().unwrap().contains("1024 KiB"), "{body}");

    // 2,000 ids (well within the body limit and within SQLite's variables): 400 naming "id".
    let ids: Vec<String> = (0..2000).map(|_| bson::oid::ObjectId::new().to_hex()).collect();
    let (status, body) = answer(client.get(&url).json(&json!({"id": ids}))).await;
    assert_eq!(status, 400, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(error.contains("\"id\"") && error.contains("1000"), "{error}");

    // A thousand are fine.
    let (status, body) = answer(client.get(&url).json(&json!({"id": ids[..1000]}))).await;
    assert_eq!((status, body), (200, json!([])));
}

/// Text of `len` bytes that differs along its length.
fn output(tag: &str, len: usize) -> String {
    let mut s = String::with_capacity(len + 64);
    let mut i = 0u64;
    while s.len() < len {
        s.push_str(&format!("{tag} line {i}\n"));
        i += 1;
    }
    s.truncate(len);
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_cuts_large_outputs_and_the_server_memory_does_not_grow_with_them() {
    const TASKS: usize = 3;
    const LEN: usize = 40 << 20;
    let (web, file, _dir) = web_with_token();
    let client = reqwest::Client::new();
    let (status, body) = answer(authed(client.post(format!("{}/queues", web.url))).json(&json!({
        "name": "q", "plugin": "demo", "threads": 0
    })))
    .await;
    assert_eq!(status, 200, "{body}");
    let params: Vec<Value> = (0..TASKS).map(|i| json!({"i": i})).collect();
    let (status, body) = answer(authed(client.post(format!("{}/tasks", web.url))).json(&json!({
        "queue": "q", "params": params
    })))
    .await;
    assert_eq!(status, 200, "{body}");

    // Run them by hand on the same file, each with two 40 MiB output files.
    let mut texts = std::collections::HashMap::new();
    {
        let store = SqliteStore::open(&file).await.unwrap();
        let mut queue = store.queues().await.unwrap().remove(0);
        queue.threads = Some(1);
        for i in 0..TASKS {
            let task = store.claim(&queue, "n1").await.unwrap().expect("a queued task");
            assert!(disbatch::lifecycle::run::start(&store, task.id, "n1").await.unwrap());
            let (out, err) = (output(&format!("out{i}"), LEN), output(&format!("err{i}"), LEN));
            let out_file = store.write_output_file(task.id, "stdout", &out).await.unwrap();
            let err_file = store.write_output_file(task.id, "stderr", &err).await.unwrap();
            let files = (OutputValue::File(out_file), OutputValue::File(err_file));
            assert!(
                disbatch::lifecycle::run::finish(&store, task.id, "n1", 1, files.0, files.1)
                    .await
                    .unwrap()
            );
            texts.insert(task.id.to_hex(), out);
        }
    }

    let pid = web.pid();
    let before = peak_rss(pid);
    let r = client
        .get(format!("{}/tasks?queue=q&full=1&limit={TASKS}", web.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let tasks: Value = r.json().await.unwrap();
    let grown = peak_rss(pid).saturating_sub(before);
    let whole = (TASKS * 2 * LEN) as u64;
    println!(
        "full=1 over {TASKS} tasks with {} MiB of output: peak RSS grew {} MiB",
        whole >> 20,
        grown >> 20
    );
    assert!(
        grown < whole / 8,
        "peak RSS grew {grown} bytes for {whole} bytes of outputs"
    );

    let tasks = tasks.as_array().unwrap();
    assert_eq!(tasks.len(), TASKS);
    for t in tasks {
        let id = t["id"].as_str().unwrap();
        let text = &texts[id];
        for name in ["stdout", "stderr"] {
            let shown = t[name].as_str().unwrap();
            assert_eq!(shown.len(), FULL_OUTPUT_CAP, "{name} of {id} is cut at the cap");
            let cut = &t[format!("{name}_cut")];
            assert_eq!(cut["shown_bytes"], FULL_OUTPUT_CAP);
            assert_eq!(cut["full_text"], format!("/tasks/{id}/{name}"));
        }
        assert_eq!(t["stdout"].as_str().unwrap(), &text[..FULL_OUTPUT_CAP]);
    }

    // The link gives the whole text, streamed.
    let (id, text) = texts.iter().next().unwrap();
    let r = client
        .get(format!("{}/tasks/{id}/stdout", web.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let got = r.text().await.unwrap();
    assert!(
        got == *text,
        "the whole stdout ({} bytes, {} expected)",
        got.len(),
        text.len()
    );

    // More than the cap of tasks with full outputs per request is refused.
    let (status, body) = answer(client.get(format!("{}/tasks?queue=q&full=1&limit=11", web.url))).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().unwrap().contains("at most 10"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_env_values_are_hidden_without_the_token_and_kept_by_updates() {
    let (web, _file, _dir) = web_with_token();
    let client = reqwest::Client::new();
    let secret = "sk-live-0123456789abcdef";
    let sandbox = json!({"env": {"API_KEY": secret, "REGION": "eu"}});
    let (status, body) = answer(authed(client.post(format!("{}/queues", web.url))).json(&json!({
        "name": "h", "plugin": "demo", "threads": 0, "sandbox": sandbox
    })))
    .await;
    assert_eq!(status, 200, "{body}");

    // Reads without the token see the keys, not the values; with it, the values.
    let (_, list) = answer(client.get(format!("{}/queues", web.url))).await;
    assert_eq!(
        list[0]["sandbox"]["env"],
        json!({"API_KEY": "***", "REGION": "***"}),
        "{list}"
    );
    let (_, one) = answer(client.get(format!("{}/queues/h", web.url))).await;
    assert_eq!(one["sandbox"]["env"]["API_KEY"], "***", "{one}");
    assert!(!one.to_string().contains(secret));
    let (_, wrong) = answer(client.get(format!("{}/queues/h", web.url)).bearer_auth("not-the-token")).await;
    assert_eq!(wrong["sandbox"]["env"]["API_KEY"], "***", "{wrong}");
    let (_, clear) = answer(authed(client.get(format!("{}/queues/h", web.url)))).await;
    assert_eq!(clear["sandbox"]["env"]["API_KEY"], secret, "{clear}");
    let (_, clear) = answer(authed(client.get(format!("{}/queues", web.url)))).await;
    assert_eq!(clear[0]["sandbox"]["env"]["API_KEY"], secret, "{clear}");

    // The CLI without a token shows the redacted value.
    let out = run_disbatch(&["--json", "queues"], None, &[("DISBATCH_URL", web.url.as_str())]);
    assert!(out.status.success(), "{}", stderr(&out));
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(printed.contains("API_KEY") && !printed.contains(secret), "{printed}");

    // The UI's editor sends back the sandbox it read (redacted) with a change: the secret stays.
    let mut edited = one["sandbox"].clone();
    edited["memory_mib"] = json!(64);
    edited["env"]["REGION"] = json!("us");
    let (status, body) = answer(authed(client.post(format!("{}/queues/h", web.url))).json(&json!({
        "sandbox": edited, "threads": 2
    })))
    .await;
    assert_eq!(status, 200, "{body}");
    let (_, clear) = answer(authed(client.get(format!("{}/queues/h", web.url)))).await;
    assert_eq!(
        clear["sandbox"]["env"],
        json!({"API_KEY": secret, "REGION": "us"}),
        "{clear}"
    );
    assert_eq!(clear["threads"], 2);

    // The CLI's update-queue with the redacted sandbox keeps it too.
    let redacted = json!({"env": {"API_KEY": "***", "REGION": "us"}}).to_string();
    let env = [("DISBATCH_URL", web.url.as_str()), ("DISBATCH_TOKEN", TOKEN)];
    let out = run_disbatch(&["update-queue", "h", "sandbox", &redacted], None, &env);
    assert!(out.status.success(), "{}", stderr(&out));
    let (_, clear) = answer(authed(client.get(format!("{}/queues/h", web.url)))).await;
    assert_eq!(clear["sandbox"]["env"]["API_KEY"], secret, "{clear}");

    // "***" for a variable the queue does not have cannot be kept: 400 naming it.
    let (status, body) = answer(authed(client.post(format!("{}/queues/h", web.url))).json(&json!({
        "sandbox": {"env": {"OTHER": "***"}}
    })))
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().unwrap().contains("sandbox.env.OTHER"), "{body}");
}
