//! Retries: a queue's `retry` policy, and the `attempts` a task keeps of its earlier runs.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use bson::{Bson, DateTime, Document};
use serde::{Deserialize, Serialize};

/// Longest `activity_timeout`, `backoff` or `max_backoff`: 365 days.
pub const MAX_WAIT_TIME: Duration = Duration::from_secs(365 * 24 * 3600);
/// Most attempts a policy may allow.
pub const MAX_ATTEMPTS: u32 = 100;
/// How much of each output stream of a failed attempt its record keeps (the end of it).
pub const ATTEMPT_OUTPUT_KEPT: usize = 4096;
/// Most records a task keeps in `attempts`: appending one more drops the oldest, and the
/// task counts what it dropped (`attempts_dropped`). Never below [`MAX_ATTEMPTS`], so a
/// retry policy still finds every run it counts in the records kept.
pub const ATTEMPTS_KEPT: usize = 100;
const _: () = assert!(ATTEMPTS_KEPT >= MAX_ATTEMPTS as usize);
/// How long after a retry is due the node that ran the failed attempt leaves it to the
/// others: a single node still retries, just this much later.
pub const PREFER_OTHER_NODE: Duration = Duration::from_secs(2);

/// Which failures a policy retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RetryOn {
    /// The plugin returned the failed status (2), or a status that is not positive.
    Status,
    /// The plugin returned an error.
    Err,
    /// The plugin trapped (panic, stack overflow, out-of-bounds access…).
    Trap,
    /// The plugin ran past its timeout.
    Timeout,
    /// The plugin hit its memory limit.
    Memory,
    /// The plugin reported no progress for the queue's `activity_timeout`.
    Stuck,
    /// The task's DEN died while it ran (recovery found it).
    Orphaned,
    /// The sandbox could not be set up on the node (a granted directory missing there).
    Sandbox,
    /// Someone killed it (not retried unless named).
    Killed,
}

impl RetryOn {
    /// The name used in `retry.on`.
    pub fn as_str(self) -> &'static str {
        match self {
            RetryOn::Status => "status",
            RetryOn::Err => "err",
            RetryOn::Trap => "trap",
            RetryOn::Timeout => "timeout",
            RetryOn::Memory => "memory",
            RetryOn::Stuck => "stuck",
            RetryOn::Orphaned => "orphaned",
            RetryOn::Sandbox => "sandbox",
            RetryOn::Killed => "killed",
        }
    }
}

fn default_on() -> Vec<RetryOn> {
    vec![
        RetryOn::Status,
        RetryOn::Err,
        RetryOn::Trap,
        RetryOn::Timeout,
        RetryOn::Memory,
        RetryOn::Stuck,
        RetryOn::Orphaned,
    ]
}

fn default_backoff() -> Option<Duration> {
    Some(Duration::from_secs(1))
}

/// A queue's `retry` policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    /// Runs in all, the first included (1 = no retry).
    pub attempts: u32,
    /// Wait before the first retry ("1s" by default).
    #[serde(default = "default_backoff", with = "super::opt_duration")]
    pub backoff: Option<Duration>,
    /// Double the wait at each retry (otherwise it stays `backoff`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exponential: bool,
    /// Longest wait (no cap when unset).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "super::opt_duration")]
    pub max_backoff: Option<Duration>,
    /// Wait a random time between half the backoff and all of it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub jitter: bool,
    /// Which failures retry.
    #[serde(default = "default_on")]
    pub on: Vec<RetryOn>,
    /// Lower the task's priority by this much at each retry.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lower_priority: i64,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// When and how a failed attempt runs again.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryAt {
    /// The record of the attempt that failed.
    pub attempt: Attempt,
    /// When it is due again.
    pub run_at: DateTime,
    /// Its priority from now on.
    pub priority: i64,
    /// The node it ran on, which leaves it to the others until `avoid_until`.
    pub avoid_node: String,
    /// Until when `avoid_node` leaves it to the others.
    pub avoid_until: DateTime,
    /// The run was killed and the policy retries kills (`on` names `killed`): the kill
    /// request does not stop the retry. Otherwise a kill request does.
    pub after_kill: bool,
}

