//! Plugins written in Python (componentize-py) and JavaScript (ComponentizeJS) with the SDKs
//! of `plugins/sdk-python` and `plugins/sdk-js`: the demos behave like the Rust demo under
//! `runner exec`, the SDKs turn a thrown error or an invalid status into a clear failure,
//! and both demos run as tasks of a real DEN on the embedded store.
//!
//! The components are built by `plugins/build-py-js` (scripts/test runs it).

use crate::common;

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use common::web::Web;
use common::{plugins_dir, wait_for};
use serde_json::{json, Value};

const BUILD: &str = "plugins/build-py-js";

/// The compiled-component cache shared by every `runner` and DEN of this test binary.
fn cache_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().unwrap().keep()).clone()
}

/// The built component `name`, compiled into the shared cache once (a Python or JavaScript
/// component takes seconds to compile; tests wait for one compile instead of repeating it).
/// Panics saying how to build it when it is missing.
fn component(name: &str) -> PathBuf {
    static WARM: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let path = plugins_dir().join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "the plugin component {} is missing: build the Python and JavaScript plugins with `{BUILD}` \
         (it installs componentize-py and jco on first use; scripts/test runs it)",
        path.display()
    );
    let mut warm = WARM.lock().unwrap_or_else(|e| e.into_inner());
    if warm.get_or_insert_with(HashSet::new).insert(name.to_owned()) {
        let out = Command::new(env!("CARGO_BIN_EXE_runner"))
            .arg("check")
            .arg(&path)
            .env("DISBATCH_CACHE_DIR", cache_dir())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "runner check {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    path
}

/// `runner exec <name> --json --params <params>`: the exit code and the printed object.
fn exec(name: &str, params: &Value) -> (i32, Value) {
    exec_with(name, params, &[])
}

/// [`exec`] with more `runner exec` arguments.
fn exec_with(name: &str, params: &Value, args: &[&str]) -> (i32, Value) {
    let path = component(name);
    let out = Command::new(env!("CARGO_BIN_EXE_runner"))
        .arg("exec")
        .arg(&path)
        .args(["--json", "--params", &params.to_string()])
        .args(args)
        .env("DISBATCH_CACHE_DIR", cache_dir())
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{name} {params}: no JSON on stdout ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), v)
}

fn text(v: &Value, key: &str) -> String {
    v[key].as_str().unwrap_or_default().to_owned()
}

/// Runs one params document through the Rust demo and `demo`, and checks they agree on
/// exit code, status, stdout, the plugin's own stderr and failure kind.
fn same_as_rust_demo(demo: &str, params: Value) -> (i32, Value) {
    let (want_code, want) = exec("demo", &params);
    let (code, got) = exec(demo, &params);
    assert_eq!(code, want_code, "{demo} {params}: exit code\n{got}\nRust demo: {want}");
    assert_eq!(got["status"], want["status"], "{demo} {params}: status\n{got}");
    assert_eq!(got["stdout"], want["stdout"], "{demo} {params}: stdout");
    assert_eq!(got["failure"], want["failure"], "{demo} {params}: failure\n{got}");
    if want["failure"].is_null() {
        assert_eq!(got["stderr"], want["stderr"], "{demo} {params}: stderr");
    }
    (code, got)
}

