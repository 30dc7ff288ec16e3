//! `mark`: waits `params.sleep_ms` (default 0), then creates the file `params.path`
//! exclusively in a granted directory. A second run of the same task finds the file and
//! fails with "already ran", so tests can count how often each task really ran. With
//! `params.append`, each run appends a line to the file instead and succeeds: the lines
//! count the runs.

use std::io::Write;

use serde::Deserialize;

#[derive(Deserialize)]
struct Params {
    path: String,
    #[serde(default)]
    sleep_ms: u64,
    #[serde(default)]
    append: bool,
}

fn run(p: Params) -> Result<u32, String> {
    if p.sleep_ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(p.sleep_ms));
    }
    let mut options = std::fs::OpenOptions::new();
    if p.append {
        options.append(true).create(true);
    } else {
        options.write(true).create_new(true);
    }
    let mut file = options
        .open(&p.path)
        .map_err(|e| format!("already ran? cannot create {}: {e}", p.path))?;
    file.write_all(if p.append { b"ran\n" } else { b"ran" })
        .map_err(|e| e.to_string())?;
    println!("marked {}", p.path);
    Ok(disbatch_plugin::SUCCEEDED)
}

disbatch_plugin::plugin!(run);
