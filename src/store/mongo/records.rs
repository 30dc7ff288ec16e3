//! BSON documents of the MongoDB store ↔ model types.
//!
//! Parsing is lenient about what other Disbatch 4 clients may write: integers may be
//! Int32, Int64, an integral Double or a decimal string (Perl Disbatch 4's DCI writes
//! form values such as `maxthreads: "3"` as strings); dates may be BSON dates or epoch
//! numbers (seconds or milliseconds); a task's `node` may be `-1` (unclaimed); a task's
//! parameters may be under `parameters` (Disbatch 3's name, which Disbatch 4's task runner
//! still reads) when `params` is absent; optional fields may be null or missing. Anything
//! else is [`StoreError::Malformed`], naming the collection, the `_id` and the field.

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};

use crate::model::{Node, Output, Task};
use crate::store::{OutputValue, StoreError, StoreResult, TaskFilter};

/// An integer as other clients write it (see [`crate::model::lenient_int`]).
pub(super) fn as_int(value: &Bson) -> Option<i64> {
    crate::model::lenient_int(value)
}

/// Epoch numbers below this are seconds, at or above it milliseconds (10^11 s is the
/// year 5138; 10^11 ms is 1973).
const EPOCH_MILLIS_FROM: f64 = 1e11;

/// A date as other clients write it: a BSON date, or an epoch number (Int32, Int64,
/// Double or a numeric string) in seconds or milliseconds.
pub(super) fn as_date(value: &Bson) -> Option<DateTime> {
    let secs_or_millis = match value {
        Bson::DateTime(d) => return Some(*d),
        Bson::Int32(n) => f64::from(*n),
        Bson::Int64(n) => *n as f64,
        Bson::Double(f) => *f,
        Bson::String(s) => s.trim().parse::<f64>().ok()?,
        _ => return None,
    };
    if !secs_or_millis.is_finite() {
        return None;
    }
    let millis = if secs_or_millis.abs() < EPOCH_MILLIS_FROM {
        secs_or_millis * 1000.0
    } else {
        secs_or_millis
    };
    (millis.abs() <= crate::model::MAX_EXACT_DOUBLE).then(|| DateTime::from_millis(millis.round() as i64))
}

/// A finishing task's stdout or stderr as stored: a String or a GridFS file id.
pub(super) fn output_bson(value: &OutputValue) -> Bson {
    match value {
        OutputValue::Inline(s) => Bson::String(s.clone()),
        OutputValue::File(id) => Bson::ObjectId(*id),
    }
}

/// The query for a task search.
pub(super) fn task_filter_doc(filter: &TaskFilter) -> Document {
    let mut q = Document::new();
    if let Some(id) = filter.id {
        q.insert("_id", id);
    }
    if let Some(queue) = filter.queue {
        q.insert("queue", queue);
    }
    if let Some(statuses) = &filter.status {
        q.insert(
            "status",
            doc! { "$in": statuses.iter().map(|s| Bson::Int32(*s)).collect::<Vec<_>>() },
        );
    }
    if let Some(ids) = &filter.ids {
        q.insert(
            "_id",
            doc! { "$in": ids.iter().map(|i| Bson::ObjectId(*i)).collect::<Vec<_>>() },
        );
    }
    if let Some(key) = &filter.key {
        q.insert("key", key);
    }
    if let Some(batch) = &filter.batch {
        q.insert("batch", batch);
    }
    if let Some(dep) = &filter.after {
        q.insert("after", dep.key());
    }
    // Id bounds join the other conditions on `_id` rather than replace them.
    let mut bounds = Document::new();
    if let Some(id) = filter.newer_than {
        bounds.insert("$gt", id);
    }
    if let Some(id) = filter.older_than {
        bounds.insert("$lt", id);
    }
    if !bounds.is_empty() {
        match q.remove("_id") {
            Some(id) => {
                q.insert(
                    "$and",
                    vec![
                        Bson::Document(doc! { "_id": id }),
                        Bson::Document(doc! { "_id": bounds }),
                    ],
                );
            }
            None => {
                q.insert("_id", bounds);
            }
        }
    }
    if let Some(node) = &filter.node {
        q.insert(
            "node",
            node.as_ref().map_or_else(super::unclaimed, |n| Bson::String(n.clone())),
        );
    }
    q
}

/// One document's fields, with errors naming the collection, the `_id` and the field.
struct Fields<'a> {
    collection: &'static str,
    doc: &'a Document,
}

impl<'a> Fields<'a> {
    fn new(collection: &'static str, doc: &'a Document) -> Self {
        Fields { collection, doc }
    }

    fn id_text(&self) -> String {
        match self.doc.get("_id") {
            Some(Bson::ObjectId(id)) => id.to_hex(),
            Some(other) => other.to_string(),
            None => "?".to_string(),
        }
    }

