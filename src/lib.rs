//! Disbatch: a distributed task runner implementing the Disbatch 4 protocol, whose
//! plugins are sandboxed WebAssembly components.
//!
//! # Layout
//! - [`model`]: the spec's documents as types — tasks, queues, nodes, status codes.
//! - [`store`]: the store boundary (the `Store` trait) and its MongoDB implementation,
//!   with String-chunk GridFS for large task output.
//! - [`runner`]: the sandbox — wasmtime engine, WASI context, limits, plugin loading and
//!   the result of one task.
pub mod model;
pub mod runner;
pub mod store;
