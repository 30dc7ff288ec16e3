//! The sandbox, through the library: every example plugin, every limit proven by a hostile
//! plugin, and the grants.

use crate::common;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use disbatch::runner::{EngineOptions, Failure, Outcome, Progress, Runner, Sandbox};

fn runner() -> &'static Runner {
    static RUNNER: OnceLock<Runner> = OnceLock::new();
    RUNNER.get_or_init(|| {
        let cache = tempfile::tempdir().unwrap().keep();
        Runner::new(&EngineOptions {
            cache_dir: Some(cache),
            max_instances: 16,
        })
        .unwrap()
    })
}

fn run(plugin: &str, params: &str, sandbox: &Sandbox) -> Outcome {
    let path = common::plugins_dir().join(format!("{plugin}.wasm"));
    runner().run_file(&path, params, sandbox, None)
}

fn stdout(o: &Outcome) -> String {
    String::from_utf8(o.stdout.bytes.clone()).unwrap()
}

fn stderr(o: &Outcome) -> String {
    String::from_utf8_lossy(&o.stderr.bytes).into_owned()
}

#[test]
fn demo_defaults_print_hello_and_succeed() {
    let o = run("demo", "{}", &Sandbox::default());
    assert_eq!(o.failure, None);
    assert_eq!(o.status, 1);
    assert_eq!(stdout(&o), "hello\n");
    assert_eq!(stderr(&o), "");
    assert!(o.succeeded());
    assert!(!o.progress.is_empty(), "demo reports progress");
    assert_eq!(o.progress.last().unwrap().percent, Some(100.0));
}

#[test]
fn demo_params_shape_the_output_and_status() {
    let o = run(
        "demo",
        r#"{"message":"hi there","repeat":3,"stderr":"careful","status":7}"#,
        &Sandbox::default(),
    );
    assert_eq!(o.failure, None);
    assert_eq!(o.status, 7);
    assert_eq!(stdout(&o), "hi there\nhi there\nhi there\n");
    assert!(stderr(&o).contains("careful"));
}

#[test]
fn progress_reaches_the_sink_while_running() {
    let seen: Arc<Mutex<Vec<Progress>>> = Arc::default();
    let sink_seen = seen.clone();
    let path = common::plugins_dir().join("demo.wasm");
    let o = runner().run_file(
        &path,
        "{}",
        &Sandbox::default(),
        Some(Arc::new(move |p: &Progress| sink_seen.lock().unwrap().push(p.clone()))),
    );
    assert!(o.succeeded());
    assert_eq!(*seen.lock().unwrap(), o.progress);
}

