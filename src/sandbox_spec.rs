//! What a task's sandbox grants and within which limits: [`Sandbox`], its grants
//! ([`DirGrant`], [`HttpRule`], `network_allow` ranges), their defaults and bounds.
//!
//! The default sandbox grants nothing: no preopened directories, no environment variables,
//! no arguments, no network, stdin closed. Everything a plugin may touch is granted
//! explicitly, per queue (DEN) or per call (`runner exec`).
//!
//! A leaf: the config file, the queue documents and the runner all read these settings,
//! and this module imports none of them. The runner adds what needs the engine or the
//! host (building the WASI context, refusing grants on protected or kernel paths).

mod http_rule;

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

pub use http_rule::{default_port, normalize_host, HttpRule};

/// Default wall-time limit of one task.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3600);
/// Default linear-memory limit of one task, in bytes (1 GiB).
pub const DEFAULT_MEMORY: u64 = 1024 * 1024 * 1024;
/// Default cap of each captured output stream, in bytes (64 MiB).
pub const DEFAULT_OUTPUT_CAP: usize = 64 * 1024 * 1024;
/// The largest memory limit a sandbox may set (the engine's per-instance maximum, 4 GiB).
pub const MAX_MEMORY: u64 = 4 * 1024 * 1024 * 1024;
/// The longest duration any setting accepts, config keys and a sandbox's `timeout` alike
/// (365 days).
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);
/// The longest wall-time limit a sandbox may set: the longest duration the config accepts
/// (365 days).
pub const MAX_TIMEOUT: Duration = MAX_DURATION;
/// Default bytes one task may write into its grants (1 GiB).
pub const DEFAULT_WRITE_QUOTA: u64 = 1 << 30;
/// Default files and directories one task may create (10,000).
pub const DEFAULT_FILE_QUOTA: u64 = 10_000;
/// Default `http_max_requests`: requests one task may send.
pub const DEFAULT_MAX_REQUESTS: u32 = 1000;
/// Default `http_max_body_mib`, in bytes: body bytes one task may send and receive (1 GiB).
pub const DEFAULT_MAX_BODY: u64 = 1 << 30;
/// Default `sandbox.submit_max`: follow-ups one task may submit.
pub const DEFAULT_SUBMIT_MAX: u32 = 100;
/// The largest `sandbox.submit_max` a sandbox may set.
pub const MAX_SUBMIT_MAX: u32 = 10_000;
/// Default `sandbox.submit_depth`: how deep a lineage of follow-ups may go (a task
/// submitted through the API is at depth 0, a follow-up one deeper than its parent).
pub const DEFAULT_SUBMIT_DEPTH: u32 = 8;
/// The largest `sandbox.submit_depth` a sandbox may set.
pub const MAX_SUBMIT_DEPTH: u32 = 1000;

/// A host directory made visible to the plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirGrant {
    /// Directory on the host.
    pub host: PathBuf,
    /// Path under which the plugin sees it (defaults to the host path).
    pub guest: String,
    /// Whether the plugin may create, write and delete files in it (read-only otherwise).
    #[serde(default)]
    pub writable: bool,
}

impl FromStr for DirGrant {
    type Err = String;

    /// Parses `host[:guest][:rw|:ro]`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts: Vec<&str> = s.split(':').collect();
        let mut writable = false;
        if parts.len() > 1 {
            match *parts.last().unwrap() {
                "rw" => {
                    writable = true;
                    parts.pop();
                }
                "ro" => {
                    parts.pop();
                }
                _ => {}
            }
        }
        let (host, guest) = match parts.as_slice() {
            [host] => (*host, *host),
            [host, guest] => (*host, *guest),
            _ => return Err(format!("invalid directory grant {s:?}: expected host[:guest][:rw|:ro]")),
        };
        if host.is_empty() || guest.is_empty() {
            return Err(format!("invalid directory grant {s:?}: empty path"));
        }
        Ok(DirGrant {
            host: PathBuf::from(host),
            guest: guest.to_owned(),
            writable,
        })
    }
}

impl fmt::Display for DirGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = if self.writable { "rw" } else { "ro" };
        write!(f, "{}:{}:{mode}", self.host.display(), self.guest)
    }
}

