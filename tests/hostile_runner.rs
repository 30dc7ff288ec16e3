//! Hostile plugins against the `runner` binary as a user runs it: what reaches the
//! terminal, how much is printed, the host's peak memory, and an address-space limit.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::json;

fn cache_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().unwrap().keep()).clone()
}

/// What one `runner` process did.
struct Run {
    code: Option<i32>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// Peak resident set size of the process, in bytes.
    max_rss: u64,
}

impl Run {
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// Runs `runner` with `args` (through `sh -c` when `shell_prefix` is set, e.g. a ulimit)
/// and reads its peak RSS from `wait4`.
fn run(args: &[&str], shell_prefix: Option<&str>) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let (out, err) = (dir.path().join("out"), dir.path().join("err"));
    let bin = env!("CARGO_BIN_EXE_runner");
    let mut cmd = match shell_prefix {
        Some(prefix) => {
            let quoted: Vec<String> = args.iter().map(|a| format!("'{}'", a.replace('\'', r"'\''"))).collect();
            let mut c = Command::new("sh");
            c.arg("-c").arg(format!("{prefix}; exec '{bin}' {}", quoted.join(" ")));
            c
        }
        None => {
            let mut c = Command::new(bin);
            c.args(args);
            c
        }
    };
    let child = cmd
        .env("DISBATCH_CACHE_DIR", cache_dir())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: rusage is plain data; wait4 fills it for the child we spawned and reap here.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let got = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(got, pid, "wait4: {}", std::io::Error::last_os_error());
    std::mem::forget(child);
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    Run {
        code,
        stdout: std::fs::read(out).unwrap(),
        stderr: std::fs::read(err).unwrap(),
        max_rss: usage.ru_maxrss as u64 * 1024,
    }
}

fn attack() -> String {
    common::plugin_path("attack").display().to_string()
}

const MIB: u64 = 1 << 20;

#[test]
fn json_output_of_a_100_mib_error_stays_small() {
    let params = json!({"attack": "err", "bytes": 100 << 20}).to_string();
    let r = run(&["exec", &attack(), "--json", "--params", &params], None);
    assert_eq!(r.code, Some(1), "{}", r.stderr());
    assert!(r.stdout.len() < 32 << 10, "{} bytes of JSON", r.stdout.len());
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    assert!(v["error"].as_str().unwrap().contains("message cut at 4096 bytes"));
    assert_eq!(v["notes"].as_array().unwrap().len(), 1, "{}", v["notes"]);
}

