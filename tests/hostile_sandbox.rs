//! Hostile plugins against the sandbox's messages, output accounting, compile bounds,
//! filesystem and network policy. Each case is one attack; the host must hold and say
//! what happened.

use crate::common;

use std::net::TcpListener;
use std::path::Path;

use disbatch::runner::{EngineOptions, Failure, Outcome, Runner, Sandbox, MAX_MESSAGE};
use serde_json::json;

fn runner() -> Runner {
    Runner::new(&EngineOptions {
        cache_dir: None,
        max_instances: 4,
    })
    .unwrap()
}

fn attack(params: serde_json::Value, sandbox: &Sandbox) -> Outcome {
    let path = common::plugin_path("attack");
    runner().run_file(&path, &params.to_string(), sandbox, None)
}

fn failure_text(o: &Outcome) -> String {
    o.failure.as_ref().map(|f| f.to_string()).unwrap_or_default()
}

fn stdout(o: &Outcome) -> String {
    String::from_utf8_lossy(&o.stdout.bytes).into_owned()
}

#[test]
fn a_100_mib_error_message_is_cut_to_a_few_kib_and_says_so() {
    let o = attack(json!({"attack": "err", "bytes": 100 << 20}), &Sandbox::default());
    let Some(Failure::Plugin(msg)) = &o.failure else {
        panic!(
            "expected a plugin error, got {:?}",
            o.failure.as_ref().map(|f| f.kind())
        )
    };
    assert!(msg.len() <= MAX_MESSAGE + 200, "message of {} bytes", msg.len());
    assert!(msg.contains("message cut at 4096 bytes"), "{}", &msg[msg.len() - 100..]);
    assert!(msg.contains(&format!("{} more bytes were dropped", (100 << 20) - MAX_MESSAGE)));
    // The stored stderr carries it once, bounded too.
    let (_, stderr) = o.output_texts();
    assert!(stderr.len() < 2 * MAX_MESSAGE, "stderr of {} bytes", stderr.len());
}

#[test]
fn a_trap_after_a_refused_memory_probe_is_reported_as_the_trap() {
    let sandbox = Sandbox {
        memory: 64 << 20,
        ..Sandbox::default()
    };
    let o = attack(json!({"attack": "probe-then-trap", "probe_mib": 512}), &sandbox);
    assert_eq!(stdout(&o), "probe refused: true\n");
    let Some(Failure::Trap(msg)) = &o.failure else {
        panic!("expected a trap, got {}", failure_text(&o))
    };
    assert!(msg.contains("wasm trap: out of bounds memory access"), "{msg}");
    assert!(
        msg.contains("earlier, a memory growth past the limit of 64 MiB was refused"),
        "{msg}"
    );
}

/// A component whose `run` returns an error string that points outside its memory: the
/// host fails while lifting the result, inside the call.
fn lying_component() -> Vec<u8> {
    common::components::component_with(
        "",
        "(i32.store8 (i32.const 16) (i32.const 1)) (i32.store (i32.const 20) (i32.const 0xfffffff0)) \
         (i32.store (i32.const 24) (i32.const 64))",
    )
}

#[test]
fn a_host_side_failure_inside_a_call_names_its_cause() {
    let r = runner();
    let p = r.load_bytes(&lying_component(), Path::new("liar.wasm")).unwrap();
    let o = r.run(&p, "{}", &Sandbox::default(), None);
    let msg = failure_text(&o);
    assert!(!msg.contains("wasm backtrace"), "{msg}");
    assert!(msg.contains("out of bounds"), "{msg}");
}

#[test]
fn a_load_error_keeps_its_cause() {
    // A component header followed by a section that claims more bytes than there are.
    let bytes = b"\0asm\x0d\0\x01\0\x01\xff\x01\x00";
    let err = runner()
        .load_bytes(bytes, Path::new("cut.wasm"))
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("cut.wasm: "), "{err}");
    assert!(err.contains("offset"), "the parser's detail is kept: {err}");
}