impl RetryPolicy {
    /// Reads a stored `retry` field; the error names what is wrong.
    pub fn from_bson(v: &Bson) -> Result<RetryPolicy, String> {
        let Bson::Document(d) = v else {
            return Err("field `retry` must be an object".into());
        };
        let policy: RetryPolicy = bson::from_document(d.clone()).map_err(|e| format!("field `retry`: {e}"))?;
        policy.check()?;
        Ok(policy)
    }

    /// The policy as stored.
    pub fn to_document(&self) -> Document {
        bson::to_document(self).unwrap_or_default()
    }

    /// Refuses values no DEN can use.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=MAX_ATTEMPTS).contains(&self.attempts) {
            return Err(format!(
                "field `retry.attempts` must be between 1 and {MAX_ATTEMPTS}, got {}",
                self.attempts
            ));
        }
        for (field, d) in [("backoff", self.backoff), ("max_backoff", self.max_backoff)] {
            if d.is_some_and(|d| d > MAX_WAIT_TIME) {
                return Err(format!(
                    "field `retry.{field}` must be at most {} seconds (365 days)",
                    MAX_WAIT_TIME.as_secs()
                ));
            }
        }
        if self.lower_priority < 0 {
            return Err("field `retry.lower_priority` must not be negative".into());
        }
        Ok(())
    }

    /// Whether a failure of `kind` after `made` attempts (this one included) runs again.
    pub fn retries(&self, kind: RetryOn, made: u32) -> bool {
        made < self.attempts && self.on.contains(&kind)
    }

    /// The wait before retry number `n` (1 for the first retry).
    pub fn backoff(&self, n: u32) -> Duration {
        let base = self.backoff.unwrap_or_default();
        let mut d = if self.exponential {
            base.saturating_mul(2u32.saturating_pow(n.saturating_sub(1)))
        } else {
            base
        };
        if let Some(cap) = self.max_backoff {
            d = d.min(cap);
        }
        if self.jitter && !d.is_zero() {
            let r = std::collections::hash_map::RandomState::new().build_hasher().finish();
            let half = d / 2;
            let nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
            d = half + Duration::from_nanos(if nanos == 0 { 0 } else { r % nanos });
        }
        d
    }

    /// The retry of a failed `attempt`, the `made`-th, of a task at `priority`, at `now`.
    pub fn retry_at(&self, attempt: Attempt, made: u32, priority: i64, now: DateTime) -> RetryAt {
        let wait = self.backoff(made);
        let run_at = add(now, wait);
        RetryAt {
            avoid_node: attempt.node.clone().unwrap_or_default(),
            avoid_until: add(run_at, PREFER_OTHER_NODE),
            attempt,
            run_at,
            priority: priority.saturating_sub(self.lower_priority),
            after_kill: false,
        }
    }
}

/// A queue's retry policy and activity timeout.
pub type QueueLifecycle = (Option<RetryPolicy>, Option<Duration>);

/// A queue's `retry` and `activity_timeout` fields (absent or null: none), read the same
/// way by every store; the error is `(field, what is wrong)`.
pub fn queue_lifecycle(
    retry: Option<&Bson>,
    activity_timeout: Option<&Bson>,
) -> Result<QueueLifecycle, (&'static str, String)> {
    let retry = match retry {
        None | Some(Bson::Null) => None,
        Some(v) => Some(RetryPolicy::from_bson(v).map_err(|e| ("retry", e))?),
    };
    let activity = match activity_timeout {
        None | Some(Bson::Null) => None,
        Some(v) => Some(activity_timeout_from(v).map_err(|e| ("activity_timeout", e))?),
    };
    Ok((retry, activity))
}

/// Reads an `activity_timeout` ("5m", or seconds).
pub fn activity_timeout_from(v: &Bson) -> Result<Duration, String> {
    #[derive(Deserialize)]
    struct Wrapped {
        #[serde(with = "super::opt_duration")]
        v: Option<Duration>,
    }
    let w: Wrapped =
        bson::from_document(bson::doc! {"v": v.clone()}).map_err(|e| format!("field `activity_timeout`: {e}"))?;
    match w.v {
        Some(d) if d <= MAX_WAIT_TIME => Ok(d),
        Some(_) => Err(format!(
            "field `activity_timeout` must be at most {} seconds (365 days)",
            MAX_WAIT_TIME.as_secs()
        )),
        None => Err("field `activity_timeout` must be a duration".to_owned()),
    }
}

