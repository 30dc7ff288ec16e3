//! Configuration: the JSON config file of the spec (plus our keys) → a validated [`Config`].
//!
//! The file is read as raw JSON ([`serde_json::Value`]), then every key is checked on its
//! own so each error names its key: `config file den.json: "heartbeat_stale" must be a
//! positive number of seconds, got "abc"`. Nested keys are dotted (`sandbox.memory_mib`),
//! array entries indexed (`plugins[1]`). Unknown keys are not errors; they are returned in
//! [`Config::warnings`] for the binary to log, with a suggestion when they look like a typo.
//! Environment variables override some keys (see [`ENV_OVERRIDES`]). The full reference is
//! `docs/config.md`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bson::oid::ObjectId;
use serde_json::{Map, Value};

use crate::runner::{DirGrant, Sandbox, MAX_MEMORY};

/// Environment variable naming the config file when `--config` is not given.
pub const CONFIG_ENV: &str = "DISBATCH_CONFIG";
/// How errors name the config of a program run without a config file.
pub const NO_CONFIG_FILE: &str = "(no config file)";
/// Default `plugin_dir`.
pub const DEFAULT_PLUGIN_DIR: &str = "/var/lib/disbatch/plugins";
/// Default `heartbeat_stale`: a node silent this long is dead.
pub const DEFAULT_HEARTBEAT_STALE: Duration = Duration::from_secs(30);
/// Default `orphan_claimed_after`: the spec's 5 minutes for tasks stuck claimed.
pub const DEFAULT_ORPHAN_CLAIMED_AFTER: Duration = Duration::from_secs(300);
/// Default `shutdown_grace`.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// Default `bind` of the web server.
pub const DEFAULT_BIND: &str = "127.0.0.1:8080";
/// Default `max_instances`: plugin instances one process may run at once.
pub const DEFAULT_MAX_INSTANCES: u32 = 1000;
/// Largest `max_instances`.
pub const MAX_INSTANCES: u32 = 100_000;
/// Longest duration any key accepts (365 days).
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);
/// Largest `sandbox.output_cap_mib`.
pub const MAX_OUTPUT_CAP_MIB: u64 = 4096;
/// An `api_token` shorter than this gets a warning.
pub const MIN_API_TOKEN_LEN: usize = 16;
/// Longest plugin name, in bytes (a file name is at most 255 bytes with `.wasm`).
pub const MAX_PLUGIN_NAME_LEN: usize = 200;
/// The spec's MongoDB users: each role connects as the user of that name.
pub const AUTH_ROLES: [&str; 4] = ["disbatchd", "disbatch_web", "task_runner", "plugin"];

/// How long a database operation waits for a reachable server before it fails (and the
/// DEN logs an outage and retries), instead of the driver's 30 s.
pub const SERVER_SELECTION_TIMEOUT: Duration = Duration::from_secs(3);

/// Environment variables that override config keys: (variable, key). An empty variable
/// counts as unset.
pub const ENV_OVERRIDES: [(&str, &str); 6] = [
    ("DISBATCH_MONGOHOST", "mongohost"),
    ("DISBATCH_DATABASE", "database"),
    ("DISBATCH_NODE", "node"),
    ("DISBATCH_PLUGIN_DIR", "plugin_dir"),
    ("DISBATCH_API_TOKEN", "api_token"),
    ("DISBATCH_BIND", "bind"),
];

/// Keys of the spec kept for compatibility that have no effect here.
const IGNORED_KEYS: [&str; 4] = ["web_extensions", "task_runner", "views_dir", "log4perl"];

/// Every key this module reads.
const KNOWN_KEYS: [&str; 21] = [
    "mongohost",
    "database",
    "attributes",
    "auth",
    "plugins",
    "monitoring",
    "balance",
    "gfs",
    "web_root",
    "activequeues",
    "ignorequeues",
    "plugin_dir",
    "node",
    "heartbeat_stale",
    "orphan_claimed_after",
    "shutdown_grace",
    "sandbox",
    "cache_dir",
    "api_token",
    "bind",
    "max_instances",
];

/// Keys of the `sandbox` object.
const SANDBOX_KEYS: [&str; 9] = [
    "timeout",
    "memory_mib",
    "output_cap_mib",
    "dirs",
    "env",
    "network",
    "network_allow",
    "write_quota_mib",
    "file_quota",
];
/// Keys of the `balance` object.
const BALANCE_KEYS: [&str; 4] = ["enabled", "log", "verbose", "pretend"];
/// TLS keys of the `attributes` object.
const TLS_KEYS: [&str; 4] = ["ssl", "tls", "tls_ca_file", "tls_allow_invalid_certificates"];

/// Errors loading a config file. Each names the file and, where there is one, the key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid JSON.
    #[error("config file {file}: invalid JSON at line {line}, column {column}: {message}")]
    Syntax {
        /// The file.
        file: String,
        /// Line of the error (1-based).
        line: usize,
        /// Column of the error (1-based).
        column: usize,
        /// What the parser said.
        message: String,
    },
    /// A required key is missing.
    #[error("config file {file}: missing required key {key:?}")]
    Missing {
        /// The file.
        file: String,
        /// The key.
        key: String,
    },
    /// A key has the wrong type or an invalid value.
    #[error("config file {file}: {key:?} {reason}")]
    Invalid {
        /// The file.
        file: String,
        /// The key: dotted for nested keys (`sandbox.memory_mib`), indexed for array
        /// entries (`plugins[1]`), `(top level)` when the file is not an object.
        key: String,
        /// What is wrong, and where the value came from when an environment variable set it.
        reason: String,
    },
}

