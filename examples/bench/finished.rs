//! The `finished` scenario: what the dashboard's reads cost on a database holding many
//! finished tasks — `GET /queues`, `GET /metrics` and `GET /stats` through the real router
//! (in-process), next to the full count by status they no longer make on each request.
//!
//! The embedded store gets 1,000,000 finished tasks (100,000 with `--quick`), written
//! straight into its file; MongoDB (the test server, slow to insert into) gets 100,000
//! (10,000 with `--quick`). Both get a day of per-minute counters for 4 queues and 2 nodes.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use bson::oid::ObjectId;
use bson::{doc, DateTime, Document};
use disbatch::api::{router, ApiState};
use disbatch::stats::{minute_of, Counters, End};
use disbatch::store::mongo::MongoStore;
use disbatch::store::sqlite::SqliteStore;
use disbatch::store::{NewQueue, Page, Store, TaskFilter};
use http_body_util::BodyExt;
use tower::ServiceExt;

use super::{median, Bench};

const QUEUES: usize = 4;

/// Median milliseconds of `GET uri` over `rounds` requests (after one not counted), and
/// the first request's.
async fn timed(app: &axum::Router, uri: &str, rounds: usize) -> (f64, f64) {
    let mut took = Vec::new();
    let mut first = f64::NAN;
    for i in 0..=rounds {
        let start = Instant::now();
        let resp = app
            .clone()
            .oneshot(Request::get(uri).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(status, StatusCode::OK, "{uri}: {}", String::from_utf8_lossy(&body));
        let ms = start.elapsed().as_secs_f64() * 1e3;
        if i == 0 {
            first = ms;
        } else {
            took.push(ms);
        }
    }
    (median(took), first)
}

/// A day of per-minute counters for `queues`, from two nodes.
async fn history(store: &dyn Store, queues: &[ObjectId]) {
    let now = minute_of(DateTime::now());
    let mut rows = Vec::new();
    for m in now - 1440..=now {
        for q in queues {
            let mut c = Counters::default();
            for i in 0..20 {
                c.observe(
                    if i % 10 == 0 { End::Failed } else { End::Succeeded },
                    0.002 * f64::from(i + 1),
                );
            }
            rows.push((m, *q, c));
        }
    }
    for node in ["bench-a", "bench-b"] {
        for chunk in rows.chunks(500) {
            store.add_stats(node, chunk).await.unwrap();
        }
    }
    let depths: Vec<(ObjectId, i64)> = queues.iter().map(|q| (*q, 10)).collect();
    for m in now - 1440..=now {
        store.record_depth(m, &depths).await.unwrap();
    }
}

/// Fills the embedded file with `n` finished tasks over `queues` in one statement.
fn fill_sqlite(path: &std::path::Path, queues: &[ObjectId], n: usize) {
    let conn = rusqlite::Connection::open(path).unwrap();
    let now = DateTime::now().timestamp_millis();
    let pick: String = queues
        .iter()
        .enumerate()
        .map(|(i, q)| format!(" WHEN {i} THEN '{}'", q.to_hex()))
        .collect();
    // Each task gets a queue by its number, succeeded but for every 20th (failed).
    conn.execute_batch(&format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {n})
         INSERT INTO tasks (id, queue, ctime, mtime, node, status, params, stdout, stderr)
         SELECT printf('ff%022x', i), CASE i % {}{pick} END,
                {now}, {now}, 'bench', CASE WHEN i % 20 = 0 THEN 2 ELSE 1 END, x'0500000000', '', ''
         FROM n;",
        queues.len()
    ))
    .unwrap();
}

async fn fill_mongo(db: &mongodb::Database, queues: &[ObjectId], n: usize) {
    let now = DateTime::now();
    let docs: Vec<Document> = (0..n)
        .map(|i| {
            doc! {"queue": queues[i % queues.len()], "status": if i % 20 == 0 { 2 } else { 1 }, "node": "bench",
            "params": {}, "stdout": "", "stderr": "", "ctime": now, "mtime": now}
        })
        .collect();
    for batch in docs.chunks(10_000) {
        db.collection::<Document>("tasks")
            .insert_many(batch.to_vec())
            .await
            .unwrap();
    }
}

