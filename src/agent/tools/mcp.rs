//! MCP servers' tools: the servers in `[[mcp.servers]]` are started (stdio: a child process)
//! or connected (streamable HTTP) at startup with rmcp's client, and each server's tools join
//! the registry as `mcp__<server>__<tool>` ([`tool_name`]: the OpenAI name charset, at most 64
//! characters). A call goes to `call_tool` on its server within the server's `timeout_secs`
//! (and the tool deadline); text parts come back to the model, other parts are described.
//!
//! Everything a server says is untrusted: descriptions and results are cut to size, framework
//! tags in results are neutralised, errors are cut and have the server's configured secrets
//! (env values, header values, the bearer token) masked before the model or the log sees them,
//! and so are its command-line arguments ([`McpServerConfig::hidden`]). Servers connect
//! concurrently, each within `connect_timeout_secs`, so startup never hangs on one. A server
//! that fails to start or list its tools is logged (warn) and reported in `/readyz` detail, and
//! antler serves without it: readiness stays ready, since one broken optional tool source is
//! not a broken gateway. A stdio server gets only a small safe environment (PATH, HOME, LANG,
//! ...) plus its configured `env`, never antler's own secrets, and is killed when antler stops
//! (or when its connection is dropped). In the chain, MCP tools are not core tools: with many
//! of them they sit behind `deferred_tools`' `tool_search`.
//!
//! A connected server whose connection ends (a stdio server that crashed or was killed, an
//! HTTP session that broke) is started or connected again by its supervisor ([`supervise`]),
//! with the backoff of [`RESTART`]; meanwhile its tools answer that it is restarting, and
//! `/readyz` shows it not ok. A message over [`MAX_MESSAGE_BYTES`] (the transport's limit) is
//! dropped, and its call answers that the result was too large rather than waiting for its
//! timeout.

mod stdio;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock, ResourceContents};
use rmcp::service::{Peer, RoleClient, RunningService, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncBufReadExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{Tool, ToolContext, ToolError};
use crate::agent::model::ToolSpec;
use crate::retry::RetryPolicy;
use crate::secret::Secret;

/// The longest tool name the OpenAI API accepts.
pub(crate) const MAX_TOOL_NAME: usize = 64;
/// Tools taken from one server at most.
pub(crate) const MAX_TOOLS_PER_SERVER: usize = 128;
/// A tool description is cut to this many characters.
const MAX_DESCRIPTION_CHARS: usize = 2000;
/// A parameter schema larger than this (as JSON) leaves its tool out.
const MAX_SCHEMA_BYTES: usize = 64 * 1024;
/// A result is cut to this many bytes (tool_output_budget may cut it further).
const MAX_RESULT_BYTES: usize = 512 * 1024;
/// The largest message taken from a server: one stdio line, one HTTP body or SSE event (rmcp's
/// own default for each). A larger result is dropped and reported as too large.
pub(crate) const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// An error text from a server is cut to this many characters.
const MAX_ERROR_CHARS: usize = 500;
/// A line a stdio server writes to stderr is logged cut to this many characters.
const MAX_STDERR_LINE_CHARS: usize = 500;
/// The last stderr line of a stdio server that failed to start is quoted cut to this.
const MAX_LAST_WORDS_CHARS: usize = 200;
/// How long the stderr of a stdio server that failed to start is read for its last line.
const LAST_WORDS_WAIT: Duration = Duration::from_secs(2);
/// The longest server name.
pub(crate) const MAX_SERVER_NAME: usize = 32;
/// Restarting a server whose connection ended: attempts in a row (an attempt whose server then
/// ran less than [`STABLE_UPTIME`] counts as failed too) before it is given up, and the backoff
/// before each (exponential, jittered, capped).
pub(crate) const RESTART: RetryPolicy = RetryPolicy {
    max_attempts: 10,
    backoff_base: Duration::from_secs(1),
    backoff_max: Duration::from_secs(60),
};
/// A server that ran this long before its connection ended has its restart attempts counted
/// from one again: it was not crashing in a loop.
const STABLE_UPTIME: Duration = Duration::from_secs(60);
/// The variables of antler's environment a stdio server inherits (MCP's usual safe set).
const INHERITED_ENV: [&str; 9] = [
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "TMPDIR", "TZ",
];

/// One `[[mcp.servers]]` entry: a stdio command or a streamable-HTTP URL.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct McpServerConfig {
    /// The server's name in tool names (`mcp__<name>__<tool>`): letters, digits, `_`, `-`.
    #[serde(deserialize_with = "crate::secret::string")]
    pub(crate) name: String,
    /// Whether it is started.
    pub(crate) enabled: bool,
    /// stdio: the program to run.
    #[serde(deserialize_with = "crate::secret::opt_string")]
    pub(crate) command: Option<String>,
    /// stdio: its arguments.
    #[serde(deserialize_with = "crate::secret::strings")]
    pub(crate) args: Vec<String>,
    /// stdio: environment variables set for it (secrets).
    pub(crate) env: BTreeMap<String, Secret>,
    /// Streamable HTTP: the endpoint.
    #[serde(deserialize_with = "crate::secret::opt_string")]
    pub(crate) url: Option<String>,
    /// Streamable HTTP: headers sent with every request (secrets).
    pub(crate) headers: BTreeMap<String, Secret>,
    /// Streamable HTTP: sent as `Authorization: Bearer <token>`.
    #[serde(deserialize_with = "crate::secret::opt_secret")]
    pub(crate) bearer_token: Option<Secret>,
    /// The time limit of one tool call.
    pub(crate) timeout_secs: u64,
    /// The time limit of starting, connecting and listing the tools.
    pub(crate) connect_timeout_secs: u64,
}

