//! Compile bombs: small components whose functions would cost Cranelift gigabytes and
//! minutes. They are refused by the shape check at upload (`POST /plugins` on a real
//! `disbatch web`) and at load (`runner exec`), with the limit named and the process
//! staying small; what passes the shape is compiled in a child process under limits, and
//! real plugins still compile and are cached.

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::plugins::{plugin_path, plugins_dir};
use common::web::Web;
use disbatch::runner::{EngineOptions, Runner, MAX_FUNCTION_COST, MAX_TOTAL_COST};

/// How much a process may grow while a bomb is refused: generous, far below what compiling
/// one costs (gigabytes).
const GROWTH_KIB: u64 = 500 << 10;

/// A component holding one core module of `funcs`.
fn component(funcs: &str) -> Vec<u8> {
    wat::parse_str(format!("(component (core module {funcs}))")).unwrap()
}

/// `blocks` merge blocks, each an `if` reading and writing two of `values` locals.
fn merges(values: u32, blocks: u32) -> String {
    (0..blocks)
        .map(|k| {
            format!(
                "(if (local.get {}) (then (local.set {} (local.get {}))))",
                k % values,
                (k * 13 + 1) % values,
                (k * 7 + 2) % values
            )
        })
        .collect()
}

/// One function declaring 20,000 locals, through 40,000 merge blocks (about 450 KB).
fn locals_bomb() -> Vec<u8> {
    component(&format!(
        "(func (param i32) (local {}) {})",
        "i32 ".repeat(19_999),
        merges(20_000, 40_000)
    ))
}

/// One function of 999 parameters and no declared local, through 150,000 merge blocks
/// (about 1.7 MB).
fn params_bomb() -> Vec<u8> {
    component(&format!(
        "(func (param {}) {})",
        "i32 ".repeat(999),
        merges(999, 150_000)
    ))
}

/// 300 functions of 999 parameters, each under the limit for one function, together over
/// the limit for a component (about 3.5 MB).
fn spread_bomb() -> Vec<u8> {
    let one = format!("(func (param {}) {})", "i32 ".repeat(999), merges(999, 1_000));
    component(&one.repeat(300))
}

/// `VmHWM` (peak resident set) of process `pid`, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    peak_rss_kib_of(&std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap())
}

