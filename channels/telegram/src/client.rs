//! The Bot API calls antler makes, with every failure mapped to a [`ChannelError`] whose text
//! never holds the bot token (it is part of every request URL, and reqwest's errors name the
//! URL).
//!
//! Requests are built with teloxide's payloads. The calls that answer people (send, edit,
//! typing, upload) and `getUpdates` are sent by [`TelegramApi::call`] rather than teloxide's
//! request layer, which sleeps 10 s inside every call answered 5xx and then reads a JSON 5xx
//! (`{"ok":false,"error_code":502,...}`) as a permanent API error: here a 5xx, JSON or not, is
//! [`ChannelError::Transient`] at once, and delivery's backoff decides when to try again.
//! Setup calls (`setWebhook`, `getMe`, ...) still go through teloxide.

use std::sync::Arc;

use antler_channel::{Button, ChannelError};
use serde::de::DeserializeOwned;
use serde_json::Value;
use teloxide_core::Bot;
use teloxide_core::errors::{ApiError, RequestError};
use teloxide_core::net::Download;
use teloxide_core::payloads::{
    AnswerCallbackQuerySetters, DeleteWebhookSetters, EditMessageTextSetters, GetUpdatesSetters,
    SendChatActionSetters, SendMessageSetters, SetWebhookSetters,
};
use teloxide_core::requests::{HasPayload, Payload, Request, Requester};
use teloxide_core::types::{
    AllowedUpdate, BotCommand, CallbackQueryId, ChatAction, ChatId, FileId, InlineKeyboardButton,
    InlineKeyboardMarkup, MessageId, ParseMode, ReplyParameters, Seconds, ThreadId,
};

use crate::normalize::BotIdentity;

impl std::fmt::Debug for WebhookSettings<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookSettings")
            .field("url", &self.url)
            .field("secret_token", &"***")
            .field("drop_pending_updates", &self.drop_pending_updates)
            .finish()
    }
}

/// Where a message goes: the chat, the forum topic, the message it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    /// The chat.
    pub chat_id: i64,
    /// The forum topic, for topic messages.
    pub topic: Option<i32>,
    /// The message this one replies to (in groups).
    pub reply_to: Option<i32>,
}

/// Why a message was not sent.
#[derive(Debug, Clone, PartialEq)]
pub enum SendFailure {
    /// Telegram could not parse the HTML.
    Markup,
    /// The forum topic is closed or deleted ("Bad Request: TOPIC_CLOSED", "Bad Request:
    /// message thread not found"): the chat's General topic still takes it.
    TopicGone,
    /// The group became a supergroup with this id (`parameters.migrate_to_chat_id`).
    Migrated(i64),
    /// Anything else.
    Other(ChannelError),
}

/// The update types antler asks Telegram for: messages, and presses of its buttons.
pub const ALLOWED_UPDATES: &[&str] = &["message", "callback_query"];

/// The longest notice `answerCallbackQuery` shows ("Text of the notification. If not specified,
/// nothing will be shown to the user, 0-200 characters").
const CALLBACK_TEXT_LIMIT: usize = 200;

/// `buttons` as one row of an inline keyboard, each sending its action back as
/// `callback_data` (1-64 bytes, which [`Button::MAX_ACTION_BYTES`] keeps).
fn keyboard(buttons: &[Button]) -> InlineKeyboardMarkup {
    InlineKeyboardMarkup::new([buttons
        .iter()
        .map(|button| InlineKeyboardButton::callback(button.label.clone(), button.action.clone()))
        .collect::<Vec<_>>()])
}

/// What `setWebhook` is told.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookSettings<'a> {
    /// The HTTPS URL Telegram posts updates to.
    pub url: &'a str,
    /// Sent back in `X-Telegram-Bot-Api-Secret-Token` on every webhook request.
    pub secret_token: &'a str,
    /// Drop the updates waiting for delivery.
    pub drop_pending_updates: bool,
}

/// The webhook as Telegram reports it (`getWebhookInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookStatus {
    /// The webhook URL; `None` when no webhook is set.
    pub url: Option<String>,
    /// Updates waiting for delivery.
    pub pending_update_count: u32,
    /// When the last delivery failed, in Unix seconds.
    pub last_error_date: Option<i64>,
    /// Why the last delivery failed.
    pub last_error_message: Option<String>,
    /// Simultaneous webhook connections Telegram opens at most.
    pub max_connections: Option<u32>,
    /// The update types delivered; `None` means Telegram's default (all but a few).
    pub allowed_updates: Option<Vec<String>>,
}

/// One entry of the bot's command menu (`setMyCommands`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MenuCommand {
    /// The command without its `/`: 1 to 32 of `a-z 0-9 _`.
    pub command: String,
    /// What it does: 1 to 256 characters.
    pub description: String,
}

