//! The typed TOML configuration: `${ENV}` substitution, parsing and validation.
//!
//! Loading runs in four steps, and every failure names the dotted key it is about:
//! 1. the text is parsed as TOML ([`ConfigError::Syntax`] with line and column);
//! 2. every string value is expanded: `${VAR}` and `${VAR:-default}` (see [`Config::from_toml_str`]);
//! 3. the tree is deserialized into [`Config`]; unknown keys and wrong types are errors;
//! 4. [`Config::validate`] checks ranges and cross-field rules and collects every issue.
//!
//! Secrets are [`Secret`]s: they print as `***` and are never serialized. An empty secret (for
//! example `"${OPENAI_API_KEY:-}"` with the variable unset) counts as absent.

mod env;
mod secret;
mod validate;

#[cfg(test)]
mod tests;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::agent::middleware::dangling_tool_call::DanglingToolCallConfig;
use crate::agent::middleware::loop_detection::LoopDetectionConfig;
use crate::agent::middleware::title::TitleConfig;
use crate::agent::middleware::token_usage::TokenUsageConfig;

pub use secret::Secret;

/// Where `antler serve` and `antler check-config` look when `--config` is not given.
pub const DEFAULT_PATH: &str = "config/antler.toml";

/// The whole configuration file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `[server]`: the HTTP listener.
    pub server: ServerConfig,
    /// `[store]`: the embedded sled store.
    pub store: StoreConfig,
    /// `[model]`: the OpenAI-compatible model endpoint.
    pub model: ModelConfig,
    /// `[agent]`: the agent runtime and its middleware.
    pub agent: AgentConfig,
    /// `[delivery]`: the outbox delivery workers.
    pub delivery: DeliveryConfig,
    /// `[channels.*]`: the API channel and the chat platforms.
    pub channels: ChannelsConfig,
}

/// `[server]`
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// The address the HTTP server binds.
    pub listen: SocketAddr,
    /// The public base URL platforms reach the webhooks at (used by setup commands).
    #[serde(deserialize_with = "secret::opt_string")]
    pub public_url: Option<String>,
    /// The largest request body accepted, in bytes.
    pub body_limit_bytes: usize,
    /// How long a graceful shutdown waits for in-flight work.
    pub shutdown_grace_secs: u64,
    /// Open client connections at most; further clients wait in the listen backlog.
    pub max_connections: usize,
    /// A connection that has not sent a complete request head within this time is closed:
    /// slow clients and idle keep-alive connections alike.
    pub header_read_timeout_secs: u64,
    /// A request whose body has not arrived in full within this time is refused (408).
    pub body_read_timeout_secs: u64,
    /// Long-lived responses at once: SSE streams and `"wait": true` requests.
    pub max_streams: usize,
    /// Extra `Host` values the API accepts (loopback names, the listen address and the host
    /// of `public_url` always are); `"*"` accepts any.
    pub allowed_hosts: Vec<String>,
    /// Bearer token for `/metrics` and the detail of `/readyz` on the main listener.
    #[serde(deserialize_with = "secret::opt_secret")]
    pub metrics_token: Option<Secret>,
    /// A separate address for `/healthz`, `/readyz` and `/metrics`, served without a token
    /// (the Prometheus convention); the main listener then keeps only `/healthz`.
    pub ops_listen: Option<SocketAddr>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            public_url: None,
            body_limit_bytes: 1_048_576,
            shutdown_grace_secs: 10,
            max_connections: 512,
            header_read_timeout_secs: 10,
            body_read_timeout_secs: 30,
            max_streams: 256,
            allowed_hosts: Vec::new(),
            metrics_token: None,
            ops_listen: None,
        }
    }
}

/// `[store]`
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// The directory sled lives in.
    #[serde(deserialize_with = "secret::string")]
    pub path: PathBuf,
    /// How long a delivered platform event id is remembered for dedupe.
    pub dedupe_ttl_secs: u64,
    /// The memory sled may use for its page cache, in bytes.
    pub cache_capacity_bytes: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            path: PathBuf::from("data"),
            dedupe_ttl_secs: 86_400,
            cache_capacity_bytes: 32 * 1024 * 1024,
        }
    }
}

/// The system prompt used when `[model] system_prompt` is not set.
pub const DEFAULT_SYSTEM_PROMPT: &str =
    "You are antler, a helpful assistant answering in a chat. Be concise.";

