//! The Bot API calls antler makes, through teloxide's `Bot`, with every failure mapped to a
//! [`ChannelError`] whose text never holds the bot token (it is part of every request URL,
//! and reqwest's errors name the URL).

use antler_channel::ChannelError;
use futures_util::StreamExt;
use teloxide_core::Bot;
use teloxide_core::errors::{ApiError, RequestError};
use teloxide_core::net::Download;
use teloxide_core::payloads::SendMessageSetters;
use teloxide_core::requests::{Request, Requester};
use teloxide_core::types::{ChatId, FileId, MessageId, ParseMode, ReplyParameters, ThreadId};

use crate::normalize::BotIdentity;

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
    /// Anything else.
    Other(ChannelError),
}

/// A Bot API client for one bot.
#[derive(Clone)]
pub struct TelegramApi {
    bot: Bot,
}

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
        Ok(Self {
            bot: Bot::new(token).set_api_url(url),
        })
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
        if u64::from(file.meta.size) > max_bytes {
            return Err(ChannelError::TooLarge { limit: max_bytes });
        }
        let mut stream = self.bot.download_file_stream(&file.path);
        let mut bytes = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                ChannelError::Transient(self.mask(&format!("downloading a file failed: {e}")))
            })?;
            if (bytes.len() + chunk.len()) as u64 > max_bytes {
                return Err(ChannelError::TooLarge { limit: max_bytes });
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    }

    /// Sends one message (`sendMessage`) and returns its id. `html` selects Telegram's HTML
    /// parse mode; a message Telegram cannot parse as HTML is [`SendFailure::Markup`], so the
    /// caller can send the same words plain.
    pub async fn send_text(
        &self,
        target: &Target,
        text: &str,
        html: bool,
    ) -> Result<i32, SendFailure> {
        let mut request = self.bot.send_message(ChatId(target.chat_id), text);
        if html {
            request = request.parse_mode(ParseMode::Html);
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
        match request.send().await {
            Ok(message) => Ok(message.id.0),
            Err(RequestError::Api(ApiError::CantParseEntities(_))) if html => {
                Err(SendFailure::Markup)
            }
            Err(e) => Err(SendFailure::Other(self.error(e))),
        }
    }

    /// `text` with the bot token masked.
    fn mask(&self, text: &str) -> String {
        let token = self.bot.token();
        if token.is_empty() {
            text.to_owned()
        } else {
            text.replace(token, "***")
        }
    }

    /// What a failed Bot API call means to the caller.
    pub(crate) fn error(&self, error: RequestError) -> ChannelError {
        match error {
            RequestError::RetryAfter(seconds) => ChannelError::RateLimited {
                retry_after: seconds.duration(),
            },
            RequestError::Network(e) => ChannelError::Transient(self.mask(&e.to_string())),
            RequestError::Io(e) => ChannelError::Transient(self.mask(&e.to_string())),
            RequestError::Api(ApiError::InvalidToken) => ChannelError::Permanent(
                "the bot token was refused (channels.telegram.bot_token)".to_owned(),
            ),
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
        assert!(matches!(
            api.error(RequestError::Api(ApiError::InvalidToken)),
            ChannelError::Permanent(text) if text.contains("channels.telegram.bot_token")
        ));
        let debug = format!("{api:?}");
        assert!(!debug.contains(TOKEN), "{debug}");
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

    #[test]
    fn a_bad_api_url_names_the_key() {
        let error = TelegramApi::new(TOKEN, "not a url").unwrap_err();
        assert!(
            matches!(&error, ChannelError::Permanent(text) if text.contains("channels.telegram.api_url")),
            "{error:?}"
        );
    }
}
