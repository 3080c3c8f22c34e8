//! Slack events and slash commands → antler's normalized message.
//!
//! Pure: no I/O, no clock beyond what the caller passes, so every recorded payload in
//! `tests/fixtures` is a test.
//!
//! Who is addressed: an `app_mention` in a channel, any message in a DM, a channel message
//! that mentions the bot, and (as a follow-up the gateway accepts only in a conversation it
//! already has) a reply in a channel thread. Everything else, and the bot's own posts, is
//! ignored with a reason for the debug log.

use antler_channel::{
    AttachmentRef, AttachmentSource, ConversationKey, InboundEvent, ReplyContext, UserRef,
};
use serde::{Deserialize, Serialize};
use slack_morphism::events::{
    SlackAppMentionEvent, SlackEventCallbackBody, SlackMessageEvent, SlackMessageEventType,
    SlackPushEventCallback,
};

/// The channel's name: the first segment of its conversation keys.
pub(crate) const NAME: &str = "slack";

/// What normalization needs to know besides the payload.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Context<'a> {
    /// The bot's user id when the envelope does not say (learned through `auth.test`).
    pub(crate) bot_user_id: Option<&'a str>,
    /// The only workspace to accept; `None` accepts any.
    pub(crate) team_id: Option<&'a str>,
    /// Replies in a channel thread without a mention become follow-ups.
    pub(crate) thread_follow_ups: bool,
    /// Other bots (`bot_id`s, or their apps' `app_id`s) whose messages are handled like a
    /// person's, classic bots and incoming webhooks (`subtype: bot_message`) too; every other
    /// bot is ignored, so two bots cannot answer each other forever.
    pub(crate) allowed_bots: &'a [String],
    /// When antler received the request, in milliseconds since the Unix epoch.
    pub(crate) received_at_ms: u64,
}

/// What a payload means to antler.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Normalized {
    /// A message for the bot.
    Event(Box<InboundEvent>),
    /// Nothing to do; the reason is for the debug log.
    Ignored(&'static str),
    /// A channel message that mentions someone, while the bot's user id is known from neither
    /// the envelope nor `auth.test`: it may be for the bot, so it is not dropped (Slack
    /// retries it).
    AwaitingIdentity,
}

/// What the answer to a message needs besides its conversation, kept with the message in the
/// store (so it outlives a restart) as its [`ReplyContext`]: who wrote it, for a DM when the
/// bot cannot post where it was asked, and a slash command's `response_url`, a credential that
/// posts where the command ran (30 minutes, 5 uses).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ReplyTo {
    /// The user who wrote the message.
    #[serde(rename = "u")]
    pub(crate) user: String,
    /// A slash command's `response_url`.
    #[serde(rename = "r", default, skip_serializing_if = "Option::is_none")]
    pub(crate) response_url: Option<String>,
    /// When antler received it, in milliseconds since the Unix epoch.
    #[serde(rename = "t")]
    pub(crate) received_at_ms: u64,
}

impl ReplyTo {
    /// As the reply context of an event.
    pub(crate) fn context(&self) -> ReplyContext {
        ReplyContext::new(serde_json::to_string(self).unwrap_or_default())
    }

    /// What [`ReplyTo::context`] made; `None` for anything else.
    pub(crate) fn read(context: &ReplyContext) -> Option<Self> {
        serde_json::from_str(context.expose()).ok()
    }
}

/// The fields of a file antler uses; `size` is not in slack-morphism's `SlackFile`.
#[derive(Debug, Deserialize)]
struct RawFile {
    name: Option<String>,
    mimetype: Option<String>,
    size: Option<u64>,
    url_private_download: Option<String>,
    url_private: Option<String>,
}

