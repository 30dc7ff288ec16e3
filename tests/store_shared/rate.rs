//! Queue rate limits (`lifecycle::rate`): grants taken by compare-and-set on the grant rows,
//! each row at most once per window, so no window of `per` holds more than `max` starts,
//! as the database's `started` values show.

use disbatch::lifecycle::rate::{self, Take};
use disbatch::lifecycle::run;

use super::*;

on_both_stores!(
    concurrent_claimers_start_at_most_max_in_any_window,
    a_grant_given_back_leaves_the_window_and_a_task_waits_queued,
    lowering_and_raising_max_take_effect,
);

/// A queue `name` with `rate: {max, per}` and room for many tasks at once.
async fn rated_queue(s: &dyn Store, name: &str, max: i64, per: &str) -> Queue {
    let q = NewQueue {
        extra: doc! { "rate": { "max": max, "per": per } },
        ..new_queue(name, Some(50), Sort::Fifo)
    };
    let q = s.create_queue(q).await.unwrap();
    assert_eq!(q.rate.map(|r| r.max), Some(max));
    q
}

/// The queue as stored now.
async fn reread(s: &dyn Store, q: &Queue) -> Queue {
    s.queue(q.id).await.unwrap().expect("the queue")
}

/// The `started` of every task of `queue` in the database, in order.
async fn starts(s: &dyn Store, queue: ObjectId) -> Vec<i64> {
    let filter = TaskFilter {
        queue: Some(queue),
        ..Default::default()
    };
    let page = Page {
        skip: 0,
        limit: 10_000,
        oldest_first: true,
    };
    let mut starts: Vec<i64> = s
        .find_tasks(&filter, page)
        .await
        .unwrap()
        .iter()
        .filter_map(|t| t.started.map(|d| d.timestamp_millis()))
        .collect();
    starts.sort_unstable();
    starts
}

/// Panics when a window of `per_ms` (half-open) holds more than `max` of the sorted `starts`.
fn assert_windows(starts: &[i64], max: usize, per_ms: i64) {
    for w in starts.windows(max + 1) {
        assert!(w[max] - w[0] >= per_ms, "{} starts within {per_ms} ms: {w:?}", max + 1);
    }
}

