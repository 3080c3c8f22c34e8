//! Slack: v0 request signing and a mock Web API.
//!
//! Every request Slack sends is signed `v0=HMAC-SHA256(signing secret, "v0:{ts}:{body}")` in
//! `X-Slack-Signature`, with the Unix time in `X-Slack-Request-Timestamp`; a request older than
//! five minutes is to be refused (protocols.md §2.1). The Web API answers HTTP 200 with
//! `{"ok": true, …}` or `{"ok": false, "error": "<code>"}`.
//!
//! A slash command's `response_url` takes a JSON message (`text`, `response_type`
//! `ephemeral`|`in_channel`, `replace_original`) and answers HTTP 200 `ok` in plain text. Slack:
//! "You can use a `response_url` up to five times within 30 minutes" (Handling user
//! interaction); past that it answers HTTP 404 with the text `used_url`, and once expired
//! `expired_url`.
//!
//! A button press comes to the Interactivity Request URL as a form with one field, `payload`,
//! holding the interaction's JSON (`type: "block_actions"`), signed like events ("Handling
//! user interaction"). The mock Web API answers `chat.postEphemeral` as Slack documents it:
//! `{"ok": true, "message_ts": "…"}`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use wiremock::matchers::{body_partial_json, method, path, path_regex};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::Call;
use crate::conformance::{Expect, Fixture, MockApi, Platform, Vector, Written};

/// The bot token.
pub const TOKEN: &str = "xoxb-0000-TEST-token";
/// The signing secret the recorded vectors were signed with.
pub const SIGNING_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
/// The workspace of the fixtures.
pub const TEAM: &str = "T0OPS00001";
/// The bot's user id, as `auth.test` tells it.
pub const BOT_USER: &str = "U0BOT00001";
/// The channel of the fixtures.
pub const CHANNEL: &str = "C0SRE00001";
/// The thread the mention fixture was written in.
pub const THREAD: &str = "1767225500.000100";
/// The path of the mock's `response_url`, as in the slash-command fixture.
pub const RESPONSE_PATH: &str = "/commands/T0OPS00001/8001/xYz123";
/// How many answers a `response_url` takes.
pub const RESPONSE_URL_USES: u64 = 5;
/// The DM channel `conversations.open` opens with any user.
pub const DM: &str = "D0ADA00001";
/// The ts the mock Web API gives every message it posts.
pub const POSTED_TS: &str = "1767229999.000900";
/// The user who writes the fixtures' messages.
pub const REQUESTER: &str = "U0ADA00001";
/// The user who presses the button in the `block_actions` fixture.
pub const PRESSER: &str = "U0GRC00001";
/// The ts `chat.postEphemeral` answers with.
pub const EPHEMERAL_TS: &str = "1767229999.000950";
/// The header with the signing time.
pub const TIMESTAMP_HEADER: &str = "x-slack-request-timestamp";
/// The header with the signature.
pub const SIGNATURE_HEADER: &str = "x-slack-signature";

/// The recorded payload `name` (with its extension).
#[must_use]
pub fn fixture(name: &str) -> String {
    crate::fixture_text("slack", name)
}

/// `v0=<hex>`: the signature of `body` at `timestamp` under `secret`.
#[must_use]
pub fn signature(secret: &str, timestamp: &str, body: &[u8]) -> String {
    let mac = antler_channel::verify::hmac_sha256_hex(
        secret.as_bytes(),
        &[b"v0:", timestamp.as_bytes(), b":", body],
    );
    format!("v0={mac}")
}

/// The two signature headers for `body` signed at `timestamp` with `secret`.
#[must_use]
pub fn signed_headers(secret: &str, timestamp: u64, body: &[u8]) -> http::HeaderMap {
    let timestamp = timestamp.to_string();
    crate::headers([
        (TIMESTAMP_HEADER, timestamp.as_str()),
        (
            SIGNATURE_HEADER,
            signature(secret, &timestamp, body).as_str(),
        ),
    ])
}

