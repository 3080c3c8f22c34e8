//! The OpenAI-compatible chat-completions client: request mapping, streaming (SSE), retries.
//!
//! One `complete` call makes up to `1 + max_retries` HTTP attempts. 429, 408, 5xx, connection
//! failures, timeouts and broken streams (ended early, failed mid-way, or carrying an
//! `{"error": ...}` chunk) are retried with exponential backoff and jitter, or after the
//! server's `Retry-After` / `retry-after-ms` (capped at the backoff maximum); everything else
//! fails at once. An error chunk's `code` counts like the HTTP status it names, so a proxy that
//! answers a rate limit as `200` plus `data: {"error": {"code": "429"}}` is rate limited.
//!
//! A streamed attempt that has already passed text to the delta sink is never retried, because
//! the retry would repeat that text: it ends in [`ModelError::Interrupted`] with that text.
//!
//! Timeouts: connecting (`connect_timeout`), the response head and, streamed, its first chunk
//! (`first_byte_timeout`), the longest gap between chunks (`idle_timeout`), and for a
//! non-streamed answer the whole attempt (`request_timeout`). A healthy stream has no total
//! limit.
//!
//! Reasoning (`reasoning_content`, `reasoning`, `<think>` blocks, `thinking` content parts) is
//! kept apart in [`ModelResponse::reasoning`]: it never reaches the sink or the content.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, RETRY_AFTER};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::time::Instant;

use super::detail::{self, ProviderError};
use super::think::ThinkSplitter;
use super::{
    ChatModel, DeltaSink, FinishReason, ModelError, ModelHealth, ModelRequest, ModelResponse,
    TimeoutKind, mentions_context_length,
};
use crate::agent::message::{ChatMessage, ContentPart, TokenUsage, ToolCall};

/// The longest `Retry-After` read from a header; the wait itself is capped at `backoff_max`.
const RETRY_AFTER_CAP: Duration = Duration::from_secs(60);
/// The most of an error body read for its message.
const ERROR_BODY_MAX_BYTES: usize = 64 * 1024;
/// The largest non-streamed answer accepted.
const BODY_MAX_BYTES: usize = 8 * 1024 * 1024;
/// The longest SSE line accepted.
const SSE_LINE_MAX_BYTES: usize = 1024 * 1024;
/// The most a stream may carry in all.
const STREAM_MAX_BYTES: usize = 16 * 1024 * 1024;

/// Settings of the OpenAI-compatible client.
#[derive(Clone)]
pub(crate) struct OpenAiConfig {
    /// The API root, e.g. `https://api.openai.com/v1`; requests go to `{base_url}/chat/completions`.
    pub(crate) base_url: String,
    /// Sent as `Authorization: Bearer`; `None` for local endpoints (Ollama, llama.cpp).
    pub(crate) api_key: Option<String>,
    /// The model name sent with every request.
    pub(crate) model: String,
    /// The limit on establishing a connection.
    pub(crate) connect_timeout: Duration,
    /// The limit from sending a request to the response head and, streamed, its first chunk.
    pub(crate) first_byte_timeout: Duration,
    /// The longest gap between two chunks of a stream.
    pub(crate) idle_timeout: Duration,
    /// The limit on a whole non-streamed attempt, from sending to the last byte. Streams have
    /// no total limit.
    pub(crate) request_timeout: Duration,
    /// Retries after the first attempt.
    pub(crate) max_retries: u32,
    /// The delay before the first retry; it doubles per retry.
    pub(crate) backoff_base: Duration,
    /// The longest delay between retries, a server's `Retry-After` included.
    pub(crate) backoff_max: Duration,
    /// Whether to stream when the caller wants deltas.
    pub(crate) stream: bool,
    /// Whether a streamed request asks for token usage (`stream_options.include_usage`);
    /// some providers reject the option.
    pub(crate) stream_usage: bool,
    /// Sampling temperature; `None` leaves the provider's default.
    pub(crate) temperature: Option<f32>,
    /// Output token limit; `None` leaves the provider's default.
    pub(crate) max_tokens: Option<u32>,
}

