//! The `peers` scenario: the DEN beside the job runners users choose between, on the same
//! machine in the same run. On MongoDB, Agenda against one DEN and the driver loops; on
//! SQLite, plainjob and liteque against `den --embedded` and the driver-only loop, all on
//! one disk. The Node peers are installed from `bench/peers/` into `target/bench-peers/`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use bson::doc;
use mongodb::Client;
use serde_json::Value;

use super::counts::{mean, per_task, table, Commands};
use super::embedded_den::{den_drain, sqlite_ceiling, unix_ms};
use super::{finish_span, median, target_dir, wait_finished, Bench};

/// The files copied from `bench/peers/` next to the installed packages.
const FILES: [&str; 6] = [
    "package.json",
    "package-lock.json",
    "common.mjs",
    "agenda.mjs",
    "plainjob.mjs",
    "liteque.mjs",
];

/// Installed when these exist (better-sqlite3's native module is built at install).
const INSTALLED: [&str; 5] = [
    "node_modules/agenda/package.json",
    "node_modules/@agendajs/mongo-backend/package.json",
    "node_modules/plainjob/package.json",
    "node_modules/liteque/package.json",
    "node_modules/better-sqlite3/build/Release/better_sqlite3.node",
];

/// `target/bench-peers/` with the scripts and `npm ci` done, or why the peers cannot run.
pub(super) fn install() -> Result<PathBuf, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/peers");
    let dir = target_dir().join("bench-peers");
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    for f in FILES {
        std::fs::copy(src.join(f), dir.join(f)).map_err(|e| format!("copy bench/peers/{f}: {e}"))?;
    }
    let version = Command::new("node").arg("--version").output();
    let Ok(version) = version.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()) else {
        return Err("Node.js is missing: `apt-get install -y nodejs npm` (Debian's Node 20 works)".into());
    };
    if INSTALLED.iter().all(|f| dir.join(f).is_file()) {
        return Ok(dir);
    }
    // better-sqlite3 tries a prebuilt binary first and builds from source when it cannot
    // download one; node-gyp then needs the headers, which Debian's Node ships in
    // /usr/include/node (`nodedir=/usr` keeps node-gyp from downloading them).
    eprintln!("installing the peers (Node {version}): npm ci in {}", dir.display());
    let mut npm = Command::new("npm");
    npm.args(["ci", "--no-audit", "--no-fund"]).current_dir(&dir);
    if Path::new("/usr/include/node/node.h").is_file() {
        npm.env("npm_config_nodedir", "/usr");
    }
    let status = npm.status();
    if !matches!(status, Ok(s) if s.success()) {
        return Err(format!(
            "npm ci failed ({status:?}); run `npm_config_nodedir=/usr npm ci --prefix {}` (needs npm, g++, make, python3 and the Node headers in /usr/include/node: `apt-get install -y npm libnode-dev g++ make python3`)",
            dir.display()
        ));
    }
    match INSTALLED.iter().find(|f| !dir.join(f).is_file()) {
        Some(f) => Err(format!("npm ci left {f} missing in {}", dir.display())),
        None => Ok(dir),
    }
}

/// One peer's drain, as its script printed it.
#[derive(Clone, Debug)]
struct PeerRun {
    rate: f64,
    drain_rate: f64,
    version: String,
    settings: String,
    /// Database commands per job while draining, by command and collection, when the
    /// script counts them.
    commands: BTreeMap<String, f64>,
}

/// Runs `node <script> <args>` in `dir`: its JSON line, or the reason it failed (one line).
fn run_peer(dir: &Path, script: &str, args: &[String]) -> Result<PeerRun, String> {
    let out = Command::new("node")
        .arg(script)
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| format!("node {script}: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        let why = stderr
            .lines()
            .find(|l| l.contains("Error") || l.starts_with("peer bench:"))
            .or_else(|| stderr.lines().last())
            .unwrap_or("no output");
        return Err(format!("node {script} exited with {}: {why}", out.status));
    }
    let line = stdout.lines().last().unwrap_or_default();
    let v: Value = serde_json::from_str(line).map_err(|e| format!("node {script} printed {line:?}: {e}"))?;
    let num = |k: &str| v.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
    let text = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    let mut version = text("version");
    for extra in ["backend", "driver"] {
        if !text(extra).is_empty() {
            version = format!("{version} ({})", text(extra));
        }
    }
    let commands = v
        .get("commands_per_job")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_f64().unwrap_or(f64::NAN)))
                .collect()
        })
        .unwrap_or_default();
    Ok(PeerRun {
        commands,
        rate: num("rate"),
        drain_rate: num("drain_rate"),
        version,
        settings: text("settings"),
    })
}

