//! Outgoing HTTP requests through the host's `wasi:http`, blocking and small.
//!
//! ```ignore
//! use disbatch_plugin::http;
//!
//! fn run(_: serde_json::Value) -> Result<u32, String> {
//!     let r = http::get("https://api.example.com/v1/items")?;
//!     println!("{} {}", r.status, r.text());
//!     Ok(disbatch_plugin::SUCCEEDED)
//! }
//! ```
//!
//! # What the host allows
//!
//! - The host denies every request unless the queue's sandbox `http` list names the
//!   request's host, e.g. `"http": ["api.example.com", "https://*.corp:8443"]`
//!   (`runner exec --http HOST`). A refused request returns an [`HttpError`] whose
//!   [`code`](HttpError::code) is `http-request-denied` (or `destination-ip-prohibited` for
//!   a name that resolves to an internal address), and the task's stderr gets a
//!   `[disbatch: …]` line saying what to list. The task goes on and decides what to do.
//! - Requests count against the task's limits: their number (`http_max_requests`), their
//!   body bytes, sent and received (`http_max_body_mib`), and the task's timeout, which
//!   also ends a request waiting for a response. [`Response::body`] is held in the task's
//!   memory.
//! - Only `http://` and `https://` URLs are accepted. Redirects are not followed. The host
//!   sets `host` and refuses the headers it reserves (`connection`, `transfer-encoding`,
//!   `upgrade`, …) with an error naming the header.
//!
//! A response with any status, 4xx and 5xx included, is an `Ok(`[`Response`]`)`; an
//! [`HttpError`] means no complete response was received. `HttpError` converts into the
//! `String` a plugin returns, so `?` works in `run`.

use std::fmt;

use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    ErrorCode, Fields, HeaderError, IncomingBody, IncomingResponse, Method, OutgoingBody, OutgoingRequest, Scheme,
};
use wasip2::io::streams::{InputStream, OutputStream, StreamError};

/// How many bytes one read of the response body asks for.
const READ_CHUNK: u64 = 64 * 1024;

/// A response: its status, headers and whole body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The HTTP status, e.g. 200.
    pub status: u16,
    /// The headers in the order received, names in lowercase; values that are not UTF-8
    /// are converted lossily.
    pub headers: Vec<(String, String)>,
    /// The body, complete.
    pub body: Vec<u8>,
}

impl Response {
    /// The body as text, invalid UTF-8 replaced by U+FFFD.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The value of the first header called `name` (compared case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// Why a request got no response.
///
/// Its message names the method, the URL and the reason, e.g.
/// `GET http://127.0.0.1:9/x refused: http-request-denied` (the host would not send it) or
/// `GET http://127.0.0.1:9/x failed: connection-refused` (it was sent and failed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    method: String,
    url: String,
    stage: Stage,
    code: Option<&'static str>,
    reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// The request could not be built: a bad URL, method or header.
    Invalid,
    /// The host would not send it.
    Refused,
    /// It was sent and failed.
    Failed,
}

impl HttpError {
    fn new(method: &str, url: &str, stage: Stage, reason: impl Into<String>) -> Self {
        HttpError {
            method: method.to_string(),
            url: url.to_string(),
            stage,
            code: None,
            reason: reason.into(),
        }
    }

    /// An error from an `error-code`: the host's refusals (the sandbox's list, an internal
    /// address, the task's request limit) read as refused wherever they were reported.
    fn from_code(method: &str, url: &str, stage: Stage, code: &ErrorCode) -> Self {
        let stage = match code {
            ErrorCode::HttpRequestDenied | ErrorCode::DestinationIpProhibited | ErrorCode::ConnectionLimitReached => {
                Stage::Refused
            }
            _ => stage,
        };
        HttpError {
            code: Some(code_name(code)),
            ..HttpError::new(method, url, stage, describe_code(code))
        }
    }

    /// The request's method.
    pub fn method(&self) -> &str {
        &self.method
    }

    /// The request's URL, as given.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The WASI `error-code` case in lowercase kebab-case (`http-request-denied`,
    /// `destination-ip-prohibited`, `connection-refused`, `dns-error`, …), when the host
    /// reported one.
    pub fn code(&self) -> Option<&str> {
        self.code
    }
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (method, url, reason) = (&self.method, &self.url, &self.reason);
        match self.stage {
            Stage::Invalid => write!(f, "{method} {url}: {reason}"),
            Stage::Refused => write!(f, "{method} {url} refused: {reason}"),
            Stage::Failed => write!(f, "{method} {url} failed: {reason}"),
        }
    }
}

impl std::error::Error for HttpError {}

impl From<HttpError> for String {
    fn from(e: HttpError) -> String {
        e.to_string()
    }
}

