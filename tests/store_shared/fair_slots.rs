//! A fair share of a queue's slots: a node that finds them all held asks the node holding
//! the most for one, which gives it up at its next renewal, reserved for the asker.

use super::*;

on_both_stores!(
    an_asked_slot_goes_to_the_asker_only,
    a_fair_share_is_not_asked_for,
    an_unanswered_ask_and_an_untaken_reservation_end,
    a_den_that_joins_a_busy_queue_gets_its_share,
    an_ask_moves_along_the_donors_slots_and_waits_while_over_the_limit,
);

/// Renews each of `slots` for `node`; answers what each renewal found.
async fn renew_all(s: &dyn Store, slots: &[disbatch::store::Slot], node: &str) -> Vec<SlotRenewal> {
    let mut found = Vec::new();
    for slot in slots {
        found.push(s.renew_slot(slot, node, LEASE).await.unwrap());
    }
    found
}

async fn an_asked_slot_goes_to_the_asker_only(s: Stores) {
    let q = queue(&*s.a, "fair", 3, Sort::Fifo).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(s.a.acquire_slot(&q, "busy", LEASE).await.unwrap().expect("a free slot"));
    }
    assert!(
        s.b.acquire_slot(&q, "late", LEASE).await.unwrap().is_none(),
        "all three held"
    );
    assert_eq!(
        s.b.want_slot(&q, "late", LEASE).await.unwrap().as_deref(),
        Some("busy"),
        "asked from the node holding them all"
    );
    assert_eq!(
        s.b.want_slot(&q, "late", LEASE).await.unwrap().as_deref(),
        Some("busy"),
        "asking again renews the same ask"
    );
    let found = renew_all(&*s.a, &held, "busy").await;
    let yielded = SlotRenewal::Yielded { to: "late".into() };
    assert_eq!(
        found.iter().filter(|f| **f == yielded).count(),
        1,
        "exactly one slot given up: {found:?}"
    );
    assert_eq!(
        found.iter().filter(|f| **f == SlotRenewal::Held).count(),
        2,
        "{found:?}"
    );
    // The given-up slot is reserved for the asker: neither its old holder nor a third node
    // takes it.
    assert!(s.a.acquire_slot(&q, "busy", LEASE).await.unwrap().is_none());
    assert!(s.a.acquire_slot(&q, "third", LEASE).await.unwrap().is_none());
    let taken =
        s.b.acquire_slot(&q, "late", LEASE)
            .await
            .unwrap()
            .expect("the reserved slot");
    let given = held[found.iter().position(|f| *f == yielded).unwrap()].clone();
    assert_eq!((taken.queue, taken.n), (given.queue, given.n), "the slot given up");
    assert_eq!(s.b.renew_slot(&taken, "late", LEASE).await.unwrap(), SlotRenewal::Held);
    // Released, it is an ordinary free slot again.
    s.b.release_slot(&taken, "late").await.unwrap();
    assert!(s.a.acquire_slot(&q, "third", LEASE).await.unwrap().is_some());
}

async fn a_fair_share_is_not_asked_for(s: Stores) {
    let q = queue(&*s.a, "shared", 3, Sort::Fifo).await;
    let held = [
        s.a.acquire_slot(&q, "one", LEASE).await.unwrap().expect("slot"),
        s.a.acquire_slot(&q, "one", LEASE).await.unwrap().expect("slot"),
        s.b.acquire_slot(&q, "two", LEASE).await.unwrap().expect("slot"),
    ];
    // Two against one: moving a slot would only swap who has more.
    assert_eq!(s.b.want_slot(&q, "two", LEASE).await.unwrap(), None);
    assert_eq!(
        renew_all(&*s.a, &held[..2], "one").await,
        vec![SlotRenewal::Held; 2],
        "nothing was asked"
    );
    // A queue with one slot keeps it where it is.
    let single = queue(&*s.a, "single", 1, Sort::Fifo).await;
    s.a.acquire_slot(&single, "one", LEASE).await.unwrap().expect("slot");
    assert_eq!(s.b.want_slot(&single, "two", LEASE).await.unwrap(), None);
}

