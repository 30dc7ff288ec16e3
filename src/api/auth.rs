//! The API token: when `api_token` is set, every write needs it, as
//! `Authorization: Bearer <token>` or, for Disbatch 4's `disbatch --username --password`
//! and other HTTP basic clients, as the password of `Authorization: Basic` (any user name).
//! A refused write is a 401 carrying both challenges, `Bearer` and
//! `Basic realm="disbatch"`: LWP (Disbatch 4's CLI) sends its credentials for realm
//! `disbatch` only after such a challenge.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;

use super::{ApiError, Shared};

/// The realm of the `Basic` challenge, the one Disbatch 4's CLI gives its credentials for.
pub const REALM: &str = "disbatch";

/// Refuses writes without the configured token with 401; reads are always allowed.
pub(super) async fn require_token(State(state): State<Shared>, request: Request, next: Next) -> Response {
    let Some(token) = state.api_token.as_deref() else {
        return next.run(request).await;
    };
    if !needs_token(request.method()) {
        return next.run(request).await;
    }
    match given_token(request.headers()) {
        Some(g) if constant_time_eq(g.as_bytes(), token.as_bytes()) => next.run(request).await,
        _ => {
            let mut response = ApiError::Unauthorized.into_response();
            if let Ok(challenge) = HeaderValue::from_str(&format!("Basic realm=\"{REALM}\"")) {
                response.headers_mut().append(header::WWW_AUTHENTICATE, challenge);
            }
            response
        }
    }
}

/// Whether a request of `method` needs the token when one is configured: every write, that
/// is every method but GET, HEAD and OPTIONS. The OpenAPI document declares its security
/// requirement by the same rule (`openapi`).
pub(super) fn needs_token(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Whether a request with `headers` may see secrets: no token is configured, or it carries
/// the configured one (as a write must).
pub(super) fn authorized(state: &Shared, headers: &HeaderMap) -> bool {
    match state.api_token.as_deref() {
        None => true,
        Some(token) => given_token(headers).is_some_and(|g| constant_time_eq(g.as_bytes(), token.as_bytes())),
    }
}

/// The token of an `Authorization` header: a bearer token, or a basic password.
fn given_token(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, rest) = value.split_once(' ')?;
    let rest = rest.trim();
    if scheme.eq_ignore_ascii_case("bearer") {
        return Some(rest.to_owned());
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let decoded = base64::engine::general_purpose::STANDARD.decode(rest).ok()?;
        let text = String::from_utf8(decoded).ok()?;
        // `user:password`; the password may itself hold colons.
        return text.split_once(':').map(|(_, password)| password.to_owned());
    }
    None
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
    use super::*;

    #[test]
    fn compares() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }

    fn with(value: &str) -> Option<String> {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        given_token(&h)
    }

    #[test]
    fn reads_bearer_and_basic() {
        assert_eq!(with("Bearer s3cret").as_deref(), Some("s3cret"));
        assert_eq!(with("bearer  s3cret ").as_deref(), Some("s3cret"));
        let basic = |s: &str| format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(s));
        assert_eq!(with(&basic("anyone:s3cret")).as_deref(), Some("s3cret"));
        assert_eq!(with(&basic(":a:b")).as_deref(), Some("a:b"));
        assert_eq!(with(&basic("no-colon")), None);
        assert_eq!(with("Basic !!!"), None);
        assert_eq!(with("Digest x"), None);
        assert_eq!(with("s3cret"), None);
        assert_eq!(REALM, "disbatch");
    }
}
