//! The global options of `disbatch` ([`Cli`]), given before or after the verb, with
//! Disbatch 4's spellings as aliases, and the [`ClientOptions`] they make: credentials and
//! TLS from the flags, the environment, and the `--config` file (Disbatch 4 reads its
//! `attributes.ssl`; we read that, our `attributes.tls_*` keys, and `api_token`).

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::client::{Client, ClientOptions};
use super::command::Command;
use super::CliError;

/// Where the config file is looked for without `--config` (as Disbatch 4 does): used when
/// it exists, silently skipped when it does not.
pub const DEFAULT_CONFIG: &str = "/etc/disbatch/config.json";
/// The DCI of the client verbs without `--url` (or `DISBATCH_URL`), as in Disbatch 4.
pub const DEFAULT_URL: &str = "http://localhost:8080";

/// Rows of `tasks` without `--limit` (Disbatch 4's default).
pub const DEFAULT_TASKS_LIMIT: u64 = 20;

/// `disbatch`: operate a Disbatch cluster through its DCI.
#[derive(Debug, clap::Parser)]
#[command(
    name = "disbatch",
    version,
    about = "Disbatch command interface: serve the DCI, manage queues and tasks",
    next_help_heading = "Global options (before or after the verb)"
)]
pub struct Cli {
    /// URL of the DCI.
    #[arg(
        long,
        short = 'u',
        global = true,
        env = "DISBATCH_URL",
        default_value = DEFAULT_URL
    )]
    pub url: String,
    /// Bearer token for writes (the server's `api_token`).
    #[arg(long, global = true, env = "DISBATCH_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// HTTP basic user name (with --password; any name: the DCI checks the password).
    #[arg(long, short = 'n', global = true, env = "DISBATCH_USERNAME")]
    pub username: Option<String>,
    /// HTTP basic password: the server's `api_token` (with --username).
    #[arg(long, global = true, env = "DISBATCH_PASSWORD", hide_env_values = true)]
    pub password: Option<String>,
    /// The config file: for `web` and `create-users` the server's; for the other verbs its
    /// TLS settings (`attributes`) and `api_token` are used. Default for the client verbs:
    /// /etc/disbatch/config.json when it exists.
    #[arg(long, global = true, env = "DISBATCH_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// PEM file of the certificate authority of an `https` DCI (over the config file's).
    #[arg(long = "ssl-ca-file", alias = "ssl_ca_file", global = true, value_name = "FILE")]
    pub ssl_ca_file: Option<PathBuf>,
    /// Do not verify the certificate of an `https` DCI.
    #[arg(long = "disable-ssl-verification", alias = "disable_ssl_verification", global = true)]
    pub disable_ssl_verification: bool,
    /// Print the API's JSON instead of tables (`--pretty`, Disbatch 4's option, is the same).
    #[arg(long, global = true, visible_alias = "pretty")]
    pub json: bool,
    /// `create-task`, `create-tasks`, `create-dag`: print only the ids of the tasks on stdout,
    /// one per line, and the sentence saying what was created on stderr (as when stdout is
    /// not a terminal).
    #[arg(long, short = 'q', global = true)]
    pub quiet: bool,
    /// `tasks`: return at most this many (default 20; 0 for all, fetched page by page).
    #[arg(long, global = true)]
    pub limit: Option<u64>,
    /// `tasks`: skip this many.
    #[arg(long, global = true)]
    pub skip: Option<u64>,
    /// `tasks`: print only the number of matching tasks.
    #[arg(long, global = true)]
    pub count: bool,
    /// `tasks`: only these fields (comma-separated).
    #[arg(long, global = true)]
    pub fields: Option<String>,
    /// `tasks`, `task`: dates as seconds since the epoch.
    #[arg(long, global = true)]
    pub epoch: bool,
    /// `tasks`: inline stdout/stderr shown as "[terse mode]".
    #[arg(long, global = true, overrides_with = "noterse")]
    pub terse: bool,
    /// `tasks`: full stdout/stderr (the default; undoes --terse).
    #[arg(long, global = true, overrides_with = "terse")]
    pub noterse: bool,
    /// `tasks`: read file-backed stdout/stderr back as text (at most 100 tasks); `plugins`:
    /// every allowed or stored plugin with its newest version.
    #[arg(long, global = true)]
    pub full: bool,
    /// The verb.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Whether `--terse` is in effect; an error when `--terse` and `--noterse` were given on
    /// the two sides of the verb (on one side the last one wins, as in Disbatch 4).
    pub fn terse_flag(&self) -> Result<bool, CliError> {
        if self.terse && self.noterse {
            return Err(CliError::Usage(
                "--terse and --noterse contradict each other: give one".into(),
            ));
        }
        Ok(self.terse)
    }

    /// The client of `--url` with the credentials and TLS settings these options give.
    pub fn client(&self) -> Result<Client, CliError> {
        Client::new(&self.url, self.client_options()?)
    }

    /// Credentials: `--username`/`--password` (basic), else `--token`, else the config
    /// file's `api_token`. TLS: `--ssl-ca-file` or `--disable-ssl-verification`, else the
    /// config file's settings.
    pub fn client_options(&self) -> Result<ClientOptions, CliError> {
        let basic = match (&self.username, &self.password) {
            (Some(u), Some(p)) => Some((u.clone(), p.clone())),
            (None, None) => None,
            _ => {
                return Err(CliError::Usage(
                    "--username and --password must be given together (env DISBATCH_USERNAME, DISBATCH_PASSWORD)"
                        .into(),
                ))
            }
        };
        let file = self.config_file()?;
        let mut options = ClientOptions {
            token: self.token.clone().or(file.token),
            basic,
            ..ClientOptions::default()
        };
        if self.ssl_ca_file.is_some() || self.disable_ssl_verification {
            options.ca_file = self.ssl_ca_file.clone();
            options.accept_invalid_certs = self.disable_ssl_verification && self.ssl_ca_file.is_none();
        } else {
            options.ca_file = file.ca_file;
            options.accept_invalid_certs = file.accept_invalid_certs;
        }
        Ok(options)
    }

    fn config_file(&self) -> Result<FileSettings, CliError> {
        match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| CliError::Usage(format!("cannot read --config {}: {e}", path.display())))?;
                FileSettings::parse(&text, path).map_err(CliError::Usage)
            }
            None => {
                let path = Path::new(DEFAULT_CONFIG);
                match std::fs::read_to_string(path) {
                    Ok(text) => Ok(FileSettings::parse(&text, path).unwrap_or_else(|e| {
                        eprintln!("disbatch: warning: {e}; its settings are not used");
                        FileSettings::default()
                    })),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(FileSettings::default()),
                    Err(e) => {
                        eprintln!("disbatch: warning: cannot read {DEFAULT_CONFIG}: {e}; its settings are not used");
                        Ok(FileSettings::default())
                    }
                }
            }
        }
    }
}

