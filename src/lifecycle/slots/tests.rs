use super::*;

fn at(ms: i64) -> DateTime {
    DateTime::from_millis(ms)
}

/// The take of the leases [`held`] makes.
fn take() -> ObjectId {
    ObjectId::from_bytes([7; 12])
}

fn held(n: i64, holder: &str, expires: i64) -> SlotRow {
    SlotRow {
        holder: Some(holder.to_string()),
        expires: at(expires),
        taken: Some(take()),
        ..SlotRow::unheld(n)
    }
}

fn busy(names: &[&str]) -> Vec<BusyNode> {
    names
        .iter()
        .map(|n| BusyNode {
            node: n.to_string(),
            tasks: 1,
            foreign: false,
        })
        .collect()
}

#[test]
fn a_slot_is_in_use_while_its_lease_runs_or_its_holder_still_has_a_task() {
    let now = at(1_000);
    let b = busy(&["working"]);
    let b = busy_names(&b);
    assert!(!in_use(&SlotRow::unheld(0), &b, now));
    assert!(in_use(&held(0, "idle", 2_000), &b, now), "live lease");
    assert!(!in_use(&held(0, "idle", 500), &b, now), "ended, holder idle");
    assert!(
        in_use(&held(0, "working", 500), &b, now),
        "ended, holder's task not recovered"
    );
    let rows = [held(0, "idle", 2_000), held(1, "idle", 500), held(2, "working", 500)];
    assert_eq!(used_from(&rows, &b, 0, now), 2);
    assert_eq!(used_from(&rows, &b, 1, now), 1);
    assert_eq!(used_from(&rows, &b, 3, now), 0);
}

#[test]
fn idle_holders_are_those_without_a_claimed_or_running_task() {
    let holders = ["a".to_string(), "b".to_string(), "c".to_string()];
    let idle = idle_holders(&holders, &busy(&["b"]));
    assert_eq!(idle, [&holders[0], &holders[2]]);
    let none_running = [BusyNode {
        node: "a".into(),
        tasks: 0,
        foreign: false,
    }];
    assert_eq!(idle_holders(&holders, &none_running).len(), 3);
}

#[test]
fn unheld_slots_come_first_and_reservations_and_busy_holders_are_respected() {
    let now = at(1_000);
    let b = busy(&["working"]);
    let b = busy_names(&b);
    let reserved_other = SlotRow {
        reserved: Some("other".into()),
        reserved_until: Some(at(5_000)),
        ..SlotRow::unheld(1)
    };
    let reserved_me = SlotRow {
        reserved: Some("me".into()),
        reserved_until: Some(at(5_000)),
        ..SlotRow::unheld(4)
    };
    let reservation_ended = SlotRow {
        reserved: Some("other".into()),
        reserved_until: Some(at(500)),
        ..SlotRow::unheld(5)
    };
    let rows = [
        held(0, "idle", 500),
        reserved_other,
        held(2, "working", 500),
        held(3, "live", 2_000),
        reserved_me,
        reservation_ended,
        SlotRow::unheld(6),
        SlotRow::unheld(9),
    ];
    let order: Vec<i64> = takeable(&rows, "me", &b, 9, now).iter().map(|(n, _)| *n).collect();
    assert_eq!(
        order,
        [4, 5, 6, 0],
        "unheld first, then ended and idle; 9 is over the limit"
    );
    let (_, fence) = &takeable(&rows, "me", &b, 9, now)[3];
    assert_eq!(fence.holder, Holder::By("idle".into()));
    assert_eq!(fence.lease, Lease::EndedAt(now));
}

#[test]
fn a_slot_taken_under_an_older_limit_is_kept_only_where_the_stored_limit_allows() {
    assert!(confirmed(1, 3, 3, 0));
    assert!(confirmed(1, 3, 5, 0), "raised meanwhile");
    assert!(!confirmed(2, 3, 2, 0), "at or above the stored limit");
    assert!(confirmed(1, 3, 2, 0), "lowered, nothing above it in use");
    assert!(!confirmed(1, 3, 2, 1), "lowered, still over it");
    assert!(!confirmed(0, 3, 0, 0), "the queue is gone");
}

