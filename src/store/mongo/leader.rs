//! The leader lease: one document `{_id: "leader", node, token, expires}` in the `leases`
//! collection. A node reads it; takes it with one update conditional on the lapsed lease
//! it read (or inserts it when it was never taken); renews it while it holds it.

use std::time::Duration;

use bson::{doc, DateTime, Document};
use mongodb::options::ReturnDocument;

use super::documents::as_int;
use super::{db_err, is_duplicate_key, MongoStore};
use crate::store::{Leader, StoreError, StoreResult};

/// Collection of cluster-wide leases.
pub const LEASES: &str = "leases";
/// The `_id` of the leader lease.
const LEADER: &str = "leader";

fn leader_of(d: &Document) -> StoreResult<Leader> {
    let bad = |field: &str| {
        StoreError::Invalid(format!(
            "{LEASES} document {LEADER:?}: field {field:?} is missing or not of its type"
        ))
    };
    Ok(Leader {
        node: d.get_str("node").map_err(|_| bad("node"))?.to_owned(),
        token: d.get("token").and_then(as_int).ok_or_else(|| bad("token"))?,
        expires: d.get_datetime("expires").map_err(|_| bad("expires"))?.to_owned(),
    })
}

impl MongoStore {
    fn leases(&self) -> mongodb::Collection<Document> {
        self.database().collection(LEASES)
    }

    /// [`Store::lead`](crate::store::Store::lead). Reads the lease first, so a node that
    /// does not lead costs one read per tick; every write is conditional on what was read
    /// (no upsert racing other nodes' upserts on one `_id`).
    pub(super) async fn take_lead(&self, node: &str, ttl: Duration) -> StoreResult<Leader> {
        let now = DateTime::now();
        let until = Leader::end(now, ttl);
        let leases = self.leases();
        let update = |filter: Document, update: Document| {
            let leases = leases.clone();
            async move {
                leases
                    .find_one_and_update(filter, update)
                    .return_document(ReturnDocument::After)
                    .await
                    .map_err(db_err("take the leader lease"))
            }
        };
        let written = match self.read_lead().await? {
            // Renewed by its holder before it lapses.
            Some(held) if held.held_by(node, now) => {
                update(
                    doc! { "_id": LEADER, "node": node, "token": held.token },
                    doc! { "$set": { "expires": until } },
                )
                .await?
            }
            // Held by another node.
            Some(held) if held.holder(now).is_some() => return Ok(held),
            // Lapsed: taken by whoever changes it first from what was read.
            Some(lapsed) => {
                update(
                    doc! { "_id": LEADER, "token": lapsed.token, "expires": lapsed.expires },
                    doc! { "$set": { "node": node, "expires": until }, "$inc": { "token": 1_i64 } },
                )
                .await?
            }
            // Never taken: the first insert wins.
            None => {
                let first = doc! { "_id": LEADER, "node": node, "token": 1_i64, "expires": until };
                match leases.insert_one(&first).await {
                    Ok(_) => Some(first),
                    Err(e) if is_duplicate_key(&e) => None,
                    Err(e) => return Err(db_err("take the leader lease")(e)),
                }
            }
        };
        match written {
            Some(d) => leader_of(&d),
            // Another node changed it first: it stands as that node left it.
            None => self
                .read_lead()
                .await?
                .ok_or_else(|| StoreError::Invalid("the leader lease vanished".into())),
        }
    }

    /// [`Store::leader`](crate::store::Store::leader).
    pub(super) async fn read_lead(&self) -> StoreResult<Option<Leader>> {
        let found = self
            .leases()
            .find_one(doc! { "_id": LEADER })
            .await
            .map_err(db_err("read the leader lease"))?;
        found.as_ref().map(leader_of).transpose()
    }
}