/// What the client takes from a config file.
#[derive(Debug, Default, PartialEq, Eq)]
struct FileSettings {
    token: Option<String>,
    ca_file: Option<PathBuf>,
    accept_invalid_certs: bool,
}

impl FileSettings {
    /// Reads `api_token` and the TLS keys of `attributes`: Disbatch 4's `ssl` object
    /// (`SSL_ca_file`, `SSL_verify_mode` 0 = no verification) and our `tls_ca_file`,
    /// `tls_allow_invalid_certificates`. Other keys are not looked at.
    fn parse(text: &str, path: &Path) -> Result<FileSettings, String> {
        let file = path.display().to_string();
        let value = crate::config::parse_relaxed(text, &file).map_err(|e| e.to_string())?;
        let bad = |key: &str, what: &str| format!("{file}: {key} must be {what}");
        let mut out = FileSettings {
            token: match value.get("api_token") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
                Some(_) => return Err(bad("api_token", "a non-empty string")),
            },
            ..FileSettings::default()
        };
        let attrs = value.get("attributes");
        let ssl = attrs.and_then(|a| a.get("ssl")).filter(|s| s.is_object());
        let text_of = |key: &str, v: Option<&Value>| match v {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if !s.is_empty() => Ok(Some(PathBuf::from(s))),
            Some(_) => Err(bad(key, "a file path")),
        };
        out.ca_file = text_of("attributes.ssl.SSL_ca_file", ssl.and_then(|s| s.get("SSL_ca_file")))?;
        if out.ca_file.is_none() {
            out.ca_file = text_of("attributes.tls_ca_file", attrs.and_then(|a| a.get("tls_ca_file")))?;
        }
        let verify = ssl.and_then(|s| s.get("SSL_verify_mode"));
        let allow = attrs.and_then(|a| a.get("tls_allow_invalid_certificates"));
        out.accept_invalid_certs = matches!(verify, Some(v) if v.as_u64() == Some(0) || v.as_str() == Some("0"))
            || matches!(allow, Some(v) if v.as_bool() == Some(true) || v.as_u64() == Some(1));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    fn parse(text: &str) -> Result<FileSettings, String> {
        FileSettings::parse(text, Path::new("c.json"))
    }