/// Normalizes an `event_callback`. `raw_event` is the same event as JSON, for what
/// slack-morphism's model leaves out (`bot_id` on an `app_mention`, file sizes).
pub(crate) fn normalize_callback(
    callback: &SlackPushEventCallback,
    raw_event: &serde_json::Value,
    context: &Context<'_>,
) -> Normalized {
    let team = callback.team_id.0.as_str();
    if context.team_id.is_some_and(|wanted| wanted != team) {
        return Normalized::Ignored("from a workspace other than channels.slack.team_id");
    }
    // The envelope names the bot it was delivered to; the learned identity covers envelopes
    // without `authorizations`.
    let bot = callback
        .authorizations
        .as_deref()
        .and_then(|auths| auths.first())
        .map(|auth| auth.user_id.0.as_str())
        .or(context.bot_user_id);
    if let Some(bot_id) = raw_event.get("bot_id").filter(|id| !id.is_null()) {
        // A bot is named by its bot id (`B…`) or its app's id (`A…`): an incoming webhook's
        // posts carry the webhook's app.
        let listed = |id: &serde_json::Value| {
            id.as_str()
                .is_some_and(|id| context.allowed_bots.iter().any(|allowed| allowed == id))
        };
        let allowed = listed(bot_id) || raw_event.get("app_id").is_some_and(listed);
        if !allowed {
            return Normalized::Ignored("written by a bot");
        }
    }
    match &callback.event {
        SlackEventCallbackBody::AppMention(mention) => {
            app_mention(team, mention, raw_event, bot, context)
        }
        SlackEventCallbackBody::Message(message) => {
            channel_message(team, message, raw_event, bot, context)
        }
        SlackEventCallbackBody::Unknown(_) => {
            // slack-morphism turns a known event with a missing field into `Unknown` too, so
            // the body is what tells a new event type from a malformed mention.
            tracing::debug!(
                event_type = raw_event.get("type").and_then(|t| t.as_str()),
                event = %raw_event,
                "a Slack event slack-morphism does not model (or a malformed one)"
            );
            Normalized::Ignored("an event type antler does not handle")
        }
        _ => Normalized::Ignored("not a message"),
    }
}

fn app_mention(
    team: &str,
    mention: &SlackAppMentionEvent,
    raw_event: &serde_json::Value,
    bot: Option<&str>,
    context: &Context<'_>,
) -> Normalized {
    if bot == Some(mention.user.0.as_str()) {
        return Normalized::Ignored("the bot's own message");
    }
    if mention.edited.is_some() {
        return Normalized::Ignored("an edit");
    }
    let message = Message {
        team,
        channel: &mention.channel.0,
        user: &mention.user.0,
        text: mention.content.text.as_deref().unwrap_or_default(),
        ts: &mention.origin.ts.0,
        thread_ts: mention.origin.thread_ts.as_ref().map(|ts| ts.0.as_str()),
        dm: false,
        follow_up: false,
    };
    message.event(raw_event, bot, context)
}

fn channel_message(
    team: &str,
    event: &SlackMessageEvent,
    raw_event: &serde_json::Value,
    bot: Option<&str>,
    context: &Context<'_>,
) -> Normalized {
    match event.subtype {
        None | Some(SlackMessageEventType::FileShare | SlackMessageEventType::ThreadBroadcast) => {}
        Some(SlackMessageEventType::MessageChanged) => return Normalized::Ignored("an edit"),
        Some(SlackMessageEventType::MessageDeleted) => return Normalized::Ignored("a deletion"),
        // A classic bot's or an incoming webhook's post; it has a `bot_id`, so it got here
        // only as one of `allowed_bots`.
        Some(SlackMessageEventType::BotMessage) if event.sender.bot_id.is_some() => {}
        Some(_) => return Normalized::Ignored("a message subtype antler does not handle"),
    }
    // A `bot_message` names no user: its author is the bot.
    let author = event
        .sender
        .user
        .as_ref()
        .map(|u| u.0.as_str())
        .or_else(|| event.sender.bot_id.as_ref().map(|b| b.0.as_str()));
    let Some(user) = author else {
        return Normalized::Ignored("no author");
    };
    if bot == Some(user) {
        return Normalized::Ignored("the bot's own message");
    }
    let Some(channel) = event.origin.channel.as_ref().map(|c| c.0.as_str()) else {
        return Normalized::Ignored("no channel");
    };
    let text = event
        .content
        .as_ref()
        .and_then(|content| content.text.as_deref())
        .unwrap_or_default();
    let dm = event
        .origin
        .channel_type
        .as_ref()
        .is_some_and(|kind| kind.0 == "im");
    let ts = event.origin.ts.0.as_str();
    let thread_ts = event.origin.thread_ts.as_ref().map(|ts| ts.0.as_str());
    if !dm && bot.is_none() && text.contains("<@") {
        return Normalized::AwaitingIdentity;
    }
    let follow_up = if dm || bot.is_some_and(|bot| mentions(text, bot)) {
        false
    } else if thread_ts.is_some_and(|root| root != ts) {
        if !context.thread_follow_ups {
            return Normalized::Ignored("a thread reply without a mention (follow-ups are off)");
        }
        true
    } else {
        return Normalized::Ignored("a channel message that does not mention the bot");
    };
    let message = Message {
        team,
        channel,
        user,
        text,
        ts,
        thread_ts,
        dm,
        follow_up,
    };
    message.event(raw_event, bot, context)
}

