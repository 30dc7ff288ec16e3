//! Documents as Perl Disbatch 4 and its DCI write them — numbers as strings, epoch-number
//! dates, `node: -1` — written straight into the real server, and a real `den` running
//! with them.

mod common;

use common::{count_tasks as count, insert_queue, wait_for, DenProcess};

use std::time::Duration;

use bson::{doc, Bson, Document};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "open in issue 13 item 7: the DEN does not yet run a queue written as Disbatch 4 writes it"]
async fn a_den_runs_with_perl_written_node_queue_and_tasks() {
    let t = common::test_db("perl_docs").await;
    let now_secs = bson::DateTime::now().timestamp_millis() / 1000;
    // The DCI's `POST /nodes/:node {maxthreads}` stores the form value as a string.
    t.db.collection::<Document>("nodes")
        .insert_one(doc! {"node": "perl", "timestamp": now_secs, "maxthreads": "3"})
        .await
        .unwrap();
    let q = insert_queue(&t.db, "perlq", "demo", doc! {"threads": "2"}).await;
    let tasks: Vec<Document> = (0..5)
        .map(|i| {
            doc! {
                "queue": q, "ctime": now_secs, "mtime": Bson::Double(now_secs as f64 * 1000.0),
                "node": Bson::Null, "status": "-2", "params": {"i": i},
                "stdout": Bson::Null, "stderr": Bson::Null,
            }
        })
        .collect();
    t.db.collection::<Document>("tasks").insert_many(tasks).await.unwrap();
    // Status as a string is read, but the claim filter matches Disbatch 4's integer -2:
    // give these the integer status the Perl DEN claims by.
    t.db.collection::<Document>("tasks")
        .update_many(doc! {"status": "-2"}, doc! {"$set": {"status": -2}})
        .await
        .unwrap();
    // A finished task as Perl left it, with `node: -1`, must not disturb the node.
    t.db.collection::<Document>("tasks")
        .insert_one(doc! {
            "queue": q, "ctime": now_secs, "mtime": now_secs, "node": -1, "status": "1",
            "params": {}, "stdout": "done", "stderr": Bson::Null,
        })
        .await
        .unwrap();

    let den = DenProcess::start(&t.uri, &t.name, "perl", serde_json::json!({}));
    wait_for(
        Duration::from_secs(60),
        "the den to run the Perl-written queue",
        || async { count(&t.db, doc! {"queue": q, "status": 1, "node": "perl"}).await == 5 },
    )
    .await;
    let node =
        t.db.collection::<Document>("nodes")
            .find_one(doc! {"node": "perl"})
            .await
            .unwrap()
            .unwrap();
    assert!(
        matches!(node.get("timestamp"), Some(Bson::DateTime(_))),
        "heartbeats refresh the node: {node}"
    );
    drop(den);
}
