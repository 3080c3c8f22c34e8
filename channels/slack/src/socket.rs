//! Slack's Socket Mode: events over a WebSocket that antler opens, for apps without a public
//! URL ("Using Socket Mode", docs.slack.dev/apis/events-api/using-socket-mode).
//!
//! `apps.connections.open` with the app-level token (`xapp-…`) answers a `wss://` URL; Slack
//! first sends `hello`, then envelopes `{"envelope_id", "type", "payload", …}`. Each envelope
//! is acknowledged with `{"envelope_id"}` (and a slash command's immediate answer as
//! `"payload"`) within 3 s, or Slack delivers it again; `disconnect` asks for a new connection.
//!
//! Written on tokio-tungstenite rather than slack-morphism's `SlackClientSocketModeListener`:
//! that listener does acknowledge after its callback, but hands the callback its own parsed
//! models (`SlackPushEvent`), not the payload, while antler's normalization reads the Events
//! API body itself (fields slack-morphism does not model, an `app_mention` it cannot read);
//! its callbacks are plain `fn` pointers reaching state through a type map, it reconnects at a
//! fixed interval rather than with antler's backoff, stops on its own signal handling rather
//! than antler's stop token, and traces whole envelopes. What is left here is small: open,
//! connect, read envelopes, acknowledge; the loop around it (acknowledge only after the
//! ingress stored the event, reconnect with backoff, stop) is antler's.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// How long opening a connection may take (`apps.connections.open`, the WebSocket handshake
/// and Slack's `hello`), each.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// A connection silent this long is pinged; silent twice as long, it is given up.
const IDLE: Duration = Duration::from_secs(30);

/// The largest frame antler reads: envelopes are Events API bodies and slash commands, far
/// below this.
const MAX_FRAME_BYTES: usize = 4 << 20;

/// The most `apps.connections.open` may answer: a URL and a few fields.
const MAX_OPEN_BYTES: usize = 64 << 10;

/// How long sending an acknowledgement or closing may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a Socket Mode connection could not be opened or ended. Never names the app token or the
/// connection URL (it carries a ticket).
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// The configured token is not an app-level token.
    #[error("channels.slack.app_token is not an app-level token (xapp-…)")]
    NotAppToken,
    /// `apps.connections.open` answered `ok: false` (`invalid_auth`, `not_allowed_token_type`…).
    #[error("Slack answered {0} to apps.connections.open (channels.slack.app_token)")]
    Refused(String),
    /// The API or the WebSocket could not be reached, or answered something else.
    #[error("{0}")]
    Transport(String),
    /// The connection closed, or fell silent.
    #[error("the connection ended: {0}")]
    Ended(String),
}

/// What a connection received that antler must act on.
#[derive(Debug)]
pub enum Frame {
    /// An envelope to answer with [`SocketConnection::ack`].
    Envelope(Envelope),
    /// Slack asks for a new connection (`refresh_requested`, `link_disabled`, `warning`…).
    Disconnect(String),
}

/// One Socket Mode envelope.
#[derive(Debug, Deserialize)]
pub struct Envelope {
    /// What the acknowledgement names.
    pub envelope_id: String,
    /// `events_api`, `slash_commands` or `interactive`.
    #[serde(rename = "type", default)]
    pub kind: String,
    /// The Events API body, or the slash command's form fields as JSON.
    #[serde(default)]
    pub payload: serde_json::Value,
    /// Whether the acknowledgement may carry a `payload` (a slash command's answer).
    #[serde(default)]
    pub accepts_response_payload: bool,
    /// 0 the first time, then 1, 2, 3 for Slack's retries.
    #[serde(default)]
    pub retry_attempt: u32,
}

/// Opens Socket Mode connections with an app-level token.
pub struct SlackSocket {
    app_token: String,
    open_url: String,
    http: reqwest::Client,
}

impl std::fmt::Debug for SlackSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlackSocket")
            .field("app_token", &"***")
            .field("open_url", &self.open_url)
            .finish_non_exhaustive()
    }
}

impl SlackSocket {
    /// Connections for the app token `app_token` (`xapp-…`), opened through the Web API at
    /// `api_url`.
    pub fn new(app_token: &str, api_url: &str) -> Result<Self, SocketError> {
        if !app_token.starts_with("xapp-") {
            return Err(SocketError::NotAppToken);
        }
        let http = reqwest::Client::builder()
            .timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(|e| SocketError::Transport(format!("no HTTP client: {e}")))?;
        Ok(Self {
            app_token: app_token.to_owned(),
            open_url: format!("{}/apps.connections.open", api_url.trim_end_matches('/')),
            http,
        })
    }

