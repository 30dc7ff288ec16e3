//! Config files from `tests/fixtures/config/`: a full one, a minimal one, a Perl-era one with
//! compatibility keys, and bad ones whose errors must name the file and the exact key.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bson::oid::ObjectId;
use disbatch::config::{
    Config, ConfigError, Gfs, DEFAULT_BIND, DEFAULT_HEARTBEAT_STALE, DEFAULT_MAX_INSTANCES,
    DEFAULT_ORPHAN_CLAIMED_AFTER, DEFAULT_PLUGIN_DIR, DEFAULT_SHUTDOWN_GRACE,
};
use disbatch::runner::{Sandbox, DEFAULT_MEMORY, DEFAULT_OUTPUT_CAP, DEFAULT_TIMEOUT};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/config")
        .join(name)
}

/// Loads a fixture without environment overrides, so the test does not depend on the
/// variables of the process running it.
fn load(name: &str) -> Result<Config, ConfigError> {
    Config::load_with_env(&fixture(name), &|_| None)
}

fn oid(s: &str) -> ObjectId {
    ObjectId::parse_str(s).unwrap()
}

#[test]
fn full_config_sets_every_key() {
    let c = load("good.json").unwrap();
    assert_eq!(
        c.mongohost,
        "mongodb://db1.example.com:27017,db2.example.com:27017/?replicaSet=rs0"
    );
    assert_eq!(c.database, "disbatch");
    assert!(c.tls.enabled && !c.tls.allow_invalid_certificates);
    assert_eq!(
        c.tls.ca_file.as_deref(),
        Some(Path::new("tests/fixtures/config/ca.pem"))
    );
    assert_eq!(c.auth.passwords.len(), 4);
    assert_eq!(c.auth.passwords["task_runner"], "runner-password");
    assert_eq!(c.auth.auth_source.as_deref(), Some("admin"));
    assert_eq!(c.plugins, ["demo", "Disbatch::Plugin::Migrate"]);
    assert!(c.monitoring);
    assert!(c.balance.enabled && c.balance.log && !c.balance.verbose && c.balance.pretend);
    assert_eq!(c.gfs, Gfs::Always);
    assert_eq!(c.web_root.as_deref(), Some(Path::new("/srv/disbatch/htdocs")));
    assert_eq!(
        c.active_queues,
        [oid("5f1e9c3b2a4d6e8f0a1b2c3d"), oid("5f1e9c3b2a4d6e8f0a1b2c3e")]
    );
    assert!(c.ignore_queues.is_empty());
    assert_eq!(c.plugin_dir, Path::new("/opt/disbatch/plugins"));
    assert_eq!(c.node, "den-01");
    assert_eq!(c.heartbeat_stale, Duration::from_secs(45));
    assert_eq!(c.orphan_claimed_after, Duration::from_secs(600));
    assert_eq!(c.shutdown_grace, Duration::from_millis(12_500));
    assert_eq!(c.sandbox.timeout, Duration::from_secs(7200));
    assert_eq!(c.sandbox.memory, 512 << 20);
    assert_eq!(c.sandbox.output_cap, 16 << 20);
    assert_eq!(c.sandbox.dirs.len(), 1);
    assert_eq!(c.sandbox.dirs[0].guest, "/fixtures");
    assert!(!c.sandbox.dirs[0].writable);
    assert_eq!(c.sandbox.env["LANG"], "C.UTF-8");
    assert!(!c.sandbox.network);
    assert_eq!(c.cache_dir.as_deref(), Some(Path::new("/var/cache/disbatch")));
    assert_eq!(c.api_token.as_deref(), Some("0123456789abcdef0123456789abcdef"));
    assert_eq!(c.bind, "0.0.0.0:9090");
    assert_eq!(c.max_instances, 250);
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);

    let debug = format!("{c:?}");
    assert!(
        !debug.contains("den-password") && !debug.contains("0123456789abcdef"),
        "{debug}"
    );
    let mongo = c.mongo_options("disbatch_web");
    assert_eq!(mongo.username.as_deref(), Some("disbatch_web"));
    assert_eq!(mongo.password.as_deref(), Some("web-password"));
    assert!(mongo.tls && mongo.tls_ca_file.is_some());
}

