//! [`Client`]: the DCI over HTTP, with its credentials (a bearer token, or HTTP basic as
//! Disbatch 4's CLI sends them), its TLS settings, and `{"error"}` bodies turned into
//! [`CliError::Api`].

use std::path::PathBuf;

use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::CliError;

/// The response header holding the cursor of the next page of `GET /tasks`.
const NEXT_HEADER: &str = "disbatch-next";

/// How a [`Client`] authenticates and checks the server's certificate.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ClientOptions {
    /// Sent as `Authorization: Bearer`.
    pub token: Option<String>,
    /// User name and password sent as `Authorization: Basic` (realm `disbatch`), instead of
    /// the token.
    pub basic: Option<(String, String)>,
    /// PEM file of the certificate authorities to trust for an `https` URL (added to the
    /// built-in ones).
    pub ca_file: Option<PathBuf>,
    /// Accept any server certificate (no verification).
    pub accept_invalid_certs: bool,
}

impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientOptions")
            .field("token", &self.token.as_ref().map(|_| "<hidden>"))
            .field("basic", &self.basic.as_ref().map(|(u, _)| (u, "<hidden>")))
            .field("ca_file", &self.ca_file)
            .field("accept_invalid_certs", &self.accept_invalid_certs)
            .finish()
    }
}

/// An HTTP client of one DCI.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    options: ClientOptions,
}

impl Client {
    /// A client of the DCI at `base` (e.g. `http://localhost:8080`).
    pub fn new(base: &str, options: ClientOptions) -> Result<Client, CliError> {
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(CliError::Usage(format!(
                "--url {base:?} must start with http:// or https://"
            )));
        }
        if let Err(e) = reqwest::Url::parse(base) {
            return Err(CliError::Usage(format!("--url {base:?} is not a valid URL: {e}")));
        }
        let base = base.trim_end_matches('/').to_owned();
        let mut builder = reqwest::Client::builder().user_agent(concat!("disbatch-cli/", env!("CARGO_PKG_VERSION")));
        if let Some(path) = &options.ca_file {
            let pem = std::fs::read(path)
                .map_err(|e| CliError::Usage(format!("cannot read the CA file {}: {e}", path.display())))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .ok()
                .filter(|c| !c.is_empty())
                .ok_or_else(|| {
                    CliError::Usage(format!(
                        "the CA file {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                        path.display()
                    ))
                })?;
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        if options.accept_invalid_certs {
            builder = builder.danger_accept_invalid_certs(true);
        }
        let http = builder.build().map_err(|e| CliError::Http(e.to_string()))?;
        Ok(Client { http, base, options })
    }

    /// Sends a request and returns the JSON answer (or the text as a JSON string).
    pub async fn call(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Value, CliError> {
        // Our own answer shapes, not Disbatch 4's (docs/api.md, "Answer shapes").
        let mut req = self.request(method, path).header("disbatch-shape", "native");
        if let Some(b) = body {
            req = req.json(b);
        }
        self.send(req).await.map(|(v, _)| v)
    }

    /// `GET path` and the cursor of the next page (the `disbatch-next` header), if any.
    pub async fn get_page(&self, path: &str) -> Result<(Value, Option<String>), CliError> {
        self.send(self.request(Method::GET, path)).await
    }

    /// `POST path` with `bytes` as the body, declared as `content_type`, and the user
    /// running the command as `X-Disbatch-User`.
    pub async fn post_bytes(&self, path: &str, content_type: &str, bytes: Vec<u8>) -> Result<Value, CliError> {
        let mut req = self
            .request(Method::POST, path)
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(bytes);
        if let Some(user) = local_user() {
            req = req.header("x-disbatch-user", user);
        }
        self.send(req).await.map(|(v, _)| v)
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let url = format!("{}{path}", self.base);
        let req = self.http.request(method, &url);
        // Sent with the first request: no round trip for a challenge.
        match (&self.options.basic, &self.options.token) {
            (Some((user, password)), _) => req.basic_auth(user, Some(password)),
            (None, Some(t)) => req.bearer_auth(t),
            (None, None) => req,
        }
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<(Value, Option<String>), CliError> {
        let resp = req
            .send()
            .await
            .map_err(|e| CliError::Http(format!("cannot reach {}: {e}", self.base)))?;
        let status = resp.status();
        let next = resp
            .headers()
            .get(NEXT_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let text = resp.text().await.map_err(|e| CliError::Http(e.to_string()))?;
        let value = serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text));
        if status.is_success() {
            return Ok((value, next));
        }
        let message = value
            .get("error")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| value.to_string());
        let hint = match (status, &self.options.basic) {
            (StatusCode::UNAUTHORIZED, None) => {
                " (give --token or set DISBATCH_TOKEN, or --username and --password with the token as password)"
            }
            (StatusCode::UNAUTHORIZED, Some(_)) => " (the --password is not the server's api_token)",
            _ => "",
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

/// `user@host` of whoever runs the command (`$USER`, else `uid<N>`).
fn local_user() -> Option<String> {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .ok()
        .filter(|u| !u.is_empty())
        // SAFETY: getuid(2) has no preconditions and cannot fail.
        .unwrap_or_else(|| format!("uid{}", unsafe { libc::getuid() }));
    let host = gethostname::gethostname();
    Some(format!("{user}@{}", host.to_string_lossy())).filter(|u| u.bytes().all(|b| b.is_ascii_graphic()))
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
