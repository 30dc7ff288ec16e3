//! A node's `stats` sub-document: histograms of its DEN's claims and runs.

use serde::{Deserialize, Serialize};

/// Upper bounds (seconds) of the claim-duration buckets.
pub const CLAIM_BUCKETS: [f64; 10] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];
/// Upper bounds (seconds) of the run-duration buckets.
pub const RUN_BUCKETS: [f64; 13] = [
    0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0,
];

/// A node's `stats` sub-document: histograms of its DEN's claim round trips (successful
/// claims) and plugin runs, counted since the DEN started. `GET /metrics` serves them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeStats {
    /// Seconds per successful claim (the `findOneAndUpdate` round trip).
    pub claim: Histogram,
    /// Seconds per plugin run (instantiate, call, capture), whatever its outcome.
    pub run: Histogram,
}

impl Default for NodeStats {
    fn default() -> Self {
        NodeStats {
            claim: Histogram::new(&CLAIM_BUCKETS),
            run: Histogram::new(&RUN_BUCKETS),
        }
    }
}

/// A histogram of durations in seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    /// Upper bounds of the buckets, ascending.
    pub bounds: Vec<f64>,
    /// Observations per bucket, not cumulative: `counts[i]` for `bounds[i - 1] < x ≤ bounds[i]`,
    /// and one more entry at the end for everything above the last bound.
    pub counts: Vec<u64>,
    /// Sum of the observations.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl Histogram {
    /// An empty histogram with these bucket bounds.
    pub fn new(bounds: &[f64]) -> Histogram {
        Histogram {
            bounds: bounds.to_vec(),
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    /// Records one observation.
    pub fn observe(&mut self, seconds: f64) {
        let i = self.bounds.partition_point(|b| *b < seconds);
        if let Some(c) = self.counts.get_mut(i) {
            *c += 1;
        }
        self.sum += seconds;
        self.count += 1;
    }

    /// `(upper bound, cumulative count)` per bucket, ending with `(+∞, count)`, as
    /// Prometheus histograms expose them. Empty when `counts` does not match `bounds`.
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        if self.counts.len() != self.bounds.len() + 1 {
            return Vec::new();
        }
        let mut total = 0;
        let mut out: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .zip(&self.counts)
            .map(|(b, c)| {
                total += c;
                (*b, total)
            })
            .collect();
        out.push((f64::INFINITY, total + self.counts[self.bounds.len()]));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::Histogram;

    #[test]
    fn histogram_buckets_are_inclusive_upper_bounds() {
        let mut h = Histogram::new(&[0.01, 0.1]);
        for x in [0.005, 0.01, 0.05, 0.5, 7.0] {
            h.observe(x);
        }
        assert_eq!(h.counts, vec![2, 1, 2]);
        assert_eq!(h.cumulative(), vec![(0.01, 2), (0.1, 3), (f64::INFINITY, 5)]);
        assert_eq!(h.count, 5);
        assert!((h.sum - 7.565).abs() < 1e-9);
    }
}
