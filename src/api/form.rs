//! What Disbatch 4's tools send and expect beyond plain JSON: form bodies
//! (`application/x-www-form-urlencoded`, LWP's `$ua->post($url, \%fields)`) with the check
//! that keeps other web sites from posting them, the decoding of forms and query strings
//! into fields (a repeated key gives the list of its values), and [`Shape`], which answer
//! shape a request asks for.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, Uri};
use serde_json::{Map, Value};

use super::ApiError;

/// The request header by which our own clients ask for the native answer shape
/// (`Disbatch-Shape: native`); the query parameter `shape=native` does the same.
pub const SHAPE_HEADER: &str = "disbatch-shape";

/// Which answer shape a request gets where Disbatch 4's and ours differ: a new queue's
/// `id` (`{"$oid"}` or the hex string), a node's `timestamp` (epoch milliseconds or
/// `{"$date"}`), an unknown queue or node (`null` or 404), `GET /tasks` with `.limit` 1 (one
/// task or a list). Disbatch 4's by default, so its tools work unchanged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Shape {
    /// Our own shape (`Disbatch-Shape: native` or `?shape=native`).
    pub native: bool,
}

impl Shape {
    /// The shape named by `value` (`native` or `disbatch4`), `what` naming where it was given.
    fn parse(value: &str, what: &str) -> Result<Shape, ApiError> {
        match value.trim().to_ascii_lowercase().as_str() {
            "native" => Ok(Shape { native: true }),
            "disbatch4" | "" => Ok(Shape { native: false }),
            other => Err(ApiError::bad(format!(
                "{what} must be \"native\" or \"disbatch4\", got {other:?}"
            ))),
        }
    }