impl Default for McpServerConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            enabled: true,
            command: None,
            args: Vec::new(),
            env: BTreeMap::new(),
            url: None,
            headers: BTreeMap::new(),
            bearer_token: None,
            timeout_secs: 60,
            connect_timeout_secs: 20,
        }
    }
}

impl std::fmt::Debug for McpServerConfig {
    /// Names and shapes only: values of `env`, `headers`, the token and any URL password are
    /// never shown, and neither are `args` (which may carry a token).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServerConfig")
            .field("name", &self.name)
            .field("enabled", &self.enabled)
            .field("command", &self.command)
            .field("args", &self.args.len())
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("url", &self.url.as_deref().map(crate::secret::mask_url))
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("bearer_token", &self.bearer_token)
            .field("timeout_secs", &self.timeout_secs)
            .field("connect_timeout_secs", &self.connect_timeout_secs)
            .finish()
    }
}

impl McpServerConfig {
    /// `stdio` or `http`.
    pub(crate) fn transport(&self) -> &'static str {
        if self.url.is_some() { "http" } else { "stdio" }
    }

    /// The secret values of this server, masked in everything it says (results included).
    fn secrets(&self) -> Vec<String> {
        self.env
            .values()
            .chain(self.headers.values())
            .chain(self.bearer_token.iter())
            .map(|s| s.expose().to_owned())
            .filter(|s| s.len() >= 4)
            .collect()
    }

    /// [`Self::secrets`] and the values among `args`, masked in errors, logs and status: an
    /// argument may be a token (`--token sk-...`, `--key=...`). A flag (`-x`, `--name`) is not a
    /// value and stays readable; of `--name=value` the value is hidden. Results are masked with
    /// the secrets only, since arguments are often paths or URLs the results rightly name.
    fn hidden(&self) -> Vec<String> {
        let args = self.args.iter().filter_map(|arg| {
            if arg.starts_with('-') {
                arg.split_once('=').map(|(_, value)| value)
            } else {
                Some(arg.as_str())
            }
        });
        let mut hidden: Vec<String> = self
            .secrets()
            .into_iter()
            .chain(args.filter(|s| s.len() >= 4).map(str::to_owned))
            .collect();
        // Longest first, so a value containing a shorter one is masked whole.
        hidden.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        hidden.dedup();
        hidden
    }
}

