//! Benchmarks: the DEN against the physical limit (the database's own claim rate) and the
//! sandbox against a process per task, measured in one run on one machine.
//!
//! ```sh
//! cargo run --release --example bench -- all            # every scenario
//! cargo run --release --example bench -- throughput     # one scenario
//! cargo run --release --example bench -- all --quick    # small sizes: about a minute after the builds
//! ```
//!
//! Starts its own `secantusd-rs` (or uses `MONGODB_URI`), builds the plugins and the
//! binaries it needs, prints a table per scenario with medians over the rounds, and ends
//! each scenario with one line `RESULT <scenario> key=value …`. `--n`, `--deep`, `--claims`,
//! `--rounds` and `--threads` set the sizes; `docs/performance.md` explains the figures.

#[path = "bench/dag.rs"]
mod dag;
#[path = "bench/finished.rs"]
mod finished;
#[path = "../tests/common/plugins.rs"]
#[allow(dead_code)]
mod plugins;
#[path = "bench/schedule.rs"]
mod schedule;
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
    /// sandbox, ceiling, throughput, latency, depth, memory, schedule, dag, finished or all
    /// (all but ceiling and finished).
    scenario: String,
    /// Smaller sizes and fewer rounds, so `all` takes a few minutes.
    #[arg(long)]
    quick: bool,
    /// Rounds per measurement (medians are reported; default 5; the sandbox always runs at least 5).
    #[arg(long)]
    rounds: Option<usize>,
    /// Task counts of the throughput scenario, comma-separated (default 2000,20000; 500 with --quick).
    #[arg(long, value_delimiter = ',')]
    n: Vec<usize>,
    /// Depth scenario: the deep queue's size (default 50000; 5000 with --quick).
    #[arg(long)]
    deep: Option<usize>,
    /// Depth scenario: claims timed at each depth, by the driver loop and then by the DEN (default 100; 50 with --quick).
    #[arg(long)]
    claims: Option<usize>,
    /// Tasks at a time: the queue's `threads` and the driver-only loop's workers.
    #[arg(long, default_value_t = 8)]
    threads: i64,
    /// Never run `cargo build` for the binaries (use them even when older than the sources).
    #[arg(long)]
    no_build: bool,
}

