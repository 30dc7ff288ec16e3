//! Grouped starts on MongoDB: the starts of the runs of a DEN's workers made at the same
//! moment go as one `updateMany` of their tasks (an entry of the group's `bulkWrite` beside
//! the ends of other runs), and each start is told whether its own fence held, as the
//! database shows.

use crate::common;
use crate::store_mongo_groups::{counted_store, finish};

use bson::{doc, Document};
use disbatch::model::status;
use disbatch::store::{Store, StoreResult};

/// The starts on node "n1" of the claimed tasks `ids`, each a call of its own, all made at
/// once; their answers in the order of `ids`.
async fn start_at_once(
    store: &disbatch::store::mongo::MongoStore,
    ids: &[bson::oid::ObjectId],
) -> Vec<StoreResult<Vec<bool>>> {
    let starts = ids.iter().map(|&id| {
        let store = store.clone();
        let entry = [(
            id,
            disbatch::lifecycle::machine::claimed_by("n1"),
            disbatch::lifecycle::machine::start(),
        )];
        tokio::spawn(async move { store.change_tasks(&entry).await })
    });
    futures::future::join_all(starts)
        .await
        .into_iter()
        .map(|a| a.unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn starts_made_at_once_go_as_one_update_and_each_is_told_whether_it_held() {
    let t = common::test_db("grouped_starts").await;
    let (store, commands) = counted_store(&t).await;
    let queue = bson::oid::ObjectId::new();
    // 40 claimed tasks, every other one by node "n1", the rest by another node: a start on
    // "n1" holds for the first kind only.
    let n = 40;
    let docs: Vec<Document> = (0..n)
        .map(|i| {
            doc! {
                "_id": bson::oid::ObjectId::new(), "queue": queue, "status": status::CLAIMED,
                "node": if i % 2 == 0 { "n1" } else { "other" }, "params": {},
                "ctime": bson::DateTime::now(), "mtime": bson::DateTime::now(),
            }
        })
        .collect();
    let ids: Vec<_> = docs.iter().map(|d| d.get_object_id("_id").unwrap()).collect();
    t.db.collection::<Document>("tasks").insert_many(docs).await.unwrap();

    let answers = start_at_once(&store, &ids).await;

    for (i, (answer, &id)) in answers.into_iter().zip(&ids).enumerate() {
        let held = answer.unwrap();
        let d =
            t.db.collection::<Document>("tasks")
                .find_one(doc! { "_id": id })
                .await
                .unwrap()
                .unwrap();
        if i % 2 == 0 {
            assert_eq!(held, vec![true], "task {i}: its start held");
            assert_eq!(
                (d.get_str("node"), d.get_i32("status")),
                (Ok("n1"), Ok(status::RUNNING)),
                "{d}"
            );
        } else {
            assert_eq!(held, vec![false], "task {i}: another node's task is not started");
            assert_eq!(
                (d.get_str("node"), d.get_i32("status")),
                (Ok("other"), Ok(status::CLAIMED)),
                "{d}"
            );
        }
    }
    let (updates, bulk, reads) = (commands.get("update"), commands.get("bulkWrite"), commands.get("find"));
    println!("{n} starts: {updates} update, {bulk} bulkWrite, {reads} find");
    assert_eq!(bulk, 0, "the same change of many tasks is one update, not a bulkWrite");
    assert!(updates < n / 2, "{n} starts at once went in fewer commands ({updates})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn starts_and_ends_made_at_once_share_a_bulk_write_and_each_keeps_its_answer() {
    let t = common::test_db("grouped_mixed").await;
    let (store, commands) = counted_store(&t).await;
    let queue = bson::oid::ObjectId::new();
    // 20 running tasks of node "n1" to end, one carrying 9 MB in its params (its result is
    // refused), and 40 claimed tasks to start, every other one claimed by another node.
    let task = |status: i32, node: &str| {
        doc! {
            "_id": bson::oid::ObjectId::new(), "queue": queue, "status": status, "node": node,
            "params": {}, "ctime": bson::DateTime::now(), "mtime": bson::DateTime::now(),
        }
    };
    let mut running: Vec<Document> = (0..20).map(|_| task(status::RUNNING, "n1")).collect();
    let victim = 7;
    running[victim].insert("params", doc! { "blob": "p".repeat(9 << 20) });
    let claimed: Vec<Document> = (0..40)
        .map(|i| task(status::CLAIMED, if i % 2 == 0 { "n1" } else { "other" }))
        .collect();
    let id = |d: &Document| d.get_object_id("_id").unwrap();
    let (ends, starts): (Vec<_>, Vec<_>) = (running.iter().map(id).collect(), claimed.iter().map(id).collect());
    let coll = t.db.collection::<Document>("tasks");
    coll.insert_many(running).await.unwrap();
    coll.insert_many(claimed).await.unwrap();

    let running_on = disbatch::lifecycle::machine::running_on("n1");
    let mut calls = Vec::new();
    for i in 0..40 {
        let entry = [(
            starts[i],
            disbatch::lifecycle::machine::claimed_by("n1"),
            disbatch::lifecycle::machine::start(),
        )];
        let s = store.clone();
        calls.push(tokio::spawn(async move { s.change_tasks(&entry).await }));
        if i % 2 == 0 {
            let out = if i / 2 == victim {
                "o".repeat(9 << 20)
            } else {
                format!("done {i}")
            };
            let entry = [(ends[i / 2], running_on.clone(), finish(out))];
            let s = store.clone();
            calls.push(tokio::spawn(async move { s.change_tasks(&entry).await }));
        }
    }
    let mut answers = futures::future::join_all(calls).await.into_iter().map(|a| a.unwrap());
    let stored = |id| {
        let coll = coll.clone();
        async move {
            let d = coll.find_one(doc! { "_id": id }).await.unwrap().unwrap();
            (d.get_str("node").unwrap().to_owned(), d.get_i32("status").unwrap())
        }
    };
    for i in 0..40 {
        let held = answers.next().unwrap().unwrap();
        if i % 2 == 0 {
            assert_eq!(held, vec![true], "start {i}");
            assert_eq!(stored(starts[i]).await, ("n1".into(), status::RUNNING));
            let ended = answers.next().unwrap();
            if i / 2 == victim {
                let e = ended.expect_err("a document over 16 MB is refused");
                assert!(!e.is_transient(), "{e}");
                assert_eq!(
                    stored(ends[i / 2]).await,
                    ("n1".into(), status::RUNNING),
                    "nothing written"
                );
            } else {
                assert_eq!(ended.unwrap(), vec![true], "end {}", i / 2);
                assert_eq!(stored(ends[i / 2]).await, ("n1".into(), status::SUCCEEDED));
            }
        } else {
            assert_eq!(held, vec![false], "start {i} of another node's task");
            assert_eq!(stored(starts[i]).await, ("other".into(), status::CLAIMED));
        }
    }
    let (bulk, updates) = (commands.get("bulkWrite"), commands.get("update"));
    println!(
        "60 changes: {bulk} bulkWrite, {updates} update, {} find",
        commands.get("find")
    );
    assert!(bulk >= 1, "changes made at once were grouped");
    assert!(
        bulk + updates < 30,
        "60 changes at once went in fewer commands ({bulk} + {updates})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_start_the_server_refuses_fails_alone_among_joined_ones() {
    let t = common::test_db("grouped_start_refused").await;
    let (store, _) = counted_store(&t).await;
    let queue = bson::oid::ObjectId::new();
    let task = |params: Document| {
        doc! {
            "_id": bson::oid::ObjectId::new(), "queue": queue, "status": status::CLAIMED,
            "node": "n1", "params": params, "ctime": bson::DateTime::now(),
        }
    };
    let mut docs: Vec<Document> = (0..12).map(|_| task(doc! {})).collect();
    // The last one, with no `mtime` yet, is a few bytes under the largest document the
    // server stores: the `mtime` its start writes makes it too large.
    let victim = 11;
    let mut big = task(doc! { "blob": "" });
    let room = (16 << 20) - 4 - bson::to_vec(&big).unwrap().len();
    big.insert("params", doc! { "blob": "p".repeat(room) });
    docs[victim] = big;
    let ids: Vec<_> = docs.iter().map(|d| d.get_object_id("_id").unwrap()).collect();
    let coll = t.db.collection::<Document>("tasks");
    coll.insert_many(docs).await.unwrap();

    let answers = start_at_once(&store, &ids).await;
    for (i, (answer, &id)) in answers.into_iter().zip(&ids).enumerate() {
        let d = coll
            .find_one(doc! { "_id": id })
            .projection(doc! { "params": 0 })
            .await
            .unwrap()
            .unwrap();
        if i == victim {
            let e = answer.expect_err("a document over 16 MB is refused");
            assert!(!e.is_transient(), "a refusal says retrying cannot help: {e}");
            assert_eq!(d.get_i32("status"), Ok(status::CLAIMED), "nothing written: {d}");
        } else {
            assert_eq!(answer.unwrap(), vec![true], "start {i} held beside the refused one");
            assert_eq!(d.get_i32("status"), Ok(status::RUNNING), "{d}");
        }
    }
}
