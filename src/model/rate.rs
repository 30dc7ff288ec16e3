//! A queue's `rate`: at most `max` task starts in any window of `per`, across every DEN.

use std::time::Duration;

use bson::Bson;

use super::lenient::lenient_int;
use super::retry::MAX_WAIT_TIME;

/// The largest `rate.max`: each start is one of `max` grant rows, read whole by each take.
pub const MAX_RATE: i64 = 10_000;

/// A queue's `rate` sub-document `{max, per}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// The most task starts in any window of `per` (0 starts nothing: a `rate` that cannot
    /// be read).
    pub max: i64,
    /// The window.
    pub per: Duration,
}

impl Rate {
    /// Reads a `rate` as an API caller writes it: `{max: integer ≥ 1, per: duration}` with
    /// `per` as text like "1s", "500ms", "5m" or a number of seconds, above zero and at most
    /// 365 days. The error names the field (`rate.max`, `rate.per`).
    pub fn parse(value: &Bson) -> Result<Rate, String> {
        let Bson::Document(d) = value else {
            return Err("field \"rate\" must be an object {max, per} or null".to_owned());
        };
        if let Some(k) = d.keys().find(|k| *k != "max" && *k != "per") {
            return Err(format!("field \"rate.{k}\" is unknown: rate takes max and per"));
        }
        let max = match d.get("max") {
            Some(Bson::Int32(n)) => i64::from(*n),
            Some(Bson::Int64(n)) => *n,
            Some(Bson::Double(f)) if f.fract() == 0.0 && f.abs() <= super::MAX_EXACT_DOUBLE => *f as i64,
            _ => return Err("field \"rate.max\" must be an integer of at least 1".to_owned()),
        };
        if !(1..=MAX_RATE).contains(&max) {
            return Err(format!(
                "field \"rate.max\" must be an integer from 1 to {MAX_RATE}, got {max}"
            ));
        }
        let per = d
            .get("per")
            .ok_or_else(|| "field \"rate.per\" is missing: a duration like \"1s\" or \"5m\"".to_owned())
            .and_then(per_from)?;
        Ok(Rate { max, per })
    }

    /// Reads a stored `rate` leniently (Disbatch 4's tools may write numbers as strings):
    /// absent or null is none; a `max` that cannot be read is noted in `problems` and read
    /// as 0 (the queue starts nothing until it is fixed), a `per` that cannot be read as
    /// 365 days. The queue stays readable either way.
    pub fn read(value: Option<&Bson>, problems: &mut Vec<String>) -> Option<Rate> {
        let value = value.filter(|v| !matches!(v, Bson::Null))?;
        let Bson::Document(d) = value else {
            problems.push(format!(
                "field `rate` is {value}, not {{max, per}}; rate.max read as 0 (the queue starts nothing) until it is fixed"
            ));
            return Some(Rate {
                max: 0,
                per: MAX_WAIT_TIME,
            });
        };
        let max = match d.get("max").and_then(lenient_int) {
            Some(n) if (1..=MAX_RATE).contains(&n) => n,
            _ => {
                problems.push(format!(
                    "field `rate.max` is {}, not an integer from 1 to {MAX_RATE}; read as 0 (the queue starts nothing) until it is fixed",
                    d.get("max").map_or("missing".to_owned(), ToString::to_string)
                ));
                0
            }
        };
        let per = match d.get("per").map(per_from) {
            Some(Ok(per)) => per,
            other => {
                let why = match other {
                    Some(Err(e)) => e,
                    _ => "field \"rate.per\" is missing".to_owned(),
                };
                problems.push(format!("{why}; read as 365 days until it is fixed"));
                MAX_WAIT_TIME
            }
        };
        Some(Rate { max, per })
    }

    /// The `rate` sub-document as stored: `per` as text ("1s", "5m").
    pub fn to_bson(&self) -> Bson {
        Bson::Document(bson::doc! {
            "max": i32::try_from(self.max).map_or(Bson::Int64(self.max), Bson::Int32),
            "per": humantime::format_duration(self.per).to_string(),
        })
    }

    /// The `rate` as JSON: `{max, per}`, `per` as text.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "max": self.max, "per": humantime::format_duration(self.per).to_string() })
    }
}