impl OpenAiConfig {
    /// Settings for `model` at `base_url` with the defaults: no key; timeouts of 10 s to
    /// connect, 60 s to the first byte, 60 s between chunks and 120 s for a non-streamed
    /// answer; 3 retries backing off from 500 ms up to 8 s; streaming with usage.
    #[must_use]
    pub(crate) fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            api_key: None,
            model: model.into(),
            connect_timeout: Duration::from_secs(10),
            first_byte_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(120),
            max_retries: 3,
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(8),
            stream: true,
            stream_usage: true,
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
            .field("connect_timeout", &self.connect_timeout)
            .field("first_byte_timeout", &self.first_byte_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("max_retries", &self.max_retries)
            .field("backoff_base", &self.backoff_base)
            .field("backoff_max", &self.backoff_max)
            .field("stream", &self.stream)
            .field("stream_usage", &self.stream_usage)
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
            .connect_timeout(config.connect_timeout)
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
        let mut response = request.send().await.map_err(|e| {
            if e.is_timeout() && !e.is_connect() {
                ModelError::Timeout {
                    kind: TimeoutKind::FirstByte,
                    limit: PROBE_TIMEOUT,
                }
            } else {
                self.final_error(self.transport(e), 1)
            }
        })?;
        let status = response.status();
        let text = read_capped(&mut response, ERROR_BODY_MAX_BYTES).await;
        if !status.is_success() {
            let error = self.status_error(status.as_u16(), None, &text);
            return Err(self.final_error(error, 1));
        }
        let models = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v.get("data").and_then(|d| d.as_array()).cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|m| m.get("id").and_then(|id| id.as_str()).map(str::to_owned))
            .collect();
        Ok(ProbeReport { models })
    }

    /// One HTTP attempt. Text passed to the sink is appended to `shown`.
    async fn attempt(
        &self,
        body: Bytes,
        sink: Option<DeltaSink<'_>>,
        shown: &mut String,
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

        let started = Instant::now();
        // A non-streamed answer arrives only when it is complete: its whole attempt is limited
        // by `request_timeout`, its head also by `first_byte_timeout`.
        let (head_kind, head_limit) =
            if sink.is_none() && self.config.request_timeout < self.config.first_byte_timeout {
                (TimeoutKind::Total, self.config.request_timeout)
            } else {
                (TimeoutKind::FirstByte, self.config.first_byte_timeout)
            };
        let mut response = match tokio::time::timeout(head_limit, request.send()).await {
            Ok(response) => response.map_err(|e| self.transport(e))?,
            Err(_) => return Err(AttemptError::Timeout(head_kind, head_limit)),
        };

        let status = response.status();
        if !status.is_success() {
            let retry_after = retry_after(response.headers());
            // The body only feeds the error detail; a failure to read it must not hide the status.
            let text = tokio::time::timeout(
                self.config.idle_timeout,
                read_capped(&mut response, ERROR_BODY_MAX_BYTES),
            )
            .await
            .unwrap_or_default();
            return Err(self.status_error(status.as_u16(), retry_after, &text));
        }

        let Some(sink) = sink else {
            let deadline = after(started, self.config.request_timeout);
            let bytes = read_body(&mut response, deadline, self.config.request_timeout).await?;
            return self.parse_completion(&bytes);
        };
        let is_json = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("json"));
        if is_json {
            // Some servers ignore `stream: true` and answer in one piece.
            let deadline = after(Instant::now(), self.config.request_timeout);
            let bytes = read_body(&mut response, deadline, self.config.request_timeout).await?;
            let parsed = self.parse_completion(&bytes)?;
            emit(sink, shown, &parsed.content);
            return Ok(parsed);
        }

        let first_deadline = after(started, self.config.first_byte_timeout);
        let mut parser = SseParser::default();
        let mut state = StreamState::default();
        let mut received = 0usize;
        loop {
            let next = if received == 0 {
                tokio::time::timeout_at(first_deadline, response.chunk()).await
            } else {
                tokio::time::timeout(self.config.idle_timeout, response.chunk()).await
            };
            let chunk = match next {
                Err(_) if received == 0 => {
                    return Err(AttemptError::Timeout(
                        TimeoutKind::FirstByte,
                        self.config.first_byte_timeout,
                    ));
                }
                Err(_) => {
                    return Err(AttemptError::Timeout(
                        TimeoutKind::Idle,
                        self.config.idle_timeout,
                    ));
                }
                Ok(Err(e)) => {
                    return Err(AttemptError::Broken(format!(
                        "the stream failed: {}",
                        self.reqwest_text(e)
                    )));
                }
                Ok(Ok(None)) => break,
                Ok(Ok(Some(chunk))) => chunk,
            };
            received += chunk.len();
            if received > STREAM_MAX_BYTES {
                return Err(AttemptError::Invalid(format!(
                    "the stream is longer than {} MiB",
                    STREAM_MAX_BYTES / (1024 * 1024)
                )));
            }
            for data in parser.push(&chunk)? {
                if self.apply(&mut state, &data, sink, shown)? {
                    return Ok(state.finish(sink, shown));
                }
            }
        }
        if let Some(data) = parser.finish() {
            if self.apply(&mut state, &data, sink, shown)? {
                return Ok(state.finish(sink, shown));
            }
        }
        // The connection closed without `[DONE]`: what came is usable only if it was complete.
        if state.finish_reason.is_some() {
            Ok(state.finish(sink, shown))
        } else {
            Err(AttemptError::Broken(
                "the stream ended before the answer was complete".to_owned(),
            ))
        }
    }

    /// Applies one stream event; an error chunk becomes the error it names.
    fn apply(
        &self,
        state: &mut StreamState,
        data: &str,
        sink: DeltaSink<'_>,
        shown: &mut String,
    ) -> Result<bool, AttemptError> {
        state.apply(data, sink, shown).map_err(|fault| match fault {
            Fault::Provider(error) => self.provider_error(&error),
            Fault::Invalid(msg) => AttemptError::Invalid(self.tidy(&msg)),
        })
    }

    /// Parses a non-streamed chat completion.
    fn parse_completion(&self, bytes: &[u8]) -> Result<ModelResponse, AttemptError> {
        parse_completion(bytes).map_err(|fault| match fault {
            Fault::Provider(error) => self.provider_error(&error),
            Fault::Invalid(msg) => AttemptError::Invalid(self.tidy(&msg)),
        })
    }

    /// The attempt error for a non-2xx answer.
    fn status_error(&self, status: u16, retry_after: Option<Duration>, body: &str) -> AttemptError {
        let provider = ProviderError::from_body(body);
        AttemptError::Status {
            status,
            retry_after,
            detail: self.tidy(&provider.message),
            code: provider.code,
        }
    }

    /// The attempt error for an `{"error": ...}` in a 2xx answer or a stream: the status its
    /// code names, or a broken stream (retried) when it names none.
    fn provider_error(&self, error: &Value) -> AttemptError {
        let provider = ProviderError::from_value(error);
        let detail = self.tidy(&provider.message);
        let status = provider
            .status
            .filter(|status| !(200..300).contains(status))
            .or_else(|| provider.code.as_deref().and_then(status_of_code))
            .or_else(|| mentions_context_length(&detail).then_some(400));
        match status {
            Some(status) => AttemptError::Status {
                status,
                retry_after: None,
                detail,
                code: provider.code,
            },
            None if detail.is_empty() => {
                AttemptError::Broken("the model endpoint sent an error".to_owned())
            }
            None => AttemptError::Broken(format!("the model endpoint sent an error: {detail}")),
        }
    }

    /// A transport failure (connecting or sending).
    fn transport(&self, error: reqwest::Error) -> AttemptError {
        if error.is_connect() && error.is_timeout() {
            return AttemptError::Transport(format!(
                "connecting took longer than {}s",
                self.config.connect_timeout.as_secs_f64()
            ));
        }
        AttemptError::Transport(self.reqwest_text(error))
    }

    /// A reqwest error with its causes, without the URL, masked.
    fn reqwest_text(&self, error: reqwest::Error) -> String {
        // The URL is left out: it is already known to the operator and may carry query secrets.
        let error = error.without_url();
        let mut msg = error.to_string();
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            msg.push_str(": ");
            msg.push_str(&cause.to_string());
            source = cause.source();
        }
        self.tidy(&msg)
    }

    /// Provider or transport text made safe: the key masked (before anything is cut, so no
    /// part of it survives the cut), one line, shortened.
    fn tidy(&self, text: &str) -> String {
        match &self.config.api_key {
            Some(key) if !key.is_empty() && text.contains(key.as_str()) => {
                detail::tidy(&text.replace(key.as_str(), "***"))
            }
            _ => detail::tidy(text),
        }
    }

    /// The wait before retry number `retry` (1-based).
    fn backoff(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(wait) = retry_after {
            return wait.min(self.config.backoff_max);
        }
        crate::retry::RetryPolicy::forever(self.config.backoff_base, self.config.backoff_max)
            .backoff(retry)
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
            let mut shown = String::new();
            let result = self.attempt(body.clone(), sink, &mut shown).await;
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
                        emit(sink, &mut shown, &response.content);
                    }
                    return Ok(response);
                }
                Err(error) => error,
            };
            if !shown.is_empty() {
                let error = ModelError::Interrupted {
                    shown,
                    reason: error.summary(),
                };
                self.health.record(true, error.to_string());
                return Err(error);
            }
            if !error.retryable() || attempts > self.config.max_retries {
                if let AttemptError::Status { status: 500.., .. } = &error {
                    // The 5xx error keeps only the status; its reason goes to the log here.
                    tracing::warn!(
                        model = %self.config.model,
                        attempts,
                        reason = %error.summary(),
                        "model request failed; giving up"
                    );
                }
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
                reason = %error.summary(),
                "model request failed; retrying"
            );
            tokio::time::sleep(delay).await;
        }
    }
}

impl OpenAiClient {
    /// The caller-facing error for the last failed attempt (its texts are already masked).
    fn final_error(&self, error: AttemptError, attempts: u32) -> ModelError {
        match error {
            AttemptError::Status {
                status,
                detail,
                code,
                ..
            } => match classify(status, code.as_deref(), &detail) {
                Class::Auth => ModelError::Unauthorized { status, detail },
                Class::NotFound => ModelError::NotFound { detail },
                Class::RateLimit => ModelError::RateLimited { attempts, detail },
                Class::Quota => ModelError::QuotaExceeded { status, detail },
                Class::ContextTooLong => ModelError::ContextTooLong { status, detail },
                Class::Server => ModelError::Server { status, attempts },
                Class::Bad => ModelError::BadRequest { status, detail },
            },
            AttemptError::Transport(msg) => ModelError::Unreachable(msg),
            AttemptError::Timeout(kind, limit) => ModelError::Timeout { kind, limit },
            AttemptError::Broken(reason) => ModelError::StreamBroken { attempts, reason },
            AttemptError::Invalid(msg) => ModelError::InvalidResponse(msg),
        }
    }
}