/// The rows of one store: (what, median ms, first ms).
async fn measure(store: Arc<dyn Store>, rounds: usize) -> Vec<(&'static str, f64, f64)> {
    let mut out = Vec::new();
    let mut full = Vec::new();
    let mut active = Vec::new();
    for _ in 0..rounds {
        let start = Instant::now();
        store.queue_counts().await.unwrap();
        full.push(start.elapsed().as_secs_f64() * 1e3);
        let start = Instant::now();
        store.active_counts().await.unwrap();
        active.push(start.elapsed().as_secs_f64() * 1e3);
    }
    let mut newest = Vec::new();
    for _ in 0..rounds {
        let start = Instant::now();
        let page = Page {
            skip: 0,
            limit: 1,
            oldest_first: false,
        };
        store.find_tasks(&TaskFilter::default(), page).await.unwrap();
        newest.push(start.elapsed().as_secs_f64() * 1e3);
    }
    out.push(("full count by status (before: every request)", median(full), f64::NAN));
    out.push(("active counts (every request now)", median(active), f64::NAN));
    out.push(("newest task (every request now)", median(newest), f64::NAN));
    let app = router(ApiState::new(store, vec!["demo".into()]));
    for (what, uri) in [
        ("GET /queues", "/queues"),
        ("GET /metrics", "/metrics"),
        ("GET /stats (1 h, 1 min steps)", "/stats?since=1h"),
        ("GET /stats (24 h, 15 min steps)", "/stats?since=24h&step=15m"),
    ] {
        let (warm, first) = timed(&app, uri, rounds).await;
        out.push((what, warm, first));
    }
    out
}

fn print(label: &str, n: usize, rows: &[(&str, f64, f64)]) {
    println!("\n{label}: {n} finished tasks, {QUEUES} queues, 24 h of counters (2 nodes)");
    println!("| {:<46} | {:>12} | {:>14} |", "read", "median ms", "first call ms");
    println!("|{:-<48}|{:->14}|{:->16}|", "", "", "");
    for (what, warm, first) in rows {
        let first = if first.is_nan() {
            "-".to_string()
        } else {
            format!("{first:.2}")
        };
        println!("| {what:<46} | {warm:>12.2} | {first:>14} |");
    }
}

fn key(store: &str, rows: &[(&str, f64, f64)], i: usize, name: &str) -> String {
    format!("{store}_{name}_ms={:.2}", rows[i].1)
}

impl Bench {
    pub(super) async fn finished(&self) {
        let rounds = self.rounds.max(5) * 4;
        let (n_sqlite, n_mongo) = if self.quick {
            (100_000, 10_000)
        } else {
            (1_000_000, 100_000)
        };

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("finished.db");
        let sqlite = SqliteStore::open(&path).await.unwrap();
        sqlite.ensure_indexes().await.unwrap();
        let mut queues = Vec::new();
        for i in 0..QUEUES {
            let q = sqlite
                .create_queue(NewQueue {
                    name: format!("finished-{i}"),
                    plugin: "demo".into(),
                    threads: Some(4),
                    sort: Default::default(),
                    extra: Document::new(),
                })
                .await
                .unwrap();
            queues.push(q.id);
        }
        let start = Instant::now();
        let qs = queues.clone();
        let p = path.clone();
        tokio::task::spawn_blocking(move || fill_sqlite(&p, &qs, n_sqlite))
            .await
            .unwrap();
        println!(
            "\n(embedded: {n_sqlite} tasks written in {:.1} s)",
            start.elapsed().as_secs_f64()
        );
        history(&sqlite, &queues).await;
        let embedded = measure(Arc::new(sqlite), rounds).await;
        print("Embedded store (SQLite)", n_sqlite, &embedded);

        let db = self.db("finished").await;
        let mongo = MongoStore::from_database(db.clone());
        let mut queues = Vec::new();
        for _ in 0..QUEUES {
            queues.push(self.queue(&db, 4).await);
        }
        let start = Instant::now();
        fill_mongo(&db, &queues, n_mongo).await;
        println!(
            "\n(MongoDB: {n_mongo} tasks written in {:.1} s)",
            start.elapsed().as_secs_f64()
        );
        history(&mongo, &queues).await;
        let on_mongo = measure(Arc::new(mongo), rounds.min(10)).await;
        print("MongoDB (secantusd-rs test server)", n_mongo, &on_mongo);
        db.drop().await.ok();

        let names = [
            "full_count",
            "active_counts",
            "newest",
            "queues",
            "metrics",
            "stats_1h",
            "stats_24h",
        ];
        let mut line = format!("RESULT finished sqlite_tasks={n_sqlite} mongo_tasks={n_mongo}");
        for (store, rows) in [("sqlite", &embedded), ("mongo", &on_mongo)] {
            for (i, name) in names.iter().enumerate() {
                line.push(' ');
                line.push_str(&key(store, rows, i, name));
            }
        }
        println!("\n{line}");
    }
}
