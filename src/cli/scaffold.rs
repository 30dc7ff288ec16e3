//! `disbatch new-plugin NAME --lang rust|python|js`: a new plugin project from the
//! templates, standing on its own (the SDK and the WIT world inside it), ready to build.
//! The files are those of `plugins/` in this repository, built into the binary.

use std::path::{Path, PathBuf};

use super::CliError;
use crate::config::check_plugin_name;

/// The languages a plugin can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    /// Rust, with the `disbatch-plugin` crate.
    Rust,
    /// Python, built with componentize-py.
    Python,
    /// JavaScript, built with componentize-js.
    Js,
}

/// `disbatch new-plugin`.
#[derive(Debug, Clone, clap::Args)]
pub struct NewPluginArgs {
    /// The plugin's name (also the directory created and the component's file name).
    pub name: String,
    /// Its language.
    #[arg(long, value_enum, default_value = "rust")]
    pub lang: Lang,
    /// Where to create the directory `NAME` (default: here).
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub dir: PathBuf,
}

const WIT: &str = include_str!("../../wit/plugin.wit");

const PY_APP: &str = include_str!("../../plugins/template-python/app.py");
const JS_APP: &str = include_str!("../../plugins/template-js/app.js");
/// The build script of a Python or JavaScript project: the SDK and the build tools come from
/// a checkout of the Disbatch repository.
const SCRIPT_BUILD: &str = r#"#!/usr/bin/env bash
# Builds this plugin into the component <this directory's name>.wasm here, or the file
# given as the argument. The SDK and the build tools come from a checkout of the Disbatch
# repository: set DISBATCH_REPO to it. The first build installs the tools.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ -z "${DISBATCH_REPO:-}" ] || [ ! -x "$DISBATCH_REPO/plugins/build-py-js" ]; then
    echo "build.sh: set DISBATCH_REPO to a checkout of the Disbatch repository (it has plugins/build-py-js)" >&2
    exit 1
fi
exec "$DISBATCH_REPO/plugins/build-py-js" "$here" "${1:-$here/$(basename "$here").wasm}"
"#;
const RUST_SDK_LIB: &str = include_str!("../../plugins/sdk/src/lib.rs");
const RUST_SDK_HTTP: &str = include_str!("../../plugins/sdk/src/http.rs");
const RUST_LIB: &str = include_str!("../../plugins/template/src/lib.rs");

/// The files of a new project: (path inside it, contents).
fn files(name: &str, lang: Lang) -> Vec<(String, String)> {
    let wit = ("wit/plugin.wit".to_owned(), WIT.to_owned());
    match lang {
        Lang::Rust => vec![
            ("Cargo.toml".into(), rust_manifest(name)),
            (
                "src/lib.rs".into(),
                RUST_LIB.replace(
                    "plugins/target/wasm32-wasip2/release/template.wasm",
                    &format!("target/wasm32-wasip2/release/{}.wasm", name.replace('-', "_")),
                ),
            ),
            ("sdk/Cargo.toml".into(), RUST_SDK_MANIFEST.into()),
            (
                "sdk/src/lib.rs".into(),
                RUST_SDK_LIB.replace("path: \"../../wit\"", "path: \"../wit\""),
            ),
            ("sdk/src/http.rs".into(), RUST_SDK_HTTP.into()),
            wit,
            ("README.md".into(), readme(name, lang)),
        ],
        Lang::Python => vec![
            (
                "app.py".into(),
                PY_APP.replace(
                    "plugins/target/wasm32-wasip2/release/template-python.wasm",
                    &format!("{name}.wasm"),
                ),
            ),
            ("build.sh".into(), SCRIPT_BUILD.into()),
            wit,
            ("README.md".into(), readme(name, lang)),
        ],
        Lang::Js => vec![
            (
                "app.js".into(),
                JS_APP.replace(
                    "plugins/target/wasm32-wasip2/release/template-js.wasm",
                    &format!("{name}.wasm"),
                ),
            ),
            ("build.sh".into(), SCRIPT_BUILD.into()),
            wit,
            ("README.md".into(), readme(name, lang)),
        ],
    }
}

const RUST_SDK_MANIFEST: &str = r#"[package]
name = "disbatch-plugin"
description = "Write Disbatch plugins: one function from params to a status, built as a WASI preview-2 component"
version = "0.1.0"
edition = "2021"
publish = false

[dependencies]
serde = { version = "1", features = ["derive"] }
serde_json = "1"
wit-bindgen = "0.63"
wasip2 = "1.0.4"
"#;

fn rust_manifest(name: &str) -> String {
    format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2021"
publish = false

[lib]
# A cdylib for wasm32-wasip2 is linked straight into a WASI preview-2 component.
crate-type = ["cdylib"]

[dependencies]
disbatch-plugin = {{ path = "sdk" }}
serde = {{ version = "1", features = ["derive"] }}
serde_json = "1"

[workspace]
members = [".", "sdk"]

[profile.release]
opt-level = "s"
lto = true
codegen-units = 1
strip = true
"#
    )
}

/// How to build, try and ship the new plugin.
fn readme(name: &str, lang: Lang) -> String {
    let (build, wasm) = match lang {
        Lang::Rust => (
            "rustup target add wasm32-wasip2   # once\ncargo build --release --target wasm32-wasip2".to_owned(),
            format!("target/wasm32-wasip2/release/{}.wasm", name.replace('-', "_")),
        ),
        Lang::Python | Lang::Js => ("./build.sh".to_owned(), format!("{name}.wasm")),
    };
    format!(
        "# {name}\n\nA Disbatch plugin. Build it, try it, then push it to the store so every DEN runs it:\n\n```sh\n{build}\nrunner check {wasm}\nrunner exec {wasm} --params '{{\"name\":\"you\"}}'\ndisbatch push-plugin {wasm} --name {name}\n```\n\nThe guide: docs/plugins.md of Disbatch.\n"
    )
}

/// Creates `<dir>/<name>` with the project's files; returns the directory. Refuses a name
/// that is not a plain plugin name and a directory that exists.
pub fn create(args: &NewPluginArgs) -> Result<PathBuf, CliError> {
    check_plugin_name(&args.name).map_err(CliError::Usage)?;
    if args.lang == Lang::Rust
        && !args
            .name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(CliError::Usage(format!(
            "{:?} is not a Rust package name: use letters, digits, '-' and '_'",
            args.name
        )));
    }
    let root = args.dir.join(&args.name);
    if root.exists() {
        return Err(CliError::Usage(format!("{} exists already", root.display())));
    }
    for (path, text) in files(&args.name, args.lang) {
        write(&root, &path, &text)?;
    }
    Ok(root)
}

fn write(root: &Path, path: &str, text: &str) -> Result<(), CliError> {
    let file = root.join(path);
    let fail = |e: std::io::Error| CliError::Usage(format!("cannot write {}: {e}", file.display()));
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    std::fs::write(&file, text).map_err(fail)?;
    if path.ends_with(".sh") {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).map_err(fail)?;
    }
    Ok(())
}

/// What `new-plugin` prints: the project's README.
pub fn done(root: &Path, name: &str, lang: Lang) -> String {
    format!("created {}\n\n{}", root.display(), readme(name, lang))
}
