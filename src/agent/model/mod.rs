//! The model boundary: what the run loop asks of an LLM and what comes back.
//!
//! [`ChatModel`] is the seam tests script; [`OpenAiClient`] speaks the OpenAI-compatible
//! chat-completions protocol (OpenAI, Azure, vLLM, Ollama, llama.cpp, OpenRouter, DeepSeek ...).
//! Retries, timeouts and backoff live in the client, not in the middleware chain.

mod detail;
mod health;
mod openai;
#[cfg(test)]
pub(crate) mod scripted;
mod think;

pub(crate) use health::ModelHealth;
pub(crate) use openai::{OpenAiClient, OpenAiConfig, sse_events};

use std::sync::Arc;
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
    /// The tools the model may call (empty: none). Shared with the registry: building a
    /// request copies no schema.
    pub(crate) tools: Vec<Arc<ToolSpec>>,
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

/// Which wait of a model request ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TimeoutKind {
    /// No response head (and, when streamed, no first chunk) within
    /// `model.first_byte_timeout_secs`.
    FirstByte,
    /// A stream sent nothing for `model.idle_timeout_secs`.
    Idle,
    /// A non-streamed answer was not complete within `model.request_timeout_secs`.
    Total,
}

/// The errors of the model boundary.
///
/// Every `detail` and `reason` is the provider's (or antler's) text made safe: the API key
/// and key-like words masked, one line, at most about 200 characters.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub(crate) enum ModelError {
    /// 401/403: the API key is wrong or missing.
    #[error("the model endpoint rejected the credentials (HTTP {status}){}", colon(.detail))]
    Unauthorized {
        /// The HTTP status.
        status: u16,
        /// The provider's message (may be empty).
        detail: String,
    },
    /// 404: wrong base URL or unknown model name.
    #[error("the model endpoint or model was not found (HTTP 404){}", colon(.detail))]
    NotFound {
        /// The provider's message (may be empty).
        detail: String,
    },
    /// Another 4xx that says the model name is unknown (LiteLLM's 400 "Invalid model name",
    /// an error code `model_not_found`, OpenRouter's "not a valid model ID" ...): only the
    /// operator can fix it.
    #[error("the model endpoint does not know the model (HTTP {status}){}", colon(.detail))]
    UnknownModel {
        /// The HTTP status.
        status: u16,
        /// The provider's message (may be empty).
        detail: String,
    },
    /// Still rate limited (429) after every retry.
    #[error(
        "the model endpoint is rate limiting (HTTP 429) after {attempts} attempts{}",
        colon(.detail)
    )]
    RateLimited {
        /// How many requests were made.
        attempts: u32,
        /// The provider's message of the last attempt (may be empty).
        detail: String,
    },
    /// The provider account is out of quota or credit (402, or 429 `insufficient_quota`):
    /// waiting does not help, the operator has to.
    #[error("the model provider account has no quota left (HTTP {status}){}", colon(.detail))]
    QuotaExceeded {
        /// The HTTP status.
        status: u16,
        /// The provider's message (may be empty).
        detail: String,
    },
    /// A 5xx after every retry.
    #[error("the model endpoint failed (HTTP {status}) after {attempts} attempts")]
    Server {
        /// The last HTTP status.
        status: u16,
        /// How many requests were made.
        attempts: u32,
    },
    /// The conversation does not fit the model's context window (HTTP 400 with the code
    /// `context_length_exceeded` or a message saying so).
    #[error("the request is too long for the model's context (HTTP {status}){}", colon(.detail))]
    ContextTooLong {
        /// The HTTP status (400 when it came in a stream).
        status: u16,
        /// The provider's message (may be empty).
        detail: String,
    },
    /// Another 4xx: the request itself is wrong (bad tool schema, unsupported parameter ...).
    #[error("the model endpoint refused the request (HTTP {status}){}", colon(.detail))]
    BadRequest {
        /// The HTTP status.
        status: u16,
        /// The provider's message (may be empty).
        detail: String,
    },
    /// A wait ran out (after every retry).
    #[error("{}", timeout_text(*.kind, *.limit))]
    Timeout {
        /// Which wait.
        kind: TimeoutKind,
        /// Its limit.
        limit: Duration,
    },
    /// The endpoint could not be reached.
    #[error("could not reach the model endpoint: {0}")]
    Unreachable(String),
    /// The endpoint answered something that is not a chat completion.
    #[error("the model endpoint answered garbage: {0}")]
    InvalidResponse(String),
    /// Every attempt's stream broke off (ended early, failed, or carried an error) before any
    /// answer text was shown.
    #[error("the model's answer broke off before it began, {attempts} attempts: {reason}")]
    StreamBroken {
        /// How many requests were made.
        attempts: u32,
        /// Why the last one broke off.
        reason: String,
    },
    /// The stream broke off after answer text had been passed to the delta sink (and so was
    /// shown to the user). Not retried: a retry would repeat that text.
    #[error(
        "the model's answer broke off after {} characters had been shown: {reason}",
        .shown.chars().count()
    )]
    Interrupted {
        /// The answer text passed to the sink before it broke off.
        shown: String,
        /// Why it broke off.
        reason: String,
    },
}

