//! MCP servers' tools: the servers in `[[mcp.servers]]` are started (stdio: a child process)
//! or connected (streamable HTTP) at startup with rmcp's client, and each server's tools join
//! the registry as `mcp__<server>__<tool>` ([`tool_name`]: the OpenAI name charset, at most 64
//! characters). A call goes to `call_tool` on its server within the server's `timeout_secs`
//! (and the tool deadline); text parts come back to the model, other parts are described.
//!
//! Everything a server says is untrusted: descriptions and results are cut to size, framework
//! tags in results are neutralised, errors are cut and have the server's configured secrets
//! (env values, header values, the bearer token) masked before the model or the log sees them. Servers connect concurrently, each
//! within `connect_timeout_secs`, so startup never hangs on one. A server that fails to start
//! or list its tools is logged (warn) and reported in `/readyz` detail, and antler serves
//! without it: readiness stays ready, since one broken optional tool source is not a broken
//! gateway. A stdio server gets only a small safe environment (PATH, HOME, LANG, ...) plus
//! its configured `env`, never antler's own secrets, and is killed when antler stops (or when
//! its connection is dropped). In the chain, MCP tools are not core tools: with many of them
//! they sit behind `deferred_tools`' `tool_search`.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock, ResourceContents};
use rmcp::service::{Peer, RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncBufReadExt;

use super::{Tool, ToolContext, ToolError};
use crate::agent::model::ToolSpec;
use crate::config::Secret;

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
/// An error text from a server is cut to this many characters.
const MAX_ERROR_CHARS: usize = 500;
/// A line a stdio server writes to stderr is logged cut to this many characters.
const MAX_STDERR_LINE_CHARS: usize = 500;
/// The longest server name.
pub(crate) const MAX_SERVER_NAME: usize = 32;
/// How long a server gets to stop at shutdown before it is killed.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(3);
/// The variables of antler's environment a stdio server inherits (MCP's usual safe set).
const INHERITED_ENV: [&str; 9] = [
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "TMPDIR", "TZ",
];

/// One `[[mcp.servers]]` entry: a stdio command or a streamable-HTTP URL.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct McpServerConfig {
    /// The server's name in tool names (`mcp__<name>__<tool>`): letters, digits, `_`, `-`.
    #[serde(deserialize_with = "crate::config::secret_string")]
    pub(crate) name: String,
    /// Whether it is started.
    pub(crate) enabled: bool,
    /// stdio: the program to run.
    #[serde(deserialize_with = "crate::config::secret_opt_string")]
    pub(crate) command: Option<String>,
    /// stdio: its arguments.
    #[serde(deserialize_with = "crate::config::secret_strings")]
    pub(crate) args: Vec<String>,
    /// stdio: environment variables set for it (secrets).
    pub(crate) env: BTreeMap<String, Secret>,
    /// Streamable HTTP: the endpoint.
    #[serde(deserialize_with = "crate::config::secret_opt_string")]
    pub(crate) url: Option<String>,
    /// Streamable HTTP: headers sent with every request (secrets).
    pub(crate) headers: BTreeMap<String, Secret>,
    /// Streamable HTTP: sent as `Authorization: Bearer <token>`.
    #[serde(deserialize_with = "crate::config::secret_opt_secret")]
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
            .field("url", &self.url.as_deref().map(crate::config::mask_url))
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

    /// The secret values of this server, to mask in what it says.
    fn secrets(&self) -> Vec<String> {
        self.env
            .values()
            .chain(self.headers.values())
            .chain(self.bearer_token.iter())
            .map(|s| s.expose().to_owned())
            .filter(|s| s.len() >= 4)
            .collect()
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

/// How one configured server came up, for `/readyz`.
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
    /// Why it is not connected (short, secrets masked).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
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

/// The connected servers: their tools, their status, and the connections to close.
#[derive(Default)]
pub(crate) struct McpServers {
    tools: Vec<Arc<dyn Tool>>,
    status: Vec<McpServerStatus>,
    running: Vec<RunningService<RoleClient, ()>>,
}

impl std::fmt::Debug for McpServers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServers")
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

impl McpServers {
    /// Starts or connects every enabled server, concurrently, each within its connect time.
    /// Failures are logged and reported in [`McpServers::status`]; they never fail startup.
    pub(crate) async fn connect(servers: &[McpServerConfig]) -> Self {
        let enabled: Vec<&McpServerConfig> = servers.iter().filter(|s| s.enabled).collect();
        if enabled.iter().any(|s| s.url.is_some()) {
            // rmcp's HTTP client is built without a TLS crypto provider of its own.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let results =
            futures_util::future::join_all(enabled.iter().map(|cfg| connect_one(cfg))).await;
        let mut out = Self::default();
        let mut taken: HashSet<String> = HashSet::new();
        for (cfg, result) in enabled.into_iter().zip(results) {
            match result {
                Ok((running, listed)) => {
                    let peer = running.peer().clone();
                    let before = out.tools.len();
                    for tool in listed.into_iter().take(MAX_TOOLS_PER_SERVER) {
                        match McpTool::new(cfg, &peer, tool, &taken) {
                            Some(tool) => {
                                taken.insert(tool.spec.name.clone());
                                out.tools.push(Arc::new(tool));
                            }
                            None => tracing::warn!(
                                server = %cfg.name,
                                "an MCP tool with an oversized parameter schema was left out"
                            ),
                        }
                    }
                    let count = out.tools.len() - before;
                    tracing::info!(server = %cfg.name, transport = cfg.transport(), tools = count, "MCP server connected");
                    out.status.push(McpServerStatus {
                        name: cfg.name.clone(),
                        transport: cfg.transport(),
                        ok: true,
                        tools: count,
                        error: None,
                    });
                    out.running.push(running);
                }
                Err(e) => {
                    let reason = mask(&e.to_string(), &cfg.secrets(), MAX_ERROR_CHARS);
                    tracing::warn!(server = %cfg.name, transport = cfg.transport(), error = %reason, "MCP server unavailable; serving without its tools");
                    out.status.push(McpServerStatus {
                        name: cfg.name.clone(),
                        transport: cfg.transport(),
                        ok: false,
                        tools: 0,
                        error: Some(reason),
                    });
                }
            }
        }
        out
    }

    /// The tools of every connected server.
    pub(crate) fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.tools.clone()
    }

    /// How each enabled server came up, in config order.
    pub(crate) fn status(&self) -> Vec<McpServerStatus> {
        self.status.clone()
    }

    /// Closes every connection; stdio servers that do not stop in time are killed.
    pub(crate) async fn shutdown(self) {
        let closing = self.running.into_iter().map(|running| async move {
            // A timed-out close drops the service, and dropping kills the child.
            let _ = tokio::time::timeout(SHUTDOWN_WAIT, running.cancel()).await;
        });
        futures_util::future::join_all(closing).await;
    }
}

/// Starts or connects one server and lists its tools, within its connect time.
async fn connect_one(
    cfg: &McpServerConfig,
) -> Result<(RunningService<RoleClient, ()>, Vec<rmcp::model::Tool>), McpError> {
    let secs = cfg.connect_timeout_secs.max(1);
    tokio::time::timeout(Duration::from_secs(secs), async {
        let running = match &cfg.url {
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
                let transport = StreamableHttpClientTransport::from_config(config);
                ().serve(transport)
                    .await
                    .map_err(|e| McpError::Handshake(e.to_string()))?
            }
            None => {
                let transport = spawn(cfg)?;
                ().serve(transport)
                    .await
                    .map_err(|e| McpError::Handshake(e.to_string()))?
            }
        };
        let tools = running
            .peer()
            .list_all_tools()
            .await
            .map_err(|e| McpError::List(e.to_string()))?;
        Ok((running, tools))
    })
    .await
    .map_err(|_| McpError::Timeout(secs))?
}

/// Spawns a stdio server: a small inherited environment plus its own, stderr to the log.
fn spawn(cfg: &McpServerConfig) -> Result<TokioChildProcess, McpError> {
    let program = cfg
        .command
        .as_deref()
        .ok_or_else(|| McpError::Spawn("no command".to_owned()))?;
    let mut command = tokio::process::Command::new(program);
    command.args(&cfg.args).env_clear().kill_on_drop(true);
    for name in INHERITED_ENV {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    for (name, value) in &cfg.env {
        command.env(name, value.expose());
    }
    let (transport, stderr) = TokioChildProcess::builder(command)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| McpError::Spawn(e.to_string()))?;
    if let Some(stderr) = stderr {
        let server = cfg.name.clone();
        let secrets = cfg.secrets();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let line = mask(&line, &secrets, MAX_STDERR_LINE_CHARS);
                tracing::debug!(server = %server, line = %line, "MCP server stderr");
            }
        });
    }
    Ok(transport)
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
    server: String,
    /// The tool's name on its server.
    remote: String,
    peer: Peer<RoleClient>,
    timeout: Duration,
    secrets: Vec<String>,
}

