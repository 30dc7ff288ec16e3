//! Schedules in the embedded store: one row of `schedules(name, doc, last, last_task)` per
//! schedule, the definition as BSON (as MongoDB's `schedules` document holds it) and the
//! progress mark beside it, changed only by compare-and-set on `last`, by the rules of
//! MongoDB's `schedules` collection. What is due is decided above the store
//! (`lifecycle::schedules`).

use bson::oid::ObjectId;
use bson::DateTime;
use rusqlite::{params, OptionalExtension};

use super::records::{bson_bytes, db_err, read_bson};
use super::SqliteStore;
use crate::model::Schedule;
use crate::store::schedule_doc::{definition_doc, definition_from};
use crate::store::{ScheduleMark, ScheduleRecord, StoreError, StoreResult};

/// The table's name, as the collection's.
const SCHEDULES: &str = "schedules";

/// The `schedules` table.
pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS schedules (
    name TEXT PRIMARY KEY NOT NULL,
    doc BLOB NOT NULL,
    last INTEGER NOT NULL,
    last_task TEXT
);";

type Row = (String, Vec<u8>, i64, Option<String>);

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
}

fn record_from((name, bytes, last, task): Row) -> StoreResult<ScheduleRecord> {
    let d = read_bson(SCHEDULES, &name, &bytes)?;
    let task = task
        .map(|t| {
            ObjectId::parse_str(&t).map_err(|e| StoreError::Malformed {
                collection: SCHEDULES,
                id: name.clone(),
                reason: format!("last_task is not an ObjectId: {e}"),
            })
        })
        .transpose()?;
    Ok(ScheduleRecord {
        schedule: definition_from(SCHEDULES, &name, d)?,
        mark: ScheduleMark {
            last: DateTime::from_millis(last),
            task,
        },
    })
}

impl SqliteStore {
    /// [`Store::schedules`](crate::store::Store::schedules).
    pub(super) async fn schedules(&self) -> StoreResult<Vec<ScheduleRecord>> {
        let rows = self
            .with(|conn| {
                let err = db_err("read the schedules");
                let mut stmt = conn
                    .prepare_cached("SELECT name, doc, last, last_task FROM schedules ORDER BY name")
                    .map_err(&err)?;
                let rows = stmt.query_map([], row).map_err(&err)?;
                rows.collect::<Result<Vec<_>, _>>().map_err(&err)
            })
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            match record_from(r) {
                Ok(r) => out.push(r),
                Err(e) => self.warn_once(format!("{e}; the schedule is left out")),
            }
        }
        Ok(out)
    }

    /// [`Store::schedule`](crate::store::Store::schedule).
    pub(super) async fn schedule(&self, name: &str) -> StoreResult<Option<ScheduleRecord>> {
        let name = name.to_owned();
        let found = self
            .with(move |conn| {
                conn.query_row(
                    "SELECT name, doc, last, last_task FROM schedules WHERE name = ?1",
                    [&name],
                    row,
                )
                .optional()
                .map_err(db_err("read a schedule"))
            })
            .await?;
        found.map(record_from).transpose()
    }

    /// [`Store::put_schedule`](crate::store::Store::put_schedule): one upsert, the mark
    /// set on insert (or always, when given).
    pub(super) async fn put_schedule(&self, schedule: &Schedule, mark: Option<&ScheduleMark>) -> StoreResult<()> {
        let bytes = bson_bytes(&definition_doc(schedule)?)?;
        let name = schedule.name.clone();
        let mark = mark.cloned();
        self.write_quiet("write a schedule", move |tx| {
            let err = db_err("write a schedule");
            let n = match &mark {
                Some(m) => tx.execute(
                    "INSERT INTO schedules (name, doc, last, last_task) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (name) DO UPDATE SET doc = ?2, last = MAX(last, ?3)",
                    params![name, bytes, m.last.timestamp_millis(), m.task.map(|t| t.to_hex())],
                ),
                None => tx.execute("UPDATE schedules SET doc = ?2 WHERE name = ?1", params![name, bytes]),
            }
            .map_err(err)?;
            if n == 0 {
                return Err(StoreError::Invalid(format!(
                    "schedule {name:?}: a new schedule needs its mark"
                )));
            }
            Ok(())
        })
        .await
    }

    /// [`Store::delete_schedule`](crate::store::Store::delete_schedule).
    pub(super) async fn delete_schedule(&self, name: &str) -> StoreResult<bool> {
        let name = name.to_owned();
        self.write_quiet("delete a schedule", move |tx| {
            let n = tx
                .execute("DELETE FROM schedules WHERE name = ?1", [&name])
                .map_err(db_err("delete a schedule"))?;
            Ok(n == 1)
        })
        .await
    }

    /// [`Store::advance_schedule`](crate::store::Store::advance_schedule): one update
    /// conditional on `last` as read.
    pub(super) async fn advance_schedule(&self, name: &str, expect: DateTime, new: &ScheduleMark) -> StoreResult<bool> {
        let (name, new) = (name.to_owned(), new.clone());
        self.write_quiet("advance a schedule", move |tx| {
            let n = tx
                .execute(
                    "UPDATE schedules SET last = ?3, last_task = ?4 WHERE name = ?1 AND last = ?2",
                    params![
                        name,
                        expect.timestamp_millis(),
                        new.last.timestamp_millis(),
                        new.task.map(|t| t.to_hex())
                    ],
                )
                .map_err(db_err("advance a schedule"))?;
            Ok(n == 1)
        })
        .await
    }
}
