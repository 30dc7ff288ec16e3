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

/// A task's params from `key value …` words, as Disbatch 4 sends them: every value a
/// string. A word `key:=JSON` (in a key's place) is one param with a JSON value
/// (`n:=3`, `ok:=true`, `tags:='["a"]'`), as httpie writes it. A key given twice is an
/// error.
pub(super) fn task_params(words: &[String]) -> Result<Value, CliError> {
    let mut params = Map::new();
    let mut rest = words.iter();
    while let Some(word) = rest.next() {
        let (key, value) = match word.split_once(":=") {
            Some((key, json)) => {
                let value = serde_json::from_str::<Value>(json).map_err(|e| {
                    CliError::Usage(format!(
                        "{word:?}: the value after := must be JSON ({e}); quote a string as '{key}:=\"text\"' \
                         or give it as two words: {key} text"
                    ))
                })?;
                (key, value)
            }
            None => {
                let Some(value) = rest.next() else {
                    return Err(CliError::Usage(format!(
                        "param {word:?} has no value: give pairs of key and value, or key:=JSON"
                    )));
                };
                (word.as_str(), Value::String(value.clone()))
            }
        };
        if key.is_empty() {
            return Err(CliError::Usage(format!("{word:?}: the param name is empty")));
        }
        if params.insert(key.to_owned(), value).is_some() {
            return Err(CliError::Usage(format!("param {key:?} is given twice")));
        }
    }
    Ok(Value::Object(params))
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn params(words: &[&str]) -> Result<Value, String> {
        let words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
        task_params(&words).map_err(|e| e.to_string())
    }

    #[test]
    fn a_queue_rate_is_json() {
        let words: Vec<String> = ["rate", r#"{"max": 10, "per": "1s"}"#, "threads", "4"]
            .iter()
            .map(|w| w.to_string())
            .collect();
        assert_eq!(
            queue_fields(&words).unwrap(),
            json!({"rate": {"max": 10, "per": "1s"}, "threads": 4})
        );
    }

    #[test]
    fn task_values_are_strings_unless_typed() {
        assert_eq!(
            params(&["message", "hi", "repeat", "2", "ok", "true", "obj", "{\"a\":1}"]).unwrap(),
            json!({"message": "hi", "repeat": "2", "ok": "true", "obj": "{\"a\":1}"})
        );
        assert_eq!(
            params(&[
                "repeat:=2",
                "message",
                "a:=b",
                "tags:=[\"x\"]",
                "s:=\"7\"",
                "none:=null"
            ])
            .unwrap(),
            json!({"repeat": 2, "message": "a:=b", "tags": ["x"], "s": "7", "none": null})
        );
        assert_eq!(params(&[]).unwrap(), json!({}));
        assert!(params(&["message"]).unwrap_err().contains("\"message\" has no value"));
        assert!(params(&["n:=two"]).unwrap_err().contains("must be JSON"));
        assert!(params(&[":=1"]).unwrap_err().contains("empty"));
        assert!(params(&["a", "1", "a:=2"]).unwrap_err().contains("twice"));
    }
}
