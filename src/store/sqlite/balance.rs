//! The QueueBalance document in the embedded store: the one row of `balance(id = 1, doc)`,
//! its BSON as MongoDB's `balance` collection holds it; and the leader's share writes,
//! fenced by its lease token.

use bson::oid::ObjectId;
use bson::{Bson, DateTime, Document};
use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};

use super::records::{bson_bytes, db_err, read_bson};
use super::{queue_doc, SqliteStore};
use crate::store::StoreResult;

/// The field of a queue document holding the token of the last leader that wrote or
/// fenced its share (as on MongoDB).
const BALANCE_TOKEN: &str = "balance_token";

impl SqliteStore {
    /// [`Store::set_share`](crate::store::Store::set_share): the lease and the queue's
    /// `balance_token` checked and the share written in one transaction.
    pub(super) async fn set_share(&self, queue: ObjectId, share: Option<i64>, token: i64) -> StoreResult<bool> {
        self.write("write a QueueBalance share", move |tx| {
            let held = super::leases::lease(tx, crate::store::LEADER_LEASE)?
                .is_some_and(|l| l.token == token && l.holder(DateTime::now()).is_some());
            if !held {
                return Ok(false);
            }
            let value = share.map_or(Bson::Null, Bson::Int64);
            change_queue(tx, queue, token, Some(&value))
        })
        .await
    }

    /// [`Store::fence_shares`](crate::store::Store::fence_shares).
    pub(super) async fn fence_shares(&self, queues: &[ObjectId], token: i64) -> StoreResult<()> {
        let queues = queues.to_vec();
        self.write("fence the QueueBalance shares", move |tx| {
            for q in &queues {
                change_queue(tx, *q, token, None)?;
            }
            Ok(())
        })
        .await
    }
}

/// Sets the queue `id`'s `maxthreads` to `share` (when given) and its `balance_token` to
/// `token`, unless a higher token is there already; whether it did. Without a share
/// (fencing) a queue that has `token` already is left alone.
fn change_queue(tx: &Transaction<'_>, id: ObjectId, token: i64, share: Option<&Bson>) -> StoreResult<bool> {
    let err = db_err("write a QueueBalance share");
    let hex = id.to_hex();
    let found: Option<Vec<u8>> = tx
        .query_row("SELECT doc FROM queues WHERE id = ?1", [&hex], |r| r.get(0))
        .optional()
        .map_err(&err)?;
    let Some(bytes) = found else { return Ok(false) };
    let mut d = queue_doc("queues", &hex, &bytes)?;
    let had = d.get_i64(BALANCE_TOKEN).ok();
    if had.is_some_and(|t| t > token || (t == token && share.is_none())) {
        return Ok(false);
    }
    if let Some(share) = share {
        d.insert("maxthreads", share.clone());
    }
    d.insert(BALANCE_TOKEN, token);
    d.remove("_id");
    tx.execute(
        "UPDATE queues SET doc = ?1 WHERE id = ?2",
        params![bson_bytes(&d)?, hex],
    )
    .map_err(&err)?;
    Ok(true)
}

/// The document, if one was written.
pub(super) fn read(conn: &Connection) -> StoreResult<Option<Document>> {
    let bytes: Option<Vec<u8>> = conn
        .query_row("SELECT doc FROM balance WHERE id = 1", [], |r| r.get(0))
        .optional()
        .map_err(db_err("read the balance"))?;
    bytes.map(|b| read_bson("balance", "1", &b)).transpose()
}

/// Sets `fields` in the document (creating it), in one transaction.
pub(super) fn set(conn: &mut Connection, fields: &Document) -> StoreResult<()> {
    let err = db_err("write the balance");
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(&err)?;
    let mut doc = read(&tx)?.unwrap_or_default();
    for (k, v) in fields {
        doc.insert(k.clone(), v.clone());
    }
    tx.execute(
        "INSERT INTO balance (id, doc) VALUES (1, ?1) ON CONFLICT (id) DO UPDATE SET doc = excluded.doc",
        params![bson_bytes(&doc)?],
    )
    .map_err(&err)?;
    tx.commit().map_err(&err)
}