/// A Bot API client for one bot.
#[derive(Clone)]
pub struct TelegramApi {
    bot: Bot,
    /// The HTTP client `bot` uses too (teloxide's timeouts), for [`TelegramApi::call`].
    http: reqwest::Client,
}

/// A Bot API answer: `{"ok": true, "result": …}` or `{"ok": false, "error_code": N,
/// "description": "…", "parameters"?: {"retry_after"?: N, "migrate_to_chat_id"?: N}}`.
#[derive(serde::Deserialize)]
struct Answer<R> {
    ok: bool,
    result: Option<R>,
    #[serde(default)]
    description: String,
    error_code: Option<u16>,
    parameters: Option<Value>,
}

/// A message the Bot API created: only its id is read, so a field teloxide cannot model never
/// turns a sent message into an error (and a second send).
#[derive(serde::Deserialize)]
struct Sent {
    message_id: i32,
}

/// Why a call [`TelegramApi::call`] made failed.
#[derive(Debug)]
pub(crate) enum CallError {
    /// What teloxide's request layer would have answered (refusals, rate limits, network).
    Request(RequestError),
    /// The Bot API answered 5xx, as JSON or not: Telegram is restarting or overloaded.
    Server {
        /// The HTTP status.
        status: u16,
        /// Telegram's description, or the start of the body.
        description: String,
    },
    /// The request could not be built.
    Build(String),
}

/// Whether Telegram's `description` says a forum topic is closed or gone.
fn topic_gone(description: &str) -> bool {
    ["TOPIC_CLOSED", "TOPIC_DELETED", "message thread not found"]
        .iter()
        .any(|needle| description.contains(needle))
}

/// The most of a non-JSON error body an error message quotes.
const QUOTED_BODY: usize = 200;

impl std::fmt::Debug for TelegramApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelegramApi")
            .field("api_url", &self.bot.api_url().as_str())
            .finish_non_exhaustive()
    }
}

impl TelegramApi {
    /// A client for the bot with `token`, at `api_url` (`https://api.telegram.org`, a local
    /// Bot API server, or a mock).
    pub fn new(token: &str, api_url: &str) -> Result<Self, ChannelError> {
        let url = reqwest::Url::parse(api_url).map_err(|e| {
            ChannelError::Permanent(format!("channels.telegram.api_url is not a URL: {e}"))
        })?;
        let http = teloxide_core::net::default_reqwest_settings()
            .build()
            .map_err(|e| ChannelError::Permanent(format!("no HTTP client for Telegram: {e}")))?;
        if url.cannot_be_a_base() {
            return Err(ChannelError::Permanent(format!(
                "channels.telegram.api_url is not a base URL: {url}"
            )));
        }
        Ok(Self {
            bot: Bot::with_client(token, http.clone()).set_api_url(url),
            http,
        })
    }

    /// Sends `payload` as JSON to its method and reads the answer's `result` as `R`.
    async fn call<P, R>(&self, payload: &P) -> Result<R, CallError>
    where
        P: Payload + serde::Serialize,
        R: DeserializeOwned,
    {
        let body = serde_json::to_vec(payload).map_err(|e| CallError::Build(e.to_string()))?;
        let request = self
            .http
            .post(self.method_url(P::NAME)?)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        self.answer(request).await
    }

    /// Sends `request` and reads its answer.
    async fn answer<R: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<R, CallError> {
        let network = |e: reqwest::Error| CallError::Request(RequestError::Network(Arc::new(e)));
        let response = request.send().await.map_err(network)?;
        let status = response.status();
        let text = response.text().await.map_err(network)?;
        let server = |description: String| CallError::Server {
            status: status.as_u16(),
            description,
        };
        let answer: Answer<R> = match serde_json::from_str(&text) {
            Ok(answer) => answer,
            Err(_) if status.is_server_error() => {
                return Err(server(text.chars().take(QUOTED_BODY).collect()));
            }
            Err(source) => {
                return Err(CallError::Request(RequestError::InvalidJson {
                    source: Arc::new(source),
                    raw: text.into(),
                }));
            }
        };
        if answer.ok {
            return answer.result.ok_or_else(|| {
                CallError::Request(RequestError::InvalidJson {
                    source: Arc::new(<serde_json::Error as serde::de::Error>::custom(
                        "an ok answer without a result",
                    )),
                    raw: text.into(),
                })
            });
        }
        let parameter = |name: &str| {
            answer
                .parameters
                .as_ref()
                .and_then(|parameters| parameters.get(name))
        };
        if let Some(seconds) = parameter("retry_after").and_then(Value::as_u64) {
            let seconds = u32::try_from(seconds).unwrap_or(u32::MAX);
            return Err(CallError::Request(RequestError::RetryAfter(
                Seconds::from_seconds(seconds),
            )));
        }
        if let Some(chat) = parameter("migrate_to_chat_id").and_then(Value::as_i64) {
            return Err(CallError::Request(RequestError::MigrateToChatId(ChatId(
                chat,
            ))));
        }
        if status.is_server_error() || answer.error_code.is_some_and(|code| code >= 500) {
            return Err(server(answer.description));
        }
        let api = serde_json::from_value(Value::String(answer.description.clone()))
            .unwrap_or(ApiError::Unknown(answer.description));
        Err(CallError::Request(RequestError::Api(api)))
    }

