//! Moving a node name from Disbatch 4 to a `den`: a real `den` started on the name of a
//! Disbatch 4 DEN (emulated with the plain driver, heartbeating as the Perl `disbatchd`
//! does) waits for that DEN's heartbeat to go stale and takes the name, or stops with a
//! clear error when the heartbeat keeps moving; a name one of our live DENs holds is
//! refused at once.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, Bson, DateTime, Document};
use common::{count_tasks as count, insert_queue, wait_for, DenProcess};
use disbatch::den::DISBATCH4_TAKEOVER_MARGIN;
use mongodb::Database;

/// The tests' `heartbeat_stale`, in seconds.
const STALE: u64 = 4;

/// One heartbeat as Disbatch 4's `disbatchd` writes it (`update_node_status`): it reads its
/// node document (or starts from nothing), sets `node`, its queue report and `timestamp`
/// (a date), and writes the whole document back with `$set`, upserting. Returns the
/// heartbeat written.
async fn disbatchd_beat(db: &Database, node: &str) -> DateTime {
    let nodes = db.collection::<Document>("nodes");
    let mut status = nodes.find_one(doc! {"node": node}).await.unwrap().unwrap_or_default();
    let now = DateTime::now();
    status.insert("node", node);
    // `scheduler_report`: Perl's numbers, the queue id as its hex string.
    status.insert(
        "queues",
        vec![
            doc! {"id": "5f0c6b2e9d1e8a0001a1b2c3", "tasks_todo": 0, "tasks_done": 0, "tasks_doing": 0,
            "maxthreads": Bson::Null, "name": "move", "constructor": "Demo", "preemptive": 1, "tasks_backfill": 0},
        ],
    );
    status.insert("timestamp", now);
    nodes
        .update_one(doc! {"node": node}, doc! {"$set": status})
        .upsert(true)
        .await
        .unwrap();
    now
}

/// A running Disbatch 4 `disbatchd` on `node`, emulated: the node document as the Disbatch
/// 4 DCI leaves it after `POST /nodes/:node {maxthreads}` (the form value, a string), then
/// a heartbeat every half second (its loop's is a second) until stopped.
struct Disbatchd {
    alive: Arc<AtomicBool>,
    beating: tokio::task::JoinHandle<DateTime>,
}

impl Disbatchd {
    async fn start(db: &Database, node: &str) -> Disbatchd {
        db.collection::<Document>("nodes")
            .insert_one(doc! {"node": node, "maxthreads": "4"})
            .await
            .unwrap();
        disbatchd_beat(db, node).await;
        let alive = Arc::new(AtomicBool::new(true));
        let beating = {
            let (db, node, alive) = (db.clone(), node.to_owned(), alive.clone());
            tokio::spawn(async move {
                loop {
                    let beat = disbatchd_beat(&db, &node).await;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    if !alive.load(Ordering::SeqCst) {
                        return beat;
                    }
                }
            })
        };
        Disbatchd { alive, beating }
    }

    /// Stops it; returns its last heartbeat.
    async fn stop(self) -> DateTime {
        self.alive.store(false, Ordering::SeqCst);
        self.beating.await.unwrap()
    }
}

/// The node document of `node`.
async fn node_doc(db: &Database, node: &str) -> Document {
    db.collection::<Document>("nodes")
        .find_one(doc! {"node": node})
        .await
        .unwrap()
        .unwrap()
}

/// The pid of the DEN holding a node document's name (its `process`), if one does.
fn holder_pid(node: &Document) -> Option<i64> {
    match node.get_document("process").ok()?.get("pid")? {
        Bson::Int32(n) => Some(i64::from(*n)),
        Bson::Int64(n) => Some(*n),
        _ => None,
    }
}

/// The deadline a DEN's log gives for its wait (`waiting until <time>`).
fn logged_deadline(log: &str) -> DateTime {
    let rest = log
        .split("waiting until ")
        .nth(1)
        .unwrap_or_else(|| panic!("no deadline logged:\n{log}"));
    let end = rest.find(' ').unwrap();
    DateTime::parse_rfc3339_str(&rest[..end]).unwrap_or_else(|e| panic!("{e}: {log}"))
}

