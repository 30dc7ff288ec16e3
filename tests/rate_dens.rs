//! Queue rate limits with real DEN processes: `rate: {max: 10, per: "1s"}` holds across
//! three DENs on one MongoDB database, and across two DENs on one embedded file, as the
//! database's `started` values show; every task ends succeeded, none failed.

use crate::common;

use std::time::{Duration, Instant};

use bson::{doc, Document};
use common::{count_tasks, find_docs, insert_queue, insert_tasks, DenProcess};
use disbatch::model::Sort;
use disbatch::store::sqlite::SqliteStore;
use disbatch::store::testing::StoreExt;
use disbatch::store::{NewQueue, Page, Store, TaskFilter};
use serde_json::json;

const MAX: usize = 10;
const PER_MS: i64 = 1_000;

/// Panics when a window of `PER_MS` (half-open) holds more than `MAX` of `starts`, or when
/// the starts span less than the limit allows (it did not bite).
fn assert_rate(mut starts: Vec<i64>, total: usize) {
    assert_eq!(starts.len(), total, "every task recorded its start");
    starts.sort_unstable();
    for w in starts.windows(MAX + 1) {
        assert!(w[MAX] - w[0] >= PER_MS, "{} starts within {PER_MS} ms: {w:?}", MAX + 1);
    }
    let span = starts[total - 1] - starts[0];
    let least = (total as i64 - 1) / MAX as i64 * PER_MS;
    assert!(
        span >= least,
        "{total} starts spread over {span} ms, less than {least} ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_dens_on_one_database_hold_the_rate() {
    const TOTAL: usize = 60;
    let t = common::test_db("rate_dens").await;
    let q = insert_queue(
        &t.db,
        "rated",
        "demo",
        doc! {"threads": 18, "rate": {"max": MAX as i64, "per": "1s"}},
    )
    .await;
    insert_tasks(&t.db, q, (0..TOTAL).map(|_| doc! {"sleep_ms": 20})).await;
    let dens: Vec<DenProcess> = ["rate-a", "rate-b", "rate-c"]
        .iter()
        .map(|node| DenProcess::start(&t.uri, &t.name, node, json!({"max_instances": 6})))
        .collect();
    let began = Instant::now();
    loop {
        if count_tasks(&t.db, doc! {"queue": q, "status": {"$in": [-2, -1, 0]}}).await == 0 {
            break;
        }
        let logs: Vec<String> = dens.iter().map(DenProcess::log).collect();
        assert!(
            began.elapsed() < Duration::from_secs(90),
            "drain took over 90 s:\n{logs:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let drain = began.elapsed();
    drop(dens);
    let tasks: Vec<Document> = find_docs(&t.db, "tasks", doc! {"queue": q}).await;
    assert_eq!(tasks.len(), TOTAL);
    assert!(
        tasks.iter().all(|d| d.get_i32("status") == Ok(1)),
        "every task succeeded, none failed"
    );
    let nodes: std::collections::BTreeSet<&str> = tasks.iter().filter_map(|d| d.get_str("node").ok()).collect();
    let starts = tasks
        .iter()
        .filter_map(|d| d.get_datetime("started").ok().map(|t| t.timestamp_millis()))
        .collect();
    assert_rate(starts, TOTAL);
    println!("rate over 3 DENs: {TOTAL} tasks in {drain:?}, run by {nodes:?}");
    assert!(drain >= Duration::from_secs(5), "the limit bit: {drain:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_dens_on_one_embedded_file_hold_the_rate() {
    const TOTAL: usize = 40;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rated.db");
    let store = SqliteStore::open(&file).await.unwrap();
    let q = store
        .create_queue(NewQueue {
            name: "rated".into(),
            plugin: "demo".into(),
            threads: Some(12),
            sort: Sort::Fifo,
            extra: doc! {"rate": {"max": MAX as i64, "per": "1s"}},
        })
        .await
        .unwrap();
    store
        .create_tasks(q.id, (0..TOTAL).map(|_| doc! {"sleep_ms": 20}).collect())
        .await
        .unwrap();
    let extra = json!({"max_instances": 6, "heartbeat_stale": 30});
    let dens: Vec<DenProcess> = ["embedded-a", "embedded-b"]
        .iter()
        .map(|node| DenProcess::start_embedded(&file, node, extra.clone()))
        .collect();
    let began = Instant::now();
    let unfinished = TaskFilter {
        status: Some(vec![-2, -1, 0]),
        ..Default::default()
    };
    while store.count_tasks(&unfinished).await.unwrap() > 0 {
        let logs: Vec<String> = dens.iter().map(DenProcess::log).collect();
        assert!(
            began.elapsed() < Duration::from_secs(90),
            "drain took over 90 s:\n{logs:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let drain = began.elapsed();
    drop(dens);
    let all = Page {
        skip: 0,
        limit: TOTAL as u64 + 1,
        oldest_first: true,
    };
    let tasks = store.find_tasks(&TaskFilter::default(), all).await.unwrap();
    assert_eq!(tasks.len(), TOTAL);
    assert!(tasks.iter().all(|t| t.status == 1), "every task succeeded, none failed");
    assert_rate(
        tasks
            .iter()
            .filter_map(|t| t.started.map(|d| d.timestamp_millis()))
            .collect(),
        TOTAL,
    );
    println!("rate over 2 embedded DENs: {TOTAL} tasks in {drain:?}");
    assert!(drain >= Duration::from_secs(3), "the limit bit: {drain:?}");
}
