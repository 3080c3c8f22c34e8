//! Operations endpoints: liveness, readiness and Prometheus metrics.

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use serde_json::json;

use super::AppState;

/// `GET /healthz`: the process is up.
pub(crate) async fn healthz() -> &'static str {
    "ok"
}

/// `GET /readyz`: the store answers, a model is configured and intake is open.
pub(crate) async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    let stats = state.store.stats().await;
    let ready = stats.is_ok() && state.model_configured && !state.stop.is_cancelled();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = match stats {
        Ok(stats) => json!({
            "ready": ready,
            "store": "ok",
            "model_configured": state.model_configured,
            "shutting_down": state.stop.is_cancelled(),
            "inbox": stats.inbox,
            "backlog": state.ingress.backlog(),
            "store_bytes": stats.disk_bytes,
            "outbox_pending": stats.outbox_pending,
        }),
        Err(e) => json!({ "ready": false, "store": e.to_string() }),
    };
    (status, Json(body))
}

/// `GET /metrics`: Prometheus text format.
pub(crate) async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}
