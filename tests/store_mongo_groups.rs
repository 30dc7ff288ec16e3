//! Grouped task changes on MongoDB: the fenced updates of calls made at the same moment go
//! in shared `bulkWrite` commands (a group of one update as an `updateOne`), each call keeps its own answer, and an update the server
//! refuses (a result too large for its document) fails its own call alone.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bson::{doc, Document};
use disbatch::model::status;
use disbatch::store::mongo::MongoStore;
use disbatch::store::{OutputValue, Store, TaskChange, TaskFence, Write};
use mongodb::event::command::CommandEvent;
use mongodb::event::EventHandler;
use mongodb::options::ClientOptions;
use mongodb::Client;

/// A store on `t`'s database through a client of its own that counts the commands sent by
/// name.
async fn counted_store(t: &common::TestDb) -> (MongoStore, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let (bulk, updates) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut options = ClientOptions::parse(&t.uri).await.unwrap();
    options.command_event_handler = Some(EventHandler::callback({
        let (bulk, updates) = (bulk.clone(), updates.clone());
        move |e: CommandEvent| {
            if let CommandEvent::Started(s) = e {
                match s.command_name.as_str() {
                    "bulkWrite" => bulk.fetch_add(1, Ordering::SeqCst),
                    "update" => updates.fetch_add(1, Ordering::SeqCst),
                    _ => 0,
                };
            }
        }
    }));
    let client = Client::with_options(options).unwrap();
    (MongoStore::from_database(client.database(&t.name)), bulk, updates)
}

fn finish(stdout: String) -> TaskChange {
    TaskChange {
        status: Some(status::SUCCEEDED),
        stdout: Write::Set(OutputValue::Inline(stdout)),
        touch: true,
        ..TaskChange::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_result_fails_its_own_task_alone_among_grouped_ones() {
    let t = common::test_db("grouped_refusal").await;
    let (store, bulk, updates) = counted_store(&t).await;
    let queue = bson::oid::ObjectId::new();
    // 60 running tasks; one already carries 9 MB in its params, so 9 MB more of output
    // makes its document larger than the server takes.
    let n = 60;
    let mut docs: Vec<Document> = (0..n)
        .map(|i| {
            doc! {
                "_id": bson::oid::ObjectId::new(), "queue": queue, "status": status::RUNNING,
                "node": "n1", "params": { "i": i as i64 }, "ctime": bson::DateTime::now(),
                "mtime": bson::DateTime::now(), "stdout": null, "stderr": null,
            }
        })
        .collect();
    let victim = 17;
    docs[victim].insert("params", doc! { "blob": "p".repeat(9 << 20) });
    let ids: Vec<_> = docs.iter().map(|d| d.get_object_id("_id").unwrap()).collect();
    t.db.collection::<Document>("tasks").insert_many(docs).await.unwrap();

    let running = TaskFence::statuses(&[status::RUNNING]);
    let calls = ids.iter().enumerate().map(|(i, &id)| {
        let store = store.clone();
        let out = if i == victim {
            "o".repeat(9 << 20)
        } else {
            format!("done {i}")
        };
        let entry = [(id, running.clone(), finish(out))];
        tokio::spawn(async move { store.change_tasks(&entry).await })
    });
    let answers = futures::future::join_all(calls).await;

    for (i, (answer, &id)) in answers.into_iter().zip(&ids).enumerate() {
        let answer = answer.unwrap();
        let stored = t.store.task(id).await.unwrap().unwrap();
        if i == victim {
            let e = answer.expect_err("a document over 16 MB is refused");
            assert!(!e.is_transient(), "a refusal says retrying cannot help: {e}");
            assert_eq!(stored.status, status::RUNNING, "the refused result wrote nothing");
        } else {
            assert_eq!(answer.unwrap(), vec![true], "task {i} gets its own answer");
            assert_eq!(stored.status, status::SUCCEEDED, "task {i} in the database");
        }
    }
    let (bulk, updates) = (bulk.load(Ordering::SeqCst), updates.load(Ordering::SeqCst));
    // A group of one update goes as an `updateOne`; larger groups as one `bulkWrite`.
    assert!(bulk >= 1, "calls made at once were grouped");
    assert!(
        bulk + updates < n,
        "{n} calls at once went in fewer commands ({bulk} + {updates})"
    );
}