    /// `<api_url>/bot<token>/<method>`, as teloxide builds it.
    fn method_url(&self, method: &str) -> Result<reqwest::Url, CallError> {
        let mut url = self.bot.api_url();
        url.path_segments_mut()
            .map_err(|()| CallError::Build("the API URL is not a base URL".to_owned()))?
            .push(&format!("bot{}", self.bot.token()))
            .push(method);
        Ok(url)
    }

    /// What a failed [`TelegramApi::call`] means to the caller.
    pub(crate) fn call_error(&self, error: CallError) -> ChannelError {
        match error {
            CallError::Request(e) => self.error(e),
            CallError::Server {
                status,
                description,
            } => ChannelError::Transient(
                self.mask(&format!("the Bot API answered {status}: {description}")),
            ),
            CallError::Build(e) => ChannelError::Permanent(self.mask(&e)),
        }
    }

    /// Who the bot is (`getMe`): also how `antler doctor` checks the token.
    pub async fn get_me(&self) -> Result<BotIdentity, ChannelError> {
        let me = self.bot.get_me().await.map_err(|e| self.error(e))?;
        Ok(BotIdentity {
            id: me.user.id.0,
            username: me.user.username.clone().unwrap_or_default(),
        })
    }

    /// Downloads the file `file_id` (`getFile`, then the file URL), at most `max_bytes` of it:
    /// a larger file is [`ChannelError::TooLarge`], known from its declared size when Telegram
    /// gives one, else found while reading.
    pub async fn fetch_file(&self, file_id: &str, max_bytes: u64) -> Result<Vec<u8>, ChannelError> {
        let file = self
            .bot
            .get_file(FileId(file_id.to_owned()))
            .await
            .map_err(|e| self.error(e))?;
        let declared = Some(u64::from(file.meta.size));
        let chunks = self.bot.download_file_stream(&file.path);
        antler_channel::read_bounded(chunks, declared, max_bytes, |e| {
            ChannelError::Transient(self.mask(&format!("downloading a file failed: {e}")))
        })
        .await
    }

    /// Sends one message (`sendMessage`), with `buttons` as an inline keyboard under it, and
    /// returns its id. `html` selects Telegram's HTML
    /// parse mode; a message Telegram cannot parse as HTML is [`SendFailure::Markup`], so the
    /// caller can send the same words plain.
    pub async fn send_text(
        &self,
        target: &Target,
        text: &str,
        html: bool,
        buttons: &[Button],
    ) -> Result<i32, SendFailure> {
        let mut request = self.bot.send_message(ChatId(target.chat_id), text);
        if html {
            request = request.parse_mode(ParseMode::Html);
        }
        if !buttons.is_empty() {
            request = request.reply_markup(keyboard(buttons));
        }
        if let Some(topic) = target.topic {
            request = request.message_thread_id(ThreadId(MessageId(topic)));
        }
        if let Some(reply_to) = target.reply_to {
            // A deleted original must not lose the answer.
            request = request.reply_parameters(
                ReplyParameters::new(MessageId(reply_to)).allow_sending_without_reply(),
            );
        }
        match self.call::<_, Sent>(request.payload_ref()).await {
            Ok(sent) => Ok(sent.message_id),
            Err(CallError::Request(RequestError::Api(ApiError::CantParseEntities(_)))) if html => {
                Err(SendFailure::Markup)
            }
            Err(e) => Err(self.send_failure(target, e)),
        }
    }

    /// A failed send into `target`: a refused forum topic is [`SendFailure::TopicGone`], a group
    /// that became a supergroup [`SendFailure::Migrated`].
    fn send_failure(&self, target: &Target, error: CallError) -> SendFailure {
        match &error {
            CallError::Request(RequestError::Api(ApiError::Unknown(description)))
                if target.topic.is_some() && topic_gone(description) =>
            {
                SendFailure::TopicGone
            }
            CallError::Request(RequestError::MigrateToChatId(chat)) if chat.0 != target.chat_id => {
                SendFailure::Migrated(chat.0)
            }
            _ => SendFailure::Other(self.call_error(error)),
        }
    }