/// Medians of a peer's rounds, or why it could not run.
struct Peer {
    name: &'static str,
    runs: Vec<PeerRun>,
    failed: Option<String>,
}

impl Peer {
    fn new(name: &'static str, failed: Option<String>) -> Peer {
        Peer {
            name,
            runs: Vec::new(),
            failed,
        }
    }

    fn run(&mut self, dir: Option<&Path>, script: &str, args: &[String]) {
        let Some(dir) = dir.filter(|_| self.failed.is_none()) else {
            return;
        };
        match run_peer(dir, script, args) {
            Ok(r) => self.runs.push(r),
            Err(e) => {
                eprintln!("peer {}: cannot run: {e}", self.name);
                self.failed = Some(e);
            }
        }
    }

    fn rate(&self) -> Option<f64> {
        (!self.runs.is_empty()).then(|| median(self.runs.iter().map(|r| r.rate).collect()))
    }

    fn drain_rate(&self) -> Option<f64> {
        (!self.runs.is_empty()).then(|| median(self.runs.iter().map(|r| r.drain_rate).collect()))
    }

    /// A table row: peer, version, settings, steady rate, whole-drain rate, DEN ÷ peer.
    fn row(&self, den: f64, den_drain: f64) -> String {
        match (&self.failed, self.runs.first(), self.rate(), self.drain_rate()) {
            (None, Some(r), Some(rate), Some(drain)) => format!(
                "| {} | {} | {} | {rate:.0} | {drain:.0} | {:.2} | {:.2} |",
                self.name,
                r.version,
                r.settings,
                den / rate,
                den_drain / drain
            ),
            (why, ..) => format!(
                "| {} | — | could not run here: {} | — | — | — | — |",
                self.name,
                why.as_deref().unwrap_or("no run")
            ),
        }
    }

    /// `den_per_<name>=…` (steady and whole drain), or `<name>=unavailable`.
    fn result(&self, den: f64, den_drain: f64) -> String {
        match (self.rate(), self.drain_rate()) {
            (Some(rate), Some(drain)) => format!(
                "{n}_per_s={rate:.0} {n}_drain_per_s={drain:.0} den_per_{n}={:.2} den_per_{n}_drain={:.2}",
                den / rate,
                den_drain / drain,
                n = self.name
            ),
            _ => format!("{}=unavailable", self.name),
        }
    }
}

