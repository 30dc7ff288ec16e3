//! Batches from the command line: `--batch`/`--batch-size` on `create-task(s)`, and
//! `disbatch batch <id>` (`GET /batches/{id}`).

use serde_json::{json, Map, Value};

use super::table::cell;

/// Putting the created tasks in a batch.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct BatchArgs {
    /// Put the tasks in this batch (an id of your choosing; `disbatch batch <id>` reports it).
    #[arg(long)]
    pub batch: Option<String>,
    /// How many tasks the batch will have in all: it is complete once it has that many and
    /// all have ended; more are refused.
    #[arg(long, requires = "batch")]
    pub batch_size: Option<i64>,
}

impl BatchArgs {
    /// Adds `batch` and `batch_size` to a `POST /tasks` body.
    pub fn add_to(&self, body: &mut Map<String, Value>) {
        if let Some(b) = &self.batch {
            body.insert("batch".into(), json!(b));
        }
        if let Some(n) = self.batch_size {
            body.insert("batch_size".into(), json!(n));
        }
    }
}

/// `batch b: 3 of 5 tasks, 2 ended, not complete`, then one line per status.
pub fn batch_text(v: &Value) -> String {
    let of = match v["size"].as_i64() {
        Some(n) => format!(" of {n}"),
        None => String::new(),
    };
    let done = if v["complete"] == Value::Bool(true) {
        "complete"
    } else {
        "not complete"
    };
    let mut out = format!(
        "batch {}: {}{of} tasks, {} ended, {done}\n",
        cell(&v["batch"]),
        cell(&v["total"]),
        cell(&v["ended"])
    );
    if let Some(counts) = v["counts"].as_object() {
        for (name, n) in counts {
            out.push_str(&format!("  {name} {}\n", cell(n)));
        }
    }
    out
}
