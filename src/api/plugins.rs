//! Plugins: `GET /plugins` (Disbatch 4's list of allowed names; `?full=1` for objects),
//! `POST /plugins?name=N` (upload a component), `GET /plugins/{name}` (its versions) and
//! `DELETE /plugins/{name}`.
//!
//! An upload is checked before it is stored: the body is sent as `application/wasm` (or
//! `application/octet-stream`; no browser sends either cross-site without asking), is at
//! most [`MAX_PLUGIN_BYTES`], and compiles as a component of the `disbatch:plugin` world
//! within the host's limits. A `sha256` query parameter, when given, must match the body.
//! One upload at a time is read and checked; the others wait before their body is read.
//! An upload whose body stalls or trickles is cut with 408 (the DCI's server reads every
//! body under `http_body_timeout`, see `timed_body`), which gives the turn to the next.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::Json;
use bson::DateTime;
use futures::StreamExt;
use serde_json::{json, Value};

use super::body::{content_type, PathKey};
use super::tasks::truthy;
use super::{json, ApiError, Shared};
use crate::config::check_plugin_name;
use crate::store::plugins::{digest, MAX_PLUGIN_BYTES};
use crate::store::{PluginVersion, Pushed};

/// Longest `X-Disbatch-User` kept as `uploaded_by`.
const MAX_UPLOADER: usize = 200;

/// A version as JSON.
fn version(v: &PluginVersion) -> Value {
    json!({
        "name": v.name,
        "sha256": v.sha256,
        "ref": format!("{}@sha256:{}", v.name, v.sha256),
        "size": v.size,
        "wit": v.wit,
        "uploaded": json::date(&v.uploaded, false),
        "uploaded_by": v.uploaded_by,
    })
}

/// `GET /plugins`: the allowed plugin names; with `full=1`, for every allowed or stored
/// plugin `{name, allowed, source, versions, …}` with its newest stored version's fields.
pub(super) async fn list(
    State(state): State<Shared>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    if !truthy(q.get("full")) {
        return Ok(Json(json!(state.plugins)));
    }
    let stored = state.store.plugin_versions(None).await?;
    let names: BTreeSet<&str> = state
        .plugins
        .iter()
        .map(String::as_str)
        .chain(stored.iter().map(|v| v.name.as_str()))
        .collect();
    let list: Vec<Value> = names
        .into_iter()
        .map(|name| {
            let allowed = state.plugins.iter().any(|a| a == name);
            let versions: Vec<&PluginVersion> = stored.iter().filter(|v| v.name == name).collect();
            let mut entry = match versions.first() {
                Some(newest) => version(newest),
                None => json!({ "name": name, "sha256": null, "size": null, "wit": null, "uploaded": null, "uploaded_by": null }),
            };
            entry["allowed"] = json!(allowed);
            entry["versions"] = json!(versions.len());
            entry["source"] = json!(if versions.is_empty() { "plugin_dir" } else { "store" });
            entry
        })
        .collect();
    Ok(Json(Value::Array(list)))
}

/// `GET /plugins/{name}`: `{name, allowed, versions: [...]}`, newest first.
pub(super) async fn one(State(state): State<Shared>, PathKey(name): PathKey) -> Result<Json<Value>, ApiError> {
    let versions = state.store.plugin_versions(Some(&name)).await?;
    if versions.is_empty() {
        return Err(ApiError::NotFound(format!("no plugin {name:?} in the store")));
    }
    Ok(Json(json!({
        "name": name,
        "allowed": state.plugins.contains(&name),
        "versions": versions.iter().map(version).collect::<Vec<_>>(),
    })))
}

/// `DELETE /plugins/{name}`: deletes every stored version; `{name, deleted}`.
pub(super) async fn delete(State(state): State<Shared>, PathKey(name): PathKey) -> Result<Json<Value>, ApiError> {
    let deleted = state.store.delete_plugin(&name).await?;
    if deleted == 0 {
        return Err(ApiError::NotFound(format!("no plugin {name:?} in the store")));
    }
    Ok(Json(json!({ "name": name, "deleted": deleted })))
}

