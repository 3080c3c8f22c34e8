//! Feishu as an antler [`Channel`]: event subscriptions on one route, decrypted and verified,
//! messages normalized, answers sent as replies (message cards edited in place, or text).

use std::sync::RwLock;
use std::time::Duration;

use antler_channel::render::{self, FeishuMarkdown, Limit, PlainText};
use antler_channel::{
    AttachmentRef, AttachmentSource, Capabilities, Channel, ChannelError, ConversationKey,
    EditRate, Limits, OutboundMessage, Parsed, Part, Receipt, WebhookRequest, verify,
};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::client::{DEFAULT_API_URL, FeishuApi, FeishuIdentity};
use crate::crypto;
use crate::normalize::{Context, MessageReceived, NAME, Normalized, normalize_message};

/// The most Markdown one card holds, in UTF-8 bytes. Feishu refuses cards over 30 KB; the rest
/// is room for the card around the text (about 100 bytes) and for JSON escaping of quotes,
/// backslashes and line breaks in the card's content string, which adds a few percent to an
/// ordinary answer.
const CARD_LIMIT: usize = 25_000;

/// The most plain text one message holds, in UTF-8 bytes: Feishu allows 150 KB, but longer
/// messages are hard to read, and this keeps even an all-escapes text far under the limit.
const TEXT_LIMIT: usize = 30_000;

