//! The long connection (`channels.feishu.mode = "websocket"`): events over a WebSocket that
//! antler opens, so no public URL is needed. The protocol is the official SDKs'
//! (oapi-sdk-go `ws/client.go`, oapi-sdk-python `lark_oapi/ws/client.py`):
//!
//! 1. `POST {api_url}/callback/ws/endpoint` with `{"AppID", "AppSecret"}` answers the socket's
//!    URL (its query names `device_id` and `service_id`) and a `ClientConfig`
//!    ([`FeishuApi::socket_endpoint`](crate::FeishuApi::socket_endpoint)).
//! 2. Every WebSocket message is one binary [`Frame`]. The client pings (a control frame)
//!    every `PingInterval`; a pong may carry a new `ClientConfig`.
//! 3. A data frame of type `event` carries the event JSON (schema 2.0, in clear: the SDKs
//!    neither decrypt nor check a token on this path; the connection itself was opened with
//!    the app secret). A payload may come split in `sum` parts (`seq` 0..sum, one
//!    `message_id`), reassembled before use.
//! 4. The client answers a data frame by sending it back with a `biz_rt` header and the
//!    payload `{"code": 200, …}` ([`Frame::answer`]); unanswered, Feishu delivers the event
//!    again.
//! 5. A card callback (`card.action.trigger`, when the app subscribes it on the long
//!    connection) comes in a data frame of type `card` (or `event`), its payload the same JSON
//!    a webhook callback holds in clear; its answer carries the callback's response (toast,
//!    card) as `data`, base64 as the SDKs marshal it. The Go SDK drops `card` frames; the
//!    Python SDK's handler answers both kinds alike, which antler does.
//!
//! [`FeishuSocket`] is one connection: it reads, pings and writes answers on its own task and
//! hands each event to the caller as a [`Delivery`], answered when the caller says so. The
//! caller reconnects ([`SocketConfig`] says how often) when it ends.

use std::collections::HashMap;
use std::time::Duration;

use antler_channel::ChannelError;
use futures_util::stream::FuturesUnordered;
use futures_util::{SinkExt, StreamExt};
use prost::Message as _;
use serde::Deserialize;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use crate::frame::{self, Frame};

/// The largest WebSocket message read, in bytes: event payloads are split into parts well
/// below this.
const MAX_MESSAGE: usize = 1024 * 1024;
/// The largest reassembled payload, in bytes.
const MAX_PAYLOAD: usize = 4 * 1024 * 1024;
/// The most parts one payload may be split into.
const MAX_PARTS: usize = 64;
/// The most payloads being reassembled at once.
const MAX_PENDING: usize = 64;
/// How long the parts of a payload are kept for the rest to arrive (the SDKs' 5 s cache).
const PARTS_TTL: Duration = Duration::from_secs(5);
/// How many events may wait for the caller before the socket stops being read.
const QUEUE: usize = 64;
/// How long closing waits for the server's close frame.
const CLOSE_WAIT: Duration = Duration::from_secs(2);
/// How long the WebSocket handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// The endpoint's `code` for "too many connections" (also the handshake's
/// `Handshake-Autherrcode`): Feishu allows 50 long connections per app.
pub(crate) const EXCEED_CONN_LIMIT: i64 = 1_000_040_350;
/// The handshake's `Handshake-Status` for a refused authentication.
const AUTH_FAILED: u16 = 514;
/// The handshake's `Handshake-Status` for an app that may not connect.
const FORBIDDEN: u16 = 403;

/// How the client reconnects and pings, as the server configures it (`ClientConfig`, in
/// seconds on the wire). The defaults are the SDKs' until the server says otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketConfig {
    /// Failed attempts after which the client gives up; negative: never.
    pub reconnect_count: i64,
    /// The longest wait between reconnection attempts.
    pub reconnect_interval: Duration,
    /// The first reconnection waits a random time up to this, so that clients spread out.
    pub reconnect_nonce: Duration,
    /// How often the client pings.
    pub ping_interval: Duration,
}

impl Default for SocketConfig {
    fn default() -> Self {
        Self {
            reconnect_count: -1,
            reconnect_interval: Duration::from_secs(120),
            reconnect_nonce: Duration::from_secs(30),
            ping_interval: Duration::from_secs(120),
        }
    }
}

