//! The application as a value: built from a [`Config`], served on a listener until a shutdown
//! future resolves. `main` is a thin wrapper around [`serve`]; tests call it directly.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use antler_channel::Channel;
use antler_discord::{DiscordChannel, DiscordSettings};
use antler_feishu::{FeishuChannel, FeishuSettings};
use antler_slack::{SlackChannel, SlackSettings, SlackSocket};
use antler_telegram::{TelegramChannel, TelegramSettings};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::{AbortOnDropHandle, TaskTracker};

use crate::agent::memory::identity::MemoryIdentities;
use crate::agent::memory::sharing::GroupPolicy;
use crate::agent::middleware::approval::ApprovalMiddleware;
use crate::agent::middleware::clarification::ClarificationMiddleware;
use crate::agent::middleware::dangling_tool_call::DanglingToolCallMiddleware;
use crate::agent::middleware::deferred_tools::DeferredToolsMiddleware;
use crate::agent::middleware::guardrail::GuardrailMiddleware;
use crate::agent::middleware::input_sanitization::InputSanitizationMiddleware;
use crate::agent::middleware::loop_detection::LoopDetectionMiddleware;
use crate::agent::middleware::memory::MemoryMiddleware;
use crate::agent::middleware::sandbox_audit::SandboxAuditMiddleware;
use crate::agent::middleware::skills::SkillsMiddleware;
use crate::agent::middleware::subagent_limit::SubagentLimitMiddleware;
use crate::agent::middleware::summarization::SummarizationMiddleware;
use crate::agent::middleware::thread_data::ThreadDataMiddleware;
use crate::agent::middleware::title::TitleMiddleware;
use crate::agent::middleware::todo::TodoMiddleware;
use crate::agent::middleware::token_usage::TokenUsageMiddleware;
use crate::agent::middleware::tool_output_budget::ToolOutputBudgetMiddleware;
use crate::agent::middleware::uploads::UploadsMiddleware;
use crate::agent::middleware::view_image::ViewImageMiddleware;
use crate::agent::middleware::{ChainError, Middleware, MiddlewareChain};
use crate::agent::model::{ChatModel, ModelError, ModelHealth, OpenAiClient, OpenAiConfig};
use crate::agent::runtime::{Runtime, RuntimeSettings};
use crate::agent::skills::{self, Catalogue};
use crate::agent::subagents::SUBAGENT_CHAIN;
use crate::agent::subagents::executor::{INTERRUPTED, SubagentExecutor, SubagentKind};
use crate::agent::subagents::task_tool::{ShellPolicy, TASK_TOOL, TaskTool};
use crate::agent::tools::bash::{BashTool, TOOL_NAME};
use crate::agent::tools::egress::Egress;
use crate::agent::tools::mcp::McpServers;
use crate::agent::tools::probed_bash::{ProbedBash, ShellProbe, ShellRoles};
use crate::agent::tools::web_fetch::WebFetch;
use crate::agent::tools::{Tool, ToolRegistry};
use crate::config::{Config, StoreBackend, StoreConfig};
use crate::config::{FeishuMode, SlackMode, TelegramMode};
use crate::delivery::{Delivery, ReplyFiles};
use crate::events::EventHub;
use crate::health::ChannelHealth;
use crate::http::admin::{AdminContext, session::Sessions};
use crate::http::guard::{ApiAuth, HostPolicy};
use crate::http::serve::{ServeLimits, serve as serve_http};
use crate::http::{AppContext, AppState, ShellStatus, api::ApiChannel, ops_router, router};
use crate::ingress::access::Access;
use crate::ingress::approvals::Approvals;
use crate::ingress::pairing::Pairing;
use crate::ingress::{Ingress, IngressSettings, TurnRunner, TurnSettings};
use crate::live::Live;
use crate::memory::queue::{MemoryWorker, WorkerSettings};
use crate::metrics_catalog;
use crate::retry::{Backoff, RetryPolicy};
use crate::sandbox::{self, Backend, Detection, Sandbox};
use crate::schedule::{Clock, Schedule, Schedules, SystemClock};
use crate::store::{
    Claimed, InboxItem, OutboxItem, Store, StoreDocuments, StoreError, StoreRegistry,
    StoreSkillSwitches,
};

/// How often expired dedupe keys and old outbox records are swept, at most (a short dedupe
/// TTL is swept more often: twice per TTL).
const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// How long interrupted turns get to give their attempt back.
const INTERRUPT_WAIT: Duration = Duration::from_secs(5);

/// How many times the store's lease is renewed within its length (`store.lease_secs`): a
/// process that stops unexpectedly leaves its work to the next one at most one length after
/// its last renewal, and a renewal may fail twice before the lease runs out.
const RENEWALS_PER_LEASE: u32 = 3;

/// Why the application could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The store could not be opened or read.
    #[error("{0}")]
    Store(String),
    /// The model client could not be built.
    #[error("model: {0}")]
    Model(String),
    /// The middleware chain is invalid.
    #[error("agent.middleware: {0}")]
    Chain(String),
    /// A listener could not be bound.
    #[error("{0}")]
    Bind(String),
    /// Serving HTTP failed.
    #[error("http server: {0}")]
    Serve(#[from] std::io::Error),
    /// A platform channel could not be set up.
    #[error("{0}")]
    Channel(String),
    /// A config schedule could not be read.
    #[error("{0}")]
    Schedule(String),
}

impl From<StoreError> for AppError {
    fn from(e: StoreError) -> Self {
        Self::Store(e.to_string())
    }
}

impl From<ModelError> for AppError {
    fn from(e: ModelError) -> Self {
        Self::Model(e.to_string())
    }
}

impl From<ChainError> for AppError {
    fn from(e: ChainError) -> Self {
        Self::Chain(e.to_string())
    }
}

/// The process-wide Prometheus recorder (metrics macros need one global recorder).
fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            // Fails only for empty buckets, which the catalogue has none of.
            let recorder = metrics_catalog::builder()
                .unwrap_or_else(|_| PrometheusBuilder::new())
                .build_recorder();
            metrics_catalog::describe(&recorder);
            let handle = recorder.handle();
            // Fails only if another recorder was installed first; ours then just renders empty.
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}

fn middleware_chain(
    config: &Config,
    store: &Arc<dyn Store>,
    skills: &Arc<Live<Catalogue>>,
    approvals: &Arc<Approvals>,
) -> Result<MiddlewareChain, AppError> {
    let cfg = &config.agent.middleware;
    let mut items: Vec<Arc<dyn Middleware>> = Vec::new();
    if let Some(m) =
        ThreadDataMiddleware::from_config(&cfg.thread_data, config.agent.max_attachment_bytes)
    {
        items.push(Arc::new(m));
    }
    if let Some(m) = UploadsMiddleware::from_config(&cfg.uploads) {
        items.push(Arc::new(m));
    }
    if let Some(m) = InputSanitizationMiddleware::from_config(&cfg.input_sanitization) {
        items.push(Arc::new(m));
    }
    if let Some(m) = DanglingToolCallMiddleware::from_config(&cfg.dangling_tool_call) {
        items.push(Arc::new(m));
    }
    // Commands only operators may run are theirs as tools too.
    let guardrail = crate::opcommands::guardrail_config(&cfg.guardrail, &config.commands);
    if let Some(m) = GuardrailMiddleware::from_config(&guardrail) {
        items.push(Arc::new(m));
    }
    if let Some(m) = SandboxAuditMiddleware::from_config(&cfg.sandbox_audit, &config.store.path)
        .map_err(|e| AppError::Chain(format!("sandbox_audit.{e}")))?
    {
        items.push(Arc::new(m));
    }
    if let Some(m) = ToolOutputBudgetMiddleware::from_config(&cfg.tool_output_budget) {
        items.push(Arc::new(m));
    }
    if let Some(m) = SummarizationMiddleware::from_config(&cfg.summarization) {
        items.push(Arc::new(m));
    }
    let switches = Arc::new(StoreSkillSwitches(store.clone()));
    if let Some(m) = SkillsMiddleware::from_config(&config.skills, Arc::clone(skills), switches) {
        items.push(Arc::new(m));
    }
    if let Some(m) = TodoMiddleware::from_config(&cfg.todo) {
        items.push(Arc::new(m));
    }
    if let Some(m) = TokenUsageMiddleware::from_config(&cfg.token_usage) {
        items.push(Arc::new(m));
    }
    if let Some(m) = TitleMiddleware::from_config(&cfg.title) {
        items.push(Arc::new(m));
    }
    let documents = Arc::new(StoreDocuments(store.clone()));
    if let Some(m) = MemoryMiddleware::from_config(&config.memory, documents) {
        items.push(Arc::new(m));
    }
    if let Some(m) = ViewImageMiddleware::from_config(&cfg.view_image, config.model.vision) {
        items.push(Arc::new(m));
    }
    if let Some(m) = DeferredToolsMiddleware::from_config(&cfg.deferred_tools) {
        items.push(Arc::new(m));
    }
    if let Some(m) = SubagentLimitMiddleware::from_config(&cfg.subagent_limit) {
        items.push(Arc::new(m));
    }
    if let Some(m) = LoopDetectionMiddleware::from_config(&cfg.loop_detection) {
        items.push(Arc::new(m));
    }
    if let Some(m) = ApprovalMiddleware::from_config(&config.approvals, approvals.ledger()) {
        items.push(Arc::new(m));
    }
    if let Some(m) = ClarificationMiddleware::from_config(&cfg.clarification) {
        items.push(Arc::new(m));
    }
    Ok(MiddlewareChain::new(items)?)
}

