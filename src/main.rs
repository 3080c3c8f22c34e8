//! The `antler` binary: parse the command line, set up logging, call into the library.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use antler::cli::{Cli, Command, DiscordCommand, SlackCommand, StoreCommand, TelegramCommand};
use antler::config::Config;
use antler::logging;
use clap::Parser;

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

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

async fn serve(config_path: &Path) -> anyhow::Result<()> {
    let config = Config::load(config_path)?;
    apply_log_level(&config.server.log_level);
    let listener = tokio::net::TcpListener::bind(config.server.listen)
        .await
        .map_err(|e| anyhow::anyhow!("server.listen: cannot bind {}: {e}", config.server.listen))?;
    let (reloads, reloaded) = tokio::sync::mpsc::channel(4);
    tokio::spawn(reload_on_sighup(config_path.to_owned(), reloads));
    antler::serve_reloading(config, listener, shutdown_signal(), reloaded).await?;
    Ok(())
}

/// On each SIGHUP, reads the configuration again and hands it to the running antler, which
/// applies what can change safely. A configuration with errors changes nothing; its errors
/// are logged (keys and problems, never values).
async fn reload_on_sighup(path: std::path::PathBuf, reloads: tokio::sync::mpsc::Sender<Config>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut hangups) = signal(SignalKind::hangup()) else {
            return;
        };
        while hangups.recv().await.is_some() {
            match Config::load(&path) {
                Ok(config) => {
                    apply_log_level(&config.server.log_level);
                    if reloads.send(config).await.is_err() {
                        return;
                    }
                }
                Err(e) => tracing::warn!(
                    path = %path.display(),
                    error = %e,
                    "SIGHUP: the configuration has errors; nothing changed"
                ),
            }
        }
    }
    #[cfg(not(unix))]
    drop((path, reloads));
}

/// Applies `server.log_level` unless `RUST_LOG` chose the level.
fn apply_log_level(level: &str) {
    match logging::set_level(level) {
        Ok(true) => tracing::debug!(level, "log level applied"),
        Ok(false) => {}
        // Validated with the configuration already; kept working at the old level.
        Err(e) => tracing::warn!(error = %e, "server.log_level: not applied"),
    }
}

// `println!`/`eprintln!` panic when the stream is closed (`antler ... | head`, a dead `tee`);
// a line that cannot be written is lost instead.
fn say(text: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stdout().lock(), "{text}");
}

