//! The QueueBalance document in the embedded store: the one row of `balance(id = 1, doc)`,
//! its BSON as MongoDB's `balance` collection holds it.

use bson::Document;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::rows::{bson_bytes, db_err, read_bson};
use crate::store::StoreResult;

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
