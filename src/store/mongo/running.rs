//! The DEN's writes to a task it runs: the spec's claim, the start, progress reports, the
//! result (fenced on the claiming node), and giving back what a stopping DEN did not start.

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
    pub(super) async fn claim_task(&self, queue: &Queue, node: &str) -> StoreResult<Option<Task>> {
        self.claim_task_until(queue, node, None).await
    }

    /// [`MongoStore::claim_task`], made by the server only before `until` (by its clock) when
    /// given ([`Store::claim_before`](crate::store::Store::claim_before)): a claim that
    /// reaches the server later (the process stopped between the renewal and the claim, the
    /// request held up on the network) claims nothing.
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

    pub(super) async fn start_task(&self, task: ObjectId, node: &str) -> StoreResult<bool> {
        let result = self
            .tasks
            .update_one(
                doc! { "_id": task, "node": node, "status": status::CLAIMED },
                doc! { "$set": { "status": status::RUNNING, "mtime": DateTime::now() } },
            )
            .await
            .map_err(db_err("start task"))?;
        if result.matched_count == 1 {
            return Ok(true);
        }
        // A retry after a lost reply: the first attempt applied.
        let already = self
            .tasks
            .count_documents(doc! { "_id": task, "node": node, "status": status::RUNNING })
            .limit(1)
            .await
            .map_err(db_err("start task"))?;
        Ok(already == 1)
    }

    pub(super) async fn discard_files(&self, task: ObjectId, files: &[ObjectId]) -> StoreResult<()> {
        let used = self
            .tasks
            .find_one(doc! { "_id": task })
            .projection(doc! { "stdout": 1, "stderr": 1 })
            .await
            .map_err(db_err("read task outputs"))?
            .map(|d| {
                ["stdout", "stderr"]
                    .iter()
                    .filter_map(|k| d.get_object_id(k).ok())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        let unused: Vec<ObjectId> = files.iter().copied().filter(|f| !used.contains(f)).collect();
        Ok(gridfs::delete_files(&self.db, task, &unused).await?)
    }

    pub(super) async fn finish_task(
        &self,
        task: ObjectId,
        node: &str,
        status: i32,
        stdout: OutputValue,
        stderr: OutputValue,
        extra: &FinishExtra,
    ) -> StoreResult<bool> {
        let mut set = doc! {
            "status": status,
            "stdout": output_bson(&stdout),
            "stderr": output_bson(&stderr),
            "mtime": DateTime::now(),
        };
        if let Some(p) = &extra.progress {
            set.insert("progress", p.to_document());
        }
        let mut update = doc! { "$set": set };
        if let Some(a) = &extra.attempt {
            update.insert("$push", doc! { "attempts": a.to_document() });
        }
        let fence = doc! { "_id": task, "node": node, "status": status::RUNNING };
        let mut plain = fence.clone();
        // Submitted again but then killed: it ends here.
        plain.insert(
            "$or",
            vec![doc! { "rerun": { "$ne": true } }, doc! { "stop.action": "kill" }],
        );
        update.insert("$unset", doc! { "rerun": "" });
        let result = self
            .tasks
            .update_one(plain, update)
            .await
            .map_err(db_err("finish task"))?;
        if result.matched_count == 1 {
            return Ok(true);
        }
        // Submitted again while it ran: queued once more, this run kept in `attempts`.
        let record = crate::store::retries::rerun_record(node, status, &stdout, &stderr, extra);
        let mut again = fence;
        again.insert("rerun", true);
        let result = self
            .tasks
            .update_one(
                again,
                doc! {
                    "$set": {
                        "status": status::QUEUED,
                        "node": Bson::Null,
                        "stdout": Bson::Null,
                        "stderr": Bson::Null,
                        "mtime": DateTime::now(),
                    },
                    "$unset": { "progress": "", "rerun": "" },
                    "$push": { "attempts": record.to_document() },
                },
            )
            .await
            .map_err(db_err("finish task"))?;
        Ok(result.matched_count == 1)
    }

    pub(super) async fn write_progress(
        &self,
        task: ObjectId,
        node: &str,
        progress: &TaskProgress,
    ) -> StoreResult<bool> {
        let result = self
            .tasks
            .update_one(
                doc! { "_id": task, "node": node, "status": status::RUNNING },
                doc! { "$set": { "progress": progress.to_document() } },
            )
            .await
            .map_err(db_err("report progress"))?;
        Ok(result.matched_count == 1)
    }

    pub(super) async fn requeue_mine(&self, node: &str, tasks: &[ObjectId]) -> StoreResult<Vec<ObjectId>> {
        let mut requeued = Vec::new();
        for id in tasks {
            let ours = doc! { "_id": id, "node": node, "status": { "$in": status::BUSY.to_vec() } };
            let mut unasked = ours.clone();
            unasked.insert("stop.action", doc! { "$ne": "kill" });
            let result = self
                .tasks
                .update_one(
                    unasked,
                    doc! {
                        "$set": { "status": status::QUEUED, "node": null, "mtime": DateTime::now() },
                        "$unset": { "rerun": "" },
                    },
                )
                .await
                .map_err(db_err("requeue task"))?;
            if result.modified_count == 1 {
                requeued.push(*id);
                continue;
            }
            // A task someone asked to kill ends failed rather than running again.
            let mut asked = ours;
            asked.insert("stop.action", "kill");
            self.tasks
                .update_one(
                    asked,
                    doc! { "$set": {
                        "status": status::FAILED,
                        "stdout": "",
                        "stderr": crate::store::KILLED_AT_SHUTDOWN,
                        "mtime": DateTime::now(),
                    } },
                )
                .await
                .map_err(db_err("end killed task"))?;
        }
        Ok(requeued)
    }
}
