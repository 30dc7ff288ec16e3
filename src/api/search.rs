//! What a `GET /tasks` asks for: filters and options from the query string and, as
//! Disbatch 4's `disbatch tasks` sends them, from a JSON (or form) body on the GET.
//!
//! Options are named with or without Disbatch 4's leading dot (`.limit` or `limit`); a
//! value may be a number, a boolean, `0`/`1` or a string. Every other key is a filter on an
//! indexed field; a key repeated in the query string, or a JSON array, matches any of its
//! values (Disbatch 4's `$or`).

use std::collections::HashMap;
use std::time::Duration;

use axum::extract::Request;
use axum::http::request::Parts;
use bson::oid::ObjectId;
use serde_json::{Map, Value};

use super::body::{content_type, is_form, json_object, kind, object_id, read_limited};
use super::form::{decode, to_fields};
use super::{queues, ApiError, Shared};
use crate::store::TaskFilter;

/// The options of `GET /tasks` (given as `name` or `.name`); `shape` is read by
/// [`super::form::Shape`].
const OPTIONS: [&str; 12] = [
    "limit", "skip", "count", "fields", "epoch", "terse", "full", "pretty", "new", "next", "timeout", "shape",
];

/// The options that are flags, for which a bare name or an empty value means on.
const FLAGS: [&str; 5] = ["count", "epoch", "terse", "full", "pretty"];

/// The fields a search may filter on (each indexed).
const FILTERS: [&str; 6] = ["queue", "status", "node", "id", "batch", "after"];

/// Whether query parameter `key` is a filter or an option given an empty value, which
/// means it is absent: any but a flag. (An unknown key stays, to be refused by name.)
fn blank(key: &str, value: &Value) -> bool {
    let name = key.trim_start_matches('.');
    matches!(value, Value::String(s) if s.trim().is_empty())
        && !FLAGS.contains(&name)
        && (key == "filter" || FILTERS.contains(&key) || OPTIONS.contains(&name))
}

/// Largest body of a `GET /tasks` (filters and options only): 1 MiB.
pub const MAX_READ_BODY: usize = 1 << 20;
/// Most task ids the `id` filter may list.
pub const MAX_FILTER_IDS: usize = 1000;
/// Most statuses the `status` filter may list.
const MAX_FILTER_STATUSES: usize = 64;

/// The request's filters and options, each option under its name without the dot.
#[derive(Debug, Default)]
pub(super) struct Input {
    /// Filters on task fields.
    pub filters: Map<String, Value>,
    /// Options.
    pub options: Map<String, Value>,
    /// Options given with Disbatch 4's leading dot.
    pub dotted: Vec<String>,
}

impl Input {
    /// The filters and options of the query string and of the body of `request`.
    pub async fn read(request: Request) -> Result<Input, ApiError> {
        let (parts, body) = request.into_parts();
        let query = parts.uri.query().unwrap_or_default().as_bytes().to_vec();
        // A parameter given empty (`queue=`) is absent, but for a flag, on when bare (`?count`).
        let query: Map<String, Value> = to_fields(decode(&query))
            .into_iter()
            .filter(|(k, v)| !blank(k, v))
            .collect();
        let from_body = body_fields(parts, body).await?;
        let mut input = Input::default();
        for (source, fields) in [("query string", query), ("body", from_body)] {
            for (k, v) in fields {
                input.add(k, v, source)?;
            }
        }
        Ok(input)
    }

    fn add(&mut self, key: String, value: Value, source: &str) -> Result<(), ApiError> {
        if key == "filter" {
            let map = match value {
                Value::String(text) => match serde_json::from_str::<Value>(&text) {
                    Ok(Value::Object(m)) => m,
                    Ok(other) => return Err(filter_not_object(&other)),
                    Err(e) => return Err(ApiError::bad(format!("\"filter\" is not valid JSON: {e}"))),
                },
                Value::Object(m) => m,
                other => return Err(filter_not_object(&other)),
            };
            for (k, v) in map {
                self.add_filter(k, v, "filter")?;
            }
            return Ok(());
        }
        let (name, dotted) = match key.strip_prefix('.') {
            Some(name) => (name.to_string(), true),
            None => (key.clone(), false),
        };
        if !OPTIONS.contains(&name.as_str()) {
            if dotted {
                return Err(ApiError::bad(format!(
                    "unknown option {key:?}: the options are .{}",
                    OPTIONS[..8].join(", .")
                )));
            }
            return self.add_filter(key, value, source);
        }
        if self.options.contains_key(&name) {
            return Err(ApiError::bad(format!(
                "option \"{name}\" is given twice (with and without the dot, or in both the query string and the body)"
            )));
        }
        if dotted {
            self.dotted.push(name.clone());
        }
        self.options.insert(name, value);
        Ok(())
    }

