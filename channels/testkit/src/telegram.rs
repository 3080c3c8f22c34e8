//! Telegram: the webhook's secret header and a mock Bot API.
//!
//! teloxide posts JSON to `/bot<token>/<Method>` with the method name capitalised
//! (`/bot<token>/SendMessage`). Every answer is `{"ok": true, "result": …}`; a failure is
//! `{"ok": false, "error_code": N, "description": "…", "parameters"?: {…}}` with the same
//! HTTP status (protocols.md §1.3).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use wiremock::matchers::{body_partial_json, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::Call;
use crate::conformance::{Expect, Fixture, MockApi, Platform, Vector, Written};

/// The bot token (`<bot id>:<secret>`).
pub const TOKEN: &str = "7000000001:TEST-token";
/// The webhook secret.
pub const SECRET: &str = "hook-secret_1";
/// The bot's username, as `getMe` tells it (the group fixtures mention it).
pub const USERNAME: &str = "opsbot_bot";
/// The header Telegram sends the webhook secret in (`setWebhook`'s `secret_token`).
pub const SECRET_HEADER: &str = "x-telegram-bot-api-secret-token";
/// The id the mock Bot API gives every message it creates.
pub const MESSAGE_ID: i64 = 700;

/// The recorded update `name` (without `.json`).
#[must_use]
pub fn fixture(name: &str) -> String {
    crate::fixture_text("telegram", &format!("{name}.json"))
}

/// The headers a webhook delivery carries: the secret, which is all Telegram signs with.
#[must_use]
pub fn secret_headers(secret: &str) -> http::HeaderMap {
    crate::headers([
        (SECRET_HEADER, secret),
        ("content-type", "application/json"),
    ])
}

/// Posts `update` to `<base>/webhooks/telegram` as Telegram does, with `secret` when given.
pub async fn post(base: &str, update: &str, secret: Option<&str>) -> reqwest::StatusCode {
    let headers = match secret {
        Some(secret) => secret_headers(secret),
        None => crate::headers([("content-type", "application/json")]),
    };
    crate::post_webhook(
        &reqwest::Client::new(),
        &format!("{base}/webhooks/telegram"),
        update.to_owned(),
        &headers,
    )
    .await
    .status
}

/// A sent message as the Bot API returns it.
fn message(extra: Value) -> Value {
    let mut message = json!({
        "message_id": MESSAGE_ID, "date": 1,
        "chat": {"id": 1, "type": "private", "first_name": "A"}
    });
    if let (Some(message), Some(extra)) = (message.as_object_mut(), extra.as_object()) {
        message.extend(extra.clone());
    }
    json!({"ok": true, "result": message})
}

/// Matches a request whose `text` is `parse_mode=HTML` that Telegram refuses for its nesting.
/// Bot API, Formatting options: "Message entities can be nested, providing following
/// restrictions are met: [...] bold, italic, underline, strikethrough, and spoiler entities can
/// contain and can be part of any other entities, except pre and code. blockquote and
/// expandable_blockquote entities can't be nested. All other entities can't contain each
/// other." So `<code>` inside `<a>`, `<b>`, `<i>`, `<s>`, and `<blockquote>` inside
/// `<blockquote>`, are refused (`<pre><code class="language-…">` is the documented form of a
/// code block, not a nesting).
#[derive(Debug, Clone, Copy)]
pub struct InvalidHtml;

impl wiremock::Match for InvalidHtml {
    fn matches(&self, request: &wiremock::Request) -> bool {
        let Ok(body) = serde_json::from_slice::<Value>(&request.body) else {
            return false;
        };
        body["parse_mode"] == "HTML" && body["text"].as_str().is_some_and(refused_nesting)
    }
}

/// Matches a message whose inline keyboard holds a `callback_data` outside 1-64 bytes.
#[derive(Debug, Clone, Copy)]
pub struct LongCallbackData;

impl wiremock::Match for LongCallbackData {
    fn matches(&self, request: &wiremock::Request) -> bool {
        let Ok(body) = serde_json::from_slice::<Value>(&request.body) else {
            return false;
        };
        body["reply_markup"]["inline_keyboard"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_array)
            .flatten()
            .filter_map(|button| button["callback_data"].as_str())
            .any(|data| data.is_empty() || data.len() > 64)
    }
}