impl ConfigError {
    /// The key at fault, when there is one.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Missing { key, .. } | ConfigError::Invalid { key, .. } => Some(key),
            _ => None,
        }
    }
}

/// The store a config is for: MongoDB needs `mongohost` and `database`; the embedded
/// store (one SQLite file) needs neither.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StoreKind {
    /// MongoDB: `mongohost` and `database` are required.
    #[default]
    Mongo,
    /// The embedded store: `mongohost` and `database` are optional (empty when absent) and
    /// still checked when present.
    Embedded,
}

/// Where stdout/stderr of finished tasks go (the spec's `gfs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Gfs {
    /// `false`: always in the task document (truncated with a marker to fit).
    Never,
    /// `true`: always GridFS files.
    Always,
    /// `"auto"`: GridFS only when the document would get too large.
    #[default]
    Auto,
}

/// TLS settings of the MongoDB connection (`attributes`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tls {
    /// Use TLS.
    pub enabled: bool,
    /// Certificate authority file for an internally signed server certificate.
    pub ca_file: Option<PathBuf>,
    /// Accept a self-signed server certificate.
    pub allow_invalid_certificates: bool,
}

/// MongoDB credentials (`auth`): per spec, role name → password, the role name being the
/// user name (one of [`AUTH_ROLES`]). Its `Debug` output hides the passwords.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Auth {
    /// Role (user name) → password.
    pub passwords: BTreeMap<String, String>,
    /// Database holding the users (`auth_source`; the driver's default when unset).
    pub auth_source: Option<String>,
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let roles: BTreeMap<&str, &str> = self.passwords.keys().map(|k| (k.as_str(), "<hidden>")).collect();
        f.debug_struct("Auth")
            .field("passwords", &roles)
            .field("auth_source", &self.auth_source)
            .finish()
    }
}

/// QueueBalance settings (`balance`), kept for compatibility.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Balance {
    /// `enabled`.
    pub enabled: bool,
    /// `log`.
    pub log: bool,
    /// `verbose`.
    pub verbose: bool,
    /// `pretend`.
    pub pretend: bool,
}

/// The validated configuration. Its `Debug` output hides passwords and the API token.
#[derive(Clone, PartialEq)]
pub struct Config {
    /// MongoDB URI (`mongohost`; empty in a config for the embedded store that has none).
    pub mongohost: String,
    /// Database name (`database`; empty in a config for the embedded store that has none).
    pub database: String,
    /// TLS settings (`attributes`).
    pub tls: Tls,
    /// Credentials (`auth`).
    pub auth: Auth,
    /// Allowed plugin names (`plugins`).
    pub plugins: Vec<String>,
    /// Whether `GET /monitoring` checks nodes (`monitoring`).
    pub monitoring: bool,
    /// QueueBalance settings (`balance`).
    pub balance: Balance,
    /// Where large outputs go (`gfs`).
    pub gfs: Gfs,
    /// Directory of web documents to serve instead of the built-in UI (`web_root`).
    pub web_root: Option<PathBuf>,
    /// Only these queues run on this node, when not empty (`activequeues`).
    pub active_queues: Vec<ObjectId>,
    /// These queues never run on this node (`ignorequeues`; unused when `activequeues` is set).
    pub ignore_queues: Vec<ObjectId>,
    /// Directory of `<plugin>.wasm` files (`plugin_dir`).
    pub plugin_dir: PathBuf,
    /// This DEN's node name (`node`, default the hostname).
    pub node: String,
    /// Heartbeat age after which a node is dead (`heartbeat_stale`).
    pub heartbeat_stale: Duration,
    /// Age after which a claimed task is orphaned (`orphan_claimed_after`).
    pub orphan_claimed_after: Duration,
    /// Graceful-shutdown wait for running tasks (`shutdown_grace`).
    pub shutdown_grace: Duration,
    /// Sandbox defaults of every task (`sandbox`).
    pub sandbox: Sandbox,
    /// Compiled component cache directory (`cache_dir`).
    pub cache_dir: Option<PathBuf>,
    /// Bearer token required for writes to the API (`api_token`).
    pub api_token: Option<String>,
    /// Address of the web server (`bind`).
    pub bind: String,
    /// Plugin instances one process may run at once (`max_instances`).
    pub max_instances: u32,
    /// Problems that are not errors (unknown keys, keys without effect, weak settings).
    pub warnings: Vec<String>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("mongohost", &redact_uri(&self.mongohost))
            .field("database", &self.database)
            .field("tls", &self.tls)
            .field("auth", &self.auth)
            .field("plugins", &self.plugins)
            .field("monitoring", &self.monitoring)
            .field("balance", &self.balance)
            .field("gfs", &self.gfs)
            .field("web_root", &self.web_root)
            .field("active_queues", &self.active_queues)
            .field("ignore_queues", &self.ignore_queues)
            .field("plugin_dir", &self.plugin_dir)
            .field("node", &self.node)
            .field("heartbeat_stale", &self.heartbeat_stale)
            .field("orphan_claimed_after", &self.orphan_claimed_after)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("sandbox", &self.sandbox)
            .field("cache_dir", &self.cache_dir)
            .field("api_token", &self.api_token.as_ref().map(|_| "<hidden>"))
            .field("bind", &self.bind)
            .field("max_instances", &self.max_instances)
            .field("warnings", &self.warnings)
            .finish()
    }
}

