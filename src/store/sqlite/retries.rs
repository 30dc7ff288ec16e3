//! Retries on the embedded store (see the MongoDB store's `retries`). The `attempts`
//! column holds the BSON of `{list: [record, …]}`; a record is appended by reading and
//! rewriting it in the same write transaction.

use bson::Bson;
use rusqlite::{OptionalExtension, Transaction};

use super::rows::{bson_bytes, db_err, read_attempts};
use crate::model::Attempt;
use crate::store::StoreResult;

/// The `attempts` column of task `id` with `attempt` appended.
pub(super) fn appended(tx: &Transaction<'_>, id: &str, attempt: &Attempt) -> StoreResult<Vec<u8>> {
    let stored: Option<Option<Vec<u8>>> = tx
        .query_row("SELECT attempts FROM tasks WHERE id = ?1", [id], |r| r.get(0))
        .optional()
        .map_err(db_err("read attempts"))?;
    let mut list: Vec<Bson> = read_attempts(id, stored.flatten().as_deref())
        .iter()
        .map(|a| Bson::Document(a.to_document()))
        .collect();
    list.push(Bson::Document(attempt.to_document()));
    bson_bytes(&bson::doc! { "list": list })
}
