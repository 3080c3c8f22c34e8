//! `antler doctor`: checks what a deployment needs, one line each, with the fix for what fails.
//!
//! The configuration, the store, the listen address, the model endpoint and the API's access
//! rules; each enabled platform's credentials (Telegram: the token through `getMe`, and the
//! webhook Telegram delivers to; Slack: the token through `auth.test`, and in Socket Mode the
//! app token through `apps.connections.open` (without connecting); Discord: the bot token
//! through `GET /users/@me`; Feishu: a tenant token and the bot's info); the skills found and
//! those left out (with the file and the reason). Nothing is changed,
//! except that a store is opened the way `antler serve` would open it (an older layout is
//! migrated); a store another antler holds is reported, not touched.

use crate::store::{MaintenanceStore, PgStore, SledStore, StoreError};
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use crate::agent::model::{ModelError, OpenAiClient, OpenAiConfig};
use crate::agent::skills;
use crate::agent::tools::mcp::McpServers;
use antler_channel::ChannelError;

use crate::config::{Config, FeishuMode, StoreBackend, TelegramMode, mask_url};
use crate::setup;

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Ok,
    /// Worth knowing, not broken.
    Note,
    /// Probably wrong, with a fix, but antler can serve.
    Warn,
    Fail,
}

/// One line of the report.
#[derive(Debug)]
struct Finding {
    verdict: Verdict,
    what: &'static str,
    detail: String,
    fix: Option<String>,
}

impl Finding {
    fn ok(what: &'static str, detail: impl Into<String>) -> Self {
        Self {
            verdict: Verdict::Ok,
            what,
            detail: detail.into(),
            fix: None,
        }
    }

    fn note(what: &'static str, detail: impl Into<String>) -> Self {
        Self {
            verdict: Verdict::Note,
            what,
            detail: detail.into(),
            fix: None,
        }
    }

