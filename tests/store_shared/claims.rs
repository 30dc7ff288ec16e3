//! The DEN's claims: `claim_to_run` (claimed, and on the embedded store started in the
//! same write) and `renew_and_claim` (a worker's next claim with the slot it holds).

use super::*;

on_both_stores!(
    claims_to_run_go_to_exactly_one_claimer_and_finish,
    renew_and_claim_claims_only_with_a_slot_still_held,
    a_worker_renews_its_slot_once_a_tick_and_yields_it_at_the_renewal,
    a_claim_past_its_deadline_claims_nothing,
    claims_made_at_once_take_the_queue_in_order_each_once,
);

async fn claims_to_run_go_to_exactly_one_claimer_and_finish(s: Stores) {
    let q = queue(&*s.a, "to-run", 8, Sort::Fifo).await;
    let ids = s.a.create_tasks(q.id, vec![doc! {}; 120]).await.unwrap();
    let mut claimers = Vec::new();
    for c in 0..6 {
        let store = if c % 2 == 0 { s.a.clone() } else { s.b.clone() };
        let q = q.clone();
        claimers.push(tokio::spawn(async move {
            let node = format!("node-{c}");
            let mut got = Vec::new();
            while let Some(t) = store.claim_to_run(&q, &node).await.unwrap() {
                assert_eq!(t.node.as_deref(), Some(node.as_str()));
                assert!(
                    [status::CLAIMED, status::RUNNING].contains(&t.status),
                    "claimed or running, got {}",
                    t.status
                );
                if t.status == status::CLAIMED {
                    assert!(disbatch::lifecycle::run::start(&*store, t.id, &node).await.unwrap());
                }
                let done = OutputValue::Inline(format!("{}", t.id));
                let empty = OutputValue::Inline(String::new());
                assert!(
                    disbatch::lifecycle::run::finish(&*store, t.id, &node, 1, done, empty)
                        .await
                        .unwrap(),
                    "{}",
                    t.id
                );
                got.push(t.id);
            }
            got
        }));
    }
    let mut all = Vec::new();
    for c in claimers {
        all.extend(c.await.unwrap());
    }
    let unique: HashSet<_> = all.iter().collect();
    assert_eq!(unique.len(), all.len(), "no task claimed twice");
    assert_eq!(unique, ids.iter().collect::<HashSet<_>>(), "every task claimed");
    for id in ids {
        let t = task(&*s.b, id).await;
        assert_eq!(t.status, 1, "{id}");
        assert_eq!(s.b.read_output(&t.stdout.unwrap()).await.unwrap(), id.to_string());
    }
}

async fn renew_and_claim_claims_only_with_a_slot_still_held(s: Stores) {
    let q = queue(&*s.a, "renew-claim", 1, Sort::Fifo).await;
    let ids = s.a.create_tasks(q.id, vec![doc! {}; 2]).await.unwrap();
    let slot = disbatch::lifecycle::slots::acquire_slot(&*s.a, &q, "a", LEASE)
        .await
        .unwrap()
        .expect("slot");
    let (renewal, claimed) = disbatch::lifecycle::slots::renew_and_claim(&*s.a, &slot, &q, "a", LEASE)
        .await
        .unwrap();
    assert_eq!(renewal, SlotRenewal::Held);
    let first = claimed.expect("a task with the slot held");
    assert_eq!((first.id, first.node.as_deref()), (ids[0], Some("a")));
    // Another node holds the slot now (given back, taken): no renewal, no claim.
    disbatch::lifecycle::slots::release_slot(&*s.a, &slot, "a")
        .await
        .unwrap();
    let theirs = disbatch::lifecycle::slots::acquire_slot(&*s.b, &q, "b", LEASE)
        .await
        .unwrap()
        .expect("slot");
    assert_eq!(theirs.n, slot.n);
    let (renewal, claimed) = disbatch::lifecycle::slots::renew_and_claim(&*s.a, &slot, &q, "a", LEASE)
        .await
        .unwrap();
    assert_eq!(renewal, SlotRenewal::Lost);
    assert!(claimed.is_none(), "no claim without the slot");
    let second = task(&*s.b, ids[1]).await;
    assert_eq!((second.status, second.node), (status::QUEUED, None));
    // The holder claims the next task; then the queue is empty.
    let (renewal, claimed) = disbatch::lifecycle::slots::renew_and_claim(&*s.b, &theirs, &q, "b", LEASE)
        .await
        .unwrap();
    assert_eq!(renewal, SlotRenewal::Held);
    assert_eq!(claimed.expect("the second task").id, ids[1]);
    let (renewal, claimed) = disbatch::lifecycle::slots::renew_and_claim(&*s.b, &theirs, &q, "b", LEASE)
        .await
        .unwrap();
    assert_eq!((renewal, claimed.is_none()), (SlotRenewal::Held, true));
}

/// The lease end of `q`'s slot `n`.
async fn slot_expires(s: &dyn Store, q: &Queue, n: i64) -> DateTime {
    s.slots(q.id)
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.n == n)
        .unwrap()
        .expires
}

