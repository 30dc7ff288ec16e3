//! Dependencies from the command line: `--after` and `--after-failure` on
//! `create-task(s)`, and `create-dag`, which submits a whole DAG in one request.

use serde_json::{json, Map, Value};

/// What the created tasks wait for.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct AfterArgs {
    /// Wait for this task (an id, or a key of the same queue) or batch (`batch:<id>`) to
    /// succeed before running; may be given many times.
    #[arg(long, value_name = "TASK|KEY|batch:ID")]
    pub after: Vec<String>,
    /// When what the tasks wait for fails: `cancel` them (the default) or `run` them anyway.
    #[arg(long, value_name = "cancel|run", requires = "after")]
    pub after_failure: Option<String>,
}

impl AfterArgs {
    /// Adds `after` and `after_failure` to a `POST /tasks` body.
    pub fn add_to(&self, body: &mut Map<String, Value>) {
        if !self.after.is_empty() {
            let refs: Vec<Value> = self.after.iter().map(|a| reference(a)).collect();
            body.insert("after".into(), Value::Array(refs));
        }
        if let Some(f) = &self.after_failure {
            body.insert("after_failure".into(), json!(f));
        }
    }
}

/// One `--after` value as a reference of `POST /tasks`.
fn reference(a: &str) -> Value {
    match a.strip_prefix("batch:") {
        Some(b) => json!({"batch": b}),
        None => json!(a),
    }
}
