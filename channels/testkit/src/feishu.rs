//! Feishu / Lark: event encryption and signatures, and a mock Open Platform.
//!
//! With an Encrypt Key, Feishu sends `{"encrypt": base64(iv || AES-256-CBC(plain))}` (the key is
//! the SHA-256 of the Encrypt Key, PKCS#7 padding) and signs it: `X-Lark-Signature` is the hex
//! SHA-256 of timestamp + nonce + Encrypt Key + body (protocols.md §4.2, §4.3). The Open
//! Platform answers `{"code": 0, "msg": …, "data": …}`; a rate limit is HTTP 429 with
//! `{"code": 99991400, "msg": "request trigger frequency limit"}` and the seconds to wait in
//! `x-ogw-ratelimit-reset` (§4.5).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aes::cipher::{BlockEncryptMut, KeyIvInit, block_padding::Pkcs7};
use base64::Engine;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use wiremock::matchers::{body_json, header, method, path, path_regex};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::Call;
use crate::conformance::{Expect, Fixture, MockApi, Platform, Vector, Written};
use crate::feishu_socket::MockFeishuSocket;

/// The app's id.
pub const APP_ID: &str = "cli_a1b2c3d4e5f60001";
/// The app's secret.
pub const APP_SECRET: &str = "feishu-APP-secret-0001";
/// The Verification Token the fixtures carry.
pub const VERIFICATION_TOKEN: &str = "vTok3nFixture0001";
/// The Encrypt Key the recorded vectors were made with.
pub const ENCRYPT_KEY: &str = "fixture-encrypt-key-0001";
/// The nonce the recorded vectors were signed with.
pub const NONCE: &str = "fixturenonce0001";
/// The tenant access token the mock issues.
pub const TENANT_TOKEN: &str = "t-TENANT-token-0001";
/// The bot's open_id, as the group fixture mentions it.
pub const BOT_OPEN_ID: &str = "ou_b07b07b07b07b07b07b07b07b07b07b0";
/// The sender of the message fixtures.
pub const ADA: &str = "ou_7d8a6e6df7621556ce0d21922b676706";
/// The group mention fixture's message.
pub const GROUP_MESSAGE: &str = "om_dc13264520392913993dd051dba21dcf";
/// The p2p fixture's message.
pub const P2P_MESSAGE: &str = "om_11112222333344445555666677778888";
/// The id the mock gives every message it creates.
pub const REPLY_ID: &str = "om_reply000000000000000000000001";
/// The header with the signing time.
pub const TIMESTAMP_HEADER: &str = "x-lark-request-timestamp";
/// The header with the nonce.
pub const NONCE_HEADER: &str = "x-lark-request-nonce";
/// The header with the signature.
pub const SIGNATURE_HEADER: &str = "x-lark-signature";

/// The recorded payload `name` (with its extension) as JSON.
#[must_use]
pub fn fixture(name: &str) -> Value {
    crate::fixture_json("feishu", name)
}

/// `plain` encrypted as Feishu encrypts an event body: base64 of `iv` and the AES-256-CBC
/// ciphertext under SHA-256(`encrypt_key`).
#[must_use]
pub fn encrypt(plain: &[u8], encrypt_key: &str, iv: [u8; 16]) -> String {
    let key: [u8; 32] = Sha256::digest(encrypt_key.as_bytes()).into();
    let sealed = cbc::Encryptor::<aes::Aes256>::new(&key.into(), &iv.into())
        .encrypt_padded_vec_mut::<Pkcs7>(plain);
    let mut payload = iv.to_vec();
    payload.extend(sealed);
    base64::engine::general_purpose::STANDARD.encode(payload)
}

/// The body Feishu sends for `plain` with `encrypt_key`: `{"encrypt": …}`.
#[must_use]
pub fn sealed_body(plain: &[u8], encrypt_key: &str) -> Vec<u8> {
    json!({"encrypt": encrypt(plain, encrypt_key, *b"testkit-fixed-iv")})
        .to_string()
        .into_bytes()
}

/// `X-Lark-Signature`: hex SHA-256 of timestamp, nonce, Encrypt Key and body, joined.
#[must_use]
pub fn signature(timestamp: &str, nonce: &str, encrypt_key: &str, body: &[u8]) -> String {
    let mut hash = Sha256::new();
    hash.update(timestamp.as_bytes());
    hash.update(nonce.as_bytes());
    hash.update(encrypt_key.as_bytes());
    hash.update(body);
    hex::encode(hash.finalize())
}

