//! Feishu as an antler [`Channel`]: event subscriptions and card callbacks on one route,
//! decrypted and verified, messages and button presses normalized, answers sent as replies
//! (message cards edited in place, or text; cards with buttons for prompts).

use std::sync::RwLock;
use std::time::Duration;

use antler_channel::render::{self, FeishuMarkdown, Limit, PlainText};
use antler_channel::{
    AttachmentRef, AttachmentSource, Button, ButtonStyle, Capabilities, Channel, ChannelError,
    ConversationKey, EditRate, Limits, OutboundMessage, Parsed, Part, Press, PressAnswer, Receipt,
    WebhookRequest, verify,
};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::client::{self, DEFAULT_API_URL, FeishuApi, FeishuIdentity};
use crate::crypto;
use crate::normalize::{
    CardAction, Context, MessageReceived, NAME, Normalized, PressNormalized, VALUE_ACTION,
    VALUE_ROOT, normalize_message, normalize_press,
};

/// The most Markdown one card holds, in UTF-8 bytes, before the request body is measured
/// ([`CARD_BODY_LIMIT`]): an ordinary answer fits a card at this size.
const CARD_LIMIT: usize = 25_000;

/// The most plain text one message holds, in UTF-8 bytes: Feishu allows 150 KB, but longer
/// messages are hard to read.
const TEXT_LIMIT: usize = 30_000;

/// The largest request body a card part may make, in bytes. Feishu's "Send message" and
/// "Reply" pages, error 230025: "消息体长度超出限制。文本消息请求体最大不能超过150KB;卡片及富文本消息
/// 请求体最大不能超过30KB" (the text message request body is at most 150 KB; card and rich-text
/// message request bodies at most 30 KB). The limit is on the body as sent: the card's JSON is
/// escaped once more into the `content` string, so a `"` of the answer is four bytes on the
/// wire, a control character seven. 30,000 is under 30 KB however a KB is counted.
const CARD_BODY_LIMIT: usize = 30_000;

/// The largest request body a text part may make, in bytes (150 KB, as above).
const TEXT_BODY_LIMIT: usize = 150_000;

/// The smallest Markdown limit the body fitting shrinks to: even all control characters
/// (seven bytes each on the wire) stay under [`CARD_BODY_LIMIT`] at this size.
const MIN_PART_LIMIT: usize = 4_000;

/// The bytes a card part's body keeps free for a row of buttons under it ([`button_row`]):
/// two buttons with the longest action, a topic id and labels of [`MAX_LABEL_CHARS`] take
/// about 850. A row that does not fit is left out ([`FeishuChannel::prompt_content`]).
const BUTTONS_RESERVE: usize = 1_000;

/// The most characters of a button's label shown.
const MAX_LABEL_CHARS: usize = 40;

/// The most bytes of a toast: it is one line on the presser's screen.
const TOAST_LIMIT: usize = 300;

/// The card callback's event type: a button of the bot's card was pressed.
const CARD_ACTION: &str = "card.action.trigger";

/// Stands for the chat id a measured body names: longer than any (chat ids are `oc_` and 32
/// hex digits).
const MEASURED_CHAT: &str = "oc_000000000000000000000000000000000000000000000000000000000000";

/// The header with the Unix time (seconds) a request was signed at.
pub const TIMESTAMP_HEADER: &str = "x-lark-request-timestamp";

/// The header with the request's nonce.
pub const NONCE_HEADER: &str = "x-lark-request-nonce";

/// The header with the request's signature: hex SHA-256 of timestamp, nonce, Encrypt Key and body.
pub const SIGNATURE_HEADER: &str = "x-lark-signature";

/// What the Feishu channel is set up with.
#[derive(Clone)]
pub struct FeishuSettings {
    /// The app's id (`cli_…`).
    pub app_id: String,
    /// The app's secret.
    pub app_secret: String,
    /// The Verification Token from the app's event subscription page (webhook only: events on
    /// the long connection carry none to check).
    pub verification_token: String,
    /// The Encrypt Key from the same page; when set, every event is encrypted and signed.
    pub encrypt_key: Option<String>,
    /// The Open API base URL: `https://open.feishu.cn`, or `https://open.larksuite.com` for Lark.
    pub api_url: String,
    /// Answer with message cards (Markdown, edited while written); `false` sends plain text.
    pub cards: bool,
    /// Events come over the long connection ([`crate::FeishuSocket`]), not the webhook: no
    /// Verification Token is needed.
    pub websocket: bool,
}

impl Default for FeishuSettings {
    fn default() -> Self {
        Self {
            app_id: String::new(),
            app_secret: String::new(),
            verification_token: String::new(),
            encrypt_key: None,
            api_url: DEFAULT_API_URL.to_owned(),
            cards: true,
            websocket: false,
        }
    }
}

impl std::fmt::Debug for FeishuSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeishuSettings")
            .field("app_id", &self.app_id)
            .field("app_secret", &"***")
            .field("verification_token", &"***")
            .field("encrypt_key", &self.encrypt_key.as_ref().map(|_| "***"))
            .field("api_url", &self.api_url)
            .field("cards", &self.cards)
            .field("websocket", &self.websocket)
            .finish()
    }
}

/// The Encrypt Key and the AES key made from it.
struct EncryptKey {
    text: String,
    aes: [u8; 32],
}

/// The Feishu channel.
pub struct FeishuChannel {
    app_id: String,
    verification_token: String,
    encrypt_key: Option<EncryptKey>,
    cards: bool,
    api: FeishuApi,
    /// Who the bot is, from `bot/v3/info` ([`FeishuChannel::learn_identity`]): group messages
    /// reach it only through a mention of this open_id (or a command).
    me: RwLock<Option<FeishuIdentity>>,
    now_ms: fn() -> u64,
}

impl std::fmt::Debug for FeishuChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeishuChannel")
            .field("verification_token", &"***")
            .field("encrypt_key", &self.encrypt_key.as_ref().map(|_| "***"))
            .field("cards", &self.cards)
            .field("api", &self.api)
            .finish_non_exhaustive()
    }
}

/// The outer shape of a body: encrypted or not.
#[derive(Deserialize)]
struct Sealed {
    encrypt: Option<String>,
}

impl FeishuChannel {
    /// The channel for `settings`; `now_ms` stamps received messages and times the tenant
    /// token's renewal.
    pub fn new(settings: &FeishuSettings, now_ms: fn() -> u64) -> Result<Self, ChannelError> {
        for (value, name, needed) in [
            (&settings.app_id, "app_id", true),
            (&settings.app_secret, "app_secret", true),
            (
                &settings.verification_token,
                "verification_token",
                !settings.websocket,
            ),
        ] {
            if needed && value.trim().is_empty() {
                return Err(ChannelError::Permanent(format!(
                    "channels.feishu.{name} is empty"
                )));
            }
        }
        let encrypt_key = settings
            .encrypt_key
            .as_deref()
            .filter(|key| !key.is_empty())
            .map(|key| EncryptKey {
                text: key.to_owned(),
                aes: crypto::aes_key(key),
            });
        Ok(Self {
            app_id: settings.app_id.clone(),
            verification_token: settings.verification_token.clone(),
            encrypt_key,
            cards: settings.cards,
            api: FeishuApi::new(
                &settings.app_id,
                &settings.app_secret,
                &settings.api_url,
                now_ms,
            )?,
            me: RwLock::new(None),
            now_ms,
        })
    }

    /// The Open API client (setup commands, `antler doctor`).
    pub fn api(&self) -> &FeishuApi {
        &self.api
    }

    /// Asks Feishu who the bot is (`bot/v3/info`) and remembers it.
    pub async fn learn_identity(&self) -> Result<FeishuIdentity, ChannelError> {
        let me = self.api.bot_info().await?;
        if let Ok(mut known) = self.me.write() {
            *known = Some(me.clone());
        }
        Ok(me)
    }

