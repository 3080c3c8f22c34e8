//! The axum router: the API channel, health and metrics (platform webhooks join here as their
//! channels are added).

pub(crate) mod api;
mod error;
mod ops;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use crate::events::EventHub;
use crate::ingress::Ingress;
use crate::store::Store;
use api::ApiChannel;

/// What every handler can reach.
#[derive(Debug, Clone)]
pub(crate) struct AppState {
    pub(crate) ingress: Ingress,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) hub: EventHub,
    pub(crate) api: Arc<ApiChannel>,
    pub(crate) metrics: PrometheusHandle,
    pub(crate) model_configured: bool,
    pub(crate) body_limit: usize,
    /// Cancelled when intake stops (shutdown): streams end, readiness fails.
    pub(crate) stop: CancellationToken,
}

/// The whole HTTP surface.
pub(crate) fn router(state: AppState, api_enabled: bool) -> Router {
    let mut router = Router::new()
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics));
    if api_enabled {
        router = router
            .route("/api/v1/messages", post(api::post_message))
            .route("/api/v1/threads/{id}", get(api::get_thread))
            .route("/api/v1/threads/{id}/events", get(api::thread_events));
    }
    router
        .layer(DefaultBodyLimit::max(state.body_limit))
        .with_state(state)
}
