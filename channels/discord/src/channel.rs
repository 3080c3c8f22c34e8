//! Discord as an antler [`Channel`]: Ed25519-signed interactions on
//! `/webhooks/discord/interactions`, application commands deferred at once and answered by
//! editing the deferred response, further parts as follow-ups. A part with buttons carries
//! them as message components; a press comes back as a component interaction (type 3) on the
//! same endpoint (or over the Gateway) and is answered by updating the button's message
//! (type 7) or privately (type 4, ephemeral).

use std::time::Duration;

use antler_channel::render::{self, DiscordMarkdown, Limit};
use antler_channel::verify::SignedHeaders;
use antler_channel::{
    Capabilities, Channel, ChannelError, EditRate, Limits, OutboundMessage, Parsed, Part, Press,
    PressAnswer, Receipt, WebhookRequest, verify,
};
use serenity::interactions_endpoint::Verifier;
use serenity::model::application::{ComponentInteraction, Interaction};
use serenity::model::id::GuildId;

use crate::client::{DEFAULT_API_URL, DiscordApi};
use crate::gateway::GatewayPress;
use crate::normalize::{
    Answering, NAME, Normalized, Pressed, channel_of, normalize_command, normalize_press,
    read_reply_context,
};

/// The most a message holds, in characters.
pub const MESSAGE_LIMIT: usize = 2000;

/// The header with the request's Ed25519 signature (hex).
pub const SIGNATURE_HEADER: &str = "x-signature-ed25519";

/// The header with the time the request was signed at (Unix seconds).
pub const TIMESTAMP_HEADER: &str = "x-signature-timestamp";

/// How far a request's timestamp may be from now, in seconds, either side. Discord documents
/// no replay window; this one bounds how long a captured request could be replayed.
const MAX_AGE_SECS: i64 = 300;

/// How long an interaction token lets antler answer through the interaction webhook.
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(15 * 60);

/// How long before the token's end antler stops using it (a request under way must not be
/// the one that finds it expired).
const TOKEN_MARGIN: Duration = Duration::from_secs(30);

/// The most follow-up messages Discord takes for an interaction of an app installed to the
/// user only ("Apps installed to a user ... are limited to 5 followup messages per
/// interaction"); later parts go to the channel as the bot's own messages.
pub(crate) const USER_INSTALL_FOLLOW_UPS: usize = 5;

/// Ephemeral: only the user who ran the command sees the message.
const EPHEMERAL: u64 = 1 << 6;

/// The least time between two edits of the deferred response while an answer streams.
const EDIT_INTERVAL: Duration = Duration::from_secs(1);

/// What the Discord channel is set up with.
#[derive(Clone)]
pub struct DiscordSettings {
    /// The application id.
    pub application_id: String,
    /// The application's Ed25519 public key, 64 hex characters.
    pub public_key: String,
    /// The bot token.
    pub bot_token: String,
    /// The API base URL (`https://discord.com`).
    pub api_url: String,
    /// The servers (guild ids) whose members may use the bot; empty: any server it is in.
    pub allowed_guilds: Vec<String>,
}

impl Default for DiscordSettings {
    fn default() -> Self {
        Self {
            application_id: String::new(),
            public_key: String::new(),
            bot_token: String::new(),
            api_url: DEFAULT_API_URL.to_owned(),
            allowed_guilds: Vec::new(),
        }
    }
}

impl std::fmt::Debug for DiscordSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscordSettings")
            .field("application_id", &self.application_id)
            .field("public_key", &self.public_key)
            .field("bot_token", &"***")
            .field("api_url", &self.api_url)
            .field("allowed_guilds", &self.allowed_guilds)
            .finish()
    }
}

/// The Discord channel.
pub struct DiscordChannel {
    verifier: Verifier,
    allowed_guilds: Vec<String>,
    api: DiscordApi,
    now_ms: fn() -> u64,
}

impl std::fmt::Debug for DiscordChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscordChannel")
            .field("allowed_guilds", &self.allowed_guilds)
            .field("api", &self.api)
            .finish_non_exhaustive()
    }
}

