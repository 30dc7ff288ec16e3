//! The settable fields of a queue (`POST /queues`, `POST /queues/{queue}`), checked: each
//! error names its field.

use bson::oid::ObjectId;
use bson::Document;
use serde_json::{Map, Value};

use super::body::kind;
use super::nodes::count;
use super::{ApiError, Shared};
use crate::config::{check_plugin_name, MAX_DURATION, MAX_OUTPUT_CAP_MIB};
use crate::model::{OnOrphan, Queue, QueueSandbox, Sort};
use crate::runner::{DirGrant, MAX_MEMORY};
use crate::store::PluginRef;

/// The settable fields of a queue, checked.
#[derive(Default)]
pub(super) struct Fields {
    pub name: Option<String>,
    pub plugin: Option<String>,
    pub threads: Option<Option<i64>>,
    pub sort: Option<Sort>,
    pub extra: Document,
}

pub(super) const QUEUE_FIELDS: &str =
    "name, plugin, threads, sort, sandbox, on_orphan, retry, activity_timeout, next_queue, rate, retention";

pub(super) fn fields(state: &Shared, body: &Map<String, Value>) -> Result<Fields, ApiError> {
    let mut f = Fields::default();
    for (k, v) in body {
        match k.as_str() {
            "name" => f.name = Some(name(v)?),
            "plugin" => f.plugin = Some(plugin(state, v)?.to_string()),
            "threads" => f.threads = Some(count("threads", v)?),
            "sort" => {
                let s = v
                    .as_str()
                    .ok_or_else(|| ApiError::bad("field \"sort\" must be \"fifo\", \"lifo\" or \"default\""))?;
                f.sort = Some(Sort::parse(s).map_err(|e| ApiError::bad(format!("field \"sort\": {e}")))?);
            }
            "sandbox" => {
                if !v.is_object() {
                    return Err(ApiError::bad(format!(
                        "field \"sandbox\" must be an object, got {}",
                        kind(v)
                    )));
                }
                submit_types(v)?;
                let sandbox: QueueSandbox =
                    serde_json::from_value(v.clone()).map_err(|e| ApiError::bad(format!("field \"sandbox\": {e}")))?;
                check_sandbox(&sandbox)?;
                let doc = bson::to_document(&sandbox).map_err(|e| ApiError::bad(format!("field \"sandbox\": {e}")))?;
                f.extra.insert("sandbox", doc);
            }
            "on_orphan" => {
                let policy: OnOrphan = serde_json::from_value(v.clone())
                    .map_err(|_| ApiError::bad("field \"on_orphan\" must be \"orphan\" or \"requeue\""))?;
                f.extra.insert(
                    "on_orphan",
                    match policy {
                        OnOrphan::Orphan => "orphan",
                        OnOrphan::Requeue => "requeue",
                    },
                );
            }
            "next_queue" => match v {
                Value::Null => {
                    f.extra.insert("next_queue", bson::Bson::Null);
                }
                Value::String(s) if !s.is_empty() => {
                    f.extra.insert("next_queue", s.as_str());
                }
                other => {
                    return Err(ApiError::bad(format!(
                        "field \"next_queue\" must be a queue name or id, or null, got {}",
                        kind(other)
                    )))
                }
            },
            "rate" if v.is_null() => {
                f.extra.insert("rate", bson::Bson::Null);
            }
            "rate" => {
                let b = bson::Bson::try_from(v.clone()).map_err(|e| ApiError::bad(format!("field \"rate\": {e}")))?;
                let rate = crate::model::Rate::parse(&b).map_err(ApiError::bad)?;
                f.extra.insert("rate", rate.to_bson());
            }
            "retention" => {
                if v.is_null() {
                    f.extra.insert("retention", bson::Bson::Null);
                } else {
                    let b = bson::Bson::try_from(v.clone())
                        .map_err(|e| ApiError::bad(format!("field \"retention\": {e}")))?;
                    let r = crate::model::Retention::from_bson(&b)
                        .map_err(|(field, e)| ApiError::bad(format!("field \"{field}\" {e}")))?;
                    f.extra.insert("retention", r.to_document());
                }
            }
            "retry" | "activity_timeout" if v.is_null() => {
                f.extra.insert(k.as_str(), bson::Bson::Null);
            }
            "retry" => {
                let b = bson::Bson::try_from(v.clone()).map_err(|e| ApiError::bad(format!("field \"retry\": {e}")))?;
                let policy = crate::model::RetryPolicy::from_bson(&b).map_err(ApiError::bad)?;
                f.extra.insert("retry", policy.to_document());
            }
            "activity_timeout" => {
                let b = bson::Bson::try_from(v.clone())
                    .map_err(|e| ApiError::bad(format!("field \"activity_timeout\": {e}")))?;
                let d = crate::model::activity_timeout_from(&b).map_err(ApiError::bad)?;
                if d > MAX_DURATION {
                    return Err(ApiError::bad(format!(
                        "field \"activity_timeout\" must be at most {} seconds (365 days)",
                        MAX_DURATION.as_secs()
                    )));
                }
                f.extra
                    .insert("activity_timeout", humantime::format_duration(d).to_string());
            }
            other => {
                return Err(ApiError::bad(format!(
                    "unknown field {other:?}: a queue has {QUEUE_FIELDS}"
                )))
            }
        }
    }
    Ok(f)
}

