//! The Disbatch 4 documents as types: tasks, queues, nodes and status codes.
//!
//! Field names and BSON types are exactly the spec's (`queue` is an ObjectId, `ctime` and
//! `mtime` are dates, `node` is null until claimed, `stdout`/`stderr` are null until the
//! task finishes and then a string or a GridFS file id). Fields we add are optional, so
//! documents written by any other Disbatch 4 client read fine.

use std::fmt;

use bson::oid::ObjectId;
use bson::{DateTime, Document};
use serde::{Deserialize, Serialize};

use crate::sandbox_spec::Sandbox;

pub mod balance;
mod lifecycle;
mod retry;
pub use self::lifecycle::{StopAction, StopRequest, TaskProgress};
pub use self::retry::{
    activity_timeout_from, counted_runs, kept_output, queue_lifecycle, Attempt, QueueLifecycle, RetryAt, RetryOn,
    RetryPolicy, BY_HAND, PREFER_OTHER_NODE, RESUBMITTED,
};

/// Task status codes of the Disbatch 4 spec.
pub mod status {
    /// Scheduled: waiting for its `run_at` time, then queued (-2). Not a Disbatch 4 code:
    /// the spec's DENs claim only -2, so they never run a task before its time.
    pub const SCHEDULED: i32 = -7;
    /// Orphaned: was being worked on, then the work was disrupted.
    pub const ORPHANED: i32 = -6;
    /// Cancelled (formerly defined; blocks claiming).
    pub const CANCELLED: i32 = -5;
    /// Blocked: waiting for the tasks it was submitted `after` (Disbatch 4 defines the
    /// code and never claims it).
    pub const BLOCKED: i32 = -4;
    /// Terminated (formerly defined; blocks claiming).
    pub const TERMINATED: i32 = -3;
    /// Queued: waiting to be claimed.
    pub const QUEUED: i32 = -2;
    /// Claimed by a DEN, not yet started.
    pub const CLAIMED: i32 = -1;
    /// Running.
    pub const RUNNING: i32 = 0;
    /// Succeeded.
    pub const SUCCEEDED: i32 = 1;
    /// Failed.
    pub const FAILED: i32 = 2;

    /// The statuses at or below zero of a task that has ended: with every positive status
    /// (succeeded, failed, or a plugin's own code), what [`finished`] means.
    pub const ENDED_HELD: [i32; 3] = [ORPHANED, CANCELLED, TERMINATED];

    /// The statuses of a task waiting to be claimed, the ones a cancel may stop.
    pub const WAITING: [i32; 3] = [QUEUED, SCHEDULED, BLOCKED];

    /// The statuses of a task a node holds (claimed or running), the ones a kill may stop
    /// and recovery looks at.
    pub const BUSY: [i32; 2] = [CLAIMED, RUNNING];

    /// The statuses of a task that has not ended: the complement of [`finished`].
    pub const UNENDED: [i32; 5] = [SCHEDULED, BLOCKED, QUEUED, CLAIMED, RUNNING];

    /// Whether a task with this status has ended (any positive status, orphaned,
    /// cancelled or terminated): it runs no more unless it is retried.
    pub fn finished(code: i32) -> bool {
        code > 0 || ENDED_HELD.contains(&code)
    }

    /// A short name of a status code.
    pub fn name(code: i32) -> &'static str {
        match code {
            SCHEDULED => "scheduled",
            ORPHANED => "orphaned",
            CANCELLED => "cancelled",
            BLOCKED => "blocked",
            TERMINATED => "terminated",
            QUEUED => "queued",
            CLAIMED => "claimed",
            RUNNING => "running",
            SUCCEEDED => "succeeded",
            FAILED => "failed",
            c if c > 0 => "finished",
            _ => "held",
        }
    }
}

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

/// Largest integer a Double represents exactly (2^53).
pub const MAX_EXACT_DOUBLE: f64 = 9_007_199_254_740_992.0;