/// The enabled platforms' channels, each served at `/webhooks/<name>`. Each one learns who
/// its bot first (briefly; then in the background).
/// The enabled platforms: every channel (for delivery), those served by webhook, and those
/// that antler reaches out to instead (Telegram polling, Slack's Socket Mode, Feishu's long
/// connection).
struct Platforms {
    all: Vec<Arc<dyn Channel>>,
    webhooks: Vec<Arc<dyn Channel>>,
    telegram_polling: Option<Arc<TelegramChannel>>,
    feishu_socket: Option<Arc<FeishuChannel>>,
    slack_socket: Option<(Arc<SlackChannel>, SlackSocket)>,
    /// Discord, whose Gateway (when on) answers button presses through it.
    discord: Option<Arc<DiscordChannel>>,
}

async fn platform_channels(config: &Config) -> Result<Platforms, AppError> {
    let mut platforms = Platforms {
        all: Vec::new(),
        webhooks: Vec::new(),
        telegram_polling: None,
        feishu_socket: None,
        slack_socket: None,
        discord: None,
    };
    let telegram = &config.channels.telegram;
    if telegram.enabled {
        let settings = TelegramSettings {
            bot_token: exposed(&telegram.bot_token),
            webhook_secret: exposed(&telegram.webhook_secret),
            api_url: telegram.api_url.clone(),
        };
        let channel = Arc::new(
            TelegramChannel::new(&settings, crate::now_ms)
                .map_err(|e| AppError::Channel(format!("channels.telegram: {e}")))?,
        );
        let learning = Arc::clone(&channel);
        learn_identity("telegram", move || {
            let channel = Arc::clone(&learning);
            async move { channel.learn_identity().await.map(|me| me.username) }
        })
        .await;
        platforms.all.push(channel.clone());
        if telegram.mode == TelegramMode::Polling {
            // getUpdates and a webhook exclude each other; say how to get out of it.
            if let Ok(status) = channel.api().webhook_info().await {
                if let Some(url) = status.url {
                    return Err(AppError::Channel(format!(
                        "channels.telegram.mode is \"polling\" but Telegram delivers to the \
                         webhook {url}; run `antler telegram delete-webhook` first"
                    )));
                }
            }
            // A webhook bot gets its menu from `set-webhook`; a polling one from here.
            let api = channel.api().clone();
            let menu = crate::setup::telegram_menu(config);
            tokio::spawn(async move {
                if let Err(e) = crate::setup::sync_telegram_menu(&api, &menu).await {
                    tracing::warn!(error = %e, "cannot set the Telegram command menu");
                }
            });
            platforms.telegram_polling = Some(channel);
        } else {
            platforms.webhooks.push(channel);
        }
    }
    let slack = &config.channels.slack;
    if slack.enabled {
        let settings = SlackSettings {
            bot_token: exposed(&slack.bot_token),
            signing_secret: exposed(&slack.signing_secret),
            socket_mode: slack.mode == SlackMode::Socket,
            api_url: slack.api_url.clone(),
            team_id: slack.team_id.clone(),
            thread_follow_ups: slack.thread_follow_ups,
            allowed_bots: slack.allowed_bots.clone(),
            progress_reactions: slack.progress_reactions,
            slash_in_channel: slack.slash_response == crate::config::SlashResponse::InChannel,
        };
        let channel = Arc::new(
            SlackChannel::new(&settings, crate::now_ms)
                .map_err(|e| AppError::Channel(format!("channels.slack: {e}")))?,
        );
        let learning = Arc::clone(&channel);
        learn_identity("slack", move || {
            let channel = Arc::clone(&learning);
            async move {
                channel
                    .learn_identity()
                    .await
                    .map(|me| format!("{} in {}", me.user_id, me.team_name))
            }
        })
        .await;
        platforms.all.push(channel.clone());
        if slack.mode == SlackMode::Socket {
            // Not served by webhook: in Socket Mode Slack sends nothing there, and without a
            // signing secret nothing sent there could be verified (404 rather than 401).
            let socket = SlackSocket::new(&exposed(&slack.app_token), &slack.api_url)
                .map_err(|e| AppError::Channel(format!("channels.slack.app_token: {e}")))?;
            platforms.slack_socket = Some((channel, socket));
        } else {
            platforms.webhooks.push(channel);
        }
    }
    let discord = &config.channels.discord;
    if discord.enabled {
        let channel = Arc::new(
            DiscordChannel::new(&discord_settings(discord), crate::now_ms)
                .map_err(|e| AppError::Channel(format!("channels.discord: {e}")))?,
        );
        // Interactions name everything they need: no identity to learn before serving.
        platforms.all.push(channel.clone());
        platforms.webhooks.push(channel.clone());
        platforms.discord = Some(channel);
    }
    let feishu = &config.channels.feishu;
    if feishu.enabled {
        let settings = FeishuSettings {
            app_id: feishu.app_id.clone().unwrap_or_default(),
            app_secret: exposed(&feishu.app_secret),
            verification_token: exposed(&feishu.verification_token),
            encrypt_key: Some(exposed(&feishu.encrypt_key)).filter(|key| !key.is_empty()),
            api_url: feishu.api_url.clone(),
            cards: feishu.cards,
            websocket: feishu.mode == FeishuMode::Websocket,
        };
        let channel = Arc::new(
            FeishuChannel::new(&settings, crate::now_ms)
                .map_err(|e| AppError::Channel(format!("channels.feishu: {e}")))?,
        );
        let learning = Arc::clone(&channel);
        learn_identity("feishu", move || {
            let channel = Arc::clone(&learning);
            async move { channel.learn_identity().await.map(|me| me.name) }
        })
        .await;
        platforms.all.push(channel.clone());
        if feishu.mode == FeishuMode::Websocket {
            platforms.feishu_socket = Some(channel);
        } else {
            platforms.webhooks.push(channel);
        }
    }
    Ok(platforms)
}

/// The Discord channel's settings from `[channels.discord]` (setup commands use them too).
pub(crate) fn discord_settings(discord: &crate::config::DiscordConfig) -> DiscordSettings {
    DiscordSettings {
        application_id: discord.application_id.clone().unwrap_or_default(),
        public_key: discord.public_key.clone().unwrap_or_default(),
        bot_token: exposed(&discord.bot_token),
        api_url: discord.api_url.clone(),
        allowed_guilds: discord.allowed_guilds.clone(),
    }
}

/// A secret's text for a platform crate (empty when unset; validation has required it).
fn exposed(value: &Option<crate::config::Secret>) -> String {
    value
        .as_ref()
        .map(|s| s.expose().to_owned())
        .unwrap_or_default()
}

