//! The DEN's side of the embedded store: claiming tasks, and recovering those of dead
//! nodes.

use bson::oid::ObjectId;
use bson::DateTime;

use rusqlite::{params, Connection, OptionalExtension, Transaction};

use super::records::{db_err, task_from_row, CLAIMED_COLUMNS};
use super::{change, SqliteStore, Touched};
use crate::model::{status, Queue, Sort, Task};
use crate::store::{EndAndClaim, StoreResult, TaskChange, TaskFence};

/// Creates the indexes of the claim: queued tasks only (a claim takes its task out of
/// them, a finish does not touch them), by queue in each claim order, so a claim reads
/// one entry however many tasks are queued.
pub(super) fn migrate(conn: &Connection) -> StoreResult<()> {
    let queued = status::QUEUED;
    conn.execute_batch(&format!(
        "CREATE INDEX IF NOT EXISTS tasks_queued_fifo ON tasks (queue, priority DESC, id ASC)
             WHERE status = {queued} AND node IS NULL;
         CREATE INDEX IF NOT EXISTS tasks_queued_lifo ON tasks (queue, priority DESC, id DESC)
             WHERE status = {queued} AND node IS NULL;"
    ))
    .map_err(db_err("create the claim's indexes"))
}

impl SqliteStore {
    pub(super) async fn has_queued(&self, queue: ObjectId) -> StoreResult<bool> {
        self.with(move |conn| {
            conn.prepare_cached(&format!(
                "SELECT EXISTS (SELECT 1 FROM tasks WHERE queue = ?1 AND status = {} AND node IS NULL)",
                status::QUEUED
            ))
            .and_then(|mut s| s.query_row(params![queue.to_hex()], |r| r.get(0)))
            .map_err(db_err("look for queued tasks"))
        })
        .await
    }

    /// Claims with one `UPDATE … WHERE id = (SELECT … LIMIT 1) RETURNING …` in an
    /// immediate transaction. A claimed row that cannot be read as a task is marked failed
    /// (status 2, the reason in `stderr`) and the error returned.
    pub(super) async fn claim(&self, queue: &Queue, node: &str) -> StoreResult<Option<Task>> {
        self.claim_as(queue, node, status::CLAIMED, None).await
    }

    /// [`Store::claim_to_run`](crate::store::Store::claim_to_run): claimed and started in
    /// one transaction, so the task comes back running (0).
    pub(super) async fn claim_to_run(&self, queue: &Queue, node: &str) -> StoreResult<Option<Task>> {
        self.claim_as(queue, node, status::RUNNING, None).await
    }

    /// [`Store::claim_before`](crate::store::Store::claim_before): [`Self::claim_to_run`],
    /// made only while the clock, read inside the write transaction, is before `until`; a
    /// process stopped on its way to the writer claims nothing once it is past.
    pub(super) async fn claim_before(&self, queue: &Queue, node: &str, until: DateTime) -> StoreResult<Option<Task>> {
        self.claim_as(queue, node, status::RUNNING, Some(until)).await
    }

    /// Claims `queue`'s next task for `node`, giving it `claimed` (-1, or 0 to start it too),
    /// only while the clock inside the write transaction is before `until` when one is given.
    async fn claim_as(
        &self,
        queue: &Queue,
        node: &str,
        claimed: i32,
        until: Option<DateTime>,
    ) -> StoreResult<Option<Task>> {
        let (queue, node) = (queue.clone(), node.to_string());
        self.write_touching(
            "claim task",
            move |tx| claim_in_before(tx, &queue, &node, claimed, until),
            claimed_touched,
        )
        .await?
    }

