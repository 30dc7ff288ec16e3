//! The plugin verbs: `push-plugin FILE [--name N]`, `plugins --full`, `plugin-versions
//! NAME` and `delete-plugin NAME`, and how their answers read.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::client::{encode, Client};
use super::table::{cell, render};
use super::CliError;
use crate::config::check_plugin_name;
use crate::store::plugins::digest;

/// `disbatch push-plugin`.
#[derive(Debug, Clone, clap::Args)]
pub struct PushArgs {
    /// The component (`.wasm`).
    pub file: PathBuf,
    /// The plugin's name (default: the file name without `.wasm`).
    #[arg(long)]
    pub name: Option<String>,
}

/// The plugin name `args` push under.
fn push_name(args: &PushArgs) -> Result<String, CliError> {
    let name = match &args.name {
        Some(n) => n.clone(),
        None => stem(&args.file)?,
    };
    check_plugin_name(&name).map_err(|e| CliError::Usage(format!("{e}; give the plugin's name with --name")))?;
    Ok(name)
}

fn stem(file: &Path) -> Result<String, CliError> {
    file.file_stem()
        .and_then(|s| s.to_str())
        .map(str::to_owned)
        .ok_or_else(|| {
            CliError::Usage(format!(
                "{}: no plugin name in the file name; give --name",
                file.display()
            ))
        })
}

/// Uploads the component, with its digest so the DCI can tell a damaged upload.
pub async fn push(client: &Client, args: &PushArgs) -> Result<Value, CliError> {
    let name = push_name(args)?;
    let bytes =
        std::fs::read(&args.file).map_err(|e| CliError::Usage(format!("cannot read {}: {e}", args.file.display())))?;
    let path = format!("/plugins?name={}&sha256={}", encode(&name), digest(&bytes));
    client.post_bytes(&path, "application/wasm", bytes).await
}

/// `push-plugin`'s answer for a person.
pub fn pushed(v: &Value) -> String {
    let what = if v["created"] == Value::Bool(true) {
        "pushed"
    } else {
        "already stored, now the newest version:"
    };
    let mut s = format!("{what} {} ({} bytes)\n", cell(&v["ref"]), cell(&v["size"]));
    if v["allowed"] == Value::Bool(false) {
        s.push_str(&format!(
            "note: {} is not in this DCI's plugins allowlist; add it to `plugins` in the config of the DCI and the DENs that are to run it\n",
            cell(&v["name"])
        ));
    }
    s
}

/// `plugins --full` as a table.
pub fn table(v: &Value) -> String {
    let fields = [
        "name",
        "source",
        "allowed",
        "versions",
        "sha256",
        "size",
        "wit",
        "uploaded",
        "uploaded_by",
    ];
    render(
        &[
            "name", "source", "allowed", "versions", "sha256", "size", "wit", "uploaded", "by",
        ],
        &rows(v, &fields),
    )
}

/// `plugin-versions NAME` as a table, newest first.
pub fn versions(v: &Value) -> String {
    let fields = ["sha256", "size", "wit", "uploaded", "uploaded_by"];
    render(
        &["sha256", "size", "wit", "uploaded", "by"],
        &rows(&v["versions"], &fields),
    )
}

/// One row of `fields` per object of the array `v`; a digest shortened where the full
/// list shows many plugins.
fn rows(v: &Value, fields: &[&str]) -> Vec<Vec<String>> {
    let short_digest = fields.contains(&"name");
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    fields
                        .iter()
                        .map(|f| match *f {
                            "sha256" if short_digest => short(&p[*f]),
                            _ => cell(&p[*f]),
                        })
                        .collect()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The path of `GET|DELETE /plugins/{name}`.
pub fn path(name: &str) -> String {
    format!("/plugins/{}", encode(name))
}

/// The first 12 hex digits of a digest.
fn short(v: &Value) -> String {
    match v.as_str() {
        Some(s) => s.chars().take(12).collect(),
        None => cell(v),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn tables_show_the_fields_and_shorten_digests_in_the_list() {
        let sha = "ab".repeat(32);
        let list = json!([{"name": "hello", "source": "store", "allowed": true, "versions": 2,
            "sha256": sha, "size": 10, "wit": "0.1.0", "uploaded": "t", "uploaded_by": "me@h"}]);
        let shown = super::table(&list);
        assert!(shown.starts_with("NAME   SOURCE  ALLOWED"), "{shown}");
        assert!(
            shown.contains("hello  store   true     2         abababababab  10"),
            "{shown}"
        );
        let versions =
            json!({"versions": [{"sha256": sha, "size": 10, "wit": null, "uploaded": "t", "uploaded_by": null}]});
        let shown = super::versions(&versions);
        assert!(shown.contains(&format!("{sha}  10    -")), "{shown}");
    }
}
