//! Benchmarks: the DEN against the physical limit (the database's own claim rate), against
//! the job runners users compare it with (`peers`), and the sandbox against a process per
//! task, measured in one run on one machine.
//!
//! ```sh
//! cargo run --release --example bench -- all            # every scenario but peers and scale
//! cargo run --release --example bench -- throughput     # one scenario
//! cargo run --release --example bench -- peers --quick  # Agenda, plainjob, liteque beside the DEN
//! cargo run --release --example bench -- all --quick    # small sizes: about a minute after the builds
//! cargo run --release --example bench -- retention      # claims while 1,000,000 ended tasks are deleted
//! ```
//!
//! Starts its own `secantusd-rs` (or uses `MONGODB_URI`), builds the plugins and the
//! binaries it needs, prints a table per scenario with medians over the rounds, and ends
//! each scenario with one line `RESULT <scenario> key=value …`. `--n`, `--deep`, `--claims`,
//! `--rounds` and `--threads` set the sizes (`--completion-window` the MongoDB DENs' window); `docs/performance.md` explains the figures.

#[path = "bench/counts.rs"]
mod counts;
#[path = "bench/dag.rs"]
mod dag;
#[path = "bench/embedded.rs"]
mod embedded;
#[path = "bench/embedded_den.rs"]
mod embedded_den;
#[path = "bench/finished.rs"]
mod finished;
#[path = "bench/floor.rs"]
mod floor;
#[path = "bench/latency.rs"]
mod latency;
#[path = "bench/mongo.rs"]
mod mongo;
#[path = "bench/peers.rs"]
mod peers;
#[path = "../tests/common/plugins.rs"]
#[allow(dead_code)]
mod plugins;
#[path = "bench/retention.rs"]
mod retention;
#[path = "bench/sandbox.rs"]
mod sandbox;
#[path = "bench/scale.rs"]
mod scale;
#[path = "bench/schedule.rs"]
mod schedule;
#[path = "../tests/common/server.rs"]
#[allow(dead_code)]
mod server;

use std::path::{Path, PathBuf};
use std::process::Command;
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
use mongodb::{Client, Database};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(about = "Disbatch benchmarks")]
struct Args {
    /// sandbox, ceiling, throughput, latency, depth, memory, schedule, dag, embedded, finished,
    /// peers, scale, retention or all (all but ceiling, finished, peers, scale and retention).
    scenario: String,
    /// Smaller sizes and fewer rounds, so `all` takes a few minutes.
    #[arg(long)]
    quick: bool,
    /// Rounds per measurement (medians are reported; default 5; the sandbox always runs at least 5).
    #[arg(long)]
    rounds: Option<usize>,
    /// Task counts of the throughput scenario, comma-separated (default 2000,20000; 500 with
    /// --quick); for peers, the first is the MongoDB part's and the last the SQLite part's
    /// (default 2000 and 20000; 500 and 5000 with --quick).
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
    /// The in-process MongoDB DENs' `completion_window`, in seconds (default 0).
    #[arg(long, default_value_t = 0.0)]
    completion_window: f64,
}

struct Bench {
    quick: bool,
    rounds: usize,
    threads: i64,
    /// The MongoDB DENs' `completion_window`.
    window: Duration,
    sizes: Vec<usize>,
    /// Whether `--n` set `sizes`.
    sizes_given: bool,
    deep: usize,
    claims: usize,
    uri: String,
    client: Client,
    runner: Runner,
    plugins: PathBuf,
    _server: Option<server::TestServer>,
}

/// The instance pool of the bench's `Runner` (and of the sandbox's floor engine).
const RUNNER_INSTANCES: u32 = 256;

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
    target_dir().join("release").join(name)
}

/// The build's `target/` (`CARGO_TARGET_DIR` when set).
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
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
    let (n, first, last) = finish_span(db, filter).await;
    if n == 0 {
        return (f64::NAN, 0);
    }
    let span = (last - first).max(1.0) / 1e3;
    (n.saturating_sub(1) as f64 / span, n)
}

/// The count of the tasks matching `filter` and their first and last `mtime` (Unix ms).
async fn finish_span(db: &Database, filter: Document) -> (u64, f64, f64) {
    let pipeline = [
        doc! {"$match": filter},
        doc! {"$group": {"_id": Bson::Null, "n": {"$sum": 1}, "first": {"$min": "$mtime"}, "last": {"$max": "$mtime"}}},
    ];
    let mut cursor = db.collection::<Document>("tasks").aggregate(pipeline).await.unwrap();
    use futures::TryStreamExt;
    let Some(g) = cursor.try_next().await.unwrap() else {
        return (0, 0.0, 0.0);
    };
    let n = g.get_i32("n").map(i64::from).or_else(|_| g.get_i64("n")).unwrap_or(0);
    let first = g.get_datetime("first").map(|d| d.timestamp_millis()).unwrap_or(0);
    let last = g.get_datetime("last").map(|d| d.timestamp_millis()).unwrap_or(0);
    (n.max(0) as u64, first as f64, last as f64)
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
        self.den_on(
            Arc::new(MongoStore::from_database_grouping(db.clone(), self.window)),
            node,
        )
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
            retention: Default::default(),
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
        "embedded",
        "peers",
        "scale",
        "finished",
        "retention",
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
    let wants = |s: &str| (all && s != "peers" && s != "scale") || args.scenario == s;
    if wants("sandbox") || wants("memory") || wants("peers") || wants("scale") {
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
        window: Duration::from_secs_f64(args.completion_window.clamp(0.0, 0.1)),
        sizes,
        sizes_given: !args.n.is_empty(),
        deep: args.deep.unwrap_or(if args.quick { 5_000 } else { 50_000 }),
        claims: args.claims.unwrap_or(if args.quick { 50 } else { 100 }),
        client: Client::with_uri_str(&uri).await.unwrap(),
        uri,
        runner: Runner::new(&EngineOptions {
            cache_dir: Some(tempfile::tempdir().unwrap().keep()),
            max_instances: RUNNER_INSTANCES,
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
    if wants("embedded") {
        bench.embedded().await;
    }
    if wants("peers") {
        bench.peers().await;
    }
    if wants("scale") {
        bench.scale().await;
    }
    if args.scenario == "finished" {
        bench.finished().await;
    }
    if args.scenario == "retention" {
        bench.retention().await;
    }
    println!("\n(bench took {:.0} s)", started.elapsed().as_secs_f64());
}