/// A `rate.per`: text like "1s" or a number of seconds, above zero and at most 365 days;
/// a number written as a string is read as seconds.
fn per_from(v: &Bson) -> Result<Duration, String> {
    let bad = |why: String| format!("field \"rate.per\" {why}");
    let d = match v {
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) => {
            let secs = match v {
                Bson::Int32(n) => f64::from(*n),
                Bson::Int64(n) => *n as f64,
                Bson::Double(f) => *f,
                _ => unreachable!("matched above"),
            };
            if !(secs.is_finite() && secs > 0.0) {
                return Err(bad(format!("must be a positive duration, got {secs}")));
            }
            Duration::try_from_secs_f64(secs).map_err(|_| bad(format!("{secs} s is too large")))?
        }
        Bson::String(s) => match s.trim().parse::<f64>() {
            Ok(secs) if secs.is_finite() && secs > 0.0 => {
                Duration::try_from_secs_f64(secs).map_err(|_| bad(format!("{secs} s is too large")))?
            }
            Ok(secs) => return Err(bad(format!("must be a positive duration, got {secs}"))),
            Err(_) => {
                humantime::parse_duration(s.trim()).map_err(|e| bad(format!("is not a duration ({s:?}: {e})")))?
            }
        },
        other => return Err(bad(format!("must be a duration like \"1s\", got {other}"))),
    };
    if d < Duration::from_millis(1) {
        return Err(bad(format!("must be at least 1 ms, got {d:?}")));
    }
    if d > MAX_WAIT_TIME {
        return Err(bad(format!(
            "must be at most {} seconds (365 days)",
            MAX_WAIT_TIME.as_secs()
        )));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn parse_names_the_field() {
        let ok = Rate::parse(&doc! { "max": 10, "per": "1s" }.into()).unwrap();
        assert_eq!(
            ok,
            Rate {
                max: 10,
                per: Duration::from_secs(1)
            }
        );
        let ms = Rate::parse(&doc! { "max": 2, "per": "500ms" }.into()).unwrap();
        assert_eq!(ms.per, Duration::from_millis(500));
        assert_eq!(
            Rate::parse(&doc! { "max": 2, "per": 60 }.into()).unwrap().per,
            Duration::from_secs(60)
        );
        for (bad, field) in [
            (doc! { "max": 0, "per": "1s" }, "rate.max"),
            (doc! { "max": -1, "per": "1s" }, "rate.max"),
            (doc! { "max": 1.5, "per": "1s" }, "rate.max"),
            (doc! { "max": "3", "per": "1s" }, "rate.max"),
            (doc! { "per": "1s" }, "rate.max"),
            (doc! { "max": 1, "per": "soon" }, "rate.per"),
            (doc! { "max": 1, "per": 0 }, "rate.per"),
            (doc! { "max": 1, "per": "0s" }, "rate.per"),
            (doc! { "max": 1, "per": "400days" }, "rate.per"),
            (doc! { "max": 1 }, "rate.per"),
            (doc! { "max": 1, "per": "1s", "burst": 2 }, "rate.burst"),
        ] {
            let e = Rate::parse(&bad.clone().into()).unwrap_err();
            assert!(e.contains(field), "{bad}: {e}");
        }
    }

    #[test]
    fn stored_rates_are_read_leniently_and_safely() {
        let mut problems = Vec::new();
        let r = Rate::read(Some(&doc! { "max": "4", "per": "2" }.into()), &mut problems).unwrap();
        assert_eq!(
            r,
            Rate {
                max: 4,
                per: Duration::from_secs(2)
            }
        );
        assert!(problems.is_empty());
        assert_eq!(Rate::read(Some(&Bson::Null), &mut problems), None);
        let r = Rate::read(Some(&doc! { "max": "many", "per": "1s" }.into()), &mut problems).unwrap();
        assert_eq!(r.max, 0);
        assert!(problems.last().unwrap().contains("rate.max"));
        let r = Rate::read(Some(&doc! { "max": 3, "per": "soon" }.into()), &mut problems).unwrap();
        assert_eq!((r.max, r.per), (3, MAX_WAIT_TIME));
        assert!(problems.last().unwrap().contains("rate.per"));
        let r = Rate::read(Some(&Bson::Int32(5)), &mut problems).unwrap();
        assert_eq!(r.max, 0);
    }

    #[test]
    fn stored_form_reads_back() {
        let r = Rate {
            max: 10,
            per: Duration::from_millis(1500),
        };
        assert_eq!(Rate::parse(&r.to_bson()).unwrap(), r);
    }
}
