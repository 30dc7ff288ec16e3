//! `panic`: panics with `params.message` (default "boom"), to prove a panic ends the task
//! as a trap with the panic message in stderr.

use serde_json::Value;

fn run(params: Value) -> Result<u32, String> {
    let message = params
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("boom")
        .to_owned();
    panic!("{message}");
}

disbatch_plugin::plugin!(run);
