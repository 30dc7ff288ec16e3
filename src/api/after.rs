//! Dependencies in `POST /tasks`: `after` (top level, for every task of the request, or
//! per entry of `tasks`) lists what a task waits for, and `after_failure` (`"cancel"`, the
//! default, or `"run"`) what happens when one of them fails. A reference is
//!
//! - a task id (`"<24 hex digits>"` or `{"$oid": …}`, `{"id": …}`), of any queue;
//! - a key (`"<key>"`, `{"key": …}`): an entry of this request with that key, else the
//!   task of the request's queue with it; `{"key": …, "queue": <name or id>}` another
//!   queue's;
//! - `{"ref": n}`: entry `n` (from 0) of this request's `tasks`;
//! - `{"batch": <id>}`: a batch, met once it is complete with every task succeeded.
//!
//! References between entries make a DAG; a request with a cycle, or naming a task, key or
//! batch that does not exist, is refused whole (400) before anything is created. Entries
//! are inserted parents first, so a request cut short never leaves a task waiting for an
//! entry that was not created.

use std::collections::{BTreeSet, HashMap};

use bson::oid::ObjectId;
use serde_json::{Map, Value};

use self::order::parents_first;
use super::body::{kind, object_id};
use super::{queues, ApiError, Shared};
use crate::store::{Dependency, NewTask};

mod order;

/// Most references one task may wait for.
pub const MAX_AFTER: usize = 1000;

/// Most references one request may make, over all its tasks.
pub const MAX_REFERENCES: usize = 100_000;

/// One reference of an `after` list, as written.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Ref {
    Id(ObjectId),
    Key { key: String, queue: Option<String> },
    Entry(usize),
    Batch(String),
}

/// What a request's `after` / `after_failure` say (at the top level or in one entry).
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct After {
    pub refs: Vec<Ref>,
    pub runs_anyway: Option<bool>,
}

