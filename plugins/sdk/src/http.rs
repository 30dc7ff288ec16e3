//! Outgoing HTTP requests (`wasi:http`), blocking and small.
//!
//! The host refuses every request unless the queue's sandbox lists its host, e.g.
//! `"http": ["api.example.com", "https://*.corp:8443"]` (`runner exec --http HOST`). A
//! refused request is an [`HttpError`] naming the `wasi:http` error code
//! (`http-request-denied`, `destination-ip-prohibited`…), and the task's stderr gets a
//! `[disbatch: …]` line saying what to list. Requests count against the task's limits: their
//! number (`http_max_requests`), their body bytes (`http_max_body_mib`) and its timeout.
//!
//! ```ignore
//! let r = disbatch_plugin::http::get("https://api.example.com/v1/items")?;
//! println!("{} {}", r.status, r.text());
//! ```

use std::fmt;

use wasip2::http::outgoing_handler;
use wasip2::http::types::{ErrorCode, Fields, Method, OutgoingBody, OutgoingRequest, Scheme};
use wasip2::io::streams::StreamError;

/// An HTTP response, its body read whole.
#[derive(Debug, Clone)]
pub struct Response {
    /// The status code, e.g. 200.
    pub status: u16,
    /// The headers, names in lower case, in the order received.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// The body as text (invalid UTF-8 replaced with U+FFFD).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Why a request failed: the method, the URL and the reason.
#[derive(Debug, Clone)]
pub struct HttpError {
    /// The request's method.
    pub method: String,
    /// The request's URL.
    pub url: String,
    /// The reason, e.g. `http-request-denied`.
    pub reason: String,
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} failed: {}", self.method, self.url, self.reason)
    }
}

impl std::error::Error for HttpError {}

impl From<HttpError> for String {
    fn from(e: HttpError) -> String {
        e.to_string()
    }
}

/// Sends a GET request to `url`.
pub fn get(url: &str) -> Result<Response, HttpError> {
    send("GET", url, &[], &[])
}

/// Sends a request and reads the whole response.
pub fn send(method: &str, url: &str, headers: &[(&str, &str)], body: &[u8]) -> Result<Response, HttpError> {
    let fail = |reason: String| HttpError {
        method: method.to_owned(),
        url: url.to_owned(),
        reason,
    };
    let (scheme, authority, path) = split_url(url).map_err(fail)?;
    let fields: Vec<(String, Vec<u8>)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
        .collect();
    let fields = Fields::from_list(&fields).map_err(|e| fail(format!("invalid header: {e:?}")))?;
    let request = OutgoingRequest::new(fields);
    let method_value = match method.to_ascii_uppercase().as_str() {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        "PATCH" => Method::Patch,
        "OPTIONS" => Method::Options,
        other => Method::Other(other.to_owned()),
    };
    let set = |ok: Result<(), ()>, what: &str| ok.map_err(|()| fail(format!("invalid {what}")));
    set(request.set_method(&method_value), "method")?;
    set(request.set_scheme(Some(&scheme)), "scheme")?;
    set(request.set_authority(Some(&authority)), "host")?;
    set(request.set_path_with_query(Some(&path)), "path")?;
    let outgoing = request.body().map_err(|()| fail("no request body".into()))?;
    // Hand the request over first, then write its body: the host reads it as it is sent.
    let pending = outgoing_handler::handle(request, None).map_err(|e| fail(reason(&e)))?;
    {
        let stream = outgoing.write().map_err(|()| fail("no request body stream".into()))?;
        for chunk in body.chunks(4096) {
            stream
                .blocking_write_and_flush(chunk)
                .map_err(|e| fail(stream_reason(e, "sending the body")))?;
        }
    }
    OutgoingBody::finish(outgoing, None).map_err(|e| fail(reason(&e)))?;
    let response = loop {
        match pending.get() {
            Some(Ok(Ok(r))) => break r,
            Some(Ok(Err(e))) => return Err(fail(reason(&e))),
            Some(Err(())) => return Err(fail("the response was already taken".into())),
            None => pending.subscribe().block(),
        }
    };
    let status = response.status();
    let headers = response
        .headers()
        .entries()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
        .collect();
    let incoming = response.consume().map_err(|()| fail("no response body".into()))?;
    let mut data = Vec::new();
    {
        let stream = incoming.stream().map_err(|()| fail("no response body stream".into()))?;
        loop {
            match stream.blocking_read(64 * 1024) {
                Ok(bytes) => data.extend_from_slice(&bytes),
                Err(StreamError::Closed) => break,
                Err(e) => return Err(fail(stream_reason(e, "reading the body"))),
            }
        }
    }
    drop(incoming);
    Ok(Response {
        status,
        headers,
        body: data,
    })
}

