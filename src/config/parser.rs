//! Validation of one raw config object: every key checked, typos hinted, defaults filled.

use std::path::PathBuf;
use std::time::Duration;

use bson::oid::ObjectId;
use serde_json::{Map, Value};

use super::{
    check_database, check_mongohost, check_plugin_name, Config, ConfigError, Gfs, StoreKind, DEFAULT_BIND,
    DEFAULT_HEARTBEAT_STALE, DEFAULT_MAX_INSTANCES, DEFAULT_ORPHAN_CLAIMED_AFTER, DEFAULT_PLUGIN_DIR,
    DEFAULT_SHUTDOWN_GRACE, DEFAULT_STATS_RETENTION, IGNORED_KEYS, KNOWN_KEYS, MAX_COMPLETION_WINDOW, MAX_DURATION,
    MAX_INSTANCES, MAX_READ_AHEAD, MIN_API_TOKEN_LEN,
};

/// A value for a message: scalars as written (long strings shortened), containers by kind.
pub(super) fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) if s.chars().count() > 60 => format!("{:?}…", s.chars().take(60).collect::<String>()),
        Value::String(s) => format!("{s:?}"),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// `" (did you mean \"k\"?)"` for the candidate closest to `key`, when it is a likely typo.
pub(super) fn hint(key: &str, candidates: &[&str]) -> String {
    candidates
        .iter()
        .map(|k| (edit_distance(key, k), *k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 4) && *d < key.chars().count().max(1))
        .min()
        .map(|(_, k)| format!(" (did you mean {k:?}?)"))
        .unwrap_or_default()
}

/// Levenshtein distance.
pub(super) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            cur.push((prev[j] + usize::from(ca != *cb)).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// Validates the keys of one raw config object.
pub(super) struct Parser<'a> {
    pub(super) file: &'a str,
    pub(super) map: &'a Map<String, Value>,
    /// Which keys are required.
    pub(super) store: StoreKind,
    /// (key, variable) of the keys an environment variable set.
    pub(super) from_env: Vec<(&'static str, &'static str)>,
    pub(super) warnings: Vec<String>,
}

impl<'a> Parser<'a> {
    pub(super) fn invalid(&self, key: &str, reason: impl Into<String>) -> ConfigError {
        let mut reason = reason.into();
        let top = key.split(['.', '[']).next().unwrap_or(key);
        if let Some((_, var)) = self.from_env.iter().find(|(k, _)| *k == top) {
            reason.push_str(&format!(" (set by {var})"));
        }
        ConfigError::Invalid {
            file: self.file.to_owned(),
            key: key.to_owned(),
            reason,
        }
    }

    pub(super) fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub(super) fn required_str(&self, key: &str) -> Result<String, ConfigError> {
        match self.get(key) {
            None => Err(ConfigError::Missing {
                file: self.file.to_owned(),
                key: key.to_owned(),
            }),
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            Some(v) => Err(self.invalid(key, format!("must be a non-empty string, got {}", describe(v)))),
        }
    }

