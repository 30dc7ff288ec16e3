//! The `sandbox` scenario (a trivial task in-process against bare wasmtime, its floor, and
//! against a process per task) and `memory` (the `den` process's resident memory idle and
//! with tasks running).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bson::{doc, Document};
use disbatch::runner::{Plugin, Sandbox};

use super::floor::{trivial_component, Floor};
use super::{bin, median, queued, wait_finished, Bench, RUNNER_INSTANCES};

impl Bench {
    pub(super) fn sandbox(&self) {
        let demo = self.plugins.join("demo.wasm");
        let plugin = self.runner.load(&demo).unwrap();
        let trivial_bytes = trivial_component();
        let trivial = self
            .runner
            .load_bytes(&trivial_bytes, Path::new("trivial.wasm"))
            .unwrap();
        let floor = Floor::from_file(&demo, RUNNER_INSTANCES);
        let trivial_floor = Floor::new(&trivial_bytes, RUNNER_INSTANCES);
        let sandbox = Sandbox::default();
        let per_round = if self.quick { 2_000 } else { 10_000 };
        let disbatch = |p: &Plugin| assert!(self.runner.run(p, "{}", &sandbox, None).succeeded());
        let bare = |f: &Floor| assert_eq!(f.run("{}"), 1);
        for _ in 0..200 {
            disbatch(&plugin);
            disbatch(&trivial);
            bare(&floor);
            bare(&trivial_floor);
        }
        // The four measurements take turns in batches of BATCH tasks within every round, in
        // an order reversed every other batch, so load and frequency changes fall on all of
        // them alike; a round's figure is its time per task of each.
        const BATCH: usize = 100;
        let (demo_runner, demo_floor) = (|| disbatch(&plugin), || bare(&floor));
        let (trivial_runner, trivial_bare) = (|| disbatch(&trivial), || bare(&trivial_floor));
        let tasks: [&dyn Fn(); 4] = [&demo_runner, &demo_floor, &trivial_runner, &trivial_bare];
        let mut times: [Vec<f64>; 4] = Default::default();
        for _ in 0..self.rounds.max(5) {
            let mut spent = [Duration::ZERO; 4];
            for batch in 0..per_round / BATCH {
                for k in 0..tasks.len() {
                    let i = if batch % 2 == 0 { k } else { tasks.len() - 1 - k };
                    let start = Instant::now();
                    for _ in 0..BATCH {
                        tasks[i]();
                    }
                    spent[i] += start.elapsed();
                }
            }
            for (t, s) in times.iter_mut().zip(spent) {
                t.push(s.as_secs_f64() * 1e6 / (per_round / BATCH * BATCH) as f64);
            }
        }
        let [in_process, floor_times, trivial_in_process, trivial_floor_times] = times;
        let processes = if self.quick { 10 } else { 30 };
        let exec = || {
            Command::new(bin("runner"))
                .arg("exec")
                .arg(self.plugins.join("demo.wasm"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        assert!(exec(), "target/release/runner exec demo.wasm failed");
        let mut per_process = Vec::new();
        for _ in 0..self.rounds.max(5) {
            let start = Instant::now();
            for _ in 0..processes {
                assert!(exec());
            }
            per_process.push(start.elapsed().as_secs_f64() * 1e6 / processes as f64);
        }
        let (a, b) = (median(in_process), median(per_process));
        let (f, ta, tf) = (
            median(floor_times),
            median(trivial_in_process),
            median(trivial_floor_times),
        );
        println!(
            "\n## sandbox: one trivial demo task (median of {} rounds; {per_round} calls / {processes} processes per round)",
            self.rounds.max(5)
        );
        println!("| runner | µs per task |\n|---|---|");
        println!("| in-process (shared Runner, Runner::run: instantiate + call + capture) | {a:.1} |");
        println!(
            "| floor: bare wasmtime, the runner's engine settings, InstancePre of demo.wasm, fresh Store + default WASI p2 context per task | {f:.1} |"
        );
        println!("| trivial component (same world, no imports, returns ok(1)): Runner::run | {ta:.1} |");
        println!("| trivial component: bare wasmtime | {tf:.1} |");
        println!(
            "| sandbox overhead ratio: in-process ÷ floor (target ≤ 1.15) | {:.2} |",
            a / f
        );
        println!("| process per task (target/release/runner exec, compiled component from the disk cache) | {b:.0} |");
        println!("| ratio (target ≥ 100×; in-process target ≤ 20 µs) | {:.0}× |", b / a);
        println!(
            "RESULT sandbox in_process_us={a:.1} process_us={b:.0} ratio={:.0} floor_us={f:.1} sandbox_overhead_ratio={:.2}",
            b / a,
            a / f
        );
    }
    pub(super) async fn memory(&self) {
        let db = self.db("memory").await;
        let q = self.queue(&db, 100).await;
        let dir = tempfile::tempdir().unwrap();
        let config = serde_json::json!({
            "mongohost": self.uri, "database": db.name(), "plugins": ["demo"],
            "plugin_dir": self.plugins, "node": "bench-memory",
            "cache_dir": dir.path().join("cache"),
        });
        let path = dir.path().join("den.json");
        std::fs::write(&path, config.to_string()).unwrap();
        let mut child = Command::new(bin("den"))
            .arg("--config")
            .arg(&path)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        let rss = move || -> f64 {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
                .unwrap_or(f64::NAN)
                / 1024.0
        };
        // Idle: registered, plugin loaded (one task through), nothing running.
        let tasks = db.collection::<Document>("tasks");
        tasks.insert_one(queued(q, &doc! {})).await.unwrap();
        assert!(
            wait_finished(&db, doc! {"status": 1}, 1, Duration::from_secs(60)).await,
            "the den process ran no task in 60 s"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        let idle = median((0..5).map(|_| rss()).collect());
        self.tasks(&db, q, 100, doc! {"sleep_ms": 8000}).await;
        let start = Instant::now();
        while tasks.count_documents(doc! {"status": 0}).await.unwrap() < 100
            && start.elapsed() < Duration::from_secs(30)
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let running = tasks.count_documents(doc! {"status": 0}).await.unwrap();
        let busy = rss();
        child.kill().ok();
        child.wait().ok();
        db.drop().await.ok();
        println!("\n## memory: RSS of the den process (VmRSS)");
        println!("| state | RSS MiB |\n|---|---|");
        println!("| idle (plugin loaded, no task) | {idle:.1} |");
        println!("| {running} tasks running at once (demo, sleep_ms 8000) | {busy:.1} |");
        println!("| per running task | {:.2} |", (busy - idle) / (running.max(1) as f64));
        println!(
            "RESULT memory idle_mib={idle:.1} busy_mib={busy:.1} running={running} per_task_kib={:.0}",
            (busy - idle) * 1024.0 / (running.max(1) as f64)
        );
    }
}
