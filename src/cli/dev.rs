//! `disbatch dev`: Disbatch on one machine in one process — the embedded store (or
//! MongoDB with `--mongodb`), a `demo` queue for the example plugin, a DEN and the DCI
//! (REST API and web UI) — for a first run and for development.
//!
//! It prints where the web UI is, which store it uses and a command to try, then runs
//! until SIGINT/SIGTERM, which stops the web server and shuts the DEN down gracefully.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use bson::Document;
use tokio_util::sync::CancellationToken;

use super::CliError;
use crate::config::{check_database, check_mongohost, Config};
use crate::launch::{self, DEFAULT_EMBEDDED_PATH};
use crate::model::Sort;
use crate::store::{NewQueue, Store, StoreError};

/// Where `disbatch dev` looks for plugins without `--plugin-dir`, relative to the working
/// directory: the example plugins as the plugins workspace builds them.
pub const DEV_PLUGIN_DIR: &str = "plugins/target/wasm32-wasip2/release";
/// The command that builds the example plugins into [`DEV_PLUGIN_DIR`].
pub const BUILD_PLUGINS: &str = "cargo build --release --target wasm32-wasip2 --manifest-path plugins/Cargo.toml";
/// The queue (and plugin) `disbatch dev` makes sure exists.
pub const DEMO_QUEUE: &str = "demo";
/// `threads` of the queue `disbatch dev` creates.
pub const DEMO_THREADS: i64 = 4;
/// The MongoDB database of `disbatch dev --mongodb` without `--database`.
pub const DEV_DATABASE: &str = "disbatch";

/// The flags of `disbatch dev`.
#[derive(Debug, Clone, clap::Args)]
pub struct DevArgs {
    /// The embedded store's file.
    #[arg(long, value_name = "FILE", default_value = DEFAULT_EMBEDDED_PATH)]
    pub db: PathBuf,
    /// Address of the web UI and API (default 127.0.0.1:8080, env DISBATCH_BIND; port 0
    /// takes a free port).
    #[arg(long)]
    pub bind: Option<String>,
    /// Directory of plugin components; every `*.wasm` in it is allowed (default
    /// plugins/target/wasm32-wasip2/release).
    #[arg(long, value_name = "DIR")]
    pub plugin_dir: Option<PathBuf>,
    /// Use the MongoDB server at this URI instead of the embedded store.
    #[arg(long, value_name = "URI", conflicts_with = "db")]
    pub mongodb: Option<String>,
    /// The MongoDB database (with --mongodb; default disbatch).
    #[arg(long, value_name = "NAME", requires = "mongodb")]
    pub database: Option<String>,
}

/// Runs `disbatch dev` until `shutdown` is cancelled. The three lines it prints on stdout
/// once it serves:
///
/// ```text
/// disbatch dev: web UI and API at http://127.0.0.1:8080/
/// disbatch dev: store ./disbatch.db (embedded)
/// disbatch dev: try   disbatch --url http://127.0.0.1:8080 create-task demo message hello
/// ```
pub async fn run(args: &DevArgs, shutdown: CancellationToken) -> Result<(), CliError> {
    let config = config(args)?;
    for w in &config.warnings {
        tracing::warn!("config: {w}");
    }
    let embedded = args.mongodb.is_none().then_some(args.db.as_path());
    let store = launch::open_store(&config, embedded, "disbatchd").await?;
    let demo = ensure_demo_queue(&*store.store, &config.plugins).await?;
    let protected: Vec<_> = embedded.map(Path::to_owned).into_iter().collect();
    let den = launch::den(&config, store.store.clone(), &protected)?;
    let bind = args.bind.as_deref().unwrap_or(&config.bind);
    let (listener, addr) = launch::listen(bind).await?;
    let url = format!("http://{addr}");
    let try_line = if demo {
        format!("disbatch --url {url} create-task {DEMO_QUEUE} message hello")
    } else {
        format!(
            "disbatch --url {url} create-queue NAME PLUGIN   (plugins: {})",
            config.plugins.join(", ")
        )
    };
    println!("disbatch dev: web UI and API at {url}/");
    println!("disbatch dev: store {}", store.description);
    println!("disbatch dev: try   {try_line}");
    let _ = std::io::stdout().flush();
    tracing::info!(%addr, store = %store.description, node = %config.node, "serving the DCI and running a DEN");
    let state = launch::api_state(&config, &store, bind);
    let den = async {
        let r = launch::run_den(den, shutdown.clone()).await;
        shutdown.cancel();
        r
    };
    let web = async {
        let r = launch::serve_dci(listener, state, &config.http, shutdown.clone()).await;
        shutdown.cancel();
        r
    };
    let (den, web) = tokio::join!(den, web);
    web?;
    den?;
    Ok(())
}