/// Sends a `GET` request to `url` and returns the response.
pub fn get(url: &str) -> Result<Response, HttpError> {
    send("GET", url, &[], &[])
}

/// Sends a request and returns the response.
///
/// `method` is matched case-insensitively against the standard methods (any other is sent
/// as given); `url` is `http://` or `https://`, host, optional port, path and query (a
/// `#fragment` is dropped); `headers` are name-value pairs. A non-empty `body` gets a
/// `content-length` header unless `headers` has one.
pub fn send(method: &str, url: &str, headers: &[(&str, &str)], body: &[u8]) -> Result<Response, HttpError> {
    let (wasi_method, method) = parse_method(method);
    let invalid = |reason: String| HttpError::new(&method, url, Stage::Invalid, reason);
    let failed = |reason: String| HttpError::new(&method, url, Stage::Failed, reason);
    let failed_code = |code: &ErrorCode| HttpError::from_code(&method, url, Stage::Failed, code);

    let target = parse_url(url).map_err(|e| invalid(format!("invalid URL: {e}")))?;
    let fields = build_headers(headers, body.len()).map_err(invalid)?;
    let request = OutgoingRequest::new(fields);
    request
        .set_method(&wasi_method)
        .map_err(|()| invalid("invalid method".into()))?;
    request
        .set_scheme(Some(&target.scheme))
        .map_err(|()| invalid("invalid URL: the scheme is not accepted".into()))?;
    request
        .set_authority(Some(&target.authority))
        .map_err(|()| invalid(format!("invalid URL: bad host {:?}", target.authority)))?;
    request
        .set_path_with_query(Some(&target.path_with_query))
        .map_err(|()| invalid(format!("invalid URL: bad path {:?}", target.path_with_query)))?;

    // The body is taken before `handle` consumes the request, and written after it, so
    // the host is already sending while the body streams.
    let outgoing = request
        .body()
        .map_err(|()| failed("the request body is unavailable".into()))?;
    let future = outgoing_handler::handle(request, None)
        .map_err(|code| HttpError::from_code(&method, url, Stage::Refused, &code))?;

    // A server may answer without reading the whole body (a 413, say): its response is
    // what counts. Without one, the response's error says more than the stream's.
    let sent = write_body(outgoing, body);
    let response = match (wait(&future), sent) {
        (Ok(Ok(response)), _) => response,
        (Ok(Err(code)), _) => return Err(failed_code(&code)),
        (Err(_), Err(reason)) => return Err(failed(format!("sending the body: {reason}"))),
        (Err(reason), Ok(())) => return Err(failed(reason)),
    };
    let result = read_response(&response).map_err(|e| match e {
        ReadError::Code(code) => failed_code(&code),
        ReadError::Other(reason) => failed(reason),
    });
    drop(response);
    drop(future);
    result
}

/// A URL split into the parts `outgoing-request` takes.
struct Target {
    scheme: Scheme,
    authority: String,
    path_with_query: String,
}

/// Splits `scheme://authority/path?query#fragment`, keeping the path and query as given
/// and dropping the fragment.
fn parse_url(url: &str) -> Result<Target, String> {
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("it contains whitespace or control characters".into());
    }
    let (scheme, rest) = url.split_once("://").ok_or("it must start with http:// or https://")?;
    let scheme = if scheme.eq_ignore_ascii_case("http") {
        Scheme::Http
    } else if scheme.eq_ignore_ascii_case("https") {
        Scheme::Https
    } else {
        return Err(format!("scheme {scheme:?} is not http or https"));
    };
    let rest = rest.split('#').next().unwrap_or_default();
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.is_empty() {
        return Err("it has no host".into());
    }
    if authority.contains('@') {
        return Err("user names and passwords in the URL are not supported".into());
    }
    if let Some(port) = port_of(authority) {
        if port.parse::<u16>().is_err() {
            return Err(format!("port {port:?} is not a number from 0 to 65535"));
        }
    }
    let path_with_query = match path.chars().next() {
        None => "/".to_string(),
        Some('?') => format!("/{path}"),
        Some(_) => path.to_string(),
    };
    Ok(Target {
        scheme,
        authority: authority.to_string(),
        path_with_query,
    })
}

/// The port of `host:port` or `[v6]:port`, if one is given.
fn port_of(authority: &str) -> Option<&str> {
    let host_end = if authority.starts_with('[') {
        authority.find(']')? + 1
    } else {
        0
    };
    authority[host_end..].rfind(':').map(|i| &authority[host_end + i + 1..])
}

