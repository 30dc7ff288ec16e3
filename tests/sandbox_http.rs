//! Outbound HTTP by allowlist, against a real HTTP server started here: a listed host is
//! reached; an unlisted host, a loopback address behind a wildcard and a name that
//! resolves to loopback are refused before any byte is sent, with a note saying what to
//! change; requests, body bytes and time are bounded. Blocking host calls of every kind
//! (an HTTP response that never comes, a body nobody reads, a silent socket, dropping a
//! socket whose peer never reads) end at the task's deadline or kill. Last, a real DEN runs a queue whose sandbox lists the server.

use crate::common;

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::routing::{get, post};
use axum::Router;
use bson::doc;
use common::{plugin_path, wait_for, DenProcess};
use disbatch::model::{Output, Sort};
use disbatch::runner::{EngineOptions, Failure, HttpRule, Outcome, RunControl, Runner, Sandbox, StopReason};
use disbatch::store::sqlite::SqliteStore;
use disbatch::store::testing::StoreExt;
use disbatch::store::{NewQueue, Page, Store, TaskFilter};
use serde_json::json;

/// A local HTTP server counting the requests that reach it.
struct Server {
    addr: SocketAddr,
    hits: Arc<AtomicUsize>,
}

impl Server {
    fn start() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let state = hits.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let app = Router::new()
                    .route("/hello", get(|| async { "hello from the test server" }))
                    .route(
                        "/big",
                        get(|Query(q): Query<std::collections::HashMap<String, usize>>| async move {
                            vec![b'x'; q.get("bytes").copied().unwrap_or(0)]
                        }),
                    )
                    .route("/silent", get(std::future::pending::<&'static str>))
                    .route(
                        "/echo",
                        post(|body: axum::body::Bytes| async move { body.len().to_string() }),
                    )
                    .layer(axum::middleware::from_fn_with_state(
                        state,
                        |State(hits): State<Arc<AtomicUsize>>, req, next: axum::middleware::Next| async move {
                            hits.fetch_add(1, Ordering::SeqCst);
                            next.run(req).await
                        },
                    ));
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                axum::serve(listener, app).await.unwrap();
            });
        });
        Server { addr, hits }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

fn runner() -> Runner {
    Runner::new(&EngineOptions {
        cache_dir: None,
        max_instances: 4,
    })
    .unwrap()
}

fn http(rules: &[&str]) -> Sandbox {
    Sandbox {
        http: rules.iter().map(|r| r.parse::<HttpRule>().unwrap()).collect(),
        ..Sandbox::default()
    }
}

fn run(plugin: &str, params: serde_json::Value, sandbox: &Sandbox) -> Outcome {
    runner().run_file(&plugin_path(plugin), &params.to_string(), sandbox, None)
}

fn fetch(url: &str, sandbox: &Sandbox) -> Outcome {
    run("fetch", json!({ "url": url }), sandbox)
}

/// What a user reads: stdout, and stderr with the host's notes.
fn texts(o: &Outcome) -> (String, String) {
    o.output_texts()
}

fn failure(o: &Outcome) -> String {
    o.failure.as_ref().map(|f| f.to_string()).unwrap_or_default()
}

#[test]
fn a_listed_host_is_reached() {
    let server = Server::start();
    let o = fetch(&server.url("/hello"), &http(&[&format!("http://{}", server.addr)]));
    let (stdout, stderr) = texts(&o);
    assert!(o.succeeded(), "{}\n{stderr}", failure(&o));
    assert!(stdout.contains("hello from the test server"), "{stdout}");
    assert!(stdout.contains("\"status\":200"), "{stdout}");
    assert_eq!(server.hits(), 1);
    // Listed by "localhost" and any port: the name resolves to loopback, which the entry names.
    let o = fetch(
        &format!("http://localhost:{}/hello", server.addr.port()),
        &http(&["http://localhost:*"]),
    );
    assert!(o.succeeded(), "{}\n{}", failure(&o), texts(&o).1);
}

#[test]
fn an_unlisted_host_is_refused_before_any_byte_is_sent() {
    let server = Server::start();
    for sandbox in [
        Sandbox::default(),
        http(&["api.example.com"]),
        http(&[&format!("https://{}", server.addr)]),
    ] {
        let o = fetch(&server.url("/hello"), &sandbox);
        let (_, stderr) = texts(&o);
        assert!(!o.succeeded());
        assert!(failure(&o).contains("http-request-denied"), "{}", failure(&o));
        assert!(
            stderr.contains(&format!("[disbatch: HTTP request to http://{} refused", server.addr)),
            "{stderr}"
        );
        assert!(stderr.contains("sandbox.http"), "{stderr}");
    }
    assert_eq!(server.hits(), 0, "a refused request never reaches the server");
}

