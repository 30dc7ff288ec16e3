//! Schedules on MongoDB: one document per schedule in the `schedules` collection,
//! `{_id: <name>, queue, params, cron, every, timezone, catch_up, catch_up_limit, overlap,
//! paused, anchor, last, last_task}`: the definition, replaced as a whole, and the progress
//! mark (`last`, `last_task`), changed only by compare-and-set on `last`. What is due is
//! decided above the store (`lifecycle::schedules`).

use bson::{doc, Bson, DateTime, Document};
use futures::TryStreamExt;

use super::{db_err, MongoStore};
use crate::model::Schedule;
use crate::store::schedule_doc::{definition_doc, definition_from};
use crate::store::{ScheduleMark, ScheduleRecord, StoreError, StoreResult};

/// Collection of schedules.
pub const SCHEDULES: &str = "schedules";

fn record_from(mut d: Document) -> StoreResult<ScheduleRecord> {
    let name = match d.remove("_id") {
        Some(Bson::String(s)) => s,
        other => {
            return Err(StoreError::Malformed {
                collection: SCHEDULES,
                id: other.map_or("?".into(), |b| b.to_string()),
                reason: "field `_id` must be a string".into(),
            })
        }
    };
    let last = match d.remove("last") {
        Some(Bson::DateTime(t)) => t,
        _ => {
            return Err(StoreError::Malformed {
                collection: SCHEDULES,
                id: name,
                reason: "field `last` must be a date".into(),
            })
        }
    };
    let task = match d.remove("last_task") {
        Some(Bson::ObjectId(id)) => Some(id),
        _ => None,
    };
    let schedule = definition_from(SCHEDULES, &name, d)?;
    Ok(ScheduleRecord {
        schedule,
        mark: ScheduleMark { last, task },
    })
}

fn mark_doc(mark: &ScheduleMark) -> Document {
    doc! { "last": mark.last, "last_task": mark.task.map_or(Bson::Null, Bson::ObjectId) }
}

impl MongoStore {
    fn schedule_docs(&self) -> mongodb::Collection<Document> {
        self.db.collection(SCHEDULES)
    }

    /// [`Store::schedules`](crate::store::Store::schedules).
    pub(super) async fn schedules(&self) -> StoreResult<Vec<ScheduleRecord>> {
        let docs: Vec<Document> = self
            .schedule_docs()
            .find(doc! {})
            .sort(doc! { "_id": 1 })
            .await
            .map_err(db_err("read the schedules"))?
            .try_collect()
            .await
            .map_err(db_err("read the schedules"))?;
        let mut out = Vec::with_capacity(docs.len());
        for d in docs {
            match record_from(d) {
                Ok(r) => out.push(r),
                Err(e) => self.warn_once(format!("{e}; the schedule is left out")),
            }
        }
        Ok(out)
    }

    /// [`Store::schedule`](crate::store::Store::schedule).
    pub(super) async fn schedule(&self, name: &str) -> StoreResult<Option<ScheduleRecord>> {
        let found = self
            .schedule_docs()
            .find_one(doc! { "_id": name })
            .await
            .map_err(db_err("read a schedule"))?;
        found.map(record_from).transpose()
    }

    /// [`Store::put_schedule`](crate::store::Store::put_schedule): one upsert, the mark
    /// set on insert (or always, when given).
    pub(super) async fn put_schedule(&self, schedule: &Schedule, mark: Option<&ScheduleMark>) -> StoreResult<()> {
        let def = definition_doc(schedule)?;
        let err = db_err("write a schedule");
        let update = match mark {
            // A new schedule takes the mark; an existing one's moves up to it, never back
            // (a leader may have moved it since it was read), its task kept.
            Some(m) => doc! {
                "$set": def,
                "$max": { "last": m.last },
                "$setOnInsert": { "last_task": m.task.map_or(Bson::Null, Bson::ObjectId) },
            },
            None => {
                let done = self
                    .schedule_docs()
                    .update_one(doc! { "_id": &schedule.name }, doc! { "$set": def })
                    .await
                    .map_err(&err)?;
                if done.matched_count == 1 {
                    return Ok(());
                }
                return Err(StoreError::Invalid(format!(
                    "schedule {:?}: a new schedule needs its mark",
                    schedule.name
                )));
            }
        };
        self.schedule_docs()
            .update_one(doc! { "_id": &schedule.name }, update)
            .upsert(true)
            .await
            .map_err(&err)?;
        Ok(())
    }

    /// [`Store::delete_schedule`](crate::store::Store::delete_schedule).
    pub(super) async fn delete_schedule(&self, name: &str) -> StoreResult<bool> {
        let done = self
            .schedule_docs()
            .delete_one(doc! { "_id": name })
            .await
            .map_err(db_err("delete a schedule"))?;
        Ok(done.deleted_count == 1)
    }

    /// [`Store::advance_schedule`](crate::store::Store::advance_schedule): one update
    /// conditional on `last` as read.
    pub(super) async fn advance_schedule(&self, name: &str, expect: DateTime, new: &ScheduleMark) -> StoreResult<bool> {
        let done = self
            .schedule_docs()
            .update_one(doc! { "_id": name, "last": expect }, doc! { "$set": mark_doc(new) })
            .await
            .map_err(db_err("advance a schedule"))?;
        Ok(done.matched_count == 1)
    }
}
