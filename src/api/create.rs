//! `POST /tasks`: tasks from a list of params, or one per matching document of another
//! collection (Disbatch 4's two forms).
//!
//! Tasks are inserted in batches of [`INSERT_BATCH`](super::insert::INSERT_BATCH) with ids chosen here, so that a
//! failure midway answers with what is known: the ids created by the batches before it,
//! and the ids of the batch that failed, which may or may not exist
//! ([`ApiError::PartlyCreated`]).
//!
//! The collection form requires `filter` (no implicit "every document") and reads only the
//! top-level fields its `params` mapping uses.
//!
//! Every answer carries Disbatch 4's `MongoDB::InsertManyResult` beside `{queue, count,
//! ids}`: `inserted` lists `{index, _id}` of the tasks this request created.

use axum::extract::State;
use axum::Json;
use bson::oid::ObjectId;
use bson::{Bson, Document};
use serde_json::{Map, Value};

use super::body::{kind, object_id, Params};
use super::entries::to_document;
use super::{queues, ApiError, Shared};
use crate::store::NewTask;

/// Most tasks one `POST /tasks` with a `collection` may create.
pub const MAX_COLLECTION_TASKS: i64 = 1_000_000;

/// `POST /tasks`: `{queue, params: [{…}, …]}` creates one task per params object;
/// `{queue, tasks: [{params, run_at}, …]}` one per entry, each with its own time;
/// `{queue, collection, filter, params: {key: "document.field" | literal}}` one per
/// matching document of `collection`. A top-level `run_at` (a time, or a delay such as
/// `"10m"`) schedules every task of the request. Answers `{"queue", "count": n, "ids": [...]}`; a
/// failure after some tasks were created answers the error with them (see the module).
pub(super) async fn create(State(state): State<Shared>, params: Params) -> Result<Json<Value>, ApiError> {
    let mut body = params.fields;
    if params.form {
        super::form::decode_json_fields(&mut body, &["params", "tasks", "filter", "after"])?;
    }
    create_from(state, body).await.map(|answer| Json(with_inserted(answer)))
}

/// `answer` with Disbatch 4's `MongoDB::InsertManyResult`: the tasks of `ids` that were
/// created (not `existing` or `resubmitted`), each with its index in `ids`.
fn with_inserted(answer: Value) -> Value {
    let listed = |key: &str| -> Vec<String> {
        answer[key]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
            .unwrap_or_default()
    };
    let (existing, resubmitted) = (listed("existing"), listed("resubmitted"));
    let inserted: Vec<(usize, ObjectId)> = listed("ids")
        .iter()
        .enumerate()
        .filter(|(_, id)| !existing.contains(id) && !resubmitted.contains(id))
        .filter_map(|(i, id)| ObjectId::parse_str(id).ok().map(|id| (i, id)))
        .collect();
    let result = super::json::mongo::insert_many(inserted.iter().map(|(i, id)| (*i, id)));
    super::json::mongo::with(answer, result)
}

