//! Sandbox settings of one task and the WASI context built from them.
//!
//! The default sandbox grants nothing: no preopened directories, no environment variables,
//! no arguments, no network, stdin closed. Everything a plugin may touch is granted here
//! explicitly, per queue (DEN) or per call (`runner exec`).

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use wasmtime_wasi::{FsPerms, HostMonotonicClock, WasiCtx, WasiCtxBuilder};

use super::output::CappedOutput;

/// Default wall-time limit of one task.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3600);
/// Default linear-memory limit of one task, in bytes (1 GiB).
pub const DEFAULT_MEMORY: u64 = 1024 * 1024 * 1024;
/// Default cap of each captured output stream, in bytes (64 MiB).
pub const DEFAULT_OUTPUT_CAP: usize = 64 * 1024 * 1024;
/// The largest memory limit a sandbox may set (the engine's per-instance maximum, 4 GiB).
pub const MAX_MEMORY: u64 = 4 * 1024 * 1024 * 1024;
/// The longest wall-time limit a sandbox may set: the longest duration the config accepts
/// (365 days).
pub const MAX_TIMEOUT: Duration = crate::config::MAX_DURATION;

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
    /// Internal ranges a plugin with `network` may reach anyway (see [`super::egress`]).
    pub network_allow: Vec<ipnet::IpNet>,
    /// Bytes the task may write into its writable grants (see [`super::quota`]).
    pub write_quota: u64,
    /// Files and directories the task may create in its writable grants.
    pub file_quota: u64,
    /// Hosts the plugin may send HTTP requests to (see [`super::http`]); none by default.
    pub http: Vec<super::HttpRule>,
    /// HTTP requests one task may send.
    pub http_max_requests: u32,
    /// Body bytes one task's HTTP requests and responses may carry, together.
    pub http_max_body: u64,
    /// Queues (names or ids) the plugin may submit follow-up tasks to (see
    /// [`super::submit`]); none by default.
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
            write_quota: super::quota::DEFAULT_WRITE_QUOTA,
            file_quota: super::quota::DEFAULT_FILE_QUOTA,
            http: Vec::new(),
            http_max_requests: super::http::DEFAULT_MAX_REQUESTS,
            http_max_body: super::http::DEFAULT_MAX_BODY,
            submit: Vec::new(),
            submit_max: super::submit::DEFAULT_SUBMIT_MAX,
            submit_depth: super::submit::DEFAULT_SUBMIT_DEPTH,
            depth: 0,
        }
    }
}

impl Sandbox {
    /// Refuses any directory grant that equals, contains or lies inside one of the
    /// `protected` host paths (the component cache, its key, the plugin directory, the
    /// DEN's configuration and database): a plugin must never reach what the host trusts.
    /// Refuses as well any grant on a kernel filesystem (procfs, sysfs, devtmpfs…) or
    /// holding a mount of one (see [`super::kernelfs`]).
    pub fn check_grants(&self, protected: &[PathBuf]) -> Result<(), String> {
        for d in &self.dirs {
            if let Some(why) = super::kernelfs::grant_problem(&d.host) {
                return Err(format!(
                    "grant of {} is refused: {why}; kernel filesystems expose the host's processes, memory and devices \
                     (grant a directory that is on no such filesystem and holds no mount of one)",
                    d.host.display()
                ));
            }
            if let Some(p) = super::cache::grant_conflict(&d.host, protected) {
                return Err(format!(
                    "grant of {} is refused: it overlaps the protected host path {} (retrying cannot help; grant a directory that neither contains nor lies inside it)",
                    d.host.display(),
                    p.display()
                ));
            }
        }
        Ok(())
    }

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
        if self.submit_max > super::submit::MAX_SUBMIT_MAX {
            return Err(format!(
                "submit_max must be at most {}, got {}",
                super::submit::MAX_SUBMIT_MAX,
                self.submit_max
            ));
        }
        if self.submit_depth > super::submit::MAX_SUBMIT_DEPTH {
            return Err(format!(
                "submit_depth must be at most {}, got {}",
                super::submit::MAX_SUBMIT_DEPTH,
                self.submit_depth
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

    /// Builds the WASI context of one task, writing its streams into `stdout`/`stderr`.
    pub(crate) fn wasi_ctx(
        &self,
        stdout: CappedOutput,
        stderr: CappedOutput,
        clock: impl HostMonotonicClock + 'static,
    ) -> Result<WasiCtx, String> {
        let mut b = WasiCtxBuilder::new();
        b.stdout(stdout).stderr(stderr).monotonic_clock(clock);
        for (k, v) in &self.env {
            b.env(k, v);
        }
        for d in &self.dirs {
            match super::kernelfs::of_path(&d.host) {
                Ok(None) => {}
                Ok(Some(fs)) => {
                    return Err(format!(
                        "granted directory {} is on a kernel filesystem ({fs}) and is refused (retrying cannot help)",
                        d.host.display()
                    ))
                }
                Err(e) => return Err(format!("cannot open granted directory {}: {e}", d.host.display())),
            }
            let perms = if d.writable {
                FsPerms::ReadWrite
            } else {
                FsPerms::ReadOnly
            };
            b.preopened_dir(&d.host, &d.guest, perms)
                .map_err(|e| format!("cannot open granted directory {}: {e}", d.host.display()))?;
        }
        if self.network {
            b.socket_addr_check(super::egress::checker(&self.network_allow))
                .allow_ip_name_lookup(true)
                .allow_tcp(true)
                .allow_udp(true);
        } else {
            b.allow_tcp(false).allow_udp(false).allow_ip_name_lookup(false);
        }
        Ok(b.build())
    }
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
