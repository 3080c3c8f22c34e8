//! The OpenAI-compatible chat-completions client: request mapping, streaming (SSE), retries.
//!
//! One `complete` call makes up to `1 + max_retries` HTTP attempts. 429, 408, 5xx, connection
//! failures and timeouts are retried with exponential backoff and jitter (or the server's
//! `Retry-After`); everything else fails at once. A streamed attempt that has already passed
//! text to the delta sink is never retried, because the retry would repeat that text.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, RETRY_AFTER};
use serde::{Deserialize, Serialize};

use super::{
    ChatModel, DeltaSink, FinishReason, ModelError, ModelHealth, ModelRequest, ModelResponse,
};
use crate::agent::message::{ChatMessage, TokenUsage, ToolCall};

/// The longest provider message kept in an error.
const DETAIL_MAX_CHARS: usize = 300;
/// The longest `Retry-After` honoured; a server asking for more is waited on for this long.
const RETRY_AFTER_CAP: Duration = Duration::from_secs(60);
/// The most of an error body read for its message.
const ERROR_BODY_MAX_BYTES: usize = 64 * 1024;
/// The longest SSE line buffered; a stream without newlines beyond this is not SSE.
const SSE_LINE_MAX_BYTES: usize = 8 * 1024 * 1024;

/// Settings of the OpenAI-compatible client.
#[derive(Clone)]
pub(crate) struct OpenAiConfig {
    /// The API root, e.g. `https://api.openai.com/v1`; requests go to `{base_url}/chat/completions`.
    pub(crate) base_url: String,
    /// Sent as `Authorization: Bearer`; `None` for local endpoints (Ollama, llama.cpp).
    pub(crate) api_key: Option<String>,
    /// The model name sent with every request.
    pub(crate) model: String,
    /// The limit on one attempt, from sending to the last byte of the (streamed) answer.
    pub(crate) request_timeout: Duration,
    /// Retries after the first attempt.
    pub(crate) max_retries: u32,
    /// The delay before the first retry; it doubles per retry.
    pub(crate) backoff_base: Duration,
    /// The longest delay between retries (except a server's `Retry-After`).
    pub(crate) backoff_max: Duration,
    /// Whether to stream when the caller wants deltas.
    pub(crate) stream: bool,
    /// Sampling temperature; `None` leaves the provider's default.
    pub(crate) temperature: Option<f32>,
    /// Output token limit; `None` leaves the provider's default.
    pub(crate) max_tokens: Option<u32>,
}

impl OpenAiConfig {
    /// Settings for `model` at `base_url` with the defaults: no key, 120 s timeout, 3 retries
    /// backing off from 500 ms up to 8 s, streaming on.
    #[must_use]
    pub(crate) fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            api_key: None,
            model: model.into(),
            request_timeout: Duration::from_secs(120),
            max_retries: 3,
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(8),
            stream: true,
            temperature: None,
            max_tokens: None,
        }
    }
}

// Manual so that the key never reaches a log line.
impl std::fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "***"))
            .field("model", &self.model)
            .field("request_timeout", &self.request_timeout)
            .field("max_retries", &self.max_retries)
            .field("backoff_base", &self.backoff_base)
            .field("backoff_max", &self.backoff_max)
            .field("stream", &self.stream)
            .field("temperature", &self.temperature)
            .field("max_tokens", &self.max_tokens)
            .finish()
    }
}

/// The OpenAI-compatible chat-completions client.
#[derive(Debug, Clone)]
pub(crate) struct OpenAiClient {
    config: OpenAiConfig,
    url: reqwest::Url,
    http: reqwest::Client,
    health: ModelHealth,
}

/// What probing the endpoint found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProbeReport {
    /// The model names `GET /models` listed (empty when the endpoint lists none).
    pub(crate) models: Vec<String>,
}

/// How long the probe at start waits for `GET /models`.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

impl OpenAiClient {
    /// Builds the client; fails when the base URL is not an http(s) URL.
    pub(crate) fn new(config: OpenAiConfig) -> Result<Self, ModelError> {
        let raw = format!("{}/chat/completions", config.base_url.trim_end_matches('/'));
        let url = reqwest::Url::parse(&raw)
            .map_err(|e| ModelError::Unreachable(format!("invalid base URL: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(ModelError::Unreachable(format!(
                "invalid base URL: scheme `{}` is not http(s)",
                url.scheme()
            )));
        }
        let http = reqwest::Client::builder()
            .user_agent(concat!("antler/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ModelError::Unreachable(format!("cannot build HTTP client: {e}")))?;
        Ok(Self {
            config,
            url,
            http,
            health: ModelHealth::default(),
        })
    }

    /// Records every outcome in `health` (for `/readyz`).
    #[must_use]
    pub(crate) fn with_health(mut self, health: ModelHealth) -> Self {
        self.health = health;
        self
    }

    /// The base URL with any password masked, for logs.
    pub(crate) fn display_url(&self) -> String {
        let mut url = self.url.clone();
        if url.password().is_some() {
            let _ = url.set_password(Some("***"));
        }
        url.as_str()
            .trim_end_matches("/chat/completions")
            .to_owned()
    }

    /// Asks the endpoint for its models (`GET {base_url}/models`), which costs no tokens, and
    /// records whether it answered.
    pub(crate) async fn probe(&self) -> Result<ProbeReport, ModelError> {
        let result = self.probe_once().await;
        match &result {
            Ok(_) => self.health.record(true, "ok"),
            Err(e) => self.health.record(e.reached_endpoint(), e.to_string()),
        }
        result
    }

    async fn probe_once(&self) -> Result<ProbeReport, ModelError> {
        let mut url = self.url.clone();
        url.set_path(&format!(
            "{}/models",
            self.url.path().trim_end_matches("/chat/completions")
        ));
        let mut request = self.http.get(url).timeout(PROBE_TIMEOUT);
        if let Some(key) = &self.config.api_key {
            request = request.bearer_auth(key);
        }
        let mut response =
            request
                .send()
                .await
                .map_err(|e| match AttemptError::from_reqwest(e) {
                    AttemptError::Timeout => ModelError::Timeout(PROBE_TIMEOUT),
                    other => self.final_error(other, 1),
                })?;
        let status = response.status();
        let text = read_capped(&mut response, ERROR_BODY_MAX_BYTES).await;
        if !status.is_success() {
            let error = AttemptError::Status {
                status: status.as_u16(),
                retry_after: None,
                detail: provider_detail(&self.redact(text)),
            };
            return Err(self.final_error(error, 1));
        }
        let models = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v.get("data").and_then(|d| d.as_array()).cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|m| m.get("id").and_then(|id| id.as_str()).map(str::to_owned))
            .collect();
        Ok(ProbeReport { models })
    }