    /// Uploads `content` (streamed, exactly its size) as a document named `name`
    /// (`sendDocument`, multipart) in the target's chat and topic, and returns the message's id;
    /// a refused topic is [`SendFailure::TopicGone`].
    pub async fn send_document(
        &self,
        target: &Target,
        content: antler_channel::FileContent,
        name: &str,
    ) -> Result<i32, SendFailure> {
        let reader =
            tokio::io::AsyncReadExt::take(tokio::fs::File::from_std(content.file), content.size);
        let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(reader));
        let document = reqwest::multipart::Part::stream_with_length(body, content.size)
            .file_name(name.to_owned());
        let mut form = reqwest::multipart::Form::new()
            .text("chat_id", target.chat_id.to_string())
            .part("document", document);
        if let Some(topic) = target.topic {
            form = form.text("message_thread_id", topic.to_string());
        }
        let request = self
            .http
            .post(
                self.method_url("SendDocument")
                    .map_err(|e| SendFailure::Other(self.call_error(e)))?,
            )
            .multipart(form);
        match self.answer::<Sent>(request).await {
            Ok(sent) => Ok(sent.message_id),
            Err(e) => Err(self.send_failure(target, e)),
        }
    }

    /// Replaces the text of the bot's message `message_id` in `chat_id` (`editMessageText`).
    /// Telegram's "message is not modified" (the same text again) is success; HTML Telegram
    /// cannot parse is [`SendFailure::Markup`], as for [`TelegramApi::send_text`].
    pub async fn edit_text(
        &self,
        chat_id: i64,
        message_id: i32,
        text: &str,
        html: bool,
    ) -> Result<(), SendFailure> {
        let mut request = self
            .bot
            .edit_message_text(ChatId(chat_id), MessageId(message_id), text);
        if html {
            request = request.parse_mode(ParseMode::Html);
        }
        match self.call::<_, Value>(request.payload_ref()).await {
            Ok(_) | Err(CallError::Request(RequestError::Api(ApiError::MessageNotModified))) => {
                Ok(())
            }
            Err(CallError::Request(RequestError::Api(ApiError::CantParseEntities(_)))) if html => {
                Err(SendFailure::Markup)
            }
            Err(e) => Err(SendFailure::Other(self.call_error(e))),
        }
    }

    /// Answers a button press (`answerCallbackQuery`): `text` shown to the presser alone, as
    /// an alert they close with `alert`, else as a passing notice. Telegram shows at most 200
    /// characters; the rest is cut.
    pub async fn answer_callback(
        &self,
        query_id: &str,
        text: &str,
        alert: bool,
    ) -> Result<(), ChannelError> {
        let text: String = text.chars().take(CALLBACK_TEXT_LIMIT).collect();
        let request = self
            .bot
            .answer_callback_query(CallbackQueryId(query_id.to_owned()))
            .text(text)
            .show_alert(alert);
        self.call::<_, Value>(request.payload_ref())
            .await
            .map(|_| ())
            .map_err(|e| self.call_error(e))
    }

    /// Points Telegram at the webhook (`setWebhook`), asking for [`ALLOWED_UPDATES`] only.
    pub async fn set_webhook(&self, settings: &WebhookSettings<'_>) -> Result<(), ChannelError> {
        let url = reqwest::Url::parse(settings.url).map_err(|e| {
            ChannelError::Permanent(format!(
                "the webhook URL {} is not a URL: {e}",
                settings.url
            ))
        })?;
        self.bot
            .set_webhook(url)
            .secret_token(settings.secret_token)
            .allowed_updates([AllowedUpdate::Message, AllowedUpdate::CallbackQuery])
            .drop_pending_updates(settings.drop_pending_updates)
            .send()
            .await
            .map_err(|e| self.error(e))?;
        Ok(())
    }

    /// The webhook as Telegram sees it (`getWebhookInfo`).
    pub async fn webhook_info(&self) -> Result<WebhookStatus, ChannelError> {
        let info = self
            .bot
            .get_webhook_info()
            .await
            .map_err(|e| self.error(e))?;
        let allowed_updates = info.allowed_updates.map(|kinds| {
            kinds
                .iter()
                .map(|kind| match serde_json::to_value(kind) {
                    Ok(serde_json::Value::String(name)) => name,
                    _ => format!("{kind:?}"),
                })
                .collect()
        });
        Ok(WebhookStatus {
            url: info.url.map(|url| url.to_string()),
            pending_update_count: info.pending_update_count,
            last_error_date: info.last_error_date.map(|date| date.timestamp()),
            last_error_message: info.last_error_message,
            max_connections: info.max_connections,
            allowed_updates,
        })
    }

    /// Removes the webhook (`deleteWebhook`), optionally dropping the waiting updates.
    pub async fn delete_webhook(&self, drop_pending_updates: bool) -> Result<(), ChannelError> {
        self.bot
            .delete_webhook()
            .drop_pending_updates(drop_pending_updates)
            .send()
            .await
            .map_err(|e| self.error(e))?;
        Ok(())
    }

    /// Replaces the bot's command menu for every chat (`setMyCommands`, default scope).
    pub async fn set_my_commands(&self, commands: &[MenuCommand]) -> Result<(), ChannelError> {
        let commands = commands
            .iter()
            .map(|c| BotCommand::new(c.command.clone(), c.description.clone()));
        self.bot
            .set_my_commands(commands)
            .await
            .map_err(|e| self.error(e))?;
        Ok(())
    }

    /// The bot's command menu for every chat (`getMyCommands`, default scope).
    pub async fn get_my_commands(&self) -> Result<Vec<MenuCommand>, ChannelError> {
        let commands = self
            .bot
            .get_my_commands()
            .await
            .map_err(|e| self.error(e))?;
        Ok(commands
            .into_iter()
            .map(|c| MenuCommand {
                command: c.command,
                description: c.description,
            })
            .collect())
    }

    /// The updates after `offset` (`getUpdates`), waiting up to `wait_secs` for one to come
    /// (long polling), as their JSON: what teloxide cannot model is read by
    /// [`crate::read_update`], as on the webhook. Calling it with a higher offset confirms the
    /// earlier updates to Telegram.
    pub async fn get_updates(
        &self,
        offset: Option<i32>,
        wait_secs: u32,
    ) -> Result<Vec<Value>, ChannelError> {
        let mut request = self
            .bot
            .get_updates()
            .timeout(wait_secs)
            .allowed_updates(vec![AllowedUpdate::Message, AllowedUpdate::CallbackQuery]);
        if let Some(offset) = offset {
            request = request.offset(offset);
        }
        self.call(request.payload_ref())
            .await
            .map_err(|e| self.call_error(e))
    }

    /// Shows "typing…" in the chat (or topic) for up to 5 seconds (`sendChatAction`).
    pub async fn typing(&self, chat_id: i64, topic: Option<i32>) -> Result<(), ChannelError> {
        let mut request = self
            .bot
            .send_chat_action(ChatId(chat_id), ChatAction::Typing);
        if let Some(topic) = topic {
            request = request.message_thread_id(ThreadId(MessageId(topic)));
        }
        self.call::<_, Value>(request.payload_ref())
            .await
            .map(|_| ())
            .map_err(|e| self.call_error(e))
    }

    /// `text` with the bot token masked.
    fn mask(&self, text: &str) -> String {
        antler_channel::mask_secrets(text, &[self.bot.token()])
    }

    /// What a failed Bot API call means to the caller.
    pub(crate) fn error(&self, error: RequestError) -> ChannelError {
        match error {
            RequestError::RetryAfter(seconds) => ChannelError::RateLimited {
                retry_after: seconds.duration(),
            },
            RequestError::Network(e) => ChannelError::Transient(self.mask(&e.to_string())),
            RequestError::Io(e) => ChannelError::Transient(self.mask(&e.to_string())),
            RequestError::Api(ApiError::InvalidToken) => ChannelError::Refused(
                "the bot token was refused (channels.telegram.bot_token)".to_owned(),
            ),
            RequestError::Api(
                e @ (ApiError::TerminatedByOtherGetUpdates | ApiError::CantGetUpdates),
            ) => ChannelError::Refused(format!(
                "{e} (another antler or bot instance polls this bot, or a webhook is set)"
            )),
            RequestError::Api(e) => ChannelError::Permanent(self.mask(&e.to_string())),
            RequestError::MigrateToChatId(chat) => ChannelError::Permanent(format!(
                "the group became supergroup {}; messages must go there",
                chat.0
            )),
            RequestError::InvalidJson { source, .. } => ChannelError::Transient(format!(
                "the Bot API answered something that is not its JSON: {source}"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const TOKEN: &str = "123456:SECRET-token_value";

    #[test]
    fn errors_never_carry_the_token_and_keep_their_kind() {
        let api = TelegramApi::new(TOKEN, "http://127.0.0.1:9").unwrap();
        let io = std::io::Error::other(format!("GET http://127.0.0.1:9/bot{TOKEN}/GetMe broke"));
        let ChannelError::Transient(text) = api.error(RequestError::Io(io.into())) else {
            panic!("an I/O failure may go away")
        };
        assert!(
            !text.contains(TOKEN) && text.contains("/bot***/GetMe"),
            "{text}"
        );
        assert_eq!(
            api.error(RequestError::RetryAfter(
                teloxide_core::types::Seconds::from_seconds(7)
            )),
            ChannelError::RateLimited {
                retry_after: Duration::from_secs(7)
            }
        );
        // The platform refusing the bot itself: the channel is unhealthy until a call works.
        assert!(matches!(
            api.error(RequestError::Api(ApiError::InvalidToken)),
            ChannelError::Refused(text) if text.contains("channels.telegram.bot_token")
        ));
        assert!(matches!(
            api.error(RequestError::Api(ApiError::TerminatedByOtherGetUpdates)),
            ChannelError::Refused(text) if text.contains("another antler or bot instance")
        ));
        let debug = format!("{api:?}");
        assert!(!debug.contains(TOKEN), "{debug}");
        let settings = format!(
            "{:?}",
            WebhookSettings {
                url: "https://bot.example.com/webhooks/telegram",
                secret_token: "hook-SECRET",
                drop_pending_updates: false,
            }
        );
        assert!(!settings.contains("hook-SECRET"), "{settings}");
    }

    #[tokio::test]
    async fn files_are_fetched_within_the_cap_and_the_bot_knows_itself() {
        use wiremock::matchers::{method, path};
        use wiremock::{Mock, MockServer, ResponseTemplate};

        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path(format!("/bot{TOKEN}/GetMe")))
            .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
                "ok": true,
                "result": {"id": 7000000001u64, "is_bot": true, "first_name": "OpsBot",
                           "username": "opsbot_bot", "can_join_groups": true,
                           "can_read_all_group_messages": false,
                           "supports_inline_queries": false, "has_main_web_app": false}
            })))
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path(format!("/bot{TOKEN}/GetFile")))
            .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
                "ok": true,
                "result": {"file_id": "F1", "file_unique_id": "U1", "file_size": 5,
                           "file_path": "documents/a.txt"}
            })))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            // teloxide pushes the file path as one segment, so its `/` arrives encoded.
            .and(path(format!("/file/bot{TOKEN}/documents%2Fa.txt")))
            .respond_with(ResponseTemplate::new(200).set_body_string("hello"))
            .mount(&server)
            .await;
        let api = TelegramApi::new(TOKEN, &server.uri()).unwrap();
        assert_eq!(
            api.get_me().await.unwrap(),
            BotIdentity {
                id: 7_000_000_001,
                username: "opsbot_bot".into()
            }
        );
        assert_eq!(api.fetch_file("F1", 100).await.unwrap(), b"hello");
        assert_eq!(
            api.fetch_file("F1", 3).await.unwrap_err(),
            ChannelError::TooLarge { limit: 3 }
        );
    }

    /// A Bot API answer `{"ok": true, "result": result}` for `method`, whose request body must
    /// contain `body` (a partial JSON match).
    async fn answer(
        server: &wiremock::MockServer,
        method_name: &str,
        body: Option<serde_json::Value>,
        result: serde_json::Value,
    ) {
        use wiremock::matchers::{body_partial_json, method, path};
        use wiremock::{Mock, ResponseTemplate};

        let mut mock = Mock::given(method("POST")).and(path(format!("/bot{TOKEN}/{method_name}")));
        if let Some(body) = body {
            mock = mock.and(body_partial_json(body));
        }
        mock.respond_with(
            ResponseTemplate::new(200)
                .set_body_json(serde_json::json!({"ok": true, "result": result})),
        )
        .expect(1)
        .mount(server)
        .await;
    }

    /// The fields of a `multipart/form-data` request (teloxide sends setWebhook that way, as
    /// it may carry a certificate).
    fn form_fields(request: &wiremock::Request) -> std::collections::HashMap<String, String> {
        let content_type = request
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let boundary = content_type
            .split("boundary=")
            .nth(1)
            .unwrap_or_else(|| panic!("not multipart: {content_type}"));
        let body = String::from_utf8_lossy(&request.body);
        body.split(&format!("--{boundary}"))
            .filter_map(|part| {
                let (head, value) = part.split_once("\r\n\r\n")?;
                let name = head.split("name=\"").nth(1)?.split('"').next()?;
                Some((name.to_owned(), value.trim_end_matches("\r\n").to_owned()))
            })
            .collect()
    }

    #[tokio::test]
    async fn the_webhook_is_set_with_its_secret_and_message_updates_only() {
        let server = wiremock::MockServer::start().await;
        answer(&server, "SetWebhook", None, serde_json::json!(true)).await;
        let api = TelegramApi::new(TOKEN, &server.uri()).unwrap();
        api.set_webhook(&WebhookSettings {
            url: "https://bot.example.com/webhooks/telegram",
            secret_token: "hook-secret_1",
            drop_pending_updates: true,
        })
        .await
        .unwrap();
        let requests = server.received_requests().await.unwrap();
        let fields = form_fields(&requests[0]);
        let field = |name: &str| fields.get(name).map(String::as_str);
        assert_eq!(
            field("url"),
            Some("https://bot.example.com/webhooks/telegram")
        );
        assert_eq!(field("secret_token"), Some("hook-secret_1"));
        let allowed: Vec<String> = serde_json::from_str(field("allowed_updates").unwrap()).unwrap();
        assert_eq!(allowed, ALLOWED_UPDATES);
        assert_eq!(field("drop_pending_updates"), Some("true"));
        server.verify().await;
    }

    #[tokio::test]
    async fn the_webhook_is_deleted_keeping_or_dropping_pending_updates() {
        let server = wiremock::MockServer::start().await;
        answer(
            &server,
            "DeleteWebhook",
            Some(serde_json::json!({"drop_pending_updates": false})),
            serde_json::json!(true),
        )
        .await;
        let api = TelegramApi::new(TOKEN, &server.uri()).unwrap();
        api.delete_webhook(false).await.unwrap();
        server.verify().await;
    }

    #[tokio::test]
    async fn webhook_info_keeps_what_an_operator_needs() {
        let server = wiremock::MockServer::start().await;
        answer(
            &server,
            "GetWebhookInfo",
            None,
            serde_json::json!({
                "url": "https://bot.example.com/webhooks/telegram",
                "has_custom_certificate": false,
                "pending_update_count": 3,
                "last_error_date": 1_780_000_000,
                "last_error_message": "Wrong response from the webhook: 502 Bad Gateway",
                "max_connections": 40,
                "allowed_updates": ["message", "edited_message"],
            }),
        )
        .await;
        let api = TelegramApi::new(TOKEN, &server.uri()).unwrap();
        assert_eq!(
            api.webhook_info().await.unwrap(),
            WebhookStatus {
                url: Some("https://bot.example.com/webhooks/telegram".into()),
                pending_update_count: 3,
                last_error_date: Some(1_780_000_000),
                last_error_message: Some("Wrong response from the webhook: 502 Bad Gateway".into()),
                max_connections: Some(40),
                allowed_updates: Some(vec!["message".into(), "edited_message".into()]),
            }
        );

        // No webhook: an empty URL, no error, Telegram's default update types.
        let server = wiremock::MockServer::start().await;
        answer(
            &server,
            "GetWebhookInfo",
            None,
            serde_json::json!({"url": "", "has_custom_certificate": false,
                               "pending_update_count": 0}),
        )
        .await;
        let api = TelegramApi::new(TOKEN, &server.uri()).unwrap();
        let info = api.webhook_info().await.unwrap();
        assert_eq!(
            (info.url, info.last_error_message, info.allowed_updates),
            (None, None, None)
        );
    }

    #[tokio::test]
    async fn the_command_menu_is_read_and_written() {
        let server = wiremock::MockServer::start().await;
        answer(
            &server,
            "SetMyCommands",
            Some(serde_json::json!({"commands": [
                {"command": "help", "description": "the commands"},
                {"command": "new", "description": "a fresh conversation"},
            ]})),
            serde_json::json!(true),
        )
        .await;
        answer(
            &server,
            "GetMyCommands",
            None,
            serde_json::json!([{"command": "help", "description": "the commands"}]),
        )
        .await;
        let api = TelegramApi::new(TOKEN, &server.uri()).unwrap();
        let menu = |command: &str, description: &str| MenuCommand {
            command: command.into(),
            description: description.into(),
        };
        api.set_my_commands(&[
            menu("help", "the commands"),
            menu("new", "a fresh conversation"),
        ])
        .await
        .unwrap();
        assert_eq!(
            api.get_my_commands().await.unwrap(),
            [menu("help", "the commands")]
        );
        server.verify().await;
    }

    #[tokio::test]
    async fn setup_failures_never_carry_the_token() {
        // A closed port: reqwest's error names the URL, and the URL holds the token.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let api = TelegramApi::new(TOKEN, &format!("http://127.0.0.1:{port}")).unwrap();
        let settings = WebhookSettings {
            url: "https://bot.example.com/webhooks/telegram",
            secret_token: "hook-secret_1",
            drop_pending_updates: false,
        };
        let errors = [
            api.set_webhook(&settings).await.unwrap_err(),
            api.webhook_info().await.unwrap_err(),
            api.delete_webhook(true).await.unwrap_err(),
            api.set_my_commands(&[]).await.unwrap_err(),
            api.get_my_commands().await.unwrap_err(),
        ];
        for error in errors {
            let text = error.to_string();
            assert!(matches!(error, ChannelError::Transient(_)), "{error:?}");
            assert!(!text.contains(TOKEN) && !text.contains("SECRET"), "{text}");
        }

        // A refused token names the key, and Telegram's own refusals are passed on masked.
        let server = wiremock::MockServer::start().await;
        wiremock::Mock::given(wiremock::matchers::path(format!("/bot{TOKEN}/SetWebhook")))
            .respond_with(wiremock::ResponseTemplate::new(401).set_body_json(
                serde_json::json!({"ok": false, "error_code": 401, "description": "Unauthorized"}),
            ))
            .mount(&server)
            .await;
        wiremock::Mock::given(wiremock::matchers::path(format!(
            "/bot{TOKEN}/DeleteWebhook"
        )))
        .respond_with(
            wiremock::ResponseTemplate::new(400).set_body_json(serde_json::json!({
                "ok": false, "error_code": 400,
                "description": format!("Bad Request: bot{TOKEN} says no")
            })),
        )
        .mount(&server)
        .await;
        let api = TelegramApi::new(TOKEN, &server.uri()).unwrap();
        let refused = api.set_webhook(&settings).await.unwrap_err().to_string();
        assert!(refused.contains("channels.telegram.bot_token"), "{refused}");
        let other = api.delete_webhook(false).await.unwrap_err();
        assert!(
            matches!(&other, ChannelError::Permanent(text) if text.contains("says no") && !text.contains(TOKEN)),
            "{other:?}"
        );
    }

    /// Telegram's JSON 5xx (`{"ok":false,"error_code":502,...}`) pass; teloxide's request layer
    /// read them as permanent refusals after a hidden 10 s sleep. The send path answers at once
    /// (well before that sleep would end) with a transient error delivery retries.
    #[tokio::test]
    async fn json_server_errors_are_transient_at_once() {
        use wiremock::matchers::{method, path};
        use wiremock::{Mock, MockServer, ResponseTemplate};

        let server = MockServer::start().await;
        for (name, status, description) in [
            ("SendMessage", 502, "Bad Gateway"),
            ("EditMessageText", 500, "Internal Server Error: restart"),
            ("SendChatAction", 503, "Service Unavailable"),
        ] {
            Mock::given(method("POST"))
                .and(path(format!("/bot{TOKEN}/{name}")))
                .respond_with(
                    ResponseTemplate::new(status).set_body_json(serde_json::json!({
                        "ok": false, "error_code": status, "description": description
                    })),
                )
                .mount(&server)
                .await;
        }
        Mock::given(method("POST"))
            .and(path(format!("/bot{TOKEN}/SendDocument")))
            .respond_with(
                ResponseTemplate::new(502).set_body_string("<html>502 Bad Gateway</html>"),
            )
            .mount(&server)
            .await;
        let api = TelegramApi::new(TOKEN, &server.uri()).unwrap();
        let target = Target {
            chat_id: 5,
            topic: None,
            reply_to: None,
        };
        let started = std::time::Instant::now();
        let sent = api.send_text(&target, "hi", true, &[]).await.unwrap_err();
        assert!(
            matches!(&sent, SendFailure::Other(ChannelError::Transient(text)) if text.contains("502") && text.contains("Bad Gateway")),
            "{sent:?}"
        );
        let edited = api.edit_text(5, 1, "hi", true).await.unwrap_err();
        assert!(
            matches!(&edited, SendFailure::Other(ChannelError::Transient(text)) if text.contains("restart")),
            "{edited:?}"
        );
        let typing = api.typing(5, None).await.unwrap_err();
        assert!(matches!(typing, ChannelError::Transient(_)), "{typing:?}");
        let path = std::env::temp_dir().join(format!("antler-tg-5xx-{}", std::process::id()));
        std::fs::write(&path, "x").unwrap();
        let content = antler_channel::FileContent {
            file: std::fs::File::open(&path).unwrap(),
            size: 1,
        };
        let uploaded = api
            .send_document(&target, content, "x.txt")
            .await
            .unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert!(
            matches!(uploaded, SendFailure::Other(ChannelError::Transient(_))),
            "{uploaded:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no 10 s pause per server error: {:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_bad_api_url_names_the_key() {
        let error = TelegramApi::new(TOKEN, "not a url").unwrap_err();
        assert!(
            matches!(&error, ChannelError::Permanent(text) if text.contains("channels.telegram.api_url")),
            "{error:?}"
        );
    }
}
