//! Which HTTP requests a task may send, as the runner applies a queue's `http` list (the
//! entries themselves, their syntax and matching: [`crate::sandbox_spec::HttpRule`]).
//!
//! Matching an entry is not the whole check: the addresses a name resolves to must also be
//! public, unless the entry is explicit about an internal one (see [`HttpRule::admits`]).

use std::net::IpAddr;

use ipnet::IpNet;

pub use crate::sandbox_spec::{default_port, normalize_host, HttpRule};

/// The runner's half of an `http` entry: where the addresses it resolves to may lie.
impl HttpRule {
    /// Whether a request this entry matched may connect to `ip`. A public address always
    /// may. An internal one (loopback, private, link-local…, see [`super::super::is_internal`])
    /// only when the entry names exactly that address, when it names `localhost` and the
    /// address is loopback, or when `network_allow` holds it: a name that resolves to the
    /// host's own neighbourhood is refused unless the operator said so.
    pub fn admits(&self, ip: IpAddr, network_allow: &[IpNet]) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        if ip.is_unspecified() {
            return false;
        }
        if !super::super::is_internal(ip) {
            return true;
        }
        if self.names_exactly(ip) {
            return true;
        }
        super::super::egress::in_allowed(network_allow, ip)
    }
}

/// The entries of `rules` matching the request.
pub fn matching(rules: &[HttpRule], https: bool, host: &str, port: u16) -> Vec<HttpRule> {
    rules.iter().filter(|r| r.matches(https, host, port)).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(s: &str) -> HttpRule {
        s.parse().unwrap()
    }

    #[test]
    fn internal_addresses_need_an_explicit_entry() {
        let public: IpAddr = "93.184.216.34".parse().unwrap();
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let meta: IpAddr = "169.254.169.254".parse().unwrap();
        assert!(rule("api.example.com").admits(public, &[]));
        assert!(!rule("api.example.com").admits(lo, &[]));
        assert!(!rule("*").admits(meta, &[]));
        assert!(rule("127.0.0.1:*").admits(lo, &[]));
        assert!(rule("localhost:8080").admits(lo, &[]));
        assert!(!rule("localhost:8080").admits(meta, &[]));
        assert!(rule("db.corp").admits("10.1.2.3".parse().unwrap(), &["10.1.0.0/16".parse().unwrap()]));
        assert!(!rule("127.0.0.1").admits("::ffff:127.0.0.2".parse().unwrap(), &[]));
        assert!(rule("127.0.0.1").admits("::ffff:127.0.0.1".parse().unwrap(), &[]));
        assert!(!rule("*").admits("0.0.0.0".parse().unwrap(), &["0.0.0.0/0".parse().unwrap()]));
        // Every matching entry is asked, not only the first.
        let rules = [rule("*:*"), rule("http://127.0.0.1:8080")];
        let m = matching(&rules, false, "127.0.0.1", 8080);
        assert!(m.iter().any(|r| r.admits(lo, &[])));
    }
}
