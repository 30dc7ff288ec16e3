//! QueueBalance: Disbatch 4's `balance` document, read and checked, and how its limit on
//! running tasks is shared between its queues.
//!
//! The document is `{max_tasks: {"<day> <HH:MM>": n, …}, queues: [[name, …], …],
//! disabled: <epoch seconds> | null}` plus what the leader reports (`status`, `message`,
//! `timestamp`, `max_tasks_now`). A `max_tasks` key's day is `0`–`6` (Sunday is 0) or `*`
//! for every day; the entry in force is the latest one at or before the current local
//! time in the weekly cycle (wrapping around), a day's own entry winning over `*` at the
//! same time. `queues` lists lanes: the first is the default lane, which gets what the
//! others leave; the others take what they need first, in their order.

use bson::{Bson, Document};
use serde_json::Value;

/// Minutes in a week.
const WEEK: u32 = 7 * 24 * 60;

/// One `max_tasks` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    /// 0 = Sunday … 6; None = every day.
    day: Option<u8>,
    /// Minutes after midnight.
    minute: u32,
    max: i64,
}

/// A `balance` document as the leader applies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Balance {
    entries: Vec<Entry>,
    /// Lanes of queue names (or ids); the first is the default lane.
    pub lanes: Vec<Vec<String>>,
    /// Epoch seconds until which the balance is off (its limits lifted).
    pub disabled: Option<i64>,
}

impl Balance {
    /// Reads a stored document: numbers may be written as strings (as Disbatch 4's web
    /// form sends them). The error names the field at fault.
    pub fn from_document(doc: &Document) -> Result<Balance, String> {
        let entries = match doc.get("max_tasks") {
            Some(Bson::Document(m)) => m
                .iter()
                .map(|(k, v)| {
                    let max = super::lenient_int(v)
                        .filter(|n| *n >= 0)
                        .ok_or_else(|| format!("max_tasks {k:?}: {v} is not a non-negative integer"))?;
                    entry(k, max)
                })
                .collect::<Result<Vec<_>, _>>()?,
            None | Some(Bson::Null) => Vec::new(),
            Some(other) => return Err(format!("`max_tasks` is {other}, not an object")),
        };
        let lanes = match doc.get("queues") {
            Some(Bson::Array(lanes)) => lanes
                .iter()
                .enumerate()
                .map(|(i, lane)| match lane {
                    Bson::Array(names) => names
                        .iter()
                        .map(|n| match n {
                            Bson::String(s) => Ok(s.clone()),
                            other => Err(format!("queues[{i}] holds {other}, not a queue name")),
                        })
                        .collect(),
                    other => Err(format!("queues[{i}] is {other}, not an array of queue names")),
                })
                .collect::<Result<Vec<Vec<String>>, _>>()?,
            None | Some(Bson::Null) => Vec::new(),
            Some(other) => return Err(format!("`queues` is {other}, not an array of arrays")),
        };
        let disabled = match doc.get("disabled") {
            None | Some(Bson::Null) => None,
            // Perl's Time::HiRes writes fractions of a second.
            Some(Bson::Double(f)) if f.is_finite() && *f >= 0.0 => Some(f.floor() as i64).filter(|t| *t != 0),
            Some(v) => match super::lenient_int(v) {
                Some(0) => None,
                Some(t) => Some(t),
                None => return Err(format!("`disabled` is {v}, not epoch seconds or null")),
            },
        };
        Ok(Balance {
            entries,
            lanes,
            disabled,
        })
    }

    /// Whether `max_tasks` has any entry.
    pub fn has_limit(&self) -> bool {
        !self.entries.is_empty()
    }

    /// The limit in force on `weekday` (0 = Sunday) at `minute` after midnight: the latest
    /// entry at or before then in the weekly cycle. None without entries.
    pub fn max_tasks_at(&self, weekday: u8, minute: u32) -> Option<i64> {
        let now = u32::from(weekday % 7) * 24 * 60 + minute.min(24 * 60 - 1);
        // Every entry as (week minute, specific day?, max); a day's own entry beats `*`.
        let mut points: Vec<(u32, bool, i64)> = Vec::new();
        for e in &self.entries {
            match e.day {
                Some(d) => points.push((u32::from(d) * 24 * 60 + e.minute, true, e.max)),
                None => points.extend((0..7).map(|d| (d * 24 * 60 + e.minute, false, e.max))),
            }
        }
        // How far back from now each point lies (0 = now), then the nearest, specific first.
        points
            .iter()
            .min_by_key(|(at, specific, _)| ((now + WEEK - at) % WEEK, !specific))
            .map(|(_, _, max)| *max)
    }
}

