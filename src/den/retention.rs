//! The leader's retention: at most once per tick and at least every [`LONGEST_GAP`] (sooner
//! while a look leaves tasks to delete), after the schedules, one bounded look
//! (`lifecycle::retention`) deletes the ended tasks past their retention. Every
//! [`LONGEST_GAP`] it also sweeps up to [`FILE_PAGES`] pages of output files for files no
//! task uses (`lifecycle::files`), going on where the last sweep stopped.

use std::time::Duration;

use tracing::{debug, info, warn};

use super::Den;
use crate::lifecycle::files::{sweep_files, FILES_PER_PAGE};
use crate::lifecycle::retention::{sweep, Bounds};

/// The longest time between two looks.
pub const LONGEST_GAP: Duration = Duration::from_secs(30);

/// The most pages of output files one sweep looks at.
pub const FILE_PAGES: usize = 20;

/// Ticks between two looks when the last one left nothing (at most [`LONGEST_GAP`]).
const TICKS_BETWEEN: u32 = 30;

impl Den {
    /// One look when one is due; logs what it deleted.
    pub(super) async fn run_retention(&self) {
        let gap = self.settings.tick.saturating_mul(TICKS_BETWEEN).min(LONGEST_GAP);
        let due = match *self.retention_look.lock().unwrap_or_else(|e| e.into_inner()) {
            None => true,
            Some((at, more)) => more || at.elapsed() >= gap,
        };
        if !due {
            return;
        }
        let started = tokio::time::Instant::now();
        match sweep(
            &*self.store,
            &self.settings.retention,
            bson::DateTime::now(),
            Bounds::default(),
        )
        .await
        {
            Ok(swept) => {
                if swept.deleted > 0 {
                    info!(
                        deleted = swept.deleted,
                        more = swept.more,
                        "retention: deleted ended tasks past their retention, with their files"
                    );
                } else {
                    debug!("retention: nothing to delete");
                }
                *self.retention_look.lock().unwrap_or_else(|e| e.into_inner()) = Some((started, swept.more));
            }
            Err(e) => {
                warn!(error = %e, "retention: cannot delete the tasks past their retention; trying again");
                *self.retention_look.lock().unwrap_or_else(|e| e.into_inner()) = Some((started, false));
            }
        }
    }

    /// Sweeps output files used by nothing when a sweep is due; logs what it deleted.
    pub(super) async fn run_file_sweep(&self) {
        let gap = self.settings.tick.saturating_mul(TICKS_BETWEEN).min(LONGEST_GAP);
        let mut after = match *self.file_sweep.lock().unwrap_or_else(|e| e.into_inner()) {
            Some((at, _)) if at.elapsed() < gap => return,
            Some((_, after)) => after,
            None => None,
        };
        let started = tokio::time::Instant::now();
        let mut deleted = 0;
        for _ in 0..FILE_PAGES {
            match sweep_files(&*self.store, after, FILES_PER_PAGE, bson::DateTime::now()).await {
                Ok(page) => {
                    deleted += page.deleted;
                    after = page.next;
                    if after.is_none() {
                        break;
                    }
                }
                Err(e) => {
                    warn!(error = %e, "cannot sweep output files used by no task; trying again");
                    break;
                }
            }
        }
        if deleted > 0 {
            info!(deleted, "deleted output files no task uses");
        }
        *self.file_sweep.lock().unwrap_or_else(|e| e.into_inner()) = Some((started, after));
    }
}
