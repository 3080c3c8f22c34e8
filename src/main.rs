//! The `antler` binary: parse the command line, set up logging, call into the library.

use std::io::Write;
use std::process::ExitCode;

use antler::cli::{Cli, Command, DiscordCommand, SlackCommand, TelegramCommand};
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

async fn serve(config_path: &std::path::Path) -> anyhow::Result<()> {
    let config = Config::load(config_path)?;
    let listener = tokio::net::TcpListener::bind(config.server.listen)
        .await
        .map_err(|e| anyhow::anyhow!("server.listen: cannot bind {}: {e}", config.server.listen))?;
    antler::serve(config, listener, shutdown_signal()).await?;
    Ok(())
}

// `println!`/`eprintln!` panic when the stream is closed (`antler ... | head`, a dead `tee`);
// a line that cannot be written is lost instead.
fn say(text: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stdout().lock(), "{text}");
}

fn complain(text: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

/// Runs the command; `Ok` carries the exit code of a command that ends on its own terms.
async fn run(command: &Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve { config } => serve(config).await?,
        Command::CheckConfig { config: path } => match Config::load(path) {
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
                return Ok(ExitCode::from(64));
            }
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
            let mut out = std::io::stdout();
            if let Err(e) = antler::pairing::run(config, &action, &mut out).await {
                complain(format_args!(
                    "error: {}",
                    logging::sanitize_for_terminal(&e.to_string())
                ));
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::Healthcheck { url } => antler::chat::healthcheck(url).await?,
        Command::Doctor { config } => {
            if !antler::doctor::run(config).await {
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs an `antler telegram` command; its errors are printed here, with their exit code.
async fn telegram(command: &TelegramCommand) -> ExitCode {
    let mut out = std::io::stdout();
    let outcome = match command {
        TelegramCommand::SetWebhook {
            config,
            drop_pending_updates,
        } => antler::setup::set_webhook(config, *drop_pending_updates, &mut out).await,
        TelegramCommand::WebhookInfo { config } => {
            antler::setup::webhook_info(config, &mut out).await
        }
        TelegramCommand::SetCommands { config } => {
            antler::setup::set_commands(config, &mut out).await
        }
        TelegramCommand::DeleteWebhook {
            config,
            drop_pending_updates,
        } => antler::setup::delete_webhook(config, *drop_pending_updates, &mut out).await,
    };
    exit_code(outcome)
}

/// Runs an `antler slack` command.
fn slack(command: &SlackCommand) -> ExitCode {
    let mut out = std::io::stdout();
    exit_code(match command {
        SlackCommand::Manifest { config } => antler::setup::slack_manifest(config, &mut out),
    })
}

/// Runs an `antler discord` command.
async fn discord(command: &DiscordCommand) -> ExitCode {
    let mut out = std::io::stdout();
    exit_code(match command {
        DiscordCommand::RegisterCommands { config, guild } => {
            antler::setup::register_discord_commands(config, guild.as_deref(), &mut out).await
        }
    })
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
