//! `disbatch`: serve the DCI (`disbatch web`), run Disbatch on one machine (`disbatch dev`),
//! or operate queues and tasks through a DCI.

use std::process::ExitCode;

use clap::Parser;
use disbatch::cli::{self, Cli, Command};
use disbatch::config::DEFAULT_MAX_INSTANCES;
use disbatch::launch;
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    // Compiles a component and exits when started as a compile child.
    disbatch::runner::serve_compile_child();
    let cli = Cli::parse();
    let runtime = match launch::runtime(DEFAULT_MAX_INSTANCES) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("disbatch: {e}");
            return ExitCode::from(e.exit_code());
        }
    };
    let result = match &cli.command {
        Command::Web {
            embedded,
            plugin_dir,
            bind,
        } => {
            launch::init_tracing(false);
            let store = launch::StoreArgs {
                config: cli.config.clone(),
                embedded: embedded.clone(),
                plugin_dir: plugin_dir.clone(),
            };
            let shutdown = CancellationToken::new();
            runtime.spawn(launch::signals(shutdown.clone()));
            runtime.block_on(cli::web::serve(&store, bind.as_deref(), shutdown))
        }
        Command::Dev(args) => {
            launch::init_tracing(false);
            let shutdown = CancellationToken::new();
            runtime.spawn(launch::signals(shutdown.clone()));
            runtime.block_on(cli::dev::run(args, shutdown))
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
