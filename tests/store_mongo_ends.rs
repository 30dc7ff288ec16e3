//! Grouped ends on MongoDB: the ends of the runs of a DEN's workers made at the same moment
//! go as one `updateMany` of their tasks, each task given its own status and outputs (a
//! pipeline choosing by `_id`), each end told whether its own fence held; an end the server
//! refuses fails alone; and the claims sent beside the ends keep their tasks, as the
//! database shows.

use crate::common;
use crate::store_mongo_groups::{counted_store, fifo_queue};

use bson::{doc, Document};
use disbatch::lifecycle::run::{finish, finish_and_claim, FinishExtra};
use disbatch::model::status;
use disbatch::store::mongo::MongoStore;
use disbatch::store::testing::StoreExt;
use disbatch::store::{OutputValue, Store, StoreResult};

fn running(queue: bson::oid::ObjectId, node: &str) -> Document {
    doc! {
        "_id": bson::oid::ObjectId::new(), "queue": queue, "status": status::RUNNING, "node": node,
        "params": {}, "ctime": bson::DateTime::now(), "mtime": bson::DateTime::now(), "rerun": false,
    }
}

/// What the end of task `i` writes: a status and outputs of its own, some of them looking
/// like field paths or operators.
fn result_of(i: usize) -> (i32, String, String) {
    let code = if i.is_multiple_of(3) { status::FAILED } else { status::SUCCEEDED };
    let stdout = match i % 4 {
        0 => "$status".to_owned(),
        1 => format!("done {i}"),
        2 => "{\"$gt\": 1}".to_owned(),
        _ => String::new(),
    };
    (code, stdout, format!("err {}", i % 2))
}

/// The ends on node "n1" of the tasks `ids`, each a call of its own, all made at once.
async fn end_at_once(store: &MongoStore, ids: &[bson::oid::ObjectId]) -> Vec<StoreResult<bool>> {
    let ends = ids.iter().enumerate().map(|(i, &id)| {
        let store = store.clone();
        let (code, out, err) = result_of(i);
        tokio::spawn(async move {
            finish(
                &store,
                id,
                "n1",
                code,
                OutputValue::Inline(out),
                OutputValue::Inline(err),
            )
            .await
        })
    });
    futures::future::join_all(ends)
        .await
        .into_iter()
        .map(|a| a.unwrap())
        .collect()
}

