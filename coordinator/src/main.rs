//! `runlease-coordinator`: reads its settings, starts tracing, runs the
//! coordinator until SIGINT or SIGTERM.

use std::process::ExitCode;

use clap::Parser;
use runlease_coordinator::config::{Cli, Command};
use tokio_util::sync::CancellationToken;

/// mimalloc instead of glibc's allocator: request handling allocates many
/// small, short-lived buffers across threads, where glibc spent a fifth of
/// the coordinator's CPU (docs/adr/011-allocator.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // Dropped last: spans still buffered for the OTLP collector are sent.
    let _telemetry = runlease_coordinator::init_tracing(cli.config.server.log_json);
    let result = match cli.command.unwrap_or(Command::Serve) {
        Command::Migrate => runlease_coordinator::migrate(&cli.config).await,
        Command::Serve => {
            let shutdown = CancellationToken::new();
            tokio::spawn(watch_signals(shutdown.clone()));
            let grace = cli.config.server.shutdown_grace;
            let run = runlease_coordinator::run(cli.config, shutdown.clone());
            tokio::pin!(run);
            tokio::select! {
                result = &mut run => result,
                () = async { shutdown.cancelled().await; tokio::time::sleep(grace).await } => {
                    tracing::error!(?grace, "in-flight requests did not finish within the shutdown grace; exiting");
                    return ExitCode::FAILURE;
                }
            }
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("runlease-coordinator: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn watch_signals(shutdown: CancellationToken) {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM");
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutdown signal received: draining");
    shutdown.cancel();
}
