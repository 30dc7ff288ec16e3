//! What running one task produced: status, output, timing, progress and, when the task
//! failed, a typed reason.

use std::fmt;
use std::time::Duration;

use super::output::Captured;

/// Status of a task that succeeded.
pub const SUCCEEDED: u32 = 1;
/// Status of a task that failed (also used for every failure the host detects).
pub const FAILED: u32 = 2;

/// Why a task did not end with the status its plugin chose.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Failure {
    /// The plugin returned `err(message)`.
    Plugin(String),
    /// The plugin returned a status that is not positive (`ok(0)`).
    NonPositiveStatus(u32),
    /// The plugin ran past its deadline and was interrupted.
    Timeout(Duration),
    /// The plugin asked for more linear memory than its limit and then failed.
    Memory {
        /// The limit in bytes.
        limit: u64,
    },
    /// The plugin trapped (panic, `unreachable`, stack overflow, out-of-bounds access…).
    Trap(String),
    /// The file is not a loadable Disbatch plugin component.
    InvalidComponent(String),
    /// The host could not set up the sandbox (for example a granted directory is missing).
    Sandbox(String),
    /// Someone killed the task while it ran: who, when and why.
    Killed(String),
    /// The plugin reported no progress for its queue's `activity_timeout`.
    Stuck(Duration),
}

impl Failure {
    /// A short machine-friendly name of the reason.
    pub fn kind(&self) -> &'static str {
        match self {
            Failure::Plugin(_) => "plugin-error",
            Failure::NonPositiveStatus(_) => "non-positive-status",
            Failure::Timeout(_) => "timeout",
            Failure::Memory { .. } => "memory-limit",
            Failure::Trap(_) => "trap",
            Failure::InvalidComponent(_) => "invalid-component",
            Failure::Sandbox(_) => "sandbox",
            Failure::Killed(_) => "killed",
            Failure::Stuck(_) => "stuck",
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Plugin(msg) => write!(f, "plugin error: {msg}"),
            Failure::NonPositiveStatus(s) => {
                write!(
                    f,
                    "plugin returned status {s}; a finished task's status must be positive"
                )
            }
            Failure::Timeout(d) => write!(
                f,
                "timeout: plugin still running after {}",
                humantime::format_duration(*d)
            ),
            Failure::Memory { limit } => {
                write!(
                    f,
                    "memory limit: plugin tried to grow its memory past {}",
                    super::output::human_bytes(*limit)
                )
            }
            Failure::Trap(msg) => write!(f, "trap: {msg}"),
            Failure::InvalidComponent(msg) => write!(f, "invalid component: {msg}"),
            Failure::Sandbox(msg) => write!(f, "sandbox setup failed: {msg}"),
            Failure::Killed(msg) => write!(f, "{msg}"),
            Failure::Stuck(d) => write!(
                f,
                "stuck: the plugin reported no progress for {} (the queue's activity_timeout), so it was killed",
                humantime::format_duration(*d)
            ),
        }
    }
}

/// One `progress` call of a plugin.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    /// Time since the task started.
    pub at: Duration,
    /// Percent done, clamped to 0..=100.
    pub percent: Option<f32>,
    /// Short message (at most 1 KiB).
    pub info: Option<String>,
}

impl fmt::Display for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "progress")?;
        if let Some(p) = self.percent {
            write!(f, " {p:.1}%")?;
        }
        if let Some(i) = &self.info {
            write!(f, " {i}")?;
        }
        Ok(())
    }
}

/// The result of running one task.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The task's final status: the plugin's positive status, or [`FAILED`] when `failure`
    /// is set.
    pub status: u32,
    /// Captured stdout.
    pub stdout: Captured,
    /// Captured stderr.
    pub stderr: Captured,
    /// Wall time of instantiate + run.
    pub duration: Duration,
    /// The most recent progress reports (see [`MAX_PROGRESS`](super::MAX_PROGRESS)).
    pub progress: Vec<Progress>,
    /// Why the task failed, when the host decided it.
    pub failure: Option<Failure>,
    /// What the sandbox refused while the task ran (an HTTP request to a host its queue
    /// does not list…), one line each, saying what to change.
    pub sandbox_notes: Vec<String>,
    /// The follow-up tasks the plugin submitted and the host accepted, in call order. The
    /// DEN creates them when the task succeeded; `runner exec` shows them.
    pub submitted: Vec<super::Submission>,
}

impl Outcome {
    /// An outcome for a task that never got to run (invalid component, sandbox setup).
    pub fn not_run(failure: Failure) -> Self {
        Outcome {
            status: FAILED,
            stdout: Captured::default(),
            stderr: Captured::default(),
            duration: Duration::ZERO,
            progress: Vec::new(),
            failure: Some(failure),
            sandbox_notes: Vec::new(),
            submitted: Vec::new(),
        }
    }

    /// Whether the task succeeded (status 1, no failure).
    pub fn succeeded(&self) -> bool {
        self.failure.is_none() && self.status == SUCCEEDED
    }

    /// The host's notes on this run, each one line without brackets: what was replaced or
    /// dropped of the output and, last, why the task failed. They are the host's alone:
    /// [`Outcome::output_texts`] appends them to stderr as `[disbatch: …]` lines, and marks
    /// any plugin line starting that way as the plugin's.
    pub fn notes(&self) -> Vec<String> {
        let invalid = |c: &Captured| std::str::from_utf8(&c.bytes).is_err();
        self.notes_given(invalid(&self.stdout), invalid(&self.stderr))
    }

    /// The notes, given whether each stream's invalid UTF-8 was replaced.
    fn notes_given(&self, stdout_replaced: bool, stderr_replaced: bool) -> Vec<String> {
        let mut notes = Vec::new();
        for (name, replaced) in [("stdout", stdout_replaced), ("stderr", stderr_replaced)] {
            if replaced {
                notes.push(format!("invalid UTF-8 in {name} was replaced with U+FFFD"));
            }
        }
        notes.extend(self.sandbox_notes.iter().cloned());
        if let Some(f) = &self.failure {
            notes.push(f.to_string());
        }
        notes
    }

    /// The task's stdout and stderr as text, the way they are stored with the task.
    ///
    /// Each stream ends with a truncation marker when output was dropped. stderr then gets
    /// the host's [notes](Outcome::notes), one `[disbatch: …]` line each, so every failure
    /// explains itself.
    pub fn output_texts(&self) -> (String, String) {
        let (stdout, stdout_replaced) = self.stdout.to_text();
        let (mut stderr, stderr_replaced) = self.stderr.to_text();
        for note in self.notes_given(stdout_replaced, stderr_replaced) {
            if !stderr.is_empty() && !stderr.ends_with('\n') {
                stderr.push('\n');
            }
            stderr.push_str("[disbatch: ");
            stderr.push_str(&note);
            stderr.push_str("]\n");
        }
        (stdout, stderr)
    }
}