    /// An optional string; when present it must not be empty.
    pub(super) fn opt_str(&self, key: &str) -> Result<Option<String>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
            Some(v) => Err(self.invalid(
                key,
                format!(
                    "must be a non-empty string (omit the key for the default), got {}",
                    describe(v)
                ),
            )),
        }
    }

    /// `true`/`false`, or the Perl-style `1`/`0`; `None` when absent or null.
    pub(super) fn opt_bool(&self, key: &str, v: Option<&Value>) -> Result<Option<bool>, ConfigError> {
        match v {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(Value::Number(n)) if matches!(n.as_u64(), Some(0 | 1)) => Ok(Some(n.as_u64() == Some(1))),
            Some(v) => Err(self.invalid(key, format!("must be true or false, got {}", describe(v)))),
        }
    }

    pub(super) fn object(&self, key: &str) -> Result<Option<&'a Map<String, Value>>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(v) => Err(self.invalid(key, format!("must be an object, got {}", describe(v)))),
        }
    }

    /// A top-level duration: a positive number of seconds up to [`MAX_DURATION`]; a number
    /// so small that it is no time at all (below a nanosecond) is not positive.
    pub(super) fn seconds(&self, key: &str, default: Duration) -> Result<Duration, ConfigError> {
        let Some(v) = self.get(key) else {
            return Ok(default);
        };
        let not_positive = || {
            self.invalid(
                key,
                format!("must be a positive number of seconds, got {}", describe(v)),
            )
        };
        let secs = v.as_f64().filter(|s| *s > 0.0).ok_or_else(not_positive)?;
        let d = Duration::try_from_secs_f64(secs).ok();
        if d.is_some_and(|d| d.is_zero()) {
            return Err(not_positive());
        }
        self.bounded(key, d)
    }

    /// `completion_window`: seconds from 0 to [`MAX_COMPLETION_WINDOW`], 0 when unset.
    pub(super) fn completion_window(&self) -> Result<Duration, ConfigError> {
        let key = "completion_window";
        let Some(v) = self.get(key) else {
            return Ok(Duration::ZERO);
        };
        let max = MAX_COMPLETION_WINDOW.as_secs_f64();
        v.as_f64()
            .filter(|s| (0.0..=max).contains(s))
            .map(Duration::from_secs_f64)
            .ok_or_else(|| {
                self.invalid(
                    key,
                    format!("must be a number of seconds from 0 to {max}, got {}", describe(v)),
                )
            })
    }

    /// `read_ahead`: 0, or seconds from a millisecond to [`MAX_READ_AHEAD`]; `None` when
    /// unset.
    pub(super) fn read_ahead(&self) -> Result<Option<Duration>, ConfigError> {
        let key = "read_ahead";
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let max = MAX_READ_AHEAD.as_secs_f64();
        v.as_f64()
            .filter(|&s| s == 0.0 || (0.001..=max).contains(&s))
            .map(|s| Some(Duration::from_secs_f64(s.abs())))
            .ok_or_else(|| {
                self.invalid(
                    key,
                    format!(
                        "must be 0 (read none ahead) or a number of seconds from 0.001 to {max}, got {}",
                        describe(v)
                    ),
                )
            })
    }

    pub(super) fn stats_retention(&self) -> Result<Duration, ConfigError> {
        let d = self.seconds("stats_retention", DEFAULT_STATS_RETENTION)?;
        if d < Duration::from_secs(60) {
            return Err(self.invalid("stats_retention", "must be at least 60 seconds"));
        }
        Ok(d)
    }

    /// The cluster's default `retention`: the shape of a queue's (`retention.<status>`
    /// named in each error). None by default: every task is kept.
    pub(super) fn retention(&self) -> Result<crate::model::Retention, ConfigError> {
        let Some(v) = self.get("retention") else {
            return Ok(crate::model::Retention::default());
        };
        let b = bson::Bson::try_from(v.clone()).map_err(|e| self.invalid("retention", e.to_string()))?;
        crate::model::Retention::from_bson(&b).map_err(|(key, e)| self.invalid(&key, e))
    }

    pub(super) fn bounded(&self, key: &str, d: Option<Duration>) -> Result<Duration, ConfigError> {
        d.filter(|d| *d <= MAX_DURATION).ok_or_else(|| {
            self.invalid(
                key,
                format!("must be at most {} seconds (365 days)", MAX_DURATION.as_secs()),
            )
        })
    }

    /// An integer in `min..=max`.
    pub(super) fn integer(&self, key: &str, v: &Value, min: u64, max: u64) -> Result<u64, ConfigError> {
        v.as_u64().filter(|n| (min..=max).contains(n)).ok_or_else(|| {
            self.invalid(
                key,
                format!("must be an integer from {min} to {max}, got {}", describe(v)),
            )
        })
    }

    /// An array, each entry checked by `entry` and named `key[i]` in errors.
    pub(super) fn array<T>(
        &self,
        key: &str,
        what: &str,
        entry: impl Fn(&Self, &str, &Value) -> Result<T, ConfigError>,
    ) -> Result<Vec<T>, ConfigError> {
        let Some(v) = self.get(key) else {
            return Ok(Vec::new());
        };
        let Value::Array(items) = v else {
            return Err(self.invalid(key, format!("must be an array of {what}, got {}", describe(v))));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, item)| entry(self, &format!("{key}[{i}]"), item))
            .collect()
    }

    pub(super) fn config(mut self) -> Result<Config, ConfigError> {
        for key in self.map.keys() {
            if IGNORED_KEYS.contains(&key.as_str()) {
                self.warnings.push(format!(
                    "key {key:?} is accepted for compatibility and has no effect here"
                ));
            } else if !KNOWN_KEYS.contains(&key.as_str()) {
                let all: Vec<&str> = KNOWN_KEYS.iter().chain(&IGNORED_KEYS).copied().collect();
                self.warnings
                    .push(format!("unknown key {key:?} ignored{}", hint(key, &all)));
            }
        }
        let mongohost = self.mongohost()?;
        let database = self.database()?;
        let tls = self.tls()?;
        let auth = self.auth()?;
        let plugins = self.array("plugins", "plugin names", |p, key, v| match v {
            Value::String(s) => check_plugin_name(s).map(|()| s.clone()).map_err(|e| p.invalid(key, e)),
            other => Err(p.invalid(key, format!("must be a plugin name string, got {}", describe(other)))),
        })?;
        let queue_id = |p: &Self, key: &str, v: &Value| {
            v.as_str()
                .and_then(|s| ObjectId::parse_str(s).ok())
                .ok_or_else(|| p.invalid(key, format!("must be a queue _id (24 hex digits), got {}", describe(v))))
        };
        let active_queues = self.array("activequeues", "queue ids", queue_id)?;
        let ignore_queues = self.array("ignorequeues", "queue ids", queue_id)?;
        if !active_queues.is_empty() && !ignore_queues.is_empty() {
            self.warnings
                .push("both activequeues and ignorequeues are set: only activequeues is used".into());
        }
        let node = match self.opt_str("node")? {
            Some(n) if n.trim().is_empty() => return Err(self.invalid("node", "must not be blank")),
            Some(n) => n,
            None => gethostname::gethostname().to_string_lossy().into_owned(),
        };
        let max_instances = match self.get("max_instances") {
            None => DEFAULT_MAX_INSTANCES,
            Some(v) => self.integer("max_instances", v, 1, MAX_INSTANCES.into())? as u32,
        };
        let api_token = self.opt_str("api_token")?;
        if api_token.as_ref().is_some_and(|t| t.trim() != t) {
            return Err(self.invalid("api_token", "must not start or end with whitespace"));
        }
        if api_token
            .as_ref()
            .is_some_and(|t| t.chars().count() < MIN_API_TOKEN_LEN)
        {
            self.warnings.push(format!(
                "api_token is shorter than {MIN_API_TOKEN_LEN} characters: use a long random token"
            ));
        }
        let bind = self.opt_str("bind")?.unwrap_or_else(|| DEFAULT_BIND.into());
        check_bind(&bind).map_err(|e| self.invalid("bind", e))?;
        let monitoring = self.opt_bool("monitoring", self.get("monitoring"))?.unwrap_or(false);
        Ok(Config {
            balance: self.balance()?,
            gfs: self.gfs()?,
            web_root: self.opt_str("web_root")?.map(PathBuf::from),
            plugin_dir: PathBuf::from(self.opt_str("plugin_dir")?.unwrap_or_else(|| DEFAULT_PLUGIN_DIR.into())),
            heartbeat_stale: self.seconds("heartbeat_stale", DEFAULT_HEARTBEAT_STALE)?,
            orphan_claimed_after: self.seconds("orphan_claimed_after", DEFAULT_ORPHAN_CLAIMED_AFTER)?,
            shutdown_grace: self.seconds("shutdown_grace", DEFAULT_SHUTDOWN_GRACE)?,
            stats_retention: self.stats_retention()?,
            retention: self.retention()?,
            completion_window: self.completion_window()?,
            read_ahead: self.read_ahead()?,
            sandbox: self.sandbox()?,
            cache_dir: self.opt_str("cache_dir")?.map(PathBuf::from),
            mongohost,
            database,
            tls,
            auth,
            plugins,
            monitoring,
            active_queues,
            ignore_queues,
            node,
            api_token,
            bind,
            max_instances,
            http: self.http()?,
            warnings: self.warnings,
        })
    }

    /// A string required for MongoDB and optional (empty when absent) for the embedded store.
    pub(super) fn store_str(&self, key: &str) -> Result<Option<String>, ConfigError> {
        match self.store {
            StoreKind::Mongo => self.required_str(key).map(Some),
            StoreKind::Embedded => self.opt_str(key),
        }
    }

    pub(super) fn mongohost(&self) -> Result<String, ConfigError> {
        let Some(uri) = self.store_str("mongohost")? else {
            return Ok(String::new());
        };
        check_mongohost(&uri).map_err(|e| self.invalid("mongohost", e))?;
        Ok(uri)
    }

    pub(super) fn database(&self) -> Result<String, ConfigError> {
        let Some(database) = self.store_str("database")? else {
            return Ok(String::new());
        };
        check_database(&database).map_err(|e| self.invalid("database", e))?;
        Ok(database)
    }

    pub(super) fn gfs(&self) -> Result<Gfs, ConfigError> {
        match self.get("gfs") {
            None => Ok(Gfs::Auto),
            Some(Value::String(s)) if s == "auto" => Ok(Gfs::Auto),
            Some(v) => match self.opt_bool("gfs", Some(v)) {
                Ok(Some(true)) => Ok(Gfs::Always),
                Ok(_) => Ok(Gfs::Never),
                Err(_) => Err(self.invalid("gfs", format!("must be true, false or \"auto\", got {}", describe(v)))),
            },
        }
    }
}

/// Checks a `host:port` address (the host may be a name or a bracketed IPv6 address).
pub(super) fn check_bind(bind: &str) -> Result<(), String> {
    let (host, port) = bind
        .rsplit_once(':')
        .ok_or_else(|| format!("must be host:port, got {bind:?}"))?;
    if host.is_empty() || host.contains(char::is_whitespace) {
        return Err(format!("must be host:port with a host, got {bind:?}"));
    }
    port.parse::<u16>()
        .map(|_| ())
        .map_err(|_| format!("must be host:port with a port from 0 to 65535, got {bind:?}"))
}
