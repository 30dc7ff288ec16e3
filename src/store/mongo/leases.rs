//! Leases on MongoDB: one document `{_id: <name>, node, token, expires}` per lease in the
//! `leases` collection (the leader lease is `_id: "leader"`), read, and changed only by
//! compare-and-set: an update conditional on the lease as read, or an insert that loses to
//! another's on the same `_id`. Who may take or renew a lease is decided above the store
//! (`lifecycle::leader`).

use bson::{doc, Document};

use super::records::as_int;
use super::{db_err, is_duplicate_key, MongoStore};
use crate::store::{Leader, StoreError, StoreResult};

/// Collection of cluster-wide leases.
pub const LEASES: &str = "leases";

fn lease_of(name: &str, d: &Document) -> StoreResult<Leader> {
    let bad = |field: &str| {
        StoreError::Invalid(format!(
            "{LEASES} document {name:?}: field {field:?} is missing or not of its type"
        ))
    };
    Ok(Leader {
        node: d.get_str("node").map_err(|_| bad("node"))?.to_owned(),
        token: d.get("token").and_then(as_int).ok_or_else(|| bad("token"))?,
        expires: d.get_datetime("expires").map_err(|_| bad("expires"))?.to_owned(),
    })
}

fn leases(store: &MongoStore) -> mongodb::Collection<Document> {
    store.database().collection(LEASES)
}

/// [`Store::lease`](crate::store::Store::lease).
pub(super) async fn lease(store: &MongoStore, name: &str) -> StoreResult<Option<Leader>> {
    let found = leases(store)
        .find_one(doc! { "_id": name })
        .await
        .map_err(db_err("read a lease"))?;
    found.as_ref().map(|d| lease_of(name, d)).transpose()
}

/// [`Store::change_lease`](crate::store::Store::change_lease): an insert when `expect` is
/// `None` (a duplicate `_id` means another node inserted it first), else one update
/// conditional on every field as read.
pub(super) async fn change_lease(
    store: &MongoStore,
    name: &str,
    expect: Option<&Leader>,
    new: &Leader,
) -> StoreResult<bool> {
    let err = db_err("change a lease");
    let fields = doc! { "node": &new.node, "token": new.token, "expires": new.expires };
    match expect {
        None => {
            let mut first = doc! { "_id": name };
            first.extend(fields);
            match leases(store).insert_one(&first).await {
                Ok(_) => Ok(true),
                Err(e) if is_duplicate_key(&e) => Ok(false),
                Err(e) => Err(err(e)),
            }
        }
        Some(old) => {
            let filter = doc! { "_id": name, "node": &old.node, "token": old.token, "expires": old.expires };
            let done = leases(store)
                .update_one(filter, doc! { "$set": fields })
                .await
                .map_err(&err)?;
            Ok(done.matched_count == 1)
        }
    }
}