/// The limits a DEN's config puts on its own sandbox, so no queue asks for what no DEN can
/// give (e.g. a timeout past the end of its clock). Granted directories are checked by
/// each DEN, on its own host.
fn check_sandbox(s: &QueueSandbox) -> Result<(), ApiError> {
    let bad = |key: &str, message: String| ApiError::bad(format!("field \"sandbox.{key}\" {message}"));
    if let Some(t) = s.timeout.filter(|t| t.is_zero() || *t > MAX_DURATION) {
        return Err(bad(
            "timeout",
            format!(
                "must be more than 0 and at most {} seconds (365 days), got {} s",
                MAX_DURATION.as_secs(),
                t.as_secs_f64()
            ),
        ));
    }
    let max_memory_mib = MAX_MEMORY >> 20;
    if let Some(m) = s.memory_mib.filter(|m| !(1..=max_memory_mib).contains(m)) {
        return Err(bad(
            "memory_mib",
            format!("must be between 1 and {max_memory_mib}, got {m}"),
        ));
    }
    if let Some(c) = s.output_cap_mib.filter(|c| *c > MAX_OUTPUT_CAP_MIB) {
        return Err(bad(
            "output_cap_mib",
            format!("must be at most {MAX_OUTPUT_CAP_MIB}, got {c}"),
        ));
    }
    for (name, value) in &s.env {
        if name.is_empty() || name.contains(['=', '\0']) {
            return Err(bad("env", format!("{name:?} is not a valid environment variable name")));
        }
        if value.contains('\0') {
            return Err(bad("env", format!("{name:?} must not contain a NUL byte")));
        }
    }
    for (i, d) in s.dirs.iter().enumerate() {
        d.parse::<DirGrant>()
            .map_err(|e| bad(&format!("dirs[{i}]"), format!("is not a grant: {e}")))?;
    }
    for (i, a) in s.network_allow.iter().enumerate() {
        crate::runner::parse_network_allow(a).map_err(|e| bad(&format!("network_allow[{i}]"), e))?;
    }
    if s.write_quota_mib.is_some_and(|q| q.checked_mul(1 << 20).is_none()) {
        return Err(bad("write_quota_mib", "is too large".into()));
    }
    for (i, h) in s.http.iter().enumerate() {
        h.parse::<crate::runner::HttpRule>()
            .map_err(|e| bad(&format!("http[{i}]"), e))?;
    }
    if s.http_max_body_mib.is_some_and(|m| m.checked_mul(1 << 20).is_none()) {
        return Err(bad("http_max_body_mib", "is too large".into()));
    }
    if let Some(i) = s.submit.iter().position(|q| q.trim().is_empty()) {
        return Err(bad(
            &format!("submit[{i}]"),
            "must be a queue name or id, not empty".into(),
        ));
    }
    Ok(())
}

