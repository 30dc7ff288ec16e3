//! Configuration: the JSON config file of the spec (plus our keys) → a validated [`Config`].
//!
//! The file is read as raw JSON, then every key is checked on its own so each error names
//! its key: `config file den.json: "heartbeat_stale" must be a positive number of seconds,
//! got "abc"`. Unknown keys are not errors; they are returned in [`Config::warnings`] for
//! the binary to log. Environment variables override some keys (see [`ENV_OVERRIDES`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bson::oid::ObjectId;
use serde_json::{Map, Value};

use crate::runner::{Sandbox, DEFAULT_MEMORY, DEFAULT_OUTPUT_CAP, DEFAULT_TIMEOUT};

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

/// How long a database operation waits for a reachable server before it fails (and the
/// DEN logs an outage and retries), instead of the driver's 30 s.
pub const SERVER_SELECTION_TIMEOUT: Duration = Duration::from_secs(3);

/// Environment variables that override config keys: (variable, key).
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
const KNOWN_KEYS: [&str; 22] = [
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
    "embedded",
];

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
        /// Line of the error.
        line: usize,
        /// Column of the error.
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
        /// The key (dotted for nested keys).
        key: String,
        /// What is wrong.
        reason: String,
    },
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
/// user name (`disbatchd`, `disbatch_web`, `task_runner`, `plugin`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Auth {
    /// Role (user name) → password.
    pub passwords: BTreeMap<String, String>,
    /// Database holding the users (`auth_source`; the driver's default when unset).
    pub auth_source: Option<String>,
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

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// MongoDB URI (`mongohost`).
    pub mongohost: String,
    /// Database name (`database`).
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
    /// Sandbox defaults (`sandbox`).
    pub sandbox: Sandbox,
    /// Compiled component cache directory (`cache_dir`).
    pub cache_dir: Option<PathBuf>,
    /// Bearer token required for writes to the API (`api_token`).
    pub api_token: Option<String>,
    /// Address of the web server (`bind`).
    pub bind: String,
    /// Plugin instances one process may run at once (`max_instances`).
    pub max_instances: u32,
    /// Problems that are not errors (unknown keys, keys without effect).
    pub warnings: Vec<String>,
}

impl Config {
    /// Loads `path`, with the process environment's overrides.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_owned(),
            source,
        })?;
        Config::from_json_str(&text, &path.display().to_string(), &|k| std::env::var(k).ok())
    }

    /// Parses config text; `file` names it in errors; `env` looks up override variables.
    pub fn from_json_str(text: &str, file: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
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
                reason: "must be a JSON object".into(),
            });
        };
        for (var, key) in ENV_OVERRIDES {
            if let Some(v) = env(var) {
                map.insert(key.to_owned(), Value::String(v));
            }
        }
        Parser { file, map: &map }.config()
    }

    /// Whether queue `id` runs on this node per `activequeues` / `ignorequeues`.
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

    /// The file of plugin `name`: `<plugin_dir>/<name>.wasm`, for allowed, plain names only.
    pub fn plugin_path(&self, name: &str) -> Result<PathBuf, String> {
        plugin_file(&self.plugin_dir, &self.plugins, name)
    }
}

/// Checks that `name` is a plain file stem (no path separators, no `..`, not empty).
pub fn check_plugin_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("plugin name is empty".into());
    }
    if name.contains(['/', '\\', '\0']) || name.contains("..") || name.starts_with('.') {
        return Err(format!(
            "plugin name {name:?} must be a plain name without path separators or \"..\""
        ));
    }
    Ok(())
}

/// `<dir>/<name>.wasm` when `name` is in `allowed` and a plain name.
pub fn plugin_file(dir: &Path, allowed: &[String], name: &str) -> Result<PathBuf, String> {
    check_plugin_name(name)?;
    if !allowed.iter().any(|a| a == name) {
        return Err(format!("plugin {name:?} is not in the plugins allowlist"));
    }
    Ok(dir.join(format!("{name}.wasm")))
}

struct Parser<'a> {
    file: &'a str,
    map: &'a Map<String, Value>,
}

