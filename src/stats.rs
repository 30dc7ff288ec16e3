//! Per-minute task counters: what `GET /stats` and the web UI's overview read, so history
//! costs O(minutes × queues), never O(tasks).
//!
//! Each DEN counts the runs it ends in memory, per (minute, queue): succeeded, failed,
//! retried (a failed run its queue's retry policy runs again) and a histogram of run
//! durations over fixed logarithmic buckets ([`bound`]), so percentiles merge across nodes
//! and minutes by adding bucket counts. It adds them to the store every few seconds, one
//! upsert per (minute, queue, node) — never in a task's own write. The leading DEN also
//! records each queue's depth (queued tasks, from the `{queue, status}` index) once a
//! minute, and deletes minutes older than the retention (`stats_retention`).
//!
//! This module is the arithmetic shared by the DEN, both stores and the API: buckets,
//! merging, percentiles, and folding stored rows into series of fixed steps.

use std::collections::BTreeMap;

use bson::oid::ObjectId;
use bson::DateTime;

/// Number of bucket bounds: 1 ms × 10^(i/8) for i in 0..65, that is 1 ms to 100,000 s
/// (about 28 hours), eight buckets per decade (each bound 1.33× the previous one).
pub const BOUNDS: usize = 65;
/// Number of buckets: one per bound, and one more for runs longer than the last bound.
pub const BUCKETS: usize = BOUNDS + 1;

/// Upper bound in seconds of bucket `i` (infinity for the last bucket).
pub fn bound(i: usize) -> f64 {
    if i >= BOUNDS {
        f64::INFINITY
    } else {
        0.001 * 10f64.powf(i as f64 / 8.0)
    }
}

/// The bucket of a run of `seconds`: the first whose bound is not below it.
pub fn bucket_of(seconds: f64) -> usize {
    (0..BOUNDS).find(|i| seconds <= bound(*i)).unwrap_or(BOUNDS)
}

/// The minute (since the epoch) holding `t`.
pub fn minute_of(t: DateTime) -> i64 {
    t.timestamp_millis().div_euclid(60_000)
}

/// The start of minute `m`.
pub fn minute_start(m: i64) -> DateTime {
    DateTime::from_millis(m.saturating_mul(60_000))
}

/// How a counted run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Status 1.
    Succeeded,
    /// Any other final status.
    Failed,
    /// Failed, and its queue's retry policy runs it again.
    Retried,
}

/// Counters of one (minute, queue) — of one node, or merged.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counters {
    /// Runs that ended succeeded.
    pub succeeded: u64,
    /// Runs that ended failed for good.
    pub failed: u64,
    /// Failed runs that run again (retry policy).
    pub retried: u64,
    /// Sum of the run durations, in seconds.
    pub seconds: f64,
    /// Runs per duration bucket (index → count), only the buckets used.
    pub buckets: BTreeMap<usize, u64>,
}

impl Counters {
    /// Counts one run of `seconds` that ended as `end`.
    pub fn observe(&mut self, end: End, seconds: f64) {
        match end {
            End::Succeeded => self.succeeded += 1,
            End::Failed => self.failed += 1,
            End::Retried => self.retried += 1,
        }
        self.seconds += seconds;
        *self.buckets.entry(bucket_of(seconds)).or_default() += 1;
    }

    /// Adds `other`'s counts to these.
    pub fn merge(&mut self, other: &Counters) {
        self.succeeded += other.succeeded;
        self.failed += other.failed;
        self.retried += other.retried;
        self.seconds += other.seconds;
        for (b, n) in &other.buckets {
            *self.buckets.entry(*b).or_default() += n;
        }
    }

    /// Runs counted (every end).
    pub fn runs(&self) -> u64 {
        self.succeeded + self.failed + self.retried
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.runs() == 0 && self.buckets.is_empty()
    }

    /// The `q` quantile (0 < q ≤ 1) of the run durations, as the upper bound of the
    /// bucket holding it (so at most 1.33× the true value); the last bound for runs past
    /// it; `None` when no run was counted.
    pub fn percentile(&self, q: f64) -> Option<f64> {
        let total: u64 = self.buckets.values().sum();
        if total == 0 {
            return None;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (b, n) in &self.buckets {
            seen += n;
            if seen >= rank {
                return Some(bound((*b).min(BOUNDS - 1)));
            }
        }
        None
    }
}

/// One stored row: a node's counters for a (minute, queue), or (node `""`) the leader's
/// depth sample.
#[derive(Debug, Clone, PartialEq)]
pub struct StatsRow {
    /// Minute since the epoch.
    pub minute: i64,
    /// The queue.
    pub queue: ObjectId,
    /// The node that counted (empty for a depth sample).
    pub node: String,
    /// What was counted.
    pub counters: Counters,
    /// Queued tasks in the queue during that minute, when sampled.
    pub depth: Option<i64>,
}

/// One point of a series: the counters of `step` minutes from `minute` on, merged, and
/// the last depth sampled in them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Point {
    /// First minute of the step.
    pub minute: i64,
    /// Counters merged over the step.
    pub counters: Counters,
    /// The last depth sampled in the step (summed over queues for the total).
    pub depth: Option<i64>,
}

