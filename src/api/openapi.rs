//! The OpenAPI 3.1 document of the API, served at `GET /openapi.json`.
//!
//! The document is the contract outside tools check the server against
//! (`tests/api_contract.rs` runs a validator and a fuzzer on it), so it declares security
//! as this server applies it: `openapi.json` holds none, and when an API token is
//! configured the served document requires it (bearer, or HTTP basic with the token as
//! password) of every operation that needs it by [`super::auth::needs_token`], with its 401
//! answer. Without a token it requires nothing, and says so.

use std::sync::OnceLock;

use axum::extract::State;
use axum::http::{header, Method};
use axum::response::IntoResponse;
use serde_json::{json, Value};

use super::auth::{needs_token, REALM};

/// The OpenAPI document as written (JSON text), without security requirements: what a
/// server without an API token serves, but for a sentence of its description.
pub const OPENAPI_JSON: &str = include_str!("openapi.json");

/// `GET /openapi.json`: the document for this server, with or without the token.
pub(super) async fn document(State(state): State<super::Shared>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        served(state.api_token.is_some()),
    )
}

/// The served document's text, built once for each case.
fn served(token: bool) -> &'static str {
    static DOCS: OnceLock<[String; 2]> = OnceLock::new();
    let docs = DOCS.get_or_init(|| [with_security(false), with_security(true)]);
    &docs[usize::from(token)]
}

/// The document for a server that has (`token`) or has not an API token.
fn with_security(token: bool) -> String {
    let mut doc: Value = serde_json::from_str(OPENAPI_JSON).expect("openapi.json is JSON (tested)");
    let sentence = if token {
        " This server has an API token: every request but GET, HEAD and OPTIONS needs it, as \
         Authorization: Bearer <token> or as the password of HTTP basic (any user name); \
         without it the answer is 401. The document served by a server without a token \
         declares no security."
    } else {
        " This server has no API token (api_token): no request needs one, and this document \
         declares no security. A server with a token serves a document requiring it of every \
         request but GET, HEAD and OPTIONS."
    };
    if let Some(Value::String(d)) = doc.pointer_mut("/info/description") {
        d.push_str(sentence);
    }
    if !token {
        return doc.to_string();
    }
    doc["components"]["securitySchemes"] = json!({
        "bearer": {"type": "http", "scheme": "bearer", "description": "the API token"},
        "basic": {"type": "http", "scheme": "basic",
                  "description": format!("any user name, the API token as password (realm {REALM:?})")},
    });
    let unauthorized = json!({
        "description": "no token or a wrong one: the answer carries the challenges Bearer and Basic",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    });
    if let Some(Value::Object(paths)) = doc.get_mut("paths") {
        for item in paths.values_mut().filter_map(Value::as_object_mut) {
            for (method, op) in item.iter_mut() {
                // The keys of a path item that are operations, not `parameters` or `summary`.
                const METHODS: [&str; 8] = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];
                if !METHODS.contains(&method.as_str()) {
                    continue;
                }
                let Ok(m) = Method::from_bytes(method.to_ascii_uppercase().as_bytes()) else {
                    continue;
                };
                if !needs_token(&m) || !op.is_object() {
                    continue;
                }
                op["security"] = json!([{"bearer": []}, {"basic": []}]);
                op["responses"]["401"] = unauthorized.clone();
            }
        }
    }
    doc.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn security_follows_the_token() {
        let open: Value = serde_json::from_str(served(false)).unwrap();
        let closed: Value = serde_json::from_str(served(true)).unwrap();
        assert!(!served(false).contains("\"security\""));
        assert!(open.pointer("/components/securitySchemes").is_none());
        assert_eq!(
            closed.pointer("/paths/~1queues/post/security/0/bearer"),
            Some(&json!([]))
        );
        assert!(closed.pointer("/paths/~1queues/post/responses/401").is_some());
        assert!(closed.pointer("/paths/~1queues/get/security").is_none());
    }
}
