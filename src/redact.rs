//! Hiding secrets in what is shown: messages and logs name a database by its URI with
//! the credentials taken out. A leaf: the config, the stores and the CLI all use it.

/// `uri` with any `user:password@` replaced by `***@`, for messages and logs.
pub fn redact_uri(uri: &str) -> String {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return uri.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***{}", &rest[at..]),
        None => uri.to_owned(),
    }
}
