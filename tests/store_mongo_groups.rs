//! Grouped task changes on MongoDB: the fenced updates of calls made at the same moment go
//! in shared `bulkWrite` commands (a group of one update as an `updateOne`), each call keeps its own answer, and an update the server
//! refuses (a result too large for its document) fails its own call alone. Claims made at
//! the same moment go in groups too, beside a Disbatch 4 DEN's own `findOneAndUpdate`
//! claims, and every task is claimed once.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use bson::{doc, Document};
use disbatch::model::status;
use disbatch::model::Sort;
use disbatch::store::mongo::MongoStore;
use disbatch::store::testing::StoreExt;
use disbatch::store::{NewQueue, OutputValue, Store, TaskChange, TaskFence, Write};
use mongodb::event::command::CommandEvent;
use mongodb::event::EventHandler;
use mongodb::options::ClientOptions;
use mongodb::Client;

/// The commands a client sent, by name.
#[derive(Clone, Default)]
pub(crate) struct Commands(Arc<Mutex<HashMap<String, usize>>>);

impl Commands {
    pub(crate) fn get(&self, name: &str) -> usize {
        self.0.lock().unwrap().get(name).copied().unwrap_or(0)
    }
}

/// A store on `t`'s database through a client of its own that counts the commands sent by
/// name.
pub(crate) async fn counted_store(t: &common::TestDb) -> (MongoStore, Commands) {
    let commands = Commands::default();
    let mut options = ClientOptions::parse(&t.uri).await.unwrap();
    options.command_event_handler = Some(EventHandler::callback({
        let commands = commands.clone();
        move |e: CommandEvent| {
            if let CommandEvent::Started(s) = e {
                *commands.0.lock().unwrap().entry(s.command_name).or_default() += 1;
            }
        }
    }));
    let client = Client::with_options(options).unwrap();
    (MongoStore::from_database(client.database(&t.name)), commands)
}

pub(crate) fn finish(stdout: String) -> TaskChange {
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
    let (store, commands) = counted_store(&t).await;
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
    let (bulk, updates) = (commands.get("bulkWrite"), commands.get("update"));
    // A group of one update goes as an `updateOne`; larger groups as one `bulkWrite`.
    assert!(bulk >= 1, "calls made at once were grouped");
    assert!(
        bulk + updates < n,
        "{n} calls at once went in fewer commands ({bulk} + {updates})"
    );
}

/// A `fifo` queue of `demo` with `threads` 16.
pub(crate) async fn fifo_queue(store: &MongoStore, name: &str) -> disbatch::model::Queue {
    store
        .create_queue(NewQueue {
            name: name.into(),
            plugin: "demo".into(),
            threads: Some(16),
            sort: Sort::Fifo,
            extra: Document::new(),
        })
        .await
        .unwrap()
}

/// Claims as a Disbatch 4 DEN makes them: one `findOneAndUpdate` each, on a client of its
/// own, until the queue is empty. Returns the ids claimed.
async fn disbatch4_claimer(db: mongodb::Database, queue: bson::oid::ObjectId, node: &str) -> Vec<bson::oid::ObjectId> {
    let tasks = db.collection::<Document>("tasks");
    let mut got = Vec::new();
    loop {
        let claimed = tasks
            .find_one_and_update(
                doc! { "queue": queue, "status": -2, "$or": [{ "node": null }, { "node": -1 }] },
                doc! { "$set": { "node": node, "status": -1, "mtime": bson::DateTime::now() } },
            )
            .sort(doc! { "_id": 1 })
            .await
            .unwrap();
        match claimed {
            Some(d) => got.push(d.get_object_id("_id").unwrap()),
            None => return got,
        }
        tokio::task::yield_now().await;
    }
}

/// [`disbatch4_claimer`] of node "perl" on `queue`, on a task of its own.
pub(crate) async fn spawn_disbatch4_claimer(
    t: &common::TestDb,
    queue: bson::oid::ObjectId,
) -> tokio::task::JoinHandle<Vec<bson::oid::ObjectId>> {
    let client = Client::with_uri_str(&t.uri).await.unwrap();
    tokio::spawn(disbatch4_claimer(client.database(&t.name), queue, "perl"))
}

