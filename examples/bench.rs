//! Benchmarks: the DEN against the physical limit (the database's own claim rate) and the
//! sandbox against a process per task, measured in one run on one machine.
//!
//! ```sh
//! cargo run --release --example bench -- all            # every scenario
//! cargo run --release --example bench -- throughput     # one scenario
//! cargo run --release --example bench -- all --quick    # smaller sizes, fewer rounds
//! ```
//!
//! Starts its own `secantusd-rs` (or uses `MONGODB_URI`), builds the plugins and the
//! binaries it needs, prints a table per scenario with medians over the rounds, and ends
//! each scenario with one line `RESULT <scenario> key=value …`.

#[path = "../tests/common/plugins.rs"]
#[allow(dead_code)]
mod plugins;
#[path = "../tests/common/server.rs"]
#[allow(dead_code)]
mod server;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use clap::Parser;
use disbatch::config::Gfs;
use disbatch::den::{Den, DenSettings};
use disbatch::runner::{EngineOptions, Runner, Sandbox};
use disbatch::store::mongo::MongoStore;
use disbatch::store::Store;
use mongodb::options::FindOneAndUpdateOptions;
use mongodb::{Client, Database};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(about = "Disbatch benchmarks")]
struct Args {
    /// sandbox, ceiling, throughput, latency, depth, memory or all.
    scenario: String,
    /// Smaller sizes and fewer rounds, for a run of a minute or two.
    #[arg(long)]
    quick: bool,
    /// Rounds per measurement (medians are reported).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
}

/// Concurrency of the DEN runs and of the driver-only loop beside them.
const THREADS: i64 = 8;

struct Bench {
    quick: bool,
    rounds: usize,
    uri: String,
    client: Client,
    runner: Runner,
    plugins: PathBuf,
    _server: Option<server::TestServer>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn build_binaries() {
    let status = Command::new(env!("CARGO"))
        .args(["build", "--release", "--bin", "runner", "--bin", "den"])
        .status()
        .expect("run cargo build");
    assert!(status.success(), "cargo build --release --bin runner --bin den failed");
}

fn bin(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release").join(name)
}

impl Bench {
    async fn db(&self, name: &str) -> Database {
        let db = self.client.database(&format!("bench_{name}_{}", std::process::id()));
        db.drop().await.ok();
        MongoStore::from_database(db.clone()).ensure_indexes().await.unwrap();
        db
    }

    async fn queue(&self, db: &Database, threads: i64) -> ObjectId {
        db.collection::<Document>("queues")
            .insert_one(
                doc! {"name": format!("q{}", ObjectId::new()), "plugin": "demo", "threads": threads, "sort": "fifo"},
            )
            .await
            .unwrap()
            .inserted_id
            .as_object_id()
            .unwrap()
    }

    async fn tasks(&self, db: &Database, queue: ObjectId, n: usize, params: Document) {
        let now = DateTime::now();
        let docs: Vec<Document> = (0..n)
            .map(|_| {
                doc! {"queue": queue, "status": -2, "node": Bson::Null, "params": params.clone(),
                "ctime": now, "mtime": now, "stdout": Bson::Null, "stderr": Bson::Null}
            })
            .collect();
        for batch in docs.chunks(10_000) {
            db.collection::<Document>("tasks")
                .insert_many(batch.to_vec())
                .await
                .unwrap();
        }
    }

    fn den(&self, db: &Database, node: &str) -> (CancellationToken, tokio::task::JoinHandle<()>) {
        let settings = DenSettings {
            node: node.into(),
            plugin_dir: self.plugins.clone(),
            plugins: vec!["demo".into()],
            active_queues: vec![],
            ignore_queues: vec![],
            gfs: Gfs::Auto,
            heartbeat_stale: Duration::from_secs(30),
            orphan_claimed_after: Duration::from_secs(300),
            shutdown_grace: Duration::from_secs(5),
            sandbox: Sandbox::default(),
            tick: Duration::from_secs(1),
            max_instances: 256,
        };
        let den = Den::new(
            Arc::new(MongoStore::from_database(db.clone())),
            self.runner.clone(),
            settings,
        );
        let stop = CancellationToken::new();
        let handle = tokio::spawn({
            let stop = stop.clone();
            async move { den.run(stop).await.unwrap() }
        });
        (stop, handle)
    }

