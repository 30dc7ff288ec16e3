//! A Disbatch plugin template: greets `params.name`.
//!
//! Copy this crate, rename it, and replace `Params` and `run` with your own. Try it:
//! `runner exec plugins/target/wasm32-wasip2/release/template.wasm --params '{"name":"you"}'`.

use disbatch_plugin::{progress, SUCCEEDED};
use serde::Deserialize;

/// The task's params: the task's `params` document, deserialized. If it does not fit,
/// the task fails with `invalid params: …` before `run` is called. Unknown fields are
/// refused, so typos surface as `invalid params: unknown field …`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    /// Who to greet.
    name: String,
    /// How many times (default 1).
    #[serde(default)]
    times: Option<u32>,
}

/// Runs one task.
///
/// Whatever it writes to stdout and stderr is captured as the task's output. It returns
/// `Ok(status)` with a positive status (`SUCCEEDED`, `FAILED` or your own), or
/// `Err(message)` to fail the task with `message` added to its stderr.
fn run(params: Params) -> Result<u32, String> {
    let times = params.times.unwrap_or(1);
    if times == 0 {
        return Err("times must be at least 1".into());
    }
    progress(0.0, "starting");
    for i in 0..times {
        println!("hello, {}!", params.name);
        // Progress is cheap: report it as often as is useful.
        progress((i + 1) as f32 * 100.0 / times as f32, "greeting");
    }
    eprintln!("greeted {} {times} time(s)", params.name);
    Ok(SUCCEEDED)
}

// Exports `run` as the component's `run`; exactly once per plugin crate.
disbatch_plugin::plugin!(run);
