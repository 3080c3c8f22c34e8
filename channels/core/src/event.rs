//! The normalized messages that cross the channel boundary.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Where a reply goes: `<channel>:<segments...>`, e.g. `telegram:123` or `slack:T1:C2:1712.5`.
///
/// The first segment is always the channel name; the rest is the channel's business
/// (docs/architecture.md, "Conversations and threads").
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ConversationKey(String);

impl ConversationKey {
    /// Joins a channel name and its segments with `:`.
    #[must_use]
    pub fn new<I, S>(channel: &str, segments: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut key = channel.to_owned();
        for segment in segments {
            key.push(':');
            key.push_str(segment.as_ref());
        }
        Self(key)
    }

    /// The whole key.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The channel this conversation lives on.
    #[must_use]
    pub fn channel(&self) -> &str {
        self.0.split(':').next().unwrap_or_default()
    }
}

impl From<String> for ConversationKey {
    /// A whole key as [`ConversationKey::as_str`] gave it (read back from a store).
    fn from(key: String) -> Self {
        Self(key)
    }
}

impl fmt::Display for ConversationKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who wrote a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserRef {
    /// The platform's user id (memory is keyed by channel + this).
    pub id: String,
    /// A display name when the platform gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The channel counts this user as an operator (its `admins` list, an admin token).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub admin: bool,
    /// Other ids the platform knows this user by (Feishu's `user_id` beside the `open_id`):
    /// an allowlist naming any of them names the user.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
}

impl UserRef {
    /// The user's id and aliases.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.id.as_str()).chain(self.aliases.iter().map(String::as_str))
    }
}

/// One message addressed to the bot, normalized from any platform.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InboundEvent {
    /// The channel name (`api`, `telegram`, ...).
    pub channel: String,
    /// The platform's id for this delivery (update_id, event_id, interaction id, message_id):
    /// the dedupe key, unique within the channel.
    pub event_id: String,
    /// Where the reply goes.
    pub conversation: ConversationKey,
    /// The author.
    pub user: UserRef,
    /// The text, with the bot's own mention removed.
    pub text: String,
    /// The platform message to reply to, when the platform threads replies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    /// When antler received it, in milliseconds since the Unix epoch.
    pub received_at_ms: u64,
    /// Files sent with the message, as references: the turn fetches them, never the ack.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<AttachmentRef>,
    /// It was written in a group chat, where others read the answer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub group: bool,
    /// The platform's id of the chat it was written in (Telegram chat id, Slack or Discord
    /// channel id, Feishu chat id), as the channel's `allowed_chats` names it; `None` where the
    /// platform has no such thing (the API channel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat: Option<String>,
    /// Set by antler's access check, never by a channel: the author may not use the bot, so
    /// the turn answers with a refusal naming their user id instead of running anything.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub refused: bool,
    /// The bot was not addressed: a message in a thread it takes part in (a Slack thread it
    /// answered in). It is accepted only into a conversation that already exists, that is
    /// where the bot was addressed before; anywhere else it is dropped unstored.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub follow_up: bool,
    /// The message is of a kind antler cannot read (a sticker, a voice note, a location), named
    /// here as the user would call it. The turn answers that it is not supported, and nothing
    /// runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unsupported: Option<String>,
    /// Someone waits for the answer as it is written (a chat window, a streaming client).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interactive: bool,
    /// What the channel needs to answer this message that must stay secret (a Discord
    /// interaction token): stored with the message and handed back on its replies
    /// ([`OutboundMessage::reply_context`]), never shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_context: Option<ReplyContext>,
    /// The message is one of several sent together as one (a Telegram album: each photo is an
    /// update of its own, sharing a `media_group_id`): the parts that arrive together are
    /// answered in one turn, with all their files and the caption.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_group: Option<String>,
}

