//! Which requests the DCI answers, against DNS rebinding and cross-site writes:
//!
//! - the `Host` of every request must be one the DCI answers to ([`AllowedHosts`]): an IP
//!   literal, `localhost` (or a name under `.localhost`), the machine's hostname, the host
//!   of the bind address, or a name of the config's `allowed_hosts` (`"*"`: any). A web
//!   page whose own name an attacker pointed at 127.0.0.1 sends its own name as `Host`,
//!   and is refused;
//! - a write (any method but GET, HEAD and OPTIONS) whose `Origin` (browsers send it on
//!   every cross-site POST or DELETE) is not the request's own scheme, host and port
//!   must come from one of `cors_origins` ([`same_origin`] is the comparison, which the
//!   form check of `form` uses too).
//!
//! Both are refused with 403 and a JSON error naming the header and the config key.
//! Clients that are not browsers (the `disbatch` CLI, Disbatch 4's tools, curl) send an
//! IP or the name they were given as `Host` and no `Origin`.

use std::net::IpAddr;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{ApiError, Shared};

/// The `Host` names a DCI answers to besides IP literals and `localhost`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedHosts {
    any: bool,
    names: Vec<String>,
}

impl AllowedHosts {
    /// The default names (`localhost`, the machine's hostname) and `more` (lowercase
    /// names; `"*"` allows any host).
    pub fn new<I: IntoIterator<Item = String>>(more: I) -> AllowedHosts {
        let mut hosts = AllowedHosts::default();
        hosts.add(gethostname::gethostname().to_string_lossy().into_owned());
        for name in more {
            hosts.add(name);
        }
        hosts
    }

    /// Adds `name` (`"*"`: any host).
    pub fn add(&mut self, name: String) {
        let name = normal(&name);
        if name == "*" {
            self.any = true;
        } else if !name.is_empty() && !self.names.contains(&name) {
            self.names.push(name);
        }
    }

    /// Whether a request with `Host: host` (the port, if any, included) is answered.
    pub fn allows(&self, host: &str) -> bool {
        if self.any {
            return true;
        }
        let name = normal(host_part(host));
        name.parse::<IpAddr>().is_ok()
            || name == "localhost"
            || name.ends_with(".localhost")
            || self.names.contains(&name)
    }
}

/// Lowercase, without a trailing dot.
fn normal(name: &str) -> String {
    name.trim().trim_end_matches('.').to_ascii_lowercase()
}

/// The host of `host[:port]` (an IPv6 literal without its brackets).
fn host_part(authority: &str) -> &str {
    let authority = authority.trim();
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split_once(']').map_or(rest, |(v6, _)| v6);
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    }
}

/// The request's `Host` header, else the authority of an absolute request URI, lowercase.
pub(super) fn request_host(headers: &HeaderMap, uri: &Uri) -> Option<String> {
    headers
        .get(header::HOST)
        .map(|h| String::from_utf8_lossy(h.as_bytes()).trim().to_ascii_lowercase())
        .or_else(|| uri.authority().map(|a| a.as_str().to_ascii_lowercase()))
}

/// Whether `origin` (an `Origin` header: `scheme://host[:port]`) is the site of a request
/// to `host` (its `Host`): the same host and port, the scheme's default port implied.
pub(super) fn same_origin(origin: &str, host: &str) -> bool {
    let origin = origin.trim().to_ascii_lowercase();
    let Some((scheme, authority)) = origin
        .split_once("://")
        .filter(|(_, a)| !a.is_empty() && !a.contains('/'))
    else {
        return false;
    };
    without_default_port(scheme, authority) == without_default_port(scheme, &host.trim().to_ascii_lowercase())
}

/// `host:port` without the scheme's default port.
fn without_default_port(scheme: &str, authority: &str) -> String {
    let default = match scheme {
        "http" => ":80",
        "https" => ":443",
        _ => return authority.to_owned(),
    };
    authority.strip_suffix(default).unwrap_or(authority).to_owned()
}

/// Refuses (403) a request whose `Host` the DCI does not answer to, and a write from a
/// browser on another site that `cors_origins` does not allow.
pub(super) async fn check_host_and_origin(State(state): State<Shared>, request: Request, next: Next) -> Response {
    match check(&state, request.method(), request.headers(), request.uri()) {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

fn check(state: &super::ApiState, method: &Method, headers: &HeaderMap, uri: &Uri) -> Result<(), ApiError> {
    let host = request_host(headers, uri);
    if let Some(host) = &host {
        if !state.allowed_hosts.allows(host) {
            return Err(ApiError::Forbidden(format!(
                "this DCI does not answer to the name in the Host header ({host:?}): a web page could use such a \
                 name to reach it (DNS rebinding). Use its address or localhost, or add the name to the config key \
                 \"allowed_hosts\" (\"*\" allows any, e.g. behind a proxy that checks it)"
            )));
        }
    }
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return Ok(());
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = String::from_utf8_lossy(origin.as_bytes()).trim().to_ascii_lowercase();
    if host.as_deref().is_some_and(|h| same_origin(&origin, h))
        || state
            .cors_origins
            .iter()
            .any(|o| o == "*" || o.eq_ignore_ascii_case(&origin))
    {
        return Ok(());
    }
    Err(ApiError::Forbidden(format!(
        "a write from another site is refused: the Origin header ({origin:?}) is not this DCI's own origin \
         (Host {}) nor one of the config key \"cors_origins\"",
        host.as_deref().map_or("not given".to_owned(), |h| format!("{h:?}"))
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts() {
        let h = AllowedHosts::new(["Disbatch.Example.com.".to_owned()]);
        for ok in [
            "127.0.0.1:8080",
            "10.1.2.3",
            "[::1]:8080",
            "[fe80::1]",
            "localhost:8080",
            "LOCALHOST",
            "app.localhost:1",
            "disbatch.example.com:8080",
            "disbatch.example.com.",
        ] {
            assert!(h.allows(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "127.0.0.1.evil.example",
            "localhost.evil",
            "",
        ] {
            assert!(!h.allows(bad), "{bad}");
        }
        assert!(AllowedHosts::new(["*".to_owned()]).allows("evil.example"));
    }

    #[test]
    fn origins() {
        assert!(same_origin("http://localhost:8080", "localhost:8080"));
        assert!(same_origin("https://example.com:443", "Example.com"));
        assert!(!same_origin("http://evil.example", "localhost:8080"));
        assert!(!same_origin("http://localhost:8081", "localhost:8080"));
        assert!(!same_origin("null", "localhost:8080"));
    }
}
