//! Checks of single values that other modules also need: plugin names and files, MongoDB
//! URIs and database names.

use std::path::{Path, PathBuf};

use super::MAX_PLUGIN_NAME_LEN;
use crate::redact::redact_uri;

/// Checks that `name` is a plain file stem: not empty, at most [`MAX_PLUGIN_NAME_LEN`]
/// bytes, no path separators, no `..`, no leading `.`, no control characters, no `@`
/// (which starts a pinned version: `name@sha256:…`).
pub fn check_plugin_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("plugin name is empty".into());
    }
    if name.len() > MAX_PLUGIN_NAME_LEN {
        return Err(format!("plugin name is longer than {MAX_PLUGIN_NAME_LEN} bytes"));
    }
    if name.contains(['/', '\\', '@'])
        || name.contains("..")
        || name.starts_with('.')
        || name.contains(char::is_control)
    {
        return Err(format!(
            "plugin name {name:?} must be a plain name without path separators, \"..\", \"@\" or control characters"
        ));
    }
    Ok(())
}

/// `<dir>/<name>.wasm` when `name` is a plain name and in `allowed`.
pub fn plugin_file(dir: &Path, allowed: &[String], name: &str) -> Result<PathBuf, String> {
    check_plugin_name(name)?;
    if !allowed.iter().any(|a| a == name) {
        return Err(format!("plugin {name:?} is not in the plugins allowlist"));
    }
    Ok(dir.join(format!("{name}.wasm")))
}

/// Checks a MongoDB URI (`mongohost`): the scheme, then the driver's parser. Messages show
/// the URI with its password redacted.
pub fn check_mongohost(uri: &str) -> Result<(), String> {
    if !(uri.starts_with("mongodb://") || uri.starts_with("mongodb+srv://")) {
        return Err(format!(
            "must be a mongodb:// or mongodb+srv:// URI, got {:?}",
            redact_uri(uri)
        ));
    }
    if let Err(e) = mongodb::options::ConnectionString::parse(uri) {
        let reason = match *e.kind {
            mongodb::error::ErrorKind::InvalidArgument { ref message, .. } => message.clone(),
            ref other => other.to_string(),
        };
        return Err(format!("is not a valid MongoDB URI ({reason}): {:?}", redact_uri(uri)));
    }
    Ok(())
}

/// Checks a MongoDB database name (`database`): under 64 bytes, none of `/\. "$` or NUL.
pub fn check_database(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() >= 64 || name.contains(['/', '\\', '.', ' ', '"', '$', '\0']) {
        return Err(format!(
            "{name:?} is not a valid MongoDB database name (not empty, under 64 bytes, none of /\\. \"$)"
        ));
    }
    Ok(())
}
