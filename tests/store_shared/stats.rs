//! The per-minute counters on both stores: increments from several nodes add up, depth
//! samples replace each other, reads keep to their minutes, the retention deletes old
//! minutes; the live counts of active tasks; and a real DEN's counts equal the tasks it ran,
//! while as the leader it samples the depth and deletes minutes past its retention.

use disbatch::stats::{bucket_of, minute_of, Counters, End};

use super::*;

on_both_stores!(
    counters_add_up_across_nodes_and_old_minutes_are_deleted,
    active_counts_are_the_full_counts_of_active_statuses,
    a_den_counts_the_runs_it_ends,
);

fn counted(ok: u64, failed: u64, seconds: f64) -> Counters {
    let mut c = Counters::default();
    for _ in 0..ok {
        c.observe(End::Succeeded, seconds);
    }
    for _ in 0..failed {
        c.observe(End::Failed, seconds * 10.0);
    }
    c
}

async fn counters_add_up_across_nodes_and_old_minutes_are_deleted(s: Stores) {
    let q1 = queue(&*s.a, "one", 1, Sort::Fifo).await.id;
    let q2 = queue(&*s.a, "two", 1, Sort::Fifo).await.id;
    let now = minute_of(DateTime::now());
    s.a.add_stats(
        "node-a",
        &[(now, q1, counted(2, 1, 0.004)), (now - 1, q2, counted(1, 0, 2.0))],
    )
    .await
    .unwrap();
    // The same row again from another process, and another node's row.
    s.b.add_stats("node-a", &[(now, q1, counted(3, 0, 0.004))])
        .await
        .unwrap();
    s.b.add_stats("node-b", &[(now, q1, counted(0, 4, 0.1))]).await.unwrap();
    s.a.record_depth(now, &[(q1, 7), (q2, 0)]).await.unwrap();
    s.b.record_depth(now, &[(q1, 5)]).await.unwrap();
    s.a.add_stats("node-a", &[(now - 100, q1, counted(9, 9, 1.0))])
        .await
        .unwrap();

    let mut rows = s.b.read_stats(now - 10, now + 1, None).await.unwrap();
    rows.sort_by(|x, y| (x.minute, x.queue, &x.node).cmp(&(y.minute, y.queue, &y.node)));
    let keys: Vec<_> = rows
        .iter()
        .map(|r| (r.minute - now, r.queue, r.node.as_str()))
        .collect();
    let mut want = vec![
        (-1, q2, "node-a"),
        (0, q1, ""),
        (0, q1, "node-a"),
        (0, q1, "node-b"),
        (0, q2, ""),
    ];
    want.sort();
    let mut got = keys.clone();
    got.sort();
    assert_eq!(
        got, want,
        "one row per (minute, queue, node); minute -100 is out of range"
    );
    let row = |m: i64, q, n: &str| {
        rows.iter()
            .find(|r| r.minute == now + m && r.queue == q && r.node == n)
            .unwrap()
    };
    let a = &row(0, q1, "node-a").counters;
    assert_eq!((a.succeeded, a.failed, a.retried), (5, 1, 0));
    assert_eq!(a.buckets.get(&bucket_of(0.004)), Some(&5));
    assert_eq!(a.buckets.get(&bucket_of(0.04)), Some(&1));
    assert!((a.seconds - (5.0 * 0.004 + 0.04)).abs() < 1e-9, "seconds {}", a.seconds);
    assert_eq!(row(0, q1, "node-b").counters.failed, 4);
    assert_eq!(row(0, q1, "").depth, Some(5), "the later sample replaces the earlier");
    assert_eq!(row(0, q2, "").depth, Some(0));
    assert_eq!(row(-1, q2, "node-a").depth, None);
    assert_eq!(row(-1, q2, "node-a").counters.buckets.get(&bucket_of(2.0)), Some(&1));

    // Only one queue's rows, when asked.
    let only_q2 = s.b.read_stats(now - 10, now + 1, Some(q2)).await.unwrap();
    let mut got: Vec<_> = only_q2
        .iter()
        .map(|r| (r.minute - now, r.queue, r.node.as_str()))
        .collect();
    got.sort();
    assert_eq!(got, vec![(-1, q2, "node-a"), (0, q2, "")]);

    // The retention: minutes before the cut are deleted, the rest stay.
    assert_eq!(s.a.prune_stats(now - 50).await.unwrap(), 1);
    assert!(s.b.read_stats(now - 1000, now - 50, None).await.unwrap().is_empty());
    assert_eq!(s.b.read_stats(now - 10, now + 1, None).await.unwrap().len(), 5);
    assert_eq!(s.a.prune_stats(now - 50).await.unwrap(), 0);
}