/// Passes non-empty text to the sink and keeps it in `shown`.
fn emit(sink: DeltaSink<'_>, shown: &mut String, text: &str) {
    if !text.is_empty() {
        shown.push_str(text);
        sink(text);
    }
}

/// What a provider error means for the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Auth,
    NotFound,
    RateLimit,
    Quota,
    ContextTooLong,
    Server,
    Bad,
}

/// Classifies an error by its status, code and message.
fn classify(status: u16, code: Option<&str>, detail: &str) -> Class {
    let code = code.unwrap_or_default();
    if status == 402
        || code == "insufficient_quota"
        || detail
            .to_ascii_lowercase()
            .contains("exceeded your current quota")
    {
        return Class::Quota;
    }
    if (400..500).contains(&status)
        && (code == "context_length_exceeded" || mentions_context_length(detail))
    {
        return Class::ContextTooLong;
    }
    match status {
        401 | 403 => Class::Auth,
        404 => Class::NotFound,
        429 => Class::RateLimit,
        408 | 500.. => Class::Server,
        _ => Class::Bad,
    }
}

/// The status a non-numeric error code stands for, when it is a well-known one.
fn status_of_code(code: &str) -> Option<u16> {
    match code {
        "context_length_exceeded" | "invalid_request_error" => Some(400),
        "invalid_api_key" | "authentication_error" | "auth_error" => Some(401),
        "permission_denied" | "permission_error" => Some(403),
        "model_not_found" | "not_found_error" => Some(404),
        "rate_limit_exceeded" | "rate_limit_error" | "insufficient_quota" => Some(429),
        _ => None,
    }
}

/// How one attempt failed.
#[derive(Debug)]
enum AttemptError {
    /// A non-2xx answer, or an error chunk whose code names a status.
    Status {
        status: u16,
        retry_after: Option<Duration>,
        /// The provider's message, masked and shortened.
        detail: String,
        /// The provider's error code or type, lowercase.
        code: Option<String>,
    },
    /// Connecting or sending failed.
    Transport(String),
    /// A wait ran out.
    Timeout(TimeoutKind, Duration),
    /// The answer broke off after it began: it ended early, reading it failed, or it carried
    /// an error without a status.
    Broken(String),
    /// A 2xx answer that is not a chat completion.
    Invalid(String),
}

