//! A Disbatch plugin template: greets `params.name`.
//!
//! Try it: `runner exec plugins/target/wasm32-wasip2/release/template.wasm --params '{"name":"you"}'`.

use disbatch_plugin::{progress, SUCCEEDED};
use serde::Deserialize;

/// The task's params. Unknown fields are refused, so typos surface as
/// `invalid params: unknown field …`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    /// Who to greet.
    name: String,
    /// How many times (default 1).
    #[serde(default)]
    times: Option<u32>,
}

/// Runs one task: print to stdout and stderr, report progress, return a status.
fn run(params: Params) -> Result<u32, String> {
    let times = params.times.unwrap_or(1);
    if times == 0 {
        return Err("times must be at least 1".into());
    }
    for i in 0..times {
        println!("hello, {}!", params.name);
        progress((i + 1) as f32 * 100.0 / times as f32, "greeting");
    }
    eprintln!("greeted {} {times} time(s)", params.name);
    Ok(SUCCEEDED)
}

disbatch_plugin::plugin!(run);
