//! A mock of Feishu's long connection on 127.0.0.1: the WebSocket the endpoint
//! (`POST /callback/ws/endpoint`, mounted by [`crate::feishu::MockFeishu::serve_socket`])
//! points at. It speaks the SDKs' protocol (oapi-sdk-go `ws/`, oapi-sdk-python
//! `lark_oapi/ws`): binary protobuf `pbbp2.Frame`s, defined here on their own so the client's
//! encoding is checked against an independent one; pings (control frames, `type: ping`)
//! answered with a pong carrying a `ClientConfig`; events sent as data frames (`type: event`,
//! `message_id`, `sum`, `seq`, `trace_id`), whole or split; answers (the frame sent back with
//! `{"code": …}`) recorded.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::{SinkExt, StreamExt};
use prost::Message as _;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message as Ws;

/// The `device_id` in the URL the endpoint answers.
pub const DEVICE_ID: &str = "7000000000000000001";
/// The `service_id` in that URL: every frame names it.
pub const SERVICE_ID: i32 = 33_554_678;

/// `pbbp2.Header`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Header {
    /// The header's name.
    #[prost(string, required, tag = "1")]
    pub key: String,
    /// Its value.
    #[prost(string, required, tag = "2")]
    pub value: String,
}

/// `pbbp2.Frame` (proto2; `method` 0 control, 1 data).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Frame {
    /// `SeqID`.
    #[prost(uint64, required, tag = "1")]
    pub seq_id: u64,
    /// `LogID`.
    #[prost(uint64, required, tag = "2")]
    pub log_id: u64,
    /// `service`: the connection's service id.
    #[prost(int32, required, tag = "3")]
    pub service: i32,
    /// `method`: 0 control, 1 data.
    #[prost(int32, required, tag = "4")]
    pub method: i32,
    /// `headers`.
    #[prost(message, repeated, tag = "5")]
    pub headers: Vec<Header>,
    /// `payload_encoding`.
    #[prost(string, optional, tag = "6")]
    pub payload_encoding: Option<String>,
    /// `payload_type`.
    #[prost(string, optional, tag = "7")]
    pub payload_type: Option<String>,
    /// `payload`.
    #[prost(bytes = "vec", optional, tag = "8")]
    pub payload: Option<Vec<u8>>,
    /// `LogIDNew`.
    #[prost(string, optional, tag = "9")]
    pub log_id_new: Option<String>,
}

impl Frame {
    /// The first header named `key`.
    #[must_use]
    pub fn header(&self, key: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|h| h.key == key)
            .map(|h| h.value.as_str())
    }

    /// The payload as JSON (`null` when absent or not JSON).
    #[must_use]
    pub fn json(&self) -> Value {
        self.payload
            .as_deref()
            .and_then(|p| serde_json::from_slice(p).ok())
            .unwrap_or(Value::Null)
    }

    /// An answer's `data` as JSON: the handler's result (a card callback's toast and card),
    /// base64 in the payload as Go marshals `[]byte` (`ws.Response.Data`); `null` when none.
    #[must_use]
    pub fn data(&self) -> Value {
        use base64::Engine as _;
        self.json()["data"]
            .as_str()
            .and_then(|data| base64::engine::general_purpose::STANDARD.decode(data).ok())
            .and_then(|data| serde_json::from_slice(&data).ok())
            .unwrap_or(Value::Null)
    }
}

fn header(key: &str, value: &str) -> Header {
    Header {
        key: key.to_owned(),
        value: value.to_owned(),
    }
}

/// What the mock sends to the connected client.
enum Outgoing {
    Frame(Vec<u8>),
    Close,
}

#[derive(Default)]
struct Shared {
    connections: AtomicUsize,
    seq: AtomicU64,
    pings: Mutex<Vec<Frame>>,
    answers: Mutex<Vec<Frame>>,
    current: Mutex<Option<mpsc::UnboundedSender<Outgoing>>>,
    pong_config: Mutex<Value>,
}