/// `[model]`
#[derive(Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// The OpenAI-compatible API base URL (`.../v1`).
    #[serde(deserialize_with = "secret::string")]
    pub base_url: String,
    /// The bearer key; absent for local servers that need none.
    #[serde(deserialize_with = "secret::opt_secret")]
    pub api_key: Option<Secret>,
    /// The model name sent with every request.
    #[serde(deserialize_with = "secret::string")]
    pub model: String,
    /// The timeout of one model request.
    pub request_timeout_secs: u64,
    /// Retries of a failed model request (429, 5xx, connection errors).
    pub max_retries: u32,
    /// Whether answers are streamed.
    pub stream: bool,
    /// Sampling temperature, `0..=2`; the server's default when absent.
    pub temperature: Option<f32>,
    /// The completion token limit; the server's default when absent.
    pub max_tokens: Option<u32>,
    /// The system prompt at the start of every thread.
    #[serde(deserialize_with = "secret::string")]
    pub system_prompt: String,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            base_url: "https://api.openai.com/v1".to_owned(),
            api_key: None,
            model: "gpt-4o-mini".to_owned(),
            request_timeout_secs: 120,
            max_retries: 3,
            stream: true,
            temperature: None,
            max_tokens: None,
            system_prompt: DEFAULT_SYSTEM_PROMPT.to_owned(),
        }
    }
}

impl fmt::Debug for ModelConfig {
    /// Like the derived form, but a password in `base_url` is masked.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelConfig")
            .field("base_url", &validate::mask_url(&self.base_url))
            .field("api_key", &self.api_key)
            .field("model", &self.model)
            .field("request_timeout_secs", &self.request_timeout_secs)
            .field("max_retries", &self.max_retries)
            .field("stream", &self.stream)
            .field("temperature", &self.temperature)
            .field("max_tokens", &self.max_tokens)
            .field("system_prompt", &self.system_prompt)
            .finish()
    }
}

/// `[agent]`
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// Model calls per turn, `1..=200`.
    pub max_iterations: u32,
    /// Turns running at once across all conversations.
    pub max_concurrent_turns: usize,
    /// Turns waiting for a slot before new messages are refused.
    pub backlog: usize,
    /// The time limit of one turn.
    pub turn_timeout_secs: u64,
    /// How often a turn is attempted (after crashes or transient failures) before giving up.
    pub max_turn_attempts: u32,
    /// `[agent.middleware.*]`
    pub middleware: MiddlewareConfig,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            max_iterations: 25,
            max_concurrent_turns: 16,
            backlog: 10_000,
            turn_timeout_secs: 600,
            max_turn_attempts: 3,
            middleware: MiddlewareConfig::default(),
        }
    }
}

/// `[agent.middleware.*]`: one table per configurable middleware.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MiddlewareConfig {
    /// `[agent.middleware.dangling_tool_call]`
    pub(crate) dangling_tool_call: DanglingToolCallConfig,
    /// `[agent.middleware.token_usage]`
    pub(crate) token_usage: TokenUsageConfig,
    /// `[agent.middleware.title]`
    pub(crate) title: TitleConfig,
    /// `[agent.middleware.loop_detection]`
    pub(crate) loop_detection: LoopDetectionConfig,
}

impl MiddlewareConfig {
    /// The names of the enabled middleware, in chain order.
    pub fn enabled_names(&self) -> Vec<&'static str> {
        [
            ("dangling_tool_call", self.dangling_tool_call.enabled),
            ("token_usage", self.token_usage.enabled),
            ("title", self.title.enabled),
            ("loop_detection", self.loop_detection.enabled),
        ]
        .into_iter()
        .filter_map(|(name, enabled)| enabled.then_some(name))
        .collect()
    }
}

/// `[delivery]`
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeliveryConfig {
    /// Attempts to deliver one outbound message before it is dropped.
    pub max_attempts: u32,
    /// The first retry delay; it doubles per attempt.
    pub backoff_base_ms: u64,
    /// The largest retry delay.
    pub backoff_max_secs: u64,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        Self {
            max_attempts: 8,
            backoff_base_ms: 500,
            backoff_max_secs: 60,
        }
    }
}

/// `[channels]`
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChannelsConfig {
    /// `[channels.api]`
    pub api: ApiChannelConfig,
    /// `[channels.telegram]`
    pub telegram: TelegramConfig,
    /// `[channels.slack]`
    pub slack: SlackConfig,
    /// `[channels.discord]`
    pub discord: DiscordConfig,
    /// `[channels.feishu]`
    pub feishu: FeishuConfig,
}

