//! Documents as the JSON the DCI sends: the spec's fields in relaxed Extended JSON (so
//! `_id` is `{"$oid": …}` and dates `{"$date": …}` as a Disbatch 4 client reads them),
//! plus an `id` string for convenience.

use bson::oid::ObjectId;
use bson::{Bson, DateTime};
use serde_json::{json, Map, Value};

use crate::model::{status, Node, Output, Queue, Task, UnreadableQueue};
use crate::store::StatusCounts;

/// `{"$oid": "<hex>"}`.
pub(super) fn oid(id: &ObjectId) -> Value {
    json!({ "$oid": id.to_hex() })
}

/// A date as `{"$date": "<RFC 3339>"}`, or seconds since the epoch when `epoch`.
pub(super) fn date(d: &DateTime, epoch: bool) -> Value {
    if epoch {
        json!(d.timestamp_millis() as f64 / 1000.0)
    } else {
        Bson::DateTime(*d).into_relaxed_extjson()
    }
}

/// A stored output: the text, or the GridFS file's id as `{"$oid": …}`.
pub(super) fn output(o: &Option<Output>) -> Value {
    match o {
        None => Value::Null,
        Some(Output::Inline(s)) => Value::String(s.clone()),
        Some(Output::File(id)) => oid(id),
    }
}

/// How to render a task.
#[derive(Debug, Clone, Default)]
pub(super) struct TaskView {
    /// Dates as epoch seconds.
    pub epoch: bool,
    /// Only these top-level fields (plus `id` and `_id`).
    pub fields: Option<Vec<String>>,
    /// Without these top-level fields.
    pub without: Vec<String>,
}

/// A task document.
pub(super) fn task(t: &Task, view: &TaskView) -> Value {
    let mut m = Map::new();
    m.insert("id".into(), Value::String(t.id.to_hex()));
    m.insert("_id".into(), oid(&t.id));
    m.insert("queue".into(), oid(&t.queue));
    m.insert("status".into(), json!(t.status));
    m.insert("status_name".into(), json!(status::name(t.status)));
    m.insert("node".into(), json!(t.node));
    m.insert("ctime".into(), date(&t.ctime, view.epoch));
    m.insert("mtime".into(), date(&t.mtime, view.epoch));
    m.insert("params".into(), Bson::Document(t.params.clone()).into_relaxed_extjson());
    m.insert("stdout".into(), output(&t.stdout));
    m.insert("stderr".into(), output(&t.stderr));
    if let Some(problem) = &t.problem {
        m.insert("problem".into(), json!(problem));
    }
    if let Some(p) = t.priority {
        m.insert("priority".into(), json!(p));
    }
    if let Some(at) = &t.started {
        m.insert("started".into(), date(at, view.epoch));
    }
    if let Some(at) = &t.run_at {
        m.insert("run_at".into(), date(at, view.epoch));
    }
    if let Some(p) = &t.progress {
        m.insert(
            "progress".into(),
            json!({ "percent": p.percent, "info": p.info, "at": date(&p.at, view.epoch) }),
        );
    }
    if let Some(stop) = &t.stop {
        m.insert(
            "stop".into(),
            json!({
                "action": stop.action.as_str(),
                "by": stop.by,
                "at": date(&stop.at, view.epoch),
                "reason": stop.reason,
            }),
        );
    }
    if let Some(k) = &t.key {
        m.insert("key".into(), json!(k));
    }
    if let Some(b) = &t.batch {
        m.insert("batch".into(), json!(b));
    }
    if t.rerun {
        m.insert("rerun".into(), json!(true));
    }
    if !t.after.is_empty() {
        m.insert("after".into(), json!(t.after));
        m.insert("pending".into(), json!(t.pending));
        if t.after_failure_runs {
            m.insert("after_failure".into(), json!("run"));
        }
    }
    if t.dependents {
        m.insert("dependents".into(), json!(true));
    }
    if !t.attempts.is_empty() {
        let list: Vec<Value> = t
            .attempts
            .iter()
            .map(|a| {
                let output = |o: &Option<crate::model::Output>| match o {
                    None => Value::Null,
                    Some(crate::model::Output::Inline(s)) => json!(s),
                    Some(crate::model::Output::File(id)) => json!({ "file": id.to_hex() }),
                };
                json!({
                    "node": a.node,
                    "started": a.started.as_ref().map(|d| date(d, view.epoch)),
                    "ended": date(&a.ended, view.epoch),
                    "status": a.status,
                    "status_name": status::name(a.status),
                    "reason": a.reason,
                    "stdout": output(&a.stdout),
                    "stderr": output(&a.stderr),
                })
            })
            .collect();
        m.insert("attempts".into(), Value::Array(list));
        m.insert("attempts_dropped".into(), json!(t.attempts_dropped));
    }
    if let Some(fields) = &view.fields {
        m.retain(|k, _| k == "id" || k == "_id" || fields.iter().any(|f| f == k));
    }
    m.retain(|k, _| !view.without.iter().any(|f| f == k));
    Value::Object(m)
}

