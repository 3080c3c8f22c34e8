//! The application as a value: built from a [`Config`], served on a listener until a shutdown
//! future resolves. `main` is a thin wrapper around [`serve`]; tests call it directly.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use antler_channel::Channel;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::agent::middleware::dangling_tool_call::DanglingToolCallMiddleware;
use crate::agent::middleware::loop_detection::LoopDetectionMiddleware;
use crate::agent::middleware::title::TitleMiddleware;
use crate::agent::middleware::token_usage::TokenUsageMiddleware;
use crate::agent::middleware::{ChainError, Middleware, MiddlewareChain};
use crate::agent::model::{ChatModel, ModelError, OpenAiClient, OpenAiConfig};
use crate::agent::runtime::Runtime;
use crate::agent::tools::ToolRegistry;
use crate::config::Config;
use crate::delivery::{Delivery, RetryPolicy};
use crate::events::EventHub;
use crate::http::{AppState, api::ApiChannel, router};
use crate::ingress::{Ingress, IngressSettings, TurnRunner};
use crate::store::{SledStore, Store, StoreError};

/// How often expired dedupe keys and old outbox records are swept.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Why the application could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The store could not be opened or read.
    #[error("{0}")]
    Store(String),
    /// The model client could not be built.
    #[error("model: {0}")]
    Model(String),
    /// The middleware chain is invalid.
    #[error("agent.middleware: {0}")]
    Chain(String),
    /// Serving HTTP failed.
    #[error("http server: {0}")]
    Serve(#[from] std::io::Error),
}

impl From<StoreError> for AppError {
    fn from(e: StoreError) -> Self {
        Self::Store(e.to_string())
    }
}

impl From<ModelError> for AppError {
    fn from(e: ModelError) -> Self {
        Self::Model(e.to_string())
    }
}

impl From<ChainError> for AppError {
    fn from(e: ChainError) -> Self {
        Self::Chain(e.to_string())
    }
}

/// The process-wide Prometheus recorder (metrics macros need one global recorder).
fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            // Fails only if another recorder was installed first; ours then just renders empty.
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}

fn middleware_chain(config: &Config) -> Result<MiddlewareChain, ChainError> {
    let cfg = &config.agent.middleware;
    let mut items: Vec<Arc<dyn Middleware>> = Vec::new();
    if let Some(m) = DanglingToolCallMiddleware::from_config(&cfg.dangling_tool_call) {
        items.push(Arc::new(m));
    }
    if let Some(m) = TokenUsageMiddleware::from_config(&cfg.token_usage) {
        items.push(Arc::new(m));
    }
    if let Some(m) = TitleMiddleware::from_config(&cfg.title) {
        items.push(Arc::new(m));
    }
    if let Some(m) = LoopDetectionMiddleware::from_config(&cfg.loop_detection) {
        items.push(Arc::new(m));
    }
    MiddlewareChain::new(items)
}

fn model_client(config: &Config) -> Result<Arc<dyn ChatModel>, ModelError> {
    let m = &config.model;
    let mut client = OpenAiConfig::new(m.base_url.clone(), m.model.clone());
    client.api_key = m.api_key.as_ref().map(|k| k.expose().to_owned());
    client.request_timeout = Duration::from_secs(m.request_timeout_secs);
    client.max_retries = m.max_retries;
    client.stream = m.stream;
    client.temperature = m.temperature;
    client.max_tokens = m.max_tokens;
    Ok(Arc::new(OpenAiClient::new(client)?))
}