/// The defaults (with the environment's overrides), the plugin directory of `args` with all
/// its components allowed, and MongoDB's URI and database with `--mongodb`.
fn config(args: &DevArgs) -> Result<Config, CliError> {
    let mut config = Config::defaults(&|k| std::env::var(k).ok()).map_err(|e| CliError::Usage(e.to_string()))?;
    config.plugin_dir = plugin_dir(args.plugin_dir.as_deref())?;
    launch::allow_plugins_in_dir(&mut config)?;
    if let Some(uri) = &args.mongodb {
        check_mongohost(uri).map_err(|e| CliError::Usage(format!("--mongodb {e}")))?;
        let database = args.database.as_deref().unwrap_or(DEV_DATABASE);
        check_database(database).map_err(|e| CliError::Usage(format!("--database {e}")))?;
        config.mongohost = uri.clone();
        config.database = database.to_owned();
    }
    Ok(config)
}

/// `--plugin-dir`, else [`DEV_PLUGIN_DIR`] when the example plugins are built there.
fn plugin_dir(flag: Option<&Path>) -> Result<PathBuf, CliError> {
    if let Some(dir) = flag {
        return Ok(dir.to_owned());
    }
    let dir = PathBuf::from(DEV_PLUGIN_DIR);
    if dir.join(format!("{DEMO_QUEUE}.wasm")).is_file() {
        return Ok(dir);
    }
    Err(CliError::Usage(format!(
        "the example plugins are not built: {DEV_PLUGIN_DIR}/{DEMO_QUEUE}.wasm does not exist here. Build them with \
         `{BUILD_PLUGINS}` (scripts/dev does it), or give a directory of plugin components with --plugin-dir DIR"
    )))
}

/// Creates the queue [`DEMO_QUEUE`] for the plugin of that name when the plugin is allowed
/// and no queue has that name. Returns whether the queue exists.
async fn ensure_demo_queue(store: &dyn Store, plugins: &[String]) -> Result<bool, CliError> {
    if !plugins.iter().any(|p| p == DEMO_QUEUE) {
        tracing::warn!("no {DEMO_QUEUE}.wasm among the plugins: no {DEMO_QUEUE} queue");
        return Ok(false);
    }
    let failed = |e: StoreError| CliError::Server(format!("cannot create the {DEMO_QUEUE} queue: {e}"));
    if store
        .queues()
        .await
        .map_err(failed)?
        .iter()
        .any(|q| q.name == DEMO_QUEUE)
    {
        return Ok(true);
    }
    let queue = NewQueue {
        name: DEMO_QUEUE.to_owned(),
        plugin: DEMO_QUEUE.to_owned(),
        threads: Some(DEMO_THREADS),
        sort: Sort::Fifo,
        extra: Document::new(),
    };
    match store.create_queue(queue).await {
        Ok(q) => {
            tracing::info!(queue = %q.name, id = %q.id, threads = DEMO_THREADS, "created the demo queue");
            Ok(true)
        }
        Err(StoreError::Duplicate { .. }) => Ok(true),
        Err(e) => Err(failed(e)),
    }
}