/// Whether `name` may name a server: 1 to [`MAX_SERVER_NAME`] of `[A-Za-z0-9_-]`, not
/// containing `__` (the separator in tool names).
pub(crate) fn is_valid_server_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_SERVER_NAME
        && !name.contains("__")
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// How one configured server is doing, for `/readyz` and `antler doctor`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct McpServerStatus {
    /// The server's name.
    pub(crate) name: String,
    /// `stdio` or `http`.
    pub(crate) transport: &'static str,
    /// Whether it is connected.
    pub(crate) ok: bool,
    /// Tools it added.
    pub(crate) tools: usize,
    /// Why it is not connected (short, secrets and arguments masked).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    /// How often it was restarted (or reconnected) after its connection ended.
    #[serde(skip_serializing_if = "is_zero")]
    pub(crate) restarts: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Why a server could not be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum McpError {
    /// The child process did not start.
    #[error("cannot start the command: {0}")]
    Spawn(String),
    /// A header name or value is not valid HTTP.
    #[error("header `{0}` is not valid")]
    Header(String),
    /// The MCP handshake failed.
    #[error("the handshake failed: {0}")]
    Handshake(String),
    /// Listing the tools failed.
    #[error("listing the tools failed: {0}")]
    List(String),
    /// Starting and listing took too long.
    #[error("no answer within {0} seconds")]
    Timeout(u64),
}

/// How servers are kept: the restart policy and the largest message taken from a server
/// ([`RESTART`] and [`MAX_MESSAGE_BYTES`]; tests use smaller ones).
#[derive(Debug, Clone, Copy)]
pub(crate) struct McpTuning {
    pub(crate) restart: RetryPolicy,
    pub(crate) max_message_bytes: usize,
}

impl Default for McpTuning {
    fn default() -> Self {
        Self {
            restart: RESTART,
            max_message_bytes: MAX_MESSAGE_BYTES,
        }
    }
}

/// The connection of a connected server, as its tools see it.
#[derive(Debug, Clone)]
enum Link {
    /// Connected: calls go to this peer.
    Up(Peer<RoleClient>),
    /// The connection ended; restart `attempt` is next (after `last_error`, if one failed).
    Restarting {
        attempt: u32,
        last_error: Option<String>,
    },
    /// Every restart attempt failed; the tools stay unavailable.
    Down(String),
    /// antler is stopping.
    Stopped,
}

/// Recognises a transport's "too large" error, giving the limit it names.
type TooLarge = fn(&ServiceError) -> Option<u64>;

/// One server that connected at startup: shared by its tools, its supervisor and the status.
struct Server {
    name: String,
    transport: &'static str,
    tools: usize,
    link: watch::Sender<Link>,
    restarts: AtomicU32,
    /// The time limit of one call.
    timeout: Duration,
    /// Masked in results ([`McpServerConfig::secrets`]).
    secrets: Vec<String>,
    /// Masked in errors and logs ([`McpServerConfig::hidden`]).
    hidden: Vec<String>,
    too_large: TooLarge,
}

impl Server {
    /// `restarting` (stdio) or `reconnecting` (HTTP).
    fn restarting(&self) -> &'static str {
        if self.transport == "http" {
            "reconnecting"
        } else {
            "restarting"
        }
    }

    fn status(&self) -> McpServerStatus {
        let link = self.link.borrow().clone();
        let error = match link {
            Link::Up(_) => None,
            Link::Restarting {
                attempt,
                last_error,
            } => Some(match last_error {
                Some(error) => format!(
                    "the connection ended; {} (attempt {attempt}; the last failed: {error})",
                    self.restarting()
                ),
                None => format!(
                    "the connection ended; {} (attempt {attempt})",
                    self.restarting()
                ),
            }),
            Link::Down(reason) => Some(reason),
            Link::Stopped => Some("stopped".to_owned()),
        };
        McpServerStatus {
            name: self.name.clone(),
            transport: self.transport,
            ok: error.is_none(),
            tools: self.tools,
            error,
            restarts: self.restarts.load(Ordering::Relaxed),
        }
    }

    /// The peer to call, or what the tools answer while there is none.
    fn peer(&self) -> Result<Peer<RoleClient>, ToolError> {
        match &*self.link.borrow() {
            Link::Up(peer) => Ok(peer.clone()),
            link => Err(self.unavailable(link)),
        }
    }

    fn unavailable(&self, link: &Link) -> ToolError {
        ToolError::Failed(match link {
            Link::Up(_) | Link::Restarting { .. } => format!(
                "the MCP server `{}` is {}; try again shortly",
                self.name,
                self.restarting()
            ),
            Link::Down(_) => format!(
                "the MCP server `{}` stopped and could not be started again; its tools are \
                 unavailable until antler restarts",
                self.name
            ),
            Link::Stopped => format!(
                "the MCP server `{}` is stopped: antler is shutting down",
                self.name
            ),
        })
    }

    /// What the model is told when a call of `tool` failed with `error`.
    fn call_error(&self, tool: &str, error: &ServiceError) -> ToolError {
        if let Some(limit) = (self.too_large)(error) {
            metrics::counter!("antler_mcp_results_too_large_total", "server" => self.name.clone())
                .increment(1);
            return ToolError::Failed(format!(
                "the result of `{tool}` from the MCP server `{}` is larger than the limit of {} \
                 ({limit} bytes) and was dropped; ask for less at once",
                self.name,
                in_units(limit)
            ));
        }
        let ended = match error {
            ServiceError::TransportClosed => true,
            // A stdio server's pipe failing is its process gone.
            ServiceError::TransportSend(_) => self.transport == "stdio",
            _ => false,
        };
        if ended {
            // The connection ended under this call; the supervisor restarts it.
            return self.unavailable(&self.link.borrow());
        }
        self.failed(&error.to_string())
    }

    fn failed(&self, text: &str) -> ToolError {
        ToolError::Failed(format!(
            "the MCP server `{}` answered with an error: {}",
            self.name,
            mask(text, &self.hidden, MAX_ERROR_CHARS)
        ))
    }
}

