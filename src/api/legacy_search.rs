//! `POST /tasks/search`: Disbatch 4's deprecated task search (its `Disbatch::Web::Tasks`
//! routes, behind its CLI's `search` verb), answered by the search of `GET /tasks`.
//!
//! The body is `{filter, options, count, terse, pretty}`, every field optional (an empty
//! body is `{}`):
//! - `filter`: the fields to match, the same indexed fields as `GET /tasks` (`queue` an id,
//!   `{"$oid"}` or a name; `status` a code, a list or `{"$in"}`; `node`; `_id`/`id`;
//!   `batch`; `after`). Any other field is refused, naming it: Disbatch 4 passed the filter
//!   to MongoDB as it came.
//! - `options`: `limit` (default and at most [`LIMIT`]), `skip`, `sort` (`{"_id": 1}`,
//!   oldest first, the default as in Disbatch 4, or `{"_id": -1}`) and `projection`.
//! - `count`: answer `{"count": n}` instead of the tasks.
//! - `terse` (default on): inline stdout/stderr become `"[terse mode]"`; off, outputs kept
//!   in files are read back as text, as `full` does for `GET /tasks` (so at most
//!   [`super::MAX_FULL_LIMIT`] tasks).
//! - `pretty`: indented JSON.
//!
//! The answer is a JSON array of tasks, dates in epoch seconds as Disbatch 4 gave them
//! (`[]` when none matches), or `{"count": n}`; 400 `{error}` naming the problem.

use axum::extract::{Request, State};
use axum::response::Response;
use serde_json::{json, Map, Value};

use super::body::{check_json_type, kind, optional_object, read_limited};
use super::form::Shape;
use super::search::{Input, MAX_READ_BODY};
use super::{ApiError, Shared, MAX_FULL_LIMIT};

/// Largest `options.limit`, and the default, as in Disbatch 4.
pub const LIMIT: u64 = 100;

/// The fields of the body.
const FIELDS: [&str; 5] = ["filter", "options", "count", "terse", "pretty"];
/// The `options` taken.
const OPTIONS: [&str; 4] = ["limit", "skip", "sort", "projection"];

/// `POST /tasks/search`.
pub(super) async fn search(State(state): State<Shared>, shape: Shape, request: Request) -> Result<Response, ApiError> {
    check_json_type(request.headers())?;
    let bytes = read_limited(request.into_body(), MAX_READ_BODY, || {
        ApiError::TooLarge(format!(
            "a POST /tasks/search body must be at most {} KiB",
            MAX_READ_BODY >> 10
        ))
    })
    .await?;
    let (input, oldest_first) = input(optional_object(&bytes)?)?;
    super::tasks::answer(&state, shape, &input, oldest_first).await
}

