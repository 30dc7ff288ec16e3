//! The rate-limit mechanics every store supplies ([`RateStore`]): grant rows read as data
//! and written by compare-and-set. The rule — which row may be granted, when one is given
//! back — is in `lifecycle::rate`.

use async_trait::async_trait;
use bson::oid::ObjectId;
use bson::DateTime;

use super::StoreResult;

/// A queue's grant row `n` as stored: when it was last granted (`at`, the epoch when
/// never) and to which node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateRow {
    /// Row number, in `0..max` of the queue's `rate`.
    pub n: i64,
    /// When it was last granted.
    pub at: DateTime,
    /// The node it was last granted to, if any.
    pub node: Option<String>,
}

impl RateRow {
    /// A row never granted (what a missing row reads as).
    pub fn never(n: i64) -> RateRow {
        RateRow {
            n,
            at: DateTime::from_millis(0),
            node: None,
        }
    }
}

/// Rate grants: one row per number `n` in `0..max` of a rate-limited queue,
/// `{queue, n, at, node}`.
#[async_trait]
pub trait RateStore: Send + Sync {
    /// Every grant row of `queue`, in row order.
    async fn rates(&self, queue: ObjectId) -> StoreResult<Vec<RateRow>>;
    /// Creates the rows `0..max` of `queue` that do not exist yet (never granted).
    /// Idempotent.
    async fn ensure_rates(&self, queue: ObjectId, max: i64) -> StoreResult<()>;
    /// Compare-and-set of row `n` of `queue`: writes `to`'s `at` and `node` when the row's
    /// `at` and `node` are exactly `from`'s, in one conditional write. Whether it applied
    /// (false also when there is no such row).
    async fn change_rate(&self, queue: ObjectId, n: i64, from: &RateRow, to: &RateRow) -> StoreResult<bool>;
}