/// Queued / running (claimed or running) / completed (any positive status) counts, as
/// Disbatch 4 counts them: queued is every status up to -2 (queued, and the held ones such
/// as blocked, scheduled, cancelled, orphaned), which no DEN is running or has completed.
pub(super) fn summary(counts: Option<&StatusCounts>) -> (u64, u64, u64) {
    let Some(c) = counts else { return (0, 0, 0) };
    let queued = c.iter().filter(|(s, _)| **s <= status::QUEUED).map(|(_, n)| n).sum();
    let running = c.get(&status::CLAIMED).copied().unwrap_or(0) + c.get(&status::RUNNING).copied().unwrap_or(0);
    let completed = c.iter().filter(|(s, _)| **s > 0).map(|(_, n)| n).sum();
    (queued, running, completed)
}

/// A queue with its counts: `{id, name, plugin, threads, sort, on_orphan, sandbox,
/// queued, running, completed, counts: {"<status>": n}}`.
pub(super) fn queue(q: &Queue, counts: Option<&StatusCounts>) -> Value {
    let (queued, running, completed) = summary(counts);
    let by_status: Map<String, Value> = counts
        .map(|c| c.iter().map(|(s, n)| (s.to_string(), json!(n))).collect())
        .unwrap_or_default();
    json!({
        "id": q.id.to_hex(),
        "_id": oid(&q.id),
        "name": q.name,
        "plugin": q.plugin,
        "threads": q.threads,
        "sort": q.sort,
        "on_orphan": q.on_orphan,
        "sandbox": serde_json::to_value(&q.sandbox).unwrap_or(Value::Null),
        "retry": q.retry.as_ref().map(|r| serde_json::to_value(r).unwrap_or(Value::Null)),
        "activity_timeout": q.activity_timeout.map(|d| humantime::format_duration(d).to_string()),
        "next_queue": q.next_queue,
        "maxthreads": q.maxthreads,
        "rate": q.rate.map(|r| r.to_json()),
        "retention": q.retention.as_ref().map(|r| r.to_json()),
        "queued": queued,
        "running": running,
        "completed": completed,
        "counts": by_status,
    })
}

/// A queue document that cannot be read as a queue: what could be read of it, its counts
/// and its `problem`.
pub(super) fn unreadable_queue(q: &UnreadableQueue, counts: Option<&StatusCounts>) -> Value {
    let mut value = queue(
        &Queue {
            id: q.id,
            name: q.name.clone().unwrap_or_default(),
            plugin: q.plugin.clone().unwrap_or_default(),
            threads: q.threads,
            sort: Default::default(),
            sandbox: Default::default(),
            on_orphan: Default::default(),
            retry: None,
            activity_timeout: None,
            next_queue: None,
            maxthreads: None,
            rate: None,
            retention: None,
        },
        counts,
    );
    value["name"] = json!(q.name);
    value["plugin"] = json!(q.plugin);
    for field in [
        "sort",
        "sandbox",
        "on_orphan",
        "retry",
        "activity_timeout",
        "next_queue",
        "rate",
        "retention",
    ] {
        value[field] = Value::Null;
    }
    value["problem"] = json!(q.problem);
    value
}

