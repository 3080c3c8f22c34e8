//! Telegram `Update` → antler's normalized message, plus the facts the shared group-addressing
//! rule needs (is it private, does it mention the bot, reply to it, carry a command for it).
//!
//! Pure: no I/O, no clock beyond what the caller passes, so every recorded payload in
//! `tests/fixtures` is a test.
//!
//! Telegram's entity offsets are UTF-16 code units; teloxide's `MessageEntityRef` turns them
//! into byte ranges of the Rust string, which is what the stripping below slices by.

use antler_channel::{
    AttachmentRef, AttachmentSource, ChatMove, ConversationKey, InboundEvent, Press, ReplyContext,
    UserRef,
};
use serde_json::{Map, Value};
use teloxide_core::types::{
    CallbackQuery, ChatMigration, Document, MediaKind, Message, MessageEntity, MessageEntityKind,
    MessageEntityRef, MessageKind, PhotoSize, Update, UpdateKind, User,
};

/// The bot as Telegram knows it (from `getMe`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BotIdentity {
    /// Its user id (also the token's prefix before `:`).
    pub id: u64,
    /// Its username, without the `@`.
    pub username: String,
}

/// What the shared addressing rule ([`antler_channel::addressed`]) needs to know about a
/// message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressFacts {
    /// A private chat with the bot.
    pub private: bool,
    /// An @mention of the bot (by username, or a text mention of its user).
    pub mentions_bot: bool,
    /// A reply to one of the bot's own messages.
    pub replies_to_bot: bool,
    /// It starts with a command.
    pub command: bool,
    /// The bot the command names (`/status@opsbot_bot` names `opsbot_bot`).
    pub command_target: Option<String>,
    /// It @mentions some username (perhaps the bot's, when its username is not known yet).
    pub names_someone: bool,
}

impl AddressFacts {
    /// Whether the message is for `me`, by the rule every platform shares.
    pub fn addressed(&self, me: &BotIdentity) -> bool {
        antler_channel::addressed(&antler_channel::Addressing {
            is_group: !self.private,
            mentions_bot: self.mentions_bot,
            replies_to_bot: self.replies_to_bot,
            is_command: self.command,
            command_target: self.command_target.as_deref(),
            bot_username: &me.username,
        })
    }

    /// Whether a group message that is not addressed to `me` might be, had `getMe` told the
    /// bot's username: it @mentions a username or names a command's bot.
    pub fn may_be_addressed(&self, me: &BotIdentity) -> bool {
        me.username.is_empty()
            && !self.addressed(me)
            && (self.names_someone || self.command_target.is_some())
    }
}

/// A message for antler, before the addressing rule has decided whether it is a turn.
#[derive(Debug, Clone, PartialEq)]
pub struct Incoming {
    /// The normalized message.
    pub event: InboundEvent,
    /// The facts for the addressing rule.
    pub facts: AddressFacts,
    /// The chat's id.
    pub chat_id: i64,
    /// The forum topic it belongs to, when it is a topic message.
    pub topic: Option<i32>,
}