/// The parts of a Slack message every kind of event shares.
struct Message<'a> {
    team: &'a str,
    channel: &'a str,
    user: &'a str,
    text: &'a str,
    ts: &'a str,
    thread_ts: Option<&'a str>,
    dm: bool,
    follow_up: bool,
}

impl Message<'_> {
    fn event(
        &self,
        raw_event: &serde_json::Value,
        bot: Option<&str>,
        context: &Context<'_>,
    ) -> Normalized {
        let text = readable(self.text, bot);
        let attachments = attachments(raw_event);
        if text.is_empty() && attachments.is_empty() {
            return Normalized::Ignored("no text or file");
        }
        // One Slack thread is one antler thread: in channels the key ends with the thread's
        // root ts (a new mention starts its own thread); in DMs only a threaded message has one.
        let conversation = match (self.dm, self.thread_ts) {
            (true, None) => ConversationKey::new(NAME, [self.team, self.channel]),
            (true, Some(root)) => ConversationKey::new(NAME, [self.team, self.channel, root]),
            (false, root) => {
                ConversationKey::new(NAME, [self.team, self.channel, root.unwrap_or(self.ts)])
            }
        };
        Normalized::Event(Box::new(InboundEvent {
            channel: NAME.to_owned(),
            // The message's ts, not the envelope's event_id: the inbox dedupes on
            // (conversation, event_id), and Slack gives one post a different event_id in each
            // delivery that concerns it (a retry keeps its id, but the `app_mention` and the
            // `message.channels` twin of one mention do not). The ts is the same in all of
            // them, so retries and twins collapse into one turn.
            event_id: self.ts.to_owned(),
            conversation,
            user: UserRef {
                id: self.user.to_owned(),
                name: None,
                admin: false,
                aliases: Vec::new(),
            },
            text,
            reply_to: Some(self.ts.to_owned()),
            received_at_ms: context.received_at_ms,
            attachments,
            group: !self.dm,
            chat: Some(self.channel.to_owned()),
            refused: false,
            follow_up: self.follow_up,
            unsupported: None,
            interactive: true,
            reply_context: Some(
                ReplyTo {
                    user: self.user.to_owned(),
                    response_url: None,
                    received_at_ms: context.received_at_ms,
                }
                .context(),
            ),
            media_group: None,
        }))
    }
}

/// Whether `text` mentions the user `bot` (`<@U…>` or the legacy `<@U…|name>`).
fn mentions(text: &str, bot: &str) -> bool {
    text.contains(&format!("<@{bot}>")) || text.contains(&format!("<@{bot}|"))
}

/// The files of a message as references to fetch later.
fn attachments(raw_event: &serde_json::Value) -> Vec<AttachmentRef> {
    let Some(files) = raw_event.get("files").and_then(|f| f.as_array()) else {
        return Vec::new();
    };
    files
        .iter()
        .filter_map(|file| RawFile::deserialize(file).ok())
        .filter_map(|file| {
            let url = file.url_private_download.or(file.url_private)?;
            Some(AttachmentRef {
                name: file.name.unwrap_or_else(|| "file".to_owned()),
                media_type: file.mimetype,
                size: file.size,
                source: AttachmentSource::Url { url },
            })
        })
        .collect()
}

