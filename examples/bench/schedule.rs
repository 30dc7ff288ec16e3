//! The `schedule` scenario: what queueing due scheduled tasks costs per pass, with no task
//! scheduled and with 10,000 scheduled for later, and how late a due task is queued by a
//! running DEN's pass.

use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, DateTime};
use disbatch::model::status;
use disbatch::store::mongo::MongoStore;
use disbatch::store::{NewTask, Store};

use super::{median, Bench};

/// Median duration of `promote_due` (one pass), over `rounds` calls.
async fn pass(store: &MongoStore, rounds: usize) -> f64 {
    let mut took = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        disbatch::lifecycle::run::promote_due(store, DateTime::now())
            .await
            .unwrap();
        took.push(start.elapsed().as_secs_f64() * 1e6);
    }
    median(took)
}

impl Bench {
    pub(super) async fn schedule(&self) {
        let db = self.db("schedule").await;
        let store = MongoStore::from_database(db.clone());
        let queue = self.queue(&db, 0).await;
        let rounds = if self.quick { 50 } else { 200 };
        let empty = pass(&store, rounds).await;
        let later = DateTime::from_millis(DateTime::now().timestamp_millis() + 3_600_000);
        let waiting: Vec<NewTask> = (0..10_000)
            .map(|_| NewTask {
                run_at: Some(later),
                ..NewTask::queued(ObjectId::new(), doc! {})
            })
            .collect();
        for batch in waiting.chunks(1000) {
            store.insert_tasks(queue, batch.to_vec()).await.unwrap();
        }
        let loaded = pass(&store, rounds).await;
        // One task due in 300 ms among the 10,000: how long after its time a pass every
        // 200 ms (a DEN's) has queued it.
        let due_at = DateTime::from_millis(DateTime::now().timestamp_millis() + 300);
        let id = ObjectId::new();
        store
            .insert_tasks(
                queue,
                vec![NewTask {
                    run_at: Some(due_at),
                    ..NewTask::queued(id, doc! {})
                }],
            )
            .await
            .unwrap();
        let queued_late = loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            disbatch::lifecycle::run::promote_due(&store, DateTime::now())
                .await
                .unwrap();
            let t = store.task(id).await.unwrap().unwrap();
            if t.status == status::QUEUED {
                break (t.mtime.timestamp_millis() - due_at.timestamp_millis()) as f64;
            }
        };
        db.drop().await.ok();
        println!("\n## schedule: queueing due scheduled tasks (one pass = one update over {{status, run_at}})");
        println!("| case | µs per pass (median of {rounds}) |\n|---|---|");
        println!("| no task scheduled | {empty:.0} |");
        println!("| 10,000 tasks scheduled for later | {loaded:.0} |");
        println!("| ratio (target ≈ 1: no per-task work) | {:.2} |", loaded / empty);
        println!("| a due task queued after its time, passes every 200 ms | {queued_late:.0} ms |");
        println!(
            "RESULT schedule empty_us={empty:.0} scheduled_10k_us={loaded:.0} ratio={:.2} due_late_ms={queued_late:.0}",
            loaded / empty
        );
    }
}
