//! Queue documents, read and validated once for both stores.
//!
//! Both stores keep a queue as one document (MongoDB's `queues` collection, SQLite's
//! `queues.doc` BSON) and only store and return it; every rule about what a queue
//! document means is here:
//! - the lenient reader ([`read`]): integers may be Int32, Int64, an integral Double or a
//!   decimal string (Disbatch 4's Perl tools write `threads: "2"`); an unknown `sort` is
//!   `default`, with a problem; any other field of the wrong type makes the queue
//!   unreadable, with an error naming the field;
//! - the report of an unreadable queue ([`unreadable`]) and the sorting of a listing
//!   ([`sort_out`]);
//! - the checks of what a caller writes ([`check_extra`], [`check_threads`]);
//! - building a new document ([`new_doc`]) and applying a [`QueueUpdate`] in memory
//!   ([`apply`]), with the rule for an update ([`updated`]): a change that would make a
//!   readable queue unreadable is refused before anything is written; a queue that was
//!   already unreadable may still be changed, and is returned as unreadable.
//!
//! It sits under `store` rather than `model` because its errors are [`StoreError`]s.

use bson::{Bson, Document};

use crate::model::{lenient_int, OnOrphan, Queue, QueueSandbox, Sort, UnreadableQueue};
use crate::store::{NewQueue, QueueUpdate, StoreError, StoreResult};

/// Keys of a queue document that `extra` fields may not set.
pub const CORE_FIELDS: [&str; 5] = ["_id", "name", "plugin", "threads", "sort"];

/// A queue as a store returns it after a change: readable, or still unreadable because
/// of a field the change did not fix (written by another tool), with that problem.
#[derive(Debug, Clone, PartialEq)]
pub enum QueueState {
    /// The queue reads.
    Readable(Box<Queue>),
    /// The change was written, but the document still cannot be read as a queue.
    Unreadable(UnreadableQueue),
}

impl QueueState {
    /// The queue, when it reads.
    pub fn readable(self) -> Option<Queue> {
        match self {
            QueueState::Readable(q) => Some(*q),
            QueueState::Unreadable(_) => None,
        }
    }
}

/// Refuses `extra` fields that would set a core field or a MongoDB operator (`$…`).
pub fn check_extra(extra: &Document) -> StoreResult<()> {
    match extra
        .keys()
        .find(|k| CORE_FIELDS.contains(&k.as_str()) || k.starts_with('$'))
    {
        Some(k) => Err(StoreError::Invalid(format!(
            "field {k:?} cannot be set as an extra queue field"
        ))),
        None => Ok(()),
    }
}

/// Refuses a negative `threads` (`maxthreads` of a node follows the same rule: see
/// [`check_count`]).
pub fn check_threads(threads: Option<i64>) -> StoreResult<()> {
    check_count("threads", threads)
}

/// Refuses a negative count (`threads`, a node's `maxthreads`); none is no limit.
pub fn check_count(field: &str, n: Option<i64>) -> StoreResult<()> {
    match n {
        Some(n) if n < 0 => Err(StoreError::Invalid(format!(
            "field {field:?} must be a non-negative integer or null, got {n}"
        ))),
        _ => Ok(()),
    }
}

/// A node's `maxthreads` as stored (null or missing is no limit): a value that cannot be
/// read is taken as 0 (the node claims nothing until it is fixed, but heartbeats and
/// recovers orphans), with the problem to report in the node's `problem`.
pub fn node_maxthreads(value: Option<&Bson>) -> (Option<i64>, Option<String>) {
    match value.filter(|v| !matches!(v, Bson::Null)) {
        None => (None, None),
        Some(v) => match lenient_int(v) {
            Some(n) if n >= 0 => (Some(n), None),
            _ => (
                Some(0),
                Some(format!(
                    "field `maxthreads` must be a non-negative integer or null, found {:?} {v}; claiming nothing until it is fixed",
                    v.element_type()
                )),
            ),
        },
    }
}

/// An optional integer: null when absent, Int32 when it fits, else Int64.
pub fn opt_int_bson(n: Option<i64>) -> Bson {
    n.map_or(Bson::Null, |n| i32::try_from(n).map_or(Bson::Int64(n), Bson::Int32))
}

/// The spec's `sort` string.
pub fn sort_str(sort: Sort) -> &'static str {
    match sort {
        Sort::Fifo => "fifo",
        Sort::Lifo => "lifo",
        Sort::Default => "default",
    }
}

fn id_text(d: &Document) -> String {
    match d.get("_id") {
        Some(Bson::ObjectId(id)) => id.to_hex(),
        Some(other) => other.to_string(),
        None => "?".to_string(),
    }
}

