//! `antler telegram …`, `antler slack manifest` and `antler discord register-commands`:
//! pointing a platform at antler and reading back what it was told.
//!
//! Each command loads the config, makes its Bot API calls through [`TelegramApi`] (whose errors
//! never hold the bot token) and writes a few `key: value` lines. Secrets are never printed:
//! the webhook secret is named by its config key, not shown.

use std::io::Write;
use std::path::{Path, PathBuf};

use antler_channel::ChannelError;
use antler_discord::{CommandSpec, DiscordApi, OptionSpec, Registration};
use antler_telegram::{ALLOWED_UPDATES, MenuCommand, TelegramApi, WebhookSettings, WebhookStatus};

use crate::config::{Config, ConfigError, TelegramMode, mask_url};
use crate::ingress::commands::COMMANDS;
use crate::logging::sanitize_for_terminal;

/// The path Telegram's updates are served at, under `server.public_url`.
pub const TELEGRAM_WEBHOOK_PATH: &str = "/webhooks/telegram";

/// The ports Telegram delivers webhooks to.
const TELEGRAM_PORTS: &[u16] = &[443, 80, 88, 8443];

/// Why a setup command did not finish.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The config file is invalid.
    #[error("{}: invalid\n{source}", path.display())]
    Config {
        /// The file.
        path: PathBuf,
        /// Its problems, each naming its key.
        source: ConfigError,
    },
    /// A key the command needs is missing or unusable.
    #[error("{key}: {problem}")]
    Key {
        /// The config key.
        key: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// A call to the platform's API failed.
    #[error("the platform's API call failed: {0}")]
    Api(#[from] ChannelError),
}

impl SetupError {
    /// The exit code: 64 (EX_USAGE) for configuration problems, as for any bad config; 1 for
    /// a failed call.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Config { .. } | Self::Key { .. } => 64,
            Self::Api(_) => 1,
        }
    }
}

/// The webhook URL antler serves Telegram at: `server.public_url` + `/webhooks/telegram`.
/// Telegram requires HTTPS on port 443, 80, 88 or 8443.
pub fn telegram_webhook_url(config: &Config) -> Result<String, SetupError> {
    const KEY: &str = "server.public_url";
    let Some(public) = &config.server.public_url else {
        return Err(SetupError::Key {
            key: KEY,
            problem: "not set; Telegram needs the public https:// URL antler is reached at"
                .to_owned(),
        });
    };
    let problem = |problem: String| SetupError::Key { key: KEY, problem };
    let parsed = reqwest::Url::parse(public).map_err(|e| problem(format!("not a URL: {e}")))?;
    if parsed.scheme() != "https" {
        return Err(problem(format!(
            "must be an https:// URL for Telegram webhooks, not {}",
            mask_url(public)
        )));
    }
    let port = parsed.port_or_known_default().unwrap_or(443);
    if !TELEGRAM_PORTS.contains(&port) {
        return Err(problem(format!(
            "port {port}: Telegram delivers webhooks only to ports 443, 80, 88 and 8443"
        )));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(problem(
            "must not have a query or fragment; it is a base URL".to_owned(),
        ));
    }
    Ok(format!(
        "{}{TELEGRAM_WEBHOOK_PATH}",
        public.trim_end_matches('/')
    ))
}

/// A Bot API client for the configured bot; the token must be set.
pub fn telegram_api(config: &Config) -> Result<TelegramApi, SetupError> {
    let telegram = &config.channels.telegram;
    let Some(token) = &telegram.bot_token else {
        return Err(SetupError::Key {
            key: "channels.telegram.bot_token",
            problem: "not set; it is the token @BotFather gave".to_owned(),
        });
    };
    Ok(TelegramApi::new(token.expose(), &telegram.api_url)?)
}