/// The standard methods as WASI's, matched case-insensitively, and the name to report.
fn parse_method(method: &str) -> (Method, String) {
    let upper = method.to_ascii_uppercase();
    let wasi = match upper.as_str() {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        "CONNECT" => Method::Connect,
        "OPTIONS" => Method::Options,
        "TRACE" => Method::Trace,
        "PATCH" => Method::Patch,
        _ => return (Method::Other(method.to_string()), method.to_string()),
    };
    (wasi, upper)
}

/// The request's headers, plus `content-length` for a body of unstated length.
fn build_headers(headers: &[(&str, &str)], body_len: usize) -> Result<Fields, String> {
    let mut list: Vec<(String, Vec<u8>)> = headers
        .iter()
        .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
        .collect();
    let stated = headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("content-length"));
    if body_len > 0 && !stated {
        list.push(("content-length".into(), body_len.to_string().into_bytes()));
    }
    Fields::from_list(&list).map_err(|e| {
        // The error does not say which header; try them one at a time to name it.
        let culprit = list
            .iter()
            .find(|h| Fields::from_list(std::slice::from_ref(h)).is_err())
            .map(|(n, _)| format!(" {n:?}"))
            .unwrap_or_default();
        format!("invalid header{culprit}: {}", header_error_name(e))
    })
}

fn header_error_name(e: HeaderError) -> &'static str {
    match e {
        HeaderError::InvalidSyntax => "invalid-syntax",
        HeaderError::Forbidden => "forbidden",
        HeaderError::Immutable => "immutable",
    }
}

/// Writes `data` as the whole body and finishes it. On error the body is dropped
/// unfinished, which aborts the request.
fn write_body(outgoing: OutgoingBody, data: &[u8]) -> Result<(), String> {
    if !data.is_empty() {
        let stream = outgoing
            .write()
            .map_err(|()| "the body stream is unavailable".to_string())?;
        write_all(&stream, data).map_err(|e| stream_error(e).1)?;
        // The stream is a child of the body and must go first.
        drop(stream);
    }
    OutgoingBody::finish(outgoing, None).map_err(|code| describe_code(&code))
}