fn malformed_because(d: &Document, reason: String) -> StoreError {
    StoreError::Malformed {
        collection: "queues",
        id: id_text(d),
        reason,
    }
}

fn malformed(d: &Document, field: &str, expected: &str) -> StoreError {
    let found = match d.get(field) {
        None => "nothing".to_string(),
        Some(v) => format!("{:?} {v}", v.element_type()),
    };
    malformed_because(d, format!("field `{field}` must be {expected}, found {found}"))
}

/// A present, non-null value.
fn get<'a>(d: &'a Document, field: &str) -> Option<&'a Bson> {
    d.get(field).filter(|v| !matches!(v, Bson::Null))
}

fn string(d: &Document, field: &str) -> StoreResult<String> {
    match get(d, field) {
        Some(Bson::String(s)) => Ok(s.clone()),
        _ => Err(malformed(d, field, "a string")),
    }
}

/// A non-negative integer (leniently read), null or missing.
fn opt_count(d: &Document, field: &str) -> StoreResult<Option<i64>> {
    match get(d, field) {
        None => Ok(None),
        Some(v) => match lenient_int(v) {
            Some(n) if n >= 0 => Ok(Some(n)),
            _ => Err(malformed(d, field, "a non-negative integer or null")),
        },
    }
}

fn read_sort(d: &Document, problems: &mut Vec<String>) -> Sort {
    match get(d, "sort") {
        None => Sort::Default,
        Some(Bson::String(s)) => Sort::parse(s).unwrap_or_else(|e| {
            problems.push(format!("field `sort`: {e}; claiming in the default order"));
            Sort::Default
        }),
        Some(other) => {
            problems.push(format!(
                "field `sort` is {other}, not a string; claiming in the default order"
            ));
            Sort::Default
        }
    }
}

/// A queue's `retention`, when it reads; one that does not is reported in `problems` and
/// read as [`crate::model::Retention::keep_all`], so the queue keeps every task until it is
/// fixed, whatever the config's default says.
fn read_retention(d: &Document, problems: &mut Vec<String>) -> Option<crate::model::Retention> {
    let v = get(d, "retention")?;
    match crate::model::Retention::from_bson(v) {
        Ok(r) => Some(r),
        Err((field, e)) => {
            problems.push(format!("field `{field}` {e}; keeping every task until it is fixed"));
            Some(crate::model::Retention::keep_all())
        }
    }
}

/// A queue document (with its `_id`), with the problems that were tolerated.
///
/// An unknown `sort` is taken as `default` (the spec's order when `sort` is not used), an
/// unreadable `maxthreads` as 0, an unreadable `rate` as its safest value
/// ([`crate::model::Rate::read`]) and an unreadable `retention` as keeping every task,
/// each reported as a problem. Every other field of the
/// wrong type — `_id`, `name`, `plugin`, `threads`, `sandbox`, `on_orphan`, `retry`,
/// `activity_timeout`, `next_queue` — is [`StoreError::Malformed`]: the queue cannot be
/// run as its operators meant it to.
pub fn read(d: &Document) -> StoreResult<(Queue, Vec<String>)> {
    let mut problems = Vec::new();
    let sort = read_sort(d, &mut problems);
    let sandbox = match get(d, "sandbox") {
        None => QueueSandbox::default(),
        Some(Bson::Document(s)) => bson::from_document::<QueueSandbox>(s.clone())
            .map_err(|e| malformed_because(d, format!("field `sandbox`: {e}")))?,
        Some(_) => return Err(malformed(d, "sandbox", "an object")),
    };
    let on_orphan = match get(d, "on_orphan") {
        None => OnOrphan::default(),
        Some(Bson::String(s)) if s == "orphan" => OnOrphan::Orphan,
        Some(Bson::String(s)) if s == "requeue" => OnOrphan::Requeue,
        Some(_) => return Err(malformed(d, "on_orphan", "\"orphan\", \"requeue\" or null")),
    };
    let (retry, activity_timeout) = crate::model::queue_lifecycle(get(d, "retry"), get(d, "activity_timeout"))
        .map_err(|(field, e)| malformed_because(d, format!("{e} (field `{field}`)")))?;
    let id = match get(d, "_id") {
        Some(Bson::ObjectId(id)) => *id,
        _ => return Err(malformed(d, "_id", "an ObjectId")),
    };
    let queue = Queue {
        id,
        name: string(d, "name")?,
        plugin: string(d, "plugin")?,
        threads: opt_count(d, "threads")?,
        sort,
        sandbox,
        on_orphan,
        retry,
        activity_timeout,
        next_queue: match get(d, "next_queue") {
            None => None,
            Some(Bson::String(s)) if !s.is_empty() => Some(s.clone()),
            Some(_) => return Err(malformed(d, "next_queue", "a queue name or id")),
        },
        maxthreads: Queue::read_maxthreads(get(d, "maxthreads"), &mut problems),
        rate: crate::model::Rate::read(get(d, "rate"), &mut problems),
        retention: read_retention(d, &mut problems),
    };
    Ok((queue, problems))
}

