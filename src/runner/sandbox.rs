//! The runner's half of a task's sandbox: refusing grants of paths the host trusts, and
//! the WASI context built from the settings ([`crate::sandbox_spec`], re-exported here).

use std::path::PathBuf;

use wasmtime_wasi::{FsPerms, HostMonotonicClock, WasiCtx, WasiCtxBuilder};

use super::output::CappedOutput;
pub use crate::sandbox_spec::{DirGrant, Sandbox, DEFAULT_MEMORY, DEFAULT_OUTPUT_CAP, DEFAULT_TIMEOUT, MAX_MEMORY};

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
