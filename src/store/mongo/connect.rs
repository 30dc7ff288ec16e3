//! Connecting a [`MongoStore`]: the URI plus TLS and credential settings.

use std::path::PathBuf;
use std::time::Duration;

use mongodb::options::{ClientOptions, Tls, TlsOptions};
use mongodb::Client;

use super::MongoStore;
use crate::store::{StoreError, StoreResult};

/// Connection settings beyond the URI: TLS and credentials. Unset fields leave what the
/// URI says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MongoOptions {
    /// Use TLS (also implied by `tls_ca_file` or `tls_allow_invalid_certificates`).
    pub tls: bool,
    /// PEM file of the certificate authority for an internally signed server certificate.
    pub tls_ca_file: Option<PathBuf>,
    /// Accept any server certificate (self-signed certificates).
    pub tls_allow_invalid_certificates: bool,
    /// User name to authenticate as.
    pub username: Option<String>,
    /// Password of `username`.
    pub password: Option<String>,
    /// Database that holds the user (`authSource`); it wins over the URI's `authSource`.
    pub auth_source: Option<String>,
    /// Database that holds the user when neither `auth_source` nor the URI names one and
    /// `username` or `password` is set here: Disbatch 4 keeps its users in the Disbatch
    /// database, so [`Config::mongo_options`](crate::config::Config::mongo_options) puts
    /// the config's `database` here.
    pub default_auth_source: Option<String>,
    /// How long an operation waits for a reachable server (the driver's default is 30 s).
    pub server_selection_timeout: Option<Duration>,
    /// How long a grouped write waits for more writes to join it before it is sent
    /// (`completion_window`; zero, the default: it goes at once).
    pub completion_window: Duration,
    /// How long tasks read ahead for the claims to come are used (`read_ahead`; `None`:
    /// the store's default, [`MongoStore::read_ahead_for`]).
    pub read_ahead: Option<Duration>,
}

impl MongoOptions {
    /// A client of `uri` with these settings over it, connecting lazily. Errors name the
    /// URI (with its password hidden) and are not helped by retrying.
    pub async fn client(&self, uri: &str) -> StoreResult<Client> {
        let mut client_options = ClientOptions::parse(uri)
            .await
            .map_err(|e| StoreError::Invalid(format!("mongohost {:?}: {e}", crate::redact::redact_uri(uri))))?;
        self.apply(&mut client_options, uri_auth_source(uri).as_deref());
        Client::with_options(client_options).map_err(|e| StoreError::Invalid(format!("mongohost: {e}")))
    }

    /// Applies these settings over what the URI gave; `uri_auth_source` is the URI's
    /// `authSource`, which the driver drops when the URI has no user name.
    fn apply(&self, client_options: &mut ClientOptions, uri_auth_source: Option<&str>) {
        if self.tls || self.tls_ca_file.is_some() || self.tls_allow_invalid_certificates {
            let mut tls = TlsOptions::default();
            tls.ca_file_path = self.tls_ca_file.clone();
            if self.tls_allow_invalid_certificates {
                tls.allow_invalid_certificates = Some(true);
            }
            client_options.tls = Some(Tls::Enabled(tls));
        }
        if self.username.is_some() || self.password.is_some() || self.auth_source.is_some() {
            let mut credential = client_options.credential.take().unwrap_or_default();
            if let Some(u) = &self.username {
                credential.username = Some(u.clone());
            }
            if let Some(p) = &self.password {
                credential.password = Some(p.clone());
            }
            // Ours, else the URI's `authSource`, else the default (not the driver's `admin`).
            let source = self
                .auth_source
                .clone()
                .or_else(|| uri_auth_source.map(str::to_owned))
                .or_else(|| self.default_auth_source.clone());
            if source.is_some() {
                credential.source = source;
            }
            client_options.credential = Some(credential);
        }
        if let Some(t) = self.server_selection_timeout {
            client_options.server_selection_timeout = Some(t);
        }
        if client_options.app_name.is_none() {
            client_options.app_name = Some("disbatch".to_string());
        }
    }
}

/// The `authSource` option of a MongoDB URI (option names are case-insensitive).
fn uri_auth_source(uri: &str) -> Option<String> {
    let (_, query) = uri.split_once('?')?;
    query
        .split(['&', ';'])
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| k.eq_ignore_ascii_case("authSource"))
        .map(|(_, v)| v.to_owned())
        .filter(|v| !v.is_empty())
}