#[test]
fn status_zero_is_rejected_as_failed() {
    let o = run("demo", r#"{"status":0}"#, &Sandbox::default());
    assert_eq!(o.status, 2);
    assert_eq!(o.failure, Some(Failure::NonPositiveStatus(0)));
    let (_, err) = o.output_texts();
    assert!(err.contains("must be positive"), "{err}");
}

#[test]
fn plugin_error_fails_with_its_message() {
    let o = run("fail", r#"{"message":"disk on fire"}"#, &Sandbox::default());
    assert_eq!(o.status, 2);
    assert_eq!(o.failure, Some(Failure::Plugin("disk on fire".into())));
    let (_, err) = o.output_texts();
    assert!(err.contains("plugin error: disk on fire"), "{err}");
}

#[test]
fn infinite_loop_is_interrupted_at_the_timeout() {
    let sandbox = Sandbox {
        timeout: Duration::from_millis(300),
        ..Sandbox::default()
    };
    let t = Instant::now();
    let o = run("spin", "{}", &sandbox);
    assert_eq!(o.failure, Some(Failure::Timeout(Duration::from_millis(300))));
    assert_eq!(o.status, 2);
    assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
}

#[test]
fn a_long_sleep_ends_at_the_timeout() {
    let sandbox = Sandbox {
        timeout: Duration::from_millis(300),
        ..Sandbox::default()
    };
    // The sleep asked for is ten minutes: ending well before it shows the timeout ended
    // the task, with room for a first compile on a loaded machine.
    let t = Instant::now();
    let o = run("demo", r#"{"sleep_ms":600000}"#, &sandbox);
    assert_eq!(o.failure, Some(Failure::Timeout(Duration::from_millis(300))));
    assert!(t.elapsed() < Duration::from_secs(120), "took {:?}", t.elapsed());
}

#[test]
fn a_short_sleep_within_the_timeout_completes() {
    let t = Instant::now();
    let o = run("demo", r#"{"sleep_ms":200}"#, &Sandbox::default());
    assert!(o.succeeded(), "{:?}", o.failure);
    assert!(t.elapsed() >= Duration::from_millis(200));
}

#[test]
fn memory_bomb_hits_the_memory_limit() {
    let sandbox = Sandbox {
        memory: 64 << 20,
        ..Sandbox::default()
    };
    let o = run("alloc", r#"{"mib":512}"#, &sandbox);
    assert_eq!(o.status, 2);
    match &o.failure {
        Some(Failure::Memory { limit }) => assert_eq!(*limit, 64 << 20),
        Some(Failure::Plugin(msg)) => assert!(msg.contains("memory limit"), "{msg}"),
        other => panic!("expected a memory failure, got {other:?}"),
    }
}

#[test]
fn allocation_within_the_limit_succeeds() {
    let sandbox = Sandbox {
        memory: 256 << 20,
        ..Sandbox::default()
    };
    let o = run("alloc", r#"{"mib":64}"#, &sandbox);
    assert!(o.succeeded(), "{:?} {}", o.failure, stderr(&o));
}

#[test]
fn output_flood_is_capped_and_reported() {
    let sandbox = Sandbox {
        output_cap: 1 << 20,
        ..Sandbox::default()
    };
    let o = run("flood", r#"{"mib":8,"stderr":true}"#, &sandbox);
    assert!(o.succeeded(), "the plugin is not killed for printing: {:?}", o.failure);
    assert_eq!(o.stdout.bytes.len(), 1 << 20);
    assert_eq!(o.stdout.dropped, 7 << 20);
    assert_eq!(o.stderr.bytes.len(), 1 << 20);
    let (out, err) = o.output_texts();
    assert!(out.ends_with("[disbatch: output truncated at 1 MiB (1048576 bytes); 7340032 more bytes were dropped]\n"));
    assert!(err.contains("output truncated at 1 MiB"));
}

#[test]
fn large_output_under_the_cap_is_kept_whole() {
    let o = run(
        "demo",
        r#"{"message":"0123456789abcdef","repeat":100000}"#,
        &Sandbox::default(),
    );
    assert!(o.succeeded());
    assert_eq!(o.stdout.bytes.len(), 17 * 100_000);
    assert!(!o.stdout.truncated());
}

#[derive(serde::Deserialize)]
struct EscapeReport {
    read: std::collections::BTreeMap<String, String>,
    write: std::collections::BTreeMap<String, String>,
    env: std::collections::BTreeMap<String, String>,
    args: Vec<String>,
    connect: String,
}

fn escape(params: &str, sandbox: &Sandbox) -> EscapeReport {
    let o = run("escape", params, sandbox);
    assert!(o.succeeded(), "{:?} {}", o.failure, stderr(&o));
    serde_json::from_slice(&o.stdout.bytes).expect("escape prints a JSON report")
}

#[test]
fn escape_gets_nothing_by_default() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let r = escape(
        &format!(r#"{{"read":["/etc/passwd","/","."],"write":["/tmp/escaped"],"connect":"{addr}"}}"#),
        &Sandbox::default(),
    );
    for (path, result) in &r.read {
        assert!(result.starts_with("err:"), "read {path}: {result}");
    }
    assert!(r.write["/tmp/escaped"].starts_with("err:"));
    assert!(!std::path::Path::new("/tmp/escaped").exists());
    assert!(r.env.is_empty(), "env leaked: {:?}", r.env);
    assert!(r.args.len() <= 1, "args: {:?}", r.args);
    assert!(r.connect.starts_with("err:"), "connect: {}", r.connect);
    listener.set_nonblocking(true).unwrap();
    assert!(listener.accept().is_err(), "no connection reached the host");
}

#[test]
fn escape_gets_exactly_what_is_granted() {
    let ro = tempfile::tempdir().unwrap();
    let rw = tempfile::tempdir().unwrap();
    std::fs::write(ro.path().join("input.txt"), "granted data").unwrap();
    let sandbox = Sandbox {
        dirs: vec![
            format!("{}:/in", ro.path().display()).parse().unwrap(),
            format!("{}:/out:rw", rw.path().display()).parse().unwrap(),
        ],
        env: [("GREETING".to_owned(), "hi".to_owned())].into(),
        ..Sandbox::default()
    };
    let r = escape(
        r#"{"read":["/in/input.txt","/etc/passwd","/in/../../etc/passwd"],"write":["/in/new.txt","/out/new.txt"]}"#,
        &sandbox,
    );
    assert_eq!(r.read["/in/input.txt"], "ok: granted data");
    assert!(r.read["/etc/passwd"].starts_with("err:"));
    assert!(
        r.read["/in/../../etc/passwd"].starts_with("err:"),
        "{}",
        r.read["/in/../../etc/passwd"]
    );
    assert!(
        r.write["/in/new.txt"].starts_with("err:"),
        "read-only grant: {}",
        r.write["/in/new.txt"]
    );
    assert!(!ro.path().join("new.txt").exists());
    assert_eq!(r.write["/out/new.txt"], "ok");
    assert_eq!(
        std::fs::read_to_string(rw.path().join("new.txt")).unwrap(),
        "escape was here"
    );
    assert_eq!(r.env, [("GREETING".to_owned(), "hi".to_owned())].into());
}

#[test]
fn files_that_are_not_plugins_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("notes.wasm");
    std::fs::write(&text, "not wasm at all").unwrap();
    let core = dir.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    for (path, expected) in [
        (text.as_path(), "not a WebAssembly file"),
        (core.as_path(), "core WebAssembly module"),
        (dir.path().join("missing.wasm").as_path(), "cannot read plugin"),
    ] {
        let o = runner().run_file(path, "{}", &Sandbox::default(), None);
        match &o.failure {
            Some(Failure::InvalidComponent(msg)) => assert!(msg.contains(expected), "{msg}"),
            other => panic!("{}: {other:?}", path.display()),
        }
        assert_eq!(o.status, 2);
    }
}

#[test]
fn a_second_load_uses_the_compiled_cache() {
    let cache = tempfile::tempdir().unwrap();
    let opts = EngineOptions {
        cache_dir: Some(cache.path().to_owned()),
        max_instances: 4,
    };
    let path = common::plugins_dir().join("demo.wasm");
    let first = Runner::new(&opts).unwrap();
    assert!(!first.load(&path).unwrap().from_cache());
    let cached: Vec<_> = std::fs::read_dir(cache.path()).unwrap().collect();
    assert_eq!(cached.len(), 1, "one artifact cached");
    let second = Runner::new(&opts).unwrap();
    let plugin = second.load(&path).unwrap();
    assert!(
        plugin.from_cache(),
        "the second engine deserialized the cached artifact"
    );
    let o = second.run(&plugin, "{}", &Sandbox::default(), None);
    assert!(o.succeeded());
}

#[test]
fn concurrent_tasks_are_isolated() {
    let handles: Vec<_> = (0..8)
        .map(|i| {
            std::thread::spawn(move || {
                let o = run(
                    "demo",
                    &format!(r#"{{"message":"task {i}","repeat":2}}"#),
                    &Sandbox::default(),
                );
                assert!(o.succeeded());
                assert_eq!(stdout(&o), format!("task {i}\ntask {i}\n"));
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}