    fn add_filter(&mut self, key: String, value: Value, source: &str) -> Result<(), ApiError> {
        if self.filters.contains_key(&key) {
            return Err(ApiError::bad(format!(
                "filter {key:?} is given twice (the second time in the {source})"
            )));
        }
        self.filters.insert(key, value);
        Ok(())
    }

    /// A flag: `true`/`false`, a number (0 is off), or a string (`1`, `true`, `yes`, `on`
    /// or empty, i.e. present without a value, are on; `0`, `false`, `no`, `off` off).
    pub fn flag(&self, name: &str) -> Result<bool, ApiError> {
        let bad = |v: &Value| {
            ApiError::bad(format!(
                "option \"{name}\" must be a boolean (true/false, 1/0), got {}",
                shown(v)
            ))
        };
        match self.options.get(name) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(Value::Number(n)) => Ok(n.as_f64().is_some_and(|x| x != 0.0)),
            Some(v @ Value::String(s)) => match s.trim().to_ascii_lowercase().as_str() {
                "" | "1" | "true" | "yes" | "on" => Ok(true),
                "0" | "false" | "no" | "off" => Ok(false),
                other => other.parse::<f64>().map(|x| x != 0.0).map_err(|_| bad(v)),
            },
            Some(other) => Err(bad(other)),
        }
    }

    /// A non-negative integer, given as a number or a string; `null` is none.
    pub fn number(&self, name: &str) -> Result<Option<u64>, ApiError> {
        let bad = |v: &Value| {
            ApiError::bad(format!(
                "option \"{name}\" must be a non-negative integer, got {}",
                shown(v)
            ))
        };
        match self.options.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v @ Value::Number(n)) => n
                .as_u64()
                .or_else(|| {
                    n.as_f64()
                        .filter(|x| x.fract() == 0.0 && *x >= 0.0 && *x < 1.8e19)
                        .map(|x| x as u64)
                })
                .map(Some)
                .ok_or_else(|| bad(v)),
            Some(v @ Value::String(s)) => s.trim().parse::<u64>().map(Some).map_err(|_| bad(v)),
            Some(other) => Err(bad(other)),
        }
    }

    /// An option's value as text (`new`, `next`, `timeout`).
    pub fn text(&self, name: &str) -> Option<String> {
        match self.options.get(name)? {
            Value::Null => None,
            Value::String(s) => Some(s.clone()),
            other => Some(other.to_string()),
        }
    }

    /// `timeout` as [`super::watch::timeout`] reads it.
    pub fn timeout(&self) -> Result<Duration, ApiError> {
        let mut q = HashMap::new();
        if let Some(t) = self.text("timeout") {
            q.insert("timeout".to_string(), t);
        }
        super::watch::timeout(&q)
    }

    /// `fields`: which fields to keep (`Some`), and which to leave out. A comma-separated
    /// list, a JSON array of names, or a projection object (`{"status": 1}` keeps,
    /// `{"stdout": 0}` leaves out), also as JSON text as Disbatch 4 sent it.
    pub fn fields(&self) -> Result<(Option<Vec<String>>, Vec<String>), ApiError> {
        let bad = |why: String| ApiError::bad(format!("option \"fields\" {why}"));
        let value = match self.options.get("fields") {
            None | Some(Value::Null) => return Ok((None, Vec::new())),
            Some(Value::String(s)) if s.trim_start().starts_with(['[', '{']) => {
                serde_json::from_str::<Value>(s).map_err(|e| bad(format!("is not valid JSON: {e}")))?
            }
            Some(Value::String(s)) if s.trim().is_empty() => return Ok((None, Vec::new())),
            Some(Value::String(s)) => {
                let list = s.split(',').map(|f| f.trim().to_owned()).filter(|f| !f.is_empty());
                return Ok((Some(list.collect()), Vec::new()));
            }
            Some(other) => other.clone(),
        };
        match value {
            Value::Array(items) => items
                .iter()
                .map(|f| {
                    f.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| bad(format!("must list field names, got {}", kind(f))))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(|l| (Some(l), Vec::new())),
            Value::Object(m) => {
                let (mut keep, mut drop) = (Vec::new(), Vec::new());
                for (k, v) in m.into_iter().filter(|(k, _)| k != "_id" && k != "id") {
                    let on = match &v {
                        Value::Bool(b) => *b,
                        Value::Number(n) => n.as_f64().is_some_and(|x| x != 0.0),
                        other => return Err(bad(format!("projection of {k:?} must be 1 or 0, got {}", kind(other)))),
                    };
                    if on {
                        keep.push(k)
                    } else {
                        drop.push(k)
                    }
                }
                match (keep.is_empty(), drop.is_empty()) {
                    (false, false) => Err(bad("cannot both keep some fields (1) and leave out others (0)".into())),
                    (false, true) => Ok((Some(keep), drop)),
                    _ => Ok((None, drop)),
                }
            }
            other => Err(bad(format!(
                "must be a list of field names or a projection object, got {}",
                kind(&other)
            ))),
        }
    }
}

