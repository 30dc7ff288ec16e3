//! The leader's schedules: each tick, after the orphan sweep, every schedule's due
//! occurrences become tasks (`lifecycle::schedules`), each schedule on its own, and what
//! happened is logged with the schedule's name.

use tracing::{debug, info, warn};

use super::Den;
use crate::lifecycle::schedules::{run_schedules, Occurrence};

impl Den {
    /// Looks at every schedule once ([`run_schedules`]) and logs what it did: a schedule
    /// that fails is logged (once until its error changes) and the others go on.
    pub(super) async fn run_schedules(&self) {
        let outcomes = match run_schedules(&*self.store, jiff::Timestamp::now()).await {
            Ok(outcomes) => outcomes,
            Err(e) => {
                self.note_schedule_error("", Some(e.to_string()));
                return;
            }
        };
        self.note_schedule_error("", None);
        for (name, outcome) in outcomes {
            let outcome = match outcome {
                Ok(o) => {
                    self.note_schedule_error(&name, None);
                    o
                }
                Err(e) => {
                    self.note_schedule_error(&name, Some(e.to_string()));
                    continue;
                }
            };
            if let Some((first, last)) = outcome.skipped {
                warn!(schedule = %name, first = %first, last = %last, "schedule: occurrences skipped (catch_up)");
            }
            for o in &outcome.occurrences {
                match o {
                    Occurrence::Created(at, task) => {
                        info!(schedule = %name, occurrence = %at, task = %task, "schedule: task created")
                    }
                    Occurrence::Existed(at, task) => {
                        debug!(schedule = %name, occurrence = %at, task = %task, "schedule: task existed already")
                    }
                    Occurrence::Overlapped(at) => warn!(
                        schedule = %name,
                        occurrence = %at,
                        "schedule: occurrence skipped, the previous one's task has not ended (overlap: skip)"
                    ),
                }
            }
            if outcome.lost {
                debug!(schedule = %name, "schedule: another leader moved its mark first");
            }
        }
    }

    /// Logs a schedule's error when it is new, and forgets it once the schedule works
    /// again (`""`: reading the schedules).
    fn note_schedule_error(&self, name: &str, error: Option<String>) {
        let mut seen = self.schedule_errors.lock().unwrap_or_else(|e| e.into_inner());
        match error {
            Some(e) => {
                if seen.get(name) != Some(&e) {
                    if name.is_empty() {
                        warn!(error = %e, "cannot read the schedules; trying again next tick");
                    } else {
                        warn!(schedule = %name, error = %e, "schedule failed; trying again next tick");
                    }
                    seen.insert(name.to_owned(), e);
                }
            }
            None => {
                if seen.remove(name).is_some() && !name.is_empty() {
                    info!(schedule = %name, "schedule works again");
                }
            }
        }
    }
}
