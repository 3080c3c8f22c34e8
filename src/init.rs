//! `antler init`: a first configuration, asked for on the terminal or taken from flags.
//!
//! It gathers the model endpoint (probed the way `antler doctor` probes it: reachable, the key
//! accepted, the model listed) and the chat platforms to serve, then writes `DIR/antler.toml`
//! (tokens as `${VAR}` references, no secret in it) and `DIR/.env` (the values, mode 0600; the
//! config loader reads it, see [`crate::config::ENV_FILE`]), and runs `antler doctor` on the
//! result. Telegram polls unless a public URL is given (then a webhook); Slack uses Socket
//! Mode (an app-level token). An existing file is never overwritten without consent: asked
//! interactively, `--force` otherwise.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use crate::cli::InitArgs;
use crate::config::{Config, ConfigError, ENV_FILE};

/// The model endpoint offered when none is given: a local Ollama.
const DEFAULT_MODEL_URL: &str = "http://127.0.0.1:11434/v1";
/// The model offered when none is given.
const DEFAULT_MODEL: &str = "llama3.2";
/// The longest answer read from the terminal.
const MAX_ANSWER: u64 = 4096;

/// Why `antler init` stopped; nothing is written for any of these but [`InitError::Io`].
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// A file it would write exists, and overwriting it was not allowed.
    #[error("{} exists; pass --force to overwrite it", path.display())]
    Exists {
        /// The file.
        path: PathBuf,
    },
    /// An answer or flag is unusable.
    #[error("{0}")]
    Input(String),
    /// The model endpoint check failed (non-interactive), or the user gave up on it.
    #[error("the model endpoint check failed:\n{0}")]
    Model(String),
    /// The configuration built from the answers does not validate.
    #[error("the configuration would be invalid:\n{0}")]
    Config(#[source] ConfigError),
    /// The terminal closed before the questions were answered.
    #[error("stdin ended before setup was complete (use --non-interactive in scripts)")]
    StdinClosed,
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The reason.
        #[source]
        source: std::io::Error,
    },
}

impl InitError {
    /// The process exit code: 64 (EX_USAGE) for unusable input, 73 (EX_CANTCREAT) for a file
    /// it may not overwrite, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Input(_) | Self::Config(_) | Self::StdinClosed => 64,
            Self::Exists { .. } => 73,
            Self::Model(_) | Self::Io { .. } => 1,
        }
    }
}

/// What the configuration is made of.
#[derive(Debug, Default)]
struct Answers {
    model_url: String,
    model: String,
    api_key: Option<String>,
    telegram_token: Option<String>,
    /// The bot token and the app-level token.
    slack: Option<(String, String)>,
    public_url: Option<String>,
}

/// A written configuration.
#[derive(Debug)]
pub struct Written {
    /// The config file.
    pub config: PathBuf,
    /// Whether `antler doctor` found nothing to fix.
    pub doctor_passed: bool,
}

/// Runs `antler init`: asks (or reads the flags), checks, writes, runs the doctor and prints
/// the next steps.
pub async fn run(args: &InitArgs) -> Result<Written, InitError> {
    let mut out = std::io::stdout();
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let mut prompt = Prompt {
        input: &mut input,
        interactive: !args.non_interactive,
    };
    let (answers, config, vars) = loop {
        let answers = if args.non_interactive {
            from_flags(args)?
        } else {
            ask(args, &mut prompt)?
        };
        let (text, vars) = render(&answers);
        let config = Config::from_toml_str(&text, &|name| {
            std::env::var(name).ok().or_else(|| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.clone())
            })
        })
        .map_err(InitError::Config)?;
        let (passed, line) = crate::doctor::probe_model(&config).await;
        let _ = writeln!(out, "{line}");
        if passed {
            break (answers, text, vars);
        }
        if !prompt.interactive {
            return Err(InitError::Model(line));
        }
        if prompt.yes_no("Write the configuration anyway?", false)? {
            break (answers, text, vars);
        }
        let _ = writeln!(out, "Let's try the model settings again.");
    };

    let config_path = args.dir.join("antler.toml");
    let env_path = args.dir.join(ENV_FILE);
    for path in [&config_path, &env_path] {
        if path.exists() && !args.force {
            let question = format!("{} exists. Overwrite it?", path.display());
            if !prompt.interactive || !prompt.yes_no(&question, false)? {
                return Err(InitError::Exists { path: path.clone() });
            }
        }
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| InitError::Io { path, source }
    };
    std::fs::create_dir_all(&args.dir).map_err(io(&args.dir))?;
    write_env_file(&env_path, &vars).map_err(io(&env_path))?;
    std::fs::write(&config_path, config).map_err(io(&config_path))?;
    let _ = writeln!(
        out,
        "wrote {} and {} (the tokens, readable by you alone)\n",
        config_path.display(),
        env_path.display()
    );
    let _ = writeln!(out, "Checking it with `antler doctor`:");
    let doctor_passed = crate::doctor::run(&config_path).await;
    let _ = writeln!(out, "\nNext:");
    for step in next_steps(&answers, &config_path) {
        let _ = writeln!(out, "  - {step}");
    }
    Ok(Written {
        config: config_path,
        doctor_passed,
    })
}