/// The command menu antler's chat commands make, the operator commands (`[[commands]]`) of
/// `config` after the built-in ones. Telegram's menu takes no `-` in a name: such a command
/// still runs when typed, it is only left out of the menu.
pub fn telegram_menu(config: &Config) -> Vec<MenuCommand> {
    let builtin = COMMANDS.iter().map(|command| MenuCommand {
        command: command.name.to_owned(),
        description: command.menu.to_owned(),
    });
    let operator = config
        .commands
        .iter()
        .filter(|command| !command.name.contains('-'))
        .map(|command| MenuCommand {
            command: command.name.clone(),
            description: command.description.clone(),
        });
    builtin.chain(operator).collect()
}

/// The path Discord's interactions are served at, under `server.public_url`: the
/// application's Interactions Endpoint URL.
pub const DISCORD_INTERACTIONS_PATH: &str = "/webhooks/discord/interactions";

/// The label of the message context-menu command.
pub const DISCORD_MESSAGE_COMMAND: &str = "Ask antler";

/// The application commands antler answers: `/ask prompt:…`, each chat command of the menu
/// (`/plan`, `/memory`, `/skills` and `/schedule` with their optional words as `args`,
/// `/approve` and `/deny` with theirs required), each operator command of `config` (one string
/// option per argument, in order), and the "Ask antler" message command.
pub fn discord_commands(config: &Config) -> Vec<CommandSpec> {
    let option = |name: &str, description: &str, required: bool| OptionSpec {
        name: name.to_owned(),
        description: description.to_owned(),
        kind: 3,
        required,
    };
    let mut commands = vec![CommandSpec {
        name: "ask".to_owned(),
        kind: 1,
        description: "Ask the assistant".to_owned(),
        options: vec![option("prompt", "What to ask", true)],
    }];
    commands.extend(COMMANDS.iter().map(|command| CommandSpec {
        name: command.name.to_owned(),
        kind: 1,
        description: command.menu.to_owned(),
        options: match command.name {
            "plan" => vec![option("args", "on or off (nothing: switch)", false)],
            "memory" => vec![option("args", "forget <n>, clear, clear confirm", false)],
            "skills" => vec![option(
                "args",
                "enable <name>, disable <name> (admins)",
                false,
            )],
            "schedule" => vec![option(
                "args",
                "add <name> \"<cron or every 15m>\" <prompt>, remove <name> (admins)",
                false,
            )],
            "approve" => vec![option("args", "the approval's id", true)],
            "deny" => vec![option(
                "args",
                "the approval's id, then why (optional)",
                true,
            )],
            _ => Vec::new(),
        },
    }));
    commands.extend(config.commands.iter().map(|command| {
        CommandSpec {
            name: command.name.clone(),
            kind: 1,
            description: command.description.clone(),
            options: command
                .args
                .iter()
                .map(|arg| {
                    let pattern: String = arg.pattern.chars().take(80).collect();
                    option(&arg.name, &format!("Matches {pattern}"), !arg.optional)
                })
                .collect(),
        }
    }));
    commands.push(CommandSpec {
        name: DISCORD_MESSAGE_COMMAND.to_owned(),
        kind: 3,
        description: String::new(),
        options: Vec::new(),
    });
    commands
}

