//! The `scale` scenario, the points users hit: 1, 2 and 4 DENs on one machine (embedded
//! processes sharing one file, and in-process DENs on MongoDB), the embedded store's claim
//! with 100,000 queued tasks against 1,000, and the memory of a `den` process with 1,000
//! tasks sleeping at once.

use std::time::{Duration, Instant};

use bson::doc;
use disbatch::model::status;
use disbatch::store::sqlite::SqliteStore;
use disbatch::store::testing::StoreExt;
use disbatch::store::Store;

use super::embedded_den::{count, den_drain, fresh_file, prefill, wait_for, Dens};
use super::{median, percentile, target_dir, Bench};

/// VmRSS of process `pid` in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(f64::NAN)
        / 1024.0
}

impl Bench {
    pub(super) async fn scale(&self) {
        let (n_emb, n_mongo) = if self.quick { (3_000, 500) } else { (20_000, 2_000) };
        let (rounds, threads) = (self.rounds, self.threads);
        let disk = tempfile::tempdir_in(target_dir()).expect("a temporary directory under target/");
        let mut kv = Vec::new();

        println!("\n## scale: DENs on one machine draining trivial demo tasks, queue threads {threads} (steady rate, median of {rounds} rounds)");
        println!("| DENs | embedded (processes, one file), N = {n_emb} /s | MongoDB (in-process), N = {n_mongo} /s |\n|---|---|---|");
        for dens in [1usize, 2, 4] {
            let (mut emb, mut mongo) = (Vec::new(), Vec::new());
            for _ in 0..rounds {
                emb.push(den_drain(disk.path(), &self.plugins, threads, n_emb, dens).await.rate);
                mongo.push(self.drain(n_mongo, dens).await.0);
            }
            let (emb, mongo) = (median(emb), median(mongo));
            println!("| {dens} | {emb:.0} | {mongo:.0} |");
            kv.push(format!(
                "embedded_{dens}_dens_per_s={emb:.0} mongo_{dens}_dens_per_s={mongo:.0}"
            ));
        }

        let claims = if self.quick { 200 } else { 1_000 };
        println!("\n## scale: the embedded store's claim (`Store::claim`, one at a time) with 1,000 and 100,000 tasks queued ({claims} claims each)");
        println!("| queued | p50 µs | p99 µs |\n|---|---|---|");
        let mut p50s = Vec::new();
        for depth in [1_000usize, 100_000] {
            let file = fresh_file(disk.path(), "claims");
            let queue = prefill(&file, threads, depth, doc! {}).await;
            let store = SqliteStore::open(&file).await.expect("open the embedded file");
            let mut took = Vec::with_capacity(claims);
            for _ in 0..claims {
                let start = Instant::now();
                let task = store.claim(&queue, "bench-claims").await.expect("claim");
                took.push(start.elapsed().as_secs_f64() * 1e6);
                assert!(task.is_some(), "the queue ran dry after fewer than {claims} claims");
            }
            let (p50, p99) = (percentile(took.clone(), 0.5), percentile(took, 0.99));
            println!("| {depth} | {p50:.0} | {p99:.0} |");
            p50s.push(p50);
            kv.push(format!("claim_{depth}_p50_us={p50:.0} claim_{depth}_p99_us={p99:.0}"));
        }
        kv.push(format!("claim_deep_per_shallow={:.2}", p50s[1] / p50s[0]));
        println!("| 100,000 ÷ 1,000 (p50; flat = 1) | {:.2} | |", p50s[1] / p50s[0]);

        let sleeping = 1_000;
        let (idle, busy, running) = self.memory_embedded(disk.path(), sleeping).await;
        println!("\n## scale: memory of one `den --embedded` process (VmRSS)");
        println!("| state | RSS MiB |\n|---|---|");
        println!("| idle (plugin loaded, one task done) | {idle:.1} |");
        println!("| {running} demo tasks sleeping at once (queue threads {sleeping}) | {busy:.1} |");
        let per_task = (busy - idle) * 1024.0 / running.max(1) as f64;
        println!("| per sleeping task | {per_task:.0} KiB |");
        kv.push(format!(
            "idle_mib={idle:.1} sleeping={running} busy_mib={busy:.1} per_task_kib={per_task:.0}"
        ));
        println!(
            "RESULT scale threads={threads} n_embedded={n_emb} n_mongo={n_mongo} {}",
            kv.join(" ")
        );
    }

    /// VmRSS of a `den --embedded` process idle, then with `sleeping` demo tasks
    /// (`sleep_ms` 60000) running at once: (idle MiB, busy MiB, tasks seen running).
    async fn memory_embedded(&self, dir: &std::path::Path, sleeping: usize) -> (f64, f64, u64) {
        let file = fresh_file(dir, "memory");
        let queue = prefill(&file, sleeping as i64, 1, doc! {}).await;
        let (file2, plugins, cache) = (file.clone(), self.plugins.clone(), dir.join("cache"));
        let q2 = queue.clone();
        let (idle, mut d) = tokio::task::spawn_blocking(move || {
            let mut d = Dens::start(&file2, &plugins, &cache, "bench-memory", 1);
            wait_for(&file2, &q2, status::SUCCEEDED, 1, Duration::from_secs(120), &mut d);
            // Settled: registered, plugin loaded, one task through, nothing running.
            std::thread::sleep(Duration::from_secs(2));
            let pid = d.pids()[0];
            (median((0..5).map(|_| rss_mib(pid)).collect()), d)
        })
        .await
        .unwrap();
        let store = SqliteStore::open(&file).await.expect("open the embedded file");
        store
            .create_tasks(queue.id, vec![doc! {"sleep_ms": 60_000}; sleeping])
            .await
            .expect("insert the sleeping tasks");
        let (busy, running) = tokio::task::spawn_blocking(move || {
            wait_for(
                &file,
                &queue,
                status::RUNNING,
                sleeping as u64,
                Duration::from_secs(300),
                &mut d,
            );
            let busy = rss_mib(d.pids()[0]);
            let running = count(&file, &queue, status::RUNNING);
            drop(d);
            (busy, running)
        })
        .await
        .unwrap();
        (idle, busy, running)
    }
}
