//! The one error type of the HTTP edge. It answers JSON `{"error": {"code", "message"}}` and
//! never shows internals: the cause of a 500 is logged, not sent.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::ingress::{IngressError, RETRY_AFTER};
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub(crate) enum ApiError {
    #[error("missing or wrong bearer token")]
    Unauthorized,
    /// A platform webhook whose signature or secret did not verify; the message says which.
    #[error("{0}")]
    WebhookUnauthorized(&'static str),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    /// The request is valid but the resource is not in a state for it (a task already ended).
    #[error("{0}")]
    Conflict(String),
    #[error("the request body did not arrive within {secs} seconds")]
    BodyTimeout { secs: u64 },
    #[error("the request body is larger than {limit} bytes")]
    TooLarge { limit: usize },
    /// A file in the body is over its own limit; the message names it.
    #[error("{0}")]
    FileTooLarge(String),
    #[error("the body must be JSON (Content-Type: application/json)")]
    UnsupportedMediaType,
    #[error("too many messages are waiting; retry later")]
    Overloaded,
    #[error("too many open streams; retry later")]
    TooManyStreams,
    #[error("antler is shutting down; retry later")]
    ShuttingDown,
    /// A platform's message that cannot be judged yet (the bot's identity is not known): the
    /// platform delivers it again.
    #[error("{0}; retry later")]
    NotReady(String),
    /// The store cannot answer now (a database out of reach): nothing was stored, so the
    /// client or platform sends again later.
    #[error("the store is unavailable; retry later")]
    StoreUnavailable(String),
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Self::Unauthorized | Self::WebhookUnauthorized(_) => {
                (StatusCode::UNAUTHORIZED, "unauthorized")
            }
            Self::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            Self::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            Self::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            Self::BodyTimeout { .. } => (StatusCode::REQUEST_TIMEOUT, "body_timeout"),
            Self::TooLarge { .. } | Self::FileTooLarge(_) => {
                (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large")
            }
            Self::UnsupportedMediaType => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            Self::Overloaded => (StatusCode::SERVICE_UNAVAILABLE, "overloaded"),
            Self::TooManyStreams => (StatusCode::SERVICE_UNAVAILABLE, "too_many_streams"),
            Self::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
            Self::NotReady(_) => (StatusCode::SERVICE_UNAVAILABLE, "not_ready"),
            Self::StoreUnavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable"),
            Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl From<IngressError> for ApiError {
    fn from(e: IngressError) -> Self {
        match e {
            IngressError::Overloaded { .. } => Self::Overloaded,
            IngressError::ShuttingDown => Self::ShuttingDown,
            IngressError::Store(e) => e.into(),
            IngressError::Internal(cause) => Self::Internal(cause),
            // Handlers acknowledge a dropped message themselves; this is the fallback.
            IngressError::Dropped => Self::Forbidden("not allowed to use this bot".to_owned()),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        if e.is_retryable() {
            Self::StoreUnavailable(e.to_string())
        } else {
            Self::Internal(e.to_string())
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match &self {
            Self::Internal(cause) => tracing::error!(%cause, "request failed"),
            Self::StoreUnavailable(cause) => {
                tracing::warn!(%cause, "request refused: the store is unavailable");
            }
            _ => {}
        }
        let (status, code) = self.status_and_code();
        let body = json!({ "error": { "code": code, "message": self.to_string() } });
        let mut response = (status, Json(body)).into_response();
        // A webhook is signed, not bearer-authenticated.
        if matches!(self, Self::Unauthorized) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(RETRY_AFTER.as_secs()),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_out_of_reach_is_a_503_to_retry_and_a_broken_one_a_500() {
        let unavailable =
            ApiError::from(StoreError::unavailable("connection refused")).into_response();
        assert_eq!(unavailable.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            unavailable.headers()[header::RETRY_AFTER],
            RETRY_AFTER.as_secs().to_string().as_str()
        );
        let broken = ApiError::from(StoreError::backend("corrupt")).into_response();
        assert_eq!(broken.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(broken.headers().get(header::RETRY_AFTER).is_none());
    }
}