fn demo_behaves_like_the_rust_demo(demo: &str) {
    let (code, v) = same_as_rust_demo(demo, json!({"message": "hey", "repeat": 3, "stderr": "note"}));
    assert_eq!(code, 0, "{v}");
    assert_eq!(text(&v, "stdout"), "hey\nhey\nhey\n");
    assert_eq!(text(&v, "stderr"), "note\n");
    let progress: Vec<(f64, String)> = v["progress"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["percent"].as_f64().unwrap(), text(p, "info")))
        .collect();
    assert_eq!(
        progress,
        [(0.0, "starting".to_owned()), (100.0, "done".to_owned())],
        "{v}"
    );

    let (_, v) = same_as_rust_demo(demo, json!({}));
    assert_eq!(text(&v, "stdout"), "hello\n");
    // Formatting characters are printed as they are; a long run of lines comes out whole.
    same_as_rust_demo(demo, json!({"message": "50% %s %d {}", "repeat": 2}));
    let (_, v) = same_as_rust_demo(demo, json!({"message": "line", "repeat": 50_000}));
    assert_eq!(text(&v, "stdout").len(), 50_000 * 5);
    same_as_rust_demo(demo, json!({"repeat": 0}));
    same_as_rust_demo(demo, json!({"stderr": null, "sleep_ms": null}));

    let (code, v) = same_as_rust_demo(demo, json!({"status": 7}));
    assert_eq!((code, v["status"].as_u64()), (1, Some(7)), "{v}");
    let (code, v) = same_as_rust_demo(demo, json!({"status": 0}));
    assert_eq!(code, 6, "status 0 reaches the host, which refuses it: {v}");
    assert_eq!(v["status"], 2, "{v}");

    let (_, v) = same_as_rust_demo(demo, json!({"sleep_ms": 300}));
    assert!(v["duration_ms"].as_f64().unwrap() >= 300.0, "{v}");

    for (params, field) in [
        (json!({"colour": "red"}), "colour"),
        (json!({"repeat": "many"}), "repeat"),
        (json!({"message": 5}), "message"),
    ] {
        let (code, v) = same_as_rust_demo(demo, params.clone());
        assert_eq!((code, v["status"].as_u64()), (1, Some(2)), "{demo} {params}: {v}");
        let error = text(&v, "error");
        assert!(
            error.starts_with("plugin error: invalid params: ") && error.contains(field),
            "{demo} {params}: the error names the field {field:?}: {error}"
        );
        assert_eq!(text(&v, "stdout"), "", "{demo} {params}: nothing ran");
    }
    let (_, v) = exec(demo, &json!([1, 2]));
    assert!(text(&v, "error").contains("invalid params"), "{v}");
}

#[test]
fn the_python_demo_behaves_like_the_rust_demo() {
    demo_behaves_like_the_rust_demo("demo-python");
}

#[test]
fn the_javascript_demo_behaves_like_the_rust_demo() {
    demo_behaves_like_the_rust_demo("demo-js");
}

/// `runner exec` of a pitfalls fixture must fail the task (status 2, exit 1) with an error
/// containing `error`; returns the printed object.
fn fails_with(name: &str, params: Value, error: &str) -> Value {
    let (code, v) = exec(name, &params);
    assert_eq!(code, 1, "{name} {params}: {v}");
    assert_eq!(v["status"], 2, "{name} {params}: the task failed: {v}");
    assert_eq!(v["failure"], "plugin-error", "{name} {params}: an err, not a trap: {v}");
    let got = text(&v, "error");
    assert!(got.contains(error), "{name} {params}: expected {error:?} in {got:?}");
    let stderr = text(&v, "stderr");
    assert!(
        stderr.ends_with(&format!("[disbatch: {got}]\n")),
        "{name} {params}: the task's stderr ends with the error: {stderr:?}"
    );
    assert_eq!(text(&v, "stdout"), "pitfalls: started\n", "{name} {params}");
    v
}

#[test]
fn javascript_fetch_reaches_listed_hosts_only() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello");
        }
    });
    let params = json!({"fetch": format!("http://{addr}/x")});
    let listed = format!("http://{addr}");
    let (code, v) = exec_with("pitfalls-js", &params, &["--http", &listed]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(text(&v, "stdout"), "pitfalls: started\nfetched 200: hello\n", "{v}");
    let (code, v) = exec("pitfalls-js", &params);
    assert_eq!(code, 1, "{v}");
    assert!(text(&v, "error").contains("NetworkError"), "{v}");
    let stderr = text(&v, "stderr");
    assert!(
        stderr.contains(&format!("[disbatch: HTTP request to {listed} refused")),
        "{stderr}"
    );
}