/// Whether Telegram refuses `html` for a nesting its rules forbid (see [`InvalidHtml`]).
#[must_use]
pub fn refused_nesting(html: &str) -> bool {
    let mut open: Vec<String> = Vec::new();
    let mut rest = html;
    while let Some(at) = rest.find('<') {
        rest = &rest[at + 1..];
        let Some(end) = rest.find('>') else { break };
        let tag = &rest[..end];
        rest = &rest[end + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            if let Some(position) = open.iter().rposition(|t| t == name.trim()) {
                open.truncate(position);
            }
            continue;
        }
        let name = tag.split_whitespace().next().unwrap_or_default().to_owned();
        let inside = |names: &[&str]| open.iter().any(|t| names.contains(&t.as_str()));
        let refused = match name.as_str() {
            "blockquote" => inside(&["blockquote"]),
            "code" => inside(&["a", "b", "strong", "i", "em", "s", "u", "code"]),
            "pre" => inside(&["a", "b", "strong", "i", "em", "s", "u", "code", "pre"]),
            "a" => inside(&["a", "code", "pre"]),
            _ => false,
        };
        if refused {
            return true;
        }
        open.push(name);
    }
    false
}

/// A mock Bot API on 127.0.0.1 for [`TOKEN`]: knows the bot (`getMe`), accepts every message,
/// edit and chat action, and records every request. Mount more on it (it derefs to the
/// [`MockServer`]) for what a test needs besides.
#[derive(Debug)]
pub struct MockTelegram {
    server: MockServer,
    get_me_down: Arc<AtomicBool>,
}

/// `getMe`: the bot, or while `down` the Bot API's answer to a call its servers cannot serve
/// (HTTP 502, `{"ok":false,"error_code":502,"description":"Bad Gateway"}`: Telegram answers
/// errors as JSON with the same status, core.telegram.org/bots/api#making-requests).
struct GetMe {
    down: Arc<AtomicBool>,
}

impl wiremock::Respond for GetMe {
    fn respond(&self, _: &wiremock::Request) -> ResponseTemplate {
        if self.down.load(Ordering::SeqCst) {
            return ResponseTemplate::new(502).set_body_json(json!({
                "ok": false, "error_code": 502, "description": "Bad Gateway"
            }));
        }
        ResponseTemplate::new(200).set_body_json(json!({
            "ok": true,
            "result": {"id": 7000000001u64, "is_bot": true, "first_name": "OpsBot",
                       "username": USERNAME, "can_join_groups": true,
                       "can_read_all_group_messages": false, "supports_inline_queries": false,
                       "has_main_web_app": false}
        }))
    }
}

/// `getFile`: the File for the `file_id` asked (Bot API, File: `file_id`, `file_unique_id`,
/// `file_size`, `file_path`).
struct GetFile;

impl wiremock::Respond for GetFile {
    fn respond(&self, request: &wiremock::Request) -> ResponseTemplate {
        let asked: Value = serde_json::from_slice(&request.body).unwrap_or_default();
        let id = asked["file_id"].as_str().unwrap_or_default();
        ResponseTemplate::new(200).set_body_json(json!({
            "ok": true,
            "result": {"file_id": id, "file_unique_id": format!("u-{id}"),
                       "file_size": format!("bytes of {id}").len(),
                       "file_path": format!("photos/{id}.jpg")}
        }))
    }
}

impl std::ops::Deref for MockTelegram {
    type Target = MockServer;

    fn deref(&self) -> &MockServer {
        &self.server
    }
}