/// Runs antler on `listener` until `shutdown` resolves, then drains: intake stops, running
/// turns get `server.shutdown_grace_secs` to finish, pending deliveries the rest of it, and
/// the store is flushed. What is left is durable and resumes on the next start.
pub async fn serve<F>(config: Config, listener: TcpListener, shutdown: F) -> Result<(), AppError>
where
    F: Future<Output = ()> + Send + 'static,
{
    let started = Instant::now();
    let metrics = metrics_handle();
    let path = config.store.path.clone();
    let store: Arc<dyn Store> = Arc::new(
        tokio::task::spawn_blocking(move || SledStore::open(&path))
            .await
            .map_err(|e| AppError::Store(e.to_string()))??,
    );
    let runtime = Runtime::new(
        model_client(&config)?,
        ToolRegistry::builtin(),
        middleware_chain(&config)?,
        config.model.system_prompt.clone(),
        config.agent.max_iterations,
    );

    tracing::info!(model = runtime.model_name(), middleware = ?runtime.middleware_names(), "agent runtime ready");
    let intake_stop = CancellationToken::new();
    let delivery_stop = CancellationToken::new();
    let turns = TaskTracker::new();
    let deliveries = TaskTracker::new();
    let hub = EventHub::default();
    let api = Arc::new(ApiChannel::new(
        config.channels.api.token.clone(),
        hub.clone(),
    ));
    let mut channels: HashMap<String, Arc<dyn Channel>> = HashMap::new();
    if config.channels.api.enabled {
        channels.insert("api".to_owned(), api.clone());
    }
    let delivery = Delivery::new(
        Arc::clone(&store),
        channels,
        RetryPolicy {
            max_attempts: config.delivery.max_attempts,
            backoff_base: Duration::from_millis(config.delivery.backoff_base_ms),
            backoff_max: Duration::from_secs(config.delivery.backoff_max_secs),
        },
        deliveries.clone(),
        delivery_stop.clone(),
    );
    // Resume what the last process left: interrupted subagents fail, replies go, turns run.
    let now = crate::now_ms();
    let failed = store
        .fail_unfinished_subagents("antler restarted while the task was running", now)
        .await?;
    let inbox = store.inbox().await?;
    let outbox = store.outbox_pending().await?;
    if !inbox.is_empty() || !outbox.is_empty() || failed > 0 {
        tracing::info!(
            inbox = inbox.len(),
            outbox = outbox.len(),
            subagents_failed = failed,
            "resuming after restart"
        );
    }
    // Replies left in the outbox go first; the runner then owns the delivery handle.
    delivery.enqueue(outbox);
    let runner = TurnRunner::new(
        Arc::clone(&store),
        runtime,
        hub.clone(),
        delivery,
        config.agent.max_turn_attempts,
        Duration::from_secs(config.agent.turn_timeout_secs),
    );
    let ingress = Ingress::new(
        Arc::clone(&store),
        runner,
        hub.clone(),
        &IngressSettings {
            backlog_limit: config.agent.backlog,
            dedupe_ttl: Duration::from_secs(config.store.dedupe_ttl_secs),
            max_concurrent_turns: config.agent.max_concurrent_turns,
        },
        turns.clone(),
        intake_stop.clone(),
    );

    ingress.recover(inbox);

    let sweeper = tokio::spawn(sweep(
        Arc::clone(&store),
        metrics.clone(),
        Duration::from_secs(config.store.dedupe_ttl_secs),
        intake_stop.clone(),
    ));

    let state = AppState {
        ingress,
        store: Arc::clone(&store),
        hub,
        api,
        metrics,
        model_configured: !config.model.base_url.is_empty() && !config.model.model.is_empty(),
        body_limit: config.server.body_limit_bytes,
        stop: intake_stop.clone(),
    };
    let app = router(state, config.channels.api.enabled);
    let local = listener.local_addr()?;
    tracing::info!(address = %local, startup_ms = started.elapsed().as_millis() as u64, "antler is serving");

    let signal_stop = intake_stop.clone();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            tracing::info!("shutting down: intake stopped");
            signal_stop.cancel();
        })
        .await?;

    // Drain: turns first (they produce replies), then deliveries, within one grace period.
    let deadline = Instant::now() + Duration::from_secs(config.server.shutdown_grace_secs);
    turns.close();
    if tokio::time::timeout_at(deadline, turns.wait())
        .await
        .is_err()
    {
        tracing::warn!("grace period over with turns still running; they resume on the next start");
    }
    deliveries.close();
    if tokio::time::timeout_at(deadline, deliveries.wait())
        .await
        .is_err()
    {
        tracing::warn!("grace period over with deliveries pending; they resume on the next start");
    }
    delivery_stop.cancel();
    // The sweeper ends with intake; awaiting it (rather than aborting it) means it no longer
    // holds the store when `serve` returns, so the store can be opened again at once.
    let _ = sweeper.await;
    store.flush().await?;
    // Connection tasks may still be dropping their handles to the store; wait (briefly) for
    // them, so the store is closed when `serve` returns and can be opened again at once.
    let closing = Instant::now() + Duration::from_secs(5);
    while Arc::strong_count(&store) > 1 && Instant::now() < closing {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if Arc::strong_count(&store) > 1 {
        tracing::warn!("the store is still in use at exit");
    }
    drop(store);
    tracing::info!("stopped");
    Ok(())
}

async fn sweep(
    store: Arc<dyn Store>,
    metrics: PrometheusHandle,
    retain: Duration,
    stop: CancellationToken,
) {
    let retain_ms = u64::try_from(retain.as_millis()).unwrap_or(u64::MAX);
    let mut every = tokio::time::interval(SWEEP_EVERY);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = stop.cancelled() => return,
        }
        metrics.run_upkeep();
        match store.sweep(crate::now_ms(), retain_ms).await {
            Ok(0) => {}
            Ok(removed) => tracing::debug!(removed, "swept expired records"),
            Err(e) => tracing::warn!(error = %e, "sweep failed"),
        }
    }
}
