//! `disbatch web`: serves the DCI ([`crate::api::router`]) on the store the flags name
//! (MongoDB, or the embedded file with `--embedded`).

use std::io::Write as _;

use tokio_util::sync::CancellationToken;

use super::CliError;
use crate::launch::{self, StoreArgs};

/// Loads the config of `args`, opens its store, binds `bind` (or the config's `bind`),
/// prints `disbatch web: listening on http://<addr>/` on stdout and serves until `shutdown`.
pub async fn serve(args: &StoreArgs, bind: Option<&str>, shutdown: CancellationToken) -> Result<(), CliError> {
    let config = args.load_config()?;
    for w in &config.warnings {
        tracing::warn!("config: {w}");
    }
    let store = launch::open_store(&config, args.embedded.as_deref(), "disbatch_web").await?;
    let bind = bind.unwrap_or(&config.bind);
    let (listener, addr) = launch::listen(bind).await?;
    println!("disbatch web: listening on http://{addr}/");
    let _ = std::io::stdout().flush();
    tracing::info!(%addr, store = %store.description, "serving the DCI");
    let state = launch::api_state(&config, &store, bind);
    launch::serve_dci(listener, state, &config.http, shutdown).await?;
    Ok(())
}