/// Asks the platform who the bot is (`learn` returns its name) before serving, for up to 5
/// seconds, so mentions are recognised from the first message; a slow or failing API is asked
/// again in the background, with backoff, until it answers.
async fn learn_identity<F, Fut>(platform: &'static str, learn: F)
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<String, antler_channel::ChannelError>> + Send,
{
    if let Ok(Ok(name)) = tokio::time::timeout(Duration::from_secs(5), learn()).await {
        tracing::info!(platform, bot = %name, "bot ready");
        return;
    }
    tokio::spawn(async move {
        let mut backoff = Backoff::new(RetryPolicy::forever(
            Duration::from_secs(5),
            Duration::from_secs(300),
        ));
        loop {
            let wait = backoff.next_wait();
            match learn().await {
                Ok(name) => {
                    tracing::info!(platform, bot = %name, "bot ready");
                    break;
                }
                Err(e) => tracing::warn!(
                    platform,
                    error = %e,
                    retry_in = ?wait,
                    "cannot learn who the bot is; until it works, group messages that may \
                     mention the bot are answered 503 for the platform to deliver again. Check \
                     the platform's bot_token and api_url (`antler doctor`)"
                ),
            }
            tokio::time::sleep(wait).await;
        }
    });
}

/// Starts the shell's proxy, on the Unix socket `unix`, when its commands may use the
/// network: the proxy is their only way out, and never leads to antler's own listeners.
pub(crate) async fn shell_egress(config: &Config, unix: std::path::PathBuf) -> Option<Egress> {
    let bash = &config.agent.tools.bash;
    if !(bash.enabled && bash.network) {
        return None;
    }
    let own: Vec<std::net::SocketAddr> = std::iter::once(config.server.listen)
        .chain(config.server.ops_listen)
        .collect();
    match Egress::start(unix, own).await {
        Ok(egress) => Some(egress),
        Err(e) => {
            tracing::error!(error = %e, "cannot start the shell's proxy; its commands get no network");
            None
        }
    }
}

/// Finds the shell's sandbox (when the shell is enabled) and says in the log what it is: the
/// backend in effect, or that the shell is not offered and why.
async fn shell_sandbox(config: &Config, egress: Option<&Egress>) -> Option<Detection> {
    let bash = &config.agent.tools.bash;
    if !bash.enabled {
        return None;
    }
    let endpoints = egress.map(Egress::endpoints);
    let detection = sandbox::detect(
        bash.sandbox,
        bash.network && endpoints.is_some(),
        bash.limits,
        &config.store.path,
        endpoints.as_ref(),
    )
    .await;
    let described = detection.describe();
    match detection.sandbox.as_ref().map(Sandbox::backend) {
        Some(Backend::None) => {
            tracing::warn!(sandbox = %described, "the shell runs commands without a sandbox (agent.tools.bash.sandbox = \"none\")");
        }
        Some(_) => tracing::info!(sandbox = %described, "the shell runs sandboxed"),
        None => {
            tracing::error!(sandbox = %described, "the shell is not offered: no sandbox works here")
        }
    }
    Some(detection)
}

/// The shell's part of `/readyz`.
fn shell_status(config: &Config, detection: Option<&Detection>) -> serde_json::Value {
    match detection {
        None => serde_json::json!({ "enabled": false }),
        Some(detection) => serde_json::json!({
            "enabled": config.agent.tools.bash.enabled,
            "offered": detection.sandbox.is_some(),
            "sandbox": detection.sandbox.as_ref().map(|s| s.backend().name()),
            "network": config.agent.tools.bash.network,
            "detail": detection.describe(),
        }),
    }
}

/// Starts the shell's proxy and the sandbox's probe in the background when the shell is
/// enabled: the probe's verdict, and the task (aborted when dropped).
fn start_shell_probe(config: &Config) -> Option<(ShellProbe, AbortOnDropHandle<()>)> {
    if !config.agent.tools.bash.enabled {
        return None;
    }
    let (probe, done) = ShellProbe::pending();
    let config = config.clone();
    let task = tokio::spawn(async move {
        let egress = shell_egress(&config, config.store.path.join("egress.sock")).await;
        let detection = shell_sandbox(&config, egress.as_ref()).await;
        let status = shell_status(&config, detection.as_ref());
        let bash = detection
            .and_then(|found| found.sandbox)
            .map(|sandbox| BashTool::new(&config.agent.tools.bash, sandbox));
        // The shell's commands reach the network through the proxy: it lives as long as they can run.
        let keep = egress
            .filter(|_| bash.is_some())
            .map(|egress| Arc::new(egress) as Arc<dyn std::any::Any + Send + Sync>);
        done.settle(bash, status, keep);
    });
    Some((probe, AbortOnDropHandle::new(task)))
}

/// Who the guardrail (when enabled) lets run the shell, sandbox permitting.
fn shell_roles(config: &Config) -> ShellRoles {
    let guardrail = GuardrailMiddleware::from_config(&config.agent.middleware.guardrail);
    Arc::new(move |role| {
        guardrail
            .as_ref()
            .is_none_or(|guard| guard.allows(role, TOOL_NAME))
    })
}

fn tool_registry(
    config: &Config,
    extra: Vec<Arc<dyn Tool>>,
    mcp: &McpServers,
    shell: Option<&ShellProbe>,
) -> ToolRegistry {
    let agent = &config.agent;
    let mut registry = ToolRegistry::builtin();
    if let Some(probe) = shell.filter(|_| agent.tools.bash.enabled) {
        registry.register(Arc::new(ProbedBash::new(
            &agent.tools.bash,
            probe.clone(),
            shell_roles(config),
        )));
    }
    if let Some(tool) = WebFetch::from_config(&agent.tools.web_fetch) {
        registry.register(Arc::new(tool));
    }
    for tool in mcp.tools() {
        registry.register(tool);
    }
    for tool in extra {
        registry.register(tool);
    }
    let mut timeouts: HashMap<String, Duration> = agent
        .tool_timeouts
        .iter()
        .map(|(name, secs)| (name.clone(), Duration::from_secs(*secs)))
        .collect();
    if let Some(longest) = config.subagents.longest_call() {
        // `task` waits for its subagent: the slowest type's timeout and a margin, unless
        // configured (validation refuses less); each call's own limit follows its type.
        timeouts.entry(TASK_TOOL.to_owned()).or_insert(longest);
    }
    for command in &config.commands {
        // An operator command stops itself at its own limit and reports how it ended.
        timeouts
            .entry(format!(
                "{}{}",
                crate::opcommands::TOOL_PREFIX,
                command.name
            ))
            .or_insert(Duration::from_secs(command.timeout_secs.saturating_add(10)));
    }
    registry.with_timeouts(Duration::from_secs(agent.tool_timeout_secs), timeouts)
}

/// The subagent executor and its types, when `[subagents]` is enabled: each type runs on the
/// lead's tools and middlewares (its share of them), with its own model if it names one.
fn subagent_executor(
    config: &Config,
    store: &Arc<dyn Store>,
    lead: &OpenAiClient,
    health: &ModelHealth,
    tools: &ToolRegistry,
    chain: &MiddlewareChain,
    shutdown: CancellationToken,
) -> Result<Option<SubagentExecutor>, AppError> {
    let cfg = &config.subagents;
    if !cfg.enabled {
        return Ok(None);
    }
    let child_chain = chain.only(SUBAGENT_CHAIN);
    let mut models: HashMap<String, Arc<dyn ChatModel>> = HashMap::new();
    let mut kinds = Vec::new();
    for spec in cfg.types() {
        if spec.needs_shell && !tools.contains("bash") {
            // The shell is off: a shell subagent would have nothing to run.
            continue;
        }
        let model: Arc<dyn ChatModel> = match &spec.model {
            None => Arc::new(lead.clone()),
            Some(name) => match models.get(name) {
                Some(model) => Arc::clone(model),
                None => {
                    let model: Arc<dyn ChatModel> =
                        Arc::new(model_client(config, name, health.clone())?);
                    models.insert(name.clone(), Arc::clone(&model));
                    model
                }
            },
        };
        for missing in spec
            .tools
            .iter()
            .flatten()
            .filter(|name| !name.ends_with('*') && !tools.contains(name))
        {
            tracing::warn!(
                subagent_type = %spec.name,
                tool = %missing,
                "subagents.types.{}.tools names a tool antler does not have; it is left out",
                spec.name
            );
        }
        kinds.push(SubagentKind::new(
            spec,
            model,
            tools.clone(),
            child_chain.clone(),
            runtime_settings(config),
        ));
    }
    Ok(Some(SubagentExecutor::new(
        Arc::new(StoreRegistry(store.clone())),
        kinds,
        cfg.max_concurrent,
        shutdown,
    )))
}

/// Who may run the shell: the probe proved a sandbox and the guardrail (when enabled) lets
/// them.
fn shell_policy(config: &Config, shell: Option<&ShellProbe>) -> ShellPolicy {
    let shell = shell.cloned();
    let roles = shell_roles(config);
    Arc::new(move |role| shell.as_ref().is_some_and(ShellProbe::offered) && roles(role))
}

fn runtime_settings(config: &Config) -> RuntimeSettings {
    RuntimeSettings {
        system_prompt: Live::text(&config.model.system_prompt),
        max_model_calls: config.agent.max_iterations,
        max_parallel_tools: config.agent.max_parallel_tools,
        context_tokens: config.model.context_tokens,
        data_root: config.store.path.clone(),
        // Validation refused a zone that is not there.
        timezone: config.agent.time_zone().unwrap_or(jiff::tz::TimeZone::UTC),
        token_budget: None,
    }
}

fn model_client(
    config: &Config,
    model: &str,
    health: ModelHealth,
) -> Result<OpenAiClient, ModelError> {
    let m = &config.model;
    let mut client = OpenAiConfig::new(m.base_url.clone(), model.to_owned());
    client.api_key = m.api_key.as_ref().map(|k| k.expose().to_owned());
    client.connect_timeout = Duration::from_secs(m.connect_timeout_secs);
    client.first_byte_timeout = Duration::from_secs(m.first_byte_timeout_secs);
    client.idle_timeout = Duration::from_secs(m.idle_timeout_secs);
    client.request_timeout = Duration::from_secs(m.request_timeout_secs);
    client.max_retries = m.max_retries;
    client.stream = m.stream;
    client.stream_usage = m.stream_usage;
    client.temperature = m.temperature;
    client.max_tokens = m.max_tokens;
    Ok(OpenAiClient::new(client)?.with_health(health))
}

/// Asks the model endpoint whether it is there, once, and says so in the log: an unreachable
/// model is found at start, not by the first user.
async fn probe_model(client: OpenAiClient, model: String) {
    let url = client.display_url();
    match client.probe().await {
        Ok(report) if report.models.is_empty() || report.models.contains(&model) => {
            tracing::info!(base_url = %url, model = %model, "model endpoint reachable");
        }
        Ok(report) => tracing::warn!(
            base_url = %url,
            model = %model,
            available = report.models.len(),
            "the model endpoint does not list the configured model; check model.model (ANTLER_MODEL)"
        ),
        Err(e) if e.reached_endpoint() => tracing::warn!(
            base_url = %url,
            error = %e,
            "the model endpoint answered the probe with an error; check model.api_key and model.base_url"
        ),
        Err(e) => tracing::warn!(
            base_url = %url,
            error = %e,
            "the model endpoint is unreachable; turns will fail until it is up. Check \
             model.base_url (ANTLER_MODEL_BASE_URL in the default config)"
        ),
    }
}

/// `antler migrate`: applies the store's pending schema migrations and nothing else (`serve`
/// applies them at start too). Returns where the store is (a URL's password masked) and its
/// schema versions before (0: a new store) and after.
pub async fn migrate(config: &Config) -> Result<(String, u32, u32), AppError> {
    let at = match config.store.backend {
        StoreBackend::Sled => config.store.path.display().to_string(),
        StoreBackend::Postgres => store_backend::pg_options(&config.store)
            .map(|options| crate::store::mask_pg_url(&options.url))?,
    };
    let (from, to) = store_backend::migrate(&config.store).await?;
    Ok((at, from, to))
}

/// `antler store copy`: copies the deployment in store `from` into store `to` (`sled:PATH` or
/// a PostgreSQL URL), refusing a target that holds conversations unless `force`. Returns the
/// report to print: where from and to (passwords masked) and the records copied per kind.
pub async fn store_copy(from: &str, to: &str, force: bool) -> Result<String, AppError> {
    let counts = crate::store::copy::copy_between(from, to, force, crate::now_ms())
        .await
        .map_err(|e| AppError::Store(e.to_string()))?;
    let mut report = format!(
        "copied {} -> {}:",
        crate::store::copy::Endpoint::shown_text(from),
        crate::store::copy::Endpoint::shown_text(to)
    );
    for (kind, count) in counts {
        report.push_str(&format!("\n  {count:>8} {}", kind.name()));
    }
    Ok(report)
}

/// Runs antler on `listener` until `shutdown` resolves (or another process takes the store's
/// lease), then drains (the stages of [`shutdown`]): intake stops (new messages get 503),
/// running turns get `server.shutdown_grace_secs` to finish, turns still running after that
/// are interrupted (they run again on the next start, their attempt not counted), pending
/// deliveries get the rest of the grace period, connections close, and the store is synced and
/// its lease given up. What is left is durable and resumes on the next start.
pub async fn serve<F>(config: Config, listener: TcpListener, shutdown: F) -> Result<(), AppError>
where
    F: Future<Output = ()> + Send + 'static,
{
    serve_with_tools(config, listener, shutdown, Vec::new()).await
}

/// [`serve`], taking configurations read again (on SIGHUP) from `reloads`: what can change
/// safely is applied at once (who may talk: allowlists, admins, `dm_policy`); what cannot is
/// named in a warning, to take effect at the next start.
pub async fn serve_reloading<F>(
    config: Config,
    listener: TcpListener,
    shutdown: F,
    reloads: tokio::sync::mpsc::Receiver<Config>,
) -> Result<(), AppError>
where
    F: Future<Output = ()> + Send + 'static,
{
    run_app(
        config,
        listener,
        shutdown,
        Vec::new(),
        Some(reloads),
        Arc::new(SystemClock),
    )
    .await
}

/// [`serve`] with more tools in the registry (the tests' slow and inspecting tools).
pub(crate) async fn serve_with_tools<F>(
    config: Config,
    listener: TcpListener,
    shutdown: F,
    extra_tools: Vec<Arc<dyn Tool>>,
) -> Result<(), AppError>
where
    F: Future<Output = ()> + Send + 'static,
{
    run_app(
        config,
        listener,
        shutdown,
        extra_tools,
        None,
        Arc::new(SystemClock),
    )
    .await
}

/// [`serve`] with the scheduler reading `clock` (the tests' clock that moves when told).
#[cfg(test)]
pub(crate) async fn serve_with_clock<F>(
    config: Config,
    listener: TcpListener,
    shutdown: F,
    clock: Arc<dyn Clock>,
) -> Result<(), AppError>
where
    F: Future<Output = ()> + Send + 'static,
{
    run_app(config, listener, shutdown, Vec::new(), None, clock).await
}

/// What a configuration reload changes in the running antler.
struct Reloadable {
    access: Arc<Access>,
    system_prompt: Arc<Live<str>>,
    skills: Arc<Live<Catalogue>>,
    /// Weak: the schedules hold the store, which a stopped antler must have let go of (the
    /// reloads go on as long as the signal handler lives).
    schedules: std::sync::Weak<Schedules>,
}

/// Applies each configuration `reloads` brings: who may talk, the system prompt, the skills
/// (their folders read again) and the config's schedules at once, for the next message and
/// the next run; the sections that differ otherwise from what runs (`running`) are named, for
/// a restart.
async fn apply_reloads(
    running: Config,
    live: Reloadable,
    mut reloads: tokio::sync::mpsc::Receiver<Config>,
) {
    while let Some(config) = reloads.recv().await {
        live.access.reload(&config.channels);
        live.system_prompt
            .set(Arc::from(config.model.system_prompt.as_str()));
        // Skills switched on or off change the middleware chain: that waits for a restart.
        if config.skills.enabled == running.skills.enabled {
            live.skills.set(load_skills(&config).await);
        }
        let mut restart = crate::config::needs_restart(&running, &config);
        // A schedule may be for a channel this reload turns on: while channels wait for a
        // restart, so do the schedules.
        if restart
            .iter()
            .any(|section| section.starts_with("channels."))
        {
            if config.schedules != running.schedules {
                restart.push("schedules");
            }
        } else {
            match (live.schedules.upgrade(), config_schedules(&config)) {
                (Some(book), Ok(schedules)) => book.set_configured(schedules),
                (None, _) => return,
                (_, Err(e)) => tracing::warn!(error = %e, "schedules: not reloaded"),
            }
        }
        if restart.is_empty() {
            tracing::info!(
                "configuration reloaded: who may talk, the system prompt, the skills and the \
                 schedules are applied"
            );
        } else {
            tracing::warn!(
                restart = ?restart,
                "configuration reloaded: who may talk, the system prompt, the skills and the \
                 schedules are applied where they can be; the other changes take effect at the \
                 next start"
            );
        }
    }
}

async fn run_app<F>(
    config: Config,
    listener: TcpListener,
    shutdown: F,
    extra_tools: Vec<Arc<dyn Tool>>,
    reloads: Option<tokio::sync::mpsc::Receiver<Config>>,
    clock: Arc<dyn Clock>,
) -> Result<(), AppError>
where
    F: Future<Output = ()> + Send + 'static,
{
    // Traces are exported while antler runs; the last ones are sent on the way out.
    match crate::telemetry::start(&config.telemetry) {
        Ok(Some(endpoint)) => tracing::info!(%endpoint, "exporting traces (OTLP over HTTP)"),
        Ok(None) => {}
        // Only the environment's endpoint can be wrong here (the config's is validated).
        Err(e) => tracing::warn!(error = %e, "traces are not exported"),
    }
    let outcome = run_app_traced(config, listener, shutdown, extra_tools, reloads, clock).await;
    crate::telemetry::shutdown().await;
    outcome
}

/// [`run_app`] once tracing is set up.
async fn run_app_traced<F>(
    config: Config,
    listener: TcpListener,
    shutdown: F,
    extra_tools: Vec<Arc<dyn Tool>>,
    reloads: Option<tokio::sync::mpsc::Receiver<Config>>,
    clock: Arc<dyn Clock>,
) -> Result<(), AppError>
where
    F: Future<Output = ()> + Send + 'static,
{
    let started = Instant::now();
    // Same-user processes (a shell command among them) may not read this process's memory,
    // environment or open files through /proc, nor trace it.
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    let metrics = metrics_handle();
    let shutdown = futures_util::FutureExt::shared(Box::pin(shutdown));
    // A database may be down or held by another antler for a while: meanwhile antler answers
    // that it is alive and not ready (sled opens at once or not at all).
    let (listener, waiting) = match config.store.backend {
        StoreBackend::Postgres => {
            let (listener, waiting) = WaitingServer::start(listener)?;
            (listener, Some(waiting))
        }
        StoreBackend::Sled => (listener, None),
    };
    // `<replica>/<id>`: a restarted replica of the same name is another owner, so it sees
    // how the last one left.
    let owner = format!(
        "{}/{}",
        replica_name(&config.store),
        uuid::Uuid::now_v7().simple()
    );
    let Some(store) = open_store(&config.store, &owner, waiting.as_ref(), shutdown.clone()).await?
    else {
        tracing::info!("stopped while waiting for the database");
        return Ok(());
    };
    // Before anything else starts (the shell's proxy socket in the store's folder, MCP
    // servers): a second process must not get that far. Replicas sharing a store each mark
    // themselves alive instead; the store's lease then only decides which one runs the
    // singletons (`app::singletons`).
    let stops = Stops::default();
    let shared = store.shared();
    let lease_keeper = if shared {
        join_replicas(&store, &config.store, &stops).await?
    } else {
        claim_lease(&store, &owner, &config.store, &stops).await?
    };
    // The sandbox's probe (most of the start-up time) runs in the background: antler answers
    // before it is done, and only runs that may use the shell wait for its verdict
    // (tools::probed_bash). After the store opened, which sets its folder's permissions, since
    // the probe runs in that folder. Aborted (its probe process killed) when antler stops.
    let (shell, _shell_probe) = start_shell_probe(&config).unzip();
    let mcp = McpServers::connect(&config.mcp.servers).await;
    let model_health = ModelHealth::default();
    let client = model_client(&config, &config.model.model, model_health.clone())?;
    let memory_model: Arc<dyn ChatModel> = Arc::new(client.clone());
    // Cancelled when running turns must stop (and their subagents with them).
    let turn_cancel = stops.turns.clone();
    let commands = operator_commands(&config);
    let mut extra_tools = extra_tools;
    extra_tools.extend(commands.tools());
    let mut tools = tool_registry(&config, extra_tools, &mcp, shell.as_ref());
    let skills = Arc::new(Live::new(load_skills(&config).await));
    let approvals = Approvals::new(Arc::clone(&store), config.approvals.clone());
    let chain = middleware_chain(&config, &store, &skills, &approvals)?;
    let subagents = subagent_executor(
        &config,
        &store,
        &client,
        &model_health,
        &tools,
        &chain,
        turn_cancel.clone(),
    )?;
    if let Some(executor) = &subagents {
        let shell = shell_policy(&config, shell.as_ref());
        // The tool states the caps subagent_limit enforces on its calls.
        let limits = SubagentLimitMiddleware::from_config(&config.agent.middleware.subagent_limit)
            .and_then(|limit| limit.limits_of(TASK_TOOL));
        tools.register(Arc::new(TaskTool::new(executor.clone(), shell, limits)));
    }
    let settings = runtime_settings(&config);
    let system_prompt = Arc::clone(&settings.system_prompt);
    let runtime = Runtime::new(Arc::new(client.clone()), tools, chain, settings);
    tracing::info!(
        model = runtime.model_name(),
        base_url = %client.display_url(),
        middleware = ?runtime.middleware_names(),
        "agent runtime ready"
    );
    let probe = tokio::spawn(probe_model(client, config.model.model.clone()));

    let intake_stop = stops.intake.clone();
    let delivery_stop = stops.delivery.clone();
    let http_stop = stops.http.clone();
    let turns = TaskTracker::new();
    let deliveries = TaskTracker::new();
    let hub = EventHub::default();
    let auth = ApiAuth::from_config(&config.channels.api);
    let api = Arc::new(ApiChannel::new(
        auth.clone(),
        hub.clone(),
        config.agent.max_attachment_bytes,
    ));
    let mut channels: HashMap<String, Arc<dyn Channel>> = HashMap::new();
    if config.channels.api.enabled {
        channels.insert("api".to_owned(), api.clone());
    }
    let platforms = platform_channels(&config).await?;
    for channel in &platforms.all {
        channels.insert(channel.name().to_owned(), Arc::clone(channel));
    }
    metrics_catalog::register_at_zero(&metrics_catalog::Known {
        channels: channels.keys().map(String::as_str).collect(),
        mcp_servers: config
            .mcp
            .servers
            .iter()
            .filter(|server| server.enabled)
            .map(|server| server.name.as_str())
            .collect(),
        middlewares: runtime.middleware_names(),
    });
    let webhooks = platforms.webhooks;
    let health = ChannelHealth::default();
    for channel in &platforms.all {
        let posted = webhooks.iter().any(|hook| hook.name() == channel.name());
        health.register(
            channel.name(),
            if posted { "webhook" } else { "connecting" },
        );
    }
    let delivery = Delivery::new(
        store.clone(),
        channels,
        delivery_retry(&config),
        ReplyFiles {
            data_root: config.store.path.clone(),
            max_bytes: config.agent.max_attachment_bytes,
        },
        health.clone(),
        deliveries.clone(),
        delivery_stop.clone(),
    );
    // With replicas, what others left is adopted conversation by conversation instead.
    let Resumed { inbox, outbox } = if shared {
        Resumed::default()
    } else {
        resume(store.as_ref()).await?
    };
    // Replies left in the outbox go first; the runner then owns the delivery handle.
    delivery.enqueue(outbox);
    let access = Arc::new(Access::from_config(&config.channels));
    warn_open_channels(&config, &access);
    let pairing = Arc::new(Pairing::new(store.clone(), Arc::clone(&access)));
    let paired = pairing.load().await?;
    if paired > 0 {
        tracing::info!(users = paired, "users approved through pairing may talk");
    }
    let schedules = Arc::new(Schedules::new(
        config_schedules(&config)?,
        Arc::clone(&store),
        clock,
        config.agent.timezone.clone(),
    ));
    if let Some(reloads) = reloads {
        let live = Reloadable {
            access: Arc::clone(&access),
            system_prompt,
            skills: Arc::clone(&skills),
            schedules: Arc::downgrade(&schedules),
        };
        tokio::spawn(apply_reloads(config.clone(), live, reloads));
    }
    let adopted_replies = delivery.clone();
    let admin_delivery = delivery.clone();
    let runner = TurnRunner::new(
        Arc::clone(&store),
        runtime,
        hub.clone(),
        delivery,
        &turn_settings(&config, &skills, &pairing, commands, &schedules, &approvals),
        turn_cancel.clone(),
    );
    let ingress = Ingress::new(
        Arc::clone(&store),
        runner,
        hub.clone(),
        &IngressSettings {
            backlog_limit: config.agent.backlog,
            dedupe_ttl: Duration::from_secs(config.store.dedupe_ttl_secs),
            max_concurrent_turns: config.agent.max_concurrent_turns,
            access,
            pairing: Some(Arc::clone(&pairing)),
            health,
        },
        turns.clone(),
        intake_stop.clone(),
    );

    if shared {
        ingress.share_work(adopted_replies, INTERRUPTED, intake_stop.clone());
    } else {
        drop(adopted_replies);
        ingress.recover(inbox);
    }
    // After the recovered items, so a resume queued now comes after what was waiting.
    approvals.attach(ingress.downgrade());
    // After the recovered items: a firing enqueued again after a crash is found a duplicate.
    let singletons = singletons::Singletons {
        config: config.clone(),
        telegram_polling: platforms.telegram_polling,
        discord: platforms.discord,
        schedules,
        approvals: Arc::clone(&approvals),
        ingress: ingress.clone(),
    };
    let singletons = if shared {
        vec![tokio::spawn(singletons.run_while_leased(
            Arc::clone(&store),
            owner.clone(),
            Duration::from_secs(config.store.lease_secs),
            intake_stop.clone(),
        ))]
    } else {
        let tasks = singletons.start(&intake_stop).await?;
        // What they need is theirs now: the store must be free once they end.
        drop(singletons);
        tasks
    };
    let slack_socket = platforms.slack_socket.map(|(channel, socket)| {
        tokio::spawn(crate::intake::read_slack_socket(
            channel,
            socket,
            ingress.clone(),
            intake_stop.clone(),
        ))
    });
    let feishu_socket = platforms.feishu_socket.map(|channel| {
        tokio::spawn(crate::intake::read_feishu_socket(
            channel,
            ingress.clone(),
            intake_stop.clone(),
        ))
    });

    // Memory updates queued by turns (also by the last process) are learned in the background.
    let memory_stop = stops.memory.clone();
    let memory_worker = config.memory.enabled.then(|| {
        tokio::spawn(
            MemoryWorker::new(
                store.clone(),
                memory_model,
                WorkerSettings::from_config(&config.memory),
            )
            .run(memory_stop.clone()),
        )
    });

    let sweeper = tokio::spawn(sweep(
        Arc::clone(&store),
        metrics.clone(),
        Duration::from_secs(config.store.dedupe_ttl_secs),
        intake_stop.clone(),
    ));

    let server = &config.server;
    let admin = admin_context(&config, &auth, admin_delivery);
    let state = Arc::new(AppContext {
        ingress,
        store: Arc::clone(&store),
        hub,
        metrics,
        model_configured: !config.model.base_url.is_empty() && !config.model.model.is_empty(),
        model_health,
        body_limit: server.body_limit_bytes,
        max_attachment_bytes: config.agent.max_attachment_bytes,
        data_root: config.store.path.clone(),
        body_timeout: Duration::from_secs(server.body_read_timeout_secs),
        wait_limit: config.api_wait_limit(),
        stop: intake_stop.clone(),
        auth,
        hosts: HostPolicy::from_config(server),
        streams: Arc::new(Semaphore::new(server.max_streams.max(1))),
        metrics_token: server.metrics_token.clone(),
        mcp: mcp.live_status(),
        shell: {
            let bash = config.agent.tools.bash.clone();
            ShellStatus(Box::new(move || match &shell {
                Some(probe) => probe.status(&bash),
                None => serde_json::json!({ "enabled": false }),
            }))
        },
        memory_max_facts: config.memory.max_facts,
        memory_identities: MemoryIdentities::from_config(&config.memory),
        subagents: subagents.clone(),
        skills: Arc::clone(&skills),
        pairing,
        // The last use: nothing else may hold the store once the app has drained.
        approvals,
        started: std::time::Instant::now(),
        admin,
    });
    let grace = Duration::from_secs(server.shutdown_grace_secs);
    let local = listener.local_addr()?;
    if let Some(waiting) = waiting {
        waiting.stop().await;
    }
    let listeners = serve_listeners(&config, state, &webhooks, listener, &http_stop).await?;
    tracing::info!(address = %local, startup_ms = started.elapsed().as_millis() as u64, "antler is serving");

    let lease_lost = stops.lease_lost.clone();
    tokio::select! {
        () = shutdown => {}
        () = lease_lost.cancelled() => {}
    }
    let intake_tasks = [Some(sweeper), slack_socket, feishu_socket]
        .into_iter()
        .flatten()
        .chain(singletons)
        .collect();
    Shutdown {
        stops,
        grace,
        turns,
        deliveries,
        subagents,
        listeners,
        probe,
        memory_worker,
        memory_flush: Duration::from_secs(config.memory.shutdown_flush_secs),
        mcp,
        intake_tasks,
        lease_keeper,
        owner,
        store,
    }
    .drain()
    .await
}

/// The Discord Gateway's reader when `channels.discord.gateway` is on: @mentions and DMs
/// into the ingress, until `stop`.
async fn discord_gateway(
    config: &Config,
    channel: Option<Arc<DiscordChannel>>,
    ingress: &Ingress,
    stop: &CancellationToken,
) -> Result<Option<tokio::task::JoinHandle<()>>, AppError> {
    let discord = &config.channels.discord;
    let Some(channel) = channel.filter(|_| discord.enabled && discord.gateway) else {
        return Ok(None);
    };
    let gateway = antler_discord::DiscordGateway::start(
        &exposed(&discord.bot_token),
        &discord.api_url,
        crate::now_ms,
    )
    .await
    .map_err(|e| AppError::Channel(format!("channels.discord.gateway: {e}")))?;
    Ok(Some(tokio::spawn(crate::intake::read_discord_gateway(
        gateway,
        channel,
        ingress.clone(),
        stop.clone(),
    ))))
}

/// Serves the app on `listener` and, with `server.ops_listen`, the ops endpoints on their own
/// address, until `stop` (each draining for `server.shutdown_grace_secs`).
async fn serve_listeners(
    config: &Config,
    state: AppState,
    webhooks: &[Arc<dyn Channel>],
    listener: TcpListener,
    stop: &CancellationToken,
) -> Result<Vec<tokio::task::JoinHandle<()>>, AppError> {
    let server = &config.server;
    let limits = ServeLimits {
        max_connections: server.max_connections,
        header_read_timeout: Duration::from_secs(server.header_read_timeout_secs),
    };
    let grace = Duration::from_secs(server.shutdown_grace_secs);
    let mut listeners = Vec::new();
    if let Some(address) = server.ops_listen {
        let ops = TcpListener::bind(address).await.map_err(|e| {
            AppError::Bind(format!("server.ops_listen: cannot bind {address}: {e}"))
        })?;
        tracing::info!(address = %ops.local_addr()?, "ops endpoints are served here");
        listeners.push(tokio::spawn(serve_http(
            ops,
            ops_router(state.clone()),
            limits,
            stop.clone(),
            grace,
        )));
    }
    let app = router(
        state,
        config.channels.api.enabled,
        server.ops_listen.is_some(),
        webhooks,
    );
    listeners.push(tokio::spawn(serve_http(
        listener,
        app,
        limits,
        stop.clone(),
        grace,
    )));
    Ok(listeners)
}

/// The admin page's part of the state: where it is served (the ops listener when there is
/// one) decides whether it may be served without an admin token (on loopback only).
fn admin_context(config: &Config, auth: &ApiAuth, delivery: Delivery) -> AdminContext {
    let server = &config.server;
    let listen = server.ops_listen.unwrap_or(server.listen);
    let tokenless = !auth.has_admin_token();
    let only_users = tokenless && !auth.is_open();
    let loopback = listen.ip().is_loopback();
    AdminContext {
        sessions: Sessions::new(
            server
                .public_url
                .as_deref()
                .is_some_and(|url| url.starts_with("https://")),
        ),
        open: auth.is_open() && loopback,
        closed: (auth.is_open() && !loopback) || only_users,
        config_summary: config.summary(),
        delivery,
        trace_url: config.telemetry.trace_url.clone(),
    }
}

/// How delivery tries again, from `[delivery]`.
fn delivery_retry(config: &Config) -> RetryPolicy {
    RetryPolicy {
        max_attempts: config.delivery.max_attempts,
        backoff_base: Duration::from_millis(config.delivery.backoff_base_ms),
        backoff_max: Duration::from_secs(config.delivery.backoff_max_secs),
    }
}

/// The skills of `[skills]`, read once at start; each one left out is logged with its file and
/// the reason (`check-config` and `doctor` list them too), and antler serves without it.
async fn load_skills(config: &Config) -> Arc<Catalogue> {
    let cfg = config.skills.clone();
    let catalogue = tokio::task::spawn_blocking(move || skills::load(&cfg))
        .await
        .unwrap_or_default();
    for invalid in &catalogue.invalid {
        tracing::warn!(file = %invalid.file.display(), reason = %invalid.reason, "skill left out");
    }
    tracing::info!(
        skills = ?catalogue.skills.keys().collect::<Vec<_>>(),
        "skills loaded"
    );
    Arc::new(catalogue)
}

/// `[[commands]]`, audited in the store's folder, their output bounded like the shell's.
fn operator_commands(config: &Config) -> crate::opcommands::OperatorCommands {
    crate::opcommands::OperatorCommands::from_config(
        &config.commands,
        &config.store.path,
        config
            .agent
            .tools
            .bash
            .max_output_bytes
            .clamp(1, crate::agent::tools::bash::MAX_OUTPUT_BYTES_LIMIT),
    )
}

/// The config's `[[schedules]]`, read (validation checked them already).
fn config_schedules(config: &Config) -> Result<Vec<Schedule>, AppError> {
    config
        .schedules
        .iter()
        .map(|entry| {
            entry
                .schedule(&config.agent.timezone)
                .map_err(|e| AppError::Schedule(format!("schedules `{}`: {e}", entry.name)))
        })
        .collect()
}

fn turn_settings(
    config: &Config,
    skills: &Arc<Live<Catalogue>>,
    pairing: &Arc<Pairing>,
    commands: crate::opcommands::OperatorCommands,
    schedules: &Arc<Schedules>,
    approvals: &Arc<Approvals>,
) -> TurnSettings {
    TurnSettings {
        commands,
        schedules: Arc::clone(schedules),
        approvals: Arc::clone(approvals),
        pairing: Some(Arc::clone(pairing)),
        skills: Arc::clone(skills),
        max_attempts: config.agent.max_turn_attempts,
        turn_timeout: Duration::from_secs(config.agent.turn_timeout_secs),
        max_attachment_bytes: config.agent.max_attachment_bytes,
        todo: config.agent.middleware.todo.clone(),
        trace_url: config.telemetry.trace_url.clone(),
        memory_identities: MemoryIdentities::from_config(&config.memory),
        memory_groups: GroupPolicy::from_config(&config.memory),
    }
}

/// Warns for each enabled platform anyone may talk to. The API channel is left out: its
/// tokens already decide who reaches it.
fn warn_open_channels(config: &Config, access: &Access) {
    for name in config.channels.enabled_platforms() {
        if access.is_open(name) {
            tracing::warn!(
                channel = name,
                "channels.{name}.dm_policy is \"open\": anyone who can reach the bot may talk \
                 to it"
            );
        }
    }
}

/// Opens the store `[store]` names. A PostgreSQL database that does not answer is tried
/// again with backoff (0.5 s doubling to 30 s) while `waiting` says so, until `shutdown`
/// (`None`); any other failure, or any failure of sled's, ends the start.
async fn open_store(
    settings: &StoreConfig,
    owner: &str,
    waiting: Option<&WaitingServer>,
    shutdown: impl Future<Output = ()>,
) -> Result<Option<Arc<dyn Store>>, AppError> {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut backoff = Duration::from_millis(500);
    loop {
        match store_backend::open_as(settings, Some(owner)).await {
            Ok(store) => {
                if let Some(waiting) = waiting {
                    waiting.set(Waiting::Starting);
                }
                return Ok(Some(store));
            }
            Err(e) if e.is_retryable() && waiting.is_some() => {
                tracing::warn!(
                    error = %e,
                    retry_in_ms = backoff.as_millis() as u64,
                    "the database does not answer; antler is not ready until it does"
                );
                metrics::counter!("antler_store_errors_total", "retryable" => "true").increment(1);
                if let Some(waiting) = waiting {
                    waiting.set(Waiting::Database);
                }
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = &mut shutdown => return Ok(None),
                }
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// This process's name in logs and leases: `store.replica`, else the host name and the
/// process id.
fn replica_name(settings: &StoreConfig) -> String {
    settings.replica.clone().unwrap_or_else(|| {
        let host = rustix::system::uname();
        format!(
            "{}-{}",
            host.nodename().to_string_lossy(),
            std::process::id()
        )
    })
}

/// Claims the store's lease for this process (`owner`) and starts renewing it: the store's
/// work is this process's from here. With sled, the store's file lock already keeps other
/// processes out, so the claim only tells how the last owner left. Returns the renewer,
/// which stops when dropped: a start that fails later lets go of the store.
async fn claim_lease(
    store: &Arc<dyn Store>,
    owner: &str,
    settings: &StoreConfig,
    stops: &Stops,
) -> Result<AbortOnDropHandle<()>, AppError> {
    let lease = Duration::from_secs(settings.lease_secs);
    let now = crate::now_ms();
    match store.claim(owner, now, now + millis(lease)).await? {
        Claimed::Expired { owner: previous } => {
            tracing::info!(
                previous,
                "the last antler on this store stopped unexpectedly"
            );
        }
        Claimed::First | Claimed::Released { .. } | Claimed::Held => {}
    }
    Ok(AbortOnDropHandle::new(tokio::spawn(keep_lease(
        Arc::clone(store),
        owner.to_owned(),
        lease,
        stops.lease.clone(),
        stops.lease_lost.clone(),
    ))))
}

/// Marks this replica alive in a store shared with others and keeps the mark renewed
/// ([`RENEWALS_PER_LEASE`] times per `store.lease_secs`). If the mark ran out anyway (the
/// database was out of reach for longer than that), the others have adopted this replica's
/// conversations: `lease_lost` is cancelled and this process stops.
async fn join_replicas(
    store: &Arc<dyn Store>,
    settings: &StoreConfig,
    stops: &Stops,
) -> Result<AbortOnDropHandle<()>, AppError> {
    store_backend::check_shared_folder(store.as_ref(), &settings.path)
        .await
        .map_err(|e| AppError::Store(e.to_string()))?;
    let lease = Duration::from_secs(settings.lease_secs);
    store.mark_alive(millis(lease), true).await?;
    tracing::info!(
        replica = replica_name(settings),
        "joined the replicas sharing this store"
    );
    let renewing = Arc::clone(store);
    Ok(AbortOnDropHandle::new(tokio::spawn(renew_every(
        lease,
        "this replica's mark",
        move || {
            let store = Arc::clone(&renewing);
            async move { store.mark_alive(millis(lease), false).await }
        },
        stops.lease.clone(),
        stops.lease_lost.clone(),
    ))))
}

/// What the last process left to do.
#[derive(Default)]
struct Resumed {
    inbox: Vec<InboxItem>,
    outbox: Vec<OutboxItem>,
}

/// Resumes what the last process left, once its lease is gone: interrupted subagents fail
/// (what they left unfinished is unfinished for good), and the inbox and the replies still to
/// deliver are read to be queued again.
async fn resume(store: &dyn Store) -> Result<Resumed, AppError> {
    let failed = store
        .fail_unfinished_subagents(INTERRUPTED, crate::now_ms())
        .await?;
    let inbox = store.inbox().await?;
    let outbox = store.outbox_pending().await?;
    if !inbox.is_empty() || !outbox.is_empty() || failed > 0 {
        tracing::info!(
            inbox = inbox.len(),
            outbox = outbox.len(),
            subagents_failed = failed,
            "resuming after restart"
        );
    }
    Ok(Resumed { inbox, outbox })
}

/// A duration in whole milliseconds, saturating.
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Renews the store's lease of length `lease` [`RENEWALS_PER_LEASE`] times within it until
/// `stop`. If another owner took it, cancels `lost`, which stops this process: two processes
/// must never work on one store. A store that is unavailable for a moment is tried again at
/// the next renewal.
async fn keep_lease(
    store: Arc<dyn Store>,
    owner: String,
    lease: Duration,
    stop: CancellationToken,
    lost: CancellationToken,
) {
    renew_every(
        lease,
        "the store's lease",
        move || {
            let store = Arc::clone(&store);
            let owner = owner.clone();
            async move {
                let until = crate::now_ms().saturating_add(millis(lease));
                store.renew(&owner, until).await
            }
        },
        stop,
        lost,
    )
    .await;
}

/// Calls `renew` [`RENEWALS_PER_LEASE`] times per `lease` until `stop`; a retryable failure
/// is tried again at the next renewal, any other cancels `lost` and ends it.
async fn renew_every<F, Fut>(
    lease: Duration,
    what: &'static str,
    renew: F,
    stop: CancellationToken,
    lost: CancellationToken,
) where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<(), StoreError>>,
{
    let mut every = tokio::time::interval(lease / RENEWALS_PER_LEASE);
    every.tick().await;
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = stop.cancelled() => return,
        }
        match renew().await {
            Ok(()) => {}
            Err(e) if e.is_retryable() => {
                tracing::warn!(error = %e, "cannot renew {what}; trying again");
                metrics::counter!("antler_store_errors_total", "retryable" => "true").increment(1);
            }
            Err(e) => {
                tracing::error!(error = %e, "lost {what}; stopping");
                metrics::counter!("antler_store_errors_total", "retryable" => "false").increment(1);
                lost.cancel();
                return;
            }
        }
    }
}

async fn sweep(
    store: Arc<dyn Store>,
    metrics: PrometheusHandle,
    retain: Duration,
    stop: CancellationToken,
) {
    let retain_ms = u64::try_from(retain.as_millis()).unwrap_or(u64::MAX);
    let period = (retain / 2).clamp(Duration::from_secs(1), SWEEP_EVERY);
    let mut every = tokio::time::interval(period);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = stop.cancelled() => return,
        }
        metrics.run_upkeep();
        match store.sweep(crate::now_ms(), retain_ms).await {
            Ok(0) => {}
            Ok(removed) => {
                metrics::counter!("antler_store_swept_total").increment(removed as u64);
                tracing::debug!(removed, "swept expired records");
            }
            Err(e) => tracing::warn!(error = %e, "sweep failed"),
        }
    }
}

