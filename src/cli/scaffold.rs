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
/// The build script of a Python or JavaScript project: builds it with its own SDK, WIT and
/// pinned tools, installing the tools on first use.
const BUILD_SCRIPT: &str = include_str!("../../plugins/build-tools/build-plugin");
const PY_SDK: &str = include_str!("../../plugins/sdk-python/disbatch_plugin.py");
const PY_TOOLS: &str = include_str!("../../plugins/build-tools/requirements.txt");
const JS_SDK: &str = include_str!("../../plugins/sdk-js/disbatch-plugin.js");
const JS_BUNDLE_CONFIG: &str = include_str!("../../plugins/sdk-js/bundle-config.mjs");
const JS_TOOLS: &str = include_str!("../../plugins/build-tools/package.json");
const JS_TOOLS_LOCK: &str = include_str!("../../plugins/build-tools/package-lock.json");
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
                    &wasm_path(name, lang),
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
            ("build.sh".into(), BUILD_SCRIPT.into()),
            ("sdk/disbatch_plugin.py".into(), PY_SDK.into()),
            ("tools/requirements.txt".into(), PY_TOOLS.into()),
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
            ("build.sh".into(), BUILD_SCRIPT.into()),
            ("sdk/disbatch-plugin.js".into(), JS_SDK.into()),
            ("sdk/bundle-config.mjs".into(), JS_BUNDLE_CONFIG.into()),
            ("tools/package.json".into(), JS_TOOLS.into()),
            ("tools/package-lock.json".into(), JS_TOOLS_LOCK.into()),
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

/// Where the Rust build writes its components, inside the project.
const RUST_OUT_DIR: &str = "target/wasm32-wasip2/release";

/// The name of the built component, and so of the plugin: cargo turns a package's '-' into
/// '_' in the name of its library.
fn plugin_name(name: &str, lang: Lang) -> String {
    match lang {
        Lang::Rust => name.replace('-', "_"),
        Lang::Python | Lang::Js => name.to_owned(),
    }
}

/// The directory the build writes the component into, relative to the project.
fn out_dir(lang: Lang) -> &'static str {
    match lang {
        Lang::Rust => RUST_OUT_DIR,
        Lang::Python | Lang::Js => ".",
    }
}

/// The built component, relative to the project.
fn wasm_path(name: &str, lang: Lang) -> String {
    let file = format!("{}.wasm", plugin_name(name, lang));
    match lang {
        Lang::Rust => format!("{RUST_OUT_DIR}/{file}"),
        Lang::Python | Lang::Js => file,
    }
}

/// How to build, try and run the new plugin. Its two `sh` blocks are commands to run in
/// the project's directory as they are: the first builds and tries the plugin, the second
/// starts `disbatch dev` on it (left running) and runs one task through the API.
fn readme(name: &str, lang: Lang) -> String {
    let build = match lang {
        Lang::Rust => "rustup target add wasm32-wasip2   # once\ncargo build --release --target wasm32-wasip2",
        Lang::Python => "./build.sh                        # the first build installs componentize-py (about 30 s)",
        Lang::Js => "./build.sh                        # the first build installs jco and ComponentizeJS (about 30 s)",
    };
    let needs = match lang {
        Lang::Rust => "Rust with rustup",
        Lang::Python => "python3 with its venv module",
        Lang::Js => "node and npm",
    };
    let wasm = wasm_path(name, lang);
    let plugin = plugin_name(name, lang);
    let dir = out_dir(lang);
    let url = format!("http://{}", crate::config::DEFAULT_BIND);
    format!(
        "# {name}\n\n\
         A Disbatch plugin. Building it needs {needs}, and the `disbatch` and `runner` commands.\n\n\
         Build it and try it:\n\n\
         ```sh\n{build}\nrunner check {wasm}\nrunner exec {wasm} --params '{{\"name\":\"you\"}}'\n```\n\n\
         Run it as tasks: `disbatch dev` serves the web UI ({url}/) and the API and runs a DEN, \
         with every component of `{dir}` allowed; leave it running and, in a second terminal, \
         create a queue for the plugin running two tasks at a time, and a task, waiting for it to end:\n\n\
         ```sh\ndisbatch dev --plugin-dir {dir}\n\
         disbatch --url {url} create-queue {plugin} {plugin} --threads 2\n\
         disbatch --url {url} create-task --wait {plugin} name you\n```\n\n\
         Ship it: `disbatch push-plugin {wasm} --name {plugin}` uploads it to a cluster's store, \
         from which every DEN runs it. The guide: docs/plugins.md of Disbatch.\n"
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
