//! One entry of a sandbox's `http` list: which HTTP requests a task may send.
//!
//! An entry is `[scheme://]host[:port]`. The host is a name (`api.example.com`), a
//! wildcard over the subdomains of a name (`*.example.com`, which does not match
//! `example.com` itself), an IP address (`10.1.2.3`, `[fd00::1]`) or `*` for any host. No
//! scheme means `http` and `https`; no port means the scheme's default port (80, 443); a
//! port of `*` means any port. Names are compared without case and without a trailing dot.
//!
//! Matching an entry is not the whole check: the runner also requires the addresses a
//! name resolves to be public, unless the entry is explicit about an internal one
//! ([`HttpRule::names_exactly`]) or `network_allow` holds it.

use std::fmt;
use std::net::IpAddr;

/// One entry of a sandbox's `http` list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRule {
    /// The entry as written (for messages).
    text: String,
    https: bool,
    http: bool,
    host: Host,
    port: Port,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Host {
    Any,
    Name(String),
    /// `*.suffix`: stored with its leading dot (`.example.com`).
    Subdomains(String),
    Ip(IpAddr),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Port {
    Default,
    Any,
    Exactly(u16),
}

/// The default port of `scheme` (`http` or `https`).
pub fn default_port(https: bool) -> u16 {
    if https {
        443
    } else {
        80
    }
}

/// A host name as compared: lower case, no trailing dot, IPv6 brackets removed.
pub fn normalize_host(host: &str) -> String {
    let h = host.trim_end_matches('.').to_ascii_lowercase();
    match h.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(inner) => inner.to_owned(),
        None => h,
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

impl std::str::FromStr for HttpRule {
    type Err = String;

    fn from_str(entry: &str) -> Result<Self, String> {
        let text = entry.trim();
        let bad = |why: &str| {
            Err(format!(
                "{text:?} is not an HTTP host entry ({why}); write [scheme://]host[:port], e.g. \"api.example.com\" or \"https://*.corp:8443\""
            ))
        };
        let (http, https, rest) = match text.split_once("://") {
            Some((s, rest)) => match s.to_ascii_lowercase().as_str() {
                "http" => (true, false, rest),
                "https" => (false, true, rest),
                _ => return bad("the scheme must be http or https"),
            },
            None => (true, true, text),
        };
        if rest.contains(['/', '?', '#', '@']) {
            return bad("it names a host, not a URL: no path, query or user");
        }
        // Split the port off; an IPv6 address is written in brackets.
        let (host, port) = if let Some(inner) = rest.strip_prefix('[') {
            let Some((addr, after)) = inner.split_once(']') else {
                return bad("an IPv6 address must end with ]");
            };
            match after {
                "" => (format!("[{addr}]"), None),
                p if p.starts_with(':') => (format!("[{addr}]"), Some(&p[1..])),
                _ => return bad("unexpected text after the IPv6 address"),
            }
        } else {
            match rest.rsplit_once(':') {
                Some((h, p)) => (h.to_owned(), Some(p)),
                None => (rest.to_owned(), None),
            }
        };
        let port = match port {
            None => Port::Default,
            Some("*") => Port::Any,
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 => Port::Exactly(n),
                _ => return bad("the port must be a number from 1 to 65535 or *"),
            },
        };
        let host = normalize_host(&host);
        let host = if host == "*" {
            Host::Any
        } else if let Ok(ip) = host.parse::<IpAddr>() {
            if ip.is_unspecified() {
                return bad("the unspecified address connects to this host itself; name the address to reach");
            }
            Host::Ip(ip)
        } else if let Some(suffix) = host.strip_prefix("*.") {
            if !valid_name(suffix) {
                return bad("the name after *. is not a host name");
            }
            Host::Subdomains(format!(".{suffix}"))
        } else if valid_name(&host) {
            Host::Name(host)
        } else if host.contains('*') {
            return bad("a wildcard may only be a whole leading label, as in *.example.com");
        } else {
            return bad("the host is not a host name or an IP address");
        };
        Ok(HttpRule {
            text: text.to_owned(),
            http,
            https,
            host,
            port,
        })
    }
}

impl fmt::Display for HttpRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl HttpRule {
    /// Whether a request to `host` (normalized) on `port` over `https` matches this entry.
    pub fn matches(&self, https: bool, host: &str, port: u16) -> bool {
        let scheme = if https { self.https } else { self.http };
        let port_ok = match self.port {
            Port::Default => port == default_port(https),
            Port::Any => true,
            Port::Exactly(p) => p == port,
        };
        let host_ok = match &self.host {
            Host::Any => true,
            Host::Name(n) => n == host,
            Host::Subdomains(s) => {
                host.len() > s.len() && host.ends_with(s.as_str()) && host.parse::<IpAddr>().is_err()
            }
            Host::Ip(ip) => host.parse::<IpAddr>().is_ok_and(|h| h == *ip),
        };
        scheme && port_ok && host_ok
    }

    /// Whether this entry names `ip` itself: exactly that address, or `localhost` when
    /// `ip` is a loopback address. Such an entry may reach `ip` even when it is internal.
    pub fn names_exactly(&self, ip: IpAddr) -> bool {
        match &self.host {
            Host::Ip(listed) => *listed == ip,
            Host::Name(n) => n == "localhost" && ip.is_loopback(),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(s: &str) -> HttpRule {
        s.parse().unwrap()
    }

    #[test]
    fn entries_match_scheme_host_and_port() {
        let r = rule("api.example.com");
        assert!(r.matches(true, "api.example.com", 443));
        assert!(r.matches(false, "api.example.com", 80));
        assert!(!r.matches(true, "api.example.com", 8443));
        assert!(!r.matches(true, "example.com", 443));
        assert!(!r.matches(true, "api.example.com.evil.net", 443));

        let r = rule("https://*.corp:8443");
        assert!(r.matches(true, "a.corp", 8443));
        assert!(r.matches(true, "x.y.corp", 8443));
        assert!(!r.matches(true, "corp", 8443));
        assert!(!r.matches(true, "evilcorp", 8443));
        assert!(!r.matches(false, "a.corp", 8443));
        assert!(!r.matches(true, "a.corp", 443));

        let r = rule("http://127.0.0.1:*");
        assert!(r.matches(false, "127.0.0.1", 9));
        assert!(!r.matches(true, "127.0.0.1", 443));
        assert!(rule("[::1]:8080").matches(false, "::1", 8080));
        assert!(rule("*").matches(true, "anything.example", 443));
        assert!(
            !rule("*.0.0.1").matches(true, "127.0.0.1", 443),
            "a name wildcard never matches an address"
        );
        assert!(rule("API.Example.COM.").matches(true, "api.example.com", 443));
    }

    #[test]
    fn bad_entries_say_what_is_wrong() {
        for (entry, why) in [
            ("ftp://x.com", "scheme"),
            ("https://x.com/path", "no path"),
            ("x.com:0", "port"),
            ("x.com:http", "port"),
            ("a.*.com", "wildcard"),
            ("*x.com", "wildcard"),
            ("user@x.com", "no path, query or user"),
            ("", "not a host name"),
            ("0.0.0.0:8080", "unspecified"),
            ("[::]", "unspecified"),
            ("exa mple.com", "not a host name"),
        ] {
            let e = entry.parse::<HttpRule>().unwrap_err();
            assert!(e.contains(why), "{entry}: {e}");
        }
    }
}
