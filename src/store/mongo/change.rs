//! Fenced task changes on MongoDB ([`crate::store::change`]): a fence becomes a filter,
//! a change an update of `$set`, `$unset` and `$push`.

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use futures::TryStreamExt;
use mongodb::options::{ReadPreference, SelectionCriteria};

use super::bulk::FencedUpdate;
use super::records::output_bson;
use super::{db_err, unclaimed, MongoStore};
use crate::store::change::{NodeIs, StopIs, TaskChange, TaskFence, Write};
use crate::store::{StoreResult, TaskTarget};

/// Most ids named in one `updateMany` of [`MongoStore::change_where`].
const CHUNK: usize = 1000;

/// The filter of `fence`. A fence on `mtime` is a compare-and-set on a task as read, so
/// its statuses and `mtime` match every form the lenient reader reads as those values
/// ([`status_forms`], [`mtime_forms`]): a task a Disbatch 4 tool wrote stays within reach.
pub(super) fn fence_filter(fence: &TaskFence) -> Document {
    let mut f = Document::new();
    match fence.statuses.as_deref() {
        Some(read) if fence.mtime.is_some() => {
            f.insert("status", doc! { "$in": status_forms(read) });
        }
        None => {}
        Some([one]) => {
            f.insert("status", *one);
        }
        Some(many) => {
            f.insert("status", doc! { "$in": many.to_vec() });
        }
    }
    match &fence.node {
        NodeIs::Any => {}
        NodeIs::Unclaimed => {
            f.insert("node", unclaimed());
        }
        NodeIs::Node(n) => {
            f.insert("node", n.as_str());
        }
    }
    if let Some(t) = fence.mtime {
        f.insert("mtime", doc! { "$in": mtime_forms(t) });
    }
    match fence.stop {
        StopIs::Any => {}
        StopIs::None => {
            f.insert("stop", Bson::Null);
        }
        StopIs::Kill => {
            f.insert("stop.action", "kill");
        }
        StopIs::NotKill => {
            f.insert("stop.action", doc! { "$ne": "kill" });
        }
    }
    match fence.rerun {
        None => {}
        Some(true) => {
            f.insert("rerun", true);
        }
        Some(false) => {
            f.insert("rerun", doc! { "$ne": true });
        }
    }
    if let Some(t) = fence.due_by {
        f.insert("run_at", doc! { "$lte": t });
    }
    f
}

/// The stored forms the lenient reader reads as these statuses: each number (a query on a
/// number matches every numeric type) and its decimal string.
fn status_forms(statuses: &[i32]) -> Vec<Bson> {
    statuses
        .iter()
        .flat_map(|s| [Bson::Int32(*s), Bson::String(s.to_string())])
        .collect()
}

/// The stored forms the lenient reader reads as `mtime` ([`super::records::as_date`]):
/// the date, or the epoch number in milliseconds or in seconds.
fn mtime_forms(mtime: DateTime) -> Vec<Bson> {
    let ms = mtime.timestamp_millis();
    vec![Bson::DateTime(mtime), Bson::Int64(ms), Bson::Double(ms as f64 / 1000.0)]
}

/// The filter of `target`'s tasks.
fn target_filter(target: TaskTarget) -> Document {
    match target {
        TaskTarget::Task(id) => doc! { "_id": id },
        TaskTarget::Queue(q) => doc! { "queue": q },
        TaskTarget::All => Document::new(),
    }
}

/// Puts `key` in `$set` (or clears it: null, or absent with `unset`) as `w` says.
fn write_field<T>(w: &Write<T>, key: &str, value: impl Fn(&T) -> Bson, unset: bool, u: &mut Update) {
    match w {
        Write::Keep => {}
        Write::Clear if unset => {
            u.unset.insert(key, "");
        }
        Write::Clear => {
            u.set.insert(key, Bson::Null);
        }
        Write::Set(v) => {
            u.set.insert(key, value(v));
        }
    }
}

#[derive(Default)]
struct Update {
    set: Document,
    unset: Document,
}

/// The update of `change`, writing `now` as `mtime` when it touches the task.
pub(super) fn change_update(change: &TaskChange, now: DateTime) -> StoreResult<Document> {
    change.check_for_named()?;
    let mut u = Update::default();
    if let Some(s) = change.status {
        u.set.insert("status", s);
    }
    write_field(&change.node, "node", |n| Bson::String(n.clone()), false, &mut u);
    write_field(&change.stdout, "stdout", output_bson, false, &mut u);
    write_field(&change.stderr, "stderr", output_bson, false, &mut u);
    write_field(&change.progress, "progress", |p| p.to_document().into(), true, &mut u);
    write_field(&change.stop, "stop", |s| s.to_document().into(), true, &mut u);
    write_field(&change.run_at, "run_at", |t| Bson::DateTime(*t), false, &mut u);
    if let Some(t) = change.started {
        u.set.insert("started", t);
    }
    match &change.avoid {
        Write::Keep => {}
        Write::Clear => {
            u.unset.insert("avoid_node", "");
            u.unset.insert("avoid_until", "");
        }
        Write::Set((node, until)) => {
            u.set.insert("avoid_node", node.as_str());
            u.set.insert("avoid_until", *until);
        }
    }
    match change.rerun {
        None => {}
        Some(true) => {
            u.set.insert("rerun", true);
        }
        Some(false) => {
            u.unset.insert("rerun", "");
        }
    }
    if let Some(p) = change.priority {
        u.set.insert("priority", p);
    }
    if let Some(p) = &change.params {
        u.set.insert("params", p.clone());
    }
    if change.touch {
        u.set.insert("mtime", now);
    }
    let mut update = Document::new();
    if !u.set.is_empty() {
        update.insert("$set", u.set);
    }
    if !u.unset.is_empty() {
        update.insert("$unset", u.unset);
    }
    if let Some(a) = &change.attempt {
        // The last `ATTEMPTS_KEPT` records stay; `attempts_recorded` counts every record
        // ever appended, so the task knows how many were dropped.
        let kept = -i64::try_from(crate::model::ATTEMPTS_KEPT).unwrap_or(i64::MAX);
        update.insert(
            "$push",
            doc! { "attempts": { "$each": [a.to_document()], "$slice": kept } },
        );
        update.insert("$inc", doc! { "attempts_recorded": 1_i64 });
    }
    Ok(update)
}

