//! `disbatch`: serve the DCI (`disbatch web`) or operate queues and tasks through it.

use std::process::ExitCode;

use clap::Parser;
use disbatch::cli::{self, Cli, Command};
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("disbatch: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = match &cli.command {
        Command::Web { config, bind } => {
            init_tracing();
            let shutdown = CancellationToken::new();
            runtime.spawn(signals(shutdown.clone()));
            runtime.block_on(cli::web::serve(config, bind.as_deref(), shutdown))
        }
        _ => runtime.block_on(cli::run(&cli)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("disbatch: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,mongodb=warn".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// SIGINT or SIGTERM stops the server gracefully.
async fn signals(shutdown: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! { _ = int.recv() => {}, _ = term.recv() => {} }
    tracing::info!("signal received: shutting down");
    shutdown.cancel();
}
