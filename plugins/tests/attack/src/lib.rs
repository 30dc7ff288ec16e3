//! `attack`: runs one attack on the sandbox, chosen by `params.attack`, and reports on
//! stdout what it managed. The tests in `tests/hostile_*.rs` assert the host held.
//!
//! Attacks and their params:
//! - `err`: returns `err(message)` of `bytes` bytes (default 100 MiB).
//! - `symlink`: plants a symlink at `link` pointing to `target`.
//! - `write`: writes `bytes` bytes to `path`, 1 MiB at a time; prints how many were written.
//! - `files`: creates `count` empty files in `dir`; prints how many were created.
//! - `connect`: opens a TCP connection to `addr` (`host:port`).
//! - `print`: writes `stdout` and `stderr` (strings) as they are.
//! - `garbage`: writes `bytes` bytes of 0xff (never UTF-8) to stdout.
//! - `progress`: reports progress `count` times with `info`, or with `info_bytes` bytes of
//!   text when given.
//! - `probe-then-trap`: asks for `probe_mib` MiB once (refused under a smaller limit), then
//!   reads past the end of its memory.
//! - `http-many`: sends `count` GET requests to `url`; prints `{"ok": n}`.
//! - `http-body`: GETs `url`; prints `{"bytes": n}`, the body's length.
//! - `http-stall-body`: writes 3 MiB into a POST's body to `url` without ever sending the
//!   request, so nothing reads it (a naive host blocks forever).
//! - `http-hoard`: builds `count` requests that are never sent, each with `header_kib` KiB
//!   of headers (default 24) and a body written until the host takes no more, and keeps
//!   them all; prints, every 16 requests, the largest header and body bytes one request
//!   held (a naive host holds whatever it is given, outside the task's memory limit).
//! - `http-open`: starts `count` requests to `url` at once and keeps them all open; prints
//!   the error of the last one, if it fails at once.
//! - `tcp-read`: connects to `addr` and waits for one read.
//! - `tcp-write-drop`: connects to `addr`, writes without blocking until the socket accepts
//!   no more, then drops it (a naive host waits in the drop for a peer that never reads).
//! - `read`: reads up to `bytes` bytes (default 64) of `path` from `offset` (default 0), or
//!   from the start of the first readable mapping listed in `maps` (a `/proc/<pid>/maps`
//!   file, for reading `mem`); prints `{"read": n, "text": …}`.
//! - `hold`: opens `path` again and again, keeping every descriptor, until an open fails or
//!   `count` (default 100,000) are open; reports progress `holding <n>: <error>`, then waits
//!   until `release` exists (when given) and prints `{"held": n, "error": …}`.
//! - `hold-streams`: as `hold`, but each time makes a read stream from the file it opened
//!   and drops the file's handle, keeping only the stream.

use std::io::Write;

use serde_json::Value;

fn str_param<'a>(p: &'a Value, key: &str) -> Result<&'a str, String> {
    p.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("params.{key} must be a string"))
}

fn u64_param(p: &Value, key: &str, default: u64) -> u64 {
    p.get(key).and_then(Value::as_u64).unwrap_or(default)
}

fn write_file(path: &str, bytes: u64) -> Result<u32, String> {
    let mut f = std::fs::File::create(path).map_err(|e| format!("create {path}: {e}"))?;
    let chunk = vec![b'w'; 1 << 20];
    let mut written = 0u64;
    while written < bytes {
        let n = chunk.len().min((bytes - written) as usize);
        if let Err(e) = f.write_all(&chunk[..n]) {
            println!("written {written}");
            return Err(format!("write to {path} failed after {written} bytes: {e}"));
        }
        written += n as u64;
    }
    println!("written {written}");
    Ok(disbatch_plugin::SUCCEEDED)
}

fn create_files(dir: &str, count: u64) -> Result<u32, String> {
    for i in 0..count {
        if let Err(e) = std::fs::File::create(format!("{dir}/f{i}")) {
            println!("created {i}");
            return Err(format!("creating file {i} in {dir} failed: {e}"));
        }
    }
    println!("created {count}");
    Ok(disbatch_plugin::SUCCEEDED)
}

