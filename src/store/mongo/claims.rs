//! The spec's claim (a claimed task that cannot be read is failed at once).

use super::*;

impl MongoStore {
    /// Marks a claimed task that cannot be parsed as failed, so it neither blocks its
    /// queue nor stays claimed, and says why in its stderr.
    pub(super) async fn fail_malformed_claim(&self, raw: &Document, node: &str, reason: &StoreError) {
        let Some(Bson::ObjectId(id)) = raw.get("_id") else {
            return;
        };
        let update = doc! { "$set": {
            "status": status::FAILED,
            "stderr": format!("disbatch: cannot run this task: {reason}"),
            "mtime": DateTime::now(),
        }};
        if let Err(e) = self
            .tasks
            .update_one(doc! { "_id": id, "node": node, "status": status::CLAIMED }, update)
            .await
        {
            tracing::warn!(task = %id, error = %e, "could not mark a malformed task failed");
        }
    }

    /// Claims as [`Store::claim`] says. A claimed document that cannot be read as a task
    /// is marked failed (status 2, the reason in `stderr`) so it neither blocks the queue
    /// nor waits for the orphan sweep, and the error is returned.
    pub(super) async fn claim(&self, queue: &Queue, node: &str) -> StoreResult<Option<Task>> {
        self.claim_task_until(queue, node, None).await
    }

    /// [`MongoStore::claim_task`], made by the server only before `until` (by its clock) when
    /// given ([`Store::claim_before`](crate::store::Store::claim_before)): a claim that
    /// reaches the server later (the process was stopped between the renewal and the claim,
    /// the request was held up on the network) claims nothing.
    pub(super) async fn claim_task_until(
        &self,
        queue: &Queue,
        node: &str,
        until: Option<DateTime>,
    ) -> StoreResult<Option<Task>> {
        let mut filter = doc! {
            "node": unclaimed(),
            "status": status::QUEUED,
            "queue": queue.id,
            "$nor": [{ "avoid_node": node, "avoid_until": { "$gt": DateTime::now() } }],
        };
        if let Some(until) = until {
            filter.insert("$expr", doc! { "$lt": ["$$NOW", until] });
        }
        let mut options = FindOneAndUpdateOptions::default();
        options.return_document = Some(ReturnDocument::After);
        options.sort = Some(match queue.sort {
            Sort::Fifo => doc! { "priority": -1, "_id": 1 },
            Sort::Lifo => doc! { "priority": -1, "_id": -1 },
            Sort::Default => doc! { "priority": -1 },
        });
        let claimed = self
            .tasks
            .find_one_and_update(
                filter,
                doc! { "$set": { "node": node, "status": status::CLAIMED, "mtime": DateTime::now() } },
            )
            .with_options(options)
            .await
            .map_err(db_err("claim task"))?;
        let Some(raw) = claimed else {
            return Ok(None);
        };
        match task_from(&raw) {
            Ok(task) => Ok(Some(task)),
            Err(e) => {
                self.fail_malformed_claim(&raw, node, &e).await;
                Err(e)
            }
        }
    }
}