async fn an_ask_moves_along_the_donors_slots_and_waits_while_over_the_limit(s: Stores) {
    let q = queue(&*s.a, "moving", 3, Sort::Fifo).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(s.a.acquire_slot(&q, "busy", LEASE).await.unwrap().expect("a free slot"));
    }
    // Asked twice: the ask moved (a slot busy with a long task does not hold the asker up),
    // and only one is live, so one slot is given up.
    for _ in 0..2 {
        assert_eq!(s.b.want_slot(&q, "late", LEASE).await.unwrap().as_deref(), Some("busy"));
    }
    let found = renew_all(&*s.a, &held, "busy").await;
    let yielded: Vec<usize> = (0..3).filter(|i| found[*i] != SlotRenewal::Held).collect();
    assert_eq!(yielded.len(), 1, "one live ask: {found:?}");
    assert_ne!(
        held[yielded[0]].n, 0,
        "the second ask moved off the first slot: {found:?}"
    );
    // The asker takes it; an ask it left behind does not follow the slot to its new holder.
    let taken =
        s.b.acquire_slot(&q, "late", LEASE)
            .await
            .unwrap()
            .expect("the reserved slot");
    assert_eq!(s.b.renew_slot(&taken, "late", LEASE).await.unwrap(), SlotRenewal::Held);
    // The queue's limit is lowered below what is held: no ask, since a slot given up now
    // could not be taken by anyone.
    let lowered = set_threads(&*s.a, &q, 1).await;
    assert_eq!(s.b.want_slot(&lowered, "third", LEASE).await.unwrap(), None);
}

async fn an_unanswered_ask_and_an_untaken_reservation_end(s: Stores) {
    let short = Duration::from_millis(100);
    let q = queue(&*s.a, "ends", 2, Sort::Fifo).await;
    let held = [
        s.a.acquire_slot(&q, "busy", LEASE).await.unwrap().expect("slot"),
        s.a.acquire_slot(&q, "busy", LEASE).await.unwrap().expect("slot"),
    ];
    assert_eq!(s.b.want_slot(&q, "gone", short).await.unwrap().as_deref(), Some("busy"));
    // The asker went away; once its ask has ended the holder keeps both slots.
    tokio::time::sleep(short * 3).await;
    assert_eq!(renew_all(&*s.a, &held, "busy").await, vec![SlotRenewal::Held; 2]);
    // Asked again, given up, but never taken: once the reservation ends anyone may take it.
    assert_eq!(s.b.want_slot(&q, "gone", short).await.unwrap().as_deref(), Some("busy"));
    let found = renew_all(&*s.a, &held, "busy").await;
    assert!(found.contains(&SlotRenewal::Yielded { to: "gone".into() }), "{found:?}");
    assert!(
        s.a.acquire_slot(&q, "third", LEASE).await.unwrap().is_none(),
        "reserved"
    );
    tokio::time::sleep(short * 3).await;
    assert!(
        s.a.acquire_slot(&q, "third", LEASE).await.unwrap().is_some(),
        "a reservation nobody took ends"
    );
}

/// A DEN started while another one keeps every slot of a queue busy gets half of them,
/// and the queue's `threads` holds throughout.
async fn a_den_that_joins_a_busy_queue_gets_its_share(s: Stores) {
    let q = queue(&*s.a, "joined", 4, Sort::Fifo).await;
    // Tasks long enough that four at once are seen running on a loaded machine too.
    s.a.create_tasks(q.id, vec![doc! {"sleep_ms": 200}; 1000])
        .await
        .unwrap();
    let busy = |node: Option<&str>| TaskFilter {
        queue: Some(q.id),
        node: node.map(|n| Some(n.to_string())),
        status: Some(vec![status::CLAIMED, status::RUNNING]),
        ..Default::default()
    };
    let first = RunningDen::start(s.b.clone(), settings("first"));
    wait_for(
        Duration::from_secs(60),
        "the first DEN to run all four slots",
        || async { s.a.count_tasks(&busy(Some("first"))).await.unwrap() == 4 },
    )
    .await;
    let late = RunningDen::start(s.b.clone(), settings("late"));
    let (mut most_late, mut most_total) = (0, 0);
    let start = std::time::Instant::now();
    while most_late < 2 {
        assert!(
            unfinished(&*s.a, q.id).await > 0,
            "the queue drained before the late DEN ran two of its tasks at once (at most {most_late})"
        );
        assert!(start.elapsed() < Duration::from_secs(120), "no share after 2 minutes");
        most_late = most_late.max(s.a.count_tasks(&busy(Some("late"))).await.unwrap());
        most_total = most_total.max(s.a.count_tasks(&busy(None)).await.unwrap());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.stop().await;
    late.stop().await;
    assert!(most_total <= 4, "threads 4 held: {most_total} at once");
}
