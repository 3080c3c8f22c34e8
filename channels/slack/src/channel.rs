//! Slack as an antler [`Channel`]: signed requests on two routes (Events API and slash
//! commands), events normalized, replies posted in the user's thread and edited in place.

use std::sync::RwLock;
use std::time::Duration;

use antler_channel::render::{self, Limit, SlackMrkdwn};
use antler_channel::{
    AttachmentRef, AttachmentSource, Capabilities, Channel, ChannelError, ConversationKey,
    EditRate, Limits, OutboundMessage, Parsed, Part, Receipt, WebhookRequest, verify,
};
use serde::Deserialize;
use slack_morphism::SlackSigningSecret;
use slack_morphism::events::SlackPushEvent;
use slack_morphism::signature_verifier::SlackEventSignatureVerifier;

use crate::client::{DEFAULT_API_URL, SlackApi, SlackIdentity};
use crate::normalize::{
    Context, NAME, Normalized, SlashCommand, normalize_callback, normalize_command,
};

/// The most a message holds, in characters. Slack truncates `text` only past 40,000, but
/// messages longer than this are hard to read.
const MESSAGE_LIMIT: usize = 4000;

/// How far a request's timestamp may be from now, in seconds, either side (Slack's 5 minutes).
const MAX_AGE_SECS: i64 = 300;

/// The slash command's immediate answer, shown to its user alone.
pub const WORKING: &str = "Working on it…";

/// The header with the Unix time the request was signed at.
pub const TIMESTAMP_HEADER: &str = "x-slack-request-timestamp";

/// The header with the request's signature, `v0=<hex>`.
pub const SIGNATURE_HEADER: &str = "x-slack-signature";

/// What the Slack channel is set up with.
#[derive(Clone)]
pub struct SlackSettings {
    /// The bot token (`xoxb-…`).
    pub bot_token: String,
    /// The app's signing secret, which signs every request Slack sends.
    pub signing_secret: String,
    /// The Web API base URL (`https://slack.com/api`).
    pub api_url: String,
    /// The only workspace to accept; `None` accepts any the app is installed in.
    pub team_id: Option<String>,
    /// Replies in a channel thread the bot answered in reach it without a mention.
    pub thread_follow_ups: bool,
}

impl Default for SlackSettings {
    fn default() -> Self {
        Self {
            bot_token: String::new(),
            signing_secret: String::new(),
            api_url: DEFAULT_API_URL.to_owned(),
            team_id: None,
            thread_follow_ups: true,
        }
    }
}

impl std::fmt::Debug for SlackSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlackSettings")
            .field("bot_token", &"***")
            .field("signing_secret", &"***")
            .field("api_url", &self.api_url)
            .field("team_id", &self.team_id)
            .field("thread_follow_ups", &self.thread_follow_ups)
            .finish()
    }
}

/// The Slack channel.
pub struct SlackChannel {
    verifier: SlackEventSignatureVerifier,
    team_id: Option<String>,
    thread_follow_ups: bool,
    api: SlackApi,
    /// Who the bot is, from `auth.test` ([`SlackChannel::learn_identity`]). Envelopes name the
    /// bot themselves (`authorizations`); this covers those that do not.
    me: RwLock<Option<SlackIdentity>>,
    now_ms: fn() -> u64,
}

impl std::fmt::Debug for SlackChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlackChannel")
            .field("signing_secret", &"***")
            .field("team_id", &self.team_id)
            .field("api", &self.api)
            .finish_non_exhaustive()
    }
}

impl SlackChannel {
    /// The channel for `settings`; `now_ms` stamps received messages and judges the age of
    /// signed requests.
    pub fn new(settings: &SlackSettings, now_ms: fn() -> u64) -> Result<Self, ChannelError> {
        if !settings.bot_token.starts_with("xoxb-") {
            return Err(ChannelError::Permanent(
                "channels.slack.bot_token does not look like a bot token (xoxb-…)".to_owned(),
            ));
        }
        if settings.signing_secret.is_empty() {
            return Err(ChannelError::Permanent(
                "channels.slack.signing_secret is empty".to_owned(),
            ));
        }
        Ok(Self {
            verifier: SlackEventSignatureVerifier::new(&SlackSigningSecret::new(
                settings.signing_secret.clone(),
            )),
            team_id: settings.team_id.clone().filter(|team| !team.is_empty()),
            thread_follow_ups: settings.thread_follow_ups,
            api: SlackApi::new(&settings.bot_token, &settings.api_url)?,
            me: RwLock::new(None),
            now_ms,
        })
    }