    /// One HTTP attempt. Sets `emitted` once text has gone to the sink.
    async fn attempt(
        &self,
        body: Bytes,
        sink: Option<DeltaSink<'_>>,
        emitted: &AtomicBool,
    ) -> Result<ModelResponse, AttemptError> {
        let mut request = self
            .http
            .post(self.url.clone())
            .header(CONTENT_TYPE, "application/json")
            .body(body);
        if let Some(key) = &self.config.api_key {
            request = request.bearer_auth(key);
        }
        if sink.is_some() {
            request = request.header(ACCEPT, "text/event-stream");
        }
        let mut response = request.send().await.map_err(AttemptError::from_reqwest)?;

        let status = response.status();
        if !status.is_success() {
            let retry_after = retry_after(response.headers());
            // The body only feeds the error detail; a failure to read it must not hide the status.
            let text = read_capped(&mut response, ERROR_BODY_MAX_BYTES).await;
            // Masked before it is cut, so no part of a key can survive the cut.
            return Err(AttemptError::Status {
                status: status.as_u16(),
                retry_after,
                detail: provider_detail(&self.redact(text)),
            });
        }

        let Some(sink) = sink else {
            let bytes = response.bytes().await.map_err(AttemptError::from_reqwest)?;
            return parse_completion(&bytes);
        };
        let is_json = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("json"));
        if is_json {
            // Some servers ignore `stream: true` and answer in one piece.
            let bytes = response.bytes().await.map_err(AttemptError::from_reqwest)?;
            let parsed = parse_completion(&bytes)?;
            emit(sink, emitted, &parsed.content);
            return Ok(parsed);
        }

        let mut parser = SseParser::default();
        let mut state = StreamState::default();
        while let Some(chunk) = response.chunk().await.map_err(AttemptError::from_reqwest)? {
            for data in parser.push(&chunk)? {
                if state.apply(&data, sink, emitted)? {
                    return Ok(state.finish());
                }
            }
        }
        if let Some(data) = parser.finish() {
            if state.apply(&data, sink, emitted)? {
                return Ok(state.finish());
            }
        }
        // The connection closed without `[DONE]`: what came is usable only if it was complete.
        if state.finish_reason.is_some() {
            Ok(state.finish())
        } else {
            Err(AttemptError::Invalid(
                "the stream ended before the answer was complete".to_owned(),
            ))
        }
    }

    /// Replaces the API key in provider text, should a provider echo it.
    fn redact(&self, text: String) -> String {
        match &self.config.api_key {
            Some(key) if !key.is_empty() && text.contains(key.as_str()) => {
                text.replace(key.as_str(), "***")
            }
            _ => text,
        }
    }

    /// The wait before retry number `retry` (1-based).
    fn backoff(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(wait) = retry_after {
            return wait;
        }
        let factor = 1u32
            .checked_shl(retry.saturating_sub(1))
            .unwrap_or(u32::MAX);
        let capped = self
            .config
            .backoff_base
            .saturating_mul(factor)
            .min(self.config.backoff_max);
        // Equal jitter: half fixed, half random, so parallel clients spread out but still back off.
        let ms = u64::try_from(capped.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(ms / 2 + fastrand::u64(0..=ms - ms / 2))
    }
}

#[async_trait::async_trait]
impl ChatModel for OpenAiClient {
    fn name(&self) -> &str {
        &self.config.model
    }

    async fn complete(
        &self,
        request: &ModelRequest,
        deltas: Option<DeltaSink<'_>>,
    ) -> Result<ModelResponse, ModelError> {
        let streaming = self.config.stream && deltas.is_some();
        let body = serde_json::to_vec(&WireRequest::new(&self.config, request, streaming))
            .map(Bytes::from)
            .map_err(|e| ModelError::InvalidResponse(format!("cannot encode the request: {e}")))?;
        let sink = if streaming { deltas } else { None };

        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let emitted = AtomicBool::new(false);
            let result = tokio::time::timeout(
                self.config.request_timeout,
                self.attempt(body.clone(), sink, &emitted),
            )
            .await
            .unwrap_or(Err(AttemptError::Timeout));
            metrics::counter!("antler_model_requests_total", "status" => status_label(&result))
                .increment(1);

            let error = match result {
                Ok(response) => {
                    self.health.record(true, "ok");
                    if let Some(usage) = &response.usage {
                        metrics::counter!("antler_model_tokens_total", "kind" => "prompt")
                            .increment(usage.prompt_tokens);
                        metrics::counter!("antler_model_tokens_total", "kind" => "completion")
                            .increment(usage.completion_tokens);
                    }
                    // Streaming disabled by config: the caller still gets the text, in one piece.
                    if let (Some(sink), None) = (deltas, sink) {
                        emit(sink, &emitted, &response.content);
                    }
                    return Ok(response);
                }
                Err(error) => error,
            };
            if !error.retryable()
                || attempts > self.config.max_retries
                || emitted.load(Ordering::Relaxed)
            {
                let error = self.final_error(error, attempts);
                self.health
                    .record(error.reached_endpoint(), error.to_string());
                return Err(error);
            }
            let delay = self.backoff(attempts, error.retry_after());
            tracing::warn!(
                model = %self.config.model,
                attempt = attempts,
                max_retries = self.config.max_retries,
                delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                reason = %self.redact(error.summary()),
                "model request failed; retrying"
            );
            tokio::time::sleep(delay).await;
        }
    }
}