impl MongoStore {
    /// Connects to `uri` and uses `database`. The connection is made lazily: an unreachable
    /// server shows as an error of the first operation (usually
    /// [`Store::ensure_indexes`](crate::store::Store::ensure_indexes)).
    pub async fn connect(uri: &str, database: &str, options: MongoOptions) -> StoreResult<MongoStore> {
        if database.is_empty() {
            return Err(StoreError::Invalid("database name is empty".to_string()));
        }
        let client = options.client(uri).await?;
        let store = Self::from_database_grouping(client.database(database), options.completion_window);
        Ok(match options.read_ahead {
            Some(d) => store.read_ahead_for(d),
            None => store,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn settings_override_the_uri() {
        let mut o = ClientOptions::parse("mongodb://u0:p0@127.0.0.1:1/?authSource=a0")
            .await
            .unwrap();
        MongoOptions::default().apply(&mut o, None);
        assert!(o.tls.is_none());
        assert_eq!(o.credential.as_ref().and_then(|c| c.username.as_deref()), Some("u0"));

        let settings = MongoOptions {
            tls_ca_file: Some("/etc/ca.pem".into()),
            username: Some("u1".into()),
            auth_source: Some("admin".into()),
            ..Default::default()
        };
        settings.apply(&mut o, None);
        match &o.tls {
            Some(Tls::Enabled(t)) => {
                assert_eq!(t.ca_file_path.as_deref(), Some(std::path::Path::new("/etc/ca.pem")));
                assert_eq!(t.allow_invalid_certificates, None);
            }
            other => panic!("TLS not enabled: {other:?}"),
        }
        let c = o.credential.as_ref().unwrap();
        assert_eq!((c.username.as_deref(), c.password.as_deref()), (Some("u1"), Some("p0")));
        assert_eq!(c.source.as_deref(), Some("admin"));
        assert_eq!(o.app_name.as_deref(), Some("disbatch"));
    }

    #[tokio::test]
    async fn the_default_auth_source_applies_where_nothing_names_one() {
        let source = |uri: &'static str, auth_source: Option<&'static str>| async move {
            let mut o = ClientOptions::parse(uri).await.unwrap();
            let from_uri = uri_auth_source(uri);
            MongoOptions {
                username: Some("disbatchd".into()),
                password: Some("pw".into()),
                auth_source: auth_source.map(str::to_owned),
                default_auth_source: Some("disbatch".into()),
                ..Default::default()
            }
            .apply(&mut o, from_uri.as_deref());
            o.credential.and_then(|c| c.source)
        };
        assert_eq!(source("mongodb://h/", None).await.as_deref(), Some("disbatch"));
        assert_eq!(
            source("mongodb://h/?authSource=admin", None).await.as_deref(),
            Some("admin")
        );
        assert_eq!(
            source("mongodb://h/?authSource=admin", Some("users")).await.as_deref(),
            Some("users")
        );
        assert_eq!(source("mongodb://h/", Some("users")).await.as_deref(), Some("users"));
        assert_eq!(
            source("mongodb://h/?w=1&authsource=x", None).await.as_deref(),
            Some("x")
        );
        assert_eq!(
            source("mongodb://u:p@h/?authSource=y", None).await.as_deref(),
            Some("y")
        );
        // Without credentials of ours the default is not used: the URI's user keeps the
        // driver's rules.
        let mut o = ClientOptions::parse("mongodb://u:p@h/").await.unwrap();
        MongoOptions {
            default_auth_source: Some("disbatch".into()),
            ..Default::default()
        }
        .apply(&mut o, None);
        assert_ne!(o.credential.and_then(|c| c.source).as_deref(), Some("disbatch"));
    }

    #[tokio::test]
    async fn read_ahead_reaches_the_store_and_unset_keeps_its_default() {
        let store = |read_ahead| {
            MongoStore::connect(
                "mongodb://127.0.0.1:1",
                "d",
                MongoOptions {
                    read_ahead,
                    ..Default::default()
                },
            )
        };
        let off = store(Some(Duration::ZERO)).await.unwrap();
        assert_eq!(off.reads_ahead_for(), Duration::ZERO);
        let set = store(Some(Duration::from_millis(250))).await.unwrap();
        assert_eq!(set.reads_ahead_for(), Duration::from_millis(250));
        let unset = store(None).await.unwrap();
        assert_eq!(unset.reads_ahead_for(), super::super::ahead::READ_AHEAD_FOR);
    }

    #[tokio::test]
    async fn self_signed_certificates() {
        let mut o = ClientOptions::parse("mongodb://127.0.0.1:1").await.unwrap();
        MongoOptions {
            tls_allow_invalid_certificates: true,
            ..Default::default()
        }
        .apply(&mut o, None);
        assert!(matches!(&o.tls, Some(Tls::Enabled(t)) if t.allow_invalid_certificates == Some(true)));
    }
}
