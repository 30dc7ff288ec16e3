//! `fail`: always fails. Writes a line to stderr, then returns `Err(params.message)`
//! (default "this plugin always fails").

use serde_json::Value;

fn run(params: Value) -> Result<u32, String> {
    eprintln!("fail: about to fail on purpose");
    let message = params
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("this plugin always fails");
    Err(message.to_owned())
}

disbatch_plugin::plugin!(run);