/// `antler discord register-commands [--guild ID]`: registers [`discord_commands`] globally
/// or for one server, only when Discord's list differs (it is read first).
pub async fn register_discord_commands(
    config_path: &Path,
    guild: Option<&str>,
    out: &mut dyn Write,
) -> Result<(), SetupError> {
    let config = load(config_path)?;
    let discord = &config.channels.discord;
    let Some(application_id) = &discord.application_id else {
        return Err(SetupError::Key {
            key: "channels.discord.application_id",
            problem: "not set; it is the Application ID on the app's General Information page"
                .to_owned(),
        });
    };
    let Some(token) = &discord.bot_token else {
        return Err(SetupError::Key {
            key: "channels.discord.bot_token",
            problem: "not set; it is the token on the app's Bot page".to_owned(),
        });
    };
    if let Some(guild) = guild
        && (guild.is_empty() || !guild.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(SetupError::Key {
            key: "--guild",
            problem: "must be a server (guild) id: digits only".to_owned(),
        });
    }
    let api = DiscordApi::new(&discord.api_url, application_id, token.expose())?;
    let commands = discord_commands(&config);
    let outcome = api.register_commands(guild, &commands).await?;
    let scope = guild.map_or_else(|| "global".to_owned(), |guild| format!("guild {guild}"));
    let names: Vec<String> = commands
        .iter()
        .map(|c| {
            if c.kind == 1 {
                format!("/{}", c.name)
            } else {
                c.name.clone()
            }
        })
        .collect();
    let _ = writeln!(out, "scope: {scope}");
    let _ = writeln!(
        out,
        "commands: {} ({})",
        match outcome {
            Registration::Updated => "registered",
            Registration::Unchanged => "unchanged",
        },
        names.join(", ")
    );
    if let Some(public) = &config.server.public_url {
        let _ = writeln!(
            out,
            "interactions endpoint url: {}{DISCORD_INTERACTIONS_PATH}",
            mask_url(public.trim_end_matches('/'))
        );
    }
    Ok(())
}

/// `antler telegram set-webhook`: points Telegram at `server.public_url` +
/// `/webhooks/telegram` with the webhook secret and message updates only, then sets the
/// command menu when Telegram's differs.
pub async fn set_webhook(
    config_path: &Path,
    drop_pending_updates: bool,
    out: &mut dyn Write,
) -> Result<(), SetupError> {
    let config = load(config_path)?;
    let telegram = &config.channels.telegram;
    if !telegram.enabled {
        return Err(SetupError::Key {
            key: "channels.telegram.enabled",
            problem: "is false, so antler would not serve the webhook; enable Telegram first"
                .to_owned(),
        });
    }
    if telegram.mode == TelegramMode::Polling {
        return Err(SetupError::Key {
            key: "channels.telegram.mode",
            problem: "is \"polling\": a webhook would stop getUpdates; set it to \"webhook\" \
                      first"
                .to_owned(),
        });
    }
    let url = telegram_webhook_url(&config)?;
    let Some(secret) = &telegram.webhook_secret else {
        return Err(SetupError::Key {
            key: "channels.telegram.webhook_secret",
            problem: "not set; Telegram must send it with every update".to_owned(),
        });
    };
    let api = telegram_api(&config)?;
    api.set_webhook(&WebhookSettings {
        url: &url,
        secret_token: secret.expose(),
        drop_pending_updates,
    })
    .await?;
    // A closed stdout loses the report; the exit code still tells.
    let _ = writeln!(out, "webhook: {}", mask_url(&url));
    let _ = writeln!(out, "allowed updates: {}", ALLOWED_UPDATES.join(", "));
    let _ = writeln!(
        out,
        "secret token: channels.telegram.webhook_secret (not shown)"
    );
    if drop_pending_updates {
        let _ = writeln!(out, "pending updates: dropped");
    }
    report_menu(&api, &config, out).await
}

/// `antler telegram set-commands`: sets the bot's command menu when Telegram's differs, in
/// either mode (`serve` does the same at start).
pub async fn set_commands(config_path: &Path, out: &mut dyn Write) -> Result<(), SetupError> {
    let config = load(config_path)?;
    report_menu(&telegram_api(&config)?, &config, out).await
}

/// [`sync_telegram_menu`], saying which it was.
async fn report_menu(
    api: &TelegramApi,
    config: &Config,
    out: &mut dyn Write,
) -> Result<(), SetupError> {
    let menu = telegram_menu(config);
    let changed = sync_telegram_menu(api, &menu).await?;
    let names = menu
        .iter()
        .map(|c| format!("/{}", c.command))
        .collect::<Vec<_>>()
        .join(", ");
    let state = if changed { "set" } else { "unchanged" };
    let _ = writeln!(out, "commands: {state} ({names})");
    Ok(())
}