#[test]
fn loopback_is_refused_unless_named() {
    let server = Server::start();
    let port = server.addr.port();
    // A wildcard entry does not name loopback, whether it is reached by address or by name.
    for (url, rules) in [
        (server.url("/hello"), vec!["http://*:*"]),
        (format!("http://localhost:{port}/hello"), vec!["http://*:*"]),
        (
            format!("http://localhost:{port}/hello"),
            vec!["http://*.localhost:*", "*"],
        ),
    ] {
        let o = fetch(&url, &http(&rules));
        let (_, stderr) = texts(&o);
        assert!(!o.succeeded(), "{url} under {rules:?}");
        let f = failure(&o);
        assert!(
            f.contains("destination-ip-prohibited") || f.contains("http-request-denied"),
            "{url}: {f}"
        );
        assert!(stderr.contains("refused"), "{stderr}");
    }
    let o = fetch(&server.url("/hello"), &http(&["http://*:*"]));
    assert!(texts(&o).1.contains("network_allow"), "{}", texts(&o).1);
    assert_eq!(server.hits(), 0);
    // The operator may open the range for any listed name.
    let open = Sandbox {
        network_allow: vec!["127.0.0.1/32".parse().unwrap()],
        ..http(&["http://*:*"])
    };
    let o = fetch(&server.url("/hello"), &open);
    assert!(o.succeeded(), "{}", failure(&o));
    assert_eq!(server.hits(), 1);
}

#[test]
fn requests_and_body_bytes_are_bounded() {
    let server = Server::start();
    let listed = format!("http://{}", server.addr);
    let sandbox = Sandbox {
        http_max_requests: 3,
        ..http(&[&listed])
    };
    let o = run(
        "attack",
        json!({"attack": "http-many", "url": server.url("/hello"), "count": 5}),
        &sandbox,
    );
    let (stdout, stderr) = texts(&o);
    assert!(!o.succeeded());
    assert!(stdout.contains("\"ok\":3"), "{stdout}");
    assert!(failure(&o).contains("request #4"), "{}", failure(&o));
    assert!(stderr.contains("http_max_requests"), "{stderr}");
    assert_eq!(server.hits(), 3);

    let sandbox = Sandbox {
        http_max_body: 1 << 20,
        ..http(&[&listed])
    };
    let o = run(
        "attack",
        json!({"attack": "http-body", "url": server.url(&format!("/big?bytes={}", 3 << 20))}),
        &sandbox,
    );
    let (stdout, stderr) = texts(&o);
    assert!(!o.succeeded(), "{stdout}");
    assert!(failure(&o).contains("body size exceeds limit"), "{}", failure(&o));
    assert!(stderr.contains("http_max_body_mib"), "{stderr}");
    let o = run(
        "attack",
        json!({"attack": "http-body", "url": server.url(&format!("/big?bytes={}", 512 << 10))}),
        &sandbox,
    );
    assert!(o.succeeded(), "{}", failure(&o));
    assert!(texts(&o).0.contains(&format!("\"bytes\":{}", 512 << 10)));
}

fn timed_out(o: &Outcome) -> bool {
    matches!(o.failure, Some(Failure::Timeout(_)))
}

#[test]
fn a_response_that_never_comes_ends_at_the_deadline() {
    let server = Server::start();
    let sandbox = Sandbox {
        timeout: Duration::from_secs(1),
        ..http(&[&format!("http://{}", server.addr)])
    };
    let o = fetch(&server.url("/silent"), &sandbox);
    assert!(timed_out(&o), "{}", failure(&o));
    // The default first-byte wait is minutes: the deadline, not that wait, ended it.
    assert!(o.duration < Duration::from_secs(30), "{:?}", o.duration);
}

#[test]
fn a_request_body_nobody_reads_ends_at_the_deadline() {
    let server = Server::start();
    let sandbox = Sandbox {
        timeout: Duration::from_secs(1),
        ..http(&[&format!("http://{}", server.addr)])
    };
    let o = run(
        "attack",
        json!({"attack": "http-stall-body", "url": server.url("/echo")}),
        &sandbox,
    );
    assert!(timed_out(&o), "{}", failure(&o));
    assert!(o.duration < Duration::from_secs(30), "{:?}", o.duration);
}

#[test]
fn a_silent_socket_ends_at_the_deadline() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let sandbox = Sandbox {
        timeout: Duration::from_secs(1),
        network: true,
        network_allow: vec!["127.0.0.1/32".parse().unwrap()],
        ..Sandbox::default()
    };
    let addr = listener.local_addr().unwrap().to_string();
    let o = run("attack", json!({"attack": "tcp-read", "addr": addr}), &sandbox);
    assert!(timed_out(&o), "{}", failure(&o));
    assert!(o.duration < Duration::from_secs(30), "{:?}", o.duration);
    drop(listener);
}