/// A channel's private reply context: opaque to antler, which stores it with the message and
/// gives it back on every reply to it. It may hold a credential (a Discord interaction token
/// lives 15 minutes and lets anyone holding it post in the conversation), so its `Debug` shows
/// nothing of it and it must never be logged, put in an error or shown to an API client.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ReplyContext(String);

impl ReplyContext {
    /// Wraps the channel's text.
    #[must_use]
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    /// The channel's text: for the channel that made it, to answer with.
    #[must_use]
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ReplyContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ReplyContext(***)")
    }
}

/// A file that came with a message, as the platform names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachmentRef {
    /// The file name the user gave it (untrusted: made safe before it names a file).
    pub name: String,
    /// Its media type, when the platform says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// Its size in bytes, when the platform says (checked again while fetching).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Where its bytes are.
    pub source: AttachmentSource,
}

/// Where an attachment's bytes are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AttachmentSource {
    /// A platform file id, fetched through [`crate::Channel::fetch_attachment`].
    Platform {
        /// The platform's id for the file.
        id: String,
    },
    /// A URL, fetched through [`crate::Channel::fetch_attachment`] (with the bot's
    /// credentials where the platform needs them).
    Url {
        /// The URL.
        url: String,
    },
    /// The bytes themselves, sent inline (the API channel), base64-encoded.
    Inline {
        /// Standard base64.
        data_base64: String,
    },
}

/// A group chat that became another chat, as the platform announced it (a Telegram group
/// upgraded to a supergroup gets a new chat id): its conversation, its memory and its place in
/// the allowlists move to the new chat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMove {
    /// The conversation of the chat that is gone.
    pub from: ConversationKey,
    /// Its platform chat id, as `allowed_chats` names it.
    pub from_chat: String,
    /// The conversation of the chat that continues it.
    pub to: ConversationKey,
    /// Its platform chat id.
    pub to_chat: String,
    /// Who made the change (the platform user id), the new conversation's owner when the old
    /// one had none.
    pub by: String,
}

/// One message for a channel to deliver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutboundMessage {
    /// A key that is the same every time this exact message is (re)tried, so a platform or
    /// receiver that supports idempotency can drop a duplicate.
    pub idempotency_key: String,
    /// Where it goes.
    pub conversation: ConversationKey,
    /// The antler thread it answers.
    pub thread_id: String,
    /// Markdown text.
    pub text: String,
    /// The platform message it replies to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    /// Files delivered with the text, after it ([`crate::Channel::send_file`]); a channel that
    /// cannot send files gets their names appended to the text instead.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<OutboundFile>,
    /// The answered message's [`InboundEvent::reply_context`], for the channel alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_context: Option<ReplyContext>,
    /// Messages with buttons sent after the text and the files, one message each (a tool
    /// call waiting for approval, with Approve and Deny).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prompts: Vec<Prompt>,
}

/// A message with buttons under it: its own message, so that a press can replace it (the
/// decision shown, the buttons gone) without touching the rest of the reply. A channel that
/// cannot show buttons ([`crate::Capabilities::buttons`]) sends its text alone, which says how
/// to answer in words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prompt {
    /// Markdown text.
    pub text: String,
    /// The buttons, in one row, under the prompt's last part.
    pub buttons: Vec<Button>,
}

/// A button. Pressing it comes back as a [`Press`] carrying its `action`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Button {
    /// What it says (plain text).
    pub label: String,
    /// What pressing it does, as antler reads it back (`approve:k3x9p2ab`): ASCII, at most
    /// [`Button::MAX_ACTION_BYTES`] bytes, which every platform carries as it is.
    pub action: String,
    /// How it looks.
    pub style: ButtonStyle,
}

impl Button {
    /// The longest action: Telegram's `callback_data` holds 1-64 bytes.
    pub const MAX_ACTION_BYTES: usize = 64;
}

/// How a button looks, where the platform has styles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ButtonStyle {
    /// The expected choice (Slack `primary`, Discord Success, Feishu `primary`).
    Primary,
    /// A destructive or refusing choice (Slack and Feishu `danger`, Discord Danger).
    Danger,
}