/// Plants `link` (a path under a preopened directory) pointing to `target`, through the
/// directory's descriptor (std has no stable call for it on WASI).
fn symlink(target: &str, link: &str) -> Result<(), String> {
    for (dir, guest) in wasip2::filesystem::preopens::get_directories() {
        let prefix = format!("{}/", guest.trim_end_matches('/'));
        if let Some(rest) = link.strip_prefix(&prefix) {
            return dir
                .symlink_at(target, rest)
                .map_err(|e| format!("symlink refused: {e:?}"));
        }
    }
    Err(format!("{link} is not under a granted directory"))
}

/// Reads the byte at `address`: past the end of memory, a wasm trap.
#[inline(never)]
fn peek(address: usize) -> u32 {
    // SAFETY: none; the read is meant to trap.
    u32::from(unsafe { std::ptr::read_volatile(address as *const u8) })
}

fn run(p: Value) -> Result<u32, String> {
    match str_param(&p, "attack")? {
        "err" => Err("e".repeat(u64_param(&p, "bytes", 100 << 20) as usize)),
        "symlink" => {
            let (target, link) = (str_param(&p, "target")?, str_param(&p, "link")?);
            symlink(target, link)?;
            println!("symlink planted");
            Ok(disbatch_plugin::SUCCEEDED)
        }
        "write" => write_file(str_param(&p, "path")?, u64_param(&p, "bytes", 0)),
        "files" => create_files(str_param(&p, "dir")?, u64_param(&p, "count", 0)),
        "connect" => {
            let addr = str_param(&p, "addr")?;
            std::net::TcpStream::connect(addr).map_err(|e| format!("connect to {addr} refused: {e}"))?;
            println!("connected to {addr}");
            Ok(disbatch_plugin::SUCCEEDED)
        }
        "print" => {
            print!("{}", p.get("stdout").and_then(Value::as_str).unwrap_or(""));
            eprint!("{}", p.get("stderr").and_then(Value::as_str).unwrap_or(""));
            Ok(disbatch_plugin::SUCCEEDED)
        }
        "garbage" => {
            let chunk = vec![0xffu8; 1 << 16];
            let mut out = std::io::stdout().lock();
            let mut left = u64_param(&p, "bytes", 0) as usize;
            while left > 0 {
                let n = left.min(chunk.len());
                out.write_all(&chunk[..n]).map_err(|e| e.to_string())?;
                left -= n;
            }
            Ok(disbatch_plugin::SUCCEEDED)
        }
        "progress" => {
            let generated = "i".repeat(u64_param(&p, "info_bytes", 0) as usize);
            let info = p.get("info").and_then(Value::as_str).unwrap_or(&generated);
            for i in 0..u64_param(&p, "count", 1) {
                disbatch_plugin::progress((i % 100) as f32, info);
            }
            Ok(disbatch_plugin::SUCCEEDED)
        }
        "probe-then-trap" => {
            let mut v: Vec<u8> = Vec::new();
            let probe = u64_param(&p, "probe_mib", 1024) as usize;
            println!("probe refused: {}", v.try_reserve(probe << 20).is_err());
            Ok(peek(u64_param(&p, "address", 0xffff_fff0) as usize))
        }
        "http-many" => {
            let url = str_param(&p, "url")?;
            let mut ok = 0;
            let mut first = None;
            for i in 1..=u64_param(&p, "count", 1) {
                match disbatch_plugin::http::get(url) {
                    Ok(_) => ok += 1,
                    Err(e) => {
                        first.get_or_insert(format!("request #{i}: {e}"));
                    }
                }
            }
            println!("{}", serde_json::json!({ "ok": ok }));
            first.map_or(Ok(disbatch_plugin::SUCCEEDED), Err)
        }
        "http-body" => {
            let r = disbatch_plugin::http::get(str_param(&p, "url")?)?;
            println!("{}", serde_json::json!({ "bytes": r.body.len() }));
            Ok(disbatch_plugin::SUCCEEDED)
        }
        "http-stall-body" => stall_body(str_param(&p, "url")?),
        "http-hoard" => hoard(u64_param(&p, "count", 100), u64_param(&p, "header_kib", 24)),
        "http-open" => open_many(str_param(&p, "url")?, u64_param(&p, "count", 1)),
        "tcp-read" => {
            use std::io::Read;
            let addr = str_param(&p, "addr")?;
            let mut s = std::net::TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
            let mut buf = [0u8; 16];
            let n = s.read(&mut buf).map_err(|e| e.to_string())?;
            println!("{}", serde_json::json!({ "read": n }));
            Ok(disbatch_plugin::SUCCEEDED)
        }
        "tcp-write-drop" => {
            use std::io::Write;
            let addr = str_param(&p, "addr")?;
            let mut s = std::net::TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
            s.set_nonblocking(true).map_err(|e| format!("set_nonblocking: {e}"))?;
            let chunk = vec![b'w'; 64 * 1024];
            let mut written = 0usize;
            while written < 256 << 20 {
                match s.write(&chunk) {
                    Ok(n) => written += n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(format!("write after {written} bytes: {e}")),
                }
            }
            println!("{}", serde_json::json!({ "written": written }));
            drop(s);
            println!("dropped");
            Ok(disbatch_plugin::SUCCEEDED)
        }
        "read" => {
            let path = str_param(&p, "path")?;
            let offset = match p.get("maps").and_then(Value::as_str) {
                Some(maps) => first_readable(maps)?,
                None => u64_param(&p, "offset", 0),
            };
            read_at(path, offset, u64_param(&p, "bytes", 64) as usize)
        }
        "hold" => hold(
            u64_param(&p, "count", 100_000),
            p.get("release").and_then(Value::as_str),
            open_file(str_param(&p, "path")?),
        ),
        "hold-streams" => hold(
            u64_param(&p, "count", 100_000),
            p.get("release").and_then(Value::as_str),
            open_stream(str_param(&p, "path")?)?,
        ),
        other => Err(format!("unknown attack {other:?}")),
    }
}

