use super::parser::{check_bind, edit_distance};
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
    assert!(err(r#""heartbeat_stale":1.4347036195162571e-77"#).contains("\"heartbeat_stale\" must be a positive"));
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
    // The users live in the Disbatch database unless `auth_source` or the URI says otherwise.
    assert_eq!(o.default_auth_source.as_deref(), Some(c.database.as_str()));
    let c = parse(r#""auth":{"queuebalance":"q"}"#).unwrap();
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    assert_eq!(c.mongo_options("queuebalance").password.as_deref(), Some("q"));
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
    let submit = parse(r#""sandbox":{"submit":["b","64f0c0ffee0000000000000a"],"submit_max":7}"#).unwrap();
    assert_eq!(
        (submit.sandbox.submit, submit.sandbox.submit_max),
        (vec!["b".to_string(), "64f0c0ffee0000000000000a".to_string()], 7)
    );
    assert!(err(r#""sandbox":{"submit":"b"}"#).contains("\"sandbox.submit\" must be a list of queue names or ids"));
    assert!(err(r#""sandbox":{"submit":[""]}"#).contains("\"sandbox.submit[0]\" must be a queue name or id"));
    assert!(
        err(r#""sandbox":{"submit_max":10001}"#).contains("\"sandbox.submit_max\" must be an integer from 0 to 10000")
    );
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

#[test]
fn http_keys() {
    let c = parse("").unwrap();
    assert_eq!(c.http, HttpSettings::default());
    assert_eq!(c.http.max_connections, DEFAULT_HTTP_MAX_CONNECTIONS);
    let c = parse(
        r#""http_max_connections":10,"http_header_timeout":2.5,"http_idle_timeout":3,"http_body_timeout":4,
           "allowed_hosts":["Disbatch.Example.com."],"cors_origins":["https://UI.example:8443","*"]"#,
    )
    .unwrap();
    assert_eq!(c.http.max_connections, 10);
    assert_eq!(c.http.header_timeout, Duration::from_millis(2500));
    assert_eq!(c.http.idle_timeout, Duration::from_secs(3));
    assert_eq!(c.http.body_timeout, Duration::from_secs(4));
    assert_eq!(c.http.allowed_hosts, ["disbatch.example.com"]);
    assert_eq!(c.http.cors_origins, ["https://ui.example:8443", "*"]);
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    assert!(err(r#""http_max_connections":0"#).contains("\"http_max_connections\" must be an integer from 1"));
    assert!(err(r#""http_idle_timeout":-1"#).contains("\"http_idle_timeout\" must be a positive"));
    assert!(err(r#""allowed_hosts":["http://x"]"#).contains("\"allowed_hosts[0]\" must be a host name"));
    assert!(err(r#""cors_origins":["ui.example"]"#).contains("\"cors_origins[0]\" must be an origin"));
    assert!(err(r#""cors_origins":["http://ui.example/path"]"#).contains("cors_origins[0]"));
}

#[test]
fn read_ahead_is_the_stores_default_unless_set_and_at_most_a_second() {
    assert_eq!(parse("").unwrap().read_ahead, None);
    assert_eq!(
        parse(r#""read_ahead":0.25"#).unwrap().read_ahead,
        Some(Duration::from_millis(250))
    );
    assert_eq!(parse(r#""read_ahead":0"#).unwrap().read_ahead, Some(Duration::ZERO));
    assert_eq!(
        parse(r#""read_ahead":0.5"#)
            .unwrap()
            .mongo_options("disbatchd")
            .read_ahead,
        Some(Duration::from_millis(500)),
        "the DEN's store gets it"
    );
    assert_eq!(parse(r#""read_ahead":-0.0"#).unwrap().read_ahead, Some(Duration::ZERO));
    assert_eq!(
        parse(r#""read_ahead":0.001"#).unwrap().read_ahead,
        Some(Duration::from_millis(1))
    );
    // A value too small to count would turn reading ahead off unsaid.
    for bad in ["1.5", "-0.1", "1e-7", "0.0009", r#""100ms""#] {
        let e = err(&format!(r#""read_ahead":{bad}"#));
        assert!(
            e.contains("\"read_ahead\" must be 0 (read none ahead) or a number of seconds from 0.001 to 1"),
            "{bad}: {e}"
        );
    }
}

#[test]
fn the_completion_window_is_zero_unless_set_and_at_most_a_tenth_of_a_second() {
    assert_eq!(parse("").unwrap().completion_window, Duration::ZERO);
    assert_eq!(
        parse(r#""completion_window":0.004"#).unwrap().completion_window,
        Duration::from_millis(4)
    );
    assert_eq!(
        parse(r#""completion_window":0"#).unwrap().completion_window,
        Duration::ZERO
    );
    for bad in ["0.5", "-0.001", r#""5ms""#, "1e300"] {
        let e = err(&format!(r#""completion_window":{bad}"#));
        assert!(
            e.contains("\"completion_window\" must be a number of seconds from 0 to 0.1"),
            "{bad}: {e}"
        );
    }
}

#[test]
fn retention_is_a_queue_retention_and_errors_name_the_status() {
    assert!(parse("").unwrap().retention.is_empty(), "none by default");
    let c = parse(r#""retention":{"succeeded":"7d","failed":86400}"#).unwrap();
    assert_eq!(
        c.retention.of(crate::model::status::SUCCEEDED),
        Some(Duration::from_secs(7 * 86400))
    );
    assert_eq!(
        c.retention.of(crate::model::status::FAILED),
        Some(Duration::from_secs(86400))
    );
    assert!(err(r#""retention":{"queued":"7d"}"#).contains("\"retention.queued\" is not an ended status"));
    assert!(err(r#""retention":{"failed":"0s"}"#).contains("\"retention.failed\" must be more than zero"));
    assert!(err(r#""retention":{"failed":-1}"#).contains("\"retention.failed\""));
    assert!(err(r#""retention":"7d""#).contains("\"retention\" must be an object"));
}