/// A `max_tasks` key `"<day> <HH:MM>"` (any whitespace between) with its value.
fn entry(key: &str, max: i64) -> Result<Entry, String> {
    let bad = || format!("max_tasks key {key:?} is not \"<day> <HH:MM>\" (day 0-6 with 0 = Sunday, or *)");
    let mut parts = key.split_whitespace();
    let (Some(day), Some(time), None) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad());
    };
    let day = match day {
        "*" => None,
        d => Some(d.parse::<u8>().ok().filter(|d| *d <= 6).ok_or_else(bad)?),
    };
    let (h, m) = time.split_once(':').ok_or_else(bad)?;
    let (h, m) = (
        h.parse::<u32>().map_err(|_| bad())?,
        m.parse::<u32>().map_err(|_| bad())?,
    );
    if h > 23 || m > 59 {
        return Err(bad());
    }
    Ok(Entry {
        day,
        minute: h * 60 + m,
        max,
    })
}

/// Checks a `POST /balance` body the way Disbatch 4 does (fields `max_tasks`, `queues` and
/// optionally `disabled`, nothing else; every queue known and named once; `disabled` a
/// time to come, 0 or null) and returns the fields to set, numbers stored as numbers. The
/// error says what is wrong.
pub fn check_post(body: &Value, known: &[String], now: i64) -> Result<Document, String> {
    let Value::Object(fields) = body else {
        return Err("the body must be a JSON object with `max_tasks` and `queues`".into());
    };
    if let Some(k) = fields
        .keys()
        .find(|k| !matches!(k.as_str(), "max_tasks" | "queues" | "disabled"))
    {
        return Err(format!("unknown field {k:?} (allowed: max_tasks, queues, disabled)"));
    }
    let Some(Value::Object(max_tasks)) = fields.get("max_tasks") else {
        return Err("`max_tasks` must be an object of \"<day> <HH:MM>\": number".into());
    };
    let mut max = Document::new();
    for (k, v) in max_tasks {
        let n = match v {
            Value::Number(n) => n.as_i64().filter(|n| *n >= 0),
            Value::String(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => s.parse().ok(),
            _ => None,
        }
        .ok_or_else(|| format!("max_tasks {k:?}: {v} is not a non-negative integer"))?;
        let b = k.as_bytes();
        let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
        let strict = b.len() == 7 && b[1] == b' ' && b[4] == b':' && digits(2..4) && digits(5..7);
        entry(k, n).and_then(|_| {
            if strict {
                Ok(())
            } else {
                Err(format!(
                    "max_tasks key {k:?} is not \"<day> <HH:MM>\" (day 0-6 with 0 = Sunday, or *)"
                ))
            }
        })?;
        max.insert(k.clone(), n);
    }
    let Some(Value::Array(lanes)) = fields.get("queues") else {
        return Err("`queues` must be an array of arrays of queue names".into());
    };
    let mut seen = std::collections::HashSet::new();
    let mut queues = Vec::new();
    for (i, lane) in lanes.iter().enumerate() {
        let Value::Array(names) = lane else {
            return Err(format!("queues[{i}] must be an array of queue names"));
        };
        let mut out = Vec::new();
        for name in names {
            let Value::String(name) = name else {
                return Err(format!("queues[{i}] holds {name}, not a queue name"));
            };
            if !known.contains(name) {
                return Err(format!("queues[{i}]: no queue is named {name:?}"));
            }
            if !seen.insert(name.clone()) {
                return Err(format!("queue {name:?} is named twice in `queues`"));
            }
            out.push(Bson::String(name.clone()));
        }
        queues.push(Bson::Array(out));
    }
    if max.is_empty() && !seen.is_empty() {
        return Err("`max_tasks` needs at least one entry to limit the queues listed".into());
    }
    let mut set = bson::doc! { "max_tasks": max, "queues": queues };
    match fields.get("disabled") {
        None => {}
        Some(Value::Null) => {
            set.insert("disabled", Bson::Null);
        }
        Some(v) => {
            let t = match v {
                Value::Number(n) => n.as_i64(),
                Value::String(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => s.parse().ok(),
                _ => None,
            }
            .filter(|t| *t >= 0)
            .ok_or_else(|| format!("`disabled` is {v}, not epoch seconds"))?;
            if t != 0 && t < now {
                return Err(format!(
                    "`disabled` ({t}) is in the past; give a time to come, 0 or null"
                ));
            }
            if t >= 100_000_000_000 {
                return Err(format!("`disabled` ({t}) looks like milliseconds; give epoch seconds"));
            }
            set.insert("disabled", if t == 0 { Bson::Null } else { Bson::Int64(t) });
        }
    }
    Ok(set)
}

/// Shares `budget` running tasks between lanes of queues, each queue with the `demand`
/// it can use now (running plus queued, within its own `threads`). The lanes after the
/// first take first, in order; the first (default) lane gets the rest. Within a lane the
/// share is even, what a queue cannot use going to the others. The result has the
/// shape of `demands`.
/// A remainder that cannot be split evenly goes to the queues from `rotate` on (modulo the
/// lane's size), so a caller passing a changing `rotate` starves no queue at a lane's end.
pub fn allocate(budget: i64, demands: &[Vec<i64>], rotate: usize) -> Vec<Vec<i64>> {
    let mut out: Vec<Vec<i64>> = demands.iter().map(|lane| vec![0; lane.len()]).collect();
    let mut left = budget.max(0);
    let order = (1..demands.len()).chain((!demands.is_empty()).then_some(0));
    for l in order {
        left -= fill(left, &demands[l], &mut out[l], rotate);
    }
    out
}

/// Fills `got` evenly up to `demand` with at most `budget`; returns what it gave.
fn fill(budget: i64, demand: &[i64], got: &mut [i64], rotate: usize) -> i64 {
    let mut left = budget;
    loop {
        let open: Vec<usize> = (0..demand.len()).filter(|&i| got[i] < demand[i].max(0)).collect();
        if open.is_empty() || left <= 0 {
            return budget - left;
        }
        let share = left / open.len() as i64;
        if share == 0 {
            let start = rotate % open.len();
            for &i in open.iter().cycle().skip(start).take(left as usize) {
                got[i] += 1;
            }
            return budget;
        }
        for &i in &open {
            let add = share.min(demand[i] - got[i]);
            got[i] += add;
            left -= add;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn balance(max_tasks: Document) -> Balance {
        Balance::from_document(&bson::doc! { "max_tasks": max_tasks, "queues": [] }).unwrap()
    }

    #[test]
    fn the_latest_entry_at_or_before_now_is_in_force() {
        let b = balance(bson::doc! { "* 07:00": 5, "* 19:00": "10", "1 07:00": 6, "5 19:00": 15 });
        // Friday 20:00 → Friday's own 19:00 entry.
        assert_eq!(b.max_tasks_at(5, 20 * 60), Some(15));
        // Saturday 06:59 → still Friday 19:00.
        assert_eq!(b.max_tasks_at(6, 6 * 60 + 59), Some(15));
        // Saturday 07:00 → every day's 07:00.
        assert_eq!(b.max_tasks_at(6, 7 * 60), Some(5));
        // Monday 07:30 → Monday's own entry beats `*` at the same time.
        assert_eq!(b.max_tasks_at(1, 7 * 60 + 30), Some(6));
        // Sunday 00:00 wraps back to Saturday 19:00.
        assert_eq!(b.max_tasks_at(0, 0), Some(10));
        assert_eq!(balance(bson::doc! {}).max_tasks_at(3, 100), None);
        // One entry on one day holds all week.
        assert_eq!(balance(bson::doc! { "3 12:00": 4 }).max_tasks_at(2, 0), Some(4));
    }

    #[test]
    fn stored_documents_are_read_leniently_and_faults_named() {
        let b = Balance::from_document(&bson::doc! {
            "max_tasks": { "*   00:00": "3" }, "queues": [["a", "b"], ["c"]], "disabled": "0",
        })
        .unwrap();
        assert_eq!(b.max_tasks_at(4, 500), Some(3));
        assert_eq!(b.lanes, vec![vec!["a".to_string(), "b".into()], vec!["c".into()]]);
        assert_eq!(b.disabled, None);
        for (doc, fault) in [
            (
                bson::doc! { "max_tasks": { "8 00:00": 1 }, "queues": [] },
                "\"8 00:00\"",
            ),
            (
                bson::doc! { "max_tasks": { "* 24:00": 1 }, "queues": [] },
                "\"* 24:00\"",
            ),
            (
                bson::doc! { "max_tasks": { "* 01:00": -1 }, "queues": [] },
                "non-negative",
            ),
            (bson::doc! { "max_tasks": {}, "queues": "a" }, "`queues`"),
            (bson::doc! { "max_tasks": {}, "queues": ["a"] }, "queues[0]"),
            (
                bson::doc! { "max_tasks": {}, "queues": [], "disabled": "soon" },
                "`disabled`",
            ),
        ] {
            let e = Balance::from_document(&doc).unwrap_err();
            assert!(e.contains(fault), "{e} should name {fault}");
        }
    }

    #[test]
    fn posts_are_checked_like_disbatch_4() {
        let known = vec!["a".to_string(), "b".into()];
        let ok = serde_json::json!({ "max_tasks": { "* 07:00": "5", "1 19:00": 2 }, "queues": [["a"], ["b"]] });
        let set = check_post(&ok, &known, 1000).unwrap();
        assert_eq!(set.get_document("max_tasks").unwrap().get_i64("* 07:00").unwrap(), 5);
        for (body, fault) in [
            (
                serde_json::json!({ "max_tasks": {}, "queues": [], "extra": 1 }),
                "\"extra\"",
            ),
            (serde_json::json!({ "queues": [] }), "`max_tasks`"),
            (
                serde_json::json!({ "max_tasks": { "* 7:00": 1 }, "queues": [] }),
                "\"* 7:00\"",
            ),
            (
                serde_json::json!({ "max_tasks": { "* 07:00": "x" }, "queues": [] }),
                "non-negative",
            ),
            (serde_json::json!({ "max_tasks": {}, "queues": [["c"]] }), "\"c\""),
            (
                serde_json::json!({ "max_tasks": {}, "queues": [["a"], ["a"]] }),
                "twice",
            ),
            (serde_json::json!({ "max_tasks": {}, "queues": ["a"] }), "queues[0]"),
            (
                serde_json::json!({ "max_tasks": {}, "queues": [], "disabled": 999 }),
                "past",
            ),
            (
                serde_json::json!({ "max_tasks": {}, "queues": [], "disabled": 1_800_000_000_000_i64 }),
                "milliseconds",
            ),
            (
                serde_json::json!({ "max_tasks": {}, "queues": [["a"]] }),
                "at least one entry",
            ),
        ] {
            let e = check_post(&body, &known, 1000).unwrap_err();
            assert!(e.contains(fault), "{e} should name {fault}");
        }
        let off = serde_json::json!({ "max_tasks": {}, "queues": [], "disabled": 0 });
        assert_eq!(
            check_post(&off, &known, 1000).unwrap().get("disabled"),
            Some(&Bson::Null)
        );
    }

    #[test]
    fn priority_lanes_take_first_and_the_default_lane_gets_the_rest() {
        // Default lane wants 10, first priority lane 3: 7 left for the default lane.
        assert_eq!(allocate(10, &[vec![10], vec![3]], 0), vec![vec![7], vec![3]]);
        // Lanes after the first in order: lane 1 before lane 2.
        assert_eq!(
            allocate(4, &[vec![5], vec![3], vec![3]], 0),
            vec![vec![0], vec![3], vec![1]]
        );
        // Even split within a lane; what one cannot use goes to the other.
        assert_eq!(allocate(10, &[vec![2, 20]], 0), vec![vec![2, 8]]);
        assert_eq!(allocate(5, &[vec![9, 9]], 0), vec![vec![3, 2]]);
        // Never more than the budget, nor than a queue can use.
        assert_eq!(allocate(100, &[vec![1, 2], vec![0]], 0), vec![vec![1, 2], vec![0]]);
        assert_eq!(allocate(0, &[vec![4], vec![4]], 0), vec![vec![0], vec![0]]);
        assert!(allocate(3, &[], 0).is_empty());
        // The remainder moves with `rotate`: no queue at a lane's end starves.
        assert_eq!(allocate(2, &[vec![5, 5, 5]], 0), vec![vec![1, 1, 0]]);
        assert_eq!(allocate(2, &[vec![5, 5, 5]], 2), vec![vec![1, 0, 1]]);
    }
}
