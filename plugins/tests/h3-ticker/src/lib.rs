//! `h3-ticker`: forever, writes an increasing counter to the file `params.path` (in a
//! granted directory) every `params.every_ms` (default 5) milliseconds. The tests watch the
//! file to see whether a plugin really stopped.

use serde::Deserialize;

#[derive(Deserialize)]
struct Params {
    path: String,
    #[serde(default)]
    every_ms: Option<u64>,
}

fn run(p: Params) -> Result<u32, String> {
    let every = std::time::Duration::from_millis(p.every_ms.unwrap_or(5));
    for n in 0u64.. {
        std::fs::write(&p.path, n.to_string()).map_err(|e| format!("cannot write {}: {e}", p.path))?;
        std::thread::sleep(every);
    }
    Ok(disbatch_plugin::SUCCEEDED)
}

disbatch_plugin::plugin!(run);
