//! The QueueBalance document: Disbatch 4's `balance` collection, which holds exactly one.

use bson::{doc, Document};
use futures::TryStreamExt;

use super::{db_err, MongoStore};
use crate::store::{StoreError, StoreResult};

/// Collection of the QueueBalance document.
pub const BALANCE: &str = "balance";

impl MongoStore {
    fn balance_collection(&self) -> mongodb::Collection<Document> {
        self.db.collection(BALANCE)
    }

    /// [`Store::balance`](crate::store::Store::balance).
    pub(super) async fn read_balance(&self) -> StoreResult<Option<Document>> {
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

    /// [`Store::set_balance`](crate::store::Store::set_balance).
    pub(super) async fn write_balance(&self, fields: Document) -> StoreResult<()> {
        self.balance_collection()
            .update_one(doc! {}, doc! { "$set": fields })
            .upsert(true)
            .await
            .map_err(db_err("write the balance"))?;
        Ok(())
    }
}