impl OpenAiClient {
    /// The caller-facing error for the last failed attempt.
    fn final_error(&self, error: AttemptError, attempts: u32) -> ModelError {
        match error {
            AttemptError::Status { status, detail, .. } => match status {
                401 | 403 => ModelError::Unauthorized { status },
                404 => ModelError::NotFound {
                    detail: self.redact(detail),
                },
                429 => ModelError::RateLimited { attempts },
                408 | 500.. => ModelError::Server { status, attempts },
                _ => ModelError::BadRequest {
                    status,
                    detail: self.redact(detail),
                },
            },
            AttemptError::Transport(msg) => ModelError::Unreachable(self.redact(msg)),
            AttemptError::Timeout => ModelError::Timeout(self.config.request_timeout),
            AttemptError::Invalid(msg) => ModelError::InvalidResponse(self.redact(msg)),
        }
    }
}

/// Passes non-empty text to the sink and notes that it did.
fn emit(sink: DeltaSink<'_>, emitted: &AtomicBool, text: &str) {
    if !text.is_empty() {
        emitted.store(true, Ordering::Relaxed);
        sink(text);
    }
}

/// How one attempt failed.
#[derive(Debug)]
enum AttemptError {
    /// A non-2xx answer.
    Status {
        status: u16,
        retry_after: Option<Duration>,
        detail: String,
    },
    /// Connecting, sending or reading failed.
    Transport(String),
    /// The attempt exceeded the request timeout.
    Timeout,
    /// A 2xx answer that is not a chat completion.
    Invalid(String),
}

impl AttemptError {
    fn from_reqwest(error: reqwest::Error) -> Self {
        if error.is_timeout() {
            return Self::Timeout;
        }
        // The URL is left out: it is already known to the operator and may carry query secrets.
        let error = error.without_url();
        let mut msg = error.to_string();
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            msg.push_str(": ");
            msg.push_str(&cause.to_string());
            source = cause.source();
        }
        Self::Transport(msg)
    }

    fn retryable(&self) -> bool {
        match self {
            Self::Status { status, .. } => matches!(status, 408 | 429 | 500..),
            Self::Transport(_) | Self::Timeout => true,
            Self::Invalid(_) => false,
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// A one-line description for the retry log.
    fn summary(&self) -> String {
        match self {
            Self::Status { status, detail, .. } => format!("HTTP {status}: {detail}"),
            Self::Transport(msg) => msg.clone(),
            Self::Timeout => "timeout".to_owned(),
            Self::Invalid(msg) => msg.clone(),
        }
    }
}

/// The `status` label of `antler_model_requests_total` for one attempt.
fn status_label(result: &Result<ModelResponse, AttemptError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(AttemptError::Status { status, .. }) => match status {
            401 | 403 => "auth",
            404 => "404",
            429 => "429",
            500.. => "5xx",
            _ => "4xx",
        },
        Err(AttemptError::Transport(_)) => "unreachable",
        Err(AttemptError::Timeout) => "timeout",
        Err(AttemptError::Invalid(_)) => "invalid",
    }
}

/// `Retry-After` in seconds, capped; HTTP dates are ignored (plain backoff applies).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let secs: f64 = headers
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    Some(Duration::from_secs_f64(
        secs.min(RETRY_AFTER_CAP.as_secs_f64()),
    ))
}

/// At most `limit` bytes of a response body, as text; what cannot be read is left out.
async fn read_capped(response: &mut reqwest::Response, limit: usize) -> String {
    let mut body = Vec::new();
    while body.len() < limit {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    body.truncate(limit);
    String::from_utf8_lossy(&body).into_owned()
}

/// The provider's error message from an error body, shortened.
fn provider_detail(body: &str) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_str(body).ok();
    let message = parsed.as_ref().and_then(|v| {
        let error = v.get("error").unwrap_or(v);
        error
            .get("message")
            .and_then(|m| m.as_str())
            .or_else(|| error.as_str())
    });
    shorten(message.unwrap_or(body).trim())
}

/// Cuts text to [`DETAIL_MAX_CHARS`] characters.
fn shorten(text: &str) -> String {
    match text.char_indices().nth(DETAIL_MAX_CHARS) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_owned(),
    }
}

// ---- request wire format ----

#[derive(Serialize)]
struct WireRequest<'a> {
    model: &'a str,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
enum WireMessage<'a> {
    System {
        content: &'a str,
    },
    User {
        content: &'a str,
    },
    Assistant {
        // `null` rather than "" when the message is only tool calls, as OpenAI documents.
        content: Option<&'a str>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<WireFunction<'a, WireCallBody<'a>>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: &'a str,
    },
}

