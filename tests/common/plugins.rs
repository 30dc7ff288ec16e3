//! The guest plugins of `plugins/`, built once per test binary for `wasm32-wasip2`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The rustup command that installs the plugins' target.
pub const TARGET_HINT: &str = "rustup target add wasm32-wasip2";
const TARGET: &str = "wasm32-wasip2";

/// The directory of the built plugins (`plugins/target/wasm32-wasip2/release`), building
/// them on first use. Panics with the build's errors when it fails, and with
/// `rustup target add wasm32-wasip2` when the target is missing.
pub fn plugins_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(build_plugins).clone()
}

/// The built plugin `name` (`<plugins_dir>/<name>.wasm`); panics when it was not built.
pub fn plugin_path(name: &str) -> PathBuf {
    let path = plugins_dir().join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "plugin {name} was not built: {} is missing",
        path.display()
    );
    path
}

fn target_installed() -> Option<bool> {
    let out = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).lines().any(|l| l.trim() == TARGET))
}

fn build_plugins() -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let workspace = repo.join("plugins");
    let manifest = workspace.join("Cargo.toml");
    assert!(
        manifest.is_file(),
        "the plugins workspace is missing: {} does not exist",
        manifest.display()
    );
    if target_installed() == Some(false) {
        panic!("the {TARGET} target is not installed; run:\n    {TARGET_HINT}");
    }
    let target_dir = workspace.join("target");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(["build", "--release", "--target", TARGET, "--manifest-path"])
        .arg(&manifest)
        .env("CARGO_TARGET_DIR", &target_dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run cargo to build the plugins: {e}"));
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let missing_target = stderr.contains(TARGET)
            && (stderr.contains("may not be installed") || stderr.contains("can't find crate for"));
        if missing_target {
            panic!("the {TARGET} target is not installed; run:\n    {TARGET_HINT}\n\n{stderr}");
        }
        panic!("building the plugins failed ({}):\n{stderr}", out.status);
    }
    target_dir.join(TARGET).join("release")
}
