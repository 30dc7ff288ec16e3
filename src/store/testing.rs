//! Conveniences for tests and benchmarks, built on the [`Store`] trait alone: [`StoreExt`].
//!
//! They are not part of the store boundary (no store implements them, and no code of the
//! crate calls them): every store gets them through the blanket implementation, so tests
//! can write `store.create_tasks(queue, params)` on any store.

use async_trait::async_trait;
use bson::oid::ObjectId;
use bson::Document;

use super::{NewTask, Store, StoreResult};

/// Test conveniences over any [`Store`]; `use disbatch::store::testing::StoreExt;`.
#[async_trait]
pub trait StoreExt: Store {
    /// [`Store::insert_tasks`] of queued tasks with new ids, one per params document.
    /// Returns their ids in order.
    async fn create_tasks(&self, queue: ObjectId, params: Vec<Document>) -> StoreResult<Vec<ObjectId>> {
        let tasks: Vec<NewTask> = params
            .into_iter()
            .map(|p| NewTask::queued(ObjectId::new(), p))
            .collect();
        let ids = tasks.iter().map(|t| t.id).collect();
        self.insert_tasks(queue, tasks).await?;
        Ok(ids)
    }
    /// [`Store::put_output_file`] under a new file id; returns the id.
    async fn write_output_file(&self, task: ObjectId, filename: &str, text: &str) -> StoreResult<ObjectId> {
        let file = ObjectId::new();
        self.put_output_file(file, task, filename, text).await?;
        Ok(file)
    }
}

impl<S: Store + ?Sized> StoreExt for S {}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::test_support::rust_files as sources;

    /// The conveniences are for tests: no code of the crate but this module names them.
    #[test]
    fn no_code_of_the_crate_uses_the_test_conveniences() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let this = src.join("store/testing.rs");
        let users: Vec<_> = sources(&src)
            .into_iter()
            .filter(|f| *f != this)
            .filter(|f| std::fs::read_to_string(f).unwrap().contains("StoreExt"))
            .collect();
        assert!(users.is_empty(), "StoreExt is for tests only, yet named in {users:?}");
    }
}
