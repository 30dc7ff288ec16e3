//! The `sandbox` section of the config file: the defaults of every queue's sandbox.

use std::time::Duration;

use serde_json::Value;

use super::{describe, hint, ConfigError, Parser, MAX_OUTPUT_CAP_MIB, SANDBOX_KEYS};
use crate::sandbox_spec::{DirGrant, HttpRule, Sandbox, MAX_MEMORY, MAX_SUBMIT_DEPTH, MAX_SUBMIT_MAX};

impl Parser<'_> {
    /// `sandbox`: the same settings as a queue's `sandbox` sub-document, over the runner's
    /// defaults, checked with [`Sandbox::validate`].
    pub(super) fn sandbox(&self) -> Result<Sandbox, ConfigError> {
        let mut s = Sandbox::default();
        let Some(obj) = self.object("sandbox")? else {
            return Ok(s);
        };
        for (k, v) in obj.iter().filter(|(_, v)| !v.is_null()) {
            let key = format!("sandbox.{k}");
            match k.as_str() {
                "timeout" => s.timeout = self.timeout(&key, v)?,
                "memory_mib" => s.memory = self.integer(&key, v, 1, MAX_MEMORY >> 20)? << 20,
                "write_quota_mib" => s.write_quota = self.integer(&key, v, 0, u64::MAX >> 20)? << 20,
                "file_quota" => s.file_quota = self.integer(&key, v, 0, u64::MAX)?,
                "http_max_requests" => s.http_max_requests = self.integer(&key, v, 0, u32::MAX.into())? as u32,
                "http_max_body_mib" => s.http_max_body = self.integer(&key, v, 0, u64::MAX >> 20)? << 20,
                "http" => {
                    let Value::Array(items) = v else {
                        return Err(self.invalid(
                            &key,
                            format!("must be a list of hosts like \"api.example.com\", got {}", describe(v)),
                        ));
                    };
                    for (i, item) in items.iter().enumerate() {
                        let rule: HttpRule = item
                            .as_str()
                            .ok_or_else(|| format!("must be a string like \"api.example.com\", got {}", describe(item)))
                            .and_then(str::parse)
                            .map_err(|e| self.invalid(&format!("{key}[{i}]"), e))?;
                        s.http.push(rule);
                    }
                }
                "submit_max" => s.submit_max = self.integer(&key, v, 0, MAX_SUBMIT_MAX.into())? as u32,
                "submit_depth" => s.submit_depth = self.integer(&key, v, 0, MAX_SUBMIT_DEPTH.into())? as u32,
                "submit" => {
                    let Value::Array(items) = v else {
                        return Err(self.invalid(
                            &key,
                            format!("must be a list of queue names or ids, got {}", describe(v)),
                        ));
                    };
                    for (i, item) in items.iter().enumerate() {
                        let name = item.as_str().filter(|q| !q.trim().is_empty()).ok_or_else(|| {
                            self.invalid(
                                &format!("{key}[{i}]"),
                                format!("must be a queue name or id, got {}", describe(item)),
                            )
                        })?;
                        s.submit.push(name.to_owned());
                    }
                }
                "output_cap_mib" => {
                    let mib = self.integer(&key, v, 0, MAX_OUTPUT_CAP_MIB)?;
                    s.output_cap = usize::try_from(mib << 20).map_err(|_| self.invalid(&key, "is too large"))?;
                }
                "dirs" => {
                    let Value::Array(items) = v else {
                        return Err(self.invalid(
                            &key,
                            format!("must be an array of directory grants, got {}", describe(v)),
                        ));
                    };
                    for (i, item) in items.iter().enumerate() {
                        let key = format!("{key}[{i}]");
                        let grant: DirGrant = item
                            .as_str()
                            .ok_or_else(|| {
                                format!("must be a string \"host[:guest][:rw|:ro]\", got {}", describe(item))
                            })
                            .and_then(str::parse)
                            .map_err(|e| self.invalid(&key, e))?;
                        if !grant.host.is_dir() {
                            return Err(self.invalid(
                                &key,
                                format!("{} does not exist or is not a directory", grant.host.display()),
                            ));
                        }
                        s.dirs.push(grant);
                    }
                }
                "env" => {
                    let Value::Object(vars) = v else {
                        return Err(self.invalid(&key, format!("must be an object of strings, got {}", describe(v))));
                    };
                    for (name, value) in vars {
                        let key = format!("{key}.{name}");
                        if name.is_empty() || name.contains(['=', '\0']) {
                            return Err(self.invalid(&key, "is not a valid environment variable name"));
                        }
                        let Some(value) = value.as_str().filter(|s| !s.contains('\0')) else {
                            return Err(self.invalid(&key, format!("must be a string, got {}", describe(value))));
                        };
                        s.env.insert(name.clone(), value.to_owned());
                    }
                }
                "network" => s.network = self.opt_bool(&key, Some(v))?.unwrap_or(false),
                "network_allow" => {
                    let Value::Array(items) = v else {
                        return Err(self.invalid(
                            &key,
                            format!("must be a list of CIDRs or addresses, got {}", describe(v)),
                        ));
                    };
                    for item in items {
                        let net = item
                            .as_str()
                            .ok_or_else(|| format!("must be a string like \"10.0.0.0/8\", got {}", describe(item)))
                            .and_then(crate::sandbox_spec::parse_network_allow)
                            .map_err(|e| self.invalid(&key, e))?;
                        s.network_allow.push(net);
                    }
                }
                _ => {
                    return Err(self.invalid(
                        &key,
                        format!(
                            "is not a sandbox setting{} (settings are {})",
                            hint(k, &SANDBOX_KEYS),
                            SANDBOX_KEYS.join(", ")
                        ),
                    ))
                }
            }
        }
        s.validate().map_err(|e| self.invalid("sandbox", e))?;
        Ok(s)
    }

    /// `sandbox.timeout`: positive seconds or a humantime string such as `"30s"`.
    fn timeout(&self, key: &str, v: &Value) -> Result<Duration, ConfigError> {
        let bad = || {
            self.invalid(
                key,
                format!(
                    "must be a positive number of seconds or a duration like \"30s\", got {}",
                    describe(v)
                ),
            )
        };
        let d = match v {
            Value::Number(n) => {
                let secs = n.as_f64().filter(|s| *s > 0.0).ok_or_else(bad)?;
                Duration::try_from_secs_f64(secs).ok()
            }
            Value::String(t) => Some(humantime::parse_duration(t).map_err(|_| bad())?),
            _ => return Err(bad()),
        };
        if d.is_some_and(|d| d.is_zero()) {
            return Err(bad());
        }
        self.bounded(key, d)
    }
}