/// `bytes` in MiB or KiB when it is a whole number of them (limits usually are).
fn in_units(bytes: u64) -> String {
    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * KIB;
    if bytes >= MIB && bytes % MIB == 0 {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= KIB && bytes % KIB == 0 {
        format!("{} KiB", bytes / KIB)
    } else {
        format!("{bytes} bytes")
    }
}

/// Each enabled server's status, read live: a restart shows as it happens. Cloning shares it.
#[derive(Clone, Default)]
pub(crate) struct McpStatus(Arc<Vec<Entry>>);

enum Entry {
    /// A server that did not come up at startup.
    Failed(McpServerStatus),
    Connected(Arc<Server>),
}

impl McpStatus {
    /// Each enabled server's status now, in config order.
    pub(crate) fn snapshot(&self) -> Vec<McpServerStatus> {
        self.0
            .iter()
            .map(|entry| match entry {
                Entry::Failed(status) => status.clone(),
                Entry::Connected(server) => server.status(),
            })
            .collect()
    }
}

impl std::fmt::Debug for McpStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.snapshot()).finish()
    }
}

impl Serialize for McpStatus {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.snapshot().serialize(serializer)
    }
}

/// The connected servers: their tools, their status, and their supervisors.
#[derive(Default)]
pub(crate) struct McpServers {
    tools: Vec<Arc<dyn Tool>>,
    status: McpStatus,
    supervisors: Vec<JoinHandle<()>>,
    /// Cancelled at shutdown (or drop): supervisors close their connections and end.
    stop: CancellationToken,
}

impl std::fmt::Debug for McpServers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServers")
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

impl Drop for McpServers {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl McpServers {
    /// Starts or connects every enabled server, concurrently, each within its connect time.
    /// Failures are logged and reported in [`McpServers::status`]; they never fail startup.
    pub(crate) async fn connect(servers: &[McpServerConfig]) -> Self {
        Self::connect_with(servers, McpTuning::default()).await
    }