/// `POST /plugins?name=N[&sha256=H]` with the component as the body: checks and stores it.
/// 201 with the version when it is new, 200 when the plugin had it already (it is the
/// newest version again). The headers and the name are checked before the body is read,
/// and one upload at a time is read and compiled.
pub(super) async fn upload(
    State(state): State<Shared>,
    Query(q): Query<HashMap<String, String>>,
    request: Request,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let headers = request.headers().clone();
    check_wasm_type(&headers)?;
    let name = q
        .get("name")
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::bad("query parameter \"name\" is required: POST /plugins?name=NAME"))?;
    check_plugin_name(&name).map_err(|e| ApiError::bad(format!("\"name\": {e}")))?;
    let Some(runner) = state.checker.clone() else {
        return Err(ApiError::Unavailable(
            "this DCI cannot check components, so it accepts no uploads".into(),
        ));
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_PLUGIN_BYTES as u64) {
        return Err(too_large());
    }
    // Held until the check ends, even when the client goes away first.
    let turn = state
        .upload_turn
        .clone()
        .acquire_owned()
        .await
        .map_err(|e| ApiError::Unavailable(format!("uploads are closed: {e}")))?;
    let bytes = read_body(request).await?;
    let sha256 = digest(&bytes);
    if let Some(want) = super::body::query_value(&q, "sha256") {
        if !want.eq_ignore_ascii_case(&sha256) {
            return Err(ApiError::bad(format!(
                "the body's SHA-256 is {sha256}, not {want:?} as \"sha256\" says: the upload was damaged, send it again"
            )));
        }
    }
    let label = PathBuf::from(format!("{name} (uploaded)"));
    let (checked, bytes) = tokio::task::spawn_blocking(move || {
        let _turn = turn;
        let wit = runner
            .load_bytes(&bytes, &label)
            .map(|p| p.wit_version().map(str::to_owned));
        (wit, bytes)
    })
    .await
    .map_err(|e| ApiError::Unavailable(format!("checking the component failed: {e}")))?;
    let wit = checked.map_err(|e| ApiError::bad(format!("the component was refused: {e}")))?;
    let uploaded_by = headers
        .get("x-disbatch-user")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.chars().take(MAX_UPLOADER).collect::<String>())
        .filter(|v| !v.trim().is_empty());
    let v = PluginVersion {
        name,
        sha256,
        size: bytes.len() as u64,
        wit,
        uploaded: DateTime::now(),
        uploaded_by,
    };
    let pushed = state.store.put_plugin(&v, &bytes).await?;
    let mut body = version(&v);
    body["created"] = json!(pushed == Pushed::Created);
    body["allowed"] = json!(state.plugins.contains(&v.name));
    let code = match pushed {
        Pushed::Created => StatusCode::CREATED,
        Pushed::Existing => StatusCode::OK,
    };
    Ok((code, Json(body)))
}

fn too_large() -> ApiError {
    ApiError::TooLarge(format!(
        "the component is larger than the limit of {MAX_PLUGIN_BYTES} bytes (128 MiB)"
    ))
}

/// The body, refused past [`MAX_PLUGIN_BYTES`] as soon as it gets there.
async fn read_body(request: Request) -> Result<Vec<u8>, ApiError> {
    let mut stream = request.into_body().into_data_stream();
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| match super::timed_body::timed_out(&e) {
            Some(t) => ApiError::Timeout(format!("the upload was cut to let other uploads go on: {t}")),
            None => ApiError::bad(format!("cannot read the request body: {e}")),
        })?;
        if bytes.len() + chunk.len() > MAX_PLUGIN_BYTES {
            return Err(too_large());
        }
        bytes.extend_from_slice(&chunk);
    }
    if bytes.is_empty() {
        return Err(ApiError::bad("the request body is empty: send the component's bytes"));
    }
    Ok(bytes)
}

/// Refuses an upload not declared as a component.
fn check_wasm_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let (essence, given) = content_type(headers);
    match essence.as_deref() {
        Some("application/wasm" | "application/octet-stream") => Ok(()),
        _ => Err(ApiError::NotJson(format!(
            "a plugin is uploaded as its bytes: send header Content-Type: application/wasm (got {given})"
        ))),
    }
}