/// `ClientConfig` as the server sends it.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct WireConfig {
    #[serde(rename = "ReconnectCount")]
    reconnect_count: Option<i64>,
    #[serde(rename = "ReconnectInterval")]
    reconnect_interval: Option<u64>,
    #[serde(rename = "ReconnectNonce")]
    reconnect_nonce: Option<u64>,
    #[serde(rename = "PingInterval")]
    ping_interval: Option<u64>,
}

impl SocketConfig {
    /// This config with what `wire` names. A zero interval is ignored: it would make the
    /// client ping or reconnect in a busy loop.
    pub(crate) fn updated(mut self, wire: &WireConfig) -> Self {
        if let Some(count) = wire.reconnect_count {
            self.reconnect_count = count;
        }
        if let Some(secs) = wire.reconnect_interval.filter(|s| *s > 0) {
            self.reconnect_interval = Duration::from_secs(secs);
        }
        if let Some(secs) = wire.reconnect_nonce {
            self.reconnect_nonce = Duration::from_secs(secs);
        }
        if let Some(secs) = wire.ping_interval.filter(|s| *s > 0) {
            self.ping_interval = Duration::from_secs(secs);
        }
        self
    }
}

/// Where to connect: the answer of `/callback/ws/endpoint`.
pub struct SocketEndpoint {
    /// The `wss://` URL; its query holds credentials, so it is never logged.
    pub(crate) url: String,
    /// The server's `ClientConfig`.
    pub config: SocketConfig,
}

impl std::fmt::Debug for SocketEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SocketEndpoint")
            .field("url", &"***")
            .field("config", &self.config)
            .finish()
    }
}

/// How a frame is answered: the status, and the handler's result (JSON) if any.
type Reply = (u16, Option<Vec<u8>>);

/// One event (or card callback) received on the long connection, to be answered once it was
/// handled.
#[derive(Debug)]
pub struct Delivery {
    /// The event JSON.
    pub payload: Vec<u8>,
    answer: oneshot::Sender<Reply>,
}

impl Delivery {
    /// Answers the frame with `code` (200: handled; anything else makes Feishu deliver it
    /// again). A delivery dropped unanswered is not answered at all (Feishu delivers it again).
    pub fn answer(self, code: u16) {
        // The connection may have closed meanwhile: then the event comes again anyway.
        let _ = self.answer.send((code, None));
    }

    /// Answers the frame with 200 and `result`, the JSON a webhook would answer with (a card
    /// callback's toast and card).
    pub fn answer_with(self, result: &serde_json::Value) {
        let _ = self
            .answer
            .send((200, Some(result.to_string().into_bytes())));
    }
}

/// An open long connection.
#[derive(Debug)]
pub struct FeishuSocket {
    deliveries: mpsc::Receiver<Delivery>,
    config: watch::Receiver<SocketConfig>,
    close: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    /// The connection's `device_id` (for the logs).
    pub device_id: String,
}

impl FeishuSocket {
    /// Connects to `endpoint`. A refusal retrying will not fix (403, too many connections) is
    /// [`ChannelError::Permanent`]; anything else is [`ChannelError::Transient`].
    pub async fn connect(endpoint: SocketEndpoint) -> Result<Self, ChannelError> {
        let url = reqwest::Url::parse(&endpoint.url).map_err(|_| {
            ChannelError::Transient("Feishu's long connection URL is not a URL".to_owned())
        })?;
        if !matches!(url.scheme(), "ws" | "wss") {
            return Err(ChannelError::Transient(
                "Feishu's long connection URL is not a ws(s) URL".to_owned(),
            ));
        }
        let query = |name: &str| {
            url.query_pairs()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.into_owned())
                .unwrap_or_default()
        };
        let device_id = query("device_id");
        // As the Go SDK: an unreadable service id is 0.
        let service: i32 = query("service_id").parse().unwrap_or(0);
        let config = WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE))
            .max_frame_size(Some(MAX_MESSAGE));
        let connected = tokio::time::timeout(
            HANDSHAKE_TIMEOUT,
            tokio_tungstenite::connect_async_with_config(url.as_str(), Some(config), true),
        )
        .await
        .map_err(|_| {
            ChannelError::Transient("the long connection's handshake timed out".to_owned())
        })?;
        let (ws, _) = connected.map_err(handshake_error)?;
        let (deliveries_tx, deliveries) = mpsc::channel(QUEUE);
        let (config_tx, config) = watch::channel(endpoint.config);
        let (close, close_rx) = oneshot::channel();
        let task = tokio::spawn(run(ws, service, config_tx, deliveries_tx, close_rx));
        Ok(Self {
            deliveries,
            config,
            close: Some(close),
            task,
            device_id,
        })
    }

    /// The next event; `None` once the connection is closed.
    pub async fn next(&mut self) -> Option<Delivery> {
        self.deliveries.recv().await
    }

    /// The server's latest `ClientConfig`.
    pub fn config(&self) -> SocketConfig {
        *self.config.borrow()
    }

    /// Closes the connection (a WebSocket close, briefly awaited). Events received and not
    /// answered are delivered again by Feishu.
    pub async fn close(mut self) {
        if let Some(close) = self.close.take() {
            let _ = close.send(());
        }
        if tokio::time::timeout(CLOSE_WAIT * 2, &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
    }
}