struct Bench {
    quick: bool,
    rounds: usize,
    threads: i64,
    sizes: Vec<usize>,
    deep: usize,
    claims: usize,
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
    v.get(((v.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

/// Newest modification time of the files a release binary is built from.
fn newest_source() -> std::time::SystemTime {
    fn walk(dir: &Path, newest: &mut std::time::SystemTime) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let path = e.path();
            if path.is_dir() {
                walk(&path, newest);
            } else if let Ok(m) = e.metadata().and_then(|m| m.modified()) {
                *newest = (*newest).max(m);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut newest = std::time::SystemTime::UNIX_EPOCH;
    walk(&root.join("src"), &mut newest);
    walk(&root.join("wit"), &mut newest);
    for f in ["Cargo.toml", "Cargo.lock"] {
        if let Ok(m) = std::fs::metadata(root.join(f)).and_then(|m| m.modified()) {
            newest = newest.max(m);
        }
    }
    newest
}

/// Builds `target/release/{runner,den}` unless they are newer than their sources (or
/// `--no-build` was given); exits with the command to run when that fails.
fn build_binaries(no_build: bool) {
    const BUILD: &str = "cargo build --release --bin runner --bin den";
    let fresh = |name: &str| {
        std::fs::metadata(bin(name))
            .and_then(|m| m.modified())
            .is_ok_and(|t| t >= newest_source())
    };
    if fresh("runner") && fresh("den") {
        return;
    }
    if no_build {
        if bin("runner").is_file() && bin("den").is_file() {
            eprintln!("note: target/release/runner or den is older than its sources (--no-build)");
            return;
        }
        eprintln!("target/release/runner and target/release/den are needed; run:\n    {BUILD}");
        std::process::exit(2);
    }
    eprintln!("building the binaries: {BUILD}");
    let ok = Command::new(env!("CARGO"))
        .args(["build", "--release", "--bin", "runner", "--bin", "den"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("building the binaries failed; run:\n    {BUILD}");
        std::process::exit(2);
    }
}

fn bin(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release").join(name)
}

/// A task document as the spec has it, queued.
fn queued(queue: ObjectId, params: &Document) -> Document {
    let now = DateTime::now();
    doc! {"queue": queue, "status": -2, "node": Bson::Null, "params": params.clone(),
    "ctime": now, "mtime": now, "stdout": Bson::Null, "stderr": Bson::Null}
}

/// Finishing rate of the tasks matching `filter`: (count − 1) over the span between the
/// first and the last finishing `mtime`, so start-up (plugin load, first tick) is left out
/// and the DEN and the driver-only loop are timed the same way.
async fn finish_rate(db: &Database, filter: Document) -> (f64, u64) {
    let pipeline = [
        doc! {"$match": filter},
        doc! {"$group": {"_id": Bson::Null, "n": {"$sum": 1}, "first": {"$min": "$mtime"}, "last": {"$max": "$mtime"}}},
    ];
    let mut cursor = db.collection::<Document>("tasks").aggregate(pipeline).await.unwrap();
    use futures::TryStreamExt;
    let Some(g) = cursor.try_next().await.unwrap() else {
        return (f64::NAN, 0);
    };
    let n = g.get_i32("n").map(i64::from).or_else(|_| g.get_i64("n")).unwrap_or(0);
    let first = g.get_datetime("first").map(|d| d.timestamp_millis()).unwrap_or(0);
    let last = g.get_datetime("last").map(|d| d.timestamp_millis()).unwrap_or(0);
    let span = (last - first).max(1) as f64 / 1e3;
    ((n - 1).max(0) as f64 / span, n as u64)
}

/// CPU seconds (user + system) used so far by process `pid`.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which is in parentheses): state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks(11) + ticks(12)) / hz
}

/// The pid of the `secantusd-rs` this process started, if any.
fn server_pid() -> Option<u32> {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        let (name, rest) = stat.split_once(") ")?;
        let ppid = rest.split_whitespace().nth(1)?;
        (name.ends_with("(secantusd-rs") && ppid == me).then_some(pid)
    })
}

/// CPU time of the database server and of this process (the in-process DENs, the
/// driver loop and the bench's polling) over a measured run.
#[derive(Clone, Copy)]
struct Cpu {
    server: f64,
    own: f64,
}

impl Cpu {
    fn now() -> Cpu {
        Cpu {
            server: server_pid().map_or(f64::NAN, cpu_secs),
            own: cpu_secs(std::process::id()),
        }
    }

    /// µs of CPU per task since `self`, for `n` tasks: (server, this process).
    fn per_task_since(self, n: usize) -> (f64, f64) {
        let now = Cpu::now();
        let n = n.max(1) as f64;
        ((now.server - self.server) * 1e6 / n, (now.own - self.own) * 1e6 / n)
    }
}

/// Counts finished tasks matching `filter` every 50 ms until there are `n`.
async fn wait_finished(db: &Database, filter: Document, n: u64, limit: Duration) -> bool {
    let tasks = db.collection::<Document>("tasks");
    let start = Instant::now();
    loop {
        if tasks.count_documents(filter.clone()).await.unwrap() >= n {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
        let docs: Vec<Document> = (0..n).map(|_| queued(queue, &params)).collect();
        for batch in docs.chunks(5_000) {
            db.collection::<Document>("tasks")
                .insert_many(batch.to_vec())
                .await
                .unwrap();
        }
    }

    fn den(&self, db: &Database, node: &str) -> (CancellationToken, tokio::task::JoinHandle<()>) {
        self.den_on(Arc::new(MongoStore::from_database(db.clone())), node)
    }

    /// A DEN on `store` running the `demo` plugin, stopped by the token.
    fn den_on(&self, store: Arc<dyn Store>, node: &str) -> (CancellationToken, tokio::task::JoinHandle<()>) {
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
            stats_retention: disbatch::config::DEFAULT_STATS_RETENTION,
            sandbox: Sandbox::default(),
            tick: Duration::from_secs(1),
            max_instances: 256,
            protected: Vec::new(),
            balance: Default::default(),
        };
        let den = Den::new(store, self.runner.clone(), settings);
        let stop = CancellationToken::new();
        let handle = tokio::spawn({
            let stop = stop.clone();
            async move { den.run(stop).await.unwrap() }
        });
        (stop, handle)
    }

    /// Tasks/s of `dens` DENs draining `n` trivial tasks (steady rate, see [`finish_rate`]).
    async fn drain(&self, n: usize, dens: usize) -> (f64, (f64, f64)) {
        let db = self.db("drain").await;
        let q = self.queue(&db, self.threads).await;
        self.tasks(&db, q, n, doc! {}).await;
        let cpu = Cpu::now();
        let running: Vec<_> = (0..dens).map(|i| self.den(&db, &format!("bench-{i}"))).collect();
        let done = wait_finished(&db, doc! {"queue": q, "status": 1}, n as u64, Duration::from_secs(600)).await;
        assert!(done, "{dens} DEN(s) did not drain {n} tasks in 10 minutes");
        let cpu = cpu.per_task_since(n);
        for (stop, handle) in running {
            stop.cancel();
            handle.await.unwrap();
        }
        let (rate, _) = finish_rate(&db, doc! {"queue": q, "status": 1}).await;
        db.drop().await.ok();
        (rate, cpu)
    }

    /// One DEN draining `n` tasks on its own client, counting every database command it
    /// sends: commands per task by name and collection, and the total.
    async fn command_profile(&self, n: usize) -> (Vec<(String, f64)>, f64) {
        let counts: Arc<std::sync::Mutex<std::collections::BTreeMap<String, u64>>> = Arc::default();
        let mut options = mongodb::options::ClientOptions::parse(&self.uri).await.unwrap();
        options.command_event_handler = Some(mongodb::event::EventHandler::callback({
            let counts = counts.clone();
            move |event: mongodb::event::command::CommandEvent| {
                if let mongodb::event::command::CommandEvent::Started(e) = event {
                    let target = e.command.get_str(&e.command_name).unwrap_or("-");
                    let key = format!("{} {target}", e.command_name);
                    *counts.lock().unwrap().entry(key).or_default() += 1;
                }
            }
        }));
        let client = Client::with_options(options).unwrap();
        let db = self.db("profile").await;
        let q = self.queue(&db, self.threads).await;
        self.tasks(&db, q, n, doc! {}).await;
        let counted = client.database(db.name());
        counts.lock().unwrap().clear();
        let (stop, handle) = self.den(&counted, "bench-profile");
        let done = wait_finished(&db, doc! {"queue": q, "status": 1}, n as u64, Duration::from_secs(600)).await;
        assert!(done, "the DEN did not drain {n} tasks in 10 minutes");
        stop.cancel();
        handle.await.unwrap();
        db.drop().await.ok();
        let counts = counts.lock().unwrap();
        let per_task: Vec<(String, f64)> = counts.iter().map(|(k, v)| (k.clone(), *v as f64 / n as f64)).collect();
        let total = per_task.iter().map(|(_, v)| v).sum();
        (per_task, total)
    }

    /// The driver-only loop on `q`: `self.threads` workers, each claiming with the spec's
    /// findOneAndUpdate then writing one finishing update, until `n` tasks are done. Returns
    /// tasks/s (steady rate) and µs per claim+finish pair as one worker saw it.
    /// With `start`, each task also gets the DEN's `status: 0` write between claim and
    /// finish (three round trips per task, as the DEN makes).
    async fn driver_loop(&self, db: &Database, q: ObjectId, n: usize, start: bool) -> (f64, f64) {
        let claimed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let workers: Vec<_> = (0..self.threads)
            .map(|w| {
                let tasks = db.collection::<Document>("tasks");
                let claimed = claimed.clone();
                tokio::spawn(async move {
                    let node = format!("driver-{w}");
                    let mut options = FindOneAndUpdateOptions::default();
                    options.sort = Some(doc! {"_id": 1});
                    let (mut pairs, began) = (0u32, Instant::now());
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
                        let id = t.get_object_id("_id").unwrap();
                        let claimed_status = if start {
                            tasks
                                .update_one(
                                    doc! {"_id": id, "node": &node, "status": -1},
                                    doc! {"$set": {"status": 0, "mtime": DateTime::now()}},
                                )
                                .await
                                .unwrap();
                            0
                        } else {
                            -1
                        };
                        tasks
                            .update_one(
                                doc! {"_id": id, "node": &node, "status": claimed_status},
                                doc! {"$set": {"status": 1, "stdout": "hello\n", "stderr": "", "mtime": DateTime::now()}},
                            )
                            .await
                            .unwrap();
                        pairs += 1;
                    }
                    began.elapsed().as_secs_f64() * 1e6 / f64::from(pairs.max(1))
                })
            })
            .collect();
        let mut per_pair = Vec::new();
        for w in workers {
            per_pair.push(w.await.unwrap());
        }
        let (rate, _) = finish_rate(db, doc! {"queue": q, "status": 1, "node": {"$regex": "^driver-"}}).await;
        (rate, median(per_pair))
    }

    /// Tasks/s of the driver-only loop over `n` tasks of a fresh queue.
    async fn ceiling(&self, n: usize, start: bool) -> (f64, (f64, f64)) {
        let db = self.db("ceiling").await;
        let q = self.queue(&db, self.threads).await;
        self.tasks(&db, q, n, doc! {}).await;
        let cpu = Cpu::now();
        let (rate, _) = self.driver_loop(&db, q, n, start).await;
        let cpu = cpu.per_task_since(n);
        db.drop().await.ok();
        (rate, cpu)
    }

    fn sandbox(&self) {
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

    async fn ceiling_scenario(&self) {
        let mut last = String::new();
        println!(
            "\n## ceiling: driver-only claim (findOneAndUpdate) + finish (update_one), {} workers (median of {} rounds)",
            self.threads, self.rounds
        );
        println!("| N | claim+finish /s |\n|---|---|");
        for &n in &self.sizes {
            let mut c = Vec::new();
            for _ in 0..self.rounds_for(n) {
                c.push(self.ceiling(n, false).await.0);
            }
            let c = median(c);
            println!("| {n} | {c:.0} |");
            last = format!("n={n} threads={} ceiling_per_s={c:.0}", self.threads);
        }
        println!("RESULT ceiling {last}");
    }

    /// Rounds for a run over `n` tasks: all of them for small runs, fewer for big ones.
    fn rounds_for(&self, n: usize) -> usize {
        if n > 5_000 {
            1.max(self.rounds / 3)
        } else {
            self.rounds
        }
    }

    async fn throughput(&self) {
        println!(
            "\n## throughput: DENs draining N trivial demo tasks, queue threads {} (medians; rounds per N below)",
            self.threads
        );
        println!("| N | rounds | ceiling /s (claim + finish) | 1 DEN /s | 1 DEN ÷ ceiling | 2 DENs /s | 2 DENs ÷ ceiling | driver with the DEN's start write /s | 1 DEN ÷ that |\n|---|---|---|---|---|---|---|---|---|");
        let (mut results, mut ceilings, mut cpu_rows, mut cpu_kv) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        // The largest N's figures also go unprefixed at the front of the RESULT line.
        let mut headline = None;
        for &n in &self.sizes {
            let rounds = self.rounds_for(n);
            let (mut c, mut c3, mut one, mut two) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            let (mut c_db, mut c_own, mut one_db, mut one_own) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for _ in 0..rounds {
                c3.push(self.ceiling(n, true).await.0);
                let (rate, (db, own)) = self.ceiling(n, false).await;
                c.push(rate);
                c_db.push(db);
                c_own.push(own);
                let (rate, (db, own)) = self.drain(n, 1).await;
                one.push(rate);
                one_db.push(db);
                one_own.push(own);
                two.push(self.drain(n, 2).await.0);
            }
            let (c, c3, one, two) = (median(c), median(c3), median(one), median(two));
            ceilings.push((n, c));
            let (c_db, c_own, one_db, one_own) = (median(c_db), median(c_own), median(one_db), median(one_own));
            cpu_rows.push(format!("| {n} | {c_db:.0} | {c_own:.0} | {one_db:.0} | {one_own:.0} |"));
            cpu_kv.push(format!(
                "n{n}_db_cpu_us_per_task_driver={c_db:.0} n{n}_db_cpu_us_per_task_den={one_db:.0} n{n}_den_cpu_us_per_task={one_own:.0}"
            ));
            println!(
                "| {n} | {rounds} | {c:.0} | {one:.0} | {:.2} | {two:.0} | {:.2} | {c3:.0} | {:.2} |",
                one / c,
                two / c,
                one / c3
            );
            headline = Some(format!(
                "n={n} tasks_per_s={one:.0} ratio_to_ceiling={:.2} two_dens_per_s={two:.0}",
                one / c
            ));
            results.push(format!(
                "n{n}_ceiling_per_s={c:.0} n{n}_tasks_per_s={one:.0} n{n}_ratio_to_ceiling={:.2} n{n}_two_dens_per_s={two:.0} n{n}_two_dens_ratio={:.2} n{n}_three_writes_per_s={c3:.0} n{n}_ratio_to_three_writes={:.2}",
                one / c,
                two / c,
                one / c3
            ));
        }
        println!("\nCPU µs per task over the same runs (medians): the database server, and this process (driver loop, or the DEN with the bench's polling)");
        println!("| N | DB, driver-only | driver process | DB, 1 DEN | DEN process |\n|---|---|---|---|---|");
        for row in &cpu_rows {
            println!("{row}");
        }
        let n = self.sizes[0];
        let (profile, total) = self.command_profile(n).await;
        println!(
            "\nDatabase commands per task of one DEN draining {n} tasks (the whole run: start-up, ticks, shutdown)"
        );
        println!("| command collection | per task |\n|---|---|");
        for (command, per_task) in &profile {
            println!("| {command} | {per_task:.3} |");
        }
        println!("| **total** | **{total:.2}** |");
        cpu_kv.push(format!("n{n}_den_commands_per_task={total:.2}"));
        if let Some((n, c)) = ceilings.last() {
            println!("RESULT ceiling n={n} threads={} ceiling_per_s={c:.0}", self.threads);
        }
        println!(
            "RESULT throughput threads={} {} {} {}",
            self.threads,
            headline.unwrap_or_default(),
            results.join(" "),
            cpu_kv.join(" ")
        );
    }

    async fn latency(&self) {
        let db = self.db("latency").await;
        let q = self.queue(&db, self.threads).await;
        let (stop, handle) = self.den(&db, "bench-latency");
        let tasks = db.collection::<Document>("tasks");
        // Let the DEN load the plugin and settle into idle: one task through, then wait.
        let warm = tasks.insert_one(queued(q, &doc! {})).await.unwrap().inserted_id;
        let warm = warm.as_object_id().unwrap();
        assert!(wait_finished(&db, doc! {"_id": warm, "status": 1}, 1, Duration::from_secs(30)).await);
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let samples = if self.quick { 40 } else { 100 };
        let (mut to_running, mut to_finished) = (Vec::new(), Vec::new());
        for i in 0..samples {
            // Even samples are trivial (insert → finished); odd ones sleep 20 ms in the
            // plugin so that the running state is seen by polling (insert → running).
            let slow = i % 2 == 1;
            let params = if slow {
                doc! {"sleep_ms": 20}
            } else {
                doc! {}
            };
            let start = Instant::now();
            let id = tasks.insert_one(queued(q, &params)).await.unwrap().inserted_id;
            loop {
                let d = tasks
                    .find_one(doc! {"_id": &id})
                    .projection(doc! {"status": 1})
                    .await
                    .unwrap()
                    .unwrap();
                let s = d.get_i32("status").unwrap_or(-2);
                if slow && s >= 0 {
                    to_running.push(start.elapsed().as_secs_f64() * 1e3);
                    break;
                }
                if s > 0 {
                    to_finished.push(start.elapsed().as_secs_f64() * 1e3);
                    break;
                }
                tokio::time::sleep(Duration::from_micros(500)).await;
            }
            if slow {
                wait_finished(&db, doc! {"_id": &id, "status": 1}, 1, Duration::from_secs(10)).await;
            }
            tokio::time::sleep(Duration::from_millis(60)).await; // idle again
        }
        stop.cancel();
        handle.await.unwrap();
        db.drop().await.ok();
        let (r50, r99) = (percentile(to_running.clone(), 0.5), percentile(to_running, 0.99));
        let (f50, f99) = (percentile(to_finished.clone(), 0.5), percentile(to_finished, 0.99));
        println!(
            "\n## latency: one task at a time into an idle DEN ({} samples each; polled every 0.5 ms)",
            samples / 2
        );
        println!("| | p50 ms | p99 ms |\n|---|---|---|");
        println!("| insert → running (task sleeping 20 ms) | {r50:.1} | {r99:.1} |");
        println!("| insert → finished (trivial task) | {f50:.1} | {f99:.1} |");
        println!("RESULT latency running_p50_ms={r50:.1} running_p99_ms={r99:.1} finished_p50_ms={f50:.1} finished_p99_ms={f99:.1}");
    }

    /// Driver-only and DEN rates for `n` claims from one queue `depth` deep: the driver
    /// loop takes the first `n`, then one DEN the next `n` (the depth changes by 2n at most).
    async fn at_depth(&self, n: usize, depth: usize) -> (f64, f64) {
        let db = self.db("depth").await;
        let q = self.queue(&db, self.threads).await;
        self.tasks(&db, q, depth, doc! {}).await;
        let (driver, _) = self.driver_loop(&db, q, n, false).await;
        let (stop, handle) = self.den(&db, "bench-depth");
        let filter = doc! {"node": "bench-depth", "status": 1};
        assert!(wait_finished(&db, filter.clone(), n as u64, Duration::from_secs(600)).await);
        stop.cancel();
        handle.await.unwrap();
        let (den, _) = finish_rate(&db, filter).await;
        db.drop().await.ok();
        (driver, den)
    }

    async fn depth(&self) {
        let (shallow, deep, n, rounds) = (1_000, self.deep, self.claims, self.rounds);
        let (mut d_s, mut d_d, mut c_s, mut c_d) = (vec![], vec![], vec![], vec![]);
        for _ in 0..rounds {
            let (c, d) = self.at_depth(n, shallow).await;
            c_s.push(c);
            d_s.push(d);
            let (c, d) = self.at_depth(n, deep).await;
            c_d.push(c);
            d_d.push(d);
        }
        let (c_s, c_d, d_s, d_d) = (median(c_s), median(c_d), median(d_s), median(d_d));
        println!(
            "\n## depth: {n} claims from a queue {shallow} vs {deep} deep, {} at a time (median of {rounds} rounds)",
            self.threads
        );
        println!("| | {shallow} deep /s | {deep} deep /s | slowdown | µs per task at {shallow} | µs per task at {deep} |\n|---|---|---|---|---|---|");
        println!(
            "| driver-only | {c_s:.0} | {c_d:.0} | {:.2}× | {:.0} | {:.0} |",
            c_s / c_d,
            1e6 / c_s,
            1e6 / c_d
        );
        println!(
            "| DEN | {d_s:.0} | {d_d:.0} | {:.2}× | {:.0} | {:.0} |",
            d_s / d_d,
            1e6 / d_s,
            1e6 / d_d
        );
        println!(
            "RESULT depth shallow={shallow} deep={deep} den_shallow_per_s={d_s:.0} den_deep_per_s={d_d:.0} den_slowdown={:.2} db_shallow_per_s={c_s:.0} db_deep_per_s={c_d:.0} db_slowdown={:.2}",
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

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let known = [
        "sandbox",
        "ceiling",
        "throughput",
        "latency",
        "depth",
        "memory",
        "schedule",
        "dag",
        "finished",
        "all",
    ];
    if !known.contains(&args.scenario.as_str()) {
        eprintln!(
            "unknown scenario {:?}: expected one of {}",
            args.scenario,
            known.join(", ")
        );
        std::process::exit(2);
    }
    let all = args.scenario == "all";
    let wants = |s: &str| all || args.scenario == s;
    if wants("sandbox") || wants("memory") {
        build_binaries(args.no_build);
    }
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
    let sizes = if !args.n.is_empty() {
        args.n.clone()
    } else if args.quick {
        vec![500]
    } else {
        vec![2_000, 20_000]
    };
    let rounds = args.rounds.unwrap_or(5).max(1);
    let bench = Bench {
        quick: args.quick,
        rounds,
        threads: args.threads.max(1),
        sizes,
        deep: args.deep.unwrap_or(if args.quick { 5_000 } else { 50_000 }),
        claims: args.claims.unwrap_or(if args.quick { 50 } else { 100 }),
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
        "# Disbatch bench: {} mode, {rounds} rounds (sandbox ≥ 5), N = {:?}, {} tasks at a time, {} cores",
        if args.quick { "quick" } else { "full" },
        bench.sizes,
        bench.threads,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
    let started = Instant::now();
    if wants("sandbox") {
        tokio::task::block_in_place(|| bench.sandbox());
    }
    if args.scenario == "ceiling" {
        bench.ceiling_scenario().await;
    }
    if wants("throughput") {
        bench.throughput().await;
    }
    if wants("latency") {
        bench.latency().await;
    }
    if wants("depth") {
        bench.depth().await;
    }
    if wants("memory") {
        bench.memory().await;
    }
    if wants("schedule") {
        bench.schedule().await;
    }
    if wants("dag") {
        bench.dag().await;
    }
    if args.scenario == "finished" {
        bench.finished().await;
    }
    println!("\n(bench took {:.0} s)", started.elapsed().as_secs_f64());
}
