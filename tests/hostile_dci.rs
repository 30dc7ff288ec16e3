//! The DCI under hostile clients, as real `disbatch web --embedded` and `disbatch dev`
//! processes with a lowered open-files limit: a flood of idle connections neither takes
//! the API down nor starves the DEN of file descriptors; slowloris heads and idle
//! keep-alive connections are cut while long-polls are not; a stalled upload gives up
//! the upload turn; a foreign `Host` or `Origin` cannot write (DNS rebinding).

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use common::http::{raw_body, raw_http};
use common::{plugin_path, plugins_dir, wait_for};
use disbatch::launch::serve::fd_reserve;
use serde_json::{json, Value};

/// The open-files limit (soft and hard) of the processes under test.
const NOFILE: u64 = 400;

/// The connection cap the server gets under [`NOFILE`].
fn cap() -> usize {
    (NOFILE - fd_reserve(NOFILE)) as usize
}

/// A `disbatch` process under test; killed when dropped.
struct Proc {
    child: Child,
    addr: SocketAddr,
    url: String,
    log: std::path::PathBuf,
    _stdout: BufReader<ChildStdout>,
    _dir: tempfile::TempDir,
}

impl Proc {
    /// Starts `disbatch <args>` with RLIMIT_NOFILE lowered to [`NOFILE`] and waits for its
    /// line starting with `prefix`, followed by the URL it serves.
    fn start(args: &[&std::ffi::OsStr], prefix: &str, dir: tempfile::TempDir) -> Proc {
        let log = dir.path().join("stderr.log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_disbatch"));
        cmd.args(args)
            .env("DISBATCH_CACHE_DIR", dir.path().join("cache"))
            .env_remove("DISBATCH_CONFIG")
            .env_remove("DISBATCH_API_TOKEN")
            .env_remove("DISBATCH_BIND")
            .env_remove("DISBATCH_PLUGIN_DIR")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap());
        common::limit_open_files(&mut cmd, NOFILE);
        let mut child = cmd.spawn().expect("start disbatch");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let url = line
            .trim()
            .strip_prefix(prefix)
            .unwrap_or_else(|| {
                panic!(
                    "unexpected first line {line:?}:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                )
            })
            .trim_end_matches('/')
            .to_owned();
        let addr = url.strip_prefix("http://").unwrap().parse().unwrap();
        Proc {
            child,
            addr,
            url,
            log,
            _stdout: stdout,
            _dir: dir,
        }
    }

    /// `disbatch web --embedded` with the `demo` plugin and the config keys of `config`.
    fn web(config: Value) -> Proc {
        let dir = tempfile::tempdir().unwrap();
        let mut full = json!({"plugins": ["demo"], "plugin_dir": plugins_dir()});
        for (k, v) in config.as_object().unwrap() {
            full[k] = v.clone();
        }
        let path = dir.path().join("web.json");
        std::fs::write(&path, full.to_string()).unwrap();
        let db = dir.path().join("d.db");
        let args = [
            "web".as_ref(),
            "--bind".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--embedded".as_ref(),
            db.as_os_str(),
            "--config".as_ref(),
            path.as_os_str(),
        ];
        Proc::start(&args, "disbatch web: listening on ", dir)
    }

    /// `disbatch dev` with its defaults, the example plugins and a fresh store.
    fn dev() -> Proc {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("dev.db");
        let plugins = plugins_dir();
        let args = [
            "dev".as_ref(),
            "--bind".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--db".as_ref(),
            db.as_os_str(),
            "--plugin-dir".as_ref(),
            plugins.as_os_str(),
        ];
        Proc::start(&args, "disbatch dev: web UI and API at ", dir)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// How many sockets the process has open: its listener and the connections it
    /// accepted (other descriptors, such as the store's files, come and go with its work).
    fn sockets(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|target| target.to_string_lossy().starts_with("socket:"))
            .count()
    }

    /// `count` connections that send nothing.
    fn flood(&self, count: usize) -> Vec<TcpStream> {
        (0..count)
            .map(|i| TcpStream::connect(self.addr).unwrap_or_else(|e| panic!("connection {i}: {e}")))
            .collect()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client that waits long enough for a connection past the cap to be served, on a new
/// connection for each request (the servers under test close idle ones within seconds).
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

/// Reads from `s` until the server closes it (or it fails); panics past `limit`.
fn read_until_closed(s: &mut TcpStream, limit: Duration) -> Vec<u8> {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                panic!(
                    "the server kept the connection open for {limit:?}; read {:?}",
                    String::from_utf8_lossy(&got)
                )
            }
            Err(_) => return got,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_connections_past_the_cap_waits_and_the_api_keeps_answering() {
    let web = Proc::web(json!({"http_header_timeout": 2, "http_idle_timeout": 2}));
    let http = client();
    let info = format!("{}/info", web.url);
    assert_eq!(http.get(&info).send().await.unwrap().status(), 200);
    let base = web.sockets();
    let flood = web.flood(cap() * 2 + 20);
    let mut peak = web.sockets();
    // A fresh client is served once the idle ones ahead of it are cut.
    let start = Instant::now();
    let fresh = client().get(&info).send().await.unwrap();
    let waited = start.elapsed();
    assert_eq!(fresh.status(), 200, "{}", web.log());
    peak = peak.max(web.sockets());
    eprintln!(
        "cap {}, {} idle connections held: sockets {base} before, at most {peak} during; a fresh GET /info waited {waited:?}",
        cap(),
        flood.len()
    );
    assert!(
        peak <= base + cap() + 2,
        "{peak} sockets open while the flood is held ({base} before, cap {})",
        cap()
    );
    drop(flood);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disbatch_dev_runs_a_task_submitted_while_a_flood_is_held() {
    let dev = Proc::dev();
    // A client connected before the flood keeps its (keep-alive) connection.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .pool_max_idle_per_host(1)
        .build()
        .unwrap();
    let queues: Value = http
        .get(format!("{}/queues", dev.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(queues.to_string().contains("demo"), "{queues}");
    let base = dev.sockets();
    // More connections than the whole open-files limit.
    let flood = dev.flood(NOFILE as usize + 50);
    let mut peak = dev.sockets();
    let created: Value = http
        .post(format!("{}/tasks", dev.url))
        .json(&json!({"queue": "demo", "params": [{"message": "under siege"}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["ids"][0]
        .as_str()
        .unwrap_or_else(|| panic!("no task created: {created}"))
        .to_owned();
    let url = format!("{}/tasks/{id}?shape=native", dev.url);
    wait_for(Duration::from_secs(120), "the task to end", || {
        let request = http.get(&url).send();
        async move {
            let task: Value = request.await.unwrap().json().await.unwrap();
            task["status"]
                .as_i64()
                .and_then(|s| i32::try_from(s).ok())
                .is_some_and(disbatch::model::status::finished)
        }
    })
    .await;
    let task: Value = http.get(&url).send().await.unwrap().json().await.unwrap();
    peak = peak.max(dev.sockets());
    eprintln!(
        "cap {}, {} connections held: sockets {base} before, at most {peak} during",
        cap(),
        flood.len()
    );
    assert_eq!(task["status"], 1, "{task}\n{}", dev.log());
    assert!(
        task["stdout"].as_str().is_some_and(|s| s.contains("under siege")),
        "{task}"
    );
    assert!(
        peak <= base + cap() + 2,
        "{peak} sockets open ({base} before, cap {})",
        cap()
    );
    drop(flood);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_head_and_an_idle_keep_alive_connection_are_cut() {
    let web = Proc::web(json!({"http_header_timeout": 2, "http_idle_timeout": 3}));
    // Half a request head, then nothing.
    let mut slow = TcpStream::connect(web.addr).unwrap();
    slow.write_all(b"GET /info HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        .unwrap();
    let start = Instant::now();
    let got = read_until_closed(&mut slow, Duration::from_secs(25));
    eprintln!("half a head: closed after {:?}", start.elapsed());
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
    assert!(start.elapsed() >= Duration::from_millis(1500), "{:?}", start.elapsed());

    // A whole request answered, then an idle keep-alive connection.
    let mut idle = TcpStream::connect(web.addr).unwrap();
    idle.write_all(b"GET /info HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let start = Instant::now();
    let got = String::from_utf8(read_until_closed(&mut idle, Duration::from_secs(25))).unwrap();
    eprintln!("idle keep-alive connection: closed after {:?}", start.elapsed());
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(!got.to_ascii_lowercase().contains("connection: close"), "{got}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_that_ask_and_never_read_lose_their_slots() {
    const SLOTS: usize = 4;
    let web = Proc::web(json!({"http_max_connections": SLOTS, "http_header_timeout": 2, "http_idle_timeout": 2}));
    // Every slot taken by a client that pipelines requests for a large answer (the OpenAPI
    // document, ~90 KB) and never reads: the server's writes back up.
    let request = b"GET /openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".repeat(100);
    let mut stalled = Vec::new();
    for _ in 0..SLOTS {
        let mut s = TcpStream::connect(web.addr).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
        // Until the server stops reading (its answers wait for a reader), at most ~100 MB.
        for _ in 0..10 {
            if s.write_all(&request).is_err() {
                break;
            }
        }
        stalled.push(s);
    }
    // A new client is served once the stalled ones are cut: before, never.
    let start = Instant::now();
    let info = client()
        .get(format!("{}/info", web.url))
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .unwrap_or_else(|e| panic!("a new client was not served: {e}\n{}", web.log()));
    eprintln!("a new client was served after {:?}", start.elapsed());
    assert_eq!(info.status(), 200);
    drop(stalled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_longer_than_the_timeouts_gets_its_answer() {
    let web = Proc::web(json!({"http_header_timeout": 1, "http_idle_timeout": 1}));
    let http = client();
    let r = http
        .post(format!("{}/queues", web.url))
        .json(&json!({"name": "q", "plugin": "demo"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let created: Value = http
        .post(format!("{}/tasks", web.url))
        .json(&json!({"queue": "q", "params": [{}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["ids"][0].as_str().unwrap();
    // No DEN runs it: the wait lasts its whole timeout, 4 times the idle timeout.
    let start = Instant::now();
    let r = http
        .get(format!("{}/tasks/wait?ids={id}&timeout=4s", web.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["done"], false, "{body}");
    assert!(start.elapsed() >= Duration::from_secs(4), "{:?}", start.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upload_is_cut_with_408_and_the_next_upload_goes_on() {
    let web = Proc::web(json!({"http_body_timeout": 2}));
    let wasm = std::fs::read(plugin_path("demo")).unwrap();
    let mut stalled = TcpStream::connect(web.addr).unwrap();
    write!(
        stalled,
        "POST /plugins?name=stalled HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/wasm\r\n\
         Content-Length: {}\r\n\r\n",
        wasm.len()
    )
    .unwrap();
    stalled.write_all(&wasm[..1000]).unwrap();
    let addr = web.addr;
    let cut = std::thread::spawn(move || {
        let got = read_until_closed(&mut stalled, Duration::from_secs(60));
        String::from_utf8_lossy(&got).into_owned()
    });
    let start = Instant::now();
    let r = client()
        .post(format!("{}/plugins?name=second", web.url))
        .header("content-type", "application/wasm")
        .body(wasm.clone())
        .send()
        .await
        .unwrap();
    let waited = start.elapsed();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let answer = cut.join().unwrap();
    eprintln!("the second upload took {waited:?}; the stalled one got {answer:?}");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    let error: Value = serde_json::from_str(raw_body(&answer)).unwrap();
    let error = error["error"].as_str().unwrap();
    assert!(
        error.contains("stalled") && error.contains("http_body_timeout"),
        "{error}"
    );
    let listed: Value = client()
        .get(format!("http://{addr}/plugins?full=1"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let names: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert!(names.contains(&"second") && !names.contains(&"stalled"), "{listed}");
}

/// A raw request to `addr` with `host` as Host and the extra `headers`.
async fn raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    host: &str,
    headers: &str,
    body: &str,
) -> (Option<u16>, String) {
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{headers}Content-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    raw_http(addr, request.as_bytes(), false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_host_or_origin_cannot_write_dns_rebinding() {
    let web = Proc::web(json!({"cors_origins": ["http://ui.example"]}));
    let addr = web.addr;
    let own = addr.to_string();
    let queue = |name: &str| json!({"name": name, "plugin": "demo"}).to_string();

    // A page on evil.example whose name now points at 127.0.0.1.
    let (status, answer) = raw(
        addr,
        "POST",
        "/queues",
        "evil.example:1234",
        "Origin: http://evil.example:1234\r\n",
        &queue("evil"),
    )
    .await;
    assert_eq!(status, Some(403), "{answer}");
    let error = raw_body(&answer);
    assert!(error.contains("Host") && error.contains("allowed_hosts"), "{error}");
    let (status, answer) = raw(addr, "GET", "/queues", "evil.example", "", "").await;
    assert_eq!(status, Some(403), "reads too: {answer}");

    // Our own Host, but a write from another site.
    let (status, answer) = raw(
        addr,
        "POST",
        "/queues",
        &own,
        "Origin: http://evil.example\r\n",
        &queue("cross"),
    )
    .await;
    assert_eq!(status, Some(403), "{answer}");
    let error = raw_body(&answer);
    assert!(error.contains("Origin") && error.contains("cors_origins"), "{error}");

    // The CLI (no Origin), the web UI (its own origin) and an origin of cors_origins.
    for (name, headers) in [
        ("cli", String::new()),
        ("ui", format!("Origin: http://{own}\r\n")),
        ("allowed", "Origin: http://ui.example\r\n".to_owned()),
    ] {
        let (status, answer) = raw(addr, "POST", "/queues", &own, &headers, &queue(name)).await;
        assert!(matches!(status, Some(200 | 201)), "{name}: {answer}");
    }
    let (status, answer) = raw(addr, "GET", "/queues", &format!("localhost:{}", addr.port()), "", "").await;
    assert_eq!(status, Some(200), "{answer}");
    let names: Vec<String> = serde_json::from_str::<Value>(raw_body(&answer))
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|q| q["name"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(names.len(), 3, "nothing written by the refused requests: {names:?}");
    assert!(!names.iter().any(|n| n == "evil" || n == "cross"), "{names:?}");
}
