//! Operations endpoints: liveness, readiness and Prometheus metrics.
//!
//! On the main listener, `/metrics` and the detail of `/readyz` need the metrics token or an
//! admin API token (they show usage), unless no token is configured at all (a loopback-only
//! setup). On the ops listener (`server.ops_listen`) they are open, as Prometheus expects.

use antler_channel::verify;
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;
use super::error::ApiError;
use crate::store::StoreStats;

/// Marks requests that came in on the ops listener.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OpsListener;

/// Whether the request may see usage figures.
fn may_see_usage(state: &AppState, headers: &HeaderMap, ops: Option<OpsListener>) -> bool {
    if ops.is_some() {
        return true;
    }
    if state.auth.is_open() && state.metrics_token.is_none() {
        return true;
    }
    let metrics_token = state
        .metrics_token
        .as_ref()
        .is_some_and(|token| verify::bearer_matches(headers, token.expose()));
    metrics_token || state.auth.is_admin(headers)
}

/// `GET /healthz`: the process is up.
pub(crate) async fn healthz() -> &'static str {
    "ok"
}

/// `GET /readyz`: the store answers, a model is configured and intake is open. The model's
/// reachability, each MCP server's state and each platform channel's health (a revoked token,
/// a polling conflict: `"ok": false`) are reported, but none of them makes antler unready:
/// taking it out of rotation would not mend them.
pub(crate) async fn readyz(
    State(state): State<AppState>,
    headers: HeaderMap,
    ops: Option<axum::Extension<OpsListener>>,
) -> Response {
    let stats = state.store.stats().await;
    let ready = stats.is_ok() && state.model_configured && !state.stop.is_cancelled();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    if !may_see_usage(&state, &headers, ops.map(|e| e.0)) {
        return (status, Json(json!({ "ready": ready }))).into_response();
    }
    let model = match state.model_health.snapshot() {
        Some(health) => json!({
            "configured": state.model_configured,
            "reachable": health.reachable,
            "detail": health.detail,
            "checked_at_ms": health.at_ms,
        }),
        None => json!({ "configured": state.model_configured, "reachable": null }),
    };
    let body = match stats {
        Ok(stats) => json!({
            "ready": ready,
            "store": "ok",
            "model_configured": state.model_configured,
            "model": model,
            "shutting_down": state.stop.is_cancelled(),
            "inbox": stats.inbox,
            "backlog": state.ingress.backlog(),
            "running": state.ingress.running(),
            "store_bytes": stats.disk_bytes,
            "outbox_pending": stats.outbox_pending,
            "oldest_pending_age_secs": oldest_pending_age_secs(&stats),
            "mcp": state.mcp,
            "shell": state.shell.now(),
            "channels": state.ingress.health().snapshot(),
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_secs": state.started.elapsed().as_secs(),
        }),
        Err(e) => {
            tracing::error!(error = %e, "readiness: the store failed");
            json!({ "ready": false, "store": "failing", "model": model })
        }
    };
    (status, Json(body)).into_response()
}

/// `GET /metrics`: Prometheus text format.
pub(crate) async fn metrics(
    State(state): State<AppState>,
    headers: HeaderMap,
    ops: Option<axum::Extension<OpsListener>>,
) -> Result<Response, ApiError> {
    if !may_see_usage(&state, &headers, ops.map(|e| e.0)) {
        return Err(ApiError::Unauthorized);
    }
    // Read at scrape time: one store lookup, nothing on the hot path.
    if let Ok(stats) = state.store.stats().await {
        metrics::gauge!("antler_inbox_oldest_age_seconds")
            .set(oldest_pending_age_secs(&stats).unwrap_or(0) as f64);
    }
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        crate::metrics_catalog::render(&state.metrics),
    )
        .into_response())
}

/// How long the oldest item in the inbox has waited, in whole seconds; `None` when it is empty.
fn oldest_pending_age_secs(stats: &StoreStats) -> Option<u64> {
    stats
        .oldest_inbox_at_ms
        .map(|at| crate::now_ms().saturating_sub(at) / 1000)
}
