//! The optional Gateway connection (`channels.discord.gateway = true`): serenity's client on
//! Discord's websocket, for what the Interactions Endpoint never delivers: plain @mentions in
//! servers and direct messages.
//!
//! Intents are `GUILD_MESSAGES | DIRECT_MESSAGES`, not the privileged `MESSAGE_CONTENT`:
//! Discord gives a bot the text of DMs and of messages that mention it without it, and those are
//! the only messages antler answers. Each becomes an [`InboundEvent`] whose id is the message id,
//! so a message Discord replays on a resumed session (or that a second session sees) is
//! recognised by the inbox's dedupe and answered once. Answers are ordinary bot messages in the
//! channel (no interaction token), replying to the message.
//!
//! Without an Interactions Endpoint URL set in the Developer Portal, Discord sends interactions
//! over the Gateway (INTERACTION_CREATE) instead: a press of one of antler's buttons comes as a
//! [`GatewayEvent::Press`], answered through `/interactions/{id}/{token}/callback`
//! ([`crate::DiscordChannel::answer_gateway`]). Other interactions stay the endpoint's.

use std::sync::{Arc, RwLock};

use antler_channel::{ChannelError, InboundEvent, UserRef};
use serenity::all::{
    ComponentInteraction, Context, EventHandler, GatewayIntents, Interaction, Message, Ready,
    UserId,
};
use serenity::http::HttpBuilder;
use tokio::sync::mpsc;

use crate::normalize::{NAME, conversation};

/// How many received messages may wait for the gateway's reader before the websocket stops
/// being read (Discord then buffers, and replays on resume).
const QUEUE: usize = 256;

/// The longest text taken from one message, in bytes (Discord's own limit is 4,000
/// characters).
const MAX_TEXT_BYTES: usize = 32 * 1024;

/// What the Gateway received for antler.
#[derive(Debug)]
pub enum GatewayEvent {
    /// A message for the bot (a DM, an @mention).
    Message(Box<InboundEvent>),
    /// A press of a button on one of the bot's messages.
    Press(GatewayPress),
}

/// A button press received over the Gateway: read it with
/// [`crate::DiscordChannel::parse_gateway`], answer it with
/// [`crate::DiscordChannel::answer_gateway`]. Its token is secret: Debug does not show it.
pub struct GatewayPress(pub(crate) Box<ComponentInteraction>);

impl GatewayPress {
    /// The component interaction.
    pub(crate) fn component(&self) -> &ComponentInteraction {
        &self.0
    }
}

impl std::fmt::Debug for GatewayPress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayPress")
            .field("id", &self.0.id)
            .finish_non_exhaustive()
    }
}

/// A running Gateway connection: what it receives, and the means to stop it.
pub struct DiscordGateway {
    /// Messages for the bot and presses of its buttons, in the order Discord sent them.
    pub events: mpsc::Receiver<GatewayEvent>,
    shards: Arc<serenity::gateway::ShardManager>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for DiscordGateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscordGateway").finish_non_exhaustive()
    }
}

impl DiscordGateway {
    /// Connects with `bot_token` through the API at `api_url` (`GET /api/v10/gateway/bot`
    /// names the websocket); serenity reconnects and resumes by itself.
    pub async fn start(
        bot_token: &str,
        api_url: &str,
        now_ms: fn() -> u64,
    ) -> Result<Self, ChannelError> {
        let mut http = HttpBuilder::new(bot_token);
        let api_url = api_url.trim_end_matches('/');
        if api_url != crate::client::DEFAULT_API_URL {
            http = http.proxy(api_url).ratelimiter_disabled(true);
        }
        let (sender, events) = mpsc::channel(QUEUE);
        let handler = Handler {
            sender,
            me: RwLock::new(None),
            now_ms,
        };
        let intents = GatewayIntents::GUILD_MESSAGES | GatewayIntents::DIRECT_MESSAGES;
        let mut client = serenity::client::ClientBuilder::new_with_http(http.build(), intents)
            .event_handler(handler)
            .await
            .map_err(|e| {
                ChannelError::Permanent(format!(
                    "the Discord gateway client failed: {}",
                    redact(&e)
                ))
            })?;
        let shards = Arc::clone(&client.shard_manager);
        let task = tokio::spawn(async move {
            if let Err(e) = client.start().await {
                tracing::warn!(error = %redact(&e), "the Discord gateway stopped");
            }
        });
        Ok(Self {
            events,
            shards,
            task,
        })
    }

    /// Closes the connection.
    pub async fn stop(self) {
        self.shards.shutdown_all().await;
        self.task.abort();
    }
}

/// serenity's error as text, without anything that could carry the token.
fn redact(error: &serenity::Error) -> String {
    match error {
        serenity::Error::Http(e) => format!(
            "HTTP: {}",
            e.status_code()
                .map_or_else(|| "request failed".to_owned(), |s| s.to_string())
        ),
        serenity::Error::Gateway(e) => format!("gateway: {e}"),
        serenity::Error::Tungstenite(_) => "websocket failed".to_owned(),
        _ => "failed".to_owned(),
    }
}

struct Handler {
    sender: mpsc::Sender<GatewayEvent>,
    /// The bot's user id, from READY.
    me: RwLock<Option<UserId>>,
    now_ms: fn() -> u64,
}

#[serenity::async_trait]
impl EventHandler for Handler {
    async fn ready(&self, _: Context, ready: Ready) {
        tracing::info!(bot = %ready.user.name, "discord gateway ready");
        if let Ok(mut me) = self.me.write() {
            *me = Some(ready.user.id);
        }
    }

