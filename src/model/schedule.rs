//! Schedules: a queue's task created periodically, at the times of a cron expression
//! (`cron`) or of a fixed interval (`every`), in a time zone.
//!
//! A [`Schedule`] is the definition as stored (the `schedules` collection, or table);
//! [`Timing`] is its times, checked and ready to answer "the next occurrence after" and
//! "the newest occurrence at or before" a time. Cron expressions are read by `jiff-cron`
//! (six fields with seconds first, or seven with a year; five fields get seconds 0;
//! the shorthands `@yearly`, `@monthly`, `@weekly`, `@daily`, `@hourly`), in the zone's
//! local time by `jiff`'s rules, walked from one occurrence to the next: in a skipped hour
//! (spring forward) an hourly or finer expression skips the times that do not exist and a
//! daily time fires shifted by the gap (02:30 → 03:30); in a repeated hour (fall back) an
//! hourly or finer expression fires in both and a daily time once, at its second instance
//! (the tests of this module hold both). An interval counts from the schedule's
//! `anchor` (its creation time, in whole seconds), in absolute time: its zone plays no
//! part. Which occurrences become tasks is decided in `lifecycle::schedules`.

use std::str::FromStr;

use bson::oid::ObjectId;
use bson::{DateTime, Document};
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Span, SpanRelativeTo, Timestamp};
use serde::{Deserialize, Serialize};

/// The `catch_up_limit` when none is given.
pub const DEFAULT_CATCH_UP_LIMIT: i64 = 100;
/// The largest `catch_up_limit` accepted.
pub const MAX_CATCH_UP_LIMIT: i64 = 10_000;
/// The longest schedule name accepted.
pub const MAX_NAME_LEN: usize = 100;

/// What the leader does with occurrences it finds past when it looks (after a pause, a
/// change of leader, a restart).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CatchUp {
    /// Only occurrences at most a short grace old are created; older ones are skipped.
    #[default]
    None,
    /// Only the newest occurrence due is created.
    Last,
    /// Every occurrence due is created, oldest first, up to `catch_up_limit` (the newest
    /// ones); older ones beyond it are skipped.
    All,
}

/// What the leader does with an occurrence while the task of the previous one has not
/// ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Overlap {
    /// It is created all the same.
    #[default]
    Allow,
    /// It is skipped.
    Skip,
}

impl CatchUp {
    /// Its name as written.
    pub fn as_str(self) -> &'static str {
        match self {
            CatchUp::None => "none",
            CatchUp::Last => "last",
            CatchUp::All => "all",
        }
    }
}

impl Overlap {
    /// Its name as written.
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Allow => "allow",
            Overlap::Skip => "skip",
        }
    }
}

/// A schedule's definition, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    /// Its unique name.
    pub name: String,
    /// The queue its tasks go to.
    pub queue: ObjectId,
    /// The params of each task.
    pub params: Document,
    /// A cron expression (exactly one of `cron` and `every` is set).
    pub cron: Option<String>,
    /// A fixed interval such as `"30s"`, `"5m"`, `"1h30m"`, `"1d"`.
    pub every: Option<String>,
    /// The IANA zone a cron expression is read in.
    pub timezone: String,
    /// What to do with occurrences found past.
    pub catch_up: CatchUp,
    /// How many past occurrences `catch_up: "all"` creates at most at once.
    pub catch_up_limit: i64,
    /// What to do while the previous occurrence's task has not ended.
    pub overlap: Overlap,
    /// A paused schedule creates nothing.
    pub paused: bool,
    /// Where an interval counts from: the schedule's creation, in whole seconds.
    pub anchor: DateTime,
}

/// A field at fault and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field's name.
    pub field: &'static str,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}`: {}", self.field, self.message)
    }
}

fn bad(field: &'static str, message: impl Into<String>) -> FieldError {
    FieldError {
        field,
        message: message.into(),
    }
}

/// A schedule's times.
#[derive(Debug, Clone)]
pub enum Timing {
    /// A cron expression in a zone.
    Cron(Box<jiff_cron::Schedule>, TimeZone),
    /// Every `every` from `anchor`.
    Every {
        /// The first occurrence's base (anchor + k·every, k ≥ 0).
        anchor: Timestamp,
        /// The interval, at least a second, in whole seconds.
        every: SignedDuration,
    },
}

/// Reads a cron expression: five fields get seconds 0 in front.
pub fn parse_cron(expr: &str) -> Result<jiff_cron::Schedule, FieldError> {
    let expr = expr.trim();
    let fields = expr.split_whitespace().count();
    let full = match fields {
        _ if expr.starts_with('@') => expr.to_owned(),
        5 => format!("0 {expr}"),
        6 | 7 => expr.to_owned(),
        n => {
            return Err(bad(
                "cron",
                format!("{expr:?} has {n} fields; expected 5 (minute first), 6 (seconds first) or 7 (with a year)"),
            ))
        }
    };
    jiff_cron::Schedule::from_str(&full).map_err(|e| {
        bad(
            "cron",
            format!("{expr:?} is not a cron expression: {}", e.to_string().trim()),
        )
    })
}

