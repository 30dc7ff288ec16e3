//! `den`: the Disbatch Execution Node daemon.

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

fn main() {
    // Compiles a component and exits when started as a compile child.
    disbatch::runner::serve_compile_child();
    let code = den_main();
    // Exit at once after the drain: a plugin thread stuck in a host call must not keep the
    // process alive (the runtime's drop would wait for it).
    use std::io::Write as _;
    let _ = std::io::stderr().flush();
    std::process::exit(code);
}

fn den_main() -> i32 {
    let cli = Cli::parse();
    launch::init_tracing(matches!(cli.log_format, LogFormat::Json));
    let config = match cli.store.load_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("den: {e}");
            return e.exit_code().into();
        }
    };
    for w in &config.warnings {
        tracing::warn!("config: {w}");
    }
    let rt = match launch::runtime(config.max_instances) {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("{e}");
            return e.exit_code().into();
        }
    };
    let result = rt.block_on(run(&cli.store, config));
    // The runtime is deliberately not dropped: its drop waits for every blocking thread.
    std::mem::forget(rt);
    match result {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!("{e}");
            e.exit_code().into()
        }
    }
}

async fn run(args: &StoreArgs, config: Config) -> Result<(), StartError> {
    let store = launch::open_store(&config, args.embedded.as_deref(), "disbatchd").await?;
    tracing::info!(store = %store.description, node = %config.node, "store ready");
    let den = launch::den(&config, store.store, &args.host_files())?;
    let shutdown = CancellationToken::new();
    tokio::spawn(launch::signals(shutdown.clone()));
    launch::run_den(den, shutdown).await
}
