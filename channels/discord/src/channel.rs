//! Discord as an antler [`Channel`]: Ed25519-signed interactions on
//! `/webhooks/discord/interactions`, application commands deferred at once and answered by
//! editing the deferred response, further parts as follow-ups.

use std::time::Duration;

use antler_channel::render::{self, DiscordMarkdown, Limit};
use antler_channel::verify::SignedHeaders;
use antler_channel::{
    Capabilities, Channel, ChannelError, EditRate, Limits, OutboundMessage, Parsed, Part, Receipt,
    WebhookRequest, verify,
};
use serenity::interactions_endpoint::Verifier;
use serenity::model::application::Interaction;

use crate::client::{DEFAULT_API_URL, DiscordApi};
use crate::normalize::{
    Answering, NAME, Normalized, channel_of, normalize_command, read_reply_context,
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
        self.api.create_message(channel, part.body, reply_to).await
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
            Interaction::Component(_) | Interaction::Modal(_) => {
                return Ok(Parsed::Reply(ephemeral(
                    "antler does not handle buttons or forms.",
                )));
            }
            _ => return Ok(Parsed::Ignore),
        };
        if let Some(guild) = command.guild_id
            && !self.allowed_guilds.is_empty()
            && !self.allowed_guilds.contains(&guild.to_string())
        {
            tracing::info!(%guild, "a command from a server that is not in channels.discord.allowed_guilds");
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

/// A header's value as text, if present and readable.
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
                self.api.edit_original(interaction.token, part.body).await?
            }
            Some(interaction)
                if !interaction.user_install || part.index <= USER_INSTALL_FOLLOW_UPS =>
            {
                self.api.follow_up(interaction.token, part.body).await?
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
                .edit_original(interaction.token, part.body)
                .await?
                .map(drop)
                .ok_or_else(unknown),
            Some(interaction) if !sent.platform_message_id.is_empty() => self
                .api
                .webhook_message(interaction.token, &sent.platform_message_id, part.body)
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

    /// Text only (the deferred response already shows "thinking…").
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }
}

#[cfg(test)]
mod tests {
    use ed25519_dalek::SigningKey;

    use super::*;
    use antler_channel::{ConversationKey, InboundEvent, ReplyContext};

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
        ] {
            let parsed: Result<Interaction, _> = serde_json::from_slice(&fixture(name));
            assert!(parsed.is_ok(), "{name}: {parsed:?}");
        }
    }

    #[test]
    fn the_vectors_verify_and_a_flipped_byte_does_not() {
        let channel = channel();
        for name in ["discord_ping.json", "discord_slash_guild.json"] {
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