/// Fills a request body that is never sent: the third blocking write waits for a reader
/// that does not exist.
fn stall_body(url: &str) -> Result<u32, String> {
    use wasip2::http::types::{Fields, Method, OutgoingRequest, Scheme};
    let rest = url.strip_prefix("http://").ok_or("url must start with http://")?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let request = OutgoingRequest::new(Fields::new());
    let _ = request.set_method(&Method::Post);
    let _ = request.set_scheme(Some(&Scheme::Http));
    let _ = request.set_authority(Some(authority));
    let _ = request.set_path_with_query(Some(if path.is_empty() { "/" } else { path }));
    let body = request.body().map_err(|()| "no body")?;
    let stream = body.write().map_err(|()| "no body stream")?;
    let chunk = vec![b'b'; 1 << 20];
    for _ in 0..3 {
        for part in chunk.chunks(4096) {
            stream
                .blocking_write_and_flush(part)
                .map_err(|e| format!("write: {e:?}"))?;
        }
    }
    println!("wrote 3 MiB into a body nobody reads");
    Ok(disbatch_plugin::SUCCEEDED)
}

disbatch_plugin::plugin!(run);

/// See `http-hoard` above.
fn hoard(count: u64, header_kib: u64) -> Result<u32, String> {
    use wasip2::http::types::{Fields, OutgoingRequest};
    let value = vec![b'v'; 1024];
    let chunk = vec![b'b'; 1 << 20];
    let (mut header_max, mut body_max) = (0u64, 0u64);
    let mut kept = Vec::new();
    let report = |n: u64, h: u64, b: u64| {
        println!(
            "{}",
            serde_json::json!({ "requests": n, "header_bytes": h, "body_bytes": b })
        );
    };
    for i in 1..=count {
        let fields = Fields::new();
        for n in 0..header_kib {
            fields
                .append(&format!("x-h{n}"), &value)
                .map_err(|e| format!("header #{n}: {e:?}"))?;
        }
        header_max = header_max.max(header_kib * 1024);
        let request = OutgoingRequest::new(fields);
        let body = request.body().map_err(|()| "no body")?;
        let stream = body.write().map_err(|()| "no body stream")?;
        let mut buffered = 0u64;
        // A host that buffers without end would take it all: stop at 64 MiB a body.
        while buffered < 64 << 20 {
            let permitted = stream.check_write().map_err(|e| format!("check-write: {e:?}"))?;
            if permitted == 0 {
                break;
            }
            let n = permitted.min(chunk.len() as u64) as usize;
            stream.write(&chunk[..n]).map_err(|e| format!("write: {e:?}"))?;
            buffered += n as u64;
        }
        body_max = body_max.max(buffered);
        // Children first: a stream, then its body, then the request are dropped in this order.
        kept.push((stream, body, request));
        if i % 16 == 0 {
            report(i, header_max, body_max);
        }
    }
    report(count, header_max, body_max);
    Ok(disbatch_plugin::SUCCEEDED)
}