async fn create_from(state: Shared, body: Map<String, Value>) -> Result<Value, ApiError> {
    for k in body.keys() {
        if ![
            "queue",
            "params",
            "tasks",
            "run_at",
            "priority",
            "resubmit",
            "collection",
            "filter",
            "batch",
            "batch_size",
            "after",
            "after_failure",
        ]
        .contains(&k.as_str())
        {
            return Err(ApiError::bad(format!(
                "unknown field {k:?}: expected queue and params (or tasks), optionally run_at, priority, \
                 resubmit, batch, batch_size, after and after_failure, and for tasks from documents \
                 collection and filter"
            )));
        }
    }
    let shared_after = super::after::parse(&body, "")?;
    let batch = super::batches::parse(&body)?;
    let resubmit = match body.get("resubmit") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(ApiError::bad(format!(
                "field \"resubmit\" must be true or false, got {}",
                kind(other)
            )))
        }
    };
    if resubmit && !body.contains_key("tasks") {
        return Err(ApiError::bad(
            "field \"resubmit\" applies to tasks with a key: give them as \"tasks\": [{params, key}, …]",
        ));
    }
    let now = bson::DateTime::now();
    let run_at = match body.get("run_at") {
        None | Some(Value::Null) => None,
        Some(v) => Some(super::entries::run_at(v, now).map_err(|e| ApiError::bad(format!("field \"run_at\" {e}")))?),
    };
    let priority = match body.get("priority") {
        None | Some(Value::Null) => 0,
        Some(v) => super::entries::priority(v).map_err(|e| ApiError::bad(format!("field \"priority\" {e}")))?,
    };
    let key = match body.get("queue") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(v @ Value::Object(_)) => object_id(v)
            .map(|id| id.to_hex())
            .ok_or_else(|| ApiError::bad("field \"queue\" must be a queue id or name"))?,
        _ => return Err(ApiError::bad("field \"queue\" is required (a queue id or name)")),
    };
    let mut each: Vec<(Option<bson::DateTime>, Option<i64>, Option<String>)> = Vec::new();
    let mut own_after: Vec<super::after::After> = Vec::new();
    let params = if body.contains_key("tasks") {
        if body.contains_key("params") || body.contains_key("collection") {
            return Err(ApiError::bad(
                "field \"tasks\" cannot be used with \"params\" or \"collection\"",
            ));
        }
        let entries = super::entries::task_entries(body.get("tasks"), now)?;
        each = entries.iter().map(|e| (e.run_at, e.priority, e.key.clone())).collect();
        own_after = entries.iter().map(|e| e.after.clone()).collect();
        entries.into_iter().map(|e| e.params).collect()
    } else if body.contains_key("collection") {
        from_collection(&state, &body).await?
    } else {
        if body.contains_key("filter") {
            return Err(ApiError::bad("field \"filter\" needs field \"collection\""));
        }
        let list = match body.get("params") {
            Some(Value::Array(a)) => a.clone(),
            // One task, as Disbatch 4 took it (which refused an empty one).
            Some(Value::Object(m)) if m.is_empty() => return Err(ApiError::bad(
                "field \"params\" as one object must have at least one field (an array of objects gives a task each)",
            )),
            Some(one @ Value::Object(_)) => vec![one.clone()],
            Some(other) => {
                return Err(ApiError::bad(format!(
                    "field \"params\" must be an array of objects, got {} (one object is one task)",
                    kind(other)
                )))
            }
            None => return Err(ApiError::bad("field \"params\" is required (an array of objects)")),
        };
        list.iter()
            .enumerate()
            .map(|(i, p)| to_document(p).map_err(|e| ApiError::bad(format!("field \"params[{i}]\" {e}"))))
            .collect::<Result<Vec<_>, _>>()?
    };
    for (i, p) in params.iter().enumerate() {
        check_storable(p).map_err(|e| ApiError::bad(format!("field \"params[{i}]\" {e}")))?;
    }
    let queue = queues::find(&state, &key).await?;
    let total = params.len();
    if let Some((id, size)) = &batch {
        super::batches::admit(&state, id, *size, total).await?;
    }
    let batch = batch.map(|(id, _)| id);
    let rest: Vec<NewTask> = params
        .into_iter()
        .enumerate()
        .map(|(i, params)| {
            let (own_time, own_priority, key) = each.get(i).cloned().unwrap_or_default();
            NewTask {
                id: ObjectId::new(),
                params,
                run_at: own_time.or(run_at),
                priority: own_priority.unwrap_or(priority),
                key,
                batch: batch.clone(),
                after: Vec::new(),
                after_failure_runs: false,
                dependents: false,
            }
        })
        .collect();
    if !shared_after.refs.is_empty() || own_after.iter().any(|a| !a.refs.is_empty()) {
        if resubmit {
            return Err(ApiError::bad(
                "field \"resubmit\" cannot be used with \"after\": a task submitted again keeps what it waits for",
            ));
        }
        return super::after::create(&state, queue.id, rest, &shared_after, &own_after)
            .await
            .map(|v| with_batch(v, &batch));
    }
    if rest.iter().any(|t| t.key.is_some()) {
        return super::keys::create_keyed(&state, queue.id, rest, resubmit)
            .await
            .map(|v| with_batch(v, &batch));
    }
    let created = super::insert::insert_in_parts(&state, queue.id, rest).await?;
    Ok(with_batch(super::json::created(queue.id, &created), &batch))
}