fn plus(t: DateTime, d: Duration) -> DateTime {
    DateTime::from_millis(t.timestamp_millis() + d.as_millis() as i64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_den_waits_for_a_stopped_disbatch4_den_and_takes_its_name() {
    let t = common::test_db("perl_takeover_stopped").await;
    let q = insert_queue(&t.db, "move", "demo", doc! {"threads": 1}).await;
    let stale = Duration::from_secs(STALE);
    // The move: `den` starts while `disbatchd` still runs, then `disbatchd` is stopped.
    let disbatchd = Disbatchd::start(&t.db, "mover").await;
    let den_started = DateTime::now();
    let mut den = DenProcess::start(&t.uri, &t.name, "mover", serde_json::json!({"heartbeat_stale": STALE}));
    let log_path = den.log_path();
    wait_for(Duration::from_secs(90), "the den to wait for the name", || async {
        std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .contains("waiting until")
    })
    .await;
    let seen_waiting = DateTime::now();
    let last_beat = disbatchd.stop().await;

    wait_for(Duration::from_secs(90), "the den to take the name", || async {
        holder_pid(&node_doc(&t.db, "mover").await).is_some()
    })
    .await;
    let seen_taken = DateTime::now();
    println!(
        "name taken {:.1} s after the last heartbeat of the stopped disbatchd (heartbeat_stale {STALE} s)",
        (seen_taken.timestamp_millis() - last_beat.timestamp_millis()) as f64 / 1000.0
    );
    assert!(
        seen_taken >= plus(last_beat, stale),
        "taken at {seen_taken} while the heartbeat of {last_beat} was fresh:\n{}",
        den.log()
    );
    // The name is written before the DEN logs that it took it.
    wait_for(Duration::from_secs(30), "the den to log the takeover", || async {
        den.log().contains("went stale; took the name over")
    })
    .await;
    let log = den.log();
    assert!(
        log.contains(r#"node name "mover" is held by a Disbatch 4 DEN (its node document has no process marker)"#),
        "{log}"
    );
    // The deadline: heartbeat_stale and the margin from the start of the wait.
    let deadline = logged_deadline(&log);
    let window = stale + DISBATCH4_TAKEOVER_MARGIN;
    assert!(
        plus(den_started, window) <= deadline && deadline <= plus(seen_waiting, window),
        "deadline {deadline}, den started {den_started}, seen waiting {seen_waiting}:\n{log}"
    );

    // It runs tasks under that name.
    let id =
        t.db.collection::<Document>("tasks")
            .insert_one(
                doc! {"queue": q, "status": -2, "node": Bson::Null, "params": {"message": "moved"},
                "ctime": DateTime::now(), "mtime": DateTime::now()},
            )
            .await
            .unwrap()
            .inserted_id;
    wait_for(Duration::from_secs(60), "the den to run a task as `mover`", || async {
        count(&t.db, doc! {"_id": id.clone(), "status": 1, "node": "mover"}).await == 1
    })
    .await;
    let node = node_doc(&t.db, "mover").await;
    assert_eq!(holder_pid(&node), Some(i64::from(den.pid())), "{node}");
    assert_eq!(node.get("beat"), node.get("timestamp"), "our heartbeats now: {node}");
    den.signal(libc::SIGTERM);
    assert!(den.wait_exit(Duration::from_secs(60)).success(), "{}", den.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_den_stops_when_the_disbatch4_den_holding_its_name_keeps_beating() {
    let t = common::test_db("perl_takeover_alive").await;
    let q = insert_queue(&t.db, "move", "demo", doc! {"threads": 1}).await;
    // `disbatchd` still runs.
    let disbatchd = Disbatchd::start(&t.db, "busy").await;
    let queued =
        t.db.collection::<Document>("tasks")
            .insert_one(doc! {"queue": q, "status": -2, "node": Bson::Null, "params": {},
            "ctime": DateTime::now(), "mtime": DateTime::now()})
            .await
            .unwrap()
            .inserted_id;

    let started = Instant::now();
    let mut den = DenProcess::start(&t.uri, &t.name, "busy", serde_json::json!({"heartbeat_stale": STALE}));
    let status = den.wait_exit(Duration::from_secs(120));
    let waited = started.elapsed();
    disbatchd.stop().await;
    let log = den.log();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("waiting until"), "{log}");
    assert!(
        log.contains(r#"node name "busy" is held by a Disbatch 4 disbatchd that is still running"#)
            && log.contains("stop that disbatchd and start this DEN again"),
        "{log}"
    );
    let window = Duration::from_secs(STALE) + DISBATCH4_TAKEOVER_MARGIN;
    println!("refused after {:.1} s (the wait: {window:?})", waited.as_secs_f64());
    assert!(
        waited >= window,
        "gave up after {waited:?}, before the {window:?} wait:\n{log}"
    );
    // Nothing was taken: the document is still Disbatch 4's, the task still queued.
    let node = node_doc(&t.db, "busy").await;
    assert!(node.get("process").is_none(), "{node}");
    assert_eq!(count(&t.db, doc! {"_id": queued, "status": -2}).await, 1, "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_name_a_live_den_of_ours_holds_is_refused_at_once() {
    let t = common::test_db("ours_name_refused").await;
    // A stale window far longer than the test: the refusal must not wait for it.
    let extra = serde_json::json!({"heartbeat_stale": 300});
    let first = DenProcess::start(&t.uri, &t.name, "taken", extra.clone());
    let first_pid = i64::from(first.pid());
    wait_for(Duration::from_secs(60), "the first DEN to take its name", || async {
        let node =
            t.db.collection::<Document>("nodes")
                .find_one(doc! {"node": "taken"})
                .await
                .unwrap();
        node.and_then(|n| holder_pid(&n)) == Some(first_pid)
    })
    .await;

    let mut second = DenProcess::start(&t.uri, &t.name, "taken", extra);
    let status = second.wait_exit(Duration::from_secs(60));
    let log = second.log();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains(&format!(
            "node name \"taken\" is held by a running DEN (pid {first_pid} on "
        )),
        "{log}"
    );
    assert!(!log.contains("waiting until"), "{log}");
    let node = node_doc(&t.db, "taken").await;
    assert_eq!(
        holder_pid(&node),
        Some(first_pid),
        "the refused DEN took nothing: {node}"
    );
    drop(first);
}
