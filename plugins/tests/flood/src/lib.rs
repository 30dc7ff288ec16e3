//! `flood`: writes `params.mib` MiB (default 64) to stdout, and as much to stderr when
//! `params.stderr` is true, to prove the host's output cap. A failed write fails the task.

use std::io::Write;

use serde_json::Value;

fn run(params: Value) -> Result<u32, String> {
    let mib = params.get("mib").and_then(Value::as_u64).unwrap_or(64);
    let both = params.get("stderr").and_then(Value::as_bool).unwrap_or(false);
    let chunk = vec![b'x'; 1 << 20];
    let mut out = std::io::stdout().lock();
    let mut err = std::io::stderr().lock();
    for i in 0..mib {
        out.write_all(&chunk)
            .map_err(|e| format!("stdout write {i} failed: {e}"))?;
        if both {
            err.write_all(&chunk)
                .map_err(|e| format!("stderr write {i} failed: {e}"))?;
        }
    }
    out.flush().map_err(|e| format!("stdout flush failed: {e}"))?;
    Ok(disbatch_plugin::SUCCEEDED)
}

disbatch_plugin::plugin!(run);