impl ChannelsConfig {
    /// The names of the enabled chat platforms (the API channel is not a platform).
    pub fn enabled_platforms(&self) -> Vec<&'static str> {
        [
            ("telegram", self.telegram.enabled),
            ("slack", self.slack.enabled),
            ("discord", self.discord.enabled),
            ("feishu", self.feishu.enabled),
        ]
        .into_iter()
        .filter_map(|(name, enabled)| enabled.then_some(name))
        .collect()
    }
}

/// `[channels.api]`: the HTTP API channel (`/api/v1/...`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiChannelConfig {
    /// Whether the API routes are served.
    pub enabled: bool,
    /// An admin bearer token (reaches every conversation). A token is required unless the
    /// server listens on a loopback address.
    #[serde(deserialize_with = "secret::opt_secret")]
    pub token: Option<Secret>,
    /// `[[channels.api.tokens]]`: more tokens, each bound to one user and a role.
    pub tokens: Vec<ApiToken>,
}

impl Default for ApiChannelConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            token: None,
            tokens: Vec::new(),
        }
    }
}

/// One `[[channels.api.tokens]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiToken {
    /// The bearer token.
    pub token: Secret,
    /// The user every request with this token acts as.
    #[serde(deserialize_with = "secret::string")]
    pub user: String,
    /// `user` (its own conversations only) or `admin` (every conversation).
    #[serde(default)]
    pub role: ApiRole,
}

/// What an API token may reach.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApiRole {
    /// Its own conversations.
    #[default]
    User,
    /// Every conversation.
    Admin,
}

/// `[channels.telegram]`
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelegramConfig {
    /// Whether the platform is served.
    pub enabled: bool,
    /// The bot token from @BotFather.
    #[serde(deserialize_with = "secret::opt_secret")]
    pub bot_token: Option<Secret>,
    /// The `X-Telegram-Bot-Api-Secret-Token` the webhook must carry.
    #[serde(deserialize_with = "secret::opt_secret")]
    pub webhook_secret: Option<Secret>,
    /// The Bot API base URL.
    #[serde(deserialize_with = "secret::string")]
    pub api_url: String,
}

impl Default for TelegramConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            bot_token: None,
            webhook_secret: None,
            api_url: "https://api.telegram.org".to_owned(),
        }
    }
}

/// `[channels.slack]`
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SlackConfig {
    /// Whether the platform is served.
    pub enabled: bool,
    /// The bot token (`xoxb-...`).
    #[serde(deserialize_with = "secret::opt_secret")]
    pub bot_token: Option<Secret>,
    /// The signing secret that verifies request signatures.
    #[serde(deserialize_with = "secret::opt_secret")]
    pub signing_secret: Option<Secret>,
    /// The Web API base URL.
    #[serde(deserialize_with = "secret::string")]
    pub api_url: String,
}

impl Default for SlackConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            bot_token: None,
            signing_secret: None,
            api_url: "https://slack.com/api".to_owned(),
        }
    }
}

/// `[channels.discord]`
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiscordConfig {
    /// Whether the platform is served.
    pub enabled: bool,
    /// The application id.
    #[serde(deserialize_with = "secret::opt_string")]
    pub application_id: Option<String>,
    /// The application's Ed25519 public key, 64 hex characters.
    #[serde(deserialize_with = "secret::opt_string")]
    pub public_key: Option<String>,
    /// The bot token.
    #[serde(deserialize_with = "secret::opt_secret")]
    pub bot_token: Option<Secret>,
    /// The API base URL.
    #[serde(deserialize_with = "secret::string")]
    pub api_url: String,
}

impl Default for DiscordConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            application_id: None,
            public_key: None,
            bot_token: None,
            api_url: "https://discord.com".to_owned(),
        }
    }
}

/// `[channels.feishu]`
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FeishuConfig {
    /// Whether the platform is served.
    pub enabled: bool,
    /// The app id (`cli_...`).
    #[serde(deserialize_with = "secret::opt_string")]
    pub app_id: Option<String>,
    /// The app secret.
    #[serde(deserialize_with = "secret::opt_secret")]
    pub app_secret: Option<Secret>,
    /// The event subscription verification token.
    #[serde(deserialize_with = "secret::opt_secret")]
    pub verification_token: Option<Secret>,
    /// The event encryption key; events arrive in clear when absent.
    #[serde(deserialize_with = "secret::opt_secret")]
    pub encrypt_key: Option<Secret>,
    /// The Open Platform base URL (`https://open.larksuite.com` for Lark).
    #[serde(deserialize_with = "secret::string")]
    pub api_url: String,
}

impl Default for FeishuConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            app_id: None,
            app_secret: None,
            verification_token: None,
            encrypt_key: None,
            api_url: "https://open.feishu.cn".to_owned(),
        }
    }
}

