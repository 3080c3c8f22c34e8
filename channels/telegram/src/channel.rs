//! Telegram as an antler [`Channel`]: the webhook's secret header, the update parsed and
//! normalized, attachments fetched through the Bot API.

use std::sync::RwLock;
use std::time::Duration;

use antler_channel::render::{self, Limit, TelegramHtml};
use antler_channel::{
    AttachmentRef, AttachmentSource, Button, Capabilities, Channel, ChannelError, ConversationKey,
    EditRate, FileContent, Limits, OutboundFile, OutboundMessage, Parsed, Part, Press, PressAnswer,
    Receipt, WebhookRequest, verify,
};
use teloxide_core::types::Update;

use crate::client::{SendFailure, Target, TelegramApi};
use crate::normalize::{BotIdentity, Normalized, UnreadableUpdate, normalize, read_update};

/// The most a message may hold, in UTF-16 units (Telegram counts after parsing the markup;
/// counting the markup too keeps every chunk under it).
const MESSAGE_LIMIT: usize = 4096;

/// The largest file a bot may upload through the Bot API, in bytes (50 MB).
const UPLOAD_LIMIT: u64 = 50 * 1000 * 1000;

/// The header Telegram sends the webhook secret in.
pub const SECRET_HEADER: &str = "x-telegram-bot-api-secret-token";

/// What the Telegram channel is set up with.
#[derive(Clone)]
pub struct TelegramSettings {
    /// The bot token from @BotFather.
    pub bot_token: String,
    /// The secret the webhook carries in [`SECRET_HEADER`].
    pub webhook_secret: String,
    /// The Bot API base URL.
    pub api_url: String,
}

impl std::fmt::Debug for TelegramSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelegramSettings")
            .field("bot_token", &"***")
            .field("webhook_secret", &"***")
            .field("api_url", &self.api_url)
            .finish()
    }
}

/// The Telegram channel.
pub struct TelegramChannel {
    webhook_secret: String,
    api: TelegramApi,
    /// Who the bot is: its id is the token's prefix; its username comes from `getMe`
    /// ([`TelegramChannel::learn_identity`]); until then, mentions by name are not recognised.
    me: RwLock<BotIdentity>,
    now_ms: fn() -> u64,
}

impl std::fmt::Debug for TelegramChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelegramChannel")
            .field("webhook_secret", &"***")
            .field("api", &self.api)
            .finish_non_exhaustive()
    }
}

impl TelegramChannel {
    /// The channel for `settings`; `now_ms` stamps received messages.
    pub fn new(settings: &TelegramSettings, now_ms: fn() -> u64) -> Result<Self, ChannelError> {
        let id = settings
            .bot_token
            .split_once(':')
            .and_then(|(id, _)| id.parse().ok())
            .ok_or_else(|| {
                ChannelError::Permanent(
                    "channels.telegram.bot_token does not look like a bot token (<id>:<secret>)"
                        .to_owned(),
                )
            })?;
        Ok(Self {
            webhook_secret: settings.webhook_secret.clone(),
            api: TelegramApi::new(&settings.bot_token, &settings.api_url)?,
            me: RwLock::new(BotIdentity {
                id,
                username: String::new(),
            }),
            now_ms,
        })
    }

    /// The Bot API client.
    pub fn api(&self) -> &TelegramApi {
        &self.api
    }

    /// Asks Telegram who the bot is (`getMe`) and remembers it.
    pub async fn learn_identity(&self) -> Result<BotIdentity, ChannelError> {
        let me = self.api.get_me().await?;
        if let Ok(mut known) = self.me.write() {
            known.clone_from(&me);
        }
        Ok(me)
    }

    /// What an update's JSON is for antler: the message when it addresses the bot, else
    /// nothing. The webhook and the polling loop share it. The update is read by
    /// [`read_update`], so a message teloxide cannot fully model is still read for what antler
    /// needs; one nothing can be read from is acknowledged (Telegram would only send it
    /// again), logged at warn with its id and counted.
    pub fn parse_json(&self, raw: &serde_json::Value) -> Result<Parsed, ChannelError> {
        match read_update(raw) {
            Ok(Some(update)) => self.parse_update(&update),
            Ok(None) => Err(ChannelError::Malformed(
                "not a Telegram update: no update_id".to_owned(),
            )),
            Err(unreadable) => Ok(Self::unreadable(&unreadable)),
        }
    }

