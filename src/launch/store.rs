//! Opening the store a program runs on: MongoDB ([`MongoStore`]) or the embedded SQLite
//! file ([`SqliteStore`]), schema and indexes ensured, and the MongoDB connection settings
//! a config gives ([`Config::mongo_options`]).

use std::path::Path;
use std::sync::Arc;

use super::StartError;
use crate::api::DocumentSource;
use crate::config::{redact_uri, Config, SERVER_SELECTION_TIMEOUT};
use crate::store::mongo::{MongoOptions, MongoStore};
use crate::store::sqlite::SqliteStore;
use crate::store::Store;

/// The MongoDB side of a config, built here where the store is opened so that the config
/// knows nothing of the store.
impl Config {
    /// MongoDB connection settings for `role` (`disbatchd`, `disbatch_web`, …): TLS from
    /// `attributes`, the role as user name with its password when `auth` has one (the user
    /// looked up in `auth.auth_source`, else the URI's `authSource`, else `database`), and
    /// a [`SERVER_SELECTION_TIMEOUT`] so outages surface quickly.
    pub fn mongo_options(&self, role: &str) -> MongoOptions {
        let password = self.auth.passwords.get(role).cloned();
        MongoOptions {
            tls: self.tls.enabled,
            tls_ca_file: self.tls.ca_file.clone(),
            tls_allow_invalid_certificates: self.tls.allow_invalid_certificates,
            username: password.as_ref().map(|_| role.to_owned()),
            password,
            auth_source: self.auth.auth_source.clone(),
            default_auth_source: Some(self.database.clone()).filter(|d| !d.is_empty()),
            server_selection_timeout: Some(SERVER_SELECTION_TIMEOUT),
            completion_window: self.completion_window,
            read_ahead: self.read_ahead,
        }
    }
}

/// An open store and how to name it.
#[derive(Clone)]
pub struct OpenStore {
    /// The store.
    pub store: Arc<dyn Store>,
    /// Other collections of the same database, for `POST /tasks` from documents: MongoDB
    /// has them, the embedded store does not (`None`: that form answers 400).
    pub documents: Option<Arc<dyn DocumentSource>>,
    /// What `GET /info` shows as the database: the MongoDB database name or the file.
    pub database: String,
    /// For people: `./disbatch.db (embedded)` or `mongodb://***@host/ database disbatch (MongoDB)`.
    pub description: String,
}

impl std::fmt::Debug for OpenStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenStore")
            .field("description", &self.description)
            .finish_non_exhaustive()
    }
}

/// Opens the embedded store in the file `embedded` when given, else connects to the
/// config's MongoDB as `role` (`disbatchd`, `disbatch_web`; see [`Config::mongo_options`]),
/// and ensures the schema or indexes.
pub async fn open_store(config: &Config, embedded: Option<&Path>, role: &str) -> Result<OpenStore, StartError> {
    if let Some(path) = embedded {
        check_store_file(path)?;
        let store = SqliteStore::open(path)
            .await
            .map_err(|e| StartError::Failed(format!("cannot open the embedded store {}: {e}", path.display())))?;
        return Ok(OpenStore {
            store: Arc::new(store),
            documents: None,
            database: path.display().to_string(),
            description: format!("{} (embedded)", path.display()),
        });
    }
    let uri = redact_uri(&config.mongohost);
    let store = MongoStore::connect(&config.mongohost, &config.database, config.mongo_options(role))
        .await
        .map_err(|e| StartError::Usage(format!("cannot use MongoDB at {uri}: {e}")))?;
    store
        .ensure_indexes()
        .await
        .map_err(|e| StartError::Failed(format!("cannot prepare the database {} at {uri}: {e}", config.database)))?;
    Ok(OpenStore {
        documents: Some(Arc::new(store.database().clone())),
        store: Arc::new(store),
        database: config.database.clone(),
        description: format!("{uri} database {} (MongoDB)", config.database),
    })
}

/// Refuses names SQLite would not take as a plain file: empty (a private temporary
/// database), `:memory:` and `file:` URIs, which DENs and DCIs could not share.
fn check_store_file(path: &Path) -> Result<(), StartError> {
    let text = path.to_string_lossy();
    if text.is_empty() || text == ":memory:" || text.starts_with("file:") {
        return Err(StartError::Usage(format!(
            "the embedded store needs a file name, got {text:?}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_embedded_store_is_a_plain_file() {
        let config = Config::defaults(&|_| None).unwrap();
        for bad in ["", ":memory:", "file:x.db?mode=memory"] {
            let e = open_store(&config, Some(Path::new(bad)), "disbatchd")
                .await
                .unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}: {e}");
            assert!(e.to_string().contains("needs a file name"), "{e}");
        }
    }
}
