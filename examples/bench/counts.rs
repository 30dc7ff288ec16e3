//! What a DEN asks of its database while it drains, counted rather than inferred: the
//! MongoDB commands it sends (the driver's command monitoring, on a client only the DEN
//! uses) and the write transactions the embedded store commits (its own count,
//! [`SqliteStore::write_transactions`]). Used by `throughput`'s command profile and by
//! `peers`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bson::doc;
use disbatch::model::status;
use disbatch::store::sqlite::SqliteStore;
use mongodb::event::command::{CommandEvent, CommandStartedEvent};
use mongodb::Client;

use super::embedded_den::{count, drain_of, fresh_file, prefill};
use super::Bench;

/// Commands started on one client while counting is on, by command and collection.
#[derive(Clone, Default)]
pub(super) struct Commands {
    counts: Arc<Mutex<BTreeMap<String, u64>>>,
    on: Arc<AtomicBool>,
}

impl Commands {
    /// A client on `uri` whose commands are counted while [`Commands::start`] is in force.
    /// The client is to be the counted DEN's only: whatever else uses it is counted too.
    pub(super) async fn client(uri: &str) -> (Client, Commands) {
        let commands = Commands::default();
        let mut options = mongodb::options::ClientOptions::parse(uri).await.unwrap();
        options.command_event_handler = Some(mongodb::event::EventHandler::callback({
            let commands = commands.clone();
            move |event: CommandEvent| {
                if let CommandEvent::Started(e) = event {
                    if commands.on.load(Ordering::SeqCst) {
                        *commands.counts.lock().unwrap().entry(key(&e)).or_default() += 1;
                    }
                }
            }
        }));
        (Client::with_options(options).unwrap(), commands)
    }

    /// Counts from now on, from zero.
    pub(super) fn start(&self) {
        self.counts.lock().unwrap().clear();
        self.on.store(true, Ordering::SeqCst);
    }

    /// Stops counting: the commands counted since [`Commands::start`].
    pub(super) fn stop(&self) -> BTreeMap<String, u64> {
        self.on.store(false, Ordering::SeqCst);
        std::mem::take(&mut *self.counts.lock().unwrap())
    }
}

/// `<command> <collection>`: `find tasks`, `getMore tasks` (a `getMore` names its collection
/// apart), `-` for a command on no collection (`aggregate: 1`, `ping`).
fn key(e: &CommandStartedEvent) -> String {
    let target = e
        .command
        .get_str(&e.command_name)
        .or_else(|_| e.command.get_str("collection"))
        .unwrap_or("-");
    format!("{} {target}", e.command_name)
}

/// Counts ÷ `n`, by key, and their total.
pub(super) fn per_task(counts: &BTreeMap<String, u64>, n: usize) -> (BTreeMap<String, f64>, f64) {
    let per: BTreeMap<String, f64> = counts
        .iter()
        .map(|(k, v)| (k.clone(), *v as f64 / n.max(1) as f64))
        .collect();
    let total = per.values().sum();
    (per, total)
}

/// The mean of per-task breakdowns (a key missing from one counts 0 there), and its total.
pub(super) fn mean(runs: &[BTreeMap<String, f64>]) -> (BTreeMap<String, f64>, f64) {
    let mut sum: BTreeMap<String, f64> = BTreeMap::new();
    for run in runs {
        for (k, v) in run {
            *sum.entry(k.clone()).or_default() += v;
        }
    }
    let runs = runs.len().max(1) as f64;
    let mean: BTreeMap<String, f64> = sum.into_iter().map(|(k, v)| (k, v / runs)).collect();
    let total = mean.values().sum();
    (mean, total)
}

/// A table of per-task breakdowns side by side (`—` where a runner sent no such command,
/// and for the total of a runner not counted).
pub(super) fn table(columns: &[(&str, &BTreeMap<String, f64>)]) -> String {
    let mut keys: Vec<&String> = columns.iter().flat_map(|(_, m)| m.keys()).collect();
    keys.sort();
    keys.dedup();
    let cell = |m: &BTreeMap<String, f64>, k: &str| m.get(k).map_or("—".to_string(), |v| format!("{v:.3}"));
    let names: Vec<&str> = columns.iter().map(|(name, _)| *name).collect();
    let mut out = format!(
        "| command collection | {} |\n|---|{}",
        names.join(" | "),
        "---|".repeat(columns.len())
    );
    for k in keys {
        let cells: Vec<String> = columns.iter().map(|(_, m)| cell(m, k)).collect();
        out.push_str(&format!("\n| {k} | {} |", cells.join(" | ")));
    }
    let totals: Vec<String> = columns
        .iter()
        .map(|(_, m)| {
            if m.is_empty() {
                "—".to_string()
            } else {
                format!("**{:.2}**", m.values().sum::<f64>())
            }
        })
        .collect();
    out.push_str(&format!("\n| **total** | {} |", totals.join(" | ")));
    out
}

/// An in-process DEN's drain on the embedded store, counted.
pub(super) struct CountedDrain {
    /// Write transactions per task, from the DEN's start until `n` tasks were seen finished.
    pub(super) per_task: f64,
    /// Its steady rate (as the `den --embedded` process's is taken).
    pub(super) rate: f64,
}

impl Bench {
    /// One in-process DEN on its own [`SqliteStore`] draining `n` trivial tasks from a
    /// fresh file in `dir`, its write transactions counted over the span Agenda's commands
    /// are: from the DEN's start to the last finish (seen by the 20 ms poll, on a connection
    /// of the bench's own, which the store does not count).
    ///
    /// In-process rather than the `den --embedded` process the SQLite table times: the
    /// store's count is read at the moment the last finish is seen, with no product change
    /// beyond the count and its accessor (a process would have to report it, at shutdown,
    /// over a span that adds its start-up and shutdown). The DEN is the same code on the
    /// same file and settings; its rate is printed beside the process's, so a difference
    /// in how its writes group would show.
    pub(super) async fn counted_embedded_drain(&self, dir: &Path, n: usize) -> CountedDrain {
        let file = fresh_file(dir, "counted");
        let queue = prefill(&file, self.threads, n, doc! {}).await;
        let store = SqliteStore::open(&file).await.expect("open the embedded file");
        let before = store.write_transactions();
        let (stop, handle) = self.den_on(Arc::new(store.clone()), "bench-counted");
        let began = Instant::now();
        while count(&file, &queue, status::SUCCEEDED) < n as u64 {
            assert!(
                began.elapsed() < Duration::from_secs(900),
                "the in-process DEN did not drain {n} tasks of the embedded file in 15 minutes"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let transactions = store.write_transactions() - before;
        stop.cancel();
        handle.await.unwrap();
        let drain = drain_of(&file, &queue);
        assert_eq!(drain.finished, n as u64, "every task must have succeeded");
        drop(store);
        for suffix in ["", "-wal", "-shm"] {
            std::fs::remove_file(format!("{}{suffix}", file.display())).ok();
        }
        CountedDrain {
            per_task: transactions as f64 / n.max(1) as f64,
            rate: drain.rate,
        }
    }
}