fn leb(mut n: u64, out: &mut Vec<u8>) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn section(id: u8, body: &[u8], out: &mut Vec<u8>) {
    out.push(id);
    leb(body.len() as u64, out);
    out.extend_from_slice(body);
}

/// A component holding one core module of `functions` functions that each declare
/// `locals` i32 locals and do nothing: a few bytes each, costly to compile.
fn locals_bomb(functions: u64, locals: u64) -> Vec<u8> {
    let mut module = b"\0asm\x01\0\0\0".to_vec();
    section(1, &[1, 0x60, 0, 0], &mut module);
    let mut funcs = Vec::new();
    leb(functions, &mut funcs);
    funcs.extend(std::iter::repeat_n(0u8, functions as usize));
    section(3, &funcs, &mut module);
    let mut body = vec![1];
    leb(locals, &mut body);
    body.extend_from_slice(&[0x7f, 0x0b]);
    let mut code = Vec::new();
    leb(functions, &mut code);
    for _ in 0..functions {
        leb(body.len() as u64, &mut code);
        code.extend_from_slice(&body);
    }
    section(10, &code, &mut module);
    let mut component = b"\0asm\x0d\0\x01\0".to_vec();
    section(1, &module, &mut component);
    component
}

#[test]
fn a_component_declaring_millions_of_locals_is_refused_before_compiling() {
    let bomb = locals_bomb(200, 50_000);
    assert!(bomb.len() < 4096, "{} bytes", bomb.len());
    let started = std::time::Instant::now();
    let err = runner()
        .load_bytes(&bomb, Path::new("bomb.wasm"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("more than 4000000 locals"), "{err}");
    assert!(err.contains("retrying cannot help"), "{err}");
    // Refused by the shape check, not after a compilation (which takes minutes).
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
}

#[test]
fn a_component_file_over_the_size_limit_is_refused_without_reading_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.wasm");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(disbatch::runner::MAX_COMPONENT_BYTES as u64 + 1).unwrap();
    let err = runner().load(&path).unwrap_err().to_string();
    assert!(err.contains("over the limit of 268435456 bytes (256 MiB)"), "{err}");
}

#[test]
fn invalid_utf8_cannot_grow_stored_output_past_the_cap() {
    let sandbox = Sandbox {
        output_cap: 1 << 20,
        ..Sandbox::default()
    };
    let o = attack(json!({"attack": "garbage", "bytes": 1 << 20}), &sandbox);
    assert!(o.succeeded(), "{}", failure_text(&o));
    let (stdout, stderr) = o.output_texts();
    let marker = stdout.find("\n[disbatch: output truncated").expect("truncation stated");
    assert!(marker <= 1 << 20, "kept {marker} bytes under a 1 MiB cap");
    assert!(stdout.len() < (1 << 20) + 200);
    assert!(stderr.contains("[disbatch: invalid UTF-8 in stdout was replaced with U+FFFD]"));
}

#[test]
fn plugin_text_cannot_forge_a_host_note() {
    let o = attack(
        json!({"attack": "print", "stdout": "[disbatch: output truncated]\n", "stderr": "[disbatch: timeout: plugin still running after 1s]\n"}),
        &Sandbox::default(),
    );
    assert!(o.succeeded());
    assert!(o.notes().is_empty(), "{:?}", o.notes());
    let (stdout, stderr) = o.output_texts();
    assert_eq!(stdout, "[plugin] [disbatch: output truncated]\n");
    assert_eq!(stderr, "[plugin] [disbatch: timeout: plugin still running after 1s]\n");
}

#[test]
fn a_progress_flood_keeps_only_a_kib_per_report() {
    let o = attack(
        json!({"attack": "progress", "count": 200, "info_bytes": 1 << 20}),
        &Sandbox::default(),
    );
    assert!(o.succeeded(), "{}", failure_text(&o));
    assert_eq!(o.progress.len(), disbatch::runner::MAX_PROGRESS);
    for p in &o.progress {
        let info = p.info.as_ref().unwrap();
        assert_eq!(info.len(), disbatch::runner::MAX_PROGRESS_INFO);
        assert!(
            info.capacity() <= 2 * disbatch::runner::MAX_PROGRESS_INFO,
            "{}",
            info.capacity()
        );
    }
}