    #[test]
    fn reads_tls_and_the_token_from_a_config() {
        let s = parse(
            r#"{ # Disbatch 4 style
              "attributes": {"ssl": {"SSL_ca_file": "/etc/ca.pem", "SSL_verify_mode": 1}},
              "api_token": "t0k", "mongohost": "ignored", }"#,
        )
        .unwrap();
        assert_eq!(s.token.as_deref(), Some("t0k"));
        assert_eq!(s.ca_file.as_deref(), Some(Path::new("/etc/ca.pem")));
        assert!(!s.accept_invalid_certs);
        let s = parse(r#"{"attributes": {"ssl": {"SSL_verify_mode": 0}}}"#).unwrap();
        assert!(s.accept_invalid_certs && s.ca_file.is_none() && s.token.is_none());
        let s = parse(r#"{"attributes": {"tls_ca_file": "/ca", "tls_allow_invalid_certificates": true}}"#).unwrap();
        assert_eq!(
            (s.ca_file.as_deref(), s.accept_invalid_certs),
            (Some(Path::new("/ca")), true)
        );
        assert_eq!(parse("{}").unwrap(), FileSettings::default());
        assert!(parse(r#"{"api_token": 3}"#).unwrap_err().contains("c.json: api_token"));
        assert!(parse("{").is_err());
    }

    fn cli(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("disbatch").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn the_command_line_is_consistent() {
        <Cli as clap::CommandFactory>::command().debug_assert();
    }

    #[test]
    fn global_options_go_before_or_after_the_verb_with_perl_spellings() {
        let before = cli(&[
            "-u",
            "http://h:1",
            "-n",
            "me",
            "--password",
            "pw",
            "--limit",
            "5",
            "tasks",
        ]);
        let after = cli(&[
            "tasks",
            "--url",
            "http://h:1",
            "--username",
            "me",
            "--password",
            "pw",
            "--limit=5",
        ]);
        assert_eq!((before.url.as_str(), before.limit), ("http://h:1", Some(5)));
        assert_eq!((after.url.as_str(), after.limit), ("http://h:1", Some(5)));
        let c = cli(&[
            "--ssl_ca_file",
            "/ca.pem",
            "--disable_ssl_verification",
            "--noterse",
            "tasks",
            "--epoch",
        ]);
        assert_eq!(c.ssl_ca_file.as_deref(), Some(Path::new("/ca.pem")));
        assert!(c.disable_ssl_verification && c.noterse && !c.terse && c.epoch);
        let c = cli(&["tasks", "--terse", "--noterse"]);
        assert!(!c.terse && c.noterse);
        let c = cli(&["tasks", "--noterse", "--terse", "--full", "--skip", "3"]);
        assert!(c.terse && c.full && c.skip == Some(3));
        // Before and after the verb they are both kept: refused as contradicting.
        let c = cli(&["--terse", "tasks", "--noterse"]);
        assert!(c.terse_flag().is_err());
        assert!(cli(&["plugins", "--full"]).full);
    }

    #[test]
    fn credentials_and_tls_from_flags_over_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.json");
        std::fs::write(
            &file,
            r#"{"api_token": "from-file", "attributes": {"ssl": {"SSL_verify_mode": 0}}}"#,
        )
        .unwrap();
        let config = file.to_str().unwrap();
        let o = cli(&["--config", config, "queues"]).client_options().unwrap();
        assert_eq!((o.token.as_deref(), o.accept_invalid_certs), (Some("from-file"), true));
        let o = cli(&["--config", config, "--token", "flag", "--ssl-ca-file", "/ca", "queues"])
            .client_options()
            .unwrap();
        assert_eq!(o.token.as_deref(), Some("flag"));
        assert_eq!(
            (o.ca_file.as_deref(), o.accept_invalid_certs),
            (Some(Path::new("/ca")), false)
        );
        let o = cli(&["--config", config, "-n", "u", "--password", "p", "queues"])
            .client_options()
            .unwrap();
        assert_eq!(o.basic, Some(("u".into(), "p".into())));
        let e = cli(&["--config", config, "-n", "u", "queues"])
            .client_options()
            .unwrap_err();
        assert!(e.to_string().contains("together"), "{e}");
        let e = cli(&["--config", "/no/such.json", "queues"])
            .client_options()
            .unwrap_err();
        assert!(e.to_string().contains("/no/such.json"), "{e}");
    }
}