/// A handshake failure, judged as the SDKs judge it: by the response's `Handshake-Status`
/// (514 with `Handshake-Autherrcode` 1000040350: too many connections; 403: forbidden; both
/// final), anything else worth another attempt. The URL is never part of the message.
fn handshake_error(error: tokio_tungstenite::tungstenite::Error) -> ChannelError {
    use tokio_tungstenite::tungstenite::Error;
    let Error::Http(response) = &error else {
        return ChannelError::Transient(format!("the long connection failed: {error}"));
    };
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    };
    let status: u16 = header("Handshake-Status").parse().unwrap_or(0);
    let message = header("Handshake-Msg");
    let auth_code: i64 = header("Handshake-Autherrcode").parse().unwrap_or(0);
    match status {
        AUTH_FAILED if auth_code == EXCEED_CONN_LIMIT => ChannelError::Permanent(format!(
            "Feishu refused the long connection: too many connections ({EXCEED_CONN_LIMIT}, \
             {message}); an app may hold at most 50"
        )),
        FORBIDDEN => ChannelError::Permanent(format!(
            "Feishu refused the long connection: forbidden (403, {message})"
        )),
        _ => ChannelError::Transient(format!(
            "Feishu refused the long connection: HTTP {}, handshake status {status} {message}",
            response.status()
        )),
    }
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// An answered event: the frame to send back, its answer and when it arrived.
type Answered = Option<(Frame, Reply, Instant)>;

/// Reads, pings and answers until the server closes, the socket fails or `close` fires.
async fn run(
    mut ws: Socket,
    service: i32,
    config: watch::Sender<SocketConfig>,
    deliveries: mpsc::Sender<Delivery>,
    mut close: oneshot::Receiver<()>,
) {
    let mut ping_every = config.borrow().ping_interval;
    // The first tick is at once: the SDKs ping as soon as they are connected.
    let mut ping = tokio::time::interval(ping_every);
    let mut parts = Parts::default();
    let mut answers = FuturesUnordered::new();
    loop {
        tokio::select! {
            _ = &mut close => {
                let _ = tokio::time::timeout(CLOSE_WAIT, async {
                    let _ = ws.close(None).await;
                    while let Some(Ok(_)) = ws.next().await {}
                })
                .await;
                return;
            }
            _ = ping.tick() => {
                let ping = Frame::ping(service).encode_to_vec();
                if let Err(e) = ws.send(Message::binary(ping)).await {
                    tracing::warn!(error = %e, "feishu long connection: a ping failed");
                    return;
                }
            }
            Some(answered) = answers.next(), if !answers.is_empty() => {
                let answered: Answered = answered;
                let Some((frame, (code, data), arrived)) = answered else { continue };
                let took_ms = u64::try_from(arrived.elapsed().as_millis()).unwrap_or(u64::MAX);
                let bytes = frame.answer(code, took_ms, data.as_deref()).encode_to_vec();
                if let Err(e) = ws.send(Message::binary(bytes)).await {
                    tracing::warn!(error = %e, "feishu long connection: an answer failed");
                    return;
                }
            }
            message = ws.next() => {
                let bytes = match message {
                    Some(Ok(Message::Binary(bytes))) => bytes,
                    Some(Ok(Message::Close(_))) | None => {
                        tracing::info!("feishu long connection closed by the server");
                        return;
                    }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "feishu long connection failed");
                        return;
                    }
                    // WebSocket pings are answered by tungstenite; text is not the protocol.
                    Some(Ok(_)) => continue,
                };
                let frame = match Frame::decode(bytes.as_ref()) {
                    Ok(frame) => frame,
                    Err(e) => {
                        tracing::warn!(error = %e, "feishu long connection: not a frame");
                        continue;
                    }
                };
                match frame.method {
                    frame::CONTROL => {
                        if let Some(every) = control(&frame, &config)
                            && every != ping_every
                        {
                            ping_every = every;
                            ping = tokio::time::interval_at(Instant::now() + every, every);
                        }
                    }
                    frame::DATA => {
                        let Some((frame, payload)) = parts.complete(frame) else { continue };
                        if !matches!(frame.header(frame::TYPE), Some("event" | "card")) {
                            tracing::debug!(kind = ?frame.header(frame::TYPE), "feishu long connection: a frame antler does not handle");
                            continue;
                        }
                        tracing::debug!(trace_id = ?frame.header(frame::TRACE_ID), "feishu long connection: an event");
                        let (answer, answered) = oneshot::channel();
                        let arrived = Instant::now();
                        if deliveries.send(Delivery { payload, answer }).await.is_err() {
                            return;
                        }
                        answers.push(async move {
                            answered.await.ok().map(|reply| (frame, reply, arrived))
                        });
                    }
                    other => tracing::debug!(method = other, "feishu long connection: an unknown frame"),
                }
            }
        }
    }
}

