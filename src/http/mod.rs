//! The axum router: the API channel, platform webhooks (`/webhooks/<channel>`), health and
//! metrics, and the accept loop that serves it.

pub(crate) mod admin;
pub(crate) mod api;
mod approvals;
mod error;
mod extract;
pub(crate) mod guard;
mod memory;
mod ops;
mod pairing;
pub(crate) mod serve;
mod skills;
mod tasks;
pub(crate) mod webhook;

use std::sync::Arc;
use std::time::Duration;

use antler_channel::Channel;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{delete, get, post, put};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::agent::memory::identity::MemoryIdentities;
use crate::agent::model::ModelHealth;
use crate::agent::skills::Catalogue;
use crate::agent::subagents::executor::SubagentExecutor;
use crate::agent::tools::mcp::McpStatus;
use crate::config::Secret;
use crate::events::EventHub;
use crate::ingress::Ingress;
use crate::live::Live;
use crate::store::Store;
use guard::{ApiAuth, HostPolicy};

/// What every handler can reach; cloned per request, so it is one `Arc`.
pub(crate) type AppState = Arc<AppContext>;

/// The shell's part of `/readyz`, made when asked.
pub(crate) struct ShellStatus(pub(crate) Box<dyn Fn() -> serde_json::Value + Send + Sync>);

impl ShellStatus {
    /// What `/readyz` says of the shell now.
    pub(crate) fn now(&self) -> serde_json::Value {
        (self.0)()
    }
}

impl std::fmt::Debug for ShellStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ShellStatus").field(&self.now()).finish()
    }
}

/// The shared state behind [`AppState`].
#[derive(Debug)]
pub(crate) struct AppContext {
    pub(crate) ingress: Ingress,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) hub: EventHub,
    pub(crate) metrics: PrometheusHandle,
    pub(crate) model_configured: bool,
    pub(crate) model_health: ModelHealth,
    pub(crate) body_limit: usize,
    /// `agent.max_attachment_bytes`: the largest file a message may bring (or a download
    /// of a presented file may be).
    pub(crate) max_attachment_bytes: u64,
    /// The store's directory, where threads keep their folders (downloads of presented files).
    pub(crate) data_root: std::path::PathBuf,
    pub(crate) body_timeout: Duration,
    /// How long a `"wait": true` request waits for its answer ([`crate::config::Config::api_wait_limit`]).
    pub(crate) wait_limit: Duration,
    /// Cancelled when intake stops (shutdown): streams end, readiness fails.
    pub(crate) stop: CancellationToken,
    pub(crate) auth: ApiAuth,
    pub(crate) hosts: HostPolicy,
    /// Places for long-lived responses (SSE streams, `"wait": true`).
    pub(crate) streams: Arc<Semaphore>,
    /// Grants `/metrics` and the detail of `/readyz` on the main listener.
    pub(crate) metrics_token: Option<Secret>,
    /// How each configured MCP server is doing, read live (reported by `/readyz`).
    pub(crate) mcp: McpStatus,
    /// The shell's sandbox, as the probe at start found it or that it is still probing, read
    /// live (reported by `/readyz`).
    pub(crate) shell: ShellStatus,
    /// `memory.max_facts`: the most facts a document written through the API may hold.
    pub(crate) memory_max_facts: usize,
    /// `[[memory.identities]]`: whose queued updates a cleared memory drops.
    pub(crate) memory_identities: MemoryIdentities,
    /// The subagent executor (`None` when `[subagents]` is off), for cancelling tasks.
    pub(crate) subagents: Option<SubagentExecutor>,
    /// The skills found at start, for the skills API.
    pub(crate) skills: Arc<Live<Catalogue>>,
    /// DM pairing, for the pairing API.
    pub(crate) pairing: Arc<crate::ingress::pairing::Pairing>,
    /// Tool calls waiting for a person, for the approvals API.
    pub(crate) approvals: Arc<crate::ingress::approvals::Approvals>,
    /// When antler started serving, for the uptime `/readyz` reports.
    pub(crate) started: std::time::Instant,
    /// The admin page's sessions and what it shows beside the rest.
    pub(crate) admin: admin::AdminContext,
}

/// The main listener's routes. With `ops_elsewhere`, `/readyz`, `/metrics` and the admin page
/// are left to the ops listener ([`ops_router`]).
/// Each channel in `webhooks` is served at `POST /webhooks/<its name>[/<route>]`, one path per
/// route it names.
pub(crate) fn router(
    state: AppState,
    api_enabled: bool,
    ops_elsewhere: bool,
    webhooks: &[Arc<dyn Channel>],
) -> Router {
    let mut router = Router::new().route("/healthz", get(ops::healthz));
    for channel in webhooks {
        for &route in channel.routes() {
            let channel = Arc::clone(channel);
            let path = if route.is_empty() {
                format!("/webhooks/{}", channel.name())
            } else {
                format!("/webhooks/{}/{route}", channel.name())
            };
            router = router.route(
                &path,
                post(move |state, request| {
                    webhook::receive(state, Arc::clone(&channel), route, request)
                }),
            );
        }
    }
    if !ops_elsewhere {
        router = router
            .route("/readyz", get(ops::readyz))
            .route("/metrics", get(ops::metrics))
            .merge(admin::router(state.clone()));
    }
    if api_enabled {
        let api = Router::new()
            .route("/api/v1/messages", post(api::post_message))
            .route("/api/v1/threads/{id}", get(api::get_thread))
            .route("/api/v1/threads/{id}/events", get(api::thread_events))
            .route("/api/v1/threads/{id}/files/{*name}", get(api::get_file))
            .route("/api/v1/memory", get(memory::list))
            .route(
                "/api/v1/memory/{user_key}",
                get(memory::get).put(memory::put).delete(memory::delete),
            )
            .route(
                "/api/v1/memory/{user_key}/facts/{fact_id}",
                delete(memory::delete_fact),
            )
            .route("/api/v1/tasks", get(tasks::list))
            .route("/api/v1/tasks/{id}", get(tasks::get))
            .route("/api/v1/tasks/{id}/cancel", post(tasks::cancel))
            .route("/api/v1/skills", get(skills::list))
            .route("/api/v1/skills/{name}", put(skills::put))
            .route("/api/v1/pairing", get(pairing::list))
            .route("/api/v1/pairing/approve", post(pairing::approve))
            .route("/api/v1/pairing/deny", post(pairing::deny))
            .route("/api/v1/approvals", get(approvals::list))
            .route("/api/v1/approvals/{id}", post(approvals::decide))
            .route_layer(axum::middleware::from_fn_with_state(
                state.clone(),
                guard::api_guard,
            ));
        router = router.merge(api);
    }
    router
        .layer(DefaultBodyLimit::max(state.body_limit))
        .with_state(state)
}

/// The ops listener's routes: health, readiness with detail and metrics, without a token,
/// and the admin page (which has sign-in of its own).
pub(crate) fn ops_router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .merge(admin::router(state.clone()))
        .layer(axum::Extension(ops::OpsListener))
        .with_state(state)
}
