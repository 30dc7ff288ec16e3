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
use serde_json::Value;

use crate::sandbox_spec::Sandbox;

/// Environment variable naming the config file when `--config` is not given.
pub const CONFIG_ENV: &str = "DISBATCH_CONFIG";
/// How errors name the config of a program run without a config file.
pub const NO_CONFIG_FILE: &str = "(no config file)";
/// Default `plugin_dir`.
pub const DEFAULT_PLUGIN_DIR: &str = "/var/lib/disbatch/plugins";
/// The longest `completion_window`: a grouped write never waits longer than this for
/// others to join it.
pub const MAX_COMPLETION_WINDOW: Duration = Duration::from_millis(100);
/// The longest `read_ahead`: tasks read ahead for the claims to come are used at most
/// this long after their read.
pub const MAX_READ_AHEAD: Duration = Duration::from_secs(1);

/// Default `heartbeat_stale`: a node silent this long is dead.
pub const DEFAULT_HEARTBEAT_STALE: Duration = Duration::from_secs(30);
/// Default `orphan_claimed_after`: the spec's 5 minutes for tasks stuck claimed.
pub const DEFAULT_ORPHAN_CLAIMED_AFTER: Duration = Duration::from_secs(300);
/// Default `stats_retention`: the per-minute counters are kept 7 days.
pub const DEFAULT_STATS_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Default `shutdown_grace`.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// Default `bind` of the web server.
pub const DEFAULT_BIND: &str = "127.0.0.1:8080";
/// Default `max_instances`: plugin instances one process may run at once.
pub const DEFAULT_MAX_INSTANCES: u32 = 1000;
/// Largest `max_instances`.
pub const MAX_INSTANCES: u32 = 100_000;
pub use crate::sandbox_spec::MAX_DURATION;
/// Largest `sandbox.output_cap_mib`.
pub const MAX_OUTPUT_CAP_MIB: u64 = 4096;
/// An `api_token` shorter than this gets a warning.
pub const MIN_API_TOKEN_LEN: usize = 16;
/// Longest plugin name, in bytes (a file name is at most 255 bytes with `.wasm`).
pub const MAX_PLUGIN_NAME_LEN: usize = 200;
/// The spec's MongoDB users: each role connects as the user of that name.
pub const AUTH_ROLES: [&str; 5] = ["disbatchd", "disbatch_web", "task_runner", "queuebalance", "plugin"];

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
const KNOWN_KEYS: [&str; 31] = [
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
    "stats_retention",
    "retention",
    "completion_window",
    "read_ahead",
    "http_max_connections",
    "http_header_timeout",
    "http_idle_timeout",
    "http_body_timeout",
    "allowed_hosts",
    "cors_origins",
];

/// Keys of the `sandbox` object.
const SANDBOX_KEYS: [&str; 15] = [
    "timeout",
    "memory_mib",
    "output_cap_mib",
    "dirs",
    "env",
    "network",
    "network_allow",
    "write_quota_mib",
    "file_quota",
    "http",
    "http_max_requests",
    "http_max_body_mib",
    "submit",
    "submit_max",
    "submit_depth",
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
    /// Database holding the users (`auth_source`; when unset, the URI's `authSource`, else
    /// the config's `database`, as in Disbatch 4).
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
    /// How long the per-minute counters of `GET /stats` are kept (`stats_retention`, at
    /// least a minute).
    pub stats_retention: Duration,
    /// How long ended tasks are kept by default (`retention`; none: every task is kept),
    /// under each queue's own `retention`.
    pub retention: crate::model::Retention,
    /// How long a grouped database write waits for more to join it (`completion_window`,
    /// MongoDB; zero by default, at most [`MAX_COMPLETION_WINDOW`]).
    pub completion_window: Duration,
    /// How long tasks read ahead for a DEN's next claims are used (`read_ahead`, MongoDB;
    /// `None`, unset: the store's default, 0.1 s; zero: none are read ahead).
    pub read_ahead: Option<Duration>,
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
    /// The DCI's HTTP settings (`http_*`, `allowed_hosts`, `cors_origins`).
    pub http: HttpSettings,
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
            .field("stats_retention", &self.stats_retention)
            .field("retention", &self.retention)
            .field("completion_window", &self.completion_window)
            .field("read_ahead", &self.read_ahead)
            .field("sandbox", &self.sandbox)
            .field("cache_dir", &self.cache_dir)
            .field("api_token", &self.api_token.as_ref().map(|_| "<hidden>"))
            .field("bind", &self.bind)
            .field("max_instances", &self.max_instances)
            .field("http", &self.http)
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
        let value = relaxed::parse_relaxed(text, file)?;
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

    /// The file of plugin `name`: `<plugin_dir>/<name>.wasm`, for plain names in `plugins` only.
    pub fn plugin_path(&self, name: &str) -> Result<PathBuf, String> {
        plugin_file(&self.plugin_dir, &self.plugins, name)
    }
}

mod checks;
mod http;
mod parser;
mod relaxed;
mod sandbox;
mod sections;

pub use crate::redact::redact_uri;
pub use checks::{check_database, check_mongohost, check_plugin_name, plugin_file};
pub use http::{
    HttpSettings, DEFAULT_HTTP_BODY_TIMEOUT, DEFAULT_HTTP_HEADER_TIMEOUT, DEFAULT_HTTP_IDLE_TIMEOUT,
    DEFAULT_HTTP_MAX_CONNECTIONS, MAX_HTTP_CONNECTIONS,
};
use parser::{describe, hint, Parser};
pub use relaxed::parse_relaxed;
#[cfg(test)]
mod tests;