/// An integer as other clients write it: Int32, Int64, an integral Double or a string
/// holding a decimal integer (Perl writes form values as strings).
pub fn lenient_int(value: &bson::Bson) -> Option<i64> {
    use bson::Bson;
    match value {
        Bson::Int32(n) => Some(i64::from(*n)),
        Bson::Int64(n) => Some(*n),
        Bson::Double(f) if f.fract() == 0.0 && f.abs() <= MAX_EXACT_DOUBLE => Some(*f as i64),
        Bson::String(s) => {
            let s = s.trim();
            s.parse::<i64>().ok().or_else(|| {
                s.parse::<f64>()
                    .ok()
                    .filter(|f| f.is_finite())
                    .and_then(|f| lenient_int(&Bson::Double(f)))
            })
        }
        _ => None,
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

pub(crate) mod opt_duration {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_str(&humantime::format_duration(*d).to_string()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Secs(f64),
            Text(String),
        }
        match Option::<Raw>::deserialize(d)? {
            None => Ok(None),
            Some(Raw::Secs(s)) if s > 0.0 => Duration::try_from_secs_f64(s)
                .map(Some)
                .map_err(|_| serde::de::Error::custom(format!("{s} s is too large"))),
            Some(Raw::Secs(s)) => Err(serde::de::Error::custom(format!(
                "a duration must be positive, got {s}"
            ))),
            Some(Raw::Text(t)) => humantime::parse_duration(&t)
                .map(Some)
                .map_err(|e| serde::de::Error::custom(format!("invalid duration {t:?}: {e}"))),
        }
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

/// A node (DEN) document.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// `_id`.
    pub id: ObjectId,
    /// Unique node name (the hostname by default).
    pub node: String,
    /// Last heartbeat.
    pub timestamp: DateTime,
    /// Per-node limit of concurrent tasks; `None` means no limit.
    pub maxthreads: Option<i64>,
    /// The DEN's claim and run durations since it started (`stats`), when it reported any.
    pub stats: Option<NodeStats>,
    /// The DEN process that holds this node name (`process`), when one has taken it.
    pub process: Option<NodeProcess>,
    /// Why this DEN cannot run some queues (`queue_problems`: queue id in hex → reason),
    /// such as a plugin file that is not a component or an invalid sandbox.
    pub queue_problems: std::collections::BTreeMap<String, String>,
    /// Why a field of the document could not be read as written, and what it was taken
    /// as instead (say a `maxthreads` that is not a number).
    pub problem: Option<String>,
}

/// The DEN process holding a node name (the node document's `process` sub-document). A
/// DEN takes its node name at start-up and refuses to start while another live process
/// holds it, since two DENs heartbeating one node document would keep each other's
/// tasks from ever being recovered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeProcess {
    /// Random per process start.
    pub id: ObjectId,
    /// Hostname of the machine the process runs on.
    pub host: String,
    /// Process id on that machine.
    pub pid: u32,
    /// When the process took the node name.
    pub started: DateTime,
}

/// Who holds a node name that a starting DEN wants.
#[derive(Debug, Clone, PartialEq)]
pub enum NameHolder {
    /// A DEN of this implementation.
    Den(NodeProcess),
    /// A DEN that writes no process marker in the node document (a Disbatch 4 DEN), whose
    /// last heartbeat is `heartbeat_age` old, with `tasks` claimed or running tasks (counted
    /// only once its heartbeat is stale).
    Foreign {
        /// The node's heartbeat (`timestamp`) as read, when readable: a DEN waiting for it
        /// to go stale tells a stopped holder from a running one by whether it moves.
        heartbeat: Option<DateTime>,
        /// Age of the node's heartbeat when the name was asked for.
        heartbeat_age: std::time::Duration,
        /// Its claimed and running tasks, which its task runners may still finish.
        tasks: u64,
    },
}

impl NodeProcess {
    /// The identity of this process, new on each call.
    pub fn this_process() -> NodeProcess {
        NodeProcess {
            id: ObjectId::new(),
            host: gethostname::gethostname().to_string_lossy().into_owned(),
            pid: std::process::id(),
            started: DateTime::now(),
        }
    }

    /// Whether this process certainly no longer runs: it ran on this machine and its pid
    /// is gone. A process on another machine is never known to be dead.
    pub fn is_dead_here(&self) -> bool {
        if self.host != gethostname::gethostname().to_string_lossy() || self.pid == std::process::id() {
            return false;
        }
        let Ok(pid) = libc::pid_t::try_from(self.pid) else {
            return false;
        };
        // SAFETY: signal 0 only checks that the process exists; nothing is sent.
        let r = unsafe { libc::kill(pid, 0) };
        r == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    }
}

/// Upper bounds (seconds) of the claim-duration buckets.
pub const CLAIM_BUCKETS: [f64; 10] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];
/// Upper bounds (seconds) of the run-duration buckets.
pub const RUN_BUCKETS: [f64; 13] = [
    0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0,
];

/// A node's `stats` sub-document: histograms of its DEN's claim round trips (successful
/// claims) and plugin runs, counted since the DEN started. `GET /metrics` serves them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeStats {
    /// Seconds per successful claim (the `findOneAndUpdate` round trip).
    pub claim: Histogram,
    /// Seconds per plugin run (instantiate, call, capture), whatever its outcome.
    pub run: Histogram,
}

impl Default for NodeStats {
    fn default() -> Self {
        NodeStats {
            claim: Histogram::new(&CLAIM_BUCKETS),
            run: Histogram::new(&RUN_BUCKETS),
        }
    }
}