/// `sandbox.submit`, `sandbox.submit_max` and `sandbox.submit_depth` checked before the sandbox is read, so that
/// an error names the field.
fn submit_types(sandbox: &Value) -> Result<(), ApiError> {
    let bad = |key: &str, message: String| ApiError::bad(format!("field \"sandbox.{key}\" {message}"));
    match sandbox.get("submit") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            if let Some((i, item)) = items.iter().enumerate().find(|(_, q)| !q.is_string()) {
                return Err(bad(
                    &format!("submit[{i}]"),
                    format!("must be a queue name or id, got {}", kind(item)),
                ));
            }
        }
        Some(other) => {
            return Err(bad(
                "submit",
                format!("must be a list of queue names or ids, got {}", kind(other)),
            ))
        }
    }
    for (key, max) in [
        ("submit_max", crate::runner::MAX_SUBMIT_MAX),
        ("submit_depth", crate::runner::MAX_SUBMIT_DEPTH),
    ] {
        match sandbox.get(key) {
            Some(v) if !v.is_null() && v.as_u64().is_none_or(|n| n > u64::from(max)) => {
                return Err(bad(key, format!("must be an integer from 0 to {max}, got {v}")))
            }
            _ => {}
        }
    }
    Ok(())
}

fn name(v: &Value) -> Result<String, ApiError> {
    match v.as_str().map(str::trim) {
        Some(s) if !s.is_empty() => Ok(s.to_owned()),
        _ => Err(ApiError::bad("field \"name\" must be a non-empty string")),
    }
}

fn plugin(state: &Shared, v: &Value) -> Result<PluginRef, ApiError> {
    let Some(p) = v.as_str() else {
        return Err(ApiError::bad("field \"plugin\" must be a string"));
    };
    let r = PluginRef::parse(p).map_err(|e| ApiError::bad(format!("field \"plugin\": {e}")))?;
    check_plugin_name(&r.name).map_err(|e| ApiError::bad(format!("field \"plugin\": {e}")))?;
    if !state.plugins.contains(&r.name) {
        return Err(ApiError::bad(format!(
            "field \"plugin\": {:?} is not an allowed plugin (allowed: {})",
            r.name,
            state.plugins.join(", ")
        )));
    }
    Ok(r)
}

/// A plugin pinned to a version (`name@sha256:…`) must name a stored one.
pub(super) async fn check_pin(state: &Shared, plugin: &str) -> Result<(), ApiError> {
    let r = PluginRef::parse(plugin).map_err(ApiError::bad)?;
    let Some(pin) = &r.pin else { return Ok(()) };
    let versions = state.store.plugin_versions(Some(&r.name)).await?;
    if versions.iter().any(|v| v.sha256 == *pin) {
        return Ok(());
    }
    Err(ApiError::bad(format!(
        "field \"plugin\": {plugin:?} is not a stored version of {:?} ({} stored; GET /plugins/{} lists them)",
        r.name,
        versions.len(),
        r.name
    )))
}

/// Refuses a `next_queue` that does not exist or leads back to the queue (`id`, named
/// `name`): a chain that loops would make tasks for ever.
pub(super) async fn check_next(
    state: &Shared,
    extra: &bson::Document,
    id: Option<ObjectId>,
    name: &str,
) -> Result<(), ApiError> {
    let Ok(next) = extra.get_str("next_queue") else {
        return Ok(());
    };
    let queues = state.store.queues().await?;
    let find = |key: &str| Queue::find(&queues, key);
    let mut at = match find(next) {
        Some(q) => q,
        None => {
            return Err(ApiError::bad(format!(
                "field \"next_queue\" names queue {next:?}, which does not exist"
            )))
        }
    };
    let mut path = vec![name.to_string()];
    loop {
        path.push(at.name.clone());
        if at.name == name || Some(at.id) == id {
            return Err(ApiError::bad(format!(
                "field \"next_queue\" makes a loop: {} (each succeeded task would make another for ever)",
                path.join(" → ")
            )));
        }
        match at.next_queue.as_deref().and_then(find) {
            Some(q) if path.len() <= queues.len() + 1 => at = q,
            _ => return Ok(()),
        }
    }
}

