//! What the host holds for a task's HTTP requests stays bounded, whatever the plugin does
//! with the `wasi:http` resources it may create without any grant: headers past their limit,
//! bodies written but never sent, thousands of handles, dozens of requests left open. And a
//! name lookup needs no thread of the runtime's blocking pool, which the DEN's running
//! plugins share.

use crate::common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::plugin_path;
use disbatch::runner::{
    max_handles, EngineOptions, HttpRule, Outcome, Runner, Sandbox, HTTP_BODY_CHUNK, HTTP_FIELD_SIZE_LIMIT,
    HTTP_MAX_OPEN,
};
use serde_json::{json, Value};

fn runner() -> Runner {
    Runner::new(&EngineOptions {
        cache_dir: None,
        max_instances: 4,
    })
    .unwrap()
}

/// A sandbox with a deadline that ends a test which would otherwise wait forever.
fn sandbox(rules: &[&str]) -> Sandbox {
    Sandbox {
        http: rules.iter().map(|r| r.parse::<HttpRule>().unwrap()).collect(),
        timeout: Duration::from_secs(20),
        ..Sandbox::default()
    }
}

fn attack(params: Value, sandbox: &Sandbox) -> Outcome {
    runner().run_file(&plugin_path("attack"), &params.to_string(), sandbox, None)
}

fn failure(o: &Outcome) -> String {
    o.failure.as_ref().map(|f| f.to_string()).unwrap_or_default()
}

/// The last JSON line of stdout.
fn last_report(o: &Outcome) -> Value {
    let stdout = o.output_texts().0;
    let line = stdout.lines().rev().find(|l| l.starts_with('{')).unwrap_or("null");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[test]
fn headers_past_their_limit_end_the_task_naming_the_limit() {
    let o = attack(
        json!({"attack": "http-hoard", "count": 1, "header_kib": 200}),
        &Sandbox::default(),
    );
    assert!(!o.succeeded());
    let why = failure(&o);
    let limit = format!("{} KiB", HTTP_FIELD_SIZE_LIMIT / 1024);
    assert!(why.contains("headers") && why.contains(&limit), "{why}");
}

#[test]
fn requests_never_sent_hold_bounded_host_memory_even_without_a_grant() {
    // 64 MiB of task memory: at most 512 open handles, each holding at most 128 KiB.
    let memory = 64 << 20;
    let handles = max_handles(memory);
    assert_eq!(handles, 512);
    let o = attack(
        json!({"attack": "http-hoard", "count": 100_000}),
        &Sandbox {
            memory,
            ..Sandbox::default()
        },
    );
    assert!(!o.succeeded(), "100,000 requests were kept");
    let why = failure(&o);
    assert!(
        why.contains("512 open handles") && why.contains("sandbox.memory"),
        "{why}"
    );
    let report = last_report(&o);
    let kept = report["requests"].as_u64().unwrap();
    // Each kept request holds a few handles (request, body, stream): the cap, not the
    // plugin, ended it, and long before 100,000.
    assert!((100..=handles as u64).contains(&kept), "{report}");
    // A body written without being sent buffers two chunks, not what the plugin writes.
    let body = report["body_bytes"].as_u64().unwrap();
    assert!(body > 0 && body <= 2 * HTTP_BODY_CHUNK as u64, "{report}");
    // A plugin with fewer handles than the cap runs to the end.
    let o = attack(json!({"attack": "http-hoard", "count": 20}), &Sandbox::default());
    assert!(o.succeeded(), "{}", failure(&o));
    assert_eq!(last_report(&o)["requests"], 20);
}

/// A server that accepts connections and never answers; counts them.
fn silent_server() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    let held = Arc::new(Mutex::new(Vec::new()));
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            count.fetch_add(1, Ordering::SeqCst);
            held.lock().unwrap().push(conn);
        }
    });
    (addr, accepted)
}

#[test]
fn a_task_holds_at_most_its_open_requests_at_once() {
    let (addr, accepted) = silent_server();
    let count = HTTP_MAX_OPEN as u64 + 8;
    let o = attack(
        json!({"attack": "http-open", "url": format!("http://{addr}/"), "count": count}),
        &sandbox(&[&format!("http://{addr}")]),
    );
    let (stdout, stderr) = o.output_texts();
    assert!(o.succeeded(), "{}\n{stderr}", failure(&o));
    let report = last_report(&o);
    assert_eq!(report["started"], count, "{stdout}");
    assert!(
        report["last"].as_str().unwrap().contains("ConnectionLimitReached"),
        "{report}"
    );
    assert!(stderr.contains(&format!("{} requests open", HTTP_MAX_OPEN)), "{stderr}");
    assert!(accepted.load(Ordering::SeqCst) <= HTTP_MAX_OPEN as usize);
}

/// A server answering every request with "ok" and closing the connection.
fn answering_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok");
        }
    });
    addr
}

#[test]
fn a_name_lookup_needs_no_thread_of_the_blocking_pool() {
    let addr = answering_server();
    // The task runs on one of the runtime's two blocking threads, as a DEN runs it; the
    // other is busy until the task ends. A lookup that needed a third would wait until
    // the task's deadline.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (release, held) = std::sync::mpsc::channel::<()>();
    let busy = rt.spawn_blocking(move || held.recv());
    let url = format!("http://localhost:{}/", addr.port());
    let task = rt.spawn_blocking(move || {
        runner().run_file(
            &plugin_path("fetch"),
            &json!({ "url": url }).to_string(),
            &sandbox(&["http://localhost:*"]),
            None,
        )
    });
    let o = rt.block_on(task).unwrap();
    release.send(()).unwrap();
    rt.block_on(busy).unwrap().unwrap();
    let (stdout, stderr) = o.output_texts();
    assert!(o.succeeded(), "{}\n{stderr}", failure(&o));
    assert!(stdout.contains("\"status\":200"), "{stdout}");
}