/// `": detail"`, or nothing for an empty detail.
fn colon(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(": {detail}")
    }
}

fn timeout_text(kind: TimeoutKind, limit: Duration) -> String {
    let secs = limit.as_secs_f64();
    match kind {
        TimeoutKind::FirstByte => format!("the model did not start answering within {secs}s"),
        TimeoutKind::Idle => format!("the model's stream sent nothing for {secs}s"),
        TimeoutKind::Total => format!("the model did not answer within {secs}s"),
    }
}

/// `" The provider says: <detail>."` (no second period when the detail ends a sentence), or
/// nothing for an empty detail.
fn provider_says(detail: &str) -> String {
    let detail = detail.trim();
    if detail.is_empty() {
        return String::new();
    }
    let end = if detail.ends_with(['.', '!', '?', '…']) {
        ""
    } else {
        "."
    };
    format!(" The provider says: {detail}{end}")
}

/// Whole seconds for a chat message (at least 1).
fn whole_secs(limit: Duration) -> u64 {
    limit.as_secs().max(1)
}

impl ModelError {
    /// Whether the endpoint answered at all (for [`ModelHealth`]).
    pub(crate) fn reached_endpoint(&self) -> bool {
        !matches!(self, Self::Unreachable(_) | Self::Timeout { .. })
    }

    /// Whether sending the same message again may succeed (a rate limit, an outage, a broken
    /// stream), as opposed to errors only the operator or a fresh conversation can fix.
    pub(crate) fn retry_can_help(&self) -> bool {
        match self {
            Self::Unauthorized { .. }
            | Self::NotFound { .. }
            | Self::UnknownModel { .. }
            | Self::QuotaExceeded { .. }
            | Self::ContextTooLong { .. }
            | Self::BadRequest { .. } => false,
            Self::RateLimited { .. }
            | Self::Server { .. }
            | Self::Timeout { .. }
            | Self::Unreachable(_)
            | Self::InvalidResponse(_)
            | Self::StreamBroken { .. }
            | Self::Interrupted { .. } => true,
        }
    }

    /// The answer text already shown to the user when the stream broke off
    /// ([`ModelError::Interrupted`]).
    pub(crate) fn shown_text(&self) -> Option<&str> {
        match self {
            Self::Interrupted { shown, .. } => Some(shown),
            _ => None,
        }
    }