/// Someone pressed one of the bot's buttons, normalized from any platform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Press {
    /// The channel name.
    pub channel: String,
    /// Where the button's message is.
    pub conversation: ConversationKey,
    /// Who pressed (its `admin` set by the channel, as for a message).
    pub user: UserRef,
    /// The platform's chat id (as `allowed_chats` names it).
    pub chat: Option<String>,
    /// The button's [`Button::action`], as it came back: untrusted.
    pub action: String,
    /// The platform's id of the message the button is on.
    pub message_id: String,
    /// What the channel needs to answer this press (a callback query id, an interaction
    /// token, a `response_url`): secret, never shown or logged.
    pub answer_context: Option<ReplyContext>,
}

/// How antler answers a [`Press`] ([`crate::Channel::answer_press`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PressAnswer {
    /// Shown to the presser alone where the platform can (an ephemeral message, a toast, a
    /// callback alert): what happened, or why nothing did.
    pub notice: String,
    /// The button's message as it reads now, in Markdown, its buttons removed (the decision:
    /// who and when). `None`: the message stays as it is, buttons and all (a refusal).
    pub update: Option<String>,
    /// This press took the decision; `false` for a refusal, or for a decision that stood
    /// before (shown as information rather than success where the platform tells them apart).
    pub decided_now: bool,
}

/// A file to deliver with a reply: a file the agent made in its thread's `outputs` folder.
///
/// The outbox keeps the file's name, not its bytes, which keeps outbox records small however
/// large the files are. Delivery opens it beneath the thread's outputs folder (links refused,
/// checked on the open file) and hands the channel that open file ([`crate::FileContent`]), so
/// a channel never opens a path the sandbox could have swapped for a link. A file changed
/// before delivery is delivered as it is then; a file gone or refused by then is not sent.
///
/// Records written before the name was all that was kept also carry the host path; it is
/// ignored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboundFile {
    /// Its path under the thread's `outputs` folder (`report.csv`, `charts/cpu.png`): unique
    /// within the thread, and what the API channel's download route takes.
    pub name: String,
    /// Its media type (`text/csv`).
    pub media_type: String,
    /// Its size in bytes when it was presented.
    pub size: u64,
}

impl OutboundFile {
    /// The last segment of [`OutboundFile::name`]: what the file is called in a chat.
    #[must_use]
    pub fn file_name(&self) -> &str {
        self.name.rsplit('/').next().unwrap_or(&self.name)
    }
}

/// Proof of delivery: the platform's id for the message it created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// The platform's message id.
    pub platform_message_id: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversation_key_joins_segments_and_knows_its_channel() {
        let key = ConversationKey::new("slack", ["T1", "C2", "1712.5"]);
        assert_eq!(key.as_str(), "slack:T1:C2:1712.5");
        assert_eq!(key.channel(), "slack");
        assert_eq!(key.to_string(), "slack:T1:C2:1712.5");
    }

    #[test]
    fn an_event_stored_before_chat_and_refused_existed_still_loads() {
        let old = r#"{"channel":"telegram","event_id":"7","conversation":"telegram:42",
            "user":{"id":"u"},"text":"hi","received_at_ms":1}"#;
        let event: InboundEvent = serde_json::from_str(old).unwrap();
        assert_eq!(event.chat, None);
        assert!(!event.refused);
        let back = serde_json::to_value(&event).unwrap();
        assert!(back.get("chat").is_none() && back.get("refused").is_none());
        assert!(event.reply_context.is_none() && back.get("reply_context").is_none());
    }

    #[test]
    fn a_reply_context_is_stored_but_never_shown() {
        let context = ReplyContext::new("interaction-token-SECRET");
        assert_eq!(format!("{context:?}"), "ReplyContext(***)");
        assert_eq!(
            serde_json::to_value(&context).unwrap(),
            "interaction-token-SECRET"
        );
        assert_eq!(context.expose(), "interaction-token-SECRET");
    }
}