    fn malformed(&self, field: &str, expected: &str) -> StoreError {
        let found = match self.doc.get(field) {
            None => "nothing".to_string(),
            Some(v) => format!("{:?} {v}", v.element_type()),
        };
        StoreError::Malformed {
            collection: self.collection,
            id: self.id_text(),
            reason: format!("field `{field}` must be {expected}, found {found}"),
        }
    }

    /// A present, non-null value.
    fn get(&self, field: &str) -> Option<&'a Bson> {
        self.doc.get(field).filter(|v| !matches!(v, Bson::Null))
    }

    fn object_id(&self, field: &str) -> StoreResult<ObjectId> {
        match self.get(field) {
            Some(Bson::ObjectId(id)) => Ok(*id),
            _ => Err(self.malformed(field, "an ObjectId")),
        }
    }

    fn string(&self, field: &str) -> StoreResult<String> {
        match self.get(field) {
            Some(Bson::String(s)) => Ok(s.clone()),
            _ => Err(self.malformed(field, "a string")),
        }
    }

    fn opt_date(&self, field: &str) -> StoreResult<Option<DateTime>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => as_date(v)
                .map(Some)
                .ok_or_else(|| self.malformed(field, "a date or epoch seconds/milliseconds")),
        }
    }

    /// A task's `node`: a string, or null / a number (Disbatch 4 writes `-1`) for unclaimed.
    fn task_node(&self) -> StoreResult<Option<String>> {
        match self.get("node") {
            None => Ok(None),
            Some(Bson::String(s)) => Ok(Some(s.clone())),
            Some(v) if as_int(v).is_some() => Ok(None),
            Some(_) => Err(self.malformed("node", "a string, null or -1")),
        }
    }

    fn date(&self, field: &str) -> StoreResult<DateTime> {
        self.opt_date(field)?.ok_or_else(|| self.malformed(field, "a date"))
    }

    fn output(&self, field: &str) -> StoreResult<Option<Output>> {
        match self.get(field) {
            None => Ok(None),
            Some(Bson::String(s)) => Ok(Some(Output::Inline(s.clone()))),
            Some(Bson::ObjectId(id)) => Ok(Some(Output::File(*id))),
            Some(_) => Err(self.malformed(field, "a string, an ObjectId or null")),
        }
    }
}

/// A task's parameters: `params`, else Disbatch 3's `parameters`, else none.
fn task_params(f: &Fields<'_>) -> StoreResult<Document> {
    let field = if f.get("params").is_none() && f.get("parameters").is_some() {
        "parameters"
    } else {
        "params"
    };
    match f.get(field) {
        None => Ok(Document::new()),
        Some(Bson::Document(d)) => Ok(d.clone()),
        Some(_) => Err(f.malformed(field, "an object")),
    }
}

/// A task document. `ctime` falls back to the `_id`'s timestamp and `mtime` to `ctime`
/// when missing; `params` may be missing or null (no params), or under `parameters`.
pub(super) fn task_from(doc: &Document) -> StoreResult<Task> {
    let f = Fields::new("tasks", doc);
    let id = f.object_id("_id")?;
    let ctime = f.opt_date("ctime")?.unwrap_or_else(|| id.timestamp());
    let mtime = f.opt_date("mtime")?.unwrap_or(ctime);
    let status = f
        .get("status")
        .and_then(as_int)
        .and_then(|s| i32::try_from(s).ok())
        .ok_or_else(|| f.malformed("status", "a 32-bit integer"))?;
    let params = task_params(&f)?;
    let (attempts, attempts_dropped) = attempts_of(&f);
    Ok(Task {
        id,
        queue: f.object_id("queue")?,
        ctime,
        mtime,
        node: f.task_node()?,
        status,
        params,
        stdout: f.output("stdout")?,
        stderr: f.output("stderr")?,
        problem: None,
        // Fields of the task's life beyond Disbatch 4's never make a task unreadable: a
        // value of another shape (written by another tool) reads as absent.
        run_at: f.opt_date("run_at").ok().flatten(),
        started: f.opt_date("started").ok().flatten(),
        priority: f.get("priority").and_then(as_int),
        stop: task_stop(&f).ok().flatten(),
        progress: task_progress(&f),
        attempts,
        attempts_dropped,
        key: f.get("key").and_then(|k| k.as_str()).map(str::to_owned),
        batch: f.get("batch").and_then(|k| k.as_str()).map(str::to_owned),
        rerun: f.get("rerun") == Some(&Bson::Boolean(true)),
        after: strings(f.get("after")),
        pending: strings(f.get("pending")),
        after_failure_runs: f.get("after_failure").and_then(Bson::as_str) == Some("run"),
        dependents: f.get("dependents") == Some(&Bson::Boolean(true)),
    })
}

/// The strings of an array field (`after`, `pending`); anything else reads as none.
fn strings(v: Option<&Bson>) -> Vec<String> {
    match v {
        Some(Bson::Array(a)) => a.iter().filter_map(Bson::as_str).map(str::to_owned).collect(),
        _ => Vec::new(),
    }
}

