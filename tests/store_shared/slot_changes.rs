//! The slot mechanics each store supplies: rows read as data, changes applied only under
//! their fence, and the one-transaction `renew_and_claim` checked against the same claim
//! made in steps.

use super::*;
use disbatch::lifecycle::slots;
use disbatch::store::{BusyOf, Holder, Lease, Mark, Slot, SlotChange, SlotFence, SlotRow};

on_both_stores!(
    a_slot_change_applies_only_under_its_fence,
    renew_and_claim_in_one_write_agrees_with_the_steps,
    busy_nodes_count_claimed_and_running_tasks,
);

/// The row of `slot` as `s` reads it.
async fn row(s: &dyn Store, slot: &Slot) -> SlotRow {
    let rows = s.slots(slot.queue).await.unwrap();
    rows.into_iter().find(|r| r.n == slot.n).expect("the slot's row")
}

fn fence(holder: Holder, lease: Lease, want: Mark, reserved: Mark) -> SlotFence {
    SlotFence {
        holder,
        lease,
        want,
        reserved,
        taken: None,
    }
}

async fn a_slot_change_applies_only_under_its_fence(s: Stores) {
    let q = queue(&*s.a, "fences", 2, Sort::Fifo).await;
    s.a.ensure_slots(q.id, 2).await.unwrap();
    s.b.ensure_slots(q.id, 2).await.unwrap();
    let rows = s.b.slots(q.id).await.unwrap();
    assert_eq!(
        rows,
        vec![SlotRow::unheld(0), SlotRow::unheld(1)],
        "created once, unheld"
    );
    let slot = Slot::numbered(q.id, 0);
    let first_take = bson::oid::ObjectId::new();
    let now = DateTime::now();
    let later = DateTime::from_millis(now.timestamp_millis() + 60_000);
    let by = |n: &str| Holder::By(n.to_string());
    let open_to = |n: Option<&str>| Mark::OpenTo {
        node: n.map(str::to_string),
        at: now,
    };
    let take = |n: &str| SlotChange::Take {
        holder: n.to_string(),
        until: later,
        taken: first_take,
    };
    let change = |f: SlotFence, c: SlotChange| {
        let (a, slot) = (s.a.clone(), slot.clone());
        async move { a.change_slot(&slot, &f, &c).await.unwrap() }
    };

    assert!(
        change(
            fence(Holder::Unheld, Lease::Any, Mark::Any, open_to(Some("x"))),
            take("x")
        )
        .await
    );
    assert!(
        !change(fence(Holder::Unheld, Lease::Any, Mark::Any, Mark::Any), take("y")).await,
        "held now"
    );
    let r = row(&*s.b, &slot).await;
    assert_eq!(
        (r.holder.as_deref(), r.expires, r.taken),
        (Some("x"), later, Some(first_take))
    );
    let through = |taken| SlotFence {
        taken: Some(taken),
        ..fence(by("x"), Lease::Any, Mark::Any, Mark::Any)
    };
    assert!(
        !change(through(bson::oid::ObjectId::new()), SlotChange::Renew { until: later }).await,
        "another take's lease renews nothing"
    );
    assert!(change(through(first_take), SlotChange::Renew { until: later }).await);
    assert!(
        !change(fence(by("x"), Lease::EndedAt(now), Mark::Any, Mark::Any), take("y")).await,
        "lease runs"
    );
    assert!(
        !change(
            fence(by("y"), Lease::LiveAt(now), Mark::Any, Mark::Any),
            SlotChange::Release
        )
        .await
    );
    let ask = SlotChange::Ask {
        by: "y".into(),
        until: later,
    };
    assert!(change(fence(by("x"), Lease::Any, open_to(Some("y")), Mark::Any), ask.clone()).await);
    let z_asks = SlotChange::Ask {
        by: "z".into(),
        until: later,
    };
    assert!(
        !change(fence(Holder::Any, Lease::Any, open_to(Some("z")), Mark::Any), z_asks).await,
        "asked by another"
    );
    assert!(
        !change(
            fence(by("x"), Lease::LiveAt(now), open_to(None), Mark::Any),
            SlotChange::Renew { until: later }
        )
        .await,
        "a live ask blocks the renewal"
    );
    let r = row(&*s.b, &slot).await;
    assert_eq!((r.want.as_deref(), r.want_until), (Some("y"), Some(later)));
    let give = SlotChange::Yield {
        to: "y".into(),
        until: later,
    };
    assert!(
        !change(
            fence(by("x"), Lease::Any, Mark::By("w".into()), Mark::Any),
            give.clone()
        )
        .await
    );
    assert!(change(fence(by("x"), Lease::Any, Mark::By("y".into()), Mark::Any), give).await);
    let r = row(&*s.b, &slot).await;
    assert_eq!(
        (r.holder, r.want, r.reserved.as_deref(), r.reserved_until),
        (None, None, Some("y"), Some(later)),
        "given up, reserved for the asker"
    );
    assert!(
        !change(
            fence(Holder::Unheld, Lease::Any, Mark::Any, open_to(Some("z"))),
            take("z")
        )
        .await,
        "reserved for another"
    );
    assert!(
        change(
            fence(Holder::Unheld, Lease::Any, Mark::Any, open_to(Some("y"))),
            take("y")
        )
        .await
    );
    let r = row(&*s.b, &slot).await;
    assert_eq!(
        (r.holder.as_deref(), r.reserved),
        (Some("y"), None),
        "taking clears the reservation"
    );
    let earlier = DateTime::from_millis(now.timestamp_millis() - 1);
    assert!(
        change(
            fence(by("y"), Lease::LiveAt(now), Mark::Any, Mark::Any),
            SlotChange::Renew { until: earlier }
        )
        .await
    );
    assert!(
        !change(
            fence(by("y"), Lease::LiveAt(now), Mark::Any, Mark::Any),
            SlotChange::Unask
        )
        .await,
        "lease ended"
    );
    assert!(
        change(
            fence(by("y"), Lease::EndedAt(now), Mark::Any, Mark::Any),
            SlotChange::Release
        )
        .await
    );
    assert_eq!(row(&*s.b, &slot).await.holder, None);
    let missing = Slot::numbered(q.id, 7);
    assert!(
        !s.a.change_slot(&missing, &SlotFence::default(), &SlotChange::Release)
            .await
            .unwrap(),
        "no such row"
    );
}

