//! The command line: `init`, `serve`, `check-config`, `chat`, `doctor`, `healthcheck`,
//! `telegram`, `slack`, `discord`, `pairing`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::logging::LogFormat;

/// antler: a chat-ops agent gateway.
#[derive(Debug, Parser)]
#[command(name = "antler", version, about)]
pub struct Cli {
    /// Log format (the level comes from RUST_LOG, default `info`).
    #[arg(long, value_enum, default_value_t = LogFormat::Human, global = true)]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Set antler up: ask for the model endpoint and the chat platforms (or take them from the
    /// flags), check them, and write `antler.toml` and `.env` (the tokens, mode 0600).
    Init(InitArgs),
    /// Run the gateway.
    Serve {
        /// The configuration file [default: ./config/antler.toml, else /etc/antler/antler.toml].
        #[arg(long, env = "ANTLER_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Validate the configuration and print a summary (secrets masked).
    CheckConfig {
        /// The configuration file [default: ./config/antler.toml, else /etc/antler/antler.toml].
        #[arg(long, env = "ANTLER_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Talk to a running antler through its HTTP API, with streamed answers.
    Chat {
        /// The antler base URL.
        #[arg(long, env = "ANTLER_URL", default_value = "http://127.0.0.1:8080")]
        url: String,
        /// The API bearer token (`channels.api.token`), if one is set.
        #[arg(long, env = "ANTLER_API_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// The conversation to talk in.
        #[arg(long, default_value = "terminal")]
        conversation: String,
        /// Who you speak as (an admin token or no token); a user's token always speaks as its
        /// user. Without it: the token's user, or `operator`.
        #[arg(long, env = "ANTLER_USER")]
        user: Option<String>,
    },
    /// Apply the store's pending schema migrations and exit (`serve` applies them at start
    /// too); a store written by a newer antler is refused.
    Migrate {
        /// The configuration file [default: ./config/antler.toml, else /etc/antler/antler.toml].
        #[arg(long, env = "ANTLER_CONFIG")]
        config: Option<PathBuf>,
    },
    /// The store itself: copying a deployment between backends.
    Store {
        /// What to do.
        #[command(subcommand)]
        command: StoreCommand,
    },
    /// Check the configuration, store, listen address, model endpoint and API access, and
    /// say how to fix what fails (exit 1 if anything does).
    Doctor {
        /// The configuration file [default: ./config/antler.toml, else /etc/antler/antler.toml].
        #[arg(long, env = "ANTLER_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Set up Telegram: the webhook and the command menu.
    Telegram {
        /// What to do.
        #[command(subcommand)]
        command: TelegramCommand,
    },
    /// Set up Slack: the app manifest.
    Slack {
        /// What to do.
        #[command(subcommand)]
        command: SlackCommand,
    },
    /// Set up Discord: the application commands.
    Discord {
        /// What to do.
        #[command(subcommand)]
        command: DiscordCommand,
    },
    /// DM pairing: list, approve or deny the codes unknown users got (through the running
    /// antler's API, or on the store when none runs).
    Pairing {
        /// What to do.
        #[command(subcommand)]
        command: PairingCommand,
    },
    /// Exit 0 when a running antler answers `GET /healthz` with 200 within 5 s, else 1 (for
    /// container health checks: no curl needed).
    Healthcheck {
        /// The antler base URL.
        #[arg(long, env = "ANTLER_URL", default_value = "http://127.0.0.1:8080")]
        url: String,
    },
}

/// `antler init …`
#[derive(Debug, Clone, clap::Args)]
pub struct InitArgs {
    /// Ask nothing: take everything from the flags (for scripts); `--model-url` and `--model`
    /// are required.
    #[arg(long, requires_all = ["model_url", "model"])]
    pub non_interactive: bool,
    /// The OpenAI-compatible endpoint, e.g. https://api.openai.com/v1 or
    /// http://127.0.0.1:11434/v1 (Ollama).
    #[arg(long)]
    pub model_url: Option<String>,
    /// The model to use, as the endpoint names it.
    #[arg(long)]
    pub model: Option<String>,
    /// The endpoint's API key (none for local servers).
    #[arg(long)]
    pub api_key: Option<String>,
    /// Serve Telegram with this bot token (from @BotFather).
    #[arg(long)]
    pub telegram_token: Option<String>,
    /// Serve Slack in Socket Mode with this bot token (xoxb-...).
    #[arg(long, requires = "slack_app_token")]
    pub slack_bot_token: Option<String>,
    /// The Slack app-level token (xapp-..., scope connections:write).
    #[arg(long, requires = "slack_bot_token")]
    pub slack_app_token: Option<String>,
    /// The public https:// URL antler is reached at: Telegram then uses a webhook instead of
    /// polling.
    #[arg(long)]
    pub public_url: Option<String>,
    /// Where to write antler.toml and .env.
    #[arg(long, default_value = "config")]
    pub dir: PathBuf,
    /// Overwrite existing files without asking.
    #[arg(long)]
    pub force: bool,
}

/// `antler pairing …`
#[derive(Debug, Subcommand)]
pub enum PairingCommand {
    /// Show the pending pairing requests: code, platform, user id, time left.
    List {
        /// The configuration file [default: ./config/antler.toml, else /etc/antler/antler.toml].
        #[arg(long, env = "ANTLER_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Let the user who got CODE talk to the bot, from now on.
    Approve {
        /// The pairing code the user was given.
        code: String,
        /// Make them an operator: their turns run as admin.
        #[arg(long)]
        admin: bool,
        /// The configuration file [default: ./config/antler.toml, else /etc/antler/antler.toml].
        #[arg(long, env = "ANTLER_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Refuse the request with CODE: the code stops working.
    Deny {
        /// The pairing code the user was given.
        code: String,
        /// The configuration file [default: ./config/antler.toml, else /etc/antler/antler.toml].
        #[arg(long, env = "ANTLER_CONFIG")]
        config: Option<PathBuf>,
    },
}

impl PairingCommand {
    /// The configuration file and what to do.
    pub fn action(&self) -> (&Option<PathBuf>, crate::pairing::PairingAction) {
        use crate::pairing::PairingAction;
        match self {
            Self::List { config } => (config, PairingAction::List),
            Self::Approve {
                code,
                admin,
                config,
            } => (
                config,
                PairingAction::Approve {
                    code: code.clone(),
                    admin: *admin,
                },
            ),
            Self::Deny { code, config } => (config, PairingAction::Deny { code: code.clone() }),
        }
    }
}

/// `antler discord …`
#[derive(Debug, Subcommand)]
pub enum DiscordCommand {
    /// Register `/ask`, the chat commands and the "Ask antler" message command, globally or
    /// for one server; nothing is written when Discord already has exactly these.
    RegisterCommands {
        /// The configuration file [default: ./config/antler.toml, else /etc/antler/antler.toml].
        #[arg(long, env = "ANTLER_CONFIG")]
        config: Option<PathBuf>,
        /// Register for this server (guild id) only: there they appear at once, while global
        /// commands may take a while to show.
        #[arg(long)]
        guild: Option<String>,
    },
}

/// `antler slack …`
#[derive(Debug, Subcommand)]
pub enum SlackCommand {
    /// Print the Slack app manifest (JSON) for `server.public_url`: paste it into
    /// api.slack.com/apps → Create New App → From an app manifest.
    Manifest {
        /// The configuration file [default: ./config/antler.toml, else /etc/antler/antler.toml].
        #[arg(long, env = "ANTLER_CONFIG")]
        config: Option<PathBuf>,
    },
}

/// `antler telegram …`
#[derive(Debug, Subcommand)]
pub enum TelegramCommand {
    /// Point Telegram at `server.public_url` + `/webhooks/telegram` with the webhook secret and
    /// message updates only, and set the bot's command menu if it differs.
    SetWebhook {
        /// The configuration file [default: ./config/antler.toml, else /etc/antler/antler.toml].
        #[arg(long, env = "ANTLER_CONFIG")]
        config: Option<PathBuf>,
        /// Drop the updates Telegram holds for delivery.
        #[arg(long)]
        drop_pending_updates: bool,
    },
    /// Show the webhook as Telegram reports it: URL, pending updates, last error.
    WebhookInfo {
        /// The configuration file [default: ./config/antler.toml, else /etc/antler/antler.toml].
        #[arg(long, env = "ANTLER_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Set the bot's command menu if Telegram's differs (webhook or polling mode; `serve`
    /// does it at start too).
    SetCommands {
        /// The configuration file [default: ./config/antler.toml, else /etc/antler/antler.toml].
        #[arg(long, env = "ANTLER_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Remove the webhook: Telegram stops delivering to antler.
    DeleteWebhook {
        /// The configuration file [default: ./config/antler.toml, else /etc/antler/antler.toml].
        #[arg(long, env = "ANTLER_CONFIG")]
        config: Option<PathBuf>,
        /// Drop the updates Telegram holds for delivery.
        #[arg(long)]
        drop_pending_updates: bool,
    },
}

/// `antler store ...`.
#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Copy everything in one store into another (sled <-> PostgreSQL), with antler stopped:
    /// conversations, threads, inbox, outbox, dedupe keys, memory, subagents, settings.
    Copy {
        /// The store to copy: `sled:PATH` or `postgres://USER@HOST/DB`.
        #[arg(long)]
        from: String,
        /// The store to copy into (its migrations applied first): `sled:PATH` or
        /// `postgres://USER@HOST/DB`.
        #[arg(long)]
        to: String,
        /// Copy even when the target holds conversations already (records with the same
        /// keys are replaced).
        #[arg(long)]
        force: bool,
    },
}