#[test]
fn minimal_config_takes_the_defaults() {
    let c = load("minimal.json").unwrap();
    assert_eq!(c.mongohost, "mongodb://localhost:27017");
    assert_eq!(c.database, "disbatch");
    assert!(!c.tls.enabled && c.auth.passwords.is_empty() && c.auth.auth_source.is_none());
    assert!(c.plugins.is_empty() && !c.monitoring && !c.balance.enabled);
    assert_eq!(c.gfs, Gfs::Auto);
    assert_eq!(c.web_root, None);
    assert!(c.active_queues.is_empty() && c.ignore_queues.is_empty());
    assert_eq!(c.plugin_dir, Path::new(DEFAULT_PLUGIN_DIR));
    assert_eq!(c.node, gethostname::gethostname().to_string_lossy());
    assert_eq!(c.heartbeat_stale, DEFAULT_HEARTBEAT_STALE);
    assert_eq!(c.orphan_claimed_after, DEFAULT_ORPHAN_CLAIMED_AFTER);
    assert_eq!(c.shutdown_grace, DEFAULT_SHUTDOWN_GRACE);
    assert_eq!(c.sandbox, Sandbox::default());
    assert_eq!(
        (c.sandbox.timeout, c.sandbox.memory, c.sandbox.output_cap),
        (DEFAULT_TIMEOUT, DEFAULT_MEMORY, DEFAULT_OUTPUT_CAP)
    );
    assert_eq!((c.cache_dir, c.api_token), (None, None));
    assert_eq!(c.bind, DEFAULT_BIND);
    assert_eq!(c.max_instances, DEFAULT_MAX_INSTANCES);
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
}

#[test]
fn perl_era_config_loads_with_warnings() {
    let c = load("legacy.json").unwrap();
    assert!(c.tls.enabled && c.tls.allow_invalid_certificates && c.tls.ca_file.is_none());
    assert_eq!(c.plugins, ["Disbatch::Plugin::Demo"]);
    let (active, ignored) = (oid("5f1e9c3b2a4d6e8f0a1b2c3d"), oid("5f1e9c3b2a4d6e8f0a1b2c3e"));
    assert!(c.queue_is_active(&active));
    assert!(!c.queue_is_active(&ignored), "activequeues wins over ignorequeues");
    assert!(!c.queue_is_active(&ObjectId::new()));
    let expected = [
        "key \"log4perl\" is accepted for compatibility and has no effect here",
        "unknown key \"mongoshost\" ignored (did you mean \"mongohost\"?)",
        "key \"task_runner\" is accepted for compatibility and has no effect here",
        "key \"views_dir\" is accepted for compatibility and has no effect here",
        "key \"web_extensions\" is accepted for compatibility and has no effect here",
        "attributes.connect_timeout_ms has no effect here",
        "both activequeues and ignorequeues are set: only activequeues is used",
        "attributes.ssl.SSL_verify_mode: the MongoDB server certificate is not verified",
    ];
    for e in expected {
        assert!(
            c.warnings.iter().any(|w| w.starts_with(e)),
            "missing {e:?} in {:#?}",
            c.warnings
        );
    }
    assert_eq!(c.warnings.len(), expected.len(), "{:#?}", c.warnings);
}

/// Every file in `bad/`: (file, key named, part of the message).
const BAD: &[(&str, &str, &str)] = &[
    ("missing_database", "database", "missing required key \"database\""),
    ("missing_mongohost", "mongohost", "missing required key \"mongohost\""),
    (
        "mongohost_not_string",
        "mongohost",
        "\"mongohost\" must be a non-empty string, got an array",
    ),
    (
        "mongohost_bad_scheme",
        "mongohost",
        "\"mongohost\" must be a mongodb:// or mongodb+srv:// URI",
    ),
    ("database_bad_name", "database", "is not a valid MongoDB database name"),
    (
        "plugins_not_array",
        "plugins",
        "\"plugins\" must be an array of plugin names, got \"demo\"",
    ),
    (
        "plugin_traversal",
        "plugins[1]",
        "\"plugins[1]\" plugin name \"../../etc/evil\" must be a plain name",
    ),
    (
        "gfs_sometimes",
        "gfs",
        "\"gfs\" must be true, false or \"auto\", got \"sometimes\"",
    ),
    (
        "heartbeat_negative",
        "heartbeat_stale",
        "\"heartbeat_stale\" must be a positive number of seconds, got -1",
    ),
    (
        "heartbeat_string",
        "heartbeat_stale",
        "\"heartbeat_stale\" must be a positive number of seconds, got \"abc\"",
    ),
    (
        "activequeue_not_oid",
        "activequeues[1]",
        "must be a queue _id (24 hex digits), got \"queue-two\"",
    ),
    (
        "sandbox_memory_too_big",
        "sandbox.memory_mib",
        "must be an integer from 1 to 4096, got 8192",
    ),
    (
        "sandbox_unknown_setting",
        "sandbox.netwrok",
        "is not a sandbox setting (did you mean \"network\"?)",
    ),
    (
        "sandbox_dir_missing",
        "sandbox.dirs[0]",
        "/no/such/dir does not exist or is not a directory",
    ),
    (
        "ca_file_missing",
        "attributes.ssl.SSL_ca_file",
        "/no/such/ca.pem does not exist",
    ),
    (
        "tls_contradiction",
        "attributes.tls",
        "is false but attributes.ssl says true",
    ),
    (
        "max_instances_zero",
        "max_instances",
        "must be an integer from 1 to 100000, got 0",
    ),
    ("bind_no_port", "bind", "must be host:port, got \"localhost\""),
    ("not_an_object", "(top level)", "must be a JSON object, got an array"),
];