/// A control frame: a pong may carry a new `ClientConfig`; the new ping interval, if any.
fn control(frame: &Frame, config: &watch::Sender<SocketConfig>) -> Option<Duration> {
    if frame.header(frame::TYPE) != Some("pong") {
        return None;
    }
    let payload = frame.payload.as_deref().filter(|p| !p.is_empty())?;
    let wire: WireConfig = match serde_json::from_slice(payload) {
        Ok(wire) => wire,
        Err(e) => {
            tracing::warn!(error = %e, "feishu long connection: a pong's ClientConfig is unreadable");
            return None;
        }
    };
    let updated = config.borrow().updated(&wire);
    config.send_replace(updated);
    Some(updated.ping_interval)
}

/// Payloads split into parts, waiting for the rest (bounded in parts, bytes, count and time).
#[derive(Default)]
struct Parts {
    pending: HashMap<String, Pending>,
}

struct Pending {
    parts: Vec<Option<Vec<u8>>>,
    bytes: usize,
    expires: Instant,
}

impl Parts {
    /// The frame and its whole payload: at once for a payload in one part; for a split one,
    /// once its last part arrived (with the frame of that part, the one answered, as the SDKs
    /// do). `None` while parts are missing, or for a part that breaks the bounds.
    fn complete(&mut self, mut frame: Frame) -> Option<(Frame, Vec<u8>)> {
        let payload = frame.payload.take().unwrap_or_default();
        let sum = frame.header_number(frame::SUM).unwrap_or(1);
        if sum <= 1 {
            return Some((frame, payload));
        }
        let seq = frame.header_number(frame::SEQ).unwrap_or(0);
        let id = frame
            .header(frame::MESSAGE_ID)
            .unwrap_or_default()
            .to_owned();
        let now = Instant::now();
        self.pending.retain(|_, p| p.expires > now);
        if sum > MAX_PARTS || seq >= sum || id.is_empty() {
            tracing::warn!(
                sum,
                seq,
                "feishu long connection: a part out of bounds; dropped"
            );
            return None;
        }
        if !self.pending.contains_key(&id) && self.pending.len() >= MAX_PENDING {
            tracing::warn!(
                "feishu long connection: too many split payloads at once; a part dropped"
            );
            return None;
        }
        let pending = self.pending.entry(id.clone()).or_insert_with(|| Pending {
            parts: vec![None; sum],
            bytes: 0,
            expires: now + PARTS_TTL,
        });
        if pending.parts.len() != sum || pending.bytes + payload.len() > MAX_PAYLOAD {
            tracing::warn!(
                "feishu long connection: a split payload too large or inconsistent; dropped"
            );
            self.pending.remove(&id);
            return None;
        }
        pending.bytes += payload.len();
        pending.parts[seq] = Some(payload);
        // As the SDKs' cache: each part keeps the payload 5 s longer.
        pending.expires = now + PARTS_TTL;
        if pending.parts.iter().any(Option::is_none) {
            return None;
        }
        let whole = self
            .pending
            .remove(&id)
            .map(|p| p.parts.into_iter().flatten().flatten().collect())
            .unwrap_or_default();
        Some((frame, whole))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(id: &str, sum: usize, seq: usize, payload: &[u8]) -> Frame {
        Frame {
            method: frame::DATA,
            headers: vec![
                frame::header(frame::TYPE, "event"),
                frame::header(frame::MESSAGE_ID, id),
                frame::header(frame::SUM, &sum.to_string()),
                frame::header(frame::SEQ, &seq.to_string()),
            ],
            payload: Some(payload.to_vec()),
            ..Frame::default()
        }
    }

    #[tokio::test]
    async fn split_payloads_are_joined_in_order_whatever_order_they_arrive_in() {
        let mut parts = Parts::default();
        assert!(parts.complete(part("m1", 3, 2, b"c")).is_none());
        assert!(parts.complete(part("m2", 2, 0, b"x")).is_none());
        assert!(parts.complete(part("m1", 3, 0, b"a")).is_none());
        let (frame, whole) = parts.complete(part("m1", 3, 1, b"b")).unwrap();
        assert_eq!(whole, b"abc");
        assert_eq!(
            frame.header(frame::SEQ),
            Some("1"),
            "the last part is answered"
        );
        let (_, whole) = parts.complete(part("m2", 2, 1, b"y")).unwrap();
        assert_eq!(whole, b"xy");
        // A whole payload passes through.
        let (_, whole) = parts.complete(part("m3", 1, 0, b"{}")).unwrap();
        assert_eq!(whole, b"{}");
    }

    #[tokio::test(start_paused = true)]
    async fn parts_out_of_bounds_or_too_late_are_dropped() {
        let mut parts = Parts::default();
        assert!(
            parts.complete(part("m", 2, 2, b"a")).is_none(),
            "seq past sum"
        );
        assert!(parts.complete(part("m", MAX_PARTS + 1, 0, b"a")).is_none());
        assert!(parts.complete(part("m", 2, 0, b"a")).is_none());
        tokio::time::advance(PARTS_TTL + Duration::from_millis(1)).await;
        // The first part expired: the second alone does not complete the payload.
        assert!(parts.complete(part("m", 2, 1, b"b")).is_none());
        let big = vec![b'x'; MAX_PAYLOAD];
        assert!(parts.complete(part("n", 2, 0, &big)).is_none());
        assert!(
            parts.complete(part("n", 2, 1, b"y")).is_none(),
            "over the size bound"
        );
    }

    /// A server that answers the WebSocket handshake with `status` and the SDKs' handshake
    /// headers instead of switching protocols; its ws:// URL.
    async fn refusing(status: u16, auth_code: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let auth_code = auth_code.to_owned();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request).await;
            let response = format!(
                "HTTP/1.1 {status} Refused\r\nHandshake-Status: {status}\r\n\
                 Handshake-Msg: refused\r\nHandshake-Autherrcode: {auth_code}\r\n\
                 Content-Length: 0\r\n\r\n"
            );
            let _ = stream.write_all(response.as_bytes()).await;
        });
        format!("ws://{address}/ws/v2?device_id=1&service_id=2&access_key=secret-key")
    }

    #[tokio::test]
    async fn handshake_refusals_are_judged_by_their_handshake_status() {
        for (status, auth_code, retry) in [
            (514, "1000040350", false),
            (514, "1000040351", true),
            (403, "", false),
            (500, "", true),
        ] {
            let endpoint = SocketEndpoint {
                url: refusing(status, auth_code).await,
                config: SocketConfig::default(),
            };
            let error = FeishuSocket::connect(endpoint).await.unwrap_err();
            assert_eq!(
                error.is_retryable(),
                retry,
                "{status} {auth_code}: {error:?}"
            );
            assert!(!error.to_string().contains("secret-key"), "{error}");
        }
    }

    #[test]
    fn the_servers_config_replaces_the_defaults_but_never_with_a_zero_interval() {
        let wire: WireConfig = serde_json::from_str(
            r#"{"ReconnectCount":3,"ReconnectInterval":0,"ReconnectNonce":5,"PingInterval":7}"#,
        )
        .unwrap();
        let config = SocketConfig::default().updated(&wire);
        assert_eq!(config.reconnect_count, 3);
        assert_eq!(config.reconnect_interval, Duration::from_secs(120));
        assert_eq!(config.reconnect_nonce, Duration::from_secs(5));
        assert_eq!(config.ping_interval, Duration::from_secs(7));
    }
}