/// Reads `after` and `after_failure` of `m` (named `field` in errors: "" at the top level,
/// "tasks[3]." in an entry).
pub(super) fn parse(m: &Map<String, Value>, field: &str) -> Result<After, ApiError> {
    let runs_anyway = match m.get("after_failure") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s == "cancel" => Some(false),
        Some(Value::String(s)) if s == "run" => Some(true),
        Some(other) => {
            return Err(ApiError::bad(format!(
                "field \"{field}after_failure\" must be \"cancel\" or \"run\", got {}",
                short(other)
            )))
        }
    };
    let list = match m.get("after") {
        None | Some(Value::Null) => {
            return Ok(After {
                refs: Vec::new(),
                runs_anyway,
            })
        }
        Some(Value::Array(a)) => a.clone(),
        Some(one @ (Value::String(_) | Value::Object(_))) => vec![one.clone()],
        Some(other) => {
            return Err(ApiError::bad(format!(
                "field \"{field}after\" must be a list of task ids, keys, {{\"ref\": n}} or {{\"batch\": id}}, got {}",
                kind(other)
            )))
        }
    };
    if list.len() > MAX_AFTER {
        return Err(ApiError::bad(format!(
            "field \"{field}after\" lists {} references; a task may wait for at most {MAX_AFTER}",
            list.len()
        )));
    }
    let refs = list
        .iter()
        .enumerate()
        .map(|(i, v)| one(v).map_err(|e| ApiError::bad(format!("field \"{field}after[{i}]\" {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(After { refs, runs_anyway })
}

fn short(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        other => kind(other).to_string(),
    }
}

fn one(v: &Value) -> Result<Ref, String> {
    let text = |v: Option<&Value>, what: &str| match v {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        _ => Err(format!("must give {what} as a non-empty string")),
    };
    match v {
        Value::String(s) if s.is_empty() => Err("must not be empty".into()),
        Value::String(s) => Ok(ObjectId::parse_str(s).map_or_else(
            |_| Ref::Key {
                key: s.clone(),
                queue: None,
            },
            Ref::Id,
        )),
        Value::Object(m) if m.contains_key("$oid") => {
            object_id(v).map(Ref::Id).ok_or_else(|| "is not a task id".into())
        }
        Value::Object(m) => {
            let only = |allowed: &[&str]| match m.keys().find(|k| !allowed.contains(&k.as_str())) {
                Some(k) => Err(format!("has unknown field {k:?}")),
                None => Ok(()),
            };
            if let Some(n) = m.get("ref") {
                only(&["ref"])?;
                let n = n
                    .as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or("must give \"ref\" as the index of an entry of \"tasks\" (from 0)")?;
                Ok(Ref::Entry(n))
            } else if m.contains_key("batch") {
                only(&["batch"])?;
                Ok(Ref::Batch(text(m.get("batch"), "\"batch\"")?))
            } else if m.contains_key("key") {
                only(&["key", "queue"])?;
                let queue = match m.get("queue") {
                    None | Some(Value::Null) => None,
                    q => Some(text(q, "\"queue\" (a name or id)")?),
                };
                Ok(Ref::Key {
                    key: text(m.get("key"), "\"key\"")?,
                    queue,
                })
            } else if let Some(id) = m.get("id") {
                only(&["id"])?;
                let id = id
                    .as_str()
                    .and_then(|s| ObjectId::parse_str(s).ok())
                    .or_else(|| object_id(id));
                id.map(Ref::Id).ok_or_else(|| "must give \"id\" as a task id".into())
            } else {
                Err("must be a task id, a key, {\"ref\": n}, {\"key\", \"queue\"} or {\"batch\": id}".into())
            }
        }
        other => Err(format!(
            "must be a task id, a key, {{\"ref\": n}} or {{\"batch\": id}}, got {}",
            kind(other)
        )),
    }
}

/// A request's tasks with their dependencies resolved: `tasks` in the order to insert
/// them (parents first), each waiting for its resolved `after`; `external` what they wait
/// for that existed before the request (to mark and settle once they are inserted).
pub(super) struct Planned {
    pub tasks: Vec<NewTask>,
    pub external: Vec<Dependency>,
}

/// Resolves each task's references (`own[i]` after `shared`), checks them, and orders
/// the tasks parents first. `tasks[i].id` is the id entry `i` will have.
pub(super) async fn plan(
    state: &Shared,
    queue: ObjectId,
    mut tasks: Vec<NewTask>,
    shared: &After,
    own: &[After],
) -> Result<Planned, ApiError> {
    let n = tasks.len();
    let total: usize = own.iter().map(|a| a.refs.len()).sum::<usize>() + shared.refs.len().saturating_mul(n);
    if total > MAX_REFERENCES {
        return Err(ApiError::bad(format!(
            "the request's tasks wait for {total} references in all; at most {MAX_REFERENCES} per request"
        )));
    }
    let mut by_key: HashMap<&str, usize> = HashMap::new();
    for (i, t) in tasks.iter().enumerate() {
        if let Some(k) = t.key.as_deref() {
            if let Some(first) = by_key.insert(k, i) {
                return Err(ApiError::bad(format!(
                    "field \"tasks[{i}].key\": key {k:?} is also the key of tasks[{first}]; a request with \"after\" gives each key once"
                )));
            }
        }
    }
    // A task that waits for something may not join a batch that tasks wait for: every
    // cycle through batches needs such a task.
    if let Some(b) = tasks.first().and_then(|t| t.batch.clone()) {
        let waited = state.store.batch(&b).await?.is_some_and(|r| r.dependents)
            || !state
                .store
                .blocked_on(&Dependency::Batch(b.clone()), 1)
                .await?
                .is_empty();
        if waited {
            return Err(ApiError::bad(format!(
                "field \"batch\": tasks wait for batch {b:?}, so tasks that wait for others cannot join it (it could never complete)"
            )));
        }
    }
    // Whether a keyed entry's key is taken already, looked up once per entry.
    let mut taken: HashMap<usize, Option<Dependency>> = HashMap::new();
    let mut edges: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n];
    let mut resolved: Vec<Vec<Dependency>> = vec![Vec::new(); n];
    let mut external: BTreeSet<Dependency> = BTreeSet::new();
    // What an existing key or id resolves to, looked up once per request.
    let mut looked: HashMap<(String, Option<String>), Dependency> = HashMap::new();
    for i in 0..n {
        let entry = own.get(i).cloned().unwrap_or_default();
        let field = |j: usize, from_shared: bool| {
            if from_shared {
                format!("field \"after[{j}]\"")
            } else {
                format!("field \"tasks[{i}].after[{}]\"", j)
            }
        };
        let refs = shared
            .refs
            .iter()
            .enumerate()
            .map(|(j, r)| (field(j, true), r))
            .chain(entry.refs.iter().enumerate().map(|(j, r)| (field(j, false), r)));
        let mut seen: std::collections::HashSet<Dependency> = std::collections::HashSet::new();
        for (name, r) in refs {
            let entry = match r {
                Ref::Entry(e) if *e >= n => {
                    return Err(ApiError::bad(format!(
                        "{name} names entry {e}, but \"tasks\" has {n} entries"
                    )))
                }
                Ref::Entry(e) => Some(*e),
                Ref::Key { key, queue: None } => by_key.get(key.as_str()).copied(),
                _ => None,
            };
            if let Some(e) = entry {
                if let std::collections::hash_map::Entry::Vacant(v) = taken.entry(e) {
                    v.insert(taken_key(state, queue, &tasks[e]).await?);
                }
                match taken[&e].clone() {
                    // Its key is taken: the entry will be that task.
                    Some(d) => {
                        if seen.insert(d.clone()) {
                            resolved[i].push(d.clone());
                        }
                        external.insert(d);
                    }
                    None => {
                        edges[i].insert(e);
                    }
                }
                continue;
            }
            let dep = match r {
                Ref::Entry(_) => continue,
                Ref::Key { key, queue: q } => {
                    let k = (key.clone(), q.clone());
                    if let Some(d) = looked.get(&k) {
                        d.clone()
                    } else {
                        let d = existing_key(state, queue, key, q.as_deref(), &name).await?;
                        looked.insert(k, d.clone());
                        d
                    }
                }
                Ref::Id(id) => {
                    let k = (id.to_hex(), Some(String::new()));
                    if let Some(d) = looked.get(&k) {
                        d.clone()
                    } else {
                        if state.store.task(*id).await?.is_none() {
                            return Err(ApiError::bad(format!("{name} names task {id}, which does not exist")));
                        }
                        looked.insert(k, Dependency::Task(*id));
                        Dependency::Task(*id)
                    }
                }
                Ref::Batch(b) => {
                    if tasks[i].batch.as_deref() == Some(b.as_str()) {
                        return Err(ApiError::bad(format!(
                            "{name}: a task of batch {b:?} cannot wait for its own batch"
                        )));
                    }
                    let k = (format!("batch:{b}"), Some(String::new()));
                    if let std::collections::hash_map::Entry::Vacant(v) = looked.entry(k) {
                        if state.store.batch(b).await?.is_none() {
                            return Err(ApiError::bad(format!("{name} names batch {b:?}, which does not exist")));
                        }
                        v.insert(Dependency::Batch(b.clone()));
                    }
                    Dependency::Batch(b.clone())
                }
            };
            if seen.insert(dep.clone()) {
                resolved[i].push(dep.clone());
            }
            external.insert(dep);
        }
    }
    let order = parents_first(&edges)?;
    for (i, deps) in resolved.iter_mut().enumerate() {
        let entry = own.get(i).cloned().unwrap_or_default();
        deps.extend(edges[i].iter().map(|e| Dependency::Task(tasks[*e].id)));
        tasks[i].after = std::mem::take(deps);
        tasks[i].after_failure_runs = entry.runs_anyway.or(shared.runs_anyway).unwrap_or(false);
        if tasks[i].after.len() > MAX_AFTER {
            return Err(ApiError::bad(format!(
                "field \"tasks[{i}]\" waits for {} tasks with the request's \"after\"; at most {MAX_AFTER}",
                tasks[i].after.len()
            )));
        }
    }
    for e in edges.iter().flatten() {
        tasks[*e].dependents = true;
    }
    let mut slots: Vec<Option<NewTask>> = tasks.into_iter().map(Some).collect();
    let tasks = order.iter().filter_map(|i| slots[*i].take()).collect();
    Ok(Planned {
        tasks,
        external: external.into_iter().collect(),
    })
}

/// The task that already has entry `task`'s key, if any: the entry will not be created
/// (`POST /tasks` answers the existing task for a key taken), so what waits for the entry
/// waits for that task.
async fn taken_key(state: &Shared, queue: ObjectId, task: &NewTask) -> Result<Option<Dependency>, ApiError> {
    let Some(key) = &task.key else { return Ok(None) };
    let found = crate::lifecycle::keys::by_key(state.store.as_ref(), Some(queue), key).await?;
    Ok(found.first().map(|t| Dependency::Task(t.id)))
}

/// Creates `tasks` of `queue` with their dependencies (see the module): answers as
/// `POST /tasks` does, `ids` in the request's order. Runs to its end even when the client
/// goes away, so what the new tasks wait for is always settled.
pub(super) async fn create(
    state: &Shared,
    queue: ObjectId,
    tasks: Vec<NewTask>,
    shared: &After,
    own: &[After],
) -> Result<Value, ApiError> {
    let (state, shared, own) = (state.clone(), shared.clone(), own.to_vec());
    tokio::spawn(async move { create_now(&state, queue, tasks, &shared, &own).await })
        .await
        .map_err(|e| ApiError::Unavailable(format!("creating the tasks stopped: {e}")))?
}

async fn create_now(
    state: &Shared,
    queue: ObjectId,
    tasks: Vec<NewTask>,
    shared: &After,
    own: &[After],
) -> Result<Value, ApiError> {
    let request_order: Vec<ObjectId> = tasks.iter().map(|t| t.id).collect();
    let keyed = tasks.iter().any(|t| t.key.is_some());
    let planned = plan(state, queue, tasks, shared, own).await?;
    // Marked before and after the insert: an end settled in between (finding no task yet)
    // is settled again below, on success and on failure alike.
    if !planned.external.is_empty() {
        state.store.mark_dependents(&planned.external).await?;
    }
    let answer = if keyed {
        let order: Vec<ObjectId> = planned.tasks.iter().map(|t| t.id).collect();
        let waited: Vec<bool> = planned.tasks.iter().map(|t| t.dependents).collect();
        let made = super::keys::create_keyed(state, queue, planned.tasks, false).await;
        if let Ok(v) = &made {
            not_created(state, &order, &waited, v).await;
        }
        made.map(|mut v| {
            // Back to the request's order: entry i was inserted at position p.
            if let Some(Value::Array(ids)) = v.get("ids").cloned() {
                let at: HashMap<ObjectId, usize> = order.iter().enumerate().map(|(p, id)| (*id, p)).collect();
                let sorted: Vec<Value> = request_order
                    .iter()
                    .filter_map(|id| at.get(id).and_then(|p| ids.get(*p)).cloned())
                    .collect();
                v["ids"] = Value::Array(sorted);
            }
            v
        })
    } else {
        super::insert::insert_in_parts(state, queue, planned.tasks)
            .await
            .map(|_| super::json::created(queue, &request_order))
    };
    if let Err(e) = crate::lifecycle::deps::submitted(state.store.as_ref(), &planned.external).await {
        tracing::warn!(error = %e, "cannot settle what new tasks wait for now; the leader's sweep will");
    }
    answer
}

/// Entries with a key taken meanwhile (by another request, after this one was planned)
/// were not created: the tasks planned to wait for them are cancelled, saying so.
async fn not_created(state: &Shared, order: &[ObjectId], waited: &[bool], answer: &Value) {
    let Some(ids) = answer.get("ids").and_then(Value::as_array) else {
        return;
    };
    for ((planned, waited), got) in order.iter().zip(waited).zip(ids) {
        let got = got.as_str().unwrap_or_default();
        if !waited || got == planned.to_hex() {
            continue;
        }
        let why = format!("task {planned} was not created: its key was taken by task {got} meanwhile");
        let outcome = crate::lifecycle::deps::Outcome::Failed(why);
        if let Err(e) = crate::lifecycle::deps::settle(state.store.as_ref(), Dependency::Task(*planned), outcome).await
        {
            tracing::warn!(error = %e, task = %planned, "cannot cancel the tasks waiting for an entry not created");
        }
    }
}

/// The task a key names in `queue` (or in the queue named `other`).
async fn existing_key(
    state: &Shared,
    queue: ObjectId,
    key: &str,
    other: Option<&str>,
    name: &str,
) -> Result<Dependency, ApiError> {
    let (q, qname) = match other {
        Some(o) => {
            let found = queues::find(state, o)
                .await
                .map_err(|_| ApiError::bad(format!("{name} names queue {o:?}, which does not exist")))?;
            (found.id, found.name)
        }
        None => (queue, "the request's queue".to_string()),
    };
    let found = crate::lifecycle::keys::by_key(state.store.as_ref(), Some(q), key).await?;
    match found.first() {
        Some(t) => Ok(Dependency::Task(t.id)),
        None => Err(ApiError::bad(format!(
            "{name} names key {key:?}, which no entry of this request and no task of {qname} has"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn references_parse() {
        let m = |v: Value| -> Map<String, Value> { serde_json::from_value(v).unwrap() };
        let a = parse(
            &m(
                json!({"after": ["5f0000000000000000000001", "build", {"ref": 2}, {"batch": "b"},
                {"key": "k", "queue": "q"}], "after_failure": "run"}),
            ),
            "",
        )
        .unwrap();
        assert_eq!(a.runs_anyway, Some(true));
        assert_eq!(
            a.refs[1],
            Ref::Key {
                key: "build".into(),
                queue: None
            }
        );
        assert_eq!(a.refs[2], Ref::Entry(2));
        assert_eq!(a.refs[3], Ref::Batch("b".into()));
        let bad = |v: Value| parse(&m(v), "tasks[1].").unwrap_err().to_string();
        assert!(bad(json!({"after": [{"ref": -1}]})).contains("tasks[1].after[0]"));
        assert!(
            bad(json!({"after": [7]})).contains("got a number"),
            "{}",
            bad(json!({"after": [7]}))
        );
        assert!(bad(json!({"after": [{"bogus": 1}]})).contains("after[0]"));
        assert!(bad(json!({"after_failure": "maybe"})).contains("\"cancel\" or \"run\""));
    }
}
