//! What a task's sandbox refused, noted for its stderr.

use std::sync::{Arc, Mutex};

/// The most notes one task's requests leave in its stderr.
const MAX_NOTES: usize = 20;

/// The host's notes on one task: what its sandbox refused. Shared with the outcome.
#[derive(Clone, Default)]
pub(crate) struct Notes(Arc<Mutex<(Vec<String>, usize)>>);

impl Notes {
    pub(crate) fn push(&self, note: String) {
        tracing::debug!(%note, "sandbox refusal");
        let mut n = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if n.0.len() < MAX_NOTES {
            n.0.push(note);
        } else {
            n.1 += 1;
        }
    }

    /// The notes, with one saying how many more were not kept.
    pub(crate) fn take(&self) -> Vec<String> {
        let mut n = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (mut notes, more) = std::mem::take(&mut *n);
        if more > 0 {
            notes.push(format!("{more} more refusals of the sandbox were not noted"));
        }
        notes
    }
}