/// Posts `body` to `<base>/webhooks/slack/<route>` signed with `secret` at `timestamp`, as Slack
/// does (a form for `commands` and `interactions`, JSON otherwise); `retry` adds
/// `X-Slack-Retry-Num`.
pub async fn post_signed(
    base: &str,
    route: &str,
    body: &str,
    secret: &str,
    timestamp: u64,
    retry: Option<u32>,
) -> (reqwest::StatusCode, String) {
    let mut headers = signed_headers(secret, timestamp, body.as_bytes());
    let content_type = if route == "commands" || route == "interactions" {
        "application/x-www-form-urlencoded"
    } else {
        "application/json"
    };
    headers.insert(
        "content-type",
        content_type.parse().expect("a header value"),
    );
    if let Some(retry) = retry {
        headers.insert("x-slack-retry-num", retry.into());
        headers.insert(
            "x-slack-retry-reason",
            "http_timeout".parse().expect("a header value"),
        );
    }
    let answered = crate::post_webhook(
        &reqwest::Client::new(),
        &format!("{base}/webhooks/slack/{route}"),
        body.to_owned(),
        &headers,
    )
    .await;
    (answered.status, answered.text)
}

/// Posts an Events API `body` to `<base>/webhooks/slack/events`, signed now.
pub async fn post_event(base: &str, body: &str) -> reqwest::StatusCode {
    post_signed(
        base,
        "events",
        body,
        SIGNING_SECRET,
        crate::now_secs(),
        None,
    )
    .await
    .0
}

/// A `block_actions` payload (the recorded fixture): `user` pressed the button `action` on
/// the bot's message `message_ts` in [`CHANNEL`], in the thread `thread_ts` when given.
#[must_use]
pub fn block_actions(user: &str, action: &str, message_ts: &str, thread_ts: Option<&str>) -> Value {
    let mut payload: Value =
        serde_json::from_str(&fixture("slack_block_actions.json")).expect("the fixture is JSON");
    payload["user"]["id"] = json!(user);
    payload["container"]["message_ts"] = json!(message_ts);
    payload["message"]["ts"] = json!(message_ts);
    payload["actions"][0]["action_id"] = json!(action);
    payload["actions"][0]["value"] = json!(action);
    for place in ["container", "message"] {
        let object = payload[place].as_object_mut().expect("an object");
        match thread_ts {
            Some(ts) => object.insert("thread_ts".to_owned(), json!(ts)),
            None => object.remove("thread_ts"),
        };
    }
    payload
}

/// An interaction's request body as Slack sends it: `payload=<the JSON, form-encoded>`.
#[must_use]
pub fn interaction_form(payload: &Value) -> String {
    format!("payload={}", url_encode(&payload.to_string()))
}

/// Posts the interaction `payload` to `<base>/webhooks/slack/interactions`, signed now.
pub async fn post_interaction(base: &str, payload: &Value) -> (reqwest::StatusCode, String) {
    post_signed(
        base,
        "interactions",
        &interaction_form(payload),
        SIGNING_SECRET,
        crate::now_secs(),
        None,
    )
    .await
}

/// A message event in [`CHANNEL`] from a person, as Slack sends it for `message.channels`.
#[must_use]
pub fn channel_message(ts: &str, thread_ts: Option<&str>, text: &str, event_id: &str) -> String {
    let mut event = json!({
        "type": "message", "user": "U0ADA00001", "text": text, "ts": ts,
        "team": TEAM, "channel": CHANNEL, "event_ts": ts, "channel_type": "channel"
    });
    if let Some(thread_ts) = thread_ts {
        event["thread_ts"] = json!(thread_ts);
    }
    json!({
        "token": "x", "team_id": TEAM, "api_app_id": "A0OPSBOT001",
        "event": event, "type": "event_callback", "event_id": event_id,
        "event_time": 1767225600,
        "authorizations": [{"enterprise_id": null, "team_id": TEAM,
                            "user_id": BOT_USER, "is_bot": true,
                            "is_enterprise_install": false}]
    })
    .to_string()
}