    /// [`McpServers::connect`] with its own restart policy and message limit.
    pub(crate) async fn connect_with(servers: &[McpServerConfig], tuning: McpTuning) -> Self {
        let enabled: Vec<&McpServerConfig> = servers.iter().filter(|s| s.enabled).collect();
        if enabled.iter().any(|s| s.url.is_some()) {
            // rmcp's HTTP client is built without a TLS crypto provider of its own.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let results =
            futures_util::future::join_all(enabled.iter().map(|cfg| connect_one(cfg, &tuning)))
                .await;
        let mut out = Self::default();
        let mut entries = Vec::new();
        let mut taken: HashSet<String> = HashSet::new();
        for (cfg, result) in enabled.into_iter().zip(results) {
            match result {
                Ok(connected) => {
                    let mut specs = Vec::new();
                    for tool in connected.tools.iter().take(MAX_TOOLS_PER_SERVER) {
                        match tool_spec(cfg, tool, &taken) {
                            Some(spec) => {
                                taken.insert(spec.name.clone());
                                specs.push((spec, tool.name.to_string()));
                            }
                            None => tracing::warn!(
                                server = %cfg.name,
                                "an MCP tool with an oversized parameter schema was left out"
                            ),
                        }
                    }
                    let listed: BTreeSet<String> =
                        connected.tools.iter().map(|t| t.name.to_string()).collect();
                    let server = Arc::new(Server {
                        name: cfg.name.clone(),
                        transport: cfg.transport(),
                        tools: specs.len(),
                        link: watch::Sender::new(Link::Up(connected.running.peer().clone())),
                        restarts: AtomicU32::new(0),
                        timeout: Duration::from_secs(cfg.timeout_secs.max(1)),
                        secrets: cfg.secrets(),
                        hidden: cfg.hidden(),
                        too_large: connected.too_large,
                    });
                    for (spec, remote) in specs {
                        out.tools.push(Arc::new(McpTool {
                            spec,
                            remote,
                            server: Arc::clone(&server),
                        }));
                    }
                    tracing::info!(server = %cfg.name, transport = cfg.transport(), tools = server.tools, "MCP server connected");
                    entries.push(Entry::Connected(Arc::clone(&server)));
                    out.supervisors.push(tokio::spawn(supervise(
                        cfg.clone(),
                        server,
                        connected.running,
                        listed,
                        tuning,
                        out.stop.clone(),
                    )));
                }
                Err(e) => {
                    let reason = mask(&e.to_string(), &cfg.hidden(), MAX_ERROR_CHARS);
                    tracing::warn!(server = %cfg.name, transport = cfg.transport(), error = %reason, "MCP server unavailable; serving without its tools");
                    entries.push(Entry::Failed(McpServerStatus {
                        name: cfg.name.clone(),
                        transport: cfg.transport(),
                        ok: false,
                        tools: 0,
                        error: Some(reason),
                        restarts: 0,
                    }));
                }
            }
        }
        out.status = McpStatus(Arc::new(entries));
        out
    }

    /// The tools of every connected server.
    pub(crate) fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.tools.clone()
    }

    /// How each enabled server is doing now, in config order.
    pub(crate) fn status(&self) -> Vec<McpServerStatus> {
        self.status.snapshot()
    }

    /// The status, read live (for `/readyz`).
    pub(crate) fn live_status(&self) -> McpStatus {
        self.status.clone()
    }