    /// The Web API client (setup commands, `antler doctor`).
    pub fn api(&self) -> &SlackApi {
        &self.api
    }

    /// Asks Slack who the bot is (`auth.test`) and remembers it.
    pub async fn learn_identity(&self) -> Result<SlackIdentity, ChannelError> {
        let me = self.api.auth_test().await?;
        if let Ok(mut known) = self.me.write() {
            *known = Some(me.clone());
        }
        Ok(me)
    }

    /// The identity [`SlackChannel::learn_identity`] found, if it ran.
    pub fn identity(&self) -> Option<SlackIdentity> {
        self.me
            .read()
            .map(|me| me.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }

    fn parse_event(&self, body: &[u8]) -> Result<Parsed, ChannelError> {
        let raw: serde_json::Value = serde_json::from_slice(body)
            .map_err(|e| ChannelError::Malformed(format!("not JSON: {e}")))?;
        let push = match SlackPushEvent::deserialize(&raw) {
            Ok(push) => push,
            Err(e) => {
                tracing::debug!(
                    kind = raw.get("type").and_then(|t| t.as_str()),
                    error = %e,
                    "a Slack request antler does not handle"
                );
                return Ok(Parsed::Ignore);
            }
        };
        let callback = match push {
            SlackPushEvent::UrlVerification(challenge) => {
                return Ok(Parsed::Reply(
                    serde_json::json!({"challenge": challenge.challenge}),
                ));
            }
            SlackPushEvent::EventCallback(callback) => callback,
            SlackPushEvent::AppRateLimited(limited) => {
                tracing::warn!(
                    team = %limited.team_id,
                    "Slack is dropping events: the app passed 30,000 deliveries an hour"
                );
                return Ok(Parsed::Ignore);
            }
        };
        let me = self.identity();
        let context = self.context(me.as_ref());
        let raw_event = raw.get("event").unwrap_or(&serde_json::Value::Null);
        Ok(match normalize_callback(&callback, raw_event, &context) {
            Normalized::Event(event) => Parsed::Events(vec![*event]),
            Normalized::Ignored(reason) => {
                tracing::debug!(reason, event_id = %callback.event_id, "Slack event ignored");
                Parsed::Ignore
            }
        })
    }

    fn parse_command(&self, body: &[u8]) -> Result<Parsed, ChannelError> {
        let command: SlashCommand = serde_urlencoded::from_bytes(body)
            .map_err(|e| ChannelError::Malformed(format!("not a slash command: {e}")))?;
        let me = self.identity();
        Ok(
            match normalize_command(&command, &self.context(me.as_ref())) {
                Normalized::Event(event) => Parsed::EventsWithReply {
                    events: vec![*event],
                    // Slack shows this to the user alone, at once; the answer follows in the chat.
                    reply: serde_json::json!({
                        "response_type": "ephemeral",
                        "text": WORKING,
                    }),
                },
                Normalized::Ignored(reason) => {
                    tracing::debug!(reason, "Slack command ignored");
                    Parsed::Ignore
                }
            },
        )
    }

    fn context<'a>(&'a self, me: Option<&'a SlackIdentity>) -> Context<'a> {
        Context {
            bot_user_id: me.map(|me| me.user_id.as_str()),
            team_id: self.team_id.as_deref(),
            thread_follow_ups: self.thread_follow_ups,
            received_at_ms: (self.now_ms)(),
        }
    }
}

/// The channel and thread of `slack:<team>:<channel>[:<thread ts>]`.
fn target(conversation: &ConversationKey) -> Result<(&str, Option<&str>), ChannelError> {
    let mut parts = conversation.as_str().split(':');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(NAME), Some(_team), Some(channel), thread) if !channel.is_empty() => {
            Ok((channel, thread.filter(|ts| !ts.is_empty())))
        }
        _ => Err(ChannelError::Permanent(format!(
            "not a Slack conversation: {conversation}"
        ))),
    }
}

/// A header's value as text, if present and readable.
fn header<'a>(headers: &'a http::HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