    /// The shape the request's header or query string asks for.
    pub fn of(headers: &HeaderMap, uri: &Uri) -> Result<Shape, ApiError> {
        if let Some(v) = headers.get(SHAPE_HEADER) {
            let text = v
                .to_str()
                .map_err(|_| ApiError::bad("header \"Disbatch-Shape\" is not ASCII"))?;
            return Shape::parse(text, "header \"Disbatch-Shape\"");
        }
        let pairs = decode(uri.query().unwrap_or_default().as_bytes());
        match pairs.iter().rev().find(|(k, _)| k == "shape") {
            Some((_, v)) => Shape::parse(v, "query parameter \"shape\""),
            None => Ok(Shape::default()),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Shape {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Shape::of(&parts.headers, &parts.uri)
    }
}

/// Refuses (403) a form that a browser posts from another site: browsers send such forms
/// without asking first, so without this check any web page could write to a DCI that has
/// no token. A browser says where a request comes from: `Sec-Fetch-Site` (refused unless
/// `same-origin` or `none`, a request the user typed) and `Origin` (refused unless its
/// host and port are the request's `Host`). Clients that are not browsers, such as
/// Disbatch 4's `disbatch` CLI, send neither.
pub(super) fn check_same_site(headers: &HeaderMap, uri: &Uri) -> Result<(), ApiError> {
    let refuse = |why: String| {
        ApiError::Forbidden(format!(
            "a form posted from another site is refused ({why}): send the body as JSON \
             (Content-Type: application/json), which browsers do not send across sites without asking"
        ))
    };
    if let Some(site) = headers.get("sec-fetch-site") {
        let site = String::from_utf8_lossy(site.as_bytes()).trim().to_ascii_lowercase();
        if site != "same-origin" && site != "none" {
            return Err(refuse(format!("Sec-Fetch-Site: {site}")));
        }
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = String::from_utf8_lossy(origin.as_bytes()).trim().to_ascii_lowercase();
    let Some(host) = super::hosts::request_host(headers, uri) else {
        return Err(refuse(format!("Origin: {origin}, and the request names no Host")));
    };
    if !super::hosts::same_origin(&origin, &host) {
        return Err(refuse(format!("Origin: {origin}, Host: {host}")));
    }
    Ok(())
}

/// The `key=value` pairs of a form body or query string, in order, `+` and `%XX` decoded
/// as browsers encode them: a `%` not followed by two hex digits stays as it is, and bytes
/// that are not UTF-8 once decoded become U+FFFD, so that errors can show them.
pub(super) fn decode(bytes: &[u8]) -> Vec<(String, String)> {
    bytes
        .split(|b| *b == b'&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = match pair.iter().position(|b| *b == b'=') {
                Some(i) => (&pair[..i], &pair[i + 1..]),
                None => (pair, &[][..]),
            };
            (unescape(k), unescape(v))
        })
        .collect()
}

fn unescape(part: &[u8]) -> String {
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(part.len());
    let mut i = 0;
    while i < part.len() {
        match (
            part[i],
            part.get(i + 1).copied().and_then(hex),
            part.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(high), Some(low)) => {
                out.push((high * 16 + low) as u8);
                i += 2;
            }
            (b'+', _, _) => out.push(b' '),
            (b, _, _) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Pairs as fields: each value a string, a key given more than once the array of its
/// values (as Disbatch 4 read forms and query strings).
pub(super) fn to_fields(pairs: Vec<(String, String)>) -> Map<String, Value> {
    let mut m = Map::new();
    for (k, v) in pairs {
        match m.get_mut(&k) {
            None => {
                m.insert(k, Value::String(v));
            }
            Some(Value::Array(list)) => list.push(Value::String(v)),
            Some(first) => {
                let first = first.take();
                m.insert(k, Value::Array(vec![first, Value::String(v)]));
            }
        }
    }
    m
}

/// In fields from a form, the values of `keys` that hold JSON text (an object or an array:
/// a form can carry nothing else) decoded; 400 naming the field when the text is not JSON.
pub(super) fn decode_json_fields(fields: &mut Map<String, Value>, keys: &[&str]) -> Result<(), ApiError> {
    for key in keys {
        if let Some(Value::String(text)) = fields.get(*key) {
            if !text.trim_start().starts_with(['{', '[']) {
                continue;
            }
            let value: Value = serde_json::from_str(text)
                .map_err(|e| ApiError::bad(format!("field {key:?} of the form is not valid JSON: {e}")))?;
            fields.insert((*key).to_string(), value);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use serde_json::json;

    #[test]
    fn decodes_forms_and_repeated_keys() {
        let pairs = decode(b"name=a+b&plugin=Disbatch%3A%3APlugin&x&status=1&status=2&&e=");
        assert_eq!(pairs[0], ("name".into(), "a b".into()));
        assert_eq!(pairs[1], ("plugin".into(), "Disbatch::Plugin".into()));
        assert_eq!(pairs[2], ("x".into(), "".into()));
        let f = to_fields(pairs);
        assert_eq!(f["status"], json!(["1", "2"]));
        assert_eq!(f["e"], json!(""));
        assert_eq!(decode(b"a=%zz&%=1")[0].1, "%zz");
        assert_eq!(decode(b"%=1")[0].0, "%");
        assert_eq!(decode(b"a=%ff")[0].1, "\u{fffd}");
        assert_eq!(decode(b"a=%4")[0].1, "%4");
        assert_eq!(
            decode(b"a=%+1")[0].1,
            "% 1",
            "not a hex digit: the % stays, the + is a space"
        );
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn refuses_forms_from_other_sites() {
        let uri: Uri = "/queues".parse().unwrap();
        let ok = |h: &[(&str, &str)]| check_same_site(&headers(h), &uri).is_ok();
        assert!(ok(&[]));
        assert!(ok(&[("host", "localhost:8080")]));
        assert!(ok(&[("host", "localhost:8080"), ("origin", "http://localhost:8080")]));
        assert!(ok(&[("host", "Example.com"), ("origin", "https://example.com:443")]));
        assert!(ok(&[("sec-fetch-site", "same-origin")]));
        assert!(ok(&[("sec-fetch-site", "none")]));
        assert!(!ok(&[("sec-fetch-site", "cross-site")]));
        assert!(!ok(&[("sec-fetch-site", "same-site")]));
        assert!(!ok(&[("host", "localhost:8080"), ("origin", "http://evil.example")]));
        assert!(!ok(&[("host", "localhost:8080"), ("origin", "http://localhost:8081")]));
        assert!(!ok(&[("host", "localhost:8080"), ("origin", "null")]));
        assert!(!ok(&[("origin", "http://localhost:8080")]));
        let absolute: Uri = "http://localhost:8080/queues".parse().unwrap();
        assert!(check_same_site(&headers(&[("origin", "http://localhost:8080")]), &absolute).is_ok());
    }

    #[test]
    fn json_text_in_form_fields() {
        let mut f = to_fields(decode(b"queue=q&params=%5B%7B%22a%22%3A1%7D%5D&other=plain"));
        decode_json_fields(&mut f, &["params", "other"]).unwrap();
        assert_eq!(f["params"], json!([{"a": 1}]));
        assert_eq!(f["other"], json!("plain"));
        let mut bad = to_fields(decode(b"params=%5Bnope"));
        assert!(decode_json_fields(&mut bad, &["params"])
            .unwrap_err()
            .to_string()
            .contains("\"params\""));
    }

    #[test]
    fn shapes() {
        let uri: Uri = "/queues?shape=native".parse().unwrap();
        assert!(Shape::of(&HeaderMap::new(), &uri).unwrap().native);
        let plain: Uri = "/queues".parse().unwrap();
        assert!(!Shape::of(&HeaderMap::new(), &plain).unwrap().native);
        assert!(
            Shape::of(&headers(&[("disbatch-shape", "Native")]), &plain)
                .unwrap()
                .native
        );
        assert!(Shape::of(&headers(&[("disbatch-shape", "other")]), &plain).is_err());
    }
}