    /// [`Store::finish_and_claim`](crate::store::Store::finish_and_claim): the end written
    /// as [`Store::change_tasks`](crate::store::Store::change_tasks) writes an entry, then,
    /// only when it was, [`Self::claim_before`], in one transaction.
    pub(super) async fn finish_and_claim(
        &self,
        end: &(ObjectId, TaskFence, TaskChange),
        queue: &Queue,
        node: &str,
        until: DateTime,
    ) -> StoreResult<EndAndClaim> {
        end.2.check_for_named()?;
        let (end, queue, node) = (end.clone(), queue.clone(), node.to_string());
        let ended_id = end.0;
        let queueing = change::queues(&end.2);
        let done = self
            .write_touching(
                "end the run and claim the next task",
                move |tx| {
                    let ended = change::change_one(tx, end.0, &end.1, &end.2)?;
                    let claimed = match ended {
                        true => claim_in_before(tx, &queue, &node, status::RUNNING, Some(until))?,
                        false => Ok(None),
                    };
                    Ok(EndAndClaim { ended, claimed })
                },
                |done| match (done.ended, claimed_touched(&done.claimed)) {
                    (false, touched) => touched,
                    (true, Touched::Tasks(mut ids)) => {
                        ids.push(ended_id);
                        Touched::Tasks(ids)
                    }
                    (true, Touched::Nothing) => Touched::Tasks(vec![ended_id]),
                    (true, Touched::Any) => Touched::Any,
                },
            )
            .await?;
        if done.ended && queueing {
            self.signal_queued();
        }
        Ok(done)
    }
}

/// [`claim_in`], made only while the clock, read inside the transaction, is before `until`
/// when one is given.
fn claim_in_before(
    tx: &Transaction<'_>,
    queue: &Queue,
    node: &str,
    claimed: i32,
    until: Option<DateTime>,
) -> StoreResult<StoreResult<Option<Task>>> {
    match until.is_none_or(|until| DateTime::now() < until) {
        true => claim_in(tx, queue, node, claimed),
        false => Ok(Ok(None)),
    }
}

/// The task a claim changed.
pub(super) fn claimed_touched(claimed: &StoreResult<Option<Task>>) -> Touched {
    match claimed {
        Ok(Some(t)) => Touched::Tasks(vec![t.id]),
        Ok(None) => Touched::Nothing,
        // The claimed row was marked failed; which one is in the error only.
        Err(_) => Touched::Any,
    }
}

/// Claims `queue`'s next task for `node` in `tx`, giving it status `claimed`. The outer
/// error fails the transaction; the inner one is a claimed row that cannot be read as a
/// task, marked failed (status 2, the reason in `stderr`) in `tx`, which must commit.
pub(super) fn claim_in(
    tx: &Transaction<'_>,
    queue: &Queue,
    node: &str,
    claimed: i32,
) -> StoreResult<StoreResult<Option<Task>>> {
    let order = match queue.sort {
        Sort::Fifo => "ORDER BY priority DESC, id ASC",
        Sort::Lifo => "ORDER BY priority DESC, id DESC",
        Sort::Default => "ORDER BY priority DESC",
    };
    // The queued status is written out, not bound, so the partial indexes of queued tasks
    // serve the search (see `migrate`).
    let sql = format!(
        "UPDATE tasks SET node = ?1, status = ?2, mtime = ?3
         WHERE id = (SELECT id FROM tasks WHERE queue = ?4 AND status = {queued} AND node IS NULL
                     AND (avoid_node IS NULL OR avoid_node <> ?1 OR avoid_until <= ?3) {order} LIMIT 1)
         RETURNING {CLAIMED_COLUMNS}",
        queued = status::QUEUED
    );
    let err = db_err("claim task");
    let now = DateTime::now().timestamp_millis();
    let found = tx
        .prepare_cached(&sql)
        .map_err(&err)?
        .query_row(params![node, claimed, now, queue.id.to_hex()], task_from_row)
        .optional()
        .map_err(&err)?;
    match found {
        None => Ok(Ok(None)),
        Some((_, Ok(task))) => Ok(Ok(Some(task))),
        Some((id, Err(e))) => {
            tx.execute(
                "UPDATE tasks SET status = ?1, stderr = ?2, stderr_file = NULL, mtime = ?3 WHERE id = ?4",
                params![status::FAILED, format!("disbatch: cannot run this task: {e}"), now, id],
            )
            .map_err(db_err("fail malformed task"))?;
            Ok(Err(e))
        }
    }
}