/// A queue document [`read`] refused with `err`, shown with what could be read of it.
/// `None` only when the `_id` is not an ObjectId.
pub fn unreadable(d: &Document, err: &StoreError) -> Option<UnreadableQueue> {
    let id = match d.get("_id") {
        Some(Bson::ObjectId(id)) => *id,
        _ => return None,
    };
    Some(UnreadableQueue {
        id,
        name: string(d, "name").ok(),
        plugin: string(d, "plugin").ok(),
        threads: opt_count(d, "threads").ok().flatten(),
        problem: err.to_string(),
    })
}

/// A queue document as a store returns it: readable (its tolerated problems passed to
/// `warn`), or unreadable with its problem (passed to `warn` too); `None` only when the
/// `_id` is not an ObjectId.
pub fn state_of(d: &Document, mut warn: impl FnMut(String)) -> Option<QueueState> {
    match read(d) {
        Ok((q, problems)) => {
            for p in problems {
                warn(format!("queue {:?} ({}): {p}", q.name, q.id));
            }
            Some(QueueState::Readable(Box::new(q)))
        }
        Err(e) => {
            let name = d.get_str("name").unwrap_or("?");
            warn(format!("cannot run queue {name:?}: {e}"));
            unreadable(d, &e).map(QueueState::Unreadable)
        }
    }
}

/// Every queue document of a listing: the readable queues and the unreadable ones, in
/// the order given; problems go to `warn`.
pub fn sort_out<'a>(
    docs: impl IntoIterator<Item = &'a Document>,
    mut warn: impl FnMut(String),
) -> (Vec<Queue>, Vec<UnreadableQueue>) {
    let mut queues = Vec::new();
    let mut unreadable = Vec::new();
    for d in docs {
        match state_of(d, &mut warn) {
            Some(QueueState::Readable(q)) => queues.push(*q),
            Some(QueueState::Unreadable(u)) => unreadable.push(u),
            None => warn(format!("ignoring queue {}: its `_id` is not an ObjectId", id_text(d))),
        }
    }
    (queues, unreadable)
}

/// A new queue's document (with `_id`) and the queue it reads as; anything that would not
/// read is [`StoreError::Invalid`].
pub fn new_doc(id: bson::oid::ObjectId, queue: NewQueue) -> StoreResult<(Document, Queue)> {
    check_extra(&queue.extra)?;
    check_threads(queue.threads)?;
    let mut d = bson::doc! {
        "_id": id,
        "name": queue.name,
        "plugin": queue.plugin,
        "threads": opt_int_bson(queue.threads),
        "sort": sort_str(queue.sort),
    };
    d.extend(queue.extra);
    let (parsed, _) = read(&d).map_err(|e| StoreError::Invalid(e.to_string()))?;
    Ok((d, parsed))
}

/// The fields `update` sets, checked ([`check_extra`], [`check_threads`]); empty when it
/// changes nothing.
pub fn set_fields(update: &QueueUpdate) -> StoreResult<Document> {
    check_extra(&update.extra)?;
    let mut set = Document::new();
    if let Some(name) = &update.name {
        set.insert("name", name.clone());
    }
    if let Some(plugin) = &update.plugin {
        set.insert("plugin", plugin.clone());
    }
    if let Some(threads) = update.threads {
        check_threads(threads)?;
        set.insert("threads", opt_int_bson(threads));
    }
    if let Some(sort) = update.sort {
        set.insert("sort", sort_str(sort));
    }
    set.extend(update.extra.clone());
    Ok(set)
}