    async fn wait_done(db: &Database, queue: ObjectId) {
        let tasks = db.collection::<Document>("tasks");
        while tasks
            .count_documents(doc! {"queue": queue, "status": {"$lte": 0}})
            .await
            .unwrap()
            > 0
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Tasks/s of `dens` DENs draining `n` trivial tasks.
    async fn drain(&self, n: usize, dens: usize) -> f64 {
        let db = self.db("drain").await;
        let q = self.queue(&db, THREADS).await;
        self.tasks(&db, q, n, doc! {}).await;
        let start = Instant::now();
        let running: Vec<_> = (0..dens).map(|i| self.den(&db, &format!("bench-{i}"))).collect();
        Self::wait_done(&db, q).await;
        let rate = n as f64 / start.elapsed().as_secs_f64();
        for (stop, handle) in running {
            stop.cancel();
            handle.await.unwrap();
        }
        db.drop().await.ok();
        rate
    }

    /// Tasks/s of a driver-only loop: claim with findOneAndUpdate, then one finishing
    /// update, with `THREADS` workers, over `n` tasks (of which `depth` are queued).
    async fn ceiling(&self, n: usize, depth: usize) -> f64 {
        let db = self.db("ceiling").await;
        let q = self.queue(&db, THREADS).await;
        self.tasks(&db, q, depth.max(n), doc! {}).await;
        let claimed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let start = Instant::now();
        let workers: Vec<_> = (0..THREADS)
            .map(|w| {
                let tasks = db.collection::<Document>("tasks");
                let claimed = claimed.clone();
                tokio::spawn(async move {
                    let node = format!("driver-{w}");
                    let mut options = FindOneAndUpdateOptions::default();
                    options.sort = Some(doc! {"_id": 1});
                    while claimed.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < n {
                        let Some(t) = tasks
                            .find_one_and_update(
                                doc! {"node": Bson::Null, "status": -2, "queue": q},
                                doc! {"$set": {"node": &node, "status": -1, "mtime": DateTime::now()}},
                            )
                            .with_options(options.clone())
                            .await
                            .unwrap()
                        else {
                            break;
                        };
                        tasks
                            .update_one(
                                doc! {"_id": t.get_object_id("_id").unwrap(), "node": &node},
                                doc! {"$set": {"status": 1, "stdout": "hello\n", "stderr": "", "mtime": DateTime::now()}},
                            )
                            .await
                            .unwrap();
                    }
                })
            })
            .collect();
        for w in workers {
            w.await.unwrap();
        }
        let rate = n as f64 / start.elapsed().as_secs_f64();
        db.drop().await.ok();
        rate
    }

    fn sandbox(&self) {
        let plugin = self.runner.load(&self.plugins.join("demo.wasm")).unwrap();
        let sandbox = Sandbox::default();
        let per_round = if self.quick { 2_000 } else { 10_000 };
        let mut in_process = Vec::new();
        for _ in 0..self.rounds {
            let start = Instant::now();
            for _ in 0..per_round {
                let o = self.runner.run(&plugin, "{}", &sandbox, None);
                assert!(o.succeeded());
            }
            in_process.push(start.elapsed().as_secs_f64() * 1e6 / per_round as f64);
        }
        let processes = if self.quick { 10 } else { 30 };
        let mut per_process = Vec::new();
        for _ in 0..self.rounds {
            let start = Instant::now();
            for _ in 0..processes {
                let ok = Command::new(bin("runner"))
                    .arg("exec")
                    .arg(self.plugins.join("demo.wasm"))
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .unwrap()
                    .success();
                assert!(ok);
            }
            per_process.push(start.elapsed().as_secs_f64() * 1e6 / processes as f64);
        }
        let (a, b) = (median(in_process), median(per_process));
        println!("\n## sandbox: one trivial demo task (median of {} rounds)", self.rounds);
        println!("| runner | µs per task |\n|---|---|");
        println!("| in-process (Runner::run, instance per task) | {a:.1} |");
        println!("| process per task (runner exec, cached compile) | {b:.0} |");
        println!(
            "RESULT sandbox in_process_us={a:.1} process_us={b:.0} ratio={:.0}",
            b / a
        );
    }

    async fn ceiling_and_throughput(&self, only_ceiling: bool) {
        let sizes: &[usize] = if self.quick { &[2_000] } else { &[2_000, 20_000] };
        let rounds = if self.quick {
            3.max(self.rounds / 2)
        } else {
            self.rounds
        };
        println!("\n## ceiling and throughput: trivial demo tasks, {THREADS} at a time (median of {rounds} rounds)");
        println!(
            "| N | driver-only claim+finish /s | 1 DEN /s | ratio | 2 DENs /s | ratio |\n|---|---|---|---|---|---|"
        );
        let mut last = String::new();
        for &n in sizes {
            let rounds_here = if n > 5_000 { 1.max(rounds / 3) } else { rounds };
            let mut c = Vec::new();
            let mut one = Vec::new();
            let mut two = Vec::new();
            for _ in 0..rounds_here {
                c.push(self.ceiling(n, n).await);
                if !only_ceiling {
                    one.push(self.drain(n, 1).await);
                    two.push(self.drain(n, 2).await);
                }
            }
            let (c, one, two) = (median(c), median(one), median(two));
            println!(
                "| {n} | {c:.0} | {one:.0} | {:.2} | {two:.0} | {:.2} |",
                one / c,
                two / c
            );
            last = format!("n={n} ceiling_per_s={c:.0} tasks_per_s={one:.0} ratio_to_ceiling={:.2} two_dens_per_s={two:.0} two_dens_ratio={:.2}", one / c, two / c);
        }
        if only_ceiling {
            println!(
                "RESULT ceiling {}",
                last.split(" tasks_per_s").next().unwrap_or_default()
            );
        } else {
            println!("RESULT throughput {last}");
        }
    }

    async fn latency(&self) {
        let db = self.db("latency").await;
        let q = self.queue(&db, THREADS).await;
        let (stop, handle) = self.den(&db, "bench-latency");
        tokio::time::sleep(Duration::from_millis(1500)).await; // let the DEN settle into idle
        let tasks = db.collection::<Document>("tasks");
        let samples = if self.quick { 30 } else { 100 };
        let (mut to_running, mut to_finished) = (Vec::new(), Vec::new());
        for _ in 0..samples {
            let now = DateTime::now();
            let start = Instant::now();
            let id = tasks
                .insert_one(doc! {"queue": q, "status": -2, "node": Bson::Null, "params": {},
                "ctime": now, "mtime": now, "stdout": Bson::Null, "stderr": Bson::Null})
                .await
                .unwrap()
                .inserted_id;
            let mut seen_running = None;
            loop {
                let d = tasks.find_one(doc! {"_id": &id}).await.unwrap().unwrap();
                let s = d.get_i32("status").unwrap_or(-2);
                if s >= 0 && seen_running.is_none() {
                    seen_running = Some(start.elapsed());
                }
                if s > 0 {
                    to_finished.push(start.elapsed().as_secs_f64() * 1e3);
                    break;
                }
                tokio::time::sleep(Duration::from_micros(500)).await;
            }
            to_running.push(seen_running.unwrap().as_secs_f64() * 1e3);
            tokio::time::sleep(Duration::from_millis(50)).await; // idle again
        }
        stop.cancel();
        handle.await.unwrap();
        db.drop().await.ok();
        let (r50, r99) = (percentile(to_running.clone(), 0.5), percentile(to_running, 0.99));
        let (f50, f99) = (percentile(to_finished.clone(), 0.5), percentile(to_finished, 0.99));
        println!("\n## latency: one task at a time into an idle DEN ({samples} tasks)");
        println!("| | p50 ms | p99 ms |\n|---|---|---|");
        println!("| insert → running | {r50:.1} | {r99:.1} |");
        println!("| insert → finished | {f50:.1} | {f99:.1} |");
        println!("RESULT latency running_p50_ms={r50:.1} running_p99_ms={r99:.1} finished_p50_ms={f50:.1} finished_p99_ms={f99:.1}");
    }

    /// Tasks/s of one DEN draining `n` tasks from a queue `depth` deep.
    async fn drain_at_depth(&self, n: usize, depth: usize) -> f64 {
        let db = self.db("depth").await;
        let q = self.queue(&db, THREADS).await;
        self.tasks(&db, q, depth, doc! {}).await;
        let tasks = db.collection::<Document>("tasks");
        let start = Instant::now();
        let (stop, handle) = self.den(&db, "bench-depth");
        while tasks
            .count_documents(doc! {"queue": q, "status": {"$gt": 0}})
            .await
            .unwrap()
            < n as u64
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let rate = n as f64 / start.elapsed().as_secs_f64();
        stop.cancel();
        handle.await.unwrap();
        db.drop().await.ok();
        rate
    }

    async fn depth(&self) {
        let (shallow, deep) = if self.quick { (1_000, 20_000) } else { (1_000, 50_000) };
        let n = 500;
        let rounds = if self.quick { 1 } else { 3 };
        let (mut d_s, mut d_d, mut c_s, mut c_d) = (vec![], vec![], vec![], vec![]);
        for _ in 0..rounds {
            c_s.push(self.ceiling(n, shallow).await);
            c_d.push(self.ceiling(n, deep).await);
            d_s.push(self.drain_at_depth(n, shallow).await);
            d_d.push(self.drain_at_depth(n, deep).await);
        }
        let (c_s, c_d, d_s, d_d) = (median(c_s), median(c_d), median(d_s), median(d_d));
        println!("\n## depth: {n} claims from a queue {shallow} vs {deep} deep (median of {rounds} rounds)");
        println!("| | {shallow} deep /s | {deep} deep /s | slowdown |\n|---|---|---|---|");
        println!("| driver-only | {c_s:.0} | {c_d:.0} | {:.2}× |", c_s / c_d);
        println!("| DEN | {d_s:.0} | {d_d:.0} | {:.2}× |", d_s / d_d);
        println!(
            "RESULT depth shallow={shallow} deep={deep} den_slowdown={:.2} db_slowdown={:.2}",
            d_s / d_d,
            c_s / c_d
        );
    }

    async fn memory(&self) {
        let db = self.db("memory").await;
        let q = self.queue(&db, 100).await;
        let dir = tempfile::tempdir().unwrap();
        let config = serde_json::json!({
            "mongohost": self.uri, "database": db.name(), "plugins": ["demo"],
            "plugin_dir": self.plugins, "node": "bench-memory",
        });
        let path = dir.path().join("den.json");
        std::fs::write(&path, config.to_string()).unwrap();
        let mut child = Command::new(bin("den"))
            .arg("--config")
            .arg(&path)
            .env("DISBATCH_CACHE_DIR", dir.path().join("cache"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let rss = |pid: u32| -> f64 {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
                .unwrap_or(f64::NAN)
                / 1024.0
        };
        tokio::time::sleep(Duration::from_secs(3)).await;
        let idle = rss(child.id());
        self.tasks(&db, q, 100, doc! {"sleep_ms": 5000}).await;
        let tasks = db.collection::<Document>("tasks");
        let start = Instant::now();
        while tasks.count_documents(doc! {"status": 0}).await.unwrap() < 100
            && start.elapsed() < Duration::from_secs(30)
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let running = tasks.count_documents(doc! {"status": 0}).await.unwrap();
        let busy = rss(child.id());
        child.kill().ok();
        child.wait().ok();
        db.drop().await.ok();
        println!("\n## memory: den process RSS");
        println!("| state | RSS MiB |\n|---|---|");
        println!("| idle | {idle:.1} |");
        println!("| {running} tasks running | {busy:.1} |");
        println!("RESULT memory idle_mib={idle:.1} busy_mib={busy:.1} running={running}");
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let known = ["sandbox", "ceiling", "throughput", "latency", "depth", "memory", "all"];
    if !known.contains(&args.scenario.as_str()) {
        eprintln!(
            "unknown scenario {:?}: expected one of {}",
            args.scenario,
            known.join(", ")
        );
        std::process::exit(2);
    }
    build_binaries();
    let plugins = tokio::task::spawn_blocking(plugins::plugins_dir).await.unwrap();
    let (uri, server) = match std::env::var("MONGODB_URI").ok().filter(|u| !u.is_empty()) {
        Some(uri) => (uri, None),
        None => {
            let s = tokio::task::spawn_blocking(server::TestServer::start_private)
                .await
                .unwrap();
            (s.uri(), Some(s))
        }
    };
    let bench = Bench {
        quick: args.quick,
        rounds: args.rounds.max(1),
        client: Client::with_uri_str(&uri).await.unwrap(),
        uri,
        runner: Runner::new(&EngineOptions {
            cache_dir: Some(tempfile::tempdir().unwrap().keep()),
            max_instances: 256,
        })
        .unwrap(),
        plugins,
        _server: server,
    };
    println!(
        "# Disbatch bench ({} mode, {} rounds, {} cores)",
        if args.quick { "quick" } else { "full" },
        bench.rounds,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
    let all = args.scenario == "all";
    if all || args.scenario == "sandbox" {
        tokio::task::block_in_place(|| bench.sandbox());
    }
    if args.scenario == "ceiling" {
        bench.ceiling_and_throughput(true).await;
    }
    if all || args.scenario == "throughput" {
        bench.ceiling_and_throughput(false).await;
    }
    if all || args.scenario == "latency" {
        bench.latency().await;
    }
    if all || args.scenario == "depth" {
        bench.depth().await;
    }
    if all || args.scenario == "memory" {
        bench.memory().await;
    }
}