/// The tasks `ids` were each claimed once, `ours` by node "ours" and `perl` by "perl", and
/// the database shows each claimed by whoever was told it got it (ours in one of
/// `our_statuses`, perl's claimed).
pub(crate) async fn each_claimed_once(
    t: &common::TestDb,
    ids: &[bson::oid::ObjectId],
    ours: &[bson::oid::ObjectId],
    perl: &[bson::oid::ObjectId],
    our_statuses: &[i32],
) {
    let (o, p): (HashSet<_>, HashSet<_>) = (ours.iter().collect(), perl.iter().collect());
    assert_eq!(o.len(), ours.len(), "we never claim a task twice");
    assert_eq!(p.len(), perl.len(), "the Disbatch 4 claimer never claims a task twice");
    assert!(o.is_disjoint(&p), "no task claimed by both");
    assert_eq!(o.len() + p.len(), ids.len(), "every task claimed");
    let tasks = t.db.collection::<Document>("tasks");
    for id in ids {
        let d = tasks.find_one(doc! { "_id": id }).await.unwrap().unwrap();
        let (node, statuses) = if o.contains(id) {
            ("ours", our_statuses)
        } else {
            ("perl", &[-1][..])
        };
        assert_eq!(d.get_str("node").ok(), Some(node), "{d}");
        assert!(statuses.contains(&d.get_i32("status").unwrap()), "{d}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grouped_claims_beside_a_disbatch4_claimer_claim_every_task_once() {
    let t = common::test_db("grouped_claims").await;
    let (store, commands) = counted_store(&t).await;
    let q = fifo_queue(&store, "mixed").await;
    let n = 600;
    let ids = store.create_tasks(q.id, vec![doc! {}; n]).await.unwrap();
    let perl = spawn_disbatch4_claimer(&t, q.id).await;
    let ours = (0..16).map(|_| {
        let (store, q) = (store.clone(), q.clone());
        tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                let until = bson::DateTime::from_millis(bson::DateTime::now().timestamp_millis() + 60_000);
                match store.claim_before(&q, "ours", until).await.unwrap() {
                    Some(task) => {
                        assert_eq!(task.node.as_deref(), Some("ours"));
                        // Claimed to run: started too when claimed in a group.
                        assert!(
                            [status::CLAIMED, status::RUNNING].contains(&task.status),
                            "{}",
                            task.status
                        );
                        got.push(task.id);
                    }
                    None => return got,
                }
            }
        })
    });
    let ours: Vec<_> = futures::future::join_all(ours)
        .await
        .into_iter()
        .flat_map(|g| g.unwrap())
        .collect();
    let perl = perl.await.unwrap();
    println!("ours claimed {}, the Disbatch 4 claimer {}", ours.len(), perl.len());
    // Claimed to run: started too when claimed in a group.
    each_claimed_once(&t, &ids, &ours, &perl, &[-1, 0]).await;
    assert!(!perl.is_empty(), "the Disbatch 4 claimer claimed beside us");
    // Claims made at once went together: fewer commands than claims.
    let (singles, reads, bulk) = (
        commands.get("findAndModify"),
        commands.get("find"),
        commands.get("bulkWrite"),
    );
    println!(
        "{} claims: {singles} findAndModify, {reads} find, {bulk} bulkWrite",
        ours.len()
    );
    assert!(bulk >= 1, "claims made at once were grouped");
    assert!(singles + reads + bulk < ours.len(), "fewer commands than claims");
}

/// A queue of 40 tasks on a counted store that uses what it reads ahead for ten minutes,
/// and the tasks claimed on node "a" until a round of grouped claims read the queue ahead:
/// the first of the queue, one of them started.
struct ReadAhead {
    t: common::TestDb,
    store: MongoStore,
    commands: Commands,
    q: disbatch::model::Queue,
    ids: Vec<bson::oid::ObjectId>,
    running: bson::oid::ObjectId,
    claimed: usize,
}

async fn read_ahead(hint: &str) -> ReadAhead {
    let t = common::test_db(hint).await;
    let (store, commands) = counted_store(&t).await;
    let store = store.read_ahead_for(std::time::Duration::from_secs(600));
    let q = fifo_queue(&store, "ahead").await;
    let ids = store.create_tasks(q.id, vec![doc! {}; 40]).await.unwrap();
    let mut got = Vec::new();
    while commands.get("find") == 0 {
        assert!(got.len() < 24, "no round of claims was grouped");
        let batch = futures::future::join_all((0..4).map(|_| store.claim_to_run(&q, "a"))).await;
        got.extend(batch.into_iter().map(|c| c.unwrap().expect("a task").id));
    }
    let mut sorted = got.clone();
    sorted.sort();
    assert_eq!(sorted, ids[..got.len()], "the claims took the queue's first tasks");
    assert!(disbatch::lifecycle::run::start(&store, got[0], "a").await.unwrap());
    ReadAhead {
        t,
        store,
        commands,
        q,
        ids,
        running: got[0],
        claimed: got.len(),
    }
}

type Claimed = Option<Result<Option<disbatch::model::Task>, disbatch::store::StoreError>>;

impl ReadAhead {
    /// Ends the running task's run with the claim of the queue's next task before `until`.
    async fn end(&self, until: bson::DateTime) -> (bool, Claimed) {
        let outputs = (OutputValue::Inline("out".into()), OutputValue::Inline(String::new()));
        let extra = disbatch::lifecycle::run::FinishExtra::default();
        disbatch::lifecycle::run::finish_and_claim(&self.store, self.running, "a", 1, outputs, &extra, (&self.q, until))
            .await
            .unwrap()
    }