/// The body as the filters and options of `GET /tasks`, and whether oldest first.
fn input(body: Map<String, Value>) -> Result<(Input, bool), ApiError> {
    if let Some(k) = body.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(ApiError::bad(format!(
            "unknown field {k:?}: expected {}",
            FIELDS.join(", ")
        )));
    }
    let object = |name: &str| match body.get(name) {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(m)) => Ok(m.clone()),
        Some(other) => Err(ApiError::bad(format!(
            "filter and options must be name/value objects: \"{name}\" is {}",
            kind(other)
        ))),
    };
    let (filters, options) = (object("filter")?, object("options")?);
    if let Some(k) = options.keys().find(|k| !OPTIONS.contains(&k.as_str())) {
        return Err(ApiError::bad(format!(
            "option \"options.{k}\" is not supported: the options are {}",
            OPTIONS.join(", ")
        )));
    }
    let mut input = Input {
        filters,
        ..Input::default()
    };
    for flag in ["count", "pretty"] {
        if let Some(v) = body.get(flag).filter(|v| !v.is_null()) {
            input.options.insert(flag.into(), v.clone());
        }
    }
    input.options.insert(
        "terse".into(),
        body.get("terse")
            .filter(|v| !v.is_null())
            .cloned()
            .unwrap_or(json!(true)),
    );
    let terse = input.flag("terse")?;
    if !terse {
        // Not terse: outputs kept in files are read back.
        input.options.insert("terse".into(), json!(false));
        input.options.insert("full".into(), json!(true));
    }
    input.options.insert("epoch".into(), json!(true));
    let most = if terse { LIMIT } else { MAX_FULL_LIMIT };
    let limit = match options.get("limit") {
        None | Some(Value::Null) => most,
        Some(v) => {
            let given = v
                .as_u64()
                .ok_or_else(|| ApiError::bad(format!("\"options.limit\" must be a non-negative integer, got {v}")))?;
            if given > LIMIT {
                return Err(ApiError::bad(format!(
                    "limit cannot exceed {LIMIT}: \"options.limit\" is {given}"
                )));
            }
            if !terse && given > MAX_FULL_LIMIT {
                return Err(ApiError::bad(format!(
                    "\"terse\": false reads outputs kept in files back: \"options.limit\" must be at most {MAX_FULL_LIMIT} with it, got {given}"
                )));
            }
            // 0 is no limit in MongoDB: here the most there may be.
            if given == 0 {
                most
            } else {
                given
            }
        }
    };
    input.options.insert("limit".into(), json!(limit));
    // A null option is the option absent, as for `limit` and `sort`.
    if let Some(skip) = options.get("skip").filter(|v| !v.is_null()) {
        input.options.insert("skip".into(), skip.clone());
    }
    if let Some(p) = options.get("projection").filter(|v| !v.is_null()) {
        if !p.is_object() {
            return Err(ApiError::bad(format!(
                "options.projection must be an object of fields ({{\"status\": 1}} or {{\"stdout\": 0}}), got {p}"
            )));
        }
        input.options.insert("fields".into(), p.clone());
    }
    let oldest_first = match options.get("sort") {
        None | Some(Value::Null) => true,
        Some(Value::Object(m)) if m.len() == 1 && m.contains_key("_id") => match m["_id"].as_i64() {
            Some(1) => true,
            Some(-1) => false,
            _ => return Err(bad_sort(&m["_id"])),
        },
        Some(other) => return Err(bad_sort(other)),
    };
    Ok((input, oldest_first))
}

fn bad_sort(v: &Value) -> ApiError {
    ApiError::bad(format!(
        "\"options.sort\" must be {{\"_id\": 1}} (oldest first) or {{\"_id\": -1}} (newest first), got {v}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(body: Value) -> Result<(Input, bool), ApiError> {
        input(body.as_object().cloned().unwrap_or_default())
    }

    #[test]
    fn defaults_are_disbatch_4s() {
        let (i, oldest) = read(json!({})).unwrap();
        assert!(oldest);
        assert_eq!(i.number("limit").unwrap(), Some(LIMIT));
        assert!(i.flag("terse").unwrap() && i.flag("epoch").unwrap() && !i.flag("full").unwrap());
        let (i, oldest) = read(json!({"terse": 0, "options": {"sort": {"_id": -1}, "skip": 2}})).unwrap();
        assert!(!oldest);
        assert!(!i.flag("terse").unwrap() && i.flag("full").unwrap());
        assert_eq!(i.number("limit").unwrap(), Some(MAX_FULL_LIMIT));
        assert_eq!(i.number("skip").unwrap(), Some(2));
    }

    #[test]
    fn bad_bodies_name_the_problem() {
        let message = |v: Value| read(v).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message(json!({"filter": []})).contains("filter and options must be name/value objects"));
        assert!(message(json!({"options": {"limit": 101}})).contains("limit cannot exceed 100"));
        assert!(message(json!({"options": {"hint": 1}})).contains("options.hint"));
        assert!(message(json!({"options": {"sort": {"ctime": 1}}})).contains("options.sort"));
        assert!(message(json!({"query": {}})).contains("\"query\""));
    }
}