/// The path by which a queue reaches itself through `sandbox.submit` grants (and
/// `next_queue` chains between them), names from the queue back to it: every task on it may
/// make follow-ups that come back, which only `sandbox.submit_depth` stops. Such a cycle is
/// allowed (a crawler or a tree walk grants itself `submit`), so it is a warning, not an
/// error. `None` when the queue is on no cycle with a grant in it; a cycle of chains alone
/// is refused where `next_queue` is written.
pub(super) fn submit_cycle(queues: &[Queue], id: ObjectId) -> Option<Vec<String>> {
    let start = queues.iter().position(|q| q.id == id)?;
    let edges = |q: &Queue| {
        let grants = q.sandbox.submit.iter().map(|k| (k.as_str(), true));
        let chain = q.next_queue.iter().map(|k| (k.as_str(), false));
        grants
            .chain(chain)
            .filter_map(|(k, grant)| Queue::find(queues, k).map(|to| (to.id, grant)))
            .collect::<Vec<_>>()
    };
    // A breadth-first search over (queue, whether the path to it took a grant), from
    // (start, no) to (start, yes); `from` holds how each state was first reached.
    let mut from = std::collections::HashMap::from([((start, false), None)]);
    let mut todo = std::collections::VecDeque::from([(start, false)]);
    while let Some((at, granted)) = todo.pop_front() {
        for (to, grant) in edges(&queues[at]) {
            let next = (queues.iter().position(|q| q.id == to)?, granted || grant);
            if from.contains_key(&next) {
                continue;
            }
            from.insert(next, Some((at, granted)));
            if next == (start, true) {
                let mut path = vec![queues[start].name.clone()];
                let mut state = next;
                while let Some(Some(prev)) = from.get(&state) {
                    path.push(queues[prev.0].name.clone());
                    state = *prev;
                }
                path.reverse();
                return Some(path);
            }
            todo.push_back(next);
        }
    }
    None
}

/// The answer's `warnings` for a queue just written: a cycle of follow-up grants through it.
pub(super) async fn queue_warnings(state: &Shared, id: ObjectId) -> Result<Vec<String>, ApiError> {
    let queues = state.store.queues().await?;
    let Some(path) = submit_cycle(&queues, id) else {
        return Ok(Vec::new());
    };
    let queue = queues
        .iter()
        .find(|q| q.id == id)
        .expect("the cycle starts at this queue");
    let setting = |v: Option<u32>, default: u32| {
        v.map_or_else(
            || format!("unset, so the DEN's default ({default} unless its config says otherwise)"),
            |n| n.to_string(),
        )
    };
    Ok(vec![format!(
        "queue {:?} can reach itself through sandbox.submit grants ({}): its follow-ups stop only at the depth \
         bound, sandbox.submit_depth ({}), and one lineage may hold up to sandbox.submit_max ({}) to that power of \
         tasks; lower either if the cycle is not meant",
        queue.name,
        path.join(" → "),
        setting(queue.sandbox.submit_depth, crate::runner::DEFAULT_SUBMIT_DEPTH),
        setting(queue.sandbox.submit_max, crate::runner::DEFAULT_SUBMIT_MAX),
    )])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(name: &str, submit: &[&str], next: Option<&str>) -> Queue {
        let mut q = Queue {
            id: ObjectId::new(),
            name: name.into(),
            plugin: "p".into(),
            threads: None,
            sort: Default::default(),
            sandbox: Default::default(),
            on_orphan: Default::default(),
            retry: None,
            activity_timeout: None,
            next_queue: None,
            maxthreads: None,
            rate: None,
            retention: None,
        };
        q.sandbox.submit = submit.iter().map(|s| s.to_string()).collect();
        q.next_queue = next.map(str::to_string);
        q
    }

    #[test]
    fn a_cycle_is_one_with_a_grant_through_the_queue() {
        let queues = vec![
            queue("a", &["b"], None),
            queue("b", &[], Some("c")),
            queue("c", &["a", "gone"], None),
            queue("d", &["d"], Some("a")),
            queue("e", &[], Some("f")),
            queue("f", &[], Some("e")),
            queue("g", &["a"], None),
        ];
        let path = |i: usize| submit_cycle(&queues, queues[i].id).map(|p| p.join(" → "));
        // Grants and chains together.
        assert_eq!(path(0).as_deref(), Some("a → b → c → a"));
        assert_eq!(path(1).as_deref(), Some("b → c → a → b"));
        // A self-grant; the chain out of d leads away and does not come back.
        assert_eq!(path(3).as_deref(), Some("d → d"));
        // Chains alone (refused where next_queue is written), and a queue that leads into a
        // cycle without being on it.
        assert_eq!(path(4), None);
        assert_eq!(path(6), None);
        // Names or ids.
        let mut by_id = queues.clone();
        by_id[1].next_queue = Some(queues[2].id.to_hex());
        assert_eq!(submit_cycle(&by_id, by_id[0].id).unwrap().join(" → "), "a → b → c → a");
    }
}
