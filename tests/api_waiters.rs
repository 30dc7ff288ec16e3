//! What waiters (`GET /tasks/wait`, `GET /tasks/{id}/events`) may cost a DCI: their number
//! and the ids they name are capped (503 with `Retry-After` past a cap), and on the
//! embedded store a change wakes only the waiters of the tasks it changed, so hundreds of
//! waiters holding a thousand ids each do not slow the DEN of the same process.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use disbatch::api::{router, ApiState, WaitLimits};
use disbatch::store::sqlite::SqliteStore;
use disbatch::store::Store;
use serde_json::{json, Value};

use common::dev::Dev;
use common::{plugins_dir, wait_for};

/// POSTs `body` to `url`, expecting 200; the answer.
async fn post_ok(client: &reqwest::Client, url: &str, body: Value) -> Value {
    let r = client.post(url).json(&body).send().await.unwrap();
    let status = r.status();
    let text = r.text().await.unwrap();
    assert_eq!(status, 200, "POST {url}: {text}");
    serde_json::from_str(&text).unwrap()
}

/// Creates `n` tasks in `queue` through the API; their ids.
async fn create(client: &reqwest::Client, base: &str, queue: &str, n: usize) -> Vec<String> {
    let params: Vec<Value> = (0..n).map(|i| json!({"message": format!("m{i}")})).collect();
    let answer = post_ok(
        client,
        &format!("{base}/tasks"),
        json!({"queue": queue, "params": params}),
    )
    .await;
    answer["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

/// The count of `queue`'s tasks with `status`.
async fn count(client: &reqwest::Client, base: &str, queue: &str, status: i32) -> u64 {
    let url = format!("{base}/tasks?queue={queue}&status={status}&count=1");
    let answer: Value = client.get(url).send().await.unwrap().json().await.unwrap();
    answer["count"].as_u64().unwrap()
}

/// Open file descriptors of process `pid`.
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Creates `m` tasks in the demo queue and waits (at most `limit`) until `done` of its
/// tasks have succeeded; how long the drain took.
async fn drain(client: &reqwest::Client, base: &str, m: usize, done: u64, limit: Duration) -> Duration {
    let started = Instant::now();
    create(client, base, "demo", m).await;
    let what = format!("{done} demo tasks to succeed");
    wait_for(limit, &what, || async { count(client, base, "demo", 1).await >= done }).await;
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_waiters_on_a_thousand_ids_each_neither_slow_the_den_nor_miss_the_end() {
    const WAITERS: usize = 200;
    const HELD: usize = 1000;
    const M: usize = 2000;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("w.db");
    let plugins = plugins_dir();
    let args = [
        "--db",
        db.to_str().unwrap(),
        "--bind",
        "127.0.0.1:0",
        "--plugin-dir",
        plugins.to_str().unwrap(),
    ];
    let dev = Dev::start(dir.path(), &args);
    let base = dev.url.clone();
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    post_ok(
        &client,
        &format!("{base}/queues"),
        json!({"name": "held", "plugin": "demo", "threads": 0}),
    )
    .await;
    let held = create(&client, &base, "held", HELD).await;

    // The drain alone (after a first small one, so both measured drains start warm).
    drain(&client, &base, 20, 20, Duration::from_secs(120)).await;
    let alone = drain(&client, &base, M, 20 + M as u64, Duration::from_secs(300)).await;

    // 200 waiters, each on the thousand held tasks, which do not change while the DEN drains.
    let before = fds(dev.child.id());
    let url = format!("{base}/tasks/wait?timeout=300&ids={}", held.join(","));
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let r = client.get(url).send().await.unwrap();
                let status = r.status();
                let text = r.text().await.unwrap();
                (status, text)
            })
        })
        .collect();
    wait_for(Duration::from_secs(120), "the waiters' connections", || async {
        fds(dev.child.id()) >= before + WAITERS
    })
    .await;
    // A first drain beside the waiters' first reads of their tasks, then the measured one.
    drain(
        &client,
        &base,
        M,
        20 + 2 * M as u64,
        alone * 10 + Duration::from_secs(60),
    )
    .await;
    let bound = alone * 3 + Duration::from_secs(2);
    let with = drain(&client, &base, M, 20 + 3 * M as u64, bound).await;
    println!(
        "drain of {M} tasks: {alone:?} alone, {with:?} with {WAITERS} waiters on {HELD} ids each ({:.2}x)",
        with.as_secs_f64() / alone.as_secs_f64()
    );
    assert!(with <= bound, "{with:?} with waiters against {alone:?} alone");
    for w in &waiters {
        assert!(!w.is_finished(), "a waiter answered before its tasks ended");
    }

    // The held tasks end: every waiter answers, done, with every task cancelled.
    let r = post_ok(&client, &format!("{base}/tasks/cancel"), json!({"queue": "held"})).await;
    assert_eq!(r["count"], HELD, "{r}");
    let ended = Instant::now();
    for w in waiters {
        let (status, text) = w.await.unwrap();
        assert_eq!(status, 200, "{text}");
        let answer: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(answer["done"], true);
        let tasks = answer["tasks"].as_array().unwrap();
        assert_eq!(tasks.len(), HELD);
        assert!(tasks.iter().all(|t| t["status"] == -5), "every held task cancelled");
    }
    println!("all {WAITERS} waiters answered {:?} after the cancel", ended.elapsed());
}