#[async_trait::async_trait]
impl Channel for SlackChannel {
    fn name(&self) -> &'static str {
        NAME
    }

    /// `events` for the Events API, `commands` for slash commands.
    fn routes(&self) -> &'static [&'static str] {
        &["events", "commands"]
    }

    /// Both signature headers present and the timestamp within 5 minutes of now.
    fn verify_headers(&self, headers: &http::HeaderMap) -> Result<(), ChannelError> {
        let timestamp: i64 = header(headers, TIMESTAMP_HEADER)
            .and_then(|ts| ts.trim().parse().ok())
            .ok_or(ChannelError::Unauthorized)?;
        if header(headers, SIGNATURE_HEADER).is_none() {
            return Err(ChannelError::Unauthorized);
        }
        let now = i64::try_from((self.now_ms)() / 1000).unwrap_or(i64::MAX);
        if !verify::timestamp_within(timestamp, now, MAX_AGE_SECS) {
            return Err(ChannelError::Unauthorized);
        }
        Ok(())
    }

    /// `v0=HMAC-SHA256(signing secret, "v0:{ts}:{body}")`, compared in constant time by
    /// slack-morphism's verifier. Events and slash commands are signed alike.
    fn verify(&self, request: &WebhookRequest<'_>) -> Result<(), ChannelError> {
        self.verify_headers(request.headers)?;
        let (Some(timestamp), Some(signature)) = (
            header(request.headers, TIMESTAMP_HEADER),
            header(request.headers, SIGNATURE_HEADER),
        ) else {
            return Err(ChannelError::Unauthorized);
        };
        // Slack signs text (JSON or a form); a body that is not UTF-8 was not signed by it.
        let body = std::str::from_utf8(request.body).map_err(|_| ChannelError::Unauthorized)?;
        self.verifier
            .verify(signature, body, timestamp.trim())
            .map_err(|_| ChannelError::Unauthorized)
    }

    fn parse(&self, request: &WebhookRequest<'_>) -> Result<Parsed, ChannelError> {
        match request.route {
            "events" => self.parse_event(request.body),
            "commands" => self.parse_command(request.body),
            route => Err(ChannelError::Malformed(format!(
                "Slack has no route {route:?}"
            ))),
        }
    }

    /// Slack mrkdwn in chunks of at most 4000 characters.
    fn render(&self, markdown: &str) -> Result<Vec<String>, ChannelError> {
        render::parts(markdown, &SlackMrkdwn, Limit::Chars(MESSAGE_LIMIT))
            .map_err(|e| ChannelError::Permanent(e.to_string()))
    }

    /// Posts one part in the conversation's thread (top level in a DM without one).
    async fn send(
        &self,
        message: &OutboundMessage,
        part: Part<'_>,
    ) -> Result<Receipt, ChannelError> {
        let (channel, thread_ts) = target(&message.conversation)?;
        let ts = self.api.post_message(channel, part.body, thread_ts).await?;
        Ok(Receipt {
            platform_message_id: ts,
        })
    }

    /// `chat.update` of the bot's message `sent` (its ts).
    async fn edit(
        &self,
        message: &OutboundMessage,
        sent: &Receipt,
        part: Part<'_>,
    ) -> Result<(), ChannelError> {
        let (channel, _) = target(&message.conversation)?;
        self.api
            .update_message(channel, &sent.platform_message_id, part.body)
            .await
    }

    /// 4000 characters a message; edits at most once a second in DMs and every 2 seconds in
    /// channels (`chat.update` is Tier 3, about 50 a minute per workspace).
    fn limits(&self) -> Limits {
        Limits {
            message: Some(Limit::Chars(MESSAGE_LIMIT)),
            edits: Some(EditRate {
                private: Duration::from_secs(1),
                group: Duration::from_secs(2),
            }),
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            files: true,
            images: true,
            typing: false,
        }
    }

    async fn fetch_attachment(
        &self,
        attachment: &AttachmentRef,
        max_bytes: u64,
    ) -> Result<Vec<u8>, ChannelError> {
        match &attachment.source {
            AttachmentSource::Url { url } => self.api.fetch_file(url, max_bytes).await,
            AttachmentSource::Platform { .. } | AttachmentSource::Inline { .. } => {
                Err(ChannelError::Unsupported)
            }
        }
    }
}