    /// [`TelegramChannel::parse_json`] once the update is read. A group message that may
    /// address the bot before `getMe` told its username is [`ChannelError::Transient`]: not
    /// taken, so Telegram delivers it again (the webhook answers 503; polling does not
    /// confirm it).
    fn parse_update(&self, update: &Update) -> Result<Parsed, ChannelError> {
        let me = self.identity();
        Ok(match normalize(update, &me, (self.now_ms)()) {
            Normalized::Message(incoming) if incoming.facts.addressed(&me) => {
                Parsed::Events(vec![incoming.event])
            }
            Normalized::Message(incoming) if incoming.facts.may_be_addressed(&me) => {
                return Err(ChannelError::Transient(
                    "a Telegram group message with a mention arrived before the bot's username \
                     is known (getMe); Telegram delivers it again"
                        .to_owned(),
                ));
            }
            Normalized::Message(_) => {
                tracing::debug!(
                    update_id = update.id.0,
                    "telegram update not addressed to the bot"
                );
                Parsed::Ignore
            }
            Normalized::Moved(chat_move) => Parsed::Moved(chat_move),
            Normalized::Press(press) => Parsed::Press(*press),
            Normalized::Ignored(why) => {
                tracing::debug!(update_id = update.id.0, why, "telegram update ignored");
                Parsed::Ignore
            }
        })
    }

    /// An update nothing can be read from: acknowledged (Telegram would only send it again),
    /// logged with its id and counted.
    fn unreadable(unreadable: &UnreadableUpdate) -> Parsed {
        tracing::warn!(
            update_id = unreadable.update_id,
            reason = %unreadable.reason,
            "a telegram update could not be read and is dropped"
        );
        metrics::counter!("antler_telegram_unreadable_updates_total").increment(1);
        Parsed::Ignore
    }

    /// Sends one chunk of HTML to `target`, again as the same words without markup when
    /// Telegram cannot parse it.
    async fn send_html(
        &self,
        target: &Target,
        body: &str,
        buttons: &[Button],
    ) -> Result<i32, SendFailure> {
        match self.api.send_text(target, body, true, buttons).await {
            Err(SendFailure::Markup) => {
                self.api
                    .send_text(target, &plain(body), false, buttons)
                    .await
            }
            sent => sent,
        }
    }

    /// Replaces the text of message `message_id` in `chat_id` with `body` (HTML, or the same
    /// words plain when Telegram cannot parse it); its inline keyboard goes with the old text.
    async fn edit_html(
        &self,
        chat_id: i64,
        message_id: i32,
        body: &str,
    ) -> Result<(), ChannelError> {
        match self.api.edit_text(chat_id, message_id, body, true).await {
            Ok(()) => Ok(()),
            Err(SendFailure::Markup) => self
                .api
                .edit_text(chat_id, message_id, &plain(body), false)
                .await
                .map_err(markup_refused),
            Err(failure) => Err(markup_refused(failure)),
        }
    }

    fn identity(&self) -> BotIdentity {
        self.me
            .read()
            .map(|me| me.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }
}

/// The chat and topic of `telegram:<chat>[:<topic>]`.
fn chat_of(conversation: &ConversationKey) -> Result<(i64, Option<i32>), ChannelError> {
    let mut parts = conversation.as_str().split(':').skip(1);
    let chat_id: i64 = parts
        .next()
        .and_then(|chat| chat.parse().ok())
        .ok_or_else(|| {
            ChannelError::Permanent(format!("not a Telegram conversation: {conversation}"))
        })?;
    Ok((chat_id, parts.next().and_then(|topic| topic.parse().ok())))
}

/// Where `message` goes: `telegram:<chat>[:<topic>]`; in groups (negative chat ids) it
/// replies to the user's message.
fn target(message: &OutboundMessage) -> Result<Target, ChannelError> {
    let (chat_id, topic) = chat_of(&message.conversation)?;
    let reply_to = if chat_id < 0 {
        message.reply_to.as_deref().and_then(|id| id.parse().ok())
    } else {
        None
    };
    Ok(Target {
        chat_id,
        topic,
        reply_to,
    })
}

/// A plain-text retry Telegram refused too: it is not the markup, so it will not go through.
fn markup_refused(failure: SendFailure) -> ChannelError {
    match failure {
        SendFailure::Markup => {
            ChannelError::Permanent("Telegram refused the message's markup".to_owned())
        }
        SendFailure::TopicGone => {
            ChannelError::Permanent("Telegram refused the chat's General topic too".to_owned())
        }
        SendFailure::Migrated(chat) => ChannelError::Permanent(format!(
            "the group became supergroup {chat}; messages must go there"
        )),
        SendFailure::Other(e) => e,
    }
}

/// What opens an answer moved to the General topic because its own topic is closed or gone.
const TOPIC_GONE_NOTE: &str =
    "<i>This answers a message in a topic that is now closed or deleted.</i>\n\n";

/// The note and `body` when they fit in one message, else `body` alone.
fn with_topic_note(body: &str) -> String {
    let units = |text: &str| text.encode_utf16().count();
    if units(TOPIC_GONE_NOTE) + units(body) <= MESSAGE_LIMIT {
        format!("{TOPIC_GONE_NOTE}{body}")
    } else {
        body.to_owned()
    }
}

/// The words of a chunk of our own Telegram HTML: tags dropped, entities decoded.
fn plain(html: &str) -> String {
    let mut text = String::with_capacity(html.len());
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => in_tag = false,
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&amp;", "&")
}

#[async_trait::async_trait]
impl Channel for TelegramChannel {
    fn name(&self) -> &'static str {
        "telegram"
    }