impl Bench {
    pub(super) async fn peers(&self) {
        let node_dir = tokio::task::spawn_blocking(install).await.unwrap();
        let failed = node_dir.as_ref().err().cloned();
        if let Some(why) = &failed {
            eprintln!("peers agenda, plainjob and liteque: cannot run: {why}");
        }
        let dir = node_dir.ok();
        let (n_mongo, n_sqlite) = self.peer_sizes();
        let threads = self.threads;
        let rounds = self.rounds;
        let conc = format!("{threads}");

        // MongoDB: Agenda, one DEN, the driver loops with two and three writes per task.
        let mut agenda = Peer::new("agenda", failed.clone());
        let (mut den, mut den_whole, mut two, mut three) = (vec![], vec![], vec![], vec![]);
        // The DEN's commands are counted on a client of its own, as Agenda's are on its.
        let (den_client, den_commands) = Commands::client(&self.uri).await;
        den_client
            .database("admin")
            .run_command(doc! {"ping": 1})
            .await
            .unwrap();
        let mut den_counted = Vec::new();
        for round in 0..rounds {
            let db_name = format!("bench_agenda_{}_{round}", std::process::id());
            let args = [
                "--uri",
                &self.uri,
                "--db",
                &db_name,
                "--n",
                &n_mongo.to_string(),
                "--concurrency",
                &conc,
            ]
            .map(String::from);
            tokio::task::block_in_place(|| agenda.run(dir.as_deref(), "agenda.mjs", &args));
            let (steady, whole, counted) = self.den_drain_mongo(n_mongo, &den_client, &den_commands).await;
            den.push(steady);
            den_whole.push(whole);
            den_counted.push(per_task(&counted, n_mongo).0);
            two.push(self.ceiling(n_mongo, false).await.0);
            three.push(self.ceiling(n_mongo, true).await.0);
        }
        let (den, den_whole, two, three) = (median(den), median(den_whole), median(two), median(three));
        println!(
            "\n## peers, MongoDB: N = {n_mongo} trivial jobs, {threads} at a time, median of {rounds} rounds (server: {})",
            if self._server.is_some() { "the bench's secantusd-rs" } else { "MONGODB_URI" }
        );
        println!(
            "Steady rate: (finished − 1) over first → last finish. Whole drain: N over workers' start → last finish."
        );
        println!("| runner | version | settings | steady /s | whole drain /s | DEN ÷ it (steady) | DEN ÷ it (whole drain) |\n|---|---|---|---|---|---|---|");
        println!(
            "| DEN (in-process, `demo` plugin in the sandbox) | {} | threads {threads} | {den:.0} | {den_whole:.0} | 1.00 | 1.00 |",
            env!("CARGO_PKG_VERSION")
        );
        println!("{}", agenda.row(den, den_whole));
        println!("| driver loop, claim + start + finish (the protocol's three writes) | — | {threads} workers | {three:.0} | — | {:.2} | — |", den / three);
        println!(
            "| driver loop, claim + finish (the ceiling) | — | {threads} workers | {two:.0} | — | {:.2} | — |",
            den / two
        );
        let (den_commands, den_commands_total) = mean(&den_counted);
        let agenda_counted: Vec<_> = agenda.runs.iter().map(|r| r.commands.clone()).collect();
        let (agenda_commands, agenda_commands_total) = mean(&agenda_counted);
        println!(
            "\nDatabase commands per task while draining (from the workers' start to the last finish; mean of {} rounds)",
            den_counted.len()
        );
        println!("{}", table(&[("DEN", &den_commands), ("Agenda", &agenda_commands)]));
        let agenda_commands_total = if agenda_commands.is_empty() {
            "unavailable".to_string()
        } else {
            format!("{agenda_commands_total:.2}")
        };

        // SQLite: plainjob, liteque, den --embedded processes, the driver-only loop.
        let disk = tempfile::tempdir_in(target_dir()).expect("a temporary directory under target/");
        let mut plainjob = Peer::new("plainjob", failed.clone());
        let mut liteque = Peer::new("liteque", failed);
        let (mut emb, mut emb_whole, mut ceiling, mut unindexed, mut pooled) = (vec![], vec![], vec![], vec![], vec![]);
        let (mut transactions, mut counted_rate) = (vec![], vec![]);
        for round in 0..rounds {
            for (peer, script) in [(&mut plainjob, "plainjob.mjs"), (&mut liteque, "liteque.mjs")] {
                let path = disk.path().join(format!("{script}-{round}.db"));
                let args = [
                    "--path".to_string(),
                    path.display().to_string(),
                    "--n".into(),
                    n_sqlite.to_string(),
                    "--concurrency".into(),
                    conc.clone(),
                ];
                tokio::task::block_in_place(|| peer.run(dir.as_deref(), script, &args));
            }
            let d = den_drain(disk.path(), &self.plugins, threads, n_sqlite, 1).await;
            emb.push(d.rate);
            emb_whole.push(d.finished as f64 * 1e3 / (d.last_ms - d.started_ms).max(1.0));
            ceiling.push(sqlite_ceiling(disk.path(), threads, n_sqlite, true, true).await.rate);
            unindexed.push(sqlite_ceiling(disk.path(), threads, n_sqlite, true, false).await.rate);
            pooled.push(sqlite_ceiling(disk.path(), threads, n_sqlite, false, false).await.rate);
            let counted = self.counted_embedded_drain(disk.path(), n_sqlite).await;
            transactions.push(counted.per_task);
            counted_rate.push(counted.rate);
        }
        let (emb, emb_whole) = (median(emb), median(emb_whole));
        let (ceiling, unindexed, pooled) = (median(ceiling), median(unindexed), median(pooled));
        println!(
            "\n## peers, SQLite: N = {n_sqlite} trivial jobs, {threads} at a time, one disk ({}), median of {rounds} rounds",
            disk.path().display()
        );
        println!("Every runner here uses WAL with synchronous = NORMAL: a process crash loses nothing committed; a power loss can lose the last commits.");
        println!("| runner | version | settings | steady /s | whole drain /s | DEN ÷ it (steady) | DEN ÷ it (whole drain) |\n|---|---|---|---|---|---|---|");
        println!(
            "| `den --embedded` (a process, `demo` plugin in the sandbox) | {} | threads {threads} | {emb:.0} | {emb_whole:.0} | 1.00 | 1.00 |",
            env!("CARGO_PKG_VERSION")
        );
        println!("{}", plainjob.row(emb, emb_whole));
        println!("{}", liteque.row(emb, emb_whole));
        println!("| driver-only loop, claim + finish (the ceiling; SQLite {}) | — | {threads} threads taking turns on one connection, with an index serving the claim | {ceiling:.0} | — | {:.2} | — |", rusqlite::version(), emb / ceiling);
        println!("| the same with the store's indexes of today | — | one connection, the claim sorts the queued tasks | {unindexed:.0} | — | {:.2} | — |", emb / unindexed);
        println!("| the same with a connection each | — | {threads} connections (busy handler), the store's indexes | {pooled:.0} | — | {:.2} | — |", emb / pooled);
        let transactions_mean = transactions.iter().sum::<f64>() / transactions.len().max(1) as f64;
        println!(
            "\nThe DEN's write transactions per task (its store's count, from its start to the last finish; mean of {} rounds): {transactions_mean:.3}, counted on an in-process DEN on its own `SqliteStore` draining the same N (steady {:.0}/s, median; the process above: {emb:.0}/s)",
            transactions.len(),
            median(counted_rate)
        );
        println!(
            "RESULT peers threads={threads} n_mongo={n_mongo} n_sqlite={n_sqlite} den_mongo_per_s={den:.0} den_mongo_drain_per_s={den_whole:.0} {} three_writes_per_s={three:.0} den_per_three_writes={:.2} ceiling_per_s={two:.0} den_per_ceiling={:.2} den_embedded_per_s={emb:.0} den_embedded_drain_per_s={emb_whole:.0} {} {} sqlite_ceiling_per_s={ceiling:.0} den_per_sqlite_ceiling={:.2} sqlite_unindexed_per_s={unindexed:.0} den_per_sqlite_unindexed={:.2} sqlite_pooled_per_s={pooled:.0} den_per_sqlite_pooled={:.2} den_commands_per_task={den_commands_total:.2} agenda_commands_per_task={agenda_commands_total} den_transactions_per_task={transactions_mean:.3}",
            agenda.result(den, den_whole),
            den / three,
            den / two,
            plainjob.result(emb, emb_whole),
            liteque.result(emb, emb_whole),
            emb / ceiling,
            emb / unindexed,
            emb / pooled
        );
    }