impl MockTelegram {
    /// The Bot API, knowing the bot and accepting everything.
    pub async fn start() -> Self {
        let server = MockServer::start().await;
        let route =
            |name: &str| Mock::given(method("POST")).and(path(format!("/bot{TOKEN}/{name}")));
        let get_me_down = Arc::new(AtomicBool::new(false));
        route("GetMe")
            .respond_with(GetMe {
                down: Arc::clone(&get_me_down),
            })
            .mount(&server)
            .await;
        for name in ["SendMessage", "EditMessageText"] {
            // Telegram parses the HTML before anything else and refuses what its rules forbid.
            route(name)
                .and(InvalidHtml)
                .respond_with(ResponseTemplate::new(400).set_body_json(json!({
                    "ok": false, "error_code": 400,
                    "description": "Bad Request: can't parse entities: Can't find end tag corresponding to start tag \"code\""
                })))
                .with_priority(2)
                .mount(&server)
                .await;
            route(name)
                .respond_with(
                    ResponseTemplate::new(200).set_body_json(message(json!({"text": "ok"}))),
                )
                .mount(&server)
                .await;
        }
        // Bot API, InlineKeyboardButton: "callback_data: Data to be sent in a callback query to
        // the bot when the button is pressed, 1-64 bytes"; longer is refused.
        route("SendMessage")
            .and(LongCallbackData)
            .respond_with(ResponseTemplate::new(400).set_body_json(json!({
                "ok": false, "error_code": 400, "description": "Bad Request: BUTTON_DATA_INVALID"
            })))
            .with_priority(1)
            .mount(&server)
            .await;
        // answerCallbackQuery: "On success, True is returned."
        route("AnswerCallbackQuery")
            .respond_with(
                ResponseTemplate::new(200).set_body_json(json!({"ok": true, "result": true})),
            )
            .mount(&server)
            .await;
        route("SendChatAction")
            .respond_with(
                ResponseTemplate::new(200).set_body_json(json!({"ok": true, "result": true})),
            )
            .mount(&server)
            .await;
        Self {
            server,
            get_me_down,
        }
    }

    /// Makes `getMe` fail with HTTP 502 (an outage of the Bot API) while `down`.
    pub fn set_get_me_down(&self, down: bool) {
        self.get_me_down.store(down, Ordering::SeqCst);
    }

    /// A Bot API for long polling as well: `getWebhookInfo` reports `webhook`; `getUpdates`
    /// returns the private-text update until it is confirmed (asked with an offset past it),
    /// then nothing.
    pub async fn start_polling(webhook: &str) -> Self {
        Self::start_polling_update(webhook, "tg_private_text").await
    }

