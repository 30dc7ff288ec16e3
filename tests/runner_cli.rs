//! The `runner` binary: `runner exec` runs plugins exactly as the library does, with the
//! documented output formats and exit codes.

use crate::common;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn plugin(name: &str) -> PathBuf {
    common::plugins_dir().join(format!("{name}.wasm"))
}

fn runner(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_runner"))
        .args(args)
        .env("DISBATCH_CACHE_DIR", cache_dir())
        .output()
        .expect("run the runner binary")
}

fn cache_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().unwrap().keep()).clone()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn exec_demo_prints_streams_and_exits_zero() {
    let demo = plugin("demo");
    let o = runner(&[
        "exec",
        demo.to_str().unwrap(),
        "--params",
        r#"{"message":"hey","repeat":2,"stderr":"note"}"#,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "hey\nhey\n");
    let err = text(&o.stderr);
    assert!(err.contains("note"));
    assert!(err.contains("progress 100.0%"), "progress lines go to stderr: {err}");
}

#[test]
fn exec_json_prints_one_object() {
    let demo = plugin("demo");
    let o = runner(&["exec", demo.to_str().unwrap(), "--json", "--params", r#"{"status":3}"#]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["status"], 3);
    assert_eq!(v["stdout"], "hello\n");
    assert_eq!(v["stderr"], "");
    assert!(v["duration_ms"].as_f64().unwrap() >= 0.0);
    assert!(v["error"].is_null());
}

#[test]
fn exec_json_reports_the_failure() {
    let fail = plugin("fail");
    let o = runner(&[
        "exec",
        fail.to_str().unwrap(),
        "--json",
        "--params",
        r#"{"message":"nope"}"#,
    ]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["status"], 2);
    assert_eq!(v["error"], "plugin error: nope");
    assert_eq!(v["failure"], "plugin-error");
}

#[test]
fn exit_codes_tell_the_failure_apart() {
    let cases: [(&str, &[&str], i32); 4] = [
        ("spin", &["--timeout", "200ms"], 3),
        ("alloc", &["--memory", "32", "--params", r#"{"mib":256}"#], 4),
        ("demo", &["--params", r#"{"status":0}"#], 6),
        ("fail", &[], 1),
    ];
    for (name, extra, code) in cases {
        let p = plugin(name);
        let mut args = vec!["exec", p.to_str().unwrap()];
        args.extend_from_slice(extra);
        let o = runner(&args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{name}: {err}");
        assert!(err.contains("runner: "), "{name} explains itself: {err}");
    }
}

#[test]
fn params_come_from_a_file_or_stdin() {
    let demo = plugin("demo");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.json");
    std::fs::write(&file, r#"{"message":"from file"}"#).unwrap();
    let o = runner(&[
        "exec",
        demo.to_str().unwrap(),
        "--params",
        &format!("@{}", file.display()),
    ]);
    assert_eq!(text(&o.stdout), "from file\n");

    let mut child = Command::new(env!("CARGO_BIN_EXE_runner"))
        .args(["exec", demo.to_str().unwrap(), "--params", "-"])
        .env("DISBATCH_CACHE_DIR", cache_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"message":"from stdin"}"#)
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(text(&o.stdout), "from stdin\n");
}

#[test]
fn bad_input_is_one_clear_line_and_exit_2() {
    let demo = plugin("demo");
    let dir = tempfile::tempdir().unwrap();
    let not_wasm = dir.path().join("x.wasm");
    std::fs::write(&not_wasm, "hello").unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--params".into(), "{not json".into()],
            "invalid params JSON in --params",
        ),
        (
            vec!["--params".into(), "@/no/such/params.json".into()],
            "cannot read params file /no/such/params.json",
        ),
        (vec!["--dir".into(), "/no/such/dir".into()], "/no/such/dir"),
    ];
    for (extra, expected) in cases {
        let mut args = vec!["exec".to_owned(), demo.to_str().unwrap().to_owned()];
        args.extend(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = runner(&args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains(expected), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    }
    for (path, expected) in [
        (not_wasm.to_str().unwrap(), "not a WebAssembly file"),
        ("/no/such/plugin.wasm", "does not exist"),
    ] {
        let o = runner(&["exec", path]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains(expected), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    }
}

#[test]
fn grants_reach_the_plugin() {
    let escape = plugin("escape");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f.txt"), "shared").unwrap();
    let grant = format!("{}:/data", dir.path().display());
    let o = runner(&[
        "exec",
        escape.to_str().unwrap(),
        "--dir",
        &grant,
        "--env",
        "MODE=test",
        "--params",
        r#"{"read":["/data/f.txt"],"write":[]}"#,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["read"]["/data/f.txt"], "ok: shared");
    assert_eq!(v["env"], serde_json::json!({"MODE": "test"}));
}

#[test]
fn check_accepts_plugins_and_refuses_other_files() {
    let demo = plugin("demo");
    let o = runner(&["check", demo.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    let shown = text(&o.stdout);
    assert!(shown.contains("ok (sha256 "), "{shown}");
    assert!(
        shown.contains("disbatch:plugin 0.2.0): this host can run it"),
        "{shown}"
    );
    assert!(shown.contains("  exports\n    run (func)\n"), "{shown}");
    assert!(shown.contains("disbatch:plugin/host@0.2.0 (instance)"), "{shown}");
    assert!(!shown.contains("NOT PROVIDED"), "{shown}");
    let o = runner(&["check", "/etc/hostname"]);
    assert_eq!(o.status.code(), Some(2));

    // Why not, import by import.
    let o = runner(&["check", plugin("badimport").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let shown = text(&o.stdout);
    assert!(shown.contains("example:needy/missing@0.1.0 (instance)"), "{shown}");
    assert!(shown.contains("NOT PROVIDED by this host"), "{shown}");
    assert!(shown.contains("this host cannot run it: "), "{shown}");
    let o = runner(&["check", plugin("wrongworld").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let shown = text(&o.stdout);
    assert!(
        shown.contains("does not implement the disbatch:plugin/plugin world: no export `run`"),
        "{shown}"
    );
}

/// A component whose `run` calls through `bundles` core instances made of exports, around
/// `instantiations` instances of a module exporting one function.
fn instances_component(instantiations: usize, bundles: usize) -> Vec<u8> {
    let mut prelude = String::from("(core module $f (func (export \"f\")))\n");
    for i in 0..instantiations {
        prelude.push_str(&format!("(core instance $i{i} (instantiate $f))\n"));
    }
    for b in 0..bundles {
        prelude.push_str(&format!("(core instance $b{b} (export \"f\" (func $i0 \"f\")))\n"));
    }
    common::components::component_with(&prelude, common::components::RETURNS_OK)
}

#[test]
fn check_warns_of_a_cap_only_when_a_task_would_pass_it() {
    let dir = tempfile::tempdir().unwrap();
    // 40 bundles of exports and 2 instantiations (the main module's included): 42 core
    // instances declared, 2 created by a task. No note, and the task runs.
    let bundles = dir.path().join("bundles.wasm");
    std::fs::write(&bundles, instances_component(1, 40)).unwrap();
    let o = runner(&["check", bundles.to_str().unwrap()]);
    let shown = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{shown}{}", text(&o.stderr));
    assert!(shown.contains("2 instantiations of them"), "{shown}");
    assert!(!shown.contains("note:") && !shown.contains("over the"), "{shown}");
    assert!(shown.contains("this host can run it"), "{shown}");
    let o = runner(&["exec", bundles.to_str().unwrap(), "--params", "{}"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));

    // 33 instantiations and the main module: over the cap of 32. check says so, naming the
    // cap, and so does exec, which cannot run it either.
    let hog = dir.path().join("hog.wasm");
    std::fs::write(&hog, instances_component(33, 0)).unwrap();
    let o = runner(&["check", hog.to_str().unwrap()]);
    let shown = text(&o.stdout);
    assert_eq!(o.status.code(), Some(2), "{shown}");
    assert!(shown.contains("34 instantiations of them"), "{shown}");
    assert!(shown.contains("this host cannot run it: "), "{shown}");
    assert!(
        shown.contains("the plugin exceeds the limit of 32 core instances per task"),
        "{shown}"
    );
    let o = runner(&["exec", hog.to_str().unwrap(), "--params", "{}"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("the limit of 32 core instances"),
        "{}",
        text(&o.stderr)
    );
}