/// `scheme://authority/path?query` → its parts (the path defaults to `/`).
fn split_url(url: &str) -> Result<(Scheme, String, String), String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("invalid URL {url:?}: expected http://host/path or https://host/path"))?;
    let scheme = match scheme.to_ascii_lowercase().as_str() {
        "http" => Scheme::Http,
        "https" => Scheme::Https,
        other => return Err(format!("invalid URL {url:?}: scheme {other:?} is not http or https")),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.is_empty() {
        return Err(format!("invalid URL {url:?}: no host"));
    }
    let path = path.split('#').next().unwrap_or_default();
    let path = match path {
        "" => "/".to_owned(),
        p if p.starts_with('?') => format!("/{p}"),
        p => p.to_owned(),
    };
    Ok((scheme, authority.to_owned(), path))
}

fn stream_reason(e: StreamError, doing: &str) -> String {
    match e {
        StreamError::Closed => format!("the connection closed while {doing}"),
        StreamError::LastOperationFailed(err) => match wasip2::http::types::http_error_code(&err) {
            Some(code) => reason(&code),
            None => format!("{doing} failed: {}", err.to_debug_string()),
        },
    }
}

/// The error code as its WIT name, e.g. `http-request-denied`.
fn reason(e: &ErrorCode) -> String {
    let name = match e {
        ErrorCode::DnsTimeout => "dns-timeout",
        ErrorCode::DnsError(p) => return format!("dns-error ({})", p.rcode.clone().unwrap_or_default()),
        ErrorCode::DestinationNotFound => "destination-not-found",
        ErrorCode::DestinationUnavailable => "destination-unavailable",
        ErrorCode::DestinationIpProhibited => "destination-ip-prohibited",
        ErrorCode::DestinationIpUnroutable => "destination-ip-unroutable",
        ErrorCode::ConnectionRefused => "connection-refused",
        ErrorCode::ConnectionTerminated => "connection-terminated",
        ErrorCode::ConnectionTimeout => "connection-timeout",
        ErrorCode::ConnectionReadTimeout => "connection-read-timeout",
        ErrorCode::ConnectionWriteTimeout => "connection-write-timeout",
        ErrorCode::ConnectionLimitReached => "connection-limit-reached",
        ErrorCode::TlsProtocolError => "tls-protocol-error",
        ErrorCode::TlsCertificateError => "tls-certificate-error",
        ErrorCode::HttpRequestDenied => "http-request-denied",
        ErrorCode::HttpRequestBodySize(_) => "http-request-body-size",
        ErrorCode::HttpRequestUriInvalid => "http-request-uri-invalid",
        ErrorCode::HttpRequestMethodInvalid => "http-request-method-invalid",
        ErrorCode::HttpResponseIncomplete => "http-response-incomplete",
        ErrorCode::HttpResponseBodySize(_) => "http-response-body-size",
        ErrorCode::HttpResponseTimeout => "http-response-timeout",
        ErrorCode::HttpProtocolError => "http-protocol-error",
        ErrorCode::InternalError(m) => return format!("internal-error: {}", m.clone().unwrap_or_default()),
        other => return format!("{other:?}"),
    };
    name.to_owned()
}
