//! Batches: a batch is recorded at its first submission, and the first size given wins
//! ([`size_to_set`]). The store inserts a batch unless it exists and sets a size only where
//! none is recorded ([`Store::insert_batch`], [`Store::set_batch_size_if_unset`]), so of two
//! first submissions at once one records the batch and one size stands.

use crate::store::{Batch, Store, StoreError, StoreResult};

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
    use super::size_to_set;

    #[test]
    fn the_first_size_given_wins() {
        assert_eq!(size_to_set(None, Some(3)), Some(3));
        assert_eq!(size_to_set(Some(3), Some(4)), None);
        assert_eq!(size_to_set(Some(3), None), None);
        assert_eq!(size_to_set(None, None), None);
    }
}