/// `{"id"?, "type": "function", "function": F}`, shared by tool calls and tool specs.
#[derive(Serialize)]
struct WireFunction<'a, F> {
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    r#type: &'static str,
    function: F,
}

#[derive(Serialize)]
struct WireCallBody<'a> {
    name: &'a str,
    arguments: &'a str,
}

type WireTool<'a> = WireFunction<'a, &'a super::ToolSpec>;

impl<'a> WireRequest<'a> {
    fn new(config: &'a OpenAiConfig, request: &'a ModelRequest, stream: bool) -> Self {
        let messages = request.messages.iter().map(WireMessage::from).collect();
        let tools = request
            .tools
            .iter()
            .map(|spec| WireFunction {
                id: None,
                r#type: "function",
                function: spec,
            })
            .collect();
        Self {
            model: &config.model,
            messages,
            tools,
            temperature: config.temperature,
            max_tokens: config.max_tokens,
            stream,
            stream_options: stream.then_some(StreamOptions {
                include_usage: true,
            }),
        }
    }
}

impl<'a> From<&'a ChatMessage> for WireMessage<'a> {
    fn from(message: &'a ChatMessage) -> Self {
        match message {
            ChatMessage::System { content } => Self::System { content },
            ChatMessage::User { content, .. } => Self::User { content },
            ChatMessage::Assistant {
                content,
                tool_calls,
                ..
            } => Self::Assistant {
                content: (!content.is_empty() || tool_calls.is_empty()).then_some(content),
                tool_calls: tool_calls
                    .iter()
                    .map(|call| WireFunction {
                        id: Some(&call.id),
                        r#type: "function",
                        function: WireCallBody {
                            name: &call.name,
                            arguments: &call.arguments,
                        },
                    })
                    .collect(),
            },
            ChatMessage::Tool {
                tool_call_id,
                content,
            } => Self::Tool {
                tool_call_id,
                content,
            },
        }
    }
}

// ---- response wire format ----

