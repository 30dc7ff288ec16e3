//! Rows of the SQLite store ↔ model types.
//!
//! Queue documents are read by [`crate::store::queue_doc`], as on MongoDB.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{DateTime, Document};

use crate::model::{Attempt, Output, Task};
use crate::store::{OutputValue, StoreError, StoreResult};

/// The columns of a task row, in the order [`task_from_row`] reads them.
pub(super) const TASK_COLUMNS: &str =
    "id, queue, ctime, mtime, node, status, params, stdout, stdout_file, stderr, stderr_file, run_at, stop, progress, priority, attempts, key, rerun, batch, after, after_failure, dependents, (SELECT json_group_array(dep) FROM task_deps WHERE task_deps.child = tasks.id AND task_deps.met IS NULL), started";

/// [`TASK_COLUMNS`] of a task just claimed, which waits for nothing (a `RETURNING` clause).
pub(super) const CLAIMED_COLUMNS: &str =
    "id, queue, ctime, mtime, node, status, params, stdout, stdout_file, stderr, stderr_file, run_at, stop, progress, priority, attempts, key, rerun, batch, after, after_failure, dependents, NULL, started";

/// A driver error as a store error, saying what was being done and whether retrying can
/// help: a busy or locked database (another process holds the write lock past the busy
/// timeout) and a database file that cannot be opened for now are transient
/// ([`StoreError::Database`]); everything else — a full disk, a read-only or corrupt file,
/// a constraint, a bad value — is permanent ([`StoreError::Rejected`]).
pub(super) fn db_err(op: &'static str) -> impl Fn(rusqlite::Error) -> StoreError {
    move |e| {
        let message = format!("{op}: {e}");
        if is_transient(&e) {
            StoreError::Database(message)
        } else {
            StoreError::Rejected(message)
        }
    }
}

/// Whether retrying the operation that failed with `e` may succeed.
pub(super) fn is_transient(e: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode;
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked | ErrorCode::CannotOpen)
    )
}

/// A lease's end in milliseconds since the epoch.
/// Adds to `table` those of `columns` (name, type) it lacks: a database file created by an
/// earlier release gets them on open.
pub(super) fn add_columns(conn: &rusqlite::Connection, table: &str, columns: &[(&str, &str)]) -> StoreResult<()> {
    let err = db_err("upgrade schema");
    let mut stmt = conn
        .prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))
        .map_err(&err)?;
    let present: Vec<String> = stmt
        .query_map([], |r| r.get(0))
        .map_err(&err)?
        .collect::<Result<_, _>>()
        .map_err(&err)?;
    for (name, ty) in columns {
        if !present.iter().any(|p| p == name) {
            match conn.execute(&format!("ALTER TABLE {table} ADD COLUMN {name} {ty}"), []) {
                Ok(_) => {}
                // Another process opening the same file added it first.
                Err(e) if e.to_string().contains("duplicate column name") => {}
                Err(e) => return Err(err(e)),
            }
        }
    }
    Ok(())
}

/// [`crate::store::lease_end`] as the embedded store's milliseconds.
pub(super) fn lease_end(now: DateTime, lease: Duration) -> i64 {
    crate::store::lease_end(now, lease).timestamp_millis()
}

/// A document as BSON bytes.
pub(super) fn bson_bytes(doc: &Document) -> StoreResult<Vec<u8>> {
    let mut bytes = Vec::new();
    doc.to_writer(&mut bytes)
        .map_err(|e| StoreError::Invalid(format!("document cannot be stored as BSON: {e}")))?;
    Ok(bytes)
}

/// BSON bytes read back as a document.
pub(super) fn read_bson(collection: &'static str, id: &str, bytes: &[u8]) -> StoreResult<Document> {
    Document::from_reader(&mut &bytes[..]).map_err(|e| StoreError::Malformed {
        collection,
        id: id.to_string(),
        reason: format!("stored BSON is unreadable: {e}"),
    })
}

