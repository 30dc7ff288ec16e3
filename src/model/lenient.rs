//! Values as other clients write them: integers as Int32, Int64, integral Doubles or
//! strings, and durations as seconds or text like "30s".

/// Largest integer a Double represents exactly (2^53).
pub const MAX_EXACT_DOUBLE: f64 = 9_007_199_254_740_992.0;

/// An integer as other clients write it: Int32, Int64, an integral Double or a string
/// holding a decimal integer (Perl writes form values as strings).
pub fn lenient_int(value: &bson::Bson) -> Option<i64> {
    use bson::Bson;
    match value {
        Bson::Int32(n) => Some(i64::from(*n)),
        Bson::Int64(n) => Some(*n),
        Bson::Double(f) if f.fract() == 0.0 && f.abs() <= MAX_EXACT_DOUBLE => Some(*f as i64),
        Bson::String(s) => {
            let s = s.trim();
            s.parse::<i64>().ok().or_else(|| {
                s.parse::<f64>()
                    .ok()
                    .filter(|f| f.is_finite())
                    .and_then(|f| lenient_int(&Bson::Double(f)))
            })
        }
        _ => None,
    }
}

/// A duration as seconds or as text like "1h 30m" (serde `with`), for optional fields.
pub(crate) mod opt_duration {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_str(&humantime::format_duration(*d).to_string()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Secs(f64),
            Text(String),
        }
        match Option::<Raw>::deserialize(d)? {
            None => Ok(None),
            Some(Raw::Secs(s)) if s > 0.0 => Duration::try_from_secs_f64(s)
                .map(Some)
                .map_err(|_| serde::de::Error::custom(format!("{s} s is too large"))),
            Some(Raw::Secs(s)) => Err(serde::de::Error::custom(format!(
                "a duration must be positive, got {s}"
            ))),
            Some(Raw::Text(t)) => humantime::parse_duration(&t)
                .map(Some)
                .map_err(|e| serde::de::Error::custom(format!("invalid duration {t:?}: {e}"))),
        }
    }
}