    /// Closes every connection; stdio servers that do not stop in time are killed.
    pub(crate) async fn shutdown(mut self) {
        self.stop.cancel();
        let supervisors = std::mem::take(&mut self.supervisors);
        futures_util::future::join_all(supervisors).await;
    }
}

/// A server just started or connected, its tools listed.
struct Connected {
    running: RunningService<RoleClient, ()>,
    tools: Vec<rmcp::model::Tool>,
    too_large: TooLarge,
}

/// Keeps one server connected: when its connection ends (the process died, the session broke)
/// it is started or connected again after [`McpTuning::restart`]'s backoff. Attempts count up
/// until the server runs [`STABLE_UPTIME`] (a server that keeps crashing backs off further);
/// past the policy's `max_attempts` it is given up. Ends when `stop` is cancelled, closing the
/// connection.
async fn supervise(
    cfg: McpServerConfig,
    server: Arc<Server>,
    mut running: RunningService<RoleClient, ()>,
    listed: BTreeSet<String>,
    tuning: McpTuning,
    stop: CancellationToken,
) {
    let policy = tuning.restart;
    let mut attempt: u32 = 0;
    loop {
        let up_since = tokio::time::Instant::now();
        if !until_ended(running, &stop).await {
            server.link.send_replace(Link::Stopped);
            return;
        }
        if up_since.elapsed() >= STABLE_UPTIME {
            attempt = 0;
        }
        server.link.send_replace(Link::Restarting {
            attempt: attempt + 1,
            last_error: None,
        });
        tracing::warn!(server = %server.name, transport = server.transport, "the MCP server's connection ended; its tools answer that it is {} meanwhile", server.restarting());
        let mut last_error = String::new();
        running = loop {
            attempt += 1;
            if attempt > policy.max_attempts {
                let reason = format!(
                    "the connection ended, and {} attempts to start it again failed; the last: \
                     {last_error}",
                    policy.max_attempts
                );
                tracing::warn!(server = %server.name, attempts = policy.max_attempts, error = %last_error, "giving up on the MCP server; its tools stay unavailable");
                server.link.send_replace(Link::Down(reason));
                return;
            }
            let wait = policy.backoff(attempt);
            tracing::warn!(server = %server.name, attempt, wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX), "{} the MCP server after a backoff", server.restarting());
            tokio::select! {
                biased;
                () = stop.cancelled() => {
                    server.link.send_replace(Link::Stopped);
                    return;
                }
                () = tokio::time::sleep(wait) => {}
            }
            let result = tokio::select! {
                biased;
                () = stop.cancelled() => {
                    server.link.send_replace(Link::Stopped);
                    return;
                }
                result = connect_one(&cfg, &tuning) => result,
            };
            match result {
                Ok(connected) => {
                    metrics::counter!("antler_mcp_restarts_total", "server" => server.name.clone(), "outcome" => "ok").increment(1);
                    let now: BTreeSet<String> =
                        connected.tools.iter().map(|t| t.name.to_string()).collect();
                    if now != listed {
                        tracing::warn!(server = %server.name, "the MCP server lists other tools than at startup; antler offers the ones it listed then until it restarts");
                    }
                    server.restarts.fetch_add(1, Ordering::Relaxed);
                    server
                        .link
                        .send_replace(Link::Up(connected.running.peer().clone()));
                    tracing::info!(server = %server.name, attempt, "MCP server is back");
                    break connected.running;
                }
                Err(e) => {
                    metrics::counter!("antler_mcp_restarts_total", "server" => server.name.clone(), "outcome" => "failed").increment(1);
                    last_error = mask(&e.to_string(), &server.hidden, MAX_ERROR_CHARS);
                    tracing::warn!(server = %server.name, attempt, error = %last_error, "starting the MCP server again failed");
                    server.link.send_replace(Link::Restarting {
                        attempt: attempt + 1,
                        last_error: Some(last_error.clone()),
                    });
                }
            }
        };
    }
}

/// Waits until `running` ends (true), or `stop` is cancelled (false), then closes it: a stdio
/// server gets its time to exit before it is killed.
async fn until_ended(running: RunningService<RoleClient, ()>, stop: &CancellationToken) -> bool {
    let token = running.cancellation_token();
    let ended = running.waiting();
    tokio::pin!(ended);
    tokio::select! {
        _ = &mut ended => true,
        () = stop.cancelled() => {
            token.cancel();
            // The close waits up to SHUTDOWN_WAIT for the child, then kills it; this bound is
            // a backstop (dropping the wait leaves the kill on drop to the transport).
            let _ = tokio::time::timeout(stdio::SHUTDOWN_WAIT * 2, ended).await;
            false
        }
    }
}

/// The "too large" error of the streamable HTTP client `C` (whose type rmcp names only through
/// the transport): a response body over the limit.
fn http_too_large<C: StreamableHttpClient>(_: &StreamableHttpClientTransport<C>) -> TooLarge {
    fn check<C: StreamableHttpClient>(error: &ServiceError) -> Option<u64> {
        let ServiceError::TransportSend(error) = error else {
            return None;
        };
        match error
            .error
            .downcast_ref::<StreamableHttpError<C::Error>>()?
        {
            StreamableHttpError::ResponseBodyTooLarge { max_size } => u64::try_from(*max_size).ok(),
            _ => None,
        }
    }
    check::<C>
}

/// The "too large" error of the stdio transport (see [`stdio::LimitedLines`]).
fn stdio_too_large(error: &ServiceError) -> Option<u64> {
    match error {
        ServiceError::McpError(error) => stdio::too_large_limit(error),
        _ => None,
    }
}

