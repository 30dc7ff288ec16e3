use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::Semaphore;

use super::{Group, Turn};

/// The calls of each round, in order.
type Rounds = Arc<Mutex<Vec<Vec<u32>>>>;

/// A group whose rounds record their calls, wait for a permit of `gate` each, and answer
/// each call with itself times ten.
fn recording(gate: Arc<Semaphore>) -> (Group<u32, u32>, Rounds) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let rounds = seen.clone();
    let group = Group::new(100, Duration::ZERO, move |calls: Vec<u32>| {
        let rounds = rounds.clone();
        let gate = gate.clone();
        async move {
            gate.acquire().await.unwrap().forget();
            rounds.lock().unwrap().push(calls.clone());
            calls.into_iter().map(|c| Turn::Done(c * 10)).collect()
        }
        .boxed()
    });
    (group, seen)
}

#[tokio::test]
async fn a_lone_call_goes_at_once_and_gets_its_answer() {
    let (group, seen) = recording(Arc::new(Semaphore::new(100)));
    assert_eq!(group.call(4).await, Some(40));
    assert_eq!(*seen.lock().unwrap(), vec![vec![4]]);
}

#[tokio::test]
async fn calls_made_while_a_round_runs_go_together_in_the_next() {
    let gate = Arc::new(Semaphore::new(0));
    let (group, seen) = recording(gate.clone());
    let first = tokio::spawn({
        let group = group.clone();
        async move { group.call(1).await }
    });
    // The first round has taken call 1 and waits at the gate.
    while snapshot(&group) != (0, true) {
        tokio::task::yield_now().await;
    }
    let rest: Vec<_> = (2..=5)
        .map(|c| {
            let group = group.clone();
            tokio::spawn(async move { group.call(c).await })
        })
        .collect();
    while snapshot(&group).0 < 4 {
        tokio::task::yield_now().await;
    }
    gate.add_permits(2);
    assert_eq!(first.await.unwrap(), Some(10));
    for (c, h) in (2..=5).zip(rest) {
        assert_eq!(h.await.unwrap(), Some(c * 10));
    }
    assert_eq!(*seen.lock().unwrap(), vec![vec![1], vec![2, 3, 4, 5]]);
}

#[tokio::test]
async fn a_call_the_round_did_not_make_goes_again_in_order() {
    let rounds = Arc::new(AtomicUsize::new(0));
    let counted = rounds.clone();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let recorded = seen.clone();
    // The first round makes its first call and leaves the rest; later rounds make all.
    let group = Group::new(100, Duration::ZERO, move |calls: Vec<u32>| {
        let first_round = counted.fetch_add(1, Ordering::SeqCst) == 0;
        recorded.lock().unwrap().push(calls.clone());
        async move {
            calls
                .into_iter()
                .enumerate()
                .map(|(i, c)| {
                    if first_round && i > 0 {
                        Turn::Again(c)
                    } else {
                        Turn::Done(c)
                    }
                })
                .collect()
        }
        .boxed()
    });
    // Queue three calls before any round runs, by holding the group busy.
    group.inner.state().running = true;
    let handles: Vec<_> = (1..=3)
        .map(|c| {
            let group = group.clone();
            tokio::spawn(async move { group.call(c).await })
        })
        .collect();
    while snapshot(&group).0 < 3 {
        tokio::task::yield_now().await;
    }
    tokio::spawn(super::rounds(
        group.inner.clone(),
        super::Idle(Some(group.inner.clone())),
    ));
    let answers: Vec<_> = futures::future::join_all(handles).await;
    let answers: Vec<_> = answers.into_iter().map(Result::unwrap).collect();
    assert_eq!(answers, vec![Some(1), Some(2), Some(3)]);
    assert_eq!(rounds.load(Ordering::SeqCst), 2, "calls 2 and 3 went again, together");
    assert_eq!(*seen.lock().unwrap(), vec![vec![1, 2, 3], vec![2, 3]]);
    assert!(!snapshot(&group).1);
}