/// One problem with the configuration, about one dotted key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigIssue {
    /// The dotted key path, e.g. `channels.slack.signing_secret`.
    pub key: String,
    /// What is wrong with it.
    pub problem: String,
}

impl ConfigIssue {
    pub(crate) fn new(key: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            problem: problem.into(),
        }
    }
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.problem)
    }
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The reason.
        #[source]
        source: std::io::Error,
    },
    /// The text is not valid TOML (the message carries line and column).
    #[error("{0}")]
    Syntax(String),
    /// The TOML is valid but its content is not; every issue is listed.
    #[error("{}", display_issues(.0))]
    Invalid(Vec<ConfigIssue>),
}

impl ConfigError {
    /// The issues of an [`ConfigError::Invalid`] error (empty for the other kinds).
    pub fn issues(&self) -> &[ConfigIssue] {
        match self {
            Self::Invalid(issues) => issues,
            Self::Io { .. } | Self::Syntax(_) => &[],
        }
    }
}

fn display_issues(issues: &[ConfigIssue]) -> String {
    issues
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

impl Config {
    /// Reads, expands (with the process environment), parses and validates a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml_str(&text, &|name| std::env::var(name).ok())
    }

    /// Parses and validates config text, looking environment variables up with `env`.
    ///
    /// Every string value may hold `${VAR}` or `${VAR:-default}`, any number of times and mixed
    /// with other text; the default applies when `VAR` is unset or empty, and an unset `VAR`
    /// without a default is an error naming the key. A value that is exactly one `${...}` and
    /// expands to a TOML integer, float or boolean takes that type, so numeric and boolean
    /// settings can come from the environment too.
    pub fn from_toml_str(
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let mut table: toml::Table =
            toml::from_str(text).map_err(|err| ConfigError::Syntax(err.to_string()))?;
        let issues = env::substitute(&mut table, env);
        if !issues.is_empty() {
            return Err(ConfigError::Invalid(issues));
        }
        let config: Self = serde_path_to_error::deserialize(toml::Value::Table(table))
            .map_err(|err| ConfigError::Invalid(vec![deserialize_issue(&err)]))?;
        config.validate()?;
        Ok(config)
    }

    /// Checks ranges and cross-field rules, reporting every issue at once.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let issues = validate::validate(self);
        if issues.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(issues))
        }
    }

    /// A short human summary (for `antler check-config`); secrets are never shown.
    pub fn summary(&self) -> String {
        let set = |present: bool| if present { "***" } else { "not set" };
        let server = &self.server;
        let model = &self.model;
        let api = &self.channels.api;
        let platforms = self.channels.enabled_platforms();
        let middleware = self.agent.middleware.enabled_names();
        let list = |names: &[&str]| {
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        };
        let mut lines = vec![format!("listen: {}", server.listen)];
        if let Some(url) = &server.public_url {
            lines.push(format!("public url: {}", validate::mask_url(url)));
        }
        lines.push(format!("store: {}", self.store.path.display()));
        lines.push(format!(
            "model: {} at {} (api key: {})",
            model.model,
            validate::mask_url(&model.base_url),
            set(model.api_key.is_some()),
        ));
        lines.push(format!(
            "api channel: {} (token: {})",
            if api.enabled { "enabled" } else { "disabled" },
            set(api.token.is_some()),
        ));
        lines.push(format!("platforms: {}", list(&platforms)));
        lines.push(format!("middleware: {}", list(&middleware)));
        lines.join("\n")
    }
}

/// Turns a deserialization error into an issue naming the full dotted key.
fn deserialize_issue(err: &serde_path_to_error::Error<toml::de::Error>) -> ConfigIssue {
    let path = err.path().to_string();
    let key = if path == "." {
        "<root>".to_owned()
    } else {
        path
    };
    let message = err.inner().message().trim();
    ConfigIssue::new(key, friendly_message(message))
}

/// Rewrites serde's unknown-field message into antler's wording; other messages pass through.
fn friendly_message(message: &str) -> String {
    let Some(rest) = message.strip_prefix("unknown field `") else {
        return message.to_owned();
    };
    let Some((_, expected)) = rest.split_once("`, ") else {
        return message.to_owned();
    };
    if expected == "there are no fields" {
        return "unknown key (this table takes no keys)".to_owned();
    }
    let names = expected
        .trim_start_matches("expected one of ")
        .trim_start_matches("expected ")
        .replace('`', "");
    format!("unknown key (expected one of: {names})")
}