    /// Task counts: (MongoDB, SQLite).
    fn peer_sizes(&self) -> (usize, usize) {
        match (self.sizes_given, self.quick) {
            (true, _) => (self.sizes[0], *self.sizes.last().unwrap()),
            (false, true) => (500, 5_000),
            (false, false) => (2_000, 20_000),
        }
    }

    /// One in-process DEN draining `n` trivial tasks on `client` (its own, counted by
    /// `commands`): (steady rate, whole-drain rate from the DEN's start to the last finish,
    /// the commands it sent over that span). The span ends when the bench's poll (every
    /// 50 ms, on the bench's client) sees the last finish.
    async fn den_drain_mongo(
        &self,
        n: usize,
        client: &Client,
        commands: &Commands,
    ) -> (f64, f64, BTreeMap<String, u64>) {
        let db = self.db("peers").await;
        let q = self.queue(&db, self.threads).await;
        self.tasks(&db, q, n, doc! {}).await;
        let started = unix_ms();
        let began = Instant::now();
        commands.start();
        let (stop, handle) = self.den(&client.database(db.name()), "bench-peers");
        let filter = doc! {"queue": q, "status": 1};
        let done = wait_finished(&db, filter.clone(), n as u64, std::time::Duration::from_secs(900)).await;
        let counted = commands.stop();
        assert!(
            done,
            "the DEN did not drain {n} tasks in 15 minutes ({:?})",
            began.elapsed()
        );
        stop.cancel();
        handle.await.unwrap();
        let (count, first, last) = finish_span(&db, filter).await;
        db.drop().await.ok();
        let steady = count.saturating_sub(1) as f64 * 1e3 / (last - first).max(1.0);
        (steady, count as f64 * 1e3 / (last - started).max(1.0), counted)
    }
}
