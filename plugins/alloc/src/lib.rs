//! `alloc`: allocates `params.mib` MiB (default 1024) and writes to every page, to prove
//! the host's memory limit. Prints how much it got; returns 1 when it got all of it.

use serde_json::Value;

const MIB: usize = 1 << 20;

fn run(params: Value) -> Result<u32, String> {
    let want = params.get("mib").and_then(Value::as_u64).unwrap_or(1024) as usize;
    let mut blocks: Vec<Vec<u8>> = Vec::new();
    for _ in 0..want {
        let mut block = vec![0u8; MIB];
        for page in block.chunks_mut(4096) {
            page[0] = 1;
        }
        blocks.push(std::hint::black_box(block));
    }
    println!("allocated {} MiB", blocks.len());
    Ok(disbatch_plugin::SUCCEEDED)
}

disbatch_plugin::plugin!(run);