/// The answers from the flags alone.
fn from_flags(args: &InitArgs) -> Result<Answers, InitError> {
    let required = |value: &Option<String>, flag: &str| {
        value
            .clone()
            .filter(|v| !v.trim().is_empty())
            .ok_or_else(|| InitError::Input(format!("--non-interactive needs {flag}")))
    };
    let answers = Answers {
        model_url: required(&args.model_url, "--model-url")?,
        model: required(&args.model, "--model")?,
        api_key: args.api_key.clone(),
        telegram_token: args.telegram_token.clone(),
        slack: args
            .slack_bot_token
            .clone()
            .zip(args.slack_app_token.clone()),
        public_url: args.public_url.clone(),
    };
    check_answers(answers)
}

/// Tokens go into `.env` between single quotes and URLs into TOML strings: neither may hold
/// what would break out of those.
fn check_answers(mut answers: Answers) -> Result<Answers, InitError> {
    let clean =
        |value: Option<String>| value.map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
    answers.api_key = clean(answers.api_key);
    answers.telegram_token = clean(answers.telegram_token);
    answers.public_url = clean(answers.public_url);
    answers.model_url = answers.model_url.trim().to_owned();
    answers.model = answers.model.trim().to_owned();
    let tokens = [
        ("the API key", answers.api_key.as_deref()),
        ("the Telegram token", answers.telegram_token.as_deref()),
        (
            "the Slack bot token",
            answers.slack.as_ref().map(|s| s.0.as_str()),
        ),
        (
            "the Slack app token",
            answers.slack.as_ref().map(|s| s.1.as_str()),
        ),
    ];
    for (what, token) in tokens {
        if let Some(token) = token
            && !token.bytes().all(|b| b.is_ascii_graphic() && b != b'\'')
        {
            return Err(InitError::Input(format!(
                "{what} may hold printable characters only (no spaces or quotes)"
            )));
        }
    }
    for (what, text) in [
        ("the model URL", Some(answers.model_url.as_str())),
        ("the model", Some(answers.model.as_str())),
        ("the public URL", answers.public_url.as_deref()),
    ] {
        if let Some(text) = text
            && (text.contains("${") || text.chars().any(char::is_control))
        {
            return Err(InitError::Input(format!(
                "{what} may not hold `${{` or control characters"
            )));
        }
    }
    Ok(answers)
}

/// Questions and answers on the terminal.
struct Prompt<'a> {
    input: &'a mut dyn BufRead,
    interactive: bool,
}

impl Prompt<'_> {
    /// Asks `question`; an empty answer takes `default`.
    fn ask(&mut self, question: &str, default: Option<&str>) -> Result<String, InitError> {
        self.read(question, default, default)
    }

    /// [`Prompt::ask`] for a secret: a default (from a flag) is not shown.
    fn ask_secret(&mut self, question: &str, default: Option<&str>) -> Result<String, InitError> {
        let shown = default.filter(|d| !d.is_empty()).map(|_| "the one given");
        self.read(question, default, shown)
    }

    fn read(
        &mut self,
        question: &str,
        default: Option<&str>,
        shown: Option<&str>,
    ) -> Result<String, InitError> {
        let mut err = std::io::stderr().lock();
        let _ = match shown {
            Some(shown) if !shown.is_empty() => write!(err, "{question} [{shown}]: "),
            _ => write!(err, "{question}: "),
        };
        let _ = err.flush();
        let mut line = String::new();
        let read = std::io::Read::take(&mut self.input, MAX_ANSWER)
            .read_line(&mut line)
            .map_err(|source| InitError::Io {
                path: PathBuf::from("stdin"),
                source,
            })?;
        if read == 0 {
            return Err(InitError::StdinClosed);
        }
        let answer = line.trim();
        Ok(if answer.is_empty() {
            default.unwrap_or_default().to_owned()
        } else {
            answer.to_owned()
        })
    }

    fn yes_no(&mut self, question: &str, default: bool) -> Result<bool, InitError> {
        let hint = if default { "Y/n" } else { "y/N" };
        loop {
            let answer = self.ask(&format!("{question} ({hint})"), None)?;
            match answer.to_ascii_lowercase().as_str() {
                "" => return Ok(default),
                "y" | "yes" => return Ok(true),
                "n" | "no" => return Ok(false),
                _ => {}
            }
        }
    }
}