/// Sets antler's command menu when Telegram's differs; whether it did. Telegram's own menu is
/// the truth to compare with, not a copy in the store: BotFather or another deployment may
/// have changed it, and a running antler holds the store.
pub(crate) async fn sync_telegram_menu(
    api: &TelegramApi,
    menu: &[MenuCommand],
) -> Result<bool, SetupError> {
    if api.get_my_commands().await? == menu {
        return Ok(false);
    }
    api.set_my_commands(menu).await?;
    Ok(true)
}

/// `antler telegram webhook-info`: the webhook as Telegram reports it.
pub async fn webhook_info(config_path: &Path, out: &mut dyn Write) -> Result<(), SetupError> {
    let config = load(config_path)?;
    let status = telegram_api(&config)?.webhook_info().await?;
    let _ = write!(out, "{}", describe(&status));
    if config.channels.telegram.mode == TelegramMode::Polling {
        let _ = match status.url {
            Some(_) => writeln!(
                out,
                "mode: polling, which a webhook stops (`antler telegram delete-webhook` removes it)"
            ),
            None => writeln!(out, "mode: polling (no webhook expected)"),
        };
        return Ok(());
    }
    if let Ok(expected) = telegram_webhook_url(&config)
        && status.url.as_deref() != Some(expected.as_str())
    {
        let _ = writeln!(
            out,
            "expected url: {} (`antler telegram set-webhook` sets it)",
            mask_url(&expected)
        );
    }
    Ok(())
}

/// `antler telegram delete-webhook`: Telegram stops delivering to antler.
pub async fn delete_webhook(
    config_path: &Path,
    drop_pending_updates: bool,
    out: &mut dyn Write,
) -> Result<(), SetupError> {
    let config = load(config_path)?;
    telegram_api(&config)?
        .delete_webhook(drop_pending_updates)
        .await?;
    let _ = writeln!(out, "webhook: deleted");
    let _ = writeln!(
        out,
        "pending updates: {}",
        if drop_pending_updates {
            "dropped"
        } else {
            "kept (Telegram holds them for up to 24 hours)"
        }
    );
    Ok(())
}

/// `antler slack manifest`: the Slack app manifest for this antler (events and slash-command
/// URLs under `server.public_url`, or Socket Mode with `channels.slack.mode = "socket"`; the
/// bot events and scopes it needs), as JSON to paste into "Create New App → From an app
/// manifest".
pub fn slack_manifest(config_path: &Path, out: &mut dyn Write) -> Result<(), SetupError> {
    const KEY: &str = "server.public_url";
    let config = load(config_path)?;
    let slack = &config.channels.slack;
    if slack.mode == crate::config::SlackMode::Socket {
        // Socket Mode: Slack needs no URL of antler's.
        let manifest = antler_slack::manifest(None, &slack.command);
        let text = serde_json::to_string_pretty(&manifest).map_err(|e| SetupError::Key {
            key: KEY,
            problem: format!("cannot write the manifest: {e}"),
        })?;
        let _ = writeln!(out, "{text}");
        return Ok(());
    }
    let Some(public) = &config.server.public_url else {
        return Err(SetupError::Key {
            key: KEY,
            problem: "not set; Slack needs the public https:// URL antler is reached at".to_owned(),
        });
    };
    let parsed = reqwest::Url::parse(public).map_err(|e| SetupError::Key {
        key: KEY,
        problem: format!("not a URL: {e}"),
    })?;
    if parsed.scheme() != "https" {
        return Err(SetupError::Key {
            key: KEY,
            problem: format!(
                "must be an https:// URL for Slack's request URLs, not {}",
                mask_url(public)
            ),
        });
    }
    let manifest = antler_slack::manifest(Some(public.trim_end_matches('/')), &slack.command);
    let text = serde_json::to_string_pretty(&manifest).map_err(|e| SetupError::Key {
        key: KEY,
        problem: format!("cannot write the manifest: {e}"),
    })?;
    let _ = writeln!(out, "{text}");
    Ok(())
}