/// What a claim with a slot found: the renewal, the task claimed (its index, its status),
/// and the slot's holder and reservation after.
type Seen = (SlotRenewal, Option<(usize, i32)>, Option<String>, Option<String>);

/// A worker's claims with a slot, in one write where the store offers it (`one`) or in
/// steps, on a queue of its own: what each renewal found, the task it claimed (by its
/// index) and status, and the slot's holder and reservation after.
async fn claims_with_a_slot(s: &Stores, name: &str, one: bool) -> Vec<Seen> {
    let q = queue(&*s.a, name, 2, Sort::Fifo).await;
    let ids = s.a.create_tasks(q.id, vec![doc! {}; 2]).await.unwrap();
    let first = slots::acquire_slot(&*s.a, &q, "a", LEASE).await.unwrap().expect("slot");
    let second = slots::acquire_slot(&*s.a, &q, "a", LEASE).await.unwrap().expect("slot");
    let mut seen = Vec::new();
    let claim = |slot: Slot, node: &'static str, store: Arc<dyn Store>| {
        let (q, ids) = (q.clone(), ids.clone());
        async move {
            let (renewal, task) = if one {
                slots::renew_and_claim(&*store, &slot, &q, node, LEASE).await.unwrap()
            } else {
                slots::renew_then_claim(&*store, &slot, &q, node, LEASE).await.unwrap()
            };
            let task = task.map(|t| (ids.iter().position(|i| *i == t.id).unwrap(), t.status));
            let r = row(&*store, &slot).await;
            (renewal, task, r.holder, r.reserved)
        }
    };
    seen.push(claim(first.clone(), "a", s.a.clone()).await);
    // Asked for a share: the holder of both gives the first asked slot up, reserved.
    assert_eq!(
        slots::want_slot(&*s.b, &q, "late", LEASE).await.unwrap().as_deref(),
        Some("a")
    );
    seen.push(claim(first.clone(), "a", s.a.clone()).await);
    seen.push(claim(second.clone(), "a", s.b.clone()).await);
    // Taken by another node: lost.
    slots::release_slot(&*s.a, &second, "a").await.unwrap();
    let theirs = slots::acquire_slot(&*s.b, &q, "b", LEASE).await.unwrap().expect("slot");
    assert_eq!((theirs.queue, theirs.n), (second.queue, second.n), "the same slot");
    seen.push(claim(second.clone(), "a", s.a.clone()).await);
    // Held with the queue empty: no task.
    seen.push(claim(theirs.clone(), "b", s.b.clone()).await);
    seen
}

async fn renew_and_claim_in_one_write_agrees_with_the_steps(s: Stores) {
    let one = claims_with_a_slot(&s, "one-write", true).await;
    let steps = claims_with_a_slot(&s, "in-steps", false).await;
    assert_eq!(one, steps);
    let (a, late) = (Some("a".to_string()), Some("late".to_string()));
    assert_eq!(one[0].0, SlotRenewal::Held);
    assert_eq!((one[0].1.map(|t| t.0), &one[0].2), (Some(0), &a));
    assert_eq!(one[1], (SlotRenewal::Yielded { to: "late".into() }, None, None, late));
    assert_eq!(one[2].0, SlotRenewal::Held);
    assert_eq!(one[2].1.map(|t| t.0), Some(1));
    assert_eq!(one[3], (SlotRenewal::Lost, None, Some("b".into()), None));
    assert_eq!(one[4], (SlotRenewal::Held, None, Some("b".into()), None));
}

async fn busy_nodes_count_claimed_and_running_tasks(s: Stores) {
    let q = queue(&*s.a, "busy", 5, Sort::Fifo).await;
    let other = queue(&*s.a, "busy-other", 5, Sort::Fifo).await;
    s.a.create_tasks(q.id, vec![doc! {}; 3]).await.unwrap();
    s.a.create_tasks(other.id, vec![doc! {}; 1]).await.unwrap();
    for node in ["x", "x", "y"] {
        let t = s.a.claim(&q, node).await.unwrap().expect("a task");
        if node == "y" {
            assert!(disbatch::lifecycle::run::start(&*s.a, t.id, node).await.unwrap());
        }
    }
    s.a.claim(&other, "z").await.unwrap().expect("a task");
    let counts = |busy: Vec<disbatch::store::BusyNode>| {
        let mut c: Vec<(String, i64, bool)> = busy.into_iter().map(|b| (b.node, b.tasks, b.foreign)).collect();
        c.sort();
        c
    };
    let of_q = counts(s.b.busy_nodes(Some(q.id), BusyOf::All).await.unwrap());
    assert_eq!(of_q, vec![("x".into(), 2, false), ("y".into(), 1, false)]);
    let all = counts(s.b.busy_nodes(None, BusyOf::All).await.unwrap());
    assert_eq!(all.len(), 3, "{all:?}");
    assert!(
        s.b.busy_nodes(None, BusyOf::Foreign).await.unwrap().is_empty(),
        "no Disbatch 4 DEN here"
    );
    assert_eq!(
        slots::slots_in_use(&*s.b, q.id).await.unwrap(),
        0,
        "tasks claimed without slots hold none"
    );
}
