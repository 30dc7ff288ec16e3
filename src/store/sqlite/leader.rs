//! The leader lease in the embedded store: one row of `leases(name, node, token, expires)`,
//! taken, renewed and read by the same rules as MongoDB's `leases` document, inside one
//! `BEGIN IMMEDIATE` transaction.

use std::time::Duration;

use bson::DateTime;
use rusqlite::{params, OptionalExtension, Transaction};

use super::rows::db_err;
use crate::store::{Leader, StoreResult};

/// The `name` of the leader lease.
const LEADER: &str = "leader";

/// The lease as stored.
pub(super) fn read(tx: &rusqlite::Connection) -> StoreResult<Option<Leader>> {
    tx.query_row(
        "SELECT node, token, expires FROM leases WHERE name = ?1",
        [LEADER],
        |r| {
            Ok(Leader {
                node: r.get(0)?,
                token: r.get(1)?,
                expires: DateTime::from_millis(r.get(2)?),
            })
        },
    )
    .optional()
    .map_err(db_err("read the leader lease"))
}

/// [`Store::lead`](crate::store::Store::lead): renews the lease for its holder, takes it
/// when it lapsed or was never taken, and answers it as it stands.
pub(super) fn lead(tx: &Transaction<'_>, node: &str, ttl: Duration) -> StoreResult<Leader> {
    let err = db_err("take the leader lease");
    let now = DateTime::now();
    let until = Leader::end(now, ttl);
    let lease = match read(tx)? {
        Some(held) if held.held_by(node, now) => Leader { expires: until, ..held },
        Some(held) if held.holder(now).is_some() => return Ok(held),
        Some(lapsed) => Leader {
            node: node.to_owned(),
            token: lapsed.token + 1,
            expires: until,
        },
        None => Leader {
            node: node.to_owned(),
            token: 1,
            expires: until,
        },
    };
    tx.execute(
        "INSERT INTO leases (name, node, token, expires) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (name) DO UPDATE SET node = excluded.node, token = excluded.token, expires = excluded.expires",
        params![LEADER, lease.node, lease.token, lease.expires.timestamp_millis()],
    )
    .map_err(err)?;
    Ok(lease)
}
