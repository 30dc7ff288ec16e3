//! A node (DEN) document and the process holding its name.

use bson::oid::ObjectId;
use bson::DateTime;
use serde::{Deserialize, Serialize};

use super::stats::NodeStats;

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