/// A `POST /tasks` answer with the batch its tasks went to, if any.
fn with_batch(mut answer: Value, batch: &Option<String>) -> Value {
    if let (Some(b), Some(m)) = (batch, answer.as_object_mut()) {
        m.insert("batch".into(), Value::String(b.clone()));
    }
    answer
}

/// Largest BSON size of one task's params: the database's 16 MiB document limit less room
/// for the task's other fields.
pub const MAX_PARAMS_BYTES: usize = (16 << 20) - (16 << 10);

/// Whether `params` can be stored in a task document: BSON keys without NUL bytes, and at
/// most [`MAX_PARAMS_BYTES`].
fn check_storable(params: &Document) -> Result<(), String> {
    let bytes = bson::to_vec(params).map_err(|e| format!("cannot be stored: {e}"))?;
    if bytes.len() > MAX_PARAMS_BYTES {
        return Err(format!(
            "is {} bytes as BSON, over the {MAX_PARAMS_BYTES} bytes a task's params may take",
            bytes.len()
        ));
    }
    Ok(())
}

/// Operators that run code on the server; refused in a filter.
const CODE_OPERATORS: [&str; 3] = ["$where", "$function", "$accumulator"];

fn check_no_code(v: &Value) -> Result<(), ApiError> {
    match v {
        Value::Object(m) => {
            if let Some(k) = m.keys().find(|k| CODE_OPERATORS.contains(&k.as_str())) {
                return Err(ApiError::bad(format!("field \"filter\": operator {k} is not allowed")));
            }
            m.values().try_for_each(check_no_code)
        }
        Value::Array(a) => a.iter().try_for_each(check_no_code),
        _ => Ok(()),
    }
}

async fn from_collection(state: &Shared, body: &Map<String, Value>) -> Result<Vec<Document>, ApiError> {
    let collection = match body.get("collection") {
        Some(Value::String(s)) if !s.is_empty() && !s.contains('$') && !s.starts_with("system.") => s.clone(),
        _ => return Err(ApiError::bad("field \"collection\" must be a collection name")),
    };
    let mapping = match body.get("params") {
        Some(Value::Object(m)) => m.clone(),
        None => Map::new(),
        Some(other) => {
            return Err(ApiError::bad(format!(
                "field \"params\" must be an object mapping keys to \"document.<field>\" or values, got {}",
                kind(other)
            )))
        }
    };
    let Some(filter_value) = body.get("filter") else {
        return Err(ApiError::bad(
            "field \"filter\" is required with \"collection\" (a query object; {} matches every document)",
        ));
    };
    check_no_code(filter_value)?;
    let filter = to_document(filter_value).map_err(|e| ApiError::bad(format!("field \"filter\" {e}")))?;
    let source = state
        .documents
        .as_ref()
        .ok_or_else(|| ApiError::bad("field \"collection\": this server cannot read other collections"))?;
    let docs = source
        .find(&collection, filter, projection(&mapping), MAX_COLLECTION_TASKS + 1)
        .await
        .map_err(|e| ApiError::bad(format!("field \"filter\": the query on {collection:?} failed: {e}")))?;
    if docs.len() as i64 > MAX_COLLECTION_TASKS {
        return Err(ApiError::bad(format!(
            "field \"filter\" matches more than {MAX_COLLECTION_TASKS} documents"
        )));
    }
    Ok(docs.iter().map(|d| map_params(&mapping, d)).collect())
}

