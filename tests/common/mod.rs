//! The shared integration-test harness.
//!
//! - [`server`]: the MongoDB-wire test server `secantusd-rs` — one shared instance per test
//!   binary (or `MONGODB_URI`), and private instances a test can stop and restart.
//! - [`test_db`]: a fresh, uniquely named database per test with a connected
//!   [`MongoStore`](disbatch::store::mongo::MongoStore).
//! - [`components`]: raw components in WAT around a `run` export.
//! - [`den`]: the `den` binary as a process ([`DenProcess`]) and [`wait_for`].
//! - [`dev`]: `disbatch dev` as a process ([`dev::Dev`]).
//! - [`docs`]: spec documents inserted with the plain driver, and a shared runner.
//! - [`http`]: the REST API router on a test database, and requests to it in-process or
//!   over TCP.
//! - [`plugins`]: the guest plugins, built once per test run for `wasm32-wasip2`.
//! - [`proxy`]: a TCP fault proxy (latency, resets, freezes, refused connections) to put
//!   between a DEN and the database.
//! - [`python`]: a Python with a pinned PyPI package, to check our output with its parser.
//! - [`recording`]: a store wrapper recording which tasks a DEN claimed and started.
//! - [`web`]: `disbatch web` as a process and the `disbatch` client verbs against it.

pub mod components;
pub mod db;
pub mod den;
pub mod dev;
pub mod docs;
pub mod http;
pub mod plugins;
pub mod proxy;
pub mod python;
pub mod recording;
pub mod server;
pub mod web;

pub use db::{test_db, test_db_at, TestDb};
pub use den::{wait_for, DenProcess};
pub use docs::{count_tasks, find_docs, insert_queue, insert_task, insert_tasks, shared_runner, task_doc_of};
pub use plugins::{plugin_path, plugins_dir};
pub use proxy::{FaultProxy, Latency};
pub use recording::Recording;
pub use server::TestServer;
pub use web::Web;

/// Sets the open-files limit (soft and hard) of the child `cmd` starts to `n`, so a test of
/// what happens at the limit needs hundreds of descriptors, not the machine's limit.
pub fn limit_open_files(cmd: &mut std::process::Command, n: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setrlimit is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: n,
                rlim_max: n,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