/// Slack's message text as a person would read it: the bot's own mention removed, other
/// mentions, channels and links written out, `&amp; &lt; &gt;` decoded, trimmed.
pub(crate) fn readable(text: &str, bot: Option<&str>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find('<') {
        out.push_str(&rest[..start]);
        let Some(len) = rest[start..].find('>') else {
            out.push_str(&rest[start..]);
            rest = "";
            break;
        };
        let inner = &rest[start + 1..start + len];
        rest = &rest[start + len + 1..];
        let (target, label) = match inner.split_once('|') {
            Some((target, label)) => (target, Some(label)),
            None => (inner, None),
        };
        if let Some(user) = target.strip_prefix('@') {
            if Some(user) == bot {
                // The mention is how the user called the bot, not part of what they asked;
                // the spaces around it merge into one.
                if out.is_empty() || out.ends_with(char::is_whitespace) {
                    rest = rest.trim_start_matches([' ', '\t']);
                }
                continue;
            }
            out.push('@');
            out.push_str(label.unwrap_or(user));
        } else if let Some(channel) = target.strip_prefix('#') {
            out.push('#');
            out.push_str(label.unwrap_or(channel));
        } else if let Some(special) = target.strip_prefix('!') {
            // `<!here>`, `<!subteam^S1|@oncall>`, `<!date^…|fallback>`.
            match label {
                Some(label) if label.starts_with('@') => out.push_str(label),
                Some(label) => out.push_str(label),
                None => {
                    out.push('@');
                    out.push_str(special.split('^').next().unwrap_or(special));
                }
            }
        } else {
            match label {
                Some(label) if label != target && Some(label) != target.strip_prefix("mailto:") => {
                    out.push_str(label);
                    out.push_str(" (");
                    out.push_str(target);
                    out.push(')');
                }
                Some(label) => out.push_str(label),
                None => out.push_str(target.strip_prefix("mailto:").unwrap_or(target)),
            }
        }
    }
    out.push_str(rest);
    unescape(out.trim())
}

/// Decodes the three entities Slack escapes; `&amp;` last, so `&amp;lt;` stays `&lt;`.
fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// The fields of a slash-command request antler uses.
#[derive(Debug, Deserialize)]
pub(crate) struct SlashCommand {
    pub(crate) team_id: String,
    pub(crate) channel_id: String,
    pub(crate) user_id: String,
    #[serde(default)]
    pub(crate) user_name: Option<String>,
    #[serde(default)]
    pub(crate) text: String,
    pub(crate) trigger_id: String,
    /// Where the answer is posted, in the conversation the command ran in.
    #[serde(default)]
    pub(crate) response_url: Option<String>,
}

/// The gateway's own commands, which `/antler <word>` runs as `/<word>`.
const GATEWAY_COMMANDS: &[&str] = &["new", "help", "status", "stop"];

