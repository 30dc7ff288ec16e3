//! The leader lease: one DEN at a time leads the cluster (the orphan sweep, the settling of
//! ends left unsettled, the QueueBalance shares). The four cases are decided here, once
//! ([`next`]); the store only reads the lease and changes it by compare-and-set
//! ([`Store::lease`], [`Store::change_lease`]), so of two nodes acting on the same lease as
//! read, one wins and the other answers the lease as the winner left it.

use std::time::Duration;

use bson::DateTime;

use crate::store::{Leader, Store, StoreError, StoreResult, LEADER_LEASE};

/// The lease `node` writes when it finds `held` at `now` wanting it until now + `ttl`:
/// renewed with the same token when `node` holds it; taken with the next token when it
/// lapsed; taken with token 1 when it was never taken; `None` (nothing to write) while
/// another node holds it.
pub fn next(held: Option<&Leader>, node: &str, now: DateTime, ttl: Duration) -> Option<Leader> {
    let until = Leader::end(now, ttl);
    match held {
        Some(h) if h.held_by(node, now) => Some(Leader {
            expires: until,
            ..h.clone()
        }),
        Some(h) if h.holder(now).is_some() => None,
        Some(lapsed) => Some(Leader {
            node: node.to_owned(),
            token: lapsed.token + 1,
            expires: until,
        }),
        None => Some(Leader {
            node: node.to_owned(),
            token: 1,
            expires: until,
        }),
    }
}

/// Takes the leader lease for `node` until now + `ttl` when it is free or has lapsed (its
/// token grows by one), or renews it when `node` holds it; answers the lease as it stands
/// after the attempt, whoever holds it. A node that does not lead costs one read.
pub async fn lead(store: &(impl Store + ?Sized), node: &str, ttl: Duration) -> StoreResult<Leader> {
    let held = store.lease(LEADER_LEASE).await?;
    let Some(new) = next(held.as_ref(), node, DateTime::now(), ttl) else {
        return held.ok_or_else(|| StoreError::Invalid("the leader lease vanished".into()));
    };
    if store.change_lease(LEADER_LEASE, held.as_ref(), &new).await? {
        return Ok(new);
    }
    // Another node changed it first: it stands as that node left it.
    leader(store)
        .await?
        .ok_or_else(|| StoreError::Invalid("the leader lease vanished".into()))
}

/// The leader lease as stored (possibly lapsed), if any DEN ever took it.
pub async fn leader(store: &(impl Store + ?Sized)) -> StoreResult<Option<Leader>> {
    store.lease(LEADER_LEASE).await
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(10);

    fn lease(node: &str, token: i64, expires: i64) -> Leader {
        Leader {
            node: node.into(),
            token,
            expires: DateTime::from_millis(expires),
        }
    }

    #[test]
    fn the_four_cases_of_a_lease() {
        let now = DateTime::from_millis(1_000_000);
        assert_eq!(next(None, "a", now, TTL), Some(lease("a", 1, 1_010_000)), "never taken");
        let held = lease("a", 4, 1_005_000);
        assert_eq!(
            next(Some(&held), "a", now, TTL),
            Some(lease("a", 4, 1_010_000)),
            "renewed"
        );
        assert_eq!(next(Some(&held), "b", now, TTL), None, "held by another");
        let lapsed = lease("a", 4, 1_000_000);
        assert_eq!(
            next(Some(&lapsed), "b", now, TTL),
            Some(lease("b", 5, 1_010_000)),
            "lapsed"
        );
        assert_eq!(
            next(Some(&lapsed), "a", now, TTL),
            Some(lease("a", 5, 1_010_000)),
            "its own lapsed lease is taken again with a new token"
        );
    }
}