async fn a_worker_renews_its_slot_once_a_tick_and_yields_it_at_the_renewal(s: Stores) {
    use disbatch::lifecycle::slots::{acquire_slot, claim_next, want_slot};
    let q = queue(&*s.a, "once-a-tick", 2, Sort::Fifo).await;
    let ids = s.a.create_tasks(q.id, vec![doc! {}; 6]).await.unwrap();
    let slots = [
        acquire_slot(&*s.a, &q, "a", LEASE).await.unwrap().expect("slot"),
        acquire_slot(&*s.a, &q, "a", LEASE)
            .await
            .unwrap()
            .expect("another slot"),
    ];
    let long_tick = (LEASE, Duration::from_secs(3600));
    let mut renewed = [None, None];
    // The first claim with each slot renews it; the next, within the tick, claims on
    // that renewal.
    for (slot, renewed) in slots.iter().zip(&mut renewed) {
        let (renewal, first) = claim_next(&*s.a, slot, &q, "a", long_tick, renewed).await.unwrap();
        assert_eq!((renewal, first.is_some()), (SlotRenewal::Held, true));
        assert!(renewed.is_some(), "a renewal that kept the slot is kept");
    }
    let expires = slot_expires(&*s.b, &q, slots[0].n).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let (renewal, next) = claim_next(&*s.a, &slots[0], &q, "a", long_tick, &mut renewed[0])
        .await
        .unwrap();
    assert_eq!((renewal, next.map(|t| t.id)), (SlotRenewal::Held, Some(ids[2])));
    assert_eq!(
        slot_expires(&*s.b, &q, slots[0].n).await,
        expires,
        "no slot write within the tick"
    );
    // Another node asks for a slot: its holder sees the ask at its next renewal, a tick on,
    // and claims on its last renewal until then.
    assert_eq!(
        want_slot(&*s.b, &q, "b", Duration::from_secs(60))
            .await
            .unwrap()
            .as_deref(),
        Some("a")
    );
    let rows = s.b.slots(q.id).await.unwrap();
    let asked = rows
        .iter()
        .position(|r| r.want.as_deref() == Some("b"))
        .expect("one slot asked for");
    let i = slots.iter().position(|slot| slot.n == rows[asked].n).unwrap();
    let (renewal, next) = claim_next(&*s.a, &slots[i], &q, "a", long_tick, &mut renewed[i])
        .await
        .unwrap();
    assert_eq!((renewal, next.map(|t| t.id)), (SlotRenewal::Held, Some(ids[3])));
    let tick_over = (LEASE, Duration::ZERO);
    let (renewal, none) = claim_next(&*s.a, &slots[i], &q, "a", tick_over, &mut renewed[i])
        .await
        .unwrap();
    assert_eq!(renewal, SlotRenewal::Yielded { to: "b".into() });
    assert!(none.is_none() && renewed[i].is_none(), "no claim, no renewal kept");
    let left = task(&*s.b, ids[4]).await;
    assert_eq!((left.status, left.node), (status::QUEUED, None), "left for the asker");
}

async fn a_claim_past_its_deadline_claims_nothing(s: Stores) {
    let q = queue(&*s.a, "deadline", 1, Sort::Fifo).await;
    let ids = s.a.create_tasks(q.id, vec![doc! {}]).await.unwrap();
    let past = DateTime::from_millis(DateTime::now().timestamp_millis() - 1_000);
    assert!(
        s.a.claim_before(&q, "a", past).await.unwrap().is_none(),
        "past its deadline"
    );
    let t = task(&*s.b, ids[0]).await;
    assert_eq!((t.status, t.node), (status::QUEUED, None));
    let soon = DateTime::from_millis(DateTime::now().timestamp_millis() + 60_000);
    let claimed =
        s.a.claim_before(&q, "a", soon)
            .await
            .unwrap()
            .expect("before its deadline");
    assert_eq!((claimed.id, claimed.node.as_deref()), (ids[0], Some("a")));
}

/// Claims of one queue by one node made at the same moment (grouped on MongoDB) take the
/// queue's first tasks in its order, each task once; a claim among them whose deadline has
/// passed claims nothing and keeps none of the others from claiming.
async fn claims_made_at_once_take_the_queue_in_order_each_once(s: Stores) {
    let q = queue(&*s.a, "at-once", 16, Sort::Fifo).await;
    let ids = s.a.create_tasks(q.id, vec![doc! {}; 40]).await.unwrap();
    let claims = 12;
    let late = 5;
    let start = Arc::new(tokio::sync::Barrier::new(claims));
    let mut calls = Vec::new();
    for i in 0..claims {
        let (store, q, start) = (s.a.clone(), q.clone(), start.clone());
        calls.push(tokio::spawn(async move {
            let until = if i == late { ago(1_000) } else { ago(-60_000) };
            start.wait().await;
            store.claim_before(&q, "a", until).await.unwrap()
        }));
    }
    let mut got = Vec::new();
    for (i, call) in calls.into_iter().enumerate() {
        let claimed = call.await.unwrap();
        if i == late {
            assert!(claimed.is_none(), "a claim past its deadline claims nothing");
            continue;
        }
        let t = claimed.expect("a claim before its deadline gets a task");
        // The embedded store claims and starts in one write.
        assert_eq!(t.node.as_deref(), Some("a"));
        assert!([status::CLAIMED, status::RUNNING].contains(&t.status), "{}", t.status);
        got.push(t.id);
    }
    let unique: HashSet<_> = got.iter().copied().collect();
    assert_eq!(unique.len(), got.len(), "no task claimed twice: {got:?}");
    let first: HashSet<_> = ids[..claims - 1].iter().copied().collect();
    assert_eq!(unique, first, "the queue's first tasks, in its order");
    for id in &ids {
        let t = task(&*s.b, *id).await;
        if first.contains(id) {
            assert!(
                [status::CLAIMED, status::RUNNING].contains(&t.status),
                "{id}: {}",
                t.status
            );
            assert_eq!(t.node.as_deref(), Some("a"), "{id}");
        } else {
            assert_eq!((t.status, t.node), (status::QUEUED, None), "{id}");
        }
    }
}
