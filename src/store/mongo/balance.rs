//! The QueueBalance document: Disbatch 4's `balance` collection, which holds exactly one;
//! and the leader's share writes, fenced by its lease token.

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use futures::TryStreamExt;

use super::{db_err, MongoStore};
use crate::store::{StoreError, StoreResult};

/// Collection of the QueueBalance document.
pub const BALANCE: &str = "balance";

/// The field of a queue document holding the token of the last leader that wrote or
/// fenced its share.
pub(crate) const BALANCE_TOKEN: &str = "balance_token";

/// A queue whose share a leader holding `token` may write: never written or fenced by a
/// leader with a higher token.
fn fenced_for(token: i64) -> Document {
    doc! { "$or": [
        { BALANCE_TOKEN: { "$exists": false } },
        { BALANCE_TOKEN: { "$lte": token } },
    ] }
}

impl MongoStore {
    fn balance_collection(&self) -> mongodb::Collection<Document> {
        self.db.collection(BALANCE)
    }

    /// [`Store::balance`](crate::store::Store::balance).
    pub(super) async fn balance(&self) -> StoreResult<Option<Document>> {
        let err = db_err("read the balance");
        let mut docs: Vec<Document> = self
            .balance_collection()
            .find(doc! {})
            .limit(2)
            .await
            .map_err(&err)?
            .try_collect()
            .await
            .map_err(&err)?;
        if docs.len() > 1 {
            let total = self.balance_collection().count_documents(doc! {}).await.map_err(&err)?;
            return Err(StoreError::Malformed {
                collection: "balance",
                id: String::new(),
                reason: format!("the collection holds {total} documents; exactly one is allowed"),
            });
        }
        Ok(docs.pop())
    }

    /// [`Store::set_share`](crate::store::Store::set_share): the lease read, then one
    /// update conditional on the queue's `balance_token`. A leader deposed between the read
    /// and the update writes nothing once its successor fenced the queue, which it does
    /// before it reads the queues ([`Self::fence_shares`]); a write that lands before
    /// that is read by the successor's pass.
    pub(super) async fn set_share(&self, queue: ObjectId, share: Option<i64>, token: i64) -> StoreResult<bool> {
        let held = super::leases::lease(self, crate::store::LEADER_LEASE)
            .await?
            .is_some_and(|l| l.token == token && l.holder(DateTime::now()).is_some());
        if !held {
            return Ok(false);
        }
        let mut filter = fenced_for(token);
        filter.insert("_id", queue);
        let set = doc! { "maxthreads": share.map_or(Bson::Null, Bson::Int64), BALANCE_TOKEN: token };
        let r = self
            .queues
            .update_one(filter, doc! { "$set": set })
            .await
            .map_err(db_err("write a QueueBalance share"))?;
        Ok(r.matched_count == 1)
    }

    /// [`Store::fence_shares`](crate::store::Store::fence_shares): one update of the
    /// queues fenced by a lower token (none after a leader's first pass).
    pub(super) async fn fence_shares(&self, queues: &[ObjectId], token: i64) -> StoreResult<()> {
        let mut filter = doc! { "$or": [
            { BALANCE_TOKEN: { "$exists": false } },
            { BALANCE_TOKEN: { "$lt": token } },
        ] };
        filter.insert(
            "_id",
            doc! { "$in": queues.iter().map(|q| Bson::ObjectId(*q)).collect::<Vec<_>>() },
        );
        self.database()
            .collection::<Document>(super::QUEUES)
            .update_many(filter, doc! { "$set": { BALANCE_TOKEN: token } })
            .await
            .map_err(db_err("fence the QueueBalance shares"))?;
        Ok(())
    }

    /// [`Store::set_balance`](crate::store::Store::set_balance).
    pub(super) async fn set_balance(&self, fields: Document) -> StoreResult<()> {
        self.balance_collection()
            .update_one(doc! {}, doc! { "$set": fields })
            .upsert(true)
            .await
            .map_err(db_err("write the balance"))?;
        Ok(())
    }
}
