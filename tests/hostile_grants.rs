//! Hostile uses of the component cache and of directory grants: a forged cached artifact
//! is never executed, no grant may reach the cache or its key, nor a kernel filesystem
//! (procfs, sysfs…), and plugins together cannot take the DEN's file descriptors.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use bson::doc;
use common::{wait_for, DenProcess};
use disbatch::model::{Output, Sort};
use disbatch::runner::{protected_paths, DirGrant, EngineOptions, Outcome, Runner, Sandbox};
use disbatch::store::sqlite::SqliteStore;
use disbatch::store::testing::StoreExt;
use disbatch::store::{NewQueue, Store};

fn opts(cache: &Path) -> EngineOptions {
    EngineOptions {
        cache_dir: Some(cache.to_owned()),
        max_instances: 4,
    }
}

fn artifacts(cache: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .collect()
}

#[test]
fn a_tampered_cached_artifact_is_rejected_and_recompiled() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("components");
    let path = common::plugins_dir().join("demo.wasm");
    assert!(!Runner::new(&opts(&cache)).unwrap().load(&path).unwrap().from_cache());
    let cached = artifacts(&cache);
    assert_eq!(cached.len(), 1, "one artifact cached");
    assert!(
        !std::fs::read_dir(&cache)
            .unwrap()
            .any(|e| e.unwrap().file_name() == "cache.key"),
        "the MAC key lives outside the cache directory"
    );

    // Overwrite part of the artifact, as a plugin with write access to the cache would.
    let mut bytes = std::fs::read(&cached[0]).unwrap();
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..mid + 64] {
        *b ^= 0xA5;
    }
    std::fs::write(&cached[0], &bytes).unwrap();

    let runner = Runner::new(&opts(&cache)).unwrap();
    let plugin = runner.load(&path).unwrap();
    assert!(!plugin.from_cache(), "the tampered artifact must not be deserialized");
    let o = runner.run(&plugin, "{}", &Sandbox::default(), None);
    assert!(o.succeeded(), "{o:?}");

    // The recompiled artifact replaced it and verifies again.
    let again = Runner::new(&opts(&cache)).unwrap().load(&path).unwrap();
    assert!(again.from_cache());
}

#[test]
fn an_artifact_without_a_mac_is_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("components");
    let path = common::plugins_dir().join("demo.wasm");
    Runner::new(&opts(&cache)).unwrap().load(&path).unwrap();
    let cached = artifacts(&cache);
    // The engine's own serialization, with this host's MAC stripped off.
    let bytes = std::fs::read(&cached[0]).unwrap();
    std::fs::write(&cached[0], &bytes[32..]).unwrap();
    let plugin = Runner::new(&opts(&cache)).unwrap().load(&path).unwrap();
    assert!(!plugin.from_cache());
}

#[test]
fn grants_over_the_cache_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let cache = home.join(".cache").join("disbatch").join("components");
    std::fs::create_dir_all(&cache).unwrap();
    let protected = protected_paths(Some(&cache));
    for host in [home.clone(), cache.clone(), cache.join("sub")] {
        let s = Sandbox {
            dirs: vec![DirGrant {
                host: host.clone(),
                guest: "/data".into(),
                writable: true,
            }],
            ..Sandbox::default()
        };
        let err = s.check_grants(&protected).unwrap_err();
        assert!(err.contains("protected host path"), "{err}");
        assert!(err.contains(&host.display().to_string()), "{err}");
    }
}

#[test]
fn runner_exec_refuses_a_grant_of_home_holding_the_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let demo = common::plugins_dir().join("demo.wasm");
    let grant = format!("{}:/home:rw", home.display());
    let o = Command::new(env!("CARGO_BIN_EXE_runner"))
        .args(["exec", demo.to_str().unwrap(), "--dir", &grant])
        .env("HOME", &home)
        .env_remove("XDG_CACHE_HOME")
        .env_remove("DISBATCH_CACHE_DIR")
        .env_remove("DISBATCH_CACHE_KEY")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("protected host path"), "{err}");
    assert!(!home.join(".cache").exists() || err.contains(".cache"), "{err}");
}

fn grant(host: &str, guest: &str, writable: bool) -> Sandbox {
    Sandbox {
        dirs: vec![DirGrant {
            host: host.into(),
            guest: guest.into(),
            writable,
        }],
        ..Sandbox::default()
    }
}

#[test]
fn grants_on_or_holding_a_kernel_filesystem_are_refused() {
    for (host, writable, why) in [
        ("/proc", false, "(proc)"),
        ("/proc", true, "(proc)"),
        ("/proc/self", false, "(proc)"),
        ("/sys", false, "(sysfs)"),
        ("/dev", false, "kernel filesystem"),
        ("/", false, "mounted at /proc"),
    ] {
        let err = grant(host, "/data", writable).check_grants(&[]).unwrap_err();
        assert!(err.contains(&format!("grant of {host} is refused")), "{err}");
        assert!(err.contains(why), "{host}: {err}");
    }
    let tmp = tempfile::tempdir().unwrap();
    grant(tmp.path().to_str().unwrap(), "/data", true)
        .check_grants(&[])
        .unwrap();
}

