//! Slack as an antler [`Channel`]: signed requests on three routes (Events API, slash
//! commands and interactions), events normalized, replies posted in the user's thread and
//! edited in place, prompts posted with Block Kit buttons whose presses are answered through
//! the Web API.

use std::sync::RwLock;
use std::time::Duration;

use antler_channel::render::{self, Limit, SlackMrkdwn};
use antler_channel::verify::SignedHeaders;
use antler_channel::{
    AttachmentRef, AttachmentSource, Capabilities, Channel, ChannelError, ConversationKey,
    EditRate, Limits, OutboundMessage, Parsed, Part, Press, PressAnswer, Progress, Receipt,
    WebhookRequest, verify,
};
use serde::Deserialize;
use slack_morphism::SlackSigningSecret;
use slack_morphism::events::SlackPushEvent;
use slack_morphism::signature_verifier::SlackEventSignatureVerifier;

use crate::blocks;
use crate::client::{DEFAULT_API_URL, Posted, Responded, SlackApi, SlackIdentity};
use crate::interaction::{Interacted, PressTo, normalize_interaction};
use crate::normalize::{
    Context, NAME, Normalized, ReplyTo, SlashCommand, normalize_callback, normalize_command,
};

/// The most a message holds, in characters. Slack truncates `text` only past 40,000, but
/// messages longer than this are hard to read.
const MESSAGE_LIMIT: usize = 4000;

/// How far a request's timestamp may be from now, in seconds, either side (Slack's 5 minutes).
const MAX_AGE_SECS: i64 = 300;

/// How long a slash command's `response_url` takes answers ("up to 5 times within 30 minutes",
/// Slack's "Handling user interaction"), less a margin so a post under way does not find it
/// expired.
const RESPONSE_URL_LIFETIME_MS: u64 = 30 * 60 * 1000 - 30 * 1000;

/// The receipt of a part posted through a `response_url`: Slack names no message for it.
const RESPONDED: &str = "response_url";

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
    /// The app's signing secret, which signs every request Slack sends to the webhooks. Empty
    /// only with `socket_mode`, and then every webhook request is refused.
    pub signing_secret: String,
    /// Events arrive over Socket Mode ([`crate::SlackSocket`]), not the webhooks.
    pub socket_mode: bool,
    /// The Web API base URL (`https://slack.com/api`).
    pub api_url: String,
    /// The only workspace to accept; `None` accepts any the app is installed in.
    pub team_id: Option<String>,
    /// Replies in a channel thread the bot answered in reach it without a mention.
    pub thread_follow_ups: bool,
    /// Other bots (`B…` bot ids or `A…` app ids; classic bots and incoming webhooks too) whose
    /// messages are answered like a person's; the rest are ignored.
    pub allowed_bots: Vec<String>,
    /// React to the user's message while its turn runs (👀) and when it ends (✅ or ❌).
    pub progress_reactions: bool,
    /// A slash command's answer is seen by everyone in the conversation (`in_channel`), not
    /// only by its user (`ephemeral`, the default).
    pub slash_in_channel: bool,
}

impl Default for SlackSettings {
    fn default() -> Self {
        Self {
            bot_token: String::new(),
            signing_secret: String::new(),
            socket_mode: false,
            api_url: DEFAULT_API_URL.to_owned(),
            team_id: None,
            thread_follow_ups: true,
            allowed_bots: Vec::new(),
            progress_reactions: true,
            slash_in_channel: false,
        }
    }
}

impl std::fmt::Debug for SlackSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlackSettings")
            .field("bot_token", &"***")
            .field("signing_secret", &"***")
            .field("socket_mode", &self.socket_mode)
            .field("api_url", &self.api_url)
            .field("team_id", &self.team_id)
            .field("thread_follow_ups", &self.thread_follow_ups)
            .field("allowed_bots", &self.allowed_bots)
            .field("progress_reactions", &self.progress_reactions)
            .field("slash_in_channel", &self.slash_in_channel)
            .finish()
    }
}

