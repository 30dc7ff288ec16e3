//! The `sandbox` scenario (a trivial task in-process against a process per task) and
//! `memory` (the `den` process's resident memory idle and with tasks running).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bson::{doc, Document};
use disbatch::runner::Sandbox;

use super::{bin, median, queued, wait_finished, Bench};

impl Bench {
    pub(super) fn sandbox(&self) {
        let plugin = self.runner.load(&self.plugins.join("demo.wasm")).unwrap();
        let sandbox = Sandbox::default();
        let per_round = if self.quick { 2_000 } else { 10_000 };
        for _ in 0..200 {
            assert!(self.runner.run(&plugin, "{}", &sandbox, None).succeeded());
        }
        let mut in_process = Vec::new();
        for _ in 0..self.rounds.max(5) {
            let start = Instant::now();
            for _ in 0..per_round {
                let o = self.runner.run(&plugin, "{}", &sandbox, None);
                assert!(o.succeeded());
            }
            in_process.push(start.elapsed().as_secs_f64() * 1e6 / per_round as f64);
        }
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
        println!(
            "\n## sandbox: one trivial demo task (median of {} rounds; {per_round} calls / {processes} processes per round)",
            self.rounds.max(5)
        );
        println!("| runner | µs per task |\n|---|---|");
        println!("| in-process (shared Runner, Runner::run: instantiate + call + capture) | {a:.1} |");
        println!("| process per task (target/release/runner exec, compiled component from the disk cache) | {b:.0} |");
        println!("| ratio (target ≥ 100×; in-process target ≤ 20 µs) | {:.0}× |", b / a);
        println!(
            "RESULT sandbox in_process_us={a:.1} process_us={b:.0} ratio={:.0}",
            b / a
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