impl AttemptError {
    fn retryable(&self) -> bool {
        match self {
            Self::Status {
                status,
                detail,
                code,
                ..
            } => matches!(
                classify(*status, code.as_deref(), detail),
                Class::RateLimit | Class::Server
            ),
            Self::Transport(_) | Self::Timeout(..) | Self::Broken(_) => true,
            Self::Invalid(_) => false,
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// A one-line description for the log (already masked).
    fn summary(&self) -> String {
        match self {
            Self::Status { status, detail, .. } if detail.is_empty() => format!("HTTP {status}"),
            Self::Status { status, detail, .. } => format!("HTTP {status}: {detail}"),
            Self::Transport(msg) | Self::Broken(msg) | Self::Invalid(msg) => msg.clone(),
            Self::Timeout(kind, limit) => ModelError::Timeout {
                kind: *kind,
                limit: *limit,
            }
            .to_string(),
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
        Err(AttemptError::Timeout(..)) => "timeout",
        Err(AttemptError::Broken(_)) => "broken",
        Err(AttemptError::Invalid(_)) => "invalid",
    }
}

/// How long the server asks to wait: `retry-after-ms` (OpenAI, Azure), else `Retry-After` in
/// seconds or as an HTTP date; capped at [`RETRY_AFTER_CAP`]. A date in the past (or a skewed
/// clock) gives `None`, so the plain backoff applies.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let header = |name| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let number = |text: &str| {
        text.parse::<f64>()
            .ok()
            .filter(|n| n.is_finite() && *n >= 0.0)
    };
    let secs = if let Some(ms) = header("retry-after-ms").and_then(number) {
        ms / 1000.0
    } else {
        let value = header(RETRY_AFTER.as_str())?;
        match number(value) {
            Some(secs) => secs,
            None => httpdate::parse_http_date(value)
                .ok()?
                .duration_since(SystemTime::now())
                .ok()?
                .as_secs_f64(),
        }
    };
    Some(Duration::from_secs_f64(
        secs.min(RETRY_AFTER_CAP.as_secs_f64()),
    ))
}

/// `start + limit`, or about 30 years on when that overflows (a huge configured limit).
fn after(start: Instant, limit: Duration) -> Instant {
    start
        .checked_add(limit)
        .or_else(|| start.checked_add(Duration::from_secs(30 * 365 * 86_400)))
        .unwrap_or(start)
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

/// A whole (non-streamed) answer body, at most [`BODY_MAX_BYTES`], complete by `deadline`.
async fn read_body(
    response: &mut reqwest::Response,
    deadline: Instant,
    limit: Duration,
) -> Result<Vec<u8>, AttemptError> {
    let mut body = Vec::new();
    loop {
        let chunk = match tokio::time::timeout_at(deadline, response.chunk()).await {
            Err(_) => return Err(AttemptError::Timeout(TimeoutKind::Total, limit)),
            Ok(Err(e)) => {
                return Err(AttemptError::Broken(format!(
                    "reading the answer failed: {}",
                    e.without_url()
                )));
            }
            Ok(Ok(None)) => return Ok(body),
            Ok(Ok(Some(chunk))) => chunk,
        };
        if body.len() + chunk.len() > BODY_MAX_BYTES {
            return Err(AttemptError::Invalid(format!(
                "the answer is larger than {} MiB",
                BODY_MAX_BYTES / (1024 * 1024)
            )));
        }
        body.extend_from_slice(&chunk);
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
        content: WireContent<'a>,
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

/// A user message's content: a string, or content parts when it carries more than text.
#[derive(Serialize)]
#[serde(untagged)]
enum WireContent<'a> {
    Text(&'a str),
    Parts(Vec<WirePart<'a>>),
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WirePart<'a> {
    Text { text: &'a str },
    ImageUrl { image_url: WireImageUrl<'a> },
}

#[derive(Serialize)]
struct WireImageUrl<'a> {
    url: &'a str,
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
                function: spec.as_ref(),
            })
            .collect();
        Self {
            model: &config.model,
            messages,
            tools,
            temperature: config.temperature,
            max_tokens: config.max_tokens,
            stream,
            stream_options: (stream && config.stream_usage).then_some(StreamOptions {
                include_usage: true,
            }),
        }
    }
}

impl<'a> From<&'a ChatMessage> for WireMessage<'a> {
    fn from(message: &'a ChatMessage) -> Self {
        match message {
            ChatMessage::System { content } => Self::System { content },
            ChatMessage::User { content, parts } if parts.is_empty() => Self::User {
                content: WireContent::Text(content),
            },
            ChatMessage::User { content, parts } => {
                let text = (!content.is_empty()).then_some(WirePart::Text { text: content });
                let parts = text
                    .into_iter()
                    .chain(parts.iter().map(|part| match part {
                        ContentPart::Text { text } => WirePart::Text { text },
                        ContentPart::Image { url } => WirePart::ImageUrl {
                            image_url: WireImageUrl { url },
                        },
                    }))
                    .collect();
                Self::User {
                    content: WireContent::Parts(parts),
                }
            }
            // The reasoning stays home: providers reject or ignore it, and it costs tokens.
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
    error: Option<Value>,
}

#[derive(Deserialize)]
struct WireChoice {
    message: WireAnswer,
    finish_reason: Option<String>,
}

/// A message or a delta: content (a string or content parts), reasoning, tool calls.
#[derive(Deserialize)]
struct WireAnswer<C = WireCallIn> {
    #[serde(default)]
    content: Value,
    /// DeepSeek, vLLM (older), SGLang.
    #[serde(default)]
    reasoning_content: Value,
    /// OpenRouter, vLLM (newer), Ollama.
    #[serde(default)]
    reasoning: Value,
    tool_calls: Option<Vec<C>>,
}

impl<C> WireAnswer<C> {
    /// The answer text and the reasoning this message carries (before `<think>` splitting).
    fn texts(&self) -> (String, String) {
        let (text, mut reasoning) = content_texts(&self.content);
        // Servers that send both fields send the same text twice.
        let field = match (&self.reasoning_content, &self.reasoning) {
            (Value::String(text), _) if !text.is_empty() => text.as_str(),
            (_, Value::String(text)) => text.as_str(),
            _ => "",
        };
        reasoning.insert_str(0, field);
        (text, reasoning)
    }
}

/// The text and the reasoning of a `content` value: a string, `null`, or parts
/// (`{"type": "text", "text"}`; `thinking`/`reasoning` parts are reasoning; others, such as
/// images, are skipped).
fn content_texts(content: &Value) -> (String, String) {
    let mut text = String::new();
    let mut reasoning = String::new();
    match content {
        Value::String(s) => text.push_str(s),
        Value::Array(parts) => {
            for part in parts {
                let kind = part.get("type").and_then(Value::as_str).unwrap_or("text");
                let body = ["text", kind]
                    .iter()
                    .find_map(|key| part.get(key))
                    .map(part_text)
                    .unwrap_or_default();
                match kind {
                    "text" | "output_text" => text.push_str(&body),
                    "thinking" | "reasoning" => reasoning.push_str(&body),
                    _ => {}
                }
            }
        }
        _ => {}
    }
    (text, reasoning)
}

/// The text of a part's body: a string, or nested text parts (Mistral's `thinking`).
fn part_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Array(_) => content_texts(value).0,
        _ => String::new(),
    }
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
    arguments: Value,
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
    error: Option<Value>,
}

#[derive(Deserialize)]
struct WireChunkChoice {
    #[serde(default)]
    delta: Option<WireAnswer<WireCallDelta>>,
    finish_reason: Option<String>,
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

/// Why a 2xx answer is not a usable completion.
enum Fault {
    /// It carries `{"error": ...}`.
    Provider(Value),
    /// It is not a chat completion (the text is unmasked).
    Invalid(String),
}

/// Parses a non-streamed chat completion.
fn parse_completion(bytes: &[u8]) -> Result<ModelResponse, Fault> {
    let completion: WireCompletion = serde_json::from_slice(bytes).map_err(|e| {
        let body = String::from_utf8_lossy(bytes);
        Fault::Invalid(format!("{e}; body: {body}"))
    })?;
    if let Some(error) = completion.error.filter(|e| !e.is_null()) {
        return Err(Fault::Provider(error));
    }
    let Some(choice) = completion.choices.into_iter().next() else {
        return Err(Fault::Invalid("the answer has no choices".to_owned()));
    };
    let (text, mut reasoning) = choice.message.texts();
    let split = ThinkSplitter::split(&text);
    reasoning.push_str(&split.reasoning);
    let tool_calls: Vec<ToolCall> = choice
        .message
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .map(|call| ToolCall {
            id: call.id,
            name: call.function.name,
            arguments: match call.function.arguments {
                Value::String(text) => text,
                Value::Null => String::new(),
                other => other.to_string(),
            },
        })
        .collect();
    Ok(ModelResponse {
        content: split.answer,
        finish_reason: finish_reason(choice.finish_reason, !tool_calls.is_empty()),
        reasoning: non_empty(reasoning),
        tool_calls,
        usage: completion.usage.map(TokenUsage::from),
    })
}

/// Reasoning worth keeping: trimmed, `None` when nothing is left.
fn non_empty(reasoning: String) -> Option<String> {
    let trimmed = reasoning.trim();
    (!trimmed.is_empty()).then(|| trimmed.to_owned())
}

// ---- streaming ----

/// Splits a byte stream into the `data` of server-sent events.
#[derive(Default)]
struct SseParser {
    /// Bytes after the last complete line.
    pending: Vec<u8>,
    /// How much of `pending` is known to hold no newline.
    scanned: usize,
    /// The `data` lines of the event being read, joined by `\n`.
    data: Option<String>,
}

impl SseParser {
    /// Feeds the next network chunk; returns the events it completed.
    fn push(&mut self, chunk: &[u8]) -> Result<Vec<String>, AttemptError> {
        self.pending.extend_from_slice(chunk);
        let mut events = Vec::new();
        let mut start = 0;
        let mut from = self.scanned;
        while let Some(offset) = self.pending[from..].iter().position(|b| *b == b'\n') {
            let end = from + offset;
            if end - start > SSE_LINE_MAX_BYTES {
                return Err(line_too_long());
            }
            let line = String::from_utf8_lossy(&self.pending[start..end]).into_owned();
            self.line(&line, &mut events);
            start = end + 1;
            from = start;
        }
        self.pending.drain(..start);
        self.scanned = self.pending.len();
        if self.pending.len() > SSE_LINE_MAX_BYTES {
            return Err(line_too_long());
        }
        Ok(events)
    }

    /// Ends the stream; returns an event left without its closing blank line.
    fn finish(&mut self) -> Option<String> {
        let mut events = Vec::new();
        if !self.pending.is_empty() {
            let line = String::from_utf8_lossy(&self.pending).into_owned();
            self.pending.clear();
            self.scanned = 0;
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

fn line_too_long() -> AttemptError {
    AttemptError::Invalid(format!(
        "a stream line is longer than {} MiB",
        SSE_LINE_MAX_BYTES / (1024 * 1024)
    ))
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
    reasoning: String,
    think: ThinkSplitter,
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
        shown: &mut String,
    ) -> Result<bool, Fault> {
        if data.trim() == "[DONE]" {
            return Ok(true);
        }
        let chunk: WireChunk = serde_json::from_str(data)
            .map_err(|e| Fault::Invalid(format!("bad stream event ({e}): {data}")))?;
        if let Some(error) = chunk.error.filter(|e| !e.is_null()) {
            return Err(Fault::Provider(error));
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
        let (text, reasoning) = delta.texts();
        self.reasoning.push_str(&reasoning);
        self.take_text(&text, sink, shown);
        for fragment in delta.tool_calls.unwrap_or_default() {
            self.apply_call(fragment);
        }
        Ok(false)
    }

    /// Routes content through the `<think>` splitter: answer text to the sink, the rest to
    /// the reasoning.
    fn take_text(&mut self, text: &str, sink: DeltaSink<'_>, shown: &mut String) {
        if text.is_empty() {
            return;
        }
        let split = self.think.push(text);
        self.reasoning.push_str(&split.reasoning);
        emit(sink, shown, &split.answer);
        self.content.push_str(&split.answer);
    }

    fn apply_call(&mut self, fragment: WireCallDelta) {
        let id = fragment.id.filter(|id| !id.is_empty());
        // Without an index (some servers), a new id starts a new call; otherwise it continues.
        let index = fragment
            .index
            .unwrap_or_else(|| match (&id, self.calls.last()) {
                (Some(id), Some(last)) if !last.id.is_empty() && *id != last.id => last.index + 1,
                (_, Some(last)) => last.index,
                (_, None) => 0,
            });
        // The latest call at this index continues, unless the fragment names another id:
        // then it is a new call that reuses the index (seen from some servers).
        let latest = self.calls.iter().rposition(|c| c.index == index);
        let position = match (latest, &id) {
            (Some(position), Some(id))
                if self
                    .calls
                    .get(position)
                    .is_some_and(|c| !c.id.is_empty() && c.id != *id) =>
            {
                None
            }
            (latest, _) => latest,
        };
        let position = position.unwrap_or_else(|| {
            self.calls.push(PartialCall {
                index,
                id: String::new(),
                name: String::new(),
                arguments: String::new(),
            });
            self.calls.len() - 1
        });
        let Some(call) = self.calls.get_mut(position) else {
            return;
        };
        // Id and name come whole in the first fragment; some servers repeat them later.
        if let Some(id) = id {
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

    /// The response; text the `<think>` splitter still held goes out first.
    fn finish(mut self, sink: DeltaSink<'_>, shown: &mut String) -> ModelResponse {
        let rest = self.think.finish();
        self.reasoning.push_str(&rest.reasoning);
        emit(sink, shown, &rest.answer);
        self.content.push_str(&rest.answer);
        // Stable: calls that share an index keep their order.
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
            reasoning: non_empty(self.reasoning),
            tool_calls,
            usage: self.usage,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use axum::response::{IntoResponse, Response};

    use serde_json::{Value, json};
    use wiremock::matchers::{header, method, path};
    use wiremock::{Mock, MockBuilder, MockServer, ResponseTemplate};

    use super::detail::DETAIL_MAX_CHARS;
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

    /// A server whose answer number `n` (from 0) is `answer(n)`: its base URL and hit count.
    async fn serve_fn<F>(answer: F) -> (String, Arc<AtomicUsize>)
    where
        F: Fn(usize) -> Response + Send + Sync + 'static,
    {
        let hits = Arc::new(AtomicUsize::new(0));
        let counter = hits.clone();
        let answer = Arc::new(answer);
        let app = axum::Router::new().route(
            "/v1/chat/completions",
            axum::routing::post(move || {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                let answer = answer.clone();
                async move { answer(n) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (base, hits)
    }

    /// An SSE response sending `pieces` (raw text), each after `gap`; it then stays open
    /// without sending anything when `hang`, or ends.
    fn paced(pieces: Vec<String>, gap: Duration, hang: bool) -> Response {
        use futures_util::StreamExt;
        let stream = futures_util::stream::unfold(pieces.into_iter(), move |mut rest| async move {
            let piece = rest.next()?;
            tokio::time::sleep(gap).await;
            Some((Ok::<_, std::io::Error>(piece), rest))
        });
        let body = if hang {
            axum::body::Body::from_stream(stream.chain(futures_util::stream::pending()))
        } else {
            axum::body::Body::from_stream(stream)
        };
        ([(CONTENT_TYPE, "text/event-stream")], body).into_response()
    }

    /// `data: {event}` lines of `events`, plus `[DONE]` when `done`.
    fn sse_text(events: &[Value], done: bool) -> String {
        let mut body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        if done {
            body.push_str("data: [DONE]\n\n");
        }
        body
    }

    /// A server answering the first `n` completions with `first`, the rest with `then`.
    async fn serve_then(first: ResponseTemplate, n: u64, then: ResponseTemplate) -> MockServer {
        let server = MockServer::start().await;
        completions()
            .respond_with(first)
            .up_to_n_times(n)
            .mount(&server)
            .await;
        completions().respond_with(then).mount(&server).await;
        server
    }

    async fn stream(client: &OpenAiClient, deltas: &Deltas) -> Result<ModelResponse, ModelError> {
        let sink = |t: &str| deltas.push(t);
        client.complete(&request(), Some(&sink)).await
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
            matches!(&result, Err(ModelError::Interrupted { shown, .. }) if shown == "o"),
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
            ModelError::RateLimited {
                attempts: 4,
                detail: String::new()
            }
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
        assert_eq!(
            error,
            ModelError::Unauthorized {
                status: 401,
                detail: "Incorrect API key provided: ***".to_owned()
            }
        );
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
        assert_eq!(
            fail(&client).await,
            ModelError::Timeout {
                kind: TimeoutKind::Total,
                limit: timeout
            }
        );
    }

    #[tokio::test]
    async fn stalled_stream_after_text_is_not_retried() {
        // One delta, then nothing: the stream goes idle after text went out.
        let (base, hits) = serve_fn(|_| {
            paced(
                vec![format!("data: {}\n\n", text_chunk("partial"))],
                Duration::ZERO,
                true,
            )
        })
        .await;
        let timeout = Duration::from_millis(300);
        let client = client_with(&base, |c| c.idle_timeout = timeout);
        let deltas = Deltas::default();
        let sink = |t: &str| deltas.push(t);
        let error = client.complete(&request(), Some(&sink)).await.unwrap_err();
        let ModelError::Interrupted { shown, reason } = &error else {
            panic!("expected Interrupted, got {error:?}");
        };
        assert_eq!(shown, "partial");
        assert!(reason.contains("sent nothing for 0.3s"), "{reason}");
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
            tools: vec![std::sync::Arc::new(ToolSpec {
                name: "ls".into(),
                description: "Lists files.".into(),
                parameters: json!({"type": "object", "properties": {}}),
            })],
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

    // ---- timeouts ----

    #[tokio::test]
    async fn a_healthy_stream_outlives_every_timeout() {
        // 25 deltas 100 ms apart: about 2.5 s in all, beyond every limit (1 s each), while
        // each gap stays far below the idle limit.
        let pieces: Vec<String> = (0..25)
            .map(|i| format!("data: {}\n\n", text_chunk(&format!("{i} "))))
            .chain([format!(
                "data: {}\n\ndata: [DONE]\n\n",
                finish_chunk("stop")
            )])
            .collect();
        let (base, hits) =
            serve_fn(move |_| paced(pieces.clone(), Duration::from_millis(100), false)).await;
        let limit = Duration::from_secs(1);
        let client = client_with(&base, |c| {
            c.first_byte_timeout = limit;
            c.idle_timeout = limit;
            c.request_timeout = limit;
            c.max_retries = 0;
        });
        let started = std::time::Instant::now();
        let deltas = Deltas::default();
        let response = stream(&client, &deltas).await.unwrap();
        assert!(
            started.elapsed() > Duration::from_secs(2),
            "the stream was long"
        );
        let expected: String = (0..25).map(|i| format!("{i} ")).collect();
        assert_eq!(response.content, expected);
        assert_eq!(deltas.all().len(), 25);
        assert_eq!(hits.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn first_byte_timeout_covers_the_head_and_the_first_chunk() {
        let limit = Duration::from_millis(300);
        let no_retry = |c: &mut OpenAiConfig| {
            c.first_byte_timeout = limit;
            c.max_retries = 0;
        };
        let expected = ModelError::Timeout {
            kind: TimeoutKind::FirstByte,
            limit,
        };
        // The head is late.
        let late_head =
            serve(sse(&[text_chunk("late")], true).set_delay(Duration::from_secs(30))).await;
        let deltas = Deltas::default();
        let error = stream(&client_with(&late_head.uri(), no_retry), &deltas).await;
        assert_eq!(error.unwrap_err(), expected);
        // The head comes at once, the first chunk never.
        let (base, _) = serve_fn(|_| paced(Vec::new(), Duration::ZERO, true)).await;
        let error = stream(&client_with(&base, no_retry), &deltas).await;
        assert_eq!(error.unwrap_err(), expected);
        assert!(deltas.all().is_empty());
    }

    #[tokio::test]
    async fn a_stream_stalled_before_any_text_is_retried() {
        // The first answer sends its role chunk and a reasoning delta, then goes quiet; the
        // second is fine. Nothing was shown, so the retry is invisible.
        let (base, hits) = serve_fn(|n| {
            if n == 0 {
                let events = [
                    json!({"choices": [{"delta": {"role": "assistant"}}]}),
                    json!({"choices": [{"delta": {"reasoning_content": "hmm"}}]}),
                ];
                paced(vec![sse_text(&events, false)], Duration::ZERO, true)
            } else {
                let events = [text_chunk("fine"), finish_chunk("stop")];
                paced(vec![sse_text(&events, true)], Duration::ZERO, false)
            }
        })
        .await;
        let client = client_with(&base, |c| c.idle_timeout = Duration::from_millis(300));
        let deltas = Deltas::default();
        let response = stream(&client, &deltas).await.unwrap();
        assert_eq!(response.content, "fine");
        assert_eq!(
            response.reasoning, None,
            "the failed attempt's reasoning is gone"
        );
        assert_eq!(deltas.all(), ["fine"]);
        assert_eq!(hits.load(Ordering::SeqCst), 2);
    }

    // ---- broken streams ----

    #[tokio::test]
    async fn a_stream_cut_before_any_text_is_retried() {
        let cut = sse(
            &[json!({"choices": [{"delta": {"role": "assistant"}}]})],
            false,
        );
        let server = serve_then(
            cut,
            1,
            sse(&[text_chunk("whole"), finish_chunk("stop")], true),
        )
        .await;
        let deltas = Deltas::default();
        let response = stream(&client(&server), &deltas).await.unwrap();
        assert_eq!(response.content, "whole");
        assert_eq!(requests(&server).await, 2);

        // Cut every time: the retries run out.
        let server = serve(sse(&[], false)).await;
        let error = stream(&client_with(&server.uri(), |c| c.max_retries = 1), &deltas)
            .await
            .unwrap_err();
        assert_eq!(
            error,
            ModelError::StreamBroken {
                attempts: 2,
                reason: "the stream ended before the answer was complete".to_owned()
            }
        );
        assert!(error.retry_can_help());
        assert_eq!(requests(&server).await, 2);
    }

    /// LiteLLM's proxy with keep-alive pings: a rate limit is a 200 stream of `: ping`
    /// comments and an error chunk whose code is the status, as a string.
    fn litellm_rate_limit() -> ResponseTemplate {
        let error = json!({"error": {
            "message": "litellm.RateLimitError: Rate limit reached for gpt-4o. Please try again in 2s.",
            "type": "None", "param": "None", "code": "429"
        }});
        ResponseTemplate::new(200).set_body_raw(
            format!(": ping\n\n: ping - 2025-01-01 00:00:00\n\ndata: {error}\n\n"),
            "text/event-stream",
        )
    }

    #[tokio::test]
    async fn an_error_chunk_naming_429_is_a_rate_limit_and_retried() {
        let answer = sse(&[text_chunk("after"), finish_chunk("stop")], true);
        let server = serve_then(litellm_rate_limit(), 1, answer).await;
        let deltas = Deltas::default();
        let response = stream(&client(&server), &deltas).await.unwrap();
        assert_eq!(response.content, "after");
        assert_eq!(deltas.all(), ["after"]);
        assert_eq!(requests(&server).await, 2);

        let server = serve(litellm_rate_limit()).await;
        let error = stream(&client(&server), &deltas).await.unwrap_err();
        assert_eq!(
            error,
            ModelError::RateLimited {
                attempts: 4,
                detail:
                    "litellm.RateLimitError: Rate limit reached for gpt-4o. Please try again in 2s."
                        .to_owned()
            }
        );
        assert_eq!(requests(&server).await, 4);
    }

    #[tokio::test]
    async fn error_chunks_count_like_the_status_they_name() {
        let chunk = |error: Value| sse(&[json!({ "error": error })], false);
        let deltas = Deltas::default();
        // A numeric 401: not retried.
        let server = serve(chunk(
            json!({"message": "No api key passed in.", "code": 401}),
        ))
        .await;
        let error = stream(&client(&server), &deltas).await.unwrap_err();
        assert_eq!(
            error,
            ModelError::Unauthorized {
                status: 401,
                detail: "No api key passed in.".to_owned()
            }
        );
        assert_eq!(requests(&server).await, 1);
        // A named code: the context is full, not retried.
        let server = serve(chunk(json!({
            "message": "This model's maximum context length is 8192 tokens.",
            "code": "context_length_exceeded"
        })))
        .await;
        let error = stream(&client(&server), &deltas).await.unwrap_err();
        assert!(
            matches!(error, ModelError::ContextTooLong { status: 400, .. }),
            "{error:?}"
        );
        assert_eq!(requests(&server).await, 1);
        // No status at all: a broken stream, retried.
        let server = serve(chunk(
            json!({"message": "upstream hiccup", "type": "server_error"}),
        ))
        .await;
        let error = stream(&client_with(&server.uri(), |c| c.max_retries = 1), &deltas)
            .await
            .unwrap_err();
        assert_eq!(
            error,
            ModelError::StreamBroken {
                attempts: 2,
                reason: "the model endpoint sent an error: upstream hiccup".to_owned()
            }
        );
        assert_eq!(requests(&server).await, 2);
        assert!(deltas.all().is_empty());
    }

    #[tokio::test]
    async fn an_error_after_text_interrupts_with_the_text_shown() {
        let server = serve(sse(
            &[
                text_chunk("The answer is"),
                json!({"error": {"message": "overloaded", "code": 503}}),
            ],
            false,
        ))
        .await;
        let deltas = Deltas::default();
        let error = stream(&client(&server), &deltas).await.unwrap_err();
        assert_eq!(
            error,
            ModelError::Interrupted {
                shown: "The answer is".to_owned(),
                reason: "HTTP 503: overloaded".to_owned()
            }
        );
        assert_eq!(error.shown_text(), Some("The answer is"));
        assert_eq!(deltas.all(), ["The answer is"]);
        assert_eq!(requests(&server).await, 1, "a retry would repeat the text");
        let message = error.user_message();
        assert!(message.starts_with("The answer is\n\n⚠️"), "{message}");
        assert!(message.contains("broke off"), "{message}");
        assert!(message.contains("again to get a full answer"), "{message}");
        assert!(
            !error.to_string().contains("The answer is"),
            "no answer text in logs"
        );
    }

    // ---- provider errors ----

    #[tokio::test]
    async fn the_providers_reason_is_kept_masked_and_short() {
        // LiteLLM's answer to a missing key.
        let server = serve(ResponseTemplate::new(401).set_body_json(json!({"error": {
            "message": "Authentication Error, No api key passed in.",
            "type": "auth_error", "param": "None", "code": "401"
        }})))
        .await;
        let error = fail(&client(&server)).await;
        assert_eq!(
            error,
            ModelError::Unauthorized {
                status: 401,
                detail: "Authentication Error, No api key passed in.".to_owned()
            }
        );
        assert!(
            error
                .to_string()
                .ends_with(": Authentication Error, No api key passed in.")
        );
        let message = error.user_message();
        assert!(
            message.contains(
                "The provider says: Authentication Error, No api key passed in. The operator"
            ),
            "{message}"
        );
        assert!(!message.contains(".."), "{message}");
        assert!(
            !message.to_lowercase().contains("send your message again"),
            "{message}"
        );

        // A long, multi-line message quoting the key.
        let long = format!(
            "Invalid request:\n  the key {KEY} was\tgiven, and {}",
            "more words follow here ".repeat(30)
        );
        let server =
            serve(ResponseTemplate::new(400).set_body_json(json!({"error": {"message": long}})))
                .await;
        let error = fail(&client(&server)).await;
        let ModelError::BadRequest {
            status: 400,
            detail,
        } = &error
        else {
            panic!("expected BadRequest, got {error:?}");
        };
        assert!(
            detail.starts_with("Invalid request: the key *** was given, and more words"),
            "{detail}"
        );
        assert!(!detail.contains(KEY) && !detail.contains('\n') && !detail.contains('\t'));
        assert!(detail.chars().count() <= DETAIL_MAX_CHARS + 1, "{detail}");
        let last_word = detail
            .trim_end_matches('…')
            .rsplit(' ')
            .next()
            .unwrap_or_default();
        assert!(
            ["more", "words", "follow", "here"].contains(&last_word),
            "{detail}"
        );
        assert!(error.user_message().contains(detail.as_str()));
        assert!(!error.user_message().contains(KEY));
    }

    #[tokio::test]
    async fn a_full_context_is_its_own_error() {
        for body in [
            json!({"error": {"message": "Please reduce the length of the messages.", "code": "context_length_exceeded"}}),
            json!({"error": {"message": "This model's maximum context length is 128000 tokens."}}),
        ] {
            let server = serve(ResponseTemplate::new(400).set_body_json(body)).await;
            let error = fail(&client(&server)).await;
            assert!(
                matches!(error, ModelError::ContextTooLong { status: 400, .. }),
                "{error:?}"
            );
            assert!(error.user_message().contains("too long for the model"));
            assert!(error.user_message().contains("/new"));
            assert!(!error.retry_can_help());
            assert_eq!(requests(&server).await, 1);
        }
    }

    #[tokio::test]
    async fn an_empty_quota_is_not_retried() {
        let server = serve(ResponseTemplate::new(429).set_body_json(json!({"error": {
            "message": "You exceeded your current quota, please check your plan and billing details.",
            "type": "insufficient_quota", "code": "insufficient_quota"
        }})))
        .await;
        let error = fail(&client(&server)).await;
        assert!(
            matches!(error, ModelError::QuotaExceeded { status: 429, .. }),
            "{error:?}"
        );
        assert_eq!(requests(&server).await, 1);
        let message = error.user_message();
        assert!(message.contains("billing"), "{message}");
        assert!(
            !message.to_lowercase().contains("send your message again"),
            "{message}"
        );
    }

    #[tokio::test]
    async fn an_error_in_a_2xx_body_counts_like_its_status() {
        let server = serve_then(
            ResponseTemplate::new(200)
                .set_body_json(json!({"error": {"message": "busy", "code": "429"}})),
            1,
            answer("ok"),
        )
        .await;
        let response = client(&server).complete(&request(), None).await.unwrap();
        assert_eq!(response.content, "ok");
        assert_eq!(requests(&server).await, 2);
    }

    // ---- Retry-After and size limits ----

    #[test]
    fn retry_after_reads_dates_and_milliseconds() {
        let headers = |pairs: &[(&'static str, String)]| {
            let mut headers = HeaderMap::new();
            for (name, value) in pairs {
                headers.insert(*name, value.parse().unwrap());
            }
            retry_after(&headers)
        };
        let in_30s = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(30));
        let wait = headers(&[("retry-after", in_30s)]).unwrap();
        assert!(
            (Duration::from_secs(20)..=Duration::from_secs(30)).contains(&wait),
            "{wait:?}"
        );
        assert_eq!(
            headers(&[("retry-after-ms", "1500".into())]),
            Some(Duration::from_millis(1500))
        );
        // The milliseconds are the more precise of the two.
        assert_eq!(
            headers(&[
                ("retry-after-ms", "250".into()),
                ("retry-after", "1".into())
            ]),
            Some(Duration::from_millis(250))
        );
        assert_eq!(headers(&[("retry-after", "soon".into())]), None);
        assert_eq!(headers(&[]), None);
        // Whatever the server asks, the wait is capped at backoff_max.
        let client = client_with("http://h", |c| c.backoff_max = Duration::from_millis(1000));
        assert_eq!(
            client.backoff(1, Some(Duration::from_secs(30))),
            Duration::from_millis(1000)
        );
    }

    #[tokio::test]
    async fn retry_after_ms_is_honoured() {
        let server = serve_then(
            ResponseTemplate::new(429).insert_header("retry-after-ms", "10"),
            1,
            answer("done"),
        )
        .await;
        let client = client_with(&server.uri(), |c| c.backoff_max = Duration::from_secs(5));
        assert_eq!(
            client.complete(&request(), None).await.unwrap().content,
            "done"
        );
        assert_eq!(requests(&server).await, 2);
    }

    #[tokio::test]
    async fn oversized_answers_are_refused() {
        // A non-streamed body over 8 MiB.
        let big = format!(
            r#"{{"choices": [{{"message": {{"content": "{}"}}, "finish_reason": "stop"}}]}}"#,
            "a".repeat(BODY_MAX_BYTES)
        );
        let server = serve(ResponseTemplate::new(200).set_body_raw(big, "application/json")).await;
        let error = fail(&client(&server)).await;
        assert_eq!(
            error,
            ModelError::InvalidResponse("the answer is larger than 8 MiB".into())
        );
        assert_eq!(requests(&server).await, 1);

        let deltas = Deltas::default();
        // One line over 1 MiB.
        let line = format!("data: {}\n\n", "x".repeat(SSE_LINE_MAX_BYTES + 1));
        let server =
            serve(ResponseTemplate::new(200).set_body_raw(line, "text/event-stream")).await;
        let error = stream(&client(&server), &deltas).await.unwrap_err();
        assert_eq!(
            error,
            ModelError::InvalidResponse("a stream line is longer than 1 MiB".into())
        );
        // Over 16 MiB in all, in lines that are each fine.
        let comment = format!(": {}\n", "p".repeat(1024));
        let body = comment.repeat(STREAM_MAX_BYTES / comment.len() + 2);
        let server =
            serve(ResponseTemplate::new(200).set_body_raw(body, "text/event-stream")).await;
        let error = stream(&client(&server), &deltas).await.unwrap_err();
        assert_eq!(
            error,
            ModelError::InvalidResponse("the stream is longer than 16 MiB".into())
        );
        assert!(deltas.all().is_empty());
    }

    // ---- response shapes ----

    #[tokio::test]
    async fn same_index_with_a_new_id_is_a_new_call() {
        let fragment = |id: Option<&str>, name: Option<&str>, args: &str| {
            let mut f = json!({"index": 0, "function": {"arguments": args}});
            if let Some(id) = id {
                f["id"] = json!(id);
            }
            if let Some(name) = name {
                f["function"]["name"] = json!(name);
            }
            json!({"choices": [{"delta": {"tool_calls": [f]}}]})
        };
        let server = serve(sse(
            &[
                fragment(Some("call_1"), Some("ls"), "{\"dir\":"),
                fragment(None, None, "\"/\"}"),
                // Repeating the same id continues the call.
                fragment(Some("call_1"), None, ""),
                fragment(Some("call_2"), Some("read_file"), "{\"path\":"),
                fragment(None, None, "\"a\"}"),
                finish_chunk("tool_calls"),
            ],
            true,
        ))
        .await;
        let deltas = Deltas::default();
        let response = stream(&client(&server), &deltas).await.unwrap();
        assert_eq!(
            response.tool_calls,
            [
                call("call_1", "ls", r#"{"dir":"/"}"#),
                call("call_2", "read_file", r#"{"path":"a"}"#)
            ]
        );
    }

    #[tokio::test]
    async fn array_content_is_read_in_messages_and_deltas() {
        let server = serve(ResponseTemplate::new(200).set_body_json(json!({
            "choices": [{"message": {"role": "assistant", "content": [
                {"type": "text", "text": "Hello "},
                {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
                {"type": "text", "text": "there"}
            ]}, "finish_reason": "stop"}]
        })))
        .await;
        let response = client(&server).complete(&request(), None).await.unwrap();
        assert_eq!(response.content, "Hello there");

        let server = serve(sse(
            &[
                json!({"choices": [{"delta": {"content": [{"type": "text", "text": "Hi"}]}}]}),
                json!({"choices": [{"delta": {"content": [{"type": "text", "text": "!"}]}}]}),
                finish_chunk("stop"),
            ],
            true,
        ))
        .await;
        let deltas = Deltas::default();
        let response = stream(&client(&server), &deltas).await.unwrap();
        assert_eq!(response.content, "Hi!");
        assert_eq!(deltas.all(), ["Hi", "!"]);
    }

    #[tokio::test]
    async fn length_and_content_filter_come_through() {
        for (raw, expected) in [
            ("length", FinishReason::Length),
            ("content_filter", FinishReason::ContentFilter),
        ] {
            let server = serve(ResponseTemplate::new(200).set_body_json(json!({
                "choices": [{"message": {"content": "cut"}, "finish_reason": raw}]
            })))
            .await;
            let response = client(&server).complete(&request(), None).await.unwrap();
            assert_eq!(response.finish_reason, expected);

            let server = serve(sse(&[text_chunk("cut"), finish_chunk(raw)], true)).await;
            let response = stream(&client(&server), &Deltas::default()).await.unwrap();
            assert_eq!(response.finish_reason, expected);
            assert_eq!(response.content, "cut");
        }
    }

    #[tokio::test]
    async fn stream_usage_can_be_turned_off() {
        let server = serve(sse(&[text_chunk("x"), finish_chunk("stop")], true)).await;
        let client = client_with(&server.uri(), |c| c.stream_usage = false);
        stream(&client, &Deltas::default()).await.unwrap();
        let sent = first_body(&server).await;
        assert_eq!(sent["stream"], true);
        assert!(sent.get("stream_options").is_none(), "{sent}");
    }

    // ---- reasoning ----

    #[tokio::test]
    async fn streamed_reasoning_never_reaches_the_sink() {
        // DeepSeek's reasoning_content, OpenRouter's reasoning, and a <think> block in the
        // content, its tags split across chunks.
        let content = "<think>The user greets; greet back.</think>\n\nHello!";
        let mut events = vec![
            json!({"choices": [{"delta": {"role": "assistant", "content": null, "reasoning_content": "Step one. "}}]}),
            json!({"choices": [{"delta": {"reasoning": "Step two. "}}]}),
            // vLLM sends both names with the same text: it counts once.
            json!({"choices": [{"delta": {"reasoning_content": "Step three. ", "reasoning": "Step three. "}}]}),
        ];
        let bytes: Vec<char> = content.chars().collect();
        for piece in bytes.chunks(3) {
            events.push(text_chunk(&piece.iter().collect::<String>()));
        }
        events.push(finish_chunk("stop"));
        let server = serve(sse(&events, true)).await;
        let deltas = Deltas::default();
        let response = stream(&client(&server), &deltas).await.unwrap();
        assert_eq!(response.content, "Hello!");
        assert_eq!(deltas.all().concat(), "Hello!");
        assert_eq!(
            response.reasoning.as_deref(),
            Some("Step one. Step two. Step three. The user greets; greet back.")
        );
    }

    #[tokio::test]
    async fn reasoning_in_a_whole_message_is_kept_apart() {
        let server = serve(ResponseTemplate::new(200).set_body_json(json!({
            "choices": [{"message": {
                "role": "assistant",
                "reasoning_content": "Think first.",
                "content": "<think>\nAnd more.\n</think>\nThe answer."
            }, "finish_reason": "stop"}]
        })))
        .await;
        let deltas = Deltas::default();
        let sink = |t: &str| deltas.push(t);
        let client = client_with(&server.uri(), |c| c.stream = false);
        let response = client.complete(&request(), Some(&sink)).await.unwrap();
        assert_eq!(response.content, "The answer.");
        assert_eq!(deltas.all(), ["The answer."]);
        assert_eq!(
            response.reasoning.as_deref(),
            Some("Think first.\nAnd more.")
        );

        // No reasoning: none at all.
        let server = serve(answer("plain")).await;
        let response = client_with(&server.uri(), |_| {})
            .complete(&request(), None)
            .await
            .unwrap();
        assert_eq!(response.reasoning, None);
    }

    // ---- request shape ----

    #[tokio::test]
    async fn images_go_as_content_parts_and_reasoning_stays_home() {
        let server = serve(answer("seen")).await;
        let request = ModelRequest {
            messages: vec![
                ChatMessage::user("earlier"),
                ChatMessage::Assistant {
                    content: "Earlier answer.".into(),
                    tool_calls: Vec::new(),
                    reasoning: Some("private thoughts".into()),
                },
                ChatMessage::User {
                    content: "What is in these?".into(),
                    parts: vec![
                        ContentPart::Image {
                            url: "https://example.com/a.png".into(),
                        },
                        ContentPart::Text {
                            text: "and this one:".into(),
                        },
                        ContentPart::Image {
                            url: "data:image/png;base64,iVBORw0KGgo=".into(),
                        },
                    ],
                },
            ],
            tools: Vec::new(),
        };
        client(&server).complete(&request, None).await.unwrap();
        let sent = first_body(&server).await;
        assert_eq!(
            sent["messages"],
            json!([
                {"role": "user", "content": "earlier"},
                {"role": "assistant", "content": "Earlier answer."},
                {"role": "user", "content": [
                    {"type": "text", "text": "What is in these?"},
                    {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                    {"type": "text", "text": "and this one:"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
                ]}
            ])
        );
        assert!(!sent.to_string().contains("private thoughts"));
    }

    #[test]
    fn sse_lines_are_limited() {
        let mut parser = SseParser::default();
        let half = vec![b'x'; SSE_LINE_MAX_BYTES / 2];
        assert!(parser.push(b"data: ").unwrap().is_empty());
        assert!(parser.push(&half).unwrap().is_empty());
        assert!(parser.push(&half).is_err(), "the line grew past the limit");
        // Also when the whole line arrives in one piece.
        let mut line = b"data: ".to_vec();
        line.extend(vec![b'x'; SSE_LINE_MAX_BYTES]);
        line.extend(b"\n\n");
        assert!(SseParser::default().push(&line).is_err());
        assert_eq!(SseParser::default().push(b"data: ok\n\n").unwrap(), ["ok"]);
    }
}
