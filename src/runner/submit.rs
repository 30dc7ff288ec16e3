//! The `submit` host import: a plugin asks for follow-up tasks. The runner only checks
//! and records them (grant, bounds, params); the DEN creates them once the task succeeded
//! (see `den::chain`), and `runner exec` shows them.
//!
//! Also the `disbatch:plugin/host@0.1.0` interface: wasmtime links an import only to a
//! semver-compatible definition, and 0.1.x is not compatible with 0.2.x, so components
//! built against 0.1.x find their `progress` here.

use wasmtime::component::Linker;

use super::TaskState;

pub use crate::sandbox_spec::{DEFAULT_SUBMIT_DEPTH, DEFAULT_SUBMIT_MAX, MAX_SUBMIT_DEPTH, MAX_SUBMIT_MAX};
/// Longest `params` text of one follow-up, in bytes (1 MiB).
pub const MAX_SUBMIT_PARAMS: usize = 1 << 20;
/// Most `params` bytes of all of one task's follow-ups together (16 MiB).
pub const MAX_SUBMIT_TOTAL: usize = 16 << 20;

/// One follow-up task a plugin submitted.
#[derive(Debug, Clone, PartialEq)]
pub struct Submission {
    /// The queue, by name or id, as the plugin named it.
    pub queue: String,
    /// The new task's params (a JSON object).
    pub params: serde_json::Map<String, serde_json::Value>,
}

/// What one task submitted and what it was refused.
#[derive(Debug, Default)]
pub(super) struct TaskSubmits {
    /// The queues the task may submit to (`sandbox.submit`).
    grant: Vec<String>,
    /// `sandbox.submit_max`.
    max: u32,
    /// This task's depth in its lineage of follow-ups.
    depth: u32,
    /// `sandbox.submit_depth`: the deepest a follow-up may be.
    max_depth: u32,
    /// Bytes of params accepted so far.
    bytes: usize,
    /// The accepted follow-ups, in call order.
    pub(super) accepted: Vec<Submission>,
    /// How many calls were refused for a bound.
    refused: u32,
}

impl TaskSubmits {
    pub(super) fn new(sandbox: &super::Sandbox) -> Self {
        TaskSubmits {
            grant: sandbox.submit.clone(),
            max: sandbox.submit_max,
            depth: sandbox.depth,
            max_depth: sandbox.submit_depth,
            ..TaskSubmits::default()
        }
    }

    /// Checks and records one `submit` call.
    pub(super) fn submit(&mut self, queue: String, params: &str) -> Result<(), String> {
        if !self.grant.contains(&queue) {
            return Err(format!(
                "cannot submit to queue {queue:?}: this task's sandbox.submit does not grant it (granted: {})",
                if self.grant.is_empty() {
                    "none".to_owned()
                } else {
                    self.grant.join(", ")
                }
            ));
        }
        if self.depth >= self.max_depth {
            self.refused += 1;
            return Err(format!(
                "follow-up refused: it would be at depth {} of its lineage of follow-ups, past sandbox.submit_depth {} (a queue granted submit to itself, or a cycle of grants, stops here; retrying cannot help)",
                u64::from(self.depth) + 1,
                self.max_depth
            ));
        }
        if self.accepted.len() >= self.max as usize {
            self.refused += 1;
            return Err(format!(
                "follow-up refused: this task already submitted {} follow-ups, its limit (sandbox.submit_max)",
                self.max
            ));
        }
        if params.len() > MAX_SUBMIT_PARAMS {
            self.refused += 1;
            return Err(format!(
                "follow-up refused: its params are {} bytes, over the limit of {MAX_SUBMIT_PARAMS} bytes (1 MiB) per follow-up",
                params.len()
            ));
        }
        if self.bytes + params.len() > MAX_SUBMIT_TOTAL {
            self.refused += 1;
            return Err(format!(
                "follow-up refused: the params of this task's follow-ups would take {} bytes, over the limit of {MAX_SUBMIT_TOTAL} bytes (16 MiB) per task",
                self.bytes + params.len()
            ));
        }
        let text_len = params.len();
        let params = match serde_json::from_str::<serde_json::Value>(params) {
            Ok(serde_json::Value::Object(m)) => m,
            Ok(other) => {
                return Err(format!(
                    "follow-up params must be a JSON object, got {}",
                    json_kind(&other)
                ))
            }
            Err(e) => return Err(format!("follow-up params are not valid JSON: {e}")),
        };
        if let Err(e) = bson::Bson::try_from(serde_json::Value::Object(params.clone())) {
            return Err(format!("follow-up params cannot be stored as a task's params: {e}"));
        }
        if let Some(k) = nul_key(&params) {
            return Err(format!(
                "follow-up params cannot be stored as a task's params: the key {k:?} contains a NUL byte"
            ));
        }
        self.bytes += text_len;
        self.accepted.push(Submission { queue, params });
        Ok(())
    }

