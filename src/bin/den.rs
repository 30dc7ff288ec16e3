//! `den`: the Disbatch Execution Node daemon.

use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use disbatch::config::Config;
use disbatch::launch::{self, StartError, StoreArgs};
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
    about = "Disbatch Execution Node: claims tasks from the queues of MongoDB or of an embedded SQLite file and \
             runs their plugins"
)]
struct Cli {
    #[command(flatten)]
    store: StoreArgs,
    /// Log line format.
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    launch::init_tracing(matches!(cli.log_format, LogFormat::Json));
    let config = match cli.store.load_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("den: {e}");
            return ExitCode::from(e.exit_code());
        }
    };
    for w in &config.warnings {
        tracing::warn!("config: {w}");
    }
    let result = launch::runtime(config.max_instances).and_then(|rt| rt.block_on(run(&cli.store, config)));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::from(e.exit_code())
        }
    }
}

async fn run(args: &StoreArgs, config: Config) -> Result<(), StartError> {
    let store = launch::open_store(&config, args.embedded.as_deref(), "disbatchd").await?;
    tracing::info!(store = %store.description, node = %config.node, "store ready");
    let den = launch::den(&config, store.store)?;
    let shutdown = CancellationToken::new();
    tokio::spawn(launch::signals(shutdown.clone()));
    launch::run_den(den, shutdown).await
}
