//! Reading a verb's input: `key value` pairs, and JSON given inline, as `@file` or `-`.

use std::io::Read as _;

use serde_json::{Map, Value};

use super::CliError;

/// `key value …` pairs → a JSON object; each value is JSON when it parses, else a string.
pub(super) fn pairs_object(pairs: &[String]) -> Result<Map<String, Value>, CliError> {
    if !pairs.len().is_multiple_of(2) {
        return Err(CliError::Usage(format!(
            "expected pairs of key and value, got an odd number of words: {}",
            pairs.join(" ")
        )));
    }
    Ok(pairs
        .chunks(2)
        .map(|kv| {
            let v = serde_json::from_str::<Value>(&kv[1]).unwrap_or_else(|_| Value::String(kv[1].clone()));
            (kv[0].clone(), v)
        })
        .collect())
}

pub(super) fn task_params(pairs: &[String]) -> Result<Value, CliError> {
    pairs_object(pairs).map(Value::Object)
}

/// Queue fields from pairs: `name`, `plugin`, `sort` and `on_orphan` stay strings; `threads`
/// is a number or null; `sandbox` is JSON.
pub(super) fn queue_fields(pairs: &[String]) -> Result<Value, CliError> {
    let mut m = pairs_object(pairs)?;
    for kv in pairs.chunks(2) {
        if matches!(kv[0].as_str(), "name" | "plugin" | "sort" | "on_orphan") {
            m.insert(kv[0].clone(), Value::String(kv[1].clone()));
        }
    }
    Ok(Value::Object(m))
}

/// JSON given inline, as `@file`, or `-` for stdin.
pub(super) fn read_json(arg: &str) -> Result<Value, CliError> {
    let (text, source) = if arg == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| CliError::Usage(format!("cannot read stdin: {e}")))?;
        (s, "stdin".to_owned())
    } else if let Some(path) = arg.strip_prefix('@') {
        let text = std::fs::read_to_string(path).map_err(|e| CliError::Usage(format!("cannot read {path}: {e}")))?;
        (text, format!("file {path}"))
    } else {
        (arg.to_owned(), "the tasks argument".to_owned())
    };
    serde_json::from_str(&text).map_err(|e| CliError::Usage(format!("invalid JSON in {source}: {e}")))
}