    /// [`MockTelegram::start_polling`] delivering the recorded update `name`.
    pub async fn start_polling_update(webhook: &str, name: &str) -> Self {
        let update: Value = serde_json::from_str(&fixture(name)).expect("the update is JSON");
        let confirmed_by = update["update_id"].as_u64().expect("an update id") + 1;
        let api = Self::start().await;
        Mock::given(method("POST"))
            .and(path(format!("/bot{TOKEN}/GetWebhookInfo")))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                "ok": true,
                "result": {"url": webhook, "has_custom_certificate": false, "pending_update_count": 0}
            })))
            .mount(&api.server)
            .await;
        Mock::given(method("POST"))
            .and(path(format!("/bot{TOKEN}/GetUpdates")))
            .and(body_partial_json(json!({"offset": confirmed_by})))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(json!({"ok": true, "result": []}))
                    .set_delay(Duration::from_millis(200)),
            )
            // Below the updates [`MockTelegram::poll_next`] adds.
            .with_priority(2)
            .mount(&api.server)
            .await;
        Mock::given(method("POST"))
            .and(path(format!("/bot{TOKEN}/GetUpdates")))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(json!({"ok": true, "result": [update]}))
                    .set_delay(Duration::from_millis(50)),
            )
            .with_priority(5)
            .mount(&api.server)
            .await;
        api
    }

    /// Delivers `update` to a polling bot once it confirmed `after` (the update id before it),
    /// then nothing.
    pub async fn poll_next(&self, after: u64, update: Value) {
        let id = update["update_id"].as_u64().expect("an update id");
        Mock::given(method("POST"))
            .and(path(format!("/bot{TOKEN}/GetUpdates")))
            .and(body_partial_json(json!({"offset": after + 1})))
            .respond_with(
                ResponseTemplate::new(200).set_body_json(json!({"ok": true, "result": [update]})),
            )
            .with_priority(1)
            .mount(&self.server)
            .await;
        Mock::given(method("POST"))
            .and(path(format!("/bot{TOKEN}/GetUpdates")))
            .and(body_partial_json(json!({"offset": id + 1})))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(json!({"ok": true, "result": []}))
                    .set_delay(Duration::from_millis(200)),
            )
            .with_priority(1)
            .mount(&self.server)
            .await;
    }

    /// Accepts uploads (`sendDocument`) too.
    pub async fn accept_documents(&self) {
        Mock::given(method("POST"))
            .and(path(format!("/bot{TOKEN}/SendDocument")))
            .respond_with(ResponseTemplate::new(200).set_body_json(message(json!({
                "message_id": MESSAGE_ID + 1,
                "document": {"file_id": "f", "file_unique_id": "u", "file_name": "report.txt"}
            }))))
            .mount(&self.server)
            .await;
    }

    /// The `[channels.telegram]` config for a webhook bot at this API, with `more` lines.
    #[must_use]
    pub fn config(&self, more: &str) -> String {
        format!(
            "[channels.telegram]\nenabled = true\nbot_token = \"{TOKEN}\"\n\
             webhook_secret = \"{SECRET}\"\napi_url = \"{}\"\n{}{more}",
            self.server.uri(),
            crate::open_unless_listed(more)
        )
    }

    /// The `[channels.telegram]` config for a bot that polls this API.
    #[must_use]
    pub fn polling_config(&self) -> String {
        format!(
            "[channels.telegram]\nenabled = true\nmode = \"polling\"\nbot_token = \"{TOKEN}\"\n\
             api_url = \"{}\"\ndm_policy = \"open\"\n",
            self.server.uri()
        )
    }

    /// The bodies of every call of `method` (`SendMessage`, `EditMessageText`…), in order.
    pub async fn calls(&self, method: &str) -> Vec<Value> {
        crate::bodies_of(&self.server, method).await
    }

    /// The bodies of every `SendMessage`, in order.
    pub async fn sent(&self) -> Vec<Value> {
        self.calls("SendMessage").await
    }

    /// Waits until at least `n` messages were sent; their bodies.
    pub async fn wait_for_sends(&self, n: usize) -> Vec<Value> {
        crate::wait_for_at_least(&format!("{n} messages sent to Telegram"), n, || self.sent()).await
    }

    /// Refuses the next `SendMessage` as Telegram does when flooded: HTTP 429 with
    /// `parameters.retry_after` in seconds (protocols.md §1.3: `{"ok":false,"error_code":429,
    /// "description":"Too Many Requests: retry after N","parameters":{"retry_after":N}}`).
    pub async fn rate_limit_next_send(&self, retry_after_secs: u64) {
        Mock::given(method("POST"))
            .and(path(format!("/bot{TOKEN}/SendMessage")))
            .respond_with(ResponseTemplate::new(429).set_body_json(json!({
                "ok": false, "error_code": 429,
                "description": format!("Too Many Requests: retry after {retry_after_secs}"),
                "parameters": {"retry_after": retry_after_secs}
            })))
            .up_to_n_times(1)
            .with_priority(1)
            .mount(&self.server)
            .await;
    }

    /// Answers the next `SendMessage`s, one each, with the Bot API's server errors as
    /// `(status, description)`: Telegram answers these as JSON too
    /// (`{"ok":false,"error_code":502,"description":"Bad Gateway"}`; `500` "Internal Server
    /// Error: restart" while a bot's server restarts; `503`), with the same HTTP status
    /// ("error_code: An Integer error code. Its value may be subject to change", core.telegram.org/bots/api#making-requests).
    pub async fn server_error_next_sends(&self, errors: &[(u16, &str)]) {
        for (status, description) in errors {
            Mock::given(method("POST"))
                .and(path(format!("/bot{TOKEN}/SendMessage")))
                .respond_with(ResponseTemplate::new(*status).set_body_json(json!({
                    "ok": false, "error_code": status, "description": description
                })))
                .up_to_n_times(1)
                .with_priority(1)
                .mount(&self.server)
                .await;
        }
    }

    /// Refuses every message and upload into forum topic `topic` as Telegram does once the
    /// topic is closed (`description` "Bad Request: TOPIC_CLOSED") or deleted ("Bad Request:
    /// message thread not found"): HTTP 400.
    pub async fn refuse_topic(&self, topic: i32, description: &str) {
        Mock::given(method("POST"))
            .and(path(format!("/bot{TOKEN}/SendMessage")))
            .and(body_partial_json(json!({"message_thread_id": topic})))
            .respond_with(ResponseTemplate::new(400).set_body_json(json!({
                "ok": false, "error_code": 400, "description": description
            })))
            .with_priority(1)
            .mount(&self.server)
            .await;
    }

    /// Serves files: `getFile` answers a File whose `file_path` is `photos/<file_id>.jpg`, and
    /// `GET /file/bot<token>/<file_path>` its bytes, `bytes of <file_id>` (Bot API, getFile: "The
    /// file can then be downloaded via the link
    /// https://api.telegram.org/file/bot<token>/<file_path>").
    pub async fn serve_files(&self) {
        Mock::given(method("POST"))
            .and(path(format!("/bot{TOKEN}/GetFile")))
            .respond_with(GetFile)
            .mount(&self.server)
            .await;
        // teloxide sends the path's `/` escaped (`photos%2F…`); Telegram takes either.
        Mock::given(method("GET"))
            .and(wiremock::matchers::path_regex(format!(
                "^/file/bot{TOKEN}/photos(/|%2F).+\\.jpg$"
            )))
            .respond_with(|request: &wiremock::Request| {
                let name = request
                    .url
                    .path()
                    .split_once("/photos")
                    .map_or("", |(_, name)| name);
                let id = name
                    .trim_start_matches("%2F")
                    .trim_start_matches('/')
                    .trim_end_matches(".jpg");
                ResponseTemplate::new(200).set_body_bytes(format!("bytes of {id}").into_bytes())
            })
            .mount(&self.server)
            .await;
    }

    /// Refuses every message to `chat_id` as Telegram does once the group became a supergroup:
    /// HTTP 400, "Bad Request: group chat was upgraded to a supergroup chat", with
    /// `parameters.migrate_to_chat_id` (Bot API, ResponseParameters: "migrate_to_chat_id: The
    /// group has been migrated to a supergroup with the specified identifier").
    pub async fn migrate_group(&self, chat_id: i64, to: i64) {
        Mock::given(method("POST"))
            .and(path(format!("/bot{TOKEN}/SendMessage")))
            .and(body_partial_json(json!({"chat_id": chat_id})))
            .respond_with(ResponseTemplate::new(400).set_body_json(json!({
                "ok": false, "error_code": 400,
                "description": "Bad Request: group chat was upgraded to a supergroup chat",
                "parameters": {"migrate_to_chat_id": to}
            })))
            .with_priority(1)
            .mount(&self.server)
            .await;
    }
}

