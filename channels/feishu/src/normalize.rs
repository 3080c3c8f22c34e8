//! Feishu `im.message.receive_v1` events → antler's normalized message.
//!
//! Pure: no I/O, no clock beyond what the caller passes, so every recorded payload in
//! `tests/fixtures` is a test.
//!
//! Who is addressed: any message in a private (`p2p`) chat; in a group, a message that
//! @mentions the bot, or one whose text starts with `/` (a command such as `/status`, answered
//! by the gateway's command handler). Messages from anything but a user (other apps) are
//! ignored, so two bots cannot answer each other forever.

use antler_channel::{
    AttachmentRef, AttachmentSource, Button, ConversationKey, InboundEvent, Press, UserRef,
};
use serde::Deserialize;
use serde_json::Value;

/// The channel's name: the first segment of its conversation keys.
pub(crate) const NAME: &str = "feishu";

/// What normalization needs to know besides the payload.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Context<'a> {
    /// The bot's open_id (learned through `bot/v3/info`); without it no mention is the bot's.
    pub(crate) bot_open_id: Option<&'a str>,
    /// This app's id: an event addressed to another app (its `header.app_id`) is not ours.
    pub(crate) app_id: &'a str,
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
    /// A group message that mentions someone, before the bot's open_id is known: it may be for
    /// the bot, so it is neither taken nor dropped (Feishu delivers it again).
    AwaitingIdentity,
}

/// A schema 2.0 `im.message.receive_v1` delivery (the fields antler uses).
#[derive(Debug, Deserialize)]
pub(crate) struct MessageReceived {
    header: Header,
    event: MessageEvent,
}

#[derive(Debug, Deserialize)]
struct Header {
    #[serde(default)]
    tenant_key: String,
    #[serde(default)]
    app_id: String,
}

#[derive(Debug, Deserialize)]
struct MessageEvent {
    sender: Sender,
    message: Message,
}

#[derive(Debug, Deserialize)]
struct Sender {
    #[serde(default)]
    sender_id: UserIds,
    #[serde(default)]
    sender_type: String,
    #[serde(default)]
    tenant_key: String,
}

