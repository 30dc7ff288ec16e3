//! `escape`: tries to get out of the sandbox and reports what it could do, as one JSON
//! object on stdout:
//! `{"read": {path: "ok: <first 64 bytes>" | "err: …"}, "write": {path: "ok" | "err: …"},
//!   "list": {dir: [names] | "err: …"}, "env": {k: v}, "args": [...], "connect": "ok" | "err: …"}`.
//!
//! Params: `read` (paths to read, default ["/etc/passwd"]), `write` (paths to create and
//! write "escape was here", default []), `list` (directories to list, default ["/"]),
//! `connect` (address for a TCP connection, default "127.0.0.1:9").
//!
//! Every attempt is recorded, never unwrapped: the plugin does not panic whatever the
//! sandbox refuses. Environment variables and arguments that are not UTF-8 are reported
//! lossily rather than panicking as `std::env::vars` would.

use std::collections::BTreeMap;
use std::io::{Read, Write};

use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize)]
struct Params {
    #[serde(default = "default_read")]
    read: Vec<String>,
    #[serde(default)]
    write: Vec<String>,
    #[serde(default = "default_list")]
    list: Vec<String>,
    #[serde(default = "default_connect")]
    connect: String,
}

fn default_read() -> Vec<String> {
    vec!["/etc/passwd".into()]
}

fn default_list() -> Vec<String> {
    vec!["/".into()]
}

fn default_connect() -> String {
    "127.0.0.1:9".into()
}

fn read(path: &str) -> String {
    let mut buf = Vec::new();
    match std::fs::File::open(path).and_then(|f| f.take(64).read_to_end(&mut buf)) {
        Ok(_) => format!("ok: {}", String::from_utf8_lossy(&buf)),
        Err(e) => format!("err: {e}"),
    }
}

fn write(path: &str) -> String {
    match std::fs::write(path, "escape was here") {
        Ok(()) => "ok".into(),
        Err(e) => format!("err: {e}"),
    }
}

fn list(dir: &str) -> Value {
    match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| match e {
                Ok(e) => Value::String(e.file_name().to_string_lossy().into_owned()),
                Err(e) => Value::String(format!("err: {e}")),
            })
            .collect(),
        Err(e) => Value::String(format!("err: {e}")),
    }
}

fn connect(addr: &str) -> String {
    match std::net::TcpStream::connect(addr) {
        Ok(_) => "ok".into(),
        Err(e) => format!("err: {e}"),
    }
}

fn run(p: Params) -> Result<u32, String> {
    let reads: BTreeMap<_, _> = p.read.iter().map(|path| (path.clone(), read(path))).collect();
    let writes: BTreeMap<_, _> = p.write.iter().map(|path| (path.clone(), write(path))).collect();
    let lists: BTreeMap<_, _> = p.list.iter().map(|dir| (dir.clone(), list(dir))).collect();
    let env: BTreeMap<String, String> = std::env::vars_os()
        .map(|(k, v)| (k.to_string_lossy().into_owned(), v.to_string_lossy().into_owned()))
        .collect();
    let args: Vec<String> = std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect();
    let report = json!({
        "read": reads,
        "write": writes,
        "list": lists,
        "env": env,
        "args": args,
        "connect": connect(&p.connect),
    });
    let mut out = std::io::stdout().lock();
    writeln!(out, "{report}")
        .and_then(|()| out.flush())
        .map_err(|e| format!("cannot write the report to stdout: {e}"))?;
    Ok(disbatch_plugin::SUCCEEDED)
}

disbatch_plugin::plugin!(run);