/// Starts or connects one server and lists its tools, within its connect time.
async fn connect_one(cfg: &McpServerConfig, tuning: &McpTuning) -> Result<Connected, McpError> {
    let secs = cfg.connect_timeout_secs.max(1);
    tokio::time::timeout(Duration::from_secs(secs), async {
        let (running, too_large) = match &cfg.url {
            Some(url) => {
                let mut headers = std::collections::HashMap::new();
                for (name, value) in &cfg.headers {
                    let header_name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                        .map_err(|_| McpError::Header(name.clone()))?;
                    let header_value = reqwest::header::HeaderValue::from_str(value.expose())
                        .map_err(|_| McpError::Header(name.clone()))?;
                    headers.insert(header_name, header_value);
                }
                let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
                config.custom_headers = headers;
                config.auth_header = cfg.bearer_token.as_ref().map(|t| t.expose().to_owned());
                config.max_json_response_size = tuning.max_message_bytes;
                config.max_sse_event_size = tuning.max_message_bytes;
                let transport = StreamableHttpClientTransport::from_config(config);
                let too_large = http_too_large(&transport);
                let running =
                    ().serve(transport)
                        .await
                        .map_err(|e| McpError::Handshake(e.to_string()))?;
                (running, too_large)
            }
            None => {
                let (transport, stderr) = spawn(cfg, tuning.max_message_bytes)?;
                match ().serve(transport).await {
                    Ok(running) => (running, stdio_too_large as TooLarge),
                    Err(e) => {
                        // The child is killed with the transport; its stderr then ends.
                        let last = match stderr {
                            Some(task) => tokio::time::timeout(LAST_WORDS_WAIT, task)
                                .await
                                .ok()
                                .and_then(Result::ok)
                                .flatten(),
                            None => None,
                        };
                        return Err(McpError::Handshake(match last {
                            Some(line) => format!("{e}; its last words on stderr: {line}"),
                            None => e.to_string(),
                        }));
                    }
                }
            }
        };
        let tools = running
            .peer()
            .list_all_tools()
            .await
            .map_err(|e| McpError::List(e.to_string()))?;
        Ok(Connected {
            running,
            tools,
            too_large,
        })
    })
    .await
    .map_err(|_| McpError::Timeout(secs))?
}

/// The task logging a stdio server's stderr; it returns the last line (masked).
type StderrTask = JoinHandle<Option<String>>;

/// Spawns a stdio server: a small inherited environment plus its own, stderr to the log.
fn spawn(
    cfg: &McpServerConfig,
    limit: usize,
) -> Result<(stdio::ChildTransport, Option<StderrTask>), McpError> {
    let program = cfg
        .command
        .as_deref()
        .ok_or_else(|| McpError::Spawn("no command".to_owned()))?;
    let mut command = tokio::process::Command::new(program);
    command
        .args(&cfg.args)
        .env_clear()
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    for name in INHERITED_ENV {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    for (name, value) in &cfg.env {
        command.env(name, value.expose());
    }
    let mut child = command
        .spawn()
        .map_err(|e| McpError::Spawn(e.to_string()))?;
    let stderr = child.stderr.take().map(|stderr| {
        let server = cfg.name.clone();
        let hidden = cfg.hidden();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            let mut last = None;
            while let Ok(Some(line)) = lines.next_line().await {
                let line = mask(&line, &hidden, MAX_STDERR_LINE_CHARS);
                tracing::debug!(server = %server, line = %line, "MCP server stderr");
                if !line.trim().is_empty() {
                    last = Some(line);
                }
            }
            last.map(|line| mask(&line, &[], MAX_LAST_WORDS_CHARS))
        })
    });
    let transport = stdio::ChildTransport::new(child, &cfg.name, limit)
        .map_err(|e| McpError::Spawn(e.to_string()))?;
    Ok((transport, stderr))
}

/// The registry name of tool `tool` of server `server`: `mcp__<server>__<tool>` with every
/// character outside `[A-Za-z0-9_-]` replaced by `_`. A name longer than
/// [`MAX_TOOL_NAME`], or one already `taken`, is cut and ends in a hash of the original.
pub(crate) fn tool_name(server: &str, tool: &str, taken: &HashSet<String>) -> String {
    let raw = format!("mcp__{server}__{tool}");
    let clean: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.len() <= MAX_TOOL_NAME && !taken.contains(&clean) {
        return clean;
    }
    let mut hash: u32 = 0x811c_9dc5;
    for byte in raw.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    let suffix = format!("_{hash:08x}");
    // `clean` is ASCII, so any byte index is a character boundary.
    let keep = clean.len().min(MAX_TOOL_NAME - suffix.len());
    format!("{}{suffix}", &clean[..keep])
}

