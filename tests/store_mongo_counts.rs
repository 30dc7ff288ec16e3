//! `queue_counts` on MongoDB: answered from the `{queue, status}` index alone, with the
//! same counts as a plain group over every task, odd documents included.

use crate::common;

use std::collections::BTreeMap;

use bson::{doc, Bson, Document};
use disbatch::store::mongo::queue_counts_pipeline;
use disbatch::store::Store;

#[tokio::test]
async fn queue_counts_are_read_from_the_index_alone() {
    let t = common::test_db("counts_covered").await;
    let q = common::insert_queue(&t.db, "q", "demo", doc! {}).await;
    common::insert_tasks(&t.db, q, (0..50).map(|i| doc! {"n": i, "pad": "x".repeat(1000)})).await;
    let plan =
        t.db.run_command(doc! {
            "explain": { "aggregate": "tasks", "pipeline": queue_counts_pipeline(), "cursor": {} },
            "verbosity": "queryPlanner",
        })
        .await
        .expect("explain");
    let text = plan.to_string();
    assert!(text.contains("IXSCAN"), "an index scan: {text}");
    assert!(!text.contains("COLLSCAN"), "no collection scan: {text}");
    assert!(!text.contains("\"FETCH\""), "no task document read: {text}");
}

#[tokio::test]
async fn queue_counts_match_a_plain_count_with_odd_documents() {
    let t = common::test_db("counts_odd").await;
    let a = common::insert_queue(&t.db, "a", "demo", doc! {}).await;
    let b = common::insert_queue(&t.db, "b", "demo", doc! {}).await;
    let tasks = t.db.collection::<Document>("tasks");
    let mut docs = Vec::new();
    for _ in 0..3 {
        docs.push(doc! {"queue": a, "status": -2, "node": Bson::Null});
    }
    // Status 1 written as Int32, Int64 and Double, as other clients do: one count.
    docs.push(doc! {"queue": a, "status": 1, "stdout": "x".repeat(100_000)});
    docs.push(doc! {"queue": a, "status": 1});
    docs.push(doc! {"queue": a, "status": 1_i64});
    docs.push(doc! {"queue": a, "status": 1.0});
    docs.push(doc! {"queue": b, "status": 2});
    docs.push(doc! {"queue": b, "status": 0, "node": "n"});
    // A number written as a string, as Disbatch 4's tools write form values, counts.
    docs.push(doc! {"queue": b, "status": "1"});
    // Not counted: a status that is not a number, none, no queue.
    docs.push(doc! {"queue": b, "status": "done"});
    docs.push(doc! {"queue": b});
    docs.push(doc! {"status": 1});
    docs.push(doc! {"queue": Bson::Null, "status": 1});
    tasks.insert_many(docs).await.unwrap();
    let counts = t.store.queue_counts().await.unwrap();
    let expected = BTreeMap::from([
        (a, BTreeMap::from([(-2, 3), (1, 4)])),
        (b, BTreeMap::from([(0, 1), (1, 1), (2, 1)])),
    ]);
    assert_eq!(counts, expected);
}
