//! What antler answers before its store is ready (PostgreSQL: the database unreachable at
//! start, or another antler holding the store's lease): `/healthz` 200 (the process is
//! alive), `/readyz` 503 saying which, and every other request 503 with `Retry-After`, so
//! platforms deliver again later and a load balancer sends traffic elsewhere. Nothing is
//! accepted, so nothing is acknowledged that was not stored. It is served on antler's own
//! listener until the app takes the listener over.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::ingress::RETRY_AFTER;

/// How long requests under way may take once the app takes the listener over.
const STOP_WAIT: Duration = Duration::from_secs(2);

/// Why antler is not serving yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Waiting {
    /// Opening the store, or building the rest of antler once it is open.
    Starting = 0,
    /// The database does not answer; it is tried again with backoff.
    Database = 1,
}

impl Waiting {
    fn of(raw: u8) -> Self {
        match raw {
            1 => Self::Database,
            _ => Self::Starting,
        }
    }

    /// The word `/readyz` says.
    fn name(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Database => "waiting_for_database",
        }
    }
}

/// The server answering while antler waits; [`WaitingServer::stop`] hands the listener back.
#[derive(Debug)]
pub(super) struct WaitingServer {
    state: Arc<AtomicU8>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl WaitingServer {
    /// Starts answering on a second handle of `listener`'s socket; returns `listener` for the
    /// app to serve on once the waiting is over.
    pub(super) fn start(listener: TcpListener) -> std::io::Result<(TcpListener, Self)> {
        let socket = listener.into_std()?;
        let waiting = TcpListener::from_std(socket.try_clone()?)?;
        let listener = TcpListener::from_std(socket)?;
        let state = Arc::new(AtomicU8::new(Waiting::Starting as u8));
        let stop = CancellationToken::new();
        let app = Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .route(
                "/readyz",
                get({
                    let state = Arc::clone(&state);
                    move || async move { not_ready(Waiting::of(state.load(Ordering::SeqCst))) }
                }),
            )
            .fallback(|| async { retry_later() });
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let served = axum::serve(waiting, app)
                .with_graceful_shutdown(stopped.cancelled_owned())
                .await;
            if let Err(e) = served {
                tracing::warn!(error = %e, "the server answering while antler waits stopped");
            }
        });
        Ok((listener, Self { state, stop, task }))
    }

    /// Says what antler waits for now.
    pub(super) fn set(&self, waiting: Waiting) {
        self.state.store(waiting as u8, Ordering::SeqCst);
    }

    /// Stops answering (requests under way get [`STOP_WAIT`] to finish: a client that sends
    /// its request slowly must not hold up the start) and closes this handle of the socket.
    pub(super) async fn stop(self) {
        self.stop.cancel();
        let mut task = self.task;
        if tokio::time::timeout(STOP_WAIT, &mut task).await.is_err() {
            task.abort();
            let _ = task.await;
        }
    }
}

fn not_ready(waiting: Waiting) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        axum::Json(json!({ "ready": false, "state": waiting.name() })),
    )
        .into_response()
}

fn retry_later() -> Response {
    let mut response = (
        StatusCode::SERVICE_UNAVAILABLE,
        axum::Json(json!({
            "error": "antler is not serving yet; try again later",
        })),
    )
        .into_response();
    response.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from(RETRY_AFTER.as_secs()),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn fetch(base: &str, path: &str) -> reqwest::Response {
        reqwest::get(format!("{base}{path}")).await.unwrap()
    }

    #[tokio::test]
    async fn it_answers_alive_not_ready_and_retry_later_then_hands_the_listener_back() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (listener, waiting) = WaitingServer::start(listener).unwrap();
        assert_eq!(fetch(&base, "/healthz").await.status(), StatusCode::OK);
        waiting.set(Waiting::Database);
        let ready = fetch(&base, "/readyz").await;
        assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body: serde_json::Value = ready.json().await.unwrap();
        assert_eq!(
            body,
            json!({"ready": false, "state": "waiting_for_database"})
        );
        waiting.set(Waiting::Starting);
        let body: serde_json::Value = fetch(&base, "/readyz").await.json().await.unwrap();
        assert_eq!(body["state"], "starting");
        let posted = reqwest::Client::new()
            .post(format!("{base}/api/v1/messages"))
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(posted.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            posted.headers()[header::RETRY_AFTER],
            RETRY_AFTER.as_secs().to_string().as_str()
        );
        // A client that never finishes its request does not hold the hand-over up.
        let mut slow = tokio::net::TcpStream::connect(base.trim_start_matches("http://"))
            .await
            .unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut slow, b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        tokio::time::timeout(STOP_WAIT * 5, waiting.stop())
            .await
            .expect("the hand-over is bounded");
        // The socket stays open: the app serves on the listener it got back.
        let app = Router::new().route("/healthz", get(|| async { "app" }));
        tokio::spawn(async move { axum::serve(listener, app).await });
        let answer = reqwest::Client::new()
            .get(format!("{base}/healthz"))
            .header(header::CONNECTION, "close")
            .send()
            .await
            .unwrap();
        assert_eq!(answer.text().await.unwrap(), "app");
    }
}
