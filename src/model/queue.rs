//! A queue document and its `sandbox` sub-document.

use bson::oid::ObjectId;
use serde::{Deserialize, Serialize};

use super::lenient::{lenient_int, opt_duration};
use super::retry::RetryPolicy;
use crate::sandbox_spec::Sandbox;

/// The order in which a queue's tasks are claimed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Sort {
    /// Oldest first (`_id` ascending).
    Fifo,
    /// Newest first (`_id` descending).
    Lifo,
    /// Whatever order the store returns.
    #[default]
    Default,
}

impl Sort {
    /// Parses the spec's values; unknown values are an error naming them.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "fifo" => Ok(Sort::Fifo),
            "lifo" => Ok(Sort::Lifo),
            "default" => Ok(Sort::Default),
            other => Err(format!("invalid sort {other:?}: expected fifo, lifo or default")),
        }
    }
}

/// What happens to a task whose node died while it was claimed or running.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnOrphan {
    /// Mark it orphaned (-6), the spec's behaviour.
    #[default]
    Orphan,
    /// Put it back in the queue (-2, node null) to run again.
    Requeue,
}

/// A queue document.
#[derive(Debug, Clone, PartialEq)]
pub struct Queue {
    /// `_id`.
    pub id: ObjectId,
    /// Unique name.
    pub name: String,
    /// Plugin name (an entry of the config's `plugins` allowlist).
    pub plugin: String,
    /// Cluster-wide limit of concurrently claimed/running tasks; `None` or 0 pauses the queue.
    pub threads: Option<i64>,
    /// Claim order.
    pub sort: Sort,
    /// Sandbox grants and limits for this queue's tasks (`sandbox` sub-document).
    pub sandbox: QueueSandbox,
    /// Recovery policy for tasks of dead nodes (`on_orphan`).
    pub on_orphan: OnOrphan,
    /// How failed tasks run again (`retry`); `None` runs each task once.
    pub retry: Option<RetryPolicy>,
    /// How long a running task may go without reporting progress before it is killed as
    /// stuck (`activity_timeout`).
    pub activity_timeout: Option<std::time::Duration>,
    /// The queue (name or id) each succeeded task's result goes to as a new task
    /// (`next_queue`), if any.
    pub next_queue: Option<String>,
    /// The QueueBalance's current share of this queue (`maxthreads`, written by the
    /// leader): while set, at most this many of its tasks are claimed or running at once,
    /// cluster-wide, whatever `threads` allows. `None` outside the balance.
    pub maxthreads: Option<i64>,
    /// At most `max` of its tasks start in any window of `per`, across every DEN (`rate`,
    /// see `lifecycle::rate`); `None` is no limit.
    pub rate: Option<super::Rate>,
    /// How long its ended tasks are kept (`retention`), over the config's default; `None`
    /// when it names none.
    pub retention: Option<super::Retention>,
}

impl Queue {
    /// How many of this queue's tasks may be claimed or running at once: `threads`,
    /// lowered to `maxthreads` while the QueueBalance limits the queue. 0 claims nothing.
    pub fn limit(&self) -> i64 {
        let threads = self.threads.unwrap_or(0).max(0);
        self.maxthreads.map_or(threads, |m| threads.min(m.max(0)))
    }

    /// Reads a queue's `maxthreads` leniently: a number (or a number written as a string,
    /// as Disbatch 4's tools do) that is not negative; anything else is noted in
    /// `problems` and read as 0, so a limit that cannot be read lets nothing more run.
    pub fn read_maxthreads(value: Option<&bson::Bson>, problems: &mut Vec<String>) -> Option<i64> {
        let value = value.filter(|v| !matches!(v, bson::Bson::Null))?;
        match lenient_int(value) {
            Some(n) if n >= 0 => Some(n),
            _ => {
                problems.push(format!(
                    "field `maxthreads` is {value}, not a non-negative integer; read as 0 (the queue claims nothing) until it is fixed"
                ));
                Some(0)
            }
        }
    }

    /// The queue of `queues` that `key` names: by `_id` (hex), else by name.
    pub fn find<'a>(queues: &'a [Queue], key: &str) -> Option<&'a Queue> {
        let by_id = ObjectId::parse_str(key)
            .ok()
            .and_then(|id| queues.iter().find(|q| q.id == id));
        by_id.or_else(|| queues.iter().find(|q| q.name == key))
    }
}