    fn verify_headers(&self, headers: &http::HeaderMap) -> Result<(), ChannelError> {
        let given = headers
            .get(SECRET_HEADER)
            .map(|value| value.as_bytes())
            .unwrap_or_default();
        if self.webhook_secret.is_empty()
            || !verify::constant_time_eq(given, self.webhook_secret.as_bytes())
        {
            return Err(ChannelError::Unauthorized);
        }
        Ok(())
    }

    /// The secret header is all Telegram signs a webhook with.
    fn verify(&self, request: &WebhookRequest<'_>) -> Result<(), ChannelError> {
        self.verify_headers(request.headers)
    }

    /// See [`TelegramChannel::parse_json`].
    fn parse(&self, request: &WebhookRequest<'_>) -> Result<Parsed, ChannelError> {
        let raw: serde_json::Value = serde_json::from_slice(request.body)
            .map_err(|e| ChannelError::Malformed(format!("not a Telegram update: {e}")))?;
        self.parse_json(&raw)
    }

    /// Telegram HTML in chunks of at most 4096 UTF-16 units.
    fn render(&self, markdown: &str) -> Result<Vec<String>, ChannelError> {
        render::parts(markdown, &TelegramHtml, Limit::Utf16(MESSAGE_LIMIT))
            .map_err(|e| ChannelError::Permanent(e.to_string()))
    }

    /// Sends one chunk of HTML; a chunk Telegram cannot parse goes again as the same words
    /// without markup. In groups the first part replies to the user's message; topic messages
    /// stay in their topic.
    async fn send(
        &self,
        message: &OutboundMessage,
        part: Part<'_>,
    ) -> Result<Receipt, ChannelError> {
        let mut target = target(message)?;
        if part.index > 0 {
            // Only the first part is a reply; the rest follow it.
            target.reply_to = None;
        }
        let mut body = std::borrow::Cow::Borrowed(part.body);
        // A refused topic, then a migrated group: at most one detour each.
        for _ in 0..3 {
            match self.send_html(&target, &body, part.buttons).await {
                Err(SendFailure::TopicGone) if target.topic.is_some() => {
                    // The topic is closed or deleted: the General topic takes the answer, with
                    // a note on its first part saying where it belongs.
                    target.topic = None;
                    target.reply_to = None;
                    if part.index == 0 {
                        body = std::borrow::Cow::Owned(with_topic_note(part.body));
                    }
                }
                Err(SendFailure::Migrated(chat)) if chat != target.chat_id => {
                    // The group became a supergroup; its old message ids do not exist there.
                    tracing::info!(
                        from = target.chat_id,
                        to = chat,
                        "telegram group became a supergroup; answering there"
                    );
                    target.chat_id = chat;
                    target.reply_to = None;
                }
                sent => {
                    let id = sent.map_err(markup_refused)?;
                    return Ok(Receipt {
                        platform_message_id: id.to_string(),
                    });
                }
            }
        }
        Err(ChannelError::Permanent(
            "Telegram refused the message in its topic, its chat and where they moved".to_owned(),
        ))
    }

