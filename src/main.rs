//! The `antler` binary: parse the command line, set up logging, call into the library.

use std::process::ExitCode;

use antler::cli::{Cli, Command, LogFormat};
use antler::config::Config;
use clap::Parser;
use tracing_subscriber::EnvFilter;

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}

async fn serve(config_path: &std::path::Path) -> anyhow::Result<()> {
    let config = Config::load(config_path)?;
    let listener = tokio::net::TcpListener::bind(config.server.listen)
        .await
        .map_err(|e| anyhow::anyhow!("server.listen: cannot bind {}: {e}", config.server.listen))?;
    antler::serve(config, listener, shutdown_signal()).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let result = match &cli.command {
        Command::Serve { config } => serve(config).await,
        Command::CheckConfig { config: path } => match Config::load(path) {
            Ok(config) => {
                println!("{}: valid\n{}", path.display(), config.summary());
                Ok(())
            }
            Err(e) => {
                eprintln!("{}: invalid\n{e}", path.display());
                // EX_USAGE, as for any other bad configuration.
                return ExitCode::from(64);
            }
        },
        Command::Chat {
            url,
            token,
            conversation,
            user,
        } => antler::chat::run(url, token.as_deref(), conversation, user)
            .await
            .map_err(anyhow::Error::from),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