/// The Slack channel.
pub struct SlackChannel {
    /// `None` in Socket Mode without a signing secret: no webhook request verifies.
    verifier: Option<SlackEventSignatureVerifier>,
    team_id: Option<String>,
    thread_follow_ups: bool,
    allowed_bots: Vec<String>,
    progress_reactions: bool,
    slash_in_channel: bool,
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
        if settings.signing_secret.is_empty() && !settings.socket_mode {
            return Err(ChannelError::Permanent(
                "channels.slack.signing_secret is empty".to_owned(),
            ));
        }
        Ok(Self {
            verifier: (!settings.signing_secret.is_empty()).then(|| {
                SlackEventSignatureVerifier::new(&SlackSigningSecret::new(
                    settings.signing_secret.clone(),
                ))
            }),
            team_id: settings.team_id.clone().filter(|team| !team.is_empty()),
            thread_follow_ups: settings.thread_follow_ups,
            allowed_bots: settings.allowed_bots.clone(),
            progress_reactions: settings.progress_reactions,
            slash_in_channel: settings.slash_in_channel,
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
        if let Some(wanted) = self
            .team_id
            .as_deref()
            .filter(|wanted| *wanted != me.team_id)
        {
            // Every event would be refused; say why once instead of silently.
            tracing::warn!(
                token_team = %me.team_id,
                configured = wanted,
                "channels.slack.team_id names another workspace than the bot token's"
            );
        }
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

    /// A Socket Mode envelope's payload, as the webhooks would have it: `events_api` carries
    /// the Events API body, `slash_commands` the command's form fields as JSON, `interactive`
    /// an interaction's payload (a button press). Anything newer is not handled.
    pub fn parse_socket(
        &self,
        kind: &str,
        payload: &serde_json::Value,
    ) -> Result<Parsed, ChannelError> {
        match kind {
            "events_api" => self.parse_event_json(payload),
            "slash_commands" => {
                let command = SlashCommand::deserialize(payload)
                    .map_err(|e| ChannelError::Malformed(format!("not a slash command: {e}")))?;
                Ok(self.command(&command))
            }
            "interactive" => self.interaction(payload),
            kind => {
                tracing::debug!(kind, "a Socket Mode envelope antler does not handle");
                Ok(Parsed::Ignore)
            }
        }
    }

    fn parse_event(&self, body: &[u8]) -> Result<Parsed, ChannelError> {
        let raw: serde_json::Value = serde_json::from_slice(body)
            .map_err(|e| ChannelError::Malformed(format!("not JSON: {e}")))?;
        self.parse_event_json(&raw)
    }

    fn parse_event_json(&self, raw: &serde_json::Value) -> Result<Parsed, ChannelError> {
        let push = match SlackPushEvent::deserialize(raw) {
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
            Normalized::AwaitingIdentity => {
                return Err(ChannelError::Transient(
                    "a Slack channel message with a mention arrived before the bot's user id is \
                     known (auth.test); Slack retries it"
                        .to_owned(),
                ));
            }
        })
    }

    /// An interaction request: a form whose one field, `payload`, is the JSON.
    fn parse_interaction(&self, body: &[u8]) -> Result<Parsed, ChannelError> {
        #[derive(Deserialize)]
        struct Form {
            payload: String,
        }
        let form: Form = serde_urlencoded::from_bytes(body)
            .map_err(|e| ChannelError::Malformed(format!("not an interaction: {e}")))?;
        let raw: serde_json::Value = serde_json::from_str(&form.payload).map_err(|e| {
            ChannelError::Malformed(format!("an interaction that is not JSON: {e}"))
        })?;
        self.interaction(&raw)
    }

    fn interaction(&self, raw: &serde_json::Value) -> Result<Parsed, ChannelError> {
        let me = self.identity();
        match normalize_interaction(raw, &self.context(me.as_ref())) {
            Ok(Interacted::Press(press)) => Ok(Parsed::Press(*press)),
            Ok(Interacted::Ignored(reason)) => {
                tracing::debug!(reason, "Slack interaction ignored");
                Ok(Parsed::Ignore)
            }
            Err(e) => Err(ChannelError::Malformed(e)),
        }
    }

    /// `markdown` as one mrkdwn text, its parts joined (an answer to a press is short).
    fn mrkdwn(&self, markdown: &str) -> Result<String, ChannelError> {
        Ok(self.render(markdown)?.join("\n"))
    }

    fn parse_command(&self, body: &[u8]) -> Result<Parsed, ChannelError> {
        let command: SlashCommand = serde_urlencoded::from_bytes(body)
            .map_err(|e| ChannelError::Malformed(format!("not a slash command: {e}")))?;
        Ok(self.command(&command))
    }

    fn command(&self, command: &SlashCommand) -> Parsed {
        let me = self.identity();
        match normalize_command(command, &self.context(me.as_ref())) {
            Normalized::Event(event) => Parsed::EventsWithReply {
                events: vec![*event],
                // Slack shows this to the user alone, at once; the answer follows in the chat.
                reply: serde_json::json!({
                    "response_type": "ephemeral",
                    "text": WORKING,
                }),
            },
            // A slash command names the app it is for: never awaiting an identity.
            Normalized::Ignored(reason) => {
                tracing::debug!(reason, "Slack command ignored");
                Parsed::Ignore
            }
            Normalized::AwaitingIdentity => Parsed::Ignore,
        }
    }

    /// The `response_url` of `reply` while Slack still takes answers on it.
    fn live_response_url<'a>(&self, reply: &'a ReplyTo) -> Option<&'a str> {
        let url = reply.response_url.as_deref()?;
        let until = reply
            .received_at_ms
            .saturating_add(RESPONSE_URL_LIFETIME_MS);
        ((self.now_ms)() < until).then_some(url)
    }

    /// Posts `part` to `user` in a DM, after `note` (why it is not where it was asked). The
    /// receipt names the DM too (`<channel>/<ts>`), so an edit finds the message.
    async fn send_dm(
        &self,
        user: &str,
        note: &str,
        part: &Part<'_>,
    ) -> Result<Receipt, ChannelError> {
        let dm = self.api.open_dm(user).await?;
        let text = format!("{note}\n{}", part.body);
        match self
            .api
            .post(&dm, &text, None, with_buttons(&text, part))
            .await?
        {
            Posted::Ts(ts) => Ok(Receipt {
                platform_message_id: format!("{dm}/{ts}"),
            }),
            Posted::NotThere(code) => Err(ChannelError::Permanent(format!(
                "Slack answered {code} for the DM with the user"
            ))),
        }
    }

    fn context<'a>(&'a self, me: Option<&'a SlackIdentity>) -> Context<'a> {
        Context {
            bot_user_id: me.map(|me| me.user_id.as_str()),
            team_id: self.team_id.as_deref(),
            thread_follow_ups: self.thread_follow_ups,
            allowed_bots: &self.allowed_bots,
            received_at_ms: (self.now_ms)(),
        }
    }
}

/// `text` with `part`'s buttons under it as blocks, when it has any.
fn with_buttons(text: &str, part: &Part<'_>) -> Option<Vec<slack_morphism::prelude::SlackBlock>> {
    (!part.buttons.is_empty()).then(|| blocks::with_buttons(text, part.buttons))
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
impl SlackChannel {
    /// The signature headers, present and fresh by `now_ms`.
    fn signed_headers<'a>(
        &self,
        headers: &'a http::HeaderMap,
    ) -> Result<SignedHeaders<'a>, ChannelError> {
        let now = i64::try_from((self.now_ms)() / 1000).unwrap_or(i64::MAX);
        verify::signed_headers(
            headers,
            TIMESTAMP_HEADER,
            SIGNATURE_HEADER,
            now,
            MAX_AGE_SECS,
        )
    }
}