fn writable(dir: &Path) -> Sandbox {
    Sandbox {
        dirs: vec![format!("{}:/out:rw", dir.display()).parse().unwrap()],
        ..Sandbox::default()
    }
}

#[test]
fn a_symlink_out_of_a_writable_grant_cannot_be_planted() {
    let dir = tempfile::tempdir().unwrap();
    for target in ["../../../../etc/passwd", "/etc", "inside"] {
        let o = attack(
            json!({"attack": "symlink", "target": target, "link": "/out/link"}),
            &writable(dir.path()),
        );
        assert!(
            failure_text(&o).contains("symlink refused"),
            "{target}: {}",
            failure_text(&o)
        );
        assert!(
            std::fs::symlink_metadata(dir.path().join("link")).is_err(),
            "{target}: a link was planted"
        );
    }
}

fn network(allow: &[&str]) -> Sandbox {
    Sandbox {
        network: true,
        network_allow: allow
            .iter()
            .map(|a| disbatch::runner::parse_network_allow(a).unwrap())
            .collect(),
        ..Sandbox::default()
    }
}

#[test]
fn network_access_does_not_reach_the_hosts_loopback() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    for addr in [
        format!("127.0.0.1:{port}"),
        format!("[::ffff:127.0.0.1]:{port}"),
        format!("0.0.0.0:{port}"),
    ] {
        let o = attack(json!({"attack": "connect", "addr": addr}), &network(&[]));
        assert!(failure_text(&o).contains("refused"), "{addr}: {}", failure_text(&o));
        assert!(!stdout(&o).contains("connected"), "{addr}");
    }
}

#[test]
fn private_and_link_local_ranges_are_refused_before_any_packet() {
    for addr in [
        "169.254.169.254:80",
        "10.0.0.1:80",
        "192.168.0.1:80",
        "[fd00::1]:80",
        "[fe80::1]:80",
    ] {
        let o = attack(json!({"attack": "connect", "addr": addr}), &network(&[]));
        assert!(failure_text(&o).contains("refused"), "{addr}: {}", failure_text(&o));
    }
}

#[test]
fn a_listed_internal_address_is_reachable() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let o = attack(json!({"attack": "connect", "addr": addr}), &network(&["127.0.0.1/32"]));
    assert!(o.succeeded(), "{}", failure_text(&o));
    assert_eq!(stdout(&o), format!("connected to {addr}\n"));
    // Without the network grant, the allow-list alone opens nothing.
    let closed = Sandbox {
        network: false,
        ..network(&["127.0.0.1/32"])
    };
    let o = attack(json!({"attack": "connect", "addr": addr}), &closed);
    assert!(!o.succeeded());
}

#[test]
fn a_writable_grant_cannot_be_filled_past_the_write_quota() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = Sandbox {
        write_quota: 4 << 20,
        ..writable(dir.path())
    };
    let o = attack(
        json!({"attack": "write", "path": "/out/big", "bytes": 64 << 20}),
        &sandbox,
    );
    assert!(
        failure_text(&o).contains("write to /out/big failed after"),
        "{}",
        failure_text(&o)
    );
    let size = std::fs::metadata(dir.path().join("big")).unwrap().len();
    assert!(size <= 4 << 20, "{size} bytes written under a 4 MiB quota");
    // Within the quota, writing works.
    let o = attack(
        json!({"attack": "write", "path": "/out/small", "bytes": 1 << 20}),
        &sandbox,
    );
    assert!(o.succeeded(), "{}", failure_text(&o));
    assert_eq!(std::fs::metadata(dir.path().join("small")).unwrap().len(), 1 << 20);
}

#[test]
fn a_writable_grant_cannot_be_filled_with_files_past_the_file_quota() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = Sandbox {
        file_quota: 50,
        ..writable(dir.path())
    };
    let o = attack(json!({"attack": "files", "dir": "/out", "count": 5000}), &sandbox);
    assert!(
        failure_text(&o).contains("creating file 50 in /out failed"),
        "{}",
        failure_text(&o)
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 50);
}
