//! Claims of a queue being drained read it ahead on MongoDB: a lone claim of a queue its
//! node claimed from within as long as tasks read ahead are used reads the queue's next
//! tasks and claims the first by a fenced update, and the claims that follow take the rest
//! with no read of their own, in the queue's order; a lone claim after a pause, of a queue
//! fed a task at a time, or with reading ahead off (`read_ahead` 0), is the spec's
//! `findOneAndUpdate`.

use crate::common;
use crate::store_mongo_groups::{counted_store, each_claimed_once, fifo_queue, spawn_disbatch4_claimer};

use std::time::Duration;

use bson::doc;
use disbatch::store::testing::StoreExt;
use disbatch::store::Store;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lone_claims_of_a_queue_being_drained_read_it_ahead_in_its_order() {
    let t = common::test_db("ahead_lone").await;
    let (store, commands) = counted_store(&t).await;
    // Tasks read ahead used for ten minutes (and the queue counted as being drained as
    // long), so that a loaded machine's pauses change nothing.
    let store = store.read_ahead_for(Duration::from_secs(600));
    let q = fifo_queue(&store, "ahead").await;
    let ids = store.create_tasks(q.id, vec![doc! {}; 40]).await.unwrap();
    let mut got = Vec::new();
    for _ in 0..12 {
        got.push(store.claim_to_run(&q, "a").await.unwrap().expect("a task").id);
    }
    assert_eq!(got, ids[..12], "the queue's first tasks, in its order, each once");
    let (fam, find) = (commands.get("findAndModify"), commands.get("find"));
    assert_eq!(fam, 1, "a fresh store's first claim is the spec's findOneAndUpdate");
    assert_eq!(
        find, 1,
        "the second reads the queue ahead, the others take what it read"
    );
    let claimed =
        t.db.collection::<bson::Document>("tasks")
            .count_documents(doc! { "node": "a", "status": -1 })
            .await
            .unwrap();
    assert_eq!(claimed, 12, "in the database's view, 12 tasks claimed by a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_reading_ahead_off_each_lone_claim_is_the_specs_find_one_and_update() {
    let t = common::test_db("ahead_off").await;
    let (store, commands) = counted_store(&t).await;
    let store = store.read_ahead_for(Duration::ZERO);
    let q = fifo_queue(&store, "ahead").await;
    let ids = store.create_tasks(q.id, vec![doc! {}; 6]).await.unwrap();
    let mut got = Vec::new();
    for _ in 0..5 {
        got.push(store.claim_to_run(&q, "a").await.unwrap().expect("a task").id);
    }
    assert_eq!(got, ids[..5]);
    assert_eq!(commands.get("findAndModify"), 5);
    assert_eq!(commands.get("find"), 0, "no read of the queue");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lone_claimer_reading_ahead_beside_a_disbatch4_claimer_claims_every_task_once() {
    let t = common::test_db("ahead_perl").await;
    let (store, commands) = counted_store(&t).await;
    let q = fifo_queue(&store, "ahead").await;
    let n = 300;
    let ids = store.create_tasks(q.id, vec![doc! {}; n]).await.unwrap();
    let perl = spawn_disbatch4_claimer(&t, q.id).await;
    // One worker of ours, one claim after another: lone claims of a queue being drained.
    let mut ours = Vec::new();
    while let Some(task) = store.claim_to_run(&q, "ours").await.unwrap() {
        assert_eq!(task.node.as_deref(), Some("ours"));
        ours.push(task.id);
    }
    let perl = perl.await.unwrap();
    each_claimed_once(&t, &ids, &ours, &perl, &[-1]).await;
    assert!(
        !perl.is_empty() && !ours.is_empty(),
        "both claimed: {} ours, {} perl",
        ours.len(),
        perl.len()
    );
    assert!(commands.get("find") >= 1, "ours read the queue ahead");
    // A task read ahead and lost to the other claimer holds lone claims off reading ahead
    // for a second: each would read the tasks the other takes next, and lose them too.
    let sent: usize = ["find", "findAndModify", "update", "bulkWrite"]
        .iter()
        .map(|c| commands.get(c))
        .sum();
    assert!(
        sent <= 2 * ours.len(),
        "{sent} commands for {} claims beside the Disbatch 4 claimer",
        ours.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queue_fed_a_task_at_a_time_is_claimed_with_find_one_and_update() {
    let t = common::test_db("ahead_trickle").await;
    let (store, commands) = counted_store(&t).await;
    let q = fifo_queue(&store, "ahead").await;
    for i in 0..6 {
        let id = store.create_tasks(q.id, vec![doc! { "i": i }]).await.unwrap()[0];
        let task = store
            .claim_to_run(&q, "a")
            .await
            .unwrap()
            .expect("the task just queued");
        assert_eq!(task.id, id);
    }
    let (fam, find) = (commands.get("findAndModify"), commands.get("find"));
    // The second claim reads the queue and finds only its own task: the claims after it,
    // for a second, are the spec's. (A pause of over a second between two claims, on a
    // machine loaded past reason, may add one more read.)
    assert!(find <= 2 && fam >= 4, "{fam} findAndModify, {find} find for 6 claims");
}

/// Claims two tasks of a fifo queue of ten one after the other on `store`, queues a task of
/// a higher priority, and returns it with the task the next claim got.
async fn urgent_between_claims(
    store: &disbatch::store::mongo::MongoStore,
) -> (bson::oid::ObjectId, bson::oid::ObjectId) {
    let q = fifo_queue(store, "order").await;
    store.create_tasks(q.id, vec![doc! {}; 10]).await.unwrap();
    for _ in 0..2 {
        store.claim_to_run(&q, "a").await.unwrap().expect("a task");
    }
    let mut urgent = disbatch::store::NewTask::queued(bson::oid::ObjectId::new(), doc! {});
    urgent.priority = 10;
    let id = urgent.id;
    store.insert_tasks(q.id, vec![urgent]).await.unwrap();
    let next = store.claim_to_run(&q, "a").await.unwrap().expect("a task");
    (id, next.id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_read_ahead_zero_in_the_options_a_task_queued_first_in_order_is_claimed_next() {
    let t = common::test_db("ahead_strict").await;
    let options = disbatch::store::mongo::MongoOptions {
        read_ahead: Some(Duration::ZERO),
        ..Default::default()
    };
    let store = disbatch::store::mongo::MongoStore::connect(&t.uri, &t.name, options)
        .await
        .unwrap();
    let (urgent, next) = urgent_between_claims(&store).await;
    assert_eq!(next, urgent, "claims in the queue's order at every moment");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reading_ahead_may_claim_the_tasks_read_before_one_queued_first_in_order() {
    let t = common::test_db("ahead_order").await;
    let store =
        disbatch::store::mongo::MongoStore::from_database(t.db.clone()).read_ahead_for(Duration::from_secs(600));
    let (urgent, next) = urgent_between_claims(&store).await;
    assert_ne!(next, urgent, "the cost of reading ahead (docs/guarantees.md)");
}
