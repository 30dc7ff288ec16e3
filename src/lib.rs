//! Disbatch: a distributed task runner implementing the Disbatch 4 protocol, whose
//! plugins are sandboxed WebAssembly components.
//!
//! # Layout
//! - [`api`]: the DCI — REST API router, web UI and OpenAPI document (`disbatch web`).
//! - [`cli`]: the `disbatch` command line, an HTTP client of the API.
//! - [`config`]: the JSON config file (spec keys + ours) → a validated `Config`.
//! - [`launch`]: what the binaries share to start — the `--config` / `--embedded` /
//!   `--plugin-dir` flags (`launch/flags`), opening MongoDB or the embedded SQLite store
//!   (`launch/store`), building a DEN, serving the DCI (`launch/serve`), the runtime,
//!   logging and signals.
//! - [`den`]: the Disbatch Execution Node — heartbeat, orphan recovery, the schedules'
//!   tasks, queue processing, claiming within `threads`/`maxthreads`, running tasks and
//!   writing results back.
//! - [`lifecycle`]: the task state machine above the store — every rule deciding a
//!   task's status, a slot, a node name, the leader, a schedule's occurrences or whether
//!   an action is allowed.
//! - [`model`]: the spec's documents as types — a file each for queues, nodes, tasks, node
//!   stats, a task's `stop` and `progress`, retries, the balance and schedules; the status codes in
//!   `model::status`.
//! - [`store`]: the store boundary — the `Store` trait of queries and fenced writes
//!   (`store::change` for tasks, `store::slot_change`, `store::node_change`), one reader of
//!   queue and node documents (`store::queue_doc`), schedules as stored
//!   (`store::schedule_doc`), group writes (`store::group`: calls
//!   made while one write is under way go together in the next), the MongoDB
//!   implementation with String-chunk GridFS for large task output (`store::mongo`), and
//!   the embedded SQLite one (`store::sqlite`). The stores translate; [`lifecycle`] decides.
//! - [`runner`]: the sandbox — wasmtime engine, WASI context, limits, plugin loading and
//!   the result of one task.
//! - [`sandbox_spec`]: what a task's sandbox grants and its limits (`Sandbox`, the
//!   directory and HTTP grants, `network_allow`, defaults and bounds) — a leaf read by
//!   [`config`], [`model`] and [`runner`].
//! - [`redact`]: URIs with their credentials hidden, for messages and logs — a leaf.
//! - [`stats`]: per-minute task counters (throughput, failures, duration buckets, queue
//!   depth) behind `GET /stats` and the web UI's overview.
pub mod api;
pub mod cli;
pub mod config;
pub mod den;
pub mod launch;
pub mod lifecycle;
pub mod model;
pub mod redact;
pub mod runner;
pub mod sandbox_spec;
pub mod stats;
pub mod store;
#[cfg(test)]
mod test_support;