impl DiscordChannel {
    /// The channel for `settings`; `now_ms` stamps received interactions, judges the age of
    /// signed requests and of interaction tokens.
    pub fn new(settings: &DiscordSettings, now_ms: fn() -> u64) -> Result<Self, ChannelError> {
        let key: [u8; 32] = hex::decode(settings.public_key.trim())
            .ok()
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or_else(|| {
                ChannelError::Permanent(
                    "channels.discord.public_key must be 64 hexadecimal characters".to_owned(),
                )
            })?;
        let verifier = Verifier::try_new(key).map_err(|_| {
            ChannelError::Permanent(
                "channels.discord.public_key is not an Ed25519 public key".to_owned(),
            )
        })?;
        if settings.application_id.is_empty()
            || !settings.application_id.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(ChannelError::Permanent(
                "channels.discord.application_id must be the application's numeric id".to_owned(),
            ));
        }
        if settings.bot_token.trim().is_empty() {
            return Err(ChannelError::Permanent(
                "channels.discord.bot_token is empty".to_owned(),
            ));
        }
        Ok(Self {
            verifier,
            allowed_guilds: settings.allowed_guilds.clone(),
            api: DiscordApi::new(
                &settings.api_url,
                &settings.application_id,
                &settings.bot_token,
            )?,
            now_ms,
        })
    }

    /// The API client (setup commands, `antler doctor`).
    pub fn api(&self) -> &DiscordApi {
        &self.api
    }

    /// The interaction of `message` while antler may still use its token.
    fn live_interaction<'a>(&self, message: &'a OutboundMessage) -> Option<Answering<'a>> {
        let interaction = read_reply_context(message.reply_context.as_ref()?)?;
        let usable_ms = u64::try_from((TOKEN_LIFETIME - TOKEN_MARGIN).as_millis()).unwrap_or(0);
        ((self.now_ms)() < interaction.received_at_ms.saturating_add(usable_ms))
            .then_some(interaction)
    }

    /// Sends part `part` of `message` as the bot's own message in its channel (the part 0
    /// replying to the user's message, where there is one).
    async fn channel_message(
        &self,
        message: &OutboundMessage,
        part: &Part<'_>,
    ) -> Result<String, ChannelError> {
        let channel = channel_of(&message.conversation).ok_or_else(|| {
            ChannelError::Permanent(format!(
                "not a Discord conversation: {}",
                message.conversation
            ))
        })?;
        let reply_to = message.reply_to.as_deref().filter(|_| part.index == 0);
        self.api
            .create_message(channel, part.body, reply_to, part.buttons)
            .await
    }

    /// Whether `guild` may not use the bot (`allowed_guilds` names others); logged.
    fn guild_refused(&self, guild: Option<GuildId>) -> bool {
        let refused = guild.is_some_and(|guild| {
            !self.allowed_guilds.is_empty() && !self.allowed_guilds.contains(&guild.to_string())
        });
        if refused {
            tracing::info!(
                guild = ?guild.map(|g| g.to_string()),
                "an interaction from a server that is not in channels.discord.allowed_guilds"
            );
        }
        refused
    }

    /// A button press: from a server outside `allowed_guilds`, or on a component antler does
    /// not make, refused privately at once; else a [`Parsed::Press`].
    fn parse_component(&self, component: &ComponentInteraction) -> Parsed {
        if self.guild_refused(component.guild_id) {
            return Parsed::Reply(ephemeral("Sorry, this server may not use this bot."));
        }
        match normalize_press(component) {
            Pressed::Press(press) => Parsed::Press(*press),
            Pressed::Refused(text) => Parsed::Reply(ephemeral(&text)),
        }
    }

    /// A button press received over the Gateway, read as one received on the endpoint: a
    /// [`Parsed::Press`] to decide, or a [`Parsed::Reply`] to answer with at once
    /// ([`DiscordChannel::answer_gateway`]).
    pub fn parse_gateway(&self, press: &GatewayPress) -> Parsed {
        self.parse_component(press.component())
    }

    /// Answers a press received over the Gateway with `response` (what the endpoint would have
    /// answered its request with): `POST /interactions/{id}/{token}/callback`.
    pub async fn answer_gateway(
        &self,
        press: &GatewayPress,
        response: &serde_json::Value,
    ) -> Result<(), ChannelError> {
        let component = press.component();
        self.api
            .interaction_callback(&component.id.to_string(), &component.token, response)
            .await
    }

    fn parse_interaction(&self, body: &[u8]) -> Result<Parsed, ChannelError> {
        let interaction: Interaction = serde_json::from_slice(body).map_err(|e| {
            // serde's message may quote the body; say only where it broke.
            ChannelError::Malformed(format!(
                "not a Discord interaction ({:?} error at line {} column {})",
                e.classify(),
                e.line(),
                e.column()
            ))
        })?;
        let command = match interaction {
            // Exactly `{"type":1}`: serenity's Pong would add `"data":null`.
            Interaction::Ping(_) => return Ok(Parsed::Reply(serde_json::json!({"type": 1}))),
            Interaction::Command(command) => command,
            Interaction::Autocomplete(_) => {
                return Ok(Parsed::Reply(
                    serde_json::json!({"type": 8, "data": {"choices": []}}),
                ));
            }
            Interaction::Component(component) => return Ok(self.parse_component(&component)),
            Interaction::Modal(_) => {
                return Ok(Parsed::Reply(ephemeral("antler does not handle forms.")));
            }
            _ => return Ok(Parsed::Ignore),
        };
        if self.guild_refused(command.guild_id) {
            return Ok(Parsed::Reply(ephemeral(
                "Sorry, this server may not use this bot.",
            )));
        }
        Ok(match normalize_command(&command, (self.now_ms)()) {
            Normalized::Event(event) => Parsed::EventsWithReply {
                events: vec![*event],
                // "thinking…" until the answer edits it.
                reply: serde_json::json!({"type": 5}),
            },
            Normalized::Refused(text) => Parsed::Reply(ephemeral(&text)),
        })
    }
}

/// An interaction response only its user sees (type 4, flags 64), pinging no one.
fn ephemeral(text: &str) -> serde_json::Value {
    serde_json::json!({
        "type": 4,
        "data": {"content": text, "flags": EPHEMERAL, "allowed_mentions": {"parse": []}},
    })
}

/// The answer to a component interaction: the button's message replaced by `content` with no
/// components left (type 7 UPDATE_MESSAGE), pinging no one.
fn update_message(content: &str) -> serde_json::Value {
    serde_json::json!({
        "type": 7,
        "data": {"content": content, "components": [], "allowed_mentions": {"parse": []}},
    })
}

impl DiscordChannel {
    /// The signature headers: present, fresh by `now_ms`, the signature 64 bytes in hex.
    fn signed_headers<'a>(
        &self,
        headers: &'a http::HeaderMap,
    ) -> Result<SignedHeaders<'a>, ChannelError> {
        let now = i64::try_from((self.now_ms)() / 1000).unwrap_or(i64::MAX);
        let signed = verify::signed_headers(
            headers,
            TIMESTAMP_HEADER,
            SIGNATURE_HEADER,
            now,
            MAX_AGE_SECS,
        )?;
        let hex = signed.signature.len() == 128
            && signed.signature.bytes().all(|b| b.is_ascii_hexdigit());
        if !hex {
            return Err(ChannelError::Unauthorized);
        }
        Ok(signed)
    }
}