impl Config {
    /// Loads `path`, with the process environment's overrides.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::load_with_env(path, &|k| std::env::var(k).ok())
    }

    /// Loads `path`; `env` looks up the override variables of [`ENV_OVERRIDES`].
    pub fn load_with_env(path: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        Config::load_for(path, StoreKind::Mongo, env)
    }

    /// Loads `path` as a config for the `store` kind; `env` looks up the override variables
    /// of [`ENV_OVERRIDES`].
    pub fn load_for(
        path: &Path,
        store: StoreKind,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_owned(),
            source,
        })?;
        Config::parse_for(&text, &path.display().to_string(), store, env)
    }

    /// The config of a program run without a config file, on the embedded store: every key
    /// at its default, then the overrides of [`ENV_OVERRIDES`] looked up with `env`. Errors
    /// name the file as [`NO_CONFIG_FILE`].
    pub fn defaults(env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        Config::parse_for("{}", NO_CONFIG_FILE, StoreKind::Embedded, env)
    }

    /// Parses config text; `file` names it in errors; `env` looks up the override variables
    /// of [`ENV_OVERRIDES`] (pass `&|_| None` for none).
    pub fn from_json_str(text: &str, file: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        Config::parse_for(text, file, StoreKind::Mongo, env)
    }

    /// Parses config text for the `store` kind, as [`Config::from_json_str`] does for MongoDB.
    pub fn parse_for(
        text: &str,
        file: &str,
        store: StoreKind,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let value: Value = serde_json::from_str(text).map_err(|e| ConfigError::Syntax {
            file: file.to_owned(),
            line: e.line(),
            column: e.column(),
            message: e.to_string().split(" at line").next().unwrap_or_default().to_owned(),
        })?;
        let Value::Object(mut map) = value else {
            return Err(ConfigError::Invalid {
                file: file.to_owned(),
                key: "(top level)".into(),
                reason: format!("must be a JSON object, got {}", describe(&value)),
            });
        };
        let mut from_env = Vec::new();
        for (var, key) in ENV_OVERRIDES {
            if let Some(v) = env(var).filter(|v| !v.is_empty()) {
                map.insert(key.to_owned(), Value::String(v));
                from_env.push((key, var));
            }
        }
        Parser {
            file,
            map: &map,
            store,
            from_env,
            warnings: Vec::new(),
        }
        .config()
    }

    /// Whether queue `id` runs on this node per `activequeues` / `ignorequeues`
    /// (`activequeues` wins when not empty).
    pub fn queue_is_active(&self, id: &ObjectId) -> bool {
        if !self.active_queues.is_empty() {
            self.active_queues.contains(id)
        } else {
            !self.ignore_queues.contains(id)
        }
    }

    /// MongoDB connection settings for `role` (`disbatchd`, `disbatch_web`, …): TLS from
    /// `attributes`, the role as user name with its password when `auth` has one, and a
    /// [`SERVER_SELECTION_TIMEOUT`] so outages surface quickly.
    pub fn mongo_options(&self, role: &str) -> crate::store::mongo::MongoOptions {
        let password = self.auth.passwords.get(role).cloned();
        crate::store::mongo::MongoOptions {
            tls: self.tls.enabled,
            tls_ca_file: self.tls.ca_file.clone(),
            tls_allow_invalid_certificates: self.tls.allow_invalid_certificates,
            username: password.as_ref().map(|_| role.to_owned()),
            password,
            auth_source: self.auth.auth_source.clone(),
            server_selection_timeout: Some(SERVER_SELECTION_TIMEOUT),
        }
    }

    /// The file of plugin `name`: `<plugin_dir>/<name>.wasm`, for plain names in `plugins` only.
    pub fn plugin_path(&self, name: &str) -> Result<PathBuf, String> {
        plugin_file(&self.plugin_dir, &self.plugins, name)
    }
}

/// Checks that `name` is a plain file stem: not empty, at most [`MAX_PLUGIN_NAME_LEN`]
/// bytes, no path separators, no `..`, no leading `.`, no control characters, no `@`
/// (which starts a pinned version: `name@sha256:…`).
pub fn check_plugin_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("plugin name is empty".into());
    }
    if name.len() > MAX_PLUGIN_NAME_LEN {
        return Err(format!("plugin name is longer than {MAX_PLUGIN_NAME_LEN} bytes"));
    }
    if name.contains(['/', '\\', '@'])
        || name.contains("..")
        || name.starts_with('.')
        || name.contains(char::is_control)
    {
        return Err(format!(
            "plugin name {name:?} must be a plain name without path separators, \"..\", \"@\" or control characters"
        ));
    }
    Ok(())
}

/// `<dir>/<name>.wasm` when `name` is a plain name and in `allowed`.
pub fn plugin_file(dir: &Path, allowed: &[String], name: &str) -> Result<PathBuf, String> {
    check_plugin_name(name)?;
    if !allowed.iter().any(|a| a == name) {
        return Err(format!("plugin {name:?} is not in the plugins allowlist"));
    }
    Ok(dir.join(format!("{name}.wasm")))
}