/// Everything a task may use. `Sandbox::default()` grants nothing and sets the default limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    /// Wall-time limit; the plugin is interrupted when it passes.
    pub timeout: Duration,
    /// Linear-memory limit in bytes.
    pub memory: u64,
    /// Bytes kept of each of stdout and stderr; the rest is dropped and the drop reported.
    pub output_cap: usize,
    /// Host directories the plugin may see.
    pub dirs: Vec<DirGrant>,
    /// Environment variables the plugin sees (nothing is inherited implicitly).
    pub env: BTreeMap<String, String>,
    /// Whether the plugin may open TCP/UDP sockets and resolve names. Internal addresses
    /// (loopback, private, link-local…) stay refused unless listed in `network_allow`.
    pub network: bool,
    /// Internal ranges a plugin with `network` may reach anyway (the runner's network policy).
    pub network_allow: Vec<IpNet>,
    /// Bytes the task may write into its writable grants (the runner's write quotas).
    pub write_quota: u64,
    /// Files and directories the task may create in its writable grants.
    pub file_quota: u64,
    /// Hosts the plugin may send HTTP requests to (the runner's `wasi:http` policy); none by default.
    pub http: Vec<HttpRule>,
    /// HTTP requests one task may send.
    pub http_max_requests: u32,
    /// Body bytes one task's HTTP requests and responses may carry, together.
    pub http_max_body: u64,
    /// Queues (names or ids) the plugin may submit follow-up tasks to (the runner's
    /// `submit` import); none by default.
    pub submit: Vec<String>,
    /// Follow-up tasks one task may submit.
    pub submit_max: u32,
    /// The deepest a follow-up may be in its lineage (`sandbox.submit_depth`).
    pub submit_depth: u32,
    /// This task's depth in its lineage of follow-ups: 0 for a task submitted through the
    /// API, its parent's + 1 for a follow-up (set per task by the DEN, see
    /// `den::chain::depth`).
    pub depth: u32,
}

impl Default for Sandbox {
    fn default() -> Self {
        Sandbox {
            timeout: DEFAULT_TIMEOUT,
            memory: DEFAULT_MEMORY,
            output_cap: DEFAULT_OUTPUT_CAP,
            dirs: Vec::new(),
            env: BTreeMap::new(),
            network: false,
            network_allow: Vec::new(),
            write_quota: DEFAULT_WRITE_QUOTA,
            file_quota: DEFAULT_FILE_QUOTA,
            http: Vec::new(),
            http_max_requests: DEFAULT_MAX_REQUESTS,
            http_max_body: DEFAULT_MAX_BODY,
            submit: Vec::new(),
            submit_max: DEFAULT_SUBMIT_MAX,
            submit_depth: DEFAULT_SUBMIT_DEPTH,
            depth: 0,
        }
    }
}

impl Sandbox {
    /// Checks the limits and that every granted directory exists.
    pub fn validate(&self) -> Result<(), String> {
        if self.timeout.is_zero() {
            return Err("timeout must be greater than zero".into());
        }
        if self.timeout > MAX_TIMEOUT {
            return Err(format!(
                "timeout must be at most {} seconds (365 days), got {} s",
                MAX_TIMEOUT.as_secs(),
                self.timeout.as_secs()
            ));
        }
        if self.memory == 0 || self.memory > MAX_MEMORY {
            return Err(format!(
                "memory must be between 1 byte and {MAX_MEMORY} bytes (4 GiB), got {}",
                self.memory
            ));
        }
        if self.submit_max > MAX_SUBMIT_MAX {
            return Err(format!(
                "submit_max must be at most {}, got {}",
                MAX_SUBMIT_MAX, self.submit_max
            ));
        }
        if self.submit_depth > MAX_SUBMIT_DEPTH {
            return Err(format!(
                "submit_depth must be at most {}, got {}",
                MAX_SUBMIT_DEPTH, self.submit_depth
            ));
        }
        if self.submit.iter().any(|q| q.trim().is_empty()) {
            return Err("submit must list queue names or ids, not empty strings".into());
        }
        for d in &self.dirs {
            if !d.host.is_dir() {
                return Err(format!(
                    "granted directory {} does not exist or is not a directory",
                    d.host.display()
                ));
            }
        }
        Ok(())
    }
}

/// Parses one `network_allow` entry: a CIDR (`10.0.0.0/8`) or a single address.
pub fn parse_network_allow(entry: &str) -> Result<IpNet, String> {
    let entry = entry.trim();
    entry
        .parse::<IpNet>()
        .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("{entry:?} is not an IP address or a CIDR range like 10.0.0.0/8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_grants_parse() {
        let g: DirGrant = "/data".parse().unwrap();
        assert_eq!(
            (g.host.to_str().unwrap(), g.guest.as_str(), g.writable),
            ("/data", "/data", false)
        );
        let g: DirGrant = "/data:/in".parse().unwrap();
        assert_eq!((g.guest.as_str(), g.writable), ("/in", false));
        let g: DirGrant = "/data:/out:rw".parse().unwrap();
        assert_eq!((g.guest.as_str(), g.writable), ("/out", true));
        let g: DirGrant = "/data:rw".parse().unwrap();
        assert_eq!((g.guest.as_str(), g.writable), ("/data", true));
        assert!("a:b:c:d".parse::<DirGrant>().is_err());
        assert!(":x".parse::<DirGrant>().is_err());
    }

    #[test]
    fn validation_names_the_problem() {
        let s = Sandbox {
            dirs: vec!["/definitely/not/here".parse().unwrap()],
            ..Sandbox::default()
        };
        assert!(s.validate().unwrap_err().contains("/definitely/not/here"));
        let s = Sandbox {
            memory: MAX_MEMORY + 1,
            ..Sandbox::default()
        };
        assert!(s.validate().unwrap_err().contains("memory"));
        let s = Sandbox {
            timeout: MAX_TIMEOUT + Duration::from_secs(1),
            ..Sandbox::default()
        };
        assert!(s.validate().unwrap_err().contains("timeout must be at most"));
    }
}