/// The answers asked for on the terminal (the flags given are the defaults).
fn ask(args: &InitArgs, prompt: &mut Prompt<'_>) -> Result<Answers, InitError> {
    let mut err = std::io::stderr();
    let _ = writeln!(
        err,
        "antler setup: the model endpoint, then the chat platforms. Enter keeps [the default].\n\
         (Tokens are shown as you type them; they are written to {ENV_FILE}, mode 0600.)"
    );
    let model_url = prompt.ask(
        "OpenAI-compatible model endpoint (e.g. https://api.openai.com/v1)",
        Some(args.model_url.as_deref().unwrap_or(DEFAULT_MODEL_URL)),
    )?;
    let api_key = prompt.ask_secret(
        "API key (empty: none, as for local servers)",
        args.api_key.as_deref(),
    )?;
    let model = prompt.ask(
        "Model name",
        Some(args.model.as_deref().unwrap_or(DEFAULT_MODEL)),
    )?;
    let telegram_token = prompt.ask_secret(
        "Telegram bot token from @BotFather (empty: no Telegram)",
        args.telegram_token.as_deref(),
    )?;
    let slack_bot = prompt.ask_secret(
        "Slack bot token, xoxb-... (empty: no Slack)",
        args.slack_bot_token.as_deref(),
    )?;
    let slack = if slack_bot.is_empty() {
        None
    } else {
        let app = prompt.ask_secret(
            "Slack app-level token, xapp-... with connections:write (Socket Mode)",
            args.slack_app_token.as_deref(),
        )?;
        Some((slack_bot, app))
    };
    let public_url = prompt.ask(
        "Public https:// URL antler is reached at (empty: none; Telegram then polls)",
        args.public_url.as_deref(),
    )?;
    check_answers(Answers {
        model_url,
        model,
        api_key: Some(api_key),
        telegram_token: Some(telegram_token),
        slack,
        public_url: Some(public_url),
    })
}

/// A TOML basic string holding `text`.
fn quoted(text: &str) -> String {
    toml::Value::String(text.to_owned()).to_string()
}

