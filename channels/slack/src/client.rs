//! The Web API calls antler makes: slack-morphism's hyper client for the methods, reqwest for
//! file downloads. Every failure becomes a [`ChannelError`] that carries Slack's error code or
//! the HTTP status, never a response body and never the bot token.

use std::time::Duration;

use antler_channel::ChannelError;
use slack_morphism::api::{
    SlackApiChatPostEphemeralRequest, SlackApiChatPostMessageRequest, SlackApiChatUpdateRequest,
    SlackApiReactionsAddRequest, SlackApiReactionsRemoveRequest,
};
use slack_morphism::errors::SlackClientError;
use slack_morphism::hyper_tokio::SlackClientHyperHttpsConnector;
use slack_morphism::prelude::SlackBlock;
use slack_morphism::{
    SlackApiToken, SlackApiTokenValue, SlackChannelId, SlackClient, SlackMessageContent,
    SlackReactionName, SlackTs, SlackUserId,
};

/// Where Slack's Web API is.
pub const DEFAULT_API_URL: &str = "https://slack.com/api";

/// The host Slack serves private files from; the token is sent to no other (but the API's).
const FILES_HOST: &str = "files.slack.com";

/// How long to wait after a 429 that names no delay.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The host Slack's `response_url`s are on.
const HOOKS_HOST: &str = "hooks.slack.com";

/// What `chat.postMessage` answered.
#[derive(Debug)]
pub(crate) enum Posted {
    /// The new message's ts.
    Ts(String),
    /// The bot cannot post there (`not_in_channel`, `channel_not_found`): the answer must go
    /// elsewhere.
    NotThere(&'static str),
}

/// What a `response_url` answered.
#[derive(Debug, PartialEq)]
pub(crate) enum Responded {
    /// Posted.
    Ok,
    /// The URL is spent or refused (Slack answers `404 expired_url` after 30 minutes,
    /// `404 used_url` after 5 uses): the answer must go another way.
    Gone,
}

/// The bot as Slack knows it (`auth.test`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlackIdentity {
    /// The bot's user id (`U…`): what mentions name, and the author of its own messages.
    pub user_id: String,
    /// The bot id (`B…`) its messages carry as `bot_id`.
    pub bot_id: Option<String>,
    /// The workspace the token belongs to.
    pub team_id: String,
    /// The workspace's name.
    pub team_name: String,
}

/// A Web API client for one bot token.
pub struct SlackApi {
    client: SlackClient<SlackClientHyperHttpsConnector>,
    token: SlackApiToken,
    http: reqwest::Client,
    api_url: reqwest::Url,
}

impl std::fmt::Debug for SlackApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlackApi")
            .field("api_url", &self.api_url.as_str())
            .field("token", &"***")
            .finish_non_exhaustive()
    }
}

