//! `h3-fifo`: reads the whole file `params.path` and prints its length. Pointed at a FIFO
//! in a granted directory it would block forever in the host: the tests use it to show
//! such a task is refused or ends at its deadline.

use std::io::Read;

use serde::Deserialize;

#[derive(Deserialize)]
struct Params {
    path: String,
}

fn run(p: Params) -> Result<u32, String> {
    let mut text = Vec::new();
    std::fs::File::open(&p.path)
        .and_then(|mut f| f.read_to_end(&mut text))
        .map_err(|e| format!("cannot read {}: {e}", p.path))?;
    println!("read {} bytes", text.len());
    Ok(disbatch_plugin::SUCCEEDED)
}

disbatch_plugin::plugin!(run);