/// `VmHWM` of a `/proc/<pid>/status` text, in KiB.
fn peak_rss_kib_of(status: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// `POST /plugins?name=bomb` of `bytes` to `web`, failing as soon as the process grows by
/// more than [`GROWTH_KIB`]; the status and the error.
async fn upload_watched(web: &Web, bytes: Vec<u8>) -> (u16, String) {
    let base = peak_rss_kib(web.pid());
    let url = format!("{}/plugins?name=bomb", web.url);
    let post = tokio::spawn(async move {
        let r = reqwest::Client::new()
            .post(url)
            .header("content-type", "application/wasm")
            .body(bytes)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    });
    let started = Instant::now();
    while !post.is_finished() {
        let grown = peak_rss_kib(web.pid()).saturating_sub(base);
        assert!(grown < GROWTH_KIB, "the DCI grew by {grown} KiB checking the upload");
        assert!(started.elapsed() < Duration::from_secs(300), "no answer in 300 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, body) = post.await.unwrap();
    let grown = peak_rss_kib(web.pid()).saturating_sub(base);
    assert!(grown < GROWTH_KIB, "the DCI grew by {grown} KiB checking the upload");
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compile_bombs_are_refused_at_upload_and_the_dci_stays_small() {
    let dir = tempfile::tempdir().unwrap();
    let web = Web::start_embedded(
        &dir.path().join("d.db"),
        &["--plugin-dir", dir.path().to_str().unwrap()],
    );
    let per_function = format!("costs more than {MAX_FUNCTION_COST} (values × control");
    let in_all = format!("more than {MAX_TOTAL_COST} cost (values × control) in all");
    for (name, bomb, says) in [
        ("locals", locals_bomb(), per_function.as_str()),
        ("params", params_bomb(), per_function.as_str()),
        ("spread", spread_bomb(), in_all.as_str()),
    ] {
        let (status, body) = upload_watched(&web, bomb).await;
        assert_eq!(status, 400, "{name}: {body}");
        assert!(body.contains(says), "{name}: {body}");
        assert!(
            body.contains("function 0 of core module 1") || name == "spread",
            "{name}: {body}"
        );
        assert!(body.contains("retrying cannot help"), "{name}: {body}");
    }
    // A real plugin is still accepted.
    let demo = std::fs::read(plugin_path("demo")).unwrap();
    let (status, body) = upload_watched(&web, demo).await;
    assert_eq!(status, 201, "{body}");
}

/// Runs `runner <args>` with `env`, failing as soon as it grows by more than
/// [`GROWTH_KIB`] over its size at start; the exit code and stderr.
fn runner_watched(args: &[&str], path: &Path, env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_runner"));
    cmd.args(args)
        .arg(path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .envs(env.iter().copied());
    let mut child = cmd.spawn().unwrap();
    let pid = child.id();
    let started = Instant::now();
    let mut peak = 0;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
            return (status.code().unwrap_or(-1), err);
        }
        if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            peak = peak.max(peak_rss_kib_of(&status));
        }
        if peak > GROWTH_KIB + (200 << 10) || started.elapsed() > Duration::from_secs(300) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "runner {args:?} reached {peak} KiB after {:?} without refusing",
                started.elapsed()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn compile_bombs_are_refused_by_runner_exec() {
    let dir = tempfile::tempdir().unwrap();
    for (name, bomb) in [("locals", locals_bomb()), ("params", params_bomb())] {
        let path = dir.path().join(format!("{name}.wasm"));
        std::fs::write(&path, bomb).unwrap();
        let started = Instant::now();
        let (code, err) = runner_watched(
            &["exec"],
            &path,
            &[("DISBATCH_CACHE_DIR", dir.path().to_str().unwrap())],
        );
        assert_eq!(code, 2, "{name}: {err}");
        assert!(
            err.contains(&format!(
                "function 0 of core module 1 costs more than {MAX_FUNCTION_COST}"
            )),
            "{name}: {err}"
        );
        assert!(err.contains("retrying cannot help"), "{name}: {err}");
        // Refused by the shape check in well under a second; the bound is for a loaded machine.
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{name}: {:?}",
            started.elapsed()
        );
    }
}

/// Artifacts in a cache directory.
fn artifacts(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .collect()
}

#[test]
fn a_real_plugin_compiled_in_a_child_is_cached_for_this_host() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let cache_env = [("DISBATCH_CACHE_DIR", cache.to_str().unwrap())];
    let (code, err) = runner_watched(&["check"], &plugin_path("demo"), &cache_env);
    assert_eq!(code, 0, "{err}");
    assert_eq!(artifacts(&cache).len(), 1, "the child's artifact is cached");
    // The sealed artifact deserializes in an engine of this host, without compiling.
    let runner = Runner::new(&EngineOptions {
        cache_dir: Some(cache.clone()),
        max_instances: 1,
    })
    .unwrap();
    assert!(runner.load(&plugin_path("demo")).unwrap().from_cache());
    // The componentize-py demo (a whole CPython) passes the shape and compiles too, when
    // it was built.
    let python = plugins_dir().join("demo-python.wasm");
    if python.is_file() {
        let (code, err) = run_plain(&["check"], &python, &cache_env);
        assert_eq!(code, 0, "{err}");
    }
}

fn run_plain(args: &[&str], path: &Path, env: &[(&str, &str)]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_runner"))
        .args(args)
        .arg(path)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn a_compilation_past_the_child_limits_is_stopped_and_named() {
    let tmp = tempfile::tempdir().unwrap();
    // Within every shape limit, but more than the child may use under these limits.
    let path = tmp.path().join("heavy.wasm");
    let one = format!("(func (param {}) {})", "i32 ".repeat(200), merges(200, 2_000));
    std::fs::write(&path, component(&one.repeat(100))).unwrap();
    let cache = tmp.path().join("cache");
    let (code, out) = run_plain(
        &["check"],
        &path,
        &[
            ("DISBATCH_CACHE_DIR", cache.to_str().unwrap()),
            ("DISBATCH_COMPILE_MEMORY_MIB", "64"),
        ],
    );
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("compiling it needed more than 64 MiB of memory, the limit (DISBATCH_COMPILE_MEMORY_MIB) (retrying cannot help)"),
        "{out}"
    );
    let (code, out) = run_plain(
        &["check"],
        &path,
        &[
            ("DISBATCH_CACHE_DIR", cache.to_str().unwrap()),
            ("DISBATCH_COMPILE_CPU_SECS", "1"),
        ],
    );
    assert_eq!(code, 2, "{out}");
    // Past the CPU time, or, on a loaded machine, past four times that in wall-clock time.
    assert!(
        out.contains("1 s of CPU time") && out.contains("DISBATCH_COMPILE_CPU_SECS"),
        "{out}"
    );
    assert!(artifacts(&cache).is_empty(), "nothing cached");
}
