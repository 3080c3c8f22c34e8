//! The OpenAI-compatible chat-completions client: request mapping, streaming (SSE), retries.
//!
//! One `complete` call makes up to `1 + max_retries` HTTP attempts. 429, 408, 5xx, connection
//! failures, timeouts and broken streams (ended early, failed mid-way, or carrying an
//! `{"error": ...}` chunk) are retried with exponential backoff and jitter, or after the
//! server's `Retry-After` / `retry-after-ms` (or LiteLLM's forwarded `llm_provider-` copies;
//! capped at the backoff maximum); everything else
//! fails at once. An error chunk's `code` counts like the HTTP status it names, so a proxy that
//! answers a rate limit as `200` plus `data: {"error": {"code": "429"}}` is rate limited.
//!
//! A streamed attempt that has already passed text to the delta sink is never retried, because
//! the retry would repeat that text: it ends in [`ModelError::Interrupted`] with that text.
//!
//! Timeouts: connecting (`connect_timeout`), the response head and, streamed, its first `data`
//! event (`first_byte_timeout`), the longest gap between `data` (`idle_timeout`; SSE comments
//! such as LiteLLM's `: ping` are not activity), and for a non-streamed answer the whole
//! attempt (`request_timeout`). A healthy stream has no total limit.
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
    TimeoutKind, mentions_context_length, mentions_unknown_model,
};
use crate::agent::message::{ChatMessage, ContentPart, TokenUsage, ToolCall};

mod errors;
mod stream;
#[cfg(test)]
mod tests;
mod wire;

use errors::{AttemptError, Class, classify, retry_after, status_label, status_of_code};
use stream::{SseParser, StreamState};
use wire::{Fault, WireRequest, parse_completion};

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

/// What one network chunk of a stream did.
struct ChunkRead {
    /// The answer, when the chunk completed it (`[DONE]`).
    done: Option<ModelResponse>,
    /// Whether the answer moved (see [`SseParser::take_activity`]).
    activity: bool,
}

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

        // Only `data` counts as the answer starting or moving: a proxy's keep-alive comments
        // (LiteLLM's `: ping`) must not keep a hung upstream alive.
        let mut deadline = after(started, self.config.first_byte_timeout);
        let mut answering = false;
        let mut parser = SseParser::default();
        let mut state = StreamState::default();
        let mut received = 0usize;
        loop {
            let chunk = match tokio::time::timeout_at(deadline, response.chunk()).await {
                Err(_) if !answering => {
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
            let read = self.read_chunk(&mut parser, &mut state, &chunk, sink, shown)?;
            if read.activity {
                answering = true;
                deadline = after(Instant::now(), self.config.idle_timeout);
            }
            if let Some(answer) = read.done {
                return Ok(answer);
            }
        }
        self.end_stream(parser, state, sink, shown)
    }

    /// Reads one network chunk of a stream: its events applied, and the answer once `[DONE]`
    /// completes it.
    fn read_chunk(
        &self,
        parser: &mut SseParser,
        state: &mut StreamState,
        chunk: &[u8],
        sink: DeltaSink<'_>,
        shown: &mut String,
    ) -> Result<ChunkRead, AttemptError> {
        let events = parser.push(chunk)?;
        let activity = parser.take_activity();
        for data in events {
            if self.apply(state, &data, sink, shown)? {
                let done = std::mem::take(state).finish(sink, shown);
                return Ok(ChunkRead {
                    done: Some(done),
                    activity,
                });
            }
        }
        Ok(ChunkRead {
            done: None,
            activity,
        })
    }

    /// The answer once the connection closed without `[DONE]`: an event left without its
    /// closing blank line still counts, and what came is usable only if it was complete.
    fn end_stream(
        &self,
        mut parser: SseParser,
        mut state: StreamState,
        sink: DeltaSink<'_>,
        shown: &mut String,
    ) -> Result<ModelResponse, AttemptError> {
        if let Some(data) = parser.finish() {
            if self.apply(&mut state, &data, sink, shown)? {
                return Ok(state.finish(sink, shown));
            }
        }
        if state.finish_reason.is_some() {
            Ok(state.finish(sink, shown))
        } else {
            Err(AttemptError::Broken(
                "the stream ended before the answer was complete".to_owned(),
            ))
        }
    }

    /// A whole stream body arriving in `pieces`, read as a streamed attempt reads it (without
    /// its timeouts): for the fuzz targets ([`crate::fuzzing`]).
    pub(crate) fn read_stream(
        &self,
        pieces: &[&[u8]],
        sink: DeltaSink<'_>,
        shown: &mut String,
    ) -> Result<ModelResponse, ModelError> {
        let mut parser = SseParser::default();
        let mut state = StreamState::default();
        let read = || -> Result<ModelResponse, AttemptError> {
            for piece in pieces {
                if let Some(answer) = self
                    .read_chunk(&mut parser, &mut state, piece, sink, shown)?
                    .done
                {
                    return Ok(answer);
                }
            }
            self.end_stream(parser, state, sink, shown)
        };
        read().map_err(|error| self.final_error(error, 1))
    }

    /// A non-streamed answer's body, read as an attempt reads it: for the fuzz targets.
    pub(crate) fn read_completion(&self, body: &[u8]) -> Result<ModelResponse, ModelError> {
        self.parse_completion(body)
            .map_err(|error| self.final_error(error, 1))
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
            // The retries so far, on the caller's `model_call` span (a trace attribute).
            tracing::Span::current().record("retries", attempts - 1);
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
                Class::UnknownModel => ModelError::UnknownModel { status, detail },
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

/// The `data` of each event in a stream arriving in `pieces`, an unterminated last one
/// included, as a streamed attempt splits it: for the fuzz targets ([`crate::fuzzing`]).
pub(crate) fn sse_events(pieces: &[&[u8]]) -> Result<Vec<String>, String> {
    let mut parser = SseParser::default();
    let mut events = Vec::new();
    for piece in pieces {
        events.extend(parser.push(piece).map_err(|e| format!("{e:?}"))?);
    }
    events.extend(parser.finish());
    Ok(events)
}