    fn warn(what: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            verdict: Verdict::Warn,
            what,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    fn fail(what: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            verdict: Verdict::Fail,
            what,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    fn line(&self) -> String {
        let label = match self.verdict {
            Verdict::Ok => "ok  ",
            Verdict::Note => "note",
            Verdict::Warn => "warn",
            Verdict::Fail => "FAIL",
        };
        let mut line = format!("{label}  {:<8} {}", self.what, self.detail);
        if let Some(fix) = &self.fix {
            line.push_str(&format!("\n                fix: {fix}"));
        }
        line
    }
}

/// Runs every check and prints the report; returns whether nothing failed.
pub async fn run(config_path: &Path) -> bool {
    let findings = check(config_path).await;
    let mut out = std::io::stdout().lock();
    for finding in &findings {
        // A closed stdout loses the report; the exit code still tells.
        let _ = writeln!(out, "{}", finding.line());
    }
    let failed = findings
        .iter()
        .filter(|f| f.verdict == Verdict::Fail)
        .count();
    let _ = if failed == 0 {
        writeln!(out, "\nantler is ready to serve.")
    } else {
        writeln!(
            out,
            "\n{failed} problem(s) to fix before antler can serve well."
        )
    };
    failed == 0
}

async fn check(config_path: &Path) -> Vec<Finding> {
    let config = match Config::load(config_path) {
        Ok(config) => config,
        Err(e) => {
            return vec![Finding::fail(
                "config",
                format!("{} is invalid:\n{e}", config_path.display()),
                format!(
                    "correct the keys above (`antler check-config --config {}` repeats them)",
                    config_path.display()
                ),
            )];
        }
    };
    let mut findings = vec![Finding::ok(
        "config",
        format!("{} is valid", config_path.display()),
    )];
    findings.push(check_store(&config).await);
    findings.push(check_listen(&config).await);
    findings.push(check_model(&config).await);
    findings.push(check_api(&config));
    findings.push(check_traces(&config.telemetry));
    if config.channels.telegram.enabled {
        findings.extend(check_telegram(&config).await);
    }
    if config.channels.slack.enabled {
        findings.push(check_slack(&config).await);
        if config.channels.slack.mode == crate::config::SlackMode::Socket {
            findings.push(check_slack_socket(&config).await);
        }
    }
    if config.channels.discord.enabled {
        findings.push(check_discord(&config).await);
    }
    if config.channels.feishu.enabled {
        findings.push(check_feishu(&config).await);
    }
    findings.extend(check_mcp(&config).await);
    findings.extend(check_shell(&config).await);
    findings.extend(check_skills(&config).await);
    let platforms = config.channels.enabled_platforms();
    findings.push(if platforms.is_empty() {
        Finding::note(
            "channels",
            "no chat platform is enabled; the HTTP API is the way in",
        )
    } else {
        Finding::ok("channels", format!("enabled: {}", platforms.join(", ")))
    });
    findings
}

/// Where the shell's sandbox can be probed: the store's folder when it exists (so the probe
/// also proves the sandbox's user can reach it), else a fresh temporary folder.
async fn probe_root(config: &Config) -> (std::path::PathBuf, bool) {
    if tokio::fs::metadata(&config.store.path)
        .await
        .is_ok_and(|m| m.is_dir())
    {
        return (config.store.path.clone(), false);
    }
    let dir = std::env::temp_dir().join(format!("antler-probe-{}", std::process::id()));
    let _ = tokio::fs::create_dir_all(&dir).await;
    use std::os::unix::fs::PermissionsExt as _;
    let _ = tokio::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).await;
    (dir, true)
}

/// The shell's sandbox as `serve` would find it, one line: the backend in effect (proven by a
/// probe run inside it) or why the shell would not be offered; `None` when the shell is off.
pub async fn shell_sandbox(config: &Config) -> Option<Result<String, String>> {
    let bash = &config.agent.tools.bash;
    if !bash.enabled {
        return None;
    }
    let (root, temporary) = probe_root(config).await;
    // A socket of its own: the store may be a running antler's, whose proxy socket stays.
    let socket = root.join(format!("egress-probe-{}.sock", std::process::id()));
    let egress = crate::app::shell_egress(config, socket).await;
    let endpoints = egress
        .as_ref()
        .map(crate::agent::tools::egress::Egress::endpoints);
    let found = crate::sandbox::detect(
        bash.sandbox,
        bash.network,
        bash.limits,
        &root,
        endpoints.as_ref(),
    )
    .await;
    drop(egress);
    if temporary {
        let _ = tokio::fs::remove_dir_all(&root).await;
    }
    Some(match found.sandbox {
        Some(_) => Ok(found.describe()),
        None => Err(found.describe()),
    })
}

/// The shell: its sandbox, and the warnings its config deserves.
async fn check_shell(config: &Config) -> Vec<Finding> {
    let mut findings = Vec::new();
    match shell_sandbox(config).await {
        None => findings.push(Finding::note(
            "shell",
            "disabled (agent.tools.bash.enabled = false)",
        )),
        Some(Ok(described)) if described.starts_with("none") => findings.push(Finding::warn(
            "shell",
            described,
            "set agent.tools.bash.sandbox = \"auto\" to confine commands",
        )),
        Some(Ok(described)) => findings.push(Finding::ok("shell", format!("sandbox {described}"))),
        Some(Err(why)) => findings.push(Finding::warn(
            "shell",
            why,
            "see docs/deploy.md for what each deployment needs",
        )),
    }
    for (problem, fix) in config.shell_warnings() {
        findings.push(Finding::warn("shell", problem, fix));
    }
    findings
}

/// Each enabled MCP server: started (or reached) and its tools listed, as `serve` does; a
/// server that fails is a warning, since antler serves without it.
async fn check_mcp(config: &Config) -> Vec<Finding> {
    if !config.mcp.servers.iter().any(|server| server.enabled) {
        return Vec::new();
    }
    let servers = McpServers::connect(&config.mcp.servers).await;
    let findings = servers
        .status()
        .into_iter()
        .map(|server| match server.error {
            None => Finding::ok(
                "mcp",
                format!(
                    "{} ({}): {} tools",
                    server.name, server.transport, server.tools
                ),
            ),
            Some(error) => Finding::warn(
                "mcp",
                format!("{} ({}): {error}", server.name, server.transport),
                format!(
                    "check the [[mcp.servers]] entry named {:?}; antler serves without its tools",
                    server.name
                ),
            ),
        })
        .collect();
    servers.shutdown().await;
    findings
}

async fn check_store(config: &Config) -> Finding {
    if config.store.backend == StoreBackend::Postgres {
        return check_database(config).await;
    }
    let path = config.store.path.clone();
    if !path.exists() {
        return match creatable_parent(&path) {
            Ok(parent) => Finding::note(
                "store",
                format!(
                    "{} does not exist yet; `antler serve` creates it in {}",
                    path.display(),
                    parent.display()
                ),
            ),
            Err(why) => Finding::fail(
                "store",
                format!(
                    "{} does not exist and cannot be created as uid {}: {why}",
                    path.display(),
                    rustix::process::geteuid().as_raw()
                ),
                "create it writable by that user (or make its parent so), or set store.path \
                 (ANTLER_DATA_DIR)",
            ),
        };
    }
    let cache = config.store.cache_capacity_bytes;
    let opened = tokio::task::spawn_blocking(move || SledStore::open(&path, cache)).await;
    let path = config.store.path.display();
    match opened {
        Ok(Ok(store)) => match store.stats().await {
            Ok(stats) => Finding::ok(
                "store",
                format!(
                    "{path}: {} KiB on disk, {} message(s) waiting, {} repl(ies) to deliver",
                    stats.disk_bytes / 1024,
                    stats.inbox,
                    stats.outbox_pending
                ),
            ),
            Err(e) => Finding::fail("store", format!("{path}: {e}"), "see the error above"),
        },
        Ok(Err(StoreError::InUse { .. })) => Finding::note(
            "store",
            format!("{path} is in use by a running antler (fine if that is this deployment)"),
        ),
        Ok(Err(e @ StoreError::NewerSchema { .. })) => Finding::fail(
            "store",
            e.to_string(),
            "run the antler version that wrote it, or point store.path elsewhere",
        ),
        Ok(Err(e)) => Finding::fail(
            "store",
            format!("{path}: {e}"),
            format!("make {path} writable by this user, or set store.path (ANTLER_DATA_DIR)"),
        ),
        Err(e) => Finding::fail("store", e.to_string(), "report this as a bug"),
    }
}

/// The PostgreSQL store: reachable with these credentials, its schema beside this build's,
/// and who holds the store's lease. Reads only: `serve` and `antler migrate` apply the schema.
async fn check_database(config: &Config) -> Finding {
    let options = match crate::app::store_backend::pg_options(&config.store) {
        Ok(options) => options,
        Err(e) => return Finding::fail("store", e.to_string(), "set store.url (DATABASE_URL)"),
    };
    let at = crate::store::mask_pg_url(&options.url);
    match PgStore::inspect(&options).await {
        Ok(found) if found.schema > found.supported => Finding::fail(
            "store",
            format!(
                "{at}: schema version {}, but this antler supports at most {}",
                found.schema, found.supported
            ),
            "run the antler version that wrote it (or a newer one)",
        ),
        Ok(found) => {
            let schema = if found.schema == found.supported {
                format!("schema version {}", found.schema)
            } else {
                format!(
                    "schema version {} (`antler migrate` or `serve` applies {})",
                    found.schema, found.supported
                )
            };
            let lease = match found.lease {
                Some(lease) if !lease.released && lease.until_ms > crate::now_ms() => {
                    format!("; the store's lease is held by {}", lease.owner)
                }
                Some(lease) => format!("; the last owner was {}", lease.owner),
                None => String::new(),
            };
            let replicas = match found.replicas.len() {
                0 => String::new(),
                n => format!(
                    "; {n} replica(s) alive: {}",
                    found
                        .replicas
                        .iter()
                        .map(|(owner, left)| format!("{owner} ({} s left)", left / 1000))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            let summary = format!("{at}: {schema}{lease}{replicas}");
            match shared_folder(config, found.folder.as_deref()) {
                Ok(folder) => Finding::ok("store", format!("{summary}{folder}")),
                Err(why) => Finding::fail(
                    "store",
                    format!("{summary}; {why}"),
                    "every replica must see one store.path (a shared volume, ReadWriteMany on Kubernetes)",
                ),
            }
        }
        Err(e) => Finding::fail(
            "store",
            format!("{at}: {e}"),
            "check that the database runs and that store.url names it with working credentials",
        ),
    }
}

/// The nearest existing folder above `path`, if this process can create a folder in it (as
/// `serve` does to make the store); else why not.
fn creatable_parent(path: &std::path::Path) -> Result<std::path::PathBuf, String> {
    let parent = path
        .ancestors()
        .skip(1)
        .find(|ancestor| ancestor.as_os_str().is_empty() || ancestor.exists())
        .map(|ancestor| {
            if ancestor.as_os_str().is_empty() {
                std::path::Path::new(".")
            } else {
                ancestor
            }
        })
        .ok_or_else(|| "no folder above it exists".to_owned())?;
    if !parent.is_dir() {
        return Err(format!("{} is not a folder", parent.display()));
    }
    // Trying is the only honest check: permissions, read-only mounts and pseudo file systems
    // all refuse in their own way.
    let probe = parent.join(format!(".antler-doctor-{}", std::process::id()));
    std::fs::create_dir(&probe)
        .map_err(|e| format!("nothing can be created in {}: {e}", parent.display()))?;
    let _ = std::fs::remove_dir(&probe);
    Ok(parent.to_path_buf())
}

async fn check_listen(config: &Config) -> Finding {
    let address = config.server.listen;
    match tokio::net::TcpListener::bind(address).await {
        Ok(_) => Finding::ok("listen", format!("{address} is free")),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            let healthz = format!("http://{address}/healthz");
            let antler = reqwest::Client::new()
                .get(&healthz)
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if antler {
                Finding::note("listen", format!("{address}: an antler is serving there"))
            } else {
                Finding::fail(
                    "listen",
                    format!("{address} is taken by another program"),
                    "stop it, or set server.listen (ANTLER_LISTEN) to a free address",
                )
            }
        }
        Err(e) => Finding::fail(
            "listen",
            format!("cannot bind {address}: {e}"),
            "set server.listen (ANTLER_LISTEN) to an address of this machine",
        ),
    }
}

/// The model endpoint check alone (for `antler init`): whether it passed, and its report line
/// (with the fix when it failed).
pub(crate) async fn probe_model(config: &Config) -> (bool, String) {
    let finding = check_model(config).await;
    (finding.verdict != Verdict::Fail, finding.line())
}

async fn check_model(config: &Config) -> Finding {
    let m = &config.model;
    let mut settings = OpenAiConfig::new(m.base_url.clone(), m.model.clone());
    settings.api_key = m.api_key.as_ref().map(|k| k.expose().to_owned());
    let client = match OpenAiClient::new(settings) {
        Ok(client) => client,
        Err(e) => {
            return Finding::fail(
                "model",
                e.to_string(),
                "set model.base_url (ANTLER_MODEL_BASE_URL)",
            );
        }
    };
    let url = client.display_url();
    match client.probe().await {
        Ok(report) if report.models.is_empty() => Finding::ok(
            "model",
            format!(
                "{url} answers (it lists no models; `{}` is assumed)",
                m.model
            ),
        ),
        Ok(report) if report.models.contains(&m.model) => {
            Finding::ok("model", format!("{url} answers and serves `{}`", m.model))
        }
        Ok(report) => Finding::fail(
            "model",
            format!(
                "{url} answers but does not list `{}` ({} other models)",
                m.model,
                report.models.len()
            ),
            "set model.model (ANTLER_MODEL) to one of the endpoint's models",
        ),
        Err(ModelError::Unauthorized { status, .. }) => Finding::fail(
            "model",
            format!("{url} refused the credentials (HTTP {status})"),
            "set model.api_key (OPENAI_API_KEY in the default config)",
        ),
        Err(e @ ModelError::UnknownModel { .. }) => Finding::fail(
            "model",
            format!("{url}: {e}"),
            "set model.model (ANTLER_MODEL) to one of the endpoint's models",
        ),
        Err(e @ ModelError::NotFound { .. }) => Finding::fail(
            "model",
            format!("{url}: {e}"),
            "check model.base_url: it usually ends in /v1",
        ),
        Err(e) if e.reached_endpoint() => Finding::fail(
            "model",
            format!("{url}: {e}"),
            "check model.base_url and model.api_key",
        ),
        Err(e) => Finding::fail(
            "model",
            format!("{url} is unreachable: {e}"),
            "start the model server, or set model.base_url (ANTLER_MODEL_BASE_URL)",
        ),
    }
}

/// The bot token (`getMe`), then the webhook Telegram delivers to (`getWebhookInfo`).
/// The Feishu / Lark app credentials: a tenant token fetched with them, then the bot's name.
async fn check_feishu(config: &Config) -> Finding {
    const FIX: &str = "set channels.feishu.app_id and app_secret from the app's Credentials & \
                       Basic Info page (Lark apps: api_url = \"https://open.larksuite.com\")";
    let feishu = &config.channels.feishu;
    let (Some(app_id), Some(secret)) = (&feishu.app_id, &feishu.app_secret) else {
        return Finding::fail(
            "feishu",
            "channels.feishu.app_id and app_secret are needed",
            FIX,
        );
    };
    let api = match antler_feishu::FeishuApi::new(
        app_id,
        secret.expose(),
        &feishu.api_url,
        crate::now_ms,
    ) {
        Ok(api) => api,
        Err(e) => return Finding::fail("feishu", e.to_string(), FIX),
    };
    match api.tenant_token().await {
        Ok(_) => match api.bot_info().await {
            Ok(bot) if feishu.mode == FeishuMode::Websocket => {
                check_feishu_socket(&api, &bot.name).await
            }
            Ok(bot) => Finding::ok(
                "feishu",
                format!("the app credentials work: the bot is {}", bot.name),
            ),
            Err(e) => Finding::fail(
                "feishu",
                format!("the credentials work, but the bot's info failed: {e}"),
                "enable the Bot capability in the app and publish a version",
            ),
        },
        Err(e @ (ChannelError::Transient(_) | ChannelError::RateLimited { .. })) => Finding::fail(
            "feishu",
            format!("{} is unreachable: {e}", feishu.api_url),
            "check the network, or channels.feishu.api_url",
        ),
        Err(e) => Finding::fail("feishu", format!("no tenant token: {e}"), FIX),
    }
}

/// In websocket mode: the long connection's endpoint (`/callback/ws/endpoint`) names where to
/// connect. Not connected: a connection would take one of the app's 50 and could take events
/// from a running antler.
async fn check_feishu_socket(api: &antler_feishu::FeishuApi, bot: &str) -> Finding {
    match api.socket_endpoint().await {
        Ok(_) => Finding::ok(
            "feishu",
            format!(
                "the app credentials work: the bot is {bot}; the long connection's endpoint \
                 answers"
            ),
        ),
        Err(e @ (ChannelError::Transient(_) | ChannelError::RateLimited { .. })) => Finding::fail(
            "feishu",
            format!("the long connection's endpoint failed: {e}"),
            "check the network, or channels.feishu.api_url; Feishu may be busy, try again",
        ),
        Err(e) => Finding::fail(
            "feishu",
            format!("the long connection's endpoint refused: {e}"),
            "in the developer console, under Events and Callbacks, choose \"Receive events \
             through persistent connection\" (internal apps only), publish a version, and \
             check that fewer than 50 connections are open",
        ),
    }
}

/// The Discord bot token, with `GET /users/@me`: which bot it is.
async fn check_discord(config: &Config) -> Finding {
    const FIX: &str = "set channels.discord.bot_token to the token on the application's Bot \
                       page (Reset Token shows a new one)";
    let discord = &config.channels.discord;
    let Some(token) = &discord.bot_token else {
        return Finding::fail("discord", "channels.discord.bot_token is not set", FIX);
    };
    let application_id = discord.application_id.as_deref().unwrap_or_default();
    let api =
        match antler_discord::DiscordApi::new(&discord.api_url, application_id, token.expose()) {
            Ok(api) => api,
            Err(e) => return Finding::fail("discord", e.to_string(), FIX),
        };
    match api.me().await {
        Ok(me) if !application_id.is_empty() && me.id != application_id => Finding::warn(
            "discord",
            format!(
                "the token is for bot {} ({}), but channels.discord.application_id is \
                 {application_id}",
                me.name, me.id
            ),
            "use the bot token and application id of the same application",
        ),
        Ok(me) => Finding::ok(
            "discord",
            format!("the bot token works: the bot is {} ({})", me.name, me.id),
        ),
        Err(e @ (ChannelError::Transient(_) | ChannelError::RateLimited { .. })) => Finding::fail(
            "discord",
            format!("{} is unreachable: {e}", discord.api_url),
            "check the network, or channels.discord.api_url",
        ),
        Err(e) => Finding::fail("discord", format!("GET /users/@me failed: {e}"), FIX),
    }
}

/// The Slack bot token, with `auth.test`: the bot and the workspace it is installed in.
async fn check_slack(config: &Config) -> Finding {
    const FIX: &str = "set channels.slack.bot_token to the Bot User OAuth Token (xoxb-…) of \
                       the installed app";
    let slack = &config.channels.slack;
    let Some(token) = &slack.bot_token else {
        return Finding::fail("slack", "channels.slack.bot_token is not set", FIX);
    };
    let api = match antler_slack::SlackApi::new(token.expose(), &slack.api_url) {
        Ok(api) => api,
        Err(e) => return Finding::fail("slack", e.to_string(), FIX),
    };
    match api.auth_test().await {
        Ok(me) => match &slack.team_id {
            Some(team) if *team != me.team_id => Finding::fail(
                "slack",
                format!(
                    "the token is for workspace {} ({}), but channels.slack.team_id is {team}",
                    me.team_id, me.team_name
                ),
                "use the token of the app installed in that workspace, or correct team_id",
            ),
            _ => Finding::ok(
                "slack",
                format!(
                    "the token works: the bot is {} in {} ({})",
                    me.user_id, me.team_name, me.team_id
                ),
            ),
        },
        Err(e @ (ChannelError::Transient(_) | ChannelError::RateLimited { .. })) => Finding::fail(
            "slack",
            format!("{} is unreachable: {e}", slack.api_url),
            "check the network, or channels.slack.api_url",
        ),
        Err(e) => Finding::fail("slack", format!("auth.test failed: {e}"), FIX),
    }
}

/// The Slack app-level token, with `apps.connections.open`: a URL Slack hands out is not
/// used (it expires unused), so nothing connects.
async fn check_slack_socket(config: &Config) -> Finding {
    const WHAT: &str = "slack socket";
    const FIX: &str = "set channels.slack.app_token to an app-level token (xapp-…) with the \
                       connections:write scope (Basic Information → App-Level Tokens), and \
                       enable Socket Mode in the app";
    let slack = &config.channels.slack;
    let Some(token) = &slack.app_token else {
        return Finding::fail(WHAT, "channels.slack.app_token is not set", FIX);
    };
    let socket = match antler_slack::SlackSocket::new(token.expose(), &slack.api_url) {
        Ok(socket) => socket,
        Err(e) => return Finding::fail(WHAT, e.to_string(), FIX),
    };
    match socket.open().await {
        Ok(_) => Finding::ok(
            WHAT,
            "the app token opens Socket Mode connections (apps.connections.open)",
        ),
        Err(antler_slack::SocketError::Refused(code)) => {
            Finding::fail(WHAT, format!("apps.connections.open answered {code}"), FIX)
        }
        Err(e) => Finding::fail(
            WHAT,
            format!("{} is unreachable: {e}", slack.api_url),
            "check the network, or channels.slack.api_url",
        ),
    }
}

async fn check_telegram(config: &Config) -> Vec<Finding> {
    const SET_IT: &str = "run `antler telegram set-webhook`";
    let api = match setup::telegram_api(config) {
        Ok(api) => api,
        Err(e) => {
            return vec![Finding::fail(
                "telegram",
                e.to_string(),
                "set channels.telegram.bot_token to the token @BotFather gave",
            )];
        }
    };
    let api_url = &config.channels.telegram.api_url;
    let me = match api.get_me().await {
        Ok(me) => me,
        Err(e @ (ChannelError::Transient(_) | ChannelError::RateLimited { .. })) => {
            return vec![Finding::fail(
                "telegram",
                format!("{api_url} is unreachable: {e}"),
                "check the network, or channels.telegram.api_url",
            )];
        }
        Err(e) => {
            return vec![Finding::fail(
                "telegram",
                format!("getMe failed: {e}"),
                "set channels.telegram.bot_token to the token @BotFather gave",
            )];
        }
    };
    let mut findings = vec![Finding::ok(
        "telegram",
        format!("the token works: the bot is @{}", me.username),
    )];
    let status = match api.webhook_info().await {
        Ok(status) => status,
        Err(e) => {
            findings.push(Finding::warn(
                "webhook",
                format!("getWebhookInfo failed: {e}"),
                "`antler telegram webhook-info` retries it",
            ));
            return findings;
        }
    };
    if config.channels.telegram.mode == TelegramMode::Polling {
        findings.push(polling_webhook(status.url.as_deref()));
        return findings;
    }
    let expected = setup::telegram_webhook_url(config);
    match (&status.url, &expected) {
        (None, _) => findings.push(Finding::warn(
            "webhook",
            "no webhook is set: Telegram delivers nothing to antler",
            SET_IT,
        )),
        (Some(url), Err(e)) => findings.push(Finding::warn(
            "webhook",
            format!(
                "Telegram delivers to {}; cannot check it: {e}",
                setup::one_line(&mask_url(url))
            ),
            "set server.public_url to the https:// URL antler is reached at",
        )),
        (Some(url), Ok(expected)) if url != expected => findings.push(Finding::warn(
            "webhook",
            format!(
                "Telegram delivers to {}, not {}",
                setup::one_line(&mask_url(url)),
                mask_url(expected)
            ),
            SET_IT,
        )),
        (Some(url), Ok(_)) => findings.push(Finding::ok(
            "webhook",
            format!(
                "Telegram delivers to {}; {} update(s) pending",
                mask_url(url),
                status.pending_update_count
            ),
        )),
    }
    // A webhook set before approval buttons existed delivers no presses.
    let missing = setup::missing_updates(status.allowed_updates.as_deref());
    if status.url.is_some() && !missing.is_empty() {
        findings.push(Finding::warn(
            "webhook",
            format!(
                "Telegram delivers no {} updates: the approval buttons do nothing",
                missing.join(", ")
            ),
            SET_IT,
        ));
    }
    if let Some(message) = &status.last_error_message {
        let when = status
            .last_error_date
            .map_or_else(|| "at an unknown time".to_owned(), setup::unix_time);
        findings.push(Finding::warn(
            "webhook",
            format!(
                "the last delivery failed ({when}): {}",
                setup::one_line(message)
            ),
            "check that the public URL reaches antler (proxy, TLS certificate, port)",
        ));
    }
    findings
}

/// In polling mode, the webhook must be gone: `getUpdates` and a webhook exclude each other, and
/// `serve` refuses to start while one is set (with the same words).
fn polling_webhook(url: Option<&str>) -> Finding {
    match url {
        None => Finding::ok(
            "webhook",
            "none set: polling (getUpdates) receives the updates",
        ),
        Some(url) => Finding::fail(
            "webhook",
            format!(
                "channels.telegram.mode is \"polling\" but Telegram delivers to the webhook {}",
                setup::one_line(&mask_url(url))
            ),
            "run `antler telegram delete-webhook` first (or set channels.telegram.mode = \"webhook\")",
        ),
    }
}

/// What `[skills]` finds, as `serve` would load it: the skills' names, and each one left out
/// as `<file>: <reason>`. For `check-config` and `doctor`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SkillsReport {
    /// Whether `[skills]` is on.
    pub enabled: bool,
    /// The folders searched.
    pub folders: Vec<String>,
    /// The skills loaded, by name.
    pub loaded: Vec<String>,
    /// The skills left out, each `<file>: <reason>`.
    pub invalid: Vec<String>,
}

/// Loads the skills of `config` as `serve` does, and reports them.
pub async fn skills_report(config: &Config) -> SkillsReport {
    let cfg = config.skills.clone();
    let folders = cfg
        .folders()
        .iter()
        .map(|(folder, _)| folder.display().to_string())
        .collect();
    let catalogue = tokio::task::spawn_blocking(move || skills::load(&cfg))
        .await
        .unwrap_or_default();
    SkillsReport {
        enabled: config.skills.enabled,
        folders,
        loaded: catalogue.skills.keys().cloned().collect(),
        invalid: catalogue.invalid.iter().map(ToString::to_string).collect(),
    }
}

/// The skills: how many were loaded, and a warning for each one left out.
async fn check_skills(config: &Config) -> Vec<Finding> {
    let report = skills_report(config).await;
    if !report.enabled {
        return vec![Finding::note(
            "skills",
            "disabled ([skills] enabled = false)",
        )];
    }
    let mut findings = vec![if report.loaded.is_empty() {
        Finding::note(
            "skills",
            format!("none found in {}", report.folders.join(", ")),
        )
    } else {
        Finding::ok(
            "skills",
            format!(
                "{} loaded: {}",
                report.loaded.len(),
                report.loaded.join(", ")
            ),
        )
    }];
    for invalid in report.invalid {
        findings.push(Finding::warn(
            "skills",
            format!("left out: {invalid}"),
            "correct the skill's SKILL.md (or remove its folder); antler serves without it",
        ));
    }
    findings
}

fn check_api(config: &Config) -> Finding {
    let api = &config.channels.api;
    if !api.enabled {
        return Finding::note("api", "the HTTP API channel is disabled");
    }
    let tokens = usize::from(api.token.is_some()) + api.tokens.len();
    if tokens == 0 {
        // Validation refuses this off loopback, so it is a local setup.
        return Finding::note(
            "api",
            format!(
                "no token: open to every local program on {}",
                config.server.listen
            ),
        );
    }
    Finding::ok("api", format!("{tokens} token(s) configured"))
}

/// Whether traces leave the process, and where (credentials masked). Validation has checked
/// the URLs already; an `OTEL_EXPORTER_OTLP_ENDPOINT` that is not one is reported here.
fn check_traces(telemetry: &crate::telemetry::TelemetryConfig) -> Finding {
    let Some(endpoint) = telemetry.endpoint() else {
        return Finding::note(
            "traces",
            "off (set [telemetry] otlp_endpoint or OTEL_EXPORTER_OTLP_ENDPOINT to export them)",
        );
    };
    let masked = crate::secret::mask_url(&endpoint);
    let shown = masked.trim_end_matches('/');
    if let Err(e) = crate::telemetry::check_endpoint(&endpoint) {
        return Finding::fail(
            "traces",
            format!("the collector URL {shown} {e}"),
            "set [telemetry] otlp_endpoint (or OTEL_EXPORTER_OTLP_ENDPOINT) to the collector's base URL, e.g. http://127.0.0.1:4318",
        );
    }
    let link = if telemetry.trace_url.is_some() {
        "; the admin page and /status link to telemetry.trace_url"
    } else {
        ""
    };
    Finding::ok(
        "traces",
        format!("exported as OTLP/HTTP to {shown}/v1/traces{link}"),
    )
}

/// Whether `store.path` holds the folder id the database names (`named`), as every replica's
/// must: what to add to the finding, or what is wrong.
fn shared_folder(config: &Config, named: Option<&str>) -> Result<String, String> {
    use crate::app::store_backend::FOLDER_ID_FILE;
    let Some(named) = named else {
        return Ok(String::new());
    };
    let path = config.store.path.join(FOLDER_ID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(here) if here.trim() == named => Ok(format!(
            "; {} is the folder the replicas share",
            config.store.path.display()
        )),
        Ok(here) => Err(format!(
            "{} names folder {}, but the database names {named}: this is not the folder the replicas share",
            path.display(),
            here.trim()
        )),
        Err(_) => Err(format!(
            "{} is missing, but the database names folder {named}: this is not the folder the replicas share",
            path.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_shows_its_fix_under_it() {
        let line = Finding::fail("model", "unreachable", "start it").line();
        assert_eq!(
            line,
            "FAIL  model    unreachable\n                fix: start it"
        );
        assert!(
            Finding::ok("store", "fine")
                .line()
                .starts_with("ok    store")
        );
    }

    #[test]
    fn traces_say_where_they_go_without_credentials() {
        use crate::telemetry::TelemetryConfig;
        let on = check_traces(&TelemetryConfig {
            otlp_endpoint: Some("https://user:hunter2@otel.example:4318".to_owned()),
            trace_url: Some("https://jaeger.example/trace/{trace_id}".to_owned()),
        })
        .line();
        assert!(on.starts_with("ok    traces"), "{on}");
        assert!(on.contains("otel.example:4318/v1/traces"), "{on}");
        assert!(on.contains("trace_url"), "{on}");
        assert!(!on.contains("hunter2"), "{on}");
        let bad = check_traces(&TelemetryConfig {
            otlp_endpoint: Some("ftp://otel.example".to_owned()),
            trace_url: None,
        })
        .line();
        assert!(
            bad.starts_with("FAIL  traces") && bad.contains("fix:"),
            "{bad}"
        );
    }
}
