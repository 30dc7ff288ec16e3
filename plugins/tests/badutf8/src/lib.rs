//! `badutf8`: writes bytes that are not UTF-8 to stdout and stderr, between valid text.

use std::io::Write;

use serde_json::Value;

fn run(_params: Value) -> Result<u32, String> {
    std::io::stdout()
        .write_all(b"before \xff\xfe after\n")
        .map_err(|e| e.to_string())?;
    std::io::stderr()
        .write_all(b"err \xc3\x28 end\n")
        .map_err(|e| e.to_string())?;
    Ok(disbatch_plugin::SUCCEEDED)
}

disbatch_plugin::plugin!(run);