mod shutdown;
mod singletons;
pub(crate) mod store_backend;
mod waiting;

use shutdown::{Shutdown, Stops};
use waiting::{Waiting, WaitingServer};

#[cfg(test)]
mod schedule_tests;
#[cfg(test)]
mod tool_tests;

#[cfg(test)]
mod tests {
    use crate::store::{
        Accept, Accepted, FinishTurn, InboxStore, LeaseStore, OutboxStatus, OutboxStore, SledStore,
        ThreadChoice,
    };
    use antler_channel::{InboundEvent, OutboundMessage};

    use super::*;

    #[test]
    fn the_default_chain_and_registry_hold_the_shell_and_its_guards_in_order() {
        let config = Config::default();
        let store: Arc<dyn Store> = Arc::new(crate::store::MemStore::new());
        let approvals = Approvals::new(Arc::clone(&store), config.approvals.clone());
        let chain = middleware_chain(&config, &store, &Arc::default(), &approvals).unwrap();
        assert_eq!(
            chain.names(),
            config.middleware_names(),
            "config and chain agree"
        );
        let names = chain.names();
        let at = |name: &str| names.iter().position(|n| *n == name).unwrap();
        assert!(at("uploads") < at("input_sanitization"));
        assert!(at("input_sanitization") < at("dangling_tool_call"));
        assert_eq!(at("sandbox_audit"), at("guardrail") + 1);
        assert_eq!(at("memory"), at("title") + 1);
        let sandbox = Sandbox::new(
            Backend::None,
            false,
            crate::sandbox::SandboxLimits::default(),
            std::path::PathBuf::from("/antler"),
            None,
        );
        let registry = |config: &Config, shell: Option<&ShellProbe>| {
            tool_registry(config, Vec::new(), &McpServers::default(), shell)
        };
        let admin = crate::agent::input::Author {
            channel: "api".to_owned(),
            user_id: "op".to_owned(),
            name: None,
            role: crate::agent::input::Role::Admin,
        };
        let offered = |registry: &ToolRegistry| {
            registry
                .specs_for(&admin)
                .iter()
                .any(|spec| spec.name == "bash")
        };
        let (found, done) = ShellProbe::pending();
        let policy = shell_policy(&config, Some(&found));
        assert!(
            !offered(&registry(&config, Some(&found))),
            "not before the probe"
        );
        assert!(
            !policy(admin.role),
            "no bash subagents before the probe either"
        );
        done.settle(
            Some(BashTool::new(&config.agent.tools.bash, sandbox)),
            serde_json::json!({}),
            None,
        );
        assert!(offered(&registry(&config, Some(&found))));
        assert!(policy(admin.role));
        assert!(!policy(crate::agent::input::Role::User), "the guardrail's");
        // No sandbox works: no shell.
        let (none, done) = ShellProbe::pending();
        done.settle(None, serde_json::json!({}), None);
        assert!(!offered(&registry(&config, Some(&none))));
        assert!(!shell_policy(&config, Some(&none))(admin.role));

        let mut off = Config::default();
        off.agent.tools.bash.enabled = false;
        off.agent.middleware.sandbox_audit.enabled = false;
        off.agent.middleware.input_sanitization.enabled = false;
        assert!(!registry(&off, Some(&found)).contains("bash"));
        off.memory.enabled = false;
        let names = middleware_chain(&off, &store, &Arc::default(), &approvals)
            .unwrap()
            .names();
        assert!(!names.contains(&"memory"));
        assert_eq!(names, off.middleware_names());
        assert!(!names.contains(&"sandbox_audit") && !names.contains(&"input_sanitization"));
    }

