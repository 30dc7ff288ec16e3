//! `alloc`: allocates `params.mib` MiB (default 1024) in 1 MiB blocks and writes to every
//! 4 KiB page of each block, so the memory is really committed; this proves the host's
//! memory limit. Prints how much it got to stdout and returns 1 when it got all of it.
//!
//! When the allocator refuses a block (the host refused to grow linear memory), the plugin
//! prints how much it managed and then fails the way any Rust program that runs out of
//! memory does: through `std::alloc::handle_alloc_error`, which aborts, so the task ends as
//! a trap that the host reports as hitting its memory limit.
//!
//! The crate is named `alloc` like Rust's built-in `alloc` crate. That is harmless: in
//! edition 2021 the built-in crate is only in scope after `extern crate alloc;`, which this
//! crate does not write, so cargo's `alloc` library (and `alloc.wasm`) needs no renaming.

use std::alloc::Layout;
use std::io::Write;

use serde_json::Value;

const MIB: usize = 1 << 20;
const PAGE: usize = 4096;

fn run(params: Value) -> Result<u32, String> {
    let want = match params.get("mib") {
        None => 1024,
        Some(v) => v
            .as_u64()
            .ok_or_else(|| format!("params.mib must be a non-negative integer, got {v}"))?,
    };
    let mut blocks: Vec<Vec<u8>> = Vec::new();
    for got in 0..want {
        let mut block: Vec<u8> = Vec::new();
        if block.try_reserve_exact(MIB).is_err() || blocks.try_reserve(1).is_err() {
            let _ = writeln!(std::io::stdout(), "allocated {got} of {want} MiB");
            std::alloc::handle_alloc_error(Layout::new::<[u8; MIB]>());
        }
        block.resize(MIB, 0);
        for page in block.chunks_mut(PAGE) {
            page[0] = 1;
        }
        blocks.push(std::hint::black_box(block));
    }
    println!("allocated {want} of {want} MiB");
    Ok(disbatch_plugin::SUCCEEDED)
}

disbatch_plugin::plugin!(run);