#[derive(Debug, Default, Deserialize)]
struct UserIds {
    #[serde(default)]
    open_id: Option<String>,
    /// The tenant-wide user id (given only with the `contact:user.employee_id:readonly` scope).
    #[serde(default)]
    user_id: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Message {
    message_id: String,
    #[serde(default)]
    root_id: Option<String>,
    chat_id: String,
    chat_type: String,
    message_type: String,
    #[serde(default)]
    content: String,
    #[serde(default)]
    mentions: Vec<Mention>,
}

#[derive(Debug, Deserialize)]
struct Mention {
    key: String,
    #[serde(default)]
    id: UserIds,
    #[serde(default)]
    name: String,
}

/// What a message's `content` holds, read by its `message_type`.
#[derive(Debug, Default)]
struct Content {
    text: String,
    attachments: Vec<AttachmentRef>,
    /// A kind antler cannot read, in words.
    unsupported: Option<String>,
}

/// Normalizes a message delivery.
pub(crate) fn normalize_message(received: &MessageReceived, context: &Context<'_>) -> Normalized {
    let sender = &received.event.sender;
    let message = &received.event.message;
    if !received.header.app_id.is_empty() && received.header.app_id != context.app_id {
        return Normalized::Ignored("addressed to another app");
    }
    if sender.sender_type != "user" {
        return Normalized::Ignored("not written by a user");
    }
    let Some(user) = sender
        .sender_id
        .open_id
        .as_deref()
        .filter(|id| !id.is_empty())
    else {
        return Normalized::Ignored("no author open_id");
    };
    let bot = context.bot_open_id.filter(|id| !id.is_empty());
    let bot_mentioned = bot.is_some_and(|bot| {
        message
            .mentions
            .iter()
            .any(|m| m.id.open_id.as_deref() == Some(bot))
    });
    let content = read_content(message);
    let text = readable(&content.text, &message.mentions, bot);
    let group = message.chat_type != "p2p";
    if group && bot.is_none() && !message.mentions.is_empty() && !text.starts_with('/') {
        return Normalized::AwaitingIdentity;
    }
    if group && !bot_mentioned && !text.starts_with('/') {
        return Normalized::Ignored(
            "a group message that neither mentions the bot nor is a command",
        );
    }
    if text.is_empty() && content.attachments.is_empty() && content.unsupported.is_none() {
        return Normalized::Ignored("no text or file");
    }
    let tenant = if received.header.tenant_key.is_empty() {
        sender.tenant_key.as_str()
    } else {
        received.header.tenant_key.as_str()
    };
    // One Feishu topic (a reply chain under one root message) is one antler thread in groups;
    // a private chat is one conversation, whatever message a reply quotes.
    let conversation = if group {
        let root = message
            .root_id
            .as_deref()
            .filter(|root| !root.is_empty())
            .unwrap_or(&message.message_id);
        ConversationKey::new(NAME, [tenant, &message.chat_id, root])
    } else {
        ConversationKey::new(NAME, [tenant, &message.chat_id])
    };
    Normalized::Event(Box::new(InboundEvent {
        channel: NAME.to_owned(),
        // The message_id, not the header's event_id: the inbox dedupes on
        // (conversation, event_id), and Feishu may deliver one message again under a new
        // event_id (its retries after a slow answer are not guaranteed to keep it). The
        // message_id is the same in every delivery, so they collapse into one turn.
        event_id: message.message_id.clone(),
        conversation,
        // The open_id: per app, stable, and what `allowed_users` and `admins` list for Feishu.
        user: UserRef {
            id: user.to_owned(),
            name: None,
            admin: false,
            // Allowlists may name a user by user_id as well as by open_id.
            aliases: sender
                .sender_id
                .user_id
                .iter()
                .filter(|id| !id.is_empty())
                .cloned()
                .collect(),
        },
        text,
        reply_to: Some(message.message_id.clone()),
        received_at_ms: context.received_at_ms,
        attachments: content.attachments,
        group,
        chat: Some(message.chat_id.clone()),
        refused: false,
        follow_up: false,
        unsupported: content.unsupported,
        interactive: true,
        reply_context: None,
        media_group: None,
    }))
}

/// The field of a button's `value` holding its [`Button::action`].
pub(crate) const VALUE_ACTION: &str = "action";

/// The field of a button's `value` naming the topic (root message) of the group conversation
/// its card was sent in: a press carries only the chat and the card's message, and a group
/// conversation is one topic of its chat ([`normalize_message`]). Absent in private chats.
pub(crate) const VALUE_ROOT: &str = "root";

/// The longest id read from a press (open_id, chat, message, tenant, user_id), in bytes:
/// Feishu's are 20 to 40.
const MAX_ID_BYTES: usize = 128;

/// A schema 2.0 `card.action.trigger` callback (the fields antler uses): someone pressed a
/// button of a card the bot sent.
#[derive(Debug, Deserialize)]
pub(crate) struct CardAction {
    header: Header,
    event: CardActionEvent,
}

#[derive(Debug, Deserialize)]
struct CardActionEvent {
    #[serde(default)]
    operator: Operator,
    #[serde(default)]
    action: Action,
    #[serde(default)]
    context: CardContext,
}

/// Who pressed: the same ids a message's sender has.
#[derive(Debug, Default, Deserialize)]
struct Operator {
    #[serde(default)]
    tenant_key: String,
    #[serde(default)]
    open_id: Option<String>,
    #[serde(default)]
    user_id: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Action {
    /// The button's `value` as the card set it (a JSON object for antler's buttons).
    #[serde(default)]
    value: Value,
    #[serde(default)]
    tag: String,
}

/// Where the card is.
#[derive(Debug, Default, Deserialize)]
struct CardContext {
    #[serde(default)]
    open_message_id: String,
    #[serde(default)]
    open_chat_id: String,
}

/// What a card callback means to antler.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PressNormalized {
    /// A press of one of antler's buttons.
    Press(Box<Press>),
    /// Not for antler (another app, another card's component); the reason is for the log.
    Ignored(&'static str),
    /// A press antler cannot read; the reason is for the log.
    Malformed(&'static str),
}

/// `id` is an id as Feishu writes them: 1 to [`MAX_ID_BYTES`] ASCII letters, digits, `_` or
/// `-` (so it is safe in a conversation key and a path).
fn is_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Normalizes a card callback: the presser formed as a message's author is, the conversation
/// as a message in that chat (and topic) gets, the card's message id, the button's action.
pub(crate) fn normalize_press(received: &CardAction, app_id: &str) -> PressNormalized {
    let event = &received.event;
    if !received.header.app_id.is_empty() && received.header.app_id != app_id {
        return PressNormalized::Ignored("addressed to another app");
    }
    if event.action.tag != "button" {
        return PressNormalized::Ignored("not a button");
    }
    let Some(action) = event.action.value.get(VALUE_ACTION) else {
        return PressNormalized::Ignored("a button that is not antler's");
    };
    let Some(action) = action
        .as_str()
        .filter(|a| !a.is_empty() && a.len() <= Button::MAX_ACTION_BYTES && a.is_ascii())
    else {
        return PressNormalized::Malformed("the button's action is not one antler writes");
    };
    let Some(user) = event.operator.open_id.as_deref().filter(|id| is_id(id)) else {
        return PressNormalized::Malformed("no operator open_id");
    };
    let (chat, message) = (
        event.context.open_chat_id.as_str(),
        event.context.open_message_id.as_str(),
    );
    if !is_id(chat) || !is_id(message) {
        return PressNormalized::Malformed("no chat or message id");
    }
    let tenant = if received.header.tenant_key.is_empty() {
        event.operator.tenant_key.as_str()
    } else {
        received.header.tenant_key.as_str()
    };
    if !is_id(tenant) {
        return PressNormalized::Malformed("no tenant_key");
    }
    let conversation = match event.action.value.get(VALUE_ROOT) {
        None => ConversationKey::new(NAME, [tenant, chat]),
        Some(root) => match root.as_str().filter(|root| is_id(root)) {
            Some(root) => ConversationKey::new(NAME, [tenant, chat, root]),
            None => return PressNormalized::Malformed("the button's topic is not a message id"),
        },
    };
    PressNormalized::Press(Box::new(Press {
        channel: NAME.to_owned(),
        conversation,
        // As a message's author ([`normalize_message`]): the open_id, the user_id as an alias;
        // the ingress marks admins from the channel's `admins`.
        user: UserRef {
            id: user.to_owned(),
            name: None,
            admin: false,
            aliases: event
                .operator
                .user_id
                .iter()
                .filter(|id| !id.is_empty() && id.len() <= MAX_ID_BYTES)
                .cloned()
                .collect(),
        },
        chat: Some(chat.to_owned()),
        action: action.to_owned(),
        message_id: message.to_owned(),
        // The callback is answered in its own response: nothing to keep.
        answer_context: None,
    }))
}

/// The text, files and kind of a message's content.
fn read_content(message: &Message) -> Content {
    let json: Value = serde_json::from_str(&message.content).unwrap_or(Value::Null);
    let str_of = |field: &str| json.get(field).and_then(Value::as_str).unwrap_or_default();
    match message.message_type.as_str() {
        "text" => Content {
            text: str_of("text").to_owned(),
            ..Content::default()
        },
        "post" => post(&json, &message.message_id),
        "image" => Content {
            attachments: attachment(&message.message_id, str_of("image_key"), "image", None)
                .into_iter()
                .collect(),
            ..Content::default()
        },
        "file" => Content {
            attachments: attachment(
                &message.message_id,
                str_of("file_key"),
                "file",
                Some(str_of("file_name")),
            )
            .into_iter()
            .collect(),
            ..Content::default()
        },
        other => Content {
            unsupported: Some(kind_in_words(other).to_owned()),
            ..Content::default()
        },
    }
}

/// A message type as a user would call it.
fn kind_in_words(message_type: &str) -> &str {
    match message_type {
        "audio" => "voice message",
        "media" => "video",
        "interactive" => "card",
        "share_chat" => "shared group",
        "share_user" => "shared contact",
        "merge_forward" => "forwarded chat history",
        "sticker" => "sticker",
        "location" => "location",
        "todo" => "task",
        "calendar" | "share_calendar_event" | "general_calendar" => "calendar event",
        "hongbao" => "red packet",
        "system" => "system message",
        "video_chat" => "video call",
        "vote" => "poll",
        other => other,
    }
}

/// A reference to a message's file or image: the id is `<message_id>/<key>/<image|file>`, all
/// that the resource endpoint needs (keys and message ids never hold a `/`).
fn attachment(
    message_id: &str,
    key: &str,
    kind: &str,
    name: Option<&str>,
) -> Option<AttachmentRef> {
    if key.is_empty() {
        return None;
    }
    let name = name.filter(|name| !name.is_empty()).map_or_else(
        || format!("{key}.{}", if kind == "image" { "png" } else { "bin" }),
        str::to_owned,
    );
    Some(AttachmentRef {
        name,
        media_type: None,
        size: None,
        source: AttachmentSource::Platform {
            id: format!("{message_id}/{key}/{kind}"),
        },
    })
}

/// A rich-text (`post`) message flattened to plain lines: the title, then each paragraph's
/// text, links (with their address), mentions and code blocks; images become attachments.
/// Both shapes are read: `{"title","content"}` and one keyed by language (`{"zh_cn": {…}}`).
fn post(json: &Value, message_id: &str) -> Content {
    let body = if json.get("content").is_some() {
        json
    } else {
        json.as_object()
            .and_then(|languages| languages.values().find(|v| v.get("content").is_some()))
            .unwrap_or(&Value::Null)
    };
    let mut lines = Vec::new();
    let mut attachments = Vec::new();
    if let Some(title) = body
        .get("title")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
    {
        lines.push(title.to_owned());
    }
    let paragraphs = body.get("content").and_then(Value::as_array);
    for paragraph in paragraphs.into_iter().flatten() {
        let mut line = String::new();
        for element in paragraph.as_array().into_iter().flatten() {
            let field = |name: &str| {
                element
                    .get(name)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
            };
            match field("tag") {
                "text" | "md" => line.push_str(field("text")),
                "a" => {
                    let (text, href) = (field("text"), field("href"));
                    line.push_str(text);
                    if !href.is_empty() && href != text {
                        line.push_str(&format!(" ({href})"));
                    }
                }
                "at" => {
                    // In received posts `user_id` is the placeholder (`@_user_1`) that
                    // `mentions` resolves, like in text.
                    let id = field("user_id");
                    if id.starts_with("@_") {
                        line.push_str(id);
                    } else {
                        line.push('@');
                        line.push_str(field("user_name"));
                    }
                }
                "code_block" => {
                    if !line.is_empty() {
                        lines.push(std::mem::take(&mut line));
                    }
                    line.push_str(field("text").trim_end_matches('\n'));
                }
                "img" => {
                    attachments.extend(attachment(message_id, field("image_key"), "image", None))
                }
                "media" => {
                    attachments.extend(attachment(message_id, field("file_key"), "file", None))
                }
                _ => {}
            }
        }
        lines.push(line);
    }
    while lines.last().is_some_and(|l| l.trim().is_empty()) {
        lines.pop();
    }
    Content {
        text: lines.join("\n"),
        attachments,
        unsupported: None,
    }
}

/// The text as a person would read it: `@_user_N` placeholders as `@<name>`, the bot's own
/// removed, `@_all` as `@all`, trimmed.
fn readable(text: &str, mentions: &[Mention], bot: Option<&str>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("@_") {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        // The longest key that matches, so `@_user_1` never eats the start of `@_user_10`.
        let mention = mentions
            .iter()
            .filter(|m| !m.key.is_empty() && tail.starts_with(m.key.as_str()))
            .max_by_key(|m| m.key.len());
        match mention {
            Some(m) if bot.is_some() && m.id.open_id.as_deref() == bot => {
                // The mention is how the user called the bot, not part of what they asked;
                // the spaces around it merge into one.
                rest = &tail[m.key.len()..];
                if out.is_empty() || out.ends_with(char::is_whitespace) {
                    rest = rest.trim_start_matches([' ', '\t']);
                }
            }
            Some(m) => {
                out.push('@');
                out.push_str(if m.name.is_empty() {
                    &m.key[1..]
                } else {
                    &m.name
                });
                rest = &tail[m.key.len()..];
            }
            None if tail.starts_with("@_all") => {
                out.push_str("@all");
                rest = &tail["@_all".len()..];
            }
            None => {
                out.push_str("@_");
                rest = &tail[2..];
            }
        }
    }
    out.push_str(rest);
    out.trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mention(key: &str, open_id: &str, name: &str) -> Mention {
        Mention {
            key: key.into(),
            id: UserIds {
                open_id: Some(open_id.into()),
                user_id: None,
            },
            name: name.into(),
        }
    }

    #[test]
    fn placeholders_become_names_and_the_bots_own_goes() {
        let mentions = [
            mention("@_user_1", "ou_bot", "OpsBot"),
            mention("@_user_2", "ou_ada", "Ada"),
            mention("@_user_10", "ou_bob", "Bob"),
        ];
        assert_eq!(
            readable(
                "@_user_1 ask @_user_2 and @_user_10, cc @_all",
                &mentions,
                Some("ou_bot")
            ),
            "ask @Ada and @Bob, cc @all"
        );
        assert_eq!(
            readable("hey @_user_1  please", &mentions, Some("ou_bot")),
            "hey please"
        );
        // Before the bot knows its open_id, its mention is a name like any other.
        assert_eq!(readable("@_user_1 hi", &mentions, None), "@OpsBot hi");
        assert_eq!(readable("mail a@_b", &[], None), "mail a@_b");
    }

    #[test]
    fn posts_flatten_in_both_shapes() {
        let content = serde_json::json!({
            "title": "Deploy",
            "content": [
                [{"tag": "at", "user_id": "@_user_1", "user_name": "OpsBot"},
                 {"tag": "text", "text": " roll back "},
                 {"tag": "a", "text": "web", "href": "https://x.io/web"}],
                [{"tag": "code_block", "language": "sh", "text": "kubectl get pods\n"}],
                [{"tag": "img", "image_key": "img_v3_1"}],
            ]
        });
        let flat = post(&content, "om_1");
        assert_eq!(
            flat.text,
            "Deploy\n@_user_1 roll back web (https://x.io/web)\nkubectl get pods"
        );
        assert_eq!(flat.attachments.len(), 1);
        let keyed = serde_json::json!({"zh_cn": content});
        assert_eq!(post(&keyed, "om_1").text, flat.text);
    }
}