/// `before` with `set` ([`set_fields`]) applied, and the queue it is.
///
/// The rule of every store's `update_queue`, decided before anything is written: a
/// document that reads after the change is [`QueueState::Readable`]; one that does not is
/// refused ([`StoreError::Invalid`], naming the field) when it read before the change, and
/// otherwise accepted as [`QueueState::Unreadable`] with its problem — a queue another
/// tool wrote badly can still have its other fields changed, and stays listed with the
/// problem until it is fixed.
pub fn updated(before: &Document, set: Document) -> StoreResult<(Document, QueueState)> {
    let mut after = before.clone();
    after.extend(set);
    match read(&after) {
        Ok((q, _)) => Ok((after, QueueState::Readable(Box::new(q)))),
        Err(e) if read(before).is_ok() => Err(StoreError::Invalid(format!(
            "the change would make the queue unreadable: {e}"
        ))),
        Err(e) => {
            let u = unreadable(&after, &e).ok_or(e)?;
            Ok((after, QueueState::Unreadable(u)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, oid::ObjectId};

    fn reason(e: StoreError) -> String {
        match e {
            StoreError::Malformed { collection, reason, .. } => format!("{collection}: {reason}"),
            other => panic!("not malformed: {other}"),
        }
    }

    #[test]
    fn queue_threads_widths_and_bad_sort() {
        let id = ObjectId::new();
        for threads in [Bson::Int32(3), Bson::Int64(3), Bson::Double(3.0)] {
            let (q, problems) = read(&doc! { "_id": id, "name": "q", "plugin": "p", "threads": threads }).unwrap();
            assert_eq!(q.threads, Some(3));
            assert!(problems.is_empty());
        }
        let (q, _) = read(&doc! { "_id": id, "name": "q", "plugin": "p", "threads": null }).unwrap();
        assert_eq!(q.threads, None);
        let (q, problems) = read(&doc! { "_id": id, "name": "q", "plugin": "p", "sort": "random" }).unwrap();
        assert_eq!(q.sort, Sort::Default);
        assert_eq!(problems.len(), 1);
        let e = read(&doc! { "_id": id, "name": "q", "plugin": "p", "threads": -1 }).unwrap_err();
        assert!(reason(e).contains("`threads`"));
        let e = read(&doc! { "_id": id, "name": "q", "plugin": "p", "sandbox": { "bogus": 1 } }).unwrap_err();
        assert!(reason(e).contains("`sandbox`"));
        let e = read(&doc! { "_id": id, "name": "q", "plugin": "p", "on_orphan": "retry" }).unwrap_err();
        assert!(reason(e).contains("`on_orphan`"));
    }

    #[test]
    fn queue_sandbox_and_policy() {
        let d = doc! {
            "_id": ObjectId::new(), "name": "q", "plugin": "p", "threads": 2, "sort": "lifo",
            "sandbox": { "timeout": "30s", "memory_mib": 64 }, "on_orphan": "requeue",
        };
        let (q, _) = read(&d).unwrap();
        assert_eq!(q.sort, Sort::Lifo);
        assert_eq!(q.sandbox.timeout, Some(std::time::Duration::from_secs(30)));
        assert_eq!(q.sandbox.memory_mib, Some(64));
        assert_eq!(q.on_orphan, OnOrphan::Requeue);
    }

    #[test]
    fn numbers_written_as_strings_are_read() {
        let d = doc! { "_id": ObjectId::new(), "name": "q", "plugin": "p", "threads": "2", "maxthreads": "1" };
        let (q, problems) = read(&d).unwrap();
        assert_eq!((q.threads, q.maxthreads), (Some(2), Some(1)));
        assert!(problems.is_empty());
    }

    #[test]
    fn extra_fields_may_not_set_core_fields_or_operators() {
        for k in ["name", "threads", "$set", "$unset"] {
            let e = check_extra(&doc! { k: 1 }).unwrap_err();
            assert!(matches!(&e, StoreError::Invalid(m) if m.contains(k)), "{k}: {e}");
        }
        check_extra(&doc! { "on_orphan": "requeue" }).unwrap();
    }

    #[test]
    fn a_change_may_not_make_a_readable_queue_unreadable() {
        let good = doc! { "_id": ObjectId::new(), "name": "q", "plugin": "p" };
        let e = updated(&good, doc! { "on_orphan": 5 }).unwrap_err();
        assert!(matches!(&e, StoreError::Invalid(m) if m.contains("`on_orphan`")), "{e}");
        let bad = doc! { "_id": ObjectId::new(), "name": "q", "plugin": "p", "on_orphan": 5 };
        let (after, state) = updated(&bad, doc! { "threads": 3 }).unwrap();
        assert_eq!(after.get_i32("threads").unwrap(), 3);
        assert!(
            matches!(state, QueueState::Unreadable(u) if u.threads == Some(3) && u.problem.contains("`on_orphan`"))
        );
        let (_, state) = updated(&bad, doc! { "on_orphan": "requeue" }).unwrap();
        assert!(matches!(state, QueueState::Readable(q) if q.on_orphan == OnOrphan::Requeue));
    }
}
