//! Network faults between DENs and the database: each DEN reaches the server through its
//! own fault proxy ([`common::proxy`]) adding latency; one proxy resets every connection
//! every few seconds; one DEN's traffic is frozen while it holds a task. Everything is
//! checked from the database's view, read by a client that does not go through a proxy.
//! The fault proxy's own tests come first.

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use common::{count_tasks as count, insert_queue, insert_tasks, wait_for, DenProcess, FaultProxy, Latency};
use futures::TryStreamExt;
use mongodb::Database;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An echo server on 127.0.0.1; its address.
async fn echo_server() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// Sends `msg` and reads it back whole.
async fn echo(s: &mut TcpStream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
    s.write_all(msg).await?;
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back).await?;
    Ok(back)
}

#[tokio::test]
async fn proxy_delays_each_direction_and_keeps_the_bytes_in_order() {
    let proxy = FaultProxy::start(echo_server().await).await;
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(echo(&mut s, b"warm").await.unwrap(), b"warm");
    proxy.set_latency(Latency::fixed_ms(100), Latency::fixed_ms(50));
    let began = Instant::now();
    assert_eq!(echo(&mut s, b"hello").await.unwrap(), b"hello");
    assert!(began.elapsed() >= Duration::from_millis(150), "{:?}", began.elapsed());
    // Jittered chunks written one after another arrive in order.
    proxy.set_latency(Latency::up_to_ms(30), Latency::up_to_ms(30));
    let mut sent = Vec::new();
    for i in 0..200u32 {
        let chunk = i.to_be_bytes();
        s.write_all(&chunk).await.unwrap();
        sent.extend_from_slice(&chunk);
    }
    let mut back = vec![0u8; sent.len()];
    s.read_exact(&mut back).await.unwrap();
    assert_eq!(back, sent);
}

#[tokio::test]
async fn proxy_freezes_thaws_resets_and_refuses() {
    let proxy = FaultProxy::start(echo_server().await).await;
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(echo(&mut s, b"one").await.unwrap(), b"one");

    // Frozen: the bytes are held and the connection stays open; thawed: they arrive.
    proxy.freeze();
    s.write_all(b"held").await.unwrap();
    let mut back = [0u8; 4];
    let held = tokio::time::timeout(Duration::from_millis(300), s.read_exact(&mut back)).await;
    assert!(held.is_err(), "bytes passed a frozen proxy");
    proxy.thaw();
    s.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"held");

    // A reset ends the connection with an error on the client's side.
    proxy.reset_all();
    let mut buf = [0u8; 1];
    match s.read(&mut buf).await {
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
        Ok(n) => panic!("read {n} bytes after a reset"),
    }

    // Refused: a new connection is reset before any byte comes back; allowed again after.
    proxy.refuse_new(true);
    let mut r = TcpStream::connect(proxy.addr()).await.unwrap();
    assert!(echo(&mut r, b"no").await.is_err());
    proxy.refuse_new(false);
    let mut again = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(echo(&mut again, b"yes").await.unwrap(), b"yes");

    // Reset periodically: a connection opened after a reset is reset at the next one.
    proxy.reset_every(Some(Duration::from_millis(200)));
    let mut p = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(echo(&mut p, b"p").await.unwrap(), b"p");
    let ended = tokio::time::timeout(Duration::from_secs(30), p.read(&mut buf)).await;
    assert!(matches!(ended, Ok(Err(_)) | Ok(Ok(0))), "{ended:?}");
    proxy.reset_every(None);
}

/// The DENs of the scenario, each behind its own proxy.
const DENS: [&str; 3] = ["nf-1", "nf-2", "nf-3"];
/// The DEN whose proxy resets every connection periodically.
const RESET: usize = 0;
/// The DEN whose traffic is frozen while it holds a task.
const FROZEN: usize = 1;
const THREADS: u64 = 4;
const TASKS: usize = 300;
const STALE: Duration = Duration::from_secs(2);
/// How long the frozen DEN's traffic is held: four stale windows.
const FREEZE: Duration = Duration::from_secs(8);