/// Normalizes a slash command: `/antler new` asks for `/new`, an empty one for `/help`, and
/// anything else is the prompt itself.
pub(crate) fn normalize_command(command: &SlashCommand, context: &Context<'_>) -> Normalized {
    if context
        .team_id
        .is_some_and(|wanted| wanted != command.team_id)
    {
        return Normalized::Ignored("from a workspace other than channels.slack.team_id");
    }
    let asked = command.text.trim();
    let text = if asked.is_empty() {
        "/help".to_owned()
    } else if GATEWAY_COMMANDS.contains(&asked.to_ascii_lowercase().as_str()) {
        format!("/{}", asked.to_ascii_lowercase())
    } else {
        unescape(asked)
    };
    // DM conversation ids start with D; everything else is read by others.
    let dm = command.channel_id.starts_with('D');
    Normalized::Event(Box::new(InboundEvent {
        channel: NAME.to_owned(),
        // One invocation, one trigger id: Slack does not retry a slash command.
        event_id: command.trigger_id.clone(),
        conversation: ConversationKey::new(NAME, [&command.team_id, &command.channel_id]),
        user: UserRef {
            id: command.user_id.clone(),
            name: command.user_name.clone().filter(|name| !name.is_empty()),
            admin: false,
            aliases: Vec::new(),
        },
        text,
        reply_to: None,
        received_at_ms: context.received_at_ms,
        attachments: Vec::new(),
        group: !dm,
        chat: Some(command.channel_id.clone()),
        refused: false,
        follow_up: false,
        unsupported: None,
        interactive: true,
        // The answer goes back through the command's response_url: the bot need not be a
        // member of the channel, and Slack shows it as configured (privately by default).
        reply_context: Some(
            ReplyTo {
                user: command.user_id.clone(),
                response_url: command.response_url.clone().filter(|url| !url.is_empty()),
                received_at_ms: context.received_at_ms,
            }
            .context(),
        ),
        media_group: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readable_text_strips_only_the_bots_mention() {
        let bot = Some("U0BOT");
        let cases = [
            (
                "<@U0BOT> restart web-api &amp; report",
                "restart web-api & report",
            ),
            ("please <@U0BOT|opsbot> restart", "please restart"),
            ("ask <@U123> and <@U9|ada>", "ask @U123 and @ada"),
            ("in <#C1|general> and <#C2>", "in #general and #C2"),
            (
                "see <https://x.io|the docs> or <https://y.io>",
                "see the docs (https://x.io) or https://y.io",
            ),
            ("mail <mailto:a@b.io|a@b.io>", "mail a@b.io"),
            ("<!here> &lt;b&gt; &amp;lt;", "@here <b> &lt;"),
            ("<!subteam^S1|@oncall> ping", "@oncall ping"),
            ("a < b unclosed <", "a < b unclosed <"),
            ("  <@U0BOT>  ", ""),
        ];
        for (text, expected) in cases {
            assert_eq!(readable(text, bot), expected, "{text}");
        }
        assert_eq!(readable("<@U0BOT> hi", None), "@U0BOT hi");
    }

    /// The reason `event` (in an envelope from team T1 to bot UBOT) is ignored, if it is.
    fn outcome(
        event: serde_json::Value,
        team_id: Option<&str>,
    ) -> Result<InboundEvent, &'static str> {
        let raw = serde_json::json!({
            "type": "event_callback", "team_id": "T1", "api_app_id": "A1", "event_id": "Ev1",
            "event_time": 1, "authorizations": [{"team_id": "T1", "user_id": "UBOT", "is_bot": true}],
            "event": event,
        });
        let slack_morphism::events::SlackPushEvent::EventCallback(callback) =
            serde_json::from_value(raw.clone()).unwrap()
        else {
            panic!("not a callback")
        };
        let context = Context {
            bot_user_id: None,
            team_id,
            thread_follow_ups: true,
            allowed_bots: &[String::from("B2")],
            received_at_ms: 0,
        };
        match normalize_callback(&callback, &raw["event"], &context) {
            Normalized::Event(event) => Ok(*event),
            Normalized::Ignored(reason) => Err(reason),
            Normalized::AwaitingIdentity => Err("awaiting the bot's identity"),
        }
    }

    #[test]
    fn without_any_bot_identity_a_channel_mention_waits_and_the_rest_is_handled() {
        // An envelope without `authorizations`, before auth.test answered.
        let normalize = |event: serde_json::Value| {
            let raw = serde_json::json!({
                "type": "event_callback", "team_id": "T1", "api_app_id": "A1",
                "event_id": "Ev1", "event_time": 1, "event": event,
            });
            let slack_morphism::events::SlackPushEvent::EventCallback(callback) =
                serde_json::from_value(raw.clone()).unwrap()
            else {
                panic!("not a callback")
            };
            let context = Context {
                bot_user_id: None,
                team_id: None,
                thread_follow_ups: false,
                allowed_bots: &[],
                received_at_ms: 0,
            };
            normalize_callback(&callback, &raw["event"], &context)
        };
        assert_eq!(
            normalize(message(
                serde_json::json!({"text": "<@U0BOT> restart web-api"})
            )),
            Normalized::AwaitingIdentity
        );
        assert!(matches!(
            normalize(message(serde_json::json!({"channel_type": "im"}))),
            Normalized::Event(_)
        ));
        assert_eq!(
            normalize(message(serde_json::json!({}))),
            Normalized::Ignored("a channel message that does not mention the bot")
        );
        let mention = serde_json::json!({
            "type": "app_mention", "channel": "C1", "user": "U1",
            "text": "<@U0BOT> hi", "ts": "2.0", "event_ts": "2.0"
        });
        assert!(matches!(normalize(mention), Normalized::Event(_)));
    }

    fn message(extra: serde_json::Value) -> serde_json::Value {
        let mut event = serde_json::json!({
            "type": "message", "channel": "C1", "channel_type": "channel", "user": "U1",
            "text": "hello", "ts": "2.0"
        });
        event
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        event
    }

    /// Slack's `bot_message`: "A message was posted by an integration" (classic bots,
    /// incoming webhooks): `subtype`, `bot_id`, `username`, no `user`.
    #[test]
    fn a_listed_classic_bot_or_webhook_is_answered_by_bot_id_or_app_id() {
        let bot_message = |bot: &str, app: Option<&str>| {
            let mut event = serde_json::json!({
                "type": "message", "subtype": "bot_message", "channel": "D1",
                "channel_type": "im", "text": "deploy failed", "ts": "3.0",
                "bot_id": bot, "username": "jenkins"
            });
            if let Some(app) = app {
                event["app_id"] = app.into();
            }
            event
        };
        let classic = outcome(bot_message("B2", None), None).unwrap();
        assert_eq!(classic.user.id, "B2");
        assert_eq!(classic.text, "deploy failed");
        let mut by_app = bot_message("B9", Some("A7"));
        let context = Context {
            bot_user_id: None,
            team_id: None,
            thread_follow_ups: true,
            allowed_bots: &[String::from("A7")],
            received_at_ms: 0,
        };
        let raw = serde_json::json!({
            "type": "event_callback", "team_id": "T1", "api_app_id": "A1", "event_id": "Ev1",
            "event_time": 1, "event": by_app.take(),
        });
        let slack_morphism::events::SlackPushEvent::EventCallback(callback) =
            serde_json::from_value(raw.clone()).unwrap()
        else {
            panic!("not a callback")
        };
        let Normalized::Event(webhook) = normalize_callback(&callback, &raw["event"], &context)
        else {
            panic!("an incoming webhook listed by its app id")
        };
        assert_eq!(webhook.user.id, "B9");
        assert_eq!(
            outcome(bot_message("B3", Some("A3")), None),
            Err("written by a bot")
        );
    }

    #[test]
    fn an_allowed_bot_is_answered_like_a_person() {
        let event = outcome(
            message(serde_json::json!({"bot_id": "B2", "user": "U2BOT", "channel_type": "im"})),
            None,
        )
        .unwrap();
        assert_eq!(event.user.id, "U2BOT");
        assert_eq!(event.text, "hello");
    }

    #[test]
    fn each_ignored_message_is_ignored_for_its_own_reason() {
        let cases = [
            (
                message(serde_json::json!({})),
                "a channel message that does not mention the bot",
            ),
            (
                message(
                    serde_json::json!({"subtype": "message_changed", "hidden": true,
                    "message": {"text": "x", "user": "U1", "ts": "1.0"}}),
                ),
                "an edit",
            ),
            (
                message(
                    serde_json::json!({"subtype": "message_deleted", "hidden": true,
                    "deleted_ts": "1.0"}),
                ),
                "a deletion",
            ),
            (
                message(serde_json::json!({"subtype": "channel_join"})),
                "a message subtype antler does not handle",
            ),
            (
                message(serde_json::json!({"bot_id": "B1"})),
                "written by a bot",
            ),
            (
                message(serde_json::json!({"bot_id": "B2", "user": "UBOT",
                    "channel_type": "im"})),
                "the bot's own message",
            ),
            (
                message(serde_json::json!({"user": "UBOT", "channel_type": "im"})),
                "the bot's own message",
            ),
            (
                message(serde_json::json!({"channel_type": "im", "text": " <@UBOT> "})),
                "no text or file",
            ),
        ];
        for (event, reason) in cases {
            assert_eq!(
                outcome(event.clone(), None).map(|_| ()),
                Err(reason),
                "{event}"
            );
        }
        assert_eq!(
            outcome(
                message(serde_json::json!({"text": "<@UBOT> hi"})),
                Some("T2")
            )
            .map(|_| ()),
            Err("from a workspace other than channels.slack.team_id")
        );
        let follow_up =
            outcome(message(serde_json::json!({"thread_ts": "1.0"})), Some("T1")).unwrap();
        assert!(follow_up.follow_up);
        assert_eq!(follow_up.conversation.as_str(), "slack:T1:C1:1.0");
        // A thread's root is not a reply in it.
        assert!(outcome(message(serde_json::json!({"thread_ts": "2.0"})), None).is_err());
        let broadcast = outcome(
            message(
                serde_json::json!({"subtype": "thread_broadcast", "thread_ts": "1.0",
                "text": "<@UBOT> look"}),
            ),
            None,
        )
        .unwrap();
        assert_eq!(
            (broadcast.text.as_str(), broadcast.follow_up),
            ("look", false)
        );
    }
}