#[test]
fn the_renew_decision() {
    let now = at(1_000);
    let until = at(9_000);
    let slot = Slot {
        queue: ObjectId::from_bytes([1; 12]),
        n: 0,
        taken: take(),
    };
    let step = renew_step(&held(0, "me", 2_000), &slot, "me", now, until);
    assert_eq!(step.renewal, SlotRenewal::Held);
    assert_eq!(step.write.unwrap().1, SlotChange::Renew { until });

    assert_eq!(
        renew_step(&held(0, "other", 2_000), &slot, "me", now, until).renewal,
        SlotRenewal::Lost
    );
    assert_eq!(
        renew_step(&SlotRow::unheld(0), &slot, "me", now, until).renewal,
        SlotRenewal::Lost
    );
    let again = SlotRow {
        taken: Some(ObjectId::from_bytes([8; 12])),
        ..held(0, "me", 2_000)
    };
    assert_eq!(
        renew_step(&again, &slot, "me", now, until),
        RenewStep {
            renewal: SlotRenewal::Lost,
            write: None
        },
        "a lease that ran out and was taken again, by this node too, is not renewed through the old one"
    );
    let ended = renew_step(&held(0, "me", 500), &slot, "me", now, until);
    assert_eq!(
        (ended.renewal, ended.write),
        (SlotRenewal::Lost, None),
        "an ended lease stays as it is"
    );

    let asked = |expires, want_until| SlotRow {
        want: Some("asker".into()),
        want_until: Some(at(want_until)),
        ..held(0, "me", expires)
    };
    let step = renew_step(&asked(2_000, 3_000), &slot, "me", now, until);
    assert_eq!(step.renewal, SlotRenewal::Yielded { to: "asker".into() });
    let (fence, change) = step.write.unwrap();
    assert_eq!(fence.want, Mark::By("asker".into()));
    assert_eq!(
        change,
        SlotChange::Yield {
            to: "asker".into(),
            until: at(3_000)
        }
    );
    assert_eq!(
        renew_step(&asked(2_000, 500), &slot, "me", now, until).renewal,
        SlotRenewal::Held,
        "an ended ask is no obstacle"
    );
    assert_eq!(
        renew_step(&asked(500, 500), &slot, "me", now, until).renewal,
        SlotRenewal::Yielded { to: "asker".into() },
        "an ended lease still asked for goes to the asker"
    );
}

#[test]
fn a_slot_is_asked_from_the_node_holding_the_most() {
    let ask = |held: &[&str], node| fair_share_donor(held.iter().copied(), node);
    assert_eq!(ask(&["a", "b", "b", "c", "c", "c"], "d").as_deref(), Some("c"));
    assert_eq!(
        ask(&["a", "a", "b", "b"], "d").as_deref(),
        Some("a"),
        "ties go to the first name"
    );
    assert_eq!(ask(&["a", "a", "d"], "d"), None, "one more is fair enough");
    assert_eq!(ask(&["a", "a", "a", "d"], "d").as_deref(), Some("a"));
    assert_eq!(ask(&["d", "d", "d"], "d"), None, "never from itself");
    assert_eq!(ask(&[], "d"), None);
    assert_eq!(ask(&["a"], "d"), None, "a single slot stays where it is");
}

#[test]
fn the_ask_moves_to_the_donors_next_slot_and_skips_others_asks() {
    let now = at(1_000);
    let mut rows = vec![
        held(0, "d", 9_000),
        held(2, "d", 9_000),
        held(5, "d", 9_000),
        held(1, "x", 9_000),
    ];
    assert_eq!(ask_rotation(&rows, "d", "me", now), Some(0));
    rows[0].want = Some("me".into());
    rows[0].want_until = Some(at(2_000));
    assert_eq!(ask_rotation(&rows, "d", "me", now), Some(2));
    rows[0].want = None;
    rows[1].want = Some("me".into());
    rows[1].want_until = Some(at(2_000));
    assert_eq!(
        ask_rotation(&rows, "d", "me", now),
        Some(5),
        "the slot after the one asked last"
    );
    rows[2].want = Some("other".into());
    rows[2].want_until = Some(at(2_000));
    assert_eq!(
        ask_rotation(&rows, "d", "me", now),
        Some(0),
        "round, past a slot another asks for"
    );
    let all_asked: Vec<SlotRow> = rows
        .iter()
        .cloned()
        .map(|mut r| {
            r.want = Some("other".into());
            r.want_until = Some(at(2_000));
            r
        })
        .collect();
    assert_eq!(
        ask_rotation(&all_asked, "d", "me", now),
        None,
        "every slot asked for by others"
    );
    let ended: Vec<SlotRow> = all_asked
        .into_iter()
        .map(|mut r| {
            r.want_until = Some(at(500));
            r
        })
        .collect();
    assert_eq!(
        ask_rotation(&ended, "d", "me", now),
        Some(0),
        "ended asks are no obstacle"
    );
}

#[test]
fn lease_end_adds_and_saturates() {
    let now = at(1_000);
    assert_eq!(lease_end(now, Duration::from_secs(30)), at(31_000));
    assert_eq!(lease_end(now, Duration::MAX), at(i64::MAX));
}

#[test]
fn a_renewal_is_claimed_on_for_a_tick_and_never_past_half_its_window() {
    use super::{claim_window, reuse_for};
    let lease = Duration::from_secs(30);
    assert_eq!(reuse_for(Duration::from_secs(1), lease), Duration::from_secs(1));
    assert_eq!(reuse_for(Duration::from_millis(50), lease), Duration::from_millis(50));
    // A tick longer than the lease allows: half the claim window.
    assert_eq!(reuse_for(Duration::from_secs(60), lease), claim_window(lease) / 2);
    assert!(reuse_for(Duration::from_secs(60), lease) < claim_window(lease));
}