#[test]
fn escape_sequences_reach_a_terminal_escaped() {
    let params = json!({"attack": "print", "stdout": "A\u{1b}]0;owned\u{7}B\u{1b}[2JC\n", "stderr": "D\u{1b}[31mE\n"})
        .to_string();
    // `script` gives the runner a real terminal on stdout and stderr.
    let cmdline = format!(
        "DISBATCH_CACHE_DIR='{}' '{}' exec '{}' --params '{}'",
        cache_dir().display(),
        env!("CARGO_BIN_EXE_runner"),
        attack(),
        params
    );
    let o = Command::new("script")
        .args(["-qec", &cmdline, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let seen = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{seen}");
    assert!(!seen.contains('\u{1b}'), "a raw ESC reached the terminal: {seen:?}");
    assert!(seen.contains(r"A\u{1b}]0;owned\u{7}B\u{1b}[2JC"), "{seen:?}");
    assert!(seen.contains(r"D\u{1b}[31mE"), "{seen:?}");
    // Piped, the same bytes pass through unchanged.
    let r = run(&["exec", &attack(), "--params", &params], None);
    assert_eq!(r.stdout, "A\u{1b}]0;owned\u{7}B\u{1b}[2JC\n".as_bytes());
}

#[test]
fn a_progress_flood_prints_a_bounded_number_of_lines() {
    let params = json!({"attack": "progress", "count": 300_000, "info": "\u{1b}[2J spin\nfake line"}).to_string();
    let r = run(&["exec", &attack(), "--params", &params], None);
    assert_eq!(r.code, Some(0), "{}", r.stderr());
    let text = r.stderr();
    let lines = text.lines().count();
    // At most one line per 100 ms: however long the run took, far fewer than the reports.
    assert!(lines < 1000, "{lines} progress lines printed");
    assert!(text.contains("reports not shown"), "{text}");
    assert!(!text.contains('\u{1b}'));
    assert!(
        !text.lines().any(|l| l.starts_with("fake line")),
        "a report spanned two lines"
    );
}

/// The peak RSS of `runner exec demo`: what the process needs before any attack.
fn baseline_rss() -> u64 {
    let demo = common::plugin_path("demo").display().to_string();
    let r = run(&["exec", &demo, "--params", r#"{"message":"hi"}"#], None);
    assert_eq!(r.code, Some(0), "{}", r.stderr());
    r.max_rss
}

/// A component of `growers` core instances, each with a memory of `pages` 64 KiB pages.
fn memory_hog(growers: usize, pages: u32) -> Vec<u8> {
    let instances: String = (0..growers)
        .map(|i| format!("(core instance $g{i} (instantiate $grow))\n"))
        .collect();
    let prelude = format!(
        r#"(core module $grow
    (memory 1)
    (func $fill (param $n i32)
      (loop $l
        (i32.store8 (i32.mul (local.get $n) (i32.const 65536)) (i32.const 1))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br_if $l (i32.gt_s (local.get $n) (i32.const 0)))))
    (func $start
      (if (i32.ne (memory.grow (i32.const {pages})) (i32.const -1))
        (then (call $fill (i32.const {pages})))))
    (start $start))
  {instances}"#
    );
    common::components::component_with(&prelude, common::components::RETURNS_OK)
}

fn write_temp(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p.display().to_string()
}

#[test]
fn every_memory_of_a_task_stays_inside_one_64_mib_budget_in_resident_memory() {
    let dir = tempfile::tempdir().unwrap();
    // Three memories (with the main one, the most a task may have) that each grow and
    // touch 48 MiB: 144 MiB if each had its own budget.
    let hog = write_temp(dir.path(), "hog.wasm", &memory_hog(3, 768));
    let base = baseline_rss();
    let r = run(&["exec", &hog, "--memory", "64"], None);
    assert_eq!(r.code, Some(0), "{}", r.stderr());
    let grown = r.max_rss.saturating_sub(base);
    eprintln!("peak RSS {} MiB, baseline {} MiB", r.max_rss / MIB, base / MIB);
    assert!(
        grown < 64 * MIB + 32 * MIB,
        "peak RSS {} MiB over a {} MiB baseline under a 64 MiB budget",
        r.max_rss / MIB,
        base / MIB
    );
}

#[test]
fn large_progress_reports_do_not_pile_up_in_host_memory() {
    let params = json!({"attack": "progress", "count": 100, "info_bytes": 32 << 20}).to_string();
    let base = baseline_rss();
    let r = run(&["exec", &attack(), "--memory", "200", "--params", &params], None);
    assert_eq!(r.code, Some(0), "{}", r.stderr());
    // The guest holds its 32 MiB text (plus its JSON copy); the host one lifted copy at a
    // time and 1 KiB per kept report: 100 reports kept whole would be 3.2 GiB.
    let grown = r.max_rss.saturating_sub(base);
    eprintln!("peak RSS {} MiB, baseline {} MiB", r.max_rss / MIB, base / MIB);
    assert!(grown < 400 * MIB, "peak RSS grew {} MiB", grown / MIB);
}

#[test]
fn an_address_space_limit_is_a_clear_error_not_a_silent_fallback() {
    let demo = common::plugin_path("demo").display().to_string();
    // 64 GiB of address space: far less than the pool for 1000 instances reserves.
    let limit = "ulimit -v 67108864";
    let r = run(&["exec", &demo], Some(limit));
    assert_eq!(r.code, Some(2), "{}", r.stderr());
    let err = r.stderr();
    assert!(err.contains("cannot reserve the instance pool"), "{err}");
    assert!(err.contains("max_instances"), "{err}");
    // A pool for one task fits, with the same per-task limits.
    let r = run(&["exec", &demo, "--max-instances", "1"], Some(limit));
    assert_eq!(r.code, Some(0), "{}", r.stderr());
}