/// Checks a MongoDB URI (`mongohost`): the scheme, then the driver's parser. Messages show
/// the URI with its password redacted.
pub fn check_mongohost(uri: &str) -> Result<(), String> {
    if !(uri.starts_with("mongodb://") || uri.starts_with("mongodb+srv://")) {
        return Err(format!(
            "must be a mongodb:// or mongodb+srv:// URI, got {:?}",
            redact_uri(uri)
        ));
    }
    if let Err(e) = mongodb::options::ConnectionString::parse(uri) {
        let reason = match *e.kind {
            mongodb::error::ErrorKind::InvalidArgument { ref message, .. } => message.clone(),
            ref other => other.to_string(),
        };
        return Err(format!("is not a valid MongoDB URI ({reason}): {:?}", redact_uri(uri)));
    }
    Ok(())
}

/// Checks a MongoDB database name (`database`): under 64 bytes, none of `/\. "$` or NUL.
pub fn check_database(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() >= 64 || name.contains(['/', '\\', '.', ' ', '"', '$', '\0']) {
        return Err(format!(
            "{name:?} is not a valid MongoDB database name (not empty, under 64 bytes, none of /\\. \"$)"
        ));
    }
    Ok(())
}

/// `uri` with any `user:password@` replaced by `***@`, for messages and logs.
pub fn redact_uri(uri: &str) -> String {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return uri.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***{}", &rest[at..]),
        None => uri.to_owned(),
    }
}