    /// The identity [`FeishuChannel::learn_identity`] found, if it ran.
    pub fn identity(&self) -> Option<FeishuIdentity> {
        self.me
            .read()
            .map(|me| me.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }

    /// An event's JSON, in clear, as the webhook's (after decryption) or the long connection's
    /// payload: message events normalized, others ignored. A group @mention before the bot's
    /// identity is known is [`ChannelError::Transient`]: left for Feishu to deliver again.
    pub fn parse_json(&self, event: &Value) -> Result<Parsed, ChannelError> {
        if event.get("type").and_then(Value::as_str) == Some("event_callback") {
            return Ok(old_schema(event));
        }
        let schema = event.get("schema").and_then(Value::as_str);
        let event_type = event.pointer("/header/event_type").and_then(Value::as_str);
        if schema == Some("2.0") && event_type == Some(CARD_ACTION) {
            return self.parse_press(event);
        }
        if schema != Some("2.0") || event_type != Some("im.message.receive_v1") {
            tracing::debug!(
                ?schema,
                ?event_type,
                "a Feishu event antler does not handle"
            );
            return Ok(Parsed::Ignore);
        }
        let received = match MessageReceived::deserialize(event) {
            Ok(received) => received,
            Err(e) => {
                // Verified, so it is Feishu's: a 4xx would only make it send the same again.
                tracing::warn!(error = %e, "a Feishu message event antler cannot read; ignored");
                return Ok(Parsed::Ignore);
            }
        };
        let me = self.identity();
        let context = Context {
            bot_open_id: me.as_ref().map(|me| me.open_id.as_str()),
            app_id: &self.app_id,
            received_at_ms: (self.now_ms)(),
        };
        Ok(match normalize_message(&received, &context) {
            Normalized::Event(event) => Parsed::Events(vec![*event]),
            Normalized::Ignored(reason) => {
                tracing::debug!(reason, "Feishu message ignored");
                Parsed::Ignore
            }
            Normalized::AwaitingIdentity => {
                return Err(ChannelError::Transient(
                    "a Feishu group message with a mention arrived before the bot's open_id is \
                     known (bot/v3/info); Feishu delivers it again"
                        .to_owned(),
                ));
            }
        })
    }

    /// A card callback: a press of one of antler's buttons, or nothing for antler.
    fn parse_press(&self, event: &Value) -> Result<Parsed, ChannelError> {
        let action = CardAction::deserialize(event).map_err(|_| {
            ChannelError::Malformed("a card callback antler cannot read".to_owned())
        })?;
        match normalize_press(&action, &self.app_id) {
            PressNormalized::Press(press) => Ok(Parsed::Press(*press)),
            PressNormalized::Ignored(reason) => {
                tracing::debug!(reason, "Feishu card callback ignored");
                Ok(Parsed::Ignore)
            }
            PressNormalized::Malformed(reason) => Err(ChannelError::Malformed(format!(
                "a Feishu card callback: {reason}"
            ))),
        }
    }

    /// The body's JSON, decrypted when an Encrypt Key is set. A body of the other kind
    /// (encrypted without a key, plain with one) is refused: it is not what Feishu would send.
    fn open(&self, body: &[u8]) -> Result<Value, ChannelError> {
        let sealed: Sealed =
            serde_json::from_slice(body).map_err(|_| ChannelError::Unauthorized)?;
        match (&self.encrypt_key, sealed.encrypt) {
            (Some(key), Some(encrypted)) => {
                let plain =
                    crypto::decrypt(&key.aes, &encrypted).ok_or(ChannelError::Unauthorized)?;
                serde_json::from_slice(&plain).map_err(|_| ChannelError::Unauthorized)
            }
            (None, None) => serde_json::from_slice(body).map_err(|_| ChannelError::Unauthorized),
            _ => Err(ChannelError::Unauthorized),
        }
    }

    /// The presented token is the Verification Token; never without one (websocket mode
    /// sets none, and then no webhook request is Feishu's).
    fn token_matches(&self, presented: Option<&str>) -> bool {
        !self.verification_token.is_empty()
            && presented.is_some_and(|token| {
                verify::constant_time_eq(token.as_bytes(), self.verification_token.as_bytes())
            })
    }

    /// The signature headers present and matching the raw body. Their timestamp is signed but
    /// not judged by age: Feishu documents no window and retries a failed delivery for hours,
    /// and a replay is one turn anyway (dedupe on the message_id).
    fn signature_matches(&self, key: &EncryptKey, request: &WebhookRequest<'_>) -> bool {
        let (Some(timestamp), Some(nonce), Some(signature)) = (
            verify::header(request.headers, TIMESTAMP_HEADER),
            verify::header(request.headers, NONCE_HEADER),
            verify::header(request.headers, SIGNATURE_HEADER),
        ) else {
            return false;
        };
        let expected = crypto::signature(timestamp, nonce, &key.text, request.body);
        verify::constant_time_eq(
            signature.trim().to_ascii_lowercase().as_bytes(),
            expected.as_bytes(),
        )
    }

    /// The size in bytes of the largest request body that sends `part` (to a chat, with the
    /// longest chat id, or as a reply; a card patch is smaller than either).
    fn body_size(&self, part: &str) -> usize {
        let (msg_type, content) = self.content(part);
        let uuid = part_uuid("", 0);
        [
            client::send_body(MEASURED_CHAT, msg_type, &content, &uuid),
            client::reply_body(msg_type, &content, &uuid),
        ]
        .iter()
        .map(|body| body.to_string().len())
        .max()
        .unwrap_or(0)
            + if self.cards { BUTTONS_RESERVE } else { 0 }
    }

    /// The card or text message a part is sent as: `(msg_type, content)`.
    fn content(&self, body: &str) -> (&'static str, String) {
        if self.cards {
            ("interactive", card(body).to_string())
        } else {
            ("text", json!({"text": body}).to_string())
        }
    }

    /// The element showing a part: Markdown with cards; without, the plain text as it is (a
    /// card only to carry buttons).
    fn text_element(&self, body: &str) -> Value {
        if self.cards {
            json!({"tag": "markdown", "content": body})
        } else {
            json!({"tag": "div", "text": {"tag": "plain_text", "content": body}})
        }
    }

    /// The message a part with `buttons` is sent as: a card with the part and the buttons
    /// under it, whose presses come back naming the topic `root` (in groups). A card too large
    /// for Feishu (only possible with a long plain-text part) goes as the part alone: the
    /// prompt's text says how to answer in words.
    fn prompt_content(
        &self,
        body: &str,
        buttons: &[Button],
        root: Option<&str>,
    ) -> (&'static str, String) {
        let content = card_of(vec![self.text_element(body), button_row(buttons, root)]).to_string();
        let size = client::reply_body("interactive", &content, &part_uuid("", 0))
            .to_string()
            .len()
            .max(
                client::send_body(MEASURED_CHAT, "interactive", &content, &part_uuid("", 0))
                    .to_string()
                    .len(),
            );
        if size > CARD_BODY_LIMIT {
            tracing::warn!(
                size,
                "a Feishu prompt is too long for a card; sent without its buttons"
            );
            return self.content(body);
        }
        ("interactive", content)
    }

    /// The card a pressed button's message becomes: `update` (Markdown) rendered as a part
    /// is, with no buttons. An update longer than a part keeps its first part.
    fn settled_card(&self, update: &str) -> Result<Value, ChannelError> {
        let first = self.render(update)?.into_iter().next().unwrap_or_default();
        Ok(card_of(vec![self.text_element(&first)]))
    }
}

/// The action element holding `buttons` in one row. Each button's `value` carries its
/// action and, in a group, the topic its card is in ([`VALUE_ROOT`]): Feishu sends the value
/// back with the press as the card set it.
fn button_row(buttons: &[Button], root: Option<&str>) -> Value {
    let actions: Vec<Value> = buttons
        .iter()
        .map(|button| {
            let mut value = serde_json::Map::new();
            value.insert(VALUE_ACTION.to_owned(), button.action.clone().into());
            if let Some(root) = root {
                value.insert(VALUE_ROOT.to_owned(), root.into());
            }
            json!({
                "tag": "button",
                "text": {
                    "tag": "plain_text",
                    "content": button.label.chars().take(MAX_LABEL_CHARS).collect::<String>(),
                },
                "type": match button.style {
                    ButtonStyle::Primary => "primary",
                    ButtonStyle::Danger => "danger",
                },
                "value": value,
            })
        })
        .collect();
    json!({"tag": "action", "actions": actions})
}

/// The topic of a group conversation (`feishu:<tenant>:<chat>:<root>`); `None` in a private one.
fn root_of(conversation: &ConversationKey) -> Option<&str> {
    conversation
        .as_str()
        .split(':')
        .nth(3)
        .filter(|root| !root.is_empty())
}

/// `notice` (Markdown) as the plain text of a toast, within [`TOAST_LIMIT`].
fn toast_text(notice: &str) -> String {
    render::parts(notice, &PlainText, Limit::Bytes(TOAST_LIMIT))
        .ok()
        .and_then(|parts| parts.into_iter().next())
        .unwrap_or_default()
}

/// What a schema 1.0 event (`{"type": "event_callback", "event": {"type": …}}`, apps whose
/// subscription predates 2.0) is to antler: nothing. A message in it is not answered, so the
/// warning names the subscription to change; Feishu's redeliveries would be 1.0 too, so it is
/// acknowledged rather than refused.
fn old_schema(event: &Value) -> Parsed {
    let kind = event
        .pointer("/event/type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if kind == "message" {
        tracing::warn!(
            "a Feishu message arrived as a schema 1.0 event (\"message\"), which antler does \
             not read; it is not answered. In the app's Events and Callbacks page, remove the \
             old \"Receive messages\" (message) event and add \"Message received\" \
             (im.message.receive_v1, schema 2.0)"
        );
    } else {
        tracing::debug!(kind, "a Feishu schema 1.0 event antler does not handle");
    }
    Parsed::Ignore
}

/// A message card holding `markdown`; `update_multi` makes it editable for everyone who sees
/// it (Feishu wants it both when sending and when patching).
fn card(markdown: &str) -> Value {
    card_of(vec![json!({"tag": "markdown", "content": markdown})])
}

/// A message card of `elements`, editable for everyone who sees it ([`card`]).
fn card_of(elements: Vec<Value>) -> Value {
    json!({
        "config": {"wide_screen_mode": true, "update_multi": true},
        "elements": elements,
    })
}

/// A stable idempotency key for part `index` of a message, within Feishu's 50 characters: the
/// same message part always gets the same `uuid`, so Feishu drops a retried duplicate.
fn part_uuid(idempotency_key: &str, index: usize) -> String {
    let digest = Sha256::digest(format!("{idempotency_key}:{index}").as_bytes());
    format!("antler-{}", &hex::encode(digest)[..40])
}

/// The chat of `feishu:<tenant>:<chat_id>[:<root>]`.
fn chat_of(conversation: &ConversationKey) -> Result<&str, ChannelError> {
    let mut parts = conversation.as_str().split(':');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(NAME), Some(_tenant), Some(chat)) if !chat.is_empty() => Ok(chat),
        _ => Err(ChannelError::Permanent(format!(
            "not a Feishu conversation: {conversation}"
        ))),
    }
}