#[test]
fn runner_exec_refuses_a_grant_of_proc() {
    let demo = common::plugins_dir().join("demo.wasm");
    for dir in ["/proc", "/proc:/p:rw"] {
        let o = Command::new(env!("CARGO_BIN_EXE_runner"))
            .args(["exec", demo.to_str().unwrap(), "--no-cache", "--dir", dir])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{dir}: {err}");
        assert!(err.contains("grant of /proc is refused"), "{err}");
        assert!(err.contains("kernel filesystem (proc)"), "{err}");
    }
}

/// Runs `attack` with `params` under `sandbox` without the grant check, as if what it
/// reaches had been mounted after the check.
fn attack(sandbox: &Sandbox, params: serde_json::Value) -> Outcome {
    let path = common::plugins_dir().join("attack.wasm");
    common::shared_runner().run_file(&path, &params.to_string(), sandbox, None)
}

#[test]
fn kernel_files_reached_through_a_grant_cannot_be_opened() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("plain"), "plain text").unwrap();
    let plain = format!("/host{}/plain", tmp.path().display());
    for writable in [false, true] {
        let root = grant("/", "/host", writable);
        // The same grant reaches ordinary files.
        let o = attack(&root, serde_json::json!({"attack": "read", "path": plain}));
        assert!(o.succeeded(), "{o:?}");
        assert!(text(&o.stdout).contains("plain text"), "{o:?}");
        for params in [
            serde_json::json!({"attack": "read", "path": "/host/proc/self/environ"}),
            serde_json::json!({"attack": "read", "path": "/host/proc/self/mem", "maps": "/host/proc/self/maps"}),
            serde_json::json!({"attack": "read", "path": "/host/sys/devices/system/cpu/online"}),
        ] {
            let o = attack(&root, params.clone());
            assert!(!o.succeeded(), "{params}: {}", text(&o.stdout));
            let failure = o.failure.as_ref().unwrap().to_string();
            assert!(failure.contains("Permission denied"), "{params}: {failure}");
        }
    }
}

fn text(c: &disbatch::runner::Captured) -> String {
    String::from_utf8_lossy(&c.bytes).into_owned()
}

#[test]
fn symlinks_and_dot_dot_do_not_lead_out_of_a_grant() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::os::unix::fs::symlink("/proc", data.join("proc")).unwrap();
    std::os::unix::fs::symlink("/proc/self/environ", data.join("environ")).unwrap();
    std::os::unix::fs::symlink("../../../../../../../../proc/self", data.join("up")).unwrap();
    let s = grant(data.to_str().unwrap(), "/data", true);
    for path in [
        "/data/proc/self/environ",
        "/data/environ",
        "/data/up/environ",
        "/data/../../../../../../../proc/self/environ",
        "/proc/self/environ",
    ] {
        let o = attack(&s, serde_json::json!({"attack": "read", "path": path}));
        assert!(!o.succeeded(), "{path}: {}", text(&o.stdout));
        assert!(!text(&o.stdout).contains("PATH="), "{path}");
    }
}

async fn create_queue(store: &SqliteStore, name: &str, threads: i64, dirs: &[String]) -> bson::oid::ObjectId {
    store
        .create_queue(NewQueue {
            name: name.into(),
            plugin: "attack".into(),
            threads: Some(threads),
            sort: Sort::Fifo,
            extra: doc! {"sandbox": {"dirs": dirs}},
        })
        .await
        .unwrap()
        .id
}

fn output(o: &Option<Output>) -> String {
    match o {
        Some(Output::Inline(s)) => s.clone(),
        other => format!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_den_refuses_queues_granting_proc_or_the_root() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("grants.db");
    let store = SqliteStore::open(&file).await.unwrap();
    let granted = tempfile::tempdir().unwrap();
    std::fs::write(granted.path().join("hello"), "hello").unwrap();
    let mut refused = Vec::new();
    for (name, dir) in [("proc-ro", "/proc:/p"), ("proc-rw", "/proc:/p:rw"), ("root", "/:/host")] {
        let q = create_queue(&store, name, 1, &[dir.to_owned()]).await;
        let params =
            doc! {"attack": "read", "path": if name == "root" { "/host/proc/self/environ" } else { "/p/self/environ" }};
        let t = store.create_tasks(q, vec![params]).await.unwrap()[0];
        refused.push((q, t, dir.split(':').next().unwrap().to_owned()));
    }
    let beside = create_queue(&store, "beside", 1, &[format!("{}:/in", granted.path().display())]).await;
    let ok = store
        .create_tasks(beside, vec![doc! {"attack": "read", "path": "/in/hello"}])
        .await
        .unwrap()[0];
    let den = DenProcess::start_embedded(&file, "grants", serde_json::json!({"plugins": ["attack"]}));
    wait_for(Duration::from_secs(120), "the granted task", || async {
        store.task(ok).await.unwrap().unwrap().status > 0
    })
    .await;
    let t = store.task(ok).await.unwrap().unwrap();
    assert_eq!(t.status, 1, "{}", output(&t.stderr));
    wait_for(Duration::from_secs(60), "the refused queues' problems", || async {
        let nodes = store.nodes().await.unwrap();
        refused
            .iter()
            .all(|(q, _, _)| nodes.iter().any(|n| n.queue_problems.contains_key(&q.to_hex())))
    })
    .await;
    let nodes = store.nodes().await.unwrap();
    for (q, t, host) in &refused {
        let problem = nodes.iter().find_map(|n| n.queue_problems.get(&q.to_hex())).unwrap();
        assert!(problem.contains(&format!("grant of {host} is refused")), "{problem}");
        assert!(problem.contains("kernel filesystem (proc"), "{problem}");
        let task = store.task(*t).await.unwrap().unwrap();
        assert_eq!(task.status, -2, "{task:?}\n{}", den.log());
    }
}

/// Open files of process `pid`.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_together_cannot_take_the_dens_file_descriptors() {
    hold_the_dens_file_descriptors("hold").await;
}

