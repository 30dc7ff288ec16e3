//! `disbatch new-plugin`: a project of each language, made in an empty directory outside
//! this repository, builds, checks and runs exactly as its README says, with the `disbatch`
//! and `runner` commands on PATH and nothing of this repository: the commands of the
//! README's `sh` blocks are run as they are, the second block's `disbatch dev` left running
//! while the commands after it run a task to success.
//!
//! The build tools are installed once per machine (the Python and JavaScript ones under
//! `~/.cache/disbatch-plugin-tools`, as `plugins/build-py-js` installs them); the Rust
//! project builds offline from cargo's cache, into a target directory kept under this
//! repository's `target/` so that later runs reuse the build.

use crate::common;

use std::path::Path;
use std::process::{Command, Output};

use common::dev::Dev;
use common::web::{run_disbatch, stderr};

/// The address the README's commands use: `disbatch dev`'s default.
const README_URL: &str = "http://127.0.0.1:8080";

/// PATH with the directory of the `disbatch` and `runner` binaries first.
fn path_with_binaries() -> std::ffi::OsString {
    let bin = Path::new(env!("CARGO_BIN_EXE_disbatch")).parent().unwrap();
    assert_eq!(Path::new(env!("CARGO_BIN_EXE_runner")).parent().unwrap(), bin);
    let mut dirs = vec![bin.to_owned()];
    dirs.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()));
    std::env::join_paths(dirs).unwrap()
}

/// Runs one README line with bash in `cwd`.
fn sh(line: &str, cwd: &Path, lang: &str) -> Output {
    // A command that never ends (a task that never runs) fails the test instead of hanging it.
    let mut cmd = Command::new("timeout");
    cmd.args(["600", "bash", "-c", line])
        .current_dir(cwd)
        .env("PATH", path_with_binaries())
        // The compiled-component cache of `runner check` and `runner exec`, kept between runs.
        .env(
            "DISBATCH_CACHE_DIR",
            Path::new(env!("CARGO_MANIFEST_DIR")).join("target/scaffold/components"),
        )
        .env("CARGO_NET_OFFLINE", "true")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("DISBATCH_URL");
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{lang}: cannot run {line:?}: {e}"));
    assert!(
        out.status.success(),
        "{lang}: `{line}` failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The commands of each ```sh block of `readme`, comments and blank lines left out.
fn sh_blocks(readme: &str) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in readme.lines() {
        match (&mut current, line.trim()) {
            (None, "```sh") => current = Some(Vec::new()),
            (Some(_), "```") => blocks.push(current.take().unwrap()),
            (Some(block), l) if !l.is_empty() && !l.starts_with('#') => block.push(l.to_owned()),
            _ => {}
        }
    }
    blocks
}

async fn a_new_plugin_runs_as_its_readme_says(lang: &str) {
    let dir = tempfile::tempdir().unwrap();
    let name = format!("greet-{lang}");
    let out = sh(&format!("disbatch new-plugin {name} --lang {lang}"), dir.path(), lang);
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    let root = dir.path().join(&name);
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    assert!(shown.ends_with(&readme), "{lang}: new-plugin printed {shown}");
    if lang == "rust" {
        // The build's target directory outlives the project, so later runs reuse it.
        let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/scaffold/rust");
        std::fs::create_dir_all(&target).unwrap();
        std::os::unix::fs::symlink(&target, root.join("target")).unwrap();
    }
    let blocks = sh_blocks(&readme);
    assert_eq!(blocks.len(), 2, "{lang}: README:\n{readme}");

    // Build it and try it.
    let mut outputs = Vec::new();
    for line in &blocks[0] {
        outputs.push((line.clone(), sh(line, &root, lang)));
    }
    let output_of = |verb: &str| {
        let (_, out) = outputs
            .iter()
            .find(|(l, _)| l.starts_with(verb))
            .unwrap_or_else(|| panic!("{lang}: no `{verb}` in the README:\n{readme}"));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let check = output_of("runner check");
    assert!(check.contains("this host can run it"), "{lang}: {check}");
    // Nothing alarming about a plugin that runs.
    assert!(
        !check.contains("note:") && !check.contains("over the"),
        "{lang}: {check}"
    );
    assert_eq!(output_of("runner exec"), "hello, you!\n", "{lang}");

    // Run it as a task of `disbatch dev`.
    let dev_line = &blocks[1][0];
    let args = dev_line
        .strip_prefix("disbatch dev")
        .unwrap_or_else(|| panic!("{lang}: the second block starts with {dev_line:?}"));
    let mut args: Vec<&str> = args.split_whitespace().collect();
    args.extend(["--bind", "127.0.0.1:0"]);
    let dev = Dev::start(&root, &args);
    let mut last = None;
    for line in &blocks[1][1..] {
        assert!(line.contains(README_URL), "{lang}: {line}");
        last = Some(sh(&line.replace(README_URL, &dev.url), &root, lang));
    }
    let waited = String::from_utf8_lossy(&last.expect("commands after disbatch dev").stdout).into_owned();
    let id = waited.split_whitespace().next().unwrap_or_default().to_owned();
    let task = dev.get_json(&format!("/tasks/{id}?output=1")).await;
    assert_eq!(task["status"], 1, "{lang}: {waited} {task}\n{}", dev.log());
    assert_eq!(task["stdout"], "hello, you!\n", "{lang}: {task}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_rust_plugin_runs_as_its_readme_says() {
    a_new_plugin_runs_as_its_readme_says("rust").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_python_plugin_runs_as_its_readme_says() {
    a_new_plugin_runs_as_its_readme_says("python").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_js_plugin_runs_as_its_readme_says() {
    a_new_plugin_runs_as_its_readme_says("js").await;
}

#[test]
fn new_plugin_refuses_an_existing_directory_and_bad_names() {
    let dir = tempfile::tempdir().unwrap();
    let at = dir.path().to_str().unwrap();
    let first = run_disbatch(&["new-plugin", "hello-rs", "--dir", at], None, &[]);
    assert!(first.status.success(), "{}", stderr(&first));
    let again = run_disbatch(&["new-plugin", "hello-rs", "--dir", at], None, &[]);
    assert_eq!(again.status.code(), Some(2));
    assert!(stderr(&again).contains("exists already"), "{}", stderr(&again));
    let bad = run_disbatch(&["new-plugin", "a/b", "--dir", at], None, &[]);
    assert!(stderr(&bad).contains("without path separators"), "{}", stderr(&bad));
    let bad = run_disbatch(&["new-plugin", "a.b", "--dir", at], None, &[]);
    assert!(stderr(&bad).contains("not a Rust package name"), "{}", stderr(&bad));
}