    /// `apps.connections.open`: the URL of a new connection, valid for one use. `antler
    /// doctor` checks the token with it (without connecting).
    pub async fn open(&self) -> Result<String, SocketError> {
        #[derive(Deserialize)]
        struct Opened {
            ok: bool,
            error: Option<String>,
            url: Option<String>,
        }
        let mut response = self
            .http
            .post(&self.open_url)
            .bearer_auth(&self.app_token)
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .send()
            .await
            .map_err(|e| {
                SocketError::Transport(format!("apps.connections.open failed: {}", e.without_url()))
            })?;
        let status = response.status();
        if !status.is_success() {
            return Err(SocketError::Transport(format!(
                "Slack answered HTTP {status} to apps.connections.open"
            )));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| {
            SocketError::Transport(format!("apps.connections.open failed: {}", e.without_url()))
        })? {
            if body.len() + chunk.len() > MAX_OPEN_BYTES {
                return Err(SocketError::Transport(format!(
                    "apps.connections.open answered more than {MAX_OPEN_BYTES} bytes"
                )));
            }
            body.extend_from_slice(&chunk);
        }
        // serde's message may quote the body (the URL's ticket): only where it broke is kept.
        let opened: Opened = serde_json::from_slice(&body).map_err(|e| {
            SocketError::Transport(format!(
                "apps.connections.open answered something that is not its JSON ({:?} error at \
                 line {} column {})",
                e.classify(),
                e.line(),
                e.column()
            ))
        })?;
        match opened {
            Opened {
                ok: true,
                url: Some(url),
                ..
            } => Ok(url),
            Opened { error, .. } => Err(SocketError::Refused(
                self.mask(error.as_deref().unwrap_or("no url")),
            )),
        }
    }

    /// Opens a connection and waits for Slack's `hello`.
    pub async fn connect(&self) -> Result<SocketConnection, SocketError> {
        let url = self.open().await?;
        let config = WebSocketConfig::default()
            .max_message_size(Some(MAX_FRAME_BYTES))
            .max_frame_size(Some(MAX_FRAME_BYTES));
        let connecting =
            tokio_tungstenite::connect_async_with_config(url.as_str(), Some(config), false);
        let (ws, _) = tokio::time::timeout(CONNECT_TIMEOUT, connecting)
            .await
            .map_err(|_| SocketError::Transport("the WebSocket handshake timed out".to_owned()))?
            // tungstenite's errors do not name the URL.
            .map_err(|e| SocketError::Transport(format!("the WebSocket handshake failed: {e}")))?;
        let mut connection = SocketConnection { ws };
        let hello = tokio::time::timeout(CONNECT_TIMEOUT, connection.read_json())
            .await
            .map_err(|_| SocketError::Ended("no hello from Slack".to_owned()))??;
        match hello.get("type").and_then(serde_json::Value::as_str) {
            Some("hello") => Ok(connection),
            other => Err(SocketError::Ended(format!(
                "the first frame was {other:?}, not hello"
            ))),
        }
    }

    fn mask(&self, text: &str) -> String {
        antler_channel::mask_secrets(text, &[self.app_token.as_str()])
    }
}

/// One open Socket Mode connection.
pub struct SocketConnection {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

impl std::fmt::Debug for SocketConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SocketConnection").finish_non_exhaustive()
    }
}

impl SocketConnection {
    /// The next envelope or request to reconnect; anything else Slack sends is skipped.
    pub async fn next(&mut self) -> Result<Frame, SocketError> {
        loop {
            let frame = self.read_json().await?;
            match frame.get("type").and_then(serde_json::Value::as_str) {
                Some("disconnect") => {
                    let reason = frame
                        .get("reason")
                        .and_then(serde_json::Value::as_str)
                        .unwrap_or("unknown");
                    return Ok(Frame::Disconnect(reason.to_owned()));
                }
                Some("hello") => {}
                _ if frame.get("envelope_id").is_some() => match serde_json::from_value(frame) {
                    Ok(envelope) => return Ok(Frame::Envelope(envelope)),
                    Err(e) => tracing::warn!(error = %e, "an unreadable Socket Mode envelope"),
                },
                kind => tracing::debug!(?kind, "a Socket Mode frame antler does not use"),
            }
        }
    }

    /// Acknowledges `envelope_id`, with the immediate answer `payload` when there is one.
    pub async fn ack(
        &mut self,
        envelope_id: &str,
        payload: Option<serde_json::Value>,
    ) -> Result<(), SocketError> {
        let mut ack = serde_json::json!({ "envelope_id": envelope_id });
        if let Some(payload) = payload {
            ack["payload"] = payload;
        }
        let sending = self.ws.send(Message::text(ack.to_string()));
        tokio::time::timeout(SEND_TIMEOUT, sending)
            .await
            .map_err(|_| SocketError::Ended("an acknowledgement timed out".to_owned()))?
            .map_err(|e| SocketError::Ended(e.to_string()))
    }

