//! `GET|POST /balance`: the QueueBalance document, as Disbatch 4 serves and checks it. The
//! DEN leading the cluster applies it (see the `den` module's balance).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bson::Bson;
use serde_json::{json, Value};

use super::body::Params;
use super::{ApiError, Shared};
use crate::model::balance::check_post;
use crate::store::QueueUpdate;

/// The config's `balance` settings as JSON.
fn settings(state: &Shared) -> Value {
    let b = &state.balance;
    json!({ "enabled": b.enabled, "log": b.log, "verbose": b.verbose, "pretend": b.pretend })
}

/// `GET /balance`: the document without `_id`, with `known_queues` (every queue's name)
/// and `settings` (the config's `balance`); `notice` when there is no document yet.
pub(super) async fn show(State(state): State<Shared>) -> Result<Json<Value>, ApiError> {
    let known: Vec<String> = state.store.queues().await?.into_iter().map(|q| q.name).collect();
    let mut out = match state.store.balance().await? {
        Some(mut doc) => {
            doc.remove("_id");
            Bson::Document(doc).into_relaxed_extjson()
        }
        None => json!({ "notice": "balance document not found" }),
    };
    out["known_queues"] = json!(known);
    out["settings"] = settings(&state);
    Ok(Json(out))
}

/// `POST /balance {max_tasks, queues[, disabled]}`: replaces those fields once they pass
/// Disbatch 4's checks. 400 with `error` (and Disbatch 4's `status` text) otherwise. A form
/// gives `max_tasks` and `queues` as JSON text.
pub(super) async fn update(State(state): State<Shared>, params: Params) -> Result<Response, ApiError> {
    let mut body = params.fields;
    if params.form {
        super::form::decode_json_fields(&mut body, &["max_tasks", "queues"])?;
    }
    let queues = state.store.queues().await?;
    let known: Vec<String> = queues.iter().map(|q| q.name.clone()).collect();
    let now = bson::DateTime::now().timestamp_millis() / 1000;
    match check_post(&Value::Object(body), &known, now) {
        Ok(fields) => {
            let listed: Vec<&str> = fields
                .get_array("queues")
                .into_iter()
                .flatten()
                .filter_map(Bson::as_array)
                .flatten()
                .filter_map(Bson::as_str)
                .collect();
            state.store.set_balance(fields.clone()).await?;
            // A queue new to the balance claims nothing until the leader gives it its
            // share (within about a second), so the limit holds from now on (when this
            // server's config enables the balance and does not only pretend).
            let pause = state.balance.enabled && !state.balance.pretend;
            for q in queues
                .iter()
                .filter(|q| pause && q.maxthreads.is_none() && listed.contains(&q.name.as_str()))
            {
                let paused = QueueUpdate {
                    extra: bson::doc! { "maxthreads": 0_i64 },
                    ..QueueUpdate::default()
                };
                state.store.update_queue(q.id, paused).await?;
            }
            Ok(Json(json!({ "status": "success: queuebalance modified" })).into_response())
        }
        Err(e) => Ok((
            StatusCode::BAD_REQUEST,
            Json(json!({ "error": e, "status": format!("failed: invalid json passed: {e}") })),
        )
            .into_response()),
    }
}

/// The `queuebalance` check of `GET /monitoring`: the leader's last report, CRITICAL when
/// it is older than 60 s (no DEN leads with `balance.enabled`).
pub(super) async fn check(state: &Shared) -> Value {
    if !state.balance.enabled {
        return json!({ "status": "OK", "message": "queuebalance disabled" });
    }
    let doc = match state.store.balance().await {
        Ok(Some(d)) => d,
        Ok(None) => return json!({ "status": "CRITICAL", "message": "QueueBalance has not run: no balance document" }),
        Err(e) => return json!({ "status": "CRITICAL", "message": format!("cannot read the balance: {e}") }),
    };
    let now = bson::DateTime::now().timestamp_millis() / 1000;
    let age = doc
        .get("timestamp")
        .and_then(crate::model::lenient_int)
        .map(|t| now - t);
    match age {
        Some(age) if age <= super::FRESH_NODE.as_secs() as i64 => {}
        Some(age) => {
            return json!({
                "status": "CRITICAL",
                "message": format!("QueueBalance not running for {age}s (no DEN leads with balance.enabled)"),
            })
        }
        None => return json!({ "status": "CRITICAL", "message": "QueueBalance has not run yet" }),
    }
    match doc.get_str("status") {
        Ok(s @ ("OK" | "WARNING" | "CRITICAL")) => {
            json!({ "status": s, "message": doc.get_str("message").unwrap_or_default() })
        }
        _ => json!({
            "status": "CRITICAL",
            "message": "QueueBalance unknown status",
            "result": Bson::Document(doc).into_relaxed_extjson(),
        }),
    }
}