/// A read stream keeps its file open after the file's handle is dropped: it holds the
/// file's place in the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_streams_count_in_the_descriptor_budget() {
    hold_the_dens_file_descriptors("hold-streams").await;
}

/// Tasks of one queue run the `attack` mode `attack` (`hold` or `hold-streams`) against a
/// DEN of 1024 open files, holding all they can: their share each, the DEN stays well
/// under its limit, and a task of another queue still opens a file.
async fn hold_the_dens_file_descriptors(attack: &str) {
    const NOFILE: u64 = 1024;
    // The budget is half the limit, a task's share a quarter of that.
    const SHARE: u64 = NOFILE / 2 / 4;
    const HOLDERS: usize = 3;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fds.db");
    let store = SqliteStore::open(&file).await.unwrap();
    let held = tempfile::tempdir().unwrap();
    std::fs::write(held.path().join("f"), "f").unwrap();
    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join("hello"), "hello from the other queue").unwrap();

    let hold = create_queue(
        &store,
        "hold",
        HOLDERS as i64,
        &[format!("{}:/data", held.path().display())],
    )
    .await;
    let params = doc! {"attack": attack, "path": "/data/f", "release": "/data/release"};
    let holders = store.create_tasks(hold, vec![params; HOLDERS]).await.unwrap();
    let reader = create_queue(&store, "reader", 1, &[format!("{}:/in", other.path().display())]).await;

    let den = DenProcess::start_embedded_with(&file, "fds", serde_json::json!({"plugins": ["attack"]}), |c| {
        common::limit_open_files(c, NOFILE)
    });
    let pid = den.pid();
    wait_for(
        Duration::from_secs(180),
        "every holder to hold what it could",
        || async {
            let mut all = true;
            for t in &holders {
                let t = store.task(*t).await.unwrap().unwrap();
                all &= t.progress.is_some_and(|p| p.info.starts_with("holding"));
            }
            all
        },
    )
    .await;
    let peak = std::sync::atomic::AtomicUsize::new(open_fds(pid));
    // While they hold, a task of another queue opens a file and succeeds.
    let r = store
        .create_tasks(reader, vec![doc! {"attack": "read", "path": "/in/hello"}])
        .await
        .unwrap()[0];
    wait_for(Duration::from_secs(120), "the other queue's task", || async {
        peak.fetch_max(open_fds(pid), std::sync::atomic::Ordering::SeqCst);
        store.task(r).await.unwrap().unwrap().status > 0
    })
    .await;
    let t = store.task(r).await.unwrap().unwrap();
    assert_eq!(t.status, 1, "{}\n{}", output(&t.stderr), den.log());
    assert!(output(&t.stdout).contains("hello from the other queue"));

    std::fs::write(held.path().join("release"), "").unwrap();
    wait_for(Duration::from_secs(120), "the holders to finish", || async {
        let mut all = true;
        for t in &holders {
            all &= store.task(*t).await.unwrap().unwrap().status > 0;
        }
        all
    })
    .await;
    let mut total = 0;
    for t in &holders {
        let t = store.task(*t).await.unwrap().unwrap();
        let stdout = output(&t.stdout);
        let line = stdout.lines().last().unwrap_or_default();
        let n = serde_json::from_str::<serde_json::Value>(line).unwrap()["held"]
            .as_u64()
            .unwrap();
        // Its grant's directory is one of its share.
        assert_eq!(n, SHARE - 1, "{stdout}");
        total += n;
        let stderr = output(&t.stderr);
        assert!(stderr.contains("[disbatch"), "{stderr}");
        assert!(stderr.contains(&format!("holds {SHARE} descriptors")), "{stderr}");
    }
    let peak = peak.into_inner();
    println!("held by {HOLDERS} tasks: {total}; the DEN's peak open files: {peak} of {NOFILE}");
    assert!(
        (peak as u64) < NOFILE * 3 / 4,
        "the DEN held {peak} files (limit {NOFILE})"
    );
    assert!(
        den.log().lines().all(|l| !l.contains("Too many open files")),
        "{}",
        den.log()
    );
}