    /// Closes the connection (briefly; a peer that does not answer is left).
    pub async fn close(mut self) {
        let _ = tokio::time::timeout(SEND_TIMEOUT, self.ws.close(None)).await;
    }

    /// The next text frame as JSON. Pings are answered by tungstenite as it reads; a silent
    /// connection is pinged, and given up when still silent.
    async fn read_json(&mut self) -> Result<serde_json::Value, SocketError> {
        let mut pinged = false;
        loop {
            let message = match tokio::time::timeout(IDLE, self.ws.next()).await {
                Ok(Some(Ok(message))) => message,
                Ok(Some(Err(e))) => return Err(SocketError::Ended(e.to_string())),
                Ok(None) => return Err(SocketError::Ended("closed".to_owned())),
                Err(_) if pinged => return Err(SocketError::Ended("silent".to_owned())),
                Err(_) => {
                    pinged = true;
                    let ping = self.ws.send(Message::Ping(Vec::new().into()));
                    match tokio::time::timeout(SEND_TIMEOUT, ping).await {
                        Ok(Ok(())) => continue,
                        Ok(Err(e)) => return Err(SocketError::Ended(e.to_string())),
                        Err(_) => return Err(SocketError::Ended("a ping timed out".to_owned())),
                    }
                }
            };
            pinged = false;
            match message {
                Message::Text(text) => match serde_json::from_str(text.as_str()) {
                    Ok(json) => return Ok(json),
                    Err(e) => tracing::warn!(error = %e, "a Socket Mode frame that is not JSON"),
                },
                Message::Close(frame) => {
                    return Err(SocketError::Ended(format!(
                        "closed by Slack: {}",
                        frame.map_or_else(String::new, |f| f.reason.to_string())
                    )));
                }
                Message::Binary(_) | Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use antler_testkit::slack::{APP_TOKEN, MockSlack, MockSocket};
    use serde_json::json;

    use super::*;

    #[tokio::test]
    async fn a_connection_reads_envelopes_acknowledges_them_and_hears_disconnect() {
        let api = MockSlack::start().await;
        let socket = MockSocket::start().await;
        api.serve_socket(&socket).await;
        let client = SlackSocket::new(APP_TOKEN, &api.api_url()).unwrap();
        assert!(!format!("{client:?}").contains(APP_TOKEN));
        let mut connection = client.connect().await.unwrap();
        socket.wait_for_connections(1).await;

        socket.send_envelope("e1", "slash_commands", json!({"text": "hi"}), 2);
        let Frame::Envelope(envelope) = connection.next().await.unwrap() else {
            panic!("an envelope")
        };
        assert_eq!(envelope.envelope_id, "e1");
        assert_eq!(envelope.kind, "slash_commands");
        assert_eq!(envelope.retry_attempt, 2);
        assert!(envelope.accepts_response_payload);
        assert_eq!(envelope.payload, json!({"text": "hi"}));
        connection
            .ack("e1", Some(json!({"text": "ok"})))
            .await
            .unwrap();
        connection.ack("e2", None).await.unwrap();
        assert_eq!(
            socket.wait_for_acks("e1", 1).await,
            [json!({"envelope_id": "e1", "payload": {"text": "ok"}})]
        );
        assert_eq!(
            socket.wait_for_acks("e2", 1).await,
            [json!({"envelope_id": "e2"})]
        );

        socket.disconnect("refresh_requested");
        let frame = connection.next().await.unwrap();
        assert!(
            matches!(&frame, Frame::Disconnect(reason) if reason == "refresh_requested"),
            "{frame:?}"
        );
        connection.close().await;
    }

    #[tokio::test]
    async fn a_refused_token_names_slacks_code_and_never_the_token() {
        let api = MockSlack::start().await;
        let socket = MockSocket::start().await;
        api.serve_socket(&socket).await;
        let wrong = "xapp-1-A1-2-REVOKED";
        let error = SlackSocket::new(wrong, &api.api_url())
            .unwrap()
            .open()
            .await
            .unwrap_err();
        assert!(
            matches!(&error, SocketError::Refused(code) if code == "invalid_auth"),
            "{error:?}"
        );
        let text = error.to_string();
        assert!(text.contains("channels.slack.app_token"), "{text}");
        assert!(!text.contains("REVOKED"), "{text}");
        assert!(matches!(
            SlackSocket::new("xoxb-1-2", &api.api_url()),
            Err(SocketError::NotAppToken)
        ));
        // Nothing listens there.
        let error = SlackSocket::new(APP_TOKEN, "http://127.0.0.1:9/api")
            .unwrap()
            .connect()
            .await
            .unwrap_err();
        assert!(matches!(error, SocketError::Transport(_)), "{error:?}");
        assert_eq!(socket.connections(), 0);
    }
}