fn add(t: DateTime, d: Duration) -> DateTime {
    DateTime::from_millis(
        t.timestamp_millis()
            .saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
    )
}

/// One run of a task, kept in its `attempts` list.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    /// The node that ran it.
    pub node: Option<String>,
    /// When it started, when known.
    pub started: Option<DateTime>,
    /// When it ended.
    pub ended: DateTime,
    /// Its status (2 failed, -6 orphaned, 1 succeeded…).
    pub status: i32,
    /// Why it ended so (the failure, or who asked for the retry).
    pub reason: String,
    /// The end of its stdout, or the file holding it.
    pub stdout: Option<super::Output>,
    /// The end of its stderr, or the file holding it.
    pub stderr: Option<super::Output>,
}

impl Attempt {
    /// The record as stored.
    pub fn to_document(&self) -> Document {
        let mut d = bson::doc! {
            "node": self.node.as_deref().map_or(Bson::Null, |n| Bson::String(n.to_owned())),
            "started": self.started.map_or(Bson::Null, Bson::DateTime),
            "ended": self.ended,
            "status": self.status,
            "reason": &self.reason,
        };
        for (k, v) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            if let Some(o) = v {
                d.insert(k, o.to_bson());
            }
        }
        d
    }

    /// Reads a stored record leniently: a field of another type is left out.
    pub fn from_document(d: &Document) -> Attempt {
        let output = |k: &str| match d.get(k) {
            Some(Bson::String(s)) => Some(super::Output::Inline(s.clone())),
            Some(Bson::ObjectId(id)) => Some(super::Output::File(*id)),
            _ => None,
        };
        Attempt {
            node: d.get_str("node").ok().map(str::to_owned),
            started: d.get_datetime("started").ok().copied(),
            ended: d.get_datetime("ended").copied().unwrap_or(DateTime::MIN),
            status: match d.get("status") {
                Some(Bson::Int32(n)) => *n,
                Some(Bson::Int64(n)) => i32::try_from(*n).unwrap_or(0),
                _ => 0,
            },
            reason: d.get_str("reason").unwrap_or_default().to_owned(),
            stdout: output("stdout"),
            stderr: output("stderr"),
        }
    }

    /// Reads a stored `attempts` list leniently (entries that are not objects are left out).
    pub fn list_from(v: Option<&Bson>) -> Vec<Attempt> {
        match v {
            Some(Bson::Array(a)) => a
                .iter()
                .filter_map(|e| e.as_document().map(Attempt::from_document))
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// How many records a task's `attempts` list dropped to stay within [`ATTEMPTS_KEPT`]:
/// the records ever appended (`recorded`, stored beside the list) less the `kept` ones. A
/// list written without the count (by an earlier version) dropped none.
pub fn attempts_dropped(recorded: Option<i64>, kept: usize) -> u64 {
    let kept = i64::try_from(kept).unwrap_or(i64::MAX);
    recorded.map_or(0, |r| u64::try_from(r.saturating_sub(kept)).unwrap_or(0))
}

/// How the reason of a hand retry's record starts.
pub const BY_HAND: &str = "retried by hand";
/// The reason of the record of a finished task submitted again by key.
pub const RESUBMITTED: &str = "submitted again with the same key";

/// The runs a retry policy counts in `list`: those since the task was last queued again
/// by hand or by key (each such start gives the policy's attempts anew).
pub fn counted_runs(list: &[Attempt]) -> usize {
    list.iter()
        .rev()
        .take_while(|a| !a.reason.starts_with(BY_HAND) && a.reason != RESUBMITTED)
        .count()
}

/// The end of `text`, at most [`ATTEMPT_OUTPUT_KEPT`] bytes, saying how much was left out;
/// `None` for an empty text.
pub fn kept_output(text: &str) -> Option<super::Output> {
    if text.is_empty() {
        return None;
    }
    if text.len() <= ATTEMPT_OUTPUT_KEPT {
        return Some(super::Output::Inline(text.to_owned()));
    }
    let mut cut = text.len() - ATTEMPT_OUTPUT_KEPT;
    while !text.is_char_boundary(cut) {
        cut += 1;
    }
    Some(super::Output::Inline(format!(
        "[disbatch: the first {cut} bytes are not kept]\n{}",
        &text[cut..]
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(json: serde_json::Value) -> RetryPolicy {
        RetryPolicy::from_bson(&Bson::try_from(json).unwrap()).unwrap()
    }

    #[test]
    fn defaults_and_refusals() {
        let p = policy(serde_json::json!({"attempts": 3}));
        assert_eq!(p.backoff, Some(Duration::from_secs(1)));
        assert!(p.retries(RetryOn::Trap, 1) && p.retries(RetryOn::Orphaned, 2));
        assert!(!p.retries(RetryOn::Trap, 3), "the third attempt is the last");
        assert!(!p.retries(RetryOn::Killed, 1), "a kill is not retried unless named");
        for (bad, names) in [
            (serde_json::json!({"attempts": 0}), "retry.attempts"),
            (serde_json::json!({"attempts": 101}), "retry.attempts"),
            (serde_json::json!({"attempts": 2, "on": ["sometimes"]}), "sometimes"),
            (serde_json::json!({"attempts": 2, "backof": "1s"}), "backof"),
            (serde_json::json!({"attempts": 2, "backoff": "soon"}), "soon"),
            (
                serde_json::json!({"attempts": 2, "lower_priority": -1}),
                "lower_priority",
            ),
        ] {
            let e = RetryPolicy::from_bson(&Bson::try_from(bad.clone()).unwrap()).unwrap_err();
            assert!(e.contains(names), "{bad}: {e}");
        }
    }

    #[test]
    fn backoff_grows_to_its_cap_with_jitter_inside() {
        let p = policy(serde_json::json!({"attempts": 9, "backoff": "1s", "exponential": true, "max_backoff": "5s"}));
        let waits: Vec<u64> = (1..=5).map(|n| p.backoff(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 5, 5]);
        let fixed = policy(serde_json::json!({"attempts": 9, "backoff": "3s"}));
        assert_eq!(fixed.backoff(4), Duration::from_secs(3));
        let jittered = policy(serde_json::json!({"attempts": 9, "backoff": "4s", "jitter": true}));
        let seen: std::collections::BTreeSet<Duration> = (0..50).map(|_| jittered.backoff(1)).collect();
        assert!(seen
            .iter()
            .all(|d| (Duration::from_secs(2)..=Duration::from_secs(4)).contains(d)));
        assert!(seen.len() > 1, "jitter varies the wait");
    }

    #[test]
    fn a_hand_retry_gives_the_attempts_anew() {
        let run = |reason: &str| Attempt {
            node: None,
            started: None,
            ended: DateTime::MIN,
            status: 2,
            reason: reason.into(),
            stdout: None,
            stderr: None,
        };
        let list = [
            run("trap"),
            run("trap"),
            run("retried by hand by ann: fixed"),
            run("trap"),
        ];
        assert_eq!(counted_runs(&list), 1);
        assert_eq!(counted_runs(&list[..2]), 2);
        assert_eq!(counted_runs(&[run(RESUBMITTED)]), 0);
    }

    #[test]
    fn records_round_trip_and_outputs_keep_their_end() {
        let a = Attempt {
            node: Some("n1".into()),
            started: Some(DateTime::from_millis(1000)),
            ended: DateTime::from_millis(2000),
            status: 2,
            reason: "trap: unreachable".into(),
            stdout: kept_output("out"),
            stderr: kept_output(&"é".repeat(3000)),
        };
        assert_eq!(Attempt::from_document(&a.to_document()), a);
        let Some(super::super::Output::Inline(kept)) = &a.stderr else {
            panic!("inline")
        };
        assert!(
            kept.starts_with("[disbatch: the first 1904 bytes are not kept]\n"),
            "{kept}"
        );
        assert_eq!(Attempt::list_from(Some(&Bson::Array(vec![Bson::Int32(1)]))), vec![]);
    }
}