/// What an update means to antler.
#[derive(Debug, Clone, PartialEq)]
pub enum Normalized {
    /// A message someone wrote.
    Message(Box<Incoming>),
    /// Someone pressed a button of the bot's (a `callback_query`).
    Press(Box<Press>),
    /// The group became a supergroup, with a new chat id (`migrate_to_chat_id` in the old
    /// group, `migrate_from_chat_id` in the new one: both arrive, and either says it).
    Moved(ChatMove),
    /// Nothing to do; the reason is for the debug log.
    Ignored(&'static str),
}

/// The update keys that carry a message.
const MESSAGE_KEYS: [&str; 4] = [
    "message",
    "edited_message",
    "channel_post",
    "edited_channel_post",
];

/// The message fields antler reads; everything else in a message teloxide could not model is
/// left out when it is read again ([`read_update`]).
const READ_FIELDS: [&str; 17] = [
    "message_id",
    "message_thread_id",
    "is_topic_message",
    "date",
    "chat",
    "from",
    "sender_chat",
    "is_automatic_forward",
    "text",
    "caption",
    "media_group_id",
    "forum_topic_created",
    "migrate_to_chat_id",
    "migrate_from_chat_id",
    "photo",
    "document",
    "reply_to_message",
];

/// The fields of a chat or user antler reads.
const PARTY_FIELDS: [&str; 8] = [
    "id",
    "type",
    "is_bot",
    "title",
    "username",
    "first_name",
    "last_name",
    "is_forum",
];

/// An update whose message even [`read_update`] cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Telegram update {update_id} carries a message antler cannot read: {reason}")]
pub struct UnreadableUpdate {
    /// The update's id.
    pub update_id: u32,
    /// What failed to parse.
    pub reason: String,
}

/// Reads an update from its JSON. A message teloxide cannot fully model (a newer entity type,
/// `external_reply`, an audio without `mime_type`, ...) comes out of it as an empty
/// `MessageKind::Empty`, or a captioned one without its caption (paid media), or the whole
/// update as [`UpdateKind::Error`]; such a message is read again from the fields antler needs (chat,
/// sender, text or caption, the entities teloxide knows, photo or document, reply target,
/// topic), the rest ignored. A caption whose media is left out is read as the text.
///
/// `Ok(None)`: not an update at all (no `update_id`).
pub fn read_update(raw: &Value) -> Result<Option<Update>, UnreadableUpdate> {
    let Ok(update) = update_from(raw) else {
        return Ok(None);
    };
    let lost = match &update.kind {
        UpdateKind::Error(_) => true,
        UpdateKind::Message(message)
        | UpdateKind::EditedMessage(message)
        | UpdateKind::ChannelPost(message)
        | UpdateKind::EditedChannelPost(message) => {
            matches!(message.kind, MessageKind::Empty {})
                || (message.text().is_none() && message.caption().is_none() && {
                    let fields = MESSAGE_KEYS.iter().find_map(|key| raw.get(*key));
                    fields.is_some_and(|m| m.get("text").is_some() || m.get("caption").is_some())
                })
        }
        _ => false,
    };
    if !lost {
        return Ok(Some(update));
    }
    let mut rebuilt = Map::new();
    rebuilt.insert("update_id".to_owned(), Value::from(update.id.0));
    if let Some(message) = MESSAGE_KEYS
        .iter()
        .find_map(|key| raw.get(*key).map(|message| (*key, message)))
        .map(|(key, message)| {
            let readable = readable(message, true);
            rebuilt.insert(key.to_owned(), readable.clone());
            readable
        })
        .or_else(|| {
            // A press on a message teloxide cannot model: its message is read the same way.
            let mut query = raw.get("callback_query")?.as_object()?.clone();
            let readable = readable(query.get("message")?, false);
            query.insert("message".to_owned(), readable.clone());
            rebuilt.insert("callback_query".to_owned(), Value::Object(query));
            Some(readable)
        })
    {
        if let Err(e) = serde_json::from_value::<Message>(message) {
            return Err(UnreadableUpdate {
                update_id: update.id.0,
                reason: e.to_string(),
            });
        }
    } else {
        // An update kind antler does not ask for: nothing of it is read.
        return Ok(Some(update));
    }
    match update_from(&Value::Object(rebuilt)) {
        Ok(update) if !matches!(update.kind, UpdateKind::Error(_)) => Ok(Some(update)),
        Ok(_) | Err(_) => Err(UnreadableUpdate {
            update_id: update.id.0,
            reason: "the message's readable fields still do not parse".to_owned(),
        }),
    }
}

/// `raw` as teloxide's [`Update`]. Through text: teloxide's `UpdateKind` reads its key as a
/// borrowed string, which a [`Value`] cannot lend, so `from_value` would make every update an
/// error.
fn update_from(raw: &Value) -> Result<Update, serde_json::Error> {
    serde_json::from_str(&raw.to_string())
}

/// The fields of `message` antler reads, each kept only if teloxide can model it; with
/// `reply`, the message it replies to as well (read the same way, or left out).
fn readable(message: &Value, reply: bool) -> Value {
    let mut out = Map::new();
    let Some(fields) = message.as_object() else {
        return Value::Object(out);
    };
    for name in READ_FIELDS {
        let Some(value) = fields.get(name) else {
            continue;
        };
        let kept = match name {
            "chat" | "from" | "sender_chat" => Some(only(value, &PARTY_FIELDS)),
            "photo" => serde_json::from_value::<Vec<PhotoSize>>(value.clone())
                .is_ok()
                .then(|| value.clone()),
            "document" => serde_json::from_value::<Document>(value.clone())
                .is_ok()
                .then(|| value.clone()),
            "reply_to_message" if reply => {
                let replied = readable(value, false);
                serde_json::from_value::<Message>(replied.clone())
                    .is_ok()
                    .then_some(replied)
            }
            "reply_to_message" => None,
            _ => Some(value.clone()),
        };
        if let Some(kept) = kept {
            out.insert(name.to_owned(), kept);
        }
    }
    for name in ["entities", "caption_entities"] {
        if let Some(Value::Array(entities)) = fields.get(name) {
            let known: Vec<Value> = entities
                .iter()
                .filter(|entity| serde_json::from_value::<MessageEntity>((*entity).clone()).is_ok())
                .cloned()
                .collect();
            out.insert(name.to_owned(), Value::Array(known));
        }
    }
    let has_media = out.contains_key("photo") || out.contains_key("document");
    if !has_media && !out.contains_key("text") {
        // The media is not modelled; its caption is what the person wrote.
        if let Some(caption) = out.remove("caption") {
            out.insert("text".to_owned(), caption);
            if let Some(entities) = out.remove("caption_entities") {
                out.insert("entities".to_owned(), entities);
            }
        }
    }
    Value::Object(out)
}

/// `value` (an object) with only the `keys` it has.
fn only(value: &Value, keys: &[&str]) -> Value {
    let mut out = Map::new();
    if let Some(fields) = value.as_object() {
        for key in keys {
            if let Some(field) = fields.get(*key) {
                out.insert((*key).to_owned(), field.clone());
            }
        }
    }
    Value::Object(out)
}

/// Normalizes `update`, received at `received_at_ms`, for the bot `me`.
pub fn normalize(update: &Update, me: &BotIdentity, received_at_ms: u64) -> Normalized {
    let message = match &update.kind {
        UpdateKind::Message(message) => message,
        UpdateKind::EditedMessage(_) => return Normalized::Ignored("an edit"),
        UpdateKind::ChannelPost(_) | UpdateKind::EditedChannelPost(_) => {
            return Normalized::Ignored("a channel post");
        }
        UpdateKind::CallbackQuery(query) => return press(query),
        _ => return Normalized::Ignored("not a message"),
    };
    if let Some(migration) = message.chat_migration() {
        let (from, to) = match migration {
            ChatMigration::To { chat_id } => (message.chat.id.0, chat_id.0),
            ChatMigration::From { chat_id } => (chat_id.0, message.chat.id.0),
        };
        return Normalized::Moved(ChatMove {
            from: ConversationKey::new("telegram", [from.to_string()]),
            from_chat: from.to_string(),
            to: ConversationKey::new("telegram", [to.to_string()]),
            to_chat: to.to_string(),
            by: message
                .from
                .as_ref()
                .map_or_else(|| to.to_string(), |user| user.id.0.to_string()),
        });
    }
    if message.is_automatic_forward() {
        return Normalized::Ignored("a linked channel's post forwarded to its discussion group");
    }
    let Some(user) = author(message) else {
        return Normalized::Ignored("written by a bot, or by no one");
    };
    let (text, raw_entities) = match (message.text(), message.caption()) {
        (Some(text), _) => (text, message.entities().unwrap_or_default()),
        (None, Some(caption)) => (caption, message.caption_entities().unwrap_or_default()),
        (None, None) => ("", &[][..]),
    };
    // teloxide's `MessageEntityRef::parse` panics on an offset that splits a character's
    // UTF-16 pair, and `MessageEntityRef::text` on one past the text's end: an entity that
    // does not start and end on the text's character boundaries is dropped.
    let kept = on_char_boundaries(text, raw_entities);
    let entities = MessageEntityRef::parse(text, &kept);
    let attachments = attachments(message);
    let unsupported = if text.trim().is_empty() && attachments.is_empty() {
        match unsupported(message) {
            Some(kind) => Some(kind.to_owned()),
            None => return Normalized::Ignored("no text or file (a service message, ...)"),
        }
    } else {
        None
    };

    let mentions: Vec<&MessageEntityRef<'_>> = entities
        .iter()
        .filter(|entity| mentions(entity, me))
        .collect();
    let command = entities.iter().find(|entity| {
        matches!(entity.kind(), MessageEntityKind::BotCommand) && entity.start() == 0
    });
    let command_target = command.and_then(|c| c.text().split_once('@').map(|(_, bot)| bot));
    let command_for_other_bot =
        command_target.is_some_and(|bot| !bot.eq_ignore_ascii_case(&me.username));
    // A topic's messages all "reply" to its creation message; that is not a reply to the bot.
    let replies_to_bot = message.reply_to_message().is_some_and(|replied| {
        replied.forum_topic_created().is_none()
            && replied
                .from
                .as_ref()
                .is_some_and(|author| author.id.0 == me.id)
    });
    let facts = AddressFacts {
        private: message.chat.is_private(),
        mentions_bot: !mentions.is_empty(),
        replies_to_bot,
        command: command.is_some(),
        command_target: command_target.map(str::to_owned),
        names_someone: entities
            .iter()
            .any(|entity| matches!(entity.kind(), MessageEntityKind::Mention)),
    };

    let mut cuts: Vec<std::ops::Range<usize>> = mentions.iter().map(|m| m.range()).collect();
    if let (Some(command), Some(_), false) = (command, command_target, command_for_other_bot) {
        // "/status@opsbot_bot prod" reads "/status prod".
        if let Some(at) = command.text().find('@') {
            cuts.push(command.start() + at..command.end());
        }
    }
    let text = without(text, cuts);

    let chat_id = message.chat.id.0;
    let topic = message
        .is_topic_message
        .then(|| message.thread_id.map(|thread| thread.0.0))
        .flatten();
    let conversation = match topic {
        Some(topic) => ConversationKey::new("telegram", [chat_id.to_string(), topic.to_string()]),
        None => ConversationKey::new("telegram", [chat_id.to_string()]),
    };
    let event = InboundEvent {
        channel: "telegram".to_owned(),
        event_id: update.id.0.to_string(),
        conversation,
        user,
        text,
        reply_to: Some(message.id.0.to_string()),
        received_at_ms,
        attachments,
        group: !message.chat.is_private(),
        interactive: true,
        reply_context: None,
        chat: Some(chat_id.to_string()),
        refused: false,
        follow_up: false,
        unsupported,
        media_group: message.media_group_id().map(|group| group.0.clone()),
    };
    Normalized::Message(Box::new(Incoming {
        event,
        facts,
        chat_id,
        topic,
    }))
}

/// A press of one of the bot's inline keyboard buttons, in the conversation its message is in
/// (its topic too). A press on an inline-mode message (no chat message), without data, or by
/// a bot is ignored.
fn press(query: &CallbackQuery) -> Normalized {
    let (Some(message), Some(action)) = (&query.message, &query.data) else {
        return Normalized::Ignored("a button press without a chat message or data");
    };
    if query.from.is_bot {
        return Normalized::Ignored("a button pressed by a bot");
    }
    let chat_id = message.chat().id.0;
    let topic = message
        .regular_message()
        .filter(|message| message.is_topic_message)
        .and_then(|message| message.thread_id.map(|thread| thread.0.0));
    let conversation = match topic {
        Some(topic) => ConversationKey::new("telegram", [chat_id.to_string(), topic.to_string()]),
        None => ConversationKey::new("telegram", [chat_id.to_string()]),
    };
    Normalized::Press(Box::new(Press {
        channel: "telegram".to_owned(),
        conversation,
        user: UserRef {
            id: query.from.id.0.to_string(),
            name: Some(display_name(&query.from)),
            admin: false,
            aliases: Vec::new(),
        },
        chat: Some(chat_id.to_string()),
        action: action.clone(),
        message_id: message.id().0.to_string(),
        answer_context: Some(ReplyContext::new(query.id.0.clone())),
    }))
}

/// Whether `entity` mentions the bot.
/// The entities whose UTF-16 start and end both fall on a character boundary of `text`.
fn on_char_boundaries(text: &str, entities: &[MessageEntity]) -> Vec<MessageEntity> {
    let boundaries: Vec<usize> = std::iter::once(0)
        .chain(text.chars().scan(0, |units, c| {
            *units += c.len_utf16();
            Some(*units)
        }))
        .collect();
    let is_boundary = |units: usize| boundaries.binary_search(&units).is_ok();
    entities
        .iter()
        .filter(|entity| {
            entity
                .offset
                .checked_add(entity.length)
                .is_some_and(|end| is_boundary(entity.offset) && is_boundary(end))
        })
        .cloned()
        .collect()
}

fn mentions(entity: &MessageEntityRef<'_>, me: &BotIdentity) -> bool {
    match entity.kind() {
        MessageEntityKind::Mention => entity
            .text()
            .strip_prefix('@')
            .is_some_and(|name| name.eq_ignore_ascii_case(&me.username)),
        MessageEntityKind::TextMention { user } => user.id.0 == me.id,
        _ => false,
    }
}

/// `text` without the byte ranges `cuts`, with the spaces around each cut merged.
fn without(text: &str, mut cuts: Vec<std::ops::Range<usize>>) -> String {
    if cuts.is_empty() {
        return text.trim().to_owned();
    }
    cuts.sort_by_key(|range| range.start);
    let mut out = String::with_capacity(text.len());
    let mut from = 0;
    for cut in cuts {
        if cut.start < from || cut.end > text.len() {
            continue;
        }
        if let Some(kept) = text.get(from..cut.start) {
            out.push_str(kept);
        }
        from = cut.end;
        // One space where the mention was, not two.
        if out.ends_with(' ') && text.get(from..).is_some_and(|rest| rest.starts_with(' ')) {
            from += 1;
        }
    }
    if let Some(rest) = text.get(from..) {
        out.push_str(rest);
    }
    out.trim().to_owned()
}

/// A message someone wrote that antler cannot read yet, named as they would call it: the turn
/// tells them so instead of leaving them waiting. `None` for service messages and the rest.
fn unsupported(message: &Message) -> Option<&'static str> {
    let MessageKind::Common(common) = &message.kind else {
        return None;
    };
    Some(match common.media_kind {
        MediaKind::Sticker(_) => "sticker",
        MediaKind::Voice(_) => "voice message",
        MediaKind::VideoNote(_) => "video message",
        MediaKind::Video(_) => "video",
        MediaKind::Audio(_) => "audio",
        MediaKind::Animation(_) => "GIF",
        MediaKind::Location(_) | MediaKind::Venue(_) => "location",
        MediaKind::Contact(_) => "contact",
        MediaKind::Poll(_) => "poll",
        _ => return None,
    })
}