/// Claimed or running tasks of the queue: (id, node).
async fn active(db: &Database) -> Vec<(ObjectId, String)> {
    let found: Vec<Document> = db
        .collection::<Document>("tasks")
        .find(doc! {"status": {"$in": [-1, 0]}})
        .projection(doc! {"node": 1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    found
        .iter()
        .map(|d| {
            (
                d.get_object_id("_id").unwrap(),
                d.get_str("node").unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// Where the freeze stands.
#[derive(Debug)]
enum Freeze {
    Before,
    /// Frozen since `since`, holding `held` (claimed or running there at the freeze).
    Frozen {
        since: Instant,
        held: BTreeSet<ObjectId>,
        recovered_after: Option<Duration>,
    },
    /// Thawed; `held` was recovered `recovered_after` into the freeze.
    Thawed {
        held: BTreeSet<ObjectId>,
        recovered_after: Duration,
    },
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dens_behind_latency_resets_and_a_partition_keep_threads_and_run_each_task_once() {
    let t = common::test_db("net_faults").await;
    let marks = tempfile::tempdir().unwrap();
    let grant = format!("{}:/out:rw", marks.path().display());
    let q = insert_queue(
        &t.db,
        "marks",
        "mark",
        doc! {"threads": THREADS as i64, "sandbox": {"dirs": [&grant]}},
    )
    .await;
    let params = (0..TASKS).map(|k| doc! {"path": format!("/out/{k}"), "sleep_ms": 20});
    insert_tasks(&t.db, q, params).await;

    let mut proxies = Vec::new();
    for _ in DENS {
        let p = FaultProxy::in_front_of(&t.uri).await;
        p.set_latency(Latency::up_to_ms(120), Latency::up_to_ms(120));
        proxies.push(p);
    }
    proxies[RESET].reset_every(Some(Duration::from_secs(4)));
    let extra = serde_json::json!({"plugins": ["mark"], "heartbeat_stale": STALE.as_secs()});
    let dens: Vec<DenProcess> = DENS
        .iter()
        .zip(&proxies)
        .map(|(node, p)| DenProcess::start(&p.uri(), &t.name, node, extra.clone()))
        .collect();
    let frozen = DENS[FROZEN];

    let start = Instant::now();
    let mut samples = 0u64;
    let mut peak = 0u64;
    let mut freeze = Freeze::Before;
    let mut every = tokio::time::interval(Duration::from_millis(50));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let now = active(&t.db).await;
        let at = start.elapsed().as_secs_f64();
        let n = now.len() as u64;
        assert!(
            n <= THREADS,
            "{at:.1}s ({freeze:?}): queue with threads {THREADS} shows {n} tasks at -1/0: {now:?}\n{}",
            logs(&dens)
        );
        peak = peak.max(n);
        samples += 1;
        let held_now: BTreeSet<ObjectId> = now
            .iter()
            .filter(|(_, node)| node == frozen)
            .map(|(id, _)| *id)
            .collect();
        freeze = match freeze {
            Freeze::Before if !held_now.is_empty() && samples.is_multiple_of(10) => {
                if count(&t.db, doc! {"status": 1}).await as usize >= TASKS / 5 {
                    proxies[FROZEN].freeze();
                    Freeze::Frozen {
                        since: Instant::now(),
                        held: BTreeSet::new(),
                        recovered_after: None,
                    }
                } else {
                    Freeze::Before
                }
            }
            // Writes already past the proxy land within its latency: what the frozen DEN
            // holds is read once they have.
            Freeze::Frozen { since, held, .. } if held.is_empty() || since.elapsed() < Duration::from_millis(300) => {
                if since.elapsed() < Duration::from_millis(300) {
                    Freeze::Frozen {
                        since,
                        held,
                        recovered_after: None,
                    }
                } else if held_now.is_empty() {
                    // It held nothing after all: try again later.
                    proxies[FROZEN].thaw();
                    Freeze::Before
                } else {
                    Freeze::Frozen {
                        since,
                        held: held_now,
                        recovered_after: None,
                    }
                }
            }
            Freeze::Frozen {
                since,
                held,
                mut recovered_after,
            } => {
                if recovered_after.is_none() && held_now.is_empty() {
                    recovered_after = Some(since.elapsed());
                }
                if since.elapsed() < FREEZE {
                    Freeze::Frozen {
                        since,
                        held,
                        recovered_after,
                    }
                } else {
                    let Some(recovered_after) = recovered_after else {
                        panic!(
                            "{at:.1}s: the frozen DEN's tasks {held:?} were not recovered in {FREEZE:?} \
                             ({} stale windows)\n{}",
                            FREEZE.as_secs() / STALE.as_secs(),
                            logs(&dens)
                        );
                    };
                    proxies[FROZEN].thaw();
                    Freeze::Thawed { held, recovered_after }
                }
            }
            other => other,
        };
        if samples.is_multiple_of(20) && count(&t.db, doc! {"status": {"$in": [-2, -1, 0]}}).await == 0 {
            break;
        }
        // A bound on progress, not on speed: 300 short tasks behind 120 ms proxies take
        // about a minute (more on a loaded 2-core machine); a DEN that stopped claiming never
        // ends.
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "the queue was not drained in 600 s ({freeze:?}): {} left\n{}",
            count(&t.db, doc! {"status": {"$in": [-2, -1, 0]}}).await,
            logs(&dens)
        );
    }
    let elapsed = start.elapsed();
    let Freeze::Thawed { held, recovered_after } = freeze else {
        panic!("the queue drained before the freeze ended: {freeze:?}");
    };
    // The frozen DEN's writes held in its proxy have been delivered by now (or refused):
    // give it the time to write them, then look.
    wait_for(Duration::from_secs(30), "the frozen DEN to be heard again", || async {
        let n = common::find_docs(&t.db, "nodes", doc! {"node": frozen}).await;
        n[0].get_datetime("timestamp").unwrap().timestamp_millis() > bson::DateTime::now().timestamp_millis() - 1000
    })
    .await;
    let log = logs(&dens);
    drop(dens);

    let succeeded = count(&t.db, doc! {"status": 1}).await;
    let orphaned = common::find_docs(&t.db, "tasks", doc! {"status": -6}).await;
    let failed = common::find_docs(&t.db, "tasks", doc! {"status": {"$nin": [1, -6]}}).await;
    let files = std::fs::read_dir(marks.path()).unwrap().count() as u64;
    println!(
        "net faults: {TASKS} tasks, {} DENs, {:.1}s, {samples} samples; peak at -1/0 {peak} (threads {THREADS}); \
         {} held by the frozen DEN, recovered {:.1}s into the freeze; succeeded {succeeded}, orphaned {}, \
         runs (marks) {files}; connections through the resetting proxy {}",
        DENS.len(),
        elapsed.as_secs_f64(),
        held.len(),
        recovered_after.as_secs_f64(),
        orphaned.len(),
        proxies[RESET].accepted(),
    );
    assert!(failed.is_empty(), "tasks that did not succeed once: {failed:?}\n{log}");
    assert_eq!(succeeded as usize + orphaned.len(), TASKS);
    assert!(!orphaned.is_empty(), "the frozen DEN's task was recovered");
    for d in &orphaned {
        let id = d.get_object_id("_id").unwrap();
        assert!(held.contains(&id), "only the frozen DEN's tasks are orphaned: {d}");
        assert_eq!(d.get_str("node").unwrap(), frozen, "{d}");
        assert_eq!(
            d.get("stdout"),
            Some(&Bson::Null),
            "no result landed over a recovered task: {d}"
        );
    }
    // Each succeeded task ran once; an orphaned one at most once (before the freeze).
    assert!(
        (succeeded..=succeeded + orphaned.len() as u64).contains(&files),
        "runs (marks) {files} for {succeeded} succeeded and {} orphaned tasks",
        orphaned.len()
    );
    assert!(!log.contains("already ran"), "a task ran twice:\n{log}");
    assert!(peak > 0);
}

/// The DENs' logs, for a failure's message.
fn logs(dens: &[DenProcess]) -> String {
    dens.iter()
        .zip(DENS)
        .map(|(d, n)| {
            let log = d.log();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            format!("--- {n} (last 60 lines)\n{}\n", tail.join("\n"))
        })
        .collect()
}

/// A DEN whose claim pass takes longer than its stale window (a slow link, and many
/// queues each costing round trips) still heartbeats on time: its node's `timestamp`, as
/// the other nodes read it, never gets older than `heartbeat_stale`, and it never finds
/// its own lease lapsed. The heartbeat does not wait for the claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_claim_pass_holds_no_heartbeat_back() {
    const QUEUES: usize = 12;
    const STALE: Duration = Duration::from_secs(5);
    let t = common::test_db("slow_pass").await;
    for i in 0..QUEUES {
        let q = insert_queue(&t.db, &format!("q{i}"), "demo", doc! {"threads": 1}).await;
        let params = (0..30).map(|k| doc! {"message": format!("m{k}"), "sleep_ms": 50});
        insert_tasks(&t.db, q, params).await;
    }
    let proxy = FaultProxy::in_front_of(&t.uri).await;
    proxy.set_latency(Latency::fixed_ms(100), Latency::fixed_ms(100));
    let extra = serde_json::json!({"heartbeat_stale": STALE.as_secs()});
    let den = DenProcess::start(&proxy.uri(), &t.name, "slow-pass", extra);
    let beat = || async {
        common::find_docs(&t.db, "nodes", doc! {"node": "slow-pass"})
            .await
            .first()
            .and_then(|n| n.get_datetime("timestamp").ok().copied())
    };
    wait_for(Duration::from_secs(60), "the DEN's first heartbeat", || async {
        beat().await.is_some()
    })
    .await;
    wait_for(Duration::from_secs(60), "tasks to run", || async {
        count(&t.db, doc! {"status": 1}).await > 0
    })
    .await;
    // Sampled while the DEN claims across its queues (12 queues × several round trips
    // of 200 ms: each pass over them takes longer than the stale window, about 15 s).
    let start = Instant::now();
    let mut oldest = Duration::ZERO;
    while start.elapsed() < Duration::from_secs(20) {
        let at = beat().await.expect("the node document");
        let age = (bson::DateTime::now().timestamp_millis() - at.timestamp_millis()).max(0);
        oldest = oldest.max(Duration::from_millis(age as u64));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let done = count(&t.db, doc! {"status": 1}).await;
    println!("slow claim pass: heartbeat at most {oldest:?} old over 20 s (stale {STALE:?}); {done} tasks done");
    let log = den.log();
    assert!(
        oldest < STALE,
        "the node's heartbeat was {oldest:?} old, past heartbeat_stale {STALE:?}: the others count it dead\n{log}"
    );
    assert!(!log.contains("lease lapsed"), "the DEN found its lease lapsed:\n{log}");
}

/// After a stall of the whole link (every connection frozen, not refused: heartbeats hang
/// past `heartbeat_stale`), the leader waits a stale window from its own first heartbeat
/// before it recovers anything by heartbeat age: a worker whose link comes back a second
/// later keeps its tasks, which end succeeded, never orphaned.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_a_stall_longer_than_the_stale_window_the_leader_orphans_no_live_node() {
    let t = common::test_db("stall_grace").await;
    let q = insert_queue(&t.db, "stall", "demo", doc! {"threads": 2}).await;
    let leader_proxy = FaultProxy::in_front_of(&t.uri).await;
    let worker_proxy = FaultProxy::in_front_of(&t.uri).await;
    // The leader runs no `demo` task: every task runs on the worker.
    let leader = DenProcess::start(
        &leader_proxy.uri(),
        &t.name,
        "stall-leader",
        serde_json::json!({"plugins": ["mark"]}),
    );
    wait_for(Duration::from_secs(60), "the first DEN to lead", || async {
        common::find_docs(&t.db, "leases", doc! {"_id": "leader", "node": "stall-leader"})
            .await
            .len()
            == 1
    })
    .await;
    let worker = DenProcess::start(&worker_proxy.uri(), &t.name, "stall-worker", serde_json::json!({}));
    let ids = insert_tasks(&t.db, q, (0..2).map(|_| doc! {"sleep_ms": 9000})).await;
    wait_for(Duration::from_secs(60), "2 tasks running on the worker", || async {
        count(&t.db, doc! {"status": 0, "node": "stall-worker"}).await == 2
    })
    .await;
    // The fault: both links stall for 5 s (stale window 2 s); the worker's comes back 1 s
    // after the leader's, well within the window the leader must wait.
    leader_proxy.freeze();
    worker_proxy.freeze();
    tokio::time::sleep(Duration::from_secs(5)).await;
    leader_proxy.thaw();
    tokio::time::sleep(Duration::from_secs(1)).await;
    worker_proxy.thaw();
    let ended = doc! {"_id": {"$in": &ids}, "status": {"$nin": [-2, -1, 0]}};
    wait_for(Duration::from_secs(60), "both tasks to end", || async {
        count(&t.db, ended.clone()).await == 2
    })
    .await;
    let orphaned = count(&t.db, doc! {"status": -6}).await;
    assert_eq!(
        orphaned,
        0,
        "a live worker's tasks were orphaned after the stall:\n{}\n{}",
        leader.log(),
        worker.log()
    );
    assert_eq!(count(&t.db, doc! {"_id": {"$in": &ids}, "status": 1}).await, 2);
}
