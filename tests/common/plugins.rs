//! The guest plugins of `plugins/`, built once per test run for `wasm32-wasip2`: the
//! examples (`plugins/<name>`) and the test fixtures (`plugins/tests/<name>`), all in one
//! directory, apart from the examples' own directory that `disbatch dev` offers.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The rustup command that installs the plugins' target.
pub const TARGET_HINT: &str = "rustup target add wasm32-wasip2";
const TARGET: &str = "wasm32-wasip2";
/// The profile of the tests' build of every plugin.
const PROFILE: &str = "testing";
/// Where the examples alone are built (`cargo build --release`, the workspace's default
/// members), relative to the plugins workspace: the directory `disbatch dev` offers.
pub const EXAMPLES: &str = "target/wasm32-wasip2/release";

/// The directory of every built plugin, examples and test fixtures
/// (`plugins/target/wasm32-wasip2/testing`: the profile `testing` of the examples'
/// workspace `plugins/` and of the fixtures' `plugins/tests/`), building them on first
/// use; the examples are built into their own directory (`…/release`, [`EXAMPLES`]) too. Panics with the build's errors when it fails, and with
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
    let fixtures = workspace.join("tests/Cargo.toml");
    let target_dir = workspace.join("target");
    // The examples into their directory, then examples and fixtures into the tests' one.
    cargo_build(&manifest, &target_dir, &["--release"]);
    cargo_build(&manifest, &target_dir, &["--profile", PROFILE]);
    cargo_build(&fixtures, &target_dir, &["--profile", PROFILE]);
    remove_stale_fixtures(&workspace);
    target_dir.join(TARGET).join(PROFILE)
}

fn cargo_build(manifest: &Path, target_dir: &Path, args: &[&str]) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .arg("build")
        .args(args)
        .args(["--target", TARGET, "--manifest-path"])
        .arg(manifest)
        .env("CARGO_TARGET_DIR", target_dir)
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
}

/// Removes from the examples' directory the components of test fixtures (`plugins/tests/<name>`)
/// that builds from before the fixtures left the examples put there, so `disbatch dev` on
/// that directory offers the examples only.
fn remove_stale_fixtures(workspace: &Path) {
    let examples = workspace.join(EXAMPLES);
    for entry in std::fs::read_dir(workspace.join("tests")).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        // A Rust cdylib's file name has `_` where its package name has `-`.
        for file in [format!("{name}.wasm"), format!("{}.wasm", name.replace('-', "_"))] {
            let _ = std::fs::remove_file(examples.join(file));
        }
    }
}