#[test]
fn the_javascript_sdk_turns_throws_and_bad_statuses_into_clear_failures() {
    let js = "pitfalls-js";
    let v = fails_with(
        js,
        json!({"throw": "disk is full"}),
        "plugin error: Error: disk is full",
    );
    let stderr = text(&v, "stderr");
    assert!(
        stderr.starts_with("Error: disk is full\n") && stderr.contains("app.js"),
        "the stack goes to stderr: {stderr}"
    );
    fails_with(js, json!({"task_error": "no input"}), "plugin error: no input");
    fails_with(js, json!({"throw_value": "plain text"}), "plugin error: plain text");
    fails_with(
        js,
        json!({"throw_value": {"code": 7}}),
        r#"plugin error: uncaught {"code":7}"#,
    );
    fails_with(js, json!({"throw_value": null}), "plugin error: uncaught null");

    for (status, shown) in [
        (json!(-1), "invalid status -1:"),
        (json!(1.5), "invalid status 1.5:"),
        (json!(4294967296u64), "invalid status 4294967296:"),
        (json!("7"), r#"invalid status "7" (a string):"#),
        (json!(true), "invalid status true (boolean):"),
    ] {
        let v = fails_with(js, json!({"status": status}), shown);
        assert!(text(&v, "error").contains("from 1 to 4294967295"), "{v}");
    }
    fails_with(
        js,
        json!({"undefined": true}),
        "invalid status undefined (nothing was returned)",
    );
    let (code, v) = exec(js, &json!({"status": 4294967295u64}));
    assert_eq!((code, v["status"].as_u64()), (1, Some(4294967295)), "{v}");
    let (code, v) = exec(js, &json!({}));
    assert_eq!((code, v["status"].as_u64()), (0, Some(1)), "{v}");
}

#[test]
fn the_python_sdk_turns_exceptions_and_bad_statuses_into_clear_failures() {
    let py = "pitfalls-python";
    let v = fails_with(
        py,
        json!({"raise": "disk is full"}),
        "plugin error: ValueError: disk is full",
    );
    let stderr = text(&v, "stderr");
    assert!(
        stderr.starts_with("Traceback (most recent call last):\n")
            && stderr.contains("app.py")
            && stderr.contains("ValueError: disk is full\n"),
        "the traceback goes to stderr: {stderr}"
    );
    assert!(!stderr.contains("disbatch_plugin.py"), "no SDK frames: {stderr}");
    fails_with(py, json!({"task_error": "no input"}), "plugin error: no input");
    fails_with(py, json!({"exit": 3}), "sys.exit(3) was called");

    for (status, shown) in [
        (json!(-1), "invalid status -1:"),
        (json!(4294967296u64), "invalid status 4294967296:"),
        (json!(1.0), "invalid status 1.0 (float):"),
        (json!("7"), "invalid status '7' (str):"),
        (json!(true), "invalid status True (bool):"),
    ] {
        let v = fails_with(py, json!({"status": status}), shown);
        assert!(text(&v, "error").contains("from 1 to 4294967295"), "{v}");
    }
    fails_with(py, json!({"none": true}), "invalid status None (nothing was returned)");
    let (code, v) = exec(py, &json!({"status": 4294967295u64}));
    assert_eq!((code, v["status"].as_u64()), (1, Some(4294967295)), "{v}");
    let (code, v) = exec(py, &json!({}));
    assert_eq!((code, v["status"].as_u64()), (0, Some(1)), "{v}");
}

/// Both SDKs' `submit`: an accepted follow-up is shown by `runner exec`; a refused one
/// fails the task with the host's reason, unless the plugin catches it.
#[test]
fn the_sdks_submit_follow_ups() {
    for name in ["pitfalls-python", "pitfalls-js"] {
        let params = json!({"submit": [{"queue": "b", "params": {"n": 1}}]});
        let (code, v) = exec_with(name, &params, &["--submit", "b"]);
        assert_eq!(code, 0, "{name}: {v}");
        assert_eq!(v["submitted"], json!([{"queue": "b", "params": {"n": 1}}]), "{name}");
        fails_with(
            name,
            params,
            "cannot submit to queue \"b\": this task's sandbox.submit does not grant it",
        );
        let (code, v) = exec_with(
            name,
            &json!({"submit": [{"queue": "b", "params": [1]}]}),
            &["--submit", "b"],
        );
        assert_eq!((code, &v["failure"]), (1, &json!("plugin-error")), "{name}: {v}");
        assert_eq!(
            v["error"], "plugin error: follow-up params must be a JSON object, got an array",
            "{name}"
        );
        assert_eq!(v["submitted"], json!([]), "{name}");
    }
}

#[test]
fn the_templates_greet() {
    for name in ["template-python", "template-js"] {
        let (code, v) = exec(name, &json!({"name": "you", "times": 2}));
        assert_eq!(code, 0, "{name}: {v}");
        assert_eq!(text(&v, "stdout"), "hello, you!\nhello, you!\n", "{name}");
        assert_eq!(text(&v, "stderr"), "greeted you 2 time(s)\n", "{name}");
        let (_, v) = exec(name, &json!({}));
        assert!(text(&v, "error").contains(r#"missing field "name""#), "{name}: {v}");
        let (_, v) = exec(name, &json!({"name": "you", "times": 0}));
        assert_eq!(
            text(&v, "error"),
            "plugin error: times must be at least 1",
            "{name}: {v}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_demos_run_as_tasks_of_a_den_on_the_embedded_store() {
    let plugins = plugins_dir();
    for name in ["demo-python", "demo-js", "pitfalls-python", "pitfalls-js"] {
        component(name);
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("py-js.db");
    let web = Web::start_embedded(&file, &["--plugin-dir", plugins.to_str().unwrap()]);
    let allowed = web.json(&["plugins"]);
    for name in ["demo-python", "demo-js", "pitfalls-python", "pitfalls-js"] {
        assert!(allowed.as_array().unwrap().contains(&json!(name)), "{allowed}");
        web.json(&["create-queue", name, name, "--threads", "2"]);
    }
    let create = |queue: &str, args: &[&str]| -> String {
        let mut all = vec!["create-task", queue, "--"];
        all.extend_from_slice(args);
        web.json(&all)["ids"][0].as_str().unwrap().to_owned()
    };
    let py = create(
        "demo-python",
        &["message", "from python", "repeat:=2", "stderr", "note"],
    );
    let js = create("demo-js", &["message", "from js", "repeat:=2", "sleep_ms:=50"]);
    let py_status = create("demo-python", &["status:=5"]);
    let js_unknown = create("demo-js", &["colour", "red"]);
    let py_raise = create("pitfalls-python", &["raise", "disk is full"]);
    let js_throw = create("pitfalls-js", &["throw", "disk is full"]);
    let js_minus = create("pitfalls-js", &["status:=-1"]);
    let ids = [&py, &js, &py_status, &js_unknown, &py_raise, &js_throw, &js_minus];

    let mut den = Command::new(env!("CARGO_BIN_EXE_den"))
        .arg("--embedded")
        .arg(&file)
        .arg("--plugin-dir")
        .arg(&plugins)
        .env_remove("DISBATCH_CONFIG")
        .env("DISBATCH_NODE", "py-js")
        .env("DISBATCH_CACHE_DIR", cache_dir())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let finished = |t: &Value| t["status"].as_i64().is_some_and(|s| s > 0);
    wait_for(Duration::from_secs(120), "every task to finish", || {
        let all = ids.iter().all(|id| finished(&web.json(&["task", id])));
        async move { all }
    })
    .await;
    let task = |id: &str| web.json(&["task", id]);

    let t = task(&py);
    assert_eq!(t["status"], 1, "{t}");
    assert_eq!(t["stdout"], "from python\nfrom python\n", "{t}");
    assert_eq!(t["stderr"], "note\n", "{t}");
    assert_eq!(t["node"], "py-js", "{t}");
    let t = task(&js);
    assert_eq!(t["status"], 1, "{t}");
    assert_eq!(t["stdout"], "from js\nfrom js\n", "{t}");
    assert_eq!(t["stderr"], "", "{t}");
    let t = task(&py_status);
    assert_eq!(
        (t["status"].as_i64(), text(&t, "stdout")),
        (Some(5), "hello\n".into()),
        "{t}"
    );

    for (id, want) in [
        (&js_unknown, r#"invalid params: unknown field "colour""#),
        (&py_raise, "ValueError: disk is full"),
        (&js_throw, "Error: disk is full"),
        (&js_minus, "invalid status -1:"),
    ] {
        let t = task(id);
        assert_eq!(t["status"], 2, "{t}");
        let stderr = text(&t, "stderr");
        assert!(
            stderr.contains(&format!("[disbatch: plugin error: {want}")),
            "expected {want:?} in the task's stderr: {t}"
        );
    }

    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(den.id() as i32, libc::SIGTERM) }, 0);
    let status = den.wait().unwrap();
    assert!(status.success(), "{status:?}");
}
