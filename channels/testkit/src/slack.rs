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
/// does (a form for `commands`, JSON otherwise); `retry` adds `X-Slack-Retry-Num`.
pub async fn post_signed(
    base: &str,
    route: &str,
    body: &str,
    secret: &str,
    timestamp: u64,
    retry: Option<u32>,
) -> (reqwest::StatusCode, String) {
    let mut headers = signed_headers(secret, timestamp, body.as_bytes());
    let content_type = if route == "commands" {
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
/// every post, update and reaction, opens a DM with anyone, serves slash commands'
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
             signing_secret = \"{SIGNING_SECRET}\"\napi_url = \"{}\"\n{more}",
            self.api_url()
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