impl SlackApi {
    /// A client for the bot with `token`, at `api_url` (`https://slack.com/api` or a mock;
    /// plain http is allowed so tests can use one).
    pub fn new(token: &str, api_url: &str) -> Result<Self, ChannelError> {
        let api_url = reqwest::Url::parse(api_url.trim_end_matches('/')).map_err(|e| {
            ChannelError::Permanent(format!("channels.slack.api_url is not a URL: {e}"))
        })?;
        // slack-morphism's own `new()` is https-only; the same connector that also speaks
        // plain http lets the API URL point at a local mock.
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .build();
        let connector = SlackClientHyperHttpsConnector::with_connector(https)
            .with_slack_api_url(api_url.as_str().trim_end_matches('/'));
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| ChannelError::Permanent(format!("no HTTP client: {e}")))?;
        Ok(Self {
            client: SlackClient::new(connector),
            token: SlackApiToken::new(SlackApiTokenValue(token.to_owned())),
            http,
            api_url,
        })
    }

    /// Who the bot is (`auth.test`): also how `antler doctor` checks the token.
    pub async fn auth_test(&self) -> Result<SlackIdentity, ChannelError> {
        let session = self.client.open_session(&self.token);
        let me = session.auth_test().await.map_err(|e| self.error(e))?;
        Ok(SlackIdentity {
            user_id: me.user_id.0,
            bot_id: me.bot_id.map(|id| id.0),
            team_id: me.team_id.0,
            team_name: me.team,
        })
    }

    /// Posts `text` (mrkdwn) to `channel`, in the thread `thread_ts` when given
    /// (`chat.postMessage`); returns the new message's ts. A channel the bot cannot post in
    /// is an error here; [`SlackApi::post`] tells it apart.
    pub async fn post_message(
        &self,
        channel: &str,
        text: &str,
        thread_ts: Option<&str>,
    ) -> Result<String, ChannelError> {
        match self.post(channel, text, thread_ts, None).await? {
            Posted::Ts(ts) => Ok(ts),
            Posted::NotThere(code) => {
                Err(ChannelError::Permanent(format!("Slack answered {code}")))
            }
        }
    }

    /// Posts like [`SlackApi::post_message`], with `blocks` when given (`text` is then the
    /// notification's fallback), and tells a channel the bot cannot post in
    /// (`not_in_channel`, `channel_not_found`) from other failures.
    pub(crate) async fn post(
        &self,
        channel: &str,
        text: &str,
        thread_ts: Option<&str>,
        blocks: Option<Vec<SlackBlock>>,
    ) -> Result<Posted, ChannelError> {
        let request = SlackApiChatPostMessageRequest::new(
            SlackChannelId(channel.to_owned()),
            SlackMessageContent::new()
                .with_text(text.to_owned())
                .opt_blocks(blocks),
        )
        .opt_thread_ts(thread_ts.map(|ts| SlackTs(ts.to_owned())));
        let session = self.client.open_session(&self.token);
        match session.chat_post_message(&request).await {
            Ok(posted) => Ok(Posted::Ts(posted.ts.0)),
            Err(SlackClientError::ApiError(e)) if e.code == "not_in_channel" => {
                Ok(Posted::NotThere("not_in_channel"))
            }
            Err(SlackClientError::ApiError(e)) if e.code == "channel_not_found" => {
                Ok(Posted::NotThere("channel_not_found"))
            }
            Err(e) => Err(self.error(e)),
        }
    }

    /// The DM channel with `user` (`conversations.open`, scope `im:write`). Sent as a form:
    /// Slack documents `users` as a comma-separated string, which slack-morphism's JSON
    /// request (an array) is not.
    pub(crate) async fn open_dm(&self, user: &str) -> Result<String, ChannelError> {
        #[derive(serde::Deserialize)]
        struct Opened {
            ok: bool,
            error: Option<String>,
            channel: Option<Channel>,
        }
        #[derive(serde::Deserialize)]
        struct Channel {
            id: String,
        }
        let url = format!(
            "{}/conversations.open",
            self.api_url.as_str().trim_end_matches('/')
        );
        let response = self
            .http
            .post(url)
            .bearer_auth(self.token.token_value.0.as_str())
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(format!("users={}", form_value(user)))
            .send()
            .await
            .map_err(|e| self.transport(&e))?;
        let status = response.status();
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            return Err(ChannelError::RateLimited {
                retry_after: retry_after(response.headers()),
            });
        }
        if !status.is_success() {
            let error = format!("Slack answered HTTP {status} to conversations.open");
            return Err(if status.is_server_error() {
                ChannelError::Transient(error)
            } else {
                ChannelError::Permanent(error)
            });
        }
        let opened: Opened = response.json().await.map_err(|e| {
            ChannelError::Transient(format!(
                "conversations.open answered something that is not its JSON: {}",
                e.without_url()
            ))
        })?;
        match opened {
            Opened {
                ok: true,
                channel: Some(channel),
                ..
            } => Ok(channel.id),
            Opened { error, .. } => Err(ChannelError::Permanent(format!(
                "Slack answered {} to conversations.open",
                self.mask(error.as_deref().unwrap_or("no channel"))
            ))),
        }
    }

    /// Whether `url` may be a slash command's `response_url`: on Slack's hooks host over
    /// https, or on the configured API's own scheme, host and port (a mock).
    pub(crate) fn is_response_url(&self, url: &str) -> bool {
        let Ok(url) = reqwest::Url::parse(url) else {
            return false;
        };
        let hooks = url.scheme() == "https" && url.host_str() == Some(HOOKS_HOST);
        let api = url.scheme() == self.api_url.scheme()
            && url.host_str() == self.api_url.host_str()
            && url.port_or_known_default() == self.api_url.port_or_known_default();
        hooks || api
    }

    /// Posts `text` (mrkdwn) through a slash command's `response_url`: a new message where
    /// the command ran, seen by its user alone or, `in_channel`, by everyone there. The URL
    /// is a credential: it appears in no error.
    pub(crate) async fn respond(
        &self,
        url: &str,
        text: &str,
        in_channel: bool,
    ) -> Result<Responded, ChannelError> {
        if !self.is_response_url(url) {
            return Ok(Responded::Gone);
        }
        let body = serde_json::json!({
            "text": text,
            "response_type": if in_channel { "in_channel" } else { "ephemeral" },
            "replace_original": false,
        });
        let response = self
            .http
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| {
                ChannelError::Transient(format!(
                    "posting to the response_url failed: {}",
                    e.without_url()
                ))
            })?;
        let status = response.status();
        if status.is_success() {
            return Ok(Responded::Ok);
        }
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            return Err(ChannelError::RateLimited {
                retry_after: retry_after(response.headers()),
            });
        }
        if status.is_server_error() {
            return Err(ChannelError::Transient(format!(
                "the response_url answered HTTP {status}"
            )));
        }
        // Slack's reason is a short code (`expired_url`, `used_url`); bounded all the same.
        let reason: String = response
            .text()
            .await
            .unwrap_or_default()
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
            .take(40)
            .collect();
        tracing::info!(%status, reason, "a slash command's response_url refused the answer; it goes another way");
        Ok(Responded::Gone)
    }

    /// Replaces the text of the bot's message `ts` in `channel` (`chat.update`).
    pub async fn update_message(
        &self,
        channel: &str,
        ts: &str,
        text: &str,
    ) -> Result<(), ChannelError> {
        self.update(
            channel,
            ts,
            SlackMessageContent::new().with_text(text.to_owned()),
        )
        .await
    }

    /// Replaces the bot's message `ts` in `channel` with `blocks`, `text` their fallback
    /// (`chat.update`). Slack: "If you don't include this field, the message's previous blocks
    /// will be retained": the new blocks replace the old ones, buttons and all.
    pub(crate) async fn update_blocks(
        &self,
        channel: &str,
        ts: &str,
        text: &str,
        blocks: Vec<SlackBlock>,
    ) -> Result<(), ChannelError> {
        let content = SlackMessageContent::new()
            .with_text(text.to_owned())
            .with_blocks(blocks);
        self.update(channel, ts, content).await
    }

    async fn update(
        &self,
        channel: &str,
        ts: &str,
        content: SlackMessageContent,
    ) -> Result<(), ChannelError> {
        let request = SlackApiChatUpdateRequest::new(
            SlackChannelId(channel.to_owned()),
            content,
            SlackTs(ts.to_owned()),
        );
        let session = self.client.open_session(&self.token);
        session
            .chat_update(&request)
            .await
            .map_err(|e| self.error(e))?;
        Ok(())
    }

    /// Shows `text` (mrkdwn) to `user` alone in `channel`, in the thread `thread_ts` when
    /// given (`chat.postEphemeral`, scope `chat:write`).
    pub(crate) async fn post_ephemeral(
        &self,
        channel: &str,
        user: &str,
        text: &str,
        thread_ts: Option<&str>,
    ) -> Result<(), ChannelError> {
        let request = SlackApiChatPostEphemeralRequest::new(
            SlackChannelId(channel.to_owned()),
            SlackUserId(user.to_owned()),
            SlackMessageContent::new().with_text(text.to_owned()),
        )
        .opt_thread_ts(thread_ts.map(|ts| SlackTs(ts.to_owned())));
        let session = self.client.open_session(&self.token);
        session
            .chat_post_ephemeral(&request)
            .await
            .map_err(|e| self.error(e))?;
        Ok(())
    }

    /// Adds the reaction `name` (an emoji name without colons) to the message `ts`. Slack's
    /// `already_reacted` counts as done.
    pub async fn add_reaction(
        &self,
        channel: &str,
        ts: &str,
        name: &str,
    ) -> Result<(), ChannelError> {
        let request = SlackApiReactionsAddRequest::new(
            SlackChannelId(channel.to_owned()),
            SlackReactionName(name.to_owned()),
            SlackTs(ts.to_owned()),
        );
        let session = self.client.open_session(&self.token);
        match session.reactions_add(&request).await {
            Ok(_) => Ok(()),
            Err(SlackClientError::ApiError(e)) if e.code == "already_reacted" => Ok(()),
            Err(e) => Err(self.error(e)),
        }
    }

    /// Removes the bot's reaction `name` from the message `ts`; `no_reaction` counts as done.
    pub async fn remove_reaction(
        &self,
        channel: &str,
        ts: &str,
        name: &str,
    ) -> Result<(), ChannelError> {
        let request = SlackApiReactionsRemoveRequest::new(SlackReactionName(name.to_owned()))
            .with_channel(SlackChannelId(channel.to_owned()))
            .with_timestamp(SlackTs(ts.to_owned()));
        let session = self.client.open_session(&self.token);
        match session.reactions_remove(&request).await {
            Ok(_) => Ok(()),
            Err(SlackClientError::ApiError(e)) if e.code == "no_reaction" => Ok(()),
            Err(e) => Err(self.error(e)),
        }
    }

    /// Downloads a private file with the bot token, at most `max_bytes` of it: a larger file
    /// is [`ChannelError::TooLarge`], known from `Content-Length` when sent, else found while
    /// reading. Only Slack's file host and the API's own host get the token.
    pub async fn fetch_file(&self, url: &str, max_bytes: u64) -> Result<Vec<u8>, ChannelError> {
        let url = reqwest::Url::parse(url)
            .map_err(|_| ChannelError::Permanent("the file URL is not a URL".to_owned()))?;
        if !self.may_send_token_to(&url) {
            return Err(ChannelError::Permanent(format!(
                "refusing to fetch a file from {}: only https://{FILES_HOST}/ gets the bot token",
                url.host_str().unwrap_or("a URL without a host")
            )));
        }
        let response = self
            .http
            .get(url)
            .bearer_auth(self.token.token_value.0.as_str())
            .send()
            .await
            .map_err(|e| self.transport(&e))?;
        let status = response.status();
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            return Err(ChannelError::RateLimited {
                retry_after: retry_after(response.headers()),
            });
        }
        if status.is_server_error() {
            return Err(ChannelError::Transient(format!(
                "Slack answered HTTP {status} for a file"
            )));
        }
        if !status.is_success() {
            return Err(ChannelError::Permanent(format!(
                "Slack answered HTTP {status} for a file"
            )));
        }
        let declared = response.content_length();
        antler_channel::read_bounded(response.bytes_stream(), declared, max_bytes, |e| {
            self.transport(&e)
        })
        .await
    }

    /// Slack's file host over https, or the configured API's own scheme, host and port.
    fn may_send_token_to(&self, url: &reqwest::Url) -> bool {
        let files = url.scheme() == "https" && url.host_str() == Some(FILES_HOST);
        let api = url.scheme() == self.api_url.scheme()
            && url.host_str() == self.api_url.host_str()
            && url.port_or_known_default() == self.api_url.port_or_known_default();
        files || api
    }

    /// `text` with the bot token masked.
    fn mask(&self, text: &str) -> String {
        antler_channel::mask_secrets(text, &[self.token.token_value.0.as_str()])
    }

    fn transport(&self, error: &reqwest::Error) -> ChannelError {
        // Without the URL: a file URL names the file, and nothing more is needed to retry.
        let text = format!("a file download failed: {error}");
        ChannelError::Transient(self.mask(&text))
    }

    /// What a failed Web API call means to the caller.
    pub(crate) fn error(&self, error: SlackClientError) -> ChannelError {
        match error {
            SlackClientError::RateLimitError(e) => ChannelError::RateLimited {
                retry_after: e.retry_after.unwrap_or(DEFAULT_RETRY_AFTER),
            },
            SlackClientError::ApiError(e) => match e.code.as_str() {
                "ratelimited" => ChannelError::RateLimited {
                    retry_after: DEFAULT_RETRY_AFTER,
                },
                "invalid_auth" | "not_authed" | "account_inactive" | "token_revoked"
                | "token_expired" => ChannelError::Permanent(format!(
                    "Slack refused the bot token (channels.slack.bot_token): {}",
                    self.mask(&e.code)
                )),
                "internal_error" | "fatal_error" | "service_unavailable" | "request_timeout" => {
                    ChannelError::Transient(format!("Slack answered {}", e.code))
                }
                code => ChannelError::Permanent(format!("Slack answered {}", self.mask(code))),
            },
            SlackClientError::HttpError(e) if e.status_code.is_server_error() => {
                ChannelError::Transient(format!("Slack answered HTTP {}", e.status_code))
            }
            SlackClientError::HttpError(e) => {
                ChannelError::Permanent(format!("Slack answered HTTP {}", e.status_code))
            }
            // serde's message may quote the body, so only where it broke is kept.
            SlackClientError::ProtocolError(e) => ChannelError::Transient(format!(
                "Slack answered something that is not its JSON ({:?} error at line {} column {})",
                e.json_error.classify(),
                e.json_error.line(),
                e.json_error.column()
            )),
            SlackClientError::HttpProtocolError(e) => {
                ChannelError::Transient(self.mask(&format!("calling Slack failed: {e}")))
            }
            SlackClientError::EndOfStream(e) => {
                ChannelError::Transient(self.mask(&format!("calling Slack failed: {e}")))
            }
            SlackClientError::SystemError(e) => {
                ChannelError::Transient(self.mask(&format!("calling Slack failed: {e}")))
            }
            SlackClientError::SocketModeProtocolError(e) => {
                ChannelError::Transient(self.mask(&format!("calling Slack failed: {e}")))
            }
        }
    }
}