/// See `http-open` above.
fn open_many(url: &str, count: u64) -> Result<u32, String> {
    use wasip2::http::outgoing_handler::handle;
    use wasip2::http::types::{Fields, OutgoingRequest, Scheme};
    let rest = url.strip_prefix("http://").ok_or("url must start with http://")?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut open = Vec::new();
    for _ in 0..count {
        let request = OutgoingRequest::new(Fields::new());
        let _ = request.set_scheme(Some(&Scheme::Http));
        let _ = request.set_authority(Some(authority));
        let _ = request.set_path_with_query(Some(if path.is_empty() { "/" } else { path }));
        open.push(handle(request, None).map_err(|e| format!("handle: {e:?}"))?);
    }
    let last = open.last().ok_or("count must be at least 1")?;
    last.subscribe().block();
    let outcome = match last.get() {
        Some(Ok(Ok(response))) => format!("status {}", response.status()),
        Some(Ok(Err(code))) => format!("{code:?}"),
        other => format!("{other:?}"),
    };
    println!("{}", serde_json::json!({ "started": open.len(), "last": outcome }));
    Ok(disbatch_plugin::SUCCEEDED)
}

/// The start of the first readable mapping in the maps file `maps`.
fn first_readable(maps: &str) -> Result<u64, String> {
    let text = std::fs::read_to_string(maps).map_err(|e| format!("read {maps}: {e}"))?;
    text.lines()
        .find(|l| l.split(' ').nth(1).is_some_and(|perms| perms.starts_with('r')))
        .and_then(|l| l.split('-').next())
        .and_then(|start| u64::from_str_radix(start, 16).ok())
        .ok_or_else(|| format!("no readable mapping in {maps}"))
}

/// See `read` above.
fn read_at(path: &str, offset: u64, bytes: usize) -> Result<u32, String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).map_err(|e| format!("open {path}: {e}"))?;
    f.seek(SeekFrom::Start(offset))
        .map_err(|e| format!("seek {path} to {offset}: {e}"))?;
    let mut buf = vec![0u8; bytes];
    let n = f.read(&mut buf).map_err(|e| format!("read {path} at {offset}: {e}"))?;
    println!(
        "{}",
        serde_json::json!({ "read": n, "text": String::from_utf8_lossy(&buf[..n]) })
    );
    Ok(disbatch_plugin::SUCCEEDED)
}

/// Opens `path` (for `hold`).
fn open_file(path: &str) -> impl FnMut() -> Result<std::fs::File, String> + '_ {
    move || std::fs::File::open(path).map_err(|e| e.to_string())
}

/// Opens `path`, a file under a preopened directory, makes a read stream from it and drops
/// the file's handle (for `hold-streams`).
fn open_stream(path: &str) -> Result<impl FnMut() -> Result<wasip2::io::streams::InputStream, String>, String> {
    use wasip2::filesystem::types::{DescriptorFlags, OpenFlags, PathFlags};
    for (dir, guest) in wasip2::filesystem::preopens::get_directories() {
        let prefix = format!("{}/", guest.trim_end_matches('/'));
        if let Some(rest) = path.strip_prefix(&prefix) {
            let rest = rest.to_owned();
            return Ok(move || {
                let file = dir
                    .open_at(PathFlags::empty(), &rest, OpenFlags::empty(), DescriptorFlags::READ)
                    .map_err(|e| format!("{e:?}"))?;
                let stream = file.read_via_stream(0).map_err(|e| format!("{e:?}"))?;
                drop(file);
                Ok(stream)
            });
        }
    }
    Err(format!("{path} is not under a granted directory"))
}

/// See `hold` above: keeps what `open` gives until it fails or `count` are held.
fn hold<T>(count: u64, release: Option<&str>, mut open: impl FnMut() -> Result<T, String>) -> Result<u32, String> {
    let mut held = Vec::new();
    let mut error = None;
    while (held.len() as u64) < count {
        match open() {
            Ok(f) => held.push(f),
            Err(e) => {
                error = Some(e);
                break;
            }
        }
    }
    let error = error.unwrap_or_default();
    disbatch_plugin::progress(100.0, &format!("holding {}: {error}", held.len()));
    if let Some(release) = release {
        while std::fs::metadata(release).is_err() {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    println!("{}", serde_json::json!({ "held": held.len(), "error": error }));
    Ok(disbatch_plugin::SUCCEEDED)
}
