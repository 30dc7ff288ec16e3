//! Batches: a batch is recorded at its first submission, and the first size given wins
//! ([`size_to_set`]). The store inserts a batch unless it exists and sets a size only where
//! none is recorded ([`Store::insert_batch`], [`Store::set_batch_size_if_unset`]), so of two
//! first submissions at once one records the batch and one size stands.
//!
//! A batch is complete ([`complete`]) once it has tasks, none of them unended, and at least
//! its `size` of them, or once retention closed it (`closed`, recorded just before it
//! deletes the tasks of a complete batch, so that a batch it deleted in part still reads
//! complete). The API, the dependencies and retention all ask this one rule.

use crate::model::status;
use crate::store::{Batch, StatusCounts, Store, StoreError, StoreResult};

/// When retention closed `batch` (RFC 3339), if it did: the reason a closed batch refuses
/// new tasks and fails the tasks that wait for it.
pub fn closed_at(batch: &Batch) -> Option<String> {
    batch.closed.map(|c| c.try_to_rfc3339_string().unwrap_or_default())
}

/// Whether `batch`, whose tasks count `counts` by status, is complete.
pub fn complete(batch: &Batch, counts: &StatusCounts) -> bool {
    let total: u64 = counts.values().sum();
    let unended = counts.iter().any(|(code, n)| *n > 0 && !status::finished(*code));
    let full = batch.closed.is_some() || batch.size.is_none_or(|s| total >= u64::try_from(s).unwrap_or(0));
    total > 0 && !unended && full
}

/// The size to record for a batch recorded with `recorded` when a submission gives
/// `given`: only a first size, never a change of one.
pub fn size_to_set(recorded: Option<i64>, given: Option<i64>) -> Option<i64> {
    match (recorded, given) {
        (None, Some(n)) => Some(n),
        _ => None,
    }
}

/// Records batch `id` at its first submission, with `size` when given (a batch recorded
/// without a size takes the first size given later). Answers the batch as recorded, whose
/// size may differ from `size`: the caller refuses such a submission.
pub async fn open_batch(store: &(impl Store + ?Sized), id: &str, size: Option<i64>) -> StoreResult<Batch> {
    store.insert_batch(id, size).await?;
    let batch = read(store, id).await?;
    match size_to_set(batch.size, size) {
        Some(n) => {
            store.set_batch_size_if_unset(id, n).await?;
            read(store, id).await
        }
        None => Ok(batch),
    }
}

async fn read(store: &(impl Store + ?Sized), id: &str) -> StoreResult<Batch> {
    store.batch(id).await?.ok_or_else(|| StoreError::Malformed {
        collection: "batches",
        id: id.to_string(),
        reason: "the batch vanished while it was recorded".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::{complete, size_to_set};
    use crate::model::status;
    use crate::store::{Batch, StatusCounts};

    #[test]
    fn a_batch_is_complete_when_full_and_ended_or_once_closed() {
        let mut b = Batch {
            id: "b".into(),
            size: Some(3),
            ctime: bson::DateTime::now(),
            dependents: false,
            closed: None,
        };
        let counts = |pairs: &[(i32, u64)]| pairs.iter().copied().collect::<StatusCounts>();
        assert!(!complete(&b, &counts(&[])));
        assert!(!complete(&b, &counts(&[(status::SUCCEEDED, 2)])));
        assert!(complete(&b, &counts(&[(status::SUCCEEDED, 2), (status::FAILED, 1)])));
        assert!(!complete(&b, &counts(&[(status::SUCCEEDED, 2), (status::QUEUED, 1)])));
        // A code of no known status (another tool's) has not ended.
        assert!(!complete(&b, &counts(&[(status::SUCCEEDED, 2), (-9, 1)])));
        b.closed = Some(bson::DateTime::now());
        assert!(complete(&b, &counts(&[(status::FAILED, 1)])));
        assert!(!complete(&b, &counts(&[(status::FAILED, 1), (status::RUNNING, 1)])));
        assert!(!complete(&b, &counts(&[])));
        b.closed = None;
        b.size = None;
        assert!(complete(&b, &counts(&[(status::CANCELLED, 1)])));
    }

    #[test]
    fn the_first_size_given_wins() {
        assert_eq!(size_to_set(None, Some(3)), Some(3));
        assert_eq!(size_to_set(Some(3), Some(4)), None);
        assert_eq!(size_to_set(Some(3), None), None);
        assert_eq!(size_to_set(None, None), None);
    }
}