/// Who wrote `message`: a person, or the chat a person wrote on behalf of (`sender_chat`: an
/// anonymous group admin writes as the group, `from` then being the fake GroupAnonymousBot; a
/// user posting as their channel writes as that channel, `from` being Channel_Bot). The chat is
/// the author the access rules see. `None` for a bot's own message.
fn author(message: &Message) -> Option<UserRef> {
    if let Some(chat) = message.sender_chat.as_ref() {
        let name = chat
            .title()
            .or(chat.username())
            .map_or_else(|| chat.id.0.to_string(), str::to_owned);
        return Some(UserRef {
            id: chat.id.0.to_string(),
            name: Some(name),
            admin: false,
            aliases: Vec::new(),
        });
    }
    let from = message.from.as_ref().filter(|from| !from.is_bot)?;
    Some(UserRef {
        id: from.id.0.to_string(),
        name: Some(display_name(from)),
        admin: false,
        aliases: Vec::new(),
    })
}

/// The author's name as people see it.
fn display_name(user: &User) -> String {
    match &user.last_name {
        Some(last) => format!("{} {last}", user.first_name),
        None => user.first_name.clone(),
    }
}

/// The message's photo (its largest size) or document, as references.
fn attachments(message: &Message) -> Vec<AttachmentRef> {
    let mut found = Vec::new();
    if let Some(largest) = message.photo().and_then(<[_]>::last) {
        found.push(AttachmentRef {
            name: format!("photo_{}.jpg", largest.file.unique_id),
            media_type: Some("image/jpeg".to_owned()),
            size: Some(u64::from(largest.file.size)),
            source: AttachmentSource::Platform {
                id: largest.file.id.to_string(),
            },
        });
    }
    if let Some(document) = message.document() {
        found.push(AttachmentRef {
            name: document
                .file_name
                .clone()
                .unwrap_or_else(|| format!("document_{}", document.file.unique_id)),
            media_type: document.mime_type.as_ref().map(ToString::to_string),
            size: Some(u64::from(document.file.size)),
            source: AttachmentSource::Platform {
                id: document.file.id.to_string(),
            },
        });
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> BotIdentity {
        BotIdentity {
            id: 7_000_000_001,
            username: "opsbot_bot".to_owned(),
        }
    }

    fn fixture(name: &str) -> Update {
        serde_json::from_str(&antler_testkit::telegram::fixture(name)).unwrap()
    }

    fn incoming(name: &str) -> Incoming {
        match normalize(&fixture(name), &me(), 42) {
            Normalized::Message(incoming) => *incoming,
            other => panic!("{name} is not a message: {other:?}"),
        }
    }

    /// Bot API, Message: "media_group_id: The unique identifier of a media message group this
    /// message belongs to"; each photo of an album is an update of its own, the caption on one.
    #[test]
    fn the_parts_of_an_album_name_their_group() {
        let first = incoming("tg_album_1").event;
        let second = incoming("tg_album_2").event;
        assert_eq!(first.media_group.as_deref(), Some("13594835521566473"));
        assert_eq!(second.media_group, first.media_group);
        assert_eq!(
            first.text,
            "compare the latency before and after the deploy"
        );
        assert_eq!(second.text, "");
        assert_eq!(
            second.attachments.len(),
            1,
            "a part without caption is a message"
        );
        assert_eq!(incoming("tg_photo_caption").event.media_group, None);
    }

    /// Bot API, Message: "migrate_to_chat_id: The group has been migrated to a supergroup with
    /// the specified identifier"; "migrate_from_chat_id: The supergroup has been migrated from a
    /// group with the specified identifier". Both announce the same move.
    #[test]
    fn a_group_upgraded_to_a_supergroup_is_a_move_either_way() {
        let expected = ChatMove {
            from: ConversationKey::new("telegram", ["-4004004004"]),
            from_chat: "-4004004004".to_owned(),
            to: ConversationKey::new("telegram", ["-1004004004004"]),
            to_chat: "-1004004004004".to_owned(),
            by: "5550001002".to_owned(),
        };
        for name in ["tg_migrate_to", "tg_migrate_from"] {
            match normalize(&fixture(name), &me(), 42) {
                Normalized::Moved(chat_move) => assert_eq!(chat_move, expected, "{name}"),
                other => panic!("{name}: {other:?}"),
            }
        }
    }

    /// Found by the `webhook_telegram` fuzz target: an entity reaching past the text made
    /// teloxide's `MessageEntityRef::text` panic.
    #[test]
    fn an_entity_past_the_end_of_the_text_is_dropped_not_a_panic() {
        let mut raw: Value =
            serde_json::from_str(&antler_testkit::telegram::fixture("tg_group_mention")).unwrap();
        raw["message"]["entities"] =
            serde_json::json!([{"offset": 0, "length": 111, "type": "mention"}]);
        let update = read_update(&raw).unwrap().unwrap();
        match normalize(&update, &me(), 42) {
            Normalized::Message(m) => assert!(!m.facts.mentions_bot),
            other => panic!("not a message: {other:?}"),
        }
    }

    /// Found by the `webhook_telegram` fuzz target: an offset inside 🚀's UTF-16 pair made
    /// teloxide's `MessageEntityRef::parse` panic ("Invalid utf-16 offset").
    #[test]
    fn an_entity_splitting_a_character_is_dropped_not_a_panic() {
        for (offset, length) in [(1, 12), (0, 1), (3, usize::MAX)] {
            let mut raw: Value =
                serde_json::from_str(&antler_testkit::telegram::fixture("tg_group_mention"))
                    .unwrap();
            raw["message"]["entities"] =
                serde_json::json!([{"offset": offset, "length": length, "type": "mention"}]);
            let update = read_update(&raw).unwrap().unwrap();
            match normalize(&update, &me(), 42) {
                Normalized::Message(m) => {
                    assert!(!m.facts.mentions_bot, "{offset}+{length}");
                    assert_eq!(m.event.text, "🚀 @opsbot_bot restart web-api");
                }
                other => panic!("not a message: {other:?}"),
            }
        }
    }

    #[test]
    fn a_private_text_is_a_message_from_its_author() {
        let m = incoming("tg_private_text");
        assert_eq!(m.event.event_id, "730100001");
        assert_eq!(m.event.conversation.as_str(), "telegram:5550001001");
        assert_eq!(m.event.user.id, "5550001001");
        assert_eq!(m.event.user.name.as_deref(), Some("Ada Ops"));
        assert_eq!(m.event.text, "status payments-api");
        assert_eq!(m.event.reply_to.as_deref(), Some("1201"));
        assert_eq!(m.event.received_at_ms, 42);
        assert!(!m.event.group && m.event.interactive);
        assert_eq!(m.event.chat.as_deref(), Some("5550001001"));
        assert_eq!(
            m.facts,
            AddressFacts {
                private: true,
                ..AddressFacts::default()
            }
        );
        assert!(m.facts.addressed(&me()));
        assert_eq!(m.topic, None);
    }

    #[test]
    fn a_group_mention_after_an_emoji_is_found_by_utf16_offset_and_stripped() {
        let m = incoming("tg_group_mention");
        assert!(m.facts.mentions_bot && !m.facts.private);
        assert_eq!(m.event.text, "🚀 restart web-api");
        assert_eq!(m.event.conversation.as_str(), "telegram:-1002200330044");
        assert!(m.event.group);
        assert_eq!(m.event.user.name.as_deref(), Some("Lin"));
    }

    #[test]
    fn a_command_for_this_bot_loses_its_suffix() {
        let m = incoming("tg_group_command");
        assert!(m.facts.command && m.facts.addressed(&me()));
        assert_eq!(m.facts.command_target.as_deref(), Some("opsbot_bot"));
        assert_eq!(m.event.text, "/status prod");

        let mut update = fixture("tg_group_command");
        let UpdateKind::Message(message) = &mut update.kind else {
            panic!("a message")
        };
        let other: Message = serde_json::from_value(serde_json::json!({
            "message_id": 89,
            "from": {"id": 5550001002u64, "is_bot": false, "first_name": "Lin"},
            "chat": {"id": -1002200330044i64, "title": "SRE on-call", "type": "supergroup"},
            "date": 1767225700,
            "text": "/status@other_bot prod",
            "entities": [{"offset": 0, "length": 17, "type": "bot_command"}]
        }))
        .unwrap();
        *message = other;
        let Normalized::Message(m) = normalize(&update, &me(), 0) else {
            panic!("still a message")
        };
        assert!(m.facts.command && !m.facts.addressed(&me()));
        assert_eq!(m.event.text, "/status@other_bot prod", "left as written");
    }

    #[test]
    fn a_reply_to_the_bot_is_seen_as_one() {
        let m = incoming("tg_reply_to_bot");
        assert!(m.facts.replies_to_bot && !m.facts.mentions_bot);
        assert_eq!(m.event.text, "and the error rate?");
    }

    #[test]
    fn a_forum_topic_is_its_own_conversation_and_its_root_is_not_a_reply_to_the_bot() {
        let m = incoming("tg_forum_topic");
        assert_eq!(m.topic, Some(400));
        assert_eq!(m.event.conversation.as_str(), "telegram:-1003300440055:400");
        assert!(m.facts.mentions_bot);
        assert!(!m.facts.replies_to_bot);
        assert_eq!(m.event.text, "tail logs worker");
    }

    #[test]
    fn a_captioned_photo_brings_its_largest_size() {
        let m = incoming("tg_photo_caption");
        assert_eq!(m.event.text, "what is this graph?");
        assert_eq!(
            m.event.attachments,
            [AttachmentRef {
                name: "photo_AQADlarge.jpg".into(),
                media_type: Some("image/jpeg".into()),
                size: Some(98123),
                source: AttachmentSource::Platform {
                    id: "AgACAgQAAxkBAAIBPhotoLarge".into()
                },
            }]
        );
    }

    #[test]
    fn a_document_keeps_its_name_type_and_size() {
        let m = incoming("tg_document");
        assert_eq!(m.event.text, "parse this");
        let file = &m.event.attachments[0];
        assert_eq!(file.name, "crash.log");
        assert_eq!(file.media_type.as_deref(), Some("text/plain"));
        assert_eq!(file.size, Some(20480));
        assert_eq!(
            file.source,
            AttachmentSource::Platform {
                id: "BQACAgQAAxkBAAIBDocument".into()
            }
        );
    }

    #[test]
    fn bots_edits_channel_posts_and_service_messages_are_ignored() {
        let text = antler_testkit::telegram::fixture("tg_private_text");
        let from_bot: Update =
            serde_json::from_str(&text.replacen("\"is_bot\": false", "\"is_bot\": true", 1))
                .unwrap();
        assert_eq!(
            normalize(&from_bot, &me(), 0),
            Normalized::Ignored("written by a bot, or by no one")
        );

        let edited: Update =
            serde_json::from_str(&text.replacen("\"message\"", "\"edited_message\"", 1)).unwrap();
        assert_eq!(normalize(&edited, &me(), 0), Normalized::Ignored("an edit"));
        let post: Update =
            serde_json::from_str(&text.replacen("\"message\"", "\"channel_post\"", 1)).unwrap();
        assert_eq!(
            normalize(&post, &me(), 0),
            Normalized::Ignored("a channel post")
        );

        let joined: Update = serde_json::from_value(serde_json::json!({
            "update_id": 1,
            "message": {
                "message_id": 5,
                "from": {"id": 1, "is_bot": false, "first_name": "A"},
                "chat": {"id": -5, "title": "g", "type": "group"},
                "date": 1,
                "new_chat_members": [{"id": 2, "is_bot": false, "first_name": "B"}]
            }
        }))
        .unwrap();
        assert!(matches!(
            normalize(&joined, &me(), 0),
            Normalized::Ignored(_)
        ));
    }

    /// The press in fixture `name`, read as the webhook reads it.
    fn read_press(raw: &Value) -> Normalized {
        normalize(&read_update(raw).unwrap().unwrap(), &me(), 42)
    }

    #[test]
    fn a_button_press_is_read_in_its_topic_even_when_its_message_is_new_to_teloxide() {
        // The prompt carries an entity type teloxide 0.13 does not know (`date_time`), which
        // makes the whole update unreadable to it; the message is read for what antler needs.
        let raw: Value =
            serde_json::from_str(&antler_testkit::telegram::fixture("tg_callback_query")).unwrap();
        let Normalized::Press(press) = read_press(&raw) else {
            panic!("not a press");
        };
        assert_eq!(press.channel, "telegram");
        assert_eq!(press.conversation.as_str(), "telegram:-1002200330044:77");
        assert_eq!(press.chat.as_deref(), Some("-1002200330044"));
        assert_eq!(press.user.id, "5550001002");
        assert_eq!(press.user.name.as_deref(), Some("Lin"));
        assert!(!press.user.admin, "the ingress decides who is an admin");
        assert_eq!(press.action, "approve:k3x9p2ab");
        assert_eq!(press.message_id, "1310");
        assert_eq!(
            press.answer_context.as_ref().map(ReplyContext::expose),
            Some("4382bfdwdsb323b2d9")
        );

        // Inline mode has no chat message; a press without data or by a bot asks nothing.
        let mut inline = raw.clone();
        inline["callback_query"]
            .as_object_mut()
            .unwrap()
            .remove("message");
        inline["callback_query"]["inline_message_id"] = "AAAAA".into();
        assert!(matches!(read_press(&inline), Normalized::Ignored(_)));
        let mut no_data = raw.clone();
        no_data["callback_query"]
            .as_object_mut()
            .unwrap()
            .remove("data");
        assert!(matches!(read_press(&no_data), Normalized::Ignored(_)));
        let mut by_bot = raw;
        by_bot["callback_query"]["from"]["is_bot"] = true.into();
        assert!(matches!(read_press(&by_bot), Normalized::Ignored(_)));
    }

    /// Reads the fixture `name` through [`read_update`], as the webhook does.
    fn read(name: &str) -> Incoming {
        let raw: Value = serde_json::from_str(&antler_testkit::telegram::fixture(name)).unwrap();
        let update = read_update(&raw).unwrap().unwrap();
        match normalize(&update, &me(), 42) {
            Normalized::Message(incoming) => *incoming,
            other => panic!("{name} is not a message: {other:?}"),
        }
    }

    #[test]
    fn messages_teloxide_cannot_model_are_read_for_what_antler_needs() {
        for name in [
            "tg_external_reply",
            "tg_new_entity",
            "tg_paid_media_caption",
            "tg_audio_no_mime",
        ] {
            assert!(
                matches!(normalize(&fixture(name), &me(), 0), Normalized::Ignored(_)),
                "{name}: teloxide models it now; the fixture no longer reproduces the gap"
            );
        }
        let reply = read("tg_external_reply");
        assert_eq!(reply.event.text, "why did this alert fire?");
        assert_eq!(reply.event.event_id, "730100011");
        assert!(reply.facts.private && !reply.facts.replies_to_bot);

        // The newer entity is ignored; the mention it sits next to is still found and cut.
        let entity = read("tg_new_entity");
        assert!(entity.facts.mentions_bot && entity.facts.addressed(&me()));
        assert_eq!(entity.event.text, "pause deploys until 2026-12-05 09:00");
        assert_eq!(
            entity.event.conversation.as_str(),
            "telegram:-1002200330044"
        );
        assert_eq!(entity.event.user.id, "5550001002");

        let paid = read("tg_paid_media_caption");
        assert_eq!(paid.event.text, "summarize the dashboard I shared");
        assert!(paid.event.attachments.is_empty());
        let audio = read("tg_audio_no_mime");
        assert_eq!(audio.event.text, "transcribe the on-call handover");
    }

    #[test]
    fn a_reply_teloxide_cannot_model_is_read_too_and_unreadable_messages_say_so() {
        let mut raw: Value =
            serde_json::from_str(&antler_testkit::telegram::fixture("tg_reply_to_bot")).unwrap();
        raw["message"]["reply_to_message"]["entities"] =
            serde_json::json!([{"offset": 0, "length": 7, "type": "date_time", "unix_time": 1}]);
        raw["message"]["paid_media"] = serde_json::json!({"star_count": 1, "paid_media": []});
        let update = read_update(&raw).unwrap().unwrap();
        let Normalized::Message(m) = normalize(&update, &me(), 0) else {
            panic!("a message")
        };
        assert!(m.facts.replies_to_bot, "the reply target survives");

        raw["message"]
            .as_object_mut()
            .unwrap()
            .remove("chat")
            .unwrap();
        let error = read_update(&raw).unwrap_err();
        assert_eq!(error.update_id, 730_100_004);
        assert_eq!(read_update(&serde_json::json!({"no": "id"})), Ok(None));
    }

    #[test]
    fn anonymous_admins_and_channel_senders_are_their_sender_chat() {
        let admin = incoming("tg_anonymous_admin");
        assert_eq!(admin.event.user.id, "-1002200330044");
        assert_eq!(admin.event.user.name.as_deref(), Some("SRE on-call"));
        assert_eq!(admin.event.text, "freeze deploys");
        assert!(admin.facts.addressed(&me()));

        let channel = incoming("tg_channel_sender");
        assert_eq!(channel.event.user.id, "-1001999888777");
        assert_eq!(channel.event.user.name.as_deref(), Some("Prod alerts"));
        assert_eq!(
            channel.event.conversation.as_str(),
            "telegram:-1002200330044"
        );

        let forwarded: Update = serde_json::from_str(
            &antler_testkit::telegram::fixture("tg_channel_sender")
                .replace("\"text\":", "\"is_automatic_forward\": true, \"text\":"),
        )
        .unwrap();
        assert!(matches!(
            normalize(&forwarded, &me(), 0),
            Normalized::Ignored(_)
        ));
    }

    #[test]
    fn stickers_voice_notes_and_locations_are_named_not_dropped() {
        for (name, kind) in [
            ("tg_sticker", "sticker"),
            ("tg_voice", "voice message"),
            ("tg_location", "location"),
        ] {
            let m = incoming(name);
            assert_eq!(m.event.unsupported.as_deref(), Some(kind), "{name}");
            assert!(m.event.text.is_empty() && m.event.attachments.is_empty());
            assert!(m.facts.addressed(&me()), "{name}: a private chat");
        }
        assert_eq!(incoming("tg_private_text").event.unsupported, None);
    }

    #[test]
    fn cutting_keeps_one_space_and_trims() {
        assert_eq!(without("a @bot b", vec![2..6]), "a b");
        assert_eq!(without("@bot hi", vec![0..4]), "hi");
        assert_eq!(without("hi @bot", vec![3..7]), "hi");
        assert_eq!(
            without("x", vec![5..9]),
            "x",
            "a range past the end is skipped"
        );
    }
}
