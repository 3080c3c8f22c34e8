//! The model boundary: what the run loop asks of an LLM and what comes back.
//!
//! [`ChatModel`] is the seam tests script; [`OpenAiClient`] speaks the OpenAI-compatible
//! chat-completions protocol (OpenAI, Azure, vLLM, Ollama, llama.cpp, OpenRouter, DeepSeek ...).
//! Retries, timeouts and backoff live in the client, not in the middleware chain.

mod health;
mod openai;
#[cfg(test)]
pub(crate) mod scripted;

pub(crate) use health::ModelHealth;
pub(crate) use openai::{OpenAiClient, OpenAiConfig};

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::message::{ChatMessage, TokenUsage, ToolCall};

/// A tool as offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ToolSpec {
    /// The name the model calls it by.
    pub(crate) name: String,
    /// What it does, for the model.
    pub(crate) description: String,
    /// JSON Schema of its arguments object.
    pub(crate) parameters: serde_json::Value,
}

/// One chat-completions request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ModelRequest {
    /// The messages to send, system prompt first.
    pub(crate) messages: Vec<ChatMessage>,
    /// The tools the model may call (empty: none).
    pub(crate) tools: Vec<ToolSpec>,
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum FinishReason {
    /// A complete answer.
    Stop,
    /// It wants tool results.
    ToolCalls,
    /// It ran out of output tokens.
    Length,
    /// The provider filtered the content.
    ContentFilter,
    /// Anything else the provider said.
    Other(String),
}

/// The model's answer to one request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ModelResponse {
    /// The visible text (may be empty).
    pub(crate) content: String,
    /// The tool calls, in the order the model made them.
    pub(crate) tool_calls: Vec<ToolCall>,
    /// Token counts when the provider reports them.
    pub(crate) usage: Option<TokenUsage>,
    /// Why it stopped.
    pub(crate) finish_reason: FinishReason,
    /// The model's reasoning, apart from the answer, when it gave any.
    pub(crate) reasoning: Option<String>,
}

/// Receives streamed text as it arrives.
pub(crate) type DeltaSink<'a> = &'a (dyn Fn(&str) + Send + Sync);

/// The errors of the model boundary.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub(crate) enum ModelError {
    /// 401/403: the API key is wrong or missing.
    #[error("the model endpoint rejected the credentials (HTTP {status})")]
    Unauthorized {
        /// The HTTP status.
        status: u16,
    },
    /// 404: wrong base URL or unknown model name.
    #[error("the model endpoint or model was not found (HTTP 404): {detail}")]
    NotFound {
        /// The provider's message, shortened.
        detail: String,
    },
    /// Still rate limited (429) after every retry.
    #[error("the model endpoint is rate limiting (HTTP 429) after {attempts} attempts")]
    RateLimited {
        /// How many requests were made.
        attempts: u32,
    },
    /// A 5xx after every retry.
    #[error("the model endpoint failed (HTTP {status}) after {attempts} attempts")]
    Server {
        /// The last HTTP status.
        status: u16,
        /// How many requests were made.
        attempts: u32,
    },
    /// Another 4xx: the request itself is wrong (bad tool schema, context too long ...).
    #[error("the model endpoint refused the request (HTTP {status}): {detail}")]
    BadRequest {
        /// The HTTP status.
        status: u16,
        /// The provider's message, shortened.
        detail: String,
    },
    /// No complete answer within the request timeout.
    #[error("the model did not answer within {0:?}")]
    Timeout(Duration),
    /// The endpoint could not be reached.
    #[error("could not reach the model endpoint: {0}")]
    Unreachable(String),
    /// The endpoint answered something that is not a chat completion.
    #[error("the model endpoint answered garbage: {0}")]
    InvalidResponse(String),
}

impl ModelError {
    /// Whether the endpoint answered at all (for [`ModelHealth`]).
    pub(crate) fn reached_endpoint(&self) -> bool {
        !matches!(self, Self::Unreachable(_) | Self::Timeout(_))
    }

    /// What to tell a chat user: what went wrong and what helps. Never the provider's raw
    /// text, which may quote the request or credentials; the full error goes to the log.
    pub(crate) fn user_message(&self) -> String {
        match self {
            Self::Unauthorized { .. } => "⚠️ Sorry, the model provider refused antler's \
                credentials, so I cannot answer right now. The operator needs to check \
                `model.api_key` (OPENAI_API_KEY in the default config)."
                .to_owned(),
            Self::NotFound { .. } => "⚠️ Sorry, the model provider does not know the model or \
                endpoint antler is set up with. The operator needs to check `model.model` and \
                `model.base_url`."
                .to_owned(),
            Self::RateLimited { .. } => "⚠️ Sorry, the model provider is limiting requests \
                right now. Send your message again in a minute."
                .to_owned(),
            Self::Server { status, .. } => format!(
                "⚠️ Sorry, the model provider failed (HTTP {status}). Send your message again \
                 in a moment."
            ),
            Self::BadRequest { status, detail } if mentions_context_length(detail) => format!(
                "⚠️ Sorry, this conversation is now too long for the model (HTTP {status}). \
                 Send /new to start a fresh one."
            ),
            Self::BadRequest { status, .. } => format!(
                "⚠️ Sorry, the model provider refused the request (HTTP {status}). The details \
                 are in antler's log."
            ),
            Self::Timeout(limit) => format!(
                "⚠️ Sorry, the model did not answer within {} seconds. Send your message again \
                 to retry.",
                limit.as_secs()
            ),
            Self::Unreachable(_) => "⚠️ Sorry, antler cannot reach the model server right \
                now. The operator needs to check that it is running and that `model.base_url` \
                (ANTLER_MODEL_BASE_URL in the default config) points at it. Send your message \
                again once it is back."
                .to_owned(),
            Self::InvalidResponse(_) => "⚠️ Sorry, the model server answered something antler \
                cannot read. The details are in antler's log; send your message again to retry."
                .to_owned(),
        }
    }
}

/// Whether a provider's 4xx text says the request was too long for the model's context.
fn mentions_context_length(detail: &str) -> bool {
    let lower = detail.to_ascii_lowercase();
    [
        "context length",
        "context_length",
        "maximum context",
        "too many tokens",
        "context window",
    ]
    .iter()
    .any(|needle| lower.contains(needle))
}

/// An LLM that completes chats.
#[async_trait::async_trait]
pub(crate) trait ChatModel: Send + Sync {
    /// The model's name, for `/status` and logs.
    fn name(&self) -> &str;

    /// Completes one request. When `deltas` is given the response is streamed and each text
    /// fragment is passed to it as it arrives; the returned response is complete either way.
    async fn complete(
        &self,
        request: &ModelRequest,
        deltas: Option<DeltaSink<'_>>,
    ) -> Result<ModelResponse, ModelError>;
}
