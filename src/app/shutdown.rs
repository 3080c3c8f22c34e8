//! The drain protocol of a serving antler, as one value ([`Shutdown`]) that owns what has to
//! stop: the tokens that stop each stage, the trackers of running work and the handles of the
//! background tasks. [`Shutdown::drain`] runs the stages in order:
//!
//! 1. intake stops: new messages get 503, `/readyz` turns 503, pollers and gateways end;
//! 2. running turns get the grace period; those still running are interrupted and give their
//!    attempt back (they run again on the next start), their subagents with them;
//! 3. deliveries get the rest of the grace period; what is left resumes on the next start;
//! 4. connections close (the listeners drain what they answer);
//! 5. the memory worker flushes its queue within `memory.shutdown_flush_secs`; MCP servers stop;
//! 6. the store's lease is given up (every write was durable when it returned) and every
//!    handle to the store let go, so it can be opened again as soon as `serve` returns.
//!
//! What a stage leaves unfinished is durable and resumes on the next start.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::{AbortOnDropHandle, TaskTracker};

use super::{AppError, INTERRUPT_WAIT};
use crate::agent::subagents::executor::SubagentExecutor;
use crate::agent::tools::mcp::McpServers;
use crate::store::Store;

/// How long the store's last handles may take to go once everything stopped.
const STORE_RELEASE_WAIT: Duration = Duration::from_secs(5);

/// The tokens that stop each stage.
#[derive(Debug, Default)]
pub(super) struct Stops {
    /// Intake: the HTTP handlers, pollers, gateways and the sweeper.
    pub(super) intake: CancellationToken,
    /// Running turns and their subagents (interrupted, not failed).
    pub(super) turns: CancellationToken,
    pub(super) delivery: CancellationToken,
    pub(super) http: CancellationToken,
    pub(super) memory: CancellationToken,
    /// Renewing the store's lease.
    pub(super) lease: CancellationToken,
    /// Cancelled by the lease keeper when another owner took the lease.
    pub(super) lease_lost: CancellationToken,
}

/// Everything a serving antler stops, and how.
pub(super) struct Shutdown {
    pub(super) stops: Stops,
    pub(super) grace: Duration,
    pub(super) turns: TaskTracker,
    pub(super) deliveries: TaskTracker,
    pub(super) subagents: Option<SubagentExecutor>,
    pub(super) listeners: Vec<JoinHandle<()>>,
    /// The model probe of the start; it may still be waiting for the model.
    pub(super) probe: JoinHandle<()>,
    pub(super) memory_worker: Option<JoinHandle<()>>,
    pub(super) memory_flush: Duration,
    pub(super) mcp: McpServers,
    /// Tasks that end with intake (sweeper, Telegram poller, Discord gateway reader); awaited
    /// rather than aborted, so they let go of the store.
    pub(super) intake_tasks: Vec<JoinHandle<()>>,
    pub(super) lease_keeper: AbortOnDropHandle<()>,
    pub(super) owner: String,
    pub(super) store: Arc<dyn Store>,
}

impl Shutdown {
    /// Runs the stages of the module doc, in order. An error only once all of them ran:
    /// another owner took the store's lease, or it could not be given up.
    pub(super) async fn drain(self) -> Result<(), AppError> {
        let Self {
            stops,
            grace,
            turns,
            deliveries,
            subagents,
            listeners,
            probe,
            memory_worker,
            memory_flush,
            mcp,
            intake_tasks,
            lease_keeper,
            owner,
            store,
        } = self;
        tracing::info!("shutting down: intake stopped, new messages are refused with 503");
        stops.intake.cancel();

        // Turns first (they produce replies), then deliveries, within one grace period.
        let deadline = Instant::now() + grace;
        turns.close();
        if tokio::time::timeout_at(deadline, turns.wait())
            .await
            .is_err()
        {
            let running = turns.len();
            tracing::warn!(
                running,
                "grace period over; interrupting the turns still running (they run again on the next start)"
            );
            stops.turns.cancel();
            if tokio::time::timeout(INTERRUPT_WAIT, turns.wait())
                .await
                .is_err()
            {
                tracing::warn!("some turns did not stop in time");
            }
        }
        // Subagents end with their turns; those interrupted stay RUNNING for the next start.
        if let Some(executor) = &subagents {
            executor.close(INTERRUPT_WAIT).await;
        }
        deliveries.close();
        if tokio::time::timeout_at(deadline, deliveries.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                "grace period over with deliveries pending; they resume on the next start"
            );
        }
        stops.delivery.cancel();
        stops.http.cancel();
        for listener in listeners {
            let _ = listener.await;
        }
        probe.abort();
        // Turns are over, so no update is queued any more: the worker flushes the queue within
        // its own bound; the abort is a backstop.
        stops.memory.cancel();
        if let Some(worker) = memory_worker {
            let abort = worker.abort_handle();
            if tokio::time::timeout(memory_flush + INTERRUPT_WAIT, worker)
                .await
                .is_err()
            {
                abort.abort();
                tracing::warn!("the memory worker did not stop in time");
            }
        }
        // Turns are over: the MCP servers' children can go.
        mcp.shutdown().await;
        for task in intake_tasks {
            let _ = task.await;
        }
        // The subagent executor holds the store (its registry); it goes before the wait below,
        // so that only tasks really still ending are waited for.
        drop(subagents);
        // Every write was durable when it returned. The lease goes last: the next owner
        // starts from here.
        stops.lease.cancel();
        let _ = lease_keeper.await;
        if stops.lease_lost.is_cancelled() {
            return Err(AppError::Store(
                "another antler took over the store's lease; this one stopped".to_owned(),
            ));
        }
        // With replicas: the others adopt this one's conversations from here, at once.
        if let Err(e) = store.leave().await {
            tracing::warn!(error = %e, "cannot let go of this replica's conversations; the others adopt them when its mark runs out");
        }
        store.release(&owner).await?;
        release_store(store).await;
        tracing::info!("stopped");
        Ok(())
    }
}

/// Lets go of the store, waiting (briefly) for tasks still dropping their handles to it, so
/// that it is closed when `serve` returns.
async fn release_store(store: Arc<dyn Store>) {
    let closing = Instant::now() + STORE_RELEASE_WAIT;
    while Arc::strong_count(&store) > 1 && Instant::now() < closing {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if Arc::strong_count(&store) > 1 {
        tracing::warn!("the store is still in use at exit");
    }
}