/// An API on a fresh embedded store with `limits`, served over TCP; its base URL, and the
/// ids of `n` tasks of a paused queue.
async fn served(limits: WaitLimits, n: usize) -> (String, Vec<String>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.path().join("c.db")).await.unwrap());
    let mut state = ApiState::new(store, vec!["demo".into()]);
    state.wait_limits = limits;
    let addr = common::http::serve(router(state)).await;
    let base = format!("http://{addr}");
    let client = reqwest::Client::new();
    post_ok(
        &client,
        &format!("{base}/queues"),
        json!({"name": "held", "plugin": "demo", "threads": 0}),
    )
    .await;
    let ids = create(&client, &base, "held", n).await;
    (base, ids, dir)
}

/// Asserts a 503 with `Retry-After` whose error names `limit`.
async fn refused(r: reqwest::Response, limit: &str) {
    assert_eq!(r.status(), 503);
    assert_eq!(
        r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned()),
        Some("1".into())
    );
    let error: Value = r.json().await.unwrap();
    let text = error["error"].as_str().unwrap();
    assert!(text.contains(limit), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_and_event_streams_past_their_caps_get_503_with_retry_after() {
    let limits = WaitLimits {
        max_waiters: 2,
        max_waited_ids: 5,
        ..WaitLimits::default()
    };
    let (base, ids, _dir) = served(limits, 6).await;
    let client = reqwest::Client::new();
    let wait = |ids: &[String]| {
        client
            .get(format!("{base}/tasks/wait?timeout=300&ids={}", ids.join(",")))
            .send()
    };

    // Two open: an event stream (its headers are out once it is registered) and a wait.
    let stream = client
        .get(format!("{base}/tasks/{}/events", ids[0]))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let long = tokio::spawn(wait(&ids[1..3]));
    let metrics = || async {
        let text = client
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("disbatch_api_waiters "))
            .map(|n| n.parse::<usize>().unwrap())
    };
    wait_for(Duration::from_secs(30), "two waiters", || async {
        metrics().await == Some(2)
    })
    .await;

    // A third of either kind is refused, naming the cap.
    refused(wait(&ids[3..4]).await.unwrap(), "max_waiters").await;
    refused(
        client
            .get(format!("{base}/tasks/{}/events", ids[3]))
            .send()
            .await
            .unwrap(),
        "max_waiters",
    )
    .await;

    // Closing the stream frees its place, and the ids cap applies: 2 held + 4 > 5.
    drop(stream);
    wait_for(Duration::from_secs(30), "the stream to close", || async {
        metrics().await == Some(1)
    })
    .await;
    refused(wait(&ids[2..6]).await.unwrap(), "max_waited_ids").await;

    // Within both caps, a wait answers as before.
    let r = client
        .get(format!("{base}/tasks/wait?timeout=0&ids={}", ids[4]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let answer: Value = r.json().await.unwrap();
    assert_eq!(answer["done"], false);
    long.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_stream_ends_at_its_lifetime_and_frees_its_place() {
    let limits = WaitLimits {
        max_waiters: 1,
        max_event_stream: Duration::from_secs(1),
        ..WaitLimits::default()
    };
    let (base, ids, _dir) = served(limits, 1).await;
    let client = reqwest::Client::new();
    let wait = || client.get(format!("{base}/tasks/wait?timeout=0&ids={}", ids[0])).send();

    // The stream on a task that never ends (its queue runs nothing) holds the one place.
    let started = Instant::now();
    let stream = client
        .get(format!("{base}/tasks/{}/events", ids[0]))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let second = wait().await.unwrap();
    // Refused while the stream lasts (it may already have ended on a very slow machine).
    if second.status() != 200 {
        refused(second, "max_waiters").await;
    }

    // It ends by itself, its first event being the task as it was.
    let body = tokio::time::timeout(Duration::from_secs(120), stream.text())
        .await
        .expect("the event stream ends at its lifetime")
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "ended after {:?}",
        started.elapsed()
    );
    let first = body
        .split("\n\n")
        .find(|e| e.lines().any(|l| l.starts_with("data:")))
        .expect("an event");
    assert!(first.lines().any(|l| l == "event: task"), "{body}");
    let data = first.lines().find_map(|l| l.strip_prefix("data:")).unwrap();
    let task: Value = serde_json::from_str(data.trim()).unwrap();
    assert_eq!(task["id"], ids[0], "{body}");
    assert_eq!(task["status"], -2, "{body}");

    // Its place is free: a wait is admitted.
    wait_for(Duration::from_secs(30), "a wait admitted", || async {
        wait().await.unwrap().status() == 200
    })
    .await;
}