#[async_trait::async_trait]
impl Channel for DiscordChannel {
    fn name(&self) -> &'static str {
        NAME
    }

    /// `/webhooks/discord/interactions`, the Interactions Endpoint URL.
    fn routes(&self) -> &'static [&'static str] {
        &["interactions"]
    }

    /// Both signature headers present, the signature 64 bytes of hex, the timestamp within
    /// 5 minutes of now.
    fn verify_headers(&self, headers: &http::HeaderMap) -> Result<(), ChannelError> {
        self.signed_headers(headers).map(|_| ())
    }

    /// Ed25519 over `timestamp || body` with the application's public key (serenity's
    /// verifier), after [`Channel::verify_headers`]. Discord sends bad signatures on purpose
    /// now and then: they must be refused.
    fn verify(&self, request: &WebhookRequest<'_>) -> Result<(), ChannelError> {
        let SignedHeaders {
            timestamp,
            signature,
        } = self.signed_headers(request.headers)?;
        self.verifier
            .verify(signature, timestamp, request.body)
            .map_err(|()| ChannelError::Unauthorized)
    }

    fn parse(&self, request: &WebhookRequest<'_>) -> Result<Parsed, ChannelError> {
        match request.route {
            "interactions" => self.parse_interaction(request.body),
            route => Err(ChannelError::Malformed(format!(
                "Discord has no route {route:?}"
            ))),
        }
    }

    /// An ephemeral message in place of the deferral: only the refused user sees it.
    fn refusal_reply(&self, text: &str) -> Option<serde_json::Value> {
        Some(ephemeral(text))
    }

    /// Discord Markdown in chunks of at most 2,000 characters.
    fn render(&self, markdown: &str) -> Result<Vec<String>, ChannelError> {
        render::parts(markdown, &DiscordMarkdown, Limit::Chars(MESSAGE_LIMIT))
            .map_err(|e| ChannelError::Permanent(e.to_string()))
    }

    /// Part 0 edits the deferred response (`@original`), later parts are follow-ups, while the
    /// interaction token lives (an app installed to the user only: the first 5 follow-ups);
    /// after that, past those 5, or when Discord no longer knows the interaction's webhook
    /// (404 Unknown Webhook), a message of the bot's own in the channel.
    async fn send(
        &self,
        message: &OutboundMessage,
        part: Part<'_>,
    ) -> Result<Receipt, ChannelError> {
        let sent = match self.live_interaction(message) {
            Some(interaction) if part.index == 0 => {
                self.api
                    .edit_original(interaction.token, part.body, part.buttons)
                    .await?
            }
            Some(interaction)
                if !interaction.user_install || part.index <= USER_INSTALL_FOLLOW_UPS =>
            {
                self.api
                    .follow_up(interaction.token, part.body, part.buttons)
                    .await?
            }
            Some(_) => {
                tracing::debug!(
                    part = part.index,
                    "past a user-installed app's 5 follow-ups: sent in the channel"
                );
                None
            }
            None => None,
        };
        let id = match sent {
            Some(id) => id,
            None => self.channel_message(message, &part).await?,
        };
        Ok(Receipt {
            platform_message_id: id,
        })
    }

    /// Part 0 edits `@original` again, a follow-up its own message, while the token lives;
    /// after that the bot's own message in the channel (an interaction's messages cannot be
    /// edited any more: delivery then sends the part anew, as it does when Discord no longer
    /// knows the interaction's webhook).
    async fn edit(
        &self,
        message: &OutboundMessage,
        sent: &Receipt,
        part: Part<'_>,
    ) -> Result<(), ChannelError> {
        let unknown =
            || ChannelError::Permanent("Discord answered Unknown Webhook (code 10015)".to_owned());
        match self.live_interaction(message) {
            Some(interaction) if part.index == 0 => self
                .api
                .edit_original(interaction.token, part.body, part.buttons)
                .await?
                .map(drop)
                .ok_or_else(unknown),
            Some(interaction) if !sent.platform_message_id.is_empty() => self
                .api
                .webhook_message(
                    interaction.token,
                    &sent.platform_message_id,
                    part.body,
                    part.buttons,
                )
                .await?
                .map(drop)
                .ok_or_else(unknown),
            _ => {
                let channel = channel_of(&message.conversation).ok_or_else(|| {
                    ChannelError::Permanent(format!(
                        "not a Discord conversation: {}",
                        message.conversation
                    ))
                })?;
                self.api
                    .edit_message(channel, &sent.platform_message_id, part.body)
                    .await
            }
        }
    }

    /// 2,000 characters a message; the deferred response is edited at most once a second
    /// while an answer streams.
    fn limits(&self) -> Limits {
        Limits {
            message: Some(Limit::Chars(MESSAGE_LIMIT)),
            edits: Some(EditRate {
                private: EDIT_INTERVAL,
                group: EDIT_INTERVAL,
            }),
        }
    }

    /// Text and buttons (the deferred response already shows "thinking…").
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            buttons: true,
            ..Capabilities::default()
        }
    }

    /// The interaction response that answers the press's request (or, over the Gateway, its
    /// callback): with an update, the button's message edited to it, buttons removed (type 7:
    /// the presser sees the decision there); without, the notice to the presser alone (type 4,
    /// ephemeral). Discord wants it within 3 seconds; nothing here calls its API.
    async fn answer_press(
        &self,
        _press: &Press,
        answer: &PressAnswer,
    ) -> Result<Option<serde_json::Value>, ChannelError> {
        Ok(Some(match &answer.update {
            Some(update) => update_message(&self.first_part(update)?),
            None => ephemeral(&self.first_part(&answer.notice)?),
        }))
    }
}

impl DiscordChannel {
    /// `markdown` rendered for one message: its first part (an interaction response is one
    /// message; what is longer than 2,000 characters is cut there).
    fn first_part(&self, markdown: &str) -> Result<String, ChannelError> {
        Ok(self
            .render(markdown)?
            .into_iter()
            .next()
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use ed25519_dalek::SigningKey;

    use super::*;
    use antler_channel::{Button, ButtonStyle, ConversationKey, InboundEvent, ReplyContext};

    /// The vectors' public key (seed `sha256("discord-fixture-seed")`).
    const VECTOR_KEY: &str = "976269d7368c52d1d3d87cc2c6b0e0d72897944669f5691d23d8cffa921f2e47";
    const BOT_TOKEN: &str = "BOT-TOKEN-SECRET";

    /// The vectors' signing time, 2026-01-01T00:00:00Z.
    fn vector_clock_ms() -> u64 {
        1_767_225_600_000
    }

    fn wall_clock_ms() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }

    fn settings(api_url: &str, public_key: &str) -> DiscordSettings {
        DiscordSettings {
            application_id: "1300000000000000001".into(),
            public_key: public_key.into(),
            bot_token: BOT_TOKEN.into(),
            api_url: api_url.into(),
            allowed_guilds: Vec::new(),
        }
    }

    fn channel() -> DiscordChannel {
        DiscordChannel::new(&settings("http://127.0.0.1:9", VECTOR_KEY), vector_clock_ms).unwrap()
    }

    fn fixture(name: &str) -> Vec<u8> {
        antler_testkit::fixture_bytes("discord", name)
    }

    fn parse(channel: &DiscordChannel, body: &[u8]) -> Parsed {
        let headers = http::HeaderMap::new();
        channel
            .parse(&WebhookRequest {
                route: "interactions",
                headers: &headers,
                body,
            })
            .unwrap()
    }

    fn command_event(channel: &DiscordChannel, body: &[u8]) -> InboundEvent {
        let Parsed::EventsWithReply { events, reply } = parse(channel, body) else {
            panic!("a command is an event and a deferral")
        };
        assert_eq!(reply, serde_json::json!({"type": 5}));
        let [event] = <[InboundEvent; 1]>::try_from(events).unwrap();
        event
    }

    fn signed(timestamp: &str, signature: &str) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        headers.insert(TIMESTAMP_HEADER, timestamp.parse().unwrap());
        headers.insert(SIGNATURE_HEADER, signature.parse().unwrap());
        headers
    }

    fn recorded(name: &str) -> http::HeaderMap {
        let meta: serde_json::Value =
            serde_json::from_slice(&fixture(&format!("{name}.meta.json"))).unwrap();
        assert_eq!(meta["public_key_hex"], VECTOR_KEY);
        signed(
            meta["headers"]["X-Signature-Timestamp"].as_str().unwrap(),
            meta["headers"]["X-Signature-Ed25519"].as_str().unwrap(),
        )
    }