    /// What to tell a chat user: what went wrong and what helps. "Send it again" only where a
    /// retry can help. The provider's reason is quoted for 4xx answers only (masked, one line,
    /// shortened); 5xx and transport details stay in the log.
    pub(crate) fn user_message(&self) -> String {
        match self {
            Self::Unauthorized { status, detail } => format!(
                "⚠️ Sorry, the model provider refused antler's credentials (HTTP {status}), so \
                 I cannot answer right now.{} The operator needs to check `model.api_key` \
                 (OPENAI_API_KEY in the default config).",
                provider_says(detail)
            ),
            Self::NotFound { detail } => format!(
                "⚠️ Sorry, the model provider does not know the model or endpoint antler is \
                 set up with (HTTP 404).{} The operator needs to check `model.model` and \
                 `model.base_url`.",
                provider_says(detail)
            ),
            Self::UnknownModel { status, detail } => format!(
                "⚠️ Sorry, the model provider does not know the model antler is set up with \
                 (HTTP {status}), so I cannot answer right now.{} The operator needs to fix \
                 the `model.model` setting (ANTLER_MODEL in the default config).",
                provider_says(detail)
            ),
            Self::RateLimited { detail, .. } => format!(
                "⚠️ Sorry, the model provider is limiting requests right now.{} Send your \
                 message again in a minute.",
                provider_says(detail)
            ),
            Self::QuotaExceeded { status, detail } => format!(
                "⚠️ Sorry, antler's account with the model provider has no quota or credit \
                 left (HTTP {status}), so I cannot answer right now.{} The operator needs to \
                 check the account's plan and billing.",
                provider_says(detail)
            ),
            Self::Server { status, .. } => format!(
                "⚠️ Sorry, the model provider failed (HTTP {status}). Send your message again \
                 in a moment."
            ),
            Self::ContextTooLong { detail, .. } => format!(
                "⚠️ Sorry, this conversation is now too long for the model.{} Send /new to \
                 start a fresh one.",
                provider_says(detail)
            ),
            Self::BadRequest { status, detail } => format!(
                "⚠️ Sorry, the model provider refused the request (HTTP {status}).{} Sending \
                 the same message again will not help; /new starts a fresh conversation, and \
                 the details are in antler's log.",
                provider_says(detail)
            ),
            Self::Timeout { kind, limit } => {
                let secs = whole_secs(*limit);
                match kind {
                    TimeoutKind::FirstByte => format!(
                        "⚠️ Sorry, the model did not start answering within {secs} seconds. \
                         Send your message again to retry."
                    ),
                    TimeoutKind::Idle => format!(
                        "⚠️ Sorry, the model went silent for {secs} seconds in the middle of \
                         its answer. Send your message again to retry."
                    ),
                    TimeoutKind::Total => format!(
                        "⚠️ Sorry, the model did not answer within {secs} seconds. Send your \
                         message again to retry."
                    ),
                }
            }
            Self::Unreachable(_) => "⚠️ Sorry, antler cannot reach the model server right \
                now. The operator needs to check that it is running and that `model.base_url` \
                (ANTLER_MODEL_BASE_URL in the default config) points at it. Send your message \
                again once it is back."
                .to_owned(),
            Self::InvalidResponse(_) => "⚠️ Sorry, the model server answered something antler \
                cannot read. The details are in antler's log; send your message again to retry."
                .to_owned(),
            Self::StreamBroken { .. } => "⚠️ Sorry, the model's answer kept breaking off \
                before it began. Send your message again in a moment."
                .to_owned(),
            Self::Interrupted { shown, .. } => {
                let note = "⚠️ The answer broke off here. Send your message again to get a \
                    full answer.";
                let shown = shown.trim_end();
                if shown.is_empty() {
                    note.to_owned()
                } else {
                    format!("{shown}\n\n{note}")
                }
            }
        }
    }
}

