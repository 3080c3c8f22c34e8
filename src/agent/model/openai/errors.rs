//! How an attempt failed and what a provider's error means: classification by status, code and
//! message, the metrics label, and `Retry-After`.

use super::*;

/// What a provider error means for the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    Auth,
    NotFound,
    UnknownModel,
    RateLimit,
    Quota,
    ContextTooLong,
    Server,
    Bad,
}

/// Classifies an error by its status, code and message.
pub(super) fn classify(status: u16, code: Option<&str>, detail: &str) -> Class {
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
    // A 404 stays `NotFound`, which names the base URL too; 401/403 are about the key.
    if (400..500).contains(&status)
        && !matches!(status, 401 | 403 | 404 | 408 | 429)
        && (code == "model_not_found" || mentions_unknown_model(detail))
    {
        return Class::UnknownModel;
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
pub(super) fn status_of_code(code: &str) -> Option<u16> {
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
pub(super) enum AttemptError {
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
    pub(super) fn retryable(&self) -> bool {
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

    pub(super) fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// A one-line description for the log (already masked).
    pub(super) fn summary(&self) -> String {
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
pub(super) fn status_label(result: &Result<ModelResponse, AttemptError>) -> &'static str {
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
///
/// Behind LiteLLM's proxy the provider's own headers arrive prefixed `llm_provider-`
/// (`llm_provider-retry-after`, `llm_provider-retry-after-ms`); the proxy's own header wins,
/// then the provider's, milliseconds before seconds.
pub(super) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    retry_after_of(headers, "").or_else(|| retry_after_of(headers, "llm_provider-"))
}

/// [`retry_after`] for the headers named with `prefix`.
fn retry_after_of(headers: &HeaderMap, prefix: &str) -> Option<Duration> {
    let header = |name: &str| {
        headers
            .get(format!("{prefix}{name}").as_str())
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