    /// A clean stop lets go of the store at once: nothing of the app still holds it when the
    /// drain is over (it used to wait out its 5 s bound, and warn, on every stop).
    #[tokio::test]
    async fn a_clean_stop_releases_the_store_without_waiting_for_it() {
        // A current-thread runtime: `serve` and what it spawns log on this thread.
        let logs = crate::test_support::capture_logs(tracing::Level::INFO);
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::default();
        config.store.path = dir.path().join("store");
        config.model.base_url = "http://127.0.0.1:9/v1".to_owned();
        config.agent.tools.bash.enabled = false;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        serve(config, listener, async {}).await.unwrap();
        let text = logs.text();
        assert!(text.contains("stopped"), "{text}");
        assert!(!text.contains("still in use"), "{text}");
        let store =
            SledStore::open(&dir.path().join("store"), 1 << 20).expect("the store is free again");
        // And its lease was given up: the next owner knows the last one stopped cleanly.
        let claimed = store.claim("next", 0, 1).await.unwrap();
        assert!(
            matches!(&claimed, Claimed::Released { owner }
                if owner.contains(&format!("-{}/", std::process::id()))),
            "{claimed:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_start_that_fails_after_claiming_the_lease_lets_go_of_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::default();
        config.store.path = dir.path().join("store");
        // Found after the lease was claimed.
        config.model.base_url = "not a url".to_owned();
        config.agent.tools.bash.enabled = false;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let error = serve(config, listener, async {}).await.unwrap_err();
        assert!(error.to_string().contains("model"), "{error}");
        // Nothing goes on renewing the lease, so nothing holds the store.
        let store =
            SledStore::open(&dir.path().join("store"), 1 << 20).expect("the store is free again");
        let claimed = store.claim("next", 0, 1).await.unwrap();
        assert!(
            matches!(&claimed, Claimed::Expired { owner }
                if owner.contains(&format!("-{}/", std::process::id()))),
            "a failed start never released it: {claimed:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_taken_over_by_another_owner_stops_this_process() {
        let store: Arc<dyn Store> = Arc::new(crate::store::MemStore::new());
        store.claim("a", 0, 1).await.unwrap();
        let (stop, lost) = (CancellationToken::new(), CancellationToken::new());
        let lease = Duration::from_secs(15);
        let keeper = tokio::spawn(keep_lease(
            Arc::clone(&store),
            "a".to_owned(),
            lease,
            stop.clone(),
            lost.clone(),
        ));
        // Renewals keep it while it is ours.
        tokio::time::sleep(lease).await;
        assert!(!lost.is_cancelled());
        // Another owner takes it (here: after a release, as a second process would once
        // the lease had run out).
        store.release("a").await.unwrap();
        store.claim("b", 0, u64::MAX).await.unwrap();
        tokio::time::sleep(lease / 2).await;
        assert!(lost.is_cancelled(), "the next renewal notices");
        keeper.await.unwrap();
        assert!(!stop.is_cancelled());
    }

    /// The state a crash leaves right after a turn finished and before its reply went out: the
    /// reply is in the outbox, pending. The next start delivers it, once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reply_left_by_a_crash_after_the_turn_is_delivered_on_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store");
        let seq = {
            let store = SledStore::open(&path, 8 << 20).unwrap();
            let event = InboundEvent {
                reply_to: Some("m1".to_owned()),
                ..crate::test_support::event("c", "m1", "hi")
            };
            let Accepted::New(item) = store
                .accept(Accept {
                    dedupe_ttl_ms: 60_000,
                    trace: crate::telemetry::TraceContext::fresh(),
                    event: event.clone(),
                    thread: ThreadChoice::Current,
                    now_ms: 1,
                })
                .await
                .unwrap()
            else {
                panic!("a new message");
            };
            store.start_turn(item.seq).await.unwrap();
            store
                .finish_turn(FinishTurn {
                    inbox_seq: item.seq,
                    trace: crate::telemetry::TraceContext::fresh(),
                    thread: None,
                    replies: vec![OutboundMessage {
                        prompts: Vec::new(),
                        idempotency_key: format!("{}:{}:0", item.thread_id, item.seq),
                        conversation: event.conversation,
                        thread_id: item.thread_id.clone(),
                        text: "hello".to_owned(),
                        reply_to: Some("m1".to_owned()),
                        files: Vec::new(),
                        reply_context: None,
                    }],
                    memory_update: None,
                    draft: None,
                    now_ms: 2,
                    absorbed: Vec::new(),
                })
                .await
                .unwrap();
            // The process dies here: the store is closed with the reply still pending.
            item.seq
        };

        let mut config = Config::default();
        config.store.path = path.clone();
        config.model.base_url = "http://127.0.0.1:9/v1".to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let readyz = format!("http://{}/readyz", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(config, listener, async move {
            let _ = stopped.await;
        }));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready: serde_json::Value = match reqwest::get(&readyz).await {
                Ok(response) => response.json().await.unwrap_or_default(),
                Err(_) => serde_json::Value::Null,
            };
            if ready["outbox_pending"] == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the reply was never delivered; /readyz says {ready}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = stop.send(());
        server.await.unwrap().unwrap();

        let store = SledStore::open(&path, 8 << 20).unwrap();
        let replies = store.replies(seq).await.unwrap();
        assert_eq!(replies.len(), 1);
        assert_eq!(replies[0].status, OutboxStatus::Sent);
        assert_eq!(replies[0].attempts, 1, "sent once");
        assert!(replies[0].receipt.is_some());
        assert!(
            store.inbox().await.unwrap().is_empty(),
            "the turn did not run again"
        );
    }
}