/// The `(text, file id)` columns of a finishing task's stdout or stderr.
pub(super) fn output_columns(value: &OutputValue) -> (Option<String>, Option<String>) {
    match value {
        OutputValue::Inline(s) => (Some(s.clone()), None),
        OutputValue::File(id) => (None, Some(id.to_hex())),
    }
}

/// A task row ([`TASK_COLUMNS`]) as its id text and the task, or why it cannot be read.
/// Only errors of SQLite itself fail the row.
pub(super) fn task_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(String, StoreResult<Task>)> {
    let (id, task) = task_or_problem_from_row(r)?;
    let task = match task {
        Some(t) if t.problem.is_none() => Ok(t),
        Some(t) => Err(malformed(&id, t.problem.unwrap_or_default())),
        None => Err(malformed(&id, "field `_id` must be an ObjectId".into())),
    };
    Ok((id, task))
}

/// A task row ([`TASK_COLUMNS`]) as well as it can be read, as MongoDB's `task_or_problem`
/// reads a document: a field that cannot be read is left empty (an unreadable `status` as
/// [`Task::UNREADABLE_STATUS`], `queue` as [`Task::UNREADABLE_QUEUE`]) and named in the
/// task's `problem`. `None` only when the id is not an ObjectId. Only errors of SQLite
/// itself fail the row.
pub(super) fn task_or_problem_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(String, Option<Task>)> {
    let id: String = r.get(0)?;
    let queue: String = r.get(1)?;
    let ctime: i64 = r.get(2)?;
    let mtime: i64 = r.get(3)?;
    let node: Option<String> = r.get(4)?;
    let status: i64 = r.get(5)?;
    let params: Vec<u8> = r.get(6)?;
    let stdout: (Option<String>, Option<String>) = (r.get(7)?, r.get(8)?);
    let stderr: (Option<String>, Option<String>) = (r.get(9)?, r.get(10)?);
    let run_at: Option<i64> = r.get(11)?;
    let stop: Option<Vec<u8>> = r.get(12)?;
    let progress: Option<Vec<u8>> = r.get(13)?;
    let priority: i64 = r.get(14)?;
    let attempts: Option<Vec<u8>> = r.get(15)?;
    let (attempts, attempts_dropped) = attempts_column(&id, attempts.as_deref());
    let key: Option<String> = r.get(16)?;
    let rerun: Option<i64> = r.get(17)?;
    let batch: Option<String> = r.get(18)?;
    let after: Option<String> = r.get(19)?;
    let after_failure: Option<i64> = r.get(20)?;
    let dependents: Option<i64> = r.get(21)?;
    let pending: Option<String> = r.get(22)?;
    let started: Option<i64> = r.get(23)?;
    let Ok(oid) = ObjectId::parse_str(&id) else {
        return Ok((id, None));
    };
    let mut problems = Vec::new();
    let mut keep = |field: &str, e: String| problems.push(format!("field `{field}`: {e}"));
    let queue = ObjectId::parse_str(&queue).unwrap_or_else(|e| {
        keep("queue", format!("must be an ObjectId: {e}"));
        Task::UNREADABLE_QUEUE
    });
    let status = i32::try_from(status).unwrap_or_else(|_| {
        keep("status", "must be a 32-bit integer".into());
        Task::UNREADABLE_STATUS
    });
    let params = read_bson("tasks", &id, &params).unwrap_or_else(|e| {
        keep("params", reason_of(e));
        Document::new()
    });
    let mut output = |field: &str, (text, file): (Option<String>, Option<String>)| match (text, file) {
        (_, Some(f)) => match ObjectId::parse_str(&f) {
            Ok(f) => Some(Output::File(f)),
            Err(e) => {
                keep(field, format!("must be an ObjectId: {e}"));
                None
            }
        },
        (Some(t), None) => Some(Output::Inline(t)),
        (None, None) => None,
    };
    let stdout = output("stdout", stdout);
    let stderr = output("stderr", stderr);
    let stop = stop.and_then(|bytes| {
        let read = read_bson("tasks", &id, &bytes)
            .map_err(reason_of)
            .and_then(|d| crate::model::StopRequest::from_document(&d).map_err(|e| e.to_string()));
        read.map_err(|e| keep("stop", e)).ok()
    });
    let problem = (!problems.is_empty()).then(|| malformed(&id, problems.join("; ")).to_string());
    let task = Task {
        id: oid,
        queue,
        ctime: DateTime::from_millis(ctime),
        mtime: DateTime::from_millis(mtime),
        node,
        status,
        params,
        stdout,
        stderr,
        problem,
        run_at: run_at.map(DateTime::from_millis),
        started: started.map(DateTime::from_millis),
        priority: Some(priority),
        stop,
        progress: progress
            .and_then(|b| read_bson("tasks", &id, &b).ok())
            .map(|d| crate::model::TaskProgress::from_document(&d)),
        attempts,
        attempts_dropped,
        key,
        batch,
        rerun: rerun.is_some_and(|r| r != 0),
        after: keys_of(after.as_deref()),
        pending: keys_of(pending.as_deref()),
        after_failure_runs: after_failure.is_some_and(|r| r != 0),
        dependents: dependents.is_some_and(|r| r != 0),
    };
    Ok((id, Some(task)))
}

