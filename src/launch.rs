//! Starting the programs: what `den`, `disbatch web` and `disbatch dev` share.
//!
//! - [`StoreArgs`]: the `--config`, `--embedded [FILE]` and `--plugin-dir DIR` flags, and the
//!   [`Config`] they give ([`StoreArgs::load_config`]): with `--embedded` the config file is
//!   optional, and without one the defaults apply with every `*.wasm` of the plugin
//!   directory allowed.
//! - [`open_store`]: MongoDB ([`MongoStore`]) or the embedded SQLite file ([`SqliteStore`]),
//!   schema and indexes ensured.
//! - [`den`] and [`run_den`]: a DEN on that store.
//! - [`listen`], [`api_state`] and [`serve_dci`]: the DCI (REST API and web UI), served
//!   by [`serve`] under a connection cap and timeouts.
//! - [`runtime`], [`init_tracing`] and [`signals`]: the process around them.
//!
//! Errors are [`StartError`]s: bad flags or config (exit code 2), or a failure to start or
//! run (exit code 1).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::api::{router, AllowedHosts, ApiState};
use crate::config::{check_plugin_name, Config, ConfigError, HttpSettings, StoreKind};
use crate::den::{Den, DenSettings};
use crate::runner::{EngineOptions, Runner};
use crate::store::Store;

pub mod serve;
mod store;

pub use store::{open_store, OpenStore};

/// The config file used when neither `--config` nor `--embedded` is given and the file
/// exists (Disbatch 4's default).
pub const DEFAULT_CONFIG_PATH: &str = "/etc/disbatch/config.json";

/// Default file of the embedded store (`--embedded` without a value, `disbatch dev --db`).
pub const DEFAULT_EMBEDDED_PATH: &str = "./disbatch.db";

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

/// The flags choosing the config and the store, shared by `den` and `disbatch web`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct StoreArgs {
    /// The JSON config file (optional with --embedded: the defaults apply without one).
    #[arg(long, env = "DISBATCH_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Use the embedded store, a SQLite file (default ./disbatch.db), instead of MongoDB.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = DEFAULT_EMBEDDED_PATH)]
    pub embedded: Option<PathBuf>,
    /// Directory of plugin components, over the config's `plugin_dir`. Without a config
    /// file every `*.wasm` in it is an allowed plugin.
    #[arg(long, value_name = "DIR")]
    pub plugin_dir: Option<PathBuf>,
}

impl StoreArgs {
    /// The host files these flags name, which no plugin may be granted: the config file
    /// and the embedded database.
    pub fn host_files(&self) -> Vec<PathBuf> {
        let default = Path::new(DEFAULT_CONFIG_PATH);
        let mut files: Vec<PathBuf> = self
            .config_file(default)
            .into_iter()
            .chain(self.embedded.clone())
            .collect();
        // A Disbatch 4 config there (with its database passwords) is protected even when
        // another file is in use.
        if default.is_file() && !files.iter().any(|f| f == default) {
            files.push(default.to_owned());
        }
        files
    }

    /// The config file these flags give: `--config`, else `default` when there is no
    /// `--embedded` and `default` exists.
    fn config_file(&self, default: &Path) -> Option<PathBuf> {
        match &self.config {
            Some(path) => Some(path.clone()),
            None if self.embedded.is_none() && default.is_file() => Some(default.to_owned()),
            None => None,
        }
    }

    /// The config these flags give: the `--config` file (the environment overrides
    /// applied), or with `--embedded` and no file the defaults; then `--plugin-dir` over
    /// `plugin_dir`; without a config file the allowed plugins are the `*.wasm` files of
    /// the plugin directory ([`allow_plugins_in_dir`]).
    pub fn load_config(&self) -> Result<Config, StartError> {
        self.load_config_with(Path::new(DEFAULT_CONFIG_PATH))
    }

    /// [`StoreArgs::load_config`] with `default` as the default config file.
    fn load_config_with(&self, default: &Path) -> Result<Config, StartError> {
        let env = |k: &str| std::env::var(k).ok();
        let kind = if self.embedded.is_some() {
            StoreKind::Embedded
        } else {
            StoreKind::Mongo
        };
        let file = self.config_file(default);
        let mut config = match &file {
            Some(path) => Config::load_for(path, kind, &env)?,
            None if self.embedded.is_some() => Config::defaults(&env)?,
            None => {
                return Err(StartError::Usage(format!(
                    "no config file: give --config FILE (or set DISBATCH_CONFIG; {} is used when it \
                         exists), or use --embedded [FILE] to run on the embedded store without one",
                    default.display()
                )))
            }
        };
        if let Some(dir) = &self.plugin_dir {
            config.plugin_dir = dir.clone();
        }
        if file.is_none() {
            allow_plugins_in_dir(&mut config)?;
        }
        let mut own = self.host_files();
        own.extend(file);
        own.push(config.plugin_dir.clone());
        own.extend(config.cache_dir.clone().or_else(crate::runner::default_cache_dir));
        check_web_root(&mut config, &own)?;
        Ok(config)
    }
}