#[tokio::test]
async fn a_round_that_panics_answers_its_calls_with_nothing_and_the_group_goes_on() {
    let group = Group::new(100, Duration::ZERO, move |calls: Vec<u32>| {
        async move {
            assert!(calls[0] != 13, "unlucky");
            calls.into_iter().map(Turn::Done).collect()
        }
        .boxed()
    });
    assert_eq!(group.call(13).await, None);
    assert_eq!(group.call(7).await, Some(7));
}

#[tokio::test]
async fn a_caller_that_stops_waiting_strands_no_one() {
    let gate = Arc::new(Semaphore::new(0));
    let (group, _) = recording(gate.clone());
    let dropped = tokio::spawn({
        let group = group.clone();
        async move { group.call(1).await }
    });
    while snapshot(&group) != (0, true) {
        tokio::task::yield_now().await;
    }
    let kept = tokio::spawn({
        let group = group.clone();
        async move { group.call(2).await }
    });
    while snapshot(&group).0 == 0 {
        tokio::task::yield_now().await;
    }
    dropped.abort();
    gate.add_permits(2);
    assert_eq!(kept.await.unwrap(), Some(20));
}

#[test]
fn a_runtime_that_shuts_down_mid_round_leaves_the_group_usable() {
    let gate = Arc::new(Semaphore::new(0));
    let (group, _) = recording(gate.clone());
    {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let (g, watched) = (group.clone(), group.clone());
        rt.block_on(async move {
            tokio::spawn(async move { g.call(1).await });
            while snapshot(&watched) != (0, true) {
                tokio::task::yield_now().await;
            }
        });
    }
    assert!(!snapshot(&group).1, "the round ended with its runtime");
    gate.add_permits(1);
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert_eq!(rt.block_on(group.call(3)), Some(30));
}

/// How many calls wait, and whether a round runs.
fn snapshot(group: &Group<u32, u32>) -> (usize, bool) {
    let s = group.inner.state();
    (s.waiting.len(), s.running)
}

#[test]
fn a_round_dropped_before_it_ran_leaves_the_group_usable() {
    let (group, _) = recording(Arc::new(Semaphore::new(10)));
    {
        // A runtime that shuts down right after the call spawned its round: the round's
        // task is dropped whether or not it ever ran.
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let g = group.clone();
        rt.block_on(async move {
            let call = tokio::spawn(async move { g.call(1).await });
            tokio::task::yield_now().await;
            drop(call);
        });
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let answer = rt.block_on(async { tokio::time::timeout(std::time::Duration::from_secs(30), group.call(2)).await });
    assert_eq!(answer.expect("the group answers again"), Some(20));
}

#[tokio::test(start_paused = true)]
async fn a_window_gathers_the_calls_made_within_it_and_delays_a_lone_call_by_it_at_most() {
    let seen: Rounds = Arc::new(Mutex::new(Vec::new()));
    let rounds = seen.clone();
    let window = Duration::from_millis(50);
    let group = Group::new(3, window, move |calls: Vec<u32>| {
        rounds.lock().unwrap().push(calls.clone());
        async move { calls.into_iter().map(|c| Turn::Done(c * 10)).collect() }.boxed()
    });
    // A lone call waits the window, no more.
    let began = tokio::time::Instant::now();
    assert_eq!(group.call(1).await, Some(10));
    assert_eq!(began.elapsed(), window);
    // Calls made within the window go in the same round.
    let later = |g: Group<u32, u32>, c: u32, after: u64| async move {
        tokio::time::sleep(Duration::from_millis(after)).await;
        g.call(c).await
    };
    let began = tokio::time::Instant::now();
    let (a, b) = tokio::join!(later(group.clone(), 2, 0), later(group.clone(), 3, 20));
    assert_eq!((a, b), (Some(20), Some(30)));
    assert_eq!(began.elapsed(), window);
    // A full round does not wait.
    let began = tokio::time::Instant::now();
    let all = futures::future::join_all((4..7).map(|c| group.call(c))).await;
    assert_eq!(all, vec![Some(40), Some(50), Some(60)]);
    assert!(began.elapsed() < window, "{:?}", began.elapsed());
    assert_eq!(*seen.lock().unwrap(), vec![vec![1], vec![2, 3], vec![4, 5, 6]]);
}
