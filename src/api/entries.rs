//! The task entries of `POST /tasks`: `tasks: [{params, run_at, priority, key, after,
//! after_failure}, …]`, each field checked and named in errors by its place in the list.

use bson::{Bson, DateTime, Document};
use serde_json::Value;

use super::after::{parse as parse_after, After};
use super::body::kind;
use super::ApiError;

/// A `run_at` value as a time: an RFC 3339 string or `{"$date": …}`, a delay from `now`
/// such as `"10m"` or `"1h 30m"`, or a number of seconds since the epoch.
pub(super) fn run_at(v: &Value, now: DateTime) -> Result<DateTime, String> {
    match v {
        Value::String(s) => match DateTime::parse_rfc3339_str(s) {
            Ok(t) => Ok(t),
            Err(_) => humantime::parse_duration(s)
                .map_err(|e| format!("must be a time (RFC 3339) or a delay like \"10m\": {s:?}: {e}"))
                .and_then(|d| {
                    i64::try_from(d.as_millis())
                        .ok()
                        .and_then(|ms| now.timestamp_millis().checked_add(ms))
                        .map(DateTime::from_millis)
                        .ok_or_else(|| format!("delay {s:?} is too long"))
                }),
        },
        Value::Number(n) => n
            .as_f64()
            .filter(|s| s.is_finite() && *s >= 0.0 && *s < 1e13)
            .map(|s| DateTime::from_millis((s * 1000.0) as i64))
            .ok_or_else(|| format!("must be seconds since the epoch, got {n}")),
        Value::Object(_) => match bson::Bson::try_from(v.clone()) {
            Ok(bson::Bson::DateTime(t)) => Ok(t),
            _ => Err("must be a time, a delay or {\"$date\": …}".to_string()),
        },
        other => Err(format!(
            "must be a time (RFC 3339), a delay like \"10m\" or epoch seconds, got {}",
            kind(other)
        )),
    }
}

/// One entry of the `tasks` list of `POST /tasks`.
pub(super) struct Entry {
    pub params: bson::Document,
    pub run_at: Option<DateTime>,
    pub priority: Option<i64>,
    pub key: Option<String>,
    pub after: After,
}

/// Longest task `key`.
pub const MAX_KEY: usize = 1000;

/// A `priority`: an integer (of either sign).
pub(super) fn priority(v: &Value) -> Result<i64, String> {
    v.as_i64().ok_or_else(|| {
        format!(
            "must be an integer, got {}",
            if v.is_number() {
                v.to_string()
            } else {
                kind(v).to_string()
            }
        )
    })
}

/// The `tasks` list of `POST /tasks`: `[{params, run_at, priority, key, after, after_failure}, …]`.
pub(super) fn task_entries(v: Option<&Value>, now: DateTime) -> Result<Vec<Entry>, ApiError> {
    let list = match v {
        Some(Value::Array(a)) => a,
        Some(other) => {
            return Err(ApiError::bad(format!(
                "field \"tasks\" must be an array of objects, got {}",
                kind(other)
            )))
        }
        None => return Err(ApiError::bad("field \"tasks\" is required")),
    };
    let mut entries = Vec::with_capacity(list.len());
    for (i, entry) in list.iter().enumerate() {
        let Value::Object(m) = entry else {
            return Err(ApiError::bad(format!(
                "field \"tasks[{i}]\" must be an object {{params, run_at, priority}}, got {}",
                kind(entry)
            )));
        };
        if let Some(k) = m
            .keys()
            .find(|k| !["params", "run_at", "priority", "key", "after", "after_failure"].contains(&k.as_str()))
        {
            return Err(ApiError::bad(format!(
                "field \"tasks[{i}]\": unknown field {k:?}: expected params, run_at, priority, key, after and after_failure"
            )));
        }
        let after = parse_after(m, &format!("tasks[{i}]."))?;
        let key = match m.get("key") {
            None | Some(Value::Null) => None,
            Some(Value::String(k)) if k.starts_with(crate::lifecycle::schedules::KEY_PREFIX) => {
                return Err(ApiError::bad(format!(
                    "field \"tasks[{i}].key\": keys beginning with {:?} are the schedules' own, got {k:?}",
                    crate::lifecycle::schedules::KEY_PREFIX
                )))
            }
            Some(Value::String(k)) if !k.is_empty() && k.len() <= MAX_KEY => Some(k.clone()),
            Some(other) => {
                return Err(ApiError::bad(format!(
                    "field \"tasks[{i}].key\" must be a non-empty string of at most {MAX_KEY} bytes, got {}",
                    if other.is_string() {
                        "one too long or empty"
                    } else {
                        kind(other)
                    }
                )))
            }
        };
        let params = match m.get("params") {
            None | Some(Value::Null) => bson::Document::new(),
            Some(p) => to_document(p).map_err(|e| ApiError::bad(format!("field \"tasks[{i}].params\" {e}")))?,
        };
        let run_at = match m.get("run_at") {
            None | Some(Value::Null) => None,
            Some(t) => Some(run_at(t, now).map_err(|e| ApiError::bad(format!("field \"tasks[{i}].run_at\" {e}")))?),
        };
        let priority = match m.get("priority") {
            None | Some(Value::Null) => None,
            Some(p) => Some(priority(p).map_err(|e| ApiError::bad(format!("field \"tasks[{i}].priority\" {e}")))?),
        };
        entries.push(Entry {
            params,
            run_at,
            priority,
            key,
            after,
        });
    }
    Ok(entries)
}

/// A JSON object (Extended JSON allowed) as a BSON document.
pub(super) fn to_document(v: &Value) -> Result<Document, String> {
    match v {
        Value::Object(_) => match Bson::try_from(v.clone()) {
            Ok(Bson::Document(d)) => Ok(d),
            Ok(_) => Err("must be an object".into()),
            Err(e) => Err(format!("is not valid Extended JSON: {e}")),
        },
        other => Err(format!("must be an object, got {}", kind(other))),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn run_at_takes_times_delays_and_epochs() {
        let now = DateTime::from_millis(1_000_000);
        assert_eq!(
            run_at(&json!("10m"), now).unwrap().timestamp_millis(),
            1_000_000 + 600_000
        );
        assert_eq!(
            run_at(&json!("2030-01-01T00:00:00Z"), now).unwrap().timestamp_millis(),
            1_893_456_000_000
        );
        assert_eq!(
            run_at(&json!(1700000000), now).unwrap().timestamp_millis(),
            1_700_000_000_000
        );
        assert_eq!(
            run_at(&json!({"$date": "2030-01-01T00:00:00Z"}), now)
                .unwrap()
                .timestamp_millis(),
            1_893_456_000_000
        );
        assert!(run_at(&json!("soon"), now).unwrap_err().contains("\"soon\""));
        assert!(run_at(&json!(true), now).unwrap_err().contains("boolean"));
        assert!(run_at(&json!(-5), now).is_err());
    }
}