/// Writes as much as the stream accepts at a time, waiting while it accepts nothing.
fn write_all(stream: &OutputStream, mut data: &[u8]) -> Result<(), StreamError> {
    while !data.is_empty() {
        let permitted = stream.check_write()?;
        if permitted == 0 {
            stream.subscribe().block();
            continue;
        }
        let n = usize::try_from(permitted).map_or(data.len(), |p| p.min(data.len()));
        stream.write(&data[..n])?;
        data = &data[n..];
    }
    match stream.blocking_flush() {
        // Every byte was accepted; a peer that stopped reading after them is not an error.
        Ok(()) | Err(StreamError::Closed) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Waits for the response (or the error that replaced it).
fn wait(future: &wasip2::http::types::FutureIncomingResponse) -> Result<Result<IncomingResponse, ErrorCode>, String> {
    loop {
        if let Some(ready) = future.get() {
            return ready.map_err(|()| "the response was already taken".to_string());
        }
        future.subscribe().block();
    }
}

enum ReadError {
    Code(ErrorCode),
    Other(String),
}

/// Reads the status, the headers and the whole body of `response`.
fn read_response(response: &IncomingResponse) -> Result<Response, ReadError> {
    let status = response.status();
    let fields = response.headers();
    let headers = fields
        .entries()
        .into_iter()
        .map(|(n, v)| (n, String::from_utf8_lossy(&v).into_owned()))
        .collect();
    drop(fields);
    let incoming = response
        .consume()
        .map_err(|()| ReadError::Other("the response body was already taken".into()))?;
    let body = read_body(&incoming);
    // The trailers are not kept; finishing (or dropping) the body releases it.
    drop(IncomingBody::finish(incoming));
    Ok(Response {
        status,
        headers,
        body: body?,
    })
}

fn read_body(incoming: &IncomingBody) -> Result<Vec<u8>, ReadError> {
    let stream: InputStream = incoming
        .stream()
        .map_err(|()| ReadError::Other("the response body stream is unavailable".into()))?;
    let mut body = Vec::new();
    loop {
        match stream.blocking_read(READ_CHUNK) {
            Ok(chunk) => body.extend_from_slice(&chunk),
            Err(StreamError::Closed) => return Ok(body),
            Err(e) => {
                let (code, reason) = stream_error(e);
                return Err(match code {
                    Some(code) => ReadError::Code(code),
                    None => ReadError::Other(format!("reading the body: {reason}")),
                });
            }
        }
    }
}

/// The HTTP error code behind a stream error, if any, and a readable reason.
fn stream_error(e: StreamError) -> (Option<ErrorCode>, String) {
    match e {
        StreamError::Closed => (None, "the stream was closed".into()),
        StreamError::LastOperationFailed(err) => match wasip2::http::types::http_error_code(&err) {
            Some(code) => {
                let reason = describe_code(&code);
                (Some(code), reason)
            }
            None => (None, err.to_debug_string()),
        },
    }
}

/// The WIT name of an `error-code` case, in lowercase.
fn code_name(code: &ErrorCode) -> &'static str {
    use ErrorCode as E;
    match code {
        E::DnsTimeout => "dns-timeout",
        E::DnsError(_) => "dns-error",
        E::DestinationNotFound => "destination-not-found",
        E::DestinationUnavailable => "destination-unavailable",
        E::DestinationIpProhibited => "destination-ip-prohibited",
        E::DestinationIpUnroutable => "destination-ip-unroutable",
        E::ConnectionRefused => "connection-refused",
        E::ConnectionTerminated => "connection-terminated",
        E::ConnectionTimeout => "connection-timeout",
        E::ConnectionReadTimeout => "connection-read-timeout",
        E::ConnectionWriteTimeout => "connection-write-timeout",
        E::ConnectionLimitReached => "connection-limit-reached",
        E::TlsProtocolError => "tls-protocol-error",
        E::TlsCertificateError => "tls-certificate-error",
        E::TlsAlertReceived(_) => "tls-alert-received",
        E::HttpRequestDenied => "http-request-denied",
        E::HttpRequestLengthRequired => "http-request-length-required",
        E::HttpRequestBodySize(_) => "http-request-body-size",
        E::HttpRequestMethodInvalid => "http-request-method-invalid",
        E::HttpRequestUriInvalid => "http-request-uri-invalid",
        E::HttpRequestUriTooLong => "http-request-uri-too-long",
        E::HttpRequestHeaderSectionSize(_) => "http-request-header-section-size",
        E::HttpRequestHeaderSize(_) => "http-request-header-size",
        E::HttpRequestTrailerSectionSize(_) => "http-request-trailer-section-size",
        E::HttpRequestTrailerSize(_) => "http-request-trailer-size",
        E::HttpResponseIncomplete => "http-response-incomplete",
        E::HttpResponseHeaderSectionSize(_) => "http-response-header-section-size",
        E::HttpResponseHeaderSize(_) => "http-response-header-size",
        E::HttpResponseBodySize(_) => "http-response-body-size",
        E::HttpResponseTrailerSectionSize(_) => "http-response-trailer-section-size",
        E::HttpResponseTrailerSize(_) => "http-response-trailer-size",
        E::HttpResponseTransferCoding(_) => "http-response-transfer-coding",
        E::HttpResponseContentCoding(_) => "http-response-content-coding",
        E::HttpResponseTimeout => "http-response-timeout",
        E::HttpUpgradeFailed => "http-upgrade-failed",
        E::HttpProtocolError => "http-protocol-error",
        E::LoopDetected => "loop-detected",
        E::ConfigurationError => "configuration-error",
        E::InternalError(_) => "internal-error",
    }
}

/// The WIT name of an `error-code` case with its payload, e.g. `connection-refused`,
/// `dns-error (NXDOMAIN)` or `internal-error: <message>`.
fn describe_code(code: &ErrorCode) -> String {
    use ErrorCode as E;
    let name = code_name(code);
    let detail = match code {
        E::InternalError(Some(message)) => return format!("{name}: {message}"),
        E::DnsError(p) => join([p.rcode.clone(), p.info_code.map(|c| format!("info-code {c}"))]),
        E::TlsAlertReceived(p) => join([p.alert_id.map(|id| format!("alert {id}")), p.alert_message.clone()]),
        E::HttpRequestBodySize(Some(n)) | E::HttpResponseBodySize(Some(n)) => {
            format!("{n} bytes")
        }
        E::HttpRequestHeaderSectionSize(Some(n))
        | E::HttpRequestTrailerSectionSize(Some(n))
        | E::HttpResponseHeaderSectionSize(Some(n))
        | E::HttpResponseTrailerSectionSize(Some(n)) => format!("{n} bytes"),
        E::HttpRequestHeaderSize(Some(p))
        | E::HttpRequestTrailerSize(p)
        | E::HttpResponseHeaderSize(p)
        | E::HttpResponseTrailerSize(p) => join([
            p.field_name.as_ref().map(|n| format!("{n:?}")),
            p.field_size.map(|s| format!("{s} bytes")),
        ]),
        E::HttpResponseTransferCoding(Some(c)) | E::HttpResponseContentCoding(Some(c)) => c.clone(),
        _ => String::new(),
    };
    if detail.is_empty() {
        name.to_string()
    } else {
        format!("{name} ({detail})")
    }
}

fn join<const N: usize>(parts: [Option<String>; N]) -> String {
    parts.into_iter().flatten().collect::<Vec<_>>().join(", ")
}
