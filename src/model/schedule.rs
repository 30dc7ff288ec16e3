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

/// A schedule's definition, as stored. Read leniently, as other tools may write it: a
/// missing field takes its default (an interval's anchor: the Unix epoch), and the limit
/// may be any integral number.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    /// Its unique name.
    pub name: String,
    /// The queue its tasks go to.
    pub queue: ObjectId,
    /// The params of each task.
    #[serde(default)]
    pub params: Document,
    /// A cron expression (exactly one of `cron` and `every` is set).
    #[serde(default)]
    pub cron: Option<String>,
    /// A fixed interval such as `"30s"`, `"5m"`, `"1h30m"`, `"1d"`.
    #[serde(default)]
    pub every: Option<String>,
    /// The IANA zone a cron expression is read in.
    #[serde(default = "utc")]
    pub timezone: String,
    /// What to do with occurrences found past.
    #[serde(default)]
    pub catch_up: CatchUp,
    /// How many past occurrences `catch_up: "all"` creates at most at once.
    #[serde(default = "default_limit", deserialize_with = "integral")]
    pub catch_up_limit: i64,
    /// What to do while the previous occurrence's task has not ended.
    #[serde(default)]
    pub overlap: Overlap,
    /// A paused schedule creates nothing.
    #[serde(default)]
    pub paused: bool,
    /// Where an interval counts from: the schedule's creation, in whole seconds.
    #[serde(default = "epoch")]
    pub anchor: DateTime,
}

fn utc() -> String {
    "UTC".into()
}

fn default_limit() -> i64 {
    DEFAULT_CATCH_UP_LIMIT
}

fn epoch() -> DateTime {
    DateTime::from_millis(0)
}

/// An integral number of any BSON type (a 32- or 64-bit integer, a double without a
/// fraction, as the legacy shell writes numbers, or a string of digits).
fn integral<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    use serde::de::Error;
    match bson::Bson::deserialize(d)? {
        bson::Bson::Int32(n) => Ok(n.into()),
        bson::Bson::Int64(n) => Ok(n),
        bson::Bson::Double(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Ok(f as i64),
        bson::Bson::String(s) => s
            .trim()
            .parse()
            .map_err(|_| D::Error::custom(format!("not an integer: {s:?}"))),
        other => Err(D::Error::custom(format!("not an integer: {other}"))),
    }
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

/// Reads a cron expression: five fields get seconds 0 in front. The day of the week is
/// crontab's in every form: 0 to 7, 0 and 7 both Sunday, 1 Monday (or the names `SUN` to
/// `SAT`); the cron crate counts 1 (Sunday) to 7, so the numbers are translated.
pub fn parse_cron(expr: &str) -> Result<jiff_cron::Schedule, FieldError> {
    let expr = expr.trim();
    let fields: Vec<&str> = expr.split_whitespace().collect();
    let with_weekdays = |fields: &[&str]| -> Result<String, FieldError> {
        let mut out: Vec<String> = fields.iter().map(|f| (*f).to_owned()).collect();
        out[5] = crontab_weekdays(fields[5])?;
        Ok(out.join(" "))
    };
    let full = match fields.len() {
        _ if expr.starts_with('@') => expr.to_owned(),
        5 => with_weekdays(&[&["0"], &fields[..]].concat())?,
        6 | 7 => with_weekdays(&fields)?,
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

/// A crontab day-of-week field (0–7, 0 and 7 Sunday) in the cron crate's numbering (1–7,
/// 1 Sunday): each number, range and stepped range becomes the list of days it names;
/// `*`, `?` and names stay as they are.
fn crontab_weekdays(field: &str) -> Result<String, FieldError> {
    let mut out: Vec<String> = Vec::new();
    for item in field.split(',') {
        let (base, step) = match item.split_once('/') {
            Some((b, s)) => (b, Some(s)),
            None => (item, None),
        };
        if base == "*" || base == "?" || base.chars().any(|c| c.is_ascii_alphabetic()) {
            out.push(item.to_owned());
            continue;
        }
        let day = |t: &str| -> Result<u32, FieldError> {
            t.parse::<u32>().ok().filter(|d| *d <= 7).ok_or_else(|| {
                bad(
                    "cron",
                    format!("day of the week {t:?} in {field:?}: expected 0 to 7 (0 and 7 are Sunday) or SUN to SAT"),
                )
            })
        };
        let (from, to) = match base.split_once('-') {
            Some((a, b)) => (day(a)?, day(b)?),
            None if step.is_some() => (day(base)?, 6),
            None => (day(base)?, day(base)?),
        };
        let step = match step {
            Some(s) => s
                .parse::<u32>()
                .ok()
                .filter(|s| *s > 0)
                .ok_or_else(|| bad("cron", format!("step {s:?} in {field:?}: expected a positive number")))?,
            None => 1,
        };
        if from > to {
            return Err(bad(
                "cron",
                format!("days of the week {base:?} in {field:?} run backwards"),
            ));
        }
        for d in (from..=to).step_by(step as usize) {
            let theirs = (d % 7 + 1).to_string();
            if !out.contains(&theirs) {
                out.push(theirs);
            }
        }
    }
    Ok(out.join(","))
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

/// Checks a schedule name: 1 to [`MAX_NAME_LEN`] letters, digits, `.`, `_` or `-`, the
/// first a letter or digit (so no name is `.` or `..`, which URLs resolve away).
pub fn check_name(name: &str) -> Result<(), FieldError> {
    let ok = name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.len() <= MAX_NAME_LEN
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(bad(
            "name",
            format!("{name:?}: a schedule name is 1 to {MAX_NAME_LEN} letters, digits, '.', '_' or '-', starting with a letter or digit"),
        ))
    }
}

impl Timing {
    /// The first occurrence strictly after `t`.
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        match self {
            Timing::Cron(expr, zone) => {
                // Occurrences are whole seconds; the walk starts from a whole second, since
                // from a fraction the cron crate may answer the next second without
                // checking its day of the week.
                let t = Timestamp::from_second(t.as_second()).unwrap_or(t);
                expr.after(t.to_zoned(zone.clone())).next().map(|z| z.timestamp())
            }
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