/// Age of a node's heartbeat in seconds (never negative).
pub(super) fn node_age(n: &Node, now: DateTime) -> f64 {
    ((now.timestamp_millis() - n.timestamp.timestamp_millis()).max(0)) as f64 / 1000.0
}

/// A node: `{id, _id, node, timestamp, maxthreads, age_secs, fresh, process}` (the routes
/// add `leader`); `timestamp` in epoch milliseconds as Disbatch 4 gave it, or `{"$date"}`
/// in the native shape.
pub(super) fn node(n: &Node, now: DateTime, native: bool) -> Value {
    let age = node_age(n, now);
    let timestamp = if native {
        date(&n.timestamp, false)
    } else {
        json!(n.timestamp.timestamp_millis())
    };
    json!({
        "id": n.id.to_hex(),
        "_id": oid(&n.id),
        "node": n.node,
        "timestamp": timestamp,
        "maxthreads": n.maxthreads,
        "age_secs": age,
        "fresh": age < super::FRESH_NODE.as_secs_f64(),
        "process": n.process.as_ref().map(|p| json!({
            "host": p.host,
            "pid": p.pid,
            "started": date(&p.started, false),
        })),
        "problem": n.problem,
    })
}

/// The answer of `POST /tasks`: `{queue, count, ids}`.
pub(super) fn created(queue: ObjectId, ids: &[ObjectId]) -> Value {
    json!({
        "queue": queue.to_hex(),
        "count": ids.len(),
        "ids": ids.iter().map(|id| id.to_hex()).collect::<Vec<_>>(),
    })
}

/// The MongoDB driver's result objects that Disbatch 4's DCI answered with, under their
/// Perl class names, which its tools read (`disbatch create-tasks` the `inserted` ids,
/// `update-queue` `modified_count`, `delete-queue` `deleted_count`).
pub(super) mod mongo {
    use bson::oid::ObjectId;
    use serde_json::{json, Value};

    /// The key of an insert of one document, with its result.
    pub fn insert_one(id: &ObjectId) -> (&'static str, Value) {
        (
            "MongoDB::InsertOneResult",
            json!({
                "acknowledged": 1,
                "inserted_id": super::oid(id),
                "write_errors": [],
                "write_concern_errors": [],
            }),
        )
    }

    /// The key of an insert of several documents, with its result: `inserted` lists
    /// `{index, _id}`, the index being the place in the request.
    pub fn insert_many<'a>(inserted: impl IntoIterator<Item = (usize, &'a ObjectId)>) -> (&'static str, Value) {
        let inserted: Vec<Value> = inserted
            .into_iter()
            .map(|(index, id)| json!({ "index": index, "_id": super::oid(id) }))
            .collect();
        (
            "MongoDB::InsertManyResult",
            json!({
                "acknowledged": 1,
                "inserted": inserted,
                "write_errors": [],
                "write_concern_errors": [],
            }),
        )
    }

    /// The key of an update of one document, with its result.
    pub fn update(matched: bool, modified: bool) -> (&'static str, Value) {
        (
            "MongoDB::UpdateResult",
            json!({
                "matched_count": u8::from(matched),
                "modified_count": u8::from(modified),
                "upserted_id": null,
                "write_errors": [],
                "write_concern_errors": [],
            }),
        )
    }

    /// The key of a delete of one document, with its result.
    pub fn delete(deleted: bool) -> (&'static str, Value) {
        (
            "MongoDB::DeleteResult",
            json!({
                "deleted_count": u8::from(deleted),
                "write_errors": [],
                "write_concern_errors": [],
            }),
        )
    }

    /// `value` (an object) with `result` added.
    pub fn with(mut value: Value, result: (&'static str, Value)) -> Value {
        if let Some(m) = value.as_object_mut() {
            m.insert(result.0.to_string(), result.1);
        }
        value
    }
}