/// The fields of the source documents that `mapping` uses: the top-level field of each
/// `"document.a.b"` path (a projection on the whole path would drop array elements that
/// `"document.list.1"` reads), `_id` only when a path uses it or nothing else is read.
/// `None` (whole documents) when some value is `"document"`.
pub(super) fn projection(mapping: &Map<String, Value>) -> Option<Document> {
    let mut fields = Document::new();
    let mut id = false;
    for v in mapping.values() {
        match v.as_str() {
            Some("document") => return None,
            Some(path) if path.starts_with("document.") => {
                let top = path["document.".len()..].split('.').next().unwrap_or_default();
                if top == "_id" {
                    id = true;
                } else if !top.is_empty() {
                    fields.insert(top, 1);
                }
            }
            _ => {}
        }
    }
    if fields.is_empty() {
        // Only literals: read nothing but the ids (`{_id: 0}` alone would exclude, not
        // include, and read every other field).
        return Some(bson::doc! { "_id": 1 });
    }
    if !id {
        fields.insert("_id", 0);
    }
    Some(fields)
}

/// The params of one task: each value `"document"` is the whole document, `"document.a.b"`
/// the document's field `a.b` (null when missing); anything else is taken as is.
pub(super) fn map_params(mapping: &Map<String, Value>, doc: &Document) -> Document {
    let mut out = Document::new();
    for (k, v) in mapping {
        let value = match v.as_str() {
            Some("document") => Bson::Document(doc.clone()),
            Some(path) if path.starts_with("document.") => lookup(doc, &path["document.".len()..]),
            _ => Bson::try_from(v.clone()).unwrap_or(Bson::Null),
        };
        out.insert(k.clone(), value);
    }
    out
}

fn lookup(doc: &Document, path: &str) -> Bson {
    let mut current = Bson::Document(doc.clone());
    for part in path.split('.') {
        current = match current {
            Bson::Document(d) => d.get(part).cloned().unwrap_or(Bson::Null),
            Bson::Array(a) => part
                .parse::<usize>()
                .ok()
                .and_then(|i| a.get(i).cloned())
                .unwrap_or(Bson::Null),
            _ => Bson::Null,
        };
    }
    current
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;
    use serde_json::json;

    #[test]
    fn projection_reads_only_the_mapped_top_level_fields() {
        let m = |v: Value| -> Map<String, Value> { serde_json::from_value(v).unwrap() };
        let p = projection(&m(json!({"to": "document.email", "n": "document.profile.name",
            "second": "document.list.1", "lit": 5, "text": "hello"})))
        .unwrap();
        assert_eq!(p, doc! { "email": 1, "profile": 1, "list": 1, "_id": 0 });
        let p = projection(&m(json!({"id": "document._id", "a": "document.a.b"}))).unwrap();
        assert_eq!(p, doc! { "a": 1 });
        assert_eq!(projection(&m(json!({"all": "document", "e": "document.email"}))), None);
        assert_eq!(projection(&m(json!({"lit": 1}))).unwrap(), doc! { "_id": 1 });
        assert_eq!(projection(&Map::new()).unwrap(), doc! { "_id": 1 });
    }

    #[test]
    fn params_from_document_paths() {
        let d = doc! { "_id": 1, "a": { "b": "x" }, "list": [10, 20] };
        let m: Map<String, Value> = serde_json::from_value(
            json!({"id": "document._id", "b": "document.a.b", "second": "document.list.1",
                "missing": "document.nope", "lit": 5, "all": "document"}),
        )
        .unwrap();
        let p = map_params(&m, &d);
        assert_eq!(p.get("id"), Some(&Bson::Int32(1)));
        assert_eq!(p.get_str("b").unwrap(), "x");
        assert_eq!(p.get("second"), Some(&Bson::Int32(20)));
        assert_eq!(p.get("missing"), Some(&Bson::Null));
        assert_eq!(p.get("lit"), Some(&Bson::Int32(5)));
        assert_eq!(p.get_document("all").unwrap(), &d);
    }
}
