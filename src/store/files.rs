//! Output files as data, for the sweep of files no task uses (`lifecycle::files`): every
//! store lists its files in id order ([`FileStore`]). The rule — which files a task uses,
//! and how old a file must be before it may go — is in `lifecycle::files` and the model.

use async_trait::async_trait;
use bson::oid::ObjectId;
use bson::DateTime;

use super::StoreResult;

/// An output file as listed: its id, the task it was written for (`metadata.task_id`; none
/// when it names no task, a file another tool wrote) and when it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredFile {
    /// The file's id.
    pub id: ObjectId,
    /// The task it was written for.
    pub task: Option<ObjectId>,
    /// When it was written (`uploadDate`; none when it has no time).
    pub uploaded: Option<DateTime>,
}

/// The listing of output files (GridFS `tasks.files` on MongoDB, `output_files` on the
/// embedded store).
#[async_trait]
pub trait FileStore: Send + Sync {
    /// At most `limit` output files in id order, those with ids after `after` (all when
    /// `None`).
    async fn output_files(&self, after: Option<ObjectId>, limit: usize) -> StoreResult<Vec<StoredFile>>;
}