#[async_trait::async_trait]
impl Channel for SlackChannel {
    fn name(&self) -> &'static str {
        NAME
    }

    /// `events` for the Events API, `commands` for slash commands, `interactions` for button
    /// presses (the app's Interactivity Request URL).
    fn routes(&self) -> &'static [&'static str] {
        &["events", "commands", "interactions"]
    }

    /// Both signature headers present and the timestamp within 5 minutes of now.
    fn verify_headers(&self, headers: &http::HeaderMap) -> Result<(), ChannelError> {
        self.signed_headers(headers).map(|_| ())
    }

    /// `v0=HMAC-SHA256(signing secret, "v0:{ts}:{body}")`, compared in constant time by
    /// slack-morphism's verifier. Events, slash commands and interactions are signed alike. The verifier
    /// judges the timestamp's age by the wall clock as well as [`Channel::verify_headers`]
    /// does by `now_ms`, so a replayed request fails even under a test clock.
    fn verify(&self, request: &WebhookRequest<'_>) -> Result<(), ChannelError> {
        let SignedHeaders {
            timestamp,
            signature,
        } = self.signed_headers(request.headers)?;
        let verifier = self.verifier.as_ref().ok_or(ChannelError::Unauthorized)?;
        // Slack signs text (JSON or a form); a body that is not UTF-8 was not signed by it.
        let body = std::str::from_utf8(request.body).map_err(|_| ChannelError::Unauthorized)?;
        verifier
            .verify(signature, body, timestamp.trim())
            .map_err(|_| ChannelError::Unauthorized)
    }

    fn parse(&self, request: &WebhookRequest<'_>) -> Result<Parsed, ChannelError> {
        match request.route {
            "events" => self.parse_event(request.body),
            "commands" => self.parse_command(request.body),
            "interactions" => self.parse_interaction(request.body),
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

    /// Posts one part. A slash command's answer goes through its `response_url`, where the
    /// command ran (ephemeral or in the channel as configured); once that URL is spent
    /// (30 minutes, 5 uses), a private answer goes to the user's DM and a public one to the
    /// channel. Anything else is posted in the conversation's thread (top level in a DM
    /// without one). Where the bot cannot post (`not_in_channel`, `channel_not_found`) the
    /// answer goes to the user's DM with a note, rather than being lost. A part with buttons
    /// is posted with them as Block Kit blocks, and never through a `response_url`: a press
    /// replaces it with `chat.update`, which only a posted message takes.
    async fn send(
        &self,
        message: &OutboundMessage,
        part: Part<'_>,
    ) -> Result<Receipt, ChannelError> {
        let (channel, thread_ts) = target(&message.conversation)?;
        let reply = message.reply_context.as_ref().and_then(ReplyTo::read);
        if let Some(reply) = &reply
            && reply.response_url.is_some()
        {
            if part.buttons.is_empty()
                && let Some(url) = self.live_response_url(reply)
                && self
                    .api
                    .respond(url, part.body, self.slash_in_channel)
                    .await?
                    == Responded::Ok
            {
                return Ok(Receipt {
                    platform_message_id: RESPONDED.to_owned(),
                });
            }
            if !self.slash_in_channel {
                let note = format!("_The answer to your command in <#{channel}>:_");
                return self.send_dm(&reply.user, &note, &part).await;
            }
        }
        let blocks = with_buttons(part.body, &part);
        match self.api.post(channel, part.body, thread_ts, blocks).await? {
            Posted::Ts(ts) => Ok(Receipt {
                platform_message_id: ts,
            }),
            Posted::NotThere(code) => {
                let Some(reply) = reply else {
                    return Err(ChannelError::Permanent(format!("Slack answered {code}")));
                };
                tracing::warn!(
                    channel,
                    code,
                    "the bot cannot post where it was asked; the answer goes to the user's DM"
                );
                let note = format!(
                    "_You asked in <#{channel}>, where I cannot post (invite me there with \
                     `/invite`); here is the answer:_"
                );
                self.send_dm(&reply.user, &note, &part).await
            }
        }
    }

    /// A slash command's answer is sent whole: each message through its `response_url` is one
    /// of only 5 uses.
    fn live_reply(&self, message: &OutboundMessage) -> bool {
        message
            .reply_context
            .as_ref()
            .and_then(ReplyTo::read)
            .is_none_or(|reply| reply.response_url.is_none())
    }

    /// `chat.update` of the bot's message `sent` (its ts, or `<DM>/<ts>` for one posted to the
    /// user's DM). A message posted through a `response_url` cannot be edited.
    async fn edit(
        &self,
        message: &OutboundMessage,
        sent: &Receipt,
        part: Part<'_>,
    ) -> Result<(), ChannelError> {
        if sent.platform_message_id == RESPONDED {
            return Err(ChannelError::Unsupported);
        }
        // A message posted to the user's DM instead names its channel.
        let (channel, ts) = match sent.platform_message_id.split_once('/') {
            Some((dm, ts)) => (dm, ts),
            None => (
                target(&message.conversation)?.0,
                sent.platform_message_id.as_str(),
            ),
        };
        self.api.update_message(channel, ts, part.body).await
    }

    /// 👀 while the turn runs, then ✅ or ❌ (`reactions.add`/`remove`, scope
    /// `reactions:write`).
    async fn mark(
        &self,
        conversation: &ConversationKey,
        message_id: &str,
        progress: Progress,
    ) -> Result<(), ChannelError> {
        const WORKING: &str = "eyes";
        let (channel, _) = target(conversation)?;
        match progress {
            Progress::Working => self.api.add_reaction(channel, message_id, WORKING).await,
            Progress::Done | Progress::Failed => {
                let end = if progress == Progress::Done {
                    "white_check_mark"
                } else {
                    "x"
                };
                // The end mark matters more than a stale 👀: add it first.
                self.api.add_reaction(channel, message_id, end).await?;
                self.api.remove_reaction(channel, message_id, WORKING).await
            }
        }
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
            // Replies name their files; uploading them (files.uploadV2) is not built.
            files: false,
            images: true,
            typing: false,
            progress_marks: self.progress_reactions,
            buttons: true,
        }
    }

    /// The notice goes to the presser alone (`chat.postEphemeral`, in the message's thread);
    /// an update replaces the button's message (`chat.update` with the text in sections, the
    /// buttons gone). The press's request is answered with an empty 200: the Web API is used
    /// rather than the payload's `response_url`, a URL from the request. Both calls are made,
    /// at once; the update's failure is returned first.
    async fn answer_press(
        &self,
        press: &Press,
        answer: &PressAnswer,
    ) -> Result<Option<serde_json::Value>, ChannelError> {
        let to = press
            .answer_context
            .as_ref()
            .and_then(PressTo::read)
            .ok_or_else(|| {
                ChannelError::Permanent("a Slack press without where to answer it".to_owned())
            })?;
        let updated = answer
            .update
            .as_deref()
            .map(|update| self.mrkdwn(update))
            .transpose()?;
        let notice = self.mrkdwn(&answer.notice)?;
        let update = async {
            match &updated {
                Some(text) => {
                    self.api
                        .update_blocks(&to.channel, &press.message_id, text, blocks::sections(text))
                        .await
                }
                None => Ok(()),
            }
        };
        let tell = self
            .api
            .post_ephemeral(&to.channel, &to.user, &notice, to.thread_ts.as_deref());
        // Together: Slack waits 3 seconds for the press's answer.
        let (updated, noticed) = tokio::join!(update, tell);
        updated.and(noticed).map(|()| None)
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

#[cfg(test)]
mod tests {
    use antler_testkit::slack::MockSlack;

    use super::*;

    const TOKEN: &str = "xoxb-1000-2000-SECRETtoken";
    const SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";

    fn wall_clock_ms() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }

    /// The vectors' signing time, 2026-01-01T00:00:00Z.
    fn vector_clock_ms() -> u64 {
        1_767_225_600_000
    }

    fn settings(api_url: &str) -> SlackSettings {
        SlackSettings {
            bot_token: TOKEN.into(),
            signing_secret: SECRET.into(),
            api_url: api_url.into(),
            ..SlackSettings::default()
        }
    }

    fn channel() -> SlackChannel {
        SlackChannel::new(&settings("http://127.0.0.1:9/api"), || 42).unwrap()
    }

    fn fixture(name: &str) -> Vec<u8> {
        antler_testkit::fixture_bytes("slack", name)
    }

    fn parse(channel: &SlackChannel, route: &str, body: &[u8]) -> Parsed {
        let headers = http::HeaderMap::new();
        channel
            .parse(&WebhookRequest {
                route,
                headers: &headers,
                body,
            })
            .unwrap()
    }

    fn event(parsed: Parsed) -> antler_channel::InboundEvent {
        match parsed {
            Parsed::Events(mut events) if events.len() == 1 => events.remove(0),
            other => panic!("expected one event: {other:?}"),
        }
    }

    /// A fixture's JSON with its `event` changed by `edit`.
    fn variant(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
        let mut json: serde_json::Value = serde_json::from_slice(&fixture(name)).unwrap();
        edit(&mut json["event"]);
        serde_json::to_vec(&json).unwrap()
    }

    #[test]
    fn a_mention_in_a_thread_is_a_turn_in_that_thread() {
        let event = event(parse(
            &channel(),
            "events",
            &fixture("slack_app_mention_thread.json"),
        ));
        assert_eq!(event.channel, "slack");
        assert_eq!(event.event_id, "1767225600.000200", "the message ts");
        assert_eq!(
            event.conversation.as_str(),
            "slack:T0OPS00001:C0SRE00001:1767225500.000100"
        );
        assert_eq!(event.text, "restart web-api & report");
        assert_eq!(event.user.id, "U0ADA00001");
        assert_eq!(event.chat.as_deref(), Some("C0SRE00001"));
        assert_eq!(event.reply_to.as_deref(), Some("1767225600.000200"));
        assert_eq!(event.received_at_ms, 42);
        assert!(event.group && !event.follow_up && event.attachments.is_empty());
    }

    #[test]
    fn a_new_mention_starts_a_thread_of_its_own() {
        let body = variant("slack_app_mention_thread.json", |e| {
            e.as_object_mut().unwrap().remove("thread_ts");
        });
        let event = event(parse(&channel(), "events", &body));
        assert_eq!(
            event.conversation.as_str(),
            "slack:T0OPS00001:C0SRE00001:1767225600.000200"
        );
    }

    #[test]
    fn a_direct_message_is_a_turn_and_the_bots_echo_is_not() {
        let channel = channel();
        let event = event(parse(&channel, "events", &fixture("slack_message_im.json")));
        assert_eq!(event.conversation.as_str(), "slack:T0OPS00001:D0ADA00001");
        assert_eq!(event.event_id, "1767225700.000300");
        assert_eq!(event.text, "status payments-api");
        assert_eq!(event.chat.as_deref(), Some("D0ADA00001"));
        assert!(!event.group && !event.follow_up);

        let echo = fixture("slack_message_im_own_bot_echo.json");
        assert_eq!(parse(&channel, "events", &echo), Parsed::Ignore);
        // Without `bot_id`, the author alone gives the bot away.
        let echo = variant("slack_message_im_own_bot_echo.json", |e| {
            let e = e.as_object_mut().unwrap();
            e.remove("bot_id");
            e.remove("bot_profile");
        });
        assert_eq!(parse(&channel, "events", &echo), Parsed::Ignore);

        // A DM in a thread keeps to that thread.
        let threaded = variant("slack_message_im.json", |e| {
            e["thread_ts"] = "1767225600.000100".into();
        });
        assert_eq!(
            event_of(&channel, &threaded).conversation.as_str(),
            "slack:T0OPS00001:D0ADA00001:1767225600.000100"
        );
    }

    fn event_of(channel: &SlackChannel, body: &[u8]) -> antler_channel::InboundEvent {
        event(parse(channel, "events", body))
    }

    /// The DM fixture as a message in channel `C0SRE00001`.
    fn in_channel(edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
        variant("slack_message_im.json", |e| {
            e["channel"] = "C0SRE00001".into();
            e["channel_type"] = "channel".into();
            edit(e);
        })
    }

    #[test]
    fn channel_messages_need_a_mention_unless_they_follow_up_in_a_thread() {
        let channel = channel();
        assert_eq!(
            parse(&channel, "events", &in_channel(|_| {})),
            Parsed::Ignore,
            "a top-level channel message without a mention"
        );

        // The message twin of a mention: the same conversation and event id as the
        // app_mention, so the inbox keeps one of them.
        let twin = variant("slack_app_mention_thread.json", |e| {
            e["type"] = "message".into();
            e["channel_type"] = "channel".into();
        });
        let mention = event_of(&channel, &fixture("slack_app_mention_thread.json"));
        let twin = event_of(&channel, &twin);
        assert_eq!(
            (
                &twin.conversation,
                &twin.event_id,
                &twin.text,
                twin.follow_up
            ),
            (
                &mention.conversation,
                &mention.event_id,
                &mention.text,
                false
            )
        );

        let reply = in_channel(|e| e["thread_ts"] = "1767225500.000100".into());
        let follow_up = event_of(&channel, &reply);
        assert!(follow_up.follow_up && follow_up.group);
        assert_eq!(
            follow_up.conversation.as_str(),
            "slack:T0OPS00001:C0SRE00001:1767225500.000100"
        );

        let off = SlackChannel::new(
            &SlackSettings {
                thread_follow_ups: false,
                ..settings("http://127.0.0.1:9/api")
            },
            || 0,
        )
        .unwrap();
        assert_eq!(parse(&off, "events", &reply), Parsed::Ignore);
    }

    #[test]
    fn edits_deletes_joins_and_other_workspaces_are_ignored() {
        let channel = channel();
        for subtype in [
            "message_changed",
            "message_deleted",
            "channel_join",
            "bot_message",
        ] {
            let body = variant("slack_message_im.json", |e| e["subtype"] = subtype.into());
            assert_eq!(
                parse(&channel, "events", &body),
                Parsed::Ignore,
                "{subtype}"
            );
        }
        let edited_mention = variant("slack_app_mention_thread.json", |e| {
            e["edited"] = serde_json::json!({"user": "U0ADA00001", "ts": "1767225601.000000"});
        });
        assert_eq!(parse(&channel, "events", &edited_mention), Parsed::Ignore);

        let pinned = SlackChannel::new(
            &SlackSettings {
                team_id: Some("T0OTHER0001".into()),
                ..settings("http://127.0.0.1:9/api")
            },
            || 0,
        )
        .unwrap();
        for name in ["slack_app_mention_thread.json", "slack_message_im.json"] {
            assert_eq!(parse(&pinned, "events", &fixture(name)), Parsed::Ignore);
        }
        assert_eq!(
            parse(&pinned, "commands", &fixture("slack_slash_command.form")),
            Parsed::Ignore
        );
        let ours = SlackChannel::new(
            &SlackSettings {
                team_id: Some("T0OPS00001".into()),
                ..settings("http://127.0.0.1:9/api")
            },
            || 0,
        )
        .unwrap();
        event(parse(&ours, "events", &fixture("slack_message_im.json")));
    }

    #[test]
    fn shared_files_become_url_attachments() {
        let body = variant("slack_message_im.json", |e| {
            e["subtype"] = "file_share".into();
            e["text"] = "".into();
            e["files"] = serde_json::json!([{
                "id": "F0001", "name": "trace.log", "mimetype": "text/plain", "size": 1234,
                "url_private": "https://files.slack.com/files-pri/T0-F0001/trace.log",
                "url_private_download": "https://files.slack.com/files-pri/T0-F0001/download/trace.log"
            }]);
        });
        let event = event_of(&channel(), &body);
        assert_eq!(
            event.attachments,
            [AttachmentRef {
                name: "trace.log".into(),
                media_type: Some("text/plain".into()),
                size: Some(1234),
                source: AttachmentSource::Url {
                    url: "https://files.slack.com/files-pri/T0-F0001/download/trace.log".into()
                },
            }]
        );
        assert_eq!(event.text, "");
    }

    #[test]
    fn the_url_challenge_is_answered_and_unknown_envelopes_ignored() {
        let channel = channel();
        assert_eq!(
            parse(&channel, "events", &fixture("slack_url_verification.json")),
            Parsed::Reply(serde_json::json!({
                "challenge": "x7Pq2kLm9Zr4TvB8nC1dW6sY0eHfJgU5aQ3oRiK2"
            }))
        );
        let limited = br#"{"token":"t","type":"app_rate_limited","team_id":"T0OPS00001",
            "minute_rate_limited":1518467820,"api_app_id":"A0OPSBOT001"}"#;
        assert_eq!(parse(&channel, "events", limited), Parsed::Ignore);
        assert_eq!(
            parse(&channel, "events", br#"{"type":"something_new"}"#),
            Parsed::Ignore
        );
        let reaction = variant("slack_message_im.json", |e| {
            *e = serde_json::json!({"type": "reaction_added", "user": "U1", "reaction": "+1",
                "item": {"type": "message", "channel": "C1", "ts": "1.2"}, "event_ts": "1.3"});
        });
        assert_eq!(parse(&channel, "events", &reaction), Parsed::Ignore);
        let headers = http::HeaderMap::new();
        for (route, body) in [
            ("events", &b"{nope"[..]),
            ("commands", b"%%%"),
            ("x", b"{}"),
        ] {
            assert!(matches!(
                channel.parse(&WebhookRequest {
                    route,
                    headers: &headers,
                    body
                }),
                Err(ChannelError::Malformed(_))
            ));
        }
    }

    /// Socket Mode's payloads are what the webhooks receive: the Events API body as JSON, a
    /// slash command's form fields as a JSON object of strings. Each parses to what its
    /// request does.
    #[test]
    fn socket_mode_payloads_parse_as_their_webhook_requests() {
        let channel = channel();
        for name in [
            "slack_app_mention_thread.json",
            "slack_message_im.json",
            "slack_message_im_own_bot_echo.json",
        ] {
            let body = fixture(name);
            let payload: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(
                channel.parse_socket("events_api", &payload).unwrap(),
                parse(&channel, "events", &body),
                "{name}"
            );
        }
        let form = fixture("slack_slash_command.form");
        let fields: Vec<(String, String)> = serde_urlencoded::from_bytes(&form).unwrap();
        let payload = serde_json::Value::Object(
            fields
                .into_iter()
                .map(|(key, value)| (key, value.into()))
                .collect(),
        );
        let parsed = channel.parse_socket("slash_commands", &payload).unwrap();
        assert_eq!(parsed, parse(&channel, "commands", &form));
        assert!(matches!(parsed, Parsed::EventsWithReply { .. }));
        assert_eq!(
            channel
                .parse_socket("interactive", &serde_json::json!({"type": "block_actions"}))
                .unwrap(),
            Parsed::Ignore
        );
        assert!(matches!(
            channel.parse_socket("slash_commands", &serde_json::json!({"text": "x"})),
            Err(ChannelError::Malformed(_))
        ));
    }

    /// In Socket Mode the signing secret may be absent: then no webhook request verifies.
    #[test]
    fn without_a_signing_secret_socket_mode_refuses_every_webhook_request() {
        let socket = SlackChannel::new(
            &SlackSettings {
                signing_secret: String::new(),
                socket_mode: true,
                ..settings("http://127.0.0.1:9/api")
            },
            wall_clock_ms,
        )
        .unwrap();
        let body = fixture("slack_app_mention_thread.json.body");
        let now = (wall_clock_ms() / 1000).to_string();
        for secret in ["", SECRET] {
            let headers =
                signed_headers(&now, &antler_testkit::slack::signature(secret, &now, &body));
            assert_eq!(
                socket.verify(&WebhookRequest {
                    route: "events",
                    headers: &headers,
                    body: &body,
                }),
                Err(ChannelError::Unauthorized),
                "signed with {secret:?}"
            );
        }
    }

    #[test]
    fn slash_commands_are_accepted_with_an_ephemeral_acknowledgement() {
        let channel = channel();
        let Parsed::EventsWithReply { events, reply } =
            parse(&channel, "commands", &fixture("slack_slash_command.form"))
        else {
            panic!("a command is an event and an answer")
        };
        assert_eq!(
            reply,
            serde_json::json!({"response_type": "ephemeral", "text": WORKING})
        );
        let [event] = events.as_slice() else {
            panic!("{events:?}")
        };
        assert_eq!(event.event_id, "8001.1767225800.abc123");
        assert_eq!(event.conversation.as_str(), "slack:T0OPS00001:C0SRE00001");
        assert_eq!(event.text, "status payments-api");
        assert_eq!(event.user.id, "U0ADA00001");
        assert_eq!(event.user.name.as_deref(), Some("ada"));
        assert!(event.group && !event.follow_up && event.reply_to.is_none());

        let form = String::from_utf8(fixture("slack_slash_command.form")).unwrap();
        for (text, expected) in [
            ("new", "/new"),
            ("help", "/help"),
            ("+STOP+", "/stop"),
            ("", "/help"),
        ] {
            let body = form.replace("text=status+payments-api", &format!("text={text}"));
            let Parsed::EventsWithReply { events, .. } =
                parse(&channel, "commands", body.as_bytes())
            else {
                panic!("{text}")
            };
            assert_eq!(events[0].text, expected, "{text:?}");
        }
    }

    #[test]
    fn a_slash_command_keeps_its_response_url_and_user_for_the_answer_and_is_not_streamed() {
        let channel = channel();
        let Parsed::EventsWithReply { events, .. } =
            parse(&channel, "commands", &fixture("slack_slash_command.form"))
        else {
            panic!("a command")
        };
        let context = events[0].reply_context.as_ref().unwrap();
        assert_eq!(format!("{context:?}"), "ReplyContext(***)");
        assert_eq!(
            ReplyTo::read(context),
            Some(ReplyTo {
                user: "U0ADA00001".into(),
                response_url: Some(
                    "https://hooks.slack.com/commands/T0OPS00001/8001/xYz123".into()
                ),
                received_at_ms: 42,
            })
        );
        let reply = |context| OutboundMessage {
            prompts: Vec::new(),
            idempotency_key: "k".into(),
            conversation: events[0].conversation.clone(),
            thread_id: "t".into(),
            text: "x".into(),
            reply_to: None,
            files: Vec::new(),
            reply_context: context,
        };
        assert!(!channel.live_reply(&reply(Some(context.clone()))));
        // A mention keeps its author only, and is streamed as before.
        let mention = event(parse(
            &channel,
            "events",
            &fixture("slack_app_mention_thread.json"),
        ));
        let mention_context = mention.reply_context.unwrap();
        assert_eq!(ReplyTo::read(&mention_context).unwrap().response_url, None);
        assert!(channel.live_reply(&reply(Some(mention_context))));
        assert!(channel.live_reply(&reply(None)));
        // Only Slack's hooks host over https (or the configured API, a mock) gets an answer.
        for (url, ok) in [
            ("https://hooks.slack.com/commands/T1/2/x", true),
            ("http://hooks.slack.com/commands/T1/2/x", false),
            ("https://evil.example/commands/T1/2/x", false),
            ("http://127.0.0.1:9/commands/T1/2/x", true),
            ("not a url", false),
        ] {
            assert_eq!(channel.api().is_response_url(url), ok, "{url}");
        }
    }

    #[tokio::test]
    async fn a_response_url_past_its_30_minutes_is_not_used_and_a_private_answer_goes_to_the_dm() {
        let server = MockSlack::start().await;
        let channel = SlackChannel::new(&settings(&server.api_url()), || 31 * 60 * 1000).unwrap();
        let message = OutboundMessage {
            prompts: Vec::new(),
            idempotency_key: "k".into(),
            conversation: ConversationKey::new("slack", ["T0OPS00001", "C0SRE00001"]),
            thread_id: "t".into(),
            text: "x".into(),
            reply_to: None,
            files: Vec::new(),
            reply_context: Some(
                ReplyTo {
                    user: "U0ADA00001".into(),
                    response_url: Some(server.response_url()),
                    received_at_ms: 0,
                }
                .context(),
            ),
        };
        let receipt = channel
            .send(
                &message,
                Part {
                    buttons: &[],
                    index: 0,
                    body: "the answer",
                },
            )
            .await
            .unwrap();
        assert_eq!(
            receipt.platform_message_id,
            format!(
                "{}/{}",
                antler_testkit::slack::DM,
                antler_testkit::slack::POSTED_TS
            )
        );
        assert!(server.responses().await.is_empty(), "expired: not tried");
        let posted = server.posted().await;
        assert_eq!(posted[0]["channel"], antler_testkit::slack::DM);
        assert!(
            posted[0]["text"]
                .as_str()
                .unwrap()
                .ends_with("\nthe answer")
        );
        // An edit of that message finds it in the DM.
        channel
            .edit(
                &message,
                &receipt,
                Part {
                    buttons: &[],
                    index: 0,
                    body: "edited",
                },
            )
            .await
            .unwrap();
        let updates = server.calls("chat.update").await;
        assert_eq!(updates[0]["channel"], antler_testkit::slack::DM);
        assert_eq!(updates[0]["ts"], antler_testkit::slack::POSTED_TS);
    }

    fn signed_headers(timestamp: &str, signature: &str) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        headers.insert(TIMESTAMP_HEADER, timestamp.parse().unwrap());
        headers.insert(SIGNATURE_HEADER, signature.parse().unwrap());
        headers
    }

    /// A vector's recorded headers.
    fn recorded(name: &str) -> http::HeaderMap {
        let meta: serde_json::Value =
            serde_json::from_slice(&fixture(&format!("{name}.meta.json"))).unwrap();
        assert_eq!(meta["signing_secret"], SECRET);
        signed_headers(
            meta["headers"]["X-Slack-Request-Timestamp"]
                .as_str()
                .unwrap(),
            meta["headers"]["X-Slack-Signature"].as_str().unwrap(),
        )
    }

    fn sign(timestamp: &str, body: &[u8]) -> String {
        antler_testkit::slack::signature(SECRET, timestamp, body)
    }

    #[test]
    fn signatures_verify_fresh_and_fail_stale_or_tampered() {
        let live = SlackChannel::new(&settings("http://127.0.0.1:9/api"), wall_clock_ms).unwrap();
        for (name, route) in [
            ("slack_app_mention_thread.json", "events"),
            ("slack_slash_command.form", "commands"),
        ] {
            let body = fixture(&format!("{name}.body"));
            let stale = recorded(name);
            // Recorded in 2026-01: long stale, refused by the headers alone.
            assert_eq!(live.verify_headers(&stale), Err(ChannelError::Unauthorized));
            let request = |headers| WebhookRequest {
                route,
                headers,
                body: &body,
            };
            assert_eq!(
                live.verify(&request(&stale)),
                Err(ChannelError::Unauthorized)
            );

            // At the vectors' own time the signature is right, but slack-morphism's verifier
            // judges the age by the wall clock too, so a replay still fails.
            let then =
                SlackChannel::new(&settings("http://127.0.0.1:9/api"), vector_clock_ms).unwrap();
            assert_eq!(then.verify_headers(&stale), Ok(()));
            assert_eq!(
                then.verify(&request(&stale)),
                Err(ChannelError::Unauthorized)
            );
            assert_eq!(
                stale[SIGNATURE_HEADER].to_str().unwrap(),
                sign("1767225600", &body),
                "the vector is HMAC-SHA256 over v0:ts:body"
            );

            // Re-signed now, it verifies; one byte changed, it does not.
            let now = (wall_clock_ms() / 1000).to_string();
            let fresh = signed_headers(&now, &sign(&now, &body));
            assert_eq!(live.verify(&request(&fresh)), Ok(()), "{name}");
            let mut tampered = body.clone();
            tampered[10] ^= 1;
            assert_eq!(
                live.verify(&WebhookRequest {
                    route,
                    headers: &fresh,
                    body: &tampered
                }),
                Err(ChannelError::Unauthorized)
            );
            // Missing or unreadable headers.
            let mut missing = fresh.clone();
            missing.remove(SIGNATURE_HEADER);
            assert_eq!(
                live.verify_headers(&missing),
                Err(ChannelError::Unauthorized)
            );
            let mut missing = fresh.clone();
            missing.remove(TIMESTAMP_HEADER);
            assert_eq!(
                live.verify_headers(&missing),
                Err(ChannelError::Unauthorized)
            );
            let garbled = signed_headers("soon", &sign("soon", &body));
            assert_eq!(
                live.verify_headers(&garbled),
                Err(ChannelError::Unauthorized)
            );
        }
    }

    #[test]
    fn the_token_must_be_a_bot_token_and_never_shows_in_debug() {
        for token in ["xoxp-1-2", "nonsense", ""] {
            let error = SlackChannel::new(
                &SlackSettings {
                    bot_token: token.into(),
                    ..settings("http://127.0.0.1:9/api")
                },
                || 0,
            )
            .unwrap_err();
            assert!(
                matches!(&error, ChannelError::Permanent(text) if text.contains("channels.slack.bot_token")),
                "{error:?}"
            );
        }
        let error = SlackChannel::new(
            &SlackSettings {
                signing_secret: String::new(),
                ..settings("http://127.0.0.1:9/api")
            },
            || 0,
        )
        .unwrap_err();
        assert!(matches!(&error, ChannelError::Permanent(text) if text.contains("signing_secret")));
        let settings = settings("http://127.0.0.1:9/api");
        let channel = SlackChannel::new(&settings, || 0).unwrap();
        for debug in [format!("{settings:?}"), format!("{channel:?}")] {
            assert!(
                !debug.contains("SECRETtoken") && !debug.contains(SECRET),
                "{debug}"
            );
        }
        let limits = channel.limits();
        assert_eq!(limits.message, Some(Limit::Chars(MESSAGE_LIMIT)));
        let rate = limits.edits.unwrap();
        assert_eq!(
            (rate.private, rate.group),
            (Duration::from_secs(1), Duration::from_secs(2))
        );
        assert_eq!(
            channel.capabilities(),
            Capabilities {
                files: false,
                images: true,
                typing: false,
                progress_marks: true,
                buttons: true,
            }
        );
        assert_eq!(channel.routes(), ["events", "commands", "interactions"]);
        assert_eq!(
            channel.render("**hi** & <you>").unwrap(),
            ["*hi* &amp; &lt;you&gt;"]
        );
    }

    #[tokio::test]
    async fn the_learned_identity_covers_envelopes_without_authorizations() {
        let server = MockSlack::start().await;
        let channel = SlackChannel::new(&settings(&server.api_url()), || 0).unwrap();
        assert_eq!(channel.identity(), None);
        let without_authorizations = |name: &str, edit: &dyn Fn(&mut serde_json::Value)| {
            let mut json: serde_json::Value = serde_json::from_slice(&fixture(name)).unwrap();
            json.as_object_mut().unwrap().remove("authorizations");
            edit(&mut json["event"]);
            serde_json::to_vec(&json).unwrap()
        };
        let echo = without_authorizations("slack_message_im_own_bot_echo.json", &|e| {
            e.as_object_mut().unwrap().remove("bot_id");
        });
        let mention_in_channel = without_authorizations("slack_app_mention_thread.json", &|e| {
            e["type"] = "message".into();
            e["channel_type"] = "channel".into();
            e.as_object_mut().unwrap().remove("thread_ts");
        });
        // Before auth.test antler cannot tell the bot's echo or its mention; the mention is
        // left for Slack to retry rather than dropped.
        assert!(matches!(
            parse(&channel, "events", &echo),
            Parsed::Events(_)
        ));
        let headers = http::HeaderMap::new();
        assert!(matches!(
            channel.parse(&WebhookRequest {
                route: "events",
                headers: &headers,
                body: &mention_in_channel,
            }),
            Err(ChannelError::Transient(_))
        ));

        let me = channel.learn_identity().await.unwrap();
        assert_eq!(me.user_id, "U0BOT00001");
        assert_eq!(channel.identity(), Some(me));
        assert_eq!(parse(&channel, "events", &echo), Parsed::Ignore);
        let event = event_of(&channel, &mention_in_channel);
        assert_eq!(event.text, "restart web-api & report");
        assert_eq!(
            event.conversation.as_str(),
            "slack:T0OPS00001:C0SRE00001:1767225600.000200"
        );
    }

    #[tokio::test]
    async fn replies_go_to_the_conversations_thread_and_edits_replace_them() {
        use antler_testkit::slack::POSTED_TS;
        use wiremock::matchers::{body_partial_json, method, path};
        use wiremock::{Mock, ResponseTemplate};

        let server = MockSlack::start().await;
        Mock::given(method("POST"))
            .and(path("/api/chat.update"))
            .and(body_partial_json(serde_json::json!({
                "channel": "C0SRE00001", "ts": POSTED_TS, "text": "*done*"
            })))
            .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
                "ok": true, "channel": "C0SRE00001", "ts": POSTED_TS,
                "message": {"text": "*done*"}
            })))
            .expect(1)
            .with_priority(1)
            .mount(&server)
            .await;
        let channel = SlackChannel::new(&settings(&server.api_url()), || 0).unwrap();
        let message = |conversation: &str| OutboundMessage {
            prompts: Vec::new(),
            idempotency_key: "k".into(),
            conversation: ConversationKey::new("slack", conversation.split(':')),
            thread_id: "t".into(),
            text: "**done**".into(),
            reply_to: Some("1767225600.000200".into()),
            files: Vec::new(),
            reply_context: None,
        };
        let in_thread = message("T0OPS00001:C0SRE00001:1767225500.000100");
        let body = channel.render(&in_thread.text).unwrap();
        let receipt = channel
            .send(
                &in_thread,
                Part {
                    buttons: &[],
                    index: 0,
                    body: &body[0],
                },
            )
            .await
            .unwrap();
        assert_eq!(receipt.platform_message_id, POSTED_TS);
        channel
            .send(
                &message("T0OPS00001:D0ADA00001"),
                Part {
                    buttons: &[],
                    index: 1,
                    body: "dm",
                },
            )
            .await
            .unwrap();
        channel
            .edit(
                &in_thread,
                &receipt,
                Part {
                    buttons: &[],
                    index: 0,
                    body: &body[0],
                },
            )
            .await
            .unwrap();
        let bodies: Vec<serde_json::Value> = server
            .received_requests()
            .await
            .unwrap()
            .iter()
            .map(|r| serde_json::from_slice(&r.body).unwrap())
            .collect();
        assert_eq!(bodies[0]["channel"], "C0SRE00001");
        assert_eq!(bodies[0]["thread_ts"], "1767225500.000100");
        assert_eq!(bodies[0]["text"], "*done*");
        assert_eq!(bodies[1]["channel"], "D0ADA00001");
        assert_eq!(
            bodies[1].get("thread_ts"),
            None,
            "a DM answers at the top level"
        );
        server.verify().await;

        let stray = OutboundMessage {
            prompts: Vec::new(),
            conversation: ConversationKey::new("telegram", ["42"]),
            ..in_thread
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
        // Only URL attachments can be fetched.
        let platform = AttachmentRef {
            name: "a".into(),
            media_type: None,
            size: None,
            source: AttachmentSource::Platform { id: "F1".into() },
        };
        assert_eq!(
            channel.fetch_attachment(&platform, 10).await,
            Err(ChannelError::Unsupported)
        );
    }

    /// The `block_actions` fixture as the interactions route receives it.
    fn press_form() -> Vec<u8> {
        let payload: serde_json::Value =
            serde_json::from_slice(&fixture("slack_block_actions.json")).unwrap();
        antler_testkit::slack::interaction_form(&payload).into_bytes()
    }

    /// Slack signs an interaction like any request ("Handling user interaction": the
    /// Interactivity Request URL gets `payload=<JSON>`, form-encoded, with the same
    /// `X-Slack-Signature`), so the same check refuses a forged or stale press.
    #[test]
    fn a_signed_press_verifies_and_parses_on_the_interactions_route() {
        let live = SlackChannel::new(&settings("http://127.0.0.1:9/api"), wall_clock_ms).unwrap();
        let body = press_form();
        let now = (wall_clock_ms() / 1000).to_string();
        let fresh = signed_headers(&now, &sign(&now, &body));
        let request = WebhookRequest {
            route: "interactions",
            headers: &fresh,
            body: &body,
        };
        assert_eq!(live.verify(&request), Ok(()));
        let Parsed::Press(press) = live.parse(&request).unwrap() else {
            panic!("a press")
        };
        assert_eq!(
            press.conversation.as_str(),
            "slack:T0OPS00001:C0SRE00001:1767225500.000100"
        );
        assert_eq!(press.user.id, "U0GRC00001");
        assert_eq!(press.action, "approve:k3x9p2ab");
        assert_eq!(press.message_id, "1767229999.000900");

        let mut tampered = body.clone();
        let at = tampered.len() - 3;
        tampered[at] ^= 1;
        assert_eq!(
            live.verify(&WebhookRequest {
                body: &tampered,
                ..request
            }),
            Err(ChannelError::Unauthorized)
        );
        let stale = signed_headers("1767225600", &sign("1767225600", &body));
        assert_eq!(
            live.verify(&WebhookRequest {
                headers: &stale,
                ..request
            }),
            Err(ChannelError::Unauthorized)
        );

        // The same payload over Socket Mode, as JSON.
        let payload: serde_json::Value =
            serde_json::from_slice(&fixture("slack_block_actions.json")).unwrap();
        assert_eq!(
            live.parse_socket("interactive", &payload).unwrap(),
            Parsed::Press(press)
        );
    }

    #[test]
    fn a_malformed_interaction_is_refused_and_others_are_ignored() {
        let channel = channel();
        let request = |body: &[u8]| {
            let headers = http::HeaderMap::new();
            channel.parse(&WebhookRequest {
                route: "interactions",
                headers: &headers,
                body,
            })
        };
        let nobody = antler_testkit::slack::interaction_form(&serde_json::json!({
            "type": "block_actions",
            "container": {"type": "message", "message_ts": "1767229999.000900"},
            "actions": [{"type": "button", "action_id": "approve:k3x9p2ab"}]
        }));
        for body in [
            &b"nothing=here"[..],
            b"payload=not%20json",
            nobody.as_bytes(),
        ] {
            assert!(
                matches!(request(body), Err(ChannelError::Malformed(_))),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        let shortcut = antler_testkit::slack::interaction_form(&serde_json::json!({
            "type": "shortcut", "callback_id": "x", "trigger_id": "1.2.3"
        }));
        assert_eq!(request(shortcut.as_bytes()), Ok(Parsed::Ignore));
    }

    fn prompt_message(
        conversation: &str,
        context: Option<antler_channel::ReplyContext>,
    ) -> OutboundMessage {
        OutboundMessage {
            prompts: Vec::new(),
            idempotency_key: "k".into(),
            conversation: ConversationKey::new("slack", conversation.split(':')),
            thread_id: "t".into(),
            text: "x".into(),
            reply_to: None,
            files: Vec::new(),
            reply_context: context,
        }
    }

    #[tokio::test]
    async fn a_prompt_is_posted_with_buttons_and_a_press_replaces_it_and_answers_privately() {
        let server = MockSlack::start().await;
        let channel = SlackChannel::new(&settings(&server.api_url()), || 0).unwrap();
        let buttons = antler_testkit::approve_deny();
        let message = prompt_message("T0OPS00001:C0SRE00001:1767225500.000100", None);
        let receipt = channel
            .send(
                &message,
                Part {
                    buttons: &buttons,
                    index: 0,
                    body: "⏸ *Approval needed*",
                },
            )
            .await
            .unwrap();
        assert_eq!(
            receipt.platform_message_id,
            antler_testkit::slack::POSTED_TS
        );
        let posted = server.posted().await;
        assert_eq!(posted[0]["channel"], "C0SRE00001");
        assert_eq!(posted[0]["thread_ts"], "1767225500.000100");
        assert_eq!(posted[0]["text"], "⏸ *Approval needed*", "the fallback");
        assert_eq!(
            posted[0]["blocks"][0],
            serde_json::json!({"type": "section",
                               "text": {"type": "mrkdwn", "text": "⏸ *Approval needed*"}})
        );
        let elements = &posted[0]["blocks"][1]["elements"];
        assert_eq!(posted[0]["blocks"][1]["type"], "actions");
        assert_eq!(elements[0]["value"], "approve:k3x9p2ab");
        assert_eq!(elements[0]["style"], "primary");
        assert_eq!(elements[1]["action_id"], "deny:k3x9p2ab");
        assert_eq!(elements[1]["style"], "danger");

        // The press of that button, answered: the message replaced, the presser told.
        let Parsed::Press(press) = parse(&channel, "interactions", &press_form()) else {
            panic!("a press")
        };
        let answered = channel
            .answer_press(
                &press,
                &PressAnswer {
                    notice: "✅ Approved current\\_time (k3x9p2ab)".into(),
                    update: Some("⏸ Approval needed\n✅ Approved by **grace**".into()),
                    decided_now: true,
                },
            )
            .await
            .unwrap();
        assert_eq!(answered, None, "an empty 200");
        let updates = server.updates().await;
        assert_eq!(updates.len(), 1);
        assert_eq!(updates[0]["channel"], "C0SRE00001");
        assert_eq!(updates[0]["ts"], "1767229999.000900");
        let text = "⏸ Approval needed\n✅ Approved by *grace*";
        assert_eq!(updates[0]["text"], text);
        assert_eq!(
            updates[0]["blocks"],
            serde_json::json!([{"type": "section", "text": {"type": "mrkdwn", "text": text}}]),
            "the buttons are gone"
        );
        let ephemerals = server.ephemerals().await;
        assert_eq!(ephemerals.len(), 1);
        assert_eq!(ephemerals[0]["channel"], "C0SRE00001");
        assert_eq!(ephemerals[0]["user"], "U0GRC00001");
        assert_eq!(ephemerals[0]["thread_ts"], "1767225500.000100");
        assert_eq!(ephemerals[0]["text"], "✅ Approved current_time (k3x9p2ab)");

        // A refusal changes nothing but tells the presser.
        let refused = PressAnswer {
            notice: "Only approvers can decide.".into(),
            update: None,
            decided_now: false,
        };
        channel.answer_press(&press, &refused).await.unwrap();
        assert_eq!(server.updates().await.len(), 1);
        assert_eq!(server.ephemerals().await.len(), 2);

        // Without its context a press cannot be answered; a Web API error is the channel's.
        let lost = Press {
            answer_context: None,
            ..press.clone()
        };
        assert!(matches!(
            channel.answer_press(&lost, &refused).await,
            Err(ChannelError::Permanent(_))
        ));
        wiremock::Mock::given(wiremock::matchers::path("/api/chat.postEphemeral"))
            .respond_with(
                wiremock::ResponseTemplate::new(200)
                    .set_body_json(serde_json::json!({"ok": false, "error": "ratelimited"})),
            )
            .with_priority(1)
            .mount(&server)
            .await;
        assert!(matches!(
            channel.answer_press(&press, &refused).await,
            Err(ChannelError::RateLimited { .. })
        ));
    }

    /// A slash command's prompt cannot go through its `response_url` (an ephemeral answer
    /// there is no message `chat.update` can replace): a private one goes to the user's DM,
    /// with its buttons.
    #[tokio::test]
    async fn a_slash_commands_prompt_goes_to_the_dm_with_its_buttons() {
        let server = MockSlack::start().await;
        let channel = SlackChannel::new(&settings(&server.api_url()), || 0).unwrap();
        let context = ReplyTo {
            user: "U0ADA00001".into(),
            response_url: Some(server.response_url()),
            received_at_ms: 0,
        }
        .context();
        let buttons = antler_testkit::approve_deny();
        let receipt = channel
            .send(
                &prompt_message("T0OPS00001:C0SRE00001", Some(context)),
                Part {
                    buttons: &buttons,
                    index: 0,
                    body: "approve?",
                },
            )
            .await
            .unwrap();
        assert!(server.responses().await.is_empty());
        assert_eq!(server.dms_opened().await, ["U0ADA00001"]);
        let posted = server.posted().await;
        assert_eq!(posted[0]["channel"], antler_testkit::slack::DM);
        assert_eq!(posted[0]["blocks"][1]["type"], "actions");
        assert!(
            posted[0]["blocks"][0]["text"]["text"]
                .as_str()
                .unwrap()
                .ends_with("\napprove?")
        );
        assert_eq!(
            receipt.platform_message_id,
            format!(
                "{}/{}",
                antler_testkit::slack::DM,
                antler_testkit::slack::POSTED_TS
            )
        );
    }
}
