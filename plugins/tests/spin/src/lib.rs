//! `spin`: loops forever, to prove the host's timeout.

use serde_json::Value;

fn run(_params: Value) -> Result<u32, String> {
    let mut n: u64 = 0;
    loop {
        n = std::hint::black_box(n.wrapping_add(1));
    }
}

disbatch_plugin::plugin!(run);
