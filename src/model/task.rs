//! A task document and its outputs.

use std::fmt;

use bson::oid::ObjectId;
use bson::{DateTime, Document};

use super::retry::Attempt;
use super::stop::{StopRequest, TaskProgress};

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
    /// Status code (see [`super::status`]).
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
    /// When its last run started (`started`), written by the start of a task of a
    /// rate-limited queue: the time of the rate grant it started under
    /// (`lifecycle::rate`).
    pub started: Option<DateTime>,
    /// Claim priority within its queue (`priority`): higher first, then the queue's
    /// `sort`. `None` for a task written without one (by a Disbatch 4 tool).
    pub priority: Option<i64>,
    /// Who cancelled the task or asked for it to be killed, when and why (`stop`).
    pub stop: Option<StopRequest>,
    /// The latest progress its plugin reported (`progress`), kept when it ends.
    pub progress: Option<TaskProgress>,
    /// Its earlier runs, oldest first (`attempts`); empty for a task run at most once.
    pub attempts: Vec<Attempt>,
    /// How many older records `attempts` dropped to keep the last
    /// [`ATTEMPTS_KEPT`](super::retry::ATTEMPTS_KEPT) (see
    /// [`attempts_dropped`](super::retry::attempts_dropped)).
    pub attempts_dropped: u64,
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
    /// The `status` of a task whose stored status cannot be read (its `problem` says why),
    /// on either store.
    pub const UNREADABLE_STATUS: i32 = i32::MIN;
    /// The `queue` of a task whose stored queue id cannot be read (its `problem` says why),
    /// on either store.
    pub const UNREADABLE_QUEUE: ObjectId = ObjectId::from_bytes([0; 12]);

    /// The output files the task uses: its stdout and stderr, and those its `attempts`
    /// records kept. Any other file written for it is used by nothing.
    pub fn output_files(&self) -> Vec<ObjectId> {
        let runs = self.attempts.iter().flat_map(|a| [&a.stdout, &a.stderr]);
        [&self.stdout, &self.stderr]
            .into_iter()
            .chain(runs)
            .filter_map(|o| match o {
                Some(Output::File(id)) => Some(*id),
                _ => None,
            })
            .collect()
    }

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