/// A histogram of durations in seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    /// Upper bounds of the buckets, ascending.
    pub bounds: Vec<f64>,
    /// Observations per bucket, not cumulative: `counts[i]` for `bounds[i - 1] < x ≤ bounds[i]`,
    /// and one more entry at the end for everything above the last bound.
    pub counts: Vec<u64>,
    /// Sum of the observations.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl Histogram {
    /// An empty histogram with these bucket bounds.
    pub fn new(bounds: &[f64]) -> Histogram {
        Histogram {
            bounds: bounds.to_vec(),
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    /// Records one observation.
    pub fn observe(&mut self, seconds: f64) {
        let i = self.bounds.partition_point(|b| *b < seconds);
        if let Some(c) = self.counts.get_mut(i) {
            *c += 1;
        }
        self.sum += seconds;
        self.count += 1;
    }

    /// `(upper bound, cumulative count)` per bucket, ending with `(+∞, count)`, as
    /// Prometheus histograms expose them. Empty when `counts` does not match `bounds`.
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        if self.counts.len() != self.bounds.len() + 1 {
            return Vec::new();
        }
        let mut total = 0;
        let mut out: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .zip(&self.counts)
            .map(|(b, c)| {
                total += c;
                (*b, total)
            })
            .collect();
        out.push((f64::INFINITY, total + self.counts[self.bounds.len()]));
        out
    }
}

/// A task's stdout or stderr once it finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Stored in the task document.
    Inline(String),
    /// Stored as a GridFS file (`tasks.files` / `tasks.chunks`) with this id.
    File(ObjectId),
}

impl Output {
    /// The value as stored: the text, or the file's id.
    pub fn to_bson(&self) -> bson::Bson {
        match self {
            Output::Inline(s) => bson::Bson::String(s.clone()),
            Output::File(id) => bson::Bson::ObjectId(*id),
        }
    }
}

/// A task document.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// `_id`.
    pub id: ObjectId,
    /// The queue's `_id`.
    pub queue: ObjectId,
    /// Creation time.
    pub ctime: DateTime,
    /// Last modification time.
    pub mtime: DateTime,
    /// The DEN that claimed it, or `None` while queued.
    pub node: Option<String>,
    /// Status code (see [`status`]).
    pub status: i32,
    /// The task's parameters.
    pub params: Document,
    /// stdout once finished.
    pub stdout: Option<Output>,
    /// stderr once finished.
    pub stderr: Option<Output>,
    /// Set when the stored document could not be read as a task (written by another
    /// tool): what is wrong with it. The other fields are then best effort.
    pub problem: Option<String>,
    /// When a scheduled task becomes due (`run_at`); kept after it ran.
    pub run_at: Option<DateTime>,
    /// Claim priority within its queue (`priority`): higher first, then the queue's
    /// `sort`. `None` for a task written without one (by a Disbatch 4 tool).
    pub priority: Option<i64>,
    /// Who cancelled the task or asked for it to be killed, when and why (`stop`).
    pub stop: Option<StopRequest>,
    /// The latest progress its plugin reported (`progress`), kept when it ends.
    pub progress: Option<TaskProgress>,
    /// Its earlier runs, oldest first (`attempts`); empty for a task run at most once.
    pub attempts: Vec<Attempt>,
    /// Its key, unique within its queue (`key`), when it was created with one.
    pub key: Option<String>,
    /// The batch it was submitted in (`batch`), if any.
    pub batch: Option<String>,
    /// Set when it was submitted again while it ran: it runs once more when this run ends.
    pub rerun: bool,
    /// What it was submitted to wait for (`after`): task ids in hex, `batch:<id>` for a
    /// batch.
    pub after: Vec<String>,
    /// Of those, what it still waits for while blocked (`pending`).
    pub pending: Vec<String>,
    /// Whether it runs anyway when what it waits for fails (`after_failure: "run"`).
    pub after_failure_runs: bool,
    /// Whether blocked tasks may wait for it (`dependents`), until its end released them.
    pub dependents: bool,
}

impl Task {
    /// The params as JSON text, the way the plugin receives them (relaxed Extended JSON, so
    /// plain values are plain JSON).
    pub fn params_json(&self) -> String {
        bson::Bson::Document(self.params.clone())
            .into_relaxed_extjson()
            .to_string()
    }
}

impl fmt::Display for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "task {}", self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::{Histogram, QueueSandbox};
    use crate::sandbox_spec::Sandbox;

    #[test]
    fn histogram_buckets_are_inclusive_upper_bounds() {
        let mut h = Histogram::new(&[0.01, 0.1]);
        for x in [0.005, 0.01, 0.05, 0.5, 7.0] {
            h.observe(x);
        }
        assert_eq!(h.counts, vec![2, 1, 2]);
        assert_eq!(h.cumulative(), vec![(0.01, 2), (0.1, 3), (f64::INFINITY, 5)]);
        assert_eq!(h.count, 5);
        assert!((h.sum - 7.565).abs() < 1e-9);
    }

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