    /// Uploads a reply's file as a document (`sendDocument`) after the reply's text, in its
    /// topic. A file over Telegram's upload limit (50 MB) is refused, not tried.
    async fn send_file(
        &self,
        message: &OutboundMessage,
        file: &OutboundFile,
        content: FileContent,
    ) -> Result<Receipt, ChannelError> {
        if content.size > UPLOAD_LIMIT {
            return Err(ChannelError::Permanent(format!(
                "{} is larger than Telegram's upload limit of {UPLOAD_LIMIT} bytes",
                file.file_name()
            )));
        }
        let mut target = target(message)?;
        // The text before it already answered the user's message.
        target.reply_to = None;
        // A second handle on the file, for the General topic if the topic is gone.
        let again = content.file.try_clone().ok();
        let size = content.size;
        let id = match self
            .api
            .send_document(&target, content, file.file_name())
            .await
        {
            Err(SendFailure::TopicGone) => {
                let mut handle = again.ok_or_else(|| {
                    ChannelError::Transient("the file could not be opened again".to_owned())
                })?;
                std::io::Seek::rewind(&mut handle)
                    .map_err(|e| ChannelError::Transient(format!("rewinding the file: {e}")))?;
                let general = Target {
                    topic: None,
                    ..target
                };
                self.api
                    .send_document(
                        &general,
                        FileContent { file: handle, size },
                        file.file_name(),
                    )
                    .await
            }
            sent => sent,
        }
        .map_err(markup_refused)?;
        Ok(Receipt {
            platform_message_id: id.to_string(),
        })
    }

    /// Edits a sent message to `part`, falling back to plain words as [`Channel::send`] does.
    async fn edit(
        &self,
        message: &OutboundMessage,
        sent: &Receipt,
        part: Part<'_>,
    ) -> Result<(), ChannelError> {
        let (chat_id, _) = chat_of(&message.conversation)?;
        let message_id: i32 = sent.platform_message_id.parse().map_err(|_| {
            ChannelError::Permanent(format!(
                "not a Telegram message id: {}",
                sent.platform_message_id
            ))
        })?;
        self.edit_html(chat_id, message_id, part.body).await
    }

    /// Answers the press's callback query with the notice (an alert when nothing changed, so
    /// a refusal is not missed), then replaces the button's message with the update, which
    /// removes its keyboard. A callback query Telegram no longer knows (answered late) does
    /// not stop the update.
    async fn answer_press(
        &self,
        press: &Press,
        answer: &PressAnswer,
    ) -> Result<Option<serde_json::Value>, ChannelError> {
        let answered = match &press.answer_context {
            Some(query) => {
                self.api
                    .answer_callback(query.expose(), &answer.notice, answer.update.is_none())
                    .await
            }
            None => Ok(()),
        };
        if let Some(update) = &answer.update {
            let (chat_id, _) = chat_of(&press.conversation)?;
            let message_id: i32 = press.message_id.parse().map_err(|_| {
                ChannelError::Malformed(format!("not a Telegram message id: {}", press.message_id))
            })?;
            let body = self.render(update)?.into_iter().next().unwrap_or_default();
            self.edit_html(chat_id, message_id, &body).await?;
        }
        answered.map(|()| None)
    }

    /// 4096 UTF-16 units a message; edits at most once a second in private chats and once
    /// every 3 seconds in groups (Telegram allows about 20 messages a minute in a group).
    fn limits(&self) -> Limits {
        Limits {
            message: Some(Limit::Utf16(MESSAGE_LIMIT)),
            edits: Some(EditRate {
                private: Duration::from_secs(1),
                group: Duration::from_secs(3),
            }),
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            files: true,
            images: true,
            typing: true,
            progress_marks: false,
            buttons: true,
        }
    }

    async fn typing(&self, conversation: &ConversationKey) -> Result<(), ChannelError> {
        let (chat_id, topic) = chat_of(conversation)?;
        self.api.typing(chat_id, topic).await
    }

