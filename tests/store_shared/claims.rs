//! The DEN's claims: `claim_to_run` (claimed, and on the embedded store started in the
//! same write) and `renew_and_claim` (a worker's next claim with the slot it holds).

use super::*;

on_both_stores!(
    claims_to_run_go_to_exactly_one_claimer_and_finish,
    renew_and_claim_claims_only_with_a_slot_still_held,
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