fn malformed(id: &str, reason: String) -> StoreError {
    StoreError::Malformed {
        collection: "tasks",
        id: id.to_owned(),
        reason,
    }
}

/// The reason of a [`StoreError::Malformed`] (the whole message of any other error).
fn reason_of(e: StoreError) -> String {
    match e {
        StoreError::Malformed { reason, .. } => reason,
        e => e.to_string(),
    }
}

/// The keys of an `after` column (or of the pending list read beside it).
pub(super) fn keys_of(json: Option<&str>) -> Vec<String> {
    json.and_then(|j| serde_json::from_str::<Vec<Option<String>>>(j).ok())
        .map(|v| v.into_iter().flatten().collect())
        .unwrap_or_default()
}

/// The records stored in an `attempts` column, and how many older ones it dropped (its
/// count of records ever appended, `recorded`, less those kept).
pub(super) fn attempts_column(id: &str, bytes: Option<&[u8]>) -> (Vec<Attempt>, u64) {
    let Some(d) = bytes.and_then(|b| read_bson("tasks", id, b).ok()) else {
        return (Vec::new(), 0);
    };
    let list = Attempt::list_from(d.get("list"));
    let dropped = crate::model::attempts_dropped(d.get("recorded").and_then(crate::model::lenient_int), list.len());
    (list, dropped)
}

/// The records stored in an `attempts` column.
pub(super) fn read_attempts(id: &str, bytes: Option<&[u8]>) -> Vec<Attempt> {
    attempts_column(id, bytes).0
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::ffi;

    fn failure(code: i32) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(ffi::Error::new(code), None)
    }

    #[test]
    fn busy_and_locked_are_transient_others_permanent() {
        for code in [
            ffi::SQLITE_BUSY,
            ffi::SQLITE_LOCKED,
            ffi::SQLITE_BUSY_SNAPSHOT,
            ffi::SQLITE_CANTOPEN,
        ] {
            assert!(is_transient(&failure(code)), "code {code}");
            assert!(db_err("finish task")(failure(code)).is_transient(), "code {code}");
        }
        for code in [
            ffi::SQLITE_FULL,
            ffi::SQLITE_READONLY,
            ffi::SQLITE_CORRUPT,
            ffi::SQLITE_CONSTRAINT_CHECK,
            ffi::SQLITE_TOOBIG,
        ] {
            let e = db_err("finish task")(failure(code));
            assert!(
                matches!(&e, StoreError::Rejected(m) if m.starts_with("finish task: ")),
                "code {code}: {e}"
            );
        }
        assert!(!is_transient(&rusqlite::Error::InvalidQuery));
    }
}
