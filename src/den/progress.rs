//! Progress reports of running tasks: the plugin's latest report is kept in memory and
//! written to its task (`progress: {percent, info, at}`) at most once per
//! [`PROGRESS_INTERVAL`] while it runs, and with its result when it ends. A task that ends
//! within its first interval costs no write beyond its result.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::DateTime;
use tracing::debug;

use crate::model::TaskProgress;
use crate::runner::{Progress, ProgressSink};

/// Least time between two progress writes of one task.
pub(super) const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

/// The latest report of one task, a count of reports to tell a new one, and when it came.
#[derive(Default)]
pub(super) struct Latest {
    inner: Mutex<(u64, Option<TaskProgress>)>,
    heard: Mutex<Option<Instant>>,
}

impl Latest {
    /// When the plugin last reported, or `start` when it has not yet.
    pub(super) fn last_heard(&self, start: Instant) -> Instant {
        self.heard.lock().unwrap_or_else(|e| e.into_inner()).unwrap_or(start)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, Option<TaskProgress>)> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The sink the runner calls with each report of `task`.
    pub(super) fn sink(self: &Arc<Self>, task: ObjectId) -> ProgressSink {
        let latest = self.clone();
        Arc::new(move |p: &Progress| {
            debug!(task = %task, "{p}");
            *latest.heard.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
            let mut l = latest.lock();
            l.0 += 1;
            l.1 = Some(TaskProgress {
                percent: p.percent.map(f64::from),
                info: p.info.clone().unwrap_or_default(),
                at: DateTime::now(),
            });
        })
    }

    /// The latest report when it is newer than the one numbered `seen` (then `seen` moves on).
    pub(super) fn newer(&self, seen: &mut u64) -> Option<TaskProgress> {
        let l = self.lock();
        if l.0 == *seen {
            return None;
        }
        *seen = l.0;
        l.1.clone()
    }

    /// The latest report, if any.
    pub(super) fn last(&self) -> Option<TaskProgress> {
        self.lock().1.clone()
    }
}