/// Whether a provider's 4xx text says the model name is unknown. The texts are the providers':
/// LiteLLM "Invalid model name passed in model=...", OpenAI "The model `x` does not exist or
/// you do not have access to it", Ollama "model \"x\" not found", OpenRouter "x is not a valid
/// model ID", DeepSeek "Model Not Exist".
fn mentions_unknown_model(detail: &str) -> bool {
    let lower = detail.to_ascii_lowercase();
    let quoted_missing = lower.contains("model")
        && (lower.contains("does not exist") || lower.contains("not found"));
    quoted_missing
        || [
            "invalid model",
            "unknown model",
            "no such model",
            "not a valid model",
            "model not exist",
            "model_not_found",
        ]
        .iter()
        .any(|needle| lower.contains(needle))
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
        "prompt is too long",
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

#[cfg(test)]
mod tests {
    use super::*;

    fn every_error() -> Vec<ModelError> {
        let detail = || "Something is off.".to_owned();
        vec![
            ModelError::Unauthorized {
                status: 401,
                detail: detail(),
            },
            ModelError::NotFound { detail: detail() },
            ModelError::UnknownModel {
                status: 400,
                detail: detail(),
            },
            ModelError::RateLimited {
                attempts: 4,
                detail: detail(),
            },
            ModelError::QuotaExceeded {
                status: 429,
                detail: detail(),
            },
            ModelError::Server {
                status: 502,
                attempts: 4,
            },
            ModelError::ContextTooLong {
                status: 400,
                detail: detail(),
            },
            ModelError::BadRequest {
                status: 422,
                detail: detail(),
            },
            ModelError::Timeout {
                kind: TimeoutKind::FirstByte,
                limit: Duration::from_secs(60),
            },
            ModelError::Timeout {
                kind: TimeoutKind::Idle,
                limit: Duration::from_secs(60),
            },
            ModelError::Timeout {
                kind: TimeoutKind::Total,
                limit: Duration::from_secs(120),
            },
            ModelError::Unreachable("connection refused".into()),
            ModelError::InvalidResponse("not json".into()),
            ModelError::StreamBroken {
                attempts: 4,
                reason: "ended early".into(),
            },
            ModelError::Interrupted {
                shown: "Half an answer".into(),
                reason: "HTTP 503".into(),
            },
        ]
    }

    #[test]
    fn user_messages_say_send_again_only_when_it_helps() {
        for error in every_error() {
            let message = error.user_message();
            let says_again = message.to_lowercase().contains("send your message again");
            assert_eq!(says_again, error.retry_can_help(), "{message}");
            assert!(!message.contains(".."), "{message}");
            assert!(message.contains("⚠️"), "{message}");
        }
    }

    #[test]
    fn details_of_4xx_answers_reach_the_user_and_the_log() {
        for error in every_error() {
            let message = error.user_message();
            let display = error.to_string();
            match &error {
                ModelError::Unauthorized { detail, .. }
                | ModelError::NotFound { detail }
                | ModelError::UnknownModel { detail, .. }
                | ModelError::RateLimited { detail, .. }
                | ModelError::QuotaExceeded { detail, .. }
                | ModelError::ContextTooLong { detail, .. }
                | ModelError::BadRequest { detail, .. } => {
                    assert!(
                        message.contains(&format!("The provider says: {detail} ")),
                        "{message}"
                    );
                    assert!(display.ends_with(&format!(": {detail}")), "{display}");
                }
                _ => assert!(!message.contains("The provider says"), "{message}"),
            }
        }
        // An empty detail leaves no trace; one without a full stop gets one.
        let bare = ModelError::Unauthorized {
            status: 403,
            detail: String::new(),
        };
        assert_eq!(
            bare.to_string(),
            "the model endpoint rejected the credentials (HTTP 403)"
        );
        assert!(!bare.user_message().contains("provider says"));
        let unfinished = ModelError::NotFound {
            detail: "no such model".into(),
        };
        assert!(
            unfinished
                .user_message()
                .contains("The provider says: no such model. The operator")
        );
        let cut = ModelError::BadRequest {
            status: 400,
            detail: "a long reason…".into(),
        };
        assert!(
            cut.user_message()
                .contains("The provider says: a long reason… Sending")
        );
    }

    #[test]
    fn an_unknown_model_is_for_the_operator() {
        // The providers' own texts.
        for text in [
            "/chat/completions: Invalid model name passed in model=gpt-5o. Call `/v1/models` to view available models for your key.",
            "The model `gpt-9` does not exist or you do not have access to it.",
            "model \"llama9\" not found, try pulling it first",
            "gpt-9 is not a valid model ID",
            "Model Not Exist",
        ] {
            assert!(mentions_unknown_model(text), "{text}");
        }
        assert!(!mentions_unknown_model("Invalid value for 'temperature'"));
        let message = ModelError::UnknownModel {
            status: 400,
            detail: "Invalid model name passed in model=gpt-5o".into(),
        }
        .user_message();
        assert!(message.contains("`model.model`"), "{message}");
        assert!(message.contains("operator"), "{message}");
        assert!(!message.contains("/new"), "{message}");
        assert!(!message.to_lowercase().contains("send your message again"));
    }

    #[test]
    fn an_interruption_shows_the_text_then_the_note() {
        let error = ModelError::Interrupted {
            shown: "Step 1: open the file.\n".into(),
            reason: "the model's stream sent nothing for 60s".into(),
        };
        assert_eq!(
            error.user_message(),
            "Step 1: open the file.\n\n⚠️ The answer broke off here. Send your message again \
             to get a full answer."
        );
        assert_eq!(error.shown_text(), Some("Step 1: open the file.\n"));
        assert_eq!(
            error.to_string(),
            "the model's answer broke off after 23 characters had been shown: the model's \
             stream sent nothing for 60s"
        );
        assert!(error.reached_endpoint());
        let timeout = ModelError::Timeout {
            kind: TimeoutKind::FirstByte,
            limit: Duration::from_millis(1500),
        };
        assert_eq!(
            timeout.to_string(),
            "the model did not start answering within 1.5s"
        );
        assert!(!timeout.reached_endpoint());
        assert_eq!(timeout.shown_text(), None);
    }
}
