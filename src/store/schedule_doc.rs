//! A schedule as both stores keep it: its definition ([`Schedule`]) as one BSON document,
//! and its progress mark ([`ScheduleMark`]) beside it, changed only by compare-and-set
//! ([`Store::advance_schedule`](crate::store::Store::advance_schedule)). Which occurrences
//! are due is decided above the store (`lifecycle::schedules`).

use bson::oid::ObjectId;
use bson::{DateTime, Document};

use super::{StoreError, StoreResult};
use crate::model::Schedule;

/// How far a schedule's occurrences were handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleMark {
    /// The newest occurrence handled (its task created, or skipped); at first the
    /// schedule's creation time, so no occurrence before it is ever created.
    pub last: DateTime,
    /// The task of the newest occurrence created, if any.
    pub task: Option<ObjectId>,
}

/// A schedule as stored: its definition and its mark.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleRecord {
    /// The definition.
    pub schedule: Schedule,
    /// The progress mark.
    pub mark: ScheduleMark,
}

/// The definition as a BSON document (without its name, which is the key).
pub(crate) fn definition_doc(s: &Schedule) -> StoreResult<Document> {
    let mut d = bson::to_document(s).map_err(|e| StoreError::Invalid(format!("schedule {:?}: {e}", s.name)))?;
    d.remove("name");
    Ok(d)
}

/// A stored definition read back: `name` is its key.
pub(crate) fn definition_from(collection: &'static str, name: &str, mut d: Document) -> StoreResult<Schedule> {
    d.insert("name", name);
    bson::from_document(d).map_err(|e| StoreError::Malformed {
        collection,
        id: name.to_owned(),
        reason: e.to_string(),
    })
}
