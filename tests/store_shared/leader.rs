//! The leader lease: one holder at a time, renewed by its holder with the same token, taken
//! by another node once it lapses with a greater token, and one winner among many
//! contenders at once. QueueBalance share writes fenced by the lease's token.

use disbatch::lifecycle::leader;

use super::*;

on_both_stores!(
    one_leader_at_a_time_and_a_lapsed_lease_passes_on,
    contenders_at_once_agree_on_one_leader,
    a_deposed_leaders_share_write_changes_nothing,
    a_lease_changes_only_from_the_lease_read,
);

async fn one_leader_at_a_time_and_a_lapsed_lease_passes_on(s: Stores) {
    assert_eq!(
        leader::leader(&*s.a).await.unwrap(),
        None,
        "no lease before anyone takes it"
    );
    let first = leader::lead(&*s.a, "n1", LEASE).await.unwrap();
    assert_eq!((first.node.as_str(), first.token), ("n1", 1));
    // Held: another node gets the lease as it stands, not the lease.
    let other = leader::lead(&*s.b, "n2", LEASE).await.unwrap();
    assert_eq!(other, first);
    // Renewed by its holder: same token, later end.
    let renewed = leader::lead(&*s.b, "n1", LEASE).await.unwrap();
    assert_eq!((renewed.node.as_str(), renewed.token), ("n1", 1));
    assert!(renewed.expires >= first.expires);
    assert_eq!(leader::leader(&*s.a).await.unwrap(), Some(renewed));
    // A lease of no length lapses at once: the next node takes it with a greater token.
    let lapsed = leader::lead(&*s.a, "n1", Duration::ZERO).await.unwrap();
    assert!(!lapsed.held_by("n1", DateTime::now()));
    let taken = leader::lead(&*s.b, "n2", LEASE).await.unwrap();
    assert_eq!((taken.node.as_str(), taken.token), ("n2", 2));
    assert!(taken.held_by("n2", DateTime::now()));
    // Its former holder, back, does not take it.
    assert_eq!(leader::lead(&*s.a, "n1", LEASE).await.unwrap().node, "n2");
    // A holder whose own lease lapsed takes it again with a new token.
    leader::lead(&*s.b, "n2", Duration::ZERO).await.unwrap();
    let again = leader::lead(&*s.a, "n2", LEASE).await.unwrap();
    assert_eq!((again.node.as_str(), again.token), ("n2", 3));
}

async fn contenders_at_once_agree_on_one_leader(s: Stores) {
    let mut tries = Vec::new();
    for i in 0..16 {
        let store = if i % 2 == 0 { s.a.clone() } else { s.b.clone() };
        tries.push(tokio::spawn(async move {
            leader::lead(&*store, &format!("n{i}"), LEASE).await
        }));
    }
    let mut holders = HashSet::new();
    for t in tries {
        holders.insert(t.await.unwrap().unwrap().node);
    }
    assert_eq!(holders.len(), 1, "every contender sees the same leader: {holders:?}");
    let lease = leader::leader(&*s.a).await.unwrap().unwrap();
    assert!(holders.contains(&lease.node));
    assert_eq!(lease.token, 1, "taken once");
}

async fn a_deposed_leaders_share_write_changes_nothing(s: Stores) {
    let q =
        s.a.create_queue(NewQueue {
            name: "shared".into(),
            plugin: "demo".into(),
            threads: Some(10),
            sort: Sort::Fifo,
            extra: Document::new(),
        })
        .await
        .unwrap();
    let maxthreads = || async {
        let queues = s.b.queues().await.unwrap();
        queues.into_iter().find(|x| x.id == q.id).unwrap().maxthreads
    };
    let first = leader::lead(&*s.a, "n1", LEASE).await.unwrap();
    assert!(s.a.set_share(q.id, Some(3), first.token).await.unwrap());
    assert_eq!(maxthreads().await, Some(3));
    // n1's lease lapses and n2 takes it: n1's late write changes nothing, even before n2
    // wrote or fenced anything.
    leader::lead(&*s.a, "n1", Duration::ZERO).await.unwrap();
    let second = leader::lead(&*s.b, "n2", LEASE).await.unwrap();
    assert_eq!(second.token, first.token + 1);
    assert!(!s.a.set_share(q.id, Some(7), first.token).await.unwrap());
    assert_eq!(maxthreads().await, Some(3));
    assert!(!s.a.set_share(q.id, None, first.token).await.unwrap());
    assert_eq!(maxthreads().await, Some(3));
    // The leader writes; once it fenced the queue, a write with the older token is refused
    // by the queue's `balance_token` as well (whatever the lease says).
    s.b.fence_shares(&[q.id], second.token).await.unwrap();
    assert!(s.b.set_share(q.id, Some(2), second.token).await.unwrap());
    assert_eq!(maxthreads().await, Some(2));
    assert!(s.b.set_share(q.id, None, second.token).await.unwrap());
    assert_eq!(maxthreads().await, None);
    // A queue that is gone takes no share.
    assert!(!s.b.set_share(ObjectId::new(), Some(1), second.token).await.unwrap());
}

/// The store's compare-and-set of a lease: an insert only when there is none, an update
/// only from the lease as it stands; nothing written otherwise.
async fn a_lease_changes_only_from_the_lease_read(s: Stores) {
    let at = |ms: i64| DateTime::from_millis(1_700_000_000_000 + ms);
    let lease = |node: &str, token, ms| disbatch::store::Leader {
        node: node.into(),
        token,
        expires: at(ms),
    };
    let first = lease("n1", 1, 10);
    assert!(s.a.change_lease("other", None, &first).await.unwrap());
    assert!(
        !s.b.change_lease("other", None, &lease("n2", 1, 10)).await.unwrap(),
        "taken once"
    );
    assert_eq!(s.b.lease("other").await.unwrap(), Some(first.clone()));
    let renewed = lease("n1", 1, 20);
    assert!(s.b.change_lease("other", Some(&first), &renewed).await.unwrap());
    assert!(
        !s.a.change_lease("other", Some(&first), &lease("n2", 2, 30))
            .await
            .unwrap(),
        "not from a lease that changed since it was read"
    );
    assert_eq!(s.a.lease("other").await.unwrap(), Some(renewed));
    assert_eq!(
        s.a.lease(disbatch::store::LEADER_LEASE).await.unwrap(),
        None,
        "leases apart"
    );
}
