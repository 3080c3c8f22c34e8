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
//!
//! Closing is lingering, as nginx's `lingering_close`: a connection ends by sending FIN, then
//! reading and discarding what the client still sends (at most [`LINGER_MAX_BYTES`], for at
//! most [`LINGER_TIME`]) until it closes too. Closing a socket with unread data makes the kernel
//! answer with a reset, which destroys a response the client has not read yet: a client that
//! writes its whole (oversized) body before reading would never see its 413.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How long the loop pauses after a failed `accept`.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// The longest a closing connection reads what the client still sends.
const LINGER_TIME: Duration = Duration::from_secs(5);
/// The most a closing connection reads and discards.
const LINGER_MAX_BYTES: usize = 64 * 1024 * 1024;

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
            .serve_connection(
                TokioIo::new(Lingering::new(stream)),
                TowerToHyperService::new(app.clone()),
            );
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

/// A client connection whose shutdown lingers: FIN first, then what the client still sends is
/// read and discarded until it closes, within [`LINGER_TIME`] and [`LINGER_MAX_BYTES`].
struct Lingering {
    stream: TcpStream,
    /// Set once the write side is shut.
    linger: Option<Linger>,
}

/// The bounds of one lingering close.
struct Linger {
    deadline: Pin<Box<tokio::time::Sleep>>,
    discarded: usize,
}

impl Lingering {
    fn new(stream: TcpStream) -> Self {
        Self {
            stream,
            linger: None,
        }
    }
}

impl AsyncRead for Lingering {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Lingering {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.linger.is_none() {
            ready!(Pin::new(&mut this.stream).poll_shutdown(cx))?;
            this.linger = Some(Linger {
                deadline: Box::pin(tokio::time::sleep(LINGER_TIME)),
                discarded: 0,
            });
        }
        let Some(linger) = this.linger.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let mut scratch = [0u8; 8192];
        loop {
            if linger.deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Ok(()));
            }
            let mut buf = ReadBuf::new(&mut scratch);
            match ready!(Pin::new(&mut this.stream).poll_read(cx, &mut buf)) {
                // The client closed (or the connection failed): nothing is left to reset.
                Ok(()) if buf.filled().is_empty() => return Poll::Ready(Ok(())),
                Err(_) => return Poll::Ready(Ok(())),
                Ok(()) => {
                    linger.discarded += buf.filled().len();
                    if linger.discarded > LINGER_MAX_BYTES {
                        return Poll::Ready(Ok(()));
                    }
                }
            }
        }
    }
}