    #[test]
    fn every_fixture_parses_as_a_serenity_interaction() {
        for name in [
            "discord_ping.json",
            "discord_slash_guild.json",
            "discord_slash_dm.json",
            "discord_ping.json.body",
            "discord_slash_guild.json.body",
            "discord_button_guild.json",
            "discord_button_guild.json.body",
        ] {
            let parsed: Result<Interaction, _> = serde_json::from_slice(&fixture(name));
            assert!(parsed.is_ok(), "{name}: {parsed:?}");
        }
    }

    #[test]
    fn the_vectors_verify_and_a_flipped_byte_does_not() {
        let channel = channel();
        for name in [
            "discord_ping.json",
            "discord_slash_guild.json",
            "discord_button_guild.json",
        ] {
            let body = fixture(&format!("{name}.body"));
            let headers = recorded(name);
            let request = |body: &[u8]| {
                channel.verify(&WebhookRequest {
                    route: "interactions",
                    headers: &headers,
                    body,
                })
            };
            assert_eq!(request(&body), Ok(()), "{name}");
            for at in [0, body.len() / 2, body.len() - 1] {
                let mut flipped = body.clone();
                flipped[at] ^= 1;
                assert_eq!(
                    request(&flipped),
                    Err(ChannelError::Unauthorized),
                    "{name} @{at}"
                );
            }
            // The signature covers the timestamp too.
            let mut other = headers.clone();
            other.insert(TIMESTAMP_HEADER, "1767225601".parse().unwrap());
            assert_eq!(
                channel.verify(&WebhookRequest {
                    route: "interactions",
                    headers: &other,
                    body: &body
                }),
                Err(ChannelError::Unauthorized)
            );
        }
        // At today's time the vectors are stale: refused on their headers alone.
        let live = DiscordChannel::new(&settings("http://127.0.0.1:9", VECTOR_KEY), wall_clock_ms)
            .unwrap();
        assert_eq!(
            live.verify_headers(&recorded("discord_ping.json")),
            Err(ChannelError::Unauthorized)
        );
    }

    #[test]
    fn fresh_signatures_verify_and_broken_headers_do_not() {
        let key = SigningKey::from_bytes(&[7; 32]);
        let public = hex::encode(key.verifying_key().as_bytes());
        let channel =
            DiscordChannel::new(&settings("http://127.0.0.1:9", &public), wall_clock_ms).unwrap();
        let body = fixture("discord_slash_dm.json");
        let now = wall_clock_ms() / 1000;
        let signed_by =
            |key: &SigningKey, at: u64| antler_testkit::discord::signed_headers(key, at, &body);
        let verify = |headers: &http::HeaderMap| {
            channel.verify(&WebhookRequest {
                route: "interactions",
                headers,
                body: &body,
            })
        };
        assert_eq!(verify(&signed_by(&key, now)), Ok(()));
        // Signed by another key: refused.
        let other = SigningKey::from_bytes(&[8; 32]);
        assert_eq!(
            verify(&signed_by(&other, now)),
            Err(ChannelError::Unauthorized)
        );
        let mut missing = signed_by(&key, now);
        missing.remove(SIGNATURE_HEADER);
        assert_eq!(verify(&missing), Err(ChannelError::Unauthorized));
        let mut missing = signed_by(&key, now);
        missing.remove(TIMESTAMP_HEADER);
        assert_eq!(verify(&missing), Err(ChannelError::Unauthorized));
        assert_eq!(
            verify(&signed(&now.to_string(), "zz")),
            Err(ChannelError::Unauthorized)
        );
        assert_eq!(
            verify(&signed_by(&key, now - 3600)),
            Err(ChannelError::Unauthorized)
        );
    }