/// The `.env` file's variables, in order: name and value.
type EnvVars = Vec<(&'static str, String)>;

/// The config text and the `.env` variables for `answers`.
fn render(answers: &Answers) -> (String, EnvVars) {
    let mut vars = Vec::new();
    let mut text = String::from(
        "# antler configuration, written by `antler init`. Every key, with its default and\n\
         # meaning, is documented in config/antler.example.toml of the source.\n\
         # The tokens are in .env beside this file: antler reads it at start, and a variable\n\
         # already set in the environment wins over it.\n\n\
         [server]\n\
         listen = \"${ANTLER_LISTEN:-127.0.0.1:8080}\"\n",
    );
    if let Some(url) = &answers.public_url {
        text.push_str(&format!("public_url = {}\n", quoted(url)));
    }
    text.push_str(&format!(
        "\n[store]\npath = \"${{ANTLER_DATA_DIR:-data}}\"\n\n\
         [model]\nbase_url = {}\nmodel = {}\n",
        quoted(&answers.model_url),
        quoted(&answers.model)
    ));
    if let Some(key) = &answers.api_key {
        text.push_str("api_key = \"${OPENAI_API_KEY}\"\n");
        vars.push(("OPENAI_API_KEY", key.clone()));
    }
    text.push_str(
        "\n[channels.api]\nenabled = true\n\
         # Required when `listen` is not a loopback address.\n\
         token = \"${ANTLER_API_TOKEN:-}\"\n",
    );
    if let Some(token) = &answers.telegram_token {
        text.push_str("\n[channels.telegram]\nenabled = true\n");
        if answers.public_url.is_some() {
            // Telegram's secret_token: 1-256 of A-Z, a-z, 0-9, _ and -.
            let secret = uuid::Uuid::new_v4().simple().to_string();
            text.push_str(
                "# `antler telegram set-webhook` points Telegram at server.public_url.\n\
                 mode = \"webhook\"\n\
                 webhook_secret = \"${ANTLER_TELEGRAM_WEBHOOK_SECRET}\"\n",
            );
            vars.push(("ANTLER_TELEGRAM_WEBHOOK_SECRET", secret));
        } else {
            text.push_str(
                "# No public URL: antler asks Telegram for updates.\nmode = \"polling\"\n",
            );
        }
        text.push_str(
            "bot_token = \"${ANTLER_TELEGRAM_BOT_TOKEN}\"\n\
             # A local Bot API server, if you run one.\n\
             api_url = \"${ANTLER_TELEGRAM_API_URL:-https://api.telegram.org}\"\n\
             # Who may talk to the bot (both empty: anyone who finds it):\n\
             # allowed_users = [\"123456789\"]\n\
             # admins = [\"123456789\"]\n",
        );
        vars.push(("ANTLER_TELEGRAM_BOT_TOKEN", token.clone()));
    }
    if let Some((bot, app)) = &answers.slack {
        text.push_str(
            "\n[channels.slack]\nenabled = true\n\
             # Socket Mode: antler opens the connection; no public URL needed.\n\
             mode = \"socket\"\n\
             bot_token = \"${ANTLER_SLACK_BOT_TOKEN}\"\n\
             app_token = \"${ANTLER_SLACK_APP_TOKEN}\"\n\
             api_url = \"${ANTLER_SLACK_API_URL:-https://slack.com/api}\"\n",
        );
        vars.push(("ANTLER_SLACK_BOT_TOKEN", bot.clone()));
        vars.push(("ANTLER_SLACK_APP_TOKEN", app.clone()));
    }
    (text, vars)
}

/// Writes the `.env` file, readable and writable by its owner alone (also when it existed).
fn write_env_file(path: &Path, vars: &[(&str, String)]) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let mut text = String::from(
        "# antler's secrets, written by `antler init`; keep this file to yourself (mode 0600).\n",
    );
    for (name, value) in vars {
        // check_answers made sure no value holds a quote or a line break.
        text.push_str(&format!("{name}='{value}'\n"));
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // `mode` applies to a new file only.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(text.as_bytes())?;
    file.sync_all()
}

/// What to do after `init`.
fn next_steps(answers: &Answers, config_path: &Path) -> Vec<String> {
    let default = Path::new(crate::config::DEFAULT_PATH);
    let flag = if config_path == default {
        String::new()
    } else {
        format!(" --config {}", config_path.display())
    };
    let mut steps = Vec::new();
    if answers.telegram_token.is_some() && answers.public_url.is_some() {
        steps.push(format!(
            "point Telegram at antler: antler telegram set-webhook{flag}"
        ));
    }
    steps.push(format!("start antler: antler serve{flag}"));
    steps.push("talk to it over HTTP: antler chat".to_owned());
    if answers.telegram_token.is_some() || answers.slack.is_some() {
        // With no allowlist, the platforms pair (`dm_policy` defaults to "pairing").
        steps.push(format!(
            "message the bot privately: it answers with a pairing code; let yourself in as its \
             operator with `antler pairing approve <code> --admin{flag}`"
        ));
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{SlackMode, TelegramMode};

    fn load(answers: &Answers) -> Config {
        let (text, vars) = render(answers);
        Config::from_toml_str(&text, &|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.clone())
        })
        .unwrap()
    }

    #[test]
    fn a_public_url_means_a_telegram_webhook_and_slack_uses_socket_mode() {
        let answers = Answers {
            model_url: "https://api.openai.com/v1".into(),
            model: "gpt-4o-mini".into(),
            api_key: Some("sk-test".into()),
            telegram_token: Some("7000000001:TEST-token".into()),
            slack: Some(("xoxb-1-2-abc".into(), "xapp-1-A1-2-abc".into())),
            public_url: Some("https://bot.example.com".into()),
        };
        let (text, vars) = render(&answers);
        for (_, secret) in &vars {
            assert!(!text.contains(secret.as_str()), "a secret in the config");
        }
        let config = load(&answers);
        let telegram = &config.channels.telegram;
        assert_eq!(telegram.mode, TelegramMode::Webhook);
        assert!(telegram.webhook_secret.is_some());
        assert_eq!(config.channels.slack.mode, SlackMode::Socket);
        assert_eq!(config.channels.enabled_platforms(), ["telegram", "slack"]);
        assert_eq!(
            config.server.public_url.as_deref(),
            Some("https://bot.example.com")
        );

        let polling = load(&Answers {
            public_url: None,
            slack: None,
            ..answers
        });
        assert_eq!(polling.channels.telegram.mode, TelegramMode::Polling);
        assert!(polling.channels.telegram.webhook_secret.is_none());
    }

    #[test]
    fn tokens_that_would_break_the_env_file_are_refused() {
        for token in ["a b", "it's", "line\nbreak", ""] {
            let answers = Answers {
                model_url: "http://127.0.0.1:11434/v1".into(),
                model: "m".into(),
                telegram_token: Some(format!("7000000001:{token}")),
                ..Answers::default()
            };
            let outcome = check_answers(answers);
            assert_eq!(outcome.is_err(), !token.is_empty(), "{token:?}");
        }
        let url = check_answers(Answers {
            model_url: "http://${HOME}/v1".into(),
            model: "m".into(),
            ..Answers::default()
        });
        assert!(matches!(url, Err(InitError::Input(_))));
    }
}
