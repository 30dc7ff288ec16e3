//! How long ended tasks are kept (`retention`): a queue's own, over the cluster default of
//! the config. Disbatch 4 keeps every task; so does a queue with neither.
//!
//! Written `{"succeeded": "7d", "failed": "30d", "cancelled": "1d", "orphaned": "30d",
//! "terminated": "30d"}`: a duration (text like "12h" or a number of seconds) per ended
//! status, counted from the task's end (its `mtime`). A status left out is kept for good.

use std::collections::BTreeMap;
use std::time::Duration;

use bson::{Bson, Document};

use super::status;

/// The statuses a retention names, by their key.
pub const RETENTION_KEYS: [(&str, i32); 5] = [
    ("succeeded", status::SUCCEEDED),
    ("failed", status::FAILED),
    ("cancelled", status::CANCELLED),
    ("orphaned", status::ORPHANED),
    ("terminated", status::TERMINATED),
];

/// The longest retention: ten years.
pub const MAX_RETENTION: Duration = Duration::from_secs(3650 * 24 * 3600);

/// How long ended tasks of each status are kept, counted from their end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Retention {
    /// Status code → how long its tasks are kept.
    pub by_status: BTreeMap<i32, Duration>,
    /// Every task kept, whatever the default says: a stored `retention` that cannot be
    /// read ([`Retention::keep_all`]).
    pub keeps_all: bool,
}

impl Retention {
    /// A retention that keeps every task, over any default: what a stored `retention`
    /// that cannot be read stands for until it is fixed.
    pub fn keep_all() -> Retention {
        Retention {
            by_status: BTreeMap::new(),
            keeps_all: true,
        }
    }

    /// Whether it deletes nothing.
    pub fn is_empty(&self) -> bool {
        self.keeps_all || self.by_status.is_empty()
    }

    /// How long tasks of `code` are kept; `None`: for good.
    pub fn of(&self, code: i32) -> Option<Duration> {
        self.by_status.get(&code).copied()
    }

    /// This retention over `default`: each status this one names takes its duration, the
    /// others `default`'s.
    pub fn over(&self, default: &Retention) -> Retention {
        if self.keeps_all {
            return self.clone();
        }
        let mut by_status = default.by_status.clone();
        by_status.extend(self.by_status.iter().map(|(k, v)| (*k, *v)));
        Retention {
            by_status,
            keeps_all: false,
        }
    }

    /// Reads a `retention` value as any client writes it: an object of durations (text
    /// like "7d", or a number of seconds, written as a string too). The error is
    /// `(field, what is wrong)`, the field named `retention` or `retention.<status>`.
    pub fn from_bson(value: &Bson) -> Result<Retention, (String, String)> {
        let Bson::Document(d) = value else {
            return Err(("retention".into(), format!("must be an object, got {value}")));
        };
        let mut by_status = BTreeMap::new();
        for (k, v) in d {
            let field = format!("retention.{k}");
            let Some((_, code)) = RETENTION_KEYS.iter().find(|(name, _)| name == k) else {
                let names: Vec<&str> = RETENTION_KEYS.iter().map(|(n, _)| *n).collect();
                return Err((
                    field,
                    format!("is not an ended status; a retention names {}", names.join(", ")),
                ));
            };
            if matches!(v, Bson::Null) {
                continue;
            }
            let d = duration(v).map_err(|e| (field.clone(), e))?;
            by_status.insert(*code, d);
        }
        Ok(Retention {
            by_status,
            keeps_all: false,
        })
    }

    /// The document as stored: each duration as text ("7days").
    pub fn to_document(&self) -> Document {
        let mut d = Document::new();
        for (name, code) in RETENTION_KEYS {
            if let Some(v) = self.of(code) {
                d.insert(name, humantime::format_duration(v).to_string());
            }
        }
        d
    }

    /// The JSON the API shows: each duration as text.
    pub fn to_json(&self) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        for (name, code) in RETENTION_KEYS {
            if let Some(v) = self.of(code) {
                m.insert(name.into(), humantime::format_duration(v).to_string().into());
            }
        }
        serde_json::Value::Object(m)
    }
}

/// One duration of a retention: more than zero, at most [`MAX_RETENTION`].
fn duration(v: &Bson) -> Result<Duration, String> {
    let d = match v {
        Bson::String(s) => match s.trim().parse::<f64>() {
            Ok(secs) => seconds(secs)?,
            Err(_) => humantime::parse_duration(s.trim())
                .map_err(|e| format!("must be a duration like \"7d\" or \"12h\", got {s:?}: {e}"))?,
        },
        Bson::Int32(n) => seconds(f64::from(*n))?,
        Bson::Int64(n) => seconds(*n as f64)?,
        Bson::Double(f) => seconds(*f)?,
        other => {
            return Err(format!(
                "must be a duration like \"7d\" or a number of seconds, got {other}"
            ))
        }
    };
    if d.is_zero() {
        return Err("must be more than zero".into());
    }
    if d > MAX_RETENTION {
        return Err(format!(
            "must be at most {} days",
            MAX_RETENTION.as_secs() / (24 * 3600)
        ));
    }
    Ok(d)
}

fn seconds(secs: f64) -> Result<Duration, String> {
    if secs.is_nan() || secs <= 0.0 {
        return Err(format!("must be more than zero, got {secs}"));
    }
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{secs} s is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn durations_as_text_numbers_and_strings() {
        let r = Retention::from_bson(&Bson::Document(
            doc! { "succeeded": "7d", "failed": 90, "cancelled": "3600", "orphaned": null },
        ))
        .unwrap();
        assert_eq!(r.of(status::SUCCEEDED), Some(Duration::from_secs(7 * 86400)));
        assert_eq!(r.of(status::FAILED), Some(Duration::from_secs(90)));
        assert_eq!(r.of(status::CANCELLED), Some(Duration::from_secs(3600)));
        assert_eq!(r.of(status::ORPHANED), None);
        let again = Retention::from_bson(&Bson::Document(r.to_document())).unwrap();
        assert_eq!(again, r);
    }

    #[test]
    fn errors_name_the_field() {
        let err = |d: Document| Retention::from_bson(&Bson::Document(d)).unwrap_err();
        assert_eq!(err(doc! { "queued": "1d" }).0, "retention.queued");
        assert_eq!(err(doc! { "failed": "0s" }).0, "retention.failed");
        assert_eq!(err(doc! { "failed": -5 }).0, "retention.failed");
        assert_eq!(err(doc! { "succeeded": "soon" }).0, "retention.succeeded");
        assert_eq!(
            Retention::from_bson(&Bson::String("7d".into())).unwrap_err().0,
            "retention"
        );
    }

    #[test]
    fn a_queue_overrides_the_default_per_status() {
        let d = Retention::from_bson(&Bson::Document(doc! { "succeeded": "7d", "failed": "30d" })).unwrap();
        let q = Retention::from_bson(&Bson::Document(doc! { "succeeded": "1h" })).unwrap();
        let r = q.over(&d);
        assert_eq!(r.of(status::SUCCEEDED), Some(Duration::from_secs(3600)));
        assert_eq!(r.of(status::FAILED), Some(Duration::from_secs(30 * 86400)));
    }
}
