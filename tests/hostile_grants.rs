//! Hostile uses of the component cache and of directory grants: a forged cached artifact
//! is never executed, and no grant may reach the cache or its key.

mod common;

use std::path::Path;
use std::process::Command;

use disbatch::runner::{protected_paths, DirGrant, EngineOptions, Runner, Sandbox};

fn opts(cache: &Path) -> EngineOptions {
    EngineOptions {
        cache_dir: Some(cache.to_owned()),
        max_instances: 4,
    }
}

fn artifacts(cache: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .collect()
}

#[test]
fn a_tampered_cached_artifact_is_rejected_and_recompiled() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("components");
    let path = common::plugins_dir().join("demo.wasm");
    assert!(!Runner::new(&opts(&cache)).unwrap().load(&path).unwrap().from_cache());
    let cached = artifacts(&cache);
    assert_eq!(cached.len(), 1, "one artifact cached");
    assert!(
        !std::fs::read_dir(&cache)
            .unwrap()
            .any(|e| e.unwrap().file_name() == "cache.key"),
        "the MAC key lives outside the cache directory"
    );

    // Overwrite part of the artifact, as a plugin with write access to the cache would.
    let mut bytes = std::fs::read(&cached[0]).unwrap();
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..mid + 64] {
        *b ^= 0xA5;
    }
    std::fs::write(&cached[0], &bytes).unwrap();

    let runner = Runner::new(&opts(&cache)).unwrap();
    let plugin = runner.load(&path).unwrap();
    assert!(!plugin.from_cache(), "the tampered artifact must not be deserialized");
    let o = runner.run(&plugin, "{}", &Sandbox::default(), None);
    assert!(o.succeeded(), "{o:?}");

    // The recompiled artifact replaced it and verifies again.
    let again = Runner::new(&opts(&cache)).unwrap().load(&path).unwrap();
    assert!(again.from_cache());
}

#[test]
fn an_artifact_without_a_mac_is_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("components");
    let path = common::plugins_dir().join("demo.wasm");
    Runner::new(&opts(&cache)).unwrap().load(&path).unwrap();
    let cached = artifacts(&cache);
    // The engine's own serialization, with this host's MAC stripped off.
    let bytes = std::fs::read(&cached[0]).unwrap();
    std::fs::write(&cached[0], &bytes[32..]).unwrap();
    let plugin = Runner::new(&opts(&cache)).unwrap().load(&path).unwrap();
    assert!(!plugin.from_cache());
}

#[test]
fn grants_over_the_cache_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let cache = home.join(".cache").join("disbatch").join("components");
    std::fs::create_dir_all(&cache).unwrap();
    let protected = protected_paths(Some(&cache));
    for host in [home.clone(), cache.clone(), cache.join("sub")] {
        let s = Sandbox {
            dirs: vec![DirGrant {
                host: host.clone(),
                guest: "/data".into(),
                writable: true,
            }],
            ..Sandbox::default()
        };
        let err = s.check_grants(&protected).unwrap_err();
        assert!(err.contains("protected host path"), "{err}");
        assert!(err.contains(&host.display().to_string()), "{err}");
    }
}

#[test]
fn runner_exec_refuses_a_grant_of_home_holding_the_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let demo = common::plugins_dir().join("demo.wasm");
    let grant = format!("{}:/home:rw", home.display());
    let o = Command::new(env!("CARGO_BIN_EXE_runner"))
        .args(["exec", demo.to_str().unwrap(), "--dir", &grant])
        .env("HOME", &home)
        .env_remove("XDG_CACHE_HOME")
        .env_remove("DISBATCH_CACHE_DIR")
        .env_remove("DISBATCH_CACHE_KEY")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("protected host path"), "{err}");
    assert!(!home.join(".cache").exists() || err.contains(".cache"), "{err}");
}