async fn stored(t: &common::TestDb, id: bson::oid::ObjectId) -> Document {
    t.db.collection::<Document>("tasks")
        .find_one(doc! { "_id": id })
        .projection(doc! { "params": 0 })
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ends_made_at_once_go_as_one_update_and_each_task_keeps_its_own_result() {
    let t = common::test_db("grouped_ends").await;
    let (store, commands) = counted_store(&t).await;
    let queue = bson::oid::ObjectId::new();
    // 48 running tasks, every fourth one on another node: an end on "n1" holds for the
    // others only.
    let n = 48;
    let docs: Vec<Document> = (0..n)
        .map(|i| running(queue, if i % 4 == 3 { "other" } else { "n1" }))
        .collect();
    let ids: Vec<_> = docs.iter().map(|d| d.get_object_id("_id").unwrap()).collect();
    t.db.collection::<Document>("tasks").insert_many(docs).await.unwrap();

    let answers = end_at_once(&store, &ids).await;

    for (i, (answer, &id)) in answers.into_iter().zip(&ids).enumerate() {
        let ended = answer.unwrap();
        let d = stored(&t, id).await;
        if i % 4 == 3 {
            assert!(!ended, "task {i}: another node's run is not ended");
            assert_eq!(d.get_i32("status"), Ok(status::RUNNING), "{d}");
            assert_eq!(d.get("stdout"), None, "nothing written: {d}");
            continue;
        }
        let (code, out, err) = result_of(i);
        assert!(ended, "task {i}: its end held");
        assert_eq!(d.get_i32("status"), Ok(code), "task {i}: {d}");
        assert_eq!(d.get_str("stdout"), Ok(out.as_str()), "task {i}: {d}");
        assert_eq!(d.get_str("stderr"), Ok(err.as_str()), "task {i}: {d}");
        assert_eq!(d.get_str("node"), Ok("n1"), "{d}");
        assert!(!d.contains_key("rerun"), "the rerun mark is cleared: {d}");
        assert!(d.get_datetime("mtime").is_ok(), "{d}");
    }
    let (updates, bulk) = (commands.get("update"), commands.get("bulkWrite"));
    println!(
        "{n} ends: {updates} update, {bulk} bulkWrite, {} find",
        commands.get("find")
    );
    assert!(
        updates + bulk < n / 4,
        "{n} ends at once went in few commands ({updates} update, {bulk} bulkWrite)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_end_the_server_refuses_fails_alone_among_joined_ones() {
    let t = common::test_db("grouped_end_refused").await;
    let (store, _) = counted_store(&t).await;
    let queue = bson::oid::ObjectId::new();
    let mut docs: Vec<Document> = (0..12).map(|_| running(queue, "n1")).collect();
    // One a few bytes under the largest document the server stores: its result, small
    // enough to join the others, makes it too large.
    let victim = 5;
    let mut big = running(queue, "n1");
    big.insert("params", doc! { "blob": "" });
    let room = (16 << 20) - 16 - bson::to_vec(&big).unwrap().len();
    big.insert("params", doc! { "blob": "p".repeat(room) });
    docs[victim] = big;
    let ids: Vec<_> = docs.iter().map(|d| d.get_object_id("_id").unwrap()).collect();
    t.db.collection::<Document>("tasks").insert_many(docs).await.unwrap();

    let answers = end_at_once(&store, &ids).await;

    for (i, (answer, &id)) in answers.into_iter().zip(&ids).enumerate() {
        let d = stored(&t, id).await;
        if i == victim {
            let e = answer.expect_err("a document over 16 MB is refused");
            assert!(!e.is_transient(), "a refusal says retrying cannot help: {e}");
            assert_eq!(d.get_i32("status"), Ok(status::RUNNING), "nothing written: {d}");
        } else {
            assert!(answer.unwrap(), "end {i} held beside the refused one");
            let (code, out, _) = result_of(i);
            assert_eq!(
                (d.get_i32("status"), d.get_str("stdout")),
                (Ok(code), Ok(out.as_str())),
                "{d}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ends_with_the_next_claims_beside_them_each_keep_their_own_task() {
    let t = common::test_db("grouped_ends_claims").await;
    let (store, commands) = counted_store(&t).await;
    let store = store.read_ahead_for(std::time::Duration::from_secs(600));
    let q = fifo_queue(&store, "ends").await;
    let ids = store.create_tasks(q.id, vec![doc! {}; 64]).await.unwrap();
    // Eight workers each claim and start a task; the claims read more ahead.
    let first = futures::future::join_all((0..8).map(|_| store.claim_to_run(&q, "n1"))).await;
    let mut runs: Vec<_> = first.into_iter().map(|c| c.unwrap().expect("a task").id).collect();
    for &id in &runs {
        assert!(disbatch::lifecycle::run::start(&store, id, "n1").await.unwrap());
    }
    let until = bson::DateTime::from_millis(bson::DateTime::now().timestamp_millis() + 60_000);
    let mut ended = Vec::new();
    let mut claimed = runs.clone();
    for _ in 0..3 {
        let before = commands.get("update") + commands.get("bulkWrite");
        let ends = runs.iter().enumerate().map(|(i, &id)| {
            let (store, q) = (store.clone(), q.clone());
            let (code, out, err) = result_of(i);
            tokio::spawn(async move {
                let outputs = (OutputValue::Inline(out), OutputValue::Inline(err));
                let r = finish_and_claim(&store, id, "n1", code, outputs, &FinishExtra::default(), (&q, until)).await;
                (id, i, r.unwrap())
            })
        });
        let mut next = Vec::new();
        for end in futures::future::join_all(ends).await {
            let (id, i, (held, claim)) = end.unwrap();
            assert!(held, "the end of {id} held");
            let d = stored(&t, id).await;
            let (code, out, err) = result_of(i);
            assert_eq!(
                (d.get_i32("status"), d.get_str("stdout"), d.get_str("stderr")),
                (Ok(code), Ok(out.as_str()), Ok(err.as_str())),
                "{d}"
            );
            ended.push(id);
            let task = match claim {
                Some(c) => c.unwrap().expect("a task beside the end"),
                None => store.claim_to_run(&q, "n1").await.unwrap().expect("a task"),
            };
            assert_eq!(stored(&t, task.id).await.get_i32("status"), Ok(status::CLAIMED));
            assert!(disbatch::lifecycle::run::start(&store, task.id, "n1").await.unwrap());
            next.push(task.id);
        }
        let sent = commands.get("update") + commands.get("bulkWrite") - before;
        println!("8 ends with their next claims: {sent} update and bulkWrite commands");
        claimed.extend(&next);
        runs = next;
    }
    let mut once = claimed.clone();
    once.sort();
    once.dedup();
    assert_eq!(once.len(), claimed.len(), "every task claimed once: {claimed:?}");
    assert_eq!(once, ids[..once.len()], "in the queue's order");
    assert_eq!(ended.len(), 24);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_joined_beside_tasks_whose_ids_look_like_expressions_claim_each_task_once() {
    let t = common::test_db("grouped_odd_ids").await;
    let (store, commands) = counted_store(&t).await;
    let q = fifo_queue(&store, "odd").await;
    // Written by hand: ids an aggregation expression would read as a field path or refuse.
    // In a `fifo` queue they come first (strings sort before ObjectIds).
    let odd = ["$_id", "$", "$$NOW"];
    let coll = t.db.collection::<Document>("tasks");
    for id in odd {
        coll.insert_one(doc! {
            "_id": id, "queue": q.id, "status": status::QUEUED, "node": null, "params": {},
            "ctime": bson::DateTime::now(), "mtime": bson::DateTime::now(),
        })
        .await
        .unwrap();
    }
    let ids = store.create_tasks(q.id, vec![doc! {}; 20]).await.unwrap();
    let claims = (0..12).map(|_| {
        let (store, q) = (store.clone(), q.clone());
        tokio::spawn(async move {
            let mut got = Vec::new();
            for _ in 0..12 {
                match store.claim_to_run(&q, "n1").await {
                    Ok(Some(task)) => got.push(task.id),
                    Ok(None) => break,
                    // A task whose id is not an ObjectId cannot be run: its claim says so.
                    Err(e) => assert!(e.to_string().contains("_id"), "{e}"),
                }
            }
            got
        })
    });
    let mut got: Vec<_> = futures::future::join_all(claims)
        .await
        .into_iter()
        .flat_map(|g| g.unwrap())
        .collect();
    got.sort();
    let mut once = got.clone();
    once.dedup();
    assert_eq!(once, got, "no task handed out twice");
    assert_eq!(got, ids, "every task claimed, each once");
    for id in &ids {
        let d = stored(&t, *id).await;
        assert_eq!(
            (d.get_str("node"), d.get_i32("status")),
            (Ok("n1"), Ok(status::CLAIMED)),
            "{d}"
        );
    }
    println!(
        "{} find, {} findAndModify, {} update, {} bulkWrite",
        commands.get("find"),
        commands.get("findAndModify"),
        commands.get("update"),
        commands.get("bulkWrite")
    );
}