/// The three signature headers for `body` signed at `timestamp` with `nonce` and `encrypt_key`.
#[must_use]
pub fn signed_headers(
    encrypt_key: &str,
    timestamp: u64,
    nonce: &str,
    body: &[u8],
) -> http::HeaderMap {
    let timestamp = timestamp.to_string();
    let signature = signature(&timestamp, nonce, encrypt_key, body);
    crate::headers([
        (TIMESTAMP_HEADER, timestamp.as_str()),
        (NONCE_HEADER, nonce),
        (SIGNATURE_HEADER, signature.as_str()),
    ])
}

/// Posts `body` to `<base>/webhooks/feishu/events` with `headers` (and JSON's content type).
pub async fn post_raw(base: &str, body: Vec<u8>, headers: &http::HeaderMap) -> crate::Answered {
    let mut headers = headers.clone();
    headers.insert(
        "content-type",
        "application/json".parse().expect("a header value"),
    );
    crate::post_webhook(
        &reqwest::Client::new(),
        &format!("{base}/webhooks/feishu/events"),
        body,
        &headers,
    )
    .await
}

/// Posts a plain (unencrypted) event to `<base>/webhooks/feishu/events`.
pub async fn post(base: &str, event: &Value) -> reqwest::StatusCode {
    post_raw(
        base,
        event.to_string().into_bytes(),
        &http::HeaderMap::new(),
    )
    .await
    .status
}

/// `event` as another delivery of it: a new event id, everything else the same.
#[must_use]
pub fn resent(event: &Value, event_id: &str) -> Value {
    let mut event = event.clone();
    event["header"]["event_id"] = json!(event_id);
    event
}

/// A message event of `message_type` with `content`, from Ada, in the p2p chat.
#[must_use]
pub fn p2p(message_id: &str, message_type: &str, content: &Value) -> Value {
    let mut event = fixture("feishu_im_p2p_thread_reply.json");
    event["header"]["event_id"] = json!(format!("ev-{message_id}"));
    event["event"]["message"]["message_id"] = json!(message_id);
    event["event"]["message"]["message_type"] = json!(message_type);
    event["event"]["message"]["content"] = json!(content.to_string());
    event
}

/// A `card.action.trigger` callback (schema 2.0, as Feishu's "Card callback communication"
/// page shows it): `open_id` (with `user_id`) pressed the button whose `value` is `value` on
/// the card `message_id` in `chat_id`. `event_id` tells deliveries apart; a redelivery keeps it.
#[must_use]
pub fn card_action(
    event_id: &str,
    value: &Value,
    (open_id, user_id): (&str, &str),
    message_id: &str,
    chat_id: &str,
) -> Value {
    let mut press = fixture("feishu_card_action_trigger.json");
    press["header"]["event_id"] = json!(event_id);
    press["event"]["operator"]["open_id"] = json!(open_id);
    press["event"]["operator"]["user_id"] = json!(user_id);
    press["event"]["action"]["value"] = value.clone();
    press["event"]["context"]["open_message_id"] = json!(message_id);
    press["event"]["context"]["open_chat_id"] = json!(chat_id);
    press
}