    async fn fetch_attachment(
        &self,
        attachment: &AttachmentRef,
        max_bytes: u64,
    ) -> Result<Vec<u8>, ChannelError> {
        match &attachment.source {
            AttachmentSource::Platform { id } => self.api.fetch_file(id, max_bytes).await,
            AttachmentSource::Url { .. } | AttachmentSource::Inline { .. } => {
                Err(ChannelError::Unsupported)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use antler_testkit::telegram::MockTelegram;

    use super::*;

    fn channel() -> TelegramChannel {
        let channel = TelegramChannel::new(
            &TelegramSettings {
                bot_token: "7000000001:TEST-token".into(),
                webhook_secret: "s3cret_hook-1".into(),
                api_url: "http://127.0.0.1:9".into(),
            },
            || 42,
        )
        .unwrap();
        if let Ok(mut me) = channel.me.write() {
            me.username = "opsbot_bot".into();
        }
        channel
    }

    fn request<'a>(headers: &'a http::HeaderMap, body: &'a [u8]) -> WebhookRequest<'a> {
        WebhookRequest {
            route: "",
            headers,
            body,
        }
    }

    fn fixture(name: &str) -> Vec<u8> {
        antler_testkit::fixture_bytes("telegram", &format!("{name}.json"))
    }

    #[test]
    fn the_secret_header_must_match_exactly() {
        let channel = channel();
        let mut headers = http::HeaderMap::new();
        assert_eq!(
            channel.verify(&request(&headers, b"{}")),
            Err(ChannelError::Unauthorized)
        );
        headers.insert(SECRET_HEADER, "s3cret_hook-2".parse().unwrap());
        assert_eq!(
            channel.verify(&request(&headers, b"{}")),
            Err(ChannelError::Unauthorized)
        );
        headers.insert(SECRET_HEADER, "s3cret_hook-1".parse().unwrap());
        assert_eq!(channel.verify(&request(&headers, b"{}")), Ok(()));
    }

    #[test]
    fn addressed_messages_are_events_and_the_rest_is_ignored() {
        let channel = channel();
        let headers = http::HeaderMap::new();
        for name in [
            "tg_private_text",
            "tg_group_mention",
            "tg_group_command",
            "tg_reply_to_bot",
            "tg_forum_topic",
            "tg_photo_caption",
            "tg_document",
        ] {
            let parsed = channel.parse(&request(&headers, &fixture(name))).unwrap();
            let Parsed::Events(events) = parsed else {
                panic!("{name} is for the bot: {parsed:?}")
            };
            assert_eq!(events.len(), 1, "{name}");
            assert_eq!(events[0].received_at_ms, 42);
        }
        // A plain group message that does not address the bot.
        let plain = String::from_utf8(fixture("tg_group_mention"))
            .unwrap()
            .replace("🚀 @opsbot_bot restart web-api", "restart web-api please")
            .replace(
                "\"offset\": 3, \"length\": 11, \"type\": \"mention\"",
                "\"offset\": 0, \"length\": 7, \"type\": \"bold\"",
            );
        assert_eq!(
            channel.parse(&request(&headers, plain.as_bytes())).unwrap(),
            Parsed::Ignore
        );
        assert!(matches!(
            channel.parse(&request(&headers, b"{not json")),
            Err(ChannelError::Malformed(_))
        ));
    }

    #[test]
    fn before_get_me_a_group_mention_is_left_for_redelivery_not_dropped() {
        // The bot's id is the token's prefix, its username only comes with getMe.
        let channel = TelegramChannel::new(
            &TelegramSettings {
                bot_token: "7000000001:TEST-token".into(),
                webhook_secret: "s3cret_hook-1".into(),
                api_url: "http://127.0.0.1:9".into(),
            },
            || 42,
        )
        .unwrap();
        let headers = http::HeaderMap::new();
        let parse = |body: &[u8]| channel.parse(&request(&headers, body));
        // An @username mention and `/status@opsbot_bot` may be the bot's: not taken, so the
        // webhook answers 503 and Telegram delivers them again.
        for name in ["tg_group_mention", "tg_group_command"] {
            let parsed = parse(&fixture(name));
            assert!(
                matches!(parsed, Err(ChannelError::Transient(_))),
                "{name}: {parsed:?}"
            );
        }
        // What needs no username is handled as always: private chats, replies to the bot (its
        // id is known), a command naming no bot, a group message naming nobody.
        let command = String::from_utf8(fixture("tg_group_command"))
            .unwrap()
            .replace("/status@opsbot_bot prod", "/status prod")
            .replace("\"length\": 18", "\"length\": 7");
        for (name, body) in [
            ("private", fixture("tg_private_text")),
            ("reply to the bot", fixture("tg_reply_to_bot")),
            ("command for any bot", command.into_bytes()),
        ] {
            let parsed = parse(&body);
            assert!(
                matches!(&parsed, Ok(Parsed::Events(events)) if events.len() == 1),
                "{name}: {parsed:?}"
            );
        }
        let plain = String::from_utf8(fixture("tg_group_mention"))
            .unwrap()
            .replace("\"type\": \"mention\"", "\"type\": \"bold\"");
        assert_eq!(parse(plain.as_bytes()), Ok(Parsed::Ignore));
    }

    /// The testkit's Bot API, refusing as unparsable HTML the messages whose text contains
    /// `REFUSE`.
    async fn mock_api() -> MockTelegram {
        use wiremock::matchers::{body_string_contains, method, path_regex};
        use wiremock::{Mock, ResponseTemplate};

        let server = MockTelegram::start().await;
        Mock::given(method("POST"))
            .and(path_regex("/bot[^/]+/SendMessage"))
            .and(body_string_contains("REFUSE"))
            .and(body_string_contains("\"parse_mode\":\"HTML\""))
            .respond_with(ResponseTemplate::new(400).set_body_json(serde_json::json!({
                "ok": false, "error_code": 400,
                "description": "Bad Request: can't parse entities: Unsupported start tag \"x\" at byte offset 0"
            })))
            .with_priority(1)
            .mount(&server)
            .await;
        server
    }

    fn channel_at(url: &str) -> TelegramChannel {
        TelegramChannel::new(
            &TelegramSettings {
                bot_token: "7000000001:TEST-token".into(),
                webhook_secret: "s".into(),
                api_url: url.into(),
            },
            || 0,
        )
        .unwrap()
    }

    fn answer(conversation: &str, text: &str) -> OutboundMessage {
        OutboundMessage {
            prompts: Vec::new(),
            idempotency_key: "k".into(),
            conversation: antler_channel::ConversationKey::new("telegram", conversation.split(':')),
            thread_id: "t".into(),
            text: text.into(),
            reply_to: Some("88".into()),
            files: Vec::new(),
            reply_context: None,
        }
    }

    /// Renders `message` and sends every part, as delivery does.
    async fn send_all(channel: &TelegramChannel, message: &OutboundMessage) -> Vec<Receipt> {
        let mut receipts = Vec::new();
        for (index, body) in channel.render(&message.text).unwrap().iter().enumerate() {
            receipts.push(
                channel
                    .send(
                        message,
                        Part {
                            index,
                            body,
                            buttons: &[],
                        },
                    )
                    .await
                    .unwrap(),
            );
        }
        receipts
    }

    #[tokio::test]
    async fn a_file_is_uploaded_as_a_document_in_its_topic() {
        let server = MockTelegram::start().await;
        server.accept_documents().await;
        let channel = channel_at(&server.uri());
        assert!(channel.capabilities().files);
        let dir = std::env::temp_dir().join(format!("antler-tg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("report.csv");
        std::fs::write(&path, "host,uptime\napi,99.9\n").unwrap();
        let content = || FileContent {
            file: std::fs::File::open(&path).unwrap(),
            size: 21,
        };
        let file = OutboundFile {
            name: "daily/report.csv".into(),
            media_type: "text/csv".into(),
            size: 21,
        };
        let message = answer("-1003300440055:400", "Here it is.");
        let receipt = channel.send_file(&message, &file, content()).await.unwrap();
        assert_eq!(receipt.platform_message_id, "701");
        let requests = server.received_requests().await.unwrap();
        assert_eq!(requests.len(), 1);
        let body = String::from_utf8_lossy(&requests[0].body);
        assert!(body.contains("filename=\"report.csv\""), "{body}");
        assert!(body.contains("api,99.9"), "{body}");
        assert!(body.contains("-1003300440055"), "{body}");
        assert!(body.contains("400"), "the topic: {body}");
        assert!(!body.contains("reply_parameters"), "{body}");

        // Over Telegram's upload limit: refused for good, nothing sent.
        let huge = FileContent {
            size: UPLOAD_LIMIT + 1,
            ..content()
        };
        let error = channel.send_file(&message, &file, huge).await.unwrap_err();
        assert!(matches!(error, ChannelError::Permanent(_)), "{error:?}");
        assert_eq!(server.received_requests().await.unwrap().len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Telegram refuses uploads into a deleted topic ("Bad Request: message thread not found")
    /// as it refuses messages: the file goes to the General topic.
    #[tokio::test]
    async fn a_file_for_a_deleted_topic_goes_to_general() {
        use wiremock::matchers::{body_string_contains, method, path_regex};
        use wiremock::{Mock, ResponseTemplate};

        let server = MockTelegram::start().await;
        Mock::given(method("POST"))
            .and(path_regex("/bot[^/]+/SendDocument"))
            .and(body_string_contains("name=\"message_thread_id\""))
            .respond_with(ResponseTemplate::new(400).set_body_json(serde_json::json!({
                "ok": false, "error_code": 400,
                "description": "Bad Request: message thread not found"
            })))
            .with_priority(1)
            .mount(&server)
            .await;
        server.accept_documents().await;
        let channel = channel_at(&server.uri());
        let dir = std::env::temp_dir().join(format!("antler-tg-gone-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("report.csv");
        std::fs::write(&path, "host,uptime\napi,99.9\n").unwrap();
        let content = FileContent {
            file: std::fs::File::open(&path).unwrap(),
            size: 21,
        };
        let file = OutboundFile {
            name: "report.csv".into(),
            media_type: "text/csv".into(),
            size: 21,
        };
        let message = answer("-1003300440055:400", "Here it is.");
        let receipt = channel.send_file(&message, &file, content).await.unwrap();
        assert_eq!(receipt.platform_message_id, "701");
        let requests = server.received_requests().await.unwrap();
        assert_eq!(requests.len(), 2);
        let general = String::from_utf8_lossy(&requests[1].body);
        assert!(!general.contains("message_thread_id"), "{general}");
        assert!(
            general.contains("api,99.9"),
            "the whole file again: {general}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_long_answer_goes_in_valid_chunks_the_first_replying_in_its_topic() {
        let server = mock_api().await;
        let channel = channel_at(&server.uri());
        let mut markdown = String::new();
        for i in 0..50 {
            markdown.push_str(&format!("## Step {i}\n\nSome **bold** words & more.\n\n"));
            markdown.push_str("```rust\nfn main() { println!(\"<hi>\"); }\n```\n\n");
            markdown.push_str(&"word ".repeat(30));
            markdown.push_str("\n\n");
        }
        assert!(markdown.len() > 10_000);
        let receipts = send_all(&channel, &answer("-1003300440055:400", &markdown)).await;
        assert_eq!(receipts[0].platform_message_id, "700");
        let bodies = server.sent().await;
        assert!(bodies.len() >= 3, "{} messages", bodies.len());
        for (index, body) in bodies.iter().enumerate() {
            let text = body["text"].as_str().unwrap();
            assert!(text.encode_utf16().count() <= MESSAGE_LIMIT);
            assert_eq!(body["parse_mode"], "HTML");
            assert_eq!(body["chat_id"], -1_003_300_440_055i64);
            assert_eq!(body["message_thread_id"], 400);
            let replies = body.get("reply_parameters").is_some();
            assert_eq!(replies, index == 0, "only the first chunk replies");
            assert_eq!(
                text.matches("<pre>").count(),
                text.matches("</pre>").count()
            );
        }
        assert_eq!(bodies[0]["reply_parameters"]["message_id"], 88);
    }

    #[tokio::test]
    async fn markup_telegram_refuses_is_sent_again_as_plain_words() {
        let server = mock_api().await;
        let channel = channel_at(&server.uri());
        send_all(&channel, &answer("5550001001", "**REFUSE** this & that")).await;
        let bodies = server.sent().await;
        assert_eq!(bodies.len(), 2);
        assert_eq!(bodies[0]["text"], "<b>REFUSE</b> this &amp; that");
        assert_eq!(bodies[1]["text"], "REFUSE this & that");
        assert_eq!(bodies[1].get("parse_mode"), None);
        assert_eq!(
            bodies[1].get("reply_parameters"),
            None,
            "private chats get no reply quote"
        );
    }

    #[tokio::test]
    async fn a_prompt_shows_its_buttons_and_a_press_is_answered_and_its_message_replaced() {
        let server = MockTelegram::start().await;
        let channel = channel_at(&server.uri());
        assert!(channel.capabilities().buttons);
        let message = answer("-1002200330044:77", "");
        let buttons = antler_testkit::approve_deny();
        let part = Part {
            index: 1,
            body: "⏸ Approval needed",
            buttons: &buttons,
        };
        channel.send(&message, part).await.unwrap();
        let sent = server.calls("SendMessage").await;
        assert_eq!(
            sent[0]["reply_markup"],
            serde_json::json!({"inline_keyboard": [[
                {"text": "✅ Approve", "callback_data": "approve:k3x9p2ab"},
                {"text": "❌ Deny", "callback_data": "deny:k3x9p2ab"}
            ]]})
        );
        assert_eq!(sent[0]["message_thread_id"], 77);

        // Too long for callback_data: Telegram refuses it, and so does the channel, for good.
        let long = [Button {
            action: "x".repeat(65),
            ..buttons[0].clone()
        }];
        let refused = channel
            .send(
                &message,
                Part {
                    buttons: &long,
                    ..part
                },
            )
            .await
            .unwrap_err();
        assert!(!refused.is_retryable(), "{refused:?}");

        let raw: serde_json::Value =
            serde_json::from_str(&antler_testkit::telegram::fixture("tg_callback_query")).unwrap();
        let Parsed::Press(press) = channel.parse_json(&raw).unwrap() else {
            panic!("not a press");
        };
        let refusal = PressAnswer {
            notice: "Sorry, only approvers can decide".into(),
            update: None,
            decided_now: false,
        };
        assert_eq!(channel.answer_press(&press, &refusal).await.unwrap(), None);
        let decided = PressAnswer {
            notice: "n".repeat(300),
            update: Some("⏸ Approval needed\n✅ Approved by **Lin**".into()),
            decided_now: true,
        };
        channel.answer_press(&press, &decided).await.unwrap();
        let answers = server.calls("AnswerCallbackQuery").await;
        assert_eq!(answers.len(), 2);
        assert_eq!(answers[0]["callback_query_id"], "4382bfdwdsb323b2d9");
        assert_eq!(answers[0]["show_alert"], true, "a refusal is not missed");
        assert_eq!(answers[1]["show_alert"], false);
        // "Text of the notification [...] 0-200 characters".
        assert_eq!(answers[1]["text"].as_str().unwrap().chars().count(), 200);
        let edits = server.calls("EditMessageText").await;
        assert_eq!(edits.len(), 1, "a refusal leaves the message as it is");
        assert_eq!(edits[0]["chat_id"], -1_002_200_330_044i64);
        assert_eq!(edits[0]["message_id"], 1310);
        assert!(edits[0]["text"].as_str().unwrap().contains("<b>Lin</b>"));
        // editMessageText without reply_markup removes the inline keyboard.
        assert!(edits[0].get("reply_markup").is_none());
    }

    #[tokio::test]
    async fn edits_count_not_modified_as_done_and_fall_back_to_plain_words() {
        use wiremock::matchers::{body_string_contains, method, path_regex};
        use wiremock::{Mock, ResponseTemplate};

        let server = MockTelegram::start().await;
        let refuse = |needle: &str, description: &str| {
            Mock::given(method("POST"))
                .and(path_regex("/bot[^/]+/EditMessageText"))
                .and(body_string_contains(needle))
                .and(body_string_contains("\"parse_mode\":\"HTML\""))
                .respond_with(ResponseTemplate::new(400).set_body_json(serde_json::json!({
                    "ok": false, "error_code": 400, "description": description
                })))
                .with_priority(1)
        };
        refuse("SAME", "Bad Request: message is not modified: specified new message content and reply markup are exactly the same as a current content and reply markup of the message")
            .mount(&server)
            .await;
        refuse(
            "REFUSE",
            "Bad Request: can't parse entities: Unsupported start tag",
        )
        .mount(&server)
        .await;
        let channel = channel_at(&server.uri());
        let message = answer("5550001001", "");
        let sent_id = Receipt {
            platform_message_id: "5".into(),
        };
        let part = |body| Part {
            index: 0,
            body,
            buttons: &[],
        };
        channel
            .edit(&message, &sent_id, part("SAME"))
            .await
            .unwrap();
        channel
            .edit(&message, &sent_id, part("<b>REFUSE</b> &amp;"))
            .await
            .unwrap();
        let bodies = server.calls("EditMessageText").await;
        assert_eq!(bodies.len(), 3);
        assert_eq!(bodies[0]["message_id"], 5);
        assert_eq!(bodies[0]["chat_id"], 5_550_001_001i64);
        assert_eq!(bodies[2]["text"], "REFUSE &");
        assert_eq!(bodies[2].get("parse_mode"), None);
        let limits = channel.limits();
        assert_eq!(limits.message, Some(Limit::Utf16(MESSAGE_LIMIT)));
        let rate = limits.edits.unwrap();
        assert!(rate.group > rate.private);
    }

    #[test]
    fn a_token_without_an_id_is_refused_naming_the_key() {
        let error = TelegramChannel::new(
            &TelegramSettings {
                bot_token: "nonsense".into(),
                webhook_secret: "s".into(),
                api_url: "http://127.0.0.1:9".into(),
            },
            || 0,
        )
        .unwrap_err();
        assert!(matches!(error, ChannelError::Permanent(text) if text.contains("bot_token")));
        let debug = format!(
            "{:?}",
            TelegramSettings {
                bot_token: "1:SECRET".into(),
                webhook_secret: "HOOK".into(),
                api_url: "u".into()
            }
        );
        assert!(
            !debug.contains("SECRET") && !debug.contains("HOOK"),
            "{debug}"
        );
    }
}
