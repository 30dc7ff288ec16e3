//! The fields of a task's life beyond Disbatch 4's: `progress` and `stop`.

use std::fmt;

use bson::{DateTime, Document};
use serde::{Deserialize, Serialize};

/// A task's `progress` sub-document: `{percent, info, at}`, what its plugin last reported
/// through the `progress` import.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskProgress {
    /// Percent done (0–100), when the plugin gave one.
    pub percent: Option<f64>,
    /// The plugin's message (at most 1 KiB).
    pub info: String,
    /// When it was reported.
    pub at: DateTime,
}

impl TaskProgress {
    /// The sub-document as stored.
    pub fn to_document(&self) -> Document {
        bson::doc! {
            "percent": self.percent.map_or(bson::Bson::Null, bson::Bson::Double),
            "info": &self.info,
            "at": self.at,
        }
    }

    /// Reads a stored `progress` sub-document leniently: a field of another type is left
    /// out rather than making the task unreadable.
    pub fn from_document(d: &Document) -> TaskProgress {
        let percent = match d.get("percent") {
            Some(bson::Bson::Double(f)) => Some(*f),
            Some(bson::Bson::Int32(n)) => Some(f64::from(*n)),
            Some(bson::Bson::Int64(n)) => Some(*n as f64),
            _ => None,
        };
        TaskProgress {
            percent,
            info: d.get_str("info").unwrap_or_default().to_string(),
            at: d.get_datetime("at").copied().unwrap_or(DateTime::MIN),
        }
    }
}

/// What ends a task from outside: a cancel (before it starts) or a kill (while it runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StopAction {
    /// Ended before it started: status cancelled (-5).
    Cancel,
    /// Its plugin is interrupted; the task ends failed (2).
    Kill,
}

impl StopAction {
    /// `cancel` or `kill`.
    pub fn as_str(self) -> &'static str {
        match self {
            StopAction::Cancel => "cancel",
            StopAction::Kill => "kill",
        }
    }
}

/// A task's `stop` sub-document: `{action, by, at, reason}`.
#[derive(Debug, Clone, PartialEq)]
pub struct StopRequest {
    /// Cancel or kill.
    pub action: StopAction,
    /// Who asked (the API caller's name, or `"api"`).
    pub by: String,
    /// When it was asked.
    pub at: DateTime,
    /// Why, as the caller said (may be empty).
    pub reason: String,
}

impl StopRequest {
    /// A request made now.
    pub fn now(action: StopAction, by: impl Into<String>, reason: impl Into<String>) -> StopRequest {
        StopRequest {
            action,
            by: by.into(),
            at: DateTime::now(),
            reason: reason.into(),
        }
    }

    /// The sub-document as stored.
    pub fn to_document(&self) -> Document {
        bson::doc! {
            "action": self.action.as_str(),
            "by": &self.by,
            "at": self.at,
            "reason": &self.reason,
        }
    }

    /// Reads a stored `stop` sub-document; the error names what is wrong.
    pub fn from_document(d: &Document) -> Result<StopRequest, String> {
        let action = match d.get_str("action") {
            Ok("cancel") => StopAction::Cancel,
            Ok("kill") => StopAction::Kill,
            _ => return Err("field `stop.action` must be \"cancel\" or \"kill\"".into()),
        };
        let text = |k: &str| match d.get(k) {
            None | Some(bson::Bson::Null) => Ok(String::new()),
            Some(bson::Bson::String(s)) => Ok(s.clone()),
            Some(_) => Err(format!("field `stop.{k}` must be a string")),
        };
        let at = match d.get("at") {
            Some(bson::Bson::DateTime(t)) => *t,
            _ => return Err("field `stop.at` must be a date".into()),
        };
        Ok(StopRequest {
            action,
            by: text("by")?,
            at,
            reason: text("reason")?,
        })
    }
}

impl StopRequest {
    /// A stored kill request as well as it can be read: one that cannot be read (written
    /// by another tool) still stops the task, with the problem as its reason.
    pub fn stored_kill(stored: Result<Document, String>) -> StopRequest {
        stored
            .and_then(|d| StopRequest::from_document(&d))
            .unwrap_or_else(|e| StopRequest::now(StopAction::Kill, "", format!("unreadable kill request ({e})")))
    }
}

impl fmt::Display for StopRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = match self.action {
            StopAction::Cancel => "cancelled",
            StopAction::Kill => "killed",
        };
        let by = if self.by.is_empty() { "the API" } else { &self.by };
        write!(
            f,
            "{verb} by {by} at {}",
            self.at.try_to_rfc3339_string().unwrap_or_default()
        )?;
        if !self.reason.is_empty() {
            write!(f, ": {}", self.reason)?;
        }
        Ok(())
    }
}
