//! The bearer token: when `api_token` is set, every write needs `Authorization: Bearer <token>`.

use axum::extract::{Request, State};
use axum::http::{header, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{ApiError, Shared};

/// Refuses writes without the configured token with 401; reads are always allowed.
pub(super) async fn require_token(State(state): State<Shared>, request: Request, next: Next) -> Response {
    let Some(token) = state.api_token.as_deref() else {
        return next.run(request).await;
    };
    if matches!(*request.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        return next.run(request).await;
    }
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim);
    match given {
        Some(g) if constant_time_eq(g.as_bytes(), token.as_bytes()) => next.run(request).await,
        _ => ApiError::Unauthorized.into_response(),
    }
}

/// Compares without returning early on the first difference.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn compares() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