/// The buttons of the card a reply or message body carries (its `action` elements'
/// `actions`), in order; none for a text message or a card without them.
#[must_use]
pub fn buttons(body: &Value) -> Vec<Value> {
    let card: Value =
        serde_json::from_str(body["content"].as_str().unwrap_or("null")).unwrap_or(Value::Null);
    card["elements"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["tag"] == "action")
        .flat_map(|e| e["actions"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// The markup a reply or patch body carries: the `content` of its card's markdown element
/// (the card is a JSON string inside the body), or the text of a text message.
#[must_use]
pub fn markup(body: &Value) -> String {
    fn markdown(card: &Value) -> Option<String> {
        match card {
            Value::Object(map) => {
                if map.get("tag").and_then(Value::as_str) == Some("markdown") {
                    return map
                        .get("content")
                        .and_then(Value::as_str)
                        .map(str::to_owned);
                }
                map.values().find_map(markdown)
            }
            Value::Array(items) => items.iter().find_map(markdown),
            _ => None,
        }
    }
    let content: Value =
        serde_json::from_str(body["content"].as_str().unwrap_or("null")).unwrap_or(Value::Null);
    markdown(&content)
        .or_else(|| content["text"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// What a reply or patch body shows: its [`markup`] with HTML entities decoded, as Feishu
/// shows card Markdown (`&#95;` is `_`).
#[must_use]
pub fn shown(body: &Value) -> String {
    decode_entities(&markup(body))
}

/// `text` with its HTML entities decoded.
#[must_use]
pub fn decode_entities(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find('&') {
        out.push_str(&rest[..start]);
        rest = &rest[start..];
        let Some(end) = rest.find(';') else { break };
        let entity = &rest[1..end];
        let decoded = match entity {
            "lt" => Some('<'),
            "gt" => Some('>'),
            "amp" => Some('&'),
            _ => entity
                .strip_prefix('#')
                .and_then(|n| n.parse::<u32>().ok())
                .and_then(char::from_u32),
        };
        match decoded {
            Some(c) => {
                out.push(c);
                rest = &rest[end + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// A mock Open Platform on 127.0.0.1: issues a tenant token, knows the bot, accepts every
/// reply, chat message and card patch, and records every request.
#[derive(Debug)]
pub struct MockFeishu {
    server: MockServer,
    bot_info_down: Arc<AtomicBool>,
}

/// The most a card or post message's request body may be, in bytes: Feishu's "Send message",
/// "Reply" and "Update message card" pages, error 230025: "The length of the message content
/// reaches its limit. 消息体长度超出限制。文本消息请求体最大不能超过150KB;卡片及富文本消息请求体
/// 最大不能超过30KB" (text message request body at most 150 KB; card and rich-text (post) at
/// most 30 KB). Read as KiB, the more lenient reading: antler aims under 30,000 bytes.
pub const CARD_BODY_LIMIT: usize = 30 * 1024;

/// The most a text message's request body may be, in bytes (the same error 230025).
pub const TEXT_BODY_LIMIT: usize = 150 * 1024;

/// A message write (send, reply, card patch) answered with `ok`, unless its request body, as
/// sent, is over Feishu's limit for its `msg_type` (a patch is always a card): then HTTP 400,
/// code 230025, as Feishu answers.
struct Sized(ResponseTemplate);

impl wiremock::Respond for Sized {
    fn respond(&self, request: &wiremock::Request) -> ResponseTemplate {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        let limit = match body["msg_type"].as_str() {
            Some("text") => TEXT_BODY_LIMIT,
            _ => CARD_BODY_LIMIT,
        };
        if request.body.len() > limit {
            return ResponseTemplate::new(400).set_body_json(json!({
                "code": 230025,
                "msg": "The length of the message content reaches its limit."
            }));
        }
        self.0.clone()
    }
}

/// `bot/v3/info`: the bot, or HTTP 503 (an outage) while `down`.
struct BotInfo {
    down: Arc<AtomicBool>,
}

impl wiremock::Respond for BotInfo {
    fn respond(&self, _: &wiremock::Request) -> ResponseTemplate {
        if self.down.load(Ordering::SeqCst) {
            return ResponseTemplate::new(503);
        }
        ResponseTemplate::new(200).set_body_json(json!({
            "code": 0, "msg": "ok",
            "bot": {"activate_status": 2, "app_name": "OpsBot", "open_id": BOT_OPEN_ID}
        }))
    }
}

impl std::ops::Deref for MockFeishu {
    type Target = MockServer;

    fn deref(&self) -> &MockServer {
        &self.server
    }
}

impl MockFeishu {
    /// The Open Platform, issuing [`TENANT_TOKEN`] and accepting everything.
    pub async fn start() -> Self {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/open-apis/auth/v3/tenant_access_token/internal"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                "code": 0, "msg": "ok", "tenant_access_token": TENANT_TOKEN, "expire": 7200
            })))
            .mount(&server)
            .await;
        let bot_info_down = Arc::new(AtomicBool::new(false));
        Mock::given(method("GET"))
            .and(path("/open-apis/bot/v3/info"))
            .respond_with(BotInfo {
                down: Arc::clone(&bot_info_down),
            })
            .mount(&server)
            .await;
        let sent = json!({
            "code": 0, "msg": "success",
            "data": {"message_id": REPLY_ID, "chat_id": "oc_x",
                     "msg_type": "interactive", "create_time": "1767225601000"}
        });
        Mock::given(method("POST"))
            .and(path_regex("^/open-apis/im/v1/messages/[^/]+/reply$"))
            .respond_with(Sized(
                ResponseTemplate::new(200).set_body_json(sent.clone()),
            ))
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path("/open-apis/im/v1/messages"))
            .respond_with(Sized(ResponseTemplate::new(200).set_body_json(sent)))
            .mount(&server)
            .await;
        Mock::given(method("PATCH"))
            .and(path_regex("^/open-apis/im/v1/messages/[^/]+$"))
            .respond_with(Sized(
                ResponseTemplate::new(200).set_body_json(json!({"code": 0, "msg": "success"})),
            ))
            .mount(&server)
            .await;
        Self {
            server,
            bot_info_down,
        }
    }

    /// The `[channels.feishu]` config for this API (plain events, no Encrypt Key), with `more`
    /// lines.
    #[must_use]
    pub fn config(&self, more: &str) -> String {
        format!(
            "[channels.feishu]\nenabled = true\napp_id = \"{APP_ID}\"\napp_secret = \"{APP_SECRET}\"\n\
             verification_token = \"{VERIFICATION_TOKEN}\"\napi_url = \"{}\"\n{}{more}",
            self.server.uri(),
            crate::open_unless_listed(more)
        )
    }

    /// Serves the long connection: `POST /callback/ws/endpoint` with the app's credentials
    /// (`{"AppID", "AppSecret"}`, header `locale: zh`, as the SDKs send them) answers the URL
    /// of a [`MockFeishuSocket`] and `client_config` as its `ClientConfig`, in the shape of the
    /// SDKs' `EndpointResp` (oapi-sdk-go `ws/model.go`):
    /// `{"code": 0, "msg": "ok", "data": {"URL": "wss://…?device_id=…&service_id=…",
    /// "ClientConfig": {"ReconnectCount", "ReconnectInterval", "ReconnectNonce",
    /// "PingInterval"}}}`. Other credentials get no answer that names a URL.
    pub async fn serve_socket(&self, client_config: Value) -> MockFeishuSocket {
        let socket = MockFeishuSocket::start(client_config.clone()).await;
        Mock::given(method("POST"))
            .and(path("/callback/ws/endpoint"))
            .and(header("locale", "zh"))
            .and(body_json(json!({"AppID": APP_ID, "AppSecret": APP_SECRET})))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                "code": 0, "msg": "ok",
                "data": {"URL": socket.url(), "ClientConfig": client_config}
            })))
            .mount(&self.server)
            .await;
        socket
    }

    /// Makes the long connection's endpoint refuse from now on with `code`, as the SDKs'
    /// constants name them (oapi-sdk-go `ws/const.go`: `ExceedConnLimit = 1000040350`, "too
    /// many connections"), HTTP 200 as every Open API error.
    pub async fn refuse_socket_endpoint(&self, code: i64, msg: &str) {
        Mock::given(method("POST"))
            .and(path("/callback/ws/endpoint"))
            .respond_with(
                ResponseTemplate::new(200).set_body_json(json!({"code": code, "msg": msg})),
            )
            .with_priority(1)
            .mount(&self.server)
            .await;
    }

    /// The `[channels.feishu]` config for the long connection: app id and secret only.
    #[must_use]
    pub fn socket_config(&self, more: &str) -> String {
        format!(
            "[channels.feishu]\nenabled = true\nmode = \"websocket\"\napp_id = \"{APP_ID}\"\n\
             app_secret = \"{APP_SECRET}\"\napi_url = \"{}\"\n{}{more}",
            self.server.uri(),
            crate::open_unless_listed(more)
        )
    }

    /// How many times the long connection's endpoint was called.
    pub async fn endpoint_calls(&self) -> usize {
        self.calls("POST", "/callback/ws/endpoint").await.len()
    }

    /// The requests whose method is `http_method` and path ends with `suffix`: (path, body).
    pub async fn calls(&self, http_method: &str, suffix: &str) -> Vec<(String, Value)> {
        crate::calls_of(&self.server)
            .await
            .into_iter()
            .filter(|c| c.method == http_method && c.path.ends_with(suffix))
            .map(|c| (c.path, c.body))
            .collect()
    }

    /// Every reply: (path, body).
    pub async fn replies(&self) -> Vec<(String, Value)> {
        self.calls("POST", "/reply").await
    }

    /// Waits until at least `n` replies were sent; they.
    pub async fn wait_for_replies(&self, n: usize) -> Vec<(String, Value)> {
        crate::wait_for_at_least(&format!("{n} replies sent to Feishu"), n, || self.replies()).await
    }

    /// Makes `bot/v3/info` fail with HTTP 503 (an outage) while `down`.
    pub fn set_bot_info_down(&self, down: bool) {
        self.bot_info_down.store(down, Ordering::SeqCst);
    }

    /// Refuses the next reply or chat message as Feishu refuses the sixth message a second to
    /// one chat: HTTP 400, code 230020. The "Send message" and "Update message card" pages list
    /// it: "400 | 230020 | This operation triggers the frequency limit. | 当前操作触发限频,请降低
    /// 请求频率" (the operation triggers the frequency limit, lower the request rate), under
    /// "向同一群组发送消息的限频为群内机器人共享 5 QPS" (5 QPS per group, shared by its bots).
    /// No `x-ogw-ratelimit-*` headers: this limit is the message service's, not the gateway's.
    pub async fn chat_rate_limit_next_message(&self) {
        Mock::given(method("POST"))
            .and(path_regex(r"^/open-apis/im/v1/messages(/[^/]+/reply)?$"))
            .respond_with(ResponseTemplate::new(400).set_body_json(
                json!({"code": 230020, "msg": "This operation triggers the frequency limit."}),
            ))
            .up_to_n_times(1)
            .with_priority(1)
            .mount(&self.server)
            .await;
    }

    /// Refuses the next reply or chat message as Feishu does: HTTP 429, `x-ogw-ratelimit-reset`
    /// in seconds, code 99991400 (protocols.md §4.5).
    pub async fn rate_limit_next_message(&self, retry_after_secs: u64) {
        Mock::given(method("POST"))
            .and(path_regex(r"^/open-apis/im/v1/messages(/[^/]+/reply)?$"))
            .respond_with(
                ResponseTemplate::new(429)
                    .insert_header("x-ogw-ratelimit-limit", "5")
                    .insert_header(
                        "x-ogw-ratelimit-reset",
                        retry_after_secs.to_string().as_str(),
                    )
                    .set_body_json(
                        json!({"code": 99991400, "msg": "request trigger frequency limit"}),
                    ),
            )
            .up_to_n_times(1)
            .with_priority(1)
            .mount(&self.server)
            .await;
    }
}

#[async_trait::async_trait]
impl MockApi for MockFeishu {
    async fn start() -> Self {
        Self::start().await
    }

    fn server(&self) -> &MockServer {
        &self.server
    }

    /// Replies, chat messages and card patches.
    fn written_by(call: &Call) -> Option<Written> {
        let message = call.path.starts_with("/open-apis/im/v1/messages") && call.method != "GET";
        message.then(|| Written {
            edit: call.method == "PATCH",
            text: markup(&call.body),
        })
    }

    fn message_id(&self) -> String {
        REPLY_ID.to_owned()
    }

    async fn rate_limit_next_message(&self, retry_after_secs: u64) {
        Self::rate_limit_next_message(self, retry_after_secs).await;
    }
}

/// Feishu's protocol facts for the conformance list, with an Encrypt Key set (every event
/// encrypted and signed: the mode with most to check).
#[derive(Debug)]
pub struct Feishu;

impl Platform for Feishu {
    type Mock = MockFeishu;

    const NAME: &'static str = "feishu";

    /// Feishu documents no window and retries for hours: a signed request of any age is
    /// Feishu's (replays are deduplicated).
    const REPLAY_WINDOW: Option<Duration> = None;

    fn seal(plain: &[u8]) -> Vec<u8> {
        sealed_body(plain, ENCRYPT_KEY)
    }

    fn sign(body: &[u8], at_secs: u64) -> http::HeaderMap {
        signed_headers(ENCRYPT_KEY, at_secs, NONCE, body)
    }

    fn vectors() -> Vec<Vector> {
        ["feishu_im_group_mention", "feishu_url_verification"]
            .into_iter()
            .map(|name| {
                let meta = fixture(&format!("{name}.encrypted.meta.json"));
                assert_eq!(meta["encrypt_key"], ENCRYPT_KEY);
                let header = |h: &str| meta["headers"][h].as_str().unwrap_or_default().to_owned();
                Vector {
                    name,
                    body: crate::fixture_bytes("feishu", &format!("{name}.encrypted.json")),
                    headers: crate::headers([
                        (
                            TIMESTAMP_HEADER,
                            header("X-Lark-Request-Timestamp").as_str(),
                        ),
                        (NONCE_HEADER, header("X-Lark-Request-Nonce").as_str()),
                        (SIGNATURE_HEADER, header("X-Lark-Signature").as_str()),
                    ]),
                }
            })
            .collect()
    }

    fn fixtures() -> Vec<Fixture> {
        let event = |name, expect| Fixture {
            route: "events",
            name,
            expect,
        };
        vec![
            event(
                "feishu_url_verification.json",
                Expect::Reply(json!({"challenge": "ajls384kdj1234"})),
            ),
            event("feishu_im_group_mention.json", Expect::Events(1)),
            event("feishu_im_p2p_thread_reply.json", Expect::Events(1)),
        ]
    }

    fn answered() -> Fixture {
        Fixture {
            route: "events",
            name: "feishu_im_group_mention.json",
            expect: Expect::Events(1),
        }
    }
}
