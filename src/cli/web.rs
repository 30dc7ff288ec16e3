//! `disbatch web`: serves the DCI ([`crate::api::router`]) for a config file.

use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::CliError;
use crate::api::{router, ApiState};
use crate::config::Config;
use crate::store::mongo::MongoStore;
use crate::store::Store;

/// Loads `config`, connects to its database, binds `bind` (or the config's `bind`), prints
/// `disbatch web: listening on http://<addr>/` on stdout and serves until `shutdown`.
pub async fn serve(config: &Path, bind: Option<&str>, shutdown: CancellationToken) -> Result<(), CliError> {
    let config = Config::load(config).map_err(|e| CliError::Usage(e.to_string()))?;
    for w in &config.warnings {
        tracing::warn!("config: {w}");
    }
    let store = MongoStore::connect(
        &config.mongohost,
        &config.database,
        config.mongo_options("disbatch_web"),
    )
    .await
    .map_err(|e| CliError::Server(e.to_string()))?;
    store
        .ensure_indexes()
        .await
        .map_err(|e| CliError::Server(e.to_string()))?;
    let mut state = ApiState::new(Arc::new(store.clone()), config.plugins.clone());
    state.api_token = config.api_token.clone();
    state.documents = Some(Arc::new(store.database().clone()));
    state.database = Some(config.database.clone());
    state.monitoring = config.monitoring;
    let bind = bind.unwrap_or(&config.bind);
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .map_err(|e| CliError::Server(format!("cannot listen on {bind}: {e}")))?;
    let addr = listener.local_addr().map_err(|e| CliError::Server(e.to_string()))?;
    println!("disbatch web: listening on http://{addr}/");
    let _ = std::io::stdout().flush();
    tracing::info!(%addr, database = %config.database, "serving the DCI");
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
        .map_err(|e| CliError::Server(e.to_string()))
}
