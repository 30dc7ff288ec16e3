//! [`DocumentSource`]: documents of other collections, for `POST /tasks` with
//! `{queue, collection, filter, params}` (one task per matching document).
//!
//! Kept out of the [`Store`](crate::store::Store) trait on purpose: it reads arbitrary
//! user collections, which only a document database has. [`mongodb::Database`] implements it.

use async_trait::async_trait;
use bson::Document;
use futures::TryStreamExt;

/// Reads documents of a collection of the same database.
#[async_trait]
pub trait DocumentSource: Send + Sync + 'static {
    /// Up to `limit` documents of `collection` matching `filter`, in natural order, with
    /// only the fields `projection` selects (whole documents when `None`).
    async fn find(
        &self,
        collection: &str,
        filter: Document,
        projection: Option<Document>,
        limit: i64,
    ) -> Result<Vec<Document>, String>;
}

#[async_trait]
impl DocumentSource for mongodb::Database {
    async fn find(
        &self,
        collection: &str,
        filter: Document,
        projection: Option<Document>,
        limit: i64,
    ) -> Result<Vec<Document>, String> {
        let coll = self.collection::<Document>(collection);
        let mut find = coll.find(filter).limit(limit);
        if let Some(projection) = projection {
            find = find.projection(projection);
        }
        find.await
            .map_err(|e| e.to_string())?
            .try_collect()
            .await
            .map_err(|e| e.to_string())
    }
}