/// Refuses a `web_root` that holds one of the host's own files (`own`: the config file, the
/// embedded database, the plugin directory, the compiled-component cache), which the DCI
/// would otherwise serve to anyone.
fn check_web_root(config: &mut Config, own: &[PathBuf]) -> Result<(), StartError> {
    let Some(root) = config.web_root.as_deref() else {
        return Ok(());
    };
    let Ok(root) = std::fs::canonicalize(root) else {
        // A DEN-only host of a Disbatch 4 installation has no htdocs: nothing to serve.
        config.warnings.push(format!(
            "web_root {} does not exist; `disbatch web` serves no files from it",
            root.display()
        ));
        return Ok(());
    };
    for file in own {
        let inside = match std::fs::canonicalize(file) {
            // A directory of ours (the plugins, the cache) must not hold web_root either.
            Ok(real) => real.starts_with(&root) || (real.is_dir() && root.starts_with(&real)),
            // A file not created yet will be under its nearest existing ancestor.
            Err(_) => file
                .ancestors()
                .skip(1)
                .find_map(|a| std::fs::canonicalize(if a.as_os_str().is_empty() { Path::new(".") } else { a }).ok())
                .is_some_and(|a| a.starts_with(&root)),
        };
        if inside {
            return Err(StartError::Usage(format!(
                "web_root {} would serve {}, a file of this host's own; give web_root a directory of web documents only",
                root.display(),
                file.display()
            )));
        }
    }
    Ok(())
}

/// Sets `config.plugins` to the stem of every `*.wasm` file in `config.plugin_dir`, sorted.
/// Files whose stem is not a valid plugin name are left out with a warning in
/// `config.warnings`; a directory without components gets a warning too, and one that
/// cannot be read is an error naming it.
pub fn allow_plugins_in_dir(config: &mut Config) -> Result<(), StartError> {
    let dir = &config.plugin_dir;
    let entries = std::fs::read_dir(dir).map_err(|e| {
        StartError::Usage(format!(
            "cannot read the plugin directory {}: {e}; --plugin-dir DIR names the directory of plugin components",
            dir.display()
        ))
    })?;
    let mut plugins = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(|e| StartError::Usage(format!("cannot read the plugin directory {}: {e}", dir.display())))?
            .path();
        if path.extension().is_none_or(|e| e != "wasm") || !path.is_file() {
            continue;
        }
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            config
                .warnings
                .push(format!("{}: the file name is not UTF-8, not a plugin", path.display()));
            continue;
        };
        match check_plugin_name(stem) {
            Ok(()) => plugins.push(stem.to_owned()),
            Err(e) => config.warnings.push(format!("{}: {e}, not a plugin", path.display())),
        }
    }
    plugins.sort();
    if plugins.is_empty() {
        config
            .warnings
            .push(format!("no plugin components (*.wasm) in {}", dir.display()));
    }
    config.plugins = plugins;
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugins_are_the_components_of_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["b.wasm", "a.wasm", ".hidden.wasm", "notes.txt", "wasm"] {
            std::fs::write(dir.path().join(f), b"").unwrap();
        }
        std::fs::create_dir(dir.path().join("dir.wasm")).unwrap();
        let mut config = Config::defaults(&|_| None).unwrap();
        config.plugin_dir = dir.path().to_owned();
        allow_plugins_in_dir(&mut config).unwrap();
        assert_eq!(config.plugins, ["a", "b"]);
        assert!(
            config.warnings.iter().any(|w| w.contains(".hidden.wasm")),
            "{:?}",
            config.warnings
        );

        config.plugin_dir = dir.path().join("none");
        let e = allow_plugins_in_dir(&mut config).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(
            e.to_string().contains("none") && e.to_string().contains("--plugin-dir"),
            "{e}"
        );
    }

    #[test]
    fn a_config_file_is_needed_without_embedded() {
        let dir = tempfile::tempdir().unwrap();
        let default = dir.path().join("config.json");
        let e = StoreArgs::default().load_config_with(&default).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("--embedded"), "{e}");
        assert!(e.to_string().contains(&*default.to_string_lossy()), "{e}");
    }

    #[test]
    fn the_default_config_file_is_used_when_it_exists() {
        let dir = tempfile::tempdir().unwrap();
        let default = dir.path().join("config.json");
        std::fs::write(
            &default,
            "# as Disbatch 4 writes it\n{\"mongohost\": \"mongodb://db:27017\", \"database\": \"perl\",}\n",
        )
        .unwrap();
        let args = StoreArgs::default();
        let config = args.load_config_with(&default).unwrap();
        assert_eq!(config.database, "perl");
        assert_eq!(args.config_file(&default), Some(default.clone()));
        // With --embedded and no --config the defaults apply, not the file.
        let embedded = StoreArgs {
            embedded: Some(dir.path().join("d.db")),
            plugin_dir: Some(dir.path().to_owned()),
            ..StoreArgs::default()
        };
        assert_eq!(embedded.config_file(&default), None);
    }
}
