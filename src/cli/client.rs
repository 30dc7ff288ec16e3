//! [`Client`]: the DCI over HTTP, with the bearer token and `{"error"}` bodies turned into
//! [`CliError::Api`].

use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::CliError;

/// An HTTP client of one DCI.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Client {
    /// A client of the DCI at `base` (e.g. `http://localhost:8080`).
    pub fn new(base: &str, token: Option<String>) -> Result<Client, CliError> {
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(CliError::Usage(format!(
                "--url {base:?} must start with http:// or https://"
            )));
        }
        if let Err(e) = reqwest::Url::parse(base) {
            return Err(CliError::Usage(format!("--url {base:?} is not a valid URL: {e}")));
        }
        let base = base.trim_end_matches('/').to_owned();
        let http = reqwest::Client::builder()
            .user_agent(concat!("disbatch-cli/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| CliError::Http(e.to_string()))?;
        Ok(Client { http, base, token })
    }

    /// Sends a request and returns the JSON answer (or the text as a JSON string).
    pub async fn call(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Value, CliError> {
        let url = format!("{}{path}", self.base);
        let mut req = self.http.request(method, &url);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| CliError::Http(format!("cannot reach {}: {e}", self.base)))?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| CliError::Http(e.to_string()))?;
        let value = serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text));
        if status.is_success() {
            return Ok(value);
        }
        let message = value
            .get("error")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| value.to_string());
        let hint = if status == StatusCode::UNAUTHORIZED {
            " (give --token or set DISBATCH_TOKEN)"
        } else {
            ""
        };
        Err(CliError::Api {
            status: status.as_u16(),
            message: format!("{message}{hint}"),
        })
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Result<Value, CliError> {
        self.call(Method::GET, path, None).await
    }

    /// `POST path` with a JSON body.
    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, CliError> {
        self.call(Method::POST, path, Some(body)).await
    }

    /// `DELETE path`.
    pub async fn delete(&self, path: &str) -> Result<Value, CliError> {
        self.call(Method::DELETE, path, None).await
    }
}

/// Percent-encodes one path segment or query value.
pub fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
