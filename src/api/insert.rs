//! Inserting the tasks of one request in parts of [`INSERT_BATCH`], so that a failure
//! midway answers with what is known ([`ApiError::PartlyCreated`]).

use bson::oid::ObjectId;

use super::error::PartlyCreated;
use super::{ApiError, Shared};
use crate::store::NewTask;

/// Tasks inserted per store call.
pub(super) const INSERT_BATCH: usize = 1000;

/// Inserts `tasks` in order, [`INSERT_BATCH`] per store call; their ids, or the error with
/// what was created before it ([`ApiError::PartlyCreated`]).
pub(super) async fn insert_in_parts(
    state: &Shared,
    queue: ObjectId,
    mut rest: Vec<NewTask>,
) -> Result<Vec<ObjectId>, ApiError> {
    let total = rest.len();
    let mut created = Vec::with_capacity(total);
    while !rest.is_empty() {
        let tail = rest.split_off(rest.len().min(INSERT_BATCH));
        let part = std::mem::replace(&mut rest, tail);
        let ids: Vec<ObjectId> = part.iter().map(|t| t.id).collect();
        if let Err(error) = state.store.insert_tasks(queue, part).await {
            return Err(ApiError::PartlyCreated(Box::new(PartlyCreated {
                error,
                queue,
                total,
                created,
                unconfirmed: ids,
            })));
        }
        created.extend(ids);
    }
    Ok(created)
}