#[derive(Deserialize)]
struct WireCompletion {
    #[serde(default)]
    choices: Vec<WireChoice>,
    usage: Option<WireUsage>,
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct WireChoice {
    message: WireAnswer,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireAnswer {
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<WireCallIn>>,
}

#[derive(Deserialize)]
struct WireCallIn {
    #[serde(default)]
    id: String,
    function: WireCallBodyIn,
}

#[derive(Deserialize)]
struct WireCallBodyIn {
    name: String,
    // A string per the spec; some servers send the object itself.
    #[serde(default)]
    arguments: serde_json::Value,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    total_tokens: Option<u64>,
}

impl From<WireUsage> for TokenUsage {
    fn from(u: WireUsage) -> Self {
        Self {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u
                .total_tokens
                .unwrap_or(u.prompt_tokens + u.completion_tokens),
        }
    }
}

#[derive(Deserialize)]
struct WireChunk {
    #[serde(default)]
    choices: Vec<WireChunkChoice>,
    usage: Option<WireUsage>,
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct WireChunkChoice {
    #[serde(default)]
    delta: Option<WireDelta>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireDelta {
    content: Option<String>,
    tool_calls: Option<Vec<WireCallDelta>>,
}

#[derive(Deserialize)]
struct WireCallDelta {
    index: Option<usize>,
    id: Option<String>,
    function: Option<WireCallBodyDelta>,
}

#[derive(Deserialize)]
struct WireCallBodyDelta {
    name: Option<String>,
    arguments: Option<String>,
}

fn finish_reason(raw: Option<String>, has_tool_calls: bool) -> FinishReason {
    match raw.as_deref() {
        Some("stop") => FinishReason::Stop,
        Some("tool_calls" | "function_call") => FinishReason::ToolCalls,
        Some("length") => FinishReason::Length,
        Some("content_filter") => FinishReason::ContentFilter,
        Some(other) => FinishReason::Other(other.to_owned()),
        // Some servers omit it; infer what the answer means.
        None if has_tool_calls => FinishReason::ToolCalls,
        None => FinishReason::Stop,
    }
}

fn error_value_detail(error: &serde_json::Value) -> String {
    provider_detail(&error.to_string())
}

/// Parses a non-streamed chat completion.
fn parse_completion(bytes: &[u8]) -> Result<ModelResponse, AttemptError> {
    let completion: WireCompletion = serde_json::from_slice(bytes).map_err(|e| {
        let body = String::from_utf8_lossy(bytes);
        AttemptError::Invalid(format!("{e}; body: {}", shorten(body.trim())))
    })?;
    if let Some(error) = &completion.error {
        return Err(AttemptError::Invalid(error_value_detail(error)));
    }
    let Some(choice) = completion.choices.into_iter().next() else {
        return Err(AttemptError::Invalid(
            "the answer has no choices".to_owned(),
        ));
    };
    let tool_calls: Vec<ToolCall> = choice
        .message
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .map(|call| ToolCall {
            id: call.id,
            name: call.function.name,
            arguments: match call.function.arguments {
                serde_json::Value::String(text) => text,
                serde_json::Value::Null => String::new(),
                other => other.to_string(),
            },
        })
        .collect();
    Ok(ModelResponse {
        content: choice.message.content.unwrap_or_default(),
        finish_reason: finish_reason(choice.finish_reason, !tool_calls.is_empty()),
        reasoning: None,
        tool_calls,
        usage: completion.usage.map(TokenUsage::from),
    })
}

// ---- streaming ----

/// Splits a byte stream into the `data` of server-sent events.
#[derive(Default)]
struct SseParser {
    /// Bytes after the last complete line.
    pending: Vec<u8>,
    /// The `data` lines of the event being read, joined by `\n`.
    data: Option<String>,
}

impl SseParser {
    /// Feeds the next network chunk; returns the events it completed.
    fn push(&mut self, chunk: &[u8]) -> Result<Vec<String>, AttemptError> {
        self.pending.extend_from_slice(chunk);
        let mut events = Vec::new();
        let mut start = 0;
        while let Some(offset) = self.pending[start..].iter().position(|b| *b == b'\n') {
            let end = start + offset;
            let line = String::from_utf8_lossy(&self.pending[start..end]).into_owned();
            self.line(&line, &mut events);
            start = end + 1;
        }
        self.pending.drain(..start);
        if self.pending.len() > SSE_LINE_MAX_BYTES {
            return Err(AttemptError::Invalid(
                "the stream is not server-sent events".to_owned(),
            ));
        }
        Ok(events)
    }

    /// Ends the stream; returns an event left without its closing blank line.
    fn finish(&mut self) -> Option<String> {
        let mut events = Vec::new();
        if !self.pending.is_empty() {
            let line = String::from_utf8_lossy(&self.pending).into_owned();
            self.pending.clear();
            self.line(&line, &mut events);
        }
        self.line("", &mut events);
        events.pop()
    }

    fn line(&mut self, line: &str, events: &mut Vec<String>) {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            events.extend(self.data.take());
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        if field == "data" {
            let value = value.strip_prefix(' ').unwrap_or(value);
            match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            }
        }
    }
}

/// A tool call being assembled from stream fragments.
struct PartialCall {
    index: usize,
    id: String,
    name: String,
    arguments: String,
}

/// What a stream has said so far.
#[derive(Default)]
struct StreamState {
    content: String,
    calls: Vec<PartialCall>,
    finish_reason: Option<String>,
    usage: Option<TokenUsage>,
}

impl StreamState {
    /// Applies one event; returns true at `[DONE]`.
    fn apply(
        &mut self,
        data: &str,
        sink: DeltaSink<'_>,
        emitted: &AtomicBool,
    ) -> Result<bool, AttemptError> {
        if data.trim() == "[DONE]" {
            return Ok(true);
        }
        let chunk: WireChunk = serde_json::from_str(data).map_err(|e| {
            AttemptError::Invalid(format!("bad stream event ({e}): {}", shorten(data)))
        })?;
        if let Some(error) = &chunk.error {
            return Err(AttemptError::Invalid(error_value_detail(error)));
        }
        if let Some(usage) = chunk.usage {
            self.usage = Some(usage.into());
        }
        // Only the first choice matters: antler never asks for n > 1.
        let Some(choice) = chunk.choices.into_iter().next() else {
            return Ok(false);
        };
        if choice.finish_reason.is_some() {
            self.finish_reason = choice.finish_reason;
        }
        let Some(delta) = choice.delta else {
            return Ok(false);
        };
        if let Some(text) = delta.content {
            emit(sink, emitted, &text);
            self.content.push_str(&text);
        }
        for fragment in delta.tool_calls.unwrap_or_default() {
            self.apply_call(fragment);
        }
        Ok(false)
    }

    fn apply_call(&mut self, fragment: WireCallDelta) {
        // Without an index (some servers), a new id starts a new call; otherwise it continues.
        let index = fragment
            .index
            .unwrap_or_else(|| match (&fragment.id, self.calls.last()) {
                (Some(id), Some(last)) if *id != last.id => last.index + 1,
                (_, Some(last)) => last.index,
                (_, None) => 0,
            });
        let position = match self.calls.iter().position(|c| c.index == index) {
            Some(position) => position,
            None => {
                self.calls.push(PartialCall {
                    index,
                    id: String::new(),
                    name: String::new(),
                    arguments: String::new(),
                });
                self.calls.len() - 1
            }
        };
        let Some(call) = self.calls.get_mut(position) else {
            return;
        };
        // Id and name come whole in the first fragment; some servers repeat them later.
        if let Some(id) = fragment.id.filter(|id| !id.is_empty()) {
            if call.id.is_empty() {
                call.id = id;
            }
        }
        if let Some(function) = fragment.function {
            if let Some(name) = function.name.filter(|n| !n.is_empty()) {
                if call.name.is_empty() {
                    call.name = name;
                }
            }
            if let Some(arguments) = function.arguments {
                call.arguments.push_str(&arguments);
            }
        }
    }

    fn finish(mut self) -> ModelResponse {
        self.calls.sort_by_key(|c| c.index);
        let tool_calls: Vec<ToolCall> = self
            .calls
            .into_iter()
            .map(|c| ToolCall {
                id: c.id,
                name: c.name,
                arguments: c.arguments,
            })
            .collect();
        ModelResponse {
            content: self.content,
            finish_reason: finish_reason(self.finish_reason, !tool_calls.is_empty()),
            reasoning: None,
            tool_calls,
            usage: self.usage,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::AtomicUsize;

    use serde_json::{Value, json};
    use wiremock::matchers::{header, method, path};
    use wiremock::{Mock, MockBuilder, MockServer, ResponseTemplate};

    use super::*;
    use crate::agent::model::ToolSpec;

    const KEY: &str = "sk-test-secret-key";

    /// A client for `base` with test settings (tiny backoff), adjusted by `tweak`.
    fn client_with(base: &str, tweak: impl FnOnce(&mut OpenAiConfig)) -> OpenAiClient {
        let mut config = OpenAiConfig::new(format!("{base}/v1/"), "test-model");
        config.api_key = Some(KEY.to_owned());
        config.backoff_base = Duration::from_millis(1);
        config.backoff_max = Duration::from_millis(4);
        config.request_timeout = Duration::from_secs(20);
        tweak(&mut config);
        OpenAiClient::new(config).unwrap()
    }

    fn client(server: &MockServer) -> OpenAiClient {
        client_with(&server.uri(), |_| {})
    }

    fn request() -> ModelRequest {
        ModelRequest {
            messages: vec![ChatMessage::system("be brief"), ChatMessage::user("hi")],
            tools: Vec::new(),
        }
    }

    fn completions() -> MockBuilder {
        Mock::given(method("POST")).and(path("/v1/chat/completions"))
    }

    /// A server answering every completion with `template`.
    async fn serve(template: ResponseTemplate) -> MockServer {
        let server = MockServer::start().await;
        completions().respond_with(template).mount(&server).await;
        server
    }

    fn answer(content: &str) -> ResponseTemplate {
        ResponseTemplate::new(200).set_body_json(json!({
            "choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]
        }))
    }

    /// An SSE body of `events`, ended by `[DONE]` when `done`.
    fn sse(events: &[Value], done: bool) -> ResponseTemplate {
        let mut body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        if done {
            body.push_str("data: [DONE]\n\n");
        }
        ResponseTemplate::new(200).set_body_raw(body, "text/event-stream")
    }

    fn text_chunk(text: &str) -> Value {
        json!({"choices": [{"delta": {"content": text}, "finish_reason": null}]})
    }

    fn finish_chunk(reason: &str) -> Value {
        json!({"choices": [{"delta": {}, "finish_reason": reason}]})
    }

    fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    async fn fail(client: &OpenAiClient) -> ModelError {
        client.complete(&request(), None).await.unwrap_err()
    }

    async fn requests(server: &MockServer) -> usize {
        server.received_requests().await.unwrap().len()
    }

    async fn first_body(server: &MockServer) -> Value {
        server.received_requests().await.unwrap()[0]
            .body_json()
            .unwrap()
    }

    /// Collects deltas; `push` is the sink.
    #[derive(Default)]
    struct Deltas(Mutex<Vec<String>>);

    impl Deltas {
        fn push(&self, text: &str) {
            self.0.lock().unwrap().push(text.to_owned());
        }
        fn all(&self) -> Vec<String> {
            self.0.lock().unwrap().clone()
        }
    }

    #[tokio::test]
    async fn plain_reply() {
        let server = MockServer::start().await;
        completions()
            .and(header("authorization", format!("Bearer {KEY}").as_str()))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                "choices": [{"message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
            })))
            .expect(1)
            .mount(&server)
            .await;
        let client = client(&server);
        assert_eq!(client.name(), "test-model");
        let response = client.complete(&request(), None).await.unwrap();
        assert_eq!(response.content, "hello");
        assert!(response.tool_calls.is_empty());
        assert_eq!(response.finish_reason, FinishReason::Stop);
        let usage = response.usage.unwrap();
        assert_eq!(
            [
                usage.prompt_tokens,
                usage.completion_tokens,
                usage.total_tokens
            ],
            [5, 1, 6]
        );
    }

    #[tokio::test]
    async fn streamed_reply_passes_deltas_in_order() {
        let server = serve(sse(
            &[
                json!({"choices": [{"delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}),
                text_chunk("Hel"),
                text_chunk("lo "),
                text_chunk("world"),
                finish_chunk("stop"),
                json!({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}),
            ],
            true,
        ))
        .await;
        let deltas = Deltas::default();
        let sink = |t: &str| deltas.push(t);
        let response = client(&server)
            .complete(&request(), Some(&sink))
            .await
            .unwrap();
        assert_eq!(deltas.all(), ["Hel", "lo ", "world"]);
        assert_eq!(response.content, "Hello world");
        assert_eq!(response.finish_reason, FinishReason::Stop);
        assert_eq!(response.usage.unwrap().total_tokens, 10);
        let sent = first_body(&server).await;
        assert_eq!(sent["stream"], true);
        assert_eq!(sent["stream_options"]["include_usage"], true);
    }

    #[tokio::test]
    async fn non_streamed_tool_calls_are_parsed() {
        let server = serve(ResponseTemplate::new(200).set_body_json(json!({
            "choices": [{"message": {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a.txt\"}"}},
                {"id": "call_2", "type": "function", "function": {"name": "ls", "arguments": {"dir": "/"}}}
            ]}, "finish_reason": "tool_calls"}]
        })))
        .await;
        let response = client(&server).complete(&request(), None).await.unwrap();
        assert_eq!(response.content, "");
        assert_eq!(response.finish_reason, FinishReason::ToolCalls);
        assert_eq!(
            response.tool_calls,
            [
                call("call_1", "read_file", r#"{"path":"a.txt"}"#),
                call("call_2", "ls", r#"{"dir":"/"}"#)
            ]
        );
        assert!(response.usage.is_none());
    }

    #[tokio::test]
    async fn streamed_tool_calls_are_assembled_from_fragments() {
        let fragment = |index: u32, head: Option<(&str, &str)>, args: &str| {
            let mut fragment = json!({"index": index, "function": {"arguments": args}});
            if let Some((id, name)) = head {
                fragment["id"] = json!(id);
                fragment["type"] = json!("function");
                fragment["function"]["name"] = json!(name);
            }
            json!({"choices": [{"delta": {"tool_calls": [fragment]}, "finish_reason": null}]})
        };
        let events = [
            text_chunk("Let me look."),
            fragment(0, Some(("call_a", "read_file")), ""),
            fragment(0, None, "{\"pa"),
            fragment(1, Some(("call_b", "ls")), "{\"dir\""),
            fragment(0, None, "th\": \"x.md\"}"),
            fragment(1, None, ": \"/\"}"),
            finish_chunk("tool_calls"),
        ];
        // CRLF line endings, and two calls whose fragments interleave.
        let body: String = events
            .iter()
            .map(|e| format!("data: {e}\r\n\r\n"))
            .collect();
        let server = serve(
            ResponseTemplate::new(200)
                .set_body_raw(format!("{body}data: [DONE]\r\n\r\n"), "text/event-stream"),
        )
        .await;
        let deltas = Deltas::default();
        let sink = |t: &str| deltas.push(t);
        let response = client(&server)
            .complete(&request(), Some(&sink))
            .await
            .unwrap();
        assert_eq!(deltas.all(), ["Let me look."]);
        assert_eq!(response.finish_reason, FinishReason::ToolCalls);
        assert_eq!(
            response.tool_calls,
            [
                call("call_a", "read_file", r#"{"path": "x.md"}"#),
                call("call_b", "ls", r#"{"dir": "/"}"#)
            ]
        );
    }

    #[tokio::test]
    async fn stream_without_done_is_accepted_only_when_finished() {
        let sink = |_: &str| {};
        let finished = serve(sse(&[text_chunk("ok"), finish_chunk("length")], false)).await;
        let response = client(&finished)
            .complete(&request(), Some(&sink))
            .await
            .unwrap();
        assert_eq!(response.content, "ok");
        assert_eq!(response.finish_reason, FinishReason::Length);

        let cut = serve(sse(&[text_chunk("o")], false)).await;
        let result = client(&cut).complete(&request(), Some(&sink)).await;
        assert!(
            matches!(result, Err(ModelError::InvalidResponse(_))),
            "{result:?}"
        );
        // Text had been passed on: a retry would repeat it.
        assert_eq!(requests(&cut).await, 1);
    }

    #[tokio::test]
    async fn stream_disabled_by_config_sends_the_text_once() {
        let server = serve(answer("whole")).await;
        let deltas = Deltas::default();
        let sink = |t: &str| deltas.push(t);
        let client = client_with(&server.uri(), |c| c.stream = false);
        let response = client.complete(&request(), Some(&sink)).await.unwrap();
        assert_eq!(response.content, "whole");
        assert_eq!(deltas.all(), ["whole"]);
        assert!(first_body(&server).await.get("stream").is_none());
    }

    #[tokio::test]
    async fn rate_limit_with_retry_after_is_retried() {
        let server = MockServer::start().await;
        completions()
            .respond_with(ResponseTemplate::new(429).insert_header("retry-after", "0"))
            .up_to_n_times(1)
            .mount(&server)
            .await;
        completions()
            .respond_with(answer("finally"))
            .mount(&server)
            .await;
        let response = client(&server).complete(&request(), None).await.unwrap();
        assert_eq!(response.content, "finally");
        assert_eq!(requests(&server).await, 2);
    }

    #[tokio::test]
    async fn rate_limit_forever_gives_rate_limited() {
        let server = serve(ResponseTemplate::new(429)).await;
        assert_eq!(
            fail(&client(&server)).await,
            ModelError::RateLimited { attempts: 4 }
        );
        assert_eq!(requests(&server).await, 4);
    }

    #[tokio::test]
    async fn server_error_forever_gives_up_after_the_retries() {
        let server = serve(ResponseTemplate::new(503)).await;
        let error = fail(&client_with(&server.uri(), |c| c.max_retries = 2)).await;
        assert_eq!(
            error,
            ModelError::Server {
                status: 503,
                attempts: 3
            }
        );
        assert_eq!(requests(&server).await, 3);
    }

    #[tokio::test]
    async fn unauthorized_is_not_retried() {
        let server = serve(ResponseTemplate::new(401).set_body_json(json!({
            "error": {"message": format!("Incorrect API key provided: {KEY}")}
        })))
        .await;
        let error = fail(&client(&server)).await;
        assert_eq!(error, ModelError::Unauthorized { status: 401 });
        assert!(!error.to_string().contains(KEY));
        assert_eq!(requests(&server).await, 1);
    }

    #[tokio::test]
    async fn not_found_carries_the_shortened_provider_message() {
        let long = format!("The model `gpt-9` does not exist {}", "x".repeat(1000));
        let server =
            serve(ResponseTemplate::new(404).set_body_json(json!({"error": {"message": long}})))
                .await;
        let error = fail(&client(&server)).await;
        let ModelError::NotFound { detail } = error else {
            panic!("expected NotFound, got {error:?}");
        };
        assert!(detail.starts_with("The model `gpt-9` does not exist"));
        assert!(detail.chars().count() <= DETAIL_MAX_CHARS + 3);
        assert_eq!(requests(&server).await, 1);
    }

    #[tokio::test]
    async fn other_client_errors_are_bad_requests_with_the_key_redacted() {
        let server = serve(ResponseTemplate::new(400).set_body_json(json!({
            "error": {"message": format!("context too long (key {KEY})")}
        })))
        .await;
        let detail = "context too long (key ***)".to_owned();
        assert_eq!(
            fail(&client(&server)).await,
            ModelError::BadRequest {
                status: 400,
                detail
            }
        );
        assert_eq!(requests(&server).await, 1);
    }

    #[tokio::test]
    async fn garbage_body_is_invalid_and_not_retried() {
        let server =
            serve(ResponseTemplate::new(200).set_body_raw("<html>oops</html>", "text/html")).await;
        let error = fail(&client(&server)).await;
        assert!(matches!(error, ModelError::InvalidResponse(_)), "{error:?}");
        assert_eq!(requests(&server).await, 1);
    }

    #[tokio::test]
    async fn slow_answer_times_out() {
        let server = serve(answer("late").set_delay(Duration::from_secs(30))).await;
        let timeout = Duration::from_millis(200);
        let client = client_with(&server.uri(), |c| {
            c.request_timeout = timeout;
            c.max_retries = 0;
        });
        assert_eq!(fail(&client).await, ModelError::Timeout(timeout));
    }

    #[tokio::test]
    async fn stalled_stream_after_text_is_not_retried() {
        // One delta, then nothing: the attempt times out after text went out.
        let hits = std::sync::Arc::new(AtomicUsize::new(0));
        let counter = hits.clone();
        let app = axum::Router::new().route(
            "/v1/chat/completions",
            axum::routing::post(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                async {
                    use futures_util::StreamExt;
                    let first = format!("data: {}\n\n", text_chunk("partial"));
                    let body = futures_util::stream::iter([Ok::<_, std::io::Error>(first)])
                        .chain(futures_util::stream::pending());
                    (
                        [(CONTENT_TYPE, "text/event-stream")],
                        axum::body::Body::from_stream(body),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });

        let timeout = Duration::from_millis(300);
        let client = client_with(&base, |c| c.request_timeout = timeout);
        let deltas = Deltas::default();
        let sink = |t: &str| deltas.push(t);
        let error = client.complete(&request(), Some(&sink)).await.unwrap_err();
        assert_eq!(error, ModelError::Timeout(timeout));
        assert_eq!(deltas.all(), ["partial"]);
        assert_eq!(hits.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn unreachable_endpoint_is_retried_then_reported() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let error = fail(&client_with(&base, |c| c.max_retries = 1)).await;
        assert!(matches!(error, ModelError::Unreachable(_)), "{error:?}");
        assert!(!error.to_string().contains(KEY));
    }

    #[tokio::test]
    async fn request_body_has_the_openai_shape() {
        let server = serve(answer("done")).await;
        let client = client_with(&server.uri(), |c| {
            c.temperature = Some(0.5);
            c.max_tokens = Some(256);
        });
        let request = ModelRequest {
            messages: vec![
                ChatMessage::system("sys"),
                ChatMessage::user("list files"),
                ChatMessage::assistant_calls("", vec![call("call_1", "ls", "{}")]),
                ChatMessage::tool("call_1", "a.txt"),
                ChatMessage::assistant("There is a.txt."),
            ],
            tools: vec![ToolSpec {
                name: "ls".into(),
                description: "Lists files.".into(),
                parameters: json!({"type": "object", "properties": {}}),
            }],
        };
        client.complete(&request, None).await.unwrap();
        assert_eq!(
            first_body(&server).await,
            json!({
                "model": "test-model",
                "messages": [
                    {"role": "system", "content": "sys"},
                    {"role": "user", "content": "list files"},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
                    ]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
                    {"role": "assistant", "content": "There is a.txt."}
                ],
                "tools": [{"type": "function", "function": {
                    "name": "ls",
                    "description": "Lists files.",
                    "parameters": {"type": "object", "properties": {}}
                }}],
                "temperature": 0.5,
                "max_tokens": 256
            })
        );
    }

    #[test]
    fn sse_parser_handles_any_chunking() {
        let stream = b": comment\r\nevent: x\r\ndata: {\"a\":1}\r\n\r\nid: 7\ndata:{\"b\":2}\n\ndata: line1\ndata: line2\n\ndata: [DONE]\n\n";
        let expected = ["{\"a\":1}", "{\"b\":2}", "line1\nline2", "[DONE]"];
        for size in 1..=stream.len() {
            let mut parser = SseParser::default();
            let mut events = Vec::new();
            for piece in stream.chunks(size) {
                events.extend(parser.push(piece).unwrap());
            }
            assert_eq!(parser.finish(), None);
            assert_eq!(events, expected, "chunk size {size}");
        }
        // An event cut off by the end of the stream still counts.
        let mut parser = SseParser::default();
        assert!(parser.push(b"data: tail").unwrap().is_empty());
        assert_eq!(parser.finish().as_deref(), Some("tail"));
    }

    #[test]
    fn debug_never_shows_the_key() {
        let client = client_with("https://api.openai.com", |_| {});
        for shown in [format!("{:?}", client.config), format!("{client:?}")] {
            assert!(!shown.contains(KEY));
            assert!(shown.contains("***"));
        }
    }

    #[test]
    fn url_and_retry_after_are_derived_carefully() {
        let with_slash = OpenAiClient::new(OpenAiConfig::new("http://h:1/v1/", "m")).unwrap();
        let without = OpenAiClient::new(OpenAiConfig::new("http://h:1/v1", "m")).unwrap();
        assert_eq!(with_slash.url.as_str(), "http://h:1/v1/chat/completions");
        assert_eq!(without.url, with_slash.url);
        assert!(OpenAiClient::new(OpenAiConfig::new("not a url", "m")).is_err());

        let after = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(RETRY_AFTER, value.parse().unwrap());
            retry_after(&headers)
        };
        assert_eq!(after("2"), Some(Duration::from_secs(2)));
        assert_eq!(after("3600"), Some(RETRY_AFTER_CAP));
        assert_eq!(after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let client = client_with("http://h", |c| {
            c.backoff_base = Duration::from_millis(100);
            c.backoff_max = Duration::from_millis(1000);
        });
        let ms = Duration::from_millis;
        for _ in 0..50 {
            assert!((ms(50)..=ms(100)).contains(&client.backoff(1, None)));
            assert!((ms(500)..=ms(1000)).contains(&client.backoff(30, None)));
        }
        assert_eq!(client.backoff(1, Some(Duration::ZERO)), Duration::ZERO);
    }
}
