//! The DCI's HTTP settings: how many connections it serves, how long it waits for a
//! client, which `Host` names it answers to and which other origins may write.

use std::time::Duration;

use serde_json::Value;

use super::{describe, ConfigError, Parser};

/// Default `http_max_connections`.
pub const DEFAULT_HTTP_MAX_CONNECTIONS: usize = 4096;
/// Largest `http_max_connections`.
pub const MAX_HTTP_CONNECTIONS: u64 = 1_000_000;
/// Default `http_header_timeout`.
pub const DEFAULT_HTTP_HEADER_TIMEOUT: Duration = Duration::from_secs(20);
/// Default `http_idle_timeout`.
pub const DEFAULT_HTTP_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default `http_body_timeout`.
pub const DEFAULT_HTTP_BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// The DCI's HTTP settings (top-level keys `http_*`, `allowed_hosts`, `cors_origins`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpSettings {
    /// Most client connections served at once (`http_max_connections`); fewer when the
    /// open-files limit leaves no room for them.
    pub max_connections: usize,
    /// A client must send a complete request head within this (`http_header_timeout`).
    pub header_timeout: Duration,
    /// A keep-alive connection with no request in progress is closed after this
    /// (`http_idle_timeout`).
    pub idle_timeout: Duration,
    /// Longest pause in a request body, and the grace before its minimum rate applies
    /// (`http_body_timeout`).
    pub body_timeout: Duration,
    /// More `Host` names the DCI answers to (`allowed_hosts`; `"*"` for any), lowercase.
    pub allowed_hosts: Vec<String>,
    /// Origins of other sites allowed to call the API from a browser (`cors_origins`;
    /// `"*"` for any).
    pub cors_origins: Vec<String>,
}

impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings {
            max_connections: DEFAULT_HTTP_MAX_CONNECTIONS,
            header_timeout: DEFAULT_HTTP_HEADER_TIMEOUT,
            idle_timeout: DEFAULT_HTTP_IDLE_TIMEOUT,
            body_timeout: DEFAULT_HTTP_BODY_TIMEOUT,
            allowed_hosts: Vec::new(),
            cors_origins: Vec::new(),
        }
    }
}

impl Parser<'_> {
    pub(super) fn http(&self) -> Result<HttpSettings, ConfigError> {
        let max_connections = match self.get("http_max_connections") {
            None => DEFAULT_HTTP_MAX_CONNECTIONS,
            Some(v) => self.integer("http_max_connections", v, 1, MAX_HTTP_CONNECTIONS)? as usize,
        };
        let allowed_hosts = self.array("allowed_hosts", "host names", |p, key, v| {
            let host = v.as_str().map(|s| s.trim().trim_end_matches('.').to_ascii_lowercase());
            match host {
                Some(h) if h == "*" => Ok(h),
                Some(h) if !h.is_empty() && h.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) => {
                    Ok(h)
                }
                _ => Err(p.invalid(
                    key,
                    format!(
                        "must be a host name without scheme or port (e.g. \"disbatch.example.com\"), or \"*\" for any, got {}",
                        describe(v)
                    ),
                )),
            }
        })?;
        let cors_origins = self.array("cors_origins", "origins", |p, key, v| match v {
            Value::String(s) if s == "*" => Ok(s.clone()),
            Value::String(s)
                if (s.starts_with("http://") || s.starts_with("https://"))
                    && s.split_once("://")
                        .is_some_and(|(_, a)| !a.is_empty() && !a.contains('/')) =>
            {
                Ok(s.to_ascii_lowercase())
            }
            _ => Err(p.invalid(
                key,
                format!(
                    "must be an origin \"http[s]://host[:port]\" without a path, or \"*\" for any, got {}",
                    describe(v)
                ),
            )),
        })?;
        Ok(HttpSettings {
            max_connections,
            header_timeout: self.seconds("http_header_timeout", DEFAULT_HTTP_HEADER_TIMEOUT)?,
            idle_timeout: self.seconds("http_idle_timeout", DEFAULT_HTTP_IDLE_TIMEOUT)?,
            body_timeout: self.seconds("http_body_timeout", DEFAULT_HTTP_BODY_TIMEOUT)?,
            allowed_hosts,
            cors_origins,
        })
    }
}