/// The mock long connection server.
#[derive(Clone)]
pub struct MockFeishuSocket {
    address: String,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for MockFeishuSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockFeishuSocket")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl MockFeishuSocket {
    /// Listens on 127.0.0.1; each pong carries `pong_config` as its `ClientConfig`.
    pub async fn start(pong_config: Value) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the long connection");
        let address = listener.local_addr().expect("its address").to_string();
        let shared = Arc::new(Shared {
            pong_config: Mutex::new(pong_config),
            ..Shared::default()
        });
        let serving = Arc::clone(&shared);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let shared = Arc::clone(&serving);
                tokio::spawn(async move {
                    if let Ok(ws) = tokio_tungstenite::accept_async(stream).await {
                        connection(ws, shared).await;
                    }
                });
            }
        });
        Self { address, shared }
    }

    /// The URL the endpoint answers, shaped as Feishu's (`device_id`, `service_id` and
    /// credentials in the query).
    #[must_use]
    pub fn url(&self) -> String {
        format!(
            "ws://{}/ws/v2?fpid=493&aid=552564&device_id={DEVICE_ID}&access_key=mock-access-key\
             &service_id={SERVICE_ID}&ticket=mock-ticket",
            self.address
        )
    }

    /// Makes later pongs carry `config` as their `ClientConfig`.
    pub fn set_pong_config(&self, config: Value) {
        if let Ok(mut current) = self.shared.pong_config.lock() {
            *current = config;
        }
    }

    /// How many connections were accepted so far.
    #[must_use]
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Waits until `n` connections were accepted.
    pub async fn wait_for_connections(&self, n: usize) {
        crate::wait_until(&format!("{n} long connections"), || async {
            (self.connections() >= n).then_some(())
        })
        .await;
    }

    /// The pings received, in order.
    #[must_use]
    pub fn pings(&self) -> Vec<Frame> {
        self.shared
            .pings
            .lock()
            .map(|p| p.clone())
            .unwrap_or_default()
    }

    /// Waits until `n` pings were received; they.
    pub async fn wait_for_pings(&self, n: usize) -> Vec<Frame> {
        crate::wait_for_at_least(&format!("{n} pings"), n, || async { self.pings() }).await
    }

    /// The answers received (data frames sent back), in order.
    #[must_use]
    pub fn answers(&self) -> Vec<Frame> {
        self.shared
            .answers
            .lock()
            .map(|a| a.clone())
            .unwrap_or_default()
    }

    /// Waits until `n` answers were received; they.
    pub async fn wait_for_answers(&self, n: usize) -> Vec<Frame> {
        crate::wait_for_at_least(&format!("{n} answers"), n, || async { self.answers() }).await
    }

    /// Sends `event` as one data frame with `message_id` (once a client is connected).
    pub async fn send_event(&self, message_id: &str, event: &Value) {
        self.send_split(message_id, event, 1).await;
    }

    /// Sends a card callback (`card.action.trigger`) as one data frame of type `card`, as
    /// Feishu does for apps that subscribe card callbacks on the long connection.
    pub async fn send_card(&self, message_id: &str, callback: &Value) {
        self.send_frames("card", message_id, callback, 1).await;
    }

    /// Sends `event` split into `sum` data frames (`seq` 0..sum), last part first, so that
    /// order does not decide the reassembly.
    pub async fn send_split(&self, message_id: &str, event: &Value, sum: usize) {
        self.send_frames("event", message_id, event, sum).await;
    }

    /// Sends `payload` in `sum` data frames of type `kind`, last part first.
    async fn send_frames(&self, kind: &str, message_id: &str, event: &Value, sum: usize) {
        let payload = event.to_string().into_bytes();
        let size = payload.len().div_ceil(sum);
        let parts: Vec<&[u8]> = payload.chunks(size).collect();
        assert_eq!(parts.len(), sum, "an event long enough for {sum} parts");
        let sender = crate::wait_until("a connected client", || async {
            self.shared.current.lock().ok().and_then(|c| c.clone())
        })
        .await;
        for (seq, part) in parts.iter().enumerate().rev() {
            let frame = Frame {
                seq_id: self.shared.seq.fetch_add(1, Ordering::SeqCst) + 1,
                log_id: 0,
                service: SERVICE_ID,
                method: 1,
                headers: vec![
                    header("type", kind),
                    header("message_id", message_id),
                    header("sum", &sum.to_string()),
                    header("seq", &seq.to_string()),
                    header("trace_id", &format!("trace-{message_id}")),
                    header("timestamp", "1767225600000"),
                ],
                payload: Some(part.to_vec()),
                ..Frame::default()
            };
            let _ = sender.send(Outgoing::Frame(frame.encode_to_vec()));
        }
    }

    /// Closes the current connection from the server's side.
    pub fn close_connection(&self) {
        if let Some(sender) = self.shared.current.lock().ok().and_then(|mut c| c.take()) {
            let _ = sender.send(Outgoing::Close);
        }
    }
}

/// One client: frames in (pings answered, answers recorded), frames out.
async fn connection<S>(ws: tokio_tungstenite::WebSocketStream<S>, shared: Arc<Shared>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut sink, mut stream) = ws.split();
    let (sender, mut outgoing) = mpsc::unbounded_channel();
    if let Ok(mut current) = shared.current.lock() {
        *current = Some(sender);
    }
    shared.connections.fetch_add(1, Ordering::SeqCst);
    loop {
        tokio::select! {
            out = outgoing.recv() => match out {
                Some(Outgoing::Frame(bytes)) => {
                    if sink.send(Ws::Binary(bytes)).await.is_err() {
                        return;
                    }
                }
                Some(Outgoing::Close) | None => {
                    let _ = sink.send(Ws::Close(None)).await;
                    return;
                }
            },
            message = stream.next() => {
                let Some(Ok(message)) = message else { return };
                let Ws::Binary(bytes) = message else { continue };
                let frame = Frame::decode(bytes.as_slice()).expect("a pbbp2.Frame from the client");
                assert_eq!(frame.service, SERVICE_ID, "the frame names the connection's service");
                if frame.method == 0 && frame.header("type") == Some("ping") {
                    if let Ok(mut pings) = shared.pings.lock() {
                        pings.push(frame.clone());
                    }
                    let config = shared.pong_config.lock().map(|c| c.clone()).unwrap_or_default();
                    let pong = Frame {
                        headers: vec![header("type", "pong")],
                        payload: Some(config.to_string().into_bytes()),
                        ..frame
                    };
                    if sink.send(Ws::Binary(pong.encode_to_vec())).await.is_err() {
                        return;
                    }
                } else if frame.method == 1 {
                    if let Ok(mut answers) = shared.answers.lock() {
                        answers.push(frame);
                    }
                }
            }
        }
    }
}

/// The `ClientConfig` the endpoint and the pongs carry by default: the SDKs' own defaults
/// (`ReconnectCount` -1: forever; 120 s between attempts and pings), except a first-reconnect
/// jitter of at most 1 s instead of 30, so a reconnection in a test is quick.
#[must_use]
pub fn client_config() -> Value {
    json!({"ReconnectCount": -1, "ReconnectInterval": 120, "ReconnectNonce": 1, "PingInterval": 120})
}
