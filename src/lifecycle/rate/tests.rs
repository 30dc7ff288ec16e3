use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;

use super::*;

/// The injected clock's origin (a grant row never granted reads as the epoch).
const BASE: i64 = 1_700_000_000_000;

/// `ms` after [`BASE`].
fn at(ms: i64) -> DateTime {
    DateTime::from_millis(BASE + ms)
}

/// Grant rows in memory, with the store's compare-and-set.
#[derive(Default)]
struct Rows(Mutex<Vec<RateRow>>);

#[async_trait]
impl RateStore for Rows {
    async fn rates(&self, _queue: ObjectId) -> StoreResult<Vec<RateRow>> {
        let mut rows = self.0.lock().unwrap().clone();
        rows.sort_by_key(|r| r.n);
        Ok(rows)
    }
    async fn ensure_rates(&self, _queue: ObjectId, max: i64) -> StoreResult<()> {
        let mut rows = self.0.lock().unwrap();
        for n in 0..max {
            if !rows.iter().any(|r| r.n == n) {
                rows.push(RateRow::never(n));
            }
        }
        Ok(())
    }
    async fn change_rate(&self, _queue: ObjectId, n: i64, from: &RateRow, to: &RateRow) -> StoreResult<bool> {
        let mut rows = self.0.lock().unwrap();
        match rows
            .iter_mut()
            .find(|r| r.n == n && r.at == from.at && r.node == from.node)
        {
            Some(r) => {
                r.at = to.at;
                r.node = to.node.clone();
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

fn rate(max: i64, per_ms: u64) -> Rate {
    Rate {
        max,
        per: Duration::from_millis(per_ms),
    }
}

/// Takes grants every `step` ms from 0 to `until` ms, as many as granted at each time;
/// answers the grant times.
async fn take_all(store: &Rows, q: ObjectId, r: &Rate, step: i64, until: i64) -> Vec<i64> {
    let mut granted = Vec::new();
    let mut now = 0;
    while now <= until {
        while let Take::Granted(g) = take(store, q, r, "n", at(now)).await.unwrap() {
            granted.push(g.at.timestamp_millis() - BASE);
        }
        now += step;
    }
    granted
}

#[tokio::test]
async fn at_most_max_grants_in_any_window() {
    let store = Rows::default();
    let q = ObjectId::new();
    let r = rate(5, 1_000);
    let granted = take_all(&store, q, &r, 7, 10_000).await;
    assert!(granted.len() >= 50, "{}", granted.len());
    for w in granted.windows(6) {
        assert!(w[5] - w[0] >= 1_000, "6 grants within a window: {w:?}");
    }
}

#[tokio::test]
async fn a_full_window_waits_for_its_first_row() {
    let store = Rows::default();
    let q = ObjectId::new();
    let r = rate(2, 1_000);
    assert!(matches!(
        take(&store, q, &r, "a", at(100)).await.unwrap(),
        Take::Granted(_)
    ));
    assert!(matches!(
        take(&store, q, &r, "b", at(300)).await.unwrap(),
        Take::Granted(_)
    ));
    assert_eq!(
        take(&store, q, &r, "a", at(500)).await.unwrap(),
        Take::WaitUntil(at(1_100))
    );
    assert!(matches!(
        take(&store, q, &r, "a", at(1_100)).await.unwrap(),
        Take::Granted(_)
    ));
    assert_eq!(used(&store.0.lock().unwrap(), &r, at(1_100)), 2);
    assert_eq!(used(&store.0.lock().unwrap(), &r, at(2_300)), 0);
}

#[tokio::test]
async fn a_grant_given_back_is_free_again() {
    let store = Rows::default();
    let q = ObjectId::new();
    let r = rate(1, 1_000);
    let Take::Granted(g) = take(&store, q, &r, "a", at(5_000)).await.unwrap() else {
        panic!("not granted")
    };
    assert!(give_back(&store, &g, "a").await.unwrap());
    assert!(matches!(
        take(&store, q, &r, "b", at(5_001)).await.unwrap(),
        Take::Granted(_)
    ));
    // Given back only while the row still holds it.
    assert!(!give_back(&store, &g, "a").await.unwrap());
    assert_eq!(
        take(&store, q, &r, "a", at(5_002)).await.unwrap(),
        Take::WaitUntil(at(6_001))
    );
}

#[tokio::test]
async fn rows_above_a_lowered_max_are_not_granted() {
    let store = Rows::default();
    let q = ObjectId::new();
    assert_eq!(take_all(&store, q, &rate(4, 1_000), 1, 0).await.len(), 4);
    // Lowered to 1: one row, granted at 0, frees at 1000.
    let one = rate(1, 1_000);
    assert_eq!(
        take(&store, q, &one, "a", at(10)).await.unwrap(),
        Take::WaitUntil(at(1_000))
    );
    assert_eq!(take_all(&store, q, &one, 100, 2_900).await, vec![1_000, 2_000]);
    // A max of 0 (a `rate` that cannot be read) grants nothing.
    assert_eq!(
        take(&store, q, &rate(0, 1_000), "a", at(9_000)).await.unwrap(),
        Take::WaitUntil(DateTime::MAX)
    );
}

#[tokio::test]
async fn grants_made_before_max_was_lowered_count_in_their_window() {
    let store = Rows::default();
    let q = ObjectId::new();
    // Rows 0 and 1 granted at 0, rows 2 and 3 at 500.
    let four = rate(4, 1_000);
    for ms in [0, 0, 500, 500] {
        assert!(matches!(
            take(&store, q, &four, "a", at(ms)).await.unwrap(),
            Take::Granted(_)
        ));
    }
    // Lowered to 2 at 1,000: rows 0 and 1 are free, but rows 2 and 3 fill the window
    // until 1,500.
    let two = rate(2, 1_000);
    assert_eq!(
        take(&store, q, &two, "a", at(1_000)).await.unwrap(),
        Take::WaitUntil(at(1_500))
    );
    for ms in [1_500, 1_500] {
        assert!(matches!(
            take(&store, q, &two, "a", at(ms)).await.unwrap(),
            Take::Granted(_)
        ));
    }
    assert_eq!(
        take(&store, q, &two, "a", at(1_600)).await.unwrap(),
        Take::WaitUntil(at(2_500))
    );
}

#[tokio::test]
async fn rows_deleted_by_hand_are_created_again() {
    let store = Rows::default();
    let q = ObjectId::new();
    let r = rate(2, 1_000);
    assert!(matches!(
        take(&store, q, &r, "a", at(0)).await.unwrap(),
        Take::Granted(_)
    ));
    store.0.lock().unwrap().clear();
    assert!(matches!(
        take(&store, q, &r, "a", at(10)).await.unwrap(),
        Take::Granted(_)
    ));
    assert_eq!(store.0.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn a_window_below_a_millisecond_is_never_free_at_once() {
    let store = Rows::default();
    let q = ObjectId::new();
    let r = Rate {
        max: 1,
        per: Duration::from_micros(1_500),
    };
    assert!(matches!(
        take(&store, q, &r, "a", at(0)).await.unwrap(),
        Take::Granted(_)
    ));
    // 1.5 ms rounds up to 2: nothing more at 0 or 1 ms.
    for ms in [0, 1] {
        assert_eq!(
            take(&store, q, &r, "a", at(ms)).await.unwrap(),
            Take::WaitUntil(at(2)),
            "at {ms} ms"
        );
    }
}

#[test]
fn free_rows_go_least_recently_granted_first() {
    let r = rate(3, 1_000);
    let row = |n, t| RateRow {
        n,
        at: at(t),
        node: None,
    };
    let rows = [row(0, 500), row(1, 100), row(2, 1_900), row(3, 0)];
    let free: Vec<i64> = free_rows(&rows, &r, at(2_000)).iter().map(|r| r.n).collect();
    assert_eq!(free, vec![1, 0]);
    assert_eq!(next_free(&rows, &r), at(1_100));
    assert_eq!(
        next_free(&rows[..2], &r),
        DateTime::from_millis(0),
        "a missing row is free"
    );
}