#[async_trait::async_trait]
impl MockApi for MockTelegram {
    async fn start() -> Self {
        Self::start().await
    }

    fn server(&self) -> &MockServer {
        &self.server
    }

    fn written_by(call: &Call) -> Option<Written> {
        Written::by_method(call, "SendMessage", "EditMessageText")
    }

    fn message_id(&self) -> String {
        MESSAGE_ID.to_string()
    }

    async fn rate_limit_next_message(&self, retry_after_secs: u64) {
        self.rate_limit_next_send(retry_after_secs).await;
    }
}

/// Telegram's protocol facts for the conformance list.
#[derive(Debug)]
pub struct Telegram;

impl Platform for Telegram {
    type Mock = MockTelegram;

    const NAME: &'static str = "telegram";

    /// A delivery carries no time: the secret token is the same on every request, so Telegram
    /// has no replay window to check (protocols.md §1.1: `secret_token` is sent as is).
    const REPLAY_WINDOW: Option<Duration> = None;

    fn sign(_body: &[u8], _at_secs: u64) -> http::HeaderMap {
        secret_headers(SECRET)
    }

    /// Nothing signs the body, so tampering that can be caught is tampering with the secret.
    fn tamper(_body: &mut Vec<u8>, headers: &mut http::HeaderMap) {
        let mut secret = SECRET.as_bytes().to_vec();
        crate::conformance::flip_a_letter(&mut secret);
        let secret = String::from_utf8(secret).expect("ASCII");
        headers.insert(SECRET_HEADER, secret.parse().expect("a header value"));
    }

    fn vectors() -> Vec<Vector> {
        Vec::new()
    }

    fn fixtures() -> Vec<Fixture> {
        [
            "tg_private_text.json",
            "tg_group_mention.json",
            "tg_group_command.json",
            "tg_reply_to_bot.json",
            "tg_forum_topic.json",
            "tg_photo_caption.json",
            "tg_document.json",
        ]
        .into_iter()
        .map(|name| Fixture {
            route: "",
            name,
            expect: Expect::Events(1),
        })
        .collect()
    }

    fn answered() -> Fixture {
        Fixture {
            route: "",
            name: "tg_group_mention.json",
            expect: Expect::Events(1),
        }
    }
}