#[test]
fn bad_configs_name_the_file_and_the_key() {
    for (name, key, message) in BAD {
        let path = fixture(&format!("bad/{name}.json"));
        let err = load(&format!("bad/{name}.json")).expect_err(name);
        assert_eq!(err.key(), Some(*key), "{name}: {err}");
        let text = err.to_string();
        let prefix = format!("config file {}: ", path.display());
        assert!(text.starts_with(&prefix), "{name}: {text}");
        assert!(text.contains(&format!("\"{key}\"")), "{name}: {text}");
        assert!(text.contains(message), "{name}: {text}");
    }
}

#[test]
fn every_bad_fixture_is_checked() {
    let mut files: Vec<String> = std::fs::read_dir(fixture("bad"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let mut covered: Vec<String> = BAD.iter().map(|(n, _, _)| format!("{n}.json")).collect();
    covered.push("invalid_json.json".into());
    covered.sort();
    assert_eq!(files, covered);
}

#[test]
fn invalid_json_gives_line_and_column() {
    let err = load("bad/invalid_json.json").unwrap_err();
    let ConfigError::Syntax { line, column, .. } = &err else {
        panic!("not a syntax error: {err}");
    };
    assert_eq!((*line, *column), (4, 22), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("bad/invalid_json.json: invalid JSON at line 4, column 22: expected `,` or `]`"),
        "{text}"
    );
    assert_eq!(err.key(), None);
}

#[test]
fn unreadable_files_are_named() {
    for path in [fixture("no-such-file.json"), fixture("bad")] {
        let err = Config::load(&path).unwrap_err();
        assert!(matches!(err, ConfigError::Io { .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with(&format!("cannot read config file {}: ", path.display())),
            "{err}"
        );
    }
}

#[test]
fn environment_overrides_the_file() {
    let env = |var: &str| {
        let value = match var {
            "DISBATCH_MONGOHOST" => "mongodb://other:27017",
            "DISBATCH_DATABASE" => "disbatch_test",
            "DISBATCH_NODE" => "den-from-env",
            "DISBATCH_PLUGIN_DIR" => "/tmp/plugins",
            "DISBATCH_API_TOKEN" => "token-from-the-environment",
            "DISBATCH_BIND" => "127.0.0.1:0",
            _ => return None,
        };
        Some(value.to_owned())
    };
    let c = Config::load_with_env(&fixture("good.json"), &env).unwrap();
    assert_eq!(c.mongohost, "mongodb://other:27017");
    assert_eq!(c.database, "disbatch_test");
    assert_eq!(c.node, "den-from-env");
    assert_eq!(c.plugin_dir, Path::new("/tmp/plugins"));
    assert_eq!(c.api_token.as_deref(), Some("token-from-the-environment"));
    assert_eq!(c.bind, "127.0.0.1:0");
    assert_eq!(c.plugin_path("demo").unwrap(), Path::new("/tmp/plugins/demo.wasm"));

    let bad_env = |var: &str| (var == "DISBATCH_MONGOHOST").then(|| "localhost:27017".to_owned());
    let err = Config::load_with_env(&fixture("minimal.json"), &bad_env).unwrap_err();
    assert_eq!(err.key(), Some("mongohost"));
    assert!(err.to_string().ends_with("(set by DISBATCH_MONGOHOST)"), "{err}");

    let missing = |var: &str| (var == "DISBATCH_DATABASE").then(|| "from_env".to_owned());
    let c = Config::load_with_env(&fixture("bad/missing_database.json"), &missing).unwrap();
    assert_eq!(c.database, "from_env", "the environment can supply a required key");
}

#[test]
fn plugin_paths_stay_in_the_plugin_dir() {
    let c = load("good.json").unwrap();
    assert_eq!(
        c.plugin_path("Disbatch::Plugin::Migrate").unwrap(),
        Path::new("/opt/disbatch/plugins/Disbatch::Plugin::Migrate.wasm")
    );
    assert!(c
        .plugin_path("other")
        .unwrap_err()
        .contains("not in the plugins allowlist"));
    for bad in ["../demo", "demo/x", "", "..", "a\\b"] {
        assert!(c.plugin_path(bad).is_err(), "{bad:?}");
    }
}