fn type_name(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("{s:?}"),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

impl Parser<'_> {
    fn invalid(&self, key: &str, reason: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            file: self.file.to_owned(),
            key: key.to_owned(),
            reason: reason.into(),
        }
    }

    fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn required_str(&self, key: &str) -> Result<String, ConfigError> {
        match self.get(key) {
            None => Err(ConfigError::Missing {
                file: self.file.to_owned(),
                key: key.to_owned(),
            }),
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            Some(v) => Err(self.invalid(key, format!("must be a non-empty string, got {}", type_name(v)))),
        }
    }

    fn opt_str(&self, key: &str) -> Result<Option<String>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(self.invalid(key, format!("must be a string, got {}", type_name(v)))),
        }
    }

    fn bool_at(&self, key: &str, v: Option<&Value>) -> Result<bool, ConfigError> {
        match v {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(Value::Number(n)) if n.as_i64() == Some(0) || n.as_i64() == Some(1) => Ok(n.as_i64() == Some(1)),
            Some(v) => Err(self.invalid(key, format!("must be true or false, got {}", type_name(v)))),
        }
    }

    fn seconds(&self, key: &str, default: Duration) -> Result<Duration, ConfigError> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Number(n)) if n.as_f64().is_some_and(|s| s > 0.0 && s.is_finite()) => {
                Ok(Duration::from_secs_f64(n.as_f64().unwrap_or_default()))
            }
            Some(v) => Err(self.invalid(
                key,
                format!("must be a positive number of seconds, got {}", type_name(v)),
            )),
        }
    }

    fn config(&self) -> Result<Config, ConfigError> {
        let mut warnings = Vec::new();
        for key in self.map.keys() {
            if IGNORED_KEYS.contains(&key.as_str()) {
                warnings.push(format!("key {key:?} is accepted for compatibility and has no effect"));
            } else if !KNOWN_KEYS.contains(&key.as_str()) {
                let hint = suggestion(key)
                    .map(|k| format!(" (did you mean {k:?}?)"))
                    .unwrap_or_default();
                warnings.push(format!("unknown key {key:?} ignored{hint}"));
            }
        }
        let mongohost = self.required_str("mongohost")?;
        if !(mongohost.starts_with("mongodb://") || mongohost.starts_with("mongodb+srv://")) {
            return Err(self.invalid(
                "mongohost",
                format!("must be a mongodb:// or mongodb+srv:// URI, got {mongohost:?}"),
            ));
        }
        let database = self.required_str("database")?;
        if database.len() >= 64 || database.contains(['/', '\\', '.', ' ', '"', '$', '\0']) {
            return Err(self.invalid(
                "database",
                format!("{database:?} is not a valid database name (under 64 bytes, none of /\\. \"$)"),
            ));
        }
        let plugins = self.plugins()?;
        let (active_queues, ignore_queues) = (self.queue_ids("activequeues")?, self.queue_ids("ignorequeues")?);
        if !active_queues.is_empty() && !ignore_queues.is_empty() {
            warnings.push("both activequeues and ignorequeues are set: only activequeues is used".into());
        }
        let node = match self.opt_str("node")? {
            Some(n) if n.is_empty() => return Err(self.invalid("node", "must not be empty")),
            Some(n) => n,
            None => gethostname::gethostname().to_string_lossy().into_owned(),
        };
        let max_instances = match self.get("max_instances") {
            None => DEFAULT_MAX_INSTANCES,
            Some(v) => v
                .as_u64()
                .filter(|n| (1..=100_000).contains(n))
                .map(|n| n as u32)
                .ok_or_else(|| {
                    self.invalid(
                        "max_instances",
                        format!("must be an integer from 1 to 100000, got {}", type_name(v)),
                    )
                })?,
        };
        let api_token = self.opt_str("api_token")?.filter(|t| !t.is_empty());
        Ok(Config {
            tls: self.tls()?,
            auth: self.auth()?,
            monitoring: self.bool_at("monitoring", self.get("monitoring"))?,
            balance: self.balance()?,
            gfs: self.gfs()?,
            web_root: self.opt_str("web_root")?.map(PathBuf::from),
            plugin_dir: PathBuf::from(self.opt_str("plugin_dir")?.unwrap_or_else(|| DEFAULT_PLUGIN_DIR.into())),
            heartbeat_stale: self.seconds("heartbeat_stale", DEFAULT_HEARTBEAT_STALE)?,
            orphan_claimed_after: self.seconds("orphan_claimed_after", DEFAULT_ORPHAN_CLAIMED_AFTER)?,
            shutdown_grace: self.seconds("shutdown_grace", DEFAULT_SHUTDOWN_GRACE)?,
            sandbox: self.sandbox()?,
            cache_dir: self.opt_str("cache_dir")?.map(PathBuf::from),
            bind: self.opt_str("bind")?.unwrap_or_else(|| DEFAULT_BIND.into()),
            mongohost,
            database,
            plugins,
            active_queues,
            ignore_queues,
            node,
            api_token,
            max_instances,
            warnings,
        })
    }

    fn plugins(&self) -> Result<Vec<String>, ConfigError> {
        let Some(v) = self.get("plugins") else {
            return Ok(Vec::new());
        };
        let Value::Array(items) = v else {
            return Err(self.invalid(
                "plugins",
                format!("must be an array of plugin names, got {}", type_name(v)),
            ));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(s) => check_plugin_name(s)
                    .map(|()| s.clone())
                    .map_err(|e| self.invalid(&format!("plugins[{i}]"), e)),
                other => Err(self.invalid(
                    &format!("plugins[{i}]"),
                    format!("must be a string, got {}", type_name(other)),
                )),
            })
            .collect()
    }

    fn queue_ids(&self, key: &str) -> Result<Vec<ObjectId>, ConfigError> {
        let Some(v) = self.get(key) else {
            return Ok(Vec::new());
        };
        let Value::Array(items) = v else {
            return Err(self.invalid(key, format!("must be an array of queue ids, got {}", type_name(v))));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                item.as_str().and_then(|s| ObjectId::parse_str(s).ok()).ok_or_else(|| {
                    self.invalid(
                        &format!("{key}[{i}]"),
                        format!("must be a queue _id (24 hex digits), got {}", type_name(item)),
                    )
                })
            })
            .collect()
    }

    fn gfs(&self) -> Result<Gfs, ConfigError> {
        match self.get("gfs") {
            None => Ok(Gfs::Auto),
            Some(Value::Bool(true)) => Ok(Gfs::Always),
            Some(Value::Bool(false)) => Ok(Gfs::Never),
            Some(Value::String(s)) if s == "auto" => Ok(Gfs::Auto),
            Some(v) => Err(self.invalid("gfs", format!("must be true, false or \"auto\", got {}", type_name(v)))),
        }
    }

    fn object(&self, key: &str) -> Result<Option<&Map<String, Value>>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(v) => Err(self.invalid(key, format!("must be an object, got {}", type_name(v)))),
        }
    }

    fn tls(&self) -> Result<Tls, ConfigError> {
        let Some(attrs) = self.object("attributes")? else {
            return Ok(Tls::default());
        };
        let mut tls = Tls::default();
        match attrs.get("ssl") {
            None | Some(Value::Null) => {}
            Some(Value::Bool(b)) => tls.enabled = *b,
            Some(Value::Number(n)) => tls.enabled = n.as_i64() != Some(0),
            Some(Value::Object(ssl)) => {
                tls.enabled = true;
                if let Some(ca) = ssl.get("SSL_ca_file") {
                    tls.ca_file = Some(self.ca_file("attributes.ssl.SSL_ca_file", ca)?);
                }
                if let Some(mode) = ssl.get("SSL_verify_mode") {
                    tls.allow_invalid_certificates = mode.as_i64() == Some(0);
                }
            }
            Some(v) => {
                return Err(self.invalid(
                    "attributes.ssl",
                    format!("must be 1, true or an object, got {}", type_name(v)),
                ))
            }
        }
        if attrs.contains_key("tls") {
            tls.enabled = self.bool_at("attributes.tls", attrs.get("tls"))?;
        }
        if let Some(ca) = attrs.get("tls_ca_file").filter(|v| !v.is_null()) {
            tls.ca_file = Some(self.ca_file("attributes.tls_ca_file", ca)?);
            tls.enabled = true;
        }
        if attrs.contains_key("tls_allow_invalid_certificates") {
            tls.allow_invalid_certificates = self.bool_at(
                "attributes.tls_allow_invalid_certificates",
                attrs.get("tls_allow_invalid_certificates"),
            )?;
            tls.enabled |= tls.allow_invalid_certificates;
        }
        Ok(tls)
    }

    fn ca_file(&self, key: &str, v: &Value) -> Result<PathBuf, ConfigError> {
        let Some(path) = v.as_str() else {
            return Err(self.invalid(key, format!("must be a file path, got {}", type_name(v))));
        };
        let path = PathBuf::from(path);
        if !path.is_file() {
            return Err(self.invalid(key, format!("{} does not exist", path.display())));
        }
        Ok(path)
    }

    fn auth(&self) -> Result<Auth, ConfigError> {
        let Some(auth) = self.object("auth")? else {
            return Ok(Auth::default());
        };
        let mut out = Auth::default();
        for (role, v) in auth {
            let key = format!("auth.{role}");
            let Some(pw) = v.as_str() else {
                return Err(self.invalid(&key, format!("must be a string, got {}", type_name(v))));
            };
            if role == "auth_source" {
                out.auth_source = Some(pw.to_owned());
            } else {
                out.passwords.insert(role.clone(), pw.to_owned());
            }
        }
        Ok(out)
    }

    fn balance(&self) -> Result<Balance, ConfigError> {
        let Some(b) = self.object("balance")? else {
            return Ok(Balance::default());
        };
        Ok(Balance {
            enabled: self.bool_at("balance.enabled", b.get("enabled"))?,
            log: self.bool_at("balance.log", b.get("log"))?,
            verbose: self.bool_at("balance.verbose", b.get("verbose"))?,
            pretend: self.bool_at("balance.pretend", b.get("pretend"))?,
        })
    }

    fn sandbox(&self) -> Result<Sandbox, ConfigError> {
        let mut s = Sandbox {
            timeout: DEFAULT_TIMEOUT,
            memory: DEFAULT_MEMORY,
            output_cap: DEFAULT_OUTPUT_CAP,
            ..Sandbox::default()
        };
        let Some(obj) = self.object("sandbox")? else {
            return Ok(s);
        };
        // The same settings a queue's `sandbox` sub-document takes.
        let raw: crate::model::QueueSandbox =
            serde_json::from_value(Value::Object(obj.clone())).map_err(|e| self.invalid("sandbox", e.to_string()))?;
        s = raw.resolve(&s).map_err(|e| self.invalid("sandbox", e))?;
        Ok(s)
    }
}

