//! The Disbatch plugin SDK.
//!
//! A Disbatch plugin is a WebAssembly component (target `wasm32-wasip2`) implementing the
//! `disbatch:plugin/plugin` world of the repository's `wit/plugin.wit`. With this crate a
//! plugin is one function: it receives the task's params — as a [`serde_json::Value`] or
//! as any type implementing `serde::Deserialize` — prints what it likes to stdout and
//! stderr, and returns the task's status. The crate generates the WIT bindings, so a
//! plugin crate needs no `wit-bindgen` code of its own.
//!
//! # A complete plugin
//!
//! `Cargo.toml`:
//!
//! ```toml
//! [package]
//! name = "hello"            # the component is target/wasm32-wasip2/release/hello.wasm
//! version = "0.1.0"
//! edition = "2021"
//!
//! [lib]
//! crate-type = ["cdylib"]   # a cdylib for wasm32-wasip2 is linked into a component
//!
//! [dependencies]
//! disbatch-plugin = { path = "../sdk" }
//! serde = { version = "1", features = ["derive"] }
//! ```
//!
//! `src/lib.rs`:
//!
//! ```ignore
//! use disbatch_plugin::{progress, SUCCEEDED};
//! use serde::Deserialize;
//!
//! #[derive(Deserialize)]
//! struct Params {
//!     name: String,
//! }
//!
//! fn run(params: Params) -> Result<u32, String> {
//!     progress(50.0, "greeting");
//!     println!("hello, {}", params.name);
//!     Ok(SUCCEEDED)
//! }
//!
//! disbatch_plugin::plugin!(run);
//! ```
//!
//! Build it with `cargo build --release --target wasm32-wasip2` and try it with
//! `runner exec target/wasm32-wasip2/release/hello.wasm --params '{"name":"you"}'`.
//!
//! For params of no fixed shape take a [`serde_json::Value`] instead (and add
//! `serde_json = "1"` to the dependencies):
//!
//! ```ignore
//! fn run(params: serde_json::Value) -> Result<u32, String> {
//!     let name = params.get("name").and_then(|v| v.as_str()).unwrap_or("world");
//!     println!("hello, {name}");
//!     Ok(disbatch_plugin::SUCCEEDED)
//! }
//!
//! disbatch_plugin::plugin!(run);
//! ```
//!
//! # The contract
//!
//! - Return `Ok(status)` with a positive status: [`SUCCEEDED`] (1), [`FAILED`] (2), or a
//!   larger value of your own; `Ok(0)` is rejected by the host and the task fails.
//! - Return `Err(message)` to fail the task with `message` added to its stderr.
//! - Params that do not deserialize into the function's parameter type fail the task with
//!   `invalid params: <serde error>` without calling the function.
//! - stdout and stderr are captured by the host; a panic or a trap fails the task.
//! - Report progress with [`progress`], [`progress_percent`] or [`progress_info`].
//! - Submit follow-up tasks with [`submit`] (or [`submit_json`]) to the queues the task's
//!   queue grants in its `sandbox.submit`; they are created only if the task succeeds.
//! - The sandbox grants no files, environment or network unless the queue grants them.

/// The generated bindings of the `disbatch:plugin/plugin` world.
#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "disbatch:plugin/plugin",
        pub_export_macro: true,
        export_macro_name: "__export_plugin_world",
        default_bindings_module: "::disbatch_plugin::bindings",
    });
}

pub mod http;

use serde::de::DeserializeOwned;

#[doc(hidden)]
pub use bindings::Guest as __Guest;

/// Status of a task that succeeded.
pub const SUCCEEDED: u32 = 1;
/// Status of a task that failed.
pub const FAILED: u32 = 2;

/// Reports progress: `percent` in 0..=100 and a short message.
///
/// The host clamps `percent` to 0..=100, ignores NaN, keeps at most 1 KiB of `info` and
/// keeps only the latest reports, so calling this often is fine.
pub fn progress(percent: f32, info: &str) {
    bindings::disbatch::plugin::host::progress(Some(percent), Some(info));
}

/// Reports progress as a percentage only.
pub fn progress_percent(percent: f32) {
    bindings::disbatch::plugin::host::progress(Some(percent), None);
}

/// Reports progress as a message only.
pub fn progress_info(info: &str) {
    bindings::disbatch::plugin::host::progress(None, Some(info));
}

/// Submits a follow-up task of `queue` (its name or id) with `params`, which must
/// serialize to a JSON object.
///
/// The host records it and creates it only if this task succeeds (status 1), keyed
/// `submit:<task id>:<n>` and running after this task. `Err` says why it was refused: the
/// queue is not in the task's `sandbox.submit`, a bound was reached (`sandbox.submit_max`
/// follow-ups per task, 1 MiB of params each, 16 MiB per task), or the params are not an
/// object. A refused call submits nothing; the task goes on.
///
/// ```ignore
/// disbatch_plugin::submit("resize", &serde_json::json!({"file": "a.png"}))?;
/// ```
pub fn submit<P: serde::Serialize + ?Sized>(queue: &str, params: &P) -> Result<(), String> {
    let text = serde_json::to_string(params).map_err(|e| format!("cannot serialize the follow-up's params: {e}"))?;
    submit_json(queue, &text)
}

/// [`submit`] with `params` already as JSON text (an object).
pub fn submit_json(queue: &str, params: &str) -> Result<(), String> {
    bindings::disbatch::plugin::host::submit(queue, params)
}

/// Parses `params` into the function's parameter type and calls it. Used by [`plugin!`].
#[doc(hidden)]
pub fn __run<P, F>(params: &str, f: F) -> Result<u32, String>
where
    P: DeserializeOwned,
    F: FnOnce(P) -> Result<u32, String>,
{
    let params: P = serde_json::from_str(params).map_err(|e| format!("invalid params: {e}"))?;
    f(params)
}

/// Exports `f` as the plugin's `run`.
///
/// `f` is a function `fn(P) -> Result<u32, String>` where `P` is `serde_json::Value` or
/// any type implementing `serde::Deserialize`. Use it once per plugin crate.
#[macro_export]
macro_rules! plugin {
    ($f:path) => {
        struct __DisbatchPlugin;

        impl $crate::__Guest for __DisbatchPlugin {
            fn run(
                params: ::std::string::String,
            ) -> ::std::result::Result<::core::primitive::u32, ::std::string::String> {
                $crate::__run(&params, $f)
            }
        }

        $crate::bindings::__export_plugin_world!(__DisbatchPlugin with_types_in $crate::bindings);
    };
}