/// The fields of a GET's body: a JSON object or a form; nothing for an empty body, 415 for
/// a body of another type.
async fn body_fields(parts: Parts, body: axum::body::Body) -> Result<Map<String, Value>, ApiError> {
    let headers = parts.headers.clone();
    let bytes = read_limited(body, MAX_READ_BODY, || {
        ApiError::TooLarge(format!(
            "a GET /tasks body (its filters and options) must be at most {} KiB: give long lists of ids in several requests",
            MAX_READ_BODY >> 10
        ))
    })
    .await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    if is_form(&headers) {
        return Ok(to_fields(decode(&bytes)));
    }
    match content_type(&headers) {
        (Some(t), _) if t == "application/json" || (t.starts_with("application/") && t.ends_with("+json")) => {
            json_object(&bytes)
        }
        (_, given) => Err(ApiError::NotJson(format!(
            "a GET /tasks body must be a JSON object sent as Content-Type: application/json (or a form), got {given}"
        ))),
    }
}

fn filter_not_object(v: &Value) -> ApiError {
    ApiError::bad(format!("\"filter\" must be a JSON object, got {}", kind(v)))
}

/// A value for a message: strings quoted, others as JSON.
fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

/// One status code, several separated by commas, a list (any of them) or `{"$in": [...]}`.
fn statuses(v: &Value) -> Result<Vec<i32>, ApiError> {
    let bad = || {
        ApiError::bad(format!(
            "filter \"status\" must be an integer or a list of integers, got {v}"
        ))
    };
    match v {
        Value::Number(n) => Ok(vec![n.as_i64().and_then(|n| i32::try_from(n).ok()).ok_or_else(bad)?]),
        Value::String(s) => s
            .split(',')
            .map(|p| p.trim().parse::<i32>().map_err(|_| bad()))
            .collect(),
        Value::Array(a) => a
            .iter()
            .map(|x| match (x, statuses(x)?.as_slice()) {
                (Value::Number(_) | Value::String(_), [one]) => Ok(*one),
                _ => Err(bad()),
            })
            .collect(),
        Value::Object(o) if o.len() == 1 && o.contains_key("$in") => statuses(&o["$in"]),
        _ => Err(bad()),
    }
}

/// The one value of a filter that takes one: a list of one is that value.
fn single<'a>(key: &str, v: &'a Value) -> Result<&'a Value, ApiError> {
    match v {
        Value::Array(items) if items.len() == 1 => Ok(&items[0]),
        Value::Array(_) => Err(ApiError::bad(format!(
            "filter {key:?} takes one value (only status and id match any of several)"
        ))),
        other => Ok(other),
    }
}