/// Reads an interval (`"30s"`, `"5m"`, `"2h"`, `"1d"`, `"1h30m"`, or an ISO 8601
/// duration): at least a second, in whole seconds; a day is 24 hours.
pub fn parse_every(text: &str) -> Result<SignedDuration, FieldError> {
    let span: Span = text.trim().parse().map_err(|e| {
        bad(
            "every",
            format!("{text:?} is not a duration such as \"30s\", \"5m\" or \"1h30m\": {e}"),
        )
    })?;
    let d = span
        .to_duration(SpanRelativeTo::days_are_24_hours())
        .map_err(|e| bad("every", format!("{text:?}: {e} (use days, hours, minutes or seconds)")))?;
    if d < SignedDuration::from_secs(1) {
        return Err(bad("every", format!("{text:?} is shorter than a second")));
    }
    if d.subsec_nanos() != 0 {
        return Err(bad("every", format!("{text:?} is not a whole number of seconds")));
    }
    Ok(d)
}

/// Reads an IANA zone name.
pub fn parse_zone(name: &str) -> Result<TimeZone, FieldError> {
    TimeZone::get(name).map_err(|_| bad("timezone", format!("{name:?} is not a known IANA time zone")))
}

/// A bson date as a timestamp.
pub fn timestamp(d: DateTime) -> Timestamp {
    Timestamp::from_millisecond(d.timestamp_millis()).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// A timestamp as a bson date (to the millisecond).
pub fn date(t: Timestamp) -> DateTime {
    DateTime::from_millis(t.as_millisecond())
}

impl Schedule {
    /// Checks the definition (name, times, zone, limit) and answers its times; the error
    /// names the field at fault. An expression with no occurrence after `now` is refused.
    pub fn timing(&self, now: Timestamp) -> Result<Timing, FieldError> {
        check_name(&self.name)?;
        let zone = parse_zone(&self.timezone)?;
        if !(1..=MAX_CATCH_UP_LIMIT).contains(&self.catch_up_limit) {
            return Err(bad(
                "catch_up_limit",
                format!("{} is not between 1 and {MAX_CATCH_UP_LIMIT}", self.catch_up_limit),
            ));
        }
        let timing = match (&self.cron, &self.every) {
            (Some(_), Some(_)) => return Err(bad("cron", "give either `cron` or `every`, not both")),
            (None, None) => return Err(bad("cron", "give `cron` (an expression) or `every` (an interval)")),
            (Some(expr), None) => Timing::Cron(Box::new(parse_cron(expr)?), zone),
            (None, Some(every)) => Timing::Every {
                anchor: timestamp(self.anchor),
                every: parse_every(every)?,
            },
        };
        if timing.next_after(now).is_none() {
            let field = if self.cron.is_some() { "cron" } else { "every" };
            return Err(bad(field, "the schedule never fires (no occurrence after now)"));
        }
        Ok(timing)
    }
}

/// Checks a schedule name: 1 to [`MAX_NAME_LEN`] letters, digits, `.`, `_` or `-`.
pub fn check_name(name: &str) -> Result<(), FieldError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(bad(
            "name",
            format!("{name:?}: a schedule name is 1 to {MAX_NAME_LEN} letters, digits, '.', '_' or '-'"),
        ))
    }
}

impl Timing {
    /// The first occurrence strictly after `t`.
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        match self {
            Timing::Cron(expr, zone) => expr.after(t.to_zoned(zone.clone())).next().map(|z| z.timestamp()),
            Timing::Every { anchor, every } => {
                if t < *anchor {
                    return Some(*anchor);
                }
                let k = steps(*anchor, *every, t)?.checked_add(1)?;
                anchor.checked_add(every.checked_mul(i32::try_from(k).ok()?)?).ok()
            }
        }
    }

    /// Up to `n` occurrences strictly after `t`, oldest first.
    pub fn upcoming(&self, t: Timestamp, n: usize) -> Vec<Timestamp> {
        let mut out = Vec::with_capacity(n);
        let mut at = t;
        while out.len() < n {
            let Some(next) = self.next_after(at) else { break };
            out.push(next);
            at = next;
        }
        out
    }
}

/// How many whole intervals from `anchor` fit up to `t` (None before the anchor).
fn steps(anchor: Timestamp, every: SignedDuration, t: Timestamp) -> Option<i64> {
    if t < anchor {
        return None;
    }
    let since = t.duration_since(anchor).as_millis();
    let each = every.as_millis();
    i64::try_from(since / each).ok()
}

/// A time in a key: RFC 3339 in UTC, whole seconds unless it has a fraction.
pub fn key_time(t: Timestamp) -> String {
    t.to_string()
}

#[cfg(test)]
#[path = "schedule/tests.rs"]
mod tests;