impl McpTool {
    /// The tool, or `None` when its schema is too large to offer.
    fn new(
        cfg: &McpServerConfig,
        peer: &Peer<RoleClient>,
        tool: rmcp::model::Tool,
        taken: &HashSet<String>,
    ) -> Option<Self> {
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
        Some(Self {
            spec: ToolSpec {
                name: tool_name(&cfg.name, &tool.name, taken),
                description: format!("[MCP server `{}`] {description}", cfg.name),
                parameters,
            },
            server: cfg.name.clone(),
            remote: tool.name.into_owned(),
            peer: peer.clone(),
            timeout: Duration::from_secs(cfg.timeout_secs.max(1)),
            secrets: cfg.secrets(),
        })
    }

    fn failed(&self, text: &str) -> ToolError {
        ToolError::Failed(format!(
            "the MCP server `{}` answered with an error: {}",
            self.server,
            mask(text, &self.secrets, MAX_ERROR_CHARS)
        ))
    }
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
        let params = CallToolRequestParams::new(self.remote.clone()).with_arguments(arguments);
        let result = tokio::time::timeout(self.timeout, self.peer.call_tool(params))
            .await
            .map_err(|_| {
                ToolError::Failed(format!(
                    "the MCP server `{}` did not answer within {} seconds",
                    self.server,
                    self.timeout.as_secs()
                ))
            })?
            .map_err(|e| self.failed(&e.to_string()))?;
        let text = super::web_fetch::neutralize_tags(&render(&result));
        if result.is_error == Some(true) {
            return Err(self.failed(&text));
        }
        Ok(mask(&text, &self.secrets, MAX_RESULT_BYTES))
    }
}

#[cfg(test)]
mod tests;
