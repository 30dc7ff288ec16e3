//! `den`: the Disbatch Execution Node daemon.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, ValueEnum};
use disbatch::config::Config;
use disbatch::den::{Den, DenSettings};
use disbatch::runner::{EngineOptions, Runner};
use disbatch::store::mongo::MongoStore;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Parser)]
#[command(
    name = "den",
    version,
    about = "Disbatch Execution Node: claims tasks from MongoDB queues and runs their plugins"
)]
struct Cli {
    /// The JSON config file.
    #[arg(long, env = "DISBATCH_CONFIG")]
    config: PathBuf,
    /// Log line format.
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,mongodb=warn".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(true).init(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    let config = match Config::load(&cli.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("den: {e}");
            return ExitCode::from(2);
        }
    };
    for w in &config.warnings {
        tracing::warn!("config: {w}");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(config.max_instances.max(1) as usize + 16)
        .build()
        .expect("tokio runtime");
    match runtime.block_on(run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::from(1)
        }
    }
}

async fn run(config: Config) -> anyhow::Result<()> {
    let store = MongoStore::connect(&config.mongohost, &config.database, config.mongo_options("disbatchd")).await?;
    let runner = Runner::new(&EngineOptions {
        cache_dir: config.cache_dir.clone().or_else(disbatch::runner::default_cache_dir),
        max_instances: config.max_instances,
    })?;
    let den = Den::new(Arc::new(store), runner, DenSettings::from_config(&config));
    let shutdown = CancellationToken::new();
    tokio::spawn(signals(shutdown.clone()));
    den.run(shutdown).await?;
    Ok(())
}

/// The first SIGINT/SIGTERM starts a graceful shutdown; a second one exits at once.
async fn signals(shutdown: CancellationToken) {
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