/// A Unix time as RFC 3339 UTC (the number itself if it is out of range).
pub(crate) fn unix_time(seconds: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(seconds)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| seconds.to_string())
}

/// The update types antler asks for that a webhook's `allowed_updates` leaves out (none when
/// it names none: Telegram's default sends them all but chat members and reactions).
pub(crate) fn missing_updates(allowed: Option<&[String]>) -> Vec<&'static str> {
    match allowed {
        Some(kinds) if !kinds.is_empty() => ALLOWED_UPDATES
            .iter()
            .copied()
            .filter(|kind| !kinds.iter().any(|k| k == kind))
            .collect(),
        _ => Vec::new(),
    }
}

/// The lines of `webhook-info`; Telegram's texts are made safe for a terminal.
fn describe(status: &WebhookStatus) -> String {
    let url = match &status.url {
        Some(url) => sanitize_for_terminal(&mask_url(url)),
        None => "none (no webhook is set)".to_owned(),
    };
    let last_error = match (&status.last_error_date, &status.last_error_message) {
        (None, None) => "none".to_owned(),
        (date, message) => format!(
            "{}: {}",
            date.map_or_else(|| "at an unknown time".to_owned(), unix_time),
            one_line(message.as_deref().unwrap_or("(no message)"))
        ),
    };
    let max_connections = status
        .max_connections
        .map_or_else(|| "default (40)".to_owned(), |n| n.to_string());
    let allowed_updates = match &status.allowed_updates {
        Some(kinds) if !kinds.is_empty() => {
            let missing = missing_updates(Some(kinds));
            let shown = sanitize_for_terminal(&kinds.join(", "));
            if missing.is_empty() {
                shown
            } else {
                format!(
                    "{shown} (missing {}: approval buttons do nothing)",
                    missing.join(", ")
                )
            }
        }
        _ => "Telegram's default (all but chat_member and reactions)".to_owned(),
    };
    format!(
        "url: {url}\npending updates: {}\nlast error: {last_error}\nmax connections: \
         {max_connections}\nallowed updates: {allowed_updates}\n",
        status.pending_update_count
    )
}

/// Telegram's text on one line, safe for a terminal.
pub(crate) fn one_line(text: &str) -> String {
    sanitize_for_terminal(&text.replace(['\n', '\r'], " "))
}

