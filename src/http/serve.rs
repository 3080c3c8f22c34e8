//! The HTTP/1.1 accept loop: a cap on open connections, a deadline for request heads, and a
//! graceful close.
//!
//! Every connection holds a permit; at the cap, the loop stops accepting and further clients
//! wait in the kernel's listen backlog, so a flood of sockets can never exhaust the process's
//! file descriptors. A connection that does not send a complete request head within
//! `header_read_timeout` is closed; hyper arms that timer whenever it waits for a head, so it
//! closes idle keep-alive connections too. Body reads have their own deadline in the handlers.
//! Accept errors (such as running out of descriptors) are logged and retried after a pause
//! instead of ending the server.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How long the loop pauses after a failed `accept`.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// An open connection's permit, counted in `antler_http_connections` until dropped (also
/// when its task is aborted).
struct ConnectionSlot {
    _permit: OwnedSemaphorePermit,
}

impl ConnectionSlot {
    fn new(permit: OwnedSemaphorePermit) -> Self {
        metrics::gauge!("antler_http_connections").increment(1.0);
        Self { _permit: permit }
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        metrics::gauge!("antler_http_connections").decrement(1.0);
    }
}

/// Limits of one listener.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ServeLimits {
    pub(crate) max_connections: usize,
    pub(crate) header_read_timeout: Duration,
}

/// Serves `app` on `listener` until `stop` is cancelled, then closes idle connections and
/// lets in-flight requests finish, for at most `drain`.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ServeLimits,
    stop: CancellationToken,
    drain: Duration,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    loop {
        // Reap finished connections so the set holds only open ones.
        while connections.try_join_next().is_some() {}
        let permit = tokio::select! {
            permit = Arc::clone(&permits).acquire_owned() => permit,
            () = stop.cancelled() => break,
        };
        // The semaphore is never closed.
        let Ok(permit) = permit else { break };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => break,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(e) => {
                metrics::counter!("antler_http_accept_errors_total").increment(1);
                tracing::warn!(error = %e, "accepting a connection failed; retrying");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let connection = graceful.watch(connection);
        let slot = ConnectionSlot::new(permit);
        connections.spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the grace period are cut");
        connections.abort_all();
    }
    // Wait until every connection task (and the app state it holds) is gone.
    while connections.join_next().await.is_some() {}
}