/// `text` percent-encoded for a form.
fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            b' ' => "+".to_owned(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A post in [`CHANNEL`] by a classic bot or an incoming webhook, as Slack sends it
/// (`message` with `subtype: bot_message`, "A message was posted by an integration"): a
/// `bot_id`, the webhook's `app_id` when it has one, a `username`, and no `user`.
#[must_use]
pub fn bot_message(
    ts: &str,
    text: &str,
    bot_id: &str,
    app_id: Option<&str>,
    event_id: &str,
) -> String {
    let mut event = json!({
        "type": "message", "subtype": "bot_message", "text": text, "ts": ts,
        "bot_id": bot_id, "username": "jenkins", "team": TEAM, "channel": CHANNEL,
        "event_ts": ts, "channel_type": "channel"
    });
    if let Some(app_id) = app_id {
        event["app_id"] = json!(app_id);
    }
    json!({
        "token": "x", "team_id": TEAM, "api_app_id": "A0OPSBOT001",
        "event": event, "type": "event_callback", "event_id": event_id,
        "event_time": 1767225600,
        "authorizations": [{"enterprise_id": null, "team_id": TEAM,
                            "user_id": BOT_USER, "is_bot": true,
                            "is_enterprise_install": false}]
    })
    .to_string()
}

/// A mock Web API on 127.0.0.1 (`<uri>/api/<method>`): knows the bot (`auth.test`), accepts
/// every post, ephemeral post, update and reaction, opens a DM with anyone, serves slash commands'
/// `response_url`s (`<uri>/commands/…`) as Slack does, and records every request.
#[derive(Debug)]
pub struct MockSlack {
    server: MockServer,
    auth_test_down: Arc<AtomicBool>,
}

/// `auth.test`: the bot, or while `down` the Web API's answer when Slack cannot serve it
/// (HTTP 200, `{"ok": false, "error": "service_unavailable"}`; Slack's method docs list
/// `service_unavailable`, "The service is temporarily unavailable", among the errors every
/// method may return).
struct AuthTest {
    down: Arc<AtomicBool>,
}

impl wiremock::Respond for AuthTest {
    fn respond(&self, _: &wiremock::Request) -> ResponseTemplate {
        if self.down.load(Ordering::SeqCst) {
            return ResponseTemplate::new(200)
                .set_body_json(json!({"ok": false, "error": "service_unavailable"}));
        }
        ResponseTemplate::new(200).set_body_json(json!({
            "ok": true, "url": "https://acme-ops.slack.com/", "team": "Acme Ops",
            "user": "opsbot", "team_id": TEAM, "user_id": BOT_USER,
            "bot_id": "B0BOT00001", "is_enterprise_install": false
        }))
    }
}

impl std::ops::Deref for MockSlack {
    type Target = MockServer;

    fn deref(&self) -> &MockServer {
        &self.server
    }
}

impl MockSlack {
    /// The Web API, knowing the bot and accepting everything.
    pub async fn start() -> Self {
        let server = MockServer::start().await;
        // Slack takes GET or POST for auth.test; slack-morphism asks with GET.
        let auth_test_down = Arc::new(AtomicBool::new(false));
        Mock::given(path("/api/auth.test"))
            .respond_with(AuthTest {
                down: Arc::clone(&auth_test_down),
            })
            .mount(&server)
            .await;
        for method_name in ["reactions.add", "reactions.remove"] {
            Mock::given(method("POST"))
                .and(path(format!("/api/{method_name}")))
                .respond_with(ResponseTemplate::new(200).set_body_json(json!({"ok": true})))
                .mount(&server)
                .await;
        }
        for method_name in ["chat.postMessage", "chat.update"] {
            Mock::given(method("POST"))
                .and(path(format!("/api/{method_name}")))
                .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                    "ok": true, "channel": CHANNEL, "ts": POSTED_TS,
                    "text": "ok",
                    "message": {"type": "message", "text": "ok", "user": BOT_USER,
                                "bot_id": "B0BOT00001", "ts": POSTED_TS}
                })))
                .mount(&server)
                .await;
        }
        // chat.postEphemeral: "Ephemeral message delivery is not guaranteed"; the answer
        // names the message: `{"ok": true, "message_ts": "1502210682.580145"}`.
        Mock::given(method("POST"))
            .and(path("/api/chat.postEphemeral"))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(json!({"ok": true, "message_ts": EPHEMERAL_TS})),
            )
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path("/api/conversations.open"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                "ok": true, "channel": {"id": DM}
            })))
            .mount(&server)
            .await;
        // A response_url: 5 answers, then `used_url`.
        Mock::given(method("POST"))
            .and(path_regex("^/commands/"))
            .respond_with(ResponseTemplate::new(200).set_body_string("ok"))
            .up_to_n_times(RESPONSE_URL_USES)
            .with_priority(4)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path_regex("^/commands/"))
            .respond_with(ResponseTemplate::new(404).set_body_string("used_url"))
            .mount(&server)
            .await;
        Self {
            server,
            auth_test_down,
        }
    }

    /// Makes `auth.test` fail with `service_unavailable` while `down`.
    pub fn set_auth_test_down(&self, down: bool) {
        self.auth_test_down.store(down, Ordering::SeqCst);
    }

    /// The `response_url` of a slash command, on this mock.
    #[must_use]
    pub fn response_url(&self) -> String {
        format!("{}{RESPONSE_PATH}", self.server.uri())
    }

    /// The slash-command fixture with its `response_url` on this mock and `text`.
    #[must_use]
    pub fn slash_command(&self, text: &str) -> String {
        let form = fixture("slack_slash_command.form");
        let url: String = url_encode(&self.response_url());
        form.trim()
            .replace(
                "https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT0OPS00001%2F8001%2FxYz123",
                &url,
            )
            .replace(
                "text=status+payments-api",
                &format!("text={}", url_encode(text)),
            )
    }

    /// The bodies posted to the `response_url`, in order.
    pub async fn responses(&self) -> Vec<Value> {
        crate::calls_of(&self.server)
            .await
            .into_iter()
            .filter(|c| c.path.starts_with("/commands/"))
            .map(|c| c.body)
            .collect()
    }

    /// From now on the `response_url` answers as Slack does 30 minutes after the command:
    /// HTTP 404 `expired_url`.
    pub async fn expire_response_urls(&self) {
        Mock::given(method("POST"))
            .and(path_regex("^/commands/"))
            .respond_with(ResponseTemplate::new(404).set_body_string("expired_url"))
            .with_priority(1)
            .mount(&self.server)
            .await;
    }

    /// From now on `chat.postMessage` to `channel` fails with the Web API error `code`
    /// (`not_in_channel` when the bot is not a member, `channel_not_found` for a private
    /// channel it cannot see).
    pub async fn refuse_posts_in(&self, channel: &str, code: &str) {
        Mock::given(method("POST"))
            .and(path("/api/chat.postMessage"))
            .and(body_partial_json(json!({"channel": channel})))
            .respond_with(
                ResponseTemplate::new(200).set_body_json(json!({"ok": false, "error": code})),
            )
            .with_priority(1)
            .mount(&self.server)
            .await;
    }

    /// The Web API's base URL (`<uri>/api`).
    #[must_use]
    pub fn api_url(&self) -> String {
        format!("{}/api", self.server.uri())
    }

    /// The `[channels.slack]` config for this API, with `more` lines.
    #[must_use]
    pub fn config(&self, more: &str) -> String {
        format!(
            "[channels.slack]\nenabled = true\nbot_token = \"{TOKEN}\"\n\
             signing_secret = \"{SIGNING_SECRET}\"\napi_url = \"{}\"\n{}{more}",
            self.api_url(),
            crate::open_unless_listed(more)
        )
    }

    /// The users each `conversations.open` asked for (its form's `users`), in order.
    pub async fn dms_opened(&self) -> Vec<String> {
        crate::calls_of(&self.server)
            .await
            .into_iter()
            .filter(|c| c.path.ends_with("/conversations.open"))
            .map(|c| {
                // Slack ids need no decoding: letters and digits.
                String::from_utf8_lossy(&c.raw)
                    .split('&')
                    .find_map(|pair| pair.strip_prefix("users="))
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect()
    }

    /// The bodies of every call of `method_name` (`chat.postMessage`…), in order.
    pub async fn calls(&self, method_name: &str) -> Vec<Value> {
        crate::bodies_of(&self.server, method_name).await
    }

    /// The bodies of every `chat.postMessage`, in order.
    pub async fn posted(&self) -> Vec<Value> {
        self.calls("chat.postMessage").await
    }

    /// The bodies of every `chat.update`, in order.
    pub async fn updates(&self) -> Vec<Value> {
        self.calls("chat.update").await
    }

    /// The bodies of every `chat.postEphemeral`, in order.
    pub async fn ephemerals(&self) -> Vec<Value> {
        self.calls("chat.postEphemeral").await
    }

    /// Waits until at least `n` ephemeral messages were posted; their bodies.
    pub async fn wait_for_ephemerals(&self, n: usize) -> Vec<Value> {
        crate::wait_for_at_least(&format!("{n} ephemeral messages"), n, || self.ephemerals()).await
    }

    /// Waits until at least `n` messages were posted; their bodies.
    pub async fn wait_for_posts(&self, n: usize) -> Vec<Value> {
        crate::wait_for_at_least(&format!("{n} messages posted to Slack"), n, || {
            self.posted()
        })
        .await
    }

    /// The reactions added and removed, in order: `(method, emoji)`, each checked to be on
    /// the message `ts` in `channel`.
    pub async fn reactions(&self, channel: &str, ts: &str) -> Vec<(String, String)> {
        crate::calls_of(&self.server)
            .await
            .into_iter()
            .filter(|c| c.path.contains("/reactions."))
            .map(|c| {
                assert_eq!(c.body["channel"], channel);
                assert_eq!(c.body["timestamp"], ts);
                let method_name = c.path.rsplit('/').next().unwrap_or_default().to_owned();
                (
                    method_name,
                    c.body["name"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }

    /// Refuses the next `chat.postMessage` as Slack does: HTTP 429 with `Retry-After` in
    /// seconds and `{"ok":false,"error":"ratelimited"}` (protocols.md §2.5).
    pub async fn rate_limit_next_post(&self, retry_after_secs: u64) {
        Mock::given(method("POST"))
            .and(path("/api/chat.postMessage"))
            .respond_with(
                ResponseTemplate::new(429)
                    .insert_header("Retry-After", retry_after_secs.to_string().as_str())
                    .set_body_json(json!({"ok": false, "error": "ratelimited"})),
            )
            .up_to_n_times(1)
            .with_priority(1)
            .mount(&self.server)
            .await;
    }
}

#[async_trait::async_trait]
impl MockApi for MockSlack {
    async fn start() -> Self {
        Self::start().await
    }

    fn server(&self) -> &MockServer {
        &self.server
    }

    fn api_url(&self) -> String {
        Self::api_url(self)
    }

    fn written_by(call: &Call) -> Option<Written> {
        Written::by_method(call, "chat.postMessage", "chat.update")
    }

    fn message_id(&self) -> String {
        POSTED_TS.to_owned()
    }

    async fn rate_limit_next_message(&self, retry_after_secs: u64) {
        self.rate_limit_next_post(retry_after_secs).await;
    }
}

/// Slack's protocol facts for the conformance list.
#[derive(Debug)]
pub struct Slack;

impl Platform for Slack {
    type Mock = MockSlack;

    const NAME: &'static str = "slack";

    /// Five minutes (protocols.md §2.1).
    const REPLAY_WINDOW: Option<Duration> = Some(Duration::from_secs(300));

    fn sign(body: &[u8], at_secs: u64) -> http::HeaderMap {
        signed_headers(SIGNING_SECRET, at_secs, body)
    }

    fn vectors() -> Vec<Vector> {
        ["slack_app_mention_thread.json", "slack_slash_command.form"]
            .into_iter()
            .map(|name| {
                let meta = crate::fixture_json("slack", &format!("{name}.meta.json"));
                assert_eq!(meta["signing_secret"], SIGNING_SECRET);
                let header = |h: &str| meta["headers"][h].as_str().unwrap_or_default().to_owned();
                Vector {
                    name,
                    body: crate::fixture_bytes("slack", &format!("{name}.body")),
                    headers: crate::headers([
                        (
                            TIMESTAMP_HEADER,
                            header("X-Slack-Request-Timestamp").as_str(),
                        ),
                        (SIGNATURE_HEADER, header("X-Slack-Signature").as_str()),
                    ]),
                }
            })
            .collect()
    }

    fn fixtures() -> Vec<Fixture> {
        let events = |name, expect| Fixture {
            route: "events",
            name,
            expect,
        };
        vec![
            events("slack_app_mention_thread.json", Expect::Events(1)),
            events("slack_message_im.json", Expect::Events(1)),
            events("slack_message_im_own_bot_echo.json", Expect::Ignore),
            events(
                "slack_url_verification.json",
                Expect::Reply(json!({
                    "challenge": crate::fixture_json("slack", "slack_url_verification.json")["challenge"]
                })),
            ),
            Fixture {
                route: "commands",
                name: "slack_slash_command.form",
                expect: Expect::EventsWithReply(1),
            },
        ]
    }

    fn answered() -> Fixture {
        Fixture {
            route: "events",
            name: "slack_app_mention_thread.json",
            expect: Expect::Events(1),
        }
    }
}

/// The app-level token the socket mock's `apps.connections.open` accepts.
pub const APP_TOKEN: &str = "xapp-1-A0OPSBOT001-1-TEST-app-token";

/// `apps.connections.open` ("Using Socket Mode"): with the app token as Bearer,
/// `{"ok": true, "url": "wss://wss-primary.slack.com/link/?ticket=…&app_id=…"}`, here the
/// `ws://127.0.0.1` URL of a [`MockSocket`]; with any other token Slack's
/// `{"ok": false, "error": "invalid_auth"}` ("Some aspect of authentication cannot be
/// validated", the method's errors). Records when each call came.
struct ConnectionsOpen {
    url: String,
    opened: Arc<std::sync::Mutex<Vec<std::time::Instant>>>,
}

impl wiremock::Respond for ConnectionsOpen {
    fn respond(&self, request: &wiremock::Request) -> ResponseTemplate {
        if let Ok(mut opened) = self.opened.lock() {
            opened.push(std::time::Instant::now());
        }
        let bearer = format!("Bearer {APP_TOKEN}");
        let authorized = request
            .headers
            .get("authorization")
            .is_some_and(|value| value.as_bytes() == bearer.as_bytes());
        if !authorized {
            return ResponseTemplate::new(200)
                .set_body_json(json!({"ok": false, "error": "invalid_auth"}));
        }
        ResponseTemplate::new(200).set_body_json(json!({"ok": true, "url": self.url}))
    }
}

impl MockSlack {
    /// Answers `apps.connections.open` with `socket`'s URL (for [`APP_TOKEN`] only); the
    /// times of the calls, which grows as they come.
    pub async fn serve_socket(
        &self,
        socket: &MockSocket,
    ) -> Arc<std::sync::Mutex<Vec<std::time::Instant>>> {
        let opened = Arc::new(std::sync::Mutex::new(Vec::new()));
        Mock::given(method("POST"))
            .and(path("/api/apps.connections.open"))
            .respond_with(ConnectionsOpen {
                url: socket.url(),
                opened: Arc::clone(&opened),
            })
            .mount(&self.server)
            .await;
        opened
    }

    /// The `[channels.slack]` config for Socket Mode with this API and `app_token` (no signing
    /// secret), with `more` lines.
    #[must_use]
    pub fn socket_config(&self, app_token: &str, more: &str) -> String {
        format!(
            "[channels.slack]\nenabled = true\nmode = \"socket\"\nbot_token = \"{TOKEN}\"\n\
             app_token = \"{app_token}\"\napi_url = \"{}\"\n{}{more}",
            self.api_url(),
            crate::open_unless_listed(more)
        )
    }
}

/// A Socket Mode server on 127.0.0.1 as Slack runs one ("Using Socket Mode"): each connection
/// first gets `{"type": "hello", …}`; the test then sends envelopes
/// (`{"envelope_id", "type", "payload", "accepts_response_payload", "retry_attempt",
/// "retry_reason"}`) or `{"type": "disconnect", "reason"}` on the newest connection, and reads
/// the acknowledgements (`{"envelope_id"[, "payload"]}`) the client sent.
#[derive(Debug, Clone)]
pub struct MockSocket {
    url: String,
    state: Arc<SocketState>,
}

#[derive(Debug, Default)]
struct SocketState {
    /// The newest connection's outgoing frames.
    current: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedSender<String>>>,
    connections: std::sync::atomic::AtomicUsize,
    closed: std::sync::atomic::AtomicUsize,
    /// Every acknowledgement, with the connection (from 1) it came on.
    acks: std::sync::Mutex<Vec<(usize, Value)>>,
}

impl MockSocket {
    /// Listens on 127.0.0.1.
    pub async fn start() -> Self {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::Message as Ws;

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the socket mock");
        let url = format!(
            "ws://{}/link/?ticket=TEST-ticket&app_id=A0OPSBOT001",
            listener.local_addr().expect("its address")
        );
        let state = Arc::new(SocketState::default());
        let shared = Arc::clone(&state);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = Arc::clone(&shared);
                tokio::spawn(async move {
                    let Ok(ws) = tokio_tungstenite::accept_async(stream).await else {
                        return;
                    };
                    let (mut write, mut read) = ws.split();
                    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
                    let hello = json!({
                        "type": "hello", "num_connections": 1,
                        "debug_info": {"host": "applink-mock", "build_number": 1,
                                       "approximate_connection_time": 18060},
                        "connection_info": {"app_id": "A0OPSBOT001"}
                    });
                    if write.send(Ws::Text(hello.to_string())).await.is_err() {
                        return;
                    }
                    let n = {
                        let mut current = state.current.lock().expect("socket state");
                        *current = Some(tx);
                        state.connections.fetch_add(1, Ordering::SeqCst) + 1
                    };
                    let writer = tokio::spawn(async move {
                        while let Some(frame) = rx.recv().await {
                            if write.send(Ws::Text(frame)).await.is_err() {
                                break;
                            }
                        }
                    });
                    while let Some(Ok(frame)) = read.next().await {
                        match frame {
                            Ws::Text(text) => {
                                let ack: Value =
                                    serde_json::from_str(&text).expect("an ack is JSON");
                                state.acks.lock().expect("socket state").push((n, ack));
                            }
                            Ws::Close(_) => break,
                            _ => {}
                        }
                    }
                    writer.abort();
                    state.closed.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        Self { url, state }
    }

    /// The URL `apps.connections.open` hands out.
    #[must_use]
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// How many connections were opened (and greeted).
    #[must_use]
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// How many connections have ended.
    #[must_use]
    pub fn closed(&self) -> usize {
        self.state.closed.load(Ordering::SeqCst)
    }

    /// Waits until `n` connections were opened.
    pub async fn wait_for_connections(&self, n: usize) {
        crate::wait_until(&format!("{n} socket connections"), || async {
            (self.connections() >= n).then_some(())
        })
        .await;
    }

    /// Sends `frame` on the newest connection.
    pub fn send(&self, frame: &Value) {
        let current = self.state.current.lock().expect("socket state");
        let sender = current.as_ref().expect("a connection");
        sender
            .send(frame.to_string())
            .expect("the connection is open");
    }

    /// Sends an envelope of `kind` (`events_api`, `slash_commands`, `interactive`) carrying
    /// `payload`; slash
    /// commands accept a response payload, as Slack sends them.
    pub fn send_envelope(&self, envelope_id: &str, kind: &str, payload: Value, retry_attempt: u32) {
        self.send(&json!({
            "envelope_id": envelope_id,
            "type": kind,
            "payload": payload,
            "accepts_response_payload": kind == "slash_commands",
            "retry_attempt": retry_attempt,
            "retry_reason": if retry_attempt == 0 { "" } else { "timeout" },
        }));
    }

    /// Asks the client for a new connection, as Slack does before it recycles one.
    pub fn disconnect(&self, reason: &str) {
        self.send(&json!({
            "type": "disconnect", "reason": reason,
            "debug_info": {"host": "applink-mock"}
        }));
    }

    /// Every acknowledgement so far, with the connection (from 1) it came on.
    #[must_use]
    pub fn acks(&self) -> Vec<(usize, Value)> {
        self.state.acks.lock().expect("socket state").clone()
    }

    /// Waits for the acknowledgements of `envelope_id`: at least `n` of them.
    pub async fn wait_for_acks(&self, envelope_id: &str, n: usize) -> Vec<Value> {
        crate::wait_until(&format!("{n} acks of {envelope_id}"), || async {
            let acks: Vec<Value> = self
                .acks()
                .into_iter()
                .map(|(_, ack)| ack)
                .filter(|ack| ack["envelope_id"] == envelope_id)
                .collect();
            (acks.len() >= n).then_some(acks)
        })
        .await
    }
}

/// The slash command's form fields as a Socket Mode `slash_commands` payload carries them: a
/// JSON object of the same strings.
#[must_use]
pub fn form_as_json(form: &str) -> Value {
    let fields: Vec<(String, String)> = serde_urlencoded::from_str(form).expect("a form");
    Value::Object(
        fields
            .into_iter()
            .map(|(key, value)| (key, Value::String(value)))
            .collect(),
    )
}
