//! The Disbatch plugin SDK.
//!
//! A Disbatch plugin is a WebAssembly component (target `wasm32-wasip2`) implementing the
//! `disbatch:plugin/plugin` world of the repository's `wit/plugin.wit`. With this crate a
//! plugin is one function: it receives the task's params — as a [`serde_json::Value`] or
//! as any type implementing `serde::Deserialize` — prints what it likes to stdout and
//! stderr, and returns the task's status.
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
//! The crate must be a `cdylib`:
//!
//! ```toml
//! [lib]
//! crate-type = ["cdylib"]
//! ```
//!
//! Build it with `cargo build --release --target wasm32-wasip2`; the component is
//! `target/wasm32-wasip2/release/<crate name>.wasm`. Try it with
//! `runner exec <that file> --params '{"name":"you"}'`.
//!
//! The rules of the contract:
//! - return `Ok(status)` with a positive status: [`SUCCEEDED`] (1), [`FAILED`] (2), or a
//!   larger value of your own; `Ok(0)` is rejected by the host and the task fails;
//! - return `Err(message)` to fail the task with `message` added to its stderr;
//! - params that do not deserialize into the function's parameter type fail the task with
//!   `invalid params: …`;
//! - the sandbox grants no files, environment or network unless the queue grants them.

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

use serde::de::DeserializeOwned;

#[doc(hidden)]
pub use bindings::Guest as __Guest;

/// Status of a task that succeeded.
pub const SUCCEEDED: u32 = 1;
/// Status of a task that failed.
pub const FAILED: u32 = 2;

/// Reports progress: `percent` in 0..=100 and a short message.
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
            fn run(params: ::std::string::String) -> ::std::result::Result<u32, ::std::string::String> {
                $crate::__run(&params, $f)
            }
        }

        $crate::bindings::__export_plugin_world!(__DisbatchPlugin with_types_in $crate::bindings);
    };
}