/// How far a request's timestamp may be from now, in seconds, either side. Feishu documents no
/// window; five minutes is what Slack uses, and Feishu's retries come with a fresh timestamp.
const MAX_AGE_SECS: i64 = 300;

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
    /// The Verification Token from the app's event subscription page.
    pub verification_token: String,
    /// The Encrypt Key from the same page; when set, every event is encrypted and signed.
    pub encrypt_key: Option<String>,
    /// The Open API base URL: `https://open.feishu.cn`, or `https://open.larksuite.com` for Lark.
    pub api_url: String,
    /// Answer with message cards (Markdown, edited while written); `false` sends plain text.
    pub cards: bool,
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
    /// The channel for `settings`; `now_ms` stamps received messages, judges the age of signed
    /// requests and times the tenant token's renewal.
    pub fn new(settings: &FeishuSettings, now_ms: fn() -> u64) -> Result<Self, ChannelError> {
        for (value, name) in [
            (&settings.app_id, "app_id"),
            (&settings.app_secret, "app_secret"),
            (&settings.verification_token, "verification_token"),
        ] {
            if value.trim().is_empty() {
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

    fn token_matches(&self, presented: Option<&str>) -> bool {
        presented.is_some_and(|token| {
            verify::constant_time_eq(token.as_bytes(), self.verification_token.as_bytes())
        })
    }

    /// The signature headers present, fresh, and matching the raw body.
    fn signature_matches(&self, key: &EncryptKey, request: &WebhookRequest<'_>) -> bool {
        let (Some(timestamp), Some(nonce), Some(signature)) = (
            header(request.headers, TIMESTAMP_HEADER),
            header(request.headers, NONCE_HEADER),
            header(request.headers, SIGNATURE_HEADER),
        ) else {
            return false;
        };
        if !self.fresh(timestamp) {
            return false;
        }
        let expected = crypto::signature(timestamp, nonce, &key.text, request.body);
        verify::constant_time_eq(
            signature.trim().to_ascii_lowercase().as_bytes(),
            expected.as_bytes(),
        )
    }

    fn fresh(&self, timestamp: &str) -> bool {
        let Ok(timestamp) = timestamp.trim().parse::<i64>() else {
            return false;
        };
        let now = i64::try_from((self.now_ms)() / 1000).unwrap_or(i64::MAX);
        verify::timestamp_within(timestamp, now, MAX_AGE_SECS)
    }

    /// The card or text message a part is sent as: `(msg_type, content)`.
    fn content(&self, body: &str) -> (&'static str, String) {
        if self.cards {
            ("interactive", card(body).to_string())
        } else {
            ("text", json!({"text": body}).to_string())
        }
    }
}

/// A message card holding `markdown`; `update_multi` makes it editable for everyone who sees
/// it (Feishu wants it both when sending and when patching).
fn card(markdown: &str) -> Value {
    json!({
        "config": {"wide_screen_mode": true, "update_multi": true},
        "elements": [{"tag": "markdown", "content": markdown}],
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
fn header<'a>(headers: &'a http::HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

#[async_trait::async_trait]
impl Channel for FeishuChannel {
    fn name(&self) -> &'static str {
        NAME
    }

    /// `events`: the event subscription's request URL is `/webhooks/feishu/events`.
    fn routes(&self) -> &'static [&'static str] {
        &["events"]
    }

    /// A timestamp header, if present, within 5 minutes of now. Presence of the signature
    /// headers cannot be required here: Feishu may send its URL verification unsigned, which
    /// only the (decrypted) body tells, so [`Channel::verify`] requires them for everything else.
    fn verify_headers(&self, headers: &http::HeaderMap) -> Result<(), ChannelError> {
        match header(headers, TIMESTAMP_HEADER) {
            Some(timestamp) if !self.fresh(timestamp) => Err(ChannelError::Unauthorized),
            _ => Ok(()),
        }
    }

    /// With an Encrypt Key: the body decrypts with it, and then either it is a URL verification
    /// whose `token` is the Verification Token (decrypting already proved the sender knows the
    /// key), or the signature headers are present, fresh and match
    /// `SHA-256(timestamp + nonce + key + body)` (compared in constant time) and `header.token`
    /// is the Verification Token. Without one: the token alone.
    fn verify(&self, request: &WebhookRequest<'_>) -> Result<(), ChannelError> {
        self.verify_headers(request.headers)?;
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
        let schema = event.get("schema").and_then(Value::as_str);
        let event_type = event.pointer("/header/event_type").and_then(Value::as_str);
        if schema != Some("2.0") || event_type != Some("im.message.receive_v1") {
            tracing::debug!(
                ?schema,
                ?event_type,
                "a Feishu event antler does not handle"
            );
            return Ok(Parsed::Ignore);
        }
        let received = MessageReceived::deserialize(&event)
            .map_err(|e| ChannelError::Malformed(format!("not a message event: {e}")))?;
        let me = self.identity();
        let context = Context {
            bot_open_id: me.as_ref().map(|me| me.open_id.as_str()),
            received_at_ms: (self.now_ms)(),
        };
        Ok(match normalize_message(&received, &context) {
            Normalized::Event(event) => Parsed::Events(vec![*event]),
            Normalized::Ignored(reason) => {
                tracing::debug!(reason, "Feishu message ignored");
                Parsed::Ignore
            }
        })
    }

    /// Card Markdown in chunks of at most 25,000 bytes, or plain text in chunks of 30,000
    /// bytes without cards.
    fn render(&self, markdown: &str) -> Result<Vec<String>, ChannelError> {
        let parts = match self.limits().message {
            Some(limit) if self.cards => render::parts(markdown, &FeishuMarkdown, limit),
            Some(limit) => render::parts(markdown, &PlainText, limit),
            None => render::parts(markdown, &PlainText, Limit::Bytes(TEXT_LIMIT)),
        };
        parts.map_err(|e| ChannelError::Permanent(e.to_string()))
    }

    /// Replies to the user's message (every part, so they stay together under it); without
    /// one, posts to the chat.
    async fn send(
        &self,
        message: &OutboundMessage,
        part: Part<'_>,
    ) -> Result<Receipt, ChannelError> {
        let (msg_type, content) = self.content(part.body);
        let uuid = part_uuid(&message.idempotency_key, part.index);
        let id = match message.reply_to.as_deref().filter(|id| !id.is_empty()) {
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
            files: true,
            images: true,
            typing: false,
        }
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