fn load(path: &Path) -> Result<Config, SetupError> {
    Config::load(path).map_err(|source| SetupError::Config {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discord_commands_follow_discords_rules() {
        let commands = discord_commands(&config(
            r#"
            [[commands]]
            name = "db-backup"
            description = "Back a database up"
            run = ["/opt/ops/backup.sh", "{db}", "{label}"]
            args = [ { name = "db", pattern = "[a-z]+" }, { name = "label", pattern = "[a-z]+", optional = true } ]
            "#,
        ));
        assert_eq!(commands[0].name, "ask");
        let backup = commands.iter().find(|c| c.name == "db-backup").unwrap();
        assert_eq!(
            backup
                .options
                .iter()
                .map(|o| (o.name.as_str(), o.required, o.kind))
                .collect::<Vec<_>>(),
            [("db", true, 3), ("label", false, 3)]
        );
        assert!(commands[0].options[0].required);
        assert_eq!(
            commands.last().map(|c| (c.name.as_str(), c.kind)),
            Some((DISCORD_MESSAGE_COMMAND, 3))
        );
        for command in &commands {
            assert!(
                (1..=32).contains(&command.name.chars().count()),
                "{command:?}"
            );
            if command.kind == 1 {
                assert!(
                    command.name.chars().all(|c| c.is_ascii_lowercase()
                        || c.is_ascii_digit()
                        || c == '-'
                        || c == '_'),
                    "{command:?}"
                );
                assert!((1..=100).contains(&command.description.chars().count()));
            } else {
                assert!(command.description.is_empty() && command.options.is_empty());
            }
        }
        let names: Vec<&str> = commands.iter().map(|c| c.name.as_str()).collect();
        for wanted in ["ask", "new", "status", "help", "stop"] {
            assert!(names.contains(&wanted), "{names:?}");
        }
    }

    fn config(server: &str) -> Config {
        Config::from_toml_str(server, &|_| None).unwrap()
    }

    #[test]
    fn the_webhook_url_needs_an_https_public_url_on_a_telegram_port() {
        let url = |public: &str| {
            telegram_webhook_url(&config(&format!("[server]\npublic_url = \"{public}\"\n")))
        };
        assert_eq!(
            url("https://bot.example.com/").unwrap(),
            "https://bot.example.com/webhooks/telegram"
        );
        assert_eq!(
            url("https://example.com:8443/antler").unwrap(),
            "https://example.com:8443/antler/webhooks/telegram"
        );
        for bad in ["http://bot.example.com", "https://bot.example.com:8080"] {
            let error = url(bad).unwrap_err();
            assert!(
                matches!(
                    error,
                    SetupError::Key {
                        key: "server.public_url",
                        ..
                    }
                ),
                "{bad}: {error}"
            );
            assert_eq!(error.exit_code(), 64);
        }
        let unset = telegram_webhook_url(&config("")).unwrap_err();
        assert!(
            unset.to_string().starts_with("server.public_url: not set"),
            "{unset}"
        );
    }

    #[test]
    fn webhook_info_reads_as_lines_and_neutralises_telegrams_text() {
        let status = WebhookStatus {
            url: Some("https://bot.example.com/webhooks/telegram".into()),
            pending_update_count: 3,
            last_error_date: Some(0),
            last_error_message: Some("502 Bad Gateway\u{1b}[2J\nforged".into()),
            max_connections: None,
            allowed_updates: Some(vec!["message".into()]),
        };
        let text = describe(&status);
        assert!(
            text.contains("url: https://bot.example.com/webhooks/telegram\n"),
            "{text}"
        );
        assert!(text.contains("pending updates: 3\n"), "{text}");
        assert!(
            text.contains("last error: 1970-01-01T00:00:00Z: 502 Bad Gateway"),
            "{text}"
        );
        assert!(
            !text.contains('\u{1b}') && !text.contains("\nforged"),
            "{text}"
        );
        assert!(text.contains("max connections: default (40)\n"), "{text}");
        assert!(
            text.contains(
                "allowed updates: message (missing callback_query: approval buttons do \
                 nothing)\n"
            ),
            "{text}"
        );
        let none = describe(&WebhookStatus {
            url: None,
            pending_update_count: 0,
            last_error_date: None,
            last_error_message: None,
            max_connections: Some(40),
            allowed_updates: None,
        });
        assert!(
            none.contains("url: none") && none.contains("last error: none"),
            "{none}"
        );
    }

    #[test]
    fn the_menu_is_antlers_commands() {
        let names: Vec<_> = telegram_menu(&Config::default())
            .into_iter()
            .map(|c| c.command)
            .collect();
        assert_eq!(
            names,
            [
                "help",
                "new",
                "status",
                "stop",
                "plan",
                "memory",
                "tasks",
                "skills",
                "schedules",
                "schedule",
                "approvals",
                "approve",
                "deny"
            ]
        );
        let with_commands = config(
            r#"
            [[commands]]
            name = "deploy"
            description = "Deploy a service"
            run = ["/opt/ops/deploy.sh"]
            [[commands]]
            name = "db-backup"
            description = "Back a database up"
            run = ["/opt/ops/backup.sh"]
            "#,
        );
        let menu = telegram_menu(&with_commands);
        let last = menu.last().unwrap();
        assert_eq!(
            (last.command.as_str(), last.description.as_str(), menu.len()),
            ("deploy", "Deploy a service", names.len() + 1),
            "a name with `-` is not allowed in Telegram's menu"
        );
    }
}