/// A header's value as text, if present and readable.

#[async_trait::async_trait]
impl Channel for FeishuChannel {
    fn name(&self) -> &'static str {
        NAME
    }

    /// `events`: the event subscription's request URL is `/webhooks/feishu/events`.
    fn routes(&self) -> &'static [&'static str] {
        &["events"]
    }

    /// With an Encrypt Key: the body decrypts with it, and then either it is a URL verification
    /// whose `token` is the Verification Token (decrypting already proved the sender knows the
    /// key), or the signature headers are present and match
    /// `SHA-256(timestamp + nonce + key + body)` (compared in constant time) and `header.token`
    /// is the Verification Token. Without one: the token alone.
    fn verify(&self, request: &WebhookRequest<'_>) -> Result<(), ChannelError> {
        let event = self.open(request.body)?;
        let url_verification =
            event.get("type").and_then(Value::as_str) == Some("url_verification");
        let token = if url_verification {
            event.get("token")
        } else {
            // Schema 2.0 carries it in the header, 1.0 at the top.
            event
                .pointer("/header/token")
                .or_else(|| event.get("token"))
        };
        if !self.token_matches(token.and_then(Value::as_str)) {
            return Err(ChannelError::Unauthorized);
        }
        match &self.encrypt_key {
            Some(key) if !url_verification && !self.signature_matches(key, request) => {
                Err(ChannelError::Unauthorized)
            }
            _ => Ok(()),
        }
    }

    fn parse(&self, request: &WebhookRequest<'_>) -> Result<Parsed, ChannelError> {
        if request.route != "events" {
            return Err(ChannelError::Malformed(format!(
                "Feishu has no route {:?}",
                request.route
            )));
        }
        let event = self
            .open(request.body)
            .map_err(|_| ChannelError::Malformed("not a Feishu event".to_owned()))?;
        if event.get("type").and_then(Value::as_str) == Some("url_verification") {
            let challenge = event.get("challenge").cloned().unwrap_or(Value::Null);
            return Ok(Parsed::Reply(json!({"challenge": challenge})));
        }
        self.parse_json(&event)
    }

    /// Card Markdown in chunks of at most 25,000 bytes, or plain text in chunks of 30,000
    /// bytes without cards; smaller when a part's request body, as sent, would pass Feishu's
    /// limit ([`CARD_BODY_LIMIT`], [`TEXT_BODY_LIMIT`]).
    fn render(&self, markdown: &str) -> Result<Vec<String>, ChannelError> {
        let (renderer, mut limit, body_limit): (&dyn render::Renderer, _, _) = if self.cards {
            (&FeishuMarkdown, CARD_LIMIT, CARD_BODY_LIMIT)
        } else {
            (&PlainText, TEXT_LIMIT, TEXT_BODY_LIMIT)
        };
        loop {
            let parts = render::parts(markdown, renderer, Limit::Bytes(limit))
                .map_err(|e| ChannelError::Permanent(e.to_string()))?;
            let largest = parts
                .iter()
                .map(|part| self.body_size(part))
                .max()
                .unwrap_or(0);
            if largest <= body_limit || limit <= MIN_PART_LIMIT {
                return Ok(parts);
            }
            // Shrink by the overshoot and a tenth more: each round is at least 10% smaller, so
            // this ends within about 20 rounds even from the worst start.
            let scaled = limit.saturating_mul(body_limit) / largest;
            limit = (scaled - scaled / 10).max(MIN_PART_LIMIT);
        }
    }

    /// Replies to the user's message (every part, so they stay together under it); without
    /// one (a resumed approval, a schedule's firing), a group conversation's answer replies to
    /// its topic's root, so it stays in the topic, and a private one posts to the chat.
    async fn send(
        &self,
        message: &OutboundMessage,
        part: Part<'_>,
    ) -> Result<Receipt, ChannelError> {
        let (msg_type, content) = if part.buttons.is_empty() {
            self.content(part.body)
        } else {
            self.prompt_content(part.body, part.buttons, root_of(&message.conversation))
        };
        let uuid = part_uuid(&message.idempotency_key, part.index);
        let reply_to = message
            .reply_to
            .as_deref()
            .filter(|id| !id.is_empty())
            .or_else(|| root_of(&message.conversation));
        let id = match reply_to {
            Some(reply_to) => self.api.reply(reply_to, msg_type, &content, &uuid).await?,
            None => {
                let chat = chat_of(&message.conversation)?;
                self.api
                    .send_to_chat(chat, msg_type, &content, &uuid)
                    .await?
            }
        };
        Ok(Receipt {
            platform_message_id: id,
        })
    }

    /// Replaces the card of the bot's message `sent`; text messages cannot be edited.
    async fn edit(
        &self,
        _message: &OutboundMessage,
        sent: &Receipt,
        part: Part<'_>,
    ) -> Result<(), ChannelError> {
        if !self.cards {
            return Err(ChannelError::Unsupported);
        }
        self.api
            .update_card(&sent.platform_message_id, &card(part.body).to_string())
            .await
    }

    /// 25,000 bytes of Markdown a card (30,000 of text without cards). Cards are edited at
    /// most twice a second in private chats (Feishu allows 5 edits a second per message) and
    /// once a second in groups, where all bots share 5 replies a second per group.
    fn limits(&self) -> Limits {
        if self.cards {
            Limits {
                message: Some(Limit::Bytes(CARD_LIMIT)),
                edits: Some(EditRate {
                    private: Duration::from_millis(500),
                    group: Duration::from_secs(1),
                }),
            }
        } else {
            Limits {
                message: Some(Limit::Bytes(TEXT_LIMIT)),
                edits: None,
            }
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // Replies name their files; uploading them (im/v1/files) is not built.
            files: false,
            images: true,
            typing: false,
            progress_marks: false,
            // Card buttons (with or without `cards`: a part with buttons is always a card).
            buttons: true,
        }
    }

    /// The card callback's answer, the body of its HTTP 200 (the long connection carries the
    /// same): a toast only the presser sees (`success`, or `error` for a refusal) and, when the
    /// message changes, the card that replaces it for everyone (`type: raw`, buttons gone).
    /// Feishu's "Card callback communication" page: `{"toast": {"type":
    /// "info|success|error|warning", "content": …}, "card": {"type": "raw", "data": {…}}}`,
    /// answered within 3 seconds.
    async fn answer_press(
        &self,
        _press: &Press,
        answer: &PressAnswer,
    ) -> Result<Option<Value>, ChannelError> {
        let kind = match (&answer.update, answer.decided_now) {
            (Some(_), true) => "success",
            // A decision that stood before: nothing changed, and the card shows it.
            (Some(_), false) => "info",
            (None, _) => "error",
        };
        let mut body = json!({"toast": {"type": kind, "content": toast_text(&answer.notice)}});
        if let Some(update) = &answer.update {
            body["card"] = json!({"type": "raw", "data": self.settled_card(update)?});
        }
        Ok(Some(body))
    }

    /// The message resource named by `<message_id>/<key>/<image|file>`.
    async fn fetch_attachment(
        &self,
        attachment: &AttachmentRef,
        max_bytes: u64,
    ) -> Result<Vec<u8>, ChannelError> {
        let AttachmentSource::Platform { id } = &attachment.source else {
            return Err(ChannelError::Unsupported);
        };
        let mut parts = id.split('/');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(message_id), Some(key), Some(kind @ ("image" | "file")), None)
                if !message_id.is_empty() && !key.is_empty() =>
            {
                self.api
                    .fetch_resource(message_id, key, kind, max_bytes)
                    .await
            }
            _ => Err(ChannelError::Permanent(format!(
                "not a Feishu attachment id: {id}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use antler_testkit::feishu::{MockFeishu, REPLY_ID};

    const VERIFICATION_TOKEN: &str = "vTok3nFixture0001";
    const ENCRYPT_KEY: &str = "fixture-encrypt-key-0001";
    const SECRET: &str = "app-SECRET-0001";
    const BOT: &str = "ou_b07b07b07b07b07b07b07b07b07b07b0";
    const TENANT: &str = "2f3e4d5c6b7a8901";

    /// The vectors' signing time, 2026-01-01T00:00:00Z.
    fn vector_clock_ms() -> u64 {
        1_767_225_600_000
    }

    fn settings(encrypt_key: Option<&str>) -> FeishuSettings {
        FeishuSettings {
            app_id: "cli_a1b2c3d4e5f60001".into(),
            app_secret: SECRET.into(),
            verification_token: VERIFICATION_TOKEN.into(),
            encrypt_key: encrypt_key.map(str::to_owned),
            api_url: "http://127.0.0.1:9".into(),
            cards: true,
            websocket: false,
        }
    }

    /// A channel that knows its bot's open_id, as after `learn_identity`.
    fn channel_with(encrypt_key: Option<&str>, now_ms: fn() -> u64) -> FeishuChannel {
        let channel = FeishuChannel::new(&settings(encrypt_key), now_ms).unwrap();
        *channel.me.write().unwrap() = Some(FeishuIdentity {
            open_id: BOT.into(),
            name: "OpsBot".into(),
        });
        channel
    }

    fn channel() -> FeishuChannel {
        channel_with(None, vector_clock_ms)
    }

    fn fixture(name: &str) -> Vec<u8> {
        antler_testkit::fixture_bytes("feishu", name)
    }

    fn request<'a>(headers: &'a http::HeaderMap, body: &'a [u8]) -> WebhookRequest<'a> {
        WebhookRequest {
            route: "events",
            headers,
            body,
        }
    }

    fn parse(channel: &FeishuChannel, body: &[u8]) -> Parsed {
        let headers = http::HeaderMap::new();
        let request = request(&headers, body);
        channel.verify(&request).unwrap();
        channel.parse(&request).unwrap()
    }

    fn event(parsed: Parsed) -> antler_channel::InboundEvent {
        match parsed {
            Parsed::Events(mut events) if events.len() == 1 => events.remove(0),
            other => panic!("expected one event: {other:?}"),
        }
    }

    /// The group mention fixture with its `message` changed by `edit`.
    fn variant(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
        let mut json: serde_json::Value = serde_json::from_slice(&fixture(name)).unwrap();
        edit(&mut json["event"]);
        serde_json::to_vec(&json).unwrap()
    }

    fn group(edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
        variant("feishu_im_group_mention.json", |e| edit(&mut e["message"]))
    }

    fn p2p(edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
        variant("feishu_im_p2p_thread_reply.json", |e| {
            edit(&mut e["message"])
        })
    }

    #[test]
    fn events_for_another_app_or_unreadable_ones_are_ignored_not_refused() {
        let channel = channel();
        let edited = |edit: &dyn Fn(&mut serde_json::Value)| {
            let mut json: serde_json::Value =
                serde_json::from_slice(&fixture("feishu_im_p2p_thread_reply.json")).unwrap();
            edit(&mut json);
            serde_json::to_vec(&json).unwrap()
        };
        let other_app = edited(&|event| event["header"]["app_id"] = "cli_someone_else".into());
        assert_eq!(parse(&channel, &other_app), Parsed::Ignore);
        let no_message = edited(&|event| {
            event["event"].as_object_mut().unwrap().remove("message");
        });
        assert_eq!(parse(&channel, &no_message), Parsed::Ignore);
    }

    #[test]
    fn a_group_mention_is_a_turn_in_its_own_topic() {
        let event = event(parse(&channel(), &fixture("feishu_im_group_mention.json")));
        assert_eq!(event.channel, "feishu");
        assert_eq!(
            event.event_id, "om_dc13264520392913993dd051dba21dcf",
            "the message_id, not the header's event_id"
        );
        assert_eq!(
            event.conversation.as_str(),
            format!(
                "feishu:{TENANT}:oc_5ad11d72b830411d72b836c20b1c9d1f:om_dc13264520392913993dd051dba21dcf"
            )
        );
        assert_eq!(event.text, "restart web-api");
        assert_eq!(event.user.id, "ou_7d8a6e6df7621556ce0d21922b676706");
        assert_eq!(event.user.aliases, ["ada01"], "the user_id, for allowlists");
        assert_eq!(
            event.chat.as_deref(),
            Some("oc_5ad11d72b830411d72b836c20b1c9d1f")
        );
        assert_eq!(
            event.reply_to.as_deref(),
            Some("om_dc13264520392913993dd051dba21dcf")
        );
        assert_eq!(event.received_at_ms, vector_clock_ms());
        assert!(event.group && !event.follow_up && event.interactive);
        assert!(event.attachments.is_empty() && event.unsupported.is_none());

        // A reply in that topic stays in it.
        let reply = group(|m| {
            m["root_id"] = "om_root0001".into();
            m["message_id"] = "om_reply0001".into();
        });
        let reply = event_of(&reply);
        assert_eq!(
            reply.conversation.as_str(),
            format!("feishu:{TENANT}:oc_5ad11d72b830411d72b836c20b1c9d1f:om_root0001")
        );
        assert_eq!(reply.reply_to.as_deref(), Some("om_reply0001"));
    }

    #[test]
    fn before_bot_info_a_group_mention_is_left_for_redelivery_not_dropped() {
        let channel = FeishuChannel::new(&settings(None), vector_clock_ms).unwrap();
        let headers = http::HeaderMap::new();
        let parse = |body: &[u8]| {
            let request = request(&headers, body);
            channel.verify(&request).unwrap();
            channel.parse(&request)
        };
        // Whom the mention names is unknown: not taken, so Feishu delivers it again.
        assert!(matches!(
            parse(&fixture("feishu_im_group_mention.json")),
            Err(ChannelError::Transient(_))
        ));
        // A private message, a command and a group message naming nobody need no identity.
        assert!(matches!(
            parse(&fixture("feishu_im_p2p_thread_reply.json")),
            Ok(Parsed::Events(_))
        ));
        let command = group(|m| {
            m["content"] = json!({"text": "/status"}).to_string().into();
            m["mentions"] = json!([]);
        });
        assert!(matches!(parse(&command), Ok(Parsed::Events(_))));
        let plain = group(|m| {
            m["content"] = json!({"text": "lunch?"}).to_string().into();
            m["mentions"] = json!([]);
        });
        assert_eq!(parse(&plain), Ok(Parsed::Ignore));
    }

    fn event_of(body: &[u8]) -> antler_channel::InboundEvent {
        event(parse(&channel(), body))
    }

    #[test]
    fn a_private_thread_reply_stays_in_the_private_conversation() {
        let event = event_of(&fixture("feishu_im_p2p_thread_reply.json"));
        assert_eq!(event.event_id, "om_11112222333344445555666677778888");
        assert_eq!(
            event.conversation.as_str(),
            format!("feishu:{TENANT}:oc_p2p0000111122223333444455556666")
        );
        assert_eq!(event.text, "and the error rate?");
        assert!(!event.group);
        assert_eq!(
            event.reply_to.as_deref(),
            Some("om_11112222333344445555666677778888")
        );
    }

    #[test]
    fn url_verification_is_answered_with_its_challenge() {
        assert_eq!(
            parse(&channel(), &fixture("feishu_url_verification.json")),
            Parsed::Reply(json!({"challenge": "ajls384kdj1234"}))
        );
        let wrong = br#"{"challenge":"c","token":"nope","type":"url_verification"}"#;
        let headers = http::HeaderMap::new();
        assert_eq!(
            channel().verify(&request(&headers, wrong)),
            Err(ChannelError::Unauthorized)
        );
        let missing = br#"{"challenge":"c","type":"url_verification"}"#;
        assert_eq!(
            channel().verify(&request(&headers, missing)),
            Err(ChannelError::Unauthorized)
        );
    }

    #[test]
    fn group_messages_need_a_mention_of_the_bot_or_a_command() {
        let other = group(|m| {
            m["mentions"][0]["id"]["open_id"] = "ou_someone_else".into();
            m["mentions"][0]["name"] = "Bob".into();
        });
        assert_eq!(parse(&channel(), &other), Parsed::Ignore);
        let plain = group(|m| {
            m["mentions"] = json!([]);
            m["content"] = r#"{"text":"restart web-api"}"#.into();
        });
        assert_eq!(parse(&channel(), &plain), Parsed::Ignore);

        let status = group(|m| {
            m["mentions"] = json!([]);
            m["content"] = r#"{"text":"/status"}"#.into();
        });
        let status = event_of(&status);
        assert_eq!(status.text, "/status");
        assert!(status.group);
        let mentioned = group(|m| m["content"] = r#"{"text":"@_user_1 /new"}"#.into());
        assert_eq!(event_of(&mentioned).text, "/new");
        for kind in ["topic_group", "group"] {
            let body = group(|m| m["chat_type"] = kind.into());
            assert!(event_of(&body).group, "{kind}");
        }
    }

    #[test]
    fn placeholders_name_people_and_the_bots_own_is_removed() {
        let body = group(|m| {
            m["content"] = r#"{"text":"@_user_1 page @_user_2 about web-api, cc @_all"}"#.into();
            m["mentions"]
                .as_array_mut()
                .unwrap()
                .push(json!({"key": "@_user_2", "id": {"open_id": "ou_ada"}, "name": "Ada"}));
        });
        assert_eq!(event_of(&body).text, "page @Ada about web-api, cc @all");
    }

    #[test]
    fn senders_other_than_users_are_ignored() {
        let app = variant("feishu_im_group_mention.json", |e| {
            e["sender"]["sender_type"] = "app".into();
        });
        assert_eq!(parse(&channel(), &app), Parsed::Ignore);
    }

    #[test]
    fn posts_are_flattened_to_text() {
        let body = p2p(|m| {
            m["message_type"] = "post".into();
            m["content"] = json!({"zh_cn": {"title": "Incident", "content": [
                [{"tag": "text", "text": "web-api is "}, {"tag": "text", "text": "down"}],
                [{"tag": "a", "text": "dashboard", "href": "https://grafana.example/d/1"}],
                [{"tag": "code_block", "language": "sh", "text": "kubectl get pods\n"}]
            ]}})
            .to_string()
            .into();
        });
        assert_eq!(
            event_of(&body).text,
            "Incident\nweb-api is down\ndashboard (https://grafana.example/d/1)\nkubectl get pods"
        );
    }

    #[test]
    fn images_and_files_are_attachment_refs() {
        let image = p2p(|m| {
            m["message_type"] = "image".into();
            m["content"] = r#"{"image_key":"img_v3_0abc"}"#.into();
        });
        let image = event_of(&image);
        assert_eq!(image.text, "");
        assert_eq!(
            image.attachments,
            [AttachmentRef {
                name: "img_v3_0abc.png".into(),
                media_type: None,
                size: None,
                source: AttachmentSource::Platform {
                    id: "om_11112222333344445555666677778888/img_v3_0abc/image".into()
                },
            }]
        );
        let file = p2p(|m| {
            m["message_type"] = "file".into();
            m["content"] = r#"{"file_key":"file_v3_0def","file_name":"trace.log"}"#.into();
        });
        let file = event_of(&file);
        assert_eq!(file.attachments[0].name, "trace.log");
        assert_eq!(
            file.attachments[0].source,
            AttachmentSource::Platform {
                id: "om_11112222333344445555666677778888/file_v3_0def/file".into()
            }
        );
    }

    #[test]
    fn kinds_antler_cannot_read_are_named() {
        for (kind, words) in [
            ("sticker", "sticker"),
            ("audio", "voice message"),
            ("media", "video"),
            ("location", "location"),
            ("interactive", "card"),
        ] {
            let body = p2p(|m| {
                m["message_type"] = kind.into();
                m["content"] = r#"{"file_key":"x"}"#.into();
            });
            let event = event_of(&body);
            assert_eq!(event.unsupported.as_deref(), Some(words), "{kind}");
            assert_eq!(event.text, "");
        }
    }

    #[test]
    fn other_events_are_ignored_and_garbage_is_malformed() {
        let read = variant("feishu_im_p2p_thread_reply.json", |_| {});
        let mut json: serde_json::Value = serde_json::from_slice(&read).unwrap();
        json["header"]["event_type"] = "im.message.message_read_v1".into();
        assert_eq!(
            parse(&channel(), &serde_json::to_vec(&json).unwrap()),
            Parsed::Ignore
        );
        let headers = http::HeaderMap::new();
        assert!(matches!(
            channel().parse(&request(&headers, b"{nope")),
            Err(ChannelError::Malformed(_))
        ));
        assert_eq!(
            channel().verify(&request(&headers, b"{nope")),
            Err(ChannelError::Unauthorized)
        );
        let mut json: serde_json::Value =
            serde_json::from_slice(&fixture("feishu_im_p2p_thread_reply.json")).unwrap();
        json["header"]["token"] = "wrong".into();
        assert_eq!(
            channel().verify(&request(&headers, &serde_json::to_vec(&json).unwrap())),
            Err(ChannelError::Unauthorized)
        );
    }

    // ---- encryption and signatures ----

    fn meta(name: &str) -> serde_json::Value {
        serde_json::from_slice(&fixture(&format!("{name}.encrypted.meta.json"))).unwrap()
    }

    fn signed_headers(timestamp: &str, nonce: &str, signature: &str) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        headers.insert(TIMESTAMP_HEADER, timestamp.parse().unwrap());
        headers.insert(NONCE_HEADER, nonce.parse().unwrap());
        headers.insert(SIGNATURE_HEADER, signature.parse().unwrap());
        headers
    }

    fn recorded(name: &str) -> http::HeaderMap {
        let meta = meta(name);
        assert_eq!(meta["encrypt_key"], ENCRYPT_KEY);
        let h = &meta["headers"];
        signed_headers(
            h["X-Lark-Request-Timestamp"].as_str().unwrap(),
            h["X-Lark-Request-Nonce"].as_str().unwrap(),
            h["X-Lark-Signature"].as_str().unwrap(),
        )
    }

    #[test]
    fn the_vectors_decrypt_to_their_plaintext() {
        let key = crypto::aes_key(ENCRYPT_KEY);
        for name in ["feishu_im_group_mention", "feishu_url_verification"] {
            let body: serde_json::Value =
                serde_json::from_slice(&fixture(&format!("{name}.encrypted.json"))).unwrap();
            let plain = crypto::decrypt(&key, body["encrypt"].as_str().unwrap()).unwrap();
            assert_eq!(
                hex::encode(Sha256::digest(&plain)),
                meta(name)["plaintext_sha256"].as_str().unwrap(),
                "{name}"
            );
        }
    }

    #[test]
    fn the_encrypted_mention_verifies_and_parses() {
        let channel = channel_with(Some(ENCRYPT_KEY), vector_clock_ms);
        let body = fixture("feishu_im_group_mention.encrypted.json");
        let headers = recorded("feishu_im_group_mention");
        assert_eq!(channel.verify_headers(&headers), Ok(()));
        let signed = request(&headers, &body);
        assert_eq!(channel.verify(&signed), Ok(()));
        let event = event(channel.parse(&signed).unwrap());
        assert_eq!(event.text, "restart web-api");
        assert_eq!(event.event_id, "om_dc13264520392913993dd051dba21dcf");

        // One byte of the body changed (inside the base64, so it still parses).
        let mut tampered = body.clone();
        let at = tampered.len() - 10;
        tampered[at] = if tampered[at] == b'A' { b'B' } else { b'A' };
        assert_eq!(
            channel.verify(&request(&headers, &tampered)),
            Err(ChannelError::Unauthorized)
        );
        // A wrong signature, or none.
        let h = &meta("feishu_im_group_mention")["headers"];
        let wrong = signed_headers("1767225600", "fixturenonce0001", &"0".repeat(64));
        assert_eq!(
            channel.verify(&request(&wrong, &body)),
            Err(ChannelError::Unauthorized)
        );
        let other_nonce = signed_headers(
            "1767225600",
            "fixturenonce0002",
            h["X-Lark-Signature"].as_str().unwrap(),
        );
        assert_eq!(
            channel.verify(&request(&other_nonce, &body)),
            Err(ChannelError::Unauthorized)
        );
        let none = http::HeaderMap::new();
        assert_eq!(
            channel.verify_headers(&none),
            Ok(()),
            "checked with the body"
        );
        assert_eq!(
            channel.verify(&request(&none, &body)),
            Err(ChannelError::Unauthorized)
        );
        // The same request a day later (Feishu retries for hours, and documents no window):
        // still Feishu's, by its signature.
        let later = channel_with(Some(ENCRYPT_KEY), || 1_767_312_000_000);
        assert_eq!(later.verify_headers(&headers), Ok(()));
        assert_eq!(later.verify(&request(&headers, &body)), Ok(()));
        assert_eq!(
            later.verify(&request(&headers, &tampered)),
            Err(ChannelError::Unauthorized)
        );
        // Another key cannot read it.
        let other_key = channel_with(Some("another-key"), vector_clock_ms);
        assert_eq!(
            other_key.verify(&request(&headers, &body)),
            Err(ChannelError::Unauthorized)
        );
    }

    #[test]
    fn the_encrypted_url_verification_is_answered_signed_or_not() {
        let channel = channel_with(Some(ENCRYPT_KEY), vector_clock_ms);
        let body = fixture("feishu_url_verification.encrypted.json");
        let headers = recorded("feishu_url_verification");
        for headers in [headers, http::HeaderMap::new()] {
            let signed = request(&headers, &body);
            assert_eq!(channel.verify(&signed), Ok(()));
            assert_eq!(
                channel.parse(&signed).unwrap(),
                Parsed::Reply(json!({"challenge": "ajls384kdj1234"}))
            );
        }
    }

    /// A request as Feishu would send it now: encrypted with `key`, signed at `timestamp`.
    fn sealed(plain: &serde_json::Value, key: &str, timestamp: u64) -> (Vec<u8>, http::HeaderMap) {
        let body = antler_testkit::feishu::sealed_body(&serde_json::to_vec(plain).unwrap(), key);
        let headers = antler_testkit::feishu::signed_headers(key, timestamp, "n0nce", &body);
        (body, headers)
    }

    #[test]
    fn fresh_encrypted_requests_verify_and_wrong_tokens_do_not() {
        let channel = channel_with(Some(ENCRYPT_KEY), vector_clock_ms);
        let plain: serde_json::Value =
            serde_json::from_slice(&fixture("feishu_im_p2p_thread_reply.json")).unwrap();
        let (body, headers) = sealed(&plain, ENCRYPT_KEY, 1_767_225_650);
        assert_eq!(channel.verify(&request(&headers, &body)), Ok(()));
        assert_eq!(
            event(channel.parse(&request(&headers, &body)).unwrap()).text,
            "and the error rate?"
        );

        // Signed and encrypted right, but with a wrong Verification Token inside.
        let mut wrong = plain.clone();
        wrong["header"]["token"] = "not-the-token".into();
        let (body, headers) = sealed(&wrong, ENCRYPT_KEY, 1_767_225_650);
        assert_eq!(
            channel.verify(&request(&headers, &body)),
            Err(ChannelError::Unauthorized)
        );
        let challenge = json!({"challenge": "c", "token": "nope", "type": "url_verification"});
        let (body, headers) = sealed(&challenge, ENCRYPT_KEY, 1_767_225_650);
        assert_eq!(
            channel.verify(&request(&headers, &body)),
            Err(ChannelError::Unauthorized)
        );

        // A plain body where an encrypted one is due, and the other way round.
        let plain_body = serde_json::to_vec(&plain).unwrap();
        let signature = crypto::signature("1767225650", "n0nce", ENCRYPT_KEY, &plain_body);
        let plain_headers = signed_headers("1767225650", "n0nce", &signature);
        assert_eq!(
            channel.verify(&request(&plain_headers, &plain_body)),
            Err(ChannelError::Unauthorized)
        );
        let (body, headers) = sealed(&plain, ENCRYPT_KEY, 1_767_225_650);
        assert_eq!(
            self::channel().verify(&request(&headers, &body)),
            Err(ChannelError::Unauthorized)
        );
    }

    // ---- the long connection ----

    #[test]
    fn in_websocket_mode_no_token_is_needed_and_no_webhook_request_verifies() {
        let s = FeishuSettings {
            verification_token: String::new(),
            websocket: true,
            ..settings(None)
        };
        let channel = FeishuChannel::new(&s, vector_clock_ms).unwrap();
        *channel.me.write().unwrap() = Some(FeishuIdentity {
            open_id: BOT.into(),
            name: "OpsBot".into(),
        });
        // An empty token in the body must not match the empty setting.
        let mut forged: serde_json::Value =
            serde_json::from_slice(&fixture("feishu_im_group_mention.json")).unwrap();
        forged["header"]["token"] = "".into();
        let body = serde_json::to_vec(&forged).unwrap();
        let headers = http::HeaderMap::new();
        assert_eq!(
            channel.verify(&request(&headers, &body)),
            Err(ChannelError::Unauthorized)
        );
        // The long connection's payload is the same event JSON, read the same way.
        let event: serde_json::Value =
            serde_json::from_slice(&fixture("feishu_im_group_mention.json")).unwrap();
        let parsed = channel.parse_json(&event).unwrap();
        let expected = self::channel()
            .parse(&request(&headers, &fixture("feishu_im_group_mention.json")))
            .unwrap();
        assert_eq!(parsed, expected);
        assert!(matches!(parsed, Parsed::Events(ref events) if events.len() == 1));
        // Webhook mode still needs the token.
        let webhook = FeishuSettings {
            verification_token: String::new(),
            ..settings(None)
        };
        assert!(FeishuChannel::new(&webhook, || 0).is_err());
    }

    // ---- settings, limits, rendering ----

    #[test]
    fn settings_are_checked_and_secrets_never_show_in_debug() {
        for blank in ["app_id", "app_secret", "verification_token"] {
            let mut s = settings(None);
            match blank {
                "app_id" => s.app_id.clear(),
                "app_secret" => s.app_secret.clear(),
                _ => s.verification_token.clear(),
            }
            let error = FeishuChannel::new(&s, || 0).unwrap_err();
            assert!(
                matches!(&error, ChannelError::Permanent(text) if text.contains(blank)),
                "{error:?}"
            );
        }
        let bad_url = FeishuSettings {
            api_url: "not a url".into(),
            ..settings(None)
        };
        assert!(matches!(
            FeishuChannel::new(&bad_url, || 0),
            Err(ChannelError::Permanent(_))
        ));
        let s = settings(Some(ENCRYPT_KEY));
        let channel = FeishuChannel::new(&s, || 0).unwrap();
        for debug in [
            format!("{s:?}"),
            format!("{channel:?}"),
            format!("{:?}", channel.api()),
        ] {
            for secret in [SECRET, VERIFICATION_TOKEN, ENCRYPT_KEY] {
                assert!(!debug.contains(secret), "{debug}");
            }
        }
        assert_eq!(FeishuSettings::default().api_url, "https://open.feishu.cn");
        assert!(FeishuSettings::default().cards);
    }

    #[test]
    fn limits_and_rendering_follow_cards() {
        let cards = channel();
        assert_eq!(cards.name(), "feishu");
        assert_eq!(cards.routes(), ["events"]);
        let limits = cards.limits();
        assert_eq!(limits.message, Some(Limit::Bytes(CARD_LIMIT)));
        assert_eq!(
            limits.edits,
            Some(EditRate {
                private: Duration::from_millis(500),
                group: Duration::from_secs(1)
            })
        );
        assert_eq!(
            cards.capabilities(),
            Capabilities {
                files: false,
                images: true,
                typing: false,
                progress_marks: false,
                buttons: true,
            }
        );
        assert_eq!(
            cards.render("**hi** & <you>").unwrap(),
            ["**hi** &amp; &lt;you&gt;"]
        );
        let long = "word ".repeat(12_000);
        let parts = cards.render(&long).unwrap();
        assert_eq!(parts.len(), 3);
        assert!(parts.iter().all(|p| p.len() <= CARD_LIMIT));

        let text = FeishuChannel::new(
            &FeishuSettings {
                cards: false,
                ..settings(None)
            },
            || 0,
        )
        .unwrap();
        assert_eq!(text.limits().message, Some(Limit::Bytes(TEXT_LIMIT)));
        assert_eq!(text.limits().edits, None);
        assert_eq!(text.render("**hi** & <you>").unwrap(), ["hi & <you>"]);
    }

    #[test]
    fn parts_are_sized_by_the_request_body_as_sent_not_by_the_markdown() {
        // Every `"` is `\"` in the card and `\\\"` in the body's `content` string: 24,000
        // bytes of this Markdown fit one 25,000-byte part but make a body of about 42,000.
        let quoted = "say \"a\" ".repeat(3_000);
        let controls = "\u{1}".repeat(20_000);
        for (name, cards, markdown, body_limit) in [
            ("quotes in a card", true, &quoted, CARD_BODY_LIMIT),
            (
                "control characters in a card",
                true,
                &controls,
                CARD_BODY_LIMIT,
            ),
            (
                "control characters as text",
                false,
                &controls,
                TEXT_BODY_LIMIT,
            ),
        ] {
            let channel = FeishuChannel::new(
                &FeishuSettings {
                    cards,
                    ..settings(None)
                },
                || 0,
            )
            .unwrap();
            let parts = channel.render(markdown).unwrap();
            for part in &parts {
                let size = channel.body_size(part);
                assert!(size <= body_limit, "{name}: a body of {size} bytes");
                let (msg_type, content) = channel.content(part);
                let sent = client::reply_body(msg_type, &content, &part_uuid("k", 9));
                assert!(sent.to_string().len() <= size, "{name}: measured as sent");
            }
            let whole: String = parts.concat();
            assert_eq!(
                whole.matches(['"', '\u{1}']).count(),
                markdown.matches(['"', '\u{1}']).count(),
                "{name}: nothing lost in {} parts",
                parts.len()
            );
        }
        // An ordinary answer is still one part.
        assert_eq!(channel().render(&"word ".repeat(4_000)).unwrap().len(), 1);
    }

    #[test]
    fn schema_1_0_events_verify_by_their_token_and_are_acknowledged_not_answered() {
        // The 1.0 "message" event: the token at the top, the message flat in `event`.
        let old = json!({
            "uuid": "41b5f371157e3d5341b38b20396e77a3", "token": VERIFICATION_TOKEN,
            "ts": "1767225600.000", "type": "event_callback",
            "event": {"type": "message", "app_id": "cli_a1b2c3d4e5f60001",
                      "tenant_key": TENANT, "open_chat_id": "oc_5ad11d72b830411d72b836c20b1c9d1f",
                      "chat_type": "private", "msg_type": "text",
                      "open_id": "ou_7d8a6e6df7621556ce0d21922b676706",
                      "open_message_id": "om_old0001", "is_mention": false,
                      "text": "restart web-api", "text_without_at_bot": "restart web-api"}
        });
        let body = serde_json::to_vec(&old).unwrap();
        assert_eq!(parse(&channel(), &body), Parsed::Ignore);
        let mut forged = old.clone();
        forged["token"] = "not-the-token".into();
        let headers = http::HeaderMap::new();
        let forged = serde_json::to_vec(&forged).unwrap();
        assert_eq!(
            channel().verify(&request(&headers, &forged)),
            Err(ChannelError::Unauthorized)
        );
    }

    #[test]
    fn part_uuids_are_stable_distinct_and_short() {
        let a = part_uuid("reply-0190-aaaa", 0);
        assert_eq!(a, part_uuid("reply-0190-aaaa", 0));
        assert_ne!(a, part_uuid("reply-0190-aaaa", 1));
        assert_ne!(a, part_uuid("reply-0190-aaab", 0));
        assert!(a.len() <= 50, "{a}");
    }

    // ---- sending ----

    /// The testkit's Open Platform, serving one image of the user's message too.
    async fn mock_api() -> MockFeishu {
        use wiremock::matchers::{method, path};
        use wiremock::{Mock, ResponseTemplate};

        let server = MockFeishu::start().await;
        Mock::given(method("GET"))
            .and(path(
                "/open-apis/im/v1/messages/om_user1/resources/img_v3_a",
            ))
            .respond_with(
                ResponseTemplate::new(200)
                    .insert_header("content-type", "image/png")
                    .set_body_bytes(b"PNG".to_vec()),
            )
            .mount(&server)
            .await;
        server
    }

    fn live(server: &wiremock::MockServer, cards: bool) -> FeishuChannel {
        FeishuChannel::new(
            &FeishuSettings {
                api_url: server.uri(),
                cards,
                ..settings(None)
            },
            vector_clock_ms,
        )
        .unwrap()
    }

    fn outbound(reply_to: Option<&str>) -> OutboundMessage {
        OutboundMessage {
            prompts: Vec::new(),
            idempotency_key: "reply-0001".into(),
            conversation: ConversationKey::new("feishu", [TENANT, "oc_chat1", "om_user1"]),
            thread_id: "t".into(),
            text: "**done** & dusted".into(),
            reply_to: reply_to.map(str::to_owned),
            files: Vec::new(),
            reply_context: None,
        }
    }

    async fn bodies(server: &wiremock::MockServer) -> Vec<(String, String, serde_json::Value)> {
        server
            .received_requests()
            .await
            .unwrap()
            .iter()
            .filter(|r| !r.url.path().contains("tenant_access_token"))
            .map(|r| {
                (
                    r.method.to_string(),
                    r.url.path().to_owned(),
                    serde_json::from_slice(&r.body).unwrap_or(Value::Null),
                )
            })
            .collect()
    }

    #[tokio::test]
    async fn replies_are_cards_that_edits_replace() {
        let server = mock_api().await;
        let channel = live(&server, true);
        let message = outbound(Some("om_user1"));
        let parts = channel.render(&message.text).unwrap();
        assert_eq!(parts, ["**done** &amp; dusted"]);
        let part = Part {
            buttons: &[],
            index: 0,
            body: &parts[0],
        };
        let receipt = channel.send(&message, part).await.unwrap();
        assert_eq!(receipt.platform_message_id, REPLY_ID);
        channel
            .edit(
                &message,
                &receipt,
                Part {
                    buttons: &[],
                    index: 0,
                    body: "**done**, really",
                },
            )
            .await
            .unwrap();
        let sent = bodies(&server).await;
        let (method, path, reply) = &sent[0];
        assert_eq!(
            (method.as_str(), path.as_str()),
            ("POST", "/open-apis/im/v1/messages/om_user1/reply")
        );
        assert_eq!(reply["msg_type"], "interactive");
        assert_eq!(reply["reply_in_thread"], false);
        assert_eq!(reply["uuid"], part_uuid("reply-0001", 0));
        let card: Value = serde_json::from_str(reply["content"].as_str().unwrap()).unwrap();
        assert_eq!(card["config"]["update_multi"], true);
        assert_eq!(
            card["elements"],
            json!([{"tag": "markdown", "content": "**done** &amp; dusted"}])
        );
        let (method, path, patch) = &sent[1];
        assert_eq!(
            (method.as_str(), path.as_str()),
            (
                "PATCH",
                format!("/open-apis/im/v1/messages/{REPLY_ID}").as_str()
            )
        );
        let card: Value = serde_json::from_str(patch["content"].as_str().unwrap()).unwrap();
        assert_eq!(card["config"]["update_multi"], true);
        assert_eq!(card["elements"][0]["content"], "**done**, really");
    }

    #[tokio::test]
    async fn without_cards_replies_are_text_and_cannot_be_edited() {
        let server = mock_api().await;
        let channel = live(&server, false);
        let message = outbound(Some("om_user1"));
        let receipt = channel
            .send(
                &message,
                Part {
                    buttons: &[],
                    index: 2,
                    body: "done & dusted",
                },
            )
            .await
            .unwrap();
        assert_eq!(
            channel
                .edit(
                    &message,
                    &receipt,
                    Part {
                        buttons: &[],
                        index: 2,
                        body: "x"
                    }
                )
                .await,
            Err(ChannelError::Unsupported)
        );
        let sent = bodies(&server).await;
        assert_eq!(sent.len(), 1, "no PATCH was made");
        let reply = &sent[0].2;
        assert_eq!(reply["msg_type"], "text");
        assert_eq!(reply["content"], r#"{"text":"done & dusted"}"#);
        assert_eq!(reply["uuid"], part_uuid("reply-0001", 2));
    }

    #[tokio::test]
    async fn without_a_message_to_reply_to_a_topic_gets_it_and_a_private_chat_too() {
        let server = mock_api().await;
        let channel = live(&server, true);
        channel
            .send(
                &outbound(None),
                Part {
                    buttons: &[],
                    index: 0,
                    body: "hi",
                },
            )
            .await
            .unwrap();
        let requests = server.received_requests().await.unwrap();
        assert_eq!(
            requests.last().unwrap().url.path(),
            "/open-apis/im/v1/messages/om_user1/reply",
            "a group conversation's answer stays in its topic"
        );
        let private = OutboundMessage {
            conversation: ConversationKey::new("feishu", [TENANT, "oc_chat1"]),
            ..outbound(None)
        };
        let receipt = channel
            .send(
                &private,
                Part {
                    buttons: &[],
                    index: 0,
                    body: "hi",
                },
            )
            .await
            .unwrap();
        assert_eq!(receipt.platform_message_id, REPLY_ID);
        let requests = server.received_requests().await.unwrap();
        let last = requests.last().unwrap();
        assert_eq!(last.url.path(), "/open-apis/im/v1/messages");
        assert_eq!(last.url.query(), Some("receive_id_type=chat_id"));
        let body: Value = serde_json::from_slice(&last.body).unwrap();
        assert_eq!(body["receive_id"], "oc_chat1");

        let stray = OutboundMessage {
            prompts: Vec::new(),
            conversation: ConversationKey::new("slack", ["T1", "C1"]),
            ..outbound(None)
        };
        assert!(matches!(
            channel
                .send(
                    &stray,
                    Part {
                        buttons: &[],
                        index: 0,
                        body: "x"
                    }
                )
                .await,
            Err(ChannelError::Permanent(_))
        ));
    }

    #[tokio::test]
    async fn the_learned_identity_lets_group_mentions_through() {
        let server = mock_api().await;
        let channel = live(&server, true);
        assert_eq!(channel.identity(), None);
        let body = fixture("feishu_im_group_mention.json");
        let headers = http::HeaderMap::new();
        assert!(matches!(
            channel.parse(&request(&headers, &body)),
            Err(ChannelError::Transient(_))
        ));
        let me = channel.learn_identity().await.unwrap();
        assert_eq!(
            me,
            FeishuIdentity {
                open_id: BOT.into(),
                name: "OpsBot".into()
            }
        );
        assert_eq!(channel.identity(), Some(me));
        assert_eq!(event(parse(&channel, &body)).text, "restart web-api");
    }

    #[tokio::test]
    async fn attachments_are_fetched_by_their_platform_id() {
        let server = mock_api().await;
        let channel = live(&server, true);
        let reference = |id: &str| AttachmentRef {
            name: "a.png".into(),
            media_type: None,
            size: None,
            source: AttachmentSource::Platform { id: id.into() },
        };
        assert_eq!(
            channel
                .fetch_attachment(&reference("om_user1/img_v3_a/image"), 100)
                .await
                .unwrap(),
            b"PNG"
        );
        let requests = server.received_requests().await.unwrap();
        assert_eq!(requests.last().unwrap().url.query(), Some("type=image"));
        for bad in [
            "om_user1/img_v3_a",
            "om_user1/img_v3_a/audio",
            "a/b/image/x",
            "/k/file",
        ] {
            assert!(
                matches!(
                    channel.fetch_attachment(&reference(bad), 100).await,
                    Err(ChannelError::Permanent(_))
                ),
                "{bad}"
            );
        }
        let url = AttachmentRef {
            source: AttachmentSource::Url {
                url: "https://x.example/a".into(),
            },
            ..reference("x")
        };
        assert_eq!(
            channel.fetch_attachment(&url, 100).await,
            Err(ChannelError::Unsupported)
        );
    }

    // ---- buttons ----

    /// The card a message body carries.
    fn sent_card(body: &Value) -> Value {
        serde_json::from_str(body["content"].as_str().unwrap()).unwrap()
    }

    /// Sends a prompt's part with Approve and Deny in `conversation`; the card sent.
    async fn send_prompt(cards: bool, conversation: ConversationKey) -> Value {
        let server = mock_api().await;
        let channel = live(&server, cards);
        let message = OutboundMessage {
            conversation,
            ..outbound(Some("om_user1"))
        };
        let buttons = antler_testkit::approve_deny();
        channel
            .send(
                &message,
                Part {
                    buttons: &buttons,
                    index: 1,
                    body: "⏸ Approval needed: current_time",
                },
            )
            .await
            .unwrap();
        let sent = bodies(&server).await;
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].2["msg_type"], "interactive", "buttons need a card");
        sent_card(&sent[0].2)
    }

    #[tokio::test]
    async fn a_part_with_buttons_is_a_card_with_a_button_row_naming_its_topic() {
        // Feishu's card JSON 1.0: an `action` element holds `button`s, each with `text`
        // (plain_text), `type` (primary, danger) and a `value` sent back when pressed.
        let card = send_prompt(
            true,
            ConversationKey::new("feishu", [TENANT, "oc_chat1", "om_root1"]),
        )
        .await;
        assert_eq!(card["config"]["update_multi"], true);
        assert_eq!(
            card["elements"],
            json!([
                {"tag": "markdown", "content": "⏸ Approval needed: current_time"},
                {"tag": "action", "actions": [
                    {"tag": "button", "text": {"tag": "plain_text", "content": "✅ Approve"},
                     "type": "primary",
                     "value": {"action": "approve:k3x9p2ab", "root": "om_root1"}},
                    {"tag": "button", "text": {"tag": "plain_text", "content": "❌ Deny"},
                     "type": "danger",
                     "value": {"action": "deny:k3x9p2ab", "root": "om_root1"}}
                ]}
            ])
        );
        // In a private chat there is no topic to name.
        let card = send_prompt(true, ConversationKey::new("feishu", [TENANT, "oc_p2p1"])).await;
        assert_eq!(
            card["elements"][1]["actions"][0]["value"],
            json!({"action": "approve:k3x9p2ab"})
        );
    }

    #[tokio::test]
    async fn without_cards_a_part_with_buttons_is_a_card_of_plain_text() {
        let card = send_prompt(false, ConversationKey::new("feishu", [TENANT, "oc_p2p1"])).await;
        assert_eq!(
            card["elements"][0],
            json!({"tag": "div", "text": {"tag": "plain_text",
                   "content": "⏸ Approval needed: current_time"}})
        );
        assert_eq!(card["elements"][1]["actions"][1]["type"], "danger");
    }

    #[tokio::test]
    async fn a_plain_text_prompt_too_long_for_a_card_goes_without_its_buttons() {
        let server = mock_api().await;
        let channel = live(&server, false);
        let long = "x".repeat(40_000);
        let buttons = antler_testkit::approve_deny();
        channel
            .send(
                &outbound(Some("om_user1")),
                Part {
                    buttons: &buttons,
                    index: 0,
                    body: &long,
                },
            )
            .await
            .unwrap();
        let sent = bodies(&server).await;
        assert_eq!(sent[0].2["msg_type"], "text");
    }

    fn press_of(parsed: Parsed) -> Press {
        match parsed {
            Parsed::Press(press) => press,
            other => panic!("expected a press: {other:?}"),
        }
    }

    #[test]
    fn a_recorded_press_is_the_presser_in_the_cards_conversation() {
        let press = press_of(parse(
            &channel(),
            &fixture("feishu_card_action_trigger.json"),
        ));
        // The author of the group mention, and the conversation its answer is in.
        let message = event_of(&fixture("feishu_im_group_mention.json"));
        assert_eq!(press.channel, "feishu");
        assert_eq!(press.conversation, message.conversation);
        assert_eq!(press.user, message.user);
        assert_eq!(press.user.aliases, ["ada01"]);
        assert!(!press.user.admin, "the ingress marks admins");
        assert_eq!(press.chat, message.chat);
        assert_eq!(press.action, "approve:k3x9p2ab");
        assert_eq!(press.message_id, REPLY_ID);
        assert_eq!(press.answer_context, None);
    }

    #[tokio::test]
    async fn a_press_comes_back_in_the_conversation_its_card_was_sent_in() {
        for conversation in [
            ConversationKey::new("feishu", [TENANT, "oc_5ad11d72b830411d72b836c20b1c9d1f"]),
            ConversationKey::new(
                "feishu",
                [TENANT, "oc_5ad11d72b830411d72b836c20b1c9d1f", "om_root1"],
            ),
        ] {
            let card = send_prompt(true, conversation.clone()).await;
            let value = card["elements"][1]["actions"][1]["value"].clone();
            let body = press_variant(|e| e["action"]["value"] = value);
            let press = press_of(parse(&channel(), &body));
            assert_eq!(press.conversation, conversation);
            assert_eq!(press.action, "deny:k3x9p2ab");
        }
    }

    /// The recorded press with its `event` changed by `edit`.
    fn press_variant(edit: impl FnOnce(&mut Value)) -> Vec<u8> {
        variant("feishu_card_action_trigger.json", edit)
    }

    #[test]
    fn presses_that_are_not_antlers_are_ignored_and_broken_ones_refused() {
        let channel = channel();
        let headers = http::HeaderMap::new();
        let outcome = |body: &[u8]| {
            let request = request(&headers, body);
            channel.verify(&request).unwrap();
            channel.parse(&request)
        };
        for (name, body) in [
            (
                "another card's button",
                press_variant(|e| e["action"]["value"] = json!({"key": "v"})),
            ),
            (
                "a select menu",
                press_variant(|e| e["action"]["tag"] = "select_static".into()),
            ),
            (
                "no value",
                press_variant(|e| e["action"]["value"] = Value::Null),
            ),
        ] {
            assert_eq!(outcome(&body), Ok(Parsed::Ignore), "{name}");
        }
        let mut other_app: Value =
            serde_json::from_slice(&fixture("feishu_card_action_trigger.json")).unwrap();
        other_app["header"]["app_id"] = "cli_someone_else".into();
        assert_eq!(
            outcome(&serde_json::to_vec(&other_app).unwrap()),
            Ok(Parsed::Ignore)
        );
        for (name, body) in [
            (
                "a long action",
                press_variant(|e| e["action"]["value"]["action"] = "a".repeat(65).into()),
            ),
            (
                "an action that is not text",
                press_variant(|e| e["action"]["value"]["action"] = json!(7)),
            ),
            (
                "a topic that is not an id",
                press_variant(|e| e["action"]["value"]["root"] = "om_1:x".into()),
            ),
            (
                "no presser",
                press_variant(|e| {
                    e.as_object_mut().unwrap().remove("operator");
                }),
            ),
            (
                "no message",
                press_variant(|e| e["context"]["open_message_id"] = "".into()),
            ),
            (
                "a chat id that would change the key",
                press_variant(|e| e["context"]["open_chat_id"] = "oc_1:om_2".into()),
            ),
            (
                "an operator that is not an object",
                press_variant(|e| e["operator"] = json!("ou_1")),
            ),
        ] {
            assert!(
                matches!(outcome(&body), Err(ChannelError::Malformed(_))),
                "{name}"
            );
        }
    }

    #[test]
    fn a_press_is_verified_like_an_event() {
        let plain: Value =
            serde_json::from_slice(&fixture("feishu_card_action_trigger.json")).unwrap();
        let mut forged = plain.clone();
        forged["header"]["token"] = "not-the-token".into();
        let headers = http::HeaderMap::new();
        assert_eq!(
            channel().verify(&request(&headers, &serde_json::to_vec(&forged).unwrap())),
            Err(ChannelError::Unauthorized)
        );
        // Encrypted and signed with the Encrypt Key, as Feishu sends callbacks when one is set.
        let channel = channel_with(Some(ENCRYPT_KEY), vector_clock_ms);
        let (body, headers) = sealed(&plain, ENCRYPT_KEY, 1_767_225_720);
        let signed = request(&headers, &body);
        assert_eq!(channel.verify(&signed), Ok(()));
        assert_eq!(
            press_of(channel.parse(&signed).unwrap()).action,
            "approve:k3x9p2ab"
        );
        let unsigned = http::HeaderMap::new();
        assert_eq!(
            channel.verify(&request(&unsigned, &body)),
            Err(ChannelError::Unauthorized)
        );
        let (body, headers) = sealed(&forged, ENCRYPT_KEY, 1_767_225_720);
        assert_eq!(
            channel.verify(&request(&headers, &body)),
            Err(ChannelError::Unauthorized)
        );
    }

    #[tokio::test]
    async fn a_decision_answers_with_a_toast_and_the_card_without_buttons() {
        let press = press_of(parse(
            &channel(),
            &fixture("feishu_card_action_trigger.json"),
        ));
        let answer = PressAnswer {
            notice: "✅ Approved current\\_time (k3x9p2ab); it runs now.".into(),
            update: Some("⏸ Approval needed: current\\_time\n✅ Approved by Ada & co.".into()),
            decided_now: true,
        };
        let body = channel()
            .answer_press(&press, &answer)
            .await
            .unwrap()
            .unwrap();
        // "Card callback communication": the response holds `toast` ({type, content}) and
        // `card` ({"type": "raw", "data": <card JSON>}) replacing the card pressed.
        assert_eq!(
            body["toast"],
            json!({"type": "success",
                   "content": "✅ Approved current_time (k3x9p2ab); it runs now."})
        );
        assert_eq!(body["card"]["type"], "raw");
        let card = &body["card"]["data"];
        assert_eq!(card["config"]["update_multi"], true);
        assert_eq!(
            card["elements"],
            json!([{"tag": "markdown",
                    "content": "⏸ Approval needed: current&#95;time\n✅ Approved by Ada &amp; co."}])
        );
    }

    #[tokio::test]
    async fn a_refusal_is_an_error_toast_and_the_card_stays() {
        let press = press_of(parse(
            &channel(),
            &fixture("feishu_card_action_trigger.json"),
        ));
        let answer = PressAnswer {
            notice: "Sorry, only approvers can decide on tool calls; nothing changed.".into(),
            update: None,
            decided_now: false,
        };
        let body = channel()
            .answer_press(&press, &answer)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            body,
            json!({"toast": {"type": "error",
                   "content": "Sorry, only approvers can decide on tool calls; nothing changed."}})
        );
        // A long notice is cut to one toast.
        let long = PressAnswer {
            notice: "word ".repeat(500),
            update: None,
            decided_now: false,
        };
        let body = channel()
            .answer_press(&press, &long)
            .await
            .unwrap()
            .unwrap();
        assert!(body["toast"]["content"].as_str().unwrap().len() <= TOAST_LIMIT);
    }
}