#[test]
fn dropping_a_socket_whose_peer_never_reads_ends_at_the_deadline() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    // Accept and hold the connection without ever reading it.
    let holder = std::thread::spawn(move || listener.accept().map(|(conn, _)| conn));
    let sandbox = Sandbox {
        timeout: Duration::from_secs(1),
        network: true,
        network_allow: vec!["127.0.0.1/32".parse().unwrap()],
        ..Sandbox::default()
    };
    let o = run("attack", json!({"attack": "tcp-write-drop", "addr": addr}), &sandbox);
    let (stdout, _) = texts(&o);
    assert!(timed_out(&o), "{}\n{stdout}", failure(&o));
    assert!(
        stdout.contains("\"written\"") && !stdout.contains("dropped"),
        "{stdout}"
    );
    assert!(o.duration < Duration::from_secs(30), "{:?}", o.duration);
    drop(holder.join().unwrap());
}

#[test]
fn a_kill_ends_a_task_waiting_for_a_response() {
    let server = Server::start();
    let sandbox = http(&[&format!("http://{}", server.addr)]);
    let control = RunControl::new();
    let killer = {
        let (control, hits) = (control.clone(), server.hits.clone());
        std::thread::spawn(move || {
            // Kill once the request is in: the plugin is then blocked waiting for it.
            while hits.load(Ordering::SeqCst) == 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
            control.cancel(StopReason::Killed);
        })
    };
    let r = runner();
    let plugin = r.load(&plugin_path("fetch")).unwrap();
    let o = r.run_controlled(
        &plugin,
        &json!({"url": server.url("/silent")}).to_string(),
        &sandbox,
        None,
        &control,
    );
    killer.join().unwrap();
    assert!(!o.succeeded());
    assert!(failure(&o).contains("killed"), "{}", failure(&o));
}

#[test]
fn bad_entries_are_refused_with_the_reason() {
    let e = "https://api.example.com/v1".parse::<HttpRule>().unwrap_err();
    assert!(e.contains("no path"), "{e}");
    let e = disbatch::config::Config::from_json_str(
        r#"{"mongohost":"mongodb://h","database":"d","sandbox":{"http":["ok.example.com", "ftp://x"]}}"#,
        "den.json",
        &|_| None,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("sandbox.http[1]") && e.contains("scheme"), "{e}");
}

fn text(o: &Option<Output>) -> String {
    match o {
        Some(Output::Inline(s)) => s.clone(),
        other => format!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_den_runs_http_plugins_under_the_queues_list() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("http.db");
    let store = SqliteStore::open(&file).await.unwrap();
    let queue = |name: &str, sandbox: bson::Document| NewQueue {
        name: name.into(),
        plugin: "fetch".into(),
        threads: Some(2),
        sort: Sort::Fifo,
        extra: doc! {"sandbox": sandbox},
    };
    let listed = store
        .create_queue(queue("listed", doc! {"http": [format!("http://{}", server.addr)]}))
        .await
        .unwrap()
        .id;
    let unlisted = store.create_queue(queue("unlisted", doc! {})).await.unwrap().id;
    for q in [listed, unlisted] {
        store
            .create_tasks(q, vec![doc! {"url": server.url("/hello")}])
            .await
            .unwrap();
    }
    let den = DenProcess::start_embedded(&file, "http-node", json!({"plugins": ["fetch"]}));
    let done = TaskFilter {
        status: Some(vec![1, 2]),
        ..Default::default()
    };
    wait_for(Duration::from_secs(60), "both tasks to finish", || async {
        store.count_tasks(&done).await.unwrap() == 2
    })
    .await;
    drop(den);
    let all = Page {
        skip: 0,
        limit: 10,
        oldest_first: false,
    };
    for t in store.find_tasks(&TaskFilter::default(), all).await.unwrap() {
        let (stdout, stderr) = (text(&t.stdout), text(&t.stderr));
        if t.queue == listed {
            assert_eq!(t.status, 1, "{stdout}\n{stderr}");
            assert!(stdout.contains("hello from the test server"), "{stdout}");
        } else {
            assert_eq!(t.status, 2, "{stdout}\n{stderr}");
            assert!(stderr.contains("http-request-denied"), "{stderr}");
            assert!(stderr.contains("[disbatch: HTTP request to"), "{stderr}");
        }
    }
    assert_eq!(server.hits(), 1, "only the listed queue's task reached the server");
}
