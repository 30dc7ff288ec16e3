//! `fetch`: sends one HTTP request and prints `{"status", "bytes", "body"}` on stdout.
//!
//! Params: `url` (required), `method` (default `GET`), `body` (text to send), `headers` (an
//! object of strings). Succeeds on a 2xx status. The queue's sandbox must list the host:
//! `"sandbox": {"http": ["api.example.com"]}`.

use std::collections::BTreeMap;

use disbatch_plugin::{http, SUCCEEDED};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    url: String,
    #[serde(default = "get")]
    method: String,
    #[serde(default)]
    body: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

fn get() -> String {
    "GET".into()
}

fn run(p: Params) -> Result<u32, String> {
    let headers: Vec<(&str, &str)> = p.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let r = http::send(&p.method, &p.url, &headers, p.body.as_bytes())?;
    let text = r.text();
    let shown: String = text.chars().take(1000).collect();
    println!(
        "{}",
        serde_json::json!({"status": r.status, "bytes": r.body.len(), "body": shown})
    );
    if r.is_success() {
        Ok(SUCCEEDED)
    } else {
        Err(format!("{} {} answered HTTP {}", p.method, p.url, r.status))
    }
}

disbatch_plugin::plugin!(run);
