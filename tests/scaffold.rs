//! `disbatch new-plugin`: a project of each language that builds on its own and runs in the
//! sandbox as generated.

mod common;

use std::path::Path;
use std::process::Command;

use common::web::{run_disbatch, stderr};

fn runner_exec(wasm: &Path, params: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_runner"))
        .args(["exec", wasm.to_str().unwrap(), "--params", params])
        .output()
        .unwrap()
}

#[test]
fn a_new_rust_plugin_builds_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_disbatch(
        &["new-plugin", "hello-rs", "--dir", dir.path().to_str().unwrap()],
        None,
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        shown.contains("cargo build --release --target wasm32-wasip2"),
        "{shown}"
    );
    let root = dir.path().join("hello-rs");
    // The project stands on its own: the SDK and the WIT world are inside it.
    for f in [
        "Cargo.toml",
        "src/lib.rs",
        "sdk/src/lib.rs",
        "wit/plugin.wit",
        "README.md",
    ] {
        assert!(root.join(f).is_file(), "{f} missing");
    }
    // Its own target directory under this repository's, so that later runs reuse the build.
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/scaffold");
    let build = Command::new("cargo")
        .args(["build", "--release", "--target", "wasm32-wasip2"])
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(&root)
        .output()
        .unwrap();
    assert!(build.status.success(), "{}", String::from_utf8_lossy(&build.stderr));
    let wasm = target.join("wasm32-wasip2/release/hello_rs.wasm");
    let run = runner_exec(&wasm, r#"{"name":"scaffold"}"#);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert_eq!(String::from_utf8_lossy(&run.stdout), "hello, scaffold!\n");

    // Refused: an existing directory, a name that is no plugin name or no Rust package name.
    let again = run_disbatch(
        &["new-plugin", "hello-rs", "--dir", dir.path().to_str().unwrap()],
        None,
        &[],
    );
    assert_eq!(again.status.code(), Some(2));
    assert!(stderr(&again).contains("exists already"), "{}", stderr(&again));
    let bad = run_disbatch(&["new-plugin", "a/b", "--dir", dir.path().to_str().unwrap()], None, &[]);
    assert!(stderr(&bad).contains("without path separators"), "{}", stderr(&bad));
    let bad = run_disbatch(&["new-plugin", "a.b", "--dir", dir.path().to_str().unwrap()], None, &[]);
    assert!(stderr(&bad).contains("not a Rust package name"), "{}", stderr(&bad));
}

#[test]
fn new_python_and_js_plugins_build_with_the_repository_tools_and_run() {
    let dir = tempfile::tempdir().unwrap();
    let repo = env!("CARGO_MANIFEST_DIR");
    for (lang, app) in [("python", "app.py"), ("js", "app.js")] {
        let name = format!("hello-{lang}");
        let out = run_disbatch(
            &[
                "new-plugin",
                &name,
                "--lang",
                lang,
                "--dir",
                dir.path().to_str().unwrap(),
            ],
            None,
            &[],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        let root = dir.path().join(&name);
        for f in [app, "build.sh", "wit/plugin.wit", "README.md"] {
            assert!(root.join(f).is_file(), "{lang}: {f} missing");
        }
        // Without a checkout to build with, build.sh says what it needs.
        let refused = Command::new(root.join("build.sh"))
            .env_remove("DISBATCH_REPO")
            .output()
            .unwrap();
        assert!(!refused.status.success());
        assert!(
            String::from_utf8_lossy(&refused.stderr).contains("set DISBATCH_REPO"),
            "{}",
            String::from_utf8_lossy(&refused.stderr)
        );
        let build = Command::new(root.join("build.sh"))
            .env("DISBATCH_REPO", repo)
            .output()
            .unwrap();
        assert!(
            build.status.success(),
            "{lang}: {}{}",
            String::from_utf8_lossy(&build.stdout),
            String::from_utf8_lossy(&build.stderr)
        );
        let wasm = root.join(format!("{name}.wasm"));
        let run = runner_exec(&wasm, r#"{"name":"scaffold","times":2}"#);
        assert!(run.status.success(), "{lang}: {}", String::from_utf8_lossy(&run.stderr));
        assert_eq!(
            String::from_utf8_lossy(&run.stdout),
            "hello, scaffold!\nhello, scaffold!\n",
            "{lang}"
        );
    }
}