/// A queue's optional `sandbox` sub-document; unset fields take the DEN's defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueSandbox {
    /// Wall-time limit, e.g. "30s" or a number of seconds.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_duration")]
    pub timeout: Option<std::time::Duration>,
    /// Memory limit in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    /// Output cap per stream in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_cap_mib: Option<u64>,
    /// Directory grants: `"host[:guest][:rw]"`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dirs: Vec<String>,
    /// Environment variables given to the plugin.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub env: std::collections::BTreeMap<String, String>,
    /// Whether the plugin may use the network (internal addresses stay refused).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub network: bool,
    /// Bytes (in MiB) a task may write into its writable grants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_quota_mib: Option<u64>,
    /// Files and directories a task may create in its writable grants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_quota: Option<u64>,
    /// Internal ranges (CIDRs or addresses) the plugin may reach anyway, e.g. "10.0.0.0/8".
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_allow: Vec<String>,
    /// Hosts the plugin may send HTTP requests to: `[scheme://]host[:port]`, e.g.
    /// "api.example.com" or "https://*.corp:8443".
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http: Vec<String>,
    /// HTTP requests one task may send.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_max_requests: Option<u32>,
    /// Body bytes (in MiB) one task's HTTP requests and responses may carry together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_max_body_mib: Option<u64>,
    /// Queues (names or ids) the plugin may submit follow-up tasks to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub submit: Vec<String>,
    /// Follow-up tasks one task may submit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submit_max: Option<u32>,
    /// The deepest a follow-up may be in its lineage of follow-ups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submit_depth: Option<u32>,
}

impl QueueSandbox {
    /// The effective sandbox: this queue's settings over `defaults`.
    pub fn resolve(&self, defaults: &Sandbox) -> Result<Sandbox, String> {
        let mut s = defaults.clone();
        if let Some(t) = self.timeout {
            s.timeout = t;
        }
        if let Some(m) = self.memory_mib {
            s.memory = m.checked_mul(1 << 20).ok_or("sandbox.memory_mib is too large")?;
        }
        if let Some(c) = self.output_cap_mib {
            s.output_cap = c
                .checked_mul(1 << 20)
                .and_then(|b| usize::try_from(b).ok())
                .ok_or("sandbox.output_cap_mib is too large")?;
        }
        for d in &self.dirs {
            s.dirs.push(d.parse().map_err(|e| format!("sandbox.dirs: {e}"))?);
        }
        s.env.extend(self.env.clone());
        if let Some(q) = self.write_quota_mib {
            s.write_quota = q.checked_mul(1 << 20).ok_or("sandbox.write_quota_mib is too large")?;
        }
        if let Some(f) = self.file_quota {
            s.file_quota = f;
        }
        s.network |= self.network;
        for a in &self.network_allow {
            let net = crate::sandbox_spec::parse_network_allow(a).map_err(|e| format!("sandbox.network_allow: {e}"))?;
            s.network_allow.push(net);
        }
        for h in &self.http {
            s.http.push(h.parse().map_err(|e| format!("sandbox.http: {e}"))?);
        }
        if let Some(n) = self.http_max_requests {
            s.http_max_requests = n;
        }
        if let Some(m) = self.http_max_body_mib {
            s.http_max_body = m.checked_mul(1 << 20).ok_or("sandbox.http_max_body_mib is too large")?;
        }
        s.submit.extend(self.submit.iter().cloned());
        if let Some(n) = self.submit_max {
            s.submit_max = n;
        }
        if let Some(n) = self.submit_depth {
            s.submit_depth = n;
        }
        s.validate().map_err(|e| format!("sandbox: {e}"))?;
        Ok(s)
    }
}

/// A queue document that cannot be read as a queue (say `sandbox: {"bogus": 1}`): never
/// run, but listed with its problem so an operator can fix or delete it.
#[derive(Debug, Clone, PartialEq)]
pub struct UnreadableQueue {
    /// `_id`.
    pub id: ObjectId,
    /// `name`, when it is a string.
    pub name: Option<String>,
    /// `plugin`, when it is a string.
    pub plugin: Option<String>,
    /// `threads`, when it is an integer.
    pub threads: Option<i64>,
    /// Why it cannot be read, naming the field.
    pub problem: String,
}

#[cfg(test)]
mod tests {
    use super::QueueSandbox;
    use crate::sandbox_spec::Sandbox;

    #[test]
    fn huge_sandbox_values_are_errors_not_panics() {
        let s: Result<QueueSandbox, _> = serde_json::from_value(serde_json::json!({ "timeout": 1e300 }));
        assert!(s.unwrap_err().to_string().contains("too large"));
        let s: QueueSandbox = serde_json::from_value(serde_json::json!({ "output_cap_mib": u64::MAX })).unwrap();
        assert!(s.resolve(&Sandbox::default()).unwrap_err().contains("output_cap_mib"));
        let s: QueueSandbox = serde_json::from_value(serde_json::json!({ "memory_mib": u64::MAX })).unwrap();
        assert!(s.resolve(&Sandbox::default()).unwrap_err().contains("memory_mib"));
        // A queue document written straight to the database can carry a timeout the API refuses;
        // the DEN must fail such a task with a reason instead of overflowing its deadline.
        let s: QueueSandbox = serde_json::from_value(serde_json::json!({ "timeout": 1e18 })).unwrap();
        assert!(s
            .resolve(&Sandbox::default())
            .unwrap_err()
            .contains("timeout must be at most"));
    }
}