/// `rest` with the condition on `_id` first. A server that plans by the order of the
/// filter's fields (the test server does) then finds the task by its `_id` index instead of
/// scanning a status index: with the fence's fields first, a fenced update of one task
/// among 20,000 took 38 ms there instead of 0.3 ms.
pub(super) fn id_first(id: impl Into<Bson>, rest: Document) -> Document {
    let mut filter = doc! { "_id": id.into() };
    for (k, v) in rest {
        if k != "_id" {
            filter.insert(k, v);
        }
    }
    filter
}

/// One entry of [`Store::change_tasks`](crate::store::Store::change_tasks) as the fenced
/// update of its task, written at `now`.
pub(super) fn fenced(
    (id, fence, change): &(ObjectId, TaskFence, TaskChange),
    now: DateTime,
) -> StoreResult<FencedUpdate> {
    Ok(FencedUpdate {
        filter: id_first(*id, fence_filter(fence)),
        update: change_update(change, now)?,
    })
}

impl MongoStore {
    /// [`Store::change_tasks`](crate::store::Store::change_tasks): one fenced update per
    /// entry, in order, grouped with the other calls made meanwhile (`mongo/bulk.rs`).
    pub(super) async fn change_tasks(&self, changes: &[(ObjectId, TaskFence, TaskChange)]) -> StoreResult<Vec<bool>> {
        if changes.is_empty() {
            return Ok(Vec::new());
        }
        let now = DateTime::now();
        let updates = changes
            .iter()
            .map(|c| fenced(c, now))
            .collect::<StoreResult<Vec<_>>>()?;
        self.updates.apply(updates).await
    }

    /// [`Store::change_where`](crate::store::Store::change_where): the ids the fence holds
    /// for, read from the primary, then one `updateMany` per [`CHUNK`] of them under the
    /// same fence. When a chunk's update matched fewer than it names (others changed some
    /// meanwhile), the ids written are read back by the values just written (`mtime`
    /// among them).
    pub(super) async fn change_where(
        &self,
        target: TaskTarget,
        fence: &TaskFence,
        change: &TaskChange,
    ) -> StoreResult<Vec<ObjectId>> {
        change.check_for_matching()?;
        let err = db_err("change tasks");
        let mut filter = fence_filter(fence);
        filter.extend(target_filter(target));
        let primary = SelectionCriteria::ReadPreference(ReadPreference::Primary);
        let found: Vec<Document> = self
            .tasks
            .find(filter.clone())
            .selection_criteria(primary.clone())
            .projection(doc! { "_id": 1 })
            .await
            .map_err(&err)?
            .try_collect()
            .await
            .map_err(&err)?;
        let ids: Vec<ObjectId> = found.iter().filter_map(|d| d.get_object_id("_id").ok()).collect();
        let mut changed = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(CHUNK) {
            let now = DateTime::now();
            let update = change_update(change, now)?;
            let named = id_first(doc! { "$in": chunk.to_vec() }, filter.clone());
            let result = self.tasks.update_many(named, update.clone()).await.map_err(&err)?;
            if result.matched_count as usize == chunk.len() {
                changed.extend_from_slice(chunk);
                continue;
            }
            let mut written = doc! { "_id": { "$in": chunk.to_vec() } };
            if let Ok(set) = update.get_document("$set") {
                written.extend(set.clone());
            }
            let back = super::bulk::written_ids(&self.tasks, written).await?;
            changed.extend(back.iter().filter_map(Bson::as_object_id));
        }
        Ok(changed)
    }
}

#[cfg(test)]
mod tests {
    use bson::doc;
    use bson::oid::ObjectId;

    use super::{fence_filter, id_first};
    use crate::store::change::{NodeIs, TaskFence};

    #[test]
    fn a_fenced_change_finds_its_task_by_id_first() {
        let id = ObjectId::new();
        let fence = TaskFence::statuses(&[0]).on(NodeIs::Node("n1".into())).rerun(false);
        let filter = id_first(id, fence_filter(&fence));
        let keys: Vec<&str> = filter.keys().map(String::as_str).collect();
        assert_eq!(keys[0], "_id", "{filter}");
        assert!(keys.len() > 2, "the fence's conditions are kept: {filter}");
        let replaced = id_first(id, doc! { "status": 0, "_id": 7 });
        assert_eq!(replaced, doc! { "_id": id, "status": 0 });
    }
}