/// Series of points, per queue and in total (key `None`), every step from `from` (a
/// minute) up to `to` (exclusive), `step` minutes each; steps with nothing counted are
/// there with zeros. Rows outside `[from, to)`, or of queues not in `queues` when given,
/// are left out.
pub fn series(
    rows: &[StatsRow],
    from: i64,
    to: i64,
    step: i64,
    queues: Option<&[ObjectId]>,
) -> BTreeMap<Option<ObjectId>, Vec<Point>> {
    let step = step.max(1);
    let n = usize::try_from((to - from + step - 1).div_euclid(step)).unwrap_or(0);
    let empty: Vec<Point> = (0..n)
        .map(|i| Point {
            minute: from + i as i64 * step,
            ..Point::default()
        })
        .collect();
    let mut out: BTreeMap<Option<ObjectId>, Vec<Point>> = BTreeMap::new();
    out.insert(None, empty.clone());
    if let Some(qs) = queues {
        for q in qs {
            out.insert(Some(*q), empty.clone());
        }
    }
    // The minute of each depth kept per (queue, point), so the last sample wins.
    let mut depth_at: BTreeMap<(ObjectId, usize), i64> = BTreeMap::new();
    for row in rows {
        if row.minute < from || row.minute >= to || queues.is_some_and(|qs| !qs.contains(&row.queue)) {
            continue;
        }
        let i = ((row.minute - from) / step) as usize;
        let points = out.entry(Some(row.queue)).or_insert_with(|| empty.clone());
        points[i].counters.merge(&row.counters);
        if let Some(d) = row.depth {
            let at = depth_at.entry((row.queue, i)).or_insert(i64::MIN);
            if row.minute >= *at {
                *at = row.minute;
                points[i].depth = Some(d);
            }
        }
    }
    let mut total = empty;
    for (key, points) in &out {
        if key.is_none() {
            continue;
        }
        for (t, p) in total.iter_mut().zip(points) {
            t.counters.merge(&p.counters);
            if let Some(d) = p.depth {
                t.depth = Some(t.depth.unwrap_or(0) + d);
            }
        }
    }
    out.insert(None, total);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_logarithmic_and_cover_every_duration() {
        assert_eq!(bucket_of(0.0), 0);
        assert_eq!(bucket_of(0.001), 0);
        assert_eq!(bucket_of(0.0011), 1);
        assert_eq!(bucket_of(0.99), 24);
        assert_eq!(bucket_of(1.01), 25);
        assert_eq!(bucket_of(999.0), 48);
        assert_eq!(bucket_of(1001.0), 49);
        assert_eq!(bucket_of(99_999.0), BOUNDS - 1);
        assert_eq!(bucket_of(100_001.0), BOUNDS);
        for i in 1..BOUNDS {
            let ratio = bound(i) / bound(i - 1);
            assert!((ratio - 10f64.powf(0.125)).abs() < 1e-9, "bound {i}");
        }
    }

    #[test]
    fn percentiles_merge_across_nodes() {
        let mut a = Counters::default();
        let mut b = Counters::default();
        for _ in 0..90 {
            a.observe(End::Succeeded, 0.010);
        }
        for _ in 0..9 {
            b.observe(End::Failed, 0.5);
        }
        b.observe(End::Retried, 20.0);
        a.merge(&b);
        assert_eq!((a.succeeded, a.failed, a.retried, a.runs()), (90, 9, 1, 100));
        let p50 = a.percentile(0.5).unwrap();
        assert!((0.010..0.0134).contains(&p50), "p50 {p50}");
        let p95 = a.percentile(0.95).unwrap();
        assert!((0.5..0.67).contains(&p95), "p95 {p95}");
        let p99 = a.percentile(0.99).unwrap();
        assert!((0.5..0.67).contains(&p99), "p99 {p99}");
        let max = a.percentile(1.0).unwrap();
        assert!((20.0..26.7).contains(&max), "max {max}");
        assert_eq!(Counters::default().percentile(0.5), None);
    }

    #[test]
    fn series_fold_minutes_into_steps() {
        let q1 = ObjectId::new();
        let q2 = ObjectId::new();
        let row = |minute, queue, node: &str, ok, depth| {
            let mut counters = Counters::default();
            for _ in 0..ok {
                counters.observe(End::Succeeded, 0.002);
            }
            StatsRow {
                minute,
                queue,
                node: node.into(),
                counters,
                depth,
            }
        };
        let rows = vec![
            row(100, q1, "a", 3, None),
            row(101, q1, "b", 4, None),
            row(101, q1, "", 0, Some(7)),
            row(100, q1, "", 0, Some(9)),
            row(102, q2, "a", 5, Some(1)),
            row(99, q2, "a", 50, None),
            row(106, q2, "a", 50, None),
        ];
        let s = series(&rows, 100, 106, 5, None);
        let total = &s[&None];
        assert_eq!(total.len(), 2);
        assert_eq!(total[0].minute, 100);
        assert_eq!(total[0].counters.succeeded, 12);
        assert_eq!(total[1].counters.succeeded, 0);
        assert_eq!(s[&Some(q1)][0].depth, Some(7), "the last sample of the step");
        assert_eq!(total[0].depth, Some(8));
        assert_eq!(total[1].depth, None);
        let only = series(&rows, 100, 106, 1, Some(&[q2]));
        assert_eq!(only[&None].len(), 6);
        assert_eq!(only[&None][2].counters.succeeded, 5);
        assert!(!only.contains_key(&Some(q1)));
    }
}
