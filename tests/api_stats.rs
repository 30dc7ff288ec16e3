//! `GET /stats` against a real `den` process running real tasks on the test server: the
//! series add up to the tasks run, steps fold minutes, percentiles come from the buckets,
//! bad parameters are refused naming them; and `GET /queues` keeps its counts right
//! without counting every task on each request, also when a writer that is not our DEN
//! (a Disbatch 4 DEN) ends a task.

use crate::common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use bson::doc;
use serde_json::{json, Value};

use common::http::{assert_bad, get, post, setup};
use common::{wait_for, DenProcess, Recording};

fn total(stats: &Value, key: &str) -> u64 {
    stats["series"][0]["summary"][key].as_u64().unwrap()
}

fn series<'a>(stats: &'a Value, name: &str) -> &'a Value {
    stats["series"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no series {name}: {stats}"))
}

fn sum(points: &Value, key: &str) -> u64 {
    points
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[key].as_u64().unwrap())
        .sum()
}

#[tokio::test]
async fn stats_count_the_runs_of_a_real_den() {
    let (db, app) = setup("api_stats_den", |_| {}).await;
    for name in ["ok-q", "mixed-q"] {
        let r = post(&app, "/queues", json!({"name": name, "plugin": "demo", "threads": 4})).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    }
    let ok: Vec<Value> = (0..6)
        .map(|i| json!({"message": format!("run {i}"), "sleep_ms": 20}))
        .collect();
    let r = post(&app, "/tasks", json!({"queue": "ok-q", "params": ok})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let mixed = vec![
        json!({"status": 2, "stderr": "bad input"}),
        json!({"status": 2}),
        json!({"status": 2}),
        json!({"sleep_ms": 300}),
    ];
    let r = post(&app, "/tasks", json!({"queue": "mixed-q", "params": mixed})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    let _den = DenProcess::start(&db.uri, &db.name, "stats-node", json!({}));
    let started = std::time::Instant::now();
    let stats = loop {
        let stats = get(&app, "/stats?since=10m").await.json();
        if total(&stats, "succeeded") + total(&stats, "failed") == 10 {
            break stats;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the counters of 10 runs: {stats}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!((total(&stats, "succeeded"), total(&stats, "failed")), (7, 3));
    assert_eq!(stats["step"], 60);
    assert_eq!(stats["series"][0]["name"], "total");
    let points = &stats["series"][0]["points"];
    assert_eq!(points.as_array().unwrap().len(), 11, "ten minutes back and this one");
    assert_eq!(sum(points, "succeeded"), 7);
    let ok = series(&stats, "ok-q");
    let mixed = series(&stats, "mixed-q");
    assert_eq!(
        (ok["summary"]["succeeded"].as_u64(), ok["summary"]["failed"].as_u64()),
        (Some(6), Some(0))
    );
    assert_eq!(
        (
            mixed["summary"]["succeeded"].as_u64(),
            mixed["summary"]["failed"].as_u64()
        ),
        (Some(1), Some(3))
    );
    // The 300 ms run is the slowest of mixed-q: its p99 bucket holds 300 ms.
    let p99 = mixed["summary"]["p99"].as_f64().unwrap();
    assert!((0.3..0.8).contains(&p99), "p99 {p99}");
    let p50 = ok["summary"]["p50"].as_f64().unwrap();
    assert!((0.02..1.0).contains(&p50), "p50 {p50}");
    assert!(p50 <= ok["summary"]["p99"].as_f64().unwrap());
    let bounds = stats["bounds"].as_array().unwrap();
    assert_eq!(bounds.len(), disbatch::stats::BOUNDS);
    assert!(
        bounds.iter().any(|b| b.as_f64() == Some(p99)),
        "percentiles are bucket bounds"
    );

    // The leading DEN sampled the depth of every queue.
    wait_for(Duration::from_secs(30), "a depth sample", || {
        let app = app.clone();
        async move {
            let s = get(&app, "/stats?since=10m&queue=ok-q").await.json();
            s["series"][1]["points"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["depth"].is_i64())
        }
    })
    .await;
    let nodes = stats["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 1);
    assert_eq!(
        (nodes[0]["node"].as_str(), nodes[0]["leader"].as_bool()),
        (Some("stats-node"), Some(true))
    );
    assert_eq!(nodes[0]["running"], 0);

    // Five-minute steps fold the same counts.
    let folded = get(&app, "/stats?since=10m&step=5m").await.json();
    assert_eq!(folded["step"], 300);
    let points = &folded["series"][0]["points"];
    assert_eq!(points.as_array().unwrap().len(), 3, "11 minutes in steps of 5");
    assert_eq!((sum(points, "succeeded"), sum(points, "failed")), (7, 3));
    // One queue only: the total is that queue's.
    let one = get(&app, "/stats?since=10m&queue=mixed-q").await.json();
    assert_eq!(one["series"].as_array().unwrap().len(), 2);
    assert_eq!((total(&one, "succeeded"), total(&one, "failed")), (1, 3));
    // A range in the past holds nothing.
    let past = get(&app, "/stats?since=3h&until=2h").await.json();
    assert_eq!(total(&past, "succeeded") + total(&past, "failed"), 0);
    assert_eq!(past["series"][0]["summary"]["p50"], Value::Null);
}

#[tokio::test]
async fn bad_stats_parameters_are_refused_naming_them() {
    let (_db, app) = setup("api_stats_bad", |_| {}).await;
    assert_bad(&get(&app, "/stats?since=yesterday").await, "\"since\"");
    assert_bad(&get(&app, "/stats?until=soon").await, "\"until\"");
    assert_bad(&get(&app, "/stats?step=90").await, "\"step\"");
    assert_bad(&get(&app, "/stats?step=0").await, "\"step\"");
    assert_bad(&get(&app, "/stats?step=abc").await, "\"step\"");
    assert_bad(&get(&app, "/stats?since=300d&step=1m").await, "\"step\"");
    assert_bad(&get(&app, "/stats?since=1h&until=2h").await, "\"since\"");
    assert_bad(&get(&app, "/stats?sinse=1h").await, "\"sinse\"");
    let r = get(&app, "/stats?queue=nope").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    let r = get(
        &app,
        "/stats?since=2026-01-01T00:00:00Z&until=2026-01-01T01:00:00Z&step=1h",
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let s = r.json();
    assert_eq!(s["since"], "2026-01-01T00:00:00Z");
    assert_eq!(
        s["series"][0]["points"].as_array().unwrap().len(),
        2,
        "the step holding `until` is included"
    );
}

#[tokio::test]
async fn stats_answers_are_bounded_in_all_series() {
    let (_db, app) = setup("api_stats_cells", |_| {}).await;
    for i in 0..30 {
        let r = post(&app, "/queues", json!({"name": format!("q{i}"), "plugin": "demo"})).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    }
    // 8,641 points for each of 31 series (the total and 30 queues): over 200,000 in all.
    let r = get(&app, "/stats?since=6d&step=1m").await;
    assert_bad(&r, "at most 200000 in all");
    // One queue: 2 series.
    let r = get(&app, "/stats?since=6d&step=1m&queue=q7").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let s = r.json();
    assert_eq!(s["series"].as_array().unwrap().len(), 2);
    assert_eq!(s["series"][1]["name"], "q7");
    // A larger step.
    let r = get(&app, "/stats?since=6d&step=1h").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json()["series"].as_array().unwrap().len(), 31);
}

#[tokio::test]
async fn queue_counts_stay_right_without_counting_every_task() {
    let db = common::test_db("api_stats_counts").await;
    let recording = Recording::new(Arc::new(db.store.clone()));
    let mut state = disbatch::api::ApiState::new(recording.clone(), vec!["demo".into()]);
    state.database = Some(db.name.clone());
    let app = disbatch::api::router(state);
    let r = post(&app, "/queues", json!({"name": "counted", "plugin": "demo"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = post(&app, "/tasks", json!({"queue": "counted", "params": [{}, {}, {}]})).await;
    let ids: Vec<String> = serde_json::from_value(r.json()["ids"].clone()).unwrap();
    let queue = |app: axum::Router| async move { get(&app, "/queues/counted").await.json() };
    let q = queue(app.clone()).await;
    assert_eq!((q["queued"].as_u64(), q["completed"].as_u64()), (Some(3), Some(0)));
    let scans = recording.full_counts.load(Ordering::SeqCst);
    for _ in 0..5 {
        let q = queue(app.clone()).await;
        assert_eq!(q["queued"], 3);
        let all = get(&app, "/queues").await.json();
        assert_eq!(all[0]["queued"], 3);
    }
    assert!(get(&app, "/metrics").await.text.contains("code=\"-2\"} 3"));
    assert_eq!(
        recording.full_counts.load(Ordering::SeqCst),
        scans,
        "nothing changed: no request counted every task again"
    );

    // A Disbatch 4 DEN ends a task: it writes the task document, never our counters.
    let tasks = db.db.collection::<bson::Document>("tasks");
    let first = bson::oid::ObjectId::parse_str(&ids[0]).unwrap();
    let done = tasks
        .update_one(
            doc! {"_id": first},
            doc! {"$set": {"status": 1, "node": "perl-den", "stdout": "", "stderr": "", "mtime": bson::DateTime::now()}},
        )
        .await
        .unwrap();
    assert_eq!(done.modified_count, 1);
    wait_for(Duration::from_secs(30), "the ended task counted", || {
        let app = app.clone();
        async move {
            let q = get(&app, "/queues/counted").await.json();
            q["queued"] == 2 && q["completed"] == 1 && q["counts"]["1"] == 1
        }
    })
    .await;
    let metrics = get(&app, "/metrics").await.text;
    assert!(metrics.contains("code=\"1\"} 1"), "{metrics}");
}