    /// The note for the task's stderr when calls were refused for a bound.
    pub(super) fn note(&self) -> Option<String> {
        (self.refused > 0).then(|| {
            format!(
                "{} follow-up task(s) were refused for a bound (sandbox.submit_max {}, sandbox.submit_depth {} at depth {}, 1 MiB per follow-up's params, 16 MiB per task); {} were accepted",
                self.refused,
                self.max,
                self.max_depth,
                self.depth,
                self.accepted.len()
            )
        })
    }
}

/// A key, at any depth, holding a NUL byte (BSON cannot store it).
fn nul_key(params: &serde_json::Map<String, serde_json::Value>) -> Option<String> {
    fn walk(v: &serde_json::Value) -> Option<String> {
        match v {
            serde_json::Value::Object(m) => m
                .iter()
                .find_map(|(k, v)| if k.contains('\0') { Some(k.clone()) } else { walk(v) }),
            serde_json::Value::Array(items) => items.iter().find_map(walk),
            _ => None,
        }
    }
    params
        .iter()
        .find_map(|(k, v)| if k.contains('\0') { Some(k.clone()) } else { walk(v) })
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Defines `disbatch:plugin/host@0.1.0` (its one function, `progress`) on `linker`, so
/// components built against 0.1.x still run.
pub(super) fn add_v01_to_linker(linker: &mut Linker<TaskState>) -> wasmtime::Result<()> {
    linker.instance("disbatch:plugin/host@0.1.0")?.func_wrap(
        "progress",
        |mut store: wasmtime::StoreContextMut<'_, TaskState>, (percent, info): (Option<f32>, Option<String>)| {
            super::bindings::disbatch::plugin::host::Host::progress(store.data_mut(), percent, info);
            Ok(())
        },
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn granted(max: u32) -> TaskSubmits {
        TaskSubmits::new(&crate::runner::Sandbox {
            submit: vec!["b".into()],
            submit_max: max,
            ..crate::runner::Sandbox::default()
        })
    }

    #[test]
    fn calls_are_checked_in_order() {
        let mut s = granted(2);
        assert!(s
            .submit("c".into(), "{}")
            .unwrap_err()
            .contains("sandbox.submit does not grant"));
        assert!(s
            .submit("b".into(), "[1]")
            .unwrap_err()
            .contains("must be a JSON object, got an array"));
        assert!(s.submit("b".into(), "{").unwrap_err().contains("not valid JSON"));
        assert!(s.submit("b".into(), r#"{"a\u0000":1}"#).unwrap_err().contains("NUL"));
        let big = format!(r#"{{"x":"{}"}}"#, "a".repeat(MAX_SUBMIT_PARAMS));
        assert!(s.submit("b".into(), &big).unwrap_err().contains("1 MiB"));
        s.submit("b".into(), r#"{"n":0}"#).unwrap();
        s.submit("b".into(), r#"{"n":1}"#).unwrap();
        assert!(s.submit("b".into(), "{}").unwrap_err().contains("sandbox.submit_max"));
        assert_eq!(s.accepted.len(), 2);
        assert!(s.note().unwrap().starts_with("2 follow-up task(s) were refused"));
        assert_eq!(granted(1).note(), None);
    }

    #[test]
    fn a_follow_up_past_the_depth_bound_is_refused() {
        let at = |depth: u32| {
            TaskSubmits::new(&crate::runner::Sandbox {
                submit: vec!["b".into()],
                submit_depth: 2,
                depth,
                ..crate::runner::Sandbox::default()
            })
        };
        at(1).submit("b".into(), "{}").unwrap();
        let mut deep = at(2);
        let e = deep.submit("b".into(), "{}").unwrap_err();
        assert!(e.contains("depth 3") && e.contains("sandbox.submit_depth 2"), "{e}");
        assert!(deep.note().unwrap().contains("sandbox.submit_depth 2 at depth 2"));
    }
}