/// `value` percent-encoded for a form (Slack ids are letters and digits; anything else is
/// encoded all the same).
fn form_value(value: &str) -> String {
    value
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The delay a 429 asks for, in whole seconds as Slack sends it.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Duration {
    antler_channel::header_secs(headers, reqwest::header::RETRY_AFTER.as_str())
        .unwrap_or(DEFAULT_RETRY_AFTER)
}

#[cfg(test)]
mod tests {
    use wiremock::matchers::{body_partial_json, header, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    use super::*;

    const TOKEN: &str = "xoxb-1000-2000-SECRETtoken";

    fn ok(extra: serde_json::Value) -> ResponseTemplate {
        let mut body = serde_json::json!({"ok": true});
        if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
            body.extend(extra.clone());
        }
        ResponseTemplate::new(200).set_body_json(body)
    }

    fn api(server: &MockServer) -> SlackApi {
        SlackApi::new(TOKEN, &format!("{}/api", server.uri())).unwrap()
    }

    #[tokio::test]
    async fn messages_are_posted_in_their_thread_and_updated() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/api/chat.postMessage"))
            .and(header("authorization", format!("Bearer {TOKEN}").as_str()))
            .and(body_partial_json(serde_json::json!({
                "channel": "C0SRE00001", "text": "*hi*", "thread_ts": "1767225500.000100"
            })))
            .respond_with(ok(serde_json::json!({
                "channel": "C0SRE00001", "ts": "1767225610.000900",
                "message": {"ts": "1767225610.000900", "text": "*hi*", "bot_id": "B0BOT00001"}
            })))
            .expect(1)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path("/api/chat.update"))
            .and(body_partial_json(serde_json::json!({
                "channel": "C0SRE00001", "ts": "1767225610.000900", "text": "*hi* there"
            })))
            .respond_with(ok(serde_json::json!({
                "channel": "C0SRE00001", "ts": "1767225610.000900",
                "message": {"text": "*hi* there"}
            })))
            .expect(1)
            .mount(&server)
            .await;
        let api = api(&server);
        let ts = api
            .post_message("C0SRE00001", "*hi*", Some("1767225500.000100"))
            .await
            .unwrap();
        assert_eq!(ts, "1767225610.000900");
        api.update_message("C0SRE00001", &ts, "*hi* there")
            .await
            .unwrap();
        server.verify().await;
    }

    #[tokio::test]
    async fn reactions_count_already_there_and_already_gone_as_done() {
        let server = MockServer::start().await;
        let answer = |method_name: &str, name: &str, response: serde_json::Value| {
            Mock::given(method("POST"))
                .and(path(format!("/api/{method_name}")))
                .and(body_partial_json(serde_json::json!({
                    "channel": "C1", "timestamp": "1.2", "name": name
                })))
                .respond_with(ResponseTemplate::new(200).set_body_json(response))
        };
        answer("reactions.add", "eyes", serde_json::json!({"ok": true}))
            .mount(&server)
            .await;
        answer(
            "reactions.add",
            "x",
            serde_json::json!({"ok": false, "error": "already_reacted"}),
        )
        .mount(&server)
        .await;
        answer(
            "reactions.remove",
            "eyes",
            serde_json::json!({"ok": false, "error": "no_reaction"}),
        )
        .mount(&server)
        .await;
        answer(
            "reactions.add",
            "white_check_mark",
            serde_json::json!({"ok": false, "error": "missing_scope"}),
        )
        .mount(&server)
        .await;
        let api = api(&server);
        api.add_reaction("C1", "1.2", "eyes").await.unwrap();
        api.add_reaction("C1", "1.2", "x").await.unwrap();
        api.remove_reaction("C1", "1.2", "eyes").await.unwrap();
        let error = api
            .add_reaction("C1", "1.2", "white_check_mark")
            .await
            .unwrap_err();
        assert!(
            matches!(&error, ChannelError::Permanent(text) if text.contains("missing_scope")),
            "{error:?}"
        );
    }

    #[tokio::test]
    async fn slack_errors_keep_their_kind_and_never_the_token() {
        let server = MockServer::start().await;
        let answer = |channel: &str, response: ResponseTemplate| {
            Mock::given(method("POST"))
                .and(path("/api/chat.postMessage"))
                .and(body_partial_json(serde_json::json!({"channel": channel})))
                .respond_with(response)
        };
        answer(
            "C_GONE",
            ResponseTemplate::new(200).set_body_json(serde_json::json!({
                "ok": false, "error": "channel_not_found", "echo": TOKEN
            })),
        )
        .mount(&server)
        .await;
        answer(
            "C_BUSY",
            ResponseTemplate::new(429)
                .insert_header("retry-after", "7")
                .set_body_json(serde_json::json!({"ok": false, "error": "ratelimited"})),
        )
        .mount(&server)
        .await;
        answer(
            "C_DOWN",
            ResponseTemplate::new(503).set_body_string(format!("upstream {TOKEN} broke")),
        )
        .mount(&server)
        .await;
        answer(
            "C_AUTH",
            ResponseTemplate::new(200)
                .set_body_json(serde_json::json!({"ok": false, "error": "invalid_auth"})),
        )
        .mount(&server)
        .await;
        answer(
            "C_ODD",
            ResponseTemplate::new(200)
                .insert_header("content-type", "application/json")
                .set_body_string(format!("{{\"ok\": true, \"token\": \"{TOKEN}\"}}")),
        )
        .mount(&server)
        .await;
        let api = api(&server);
        let post = |channel: &'static str| {
            let api = &api;
            async move { api.post_message(channel, "x", None).await.unwrap_err() }
        };

        let gone = post("C_GONE").await;
        assert_eq!(
            gone,
            ChannelError::Permanent("Slack answered channel_not_found".into())
        );
        assert_eq!(
            post("C_BUSY").await,
            ChannelError::RateLimited {
                retry_after: Duration::from_secs(7)
            }
        );
        let down = post("C_DOWN").await;
        assert!(
            matches!(&down, ChannelError::Transient(text) if text.contains("503")),
            "{down:?}"
        );
        let auth = post("C_AUTH").await;
        assert!(
            matches!(&auth, ChannelError::Permanent(text) if text.contains("channels.slack.bot_token") && text.contains("invalid_auth")),
            "{auth:?}"
        );
        let odd = post("C_ODD").await;
        assert!(matches!(odd, ChannelError::Transient(_)), "{odd:?}");

        // A closed port: the connection fails.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let closed = SlackApi::new(TOKEN, &format!("http://127.0.0.1:{port}/api")).unwrap();
        let refused = closed.post_message("C1", "x", None).await.unwrap_err();
        assert!(matches!(refused, ChannelError::Transient(_)), "{refused:?}");

        for error in [gone, down, auth, odd, refused] {
            let text = format!("{error} {error:?}");
            assert!(!text.contains("SECRETtoken"), "{text}");
        }
        let debug = format!("{api:?}");
        assert!(!debug.contains("SECRETtoken"), "{debug}");
    }

    #[tokio::test]
    async fn auth_test_names_the_bot_and_its_workspace() {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path("/api/auth.test"))
            .and(header("authorization", format!("Bearer {TOKEN}").as_str()))
            .respond_with(ok(serde_json::json!({
                "url": "https://acme-ops.slack.com/", "team": "Acme Ops", "user": "antler",
                "team_id": "T0OPS00001", "user_id": "U0BOT00001", "bot_id": "B0BOT00001",
                "is_enterprise_install": false
            })))
            .mount(&server)
            .await;
        assert_eq!(
            api(&server).auth_test().await.unwrap(),
            SlackIdentity {
                user_id: "U0BOT00001".into(),
                bot_id: Some("B0BOT00001".into()),
                team_id: "T0OPS00001".into(),
                team_name: "Acme Ops".into(),
            }
        );
    }

    #[tokio::test]
    async fn files_are_fetched_with_the_token_within_the_cap() {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path("/files-pri/T0-F1/download/a.txt"))
            .and(header("authorization", format!("Bearer {TOKEN}").as_str()))
            .respond_with(ResponseTemplate::new(200).set_body_string("hello"))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/files-pri/T0-F2/download/gone.txt"))
            .respond_with(ResponseTemplate::new(404))
            .mount(&server)
            .await;
        let api = api(&server);
        let url = format!("{}/files-pri/T0-F1/download/a.txt", server.uri());
        assert_eq!(api.fetch_file(&url, 100).await.unwrap(), b"hello");
        assert_eq!(api.fetch_file(&url, 5).await.unwrap(), b"hello");
        assert_eq!(
            api.fetch_file(&url, 4).await.unwrap_err(),
            ChannelError::TooLarge { limit: 4 }
        );
        let gone = format!("{}/files-pri/T0-F2/download/gone.txt", server.uri());
        assert!(matches!(
            api.fetch_file(&gone, 100).await.unwrap_err(),
            ChannelError::Permanent(text) if text.contains("404")
        ));

        // The token goes to Slack's file host and the API's own host only.
        for elsewhere in [
            "https://evil.example.com/files-pri/T0-F1/a.txt",
            "http://files.slack.com/files-pri/T0-F1/a.txt",
            "https://files.slack.com.evil.example/a.txt",
            "not a url",
        ] {
            assert!(
                matches!(
                    api.fetch_file(elsewhere, 100).await.unwrap_err(),
                    ChannelError::Permanent(_)
                ),
                "{elsewhere}"
            );
        }
        let other_port = url.replace(&server.address().port().to_string(), "9");
        assert!(matches!(
            api.fetch_file(&other_port, 100).await.unwrap_err(),
            ChannelError::Permanent(_)
        ));
        // Nothing but the two good fetches and the 404 reached the server.
        assert_eq!(server.received_requests().await.unwrap().len(), 4);
        assert!(api.may_send_token_to(
            &reqwest::Url::parse("https://files.slack.com/files-pri/T0-F1/download/a.txt").unwrap()
        ));
    }

    #[tokio::test]
    async fn a_file_without_a_declared_length_is_cut_off_while_reading() {
        // A server that declares no length, so only counting finds the size.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            if let Ok((mut socket, _)) = listener.accept().await {
                let mut request = [0u8; 4096];
                let _ = socket.read(&mut request).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n0123456789abcdef")
                    .await;
            }
        });
        let api = SlackApi::new(TOKEN, &format!("http://{address}/api")).unwrap();
        assert_eq!(
            api.fetch_file(&format!("http://{address}/f"), 10)
                .await
                .unwrap_err(),
            ChannelError::TooLarge { limit: 10 }
        );
    }
}