    async fn task(&self, id: bson::oid::ObjectId) -> (Option<String>, i32) {
        let d = self
            .t
            .db
            .collection::<Document>("tasks")
            .find_one(doc! { "_id": id })
            .await
            .unwrap()
            .unwrap();
        (d.get_str("node").ok().map(str::to_owned), d.get_i32("status").unwrap())
    }

    fn counts(&self) -> [usize; 4] {
        ["find", "findAndModify", "bulkWrite", "update"].map(|c| self.commands.get(c))
    }
}

fn in_a_minute() -> bson::DateTime {
    bson::DateTime::from_millis(bson::DateTime::now().timestamp_millis() + 60_000)
}

fn claimed_id(claimed: Claimed) -> bson::oid::ObjectId {
    claimed.expect("a claim made").unwrap().expect("a task claimed").id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_claims_its_next_task_in_the_bulk_write_that_ends_its_run() {
    let r = read_ahead("ahead_end").await;
    let before = r.counts();
    let (ended, claimed) = r.end(in_a_minute()).await;
    let [find, fam, bulk, update] = r.counts().map(|c| c as i64);
    let delta = [find, fam, bulk, update]
        .iter()
        .zip(before)
        .map(|(a, b)| a - b as i64)
        .collect::<Vec<_>>();
    assert!(ended);
    let next = claimed_id(claimed);
    assert_eq!(next, r.ids[r.claimed], "the queue's next task");
    assert_eq!(
        delta,
        [0, 0, 1, 0],
        "one bulkWrite (find, findAndModify, bulkWrite, update)"
    );
    assert_eq!(r.task(r.running).await, (Some("a".into()), 1), "the run ended");
    assert_eq!(r.task(next).await, (Some("a".into()), status::CLAIMED), "claimed by a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_task_read_ahead_that_another_claimer_took_is_claimed_once() {
    let r = read_ahead("ahead_taken").await;
    let perl =
        r.t.db
            .collection::<Document>("tasks")
            .find_one_and_update(
                doc! { "queue": r.q.id, "status": -2, "node": null },
                doc! { "$set": { "node": "perl", "status": -1, "mtime": bson::DateTime::now() } },
            )
            .sort(doc! { "_id": 1 })
            .await
            .unwrap()
            .unwrap()
            .get_object_id("_id")
            .unwrap();
    assert_eq!(perl, r.ids[r.claimed], "the Disbatch 4 claimer took the next task");
    let (ended, claimed) = r.end(in_a_minute()).await;
    assert!(ended);
    let next = claimed_id(claimed);
    assert_eq!(next, r.ids[r.claimed + 1], "the one after it");
    assert_eq!(r.task(perl).await, (Some("perl".into()), status::CLAIMED));
    assert_eq!(r.task(next).await, (Some("a".into()), status::CLAIMED));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_task_claimed_beside_an_end_that_did_not_hold_is_the_workers() {
    let r = read_ahead("ahead_unended").await;
    // Recovered meanwhile: back in its queue, so this node's end does not land.
    r.t.db
        .collection::<Document>("tasks")
        .update_one(
            doc! { "_id": r.running },
            doc! { "$set": { "node": null, "status": -2, "mtime": bson::DateTime::now() } },
        )
        .await
        .unwrap();
    let (ended, claimed) = r.end(in_a_minute()).await;
    assert!(!ended, "the end of a recovered task does not land");
    let next = claimed_id(claimed);
    assert_eq!(next, r.ids[r.claimed]);
    assert_eq!(r.task(next).await, (Some("a".into()), status::CLAIMED));
    assert_eq!(r.task(r.running).await, (None, status::QUEUED), "the recovered task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_read_ahead_past_its_deadline_claims_nothing() {
    let r = read_ahead("ahead_late").await;
    let past = bson::DateTime::from_millis(bson::DateTime::now().timestamp_millis() - 1_000);
    let (ended, claimed) = r.end(past).await;
    assert!(ended, "the end lands");
    assert!(matches!(claimed, Some(Ok(None))), "{claimed:?}");
    assert_eq!(r.task(r.ids[r.claimed]).await, (None, status::QUEUED), "still queued");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_task_read_ahead_then_waited_for_is_claimed_knowing_it() {
    let r = read_ahead("ahead_waited").await;
    let next = r.ids[r.claimed];
    // Another request submits a task after it: marked, its `mtime` left as it was.
    r.t.db
        .collection::<Document>("tasks")
        .update_one(doc! { "_id": next }, doc! { "$set": { "dependents": true } })
        .await
        .unwrap();
    let (ended, claimed) = r.end(in_a_minute()).await;
    assert!(ended);
    let task = claimed.expect("a claim made").unwrap().expect("a task claimed");
    assert_eq!(task.id, next);
    assert!(task.dependents, "its worker knows to release what waits for it");
}