/// `text` cut to `max` characters, every secret in it replaced by `***`.
pub(crate) fn mask(text: &str, secrets: &[String], max: usize) -> String {
    let mut masked = text.to_owned();
    for secret in secrets {
        if masked.contains(secret.as_str()) {
            masked = masked.replace(secret.as_str(), "***");
        }
    }
    if masked.chars().count() > max {
        let mut cut: String = masked.chars().take(max).collect();
        cut.push('…');
        cut
    } else {
        masked
    }
}

/// One tool of one MCP server.
struct McpTool {
    spec: ToolSpec,
    /// The tool's name on its server.
    remote: String,
    server: Arc<Server>,
}

/// The spec of `tool` of server `cfg`, or `None` when its schema is too large to offer.
fn tool_spec(
    cfg: &McpServerConfig,
    tool: &rmcp::model::Tool,
    taken: &HashSet<String>,
) -> Option<ToolSpec> {
    let parameters = serde_json::Value::Object((*tool.input_schema).clone());
    if serde_json::to_vec(&parameters).map_or(true, |v| v.len() > MAX_SCHEMA_BYTES) {
        return None;
    }
    let description = tool
        .description
        .as_deref()
        .or(tool.title.as_deref())
        .unwrap_or("");
    let description: String = description.chars().take(MAX_DESCRIPTION_CHARS).collect();
    Some(ToolSpec {
        name: tool_name(&cfg.name, &tool.name, taken),
        description: format!("[MCP server `{}`] {description}", cfg.name),
        parameters,
    })
}

/// The model's view of a result: text parts as they are, other parts described.
fn render(result: &CallToolResult) -> String {
    let mut parts: Vec<String> = Vec::new();
    for block in &result.content {
        parts.push(match block {
            ContentBlock::Text(text) => text.text.clone(),
            ContentBlock::Image(image) => format!(
                "[image ({}, {} bytes of base64) not shown]",
                image.mime_type,
                image.data.len()
            ),
            ContentBlock::Audio(audio) => format!(
                "[audio ({}, {} bytes of base64) not shown]",
                audio.mime_type,
                audio.data.len()
            ),
            ContentBlock::Resource(resource) => match &resource.resource {
                ResourceContents::TextResourceContents { uri, text, .. } => {
                    format!("[resource {uri}]\n{text}")
                }
                ResourceContents::BlobResourceContents { uri, .. } => {
                    format!("[binary resource {uri} not shown]")
                }
                _ => "[a resource not shown]".to_owned(),
            },
            ContentBlock::ResourceLink(link) => format!("[resource link: {}]", link.uri),
            _ => "[a content part of an unknown kind, not shown]".to_owned(),
        });
    }
    if parts.is_empty() {
        if let Some(structured) = &result.structured_content {
            parts.push(structured.to_string());
        }
    }
    let mut text = parts.join("\n");
    if text.len() > MAX_RESULT_BYTES {
        let mut end = MAX_RESULT_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str(&format!("\n[cut at {MAX_RESULT_BYTES} bytes]"));
    }
    text
}

#[async_trait::async_trait]
impl Tool for McpTool {
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    async fn call(
        &self,
        arguments: serde_json::Value,
        _cx: &ToolContext,
    ) -> Result<String, ToolError> {
        let serde_json::Value::Object(arguments) = arguments else {
            return Err(ToolError::InvalidArguments(
                "the arguments must be a JSON object".to_owned(),
            ));
        };
        let peer = self.server.peer()?;
        let params = CallToolRequestParams::new(self.remote.clone()).with_arguments(arguments);
        let server = &self.server;
        let result = tokio::time::timeout(server.timeout, peer.call_tool(params))
            .await
            .map_err(|_| {
                ToolError::Failed(format!(
                    "the MCP server `{}` did not answer within {} seconds",
                    server.name,
                    server.timeout.as_secs()
                ))
            })?
            .map_err(|e| server.call_error(&self.remote, &e))?;
        let text = super::web_fetch::neutralize_tags(&render(&result));
        if result.is_error == Some(true) {
            return Err(server.failed(&text));
        }
        Ok(mask(&text, &server.secrets, MAX_RESULT_BYTES))
    }
}

#[cfg(test)]
mod tests;