/// One claimer as a DEN claims a rate-limited queue: a grant, then the claim, then the
/// start under the grant (a grant that claimed nothing is given back); waits while no
/// grant is free. Runs until `until`; answers how many it started.
async fn claimer(store: Arc<dyn Store>, q: Queue, node: String, until: std::time::Instant) -> usize {
    let rate = q.rate.expect("a rate");
    let mut started = 0;
    while std::time::Instant::now() < until {
        match rate::take(&*store, q.id, &rate, &node, DateTime::now()).await.unwrap() {
            Take::WaitUntil(at) => {
                let wait = (at.timestamp_millis() - DateTime::now().timestamp_millis()).clamp(1, 200);
                tokio::time::sleep(Duration::from_millis(wait as u64)).await;
            }
            Take::Granted(g) => match store.claim(&q, &node).await.unwrap() {
                None => {
                    assert!(rate::give_back(&*store, &g, &node).await.unwrap());
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Some(t) => {
                    assert_eq!(t.status, status::CLAIMED);
                    assert!(run::start_at(&*store, t.id, &node, g.at).await.unwrap());
                    let out = || OutputValue::Inline(String::new());
                    assert!(run::finish(&*store, t.id, &node, 1, out(), out()).await.unwrap());
                    started += 1;
                }
            },
        }
    }
    started
}

async fn concurrent_claimers_start_at_most_max_in_any_window(s: Stores) {
    let q = rated_queue(&*s.a, "rated", 5, "1s").await;
    s.a.create_tasks(q.id, vec![doc! {}; 200]).await.unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(3);
    let mut claimers = Vec::new();
    for c in 0..8 {
        let store = if c % 2 == 0 { s.a.clone() } else { s.b.clone() };
        claimers.push(tokio::spawn(claimer(store, q.clone(), format!("node-{c}"), until)));
    }
    let mut total = 0;
    for c in claimers {
        total += c.await.unwrap();
    }
    let starts = starts(&*s.b, q.id).await;
    assert_eq!(starts.len(), total, "every start recorded in the database");
    assert!(total >= 10, "progress: {total} started");
    assert!(total <= 5 * 4, "at most 5 a second over about 3 s: {total}");
    assert_windows(&starts, 5, 1_000);
    // The rest wait queued; none failed.
    let queued =
        s.b.count_tasks(&TaskFilter {
            queue: Some(q.id),
            status: Some(vec![status::QUEUED]),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(queued as usize, 200 - total);
}

async fn a_grant_given_back_leaves_the_window_and_a_task_waits_queued(s: Stores) {
    let q = rated_queue(&*s.a, "hourly", 1, "1h").await;
    let rate = q.rate.unwrap();
    // An empty queue: the grant claims nothing and goes back.
    let Take::Granted(g) = rate::take(&*s.a, q.id, &rate, "a", DateTime::now()).await.unwrap() else {
        panic!("the first grant")
    };
    assert_eq!(s.a.claim(&q, "a").await.unwrap(), None);
    assert!(rate::give_back(&*s.a, &g, "a").await.unwrap());
    assert_eq!(rate::in_use(&*s.b, q.id, &rate).await.unwrap(), 0);
    // So the next task starts at once, under a grant from the other store.
    let ids = s.a.create_tasks(q.id, vec![doc! {}; 2]).await.unwrap();
    let Take::Granted(g) = rate::take(&*s.b, q.id, &rate, "b", DateTime::now()).await.unwrap() else {
        panic!("a grant given back is free again")
    };
    let t = s.b.claim(&q, "b").await.unwrap().expect("a task");
    assert!(run::start_at(&*s.b, t.id, "b", g.at).await.unwrap());
    let t = task(&*s.a, t.id).await;
    assert_eq!((t.status, t.started), (status::RUNNING, Some(g.at)));
    assert_eq!(rate::in_use(&*s.a, q.id, &rate).await.unwrap(), 1);
    // The other waits: no grant before the window ends, and it stays queued.
    match rate::take(&*s.a, q.id, &rate, "a", DateTime::now()).await.unwrap() {
        Take::WaitUntil(at) => assert_eq!(at.timestamp_millis(), g.at.timestamp_millis() + 3_600_000),
        other => panic!("granted twice in the window: {other:?}"),
    }
    let other = ids.iter().find(|id| **id != t.id).unwrap();
    let waiting = task(&*s.a, *other).await;
    assert_eq!(
        (waiting.status, waiting.node, waiting.started),
        (status::QUEUED, None, None)
    );
    // A grant is given back only while the row still holds it.
    assert!(!rate::give_back(&*s.a, &g, "a").await.unwrap());
}

async fn lowering_and_raising_max_take_effect(s: Stores) {
    let q = rated_queue(&*s.a, "lowered", 3, "1h").await;
    let take = |s: Arc<dyn Store>, q: Queue| async move {
        rate::take(&*s, q.id, &q.rate.unwrap(), "n", DateTime::now())
            .await
            .unwrap()
    };
    for _ in 0..3 {
        assert!(matches!(take(s.a.clone(), q.clone()).await, Take::Granted(_)));
    }
    assert!(matches!(take(s.b.clone(), q.clone()).await, Take::WaitUntil(_)));
    let set_rate = |max: i64| QueueUpdate {
        extra: doc! { "rate": { "max": max, "per": "1h" } },
        ..Default::default()
    };
    // Lowered to 1: the one row left was granted in the window.
    s.a.update_queue(q.id, set_rate(1)).await.unwrap();
    let lowered = reread(&*s.b, &q).await;
    assert_eq!(lowered.rate.unwrap().max, 1);
    assert!(matches!(take(s.b.clone(), lowered.clone()).await, Take::WaitUntil(_)));
    assert_eq!(rate::in_use(&*s.b, q.id, &lowered.rate.unwrap()).await.unwrap(), 1);
    // Raised to 5: the two new rows are granted, no more.
    s.a.update_queue(q.id, set_rate(5)).await.unwrap();
    let raised = reread(&*s.b, &q).await;
    for _ in 0..2 {
        assert!(matches!(take(s.b.clone(), raised.clone()).await, Take::Granted(_)));
    }
    assert!(matches!(take(s.a.clone(), raised.clone()).await, Take::WaitUntil(_)));
    assert_eq!(rate::in_use(&*s.a, q.id, &raised.rate.unwrap()).await.unwrap(), 5);
    // Removed: the queue has no rate.
    let none = QueueUpdate {
        extra: doc! { "rate": Bson::Null },
        ..Default::default()
    };
    s.a.update_queue(q.id, none).await.unwrap();
    assert_eq!(reread(&*s.b, &q).await.rate, None);
}
