//! `recurse`: recurses without end, to prove a stack overflow ends the task as a trap.

use serde_json::Value;

#[inline(never)]
fn deeper(n: u64, pad: [u64; 16]) -> u64 {
    let pad = std::hint::black_box(pad);
    if n == u64::MAX {
        return 0;
    }
    deeper(n + 1, pad) + pad[(n % 16) as usize]
}

fn run(_params: Value) -> Result<u32, String> {
    Ok(deeper(0, [1; 16]) as u32)
}

disbatch_plugin::plugin!(run);