/// The known key closest to `key`, when it is a likely typo.
fn suggestion(key: &str) -> Option<&'static str> {
    KNOWN_KEYS
        .iter()
        .map(|k| (edit_distance(key, k), *k))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, k)| k)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_json_str(text, "test.json", &|_| None)
    }

    #[test]
    fn minimal_config_gets_the_defaults() {
        let c = parse(r#"{"mongohost":"mongodb://localhost","database":"disbatch"}"#).unwrap();
        assert_eq!(c.gfs, Gfs::Auto);
        assert_eq!(c.heartbeat_stale, DEFAULT_HEARTBEAT_STALE);
        assert_eq!(c.plugin_dir, PathBuf::from(DEFAULT_PLUGIN_DIR));
        assert_eq!(c.bind, DEFAULT_BIND);
        assert!(c.plugins.is_empty());
        assert!(!c.node.is_empty());
        assert!(c.warnings.is_empty());
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            (r#"{"database":"d"}"#, "missing required key \"mongohost\""),
            (r#"{"mongohost":"mongodb://h"}"#, "missing required key \"database\""),
            (
                r#"{"mongohost":5,"database":"d"}"#,
                "\"mongohost\" must be a non-empty string, got 5",
            ),
            (
                r#"{"mongohost":"http://h","database":"d"}"#,
                "\"mongohost\" must be a mongodb://",
            ),
            (r#"{"mongohost":"mongodb://h","database":"a.b"}"#, "\"database\""),
            (
                r#"{"mongohost":"mongodb://h","database":"d","plugins":"demo"}"#,
                "\"plugins\" must be an array",
            ),
            (
                r#"{"mongohost":"mongodb://h","database":"d","plugins":["ok","../x"]}"#,
                "\"plugins[1]\"",
            ),
            (
                r#"{"mongohost":"mongodb://h","database":"d","gfs":"sometimes"}"#,
                "\"gfs\" must be true, false or \"auto\"",
            ),
            (
                r#"{"mongohost":"mongodb://h","database":"d","heartbeat_stale":-1}"#,
                "\"heartbeat_stale\" must be a positive",
            ),
            (
                r#"{"mongohost":"mongodb://h","database":"d","activequeues":["nope"]}"#,
                "\"activequeues[0]\"",
            ),
            (
                r#"{"mongohost":"mongodb://h","database":"d","sandbox":{"memory_mib":99999}}"#,
                "\"sandbox\"",
            ),
            (
                r#"{"mongohost":"mongodb://h","database":"d","sandbox":{"memroy_mib":1}}"#,
                "unknown field `memroy_mib`",
            ),
            (
                r#"{"mongohost":"mongodb://h","database":"d","attributes":{"ssl":{"SSL_ca_file":"/no/ca.pem"}}}"#,
                "/no/ca.pem does not exist",
            ),
            ("[1]", "must be a JSON object"),
        ];
        for (text, expected) in cases {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(expected), "{text}: {err}");
            assert!(err.starts_with("config file test.json: "), "{err}");
        }
    }

    #[test]
    fn syntax_errors_give_line_and_column() {
        let err = parse("{\n  \"mongohost\": ,\n}").unwrap_err().to_string();
        assert!(err.contains("invalid JSON at line 2, column 16"), "{err}");
    }

    #[test]
    fn unknown_keys_warn_with_a_suggestion() {
        let c = parse(r#"{"mongohost":"mongodb://h","database":"d","mongoshost":"x","log4perl":{}}"#).unwrap();
        assert!(c
            .warnings
            .iter()
            .any(|w| w.contains("\"mongoshost\" ignored (did you mean \"mongohost\"?)")));
        assert!(c
            .warnings
            .iter()
            .any(|w| w.contains("\"log4perl\" is accepted for compatibility")));
    }

    #[test]
    fn env_overrides_win() {
        let env = |k: &str| match k {
            "DISBATCH_DATABASE" => Some("fromenv".to_owned()),
            "DISBATCH_NODE" => Some("n1".to_owned()),
            _ => None,
        };
        let c = Config::from_json_str(r#"{"mongohost":"mongodb://h","database":"d"}"#, "t", &env).unwrap();
        assert_eq!(c.database, "fromenv");
        assert_eq!(c.node, "n1");
    }

    #[test]
    fn perl_style_tls_attributes_are_understood() {
        let c =
            parse(r#"{"mongohost":"mongodb://h","database":"d","attributes":{"ssl":{"SSL_verify_mode":0}}}"#).unwrap();
        assert_eq!(
            c.tls,
            Tls {
                enabled: true,
                ca_file: None,
                allow_invalid_certificates: true
            }
        );
        let c = parse(r#"{"mongohost":"mongodb://h","database":"d","attributes":{"ssl":1}}"#).unwrap();
        assert!(c.tls.enabled && !c.tls.allow_invalid_certificates);
    }

    #[test]
    fn queue_filters_and_plugin_paths() {
        let a = ObjectId::new();
        let b = ObjectId::new();
        let c = parse(&format!(
            r#"{{"mongohost":"mongodb://h","database":"d","plugins":["demo"],"plugin_dir":"/p","activequeues":["{a}"],"ignorequeues":["{a}"]}}"#
        ))
        .unwrap();
        assert!(c.queue_is_active(&a) && !c.queue_is_active(&b), "activequeues wins");
        assert!(c.warnings.iter().any(|w| w.contains("only activequeues is used")));
        assert_eq!(c.plugin_path("demo").unwrap(), PathBuf::from("/p/demo.wasm"));
        assert!(c
            .plugin_path("other")
            .unwrap_err()
            .contains("not in the plugins allowlist"));
        assert!(c.plugin_path("../demo").unwrap_err().contains("plain name"));
    }
}
