//! `demo`: the example plugin.
//!
//! Params (all optional): `message` (default "hello") printed `repeat` times (default 1) to
//! stdout, one per line; `stderr`, a string printed to stderr; `sleep_ms`, a wait before
//! anything else (a WASI clock wait, not a busy loop); `status`, the status to return
//! (default 1; passed through as given, so 0 shows how the host rejects it).

use std::io::Write;

use disbatch_plugin::{progress, SUCCEEDED};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    #[serde(default = "default_message")]
    message: String,
    #[serde(default = "one")]
    repeat: u64,
    stderr: Option<String>,
    sleep_ms: Option<u64>,
    #[serde(default = "default_status")]
    status: u32,
}

fn default_message() -> String {
    "hello".into()
}

fn one() -> u64 {
    1
}

fn default_status() -> u32 {
    SUCCEEDED
}

fn run(p: Params) -> Result<u32, String> {
    progress(0.0, "starting");
    if let Some(ms) = p.sleep_ms {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, stdout.lock());
    let mut line = p.message.into_bytes();
    line.push(b'\n');
    for _ in 0..p.repeat {
        out.write_all(&line).map_err(|e| format!("cannot write stdout: {e}"))?;
    }
    out.flush().map_err(|e| format!("cannot write stdout: {e}"))?;
    if let Some(text) = p.stderr {
        eprintln!("{text}");
    }
    progress(100.0, "done");
    Ok(p.status)
}

disbatch_plugin::plugin!(run);