    #[test]
    fn a_ping_is_answered_with_exactly_type_1() {
        let channel = channel();
        let Parsed::Reply(reply) = parse(&channel, &fixture("discord_ping.json")) else {
            panic!("a PING is answered at once")
        };
        assert_eq!(serde_json::to_string(&reply).unwrap(), r#"{"type":1}"#);
    }

    #[test]
    fn commands_become_messages_with_a_deferral() {
        let channel = channel();
        let dm = command_event(&channel, &fixture("discord_slash_dm.json"));
        assert_eq!(dm.event_id, "1300000000000000902");
        assert_eq!(dm.conversation.as_str(), "discord:1100000000000000077");
        assert_eq!(dm.text, "why is p99 high?");
        assert_eq!(dm.user.id, "1200000000000000001");
        assert_eq!(dm.user.name.as_deref(), Some("Ada"));
        assert_eq!(dm.chat.as_deref(), Some("1100000000000000077"));
        assert!(!dm.group && dm.reply_to.is_none());
        assert_eq!(dm.received_at_ms, vector_clock_ms());
        let context = dm.reply_context.as_ref().unwrap();
        assert_eq!(
            read_reply_context(context),
            Some(Answering {
                received_at_ms: vector_clock_ms(),
                user_install: false,
                token: "aW50ZXJhY3Rpb246MTMwMDAwMDAwMDAwMDAwMDkwMjpkbQ"
            }),
            "installed to the guild (`{{\"0\": \"0\"}}`): no follow-up limit"
        );
        assert!(
            !format!("{dm:?}").contains("aW50ZXJhY3Rpb246"),
            "the token never shows in Debug"
        );

        let guild = command_event(&channel, &fixture("discord_slash_guild.json"));
        assert_eq!(
            guild.conversation.as_str(),
            "discord:1100000000000000001:1100000000000000050"
        );
        assert_eq!(guild.text, "/ops status payments-api");
        assert!(guild.group);

        let with = |edit: &dyn Fn(&mut serde_json::Value)| {
            let mut json: serde_json::Value =
                serde_json::from_slice(&fixture("discord_slash_dm.json")).unwrap();
            edit(&mut json);
            serde_json::to_vec(&json).unwrap()
        };
        for (name, text) in [("new", "/new"), ("status", "/status")] {
            let body = with(&|json| {
                json["data"]["name"] = name.into();
                json["data"].as_object_mut().unwrap().remove("options");
            });
            assert_eq!(command_event(&channel, &body).text, text);
        }
        let memory = with(&|json| {
            json["data"]["name"] = "memory".into();
            json["data"]["options"] =
                serde_json::json!([{"name": "args", "type": 3, "value": "forget 2"}]);
        });
        assert_eq!(command_event(&channel, &memory).text, "/memory forget 2");
        let empty_ask = with(&|json| {
            json["data"]["options"][0]["value"] = "  ".into();
        });
        assert_eq!(command_event(&channel, &empty_ask).text, "/help");
    }

    #[test]
    fn the_message_command_asks_about_its_message() {
        let channel = channel();
        let mut json: serde_json::Value =
            serde_json::from_slice(&fixture("discord_slash_guild.json")).unwrap();
        let author = json["member"]["user"].clone();
        json["data"] = serde_json::json!({
            "id": "1300000000000000102", "name": "Ask antler", "type": 3,
            "target_id": "1400000000000000001",
            "resolved": {"messages": {"1400000000000000001": {
                "id": "1400000000000000001", "channel_id": "1100000000000000050",
                "author": author, "content": "deploy failed: exit 137", "timestamp":
                "2026-01-01T00:00:00.000000+00:00", "edited_timestamp": null, "tts": false,
                "mention_everyone": false, "mentions": [], "mention_roles": [],
                "attachments": [], "embeds": [], "pinned": false, "type": 0, "flags": 0,
                "components": []
            }}}
        });
        let event = command_event(&channel, &serde_json::to_vec(&json).unwrap());
        assert_eq!(event.text, "deploy failed: exit 137");
        assert_eq!(event.unsupported, None);
        json["data"]["resolved"]["messages"]["1400000000000000001"]["content"] = "".into();
        let event = command_event(&channel, &serde_json::to_vec(&json).unwrap());
        assert_eq!(event.unsupported.as_deref(), Some("a message without text"));
    }

    #[test]
    fn servers_outside_allowed_guilds_get_an_ephemeral_refusal() {
        let channel = DiscordChannel::new(
            &DiscordSettings {
                allowed_guilds: vec!["42".into()],
                ..settings("http://127.0.0.1:9", VECTOR_KEY)
            },
            vector_clock_ms,
        )
        .unwrap();
        let Parsed::Reply(reply) = parse(&channel, &fixture("discord_slash_guild.json")) else {
            panic!("refused at once")
        };
        assert_eq!(reply["type"], 4);
        assert_eq!(reply["data"]["flags"], 64);
        // DMs are not a server: the allowlists decide.
        assert!(matches!(
            parse(&channel, &fixture("discord_slash_dm.json")),
            Parsed::EventsWithReply { .. }
        ));
        let refusal = channel.refusal_reply("no").unwrap();
        assert_eq!(refusal["type"], 4);
        assert_eq!(refusal["data"]["flags"], 64);
        assert_eq!(refusal["data"]["content"], "no");
    }

    #[test]
    fn odd_requests_are_malformed_or_answered_without_a_turn() {
        let channel = channel();
        let headers = http::HeaderMap::new();
        let error = channel
            .parse(&WebhookRequest {
                route: "interactions",
                headers: &headers,
                body: br#"{"type":2,"token":"SECRET-TOKEN"}"#,
            })
            .unwrap_err();
        assert!(
            matches!(&error, ChannelError::Malformed(text) if !text.contains("SECRET")),
            "{error:?}"
        );
        assert!(
            channel
                .parse(&WebhookRequest {
                    route: "other",
                    headers: &headers,
                    body: b"{}",
                })
                .is_err()
        );
        let mut json: serde_json::Value =
            serde_json::from_slice(&fixture("discord_slash_dm.json")).unwrap();
        json["type"] = 4.into();
        assert_eq!(
            parse(&channel, &serde_json::to_vec(&json).unwrap()),
            Parsed::Reply(serde_json::json!({"type": 8, "data": {"choices": []}}))
        );
    }

    #[test]
    fn settings_are_checked_and_secrets_never_show_in_debug() {
        for (settings, key) in [
            (settings("http://127.0.0.1:9", "abcd"), "public_key"),
            (
                DiscordSettings {
                    application_id: "app".into(),
                    ..settings("http://127.0.0.1:9", VECTOR_KEY)
                },
                "application_id",
            ),
            (
                DiscordSettings {
                    bot_token: " ".into(),
                    ..settings("http://127.0.0.1:9", VECTOR_KEY)
                },
                "bot_token",
            ),
        ] {
            let error = DiscordChannel::new(&settings, || 0).unwrap_err();
            assert!(
                matches!(&error, ChannelError::Permanent(text) if text.contains(key)),
                "{error:?}"
            );
        }
        let settings = settings("http://127.0.0.1:9", VECTOR_KEY);
        let channel = DiscordChannel::new(&settings, || 0).unwrap();
        for debug in [format!("{settings:?}"), format!("{channel:?}")] {
            assert!(!debug.contains(BOT_TOKEN), "{debug}");
        }
        assert_eq!(channel.routes(), ["interactions"]);
        let limits = channel.limits();
        assert_eq!(limits.message, Some(Limit::Chars(2000)));
        assert_eq!(limits.edits.unwrap().interval(true), Duration::from_secs(1));
        assert_eq!(
            channel.render("**hi** *there*").unwrap(),
            ["**hi** *there*"]
        );
    }

    fn outbound(conversation: &str, context: Option<ReplyContext>) -> OutboundMessage {
        OutboundMessage {
            prompts: Vec::new(),
            idempotency_key: "k".into(),
            conversation: ConversationKey::new("discord", conversation.split(':')),
            thread_id: "t".into(),
            text: String::new(),
            reply_to: None,
            files: Vec::new(),
            reply_context: context,
        }
    }

    #[tokio::test]
    async fn parts_edit_the_original_then_follow_up_and_after_15_minutes_post_as_the_bot() {
        use wiremock::matchers::{body_partial_json, header, method, path, query_param};
        use wiremock::{Mock, MockServer, ResponseTemplate};

        let server = MockServer::start().await;
        let token = "INTERACTION-TOKEN";
        let webhook = format!("/api/v10/webhooks/1300000000000000001/{token}");
        Mock::given(method("PATCH"))
            .and(path(format!("{webhook}/messages/@original")))
            .and(body_partial_json(
                serde_json::json!({"allowed_mentions": {"parse": []}}),
            ))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(antler_testkit::discord::message("1500000000000000001")),
            )
            .expect(2)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path(&webhook))
            .and(query_param("wait", "true"))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(antler_testkit::discord::message("1500000000000000002")),
            )
            .expect(1)
            .mount(&server)
            .await;
        Mock::given(method("PATCH"))
            .and(path(format!("{webhook}/messages/1500000000000000002")))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(antler_testkit::discord::message("1500000000000000002")),
            )
            .expect(1)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path("/api/v10/channels/1100000000000000050/messages"))
            .and(header("authorization", format!("Bot {BOT_TOKEN}").as_str()))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(antler_testkit::discord::message("1500000000000000003")),
            )
            .expect(1)
            .mount(&server)
            .await;
        let channel =
            DiscordChannel::new(&settings(&server.uri(), VECTOR_KEY), vector_clock_ms).unwrap();
        let fresh = outbound(
            "1100000000000000001:1100000000000000050",
            Some(crate::normalize::reply_context(
                vector_clock_ms() - 60_000,
                false,
                token,
            )),
        );
        let first = channel
            .send(
                &fresh,
                Part {
                    buttons: &[],
                    index: 0,
                    body: "one",
                },
            )
            .await
            .unwrap();
        assert_eq!(first.platform_message_id, "1500000000000000001");
        let second = channel
            .send(
                &fresh,
                Part {
                    buttons: &[],
                    index: 1,
                    body: "two",
                },
            )
            .await
            .unwrap();
        assert_eq!(second.platform_message_id, "1500000000000000002");
        channel
            .edit(
                &fresh,
                &first,
                Part {
                    buttons: &[],
                    index: 0,
                    body: "one!",
                },
            )
            .await
            .unwrap();
        channel
            .edit(
                &fresh,
                &second,
                Part {
                    buttons: &[],
                    index: 1,
                    body: "two!",
                },
            )
            .await
            .unwrap();

        let expired = outbound(
            "1100000000000000001:1100000000000000050",
            Some(crate::normalize::reply_context(
                vector_clock_ms() - 15 * 60_000,
                false,
                token,
            )),
        );
        let late = channel
            .send(
                &expired,
                Part {
                    buttons: &[],
                    index: 0,
                    body: "late",
                },
            )
            .await
            .unwrap();
        assert_eq!(late.platform_message_id, "1500000000000000003");
        server.verify().await;
        // The bot token goes only to bot routes; nothing carries the interaction token but
        // its own webhook's path.
        for request in server.received_requests().await.unwrap() {
            let auth = request
                .headers
                .get("authorization")
                .map(|v| v.to_str().unwrap().to_owned());
            if request.url.path().contains("/webhooks/") {
                assert_eq!(auth, None);
            } else {
                assert!(!request.url.path().contains(token));
            }
        }
    }

    fn press_of(channel: &DiscordChannel, body: &[u8]) -> Press {
        match parse(channel, body) {
            Parsed::Press(press) => press,
            other => panic!("not a press: {other:?}"),
        }
    }

    fn json_fixture(name: &str) -> serde_json::Value {
        serde_json::from_slice(&fixture(name)).unwrap()
    }

    #[test]
    fn a_recorded_button_press_verifies_and_is_the_press_of_the_commands_user_and_place() {
        let channel = channel();
        let body = fixture("discord_button_guild.json.body");
        let headers = recorded("discord_button_guild.json");
        let request = WebhookRequest {
            route: "interactions",
            headers: &headers,
            body: &body,
        };
        assert_eq!(channel.verify(&request), Ok(()));
        let press = match channel.parse(&request).unwrap() {
            Parsed::Press(press) => press,
            other => panic!("not a press: {other:?}"),
        };
        assert_eq!(press.channel, "discord");
        assert_eq!(press.action, "approve:k3x9p2ab");
        assert_eq!(press.message_id, "1500000000000000004");
        assert_eq!(press.chat.as_deref(), Some("1100000000000000050"));
        let context = press.answer_context.as_ref().unwrap();
        assert_eq!(
            crate::normalize::read_press_context(context),
            Some((
                "1300000000000000903",
                "aW50ZXJhY3Rpb246MTMwMDAwMDAwMDAwMDAwMDkwMzpidXR0b24"
            ))
        );
        assert!(
            !format!("{press:?}").contains("aW50ZXJhY3Rpb246"),
            "the token never shows in Debug"
        );
        // The same person's command in the same place: the same conversation and user.
        let mut command = json_fixture("discord_slash_guild.json");
        command["member"]["nick"] = "Ada (SRE)".into();
        let event = command_event(&channel, &serde_json::to_vec(&command).unwrap());
        assert_eq!(press.conversation, event.conversation);
        assert_eq!(press.user, event.user);
        assert_eq!(press.user.name.as_deref(), Some("Ada (SRE)"));
        assert!(!press.user.admin, "admin is the access rules' to set");

        // In a DM: `user` instead of `member`, the DM's conversation.
        let dm_press = antler_testkit::discord::press("1300000000000000904", "tok", "deny:x", "15");
        let dm_press = press_of(&channel, &serde_json::to_vec(&dm_press).unwrap());
        let dm = command_event(&channel, &fixture("discord_slash_dm.json"));
        assert_eq!(dm_press.conversation, dm.conversation);
        assert_eq!(dm_press.user, dm.user);
        assert_eq!(dm_press.chat, dm.chat);
        assert_eq!(
            (dm_press.action.as_str(), dm_press.message_id.as_str()),
            ("deny:x", "15")
        );
    }

    #[test]
    fn presses_antler_cannot_have_made_are_refused_privately_and_broken_ones_are_malformed() {
        let channel = channel();
        let with = |edit: &dyn Fn(&mut serde_json::Value)| {
            let mut json = json_fixture("discord_button_guild.json");
            edit(&mut json);
            serde_json::to_vec(&json).unwrap()
        };
        let refused = |body: &[u8]| match parse(&channel, body) {
            Parsed::Reply(reply) => {
                assert_eq!(reply["type"], 4, "{reply}");
                assert_eq!(reply["data"]["flags"], 64, "{reply}");
                reply["data"]["content"].as_str().unwrap().to_owned()
            }
            other => panic!("not refused: {other:?}"),
        };
        // Discord's custom_id holds up to 100 characters; antler's are at most 64 ASCII bytes.
        let long = with(&|json| json["data"]["custom_id"] = "a".repeat(65).into());
        assert!(refused(&long).contains("not one antler answers"));
        let unicode = with(&|json| json["data"]["custom_id"] = "approve:ü".into());
        assert!(refused(&unicode).contains("not one antler answers"));
        let empty = with(&|json| json["data"]["custom_id"] = "".into());
        assert!(refused(&empty).contains("not one antler answers"));
        // A select menu (component_type 3) is not a button.
        let menu = with(&|json| {
            json["data"] =
                serde_json::json!({"component_type": 3, "custom_id": "m", "values": ["a"]});
        });
        assert!(refused(&menu).contains("menus"));
        // No message, or no data: not a component interaction Discord sends.
        for broken in [
            with(&|json| {
                json.as_object_mut().unwrap().remove("message");
            }),
            with(&|json| {
                json.as_object_mut().unwrap().remove("data");
            }),
        ] {
            let error = channel
                .parse(&WebhookRequest {
                    route: "interactions",
                    headers: &http::HeaderMap::new(),
                    body: &broken,
                })
                .unwrap_err();
            assert!(
                matches!(&error, ChannelError::Malformed(text) if !text.contains("aW50ZXJh")),
                "{error:?}"
            );
        }
        // A server outside allowed_guilds: refused as its commands are.
        let guarded = DiscordChannel::new(
            &DiscordSettings {
                allowed_guilds: vec!["42".into()],
                ..settings("http://127.0.0.1:9", VECTOR_KEY)
            },
            vector_clock_ms,
        )
        .unwrap();
        let Parsed::Reply(reply) = parse(&guarded, &fixture("discord_button_guild.json")) else {
            panic!("refused at once")
        };
        assert_eq!(reply["data"]["flags"], 64);
        assert!(
            reply["data"]["content"]
                .as_str()
                .unwrap()
                .contains("server")
        );
    }

    #[tokio::test]
    async fn a_press_is_answered_by_updating_its_message_or_privately() {
        let channel = channel();
        assert!(channel.capabilities().buttons);
        let press = press_of(&channel, &fixture("discord_button_guild.json"));
        let decided = channel
            .answer_press(
                &press,
                &PressAnswer {
                    notice: "✅ Approved".into(),
                    update: Some("⏸ **deploy**\n✅ Approved by @everyone".into()),
                    decided_now: true,
                },
            )
            .await
            .unwrap()
            .unwrap();
        // UPDATE_MESSAGE: the button's message edited, its components gone, no pings.
        assert_eq!(
            decided,
            serde_json::json!({"type": 7, "data": {
                "content": "⏸ **deploy**\n✅ Approved by @everyone",
                "components": [],
                "allowed_mentions": {"parse": []},
            }})
        );
        let refused = channel
            .answer_press(
                &press,
                &PressAnswer {
                    notice: "Only approvers can decide.".into(),
                    update: None,
                    decided_now: false,
                },
            )
            .await
            .unwrap()
            .unwrap();
        // CHANNEL_MESSAGE_WITH_SOURCE, EPHEMERAL: only the presser sees it; the message stays.
        assert_eq!(
            refused,
            channel.refusal_reply("Only approvers can decide.").unwrap()
        );
        assert_eq!(refused["type"], 4);
        assert_eq!(refused["data"]["flags"], 64);
        // An update longer than a message is cut to one.
        let long = channel
            .answer_press(
                &press,
                &PressAnswer {
                    notice: String::new(),
                    update: Some("word ".repeat(1000)),
                    decided_now: true,
                },
            )
            .await
            .unwrap()
            .unwrap();
        assert!(long["data"]["content"].as_str().unwrap().chars().count() <= MESSAGE_LIMIT);
    }

    #[test]
    fn buttons_are_action_rows_of_at_most_5_within_discords_limits() {
        let components = crate::client::components(&antler_testkit::approve_deny());
        assert_eq!(
            components,
            serde_json::json!([{"type": 1, "components": [
                {"type": 2, "style": 3, "label": "✅ Approve", "custom_id": "approve:k3x9p2ab"},
                {"type": 2, "style": 4, "label": "❌ Deny", "custom_id": "deny:k3x9p2ab"},
            ]}])
        );
        let mut many: Vec<Button> = (0..7)
            .map(|n| Button {
                label: "x".repeat(100),
                action: format!("a:{n}"),
                style: ButtonStyle::Primary,
            })
            .collect();
        many.push(Button {
            label: "too long".into(),
            action: "b".repeat(101),
            style: ButtonStyle::Danger,
        });
        let components = crate::client::components(&many);
        let rows = components.as_array().unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0]["components"].as_array().unwrap().len(), 5);
        assert_eq!(rows[1]["components"].as_array().unwrap().len(), 2);
        assert_eq!(
            rows[0]["components"][0]["label"]
                .as_str()
                .unwrap()
                .chars()
                .count(),
            80
        );
    }

    #[tokio::test]
    async fn buttons_go_under_the_original_a_follow_up_or_a_channel_message() {
        use wiremock::matchers::{body_partial_json, method, path};
        use wiremock::{Mock, MockServer, ResponseTemplate};

        let server = MockServer::start().await;
        let components = crate::client::components(&antler_testkit::approve_deny());
        let webhook = "/api/v10/webhooks/1300000000000000001/TOK";
        for (verb, route, id) in [
            (
                "PATCH",
                format!("{webhook}/messages/@original"),
                "1500000000000000001",
            ),
            ("POST", webhook.to_owned(), "1500000000000000002"),
            (
                "POST",
                "/api/v10/channels/1100000000000000050/messages".to_owned(),
                "1500000000000000003",
            ),
        ] {
            Mock::given(method(verb))
                .and(path(route))
                .and(body_partial_json(serde_json::json!({
                    "components": components, "allowed_mentions": {"parse": []}
                })))
                .respond_with(
                    ResponseTemplate::new(200).set_body_json(antler_testkit::discord::message(id)),
                )
                .expect(1)
                .mount(&server)
                .await;
        }
        let channel =
            DiscordChannel::new(&settings(&server.uri(), VECTOR_KEY), vector_clock_ms).unwrap();
        let live = outbound(
            "1100000000000000001:1100000000000000050",
            Some(crate::normalize::reply_context(
                vector_clock_ms(),
                false,
                "TOK",
            )),
        );
        let buttons = antler_testkit::approve_deny();
        let part = |index| Part {
            index,
            body: "⏸ Approval needed",
            buttons: &buttons,
        };
        let sent: Vec<String> = [
            channel.send(&live, part(0)).await,
            channel.send(&live, part(1)).await,
            channel
                .send(
                    &outbound("1100000000000000001:1100000000000000050", None),
                    part(1),
                )
                .await,
        ]
        .into_iter()
        .map(|r| r.unwrap().platform_message_id)
        .collect();
        assert_eq!(
            sent,
            [
                "1500000000000000001",
                "1500000000000000002",
                "1500000000000000003"
            ]
        );
        server.verify().await;
        // A part without buttons carries no components (an edit keeps the message's).
        channel
            .send(
                &outbound("1100000000000000001:1100000000000000050", None),
                Part {
                    index: 1,
                    body: "plain",
                    buttons: &[],
                },
            )
            .await
            .unwrap_err();
        let last = server.received_requests().await.unwrap().pop().unwrap();
        let body: serde_json::Value = serde_json::from_slice(&last.body).unwrap();
        assert!(body.get("components").is_none(), "{body}");
    }

    #[tokio::test]
    async fn a_press_over_the_gateway_is_answered_through_its_callback() {
        use wiremock::matchers::{method, path};
        use wiremock::{Mock, MockServer, ResponseTemplate};

        let server = MockServer::start().await;
        let token = "aW50ZXJhY3Rpb246MTMwMDAwMDAwMDAwMDAwMDkwMzpidXR0b24";
        Mock::given(method("POST"))
            .and(path(format!(
                "/api/v10/interactions/1300000000000000903/{token}/callback"
            )))
            .respond_with(ResponseTemplate::new(204))
            .up_to_n_times(1)
            .expect(1)
            .mount(&server)
            .await;
        // "Unknown interaction" once it has been answered or its 3 seconds passed.
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(404).set_body_json(
                serde_json::json!({"message": "Unknown interaction", "code": 10062}),
            ))
            .mount(&server)
            .await;
        let channel =
            DiscordChannel::new(&settings(&server.uri(), VECTOR_KEY), vector_clock_ms).unwrap();
        let component: serenity::model::application::ComponentInteraction =
            serde_json::from_slice(&fixture("discord_button_guild.json")).unwrap();
        let gateway_press = crate::gateway::GatewayPress(Box::new(component));
        assert!(!format!("{gateway_press:?}").contains(token));
        let Parsed::Press(press) = channel.parse_gateway(&gateway_press) else {
            panic!("a press")
        };
        assert_eq!(
            press,
            press_of(&channel, &fixture("discord_button_guild.json"))
        );
        let response = update_message("done");
        channel
            .answer_gateway(&gateway_press, &response)
            .await
            .unwrap();
        let call = server.received_requests().await.unwrap().pop().unwrap();
        assert!(call.headers.get("authorization").is_none());
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&call.body).unwrap(),
            response
        );
        // Discord refusing the callback (the token is spent): an error, without the token.
        let error = channel
            .answer_gateway(&gateway_press, &response)
            .await
            .unwrap_err();
        assert!(
            matches!(&error, ChannelError::Permanent(text) if text.contains("10062") && !text.contains(token)),
            "{error:?}"
        );
        server.verify().await;
    }

    #[tokio::test]
    async fn a_429_is_rate_limited_with_its_delay_and_a_spent_bucket_holds_the_route() {
        use wiremock::matchers::{method, path};
        use wiremock::{Mock, MockServer, ResponseTemplate};

        let server = MockServer::start().await;
        Mock::given(method("PATCH"))
            .and(path(
                "/api/v10/webhooks/1300000000000000001/T/messages/@original",
            ))
            .respond_with(
                ResponseTemplate::new(429)
                    .insert_header("retry-after", "1")
                    .set_body_json(serde_json::json!({
                        "message": "You are being rate limited.", "retry_after": 1.25,
                        "global": false
                    })),
            )
            .up_to_n_times(1)
            .mount(&server)
            .await;
        Mock::given(method("PATCH"))
            .and(path(
                "/api/v10/webhooks/1300000000000000001/T/messages/@original",
            ))
            .respond_with(
                ResponseTemplate::new(200)
                    .insert_header("x-ratelimit-remaining", "0")
                    .insert_header("x-ratelimit-reset-after", "30")
                    .set_body_json(antler_testkit::discord::message("1500000000000000001")),
            )
            .mount(&server)
            .await;
        let channel =
            DiscordChannel::new(&settings(&server.uri(), VECTOR_KEY), vector_clock_ms).unwrap();
        let message = outbound(
            "1100000000000000077",
            Some(crate::normalize::reply_context(
                vector_clock_ms(),
                false,
                "T",
            )),
        );
        let part = Part {
            buttons: &[],
            index: 0,
            body: "x",
        };
        assert_eq!(
            channel.send(&message, part).await,
            Err(ChannelError::RateLimited {
                retry_after: Duration::from_millis(1250)
            })
        );
        assert!(channel.send(&message, part).await.is_ok());
        // The bucket is spent: the next call waits without being sent.
        let held = channel.send(&message, part).await;
        assert!(
            matches!(held, Err(ChannelError::RateLimited { retry_after }) if retry_after > Duration::from_secs(20)),
            "{held:?}"
        );
        assert_eq!(server.received_requests().await.unwrap().len(), 2);
    }

    #[tokio::test]
    async fn register_commands_writes_only_when_the_list_changed() {
        use wiremock::matchers::{method, path};
        use wiremock::{Mock, MockServer, ResponseTemplate};

        use crate::client::{CommandSpec, OptionSpec, Registration};

        let commands = vec![
            CommandSpec {
                name: "ask".into(),
                kind: 1,
                description: "Ask antler".into(),
                options: vec![OptionSpec {
                    name: "prompt".into(),
                    description: "What to ask".into(),
                    kind: 3,
                    required: true,
                }],
            },
            CommandSpec {
                name: "Ask antler".into(),
                kind: 3,
                description: String::new(),
                options: Vec::new(),
            },
        ];
        let server = MockServer::start().await;
        let route = "/api/v10/applications/1300000000000000001/guilds/77/commands";
        Mock::given(method("GET"))
            .and(path(route))
            .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!([])))
            .up_to_n_times(1)
            .mount(&server)
            .await;
        let mut registered = serde_json::to_value(&commands).unwrap();
        for (n, command) in registered.as_array_mut().unwrap().iter_mut().enumerate() {
            command["id"] = format!("9{n}").into();
            command["version"] = "1".into();
        }
        Mock::given(method("GET"))
            .and(path(route))
            .respond_with(ResponseTemplate::new(200).set_body_json(registered))
            .mount(&server)
            .await;
        Mock::given(method("PUT"))
            .and(path(route))
            .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!([])))
            .expect(1)
            .mount(&server)
            .await;
        let channel =
            DiscordChannel::new(&settings(&server.uri(), VECTOR_KEY), vector_clock_ms).unwrap();
        let api = channel.api();
        assert_eq!(
            api.register_commands(Some("77"), &commands).await,
            Ok(Registration::Updated)
        );
        assert_eq!(
            api.register_commands(Some("77"), &commands).await,
            Ok(Registration::Unchanged)
        );
        server.verify().await;
        let put = server
            .received_requests()
            .await
            .unwrap()
            .into_iter()
            .find(|r| r.method.as_str() == "PUT")
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&put.body).unwrap();
        assert_eq!(body, serde_json::to_value(&commands).unwrap());
    }

    #[tokio::test]
    async fn me_reads_the_bot_user() {
        use wiremock::matchers::{header, method, path};
        use wiremock::{Mock, MockServer, ResponseTemplate};

        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path("/api/v10/users/@me"))
            .and(header("authorization", format!("Bot {BOT_TOKEN}").as_str()))
            .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
                "id": "1300000000000000001", "username": "antler", "discriminator": "0",
                "global_name": null, "avatar": null, "bot": true, "verified": true,
                "mfa_enabled": false, "flags": 0
            })))
            .mount(&server)
            .await;
        let channel =
            DiscordChannel::new(&settings(&server.uri(), VECTOR_KEY), vector_clock_ms).unwrap();
        let me = channel.api().me().await.unwrap();
        assert_eq!(
            (me.id.as_str(), me.name.as_str()),
            ("1300000000000000001", "antler")
        );
        let wrong = DiscordChannel::new(
            &DiscordSettings {
                bot_token: "wrong".into(),
                ..settings(&server.uri(), VECTOR_KEY)
            },
            vector_clock_ms,
        )
        .unwrap();
        let error = wrong.api().me().await.unwrap_err();
        assert!(
            matches!(&error, ChannelError::Permanent(text) if text.contains("404")),
            "{error:?}"
        );
    }
}