/// The task's `attempts` records and how many older ones it dropped, from the count of
/// records ever appended (`attempts_recorded`, any integral number).
fn attempts_of(f: &Fields<'_>) -> (Vec<crate::model::Attempt>, u64) {
    let list = crate::model::Attempt::list_from(f.get("attempts"));
    let dropped = crate::model::attempts_dropped(f.get("attempts_recorded").and_then(as_int), list.len());
    (list, dropped)
}

/// The `progress` sub-document, if it is one (anything else is not a progress report).
fn task_progress(f: &Fields<'_>) -> Option<crate::model::TaskProgress> {
    match f.get("progress") {
        Some(Bson::Document(d)) => Some(crate::model::TaskProgress::from_document(d)),
        _ => None,
    }
}

/// The `stop` sub-document, if any.
fn task_stop(f: &Fields<'_>) -> StoreResult<Option<crate::model::StopRequest>> {
    match f.get("stop") {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::Document(d)) => crate::model::StopRequest::from_document(d)
            .map(Some)
            .map_err(|e| f.malformed("stop", &format!("a valid stop request ({e})"))),
        Some(_) => Err(f.malformed("stop", "a document {action, by, at, reason}")),
    }
}

/// A task document as well as it can be read: what [`task_from`] gives, or, for a
/// document it refuses, a task carrying the error as its `problem` and every field that
/// could be read (unreadable ones empty, an unreadable `status` as
/// [`Task::UNREADABLE_STATUS`], `queue` as [`Task::UNREADABLE_QUEUE`]). `None` only when
/// the `_id` is not an ObjectId.
pub(super) fn task_or_problem(doc: &Document) -> Option<Task> {
    let err = match task_from(doc) {
        Ok(t) => return Some(t),
        Err(e) => e,
    };
    let f = Fields::new("tasks", doc);
    let id = f.object_id("_id").ok()?;
    let (attempts, attempts_dropped) = attempts_of(&f);
    let ctime = f.opt_date("ctime").ok().flatten().unwrap_or_else(|| id.timestamp());
    Some(Task {
        id,
        queue: f.object_id("queue").unwrap_or(Task::UNREADABLE_QUEUE),
        ctime,
        mtime: f.opt_date("mtime").ok().flatten().unwrap_or(ctime),
        node: f.task_node().ok().flatten(),
        status: f
            .get("status")
            .and_then(as_int)
            .and_then(|s| i32::try_from(s).ok())
            .unwrap_or(Task::UNREADABLE_STATUS),
        params: task_params(&f).unwrap_or_default(),
        stdout: f.output("stdout").ok().flatten(),
        stderr: f.output("stderr").ok().flatten(),
        problem: Some(err.to_string()),
        run_at: f.opt_date("run_at").ok().flatten(),
        started: f.opt_date("started").ok().flatten(),
        priority: f.get("priority").and_then(as_int),
        stop: task_stop(&f).ok().flatten(),
        progress: task_progress(&f),
        attempts,
        attempts_dropped,
        key: f.get("key").and_then(|k| k.as_str()).map(str::to_owned),
        batch: f.get("batch").and_then(|k| k.as_str()).map(str::to_owned),
        rerun: f.get("rerun") == Some(&Bson::Boolean(true)),
        after: strings(f.get("after")),
        pending: strings(f.get("pending")),
        after_failure_runs: f.get("after_failure").and_then(Bson::as_str) == Some("run"),
        dependents: f.get("dependents") == Some(&Bson::Boolean(true)),
    })
}

/// A node document. A `maxthreads` that cannot be read is taken as 0 (the node claims
/// nothing until it is fixed, but heartbeats and recovers orphans) and a `timestamp` that
/// cannot be read as the epoch (stale), each reported in the node's `problem`; only a
/// document without an ObjectId `_id` or a string `node` is refused.
pub(super) fn node_from(doc: &Document) -> StoreResult<Node> {
    let f = Fields::new("nodes", doc);
    let mut problems = Vec::new();
    let (maxthreads, problem) = crate::store::queue_doc::node_maxthreads(f.get("maxthreads"));
    problems.extend(problem);
    let timestamp = f.date("timestamp").unwrap_or_else(|e| {
        problems.push(format!("{e}; taken as stale"));
        DateTime::from_millis(0)
    });
    Ok(Node {
        id: f.object_id("_id")?,
        node: f.string("node")?,
        timestamp,
        maxthreads,
        stats: doc
            .get_document("stats")
            .ok()
            .and_then(|d| bson::from_document(d.clone()).ok()),
        process: doc
            .get_document("process")
            .ok()
            .and_then(|d| bson::from_document(d.clone()).ok()),
        queue_problems: doc
            .get_document("queue_problems")
            .map(|d| {
                d.iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                    .collect()
            })
            .unwrap_or_default(),
        problem: (!problems.is_empty()).then(|| problems.join("; ")),
    })
}

#[cfg(test)]
mod tests;
