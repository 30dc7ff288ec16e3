//! Leases in the embedded store: one row of `leases(name, node, token, expires)` per
//! lease (the leader lease is `name = 'leader'`), read, and changed only by
//! compare-and-set, by the rules of MongoDB's `leases` documents. Who may take or renew a
//! lease is decided above the store (`lifecycle::leader`).

use bson::DateTime;
use rusqlite::{params, OptionalExtension, Transaction};

use super::records::db_err;
use crate::store::{Leader, StoreResult};

/// [`Store::lease`](crate::store::Store::lease): the lease `name` as stored.
pub(super) fn lease(conn: &rusqlite::Connection, name: &str) -> StoreResult<Option<Leader>> {
    conn.query_row("SELECT node, token, expires FROM leases WHERE name = ?1", [name], |r| {
        Ok(Leader {
            node: r.get(0)?,
            token: r.get(1)?,
            expires: DateTime::from_millis(r.get(2)?),
        })
    })
    .optional()
    .map_err(db_err("read a lease"))
}

/// [`Store::change_lease`](crate::store::Store::change_lease): an insert that does nothing
/// when the row exists (`expect` is `None`), else one update conditional on every column as
/// read.
pub(super) fn change_lease(
    tx: &Transaction<'_>,
    name: &str,
    expect: Option<&Leader>,
    new: &Leader,
) -> StoreResult<bool> {
    let err = db_err("change a lease");
    let (node, token, expires) = (&new.node, new.token, new.expires.timestamp_millis());
    let n = match expect {
        None => tx.execute(
            "INSERT INTO leases (name, node, token, expires) VALUES (?1, ?2, ?3, ?4) ON CONFLICT (name) DO NOTHING",
            params![name, node, token, expires],
        ),
        Some(old) => tx.execute(
            "UPDATE leases SET node = ?2, token = ?3, expires = ?4
             WHERE name = ?1 AND node = ?5 AND token = ?6 AND expires = ?7",
            params![
                name,
                node,
                token,
                expires,
                old.node,
                old.token,
                old.expires.timestamp_millis()
            ],
        ),
    }
    .map_err(err)?;
    Ok(n == 1)
}