/// Builds the filter from `key → value` pairs; only indexed fields are accepted.
pub(super) async fn filter(state: &Shared, pairs: &Map<String, Value>) -> Result<TaskFilter, ApiError> {
    let mut f = TaskFilter::default();
    for (k, v) in pairs {
        match k.as_str() {
            "queue" => {
                let v = single(k, v)?;
                let queue = match object_id(v) {
                    Some(id) => id,
                    None => {
                        let key = v
                            .as_str()
                            .ok_or_else(|| ApiError::bad("filter \"queue\" must be a queue id or name"))?;
                        queues::find(state, key).await?.id
                    }
                };
                f.queue = Some(queue);
            }
            "status" => {
                let list = statuses(v)?;
                if list.len() > MAX_FILTER_STATUSES {
                    return Err(ApiError::bad(format!(
                        "filter \"status\" lists {} statuses; at most {MAX_FILTER_STATUSES}",
                        list.len()
                    )));
                }
                f.status = Some(list)
            }
            "node" => {
                f.node = Some(match single(k, v)? {
                    Value::Null => None,
                    Value::String(s) if s == "null" => None,
                    Value::String(s) => Some(s.clone()),
                    other => {
                        return Err(ApiError::bad(format!(
                            "filter \"node\" must be a node name or null, got {}",
                            kind(other)
                        )))
                    }
                })
            }
            "id" | "_id" => {
                let bad = || ApiError::bad(format!("filter {k:?} must be a task id (or a list of them)"));
                match v {
                    Value::Array(items) if items.len() > MAX_FILTER_IDS => {
                        return Err(ApiError::bad(format!(
                            "filter {k:?} lists {} task ids; at most {MAX_FILTER_IDS} per request",
                            items.len()
                        )))
                    }
                    Value::Array(items) => {
                        let ids = items.iter().map(|x| object_id(x).ok_or_else(bad));
                        f.ids = Some(ids.collect::<Result<Vec<ObjectId>, _>>()?);
                    }
                    one => f.id = Some(object_id(one).ok_or_else(bad)?),
                }
            }
            "batch" => {
                let v = single(k, v)?;
                f.batch = Some(
                    v.as_str()
                        .ok_or_else(|| ApiError::bad(format!("filter \"batch\" must be a batch id, got {}", kind(v))))?
                        .to_owned(),
                )
            }
            "after" => {
                let v = single(k, v)?;
                let text = v
                    .as_str()
                    .map(str::to_owned)
                    .or_else(|| object_id(v).map(|o| o.to_hex()));
                f.after = Some(text.as_deref().and_then(crate::store::Dependency::parse).ok_or_else(|| {
                    ApiError::bad("filter \"after\" must be a task id or batch:<batch id> (lists the tasks waiting for it)")
                })?)
            }
            other => {
                return Err(ApiError::bad(format!(
                    "cannot filter on {other:?}: only the indexed fields {}",
                    FILTERS.join(", ")
                )))
            }
        }
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn input(query: &str, body: Value) -> Input {
        let mut i = Input::default();
        for (k, v) in to_fields(decode(query.as_bytes())) {
            i.add(k, v, "query string").unwrap();
        }
        for (k, v) in body.as_object().cloned().unwrap_or_default() {
            i.add(k, v, "body").unwrap();
        }
        i
    }

    #[test]
    fn dot_options_and_filters() {
        let i = input(
            "status=1&status=2",
            json!({".count": 0, ".fields": null, ".limit": 20, ".skip": 1, ".terse": 0, ".full": 0,
                   ".epoch": 1, ".pretty": "0", "queue": "q"}),
        );
        assert_eq!(i.filters["status"], json!(["1", "2"]));
        assert_eq!(i.filters["queue"], json!("q"));
        assert_eq!(i.number("limit").unwrap(), Some(20));
        assert_eq!(i.number("skip").unwrap(), Some(1));
        assert!(!i.flag("count").unwrap() && i.flag("epoch").unwrap() && !i.flag("pretty").unwrap());
        assert_eq!(i.fields().unwrap(), (None, vec![]));
        assert!(i.dotted.contains(&"limit".to_string()));
        assert_eq!(statuses(&i.filters["status"]).unwrap(), vec![1, 2]);
    }

    #[test]
    fn fields_in_every_form() {
        let f = |v: Value| input("", json!({ ".fields": v })).fields();
        assert_eq!(
            f(json!("status,node")).unwrap().0,
            Some(vec!["status".into(), "node".into()])
        );
        assert_eq!(f(json!("[\"status\"]")).unwrap().0, Some(vec!["status".into()]));
        assert_eq!(
            f(json!({"status": 1, "_id": 0})).unwrap().0,
            Some(vec!["status".into()])
        );
        assert_eq!(f(json!({"stdout": 0})).unwrap(), (None, vec!["stdout".into()]));
        assert!(f(json!({"stdout": 0, "status": 1})).is_err());
        assert!(f(json!(7)).is_err());
    }

    #[test]
    fn bad_options_name_themselves() {
        let i = input("", json!({".limit": "many", ".count": "maybe"}));
        assert!(i.number("limit").unwrap_err().to_string().contains("\"limit\""));
        assert!(i.flag("count").unwrap_err().to_string().contains("\"count\""));
        let mut twice = input("limit=1", json!({}));
        assert!(twice.add(".limit".into(), json!(2), "body").is_err());
        let mut unknown = Input::default();
        assert!(unknown
            .add(".sort".into(), json!(1), "body")
            .unwrap_err()
            .to_string()
            .contains(".sort"));
    }

    #[test]
    fn status_lists() {
        assert_eq!(statuses(&json!("1,2")).unwrap(), vec![1, 2]);
        assert_eq!(statuses(&json!([-2, 0])).unwrap(), vec![-2, 0]);
        assert_eq!(statuses(&json!(["-2", "0"])).unwrap(), vec![-2, 0]);
        assert_eq!(statuses(&json!({"$in": [1]})).unwrap(), vec![1]);
        assert!(statuses(&json!("x")).is_err());
        assert!(statuses(&json!([[]])).is_err());
        assert!(statuses(&json!([{"$in": []}])).is_err());
        assert!(statuses(&json!(["1,2"])).is_err());
    }

    #[test]
    fn one_value_filters() {
        assert!(single("queue", &json!(["a", "b"])).is_err());
        assert_eq!(single("queue", &json!(["a"])).unwrap(), &json!("a"));
    }
}