    async fn message(&self, _: Context, message: Message) {
        let me = self.me.read().ok().and_then(|me| *me);
        if let Some(event) = normalize_message(&message, me, (self.now_ms)()) {
            // Waits while the reader is behind: the websocket is read no faster than accepted.
            if self
                .sender
                .send(GatewayEvent::Message(Box::new(event)))
                .await
                .is_err()
            {
                tracing::debug!("a gateway message after the gateway's reader stopped");
            }
        }
    }

    async fn interaction_create(&self, _: Context, interaction: Interaction) {
        let Interaction::Component(component) = interaction else {
            tracing::debug!("an interaction other than a button press over the gateway; ignored");
            return;
        };
        let press = GatewayEvent::Press(GatewayPress(Box::new(component)));
        if self.sender.send(press).await.is_err() {
            tracing::debug!("a gateway button press after the gateway's reader stopped");
        }
    }
}

/// A message for the bot as a normalized event: any DM from a person, or a server message that
/// mentions the bot; `None` for everything else (other bots, the bot's own messages).
pub(crate) fn normalize_message(
    message: &Message,
    me: Option<UserId>,
    received_at_ms: u64,
) -> Option<InboundEvent> {
    if message.author.bot || Some(message.author.id) == me {
        return None;
    }
    let guild = message.guild_id.map(|id| id.to_string());
    if guild.is_some() {
        let me = me?;
        if !message.mentions.iter().any(|user| user.id == me) {
            return None;
        }
    }
    let mut text = message.content.clone();
    if let Some(me) = me {
        for mention in [format!("<@{me}>"), format!("<@!{me}>")] {
            text = text.replace(&mention, "");
        }
    }
    let mut text = text.trim().to_owned();
    if text.len() > MAX_TEXT_BYTES {
        let mut end = MAX_TEXT_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    let channel = message.channel_id.to_string();
    let author = &message.author;
    Some(InboundEvent {
        channel: NAME.to_owned(),
        event_id: message.id.to_string(),
        conversation: conversation(guild.as_deref(), &channel),
        user: UserRef {
            id: author.id.to_string(),
            name: Some(
                author
                    .global_name
                    .clone()
                    .unwrap_or_else(|| author.name.clone()),
            ),
            admin: false,
            aliases: Vec::new(),
        },
        unsupported: text.is_empty().then(|| "a message without text".to_owned()),
        text,
        reply_to: Some(message.id.to_string()),
        received_at_ms,
        attachments: Vec::new(),
        group: guild.is_some(),
        chat: Some(channel),
        refused: false,
        follow_up: false,
        interactive: true,
        reply_context: None,
        media_group: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOT: u64 = 1_300_000_000_000_000_001;

    fn message(
        guild: Option<&str>,
        author_bot: bool,
        content: &str,
        mentions_bot: bool,
    ) -> Message {
        let mut json = serde_json::json!({
            "id": "1700000000000000001", "channel_id": "1100000000000000050",
            "author": {"id": "1200000000000000001", "username": "ada_ops", "discriminator": "0",
                       "global_name": "Ada", "avatar": null, "bot": author_bot},
            "content": content, "timestamp": "2026-01-01T00:00:00.000000+00:00",
            "edited_timestamp": null, "tts": false, "mention_everyone": false,
            "mentions": [], "mention_roles": [], "attachments": [], "embeds": [],
            "pinned": false, "type": 0
        });
        if let Some(guild) = guild {
            json["guild_id"] = guild.into();
        }
        if mentions_bot {
            json["mentions"] = serde_json::json!([{"id": BOT.to_string(), "username": "antler",
                "discriminator": "0", "global_name": null, "avatar": null, "bot": true}]);
        }
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn dms_and_mentions_are_messages_for_the_bot_and_nothing_else_is() {
        let me = Some(UserId::new(BOT));
        let dm = normalize_message(&message(None, false, "status?", false), me, 7).unwrap();
        assert_eq!(dm.conversation.as_str(), "discord:1100000000000000050");
        assert_eq!(dm.event_id, "1700000000000000001");
        assert_eq!(dm.reply_to.as_deref(), Some("1700000000000000001"));
        assert_eq!(
            (dm.text.as_str(), dm.group, dm.received_at_ms),
            ("status?", false, 7)
        );
        assert!(dm.reply_context.is_none());

        let mention = format!("<@{BOT}> restart web <@!{BOT}>");
        let event = normalize_message(
            &message(Some("1100000000000000001"), false, &mention, true),
            me,
            7,
        )
        .unwrap();
        assert_eq!(
            event.conversation.as_str(),
            "discord:1100000000000000001:1100000000000000050"
        );
        assert_eq!(event.text, "restart web");
        assert!(event.group);

        // Not addressed, another bot, or before READY named the bot: nothing.
        assert!(normalize_message(&message(Some("1"), false, "hi all", false), me, 7).is_none());
        assert!(normalize_message(&message(None, true, "beep", false), me, 7).is_none());
        assert!(normalize_message(&message(Some("1"), false, &mention, true), None, 7).is_none());
        // A bare mention is a message without text.
        let bare = normalize_message(
            &message(Some("1"), false, &format!("<@{BOT}>"), true),
            me,
            7,
        )
        .unwrap();
        assert_eq!(bare.unsupported.as_deref(), Some("a message without text"));
    }
}