async fn active_counts_are_the_full_counts_of_active_statuses(s: Stores) {
    let q1 = queue(&*s.a, "active-1", 8, Sort::Fifo).await;
    let q2 = queue(&*s.a, "active-2", 8, Sort::Fifo).await;
    s.a.create_tasks(q1.id, vec![doc! {}; 6]).await.unwrap();
    s.a.create_tasks(q2.id, vec![doc! {}; 1]).await.unwrap();
    s.a.claim(&q1, "n").await.unwrap().unwrap();
    claim_run(&*s.a, &q1, "n").await;
    for code in [1, 2] {
        let id = claim_run(&*s.a, &q1, "n").await;
        let empty = || OutputValue::Inline(String::new());
        assert!(disbatch::lifecycle::run::finish(&*s.a, id, "n", code, empty(), empty())
            .await
            .unwrap());
    }
    let full = s.b.queue_counts().await.unwrap();
    let active = s.b.active_counts().await.unwrap();
    let only_active: std::collections::BTreeMap<_, Vec<(i32, u64)>> = full
        .iter()
        .map(|(q, c)| {
            let kept = c
                .iter()
                .filter(|(code, _)| disbatch::store::ACTIVE_STATUSES.contains(code))
                .map(|(code, n)| (*code, *n))
                .collect();
            (*q, kept)
        })
        .collect();
    let active: std::collections::BTreeMap<_, Vec<(i32, u64)>> = active
        .iter()
        .map(|(q, c)| (*q, c.iter().map(|(code, n)| (*code, *n)).collect()))
        .collect();
    assert_eq!(active, only_active);
    assert_eq!(active[&q1.id], vec![(-2, 2), (-1, 1), (0, 1)]);
    assert_eq!(active[&q2.id], vec![(-2, 1)]);
}

async fn a_den_counts_the_runs_it_ends(s: Stores) {
    let q = queue(&*s.a, "counted", 4, Sort::Fifo).await;
    let mut params = vec![doc! { "message": "ok" }; 5];
    params.push(doc! { "status": 2 });
    params.push(doc! { "status": 3 });
    s.a.create_tasks(q.id, params).await.unwrap();
    // A minute past the retention (10 minutes) and past an hour, which the leader
    // deletes, and one past the retention but within the hour, which it keeps (a leader's
    // clock may run ahead of the others').
    let old = minute_of(DateTime::now()) - 90;
    let recent = minute_of(DateTime::now()) - 30;
    s.a.add_stats("gone", &[(old, q.id, counted(1, 0, 0.1))]).await.unwrap();
    s.a.add_stats("kept", &[(recent, q.id, counted(1, 0, 0.1))])
        .await
        .unwrap();
    let mut keep_ten_minutes = settings("node-c");
    keep_ten_minutes.stats_retention = Duration::from_secs(600);
    let den = RunningDen::start(s.b.clone(), keep_ten_minutes);
    wait_for(Duration::from_secs(60), "the runs counted", || async {
        let rows = s.a.read_stats(0, i64::MAX, None).await.unwrap();
        let mut all = Counters::default();
        for r in rows.iter().filter(|r| r.node == "node-c") {
            all.merge(&r.counters);
        }
        all.runs() == 7
    })
    .await;
    // The leader sampled the queue's depth.
    wait_for(Duration::from_secs(30), "a depth sample", || async {
        let rows = s.a.read_stats(0, i64::MAX, None).await.unwrap();
        rows.iter()
            .any(|r| r.node.is_empty() && r.queue == q.id && r.depth.is_some())
    })
    .await;
    wait_for(
        Duration::from_secs(30),
        "the minute past the retention deleted",
        || async { s.a.read_stats(old, old + 1, None).await.unwrap().is_empty() },
    )
    .await;
    assert_eq!(
        s.a.read_stats(recent, recent + 1, None).await.unwrap().len(),
        1,
        "a minute within the hour is kept"
    );
    den.stop().await;
    let rows = s.a.read_stats(0, i64::MAX, None).await.unwrap();
    let mut all = Counters::default();
    for r in rows.iter().filter(|r| r.node == "node-c") {
        assert_eq!(r.queue, q.id);
        all.merge(&r.counters);
    }
    assert_eq!((all.succeeded, all.failed, all.retried), (5, 2, 0));
    assert_eq!(all.buckets.values().sum::<u64>(), 7, "every run in a duration bucket");
    assert!(all.seconds > 0.0);
}
