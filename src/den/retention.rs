//! The leader's retention: at most once per tick and at least every [`LONGEST_GAP`] (sooner
//! while a look leaves tasks to delete), after the schedules, one bounded look
//! (`lifecycle::retention`) deletes the ended tasks past their retention.

use std::time::Duration;

use tracing::{debug, info, warn};

use super::Den;
use crate::lifecycle::retention::{sweep, Bounds};

/// The longest time between two looks.
pub const LONGEST_GAP: Duration = Duration::from_secs(30);

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
}