/// A value for a message: scalars as written (long strings shortened), containers by kind.
fn describe(v: &Value) -> String {
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
fn hint(key: &str, candidates: &[&str]) -> String {
    candidates
        .iter()
        .map(|k| (edit_distance(key, k), *k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 4) && *d < key.chars().count().max(1))
        .min()
        .map(|(_, k)| format!(" (did you mean {k:?}?)"))
        .unwrap_or_default()
}

/// Levenshtein distance.
fn edit_distance(a: &str, b: &str) -> usize {
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
struct Parser<'a> {
    file: &'a str,
    map: &'a Map<String, Value>,
    /// Which keys are required.
    store: StoreKind,
    /// (key, variable) of the keys an environment variable set.
    from_env: Vec<(&'static str, &'static str)>,
    warnings: Vec<String>,
}

impl<'a> Parser<'a> {
    fn invalid(&self, key: &str, reason: impl Into<String>) -> ConfigError {
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

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn required_str(&self, key: &str) -> Result<String, ConfigError> {
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
    fn opt_str(&self, key: &str) -> Result<Option<String>, ConfigError> {
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
    fn opt_bool(&self, key: &str, v: Option<&Value>) -> Result<Option<bool>, ConfigError> {
        match v {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(Value::Number(n)) if matches!(n.as_u64(), Some(0 | 1)) => Ok(Some(n.as_u64() == Some(1))),
            Some(v) => Err(self.invalid(key, format!("must be true or false, got {}", describe(v)))),
        }
    }

    fn object(&self, key: &str) -> Result<Option<&'a Map<String, Value>>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(v) => Err(self.invalid(key, format!("must be an object, got {}", describe(v)))),
        }
    }

    /// A top-level duration: a positive number of seconds up to [`MAX_DURATION`].
    fn seconds(&self, key: &str, default: Duration) -> Result<Duration, ConfigError> {
        let Some(v) = self.get(key) else {
            return Ok(default);
        };
        let secs = v.as_f64().filter(|s| *s > 0.0).ok_or_else(|| {
            self.invalid(
                key,
                format!("must be a positive number of seconds, got {}", describe(v)),
            )
        })?;
        self.bounded(key, Duration::try_from_secs_f64(secs).ok())
    }

    fn bounded(&self, key: &str, d: Option<Duration>) -> Result<Duration, ConfigError> {
        d.filter(|d| *d <= MAX_DURATION).ok_or_else(|| {
            self.invalid(
                key,
                format!("must be at most {} seconds (365 days)", MAX_DURATION.as_secs()),
            )
        })
    }

    /// An integer in `min..=max`.
    fn integer(&self, key: &str, v: &Value, min: u64, max: u64) -> Result<u64, ConfigError> {
        v.as_u64().filter(|n| (min..=max).contains(n)).ok_or_else(|| {
            self.invalid(
                key,
                format!("must be an integer from {min} to {max}, got {}", describe(v)),
            )
        })
    }

    /// An array, each entry checked by `entry` and named `key[i]` in errors.
    fn array<T>(
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

    fn config(mut self) -> Result<Config, ConfigError> {
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
            warnings: self.warnings,
        })
    }

    /// A string required for MongoDB and optional (empty when absent) for the embedded store.
    fn store_str(&self, key: &str) -> Result<Option<String>, ConfigError> {
        match self.store {
            StoreKind::Mongo => self.required_str(key).map(Some),
            StoreKind::Embedded => self.opt_str(key),
        }
    }

    fn mongohost(&self) -> Result<String, ConfigError> {
        let Some(uri) = self.store_str("mongohost")? else {
            return Ok(String::new());
        };
        check_mongohost(&uri).map_err(|e| self.invalid("mongohost", e))?;
        Ok(uri)
    }

    fn database(&self) -> Result<String, ConfigError> {
        let Some(database) = self.store_str("database")? else {
            return Ok(String::new());
        };
        check_database(&database).map_err(|e| self.invalid("database", e))?;
        Ok(database)
    }

    fn gfs(&self) -> Result<Gfs, ConfigError> {
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

    /// `attributes`: the spec's Perl-style `ssl` and our `tls*` keys, normalised.
    fn tls(&mut self) -> Result<Tls, ConfigError> {
        let Some(attrs) = self.object("attributes")? else {
            return Ok(Tls::default());
        };
        // Each setting with the key that gave it.
        let mut enabled: Option<(bool, &str)> = None;
        let mut ca_file: Option<(PathBuf, &str)> = None;
        let mut allow_invalid: Option<(bool, &str)> = None;
        match attrs.get("ssl") {
            None | Some(Value::Null) => {}
            Some(Value::Object(ssl)) => {
                enabled = Some((true, "attributes.ssl"));
                for (k, v) in ssl {
                    match k.as_str() {
                        "SSL_ca_file" => {
                            let key = "attributes.ssl.SSL_ca_file";
                            ca_file = Some((self.ca_file(key, v)?, key));
                        }
                        "SSL_verify_mode" => {
                            let key = "attributes.ssl.SSL_verify_mode";
                            let mode = v.as_u64().filter(|m| *m <= 1).ok_or_else(|| {
                                self.invalid(
                                    key,
                                    format!("must be 0 (no verification) or 1 (verify), got {}", describe(v)),
                                )
                            })?;
                            allow_invalid = Some((mode == 0, key));
                        }
                        _ => self.warnings.push(format!(
                            "attributes.ssl.{k} has no effect here: only SSL_ca_file and SSL_verify_mode are read"
                        )),
                    }
                }
            }
            Some(v) => {
                let b = self.opt_bool("attributes.ssl", Some(v)).map_err(|_| {
                    self.invalid(
                        "attributes.ssl",
                        format!("must be 1, 0, true, false or an object, got {}", describe(v)),
                    )
                })?;
                enabled = b.map(|b| (b, "attributes.ssl"));
            }
        }
        if let Some(b) = self.opt_bool("attributes.tls", attrs.get("tls"))? {
            if let Some((other, by)) = enabled.filter(|(e, _)| *e != b) {
                return Err(self.invalid("attributes.tls", format!("is {b} but {by} says {other}")));
            }
            enabled = Some((b, "attributes.tls"));
        }
        if let Some(v) = attrs.get("tls_ca_file").filter(|v| !v.is_null()) {
            let key = "attributes.tls_ca_file";
            let path = self.ca_file(key, v)?;
            if let Some((other, by)) = ca_file.as_ref().filter(|(p, _)| *p != path) {
                return Err(self.invalid(key, format!("conflicts with {by} ({})", other.display())));
            }
            ca_file = Some((path, key));
        }
        let key = "attributes.tls_allow_invalid_certificates";
        if let Some(b) = self.opt_bool(key, attrs.get("tls_allow_invalid_certificates"))? {
            if let Some((other, by)) = allow_invalid.filter(|(a, _)| *a != b) {
                return Err(self.invalid(key, format!("is {b} but {by} says {}", !other)));
            }
            allow_invalid = Some((b, key));
        }
        for k in attrs.keys().filter(|k| !TLS_KEYS.contains(&k.as_str())) {
            self.warnings.push(format!(
                "attributes.{k} has no effect here: only TLS settings are read ({}){}",
                TLS_KEYS.join(", "),
                hint(k, &TLS_KEYS)
            ));
        }
        let allow_invalid = allow_invalid.filter(|(a, _)| *a);
        let needs_tls = ca_file.as_ref().map(|(_, k)| *k).or(allow_invalid.map(|(_, k)| k));
        if let (Some((false, by)), Some(key)) = (enabled, needs_tls) {
            return Err(self.invalid(key, format!("is set but {by} turns TLS off")));
        }
        if let Some((_, key)) = allow_invalid {
            self.warnings
                .push(format!("{key}: the MongoDB server certificate is not verified"));
        }
        Ok(Tls {
            enabled: enabled.map_or(ca_file.is_some() || allow_invalid.is_some(), |(e, _)| e),
            ca_file: ca_file.map(|(p, _)| p),
            allow_invalid_certificates: allow_invalid.is_some(),
        })
    }

    fn ca_file(&self, key: &str, v: &Value) -> Result<PathBuf, ConfigError> {
        let path = v
            .as_str()
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .ok_or_else(|| self.invalid(key, format!("must be a file path, got {}", describe(v))))?;
        if !path.is_file() {
            return Err(self.invalid(key, format!("{} does not exist or is not a file", path.display())));
        }
        Ok(path)
    }

    fn auth(&mut self) -> Result<Auth, ConfigError> {
        let Some(auth) = self.object("auth")? else {
            return Ok(Auth::default());
        };
        let mut out = Auth::default();
        for (role, v) in auth {
            let key = format!("auth.{role}");
            let Some(text) = v.as_str().filter(|s| !s.is_empty()) else {
                // Never echo the value: it may be a password.
                return Err(self.invalid(&key, "must be a non-empty string"));
            };
            if role == "auth_source" {
                out.auth_source = Some(text.to_owned());
            } else if AUTH_ROLES.contains(&role.as_str()) {
                out.passwords.insert(role.clone(), text.to_owned());
            } else {
                let mut known = AUTH_ROLES.to_vec();
                known.push("auth_source");
                self.warnings.push(format!(
                    "{key}: unknown role ignored{} (roles are {})",
                    hint(role, &known),
                    AUTH_ROLES.join(", ")
                ));
            }
        }
        Ok(out)
    }

    fn balance(&mut self) -> Result<Balance, ConfigError> {
        let Some(b) = self.object("balance")? else {
            return Ok(Balance::default());
        };
        for k in b.keys().filter(|k| !BALANCE_KEYS.contains(&k.as_str())) {
            self.warnings
                .push(format!("unknown key \"balance.{k}\" ignored{}", hint(k, &BALANCE_KEYS)));
        }
        let flag = |k: &str| {
            self.opt_bool(&format!("balance.{k}"), b.get(k))
                .map(Option::unwrap_or_default)
        };
        Ok(Balance {
            enabled: flag("enabled")?,
            log: flag("log")?,
            verbose: flag("verbose")?,
            pretend: flag("pretend")?,
        })
    }

    /// `sandbox`: the same settings as a queue's `sandbox` sub-document, over the runner's
    /// defaults, checked with [`Sandbox::validate`].
    fn sandbox(&self) -> Result<Sandbox, ConfigError> {
        let mut s = Sandbox::default();
        let Some(obj) = self.object("sandbox")? else {
            return Ok(s);
        };
        for (k, v) in obj.iter().filter(|(_, v)| !v.is_null()) {
            let key = format!("sandbox.{k}");
            match k.as_str() {
                "timeout" => s.timeout = self.timeout(&key, v)?,
                "memory_mib" => s.memory = self.integer(&key, v, 1, MAX_MEMORY >> 20)? << 20,
                "write_quota_mib" => s.write_quota = self.integer(&key, v, 0, u64::MAX >> 20)? << 20,
                "file_quota" => s.file_quota = self.integer(&key, v, 0, u64::MAX)?,
                "output_cap_mib" => {
                    let mib = self.integer(&key, v, 0, MAX_OUTPUT_CAP_MIB)?;
                    s.output_cap = usize::try_from(mib << 20).map_err(|_| self.invalid(&key, "is too large"))?;
                }
                "dirs" => {
                    let Value::Array(items) = v else {
                        return Err(self.invalid(
                            &key,
                            format!("must be an array of directory grants, got {}", describe(v)),
                        ));
                    };
                    for (i, item) in items.iter().enumerate() {
                        let key = format!("{key}[{i}]");
                        let grant: DirGrant = item
                            .as_str()
                            .ok_or_else(|| {
                                format!("must be a string \"host[:guest][:rw|:ro]\", got {}", describe(item))
                            })
                            .and_then(str::parse)
                            .map_err(|e| self.invalid(&key, e))?;
                        if !grant.host.is_dir() {
                            return Err(self.invalid(
                                &key,
                                format!("{} does not exist or is not a directory", grant.host.display()),
                            ));
                        }
                        s.dirs.push(grant);
                    }
                }
                "env" => {
                    let Value::Object(vars) = v else {
                        return Err(self.invalid(&key, format!("must be an object of strings, got {}", describe(v))));
                    };
                    for (name, value) in vars {
                        let key = format!("{key}.{name}");
                        if name.is_empty() || name.contains(['=', '\0']) {
                            return Err(self.invalid(&key, "is not a valid environment variable name"));
                        }
                        let Some(value) = value.as_str().filter(|s| !s.contains('\0')) else {
                            return Err(self.invalid(&key, format!("must be a string, got {}", describe(value))));
                        };
                        s.env.insert(name.clone(), value.to_owned());
                    }
                }
                "network" => s.network = self.opt_bool(&key, Some(v))?.unwrap_or(false),
                "network_allow" => {
                    let Value::Array(items) = v else {
                        return Err(self.invalid(
                            &key,
                            format!("must be a list of CIDRs or addresses, got {}", describe(v)),
                        ));
                    };
                    for item in items {
                        let net = item
                            .as_str()
                            .ok_or_else(|| format!("must be a string like \"10.0.0.0/8\", got {}", describe(item)))
                            .and_then(crate::runner::parse_network_allow)
                            .map_err(|e| self.invalid(&key, e))?;
                        s.network_allow.push(net);
                    }
                }
                _ => {
                    return Err(self.invalid(
                        &key,
                        format!(
                            "is not a sandbox setting{} (settings are {})",
                            hint(k, &SANDBOX_KEYS),
                            SANDBOX_KEYS.join(", ")
                        ),
                    ))
                }
            }
        }
        s.validate().map_err(|e| self.invalid("sandbox", e))?;
        Ok(s)
    }

    /// `sandbox.timeout`: positive seconds or a humantime string such as `"30s"`.
    fn timeout(&self, key: &str, v: &Value) -> Result<Duration, ConfigError> {
        let bad = || {
            self.invalid(
                key,
                format!(
                    "must be a positive number of seconds or a duration like \"30s\", got {}",
                    describe(v)
                ),
            )
        };
        let d = match v {
            Value::Number(n) => {
                let secs = n.as_f64().filter(|s| *s > 0.0).ok_or_else(bad)?;
                Duration::try_from_secs_f64(secs).ok()
            }
            Value::String(t) => Some(humantime::parse_duration(t).map_err(|_| bad())?),
            _ => return Err(bad()),
        };
        if d.is_some_and(|d| d.is_zero()) {
            return Err(bad());
        }
        self.bounded(key, d)
    }
}

/// Checks a `host:port` address (the host may be a name or a bracketed IPv6 address).
fn check_bind(bind: &str) -> Result<(), String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#""mongohost":"mongodb://h","database":"d""#;

    fn parse(extra: &str) -> Result<Config, ConfigError> {
        let sep = if extra.is_empty() { "" } else { "," };
        Config::from_json_str(&format!("{{{BASE}{sep}{extra}}}"), "test.json", &|_| None)
    }

    fn err(extra: &str) -> String {
        parse(extra).unwrap_err().to_string()
    }

    #[test]
    fn edit_distance_and_hints() {
        assert_eq!(edit_distance("mongoshost", "mongohost"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(
            hint("hearbeat_stale", &KNOWN_KEYS),
            " (did you mean \"heartbeat_stale\"?)"
        );
        assert_eq!(hint("zzz", &KNOWN_KEYS), "");
        assert_eq!(hint("x", &["y"]), "", "a one-letter key is not a typo of another");
    }

    #[test]
    fn uris_are_redacted() {
        assert_eq!(redact_uri("mongodb://u:p@h:1/db?x=@"), "mongodb://***@h:1/db?x=@");
        assert_eq!(redact_uri("mongodb://h/db"), "mongodb://h/db");
        assert_eq!(redact_uri("no scheme"), "no scheme");
    }

    #[test]
    fn secrets_stay_out_of_debug_and_errors() {
        let c = parse(r#""auth":{"disbatchd":"pw-one"},"api_token":"tok-two-long-enough-123""#).unwrap();
        let c = Config {
            mongohost: "mongodb://user:pw-three@h".into(),
            ..c
        };
        let dbg = format!("{c:?}");
        for secret in ["pw-one", "tok-two", "pw-three"] {
            assert!(!dbg.contains(secret), "{dbg}");
        }
        assert!(!err(r#""auth":{"plugin":12345}"#).contains("12345"));
        let e = Config::from_json_str(r#"{"mongohost":"http://u:pw-four@h","database":"d"}"#, "t", &|_| None)
            .unwrap_err()
            .to_string();
        assert!(!e.contains("pw-four") && e.contains("http://***@h"), "{e}");
    }

    #[test]
    fn huge_and_tiny_durations_are_refused_not_panics() {
        assert!(err(r#""heartbeat_stale":1e300"#).contains("\"heartbeat_stale\" must be at most 31536000 seconds"));
        assert!(err(r#""sandbox":{"timeout":1e300}"#).contains("\"sandbox.timeout\" must be at most"));
        assert!(err(r#""sandbox":{"timeout":"0s"}"#).contains("\"sandbox.timeout\" must be a positive"));
        assert!(err(r#""shutdown_grace":0"#).contains("\"shutdown_grace\" must be a positive"));
        let c = parse(r#""heartbeat_stale":0.5,"sandbox":{"timeout":"90m"}"#).unwrap();
        assert_eq!(c.heartbeat_stale, Duration::from_millis(500));
        assert_eq!(c.sandbox.timeout, Duration::from_secs(5400));
    }

    #[test]
    fn env_overrides_win_and_are_named_in_errors() {
        let env = |k: &str| match k {
            "DISBATCH_DATABASE" => Some("fromenv".to_owned()),
            "DISBATCH_NODE" => Some("n1".to_owned()),
            "DISBATCH_API_TOKEN" => Some(String::new()),
            "DISBATCH_BIND" => Some("nope".to_owned()),
            _ => None,
        };
        let text = format!(r#"{{{BASE},"api_token":"from-the-file-0123456"}}"#);
        let e = Config::from_json_str(&text, "t", &env).unwrap_err();
        assert_eq!(e.key(), Some("bind"));
        assert!(e.to_string().ends_with("(set by DISBATCH_BIND)"), "{e}");
        let env2 = |k: &str| if k == "DISBATCH_BIND" { None } else { env(k) };
        let c = Config::from_json_str(&text, "t", &env2).unwrap();
        assert_eq!((c.database.as_str(), c.node.as_str()), ("fromenv", "n1"));
        assert_eq!(
            c.api_token.as_deref(),
            Some("from-the-file-0123456"),
            "empty variable = unset"
        );
    }

    #[test]
    fn tls_spellings_normalise() {
        let tls = |attrs: &str| parse(&format!(r#""attributes":{attrs}"#)).map(|c| c.tls);
        let on = Tls {
            enabled: true,
            ..Tls::default()
        };
        assert_eq!(tls(r#"{"ssl":1}"#).unwrap(), on);
        assert_eq!(tls(r#"{"tls":true}"#).unwrap(), on);
        assert_eq!(tls(r#"{"ssl":0}"#).unwrap(), Tls::default());
        let self_signed = Tls {
            allow_invalid_certificates: true,
            ..on.clone()
        };
        assert_eq!(tls(r#"{"ssl":{"SSL_verify_mode":0}}"#).unwrap(), self_signed);
        assert_eq!(tls(r#"{"tls_allow_invalid_certificates":true}"#).unwrap(), self_signed);
        assert_eq!(tls(r#"{"ssl":{"SSL_verify_mode":1}}"#).unwrap(), on);
        let e = tls(r#"{"ssl":1,"tls":false}"#).unwrap_err();
        assert_eq!(e.key(), Some("attributes.tls"));
        let e = tls(r#"{"tls":false,"tls_allow_invalid_certificates":true}"#).unwrap_err();
        assert_eq!(e.key(), Some("attributes.tls_allow_invalid_certificates"), "{e}");
        let e = tls(r#"{"ssl":{"SSL_verify_mode":"0"}}"#).unwrap_err();
        assert_eq!(e.key(), Some("attributes.ssl.SSL_verify_mode"));
        let e = tls(r#"{"ssl":"yes"}"#).unwrap_err();
        assert_eq!(e.key(), Some("attributes.ssl"));
        let c = parse(r#""attributes":{"ssl":{"SSL_verify_mode":0,"SSL_cert_file":"x"},"w":1}"#).unwrap();
        let warnings = c.warnings.join("\n");
        assert!(
            warnings.contains("attributes.ssl.SSL_cert_file has no effect"),
            "{warnings}"
        );
        assert!(warnings.contains("attributes.w has no effect"), "{warnings}");
        assert!(warnings.contains("certificate is not verified"), "{warnings}");
    }

    #[test]
    fn auth_keeps_known_roles() {
        let c = parse(r#""auth":{"disbatchd":"a","plugin":"b","auth_source":"admin","disbatch_wbe":"c"}"#).unwrap();
        assert_eq!(c.auth.passwords.len(), 2);
        assert_eq!(c.auth.auth_source.as_deref(), Some("admin"));
        assert!(c.warnings[0].contains("auth.disbatch_wbe: unknown role ignored (did you mean \"disbatch_web\"?)"));
        let o = c.mongo_options("disbatchd");
        assert_eq!(
            (o.username.as_deref(), o.password.as_deref()),
            (Some("disbatchd"), Some("a"))
        );
        assert_eq!(c.mongo_options("disbatch_web").username, None);
    }

    #[test]
    fn small_checks() {
        assert!(check_bind("127.0.0.1:8080").is_ok() && check_bind("[::1]:80").is_ok());
        assert!(check_bind("localhost").is_err() && check_bind(":80").is_err() && check_bind("h:99999").is_err());
        assert!(check_plugin_name("Disbatch::Plugin::Demo").is_ok());
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "a/b",
            "a\\b",
            "a\0b",
            "a\nb",
            &"x".repeat(201),
        ] {
            assert!(check_plugin_name(bad).is_err(), "{bad:?}");
        }
        assert!(err(r#""gfs":2"#).contains("\"gfs\" must be true, false or \"auto\", got 2"));
        assert_eq!(parse(r#""gfs":1"#).unwrap().gfs, Gfs::Always);
        assert_eq!(parse(r#""gfs":false"#).unwrap().gfs, Gfs::Never);
        assert!(err(r#""mongohost":"mongodb://""#).contains("is not a valid MongoDB URI"));
        assert!(err(r#""database":"a.b""#).contains("\"database\" \"a.b\" is not a valid MongoDB database name"));
        assert!(err(r#""node":"  ""#).contains("\"node\" must not be blank"));
        assert!(err(r#""sandbox":{"memroy_mib":1}"#)
            .contains("\"sandbox.memroy_mib\" is not a sandbox setting (did you mean \"memory_mib\"?)"));
        assert!(err(r#""api_token":" padded-token-0123456789 ""#).contains("\"api_token\" must not start or end"));
        assert!(parse(r#""api_token":"short""#).unwrap().warnings[0].contains("api_token is shorter"));
    }

    #[test]
    fn the_embedded_store_needs_no_mongodb_keys() {
        let embedded = |text: &str| Config::parse_for(text, "e.json", StoreKind::Embedded, &|_| None);
        let c = embedded(r#"{"plugins":["demo"]}"#).unwrap();
        assert_eq!((c.mongohost.as_str(), c.database.as_str()), ("", ""));
        assert_eq!(c.plugins, ["demo"]);
        let c = embedded(r#"{"mongohost":"mongodb://h","database":"d"}"#).unwrap();
        assert_eq!((c.mongohost.as_str(), c.database.as_str()), ("mongodb://h", "d"));
        let e = embedded(r#"{"mongohost":"http://h"}"#).unwrap_err().to_string();
        assert!(
            e.contains("e.json") && e.contains("\"mongohost\" must be a mongodb://"),
            "{e}"
        );
        let e = embedded(r#"{"database":""}"#).unwrap_err().to_string();
        assert!(e.contains("\"database\" must be a non-empty string"), "{e}");
        let e = Config::from_json_str(r#"{"plugins":[]}"#, "m.json", &|_| None).unwrap_err();
        assert_eq!(e.key(), Some("mongohost"));
    }

    #[test]
    fn defaults_take_the_environment() {
        let c = Config::defaults(&|_| None).unwrap();
        assert_eq!(c.plugin_dir, Path::new(DEFAULT_PLUGIN_DIR));
        assert_eq!((c.bind.as_str(), c.plugins.len()), (DEFAULT_BIND, 0));
        let env = |k: &str| (k == "DISBATCH_NODE").then(|| "worker-2".to_string());
        assert_eq!(Config::defaults(&env).unwrap().node, "worker-2");
        let bad = |k: &str| (k == "DISBATCH_BIND").then(|| "nowhere".to_string());
        let e = Config::defaults(&bad).unwrap_err().to_string();
        assert!(
            e.contains(NO_CONFIG_FILE) && e.contains("(set by DISBATCH_BIND)"),
            "{e}"
        );
        assert!(check_database("").is_err() && check_database("ok_name").is_ok());
        assert!(check_mongohost("mongodb://h:1").is_ok() && check_mongohost("h:1").is_err());
    }
}
