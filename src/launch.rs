//! Starting the programs: what `den`, `disbatch web` and `disbatch dev` share.
//!
//! - `flags` — [`StoreArgs`]: the `--config`, `--embedded [FILE]` and `--plugin-dir DIR`
//!   flags, and the [`Config`] they give ([`StoreArgs::load_config`]): with `--embedded`
//!   the config file is optional, and without one the defaults apply with every `*.wasm`
//!   of the plugin directory allowed.
//! - `store` — [`open_store`]: MongoDB or the embedded SQLite file, schema and indexes
//!   ensured; the MongoDB connection settings of a config (`Config::mongo_options`).
//! - here — [`den`] and [`run_den`]: a DEN on that store; [`listen`], [`api_state`] and
//!   [`serve_dci`]: the DCI (REST API and web UI), served by [`serve`] under a connection
//!   cap and timeouts; [`runtime`], [`init_tracing`] and [`signals`]: the process around
//!   them.
//!
//! Errors are [`StartError`]s: bad flags or config (exit code 2), or a failure to start or
//! run (exit code 1).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::api::{router, AllowedHosts, ApiState};
use crate::config::{Config, ConfigError, HttpSettings};
use crate::den::{Den, DenSettings};
use crate::runner::{EngineOptions, Runner};
use crate::store::Store;

mod flags;
pub mod serve;
mod store;

pub use flags::{allow_plugins_in_dir, StoreArgs, DEFAULT_CONFIG_PATH, DEFAULT_EMBEDDED_PATH};
pub use store::{open_store, OpenStore};

/// Errors starting or running a program.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// Bad flags, config file or plugin directory (exit code 2).
    #[error("{0}")]
    Usage(String),
    /// The store, the sandbox, the listener or the DEN failed (exit code 1).
    #[error("{0}")]
    Failed(String),
}

impl StartError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            StartError::Usage(_) => 2,
            StartError::Failed(_) => 1,
        }
    }
}

impl From<ConfigError> for StartError {
    fn from(e: ConfigError) -> Self {
        StartError::Usage(e.to_string())
    }
}

/// A DEN on `store` with the settings of `config` and a sandbox sized by its
/// `max_instances` and `cache_dir`; no queue's grant may reach the `protected` host files
/// (see [`StoreArgs::host_files`]).
pub fn den(config: &Config, store: Arc<dyn Store>, protected: &[PathBuf]) -> Result<Arc<Den>, StartError> {
    let runner = Runner::new(&EngineOptions {
        cache_dir: config.cache_dir.clone().or_else(crate::runner::default_cache_dir),
        max_instances: config.max_instances,
    })
    .map_err(|e| StartError::Failed(e.to_string()))?;
    let mut settings = DenSettings::from_config(config);
    settings.protected = protected.to_vec();
    Ok(Den::new(store, runner, settings))
}

/// Runs `den` until `shutdown` is cancelled, then shuts it down gracefully.
pub async fn run_den(den: Arc<Den>, shutdown: CancellationToken) -> Result<(), StartError> {
    den.run(shutdown).await.map_err(|e| StartError::Failed(e.to_string()))
}

/// The DCI's state for `config` on `store`, served at `bind`: its plugins, token,
/// monitoring setting, the `Host` names it answers to (the config's `allowed_hosts` and
/// the host of `bind`) and `cors_origins`. The DCI compiles uploaded components to check them (`POST /plugins`) with an engine of
/// its own, sharing the config's compile cache; when that engine cannot be made, uploads
/// are refused with the reason logged.
pub fn api_state(config: &Config, store: &OpenStore, bind: &str) -> ApiState {
    let mut state = ApiState::new(store.store.clone(), config.plugins.clone());
    let bind_host = bind.rsplit_once(':').map_or(bind, |(host, _)| host);
    state.allowed_hosts = AllowedHosts::new(
        config
            .http
            .allowed_hosts
            .iter()
            .cloned()
            .chain([bind_host.trim_matches(['[', ']']).to_owned()]),
    );
    state.cors_origins = config.http.cors_origins.clone();
    state.api_token = config.api_token.clone();
    state.documents = store.documents.clone();
    state.database = Some(store.database.clone());
    state.monitoring = config.monitoring;
    state.balance = config.balance.clone();
    state.web_root = config.web_root.clone();
    state.checker = match Runner::new(&EngineOptions {
        cache_dir: config.cache_dir.clone().or_else(crate::runner::default_cache_dir),
        max_instances: 1,
    }) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(error = %e, "cannot make an engine to check uploaded plugins: POST /plugins is refused");
            None
        }
    };
    state
}

/// Binds `bind` (`host:port`; port 0 takes a free port) and returns the listener with the
/// address it got.
pub async fn listen(bind: &str) -> Result<(tokio::net::TcpListener, SocketAddr), StartError> {
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .map_err(|e| StartError::Failed(format!("cannot listen on {bind}: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| StartError::Failed(format!("cannot listen on {bind}: {e}")))?;
    Ok((listener, addr))
}

/// Serves the DCI ([`router`]) of `state` on `listener` under the connection cap and
/// timeouts of `http` ([`serve::serve`]) until `shutdown` is cancelled.
pub async fn serve_dci(
    listener: tokio::net::TcpListener,
    state: ApiState,
    http: &HttpSettings,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    serve::serve(listener, router(state), http, shutdown).await
}

/// A multi-threaded runtime whose blocking pool holds `max_instances` running plugins plus
/// room for the embedded store's calls.
pub fn runtime(max_instances: u32) -> Result<tokio::runtime::Runtime, StartError> {
    raise_fd_limit();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(max_instances.max(1) as usize + 16)
        .build()
        .map_err(|e| StartError::Failed(format!("cannot start the async runtime: {e}")))
}

/// Logs to stderr, as text (colored on a terminal) or as JSON lines; `RUST_LOG` sets the
/// filter (default `info,mongodb=warn`).
pub fn init_tracing(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,mongodb=warn".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if json {
        builder.json().flatten_event(true).with_current_span(true).init();
    } else {
        builder.init();
    }
}

/// The first SIGINT/SIGTERM cancels `shutdown` (a graceful shutdown); a second one exits at
/// once with code 130.
pub async fn signals(shutdown: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! { _ = int.recv() => {}, _ = term.recv() => {} }
    tracing::info!("signal received: shutting down gracefully (send it again to exit at once)");
    shutdown.cancel();
    tokio::select! { _ = int.recv() => {}, _ = term.recv() => {} }
    tracing::warn!("second signal: exiting at once; tasks still running here will be recovered as orphans");
    std::process::exit(130);
}

/// Raises the soft limit on open files to the hard one: plugins' files, sockets and HTTP
/// connections share it with the API's clients and the database pools, and the usual soft
/// limit (1,024) is far below what the system allows.
pub fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for getrlimit to fill and setrlimit to read.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            let wanted = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) != 0 {
                tracing::debug!(
                    soft = lim.rlim_cur,
                    hard = lim.rlim_max,
                    "cannot raise the open-files limit"
                );
            }
        }
    }
}