fn complain(text: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

/// The config file a command uses: the one named, else the first found; `Err` carries the exit
/// code after saying where it looked.
fn located(config: &Option<PathBuf>) -> Result<PathBuf, ExitCode> {
    antler::config::locate(config.as_deref()).map_err(|e| {
        complain(format_args!("error: {e}"));
        // EX_USAGE, as for any other bad configuration.
        ExitCode::from(64)
    })
}

/// Runs the command; `Ok` carries the exit code of a command that ends on its own terms.
async fn run(command: &Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Init(args) => return Ok(init(args).await),
        Command::Serve { config } => match located(config) {
            Ok(path) => serve(&path).await?,
            Err(code) => return Ok(code),
        },
        Command::CheckConfig { config } => match located(config) {
            Ok(path) => return Ok(check_config(&path).await),
            Err(code) => return Ok(code),
        },
        Command::Chat {
            url,
            token,
            conversation,
            user,
        } => antler::chat::run(url, token.as_deref(), conversation, user.as_deref()).await?,
        Command::Telegram { command } => return Ok(telegram(command).await),
        Command::Slack { command } => return Ok(slack(command)),
        Command::Discord { command } => return Ok(discord(command).await),
        Command::Pairing { command } => {
            let (config, action) = command.action();
            let config = match located(config) {
                Ok(path) => path,
                Err(code) => return Ok(code),
            };
            let mut out = std::io::stdout();
            if let Err(e) = antler::pairing::run(&config, &action, &mut out).await {
                complain(format_args!(
                    "error: {}",
                    logging::sanitize_for_terminal(&e.to_string())
                ));
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::Healthcheck { url } => antler::chat::healthcheck(url).await?,
        Command::Migrate { config } => {
            let path = match located(config) {
                Ok(path) => path,
                Err(code) => return Ok(code),
            };
            let config = Config::load(&path)?;
            let (at, from, to) = antler::migrate(&config).await?;
            if from == to {
                say(format_args!(
                    "store {at}: schema version {to}, nothing to apply"
                ));
            } else {
                say(format_args!(
                    "store {at}: schema version {from} -> {to}, applied"
                ));
            }
        }
        Command::Store {
            command: StoreCommand::Copy { from, to, force },
        } => {
            let report = antler::store_copy(from, to, *force).await?;
            say(format_args!("{report}"));
        }
        Command::Doctor { config } => {
            let path = match located(config) {
                Ok(path) => path,
                Err(code) => return Ok(code),
            };
            if !antler::doctor::run(&path).await {
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `antler check-config`: the summary and warnings, or every issue (exit 64).
async fn check_config(path: &Path) -> ExitCode {
    match Config::load(path) {
        Ok(config) => {
            say(format_args!(
                "{}: valid\n{}",
                path.display(),
                config.summary()
            ));
            match antler::doctor::shell_sandbox(&config).await {
                Some(Ok(sandbox)) => say(format_args!("shell sandbox: {sandbox}")),
                Some(Err(why)) => say(format_args!("warning: shell sandbox: {why}")),
                None => {}
            }
            for (problem, fix) in config.shell_warnings() {
                say(format_args!("warning: {problem}; fix: {fix}"));
            }
            let skills = antler::doctor::skills_report(&config).await;
            if skills.enabled {
                say(format_args!(
                    "skills: {} loaded{}{}",
                    skills.loaded.len(),
                    if skills.loaded.is_empty() { "" } else { ": " },
                    skills.loaded.join(", ")
                ));
            }
            // Never fatal: antler serves without a skill it cannot read.
            for invalid in &skills.invalid {
                say(format_args!("warning: skill left out: {invalid}"));
            }
        }
        Err(e) => {
            complain(format_args!("{}: invalid\n{e}", path.display()));
            // EX_USAGE, as for any other bad configuration.
            return ExitCode::from(64);
        }
    }
    ExitCode::SUCCESS
}

/// Runs `antler init`: 0 when the config is written and the doctor passes it, 1 when the
/// doctor found something to fix, the error's own code when nothing was written.
async fn init(args: &antler::cli::InitArgs) -> ExitCode {
    match antler::init::run(args).await {
        Ok(written) if written.doctor_passed => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            complain(format_args!(
                "error: {}",
                logging::sanitize_for_terminal(&e.to_string())
            ));
            ExitCode::from(e.exit_code())
        }
    }
}

/// Runs an `antler telegram` command; its errors are printed here, with their exit code.
async fn telegram(command: &TelegramCommand) -> ExitCode {
    let mut out = std::io::stdout();
    let (TelegramCommand::SetWebhook { config, .. }
    | TelegramCommand::WebhookInfo { config }
    | TelegramCommand::SetCommands { config }
    | TelegramCommand::DeleteWebhook { config, .. }) = command;
    let config = match located(config) {
        Ok(path) => path,
        Err(code) => return code,
    };
    let outcome = match command {
        TelegramCommand::SetWebhook {
            drop_pending_updates,
            ..
        } => antler::setup::set_webhook(&config, *drop_pending_updates, &mut out).await,
        TelegramCommand::WebhookInfo { .. } => antler::setup::webhook_info(&config, &mut out).await,
        TelegramCommand::SetCommands { .. } => antler::setup::set_commands(&config, &mut out).await,
        TelegramCommand::DeleteWebhook {
            drop_pending_updates,
            ..
        } => antler::setup::delete_webhook(&config, *drop_pending_updates, &mut out).await,
    };
    exit_code(outcome)
}

/// Runs an `antler slack` command.
fn slack(command: &SlackCommand) -> ExitCode {
    let mut out = std::io::stdout();
    let SlackCommand::Manifest { config } = command;
    match located(config) {
        Ok(config) => exit_code(antler::setup::slack_manifest(&config, &mut out)),
        Err(code) => code,
    }
}

/// Runs an `antler discord` command.
async fn discord(command: &DiscordCommand) -> ExitCode {
    let mut out = std::io::stdout();
    let DiscordCommand::RegisterCommands { config, guild } = command;
    match located(config) {
        Ok(config) => exit_code(
            antler::setup::register_discord_commands(&config, guild.as_deref(), &mut out).await,
        ),
        Err(code) => code,
    }
}

/// A setup command's exit code; its error is printed here.
fn exit_code(outcome: Result<(), antler::setup::SetupError>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            complain(format_args!(
                "error: {}",
                logging::sanitize_for_terminal(&e.to_string())
            ));
            ExitCode::from(e.exit_code())
        }
    }
}

fn main() -> ExitCode {
    // The sandbox's launcher confines itself per thread: it must run before anything starts one.
    if let Some(code) = antler::main_if_launcher() {
        return code;
    }
    // Other processes of the same user (a command of the shell among them) may not read this
    // one's memory, environment or open files through /proc, nor trace it.
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(async_main()),
        Err(e) => {
            complain(format_args!("error: cannot start the async runtime: {e}"));
            ExitCode::FAILURE
        }
    }
}

async fn async_main() -> ExitCode {
    let cli = Cli::parse();
    let logs = match logging::init(cli.log_format) {
        Ok(guard) => Some(guard),
        Err(e) => {
            // Running without logs beats not running.
            complain(format_args!("warning: logging is off: {e}"));
            None
        }
    };
    let outcome = run(&cli.command).await;
    // Dropping the guard writes the queued log lines (waiting a second at most), so the
    // error below comes after them.
    drop(logs);
    match outcome {
        Ok(code) => code,
        Err(e) => {
            // Printed once, here, and not logged: the same text twice on stderr helps nobody.
            let error: &(dyn std::error::Error + 'static) = e.as_ref();
            let message = logging::error_message(error);
            complain(format_args!(
                "error: {}",
                logging::sanitize_for_terminal(&message)
            ));
            ExitCode::FAILURE
        }
    }
}
